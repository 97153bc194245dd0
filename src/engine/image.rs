//! A room as plain data: what a snapshot stores and what start-up rebuilds
//! a live room from.
//!
//! [`Room::image`] copies a running room out (without stopping it);
//! [`RoomImage::apply`] replays an [`RoomEvent`] onto an image; and
//! [`Room::restore`] builds a live room from an image. Together they let a
//! backend persist rooms as "snapshot + the events since", with the engine
//! doing no I/O.
//!
//! Replay is tolerant by design. An image taken while the room runs is not
//! a single instant: events that happened just after it started may or may
//! not show in it, and will be replayed on top. So every event is
//! idempotent on the image (a ticket's state only moves forward: waiting,
//! then admitted, then one final state; queue indices are set, never
//! shifted), and replay of the events of one ticket in any order gives the
//! same ticket. Tickets whose join never became durable leave gaps; these
//! become "left" placeholders so ids and queue numbers stay exactly as the
//! visitors were told.
//!
//! What is not kept: where each free permit was (hand or tray: on restore
//! they are all in the worker's hand, which keeps conservation and liveness
//! — the next tick hands them out), the wait histogram and the admission
//! rate estimate (statistics that rebuild within a minute).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::callbacks::CallbackState;
use super::clock::Clock;
use super::event::{EventSink, RoomEvent};
use super::lottery::LotterySeed;
use super::room::Room;
use super::settings::RoomSettings;
use super::ticket::{NOT_QUEUED, Ticket, TicketId, TicketState};

/// One ticket as data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TicketImage {
    /// `None` for an id whose join was never recorded (a gap).
    pub state: Option<TicketState>,
    pub index: Option<u32>,
    pub identity: Option<u128>,
    /// Whether the join itself is known (not just a later event).
    pub joined: bool,
    /// People ahead when the ticket was placed (for the progress bar).
    pub ahead: u32,
    pub joined_at: u64,
    pub admitted_at: u64,
    pub last_seen: u64,
    pub arrived: bool,
    /// The lane it queues in; `index` is in that lane's line.
    pub lane: u8,
    /// How to call its visitor back, if they asked, and what was said.
    pub callback: Option<CallbackState>,
}

impl TicketImage {
    fn unknown() -> Self {
        Self {
            state: None,
            index: None,
            identity: None,
            joined: false,
            ahead: 0,
            joined_at: 0,
            admitted_at: 0,
            last_seen: 0,
            arrived: false,
            lane: 0,
            callback: None,
        }
    }
}

/// One room as data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoomImage {
    pub settings: RoomSettings,
    pub epoch: u64,
    pub lottery: Option<[u8; 32]>,
    pub open: bool,
    pub closed: bool,
    pub handoffs: u64,
    pub peak_admitted: u64,
    pub tickets: Vec<TicketImage>,
    /// Each lane's line: queue index → ticket id; `u32::MAX` where the
    /// ticket is unknown.
    pub queues: Vec<Vec<TicketId>>,
    /// The pre-queue in the order the opening placed it (each ticket at
    /// the front of its own lane, in this order).
    pub drawn: Option<Vec<TicketId>>,
}

/// How far along its life a state is: events never move a ticket back.
fn rank(state: Option<TicketState>) -> u8 {
    match state {
        None => 0,
        // Away is waiting out of the line: a ticket moves between the two.
        Some(TicketState::Waiting | TicketState::Away) => 1,
        Some(TicketState::Admitted) => 2,
        Some(_) => 3,
    }
}

impl RoomImage {
    fn slot(&mut self, id: TicketId) -> &mut TicketImage {
        let i = id as usize;
        if self.tickets.len() <= i {
            self.tickets.resize(i + 1, TicketImage::unknown());
        }
        &mut self.tickets[i]
    }

    fn place(&mut self, id: TicketId, lane: u8, index: u32) {
        let (l, i) = (usize::from(lane), index as usize);
        if self.queues.len() <= l {
            self.queues.resize(l + 1, Vec::new());
        }
        let queue = &mut self.queues[l];
        if queue.len() <= i {
            queue.resize(i + 1, NOT_QUEUED);
        }
        queue[i] = id;
        let t = self.slot(id);
        t.index = Some(index);
        t.lane = lane;
    }

    /// Move a ticket forward to `state`; false if it was already there or
    /// further.
    fn advance(&mut self, id: TicketId, state: TicketState) -> bool {
        let t = self.slot(id);
        if rank(Some(state)) > rank(t.state) {
            t.state = Some(state);
            true
        } else {
            false
        }
    }

