//! One room: the fair semaphore for web sites.
//!
//! The shape is that of a reservation semaphore (予約型セマフォ):
//!
//! - `join` only appends to the queue and answers at once;
//! - the worker (`tick`, in `worker.rs`) hands out the permits in its hand
//!   to the head of the queue, once per tick;
//! - a finisher hands its permit straight to the head (`give_back`); only
//!   when nobody waits does it put the permit on the tray, an atomic counter
//!   the worker empties into its hand when its hand is empty.
//!
//! Each line (one per priority lane; one for a room without lanes) is an
//! append-only vector of ticket ids with a `head` cursor. Whoever pops (a
//! releaser or the worker) picks the lane by the lane rule
//! (`rules::lane_order`: permits shared by weight), claims that line's
//! head index with a CAS, then moves that ticket `Waiting -> Admitted` with
//! a CAS; a ticket that left or went quiet fails the second CAS and is
//! skipped. Claiming indices in order is what makes admission follow queue
//! order exactly within each lane.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use crossbeam_queue::SegQueue;
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::{Notify, watch};

use super::callbacks::{Callback, CallbackState, Callbacks, Callouts, Notice};
use super::changes::Changes;
use super::clock::{Clock, millis};
use super::event::{EventSink, RoomEvent};
use super::holds::{Holds, StreamReport};
use super::lane::LaneIndex;
use super::lottery::LotterySeed;
use super::rules::{
    self, AdmitCap, AtHead, Counter, LaneLoad, MAX_TICKETS, Mode, PassTimeouts, PresenceTimeouts,
    RoomFacts, StockTaken, TicketFacts, TicketStatus,
};
use super::settings::{Order, RoomPatch, RoomSettings};
use super::ticket::{Ticket, TicketId, TicketState};
use super::view::{Counters, LaneView, PermitLedger, RoomStats, RoomView, WaitHistogram};
use super::worker::Worker;
use crate::ids::{Identity, RoomId};
use crate::locks::{lock, read, write};

/// How long an identity keeps answering its ticket.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Binding {
    /// For good, ended or not: an origin-signed account holds one place,
    /// once, so an account whose ticket ended cannot queue again.
    #[default]
    Lasting,
    /// Only while the ticket lives: a client's retry id, free for a new
    /// ticket once its ticket has ended (left, released, revoked, expired,
    /// abandoned), so a key reused later never answers a dead ticket.
    WhileLive,
}

/// The answer to a join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Joined {
    pub ticket: TicketId,
    /// Queue number; `None` while the ticket waits in the pre-queue.
    pub number: Option<u64>,
    /// False when the identity already held this ticket.
    pub is_new: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    #[error("the room is closed")]
    Closed,
    #[error("the room's queue is full")]
    Full,
    #[error("the room is sold out")]
    SoldOut,
}

/// What became of a permit that was given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Handoff {
    /// Went straight to the next waiting ticket.
    To(TicketId),
    /// Nobody could take it now; it waits on the tray for the worker.
    Tray,
    /// Retired to pay for a capacity decrease.
    Retired,
}

/// What `leave`, `release` or `revoke` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Departure {
    /// Left the queue before admission.
    LeftQueue,
    /// Gave a permit back, and this is where it went.
    GaveBack(Handoff),
    /// The ticket was not in a state this call could change (already gone,
    /// or not admitted for a release): nothing was freed.
    Nothing(TicketState),
}

/// The hot copies of settings that the lock-free paths read.
#[derive(Debug)]
pub(crate) struct HotSettings {
    pub capacity: AtomicU32,
    pub paused: AtomicBool,
    pub open: AtomicBool,
    pub closed: AtomicBool,
    /// `rules::Mode`'s code.
    pub mode: AtomicU8,
    pub queue_idle_ms: AtomicU64,
    pub away_grace_ms: AtomicU64,
    pub pass_idle_ms: AtomicU64,
    pub arrival_grace_ms: AtomicU64,
    /// 0 means no cap.
    pub admit_per_minute: AtomicU32,
}

impl HotSettings {
    fn from(s: &RoomSettings, open: bool) -> Self {
        Self {
            capacity: AtomicU32::new(s.capacity),
            paused: AtomicBool::new(s.paused),
            open: AtomicBool::new(open),
            closed: AtomicBool::new(false),
            mode: AtomicU8::new(s.mode.code()),
            queue_idle_ms: AtomicU64::new(millis(s.queue_idle)),
            away_grace_ms: AtomicU64::new(millis(s.away_grace)),
            pass_idle_ms: AtomicU64::new(millis(s.pass_idle)),
            arrival_grace_ms: AtomicU64::new(millis(s.arrival_grace)),
            admit_per_minute: AtomicU32::new(s.admit_per_minute.unwrap_or(0)),
        }
    }

    pub(crate) fn store_timeouts(&self, s: &RoomSettings) {
        self.queue_idle_ms
            .store(millis(s.queue_idle), Ordering::Release);
        self.away_grace_ms
            .store(millis(s.away_grace), Ordering::Release);
        self.pass_idle_ms
            .store(millis(s.pass_idle), Ordering::Release);
        self.arrival_grace_ms
            .store(millis(s.arrival_grace), Ordering::Release);
        self.admit_per_minute
            .store(s.admit_per_minute.unwrap_or(0), Ordering::Release);
    }

    pub(crate) fn mode(&self) -> Mode {
        Mode::from_code(self.mode.load(Ordering::Acquire)).unwrap_or_default()
    }

    /// Whether permits go to the line now: open, not paused, and a mode
    /// that admits.
    pub(crate) fn admitting(&self) -> bool {
        self.open.load(Ordering::Acquire)
            && !self.paused.load(Ordering::Acquire)
            && self.mode().admits()
    }

    pub(crate) fn admit_cap(&self) -> AdmitCap {
        AdmitCap::per_minute(Some(self.admit_per_minute.load(Ordering::Acquire)))
    }

    pub(crate) fn presence(&self) -> PresenceTimeouts {
        PresenceTimeouts {
            away_grace_ms: self.away_grace_ms.load(Ordering::Acquire),
            queue_idle_ms: self.queue_idle_ms.load(Ordering::Acquire),
        }
    }

    pub(crate) fn timeouts(&self) -> PassTimeouts {
        PassTimeouts {
            pass_idle_ms: self.pass_idle_ms.load(Ordering::Acquire),
            arrival_grace_ms: self.arrival_grace_ms.load(Ordering::Acquire),
        }
    }
}

/// The admission cap's state: the theoretical arrival time of the next
/// allowed admission (`rules::AdmitCap`), one atomic that releasers and the
/// worker both draw from without a lock.
#[derive(Debug, Default)]
pub(crate) struct AdmitLimiter {
    /// Microseconds since the Unix epoch; 0 = never used.
    tat_us: AtomicU64,
}

