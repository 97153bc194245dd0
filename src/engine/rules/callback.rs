//! When a visitor who asked to be called back is told their turn nears:
//! within a distance of the head, the room's `notify_ahead` or, by
//! default, about two minutes of admissions at the room's current rate,
//! enough to pick up a phone and come back before the head arrives.

/// Seconds of admissions ahead the default distance covers.
pub(crate) const AHEAD_SECS: f64 = 120.0;

/// The least default distance: a room admitting slowly, or not yet known
/// to admit at all, still warns a few places ahead.
pub(crate) const MIN_AHEAD: u32 = 3;

/// How many people ahead of a subscribed visitor, at most, when the
/// "N ahead" call is made. `setting` is the room's `notify_ahead`;
/// `rate` its smoothed admissions per second.
pub(crate) fn ahead_distance(setting: Option<u32>, rate: f64) -> u32 {
    match setting {
        Some(n) => n,
        None => {
            let by_rate = (rate.max(0.0) * AHEAD_SECS).ceil();
            (by_rate.min(f64::from(u32::MAX)) as u32).max(MIN_AHEAD)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_wins_else_two_minutes_of_admissions_and_never_less_than_a_few() {
        assert_eq!(ahead_distance(Some(0), 100.0), 0);
        assert_eq!(ahead_distance(Some(50), 0.0), 50);
        assert_eq!(ahead_distance(None, 5.0), 600);
        assert_eq!(ahead_distance(None, 0.01), MIN_AHEAD);
        assert_eq!(ahead_distance(None, 0.0), MIN_AHEAD);
        assert_eq!(ahead_distance(None, f64::NAN), MIN_AHEAD);
        assert_eq!(ahead_distance(None, 1e30), u32::MAX);
    }
}
