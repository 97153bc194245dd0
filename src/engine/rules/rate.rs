//! How fast a room admits: the smoothed admission rate behind every
//! waiting-time estimate, and the optional cap on new admissions.

use serde::{Deserialize, Serialize};

/// An exponentially weighted estimate of admissions per second and of its
/// spread, updated by the room's worker once per tick. The spread turns a
/// single guess into an honest range ("about 4–7 minutes").
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct AdmissionRate {
    /// Admissions per second, smoothed.
    pub mean: f64,
    /// Smoothed variance of the per-tick rate.
    pub variance: f64,
    /// Whether any tick has been observed since the room opened.
    pub primed: bool,
}

impl AdmissionRate {
    /// Time constant of the smoothing: the last half-minute matters most.
    const HORIZON_SECS: f64 = 30.0;

    /// After a tick: its admissions count only while the room was
    /// admitting (open and not paused), else the estimate stays as it was.
    pub(crate) fn after_tick(&mut self, admitting: bool, admissions: u64, elapsed_ms: u64) {
        if admitting {
            self.observe(admissions, elapsed_ms);
        }
    }

    /// Take one tick's admissions into the estimate.
    pub(crate) fn observe(&mut self, admissions: u64, elapsed_ms: u64) {
        if elapsed_ms == 0 {
            return;
        }
        let secs = elapsed_ms as f64 / 1000.0;
        let sample = admissions as f64 / secs;
        if !self.primed {
            *self = Self {
                mean: sample,
                variance: 0.0,
                primed: true,
            };
            return;
        }
        let alpha = 1.0 - (-secs / Self::HORIZON_SECS).exp();
        let delta = sample - self.mean;
        self.mean += alpha * delta;
        self.variance = (1.0 - alpha) * (self.variance + alpha * delta * delta);
    }

    /// Seconds until `position` is admitted: (low, expected, high), or None
    /// when nothing has been admitted lately and there is no basis to guess.
    pub(crate) fn eta(&self, position: u64) -> Option<(u64, u64, u64)> {
        if !self.primed || self.mean < 1e-6 {
            return None;
        }
        let p = position as f64;
        let spread = 1.5 * self.variance.sqrt();
        let fast = self.mean + spread;
        let slow = (self.mean - spread).max(self.mean / 3.0);
        let secs = |rate: f64| (p / rate).ceil() as u64;
        Some((secs(fast), secs(self.mean), secs(slow)))
    }

    /// Which 25%-wide band (on a log scale) the rate falls in; rates under
    /// one admission a minute all share one band. The rate drifts a little
    /// on every tick, even in a quiet room; only a move to another band is
    /// worth telling every waiting visitor about.
    pub(crate) fn band(&self) -> i64 {
        let per_second = self.mean;
        if per_second.is_nan() || per_second < 1.0 / 60.0 {
            return i64::MIN;
        }
        (per_second.ln() / 1.25f64.ln()).floor() as i64
    }
}

/// A cap on new admissions per minute as a GCRA (generic cell rate
/// algorithm): admissions are spaced `interval_us` apart on average, with
/// a burst of up to one second's worth (a cap of 600 a minute admits 10 at
/// once, then one every 100 ms). The state it works on is one "theoretical
/// arrival time" (TAT) in microseconds, kept by the store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AdmitCap {
    /// Microseconds between admissions; 0 means no cap.
    pub interval_us: u64,
    /// How far ahead of now the TAT may run (the burst, less one).
    pub tolerance_us: u64,
}

impl AdmitCap {
    /// No cap.
    pub(crate) const NONE: AdmitCap = AdmitCap {
        interval_us: 0,
        tolerance_us: 0,
    };

    pub(crate) fn per_minute(per_minute: Option<u32>) -> Self {
        let Some(per_minute) = per_minute.filter(|&p| p > 0) else {
            return Self::NONE;
        };
        let interval_us = 60_000_000 / u64::from(per_minute);
        let burst = u64::from(per_minute / 60).max(1);
        Self {
            interval_us,
            tolerance_us: interval_us * (burst - 1),
        }
    }

    pub(crate) fn is_none(&self) -> bool {
        self.interval_us == 0
    }

    /// One admission at `now_us` against the stored `tat_us`: the new TAT
    /// if the cap allows it, `None` if it must wait.
    pub(crate) fn take(&self, tat_us: u64, now_us: u64) -> Option<u64> {
        if self.is_none() {
            return Some(tat_us);
        }
        let start = tat_us.max(now_us);
        (start - now_us <= self.tolerance_us).then_some(start + self.interval_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_is_unknown_until_something_was_admitted() {
        let mut r = AdmissionRate::default();
        assert_eq!(r.eta(10), None);
        r.observe(0, 1000);
        assert_eq!(r.eta(10), None);
    }

    #[test]
    fn a_steady_rate_gives_a_tight_range() {
        let mut r = AdmissionRate::default();
        for _ in 0..100 {
            r.observe(10, 1000);
        }
        assert_eq!(r.eta(100), Some((10, 10, 10)));
    }

    #[test]
    fn a_jumpy_rate_widens_the_range() {
        let mut r = AdmissionRate::default();
        for i in 0..100 {
            r.observe(if i % 2 == 0 { 2 } else { 18 }, 1000);
        }
        let (low, mid, high) = r.eta(100).unwrap();
        assert!(low < mid && mid < high, "{low} {mid} {high}");
    }

    #[test]
    fn bands_are_a_quarter_wide_and_idle_is_one_band() {
        let rate = |mean| AdmissionRate {
            mean,
            ..AdmissionRate::default()
        };
        assert_eq!(rate(10.0).band(), rate(9.7).band());
        assert_ne!(rate(10.0).band(), rate(7.0).band());
        assert_eq!(rate(0.001).band(), rate(0.0001).band());
        assert_eq!(rate(f64::NAN).band(), rate(0.0).band());
    }

    #[test]
    fn the_cap_allows_a_second_of_burst_then_paces() {
        let cap = AdmitCap::per_minute(Some(600)); // 10 per second
        let now = 1_000_000_000;
        let mut tat = 0;
        let mut taken = 0;
        for _ in 0..50 {
            if let Some(next) = cap.take(tat, now) {
                tat = next;
                taken += 1;
            }
        }
        assert_eq!(taken, 10);
        assert_eq!(cap.take(tat, now + 50_000), None);
        assert!(cap.take(tat, now + 100_000).is_some());
        assert_eq!(AdmitCap::per_minute(None).take(5, now), Some(5));
        assert_eq!(AdmitCap::per_minute(Some(0)), AdmitCap::NONE);
        // Under one a second: a burst of one.
        let slow = AdmitCap::per_minute(Some(30));
        assert_eq!((slow.interval_us, slow.tolerance_us), (2_000_000, 0));
    }
}