impl AdmitLimiter {
    /// Take one admission if the cap allows it now.
    pub(crate) fn try_take(&self, cap: AdmitCap, now_ms: u64) -> bool {
        if cap.is_none() {
            return true;
        }
        let now_us = now_ms.saturating_mul(1000);
        let mut tat = self.tat_us.load(Ordering::Acquire);
        loop {
            let Some(next) = cap.take(tat, now_us) else {
                return false;
            };
            match self
                .tat_us
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(current) => tat = current,
            }
        }
    }
}

/// A room. Shared as `Arc<Room>` by the HTTP handlers, the worker task and
/// the streams.
pub struct Room {
    id: RoomId,
    epoch: u64,
    /// This copy of the room among all made in this process, so that
    /// counts kept per copy (how far a line moved) are not compared
    /// across copies.
    copy: u64,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) settings: RwLock<RoomSettings>,
    pub(crate) hot: HotSettings,

    pub(crate) tickets: boxcar::Vec<Ticket>,
    /// One line per lane (one for a room without lanes).
    pub(crate) lines: Box<[Line]>,
    /// The lane of a join that names none or one the room does not have.
    default_lane: u8,
    /// Moved (coalesced) whenever positions or the view may have changed;
    /// the room's streams follow it.
    pub(crate) changes: Changes,
    identities: DashMap<Identity, TicketId>,
    /// Tickets that joined before opening; `None` once the room is open.
    /// A mutex because it is touched only before opening and at the draw,
    /// and the draw must see a complete list.
    pub(crate) prequeue: Mutex<Option<Vec<TicketId>>>,
    pub(crate) lottery: Option<LotterySeed>,
    /// The pre-queue in the order the opening placed it (each ticket at the
    /// front of its lane): set once, at the draw.
    pub(crate) drawn: OnceLock<Vec<TicketId>>,

    pub(crate) tray: AtomicU64,
    pub(crate) debt: AtomicU64,
    pub(crate) admitted: AtomicU64,
    pub(crate) peak_admitted: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) limiter: AdmitLimiter,
    /// New admissions, for the worker to watch for stalls.
    pub(crate) admitted_log: SegQueue<TicketId>,
    /// Tickets skipped while away, for the worker to abandon once quiet.
    pub(crate) skipped_log: SegQueue<TicketId>,
    waiters: DashMap<TicketId, Arc<Notify>>,
    pub(crate) counters: Counters,
    pub(crate) waits: WaitHistogram,

    /// The instances holding streams open, and what each holds.
    pub(crate) holds: Mutex<Holds>,
    /// State only the worker touches: its hand of permits and its lists.
    pub(crate) worker: Mutex<Worker>,
    pub(crate) view_tx: watch::Sender<RoomView>,
    /// Told of every change a restart must keep (the journal); `None` for
    /// rooms that need not survive one.
    sink: Option<Arc<dyn EventSink>>,
    /// The visitors who asked to be called back.
    pub(crate) callbacks: Callbacks,
    /// Where due calls go: set on the copy that decides (embedded, or the
    /// room's owner), never on a replica.
    callouts: OnceLock<Arc<dyn Callouts>>,
}

