//! When a change of the room view is worth publishing. Every waiting
//! stream (on every instance) wakes for a published view, so a view that
//! differs only in what nobody can see is not sent.

use serde::Serialize;

use super::mode::Mode;
use crate::engine::view::RoomView;

/// What of a room view a visitor or an operator could notice: everything
/// but its version, its timestamp and the exact admission rate, which
/// drifts a little on every tick even in a quiet room. Of the rate only
/// its band and whether it is known count.
#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct Visible<'a> {
    capacity: u32,
    waiting: u64,
    admitted: u64,
    held: u64,
    tray: u64,
    debt: u64,
    paused: bool,
    open: bool,
    closed: bool,
    mode: Mode,
    stock: Option<u64>,
    opens_at: Option<u64>,
    lottery_commitment: Option<&'a str>,
    lottery_seed: Option<&'a str>,
    admissions_total: u64,
    rate_known: bool,
    rate_band: i64,
    tick_ms: u64,
    pass_idle_ms: u64,
    arrival_grace_ms: u64,
    /// Which lanes have someone waiting (bit i for lane i): a lane filling
    /// or emptying changes every other lane's share, so their waits.
    busy_lanes: u32,
}

impl<'a> Visible<'a> {
    pub(crate) fn of(v: &'a RoomView) -> Self {
        Self {
            capacity: v.capacity,
            waiting: v.waiting,
            admitted: v.admitted,
            held: v.held,
            tray: v.tray,
            debt: v.debt,
            paused: v.paused,
            open: v.open,
            closed: v.closed,
            mode: v.mode,
            stock: v.stock,
            opens_at: v.opens_at,
            lottery_commitment: v.lottery_commitment.as_deref(),
            lottery_seed: v.lottery_seed.as_deref(),
            admissions_total: v.admissions_total,
            rate_known: v.rate.primed,
            rate_band: v.rate.band(),
            tick_ms: v.tick_ms,
            pass_idle_ms: v.timeouts.pass_idle_ms,
            arrival_grace_ms: v.timeouts.arrival_grace_ms,
            busy_lanes: v
                .lanes
                .iter()
                .enumerate()
                .filter(|(_, l)| l.waiting > 0)
                .fold(0, |bits, (i, _)| {
                    bits | 1u32.checked_shl(i as u32).unwrap_or(0)
                }),
        }
    }

    /// The visible part as text, for stores that compare it with the one
    /// they published last.
    #[cfg(test)]
    pub(crate) fn signature(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Whether `next` shows anything `published` did not.
pub(crate) fn worth_publishing(published: &RoomView, next: &RoomView) -> bool {
    Visible::of(published) != Visible::of(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rules::AdmissionRate;

    fn at_rate(mean: f64) -> RoomView {
        RoomView {
            rate: AdmissionRate {
                mean,
                variance: 0.0,
                primed: true,
            },
            ..RoomView::default()
        }
    }

    #[test]
    fn a_drifting_rate_alone_is_not_a_change() {
        let base = at_rate(10.0);
        let drifted = RoomView {
            version: 9,
            at_ms: 1234,
            ..at_rate(9.7)
        };
        assert!(!worth_publishing(&base, &drifted));
        assert_eq!(
            Visible::of(&base).signature(),
            Visible::of(&drifted).signature()
        );
        assert!(worth_publishing(&base, &at_rate(7.0)));
        let longer = RoomView {
            waiting: 1,
            ..base.clone()
        };
        assert!(worth_publishing(&base, &longer));
        assert_ne!(
            Visible::of(&base).signature(),
            Visible::of(&longer).signature()
        );
        assert!(!worth_publishing(&at_rate(0.001), &at_rate(0.0001)));
        // A lane emptying while another fills, the room's length the same.
        let lane = |name: &str, waiting| crate::engine::LaneView {
            name: name.into(),
            weight: 1,
            waiting,
            admitted: 0,
        };
        let members_wait = RoomView {
            waiting: 1,
            lanes: vec![lane("members", 1), lane("general", 0)],
            ..base.clone()
        };
        let general_waits = RoomView {
            waiting: 1,
            lanes: vec![lane("members", 0), lane("general", 1)],
            ..base.clone()
        };
        assert!(worth_publishing(&members_wait, &general_waits));
        assert!(
            worth_publishing(&RoomView::default(), &at_rate(0.0)),
            "primed"
        );
    }
}
