//! Model-based tests: random sequences of operations run against the engine
//! and against a plain sequential model of the semaphore; the two must agree
//! on every ticket's state and position and on where every permit is, and
//! the semaphore's invariants (capacity never exceeded, strict ticket
//! order, every permit accounted for) must hold after every step.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::rules::Mode;
use super::*;

const T0: u64 = 1_800_000_000_000;
const QUEUE_IDLE: u64 = 30_000;
const PASS_IDLE: u64 = 60_000;
const ARRIVAL_GRACE: u64 = 20_000;
const AWAY_GRACE: u64 = 10_000;

#[derive(Clone, Debug)]
enum Op {
    Join(Option<u8>),
    Leave(usize),
    Release(usize),
    Revoke(usize),
    Touch(usize),
    Tick,
    Advance(u64),
    SetCapacity(u32),
    Pause(bool),
    SetMode(Mode),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::option::weighted(0.3, 0u8..8).prop_map(Op::Join),
        3 => any::<usize>().prop_map(Op::Leave),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Revoke),
        3 => any::<usize>().prop_map(Op::Touch),
        4 => Just(Op::Tick),
        3 => (0u64..25_000).prop_map(Op::Advance),
        1 => (0u32..6).prop_map(Op::SetCapacity),
        1 => any::<bool>().prop_map(Op::Pause),
        1 => proptest::sample::select(Mode::ALL.to_vec()).prop_map(Op::SetMode),
    ]
}

#[derive(Clone, Debug)]
struct MTicket {
    state: TicketState,
    admitted_at: u64,
    last_seen: u64,
    arrived: bool,
}

/// The semaphore as a sequential program, written for clarity only.
#[derive(Debug)]
struct Model {
    now: u64,
    capacity: u64,
    hand: u64,
    tray: u64,
    debt: u64,
    paused: bool,
    mode: Mode,
    queue: Vec<usize>,
    head: usize,
    /// Queue indices of away tickets whose visitor came back: ahead of the
    /// main line, lowest first.
    back: BTreeSet<usize>,
    tickets: Vec<MTicket>,
    identities: HashMap<u8, usize>,
    admissions: u64,
}

impl Model {
    fn new(capacity: u32) -> Self {
        Self {
            now: T0,
            capacity: u64::from(capacity),
            hand: u64::from(capacity),
            tray: 0,
            debt: 0,
            paused: false,
            mode: Mode::Queue,
            queue: Vec::new(),
            head: 0,
            back: BTreeSet::new(),
            tickets: Vec::new(),
            identities: HashMap::new(),
            admissions: 0,
        }
    }

    fn admitted(&self) -> u64 {
        self.tickets
            .iter()
            .filter(|t| t.state == TicketState::Admitted)
            .count() as u64
    }

    fn admitting(&self) -> bool {
        !self.paused && self.mode.admits()
    }

    /// `passthrough`: everyone in line goes in, each permit borrowed.
    fn admit_everyone(&mut self) {
        if self.admitting() && self.mode.admits_everyone() {
            while self.pop().is_some() {
                self.debt += 1;
            }
        }
    }

    fn join(&mut self, identity: Option<u8>) -> Option<(usize, bool)> {
        if self.mode.closes() {
            return None;
        }
        let joined = self.join_line(identity);
        self.admit_everyone();
        Some(joined)
    }

    fn join_line(&mut self, identity: Option<u8>) -> (usize, bool) {
        if let Some(i) = identity.and_then(|i| self.identities.get(&i)) {
            return (*i, false);
        }
        let id = self.tickets.len();
        self.tickets.push(MTicket {
            state: TicketState::Waiting,
            admitted_at: 0,
            last_seen: self.now,
            arrived: false,
        });
        self.queue.push(id);
        if let Some(i) = identity {
            self.identities.insert(i, id);
        }
        (id, true)
    }

    fn quiet(&self, id: usize) -> bool {
        self.tickets[id].last_seen + QUEUE_IDLE < self.now
    }

    fn away(&self, id: usize) -> bool {
        self.tickets[id].last_seen + AWAY_GRACE < self.now
    }

    fn queued(&self) -> bool {
        self.head < self.queue.len() || !self.back.is_empty()
    }

