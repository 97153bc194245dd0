//! The cadence of a waiting visitor's updates: who hears what, and when.
//!
//! The cheapest update is the one not sent. Someone two hundred thousand
//! places back does not need a new number every second: their page is
//! worth changing when what it shows changes enough to notice. So a
//! stream sends a `position` event:
//!
//! - when the place moved by at least about one percent of the place last
//!   shown (at least one place, so everyone within a hundred of the head
//!   hears every move), when the wait shown changes by one displayed step
//!   ([`wait_shown`], the page's own rounding), or when the line pauses,
//!   resumes, changes mode or closes — at most once a second;
//! - otherwise, for a smaller change (a place or two deep in the line, the
//!   line's length, the stock), at least every [`REFRESH_MS`], so a page
//!   left open is never more than that out of date.
//!
//! With a million waiting and 200 admissions a second this sends about 0.1
//! updates per visitor per second where a send per change and second sent
//! one; at the head it is still one a second. Positions shown never go up
//! whatever the cadence: that is the stream's clamp, not this rule's.

use super::status::TicketStatus;

/// At most one update a second to any one visitor.
pub(crate) const MIN_GAP_MS: u64 = 1_000;
/// A change too small to notice is still sent after this long.
pub(crate) const REFRESH_MS: u64 = 20_000;
/// The share of the place last shown that is worth an update.
const NOTICEABLE: u64 = 100;

/// When to send a changed status, given what was sent last and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Nothing the visitor sees changed.
    Never,
    /// Send at this moment (Unix ms; now or earlier: send now).
    At(u64),
}

impl Due {
    /// Whether it is due by `now`.
    #[cfg(test)]
    pub(crate) fn by(self, now: u64) -> bool {
        matches!(self, Due::At(at) if at <= now)
    }
}

/// When `now`'s status should reach a visitor who was last sent `shown`
/// at `sent_at` (Unix ms).
pub(crate) fn due(shown: &TicketStatus, sent_at: u64, now: &TicketStatus) -> Due {
    if shown.shows_same_as(now) {
        return Due::Never;
    }
    if noticeable(shown, now) {
        Due::At(sent_at.saturating_add(MIN_GAP_MS))
    } else {
        Due::At(sent_at.saturating_add(REFRESH_MS))
    }
}

/// How many more moves of the line (departures ahead, at most one place
/// each) a visitor shown place `shown` and now at `now` needs before their
/// place can have changed noticeably: at least one.
pub(crate) fn moves_needed(shown: u64, now: u64) -> u64 {
    (now + shown.div_ceil(NOTICEABLE))
        .saturating_sub(shown)
        .max(1)
}

/// Whether the change is one a visitor would notice at once.
fn noticeable(shown: &TicketStatus, now: &TicketStatus) -> bool {
    if shown.paused != now.paused
        || shown.mode != now.mode
        || shown.closed != now.closed
        || shown.state != now.state
    {
        return true;
    }
    let place_moved = match (shown.position, now.position) {
        (Some(before), Some(after)) => before.abs_diff(after) >= before.div_ceil(NOTICEABLE),
        (before, after) => before != after,
    };
    let wait = |s: &TicketStatus| s.eta.map(|e| wait_shown(e.low_secs, e.high_secs));
    place_moved || wait(shown) != wait(now)
}

/// The unit a wait is shown in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitUnit {
    Seconds,
    Minutes,
    Hours,
}

/// A wait as a page shows it: a range in one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WaitShown {
    pub unit: WaitUnit,
    /// 0 only for "now" (the high end is 0).
    pub low: u64,
    pub high: u64,
}

const MINUTE: u64 = 60;
const HOUR: u64 = 60 * MINUTE;
/// Waits up to this long read better in minutes ("about 60–80 minutes")
/// than in hours ("about 1–2 hours").
const MINUTES_UP_TO: u64 = 90 * MINUTE;