    /// Replay one event. Idempotent, and tolerant of the events of one
    /// ticket arriving in any order.
    pub(crate) fn apply(&mut self, event: RoomEvent<'_>) {
        match event {
            RoomEvent::Joined {
                ticket,
                identity,
                lane,
                index,
                ahead,
                at,
            } => {
                let t = self.slot(ticket);
                t.lane = lane;
                if let Some(identity) = identity {
                    t.identity = Some(identity.0);
                }
                if !t.joined {
                    t.joined = true;
                    t.joined_at = at;
                    t.ahead = ahead;
                    t.last_seen = t.last_seen.max(at);
                }
                self.advance(ticket, TicketState::Waiting);
                if let Some(index) = index {
                    self.place(ticket, lane, index);
                }
            }
            RoomEvent::Admitted { ticket, at } => {
                if self.advance(ticket, TicketState::Admitted) {
                    let t = self.slot(ticket);
                    t.admitted_at = at;
                    t.last_seen = t.last_seen.max(at);
                }
            }
            RoomEvent::Ended { ticket, state, at } => {
                if state == TicketState::Expired || state == TicketState::Released {
                    // Only admitted tickets end this way; a lost admission
                    // event still leaves its mark.
                    let t = self.slot(ticket);
                    if t.admitted_at == 0 {
                        t.admitted_at = at;
                    }
                }
                self.advance(ticket, state);
                self.slot(ticket).callback = None;
            }
            RoomEvent::Arrived { ticket, at } => {
                let t = self.slot(ticket);
                t.arrived = true;
                t.last_seen = t.last_seen.max(at);
            }
            RoomEvent::Opened { order, at } => {
                self.open = true;
                if self.settings.opens_at.is_none_or(|t| t > at) {
                    self.settings.opens_at = Some(at);
                }
                // Each lane's front, in drawn order (a pre-queue ticket's
                // join, with its lane, is recorded before the opening).
                let mut next = [0u32; RoomSettings::MAX_LANES];
                for &id in order {
                    let lane = self.slot(id).lane;
                    let slot = &mut next[usize::from(lane) % RoomSettings::MAX_LANES];
                    self.place(id, lane, *slot);
                    *slot += 1;
                }
                self.drawn = Some(order.to_vec());
            }
            RoomEvent::Settings(s) => self.settings = s.clone(),
            RoomEvent::Closed => self.closed = true,
            // Between waiting and away only: an ended ticket stays ended.
            RoomEvent::Away { ticket, .. } => {
                let t = self.slot(ticket);
                if t.state == Some(TicketState::Waiting) {
                    t.state = Some(TicketState::Away);
                }
            }
            RoomEvent::Back { ticket, at } => {
                let t = self.slot(ticket);
                if t.state == Some(TicketState::Away) {
                    t.state = Some(TicketState::Waiting);
                    t.last_seen = t.last_seen.max(at);
                }
            }
            // Only a live ticket keeps a callback (an end may come first
            // when two threads race).
            RoomEvent::Subscribed { ticket, callback } => {
                let t = self.slot(ticket);
                if rank(t.state) <= 1 {
                    let kept = CallbackState::replacing(callback.clone(), t.callback.as_ref());
                    t.callback = Some(kept);
                }
            }
            RoomEvent::Unsubscribed { ticket } => self.slot(ticket).callback = None,
            RoomEvent::Notified { ticket, notice } => {
                if let Some(c) = &mut self.slot(ticket).callback {
                    c.mark(notice);
                }
            }
        }
    }

    /// Tickets by state, for checks and logs.
    pub fn count(&self, state: TicketState) -> usize {
        self.tickets
            .iter()
            .filter(|t| t.state == Some(state))
            .count()
    }
}

impl Room {
    /// Copy the room out as data. Runs beside visitors and the worker; see
    /// the module comment for why a slightly smeared copy is enough.
    pub fn image(&self) -> RoomImage {
        let mut identity_of: HashMap<TicketId, u128> = HashMap::new();
        for entry in self.identities_iter() {
            identity_of.insert(entry.1, entry.0.0);
        }
        let n = self.tickets.count();
        let tickets = (0..n)
            .map(|i| match self.tickets.get(i) {
                Some(t) => TicketImage {
                    state: Some(t.state()),
                    index: t.queue_index(),
                    identity: identity_of.get(&(i as TicketId)).copied(),
                    joined: true,
                    ahead: t.initial_ahead(),
                    joined_at: t.joined_at,
                    admitted_at: t.admitted_at(),
                    last_seen: t.last_seen(),
                    arrived: t.has_arrived(),
                    lane: t.lane,
                    callback: self.callbacks.get(i as TicketId),
                },
                None => TicketImage::unknown(),
            })
            .collect();
        let queues = self
            .lines
            .iter()
            .map(|line| {
                (0..line.queue.count())
                    .map(|i| line.queue.get(i).copied().unwrap_or(NOT_QUEUED))
                    .collect()
            })
            .collect();
        RoomImage {
            settings: self.settings(),
            epoch: self.epoch(),
            lottery: self.lottery.as_ref().map(|s| s.0),
            open: self.hot.open.load(Ordering::Acquire),
            closed: self.hot.closed.load(Ordering::Acquire),
            handoffs: self.counters.handoffs.load(Ordering::Relaxed),
            peak_admitted: self.peak_admitted.load(Ordering::Relaxed),
            tickets,
            queues,
            drawn: self.drawn.get().cloned(),
        }
    }