    fn pop(&mut self) -> Option<usize> {
        while self.queued() {
            let id = match self.back.pop_first() {
                Some(qi) => self.queue[qi],
                None => {
                    self.head += 1;
                    self.queue[self.head - 1]
                }
            };
            if self.tickets[id].state != TicketState::Waiting {
                continue;
            }
            if self.quiet(id) {
                self.tickets[id].state = TicketState::Abandoned;
                continue;
            }
            if self.away(id) {
                self.tickets[id].state = TicketState::Away;
                continue;
            }
            let t = &mut self.tickets[id];
            t.state = TicketState::Admitted;
            t.admitted_at = self.now;
            self.admissions += 1;
            return Some(id);
        }
        None
    }

    fn give_back(&mut self) {
        if self.debt > 0 {
            self.debt -= 1;
            return;
        }
        if self.admitting() && self.pop().is_some() {
            return;
        }
        self.tray += 1;
    }

    fn end(&mut self, id: usize, admitted_to: TicketState, waiting_to: TicketState) {
        match self.tickets[id].state {
            TicketState::Admitted => {
                self.tickets[id].state = admitted_to;
                self.give_back();
            }
            TicketState::Waiting | TicketState::Away => {
                self.tickets[id].state = waiting_to;
                self.back.remove(&id);
            }
            _ => {}
        }
    }

    fn release(&mut self, id: usize) {
        if self.tickets[id].state == TicketState::Admitted {
            self.tickets[id].state = TicketState::Released;
            self.give_back();
        }
    }

    fn touch(&mut self, id: usize) {
        let now = self.now;
        let t = &mut self.tickets[id];
        if t.state.is_live() {
            t.last_seen = t.last_seen.max(now);
            if t.state == TicketState::Admitted {
                t.arrived = true;
            }
            if t.state == TicketState::Away {
                t.state = TicketState::Waiting;
                // Ticket ids are queue indices here (no lottery).
                self.back.insert(id);
            }
        }
    }

    fn pay_debt(&mut self) {
        let paid = self.debt.min(self.hand);
        self.debt -= paid;
        self.hand -= paid;
    }

    fn tick(&mut self) {
        let now = self.now;
        for t in &mut self.tickets {
            if t.state != TicketState::Admitted {
                continue;
            }
            let deadline = if t.arrived {
                t.last_seen + PASS_IDLE
            } else {
                t.admitted_at + ARRIVAL_GRACE
            };
            if deadline < now {
                t.state = TicketState::Expired;
                self.hand += 1;
            }
        }
        self.pay_debt();
        if self.admitting() {
            loop {
                if self.hand == 0 {
                    self.hand += std::mem::take(&mut self.tray);
                    self.pay_debt();
                    if self.hand == 0 {
                        break;
                    }
                }
                if !self.queued() {
                    break;
                }
                match self.pop() {
                    Some(_) => self.hand -= 1,
                    None => break,
                }
            }
            self.admit_everyone();
        }
        for i in self.head..self.queue.len() {
            let id = self.queue[i];
            if self.tickets[id].state == TicketState::Waiting && self.quiet(id) {
                self.tickets[id].state = TicketState::Abandoned;
            }
        }
        for id in 0..self.tickets.len() {
            if self.tickets[id].state == TicketState::Away && self.quiet(id) {
                self.tickets[id].state = TicketState::Abandoned;
            }
        }
    }

    fn set_capacity(&mut self, capacity: u32) {
        let capacity = u64::from(capacity);
        if capacity >= self.capacity {
            let more = capacity - self.capacity;
            let cancelled = more.min(self.debt);
            self.debt -= cancelled;
            self.hand += more - cancelled;
        } else {
            let mut less = self.capacity - capacity;
            let from_hand = less.min(self.hand);
            self.hand -= from_hand;
            less -= from_hand;
            let from_tray = less.min(self.tray);
            self.tray -= from_tray;
            less -= from_tray;
            self.debt += less;
        }
        self.capacity = capacity;
    }

    fn position(&self, id: usize) -> Option<u64> {
        if self.tickets[id].state != TicketState::Waiting {
            return None;
        }
        let index = self.queue.iter().position(|&q| q == id)?;
        if self.back.contains(&index) {
            return Some(self.back.range(..index).count() as u64 + 1);
        }
        let ahead = self.queue[self.head.min(index)..index]
            .iter()
            .filter(|&&q| self.tickets[q].state == TicketState::Waiting)
            .count() as u64;
        Some(self.back.len() as u64 + ahead + 1)
    }
}