/// An estimated wait between `low_secs` and `high_secs` as a page shows
/// it: seconds under a minute, minutes up to an hour and a half, hours
/// beyond. The low end rounds to nearest and the high end rounds up, and
/// neither shows as zero, so the range never promises less than the
/// estimate. The page's script rounds the same way.
pub(crate) fn wait_shown(low_secs: u64, high_secs: u64) -> WaitShown {
    let (low, high) = (low_secs.min(high_secs), low_secs.max(high_secs));
    if high == 0 {
        return WaitShown {
            unit: WaitUnit::Seconds,
            low: 0,
            high: 0,
        };
    }
    let (unit, size) = if high < MINUTE {
        (WaitUnit::Seconds, 1)
    } else if high <= MINUTES_UP_TO {
        (WaitUnit::Minutes, MINUTE)
    } else {
        (WaitUnit::Hours, HOUR)
    };
    let low = (low / size + u64::from(low % size >= size.div_ceil(2))).max(1);
    let high = (high / size + u64::from(high % size != 0)).max(low);
    WaitShown { unit, low, high }
}

#[cfg(test)]
mod tests {
    use super::super::mode::Mode;
    use super::super::rate::AdmissionRate;
    use super::super::state::TicketState;
    use super::super::status::Eta;
    use super::*;
    use crate::engine::clock::Timestamp;

    /// A waiting visitor's status `ahead` places back in a line of
    /// `waiting`, admitting `rate` a second.
    fn waiting(ahead: u64, waiting: u64, rate: u64) -> TicketStatus {
        let mut r = AdmissionRate::default();
        // A steady rate, learned over a long while.
        for _ in 0..100 {
            r.observe(rate, 1_000);
        }
        let eta = r.eta(ahead + 1).map(|(low, expected, high)| Eta {
            low_secs: low,
            expected_secs: expected,
            high_secs: high,
        });
        TicketStatus {
            id: 1,
            state: TicketState::Waiting,
            lane: 0,
            number: Some(1),
            position: Some(ahead + 1),
            ahead: Some(ahead),
            eta,
            progress: 0.0,
            queue_length: waiting,
            paused: false,
            closed: false,
            mode: Mode::Queue,
            stock: None,
            joined_at: Timestamp(0),
            admitted_at: None,
            pass_expires_at: None,
            opens_at: None,
            at: Timestamp(0),
        }
    }

    /// The updates a stream `depth` places back receives over `secs` of a
    /// line of `line` admitting `rate` a second (and as many joining, so
    /// the line keeps its length), looked at on every 100 ms tick.
    fn updates(depth: u64, line: u64, rate: u64, secs: u64) -> u64 {
        let mut shown = waiting(depth, line, rate);
        let mut sent_at = 0;
        let mut sent = 1; // The first event, when the stream opens.
        for tick in 1..=secs * 10 {
            let now = tick * 100;
            let admitted = rate * now / 1000;
            let Some(ahead) = depth.checked_sub(admitted) else {
                break;
            };
            let status = waiting(ahead, line, rate);
            if due(&shown, sent_at, &status).by(now) {
                shown = status;
                sent_at = now;
                sent += 1;
            }
        }
        sent
    }

    #[test]
    fn near_the_head_every_move_once_a_second_and_deep_in_line_when_it_shows() {
        let line = 1_000_000;
        // Near the head a line moving 200 a second moves more than one
        // percent a second: one update a second, no more.
        assert_eq!(updates(5_000, line, 200, 20), 21);
        assert_eq!(updates(10_000, line, 200, 30), 31);
        // Twenty thousand back one percent is a second's move.
        let border = updates(20_000, line, 200, 60);
        assert!((58..=61).contains(&border), "{border}");
        // A hundred thousand back, one percent is a thousand places: five
        // seconds of this line.
        let deep = updates(100_000, line, 200, 60);
        assert!((11..=14).contains(&deep), "{deep}");
        // At the back, the refresh: a wait shown in hours barely moves.
        let back = updates(999_000, line, 200, 60);
        assert!((3..=5).contains(&back), "{back}");
    }

