//! The stream writers: a few shards (one per runtime worker), each a task
//! that owns its streams' connections and writes their events itself. A
//! stream has no task and no timer of its own: a room's change wakes the
//! shard once, which walks the room's streams, counts a place only for
//! those whose line moved far enough to show it ([`Stream::moved_enough`])
//! or for everyone when something every page shows changed, and writes
//! each event straight to its socket with one call. The times streams
//! wait for (the cadence's next look, keep-alives) sit in two timer wheels
//! per shard. A stream's own news (its ticket's signal, its client going
//! away, a blocked socket that can take more) wakes only that stream,
//! through a waker that queues it for its shard; those are handled before
//! anything else and between every group of a wave, so a visitor's own
//! admission is written before any position update, and a wave over
//! thousands of streams yields to the rest of the server a group at a
//! time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::encode::{self, Tail};
use super::sink::Sink;
use super::stream::{Look, NEVER, Stream};
use super::wheel::{Entry, Wheel};
use crate::backend::Backend;
use crate::backend::feed::{LineMoves, RoomFeed};
use crate::engine::rules::{LaneLoads, Mode, RoomFacts};
use crate::engine::{Clock, RoomId};
use crate::locks::lock;

/// Streams looked at between two looks at the shard's own news.
const GROUP: usize = 64;
/// How many times a wave's group lets the runtime run before it goes on
/// while other shards still have news to write (bounded, so a stream of
/// news cannot hold a wave back for long).
const NEWS_FIRST: usize = 16;
/// How often the shard looks at the times its streams wait for.
const TICK: Duration = Duration::from_millis(250);
/// The cadence wheel's span: its longest wait (a refresh) and more.
const CADENCE_SLOTS: usize = 128;

/// The shards, and what each stream needs from outside.
pub(crate) struct Writers {
    shards: Vec<Arc<Inbox>>,
    next: AtomicUsize,
    tasks: TaskTracker,
}

/// A stream ready to be written, with where to write it.
pub(crate) struct Start {
    pub stream: Stream,
    /// Held for as long as the stream lives: its address's stream slot
    /// and its ticket's presence.
    pub held: Box<dyn Send + Sync>,
    pub writers: Arc<Writers>,
}

impl Start {
    /// Hand the stream to a shard, which writes its first event at once.
    pub(crate) fn adopt(self, sink: Sink) {
        let writers = self.writers.clone();
        let n = writers.next.fetch_add(1, Ordering::Relaxed) % writers.shards.len();
        let inbox = &writers.shards[n];
        lock(&inbox.queue).new.push((self, sink));
        inbox.notify.notify_one();
    }
}

impl Writers {
    /// One shard per runtime worker.
    pub(crate) fn start(
        backend: Arc<dyn Backend>,
        clock: Arc<dyn Clock>,
        keep_alive: Duration,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let n = tokio::runtime::Handle::current()
            .metrics()
            .num_workers()
            .max(1);
        let tasks = TaskTracker::new();
        let news = Arc::new(AtomicUsize::new(0));
        let shards = (0..n)
            .map(|_| {
                let inbox = Arc::new(Inbox {
                    news: news.clone(),
                    ..Inbox::default()
                });
                let shard = Shard {
                    inbox: inbox.clone(),
                    backend: backend.clone(),
                    clock: clock.clone(),
                    keep_alive_ms: keep_alive.as_millis() as u64,
                    epoch: Instant::now(),
                    conns: Vec::new(),
                    free: Vec::new(),
                    rooms: Vec::new(),
                    cadence: Wheel::new(TICK.as_millis() as u64, CADENCE_SLOTS, clock.now_ms()),
                    keep_alives: Wheel::new(
                        TICK.as_millis() as u64,
                        (keep_alive.as_millis() as u64 / TICK.as_millis() as u64 + 2) as usize,
                        0,
                    ),
                    out: Vec::with_capacity(1024),
                    frame: Vec::with_capacity(1024),
                    due: Vec::new(),
                    eras: 0,
                    live: 0,
                };
                tasks.spawn(shard.run(shutdown.clone()));
                inbox
            })
            .collect();
        tasks.close();
        Arc::new(Self {
            shards,
            next: AtomicUsize::new(0),
            tasks,
        })
    }

