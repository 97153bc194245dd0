//! The per-address join limit: at most `join_limit_per_minute` new tickets
//! per client address and room in any sliding minute.
//!
//! Each store keeps an exact log of the address's recent joins (the
//! embedded backend in process, the Redis backend as a sorted set per room
//! and address, so the limit holds across instances) and asks
//! [`join_allowance`] with what the log holds: how many joins fall in the
//! window and when the oldest of them was. A log entry counts while it is
//! less than [`JOIN_WINDOW_MS`] old; one exactly that old has left.

use std::time::Duration;

/// The sliding window.
pub(crate) const JOIN_WINDOW_MS: u64 = 60_000;

/// Entries at or before this moment have left the window ending at `now`.
pub(crate) fn join_window_start(now: u64) -> u64 {
    now.saturating_sub(JOIN_WINDOW_MS)
}

/// Whether one more join fits under `limit` (0: no limit), given `in_window`
/// joins in the window and the oldest of them at `oldest`; if not, how long
/// until it would fit were nobody else to join meanwhile.
pub(crate) fn join_allowance(
    limit: u32,
    in_window: u64,
    oldest: Option<u64>,
    now: u64,
) -> Result<(), Duration> {
    if limit == 0 || in_window < u64::from(limit) {
        return Ok(());
    }
    // The oldest entry leaves at `oldest + window`; with more entries than
    // the limit (the limit was lowered) more must leave, and a second
    // answer says how long then.
    let leaves_at = oldest.unwrap_or(now).saturating_add(JOIN_WINDOW_MS);
    Err(Duration::from_millis(leaves_at.saturating_sub(now).max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_and_the_wait() {
        assert_eq!(join_allowance(0, 1_000, Some(0), 5), Ok(()));
        assert_eq!(join_allowance(3, 2, Some(0), 5), Ok(()));
        assert_eq!(
            join_allowance(3, 3, Some(10_000), 30_000),
            Err(Duration::from_millis(40_000))
        );
        // Waiting that long is enough: the oldest has left by then.
        assert!(10_000 <= join_window_start(30_000 + 40_000));
    }
}
