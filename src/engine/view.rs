//! What the engine shows the outside: the room view that many readers
//! follow, one ticket's status, and the counters operators watch.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::rate::AdmissionRate;
use super::ticket::{TicketId, TicketState};

/// The room as a whole, published through a `tokio::sync::watch` after each
/// tick that changed something and after every operator action. Tens of
/// thousands of waiting streams follow it: a change wakes each of them once,
/// and each recomputes its own position from the engine's atomics.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RoomView {
    /// Bumped on every published change.
    pub version: u64,
    /// When this view was taken (Unix ms).
    pub at_ms: u64,
    pub capacity: u32,
    /// Tickets waiting (queued or in the pre-queue).
    pub waiting: u64,
    /// Visitors holding a permit.
    pub admitted: u64,
    /// Permits in the worker's hand.
    pub held: u64,
    /// Permits on the tray (given back while nobody waited).
    pub tray: u64,
    /// Permits still owed after a capacity decrease.
    pub debt: u64,
    pub paused: bool,
    pub open: bool,
    pub closed: bool,
    pub opens_at: Option<u64>,
    /// SHA-256 of the lottery seed (published before opening).
    pub lottery_commitment: Option<String>,
    /// The seed itself, once the draw is done.
    pub lottery_seed: Option<String>,
    /// Admissions per second, smoothed.
    pub admit_rate: f64,
    #[serde(skip)]
    pub rate: AdmissionRate,
    pub admissions_total: u64,
    /// New tickets one client address may take per minute (0: no limit);
    /// published so the HTTP layer can enforce it without asking.
    pub join_limit_per_minute: u32,
}

impl RoomView {
    /// True when the two views differ in anything a visitor or operator
    /// could see (everything but the version and timestamp).
    ///
    /// The smoothed admission rate drifts a little on every tick, even in a
    /// quiet room; republishing for that alone would wake every waiting
    /// stream each tick to show an estimate a second or two different. The
    /// rate counts as changed when it moves to another 25% band, or becomes
    /// primed. The Redis backend's `publish_view` (lib.lua) applies the same
    /// rule and must change with it.
    pub(crate) fn differs_from(&self, other: &RoomView) -> bool {
        let strip = |v: &RoomView| RoomView {
            version: 0,
            at_ms: 0,
            admit_rate: 0.0,
            rate: AdmissionRate {
                primed: v.rate.primed,
                ..AdmissionRate::default()
            },
            ..v.clone()
        };
        strip(self) != strip(other) || rate_band(self.admit_rate) != rate_band(other.admit_rate)
    }
}

/// An estimated wait, in seconds, as a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Eta {
    pub low_secs: u64,
    pub expected_secs: u64,
    pub high_secs: u64,
}

/// Which 25%-wide band (on a log scale) an admission rate falls in; rates
/// under one admission a minute all share one band.
fn rate_band(per_second: f64) -> i64 {
    if per_second.is_nan() || per_second < 1.0 / 60.0 {
        return i64::MIN;
    }
    (per_second.ln() / 1.25f64.ln()).floor() as i64
}

/// One ticket as its holder sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TicketStatus {
    pub id: TicketId,
    pub state: TicketState,
    /// Queue number (1-based); `None` in the pre-queue before the draw.
    pub number: Option<u64>,
    /// Tickets still waiting ahead, plus one; `None` unless waiting and placed.
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub eta: Option<Eta>,
    /// 0.0 at join, 1.0 at the head of the line.
    pub progress: f64,
    pub queue_length: u64,
    pub joined_at: u64,
    pub admitted_at: Option<u64>,
    /// For an admitted ticket: when the pass lapses without activity.
    pub pass_expires_at: Option<u64>,
    pub opens_at: Option<u64>,
    pub paused: bool,
    pub closed: bool,
}

/// Counters since the room was created.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub joins: AtomicU64,
    pub admissions: AtomicU64,
    pub handoffs: AtomicU64,
    pub releases: AtomicU64,
    pub leaves: AtomicU64,
    pub revocations: AtomicU64,
    pub expirations: AtomicU64,
    pub abandonments: AtomicU64,
}