    /// Once every shard has ended its streams (after shutdown).
    pub(crate) async fn closed(&self) {
        self.tasks.wait().await;
    }
}

/// What wakes a shard: new streams, and the streams and rooms whose
/// wakers fired.
#[derive(Default)]
struct Inbox {
    queue: Mutex<Queue>,
    notify: Notify,
    /// Streams woken and not yet looked at, in every shard: a wave waits
    /// for them, so a visitor's own news (an admission) is written before
    /// the position updates of the change that came with it, whichever
    /// shard holds either.
    news: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Queue {
    new: Vec<(Start, Sink)>,
    conns: Vec<(u32, u32)>,
    rooms: Vec<(u32, u32)>,
}

/// A stream's or a room's waker: queues it for its shard, once until
/// the shard takes it.
struct Wakes {
    inbox: Arc<Inbox>,
    room: bool,
    slot: u32,
    era: u32,
    queued: AtomicBool,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let mut q = lock(&self.inbox.queue);
            if self.room {
                q.rooms.push((self.slot, self.era));
            } else {
                self.inbox.news.fetch_add(1, Ordering::AcqRel);
                q.conns.push((self.slot, self.era));
            }
        }
        self.inbox.notify.notify_one();
    }
}

struct Conn {
    era: u32,
    stream: Stream,
    sink: Sink,
    wakes: Arc<Wakes>,
    waker: Waker,
    _held: Box<dyn Send + Sync>,
    /// Its room in the shard, and its place in the room's list.
    room: u32,
    place: u32,
    /// The times its wheel entries are for (`NEVER`: none).
    cadence_at: u64,
    keep_alive_at: u64,
    /// When it was last written to (the shard's ms).
    written_at: u64,
    /// Its last event is written: it closes once the socket took it.
    ending: bool,
}

/// A room with streams in this shard.
struct ShardRoom {
    era: u32,
    id: RoomId,
    feed: Arc<dyn RoomFeed>,
    /// The feed's change counter, to tell a replaced room's new feed.
    changes: watch::Receiver<u64>,
    /// The next change, waited for with the room's waker.
    changed: Pin<Box<dyn Future<Output = (watch::Receiver<u64>, bool)> + Send>>,
    /// A change that came while the last one was being taken.
    early: Option<(watch::Receiver<u64>, bool)>,
    wakes: Arc<Wakes>,
    waker: Waker,
    conns: Vec<u32>,
    shared: Shared,
    tail: Tail,
}

/// What every stream of a room shows alike: a change in it may change
/// every page (the pause notice, the mode, the waits through the rate).
#[derive(Clone, Copy, PartialEq)]
struct Shared {
    open: bool,
    paused: bool,
    closed: bool,
    mode: Mode,
    opens_at: Option<u64>,
    rate_known: bool,
    rate_band: i64,
    lanes: LaneLoads,
}

impl Shared {
    fn of(f: &RoomFacts) -> Self {
        Self {
            open: f.open,
            paused: f.paused,
            closed: f.closed,
            mode: f.mode,
            opens_at: f.opens_at,
            rate_known: f.rate.primed,
            rate_band: f.rate.band(),
            lanes: f.lanes,
        }
    }
}

fn next_change(
    mut changes: watch::Receiver<u64>,
) -> Pin<Box<dyn Future<Output = (watch::Receiver<u64>, bool)> + Send>> {
    Box::pin(async move {
        let live = changes.changed().await.is_ok();
        (changes, live)
    })
}

struct Shard {
    inbox: Arc<Inbox>,
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    keep_alive_ms: u64,
    epoch: Instant,
    conns: Vec<Option<Conn>>,
    free: Vec<u32>,
    rooms: Vec<Option<ShardRoom>>,
    /// Cadence times are the engine's clock (virtual in tests);
    /// keep-alives are real time since `epoch`.
    cadence: Wheel,
    keep_alives: Wheel,
    out: Vec<u8>,
    frame: Vec<u8>,
    due: Vec<Entry>,
    eras: u32,
    /// Streams in the shard.
    live: usize,
}