    /// Rebuild a live room from an image. Timeouts are not applied here:
    /// the worker's first tick expires passes and skips quiet tickets by
    /// the usual rules, with the clock's "now", so time spent down counts.
    pub fn restore(
        image: RoomImage,
        clock: Arc<dyn Clock>,
        sink: Option<Arc<dyn EventSink>>,
    ) -> Arc<Room> {
        let RoomImage {
            settings,
            epoch,
            lottery,
            open,
            closed,
            handoffs,
            peak_admitted,
            mut tickets,
            mut queues,
            drawn,
        } = image;
        // Queue slots whose ticket is unknown get a placeholder that has
        // left, so later numbers keep their meaning.
        for (lane, queue) in queues.iter_mut().enumerate() {
            for (i, id) in queue.iter_mut().enumerate() {
                if *id == NOT_QUEUED || (*id as usize) >= tickets.len() {
                    *id = tickets.len() as TicketId;
                    let mut ghost = TicketImage::unknown();
                    ghost.index = Some(i as u32);
                    ghost.lane = lane as u8;
                    tickets.push(ghost);
                }
            }
        }
        let mut prequeue = Vec::new();
        for (id, t) in tickets.iter_mut().enumerate() {
            let unplaced_after_opening = open && t.index.is_none();
            if t.state.is_none()
                || (unplaced_after_opening && t.state == Some(TicketState::Waiting))
            {
                // Never acknowledged: its join did not become durable.
                t.state = Some(TicketState::Left);
            }
            if !open && t.index.is_none() {
                prequeue.push(id as TicketId);
            }
        }
        let room = Room::with_parts(
            settings,
            clock,
            epoch,
            lottery.map(LotterySeed),
            (!open).then_some(prequeue),
            sink,
        );
        room.load(tickets, queues, closed, handoffs, peak_admitted);
        if let Some(order) = drawn {
            let _ = room.drawn.set(order);
        }
        room
    }

    fn load(
        &self,
        tickets: Vec<TicketImage>,
        queues: Vec<Vec<TicketId>>,
        closed: bool,
        handoffs: u64,
        peak_admitted: u64,
    ) {
        let c = &self.counters;
        let (mut waiting, mut admitted) = (0u64, 0u64);
        for (id, t) in tickets.iter().enumerate() {
            let state = t.state.unwrap_or(TicketState::Left);
            let ticket = Ticket::restore(state, t);
            self.tickets.push(ticket);
            if let Some(identity) = t.identity {
                self.restore_identity(identity, id as TicketId);
            }
            if let Some(callback) = &t.callback
                && state.is_live()
            {
                self.callbacks.set(id as TicketId, callback.clone());
            }
            let was_admitted = t.admitted_at > 0
                && matches!(
                    state,
                    TicketState::Admitted
                        | TicketState::Released
                        | TicketState::Expired
                        | TicketState::Revoked
                );
            let counter = match state {
                // Out of the line until its visitor comes back; the worker
                // abandons it if they stay quiet past `queue_idle`.
                TicketState::Away => {
                    self.skipped_log.push(id as TicketId);
                    None
                }
                TicketState::Waiting => {
                    waiting += 1;
                    if let Some(line) = self.lines.get(usize::from(t.lane)) {
                        line.waiting.fetch_add(1, Ordering::Relaxed);
                    }
                    None
                }
                TicketState::Admitted => {
                    admitted += 1;
                    if let Some(line) = self.lines.get(usize::from(t.lane)) {
                        line.admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    self.admitted_log.push(id as TicketId);
                    None
                }
                TicketState::Released => Some(&c.releases),
                TicketState::Revoked => Some(&c.revocations),
                TicketState::Expired => Some(&c.expirations),
                TicketState::Left => t.joined.then_some(&c.leaves),
                TicketState::Abandoned => Some(&c.abandonments),
            };
            if let Some(counter) = counter {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            if t.joined {
                c.joins.fetch_add(1, Ordering::Relaxed);
            }
            if was_admitted {
                c.admissions.fetch_add(1, Ordering::Relaxed);
            }
        }
        for (line, queue) in self.lines.iter().zip(&queues) {
            for &id in queue {
                line.queue.push(id);
            }
            let head = queue
                .iter()
                .position(|&id| self.state_of(id) == Some(TicketState::Waiting))
                .unwrap_or(queue.len());
            for (i, &id) in queue.iter().enumerate().skip(head) {
                if self.state_of(id) != Some(TicketState::Waiting) {
                    line.index.record_departure(i as u32);
                }
            }
            line.index.head.store(head as u32, Ordering::Release);
        }
        c.handoffs.store(handoffs, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Release);
        self.admitted.store(admitted, Ordering::Release);
        self.peak_admitted
            .store(peak_admitted.max(admitted), Ordering::Release);
        let capacity = u64::from(self.hot.capacity.load(Ordering::Acquire));
        self.debt
            .store(admitted.saturating_sub(capacity), Ordering::Release);
        self.set_hand(capacity.saturating_sub(admitted));
        self.hot.closed.store(closed, Ordering::Release);
        self.publish_view(self.clock.now_ms(), true);
    }
}
