//! A hashed timer wheel: the times a shard's streams are next due (a
//! cadence's look again, a keep-alive), kept in slots of a fixed width
//! instead of a timer per stream. Inserting is O(1); each tick takes the
//! slots that came due. An entry only says "look at this stream about
//! then": the stream itself knows whether it is really due (it may have
//! been rescheduled or have gone since), so stale entries cost a check.

/// When an entry was asked for, and which stream it is for: its slot in
/// the shard and that slot's era, so an entry outliving its stream
/// (or the time it was for) wakes nobody.
pub(crate) type Entry = (u64, u32, u32);

#[derive(Debug)]
pub(crate) struct Wheel {
    slot_ms: u64,
    slots: Vec<Vec<Entry>>,
    /// Everything due before this time has been taken.
    done_to: u64,
}

impl Wheel {
    /// `slots` slots of `slot_ms` each: entries further out than the
    /// wheel's span go in its last slot and are looked at (and put back)
    /// then.
    pub(crate) fn new(slot_ms: u64, slots: usize, now: u64) -> Self {
        Self {
            slot_ms,
            slots: vec![Vec::new(); slots],
            done_to: now / slot_ms * slot_ms,
        }
    }

    fn span(&self) -> u64 {
        self.slot_ms * self.slots.len() as u64
    }

    /// Look at `entry` at about `at` (never before; up to a slot later).
    pub(crate) fn insert(&mut self, entry: Entry) {
        let at = entry
            .0
            .clamp(self.done_to, self.done_to + self.span() - self.slot_ms);
        let slot = (at / self.slot_ms) as usize % self.slots.len();
        self.slots[slot].push(entry);
    }

    /// Every entry due by `now`, into `due`.
    pub(crate) fn take_due(&mut self, now: u64, due: &mut Vec<Entry>) {
        if now < self.done_to {
            return;
        }
        let first = self.done_to / self.slot_ms;
        let last = now / self.slot_ms;
        // The slot `now` falls in is not over yet: take it next time,
        // unless the whole wheel went by.
        let slots = (last - first).min(self.slots.len() as u64);
        for k in 0..slots {
            let slot = ((first + k) % self.slots.len() as u64) as usize;
            due.append(&mut self.slots[slot]);
        }
        self.done_to = (first + slots) * self.slot_ms;
        if slots == self.slots.len() as u64 {
            self.done_to = last * self.slot_ms;
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.slots.iter().all(Vec::is_empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_comes_due_in_its_slot_never_before() {
        let mut w = Wheel::new(250, 8, 1_000);
        w.insert((1_600, 1, 0));
        w.insert((1_000, 2, 0));
        let mut due = Vec::new();
        w.take_due(1_249, &mut due);
        assert!(due.is_empty());
        w.take_due(1_250, &mut due);
        assert_eq!(due, [(1_000, 2, 0)]);
        due.clear();
        w.take_due(1_700, &mut due);
        assert!(due.is_empty(), "1,600 is in the slot 1,500–1,750");
        w.take_due(1_750, &mut due);
        assert_eq!(due, [(1_600, 1, 0)]);
        assert!(w.is_empty());
    }

    #[test]
    fn far_entries_wait_in_the_last_slot_and_a_jump_takes_everything() {
        let mut w = Wheel::new(250, 4, 0);
        w.insert((60_000, 1, 0));
        let mut due = Vec::new();
        w.take_due(1_000, &mut due);
        assert_eq!(
            due,
            [(60_000, 1, 0)],
            "looked at once the wheel's span has passed"
        );
        due.clear();
        w.insert((1_100, 2, 0));
        w.insert((1_900, 3, 0));
        // A clock that jumps minutes ahead takes every slot once.
        w.take_due(300_000, &mut due);
        due.sort_unstable();
        assert_eq!(due, [(1_100, 2, 0), (1_900, 3, 0)]);
        w.insert((300_000, 4, 0));
        due.clear();
        w.take_due(300_250, &mut due);
        assert_eq!(due, [(300_000, 4, 0)]);
    }
}
