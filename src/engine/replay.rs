//! A room that follows another room's records instead of deciding: how an
//! instance that does not own a room keeps its copy of it, one record at a
//! time, with the engine's own types (so every read — a status, a position,
//! the gate, a stream — is the engine's code, as on the owner).
//!
//! Each record is the change the owner's engine made, and is made here the
//! same way: a join pushes the ticket and places it in its lane's line, an
//! admission or a skip moves the lane's head past it, a departure records
//! it in the lane's index, a return puts it in the back set. Nothing here
//! picks a ticket, moves a permit or starts a timeout: where the permits
//! are, and the counters no ticket implies, come with the owner's tally
//! ([`Room::adopt`]).
//!
//! The owner's threads report their changes as they make them, so two
//! joins may be reported in the other order than their tickets were
//! numbered or placed, and a ticket may be admitted before its join is
//! reported. Records are therefore applied in the engine's order: a join
//! waits for the tickets numbered before it, a place in a line for the
//! places before it, and a change to a ticket for the ticket's join.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::event::EventRecord;
use super::room::Room;
use super::rules::TicketState;
use super::ticket::{Ticket, TicketId};
use crate::locks::{lock, write};

/// A room kept by applying another room's records.
pub(crate) struct Replayer {
    room: Arc<Room>,
    /// Joins reported before a ticket numbered ahead of them.
    joins: BTreeMap<TicketId, EventRecord>,
    /// Per lane: places reported before a place ahead of them.
    places: Vec<BTreeMap<u32, (TicketId, u32)>>,
    /// Changes to tickets whose join is not applied yet.
    early: HashMap<TicketId, Vec<EventRecord>>,
}

impl Replayer {
    /// Follow `room`'s records from the state it is in (restored from an
    /// image, with no sink and no worker).
    pub(crate) fn new(room: Arc<Room>) -> Self {
        let places = (0..room.lines.len()).map(|_| BTreeMap::new()).collect();
        Self {
            room,
            joins: BTreeMap::new(),
            places,
            early: HashMap::new(),
        }
    }

    pub(crate) fn room(&self) -> &Arc<Room> {
        &self.room
    }

    /// Whether every record so far has been applied (none waits for one
    /// reported later).
    #[cfg(test)]
    pub(crate) fn is_settled(&self) -> bool {
        self.joins.is_empty() && self.early.is_empty() && self.places.iter().all(BTreeMap::is_empty)
    }

    /// Whether a ticket's join has come but waits for a record reported
    /// after it (the ticket is known in a moment).
    pub(crate) fn is_pending(&self, ticket: TicketId) -> bool {
        self.joins.contains_key(&ticket)
            || self
                .places
                .iter()
                .any(|p| p.values().any(|&(id, _)| id == ticket))
    }

    /// Apply one record of the owner's engine.
    pub(crate) fn apply(&mut self, record: &EventRecord) {
        let ticket = match record {
            EventRecord::Joined { ticket, .. } => {
                self.joins.insert(*ticket, record.clone());
                self.drain_joins();
                return;
            }
            EventRecord::Admitted { ticket, .. }
            | EventRecord::Ended { ticket, .. }
            | EventRecord::Arrived { ticket, .. }
            | EventRecord::Away { ticket, .. }
            | EventRecord::Back { ticket, .. }
            | EventRecord::Subscribed { ticket, .. }
            | EventRecord::Unsubscribed { ticket }
            | EventRecord::Notified { ticket, .. } => *ticket,
            EventRecord::Opened { order, at } => {
                self.opened(order, *at);
                return;
            }
            EventRecord::Settings(s) => {
                self.room.replay_settings(s);
                return;
            }
            EventRecord::Closed => {
                // A replica has no sink: this only closes it.
                self.room.close();
                return;
            }
        };
        if !self.is_placed(ticket) {
            self.early.entry(ticket).or_default().push(record.clone());
            return;
        }
        self.change(record);
    }

    /// Whether a ticket's join has been applied, with its place in line if
    /// it has one.
    fn is_placed(&self, ticket: TicketId) -> bool {
        self.room.ticket(ticket).is_some()
            && !self
                .places
                .iter()
                .any(|p| p.values().any(|&(id, _)| id == ticket))
    }

    fn drain_joins(&mut self) {
        loop {
            let next = self.room.tickets.count() as TicketId;
            let Some(EventRecord::Joined {
                ticket,
                identity,
                lane,
                index,
                ahead,
                at,
            }) = self.joins.remove(&next)
            else {
                return;
            };
            let room = &self.room;
            let lane = if usize::from(lane) < room.lines.len() {
                lane
            } else {
                0
            };
            let id = room.tickets.push(Ticket::new(at, lane)) as TicketId;
            debug_assert_eq!(id, ticket);
            if let Some(identity) = identity {
                room.restore_identity(identity, id);
            }
            room.waiting.fetch_add(1, Ordering::AcqRel);
            room.lines[usize::from(lane)]
                .waiting
                .fetch_add(1, Ordering::AcqRel);
            room.counters.joins.fetch_add(1, Ordering::Relaxed);
            match index {
                Some(index) => {
                    self.places[usize::from(lane)].insert(index, (id, ahead));
                    self.drain_places(lane);
                }
                None => {
                    if let Some(pre) = lock(&room.prequeue).as_mut() {
                        pre.push(id);
                    }
                    self.settle(id);
                }
            }
        }
    }

    fn drain_places(&mut self, lane: u8) {
        let room = self.room.clone();
        let line = &room.lines[usize::from(lane)];
        loop {
            let next = line.queue.count() as u32;
            let Some((id, ahead)) = self.places[usize::from(lane)].remove(&next) else {
                return;
            };
            let index = line.queue.push(id) as u32;
            debug_assert_eq!(index, next);
            if let Some(t) = self.room.ticket(id) {
                t.set_queue_index(index, ahead);
            }
            self.settle(id);
        }
    }

