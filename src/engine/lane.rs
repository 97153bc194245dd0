//! One lane's position index: what the count of tickets waiting ahead of a
//! queue slot is computed from, wherever the line itself is kept.
//!
//! The embedded engine pops its line through this index (`head` is the
//! poppers' cursor) and records departures in it, so the count is always
//! exact there. An instance on Redis keeps a replica of the same type per
//! room, fed by the room's change log, so its streams count positions
//! locally instead of asking Redis. Either way the count is
//! `(qi - head) - departed in [head, qi)`, plus the returners of the back
//! set, who stand ahead of the whole main line.

use std::collections::BTreeSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::departures::Departures;
use crate::locks::{read, write};

/// One lane's head, departures and back set.
#[derive(Debug, Default)]
pub(crate) struct LaneIndex {
    /// The next queue index to pop from the main line.
    pub(crate) head: AtomicU32,
    departures: Departures,
    /// Tickets that were skipped at the head and came back (their queue
    /// indices, all below `head`): poppers take them lowest first, before
    /// the main line.
    back: RwLock<BTreeSet<u32>>,
    /// `back.len()`, read without the lock on every count.
    back_len: AtomicU64,
    /// Departures and back-set removals recorded: with the head, how far
    /// the line has moved ([`Self::moves`]).
    moved: AtomicU64,
}

impl LaneIndex {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The next queue index to pop from the main line.
    pub(crate) fn head(&self) -> u32 {
        self.head.load(Ordering::Acquire)
    }

    /// How far the line has moved: a count that grows by at least one
    /// whenever a waiting ticket leaves it (popped at the head, taken from
    /// the back set, departed), and sometimes more. A ticket's count ahead
    /// can have fallen by at most its growth since it was read, so a
    /// stream that needs its place to fall by `k` sleeps until the count
    /// has grown by `k`. It counts from this index's start: another copy
    /// of the line counts afresh.
    pub(crate) fn moves(&self) -> u64 {
        u64::from(self.head()) + self.moved.load(Ordering::Acquire)
    }

    /// Tickets waiting ahead of the ticket at `qi`: its rank in the back
    /// set, or the whole back set plus those between the head and it in
    /// the main line. `None` when `qi` is neither (the head passed it and
    /// it did not come back).
    pub(crate) fn ahead(&self, qi: u32) -> Option<u64> {
        let back_len = self.back_len.load(Ordering::Acquire);
        if back_len > 0 {
            let back = read(&self.back);
            if back.contains(&qi) {
                return Some(back.range(..qi).count() as u64);
            }
        }
        let head = self.head();
        if qi < head {
            return None;
        }
        Some(back_len + self.departures.waiting_ahead(head, qi))
    }

    /// The ticket at `qi` left the line while waiting (in the main line or
    /// in the back set).
    pub(crate) fn departed(&self, qi: u32) {
        if !self.leave_back(qi) {
            self.record_departure(qi);
        }
    }

    /// A replica's pop: the ticket at `qi` was taken from the back set, or
    /// else the head moved past it.
    pub(crate) fn popped(&self, qi: u32) {
        if !self.leave_back(qi) {
            self.head.fetch_max(qi.saturating_add(1), Ordering::AcqRel);
        }
    }

    /// A skipped ticket came back: it goes ahead of the main line.
    pub(crate) fn go_back(&self, qi: u32) {
        if write(&self.back).insert(qi) {
            self.back_len.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The returners' queue slots, lowest first (a sweep's: few at a time).
    pub(crate) fn returners(&self) -> Vec<u32> {
        if self.back_len.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        read(&self.back).iter().copied().collect()
    }

    /// The lowest returner, taken out of the back set (a popper's).
    pub(crate) fn take_back(&self) -> Option<u32> {
        if self.back_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let taken = write(&self.back).pop_first();
        if taken.is_some() {
            self.back_len.fetch_sub(1, Ordering::AcqRel);
            self.moved.fetch_add(1, Ordering::AcqRel);
        }
        taken
    }

    pub(crate) fn back_len(&self) -> u64 {
        self.back_len.load(Ordering::Acquire)
    }

    fn leave_back(&self, qi: u32) -> bool {
        if self.back_len.load(Ordering::Acquire) == 0 {
            return false;
        }
        let removed = write(&self.back).remove(&qi);
        if removed {
            self.back_len.fetch_sub(1, Ordering::AcqRel);
            self.moved.fetch_add(1, Ordering::AcqRel);
        }
        removed
    }

    /// A replica's starting point: the head, the departed slots from the
    /// head on, and the back set, as a snapshot of the line gives them.
    #[cfg(test)]
    pub(crate) fn restored(
        head: u32,
        departed: impl IntoIterator<Item = u32>,
        back: &[u32],
    ) -> Self {
        let index = Self::new();
        index.head.store(head, Ordering::Release);
        for qi in departed {
            index.departures.record(qi);
        }
        for &qi in back {
            index.go_back(qi);
        }
        index
    }

    /// Record a departure without touching the back set (the engine's own
    /// bookkeeping of a slot it knows is in the main line).
    pub(crate) fn record_departure(&self, qi: u32) {
        self.departures.record(qi);
        self.moved.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_line_and_the_back_set() {
        let lane = LaneIndex::new();
        // Slots 0..10; 0 and 1 popped, 4 departed.
        lane.popped(0);
        lane.popped(1);
        lane.departed(4);
        assert_eq!(lane.head(), 2);
        assert_eq!(lane.ahead(2), Some(0));
        assert_eq!(lane.ahead(5), Some(2));
        assert_eq!(lane.ahead(1), None);
        // Slot 1 (skipped) comes back: ahead of the whole main line.
        lane.go_back(1);
        assert_eq!(lane.ahead(1), Some(0));
        assert_eq!(lane.ahead(5), Some(3));
        // A pop of a returner leaves the head alone.
        lane.popped(1);
        assert_eq!((lane.head(), lane.ahead(5)), (2, Some(2)));
        lane.go_back(0);
        lane.go_back(1);
        assert_eq!(lane.ahead(1), Some(1));
        lane.departed(0);
        assert_eq!(lane.ahead(1), Some(0));
        assert_eq!(lane.take_back(), Some(1));
        assert_eq!(lane.take_back(), None);
        assert_eq!(lane.back_len(), 0);
    }

    #[test]
    fn a_place_falls_by_no_more_than_the_line_moved() {
        let lane = LaneIndex::new();
        let ahead = |lane: &LaneIndex| lane.ahead(50).unwrap();
        let (mut before, mut moves) = (ahead(&lane), lane.moves());
        let steps: [&dyn Fn(&LaneIndex); 6] = [
            &|l| l.popped(0),
            &|l| l.departed(7),
            &|l| l.go_back(0),
            &|l| l.popped(0),
            &|l| l.departed(3),
            &|l| {
                l.popped(1);
                l.popped(2);
            },
        ];
        for step in steps {
            step(&lane);
            let (now, moved) = (ahead(&lane), lane.moves());
            assert!(moved >= moves && before.saturating_sub(now) <= moved - moves);
            (before, moves) = (now, moved);
        }
        assert_eq!(ahead(&lane), 45);
    }

    #[test]
    fn a_restored_replica_counts_as_the_original() {
        let lane = LaneIndex::new();
        for qi in [3, 7, 8] {
            lane.departed(qi);
        }
        lane.popped(2);
        lane.go_back(1);
        let copy = LaneIndex::restored(3, [3, 7, 8], &[1]);
        for qi in 0..12 {
            assert_eq!(lane.ahead(qi), copy.ahead(qi), "qi {qi}");
        }
    }
}
