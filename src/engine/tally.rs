//! What a room's engine holds besides its tickets and settings: where the
//! permits are, the counters that no ticket's state implies (hand-offs,
//! skips, returns, the peak, the waits) and its estimate of the admission
//! rate.
//!
//! A room restored from its image alone rebuilds these as a restart does
//! (every free permit in the worker's hand, the counters recounted from
//! the tickets), which is right for an engine that goes on deciding. A
//! replica that only shows the room — another instance following the
//! owner's log — must show the owner's figures instead, so the owner sends
//! its tally with each batch of its log and the replica adopts it.

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::room::Room;
use super::rules::AdmissionRate;
use super::view::WaitSnapshot;
use crate::locks::lock;

/// A room's figures as its owner has them (see the module's comment).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoomTally {
    pub tray: u64,
    pub debt: u64,
    pub handoffs: u64,
    pub skips: u64,
    pub returns: u64,
    pub peak_admitted: u64,
    pub waits: WaitSnapshot,
    pub rate: AdmissionRate,
}

impl Room {
    /// The figures to send a replica.
    pub(crate) fn tally(&self) -> RoomTally {
        let c = &self.counters;
        RoomTally {
            tray: self.tray.load(Ordering::Acquire),
            debt: self.debt.load(Ordering::Acquire),
            handoffs: c.handoffs.load(Ordering::Relaxed),
            skips: c.skips.load(Ordering::Relaxed),
            returns: c.returns.load(Ordering::Relaxed),
            peak_admitted: self.peak_admitted.load(Ordering::Acquire),
            waits: self.waits.snapshot(),
            rate: lock(&self.worker).rate,
        }
    }

    /// Show the owner's figures: for a replica that never decides. The
    /// worker's hand (and, if need be, the debt) is what the rest leaves of
    /// the permits, so the ledger balances whatever moved between the tally
    /// and the tickets it came with. The view is published again by the owner's rule, from the
    /// figures adopted.
    pub(crate) fn adopt(&self, tally: &RoomTally) {
        let c = &self.counters;
        let mut w = lock(&self.worker);
        let capacity = u64::from(self.hot.capacity.load(Ordering::Acquire));
        let admitted = self.admitted.load(Ordering::Acquire);
        // A tally taken between an admission on borrowed permits and the
        // debt it runs up shows less debt than the admissions imply: the
        // admissions are what happened.
        let debt = tally
            .debt
            .max((tally.tray + admitted).saturating_sub(capacity));
        self.tray.store(tally.tray, Ordering::Release);
        self.debt.store(debt, Ordering::Release);
        w.hand = (capacity + debt).saturating_sub(tally.tray + admitted);
        w.rate = tally.rate;
        c.handoffs.store(tally.handoffs, Ordering::Relaxed);
        c.skips.store(tally.skips, Ordering::Relaxed);
        c.returns.store(tally.returns, Ordering::Relaxed);
        self.peak_admitted
            .fetch_max(tally.peak_admitted, Ordering::AcqRel);
        self.waits.set(&tally.waits);
        self.publish_locked(&w, self.clock.now_ms(), false);
    }
}
