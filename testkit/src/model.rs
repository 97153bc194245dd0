//! The fair semaphore as a plain sequential program, written for clarity
//! only, and random sequences of operations on it: model-based tests run
//! the same sequence against the engine (directly, through the embedded
//! backend, and through several instances on Redis whose rooms change
//! owner) and require that they agree with the model on every ticket's
//! state and position and on where every permit is.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use narabu::engine::rules::Mode;
use narabu::engine::{RoomId, RoomSettings, TicketState};
use proptest::prelude::*;

pub const T0: u64 = 1_800_000_000_000;
pub const QUEUE_IDLE: u64 = 30_000;
pub const PASS_IDLE: u64 = 60_000;
pub const ARRIVAL_GRACE: u64 = 20_000;
pub const AWAY_GRACE: u64 = 10_000;

#[derive(Clone, Debug)]
pub enum Op {
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

pub fn op() -> impl Strategy<Value = Op> {
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
pub struct MTicket {
    pub state: TicketState,
    admitted_at: u64,
    last_seen: u64,
    arrived: bool,
}

/// The semaphore as a sequential program, written for clarity only.
#[derive(Debug)]
pub struct Model {
    pub now: u64,
    pub capacity: u64,
    pub hand: u64,
    pub tray: u64,
    pub debt: u64,
    pub paused: bool,
    pub mode: Mode,
    queue: Vec<usize>,
    head: usize,
    /// Queue indices of away tickets whose visitor came back: ahead of the
    /// main line, lowest first.
    back: BTreeSet<usize>,
    pub tickets: Vec<MTicket>,
    identities: HashMap<u8, usize>,
    pub admissions: u64,
}

impl Model {
    pub fn new(capacity: u32) -> Self {
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

    pub fn admitted(&self) -> u64 {
        self.tickets
            .iter()
            .filter(|t| t.state == TicketState::Admitted)
            .count() as u64
    }

    pub fn admitting(&self) -> bool {
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

    pub fn join(&mut self, identity: Option<u8>) -> Option<(usize, bool)> {
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

    pub fn end(&mut self, id: usize, admitted_to: TicketState, waiting_to: TicketState) {
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

    pub fn release(&mut self, id: usize) {
        if self.tickets[id].state == TicketState::Admitted {
            self.tickets[id].state = TicketState::Released;
            self.give_back();
        }
    }

    pub fn touch(&mut self, id: usize) {
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

    pub fn tick(&mut self) {
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
        // Quiet waiting tickets, returners ahead of the head included.
        let returners: Vec<usize> = self.back.iter().copied().collect();
        for i in returners.into_iter().chain(self.head..self.queue.len()) {
            let id = self.queue[i];
            if self.tickets[id].state == TicketState::Waiting && self.quiet(id) {
                self.tickets[id].state = TicketState::Abandoned;
                self.back.remove(&i);
            }
        }
        for id in 0..self.tickets.len() {
            if self.tickets[id].state == TicketState::Away && self.quiet(id) {
                self.tickets[id].state = TicketState::Abandoned;
            }
        }
    }

    /// A new owner took the room over: every waiting, away or admitted
    /// visitor counts as seen now (the log does not carry signs of life).
    pub fn owner_changed(&mut self) {
        let now = self.now;
        for t in &mut self.tickets {
            if matches!(
                t.state,
                TicketState::Waiting | TicketState::Away | TicketState::Admitted
            ) {
                t.last_seen = t.last_seen.max(now);
            }
        }
    }

    pub fn set_capacity(&mut self, capacity: u32) {
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

    pub fn position(&self, id: usize) -> Option<u64> {
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

/// A room as the model assumes it: no lottery, no lanes, the model's
/// timeouts, and no join limit (the model issues any number of tickets).
pub fn settings(id: &str, capacity: u32) -> RoomSettings {
    let mut settings = RoomSettings::new(RoomId::new(id).unwrap());
    settings.capacity = capacity;
    settings.queue_idle = Duration::from_millis(QUEUE_IDLE);
    settings.pass_idle = Duration::from_millis(PASS_IDLE);
    settings.arrival_grace = Duration::from_millis(ARRIVAL_GRACE);
    settings.away_grace = Duration::from_millis(AWAY_GRACE);
    settings.join_limit_per_minute = 0;
    settings
}