    #[test]
    fn a_million_waiting_hear_about_a_tenth_of_an_update_a_second_each() {
        let line = 1_000_000u64;
        let depths: Vec<u64> = (0..200).map(|i| i * line / 200 + 37).collect();
        let secs = 60;
        let total: u64 = depths
            .iter()
            .map(|&d| updates(d, line, 200, secs) - 1)
            .sum();
        let per_visitor_second = total as f64 / (depths.len() as f64 * secs as f64);
        eprintln!("{per_visitor_second:.3} updates per visitor per second");
        assert!(
            per_visitor_second <= 0.12,
            "{per_visitor_second} updates per visitor per second"
        );
        assert!(per_visitor_second >= 0.05, "{per_visitor_second}");
    }

    #[test]
    fn what_changes_the_page_at_once_waits_at_most_a_second() {
        let shown = waiting(500_000, 1_000_000, 200);
        let mut paused = shown.clone();
        paused.paused = true;
        assert_eq!(due(&shown, 10_000, &paused), Due::At(11_000));
        let mut sold_out = shown.clone();
        sold_out.mode = Mode::SoldOut;
        assert_eq!(due(&shown, 10_000, &sold_out), Due::At(11_000));
        // A longer line only: shown at the next refresh.
        let mut longer = shown.clone();
        longer.queue_length += 10;
        assert_eq!(due(&shown, 10_000, &longer), Due::At(30_000));
        assert_eq!(due(&shown, 10_000, &shown.clone()), Due::Never);
        // Within a hundred of the head one place is noticeable; a place
        // a thousand back is not.
        let (near, nearer) = (waiting(50, 1_000, 200), waiting(49, 1_000, 200));
        assert_eq!(due(&near, 10_000, &nearer), Due::At(11_000));
        let (far, less_far) = (waiting(1_000, 2_000, 1), waiting(999, 2_000, 1));
        assert_eq!(due(&far, 10_000, &less_far), Due::At(30_000));
        assert!(!Due::Never.by(u64::MAX));
    }

    #[test]
    fn a_stream_sleeps_until_the_line_has_moved_enough_for_it() {
        // Shown 5,000th: 50 places make a noticeable change.
        assert_eq!(moves_needed(5_000, 5_000), 50);
        assert_eq!(moves_needed(5_000, 4_980), 30);
        // Already noticeable (or further): one more look.
        assert_eq!(moves_needed(5_000, 4_950), 1);
        assert_eq!(moves_needed(5_000, 4_000), 1);
        assert_eq!(moves_needed(3, 3), 1);
        // Whatever it needs, the rule agrees once it has moved that far.
        for (shown, now) in [(1_000_000, 999_990), (250, 249), (101, 101)] {
            let place = now - moves_needed(shown, now);
            let (before, after) = (at_place(shown), at_place(place));
            assert!(noticeable(&before, &after), "{shown} → {place}");
            if moves_needed(shown, now) > 1 {
                assert!(!noticeable(&before, &at_place(place + 1)));
            }
        }
    }

    fn at_place(position: u64) -> TicketStatus {
        let mut s = waiting(position - 1, 2_000_000, 0);
        s.eta = None;
        s
    }

    #[test]
    fn waits_are_shown_in_one_unit_never_less_than_estimated() {
        let shown = |l, h| {
            let w = wait_shown(l, h);
            (w.unit, w.low, w.high)
        };
        assert_eq!(shown(0, 0), (WaitUnit::Seconds, 0, 0));
        assert_eq!(shown(10, 40), (WaitUnit::Seconds, 10, 40));
        assert_eq!(shown(0, 3), (WaitUnit::Seconds, 1, 3));
        assert_eq!(shown(89, 181), (WaitUnit::Minutes, 1, 4));
        assert_eq!(shown(3_600, 5_400), (WaitUnit::Minutes, 60, 90));
        assert_eq!(shown(3_600, 5_401), (WaitUnit::Hours, 1, 2));
    }
}
