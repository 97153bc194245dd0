//! Presence: whether a waiting visitor is still there when their turn
//! comes.
//!
//! A visitor is present while a live event stream of theirs is open, or
//! while their last sign of life (a status read, a join, the batched
//! renewal an instance makes for the streams it holds) is younger than the
//! room's `away_grace`. A ticket found absent at the head is skipped
//! without taking a permit: it becomes away, keeps its number, and when
//! its visitor comes back within `queue_idle` it stands ahead of the whole
//! line (everyone still waiting there joined after it). Quiet past
//! `queue_idle`, it is abandoned.
//!
//! The engine calls [`at_head`] with the ticket's last sign of life.

use std::time::Duration;

use super::status::quiet_cutoff;

/// What the head does with a waiting ticket it reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtHead {
    /// Its visitor is here: it takes the permit.
    Admit,
    /// Its visitor is not here: skip it, keeping its number.
    Skip,
    /// Quiet past `queue_idle`: abandoned.
    Abandon,
}

/// The room's presence timeouts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PresenceTimeouts {
    pub away_grace_ms: u64,
    pub queue_idle_ms: u64,
}

impl PresenceTimeouts {
    /// The head's decision for a ticket last seen at `last_seen`.
    pub(crate) fn at_head(&self, last_seen: u64, now: u64) -> AtHead {
        if last_seen < quiet_cutoff(now, self.queue_idle_ms) {
            AtHead::Abandon
        } else if last_seen < away_cutoff(now, self.away_grace_ms) {
            AtHead::Skip
        } else {
            AtHead::Admit
        }
    }
}

/// A ticket last seen before this moment is away.
pub(crate) fn away_cutoff(now: u64, away_grace_ms: u64) -> u64 {
    now.saturating_sub(away_grace_ms)
}

/// How often an instance renews the presence of the streams it holds: a
/// third of the grace, so that a renewal delayed by one period still lands
/// well inside it.
pub(crate) fn renew_every(away_grace: Duration) -> Duration {
    (away_grace / RENEWALS_PER_GRACE).max(Duration::from_millis(100))
}

/// Renewals per `away_grace`.
pub(crate) const RENEWALS_PER_GRACE: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_admits_the_present_skips_the_away_and_drops_the_quiet() {
        let t = PresenceTimeouts {
            away_grace_ms: 20_000,
            queue_idle_ms: 300_000,
        };
        let now = 1_000_000;
        assert_eq!(t.at_head(now, now), AtHead::Admit);
        assert_eq!(t.at_head(now - 20_000, now), AtHead::Admit);
        assert_eq!(t.at_head(now - 20_001, now), AtHead::Skip);
        assert_eq!(t.at_head(now - 300_000, now), AtHead::Skip);
        assert_eq!(t.at_head(now - 300_001, now), AtHead::Abandon);
        // Early in a clock's life nothing is before zero.
        assert_eq!(t.at_head(0, 10), AtHead::Admit);
    }

    #[test]
    fn renewals_land_well_inside_the_grace() {
        assert_eq!(renew_every(Duration::from_secs(21)), Duration::from_secs(7));
        assert_eq!(
            renew_every(Duration::from_millis(30)),
            Duration::from_millis(100)
        );
    }
}