/// Why a visitor cannot be called back on this ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SubscribeError {
    /// Admitted already, or ended: there is no turn left to call about.
    #[error("this ticket is not waiting (it is {0:?})")]
    NotWaiting(TicketState),
}

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Room")
            .field("id", &self.id)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Room {
    /// A new, empty room. Its worker holds all `capacity` permits.
    pub fn new(settings: RoomSettings, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::with_epoch(settings, clock, rand::random())
    }

    /// A room with a given incarnation id.
    pub(crate) fn with_epoch(
        settings: RoomSettings,
        clock: Arc<dyn Clock>,
        epoch: u64,
    ) -> Arc<Self> {
        Self::create(settings, clock, epoch, None)
    }

    /// A new, empty room whose changes are reported to `sink`.
    pub fn create(
        settings: RoomSettings,
        clock: Arc<dyn Clock>,
        epoch: u64,
        sink: Option<Arc<dyn EventSink>>,
    ) -> Arc<Self> {
        let now = clock.now_ms();
        let open = settings.opens_at.is_none_or(|t| t <= now);
        let lottery = (!open && settings.order == Order::Lottery).then(LotterySeed::random);
        let room = Self::with_parts(
            settings,
            clock,
            epoch,
            lottery,
            (!open).then(Vec::new),
            sink,
        );
        room.publish_view(now, true);
        room
    }

    /// An empty room in a given phase: open when `prequeue` is `None`.
    /// The caller publishes the first view.
    pub(crate) fn with_parts(
        settings: RoomSettings,
        clock: Arc<dyn Clock>,
        epoch: u64,
        lottery: Option<LotterySeed>,
        prequeue: Option<Vec<TicketId>>,
        sink: Option<Arc<dyn EventSink>>,
    ) -> Arc<Self> {
        let now = clock.now_ms();
        let open = prequeue.is_none();
        static COPIES: AtomicU64 = AtomicU64::new(1);
        Arc::new(Self {
            id: settings.id.clone(),
            epoch,
            copy: COPIES.fetch_add(1, Ordering::Relaxed),
            hot: HotSettings::from(&settings, open),
            clock,
            tickets: boxcar::Vec::new(),
            lines: settings.lane_weights().into_iter().map(Line::new).collect(),
            default_lane: settings.lane_of(None).unwrap_or(0),
            changes: Changes::new(),
            identities: DashMap::new(),
            prequeue: Mutex::new(prequeue),
            lottery,
            drawn: OnceLock::new(),
            tray: AtomicU64::new(0),
            debt: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            peak_admitted: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            limiter: AdmitLimiter::default(),
            admitted_log: SegQueue::new(),
            skipped_log: SegQueue::new(),
            waiters: DashMap::new(),
            counters: Counters::default(),
            waits: WaitHistogram::default(),
            holds: Mutex::new(Holds::new()),
            worker: Mutex::new(Worker::new(u64::from(settings.capacity), now)),
            view_tx: watch::Sender::new(RoomView::default()),
            settings: RwLock::new(settings),
            sink,
            callbacks: Callbacks::default(),
            callouts: OnceLock::new(),
        })
    }

    /// Report a change to the sink, if any.
    pub(crate) fn emit(&self, event: RoomEvent<'_>) {
        // A callback lives and dies with its ticket.
        if let RoomEvent::Ended { ticket, .. } = event
            && !self.callbacks.is_empty()
        {
            self.callbacks.remove(ticket);
        }
        if let Some(sink) = &self.sink {
            sink.record(event);
        }
    }

    /// Report the whole current settings (after an operator's change).
    fn emit_settings(&self) {
        if self.sink.is_some() {
            let s = self.settings();
            self.emit(RoomEvent::Settings(&s));
        }
    }

    pub(crate) fn identities_iter(&self) -> impl Iterator<Item = (Identity, TicketId)> + '_ {
        self.identities.iter().map(|e| (*e.key(), *e.value()))
    }

    pub(crate) fn restore_identity(&self, identity: u128, id: TicketId) {
        self.identities.insert(Identity(identity), id);
    }

    pub(crate) fn set_hand(&self, hand: u64) {
        lock(&self.worker).hand = hand;
    }

    pub fn id(&self) -> &RoomId {
        &self.id
    }

    /// The room's incarnation: tickets of a deleted and recreated room with
    /// the same id must not be honoured, so tokens carry this.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn settings(&self) -> RoomSettings {
        let mut s = read(&self.settings).clone();
        s.capacity = self.hot.capacity.load(Ordering::Acquire);
        s.paused = self.hot.paused.load(Ordering::Acquire);
        s.mode = self.hot.mode();
        s
    }

    /// How the room queues now.
    pub fn mode(&self) -> Mode {
        self.hot.mode()
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Follow the room view. Cheap to clone and to hold by the thousand.
    #[cfg(test)]
    pub(crate) fn subscribe_view(&self) -> watch::Receiver<RoomView> {
        self.view_tx.subscribe()
    }

    pub(crate) fn view(&self) -> RoomView {
        self.view_tx.borrow().clone()
    }

    // ----- joining -------------------------------------------------------

    /// Take a ticket in the default lane. Never blocks on the queue; the
    /// same identity gets the same ticket back.
    pub fn join(&self, identity: Option<Identity>) -> Result<Joined, JoinError> {
        self.join_in(identity, self.default_lane)
    }

    /// Take a ticket in `lane` (a lane the room does not have means the
    /// default lane). An identity that already holds a ticket gets it
    /// back, in whatever lane it queues: one identity, one place.
    pub(crate) fn join_in(
        &self,
        identity: Option<Identity>,
        lane: u8,
    ) -> Result<Joined, JoinError> {
        self.join_bound(identity, lane, Binding::Lasting)
    }

    /// Like [`Room::join_in`], with the identity bound as `binding` says:
    /// a [`Binding::WhileLive`] identity whose ticket ended gets a new one.
    pub(crate) fn join_bound(
        &self,
        identity: Option<Identity>,
        lane: u8,
        binding: Binding,
    ) -> Result<Joined, JoinError> {
        let lane = if usize::from(lane) < self.lines.len() {
            lane
        } else {
            self.default_lane
        };
        if self.hot.closed.load(Ordering::Acquire) {
            return Err(JoinError::Closed);
        }
        if self.hot.mode().closes() {
            return Err(JoinError::SoldOut);
        }
        let joined = self.join_line(identity, lane, binding)?;
        if self.hot.mode().admits_everyone() && self.hot.admitting() {
            self.admit_everyone(self.clock.now_ms());
        }
        Ok(joined)
    }

    fn join_line(
        &self,
        identity: Option<Identity>,
        lane: u8,
        binding: Binding,
    ) -> Result<Joined, JoinError> {
        let Some(identity) = identity else {
            return self.issue(None, lane).map(|(ticket, number)| Joined {
                ticket,
                number,
                is_new: true,
            });
        };
        // The shard lock is held while the ticket is issued, so two racing
        // joins with one identity cannot both create a ticket.
        match self.identities.entry(identity) {
            Entry::Occupied(e) if self.binds(*e.get(), binding) => {
                let ticket = *e.get();
                Ok(Joined {
                    ticket,
                    number: self.number_of(ticket),
                    is_new: false,
                })
            }
            // Unbound, or bound to a ticket that ended while the identity
            // holds only while its ticket lives: a new ticket.
            entry => {
                let (ticket, number) = self.issue(Some(identity), lane)?;
                entry.insert(ticket);
                Ok(Joined {
                    ticket,
                    number,
                    is_new: true,
                })
            }
        }
    }

    /// The ticket an identity already holds, if any.
    pub fn ticket_of(&self, identity: Identity) -> Option<TicketId> {
        self.identities.get(&identity).map(|e| *e)
    }

    /// The ticket an identity bound as `binding` still answers, if any.
    pub(crate) fn ticket_bound(&self, identity: Identity, binding: Binding) -> Option<TicketId> {
        self.ticket_of(identity)
            .filter(|&ticket| self.binds(ticket, binding))
    }

    /// Whether an identity bound as `binding` still answers `ticket`.
    fn binds(&self, ticket: TicketId, binding: Binding) -> bool {
        binding == Binding::Lasting || self.state_of(ticket).is_some_and(TicketState::is_live)
    }

    fn issue(
        &self,
        identity: Option<Identity>,
        lane: u8,
    ) -> Result<(TicketId, Option<u64>), JoinError> {
        if self.tickets.count() as u64 >= MAX_TICKETS {
            return Err(JoinError::Full);
        }
        let now = self.clock.now_ms();
        let id = self.tickets.push(Ticket::new(now, lane)) as TicketId;
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.lines[usize::from(lane)]
            .waiting
            .fetch_add(1, Ordering::AcqRel);
        self.counters.joins.fetch_add(1, Ordering::Relaxed);
        if !self.hot.open.load(Ordering::Acquire) {
            let mut pre = lock(&self.prequeue);
            if let Some(pre) = pre.as_mut() {
                pre.push(id);
                // Under the pre-queue lock, so the draw's event cannot
                // come first.
                self.emit(RoomEvent::Joined {
                    ticket: id,
                    identity,
                    lane,
                    index: None,
                    ahead: 0,
                    at: now,
                });
                return Ok((id, None));
            }
            // Opened while we were getting here: queue normally, behind the
            // drawn pre-queue.
        }
        let index = self.enqueue(id);
        let ahead = self.ticket(id).map_or(0, Ticket::initial_ahead);
        self.emit(RoomEvent::Joined {
            ticket: id,
            identity,
            lane,
            index: Some(index),
            ahead,
            at: now,
        });
        Ok((id, Some(u64::from(index) + 1)))
    }

    /// Append a ticket to its lane's line; returns its queue index there.
    pub(crate) fn enqueue(&self, id: TicketId) -> u32 {
        let Some(t) = self.tickets.get(id as usize) else {
            return 0;
        };
        let line = self.line_of(t);
        let index = line.queue.push(id) as u32;
        let ahead = line.index.ahead(index).unwrap_or(0);
        t.set_queue_index(index, ahead.min(u64::from(u32::MAX)) as u32);
        // Gone before it had an index (revoked mid-join, or left the
        // pre-queue before the draw): count it now. Counting a ticket the
        // head already passed is harmless.
        if t.state() != TicketState::Waiting {
            self.count_departure(t);
        }
        index
    }

    fn count_departure(&self, t: &Ticket) {
        if let Some(index) = t.departure_to_count() {
            self.line_of(t).index.departed(index);
            self.changes.mark();
        }
    }

    /// The line a ticket queues in.
    pub(crate) fn line_of(&self, t: &Ticket) -> &Line {
        // A lane is checked when the ticket is made; the fallback only
        // keeps a damaged image from panicking.
        self.lines
            .get(usize::from(t.lane))
            .unwrap_or(&self.lines[0])
    }

    /// A lane's position index, for the streams that count positions
    /// from it.
    /// Which copy of the room this is, in this process.
    pub(crate) fn copy(&self) -> u64 {
        self.copy
    }

    pub(crate) fn lane(&self, lane: u8) -> Option<&LaneIndex> {
        self.lines.get(usize::from(lane)).map(|l| &l.index)
    }

    /// Each lane as the view shows it; empty for a room without lanes.
    pub(crate) fn lane_views(&self) -> Vec<LaneView> {
        let s = read(&self.settings);
        s.lanes
            .iter()
            .zip(self.lines.iter())
            .map(|(spec, line)| LaneView {
                name: spec.name.clone(),
                weight: spec.weight,
                waiting: line.waiting.load(Ordering::Acquire),
                admitted: line.admitted.load(Ordering::Acquire),
            })
            .collect()
    }

    /// What this room's streams follow to know when to look again.
    pub(crate) fn changes(&self) -> &Changes {
        &self.changes
    }

    fn number_of(&self, id: TicketId) -> Option<u64> {
        self.ticket(id)
            .and_then(Ticket::queue_index)
            .map(|i| u64::from(i) + 1)
    }

    pub(crate) fn ticket(&self, id: TicketId) -> Option<&Ticket> {
        self.tickets.get(id as usize)
    }

    // ----- calling visitors back ------------------------------------------

    /// Where this room hands the calls it decides are due. Set once, by
    /// the backend, on the copy that decides.
    pub(crate) fn set_callouts(&self, callouts: Arc<dyn Callouts>) {
        let _ = self.callouts.set(callouts);
    }

    /// Keep `callback` for a waiting (or away) ticket, replacing an
    /// earlier one: one per ticket. Calls already made stay made.
    pub(crate) fn subscribe(&self, id: TicketId, callback: Callback) -> Result<(), SubscribeError> {
        let Some(t) = self.ticket(id) else {
            return Err(SubscribeError::NotWaiting(TicketState::Left));
        };
        let state = t.state();
        if !matches!(state, TicketState::Waiting | TicketState::Away) {
            return Err(SubscribeError::NotWaiting(state));
        }
        let kept = CallbackState::replacing(callback, self.callbacks.get(id).as_ref());
        let callback = kept.callback.clone();
        self.callbacks.set(id, kept);
        self.emit(RoomEvent::Subscribed {
            ticket: id,
            callback: &callback,
        });
        // The state may have moved on since it was read, before the
        // callback was kept where the head's calls look for it.
        match self.state_of(id) {
            // Ended: its end may have missed the callback.
            Some(now) if !now.is_live() => {
                self.callbacks.remove(id);
            }
            // Admitted or skipped meanwhile: that turn's call may have
            // missed it. A call is made once, whoever makes it first.
            Some(TicketState::Admitted) if state == TicketState::Waiting => {
                let now = self.clock.now_ms();
                let grace = self.hot.timeouts().arrival_grace_ms;
                self.call(id, Notice::Turn { until: now + grace });
            }
            Some(TicketState::Away) if state == TicketState::Waiting => {
                let now = self.clock.now_ms();
                let idle = self.hot.queue_idle_ms.load(Ordering::Acquire);
                let until = self.seen_at(t, now) + idle;
                self.call(id, Notice::Turn { until });
            }
            _ => {}
        }
        Ok(())
    }

    /// Forget a ticket's callback; whether it had one.
    pub(crate) fn unsubscribe(&self, id: TicketId) -> bool {
        let had = self.callbacks.remove(id);
        if had {
            self.emit(RoomEvent::Unsubscribed { ticket: id });
        }
        had
    }

    /// A ticket's callback and what has been said on it.
    #[cfg(test)]
    pub(crate) fn callback_of(&self, id: TicketId) -> Option<CallbackState> {
        self.callbacks.get(id)
    }

    /// How many tickets have a callback.
    pub(crate) fn callback_count(&self) -> usize {
        self.callbacks.len()
    }

    /// Make `notice` to `id`'s visitor, once: recorded, then handed to the
    /// callouts (a replica has none and records nothing).
    fn call(&self, id: TicketId, notice: Notice) {
        let Some(callback) = self.callbacks.mark(id, notice) else {
            return;
        };
        self.emit(RoomEvent::Notified { ticket: id, notice });
        if let Some(callouts) = self.callouts.get() {
            let number = self
                .ticket(id)
                .and_then(Ticket::queue_index)
                .map(|i| u64::from(i) + 1);
            callouts.due(&self.id, self.epoch, id, number, notice, &callback);
        }
    }

    /// The tick's look at the subscribed tickets not yet told their turn
    /// nears: those now within the room's distance of the head are.
    pub(crate) fn call_ahead(&self, rate: f64) {
        let pending = self.callbacks.awaiting_ahead();
        if pending.is_empty() {
            return;
        }
        let setting = read(&self.settings).notify_ahead;
        let distance = u64::from(rules::ahead_distance(setting, rate));
        for id in pending {
            if let Some((facts, Some(ahead))) = self.ticket_facts(id)
                && facts.state == TicketState::Waiting
                && ahead <= distance
            {
                let ahead = u32::try_from(ahead).unwrap_or(u32::MAX);
                self.call(id, Notice::Ahead { ahead });
            }
        }
    }

    // ----- popping and handing off --------------------------------------

    /// Whether anyone might be waiting at the head of any lane right now.
    pub(crate) fn has_queued(&self) -> bool {
        self.lines.iter().any(Line::has_queued)
    }

    /// Claim the next waiting ticket, in the lane the lane rule picks, and
    /// admit it; if that lane's head holds nobody admissible, the next
    /// lane the rule would pick.
    pub(crate) fn pop_and_admit(&self, now: u64) -> Option<TicketId> {
        if self.lines.len() == 1 {
            return self.pop_lane(&self.lines[0], now);
        }
        let loads: Vec<LaneLoad> = self
            .lines
            .iter()
            .map(|line| LaneLoad {
                weight: line.weight.load(Ordering::Acquire),
                admitted: line.admitted.load(Ordering::Acquire),
                waiting: line.has_queued(),
            })
            .collect();
        rules::lane_order(&loads)
            .into_iter()
            .find_map(|lane| self.pop_lane(&self.lines[lane], now))
    }

    /// Claim the next waiting ticket of one line and admit it. Tickets met
    /// on the way whose visitor is away are skipped (they keep their
    /// number); quiet ones are abandoned (`rules::PresenceTimeouts::at_head`).
    fn pop_lane(&self, line: &Line, now: u64) -> Option<TicketId> {
        loop {
            let id = line.claim_head()?;
            // Everyone behind moved up one.
            self.changes.mark();
            let Some(t) = self.ticket(id) else { continue };
            if t.state() != TicketState::Waiting {
                continue;
            }
            match self.hot.presence().at_head(self.seen_at(t, now), now) {
                AtHead::Admit => {}
                AtHead::Skip => {
                    self.skip(id, t);
                    continue;
                }
                AtHead::Abandon => {
                    if t.transition(TicketState::Waiting, TicketState::Abandoned) {
                        self.on_left_waiting(id, TicketState::Abandoned);
                    }
                    continue;
                }
            }
            // The timestamp goes first so the worker never sees an admitted
            // ticket without one.
            t.set_admitted_at(now);
            if t.transition(TicketState::Waiting, TicketState::Admitted) {
                self.on_admitted(id, t, now);
                return Some(id);
            }
        }
    }

    fn on_admitted(&self, id: TicketId, t: &Ticket, now: u64) {
        let admitted = self.admitted.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak_admitted.fetch_max(admitted, Ordering::AcqRel);
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        let line = self.line_of(t);
        line.admitted.fetch_add(1, Ordering::AcqRel);
        line.waiting.fetch_sub(1, Ordering::AcqRel);
        self.counters.admissions.fetch_add(1, Ordering::Relaxed);
        self.waits.record(now.saturating_sub(t.joined_at));
        self.admitted_log.push(id);
        self.emit(RoomEvent::Admitted {
            ticket: id,
            at: now,
        });
        self.notify_ticket(id);
        if !self.callbacks.is_empty() {
            let grace = self.hot.timeouts().arrival_grace_ms;
            self.call(id, Notice::Turn { until: now + grace });
        }
    }

    /// The head passed a ticket whose visitor is away: it keeps its
    /// number, out of the line, until its visitor comes back.
    fn skip(&self, id: TicketId, t: &Ticket) {
        if !t.transition(TicketState::Waiting, TicketState::Away) {
            return;
        }
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        self.line_of(t).waiting.fetch_sub(1, Ordering::AcqRel);
        self.counters.skips.fetch_add(1, Ordering::Relaxed);
        self.skipped_log.push(id);
        let now = self.clock.now_ms();
        self.emit(RoomEvent::Away {
            ticket: id,
            at: now,
        });
        self.notify_ticket(id);
        if !self.callbacks.is_empty() {
            let idle = self.hot.queue_idle_ms.load(Ordering::Acquire);
            let until = self.seen_at(t, now) + idle;
            self.call(id, Notice::Turn { until });
        }
        // A sign of life that raced the skip may have missed it: look again.
        if self.hot.presence().at_head(self.seen_at(t, now), now) == AtHead::Admit {
            self.come_back(id, t);
        }
    }

    /// An away ticket's visitor is back: it stands ahead of the whole line
    /// (everyone there joined after it).
    fn come_back(&self, id: TicketId, t: &Ticket) {
        let Some(qi) = t.queue_index() else { return };
        if !t.transition(TicketState::Away, TicketState::Waiting) {
            return;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let line = self.line_of(t);
        line.waiting.fetch_add(1, Ordering::AcqRel);
        self.counters.returns.fetch_add(1, Ordering::Relaxed);
        line.index.go_back(qi);
        self.emit(RoomEvent::Back {
            ticket: id,
            at: self.clock.now_ms(),
        });
        self.changes.mark();
        self.notify_ticket(id);
    }

    fn on_left_waiting(&self, id: TicketId, to: TicketState) {
        self.on_left_line(id, to, true);
    }

    /// A queued ticket ended; `was_waiting` when it was in the line (an
    /// away one was counted out of it when skipped).
    fn on_left_line(&self, id: TicketId, to: TicketState, was_waiting: bool) {
        if was_waiting {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            if let Some(t) = self.ticket(id) {
                self.line_of(t).waiting.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let counter = match to {
            TicketState::Abandoned => &self.counters.abandonments,
            TicketState::Revoked => &self.counters.revocations,
            _ => &self.counters.leaves,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.emit(RoomEvent::Ended {
            ticket: id,
            state: to,
            at: self.clock.now_ms(),
        });
        self.notify_ticket(id);
    }

    /// `passthrough`: admit everyone in line now, in order, each on a
    /// permit borrowed as debt (`rules::Mode`); the worker pays the debt
    /// from its hand at its next tick, finishers by retiring their permit.
    pub(crate) fn admit_everyone(&self, now: u64) -> Vec<TicketId> {
        let mut admitted = Vec::new();
        while self.has_queued() {
            let Some(id) = self.pop_and_admit(now) else {
                break;
            };
            self.debt.fetch_add(1, Ordering::AcqRel);
            admitted.push(id);
        }
        admitted
    }

    /// A permit comes back from a finisher: pay any capacity debt first,
    /// else hand it straight to the head of the queue, else onto the tray.
    pub(crate) fn give_back(&self, now: u64) -> Handoff {
        let mut debt = self.debt.load(Ordering::Acquire);
        while debt > 0 {
            match self.debt.compare_exchange_weak(
                debt,
                debt - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Handoff::Retired,
                Err(d) => debt = d,
            }
        }
        if self.hot.admitting()
            && self.has_queued()
            && self.limiter.try_take(self.hot.admit_cap(), now)
            && let Some(next) = self.pop_and_admit(now)
        {
            self.counters.handoffs.fetch_add(1, Ordering::Relaxed);
            return Handoff::To(next);
        }
        self.tray.fetch_add(1, Ordering::AcqRel);
        Handoff::Tray
    }

    // ----- leaving -------------------------------------------------------

    /// The visitor is done: an admitted ticket gives its permit back (handed
    /// to the next in line); a waiting one leaves the queue.
    pub fn leave(&self, id: TicketId) -> Departure {
        self.end(id, TicketState::Released, TicketState::Left)
    }

    /// The origin reports a purchase done: only an admitted ticket can be
    /// released; anything else frees nothing.
    pub fn release(&self, id: TicketId) -> Departure {
        let Some(t) = self.ticket(id) else {
            return Departure::Nothing(TicketState::Left);
        };
        if t.transition(TicketState::Admitted, TicketState::Released) {
            self.counters.releases.fetch_add(1, Ordering::Relaxed);
            return Departure::GaveBack(self.after_permit_freed(id, TicketState::Released));
        }
        Departure::Nothing(t.state())
    }

    /// An operator takes a ticket's place or permit away.
    pub fn revoke(&self, id: TicketId) -> Departure {
        self.end(id, TicketState::Revoked, TicketState::Revoked)
    }

    fn end(&self, id: TicketId, admitted_to: TicketState, waiting_to: TicketState) -> Departure {
        let Some(t) = self.ticket(id) else {
            return Departure::Nothing(TicketState::Left);
        };
        loop {
            match t.state() {
                TicketState::Admitted => {
                    if t.transition(TicketState::Admitted, admitted_to) {
                        let counter = if admitted_to == TicketState::Revoked {
                            &self.counters.revocations
                        } else {
                            &self.counters.releases
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        return Departure::GaveBack(self.after_permit_freed(id, admitted_to));
                    }
                }
                TicketState::Waiting => {
                    if self.depart_waiting(id, t, waiting_to) {
                        return Departure::LeftQueue;
                    }
                }
                TicketState::Away => {
                    if self.depart_away(id, t, waiting_to) {
                        return Departure::LeftQueue;
                    }
                }
                other => return Departure::Nothing(other),
            }
        }
    }

    fn after_permit_freed(&self, id: TicketId, state: TicketState) -> Handoff {
        self.count_permit_back(id);
        let now = self.clock.now_ms();
        // Before the hand-off, so the journal has the permit back before
        // the next visitor's admission.
        self.emit(RoomEvent::Ended {
            ticket: id,
            state,
            at: now,
        });
        self.notify_ticket(id);
        self.give_back(now)
    }

    /// An admitted ticket's permit is no longer held: out of the room's
    /// count and its lane's.
    pub(crate) fn count_permit_back(&self, id: TicketId) {
        self.admitted.fetch_sub(1, Ordering::AcqRel);
        if let Some(t) = self.ticket(id) {
            self.line_of(t).admitted.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Move a waiting ticket out of the line, keeping positions exact.
    pub(crate) fn depart_waiting(&self, id: TicketId, t: &Ticket, to: TicketState) -> bool {
        let moved = t.transition(TicketState::Waiting, to);
        if moved {
            // Without an index yet, `enqueue` counts it once it has one.
            self.count_departure(t);
            self.on_left_waiting(id, to);
        }
        moved
    }

    /// An away ticket ends (left, revoked, or abandoned by the worker).
    pub(crate) fn depart_away(&self, id: TicketId, t: &Ticket, to: TicketState) -> bool {
        let moved = t.transition(TicketState::Away, to);
        if moved {
            // Behind the head already, unless it came back: then it leaves
            // the back set.
            self.count_departure(t);
            self.on_left_line(id, to, false);
        }
        moved
    }

    /// Record activity: a gate check, a live stream, a status poll. An
    /// away ticket's visitor is back.
    pub fn touch(&self, id: TicketId) -> Option<TicketState> {
        self.touch_at(id, self.clock.now_ms())
    }

    /// [`Self::touch`] for a sign of life seen at `now` (Unix ms) and
    /// reported a moment later (by another instance).
    pub(crate) fn touch_at(&self, id: TicketId, now: u64) -> Option<TicketState> {
        let t = self.ticket(id)?;
        let (state, arrived) = t.touch(now);
        if arrived {
            self.emit(RoomEvent::Arrived {
                ticket: id,
                at: now,
            });
        }
        if state == TicketState::Away {
            self.come_back(id, t);
            return Some(t.state());
        }
        Some(state)
    }

    /// Count every waiting, away or admitted visitor as seen at `now`,
    /// without an arrival or a return: for an engine that takes a room over
    /// from another, which heard signs of life the log does not carry. No
    /// visitor is then skipped, abandoned or expired for the change of
    /// hands; one who is gone goes quiet from here, by the usual timeouts.
    pub(crate) fn presume_seen(&self, now: u64) {
        for id in 0..self.tickets.count() {
            if let Some(t) = self.tickets.get(id)
                && matches!(
                    t.state(),
                    TicketState::Waiting | TicketState::Away | TicketState::Admitted
                )
            {
                t.seen(now);
            }
        }
    }

    /// Signs of life from many visitors at once (a test's shorthand).
    #[cfg(test)]
    pub(crate) fn renew(&self, ids: impl IntoIterator<Item = TicketId>) {
        for id in ids {
            self.touch(id);
        }
    }

    /// When a ticket was last seen, as its presence is judged at `now`: a
    /// ticket with a live stream open somewhere is seen now.
    pub(crate) fn seen_at(&self, t: &Ticket, now: u64) -> u64 {
        if t.is_held() { now } else { t.last_seen() }
    }

    /// A holder's report of the streams it holds (see [`StreamReport`]):
    /// a ticket whose stream opened is seen (an away visitor is back), one
    /// whose last stream closed is seen for the last time now. Says which
    /// engine heard it (`Holds::generation`).
    pub(crate) fn hold_streams(&self, report: &StreamReport) -> u64 {
        let now = self.clock.now_ms();
        let mut holds = lock(&self.holds);
        let generation = holds.generation;
        let holder = holds.holders.entry(report.holder).or_default();
        holder.heard = holder.heard.max(now);
        let mut let_go = Vec::new();
        if report.full {
            let listed: std::collections::HashSet<TicketId> =
                report.opened.iter().copied().collect();
            holder.tickets.retain(|id| {
                let keep = listed.contains(id);
                if !keep {
                    let_go.push(*id);
                }
                keep
            });
        }
        let mut held = Vec::new();
        for &id in &report.opened {
            if holder.tickets.insert(id) {
                held.push(id);
            }
        }
        for id in &report.closed {
            if holder.tickets.remove(id) {
                let_go.push(*id);
            }
        }
        drop(holds);
        for id in held {
            if let Some(t) = self.ticket(id) {
                // The hold first, then the sign of life: a head skipping
                // the ticket meanwhile sees one or the other.
                t.hold();
            }
        }
        for &id in &report.opened {
            self.touch_at(id, now);
        }
        for id in let_go {
            self.let_go(id, now);
        }
        generation
    }

    /// Drop one holder's hold on a ticket, last seen at `at`.
    fn let_go(&self, id: TicketId, at: u64) {
        if let Some(t) = self.ticket(id) {
            t.seen(at);
            t.unhold();
        }
    }

    /// Let go of the tickets of holders not heard from for a whole
    /// `away_grace`, as seen when each was last heard.
    pub(crate) fn lapse_holders(&self, now: u64) {
        let grace = self.hot.away_grace_ms.load(Ordering::Acquire);
        let lapsed = lock(&self.holds).take_lapsed(now.saturating_sub(grace));
        for holder in lapsed {
            for id in holder.tickets {
                self.let_go(id, holder.heard);
            }
        }
    }

    /// The holders this engine knows, and how many tickets each holds.
    #[cfg(test)]
    pub(crate) fn holders(&self) -> Vec<(super::holds::HolderId, usize)> {
        lock(&self.holds)
            .holders
            .iter()
            .map(|(&id, h)| (id, h.tickets.len()))
            .collect()
    }

    // ----- ticket notifications -----------------------------------------

    /// A `Notify` that fires whenever this ticket's state changes (admitted,
    /// expired, left…). Streams wait on it so that an admission reaches its
    /// visitor at once, ahead of any room-wide broadcast.
    pub(crate) fn ticket_notify(&self, id: TicketId) -> Arc<Notify> {
        self.waiters.entry(id).or_default().clone()
    }

    /// Drop interest in a ticket; the entry goes when its last holder does.
    pub(crate) fn forget_ticket_notify(&self, id: TicketId, notify: Arc<Notify>) {
        drop(notify);
        self.waiters
            .remove_if(&id, |_, n| Arc::strong_count(n) == 1);
    }

    /// Take over the ticket watchers of the room this one replaces (a copy
    /// started again from an image), so that a stream waiting on the old
    /// copy hears the ticket's next change from this one; each is woken
    /// once, since what it waits for may have happened in between.
    pub(crate) fn take_watchers(&self, from: &Room) {
        for entry in from.waiters.iter() {
            self.waiters.insert(*entry.key(), entry.value().clone());
            entry.value().notify_waiters();
        }
    }

    pub(crate) fn notify_ticket(&self, id: TicketId) {
        if let Some(n) = self.waiters.get(&id) {
            n.notify_waiters();
        }
    }

    // ----- reading -------------------------------------------------------

    /// A ticket's status, with its position clamped so that what its holder
    /// sees never goes up.
    pub fn status(&self, id: TicketId) -> Option<TicketStatus> {
        let (facts, ahead) = self.ticket_facts(id)?;
        Some(rules::ticket_status(
            &facts,
            ahead,
            &self.facts(),
            self.clock.now_ms(),
        ))
    }

    /// A ticket's facts, and the count ahead its holder is shown (clamped
    /// so it never goes up) while it waits in line.
    pub(crate) fn ticket_facts(&self, id: TicketId) -> Option<(TicketFacts, Option<u64>)> {
        let t = self.ticket(id)?;
        let facts = TicketFacts {
            id: u64::from(id),
            state: t.state(),
            index: t.queue_index().map(u64::from),
            initial_ahead: u64::from(t.initial_ahead()),
            joined_at: t.joined_at,
            admitted_at: t.admitted_at(),
            last_seen: t.last_seen(),
            arrived: t.has_arrived(),
            lane: t.lane,
        };
        let ahead = match (facts.state, t.queue_index()) {
            (TicketState::Waiting, Some(index)) => {
                let waiting_ahead = self.line_of(t).index.ahead(index).unwrap_or(0);
                let counted = (waiting_ahead + 1).min(u64::from(u32::MAX)) as u32;
                Some(u64::from(t.report_position(counted)) - 1)
            }
            _ => None,
        };
        Some((facts, ahead))
    }

    /// Where a ticket was placed in line: its queue index and the tickets
    /// waiting ahead of it then.
    pub fn placement(&self, id: TicketId) -> Option<(u32, u32)> {
        let t = self.ticket(id)?;
        Some((t.queue_index()?, t.initial_ahead()))
    }

    /// What a status needs of the room: the published view (operators'
    /// changes publish it at once), with the line's length as of now.
    pub(crate) fn facts(&self) -> RoomFacts {
        self.view_tx
            .borrow()
            .facts(self.waiting.load(Ordering::Acquire))
    }

    /// When an admitted ticket's pass lapses if nothing more is heard.
    pub(crate) fn pass_deadline(&self, t: &Ticket) -> u64 {
        self.hot
            .timeouts()
            .deadline(t.has_arrived(), t.admitted_at(), t.last_seen())
    }

    pub fn stats(&self) -> RoomStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RoomStats {
            joins: get(&c.joins),
            admissions: get(&c.admissions),
            handoffs: get(&c.handoffs),
            releases: get(&c.releases),
            leaves: get(&c.leaves),
            revocations: get(&c.revocations),
            expirations: get(&c.expirations),
            abandonments: get(&c.abandonments),
            skips: get(&c.skips),
            returns: get(&c.returns),
            peak_admitted: get(&self.peak_admitted),
            waits: self.waits.snapshot(),
        }
    }

    /// Where every permit is. Takes the worker's lock to read its hand.
    pub fn ledger(&self) -> PermitLedger {
        let w = lock(&self.worker);
        PermitLedger {
            capacity: u64::from(self.hot.capacity.load(Ordering::Acquire)),
            held: w.hand,
            tray: self.tray.load(Ordering::Acquire),
            admitted: self.admitted.load(Ordering::Acquire),
            debt: self.debt.load(Ordering::Acquire),
        }
    }

    pub fn admitted_count(&self) -> u64 {
        self.admitted.load(Ordering::Acquire)
    }

    pub fn waiting_count(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// Tickets issued so far (the ids are `0..issued`).
    #[cfg(test)]
    pub(crate) fn issued(&self) -> u32 {
        self.tickets.count() as u32
    }

    pub(crate) fn state_of(&self, id: TicketId) -> Option<TicketState> {
        self.ticket(id).map(Ticket::state)
    }

    // ----- operators' controls -------------------------------------------

    /// An operator's change, made as one step under the worker's lock:
    /// capacity (raising it gives the worker more permits or cancels debt;
    /// lowering it takes permits from the worker's hand and the tray, and
    /// whatever is still out becomes debt that the next finishers pay
    /// instead of handing off: `rules::resize`), pause (joins still queue,
    /// finishers' permits wait on the tray), timeouts, the caps, and opening
    /// a scheduled room now. Recorded as one settings event, published as
    /// one view.
    pub fn patch(&self, patch: &RoomPatch) {
        let mut w = lock(&self.worker);
        let now = self.clock.now_ms();
        {
            let mut s = write(&self.settings);
            patch.apply_to(&mut s);
            if let Some(capacity) = patch.capacity {
                let old = self.hot.capacity.swap(capacity, Ordering::AcqRel);
                self.move_permits(&mut w, rules::resize(old, capacity));
            }
            if let Some(paused) = patch.paused {
                self.hot.paused.store(paused, Ordering::Release);
            }
            if let Some(mode) = patch.mode {
                self.hot.mode.store(mode.code(), Ordering::Release);
            }
            for &(lane, weight) in &patch.lane_weights {
                if let Some(line) = self.lines.get(usize::from(lane)) {
                    line.weight.store(weight, Ordering::Release);
                }
            }
            self.hot.store_timeouts(&s);
            if patch.open_now && !self.hot.open.load(Ordering::Acquire) {
                s.opens_at = Some(now);
            }
        }
        self.emit_settings();
        if patch.open_now && !self.hot.open.load(Ordering::Acquire) {
            self.open(&mut w);
        }
        self.publish_locked(&w, now, false);
    }

    /// Apply a permit transfer: the hand is the worker's (its lock is held),
    /// the tray and the debt are shared with finishers, so those are taken
    /// from atomically.
    fn move_permits(&self, w: &mut Worker, transfer: rules::Transfer) {
        let mut left = transfer.amount;
        for counter in transfer.plan.take_from {
            left -= match counter {
                Counter::Hand => {
                    let take = w.hand.min(left);
                    w.hand -= take;
                    take
                }
                Counter::Tray => take_up_to(&self.tray, left),
                Counter::Debt => take_up_to(&self.debt, left),
            };
        }
        match transfer.plan.rest_to {
            Counter::Hand => w.hand += left,
            Counter::Tray => {
                self.tray.fetch_add(left, Ordering::AcqRel);
            }
            Counter::Debt => {
                self.debt.fetch_add(left, Ordering::AcqRel);
            }
        }
    }

    /// Change capacity live (see [`Room::patch`]).
    pub fn set_capacity(&self, capacity: u32) {
        self.patch(&RoomPatch {
            capacity: Some(capacity),
            ..RoomPatch::default()
        });
    }

    /// Stop or resume admission (see [`Room::patch`]).
    pub fn set_paused(&self, paused: bool) {
        self.patch(&RoomPatch {
            paused: Some(paused),
            ..RoomPatch::default()
        });
    }

    /// Open a scheduled room now: the pre-queue is drawn at once.
    #[cfg(test)]
    pub(crate) fn open_now(&self) {
        self.patch(&RoomPatch {
            open_now: true,
            ..RoomPatch::default()
        });
    }

    /// An origin's report of `purchased` units sold: taken off the stock
    /// (never below zero) as one step with the mode, so the report that
    /// takes the last unit, and only that one, turns the room sold out.
    /// `None` for a room that does not count stock.
    pub(crate) fn purchase(&self, purchased: u64) -> Option<StockTaken> {
        let w = lock(&self.worker);
        let taken = {
            let mut s = write(&self.settings);
            let taken = rules::take_stock(s.stock?, self.hot.mode(), purchased);
            s.stock = Some(taken.left);
            s.mode = taken.mode;
            self.hot.mode.store(taken.mode.code(), Ordering::Release);
            taken
        };
        self.emit_settings();
        self.publish_locked(&w, self.clock.now_ms(), false);
        Some(taken)
    }

    /// Close the room: no more joins, no more admissions. Streams see a
    /// `closed` view and end.
    pub(crate) fn close(&self) {
        let w = lock(&self.worker);
        self.hot.closed.store(true, Ordering::Release);
        self.emit(RoomEvent::Closed);
        self.publish_locked(&w, self.clock.now_ms(), false);
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.hot.closed.load(Ordering::Acquire)
    }

    pub(crate) fn settings_snapshot(&self) -> RoomSettings {
        read(&self.settings).clone()
    }

    /// Publish the room view if anything visible changed (or `force`).
    pub(crate) fn publish_view(&self, now: u64, force: bool) {
        let w = lock(&self.worker);
        self.publish_locked(&w, now, force);
    }

    pub(crate) fn publish_locked(&self, w: &MutexGuard<'_, Worker>, now: u64, force: bool) {
        let open = self.hot.open.load(Ordering::Acquire);
        let (opens_at, tick_ms, stock) = {
            let s = read(&self.settings);
            (s.opens_at, millis(s.tick), s.stock)
        };
        let next = RoomView {
            version: 0,
            at_ms: now,
            capacity: self.hot.capacity.load(Ordering::Acquire),
            waiting: self.waiting.load(Ordering::Acquire),
            admitted: self.admitted.load(Ordering::Acquire),
            held: w.hand,
            tray: self.tray.load(Ordering::Acquire),
            debt: self.debt.load(Ordering::Acquire),
            paused: self.hot.paused.load(Ordering::Acquire),
            open,
            closed: self.hot.closed.load(Ordering::Acquire),
            mode: self.hot.mode(),
            stock,
            opens_at,
            lottery_commitment: self.lottery.as_ref().map(LotterySeed::commitment),
            lottery_seed: self
                .lottery
                .as_ref()
                .filter(|_| open)
                .map(LotterySeed::to_hex),
            rate: w.rate,
            admissions_total: self.counters.admissions.load(Ordering::Relaxed),
            tick_ms,
            timeouts: self.hot.timeouts(),
            lanes: self.lane_views(),
        };
        let published = self.view_tx.send_if_modified(|current| {
            if force || rules::worth_publishing(current, &next) {
                let version = current.version + 1;
                *current = RoomView { version, ..next };
                true
            } else {
                false
            }
        });
        if published {
            self.changes.bump();
        }
    }
}

/// One lane's line: its queue, its position index, its weight and its
/// counts (the lane rule reads the admitted count; the view shows both).
#[derive(Debug)]
pub(crate) struct Line {
    pub(crate) queue: boxcar::Vec<TicketId>,
    pub(crate) index: LaneIndex,
    /// An operator may change it on a running room.
    pub(crate) weight: AtomicU32,
    pub(crate) admitted: AtomicU64,
    pub(crate) waiting: AtomicU64,
}

impl Line {
    fn new(weight: u32) -> Self {
        Self {
            queue: boxcar::Vec::new(),
            index: LaneIndex::new(),
            weight: AtomicU32::new(weight),
            admitted: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
        }
    }

    /// Whether anyone might be waiting at this line's head right now.
    fn has_queued(&self) -> bool {
        (self.index.head() as usize) < self.queue.count() || self.index.back_len() > 0
    }

    /// The next ticket at the head: a returner first (lowest number), else
    /// the main line's head, claimed with a CAS.
    fn claim_head(&self) -> Option<TicketId> {
        if let Some(qi) = self.index.take_back() {
            return self.queue.get(qi as usize).copied();
        }
        loop {
            let head = self.index.head();
            // A slot whose push has not finished yet reads as the end of the
            // queue; the worker will get it on its next tick.
            let id = *self.queue.get(head as usize)?;
            if self
                .index
                .head
                .compare_exchange(head, head + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(id);
            }
        }
    }
}

/// Subtract up to `want` from an atomic counter; returns what was taken.
pub(crate) fn take_up_to(counter: &AtomicU64, want: u64) -> u64 {
    let mut have = counter.load(Ordering::Acquire);
    loop {
        let take = have.min(want);
        if take == 0 {
            return 0;
        }
        match counter.compare_exchange_weak(have, have - take, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return take,
            Err(h) => have = h,
        }
    }
}
