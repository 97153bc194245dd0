//! Time, behind a trait, so that every timeout in the engine is tested on
//! virtual time instead of sleeps.
//!
//! The engine reads wall-clock Unix milliseconds rather than `Instant`s:
//! ticket timestamps must mean the same thing after a restart (the journal)
//! and on every instance (the Redis backend).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};

/// A source of "now" in Unix milliseconds.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;

    fn now(&self) -> Timestamp {
        Timestamp(self.now_ms())
    }
}

/// A moment as Unix milliseconds: what the engine and the stores keep.
/// Shown to people and programs as RFC 3339 in UTC (`2026-12-01T01:00:00Z`),
/// formatted here and nowhere else.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, utoipa::ToSchema)]
#[schema(value_type = String, format = DateTime)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub(crate) fn ms(self) -> u64 {
        self.0
    }

    fn to_jiff(self) -> Option<jiff::Timestamp> {
        i64::try_from(self.0)
            .ok()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
    }

    /// `2026-12-01 01:00 UTC` (with the date) or `01:00:05 UTC`: the text a
    /// page shows before its script puts it in the reader's time zone.
    pub(crate) fn display_utc(self, with_date: bool) -> String {
        let Some(t) = self.to_jiff() else {
            return String::new();
        };
        let format = if with_date {
            "%Y-%m-%d %H:%M UTC"
        } else {
            "%H:%M:%S UTC"
        };
        t.strftime(format).to_string()
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339; a moment past what RFC 3339 can hold (after the year
    /// 9999) shows as nothing rather than as a wrong date.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_jiff() {
            Some(t) => fmt::Display::fmt(&t, f),
            None => Ok(()),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn set(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Milliseconds in a duration, saturating rather than wrapping.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        let shared = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        shared.advance(Duration::from_millis(250));
        assert_eq!(clock.now_ms(), 1_250);
        clock.set(5);
        assert_eq!(shared.now_ms(), 5);
    }

    #[test]
    fn timestamps_show_as_rfc3339_in_utc() {
        assert_eq!(
            Timestamp(1_796_086_800_000).to_string(),
            "2026-12-01T01:00:00Z"
        );
        assert_eq!(
            Timestamp(1_796_086_800_123).to_string(),
            "2026-12-01T01:00:00.123Z"
        );
        assert_eq!(
            serde_json::to_string(&Timestamp(0)).unwrap(),
            "\"1970-01-01T00:00:00Z\""
        );
        assert_eq!(
            Timestamp(1_796_086_805_000).display_utc(false),
            "01:00:05 UTC"
        );
        assert_eq!(
            Timestamp(1_796_086_805_000).display_utc(true),
            "2026-12-01 01:00 UTC"
        );
        assert_eq!(Timestamp(u64::MAX).to_string(), "");
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