/// Upper bounds (ms) of the wait-time histogram buckets: join to admission.
pub const WAIT_BUCKETS_MS: [u64; 14] = [
    100,
    500,
    1_000,
    2_000,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_800_000,
    3_600_000,
    u64::MAX,
];

/// A fixed-bucket histogram of waits, lock-free, in the shape Prometheus
/// wants; quantiles are read off the buckets (upper bound of the bucket).
#[derive(Debug, Default)]
pub(crate) struct WaitHistogram {
    buckets: [AtomicU64; WAIT_BUCKETS_MS.len()],
    sum_ms: AtomicU64,
}

impl WaitHistogram {
    pub(crate) fn record(&self, wait_ms: u64) {
        let i = WAIT_BUCKETS_MS
            .iter()
            .position(|&b| wait_ms <= b)
            .unwrap_or(WAIT_BUCKETS_MS.len() - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(wait_ms, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WaitSnapshot {
        WaitSnapshot {
            counts: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_ms: self.sum_ms.load(Ordering::Relaxed),
        }
    }
}

/// A copy of the wait histogram.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WaitSnapshot {
    /// Count per bucket of `WAIT_BUCKETS_MS` (not cumulative).
    pub counts: [u64; WAIT_BUCKETS_MS.len()],
    pub sum_ms: u64,
}

impl WaitSnapshot {
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The bucket bound under which fraction `q` of waits fell.
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(WAIT_BUCKETS_MS[i]);
            }
        }
        None
    }
}

/// Figures for operators.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RoomStats {
    pub joins: u64,
    pub admissions: u64,
    pub handoffs: u64,
    pub releases: u64,
    pub leaves: u64,
    pub revocations: u64,
    pub expirations: u64,
    pub abandonments: u64,
    pub peak_admitted: u64,
    pub waits: WaitSnapshot,
}

/// Where every permit is, for the conservation invariant:
/// `held + tray + admitted == capacity + debt` whenever no release is in
/// flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PermitLedger {
    pub capacity: u64,
    pub held: u64,
    pub tray: u64,
    pub admitted: u64,
    pub debt: u64,
}

impl PermitLedger {
    pub fn balances(&self) -> bool {
        self.held + self.tray + self.admitted == self.capacity + self.debt
    }
}

/// What one tick did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    pub opened: bool,
    /// Permits the worker took from the tray into its empty hand.
    pub from_tray: u64,
    pub admitted: Vec<TicketId>,
    pub expired: Vec<TicketId>,
    pub abandoned: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_bucket_bounds() {
        let h = WaitHistogram::default();
        for ms in [50, 60, 70, 400, 9_000] {
            h.record(ms);
        }
        let s = h.snapshot();
        assert_eq!(s.total(), 5);
        assert_eq!(s.quantile_ms(0.5), Some(100));
        assert_eq!(s.quantile_ms(0.8), Some(500));
        assert_eq!(s.quantile_ms(0.95), Some(10_000));
        assert_eq!(WaitSnapshot::default().quantile_ms(0.5), None);
    }

    #[test]
    fn a_drifting_rate_alone_is_not_a_change() {
        let base = RoomView {
            admit_rate: 10.0,
            ..RoomView::default()
        };
        let drifted = RoomView {
            admit_rate: 9.7,
            version: 9,
            at_ms: 1234,
            ..base.clone()
        };
        assert!(!drifted.differs_from(&base));
        let fallen = RoomView {
            admit_rate: 7.0,
            ..base.clone()
        };
        assert!(fallen.differs_from(&base));
        let longer = RoomView {
            waiting: 1,
            ..base.clone()
        };
        assert!(longer.differs_from(&base));
        let idle = RoomView {
            admit_rate: 0.001,
            ..base.clone()
        };
        let idler = RoomView {
            admit_rate: 0.0001,
            ..base
        };
        assert!(!idler.differs_from(&idle));
    }
}