/// Why a stream left its shard.
enum Leave {
    /// Its last event went out: end the response.
    Ended,
    /// The client went away, or stopped reading.
    Gone,
}

impl Shard {
    async fn run(mut self, shutdown: CancellationToken) {
        let mut next_tick = Instant::now() + TICK;
        loop {
            let ticking = self.live > 0;
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                () = self.inbox.notify.notified() => {}
                () = tokio::time::sleep_until(next_tick), if ticking => {}
            }
            self.news();
            self.waves().await;
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + TICK;
                if ticking {
                    self.tick().await;
                }
            }
        }
        // Shutting down: every stream ends, its connection closes.
        for slot in 0..self.conns.len() {
            if self.conns[slot].is_some() {
                self.leave(slot as u32, Leave::Ended);
            }
        }
    }

    fn real_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// New streams, and the streams whose own wakers fired.
    fn news(&mut self) {
        loop {
            let (new, conns) = {
                let mut q = lock(&self.inbox.queue);
                (std::mem::take(&mut q.new), std::mem::take(&mut q.conns))
            };
            if new.is_empty() && conns.is_empty() {
                return;
            }
            for (start, sink) in new {
                self.add(start, sink);
            }
            for (slot, era) in conns {
                self.woken(slot, era);
                self.inbox.news.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn add(&mut self, start: Start, sink: Sink) {
        let Start { stream, held, .. } = start;
        let room = self.room_for(&stream);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.conns.push(None);
                (self.conns.len() - 1) as u32
            }
        };
        let era = self.next_era();
        let wakes = Arc::new(Wakes {
            inbox: self.inbox.clone(),
            room: false,
            slot,
            era,
            queued: AtomicBool::new(false),
        });
        let r = self.rooms[room as usize].as_mut().expect("a live room");
        let place = r.conns.len() as u32;
        r.conns.push(slot);
        let now = self.real_ms();
        self.live += 1;
        self.conns[slot as usize] = Some(Conn {
            era,
            stream,
            sink,
            waker: Waker::from(wakes.clone()),
            wakes,
            _held: held,
            room,
            place,
            cadence_at: NEVER,
            keep_alive_at: now + self.keep_alive_ms,
            written_at: now,
            ending: false,
        });
        self.keep_alives
            .insert((now + self.keep_alive_ms, slot, era));
        // Listen first (the client, the ticket's signal), then the first
        // event at once.
        self.woken(slot, era);
        self.look(slot, true);
    }

    /// A generation for a slot being taken, so that old wakes and wheel
    /// entries miss its new stream or room.
    fn next_era(&mut self) -> u32 {
        self.eras = self.eras.wrapping_add(1);
        self.eras
    }

    /// The shard's entry for the stream's room (this feed of it), made if
    /// need be.
    fn room_for(&mut self, stream: &Stream) -> u32 {
        let changes = stream.feed.changes();
        if let Some(i) = self.rooms.iter().position(|r| {
            r.as_ref()
                .is_some_and(|r| r.id == stream.room && r.changes.same_channel(&changes))
        }) {
            return i as u32;
        }
        let slot = match self.rooms.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.rooms.push(None);
                self.rooms.len() - 1
            }
        };
        let era = self.next_era();
        let wakes = Arc::new(Wakes {
            inbox: self.inbox.clone(),
            room: true,
            slot: slot as u32,
            era,
            queued: AtomicBool::new(false),
        });
        let waker = Waker::from(wakes.clone());
        let mut changed = next_change(changes.clone());
        // Registers the waker: the first change wakes the room.
        let early = match changed.as_mut().poll(&mut Context::from_waker(&waker)) {
            Poll::Ready(change) => {
                waker.wake_by_ref();
                Some(change)
            }
            Poll::Pending => None,
        };
        self.rooms[slot] = Some(ShardRoom {
            early,
            era,
            id: stream.room.clone(),
            feed: stream.feed.clone(),
            shared: Shared::of(&stream.feed.room_facts()),
            changes,
            changed,
            wakes,
            waker,
            conns: Vec::new(),
            tail: Tail::default(),
        });
        slot as u32
    }

    /// A stream's waker fired: its client, its socket or its ticket.
    fn woken(&mut self, slot: u32, era: u32) {
        let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if c.era != era {
            return;
        }
        c.wakes.queued.store(false, Ordering::Release);
        let waker = c.waker.clone();
        let mut cx = Context::from_waker(&waker);
        if c.sink.poll(&mut cx).is_err() {
            self.leave(slot, Leave::Gone);
            return;
        }
        if c.ending {
            if c.sink.flushed() {
                self.leave(slot, Leave::Ended);
            }
            return;
        }
        self.out.clear();
        match c.stream.poll_news(&mut cx, &self.backend, &mut self.out) {
            None => {}
            Some(Look::End) => self.write(slot, Look::End),
            Some(Look::Wait) => self.look(slot, false),
        }
    }

    /// Look at one stream now and write what is due.
    fn look(&mut self, slot: u32, recover: bool) {
        let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if c.ending {
            return;
        }
        let Some(room) = self.rooms[c.room as usize].as_mut() else {
            return;
        };
        self.out.clear();
        let now = self.clock.now_ms();
        let recovering = c.stream.recovering();
        let look = c
            .stream
            .look(now, &mut self.out, &mut room.tail, &self.backend, recover);
        // A look that sets a recovery going leaves it unpolled: woken, the
        // stream starts it now, not at its next news (for a visitor back
        // from away, the presence report up to half a second later, while
        // the permits go to those behind them).
        if !recovering && c.stream.recovering() {
            c.waker.wake_by_ref();
        }
        if c.stream.at_ms < c.cadence_at {
            c.cadence_at = c.stream.at_ms;
            self.cadence.insert((c.cadence_at, slot, c.era));
        }
        self.write(slot, look);
    }

    /// Write what a look left in `out`; end the stream if it is over.
    fn write(&mut self, slot: u32, look: Look) {
        let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
            return;
        };
        if !self.out.is_empty() {
            let mut cx = Context::from_waker(&c.waker);
            if c.sink.send(&self.out, &mut self.frame, &mut cx).is_err() {
                self.leave(slot, Leave::Gone);
                return;
            }
            c.written_at = self.epoch.elapsed().as_millis() as u64;
        }
        if look == Look::End {
            c.ending = true;
            if c.sink.flushed() {
                self.leave(slot, Leave::Ended);
            }
        }
    }

    /// The stream leaves the shard; its connection closes (after the
    /// response's end when it ended).
    fn leave(&mut self, slot: u32, why: Leave) {
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        self.free.push(slot);
        self.live -= 1;
        if let Some(room) = self.rooms[c.room as usize].as_mut() {
            room.conns.swap_remove(c.place as usize);
            if let Some(&moved) = room.conns.get(c.place as usize)
                && let Some(Some(m)) = self.conns.get_mut(moved as usize)
            {
                m.place = c.place;
            }
            if room.conns.is_empty() {
                self.rooms[c.room as usize] = None;
            }
        }
        match why {
            Leave::Ended => c.sink.close(),
            Leave::Gone => drop(c.sink),
        }
    }

    /// The rooms whose feeds changed: their streams that want to know.
    async fn waves(&mut self) {
        loop {
            let rooms = std::mem::take(&mut lock(&self.inbox.queue).rooms);
            if rooms.is_empty() {
                return;
            }
            for (slot, era) in rooms {
                self.wave(slot, era).await;
            }
        }
    }

    /// The room's change its waker announced, if there is one: whether
    /// its feed lives on. Listens for the next one.
    fn take_change(&mut self, slot: u32, era: u32) -> Option<bool> {
        let room = self.rooms.get_mut(slot as usize)?.as_mut()?;
        if room.era != era {
            return None;
        }
        room.wakes.queued.store(false, Ordering::Release);
        let waker = room.waker.clone();
        let mut cx = Context::from_waker(&waker);
        let (changes, live) = match room.early.take() {
            Some(change) => change,
            None => match room.changed.as_mut().poll(&mut cx) {
                Poll::Ready(change) => change,
                Poll::Pending => return None,
            },
        };
        if !live {
            room.changed = Box::pin(std::future::pending());
            return Some(false);
        }
        room.changed = next_change(changes);
        // Registers the waker for the next change; one already there is
        // taken after this one.
        if let Poll::Ready(change) = room.changed.as_mut().poll(&mut cx) {
            room.early = Some(change);
            waker.wake_by_ref();
        }
        Some(true)
    }

    async fn wave(&mut self, slot: u32, era: u32) {
        let Some(live) = self.take_change(slot, era) else {
            return;
        };
        let Some(Some(room)) = self.rooms.get_mut(slot as usize) else {
            return;
        };
        if !live {
            // The room was replaced or is gone: its streams are told.
            let conns = room.conns.clone();
            for c in conns {
                self.out.clear();
                encode::closed(&mut self.out, "closed");
                self.write(c, Look::End);
            }
            return;
        }
        let now = Shared::of(&room.feed.room_facts());
        let everyone = now != room.shared;
        room.shared = now;
        let mut moves: Vec<(u8, LineMoves)> = Vec::new();
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        for &c in &room.conns {
            let Some(Some(conn)) = self.conns.get(c as usize) else {
                continue;
            };
            let lane = conn.stream.lane;
            let moved = match moves.iter().find(|(l, _)| *l == lane) {
                Some(&(_, m)) => m,
                None => {
                    let m = room.feed.moves(lane);
                    moves.push((lane, m));
                    m
                }
            };
            if everyone || conn.stream.moved_enough(moved) {
                due.push((0, c, conn.era));
            }
        }
        self.look_all(&due).await;
        self.due = due;
    }

    /// Look at the streams due, a group at a time; the shard's own news
    /// first, and between groups, with the rest of the server let in.
    async fn look_all(&mut self, due: &[Entry]) {
        let mut i = 0;
        while i < due.len() {
            for _ in 0..NEWS_FIRST {
                if self.inbox.news.load(Ordering::Acquire) == 0 {
                    break;
                }
                tokio::task::yield_now().await;
                self.news();
            }
            for &(_, slot, era) in &due[i..(i + GROUP).min(due.len())] {
                if matches!(self.conns.get(slot as usize), Some(Some(c)) if c.era == era) {
                    self.look(slot, true);
                }
            }
            i += GROUP;
            if i < due.len() {
                tokio::task::yield_now().await;
                self.news();
            }
        }
    }

    /// The times come due: cadence looks, and keep-alives for streams
    /// silent that long.
    async fn tick(&mut self) {
        let mut due = std::mem::take(&mut self.due);
        due.clear();
        let now = self.clock.now_ms();
        let mut fired = Vec::new();
        self.cadence.take_due(now, &mut fired);
        for (at, slot, era) in fired.drain(..) {
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                continue;
            };
            if c.era != era || c.cadence_at != at {
                continue;
            }
            c.cadence_at = NEVER;
            if c.stream.at_ms <= now {
                due.push((at, slot, era));
            } else if c.stream.at_ms != NEVER {
                c.cadence_at = c.stream.at_ms;
                self.cadence.insert((c.cadence_at, slot, era));
            }
        }
        self.look_all(&due).await;
        self.due = due;

        let now = self.real_ms();
        self.keep_alives.take_due(now, &mut fired);
        for (at, slot, era) in fired {
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                continue;
            };
            if c.era != era || c.keep_alive_at != at {
                continue;
            }
            if c.ending {
                // Its last event has waited a whole keep-alive for the
                // client to read it.
                self.leave(slot, Leave::Gone);
                continue;
            }
            if c.written_at + self.keep_alive_ms <= now {
                self.out.clear();
                let shown = match self.rooms[c.room as usize].as_mut() {
                    Some(room) => {
                        c.stream
                            .keep_alive(self.clock.now_ms(), &mut self.out, &mut room.tail)
                    }
                    None => false,
                };
                if !shown {
                    self.out.extend_from_slice(encode::KEEP_ALIVE);
                }
                self.write(slot, Look::Wait);
            }
            // Gone if the write failed; otherwise due a keep-alive after
            // its last write.
            let Some(Some(c)) = self.conns.get_mut(slot as usize) else {
                continue;
            };
            c.keep_alive_at = c.written_at + self.keep_alive_ms;
            self.keep_alives.insert((c.keep_alive_at, slot, era));
        }
    }
}
