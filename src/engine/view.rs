//! What the engine shows the outside besides a ticket's status: the room
//! view that many readers follow, and the counters operators watch.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::rules::{
    AdmissionRate, LaneLoads, Mode, PassTimeouts, RoomFacts, WAIT_BUCKETS_MS, wait_bucket,
};
use super::ticket::TicketId;

/// The room as a whole, published through a `tokio::sync::watch` after each
/// tick that changed something and after every operator action. Tens of
/// thousands of waiting streams follow it: a change wakes each of them once,
/// and each recomputes its own position. What counts as a change is
/// `rules::worth_publishing`. It carries everything a ticket's status needs
/// of the room ([`RoomView::facts`]), so a status can be computed wherever
/// the view is followed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// How the room queues now (`rules::Mode`).
    #[serde(default)]
    pub mode: Mode,
    /// Units left to sell; `None` for a room that does not count stock.
    #[serde(default)]
    pub stock: Option<u64>,
    pub opens_at: Option<u64>,
    /// SHA-256 of the lottery seed (published before opening).
    pub lottery_commitment: Option<String>,
    /// The seed itself, once the draw is done.
    pub lottery_seed: Option<String>,
    /// Admissions per second, smoothed, for waiting-time estimates.
    pub rate: AdmissionRate,
    pub admissions_total: u64,
    /// The worker's tick, in ms.
    pub tick_ms: u64,
    pub timeouts: PassTimeouts,
    /// Each priority lane, in order; empty for a room without lanes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneView>,
}

/// One priority lane as the room's view shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LaneView {
    pub name: String,
    pub weight: u32,
    /// Tickets waiting in the lane.
    pub waiting: u64,
    /// Permits the lane's visitors hold.
    pub admitted: u64,
}

impl RoomView {
    /// What a ticket's status needs of the room, with the line's length
    /// as of now (the view's own is as of its last publication).
    pub(crate) fn facts(&self, waiting: u64) -> RoomFacts {
        RoomFacts {
            open: self.open,
            paused: self.paused,
            closed: self.closed,
            mode: self.mode,
            stock: self.stock,
            opens_at: self.opens_at,
            waiting,
            free_permits: self.held + self.tray,
            rate: self.rate,
            tick_ms: self.tick_ms,
            timeouts: self.timeouts,
            lanes: LaneLoads::new(self.lanes.iter().map(|l| (l.weight, l.waiting > 0))),
        }
    }
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
    /// Tickets skipped at the head while their visitor was away.
    pub skips: AtomicU64,
    /// Away tickets whose visitor came back.
    pub returns: AtomicU64,
}

/// A fixed-bucket histogram of waits, lock-free, in the shape Prometheus
/// wants; quantiles are read off the buckets (upper bound of the bucket).
#[derive(Debug, Default)]
pub(crate) struct WaitHistogram {
    buckets: [AtomicU64; WAIT_BUCKETS_MS.len()],
    sum_ms: AtomicU64,
}

impl WaitHistogram {
    pub(crate) fn record(&self, wait_ms: u64) {
        self.buckets[wait_bucket(wait_ms)].fetch_add(1, Ordering::Relaxed);
        self.sum_ms.fetch_add(wait_ms, Ordering::Relaxed);
    }

    /// Take another histogram's counts (a replica adopting its owner's).
    pub(crate) fn set(&self, from: &WaitSnapshot) {
        for (bucket, &count) in self.buckets.iter().zip(&from.counts) {
            bucket.store(count, Ordering::Relaxed);
        }
        self.sum_ms.store(from.sum_ms, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WaitSnapshot {
        WaitSnapshot {
            counts: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_ms: self.sum_ms.load(Ordering::Relaxed),
        }
    }
}

/// A copy of the wait histogram.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitSnapshot {
    /// Count per bucket of `WAIT_BUCKETS_MS` (not cumulative).
    pub counts: [u64; WAIT_BUCKETS_MS.len()],
    pub sum_ms: u64,
}

impl WaitSnapshot {
    pub(crate) fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The bucket bound under which fraction `q` of waits fell.
    pub(crate) fn quantile_ms(&self, q: f64) -> Option<u64> {
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
    /// Skipped at the head while away (each skip counts).
    pub skips: u64,
    /// Away tickets whose visitor came back in time.
    pub returns: u64,
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
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
}