    /// A ticket's join is applied: apply what came for it before.
    fn settle(&mut self, id: TicketId) {
        if let Some(records) = self.early.remove(&id) {
            for record in &records {
                self.change(record);
            }
        }
        self.room.changes().mark();
    }

    fn opened(&mut self, order: &[TicketId], at: u64) {
        let room = &self.room;
        {
            let mut s = write(&room.settings);
            if s.opens_at.is_none_or(|t| t > at) {
                s.opens_at = Some(at);
            }
        }
        lock(&room.prequeue).take();
        for &id in order {
            room.enqueue(id);
        }
        let _ = room.drawn.set(order.to_vec());
        room.hot.open.store(true, Ordering::Release);
        room.changes().bump();
    }

    /// A change to a ticket whose join is applied.
    fn change(&self, record: &EventRecord) {
        let room = &self.room;
        match *record {
            EventRecord::Admitted { ticket, at } => {
                let Some(t) = room.ticket(ticket) else { return };
                t.set_admitted_at(at);
                if t.transition(TicketState::Waiting, TicketState::Admitted) {
                    room.waiting.fetch_sub(1, Ordering::AcqRel);
                    room.admitted.fetch_add(1, Ordering::AcqRel);
                    let line = room.line_of(t);
                    line.waiting.fetch_sub(1, Ordering::AcqRel);
                    line.admitted.fetch_add(1, Ordering::AcqRel);
                    if let Some(qi) = t.queue_index() {
                        line.index.popped(qi);
                    }
                    room.counters.admissions.fetch_add(1, Ordering::Relaxed);
                    room.waits.record(at.saturating_sub(t.joined_at));
                }
                room.notify_ticket(ticket);
            }
            EventRecord::Ended { ticket, state, .. } => {
                let Some(t) = room.ticket(ticket) else { return };
                let from = t.state();
                if !from.is_live() || !t.transition(from, state) {
                    return;
                }
                let line = room.line_of(t);
                match from {
                    TicketState::Waiting => {
                        room.waiting.fetch_sub(1, Ordering::AcqRel);
                        line.waiting.fetch_sub(1, Ordering::AcqRel);
                        if let Some(qi) = t.departure_to_count() {
                            line.index.departed(qi);
                        }
                    }
                    TicketState::Admitted => {
                        room.admitted.fetch_sub(1, Ordering::AcqRel);
                        line.admitted.fetch_sub(1, Ordering::AcqRel);
                    }
                    _ => {}
                }
                let c = &room.counters;
                let counter = match state {
                    TicketState::Released => &c.releases,
                    TicketState::Revoked => &c.revocations,
                    TicketState::Expired => &c.expirations,
                    TicketState::Abandoned => &c.abandonments,
                    _ => &c.leaves,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                room.callbacks.remove(ticket);
                room.changes().mark();
                room.notify_ticket(ticket);
            }
            EventRecord::Subscribed {
                ticket,
                ref callback,
            } if room.state_of(ticket).is_some_and(TicketState::is_live) => {
                let old = room.callbacks.get(ticket);
                let kept = crate::engine::CallbackState::replacing(callback.clone(), old.as_ref());
                room.callbacks.set(ticket, kept);
            }
            EventRecord::Unsubscribed { ticket } => {
                room.callbacks.remove(ticket);
            }
            EventRecord::Notified { ticket, notice } => {
                room.callbacks.mark(ticket, notice);
            }
            EventRecord::Arrived { ticket, at } => {
                if let Some(t) = room.ticket(ticket) {
                    t.touch(at);
                }
            }
            EventRecord::Away { ticket, .. } => {
                let Some(t) = room.ticket(ticket) else { return };
                if t.transition(TicketState::Waiting, TicketState::Away) {
                    room.waiting.fetch_sub(1, Ordering::AcqRel);
                    let line = room.line_of(t);
                    line.waiting.fetch_sub(1, Ordering::AcqRel);
                    if let Some(qi) = t.queue_index() {
                        line.index.popped(qi);
                    }
                    room.changes().mark();
                }
                room.notify_ticket(ticket);
            }
            EventRecord::Back { ticket, at } => {
                let Some(t) = room.ticket(ticket) else { return };
                // Every place shown before the line moves back stays shown:
                // count each waiting ticket of the lane now.
                let lane = t.lane;
                for i in 0..room.tickets.count() {
                    if let Some(w) = room.tickets.get(i)
                        && w.lane == lane
                        && w.state() == TicketState::Waiting
                    {
                        let _ = room.ticket_facts(i as TicketId);
                    }
                }
                if t.transition(TicketState::Away, TicketState::Waiting) {
                    t.touch(at);
                    room.waiting.fetch_add(1, Ordering::AcqRel);
                    let line = room.line_of(t);
                    line.waiting.fetch_add(1, Ordering::AcqRel);
                    if let Some(qi) = t.queue_index() {
                        line.index.go_back(qi);
                    }
                    room.changes().mark();
                }
                room.notify_ticket(ticket);
            }
            _ => {}
        }
    }
}

impl Room {
    /// The whole new settings, as an operator's change left them.
    fn replay_settings(&self, s: &super::RoomSettings) {
        let _w = lock(&self.worker);
        *write(&self.settings) = s.clone();
        self.hot.capacity.store(s.capacity, Ordering::Release);
        self.hot.paused.store(s.paused, Ordering::Release);
        self.hot.mode.store(s.mode.code(), Ordering::Release);
        for (line, weight) in self.lines.iter().zip(s.lane_weights()) {
            line.weight.store(weight, Ordering::Release);
        }
        self.hot.store_timeouts(s);
        self.changes().bump();
    }
}
