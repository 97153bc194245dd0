//! A ticket (整理券): one visitor's place in a room, and its life cycle.
//!
//! Every transition is a compare-and-swap on the ticket's atomic state. That
//! is what makes the semaphore safe without locks: the worker revoking a
//! stalled permit, the visitor releasing it and an operator revoking it may
//! race, but exactly one CAS out of `Admitted` succeeds, so exactly one of
//! them gives the permit back. A late release of a revoked ticket fails its
//! CAS and frees nothing (invariant 5).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

use super::image::TicketImage;
pub(crate) use super::rules::TicketState;

/// A ticket's id within its room: the order in which tickets were issued.
/// Not the same as the queue number when a lottery reorders the pre-queue.
pub type TicketId = u32;

/// Sentinel for "not placed in the queue yet" (pre-queue before the draw).
pub(crate) const NOT_QUEUED: u32 = u32::MAX;

/// One ticket, stored inline in the room's append-only ticket vector. Kept
/// small on purpose: a million of them wait in a busy room.
#[derive(Debug)]
pub(crate) struct Ticket {
    state: AtomicU8,
    /// Seen at least once since admission (a gate check): until then the
    /// pass lapses after `arrival_grace`, afterwards after `pass_idle`.
    arrived: AtomicBool,
    /// Whether this ticket's departure from the line has been counted, so
    /// that the two racing sides (a departure before the ticket's index is
    /// set, and the enqueue that sets it) count it exactly once.
    departure_counted: AtomicBool,
    /// Index in the room's queue; its queue number is this plus one.
    queue_index: AtomicU32,
    /// The lowest position ever reported, so that what a visitor sees never
    /// goes up even when a concurrent reader races a departure.
    reported_position: AtomicU32,
    /// People ahead when the ticket was placed, for the progress bar.
    initial_ahead: AtomicU32,
    pub(crate) joined_at: u64,
    admitted_at: AtomicU64,
    last_seen: AtomicU64,
    /// Instances holding a live stream open for it: while any does, its
    /// visitor is present.
    holders: AtomicU16,
    /// The lane it queues in, for life: its queue index is in that lane's
    /// line.
    pub(crate) lane: u8,
}

impl Ticket {
    pub(crate) fn new(now_ms: u64, lane: u8) -> Self {
        Self {
            state: AtomicU8::new(TicketState::Waiting.code()),
            arrived: AtomicBool::new(false),
            departure_counted: AtomicBool::new(false),
            queue_index: AtomicU32::new(NOT_QUEUED),
            reported_position: AtomicU32::new(u32::MAX),
            initial_ahead: AtomicU32::new(0),
            joined_at: now_ms,
            admitted_at: AtomicU64::new(0),
            last_seen: AtomicU64::new(now_ms),
            holders: AtomicU16::new(0),
            lane,
        }
    }

    // State and queue index use SeqCst: a departure writes the state then
    // reads the index, while `enqueue` writes the index then reads the
    // state, and at least one of them must see the other's write.
    pub(crate) fn state(&self) -> TicketState {
        TicketState::from_code(self.state.load(Ordering::SeqCst)).unwrap_or(TicketState::Abandoned)
    }