fn run(initial_capacity: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(T0);
    let mut settings = RoomSettings::new(RoomId::new("model").unwrap());
    settings.capacity = initial_capacity;
    settings.queue_idle = Duration::from_millis(QUEUE_IDLE);
    settings.pass_idle = Duration::from_millis(PASS_IDLE);
    settings.arrival_grace = Duration::from_millis(ARRIVAL_GRACE);
    settings.away_grace = Duration::from_millis(AWAY_GRACE);
    let room = Room::new(settings, Arc::new(clock.clone()));
    let mut model = Model::new(initial_capacity);
    let mut last_positions: HashMap<usize, u64> = HashMap::new();

    for op in ops {
        let admitted_before = model.admitted();
        let admissions_before = room.stats().admissions;
        let pick = |i: usize| (!model.tickets.is_empty()).then(|| i % model.tickets.len());
        match op {
            Op::Join(identity) => {
                let joined = room.join(identity.map(|i| Identity(u128::from(i))));
                match model.join(identity) {
                    Some((expected, is_new)) => {
                        let joined = joined.unwrap();
                        prop_assert_eq!(joined.ticket as usize, expected, "idempotent joins");
                        prop_assert_eq!(joined.is_new, is_new);
                    }
                    None => prop_assert_eq!(joined, Err(JoinError::SoldOut)),
                }
            }
            Op::Leave(i) => {
                if let Some(id) = pick(i) {
                    model.end(id, TicketState::Released, TicketState::Left);
                    room.leave(id as TicketId);
                }
            }
            Op::Release(i) => {
                if let Some(id) = pick(i) {
                    model.release(id);
                    room.release(id as TicketId);
                }
            }
            Op::Revoke(i) => {
                if let Some(id) = pick(i) {
                    model.end(id, TicketState::Revoked, TicketState::Revoked);
                    room.revoke(id as TicketId);
                }
            }
            Op::Touch(i) => {
                if let Some(id) = pick(i) {
                    model.touch(id);
                    room.touch(id as TicketId);
                }
            }
            Op::Tick => {
                model.tick();
                room.tick();
            }
            Op::Advance(ms) => {
                model.now += ms;
                clock.advance(Duration::from_millis(ms));
            }
            Op::SetCapacity(c) => {
                model.set_capacity(c);
                room.set_capacity(c);
            }
            Op::Pause(p) => {
                model.paused = p;
                room.set_paused(p);
            }
            Op::SetMode(m) => {
                model.mode = m;
                room.patch(&RoomPatch {
                    mode: Some(m),
                    ..RoomPatch::default()
                });
            }
        }

        // The engine and the model agree on every ticket.
        for id in 0..model.tickets.len() {
            let status = room.status(id as TicketId).unwrap();
            prop_assert_eq!(status.state, model.tickets[id].state, "ticket {}", id);
            // A returner steps in ahead of the line: the count behind it
            // grows, what each holder is shown does not (invariant 7).
            let position = model
                .position(id)
                .map(|p| last_positions.get(&id).map_or(p, |&before| p.min(before)));
            prop_assert_eq!(status.position, position, "position of ticket {}", id);
            if let Some(p) = position {
                last_positions.insert(id, p);
            }
        }

        // Invariant 4: every permit is somewhere, and in the same place.
        let ledger = room.ledger();
        prop_assert!(ledger.balances(), "{:?}", ledger);
        prop_assert_eq!(ledger.held, model.hand);
        prop_assert_eq!(ledger.tray, model.tray);
        prop_assert_eq!(ledger.debt, model.debt);
        prop_assert_eq!(ledger.admitted, model.admitted());
        prop_assert_eq!(room.stats().admissions, model.admissions);

        // Invariant 1: above capacity (after a decrease, or after
        // passthrough), nobody new gets in, unless the room lets everyone in.
        let admitted_now = ledger.admitted;
        if admitted_now > ledger.capacity && !model.mode.admits_everyone() {
            prop_assert_eq!(room.stats().admissions, admissions_before);
            prop_assert!(admitted_now <= admitted_before);
        }

        // Invariant 3: after a tick, no free permit coexists with a waiter.
        if matches!(op, Op::Tick) && model.admitting() && ledger.held + ledger.tray > 0 {
            prop_assert_eq!(room.waiting_count(), 0, "{:?}", ledger);
        }
        prop_assert_eq!(
            room.waiting_count(),
            model
                .tickets
                .iter()
                .filter(|t| t.state == TicketState::Waiting)
                .count() as u64
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_engine_behaves_like_the_model(
        capacity in 0u32..5,
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        run(capacity, ops)?;
    }
}
