//! Rates: how fast a room admits (for waiting-time estimates) and the
//! optional cap on new admissions per minute.

use std::sync::atomic::{AtomicU64, Ordering};

/// An exponentially weighted estimate of admissions per second and of its
/// spread, updated by the worker once per tick. The spread turns a single
/// guess into an honest range ("about 4–7 minutes").
#[derive(Debug, Clone, Copy, Default, PartialEq)]
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

    pub fn observe(&mut self, admissions: u64, elapsed_ms: u64) {
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
    pub fn eta(&self, position: u64) -> Option<(u64, u64, u64)> {
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
}

/// A cap on admissions per minute, as a GCRA (generic cell rate algorithm)
/// on one atomic: the "theoretical arrival time" of the next allowed
/// admission. Releasers and the worker both draw from it without a lock.
#[derive(Debug)]
pub(crate) struct AdmitLimiter {
    /// Microseconds since the Unix epoch; 0 = never used.
    tat_us: AtomicU64,
}

impl AdmitLimiter {
    pub(crate) fn new() -> Self {
        Self {
            tat_us: AtomicU64::new(0),
        }
    }

    /// Take one admission if the cap allows it now. A burst of up to one
    /// second's worth is allowed, so a cap of 600/min admits 10 per tick.
    pub(crate) fn try_take(&self, per_minute: Option<u32>, now_ms: u64) -> bool {
        let Some(per_minute) = per_minute.filter(|&p| p > 0) else {
            return true;
        };
        let interval = 60_000_000 / u64::from(per_minute);
        let burst = u64::from(per_minute / 60).max(1);
        let tolerance = interval * (burst - 1);
        let now = now_ms * 1000;
        let mut tat = self.tat_us.load(Ordering::Acquire);
        loop {
            let start = tat.max(now);
            if start - now > tolerance {
                return false;
            }
            match self.tat_us.compare_exchange_weak(
                tat,
                start + interval,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(current) => tat = current,
            }
        }
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
    fn the_limiter_allows_a_second_of_burst_then_paces() {
        let l = AdmitLimiter::new();
        let cap = Some(600); // 10 per second
        let now = 1_000_000;
        let taken = (0..50).filter(|_| l.try_take(cap, now)).count();
        assert_eq!(taken, 10);
        assert!(!l.try_take(cap, now + 50));
        assert!(l.try_take(cap, now + 100));
        assert!(l.try_take(None, now));
    }
}