    /// The one way a state changes: succeeds only if nobody else moved the
    /// ticket first.
    pub(crate) fn transition(&self, from: TicketState, to: TicketState) -> bool {
        self.state
            .compare_exchange(from.code(), to.code(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    pub(crate) fn queue_index(&self) -> Option<u32> {
        match self.queue_index.load(Ordering::SeqCst) {
            NOT_QUEUED => None,
            i => Some(i),
        }
    }

    pub(crate) fn set_queue_index(&self, index: u32, ahead: u32) {
        self.initial_ahead.store(ahead, Ordering::Relaxed);
        self.queue_index.store(index, Ordering::SeqCst);
    }

    /// The queue index to count as a departure, the first time only.
    pub(crate) fn departure_to_count(&self) -> Option<u32> {
        let index = self.queue_index()?;
        (!self.departure_counted.swap(true, Ordering::AcqRel)).then_some(index)
    }

    pub(crate) fn initial_ahead(&self) -> u32 {
        self.initial_ahead.load(Ordering::Relaxed)
    }

    /// Clamp a freshly computed position to never exceed one already shown.
    pub(crate) fn report_position(&self, computed: u32) -> u32 {
        let previous = self.reported_position.fetch_min(computed, Ordering::AcqRel);
        previous.min(computed)
    }

    pub(crate) fn admitted_at(&self) -> u64 {
        self.admitted_at.load(Ordering::Acquire)
    }

    pub(crate) fn set_admitted_at(&self, now_ms: u64) {
        self.admitted_at.store(now_ms, Ordering::Release);
    }

    // SeqCst: a sign of life writes `last_seen` then reads the state, the
    // head moves the state to away then reads `last_seen` again, and one
    // of them must see the other (so a visitor who shows up as they are
    // skipped is put back at once).
    pub(crate) fn last_seen(&self) -> u64 {
        self.last_seen.load(Ordering::SeqCst)
    }

    /// A sign of life that is not an arrival.
    pub(crate) fn seen(&self, now_ms: u64) {
        self.last_seen.fetch_max(now_ms, Ordering::SeqCst);
    }

    // SeqCst for the same reason as `last_seen`: a hold is a sign of life.
    pub(crate) fn is_held(&self) -> bool {
        self.holders.load(Ordering::SeqCst) > 0
    }

    pub(crate) fn hold(&self) {
        let _ = self
            .holders
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_add(1));
    }

    pub(crate) fn unhold(&self) {
        let _ = self
            .holders
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// Record a sign of life; on an admitted ticket it also counts as the
    /// visitor's arrival. Also says whether this was that first arrival.
    pub(crate) fn touch(&self, now_ms: u64) -> (TicketState, bool) {
        let mut state = self.state();
        let mut first_arrival = false;
        if state.is_live() {
            self.last_seen.fetch_max(now_ms, Ordering::SeqCst);
            if state == TicketState::Admitted {
                first_arrival = !self.arrived.swap(true, Ordering::AcqRel);
            }
            // Read again after the write: the head may have just skipped it.
            state = self.state();
        }
        (state, first_arrival)
    }

    /// A ticket as it was saved. A placed ticket that ended has had its
    /// departure from the line counted (whoever restores the room records
    /// it once); an unplaced one's is counted when the draw places it. A
    /// waiting or away one still has its departure ahead of it: an away
    /// ticket whose visitor comes back stands in the line's back set until
    /// it is admitted or ends, exactly as in the room it was saved from.
    pub(crate) fn restore(state: TicketState, saved: &TicketImage) -> Self {
        let index = saved.index;
        let ended = !matches!(state, TicketState::Waiting | TicketState::Away);
        Self {
            state: AtomicU8::new(state.code()),
            arrived: AtomicBool::new(saved.arrived),
            departure_counted: AtomicBool::new(ended && index.is_some()),
            queue_index: AtomicU32::new(index.unwrap_or(NOT_QUEUED)),
            reported_position: AtomicU32::new(u32::MAX),
            initial_ahead: AtomicU32::new(saved.ahead),
            joined_at: saved.joined_at,
            admitted_at: AtomicU64::new(saved.admitted_at),
            last_seen: AtomicU64::new(saved.last_seen),
            holders: AtomicU16::new(0),
            lane: saved.lane,
        }
    }

    pub(crate) fn has_arrived(&self) -> bool {
        self.arrived.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_one_transition_out_of_a_state_wins() {
        let t = Ticket::new(0, 0);
        assert!(t.transition(TicketState::Waiting, TicketState::Admitted));
        assert!(!t.transition(TicketState::Waiting, TicketState::Left));
        assert!(t.transition(TicketState::Admitted, TicketState::Expired));
        // A late release of an expired permit frees nothing.
        assert!(!t.transition(TicketState::Admitted, TicketState::Released));
        assert_eq!(t.state(), TicketState::Expired);
    }

    #[test]
    fn reported_position_never_goes_up() {
        let t = Ticket::new(0, 0);
        assert_eq!(t.report_position(7), 7);
        assert_eq!(t.report_position(9), 7);
        assert_eq!(t.report_position(3), 3);
    }

    #[test]
    fn a_ticket_stays_small() {
        assert!(std::mem::size_of::<Ticket>() <= 48);
    }
}
