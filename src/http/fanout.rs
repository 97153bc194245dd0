//! Paced, selective fan-out of a room's changes to its event streams.
//!
//! Most changes of a big room matter to few of its streams: under the
//! cadence rule (`rules::due`) someone two hundred thousand places back
//! has nothing to send until the line has moved by a thousand. So a
//! stream does not wake for every change. After each look it tells the
//! room's relay when it is next worth waking ([`Waves::wake_when`]): once
//! its lane's line has moved far enough for its place to have changed
//! noticeably (`feed::LineMoves`: a place falls by at most as much as the
//! line moved), at a time (the one-second gap, the 20-second refresh), or
//! when something everyone sees changes (a pause, the mode, the rate's
//! band, the opening, the lanes' loads), which wakes them all.
//!
//! One relay task per room follows the feed. On each change, and every
//! [`RETRY`] for the streams waiting for a time, it wakes the streams due
//! a group at a time, yielding between groups: Tokio queues woken tasks
//! first in, first out, so a request that arrived meanwhile (above all a
//! `leave` whose hand-off admits the next visitor) waits behind one group
//! at most.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::backend::feed::{LineMoves, RoomFeed};
use crate::engine::rules::{Mode, RoomFacts};
use crate::engine::{Clock, RoomId};
use crate::sync::lock;

/// Streams woken at once: a Tokio worker's local run queue holds 256.
const GROUP: usize = 200;
/// The longest a wave waits for a group's streams before going on (a slow
/// store, a starved process).
const GROUP_WAIT: Duration = Duration::from_millis(50);
/// How often the streams waiting for a time are looked at.
const RETRY: Duration = Duration::from_millis(250);
/// Never, for a stream's time or count.
const NEVER: u64 = u64::MAX;

/// One stream's place in its room's relay.
pub struct Waves {
    interest: Arc<Interest>,
    wave: Arc<Wave>,
}

/// What a stream waits for.
struct Interest {
    notify: Notify,
    lane: u8,
    /// Wake once the lane's line, as this copy counts it, has moved this
    /// far; a new copy wakes it at once.
    copy: AtomicU64,
    moves: AtomicU64,
    /// Wake at this time (Unix ms, the engine's clock).
    at_ms: AtomicU64,
    /// Woken by a wave and not yet done with it.
    owed: AtomicBool,
    /// The relay ended: the room was replaced or is gone.
    ended: AtomicBool,
}

/// The group being woken: how many of its streams have yet to handle the
/// wave, and the relay waiting for them.
#[derive(Default)]
struct Wave {
    left: AtomicUsize,
    done: Notify,
}

impl Waves {
    /// Sleep until `lane`'s line has moved `needed` past `moved`, or until
    /// `at_ms`, or until something every stream sees changes. Call
    /// [`Self::handled`] after.
    pub fn wake_when(&self, moved: LineMoves, needed: Option<u64>, at_ms: Option<u64>) {
        let i = &self.interest;
        i.copy.store(moved.copy, Ordering::Release);
        i.moves.store(
            needed.map_or(NEVER, |n| moved.count.saturating_add(n.max(1))),
            Ordering::Release,
        );
        i.at_ms.store(at_ms.unwrap_or(NEVER), Ordering::Release);
    }

    /// Whether the line has already moved as far as the stream waits for
    /// (a change between its look and [`Self::wake_when`]).
    pub fn due_now(&self, moved: LineMoves) -> bool {
        let i = &self.interest;
        moved.copy != i.copy.load(Ordering::Acquire)
            || moved.count >= i.moves.load(Ordering::Acquire)
    }

    /// The stream is done with the wave it was woken for, if any.
    pub fn handled(&self) {
        if !self.interest.owed.swap(false, Ordering::AcqRel) {
            return;
        }
        // Stragglers of a group the relay stopped waiting for count against
        // the next one, which then goes on a little early: harmless.
        if self
            .wave
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            == Ok(1)
        {
            self.wave.done.notify_waiters();
        }
    }

    /// Until the relay wakes this stream: `false` when the room was
    /// replaced or is gone.
    pub async fn woken(&self) -> bool {
        if self.interest.ended.load(Ordering::Acquire) {
            return false;
        }
        self.interest.notify.notified().await;
        !self.interest.ended.load(Ordering::Acquire)
    }
}

impl Drop for Waves {
    fn drop(&mut self) {
        self.handled();
    }
}

/// The relays of every room with open streams.
#[derive(Default)]
pub struct Fanout {
    rooms: Mutex<HashMap<RoomId, Weak<Relay>>>,
}

/// One room's relay and the streams it wakes.
struct Relay {
    /// The feed's change counter this relay follows, to tell a relay of a
    /// replaced room (a new feed) from the current one.
    changes: watch::Receiver<u64>,
    streams: Mutex<Vec<Weak<Interest>>>,
    wave: Arc<Wave>,
}

impl Fanout {
    /// A stream of `room` in `lane` joins its relay, which wakes it as
    /// [`Waves::wake_when`] asks; until then, as soon as anything changes.
    pub fn subscribe(
        self: &Arc<Self>,
        room: &RoomId,
        feed: Arc<dyn RoomFeed>,
        lane: u8,
        clock: Arc<dyn Clock>,
    ) -> Waves {
        let changes = feed.changes();
        let mut rooms = lock(&self.rooms);
        let relay = match rooms.get(room).and_then(Weak::upgrade) {
            Some(relay) if relay.changes.same_channel(&changes) => relay,
            _ => {
                let relay = Arc::new(Relay {
                    changes: changes.clone(),
                    streams: Mutex::new(Vec::new()),
                    wave: Arc::default(),
                });
                rooms.insert(room.clone(), Arc::downgrade(&relay));
                tokio::spawn(run(
                    self.clone(),
                    room.clone(),
                    relay.clone(),
                    feed,
                    clock,
                    changes,
                ));
                relay
            }
        };
        let interest = Arc::new(Interest {
            notify: Notify::new(),
            lane,
            copy: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            at_ms: AtomicU64::new(NEVER),
            owed: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        lock(&relay.streams).push(Arc::downgrade(&interest));
        Waves {
            interest,
            wave: relay.wave.clone(),
        }
    }
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
    lanes: crate::engine::rules::LaneLoads,
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

/// Until the feed's counter closes (the room is gone or replaced), or no
/// stream follows the room any more; then every stream still there is
/// told.
async fn run(
    fanout: Arc<Fanout>,
    room: RoomId,
    relay: Arc<Relay>,
    feed: Arc<dyn RoomFeed>,
    clock: Arc<dyn Clock>,
    mut changes: watch::Receiver<u64>,
) {
    let mut shared = Shared::of(&feed.room_facts());
    loop {
        let changed = tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
                true
            }
            () = tokio::time::sleep(RETRY) => false,
        };
        if retired_if_unused(&fanout, &room, &relay) {
            return;
        }
        let mut everyone = false;
        if changed {
            let now = Shared::of(&feed.room_facts());
            everyone = now != shared;
            shared = now;
        }
        wake_due(&relay, &*feed, clock.now_ms(), everyone).await;
    }
    unregister(&mut lock(&fanout.rooms), &room, &relay);
    for interest in lock(&relay.streams).iter().filter_map(Weak::upgrade) {
        interest.ended.store(true, Ordering::Release);
        interest.notify.notify_one();
    }
}

/// Wake the streams due, a group at a time.
async fn wake_due(relay: &Relay, feed: &dyn RoomFeed, now: u64, everyone: bool) {
    let streams: Vec<Arc<Interest>> = {
        let mut streams = lock(&relay.streams);
        streams.retain(|w| w.strong_count() > 0);
        streams.iter().filter_map(Weak::upgrade).collect()
    };
    let mut moves: HashMap<u8, LineMoves> = HashMap::new();
    let mut due = streams.iter().filter(|i| {
        everyone || i.at_ms.load(Ordering::Acquire) <= now || {
            let m = *moves.entry(i.lane).or_insert_with(|| feed.moves(i.lane));
            m.copy != i.copy.load(Ordering::Acquire) || m.count >= i.moves.load(Ordering::Acquire)
        }
    });
    loop {
        let group: Vec<&Arc<Interest>> = due.by_ref().take(GROUP).collect();
        if group.is_empty() {
            return;
        }
        relay.wave.left.store(group.len(), Ordering::Release);
        let done = relay.wave.done.notified();
        tokio::pin!(done);
        done.as_mut().enable();
        for interest in group {
            // Not again for the same reason before it has looked.
            interest.at_ms.store(NEVER, Ordering::Release);
            interest.moves.store(NEVER, Ordering::Release);
            interest.owed.store(true, Ordering::Release);
            interest.notify.notify_one();
        }
        let _ = tokio::time::timeout(GROUP_WAIT, done).await;
    }
}

/// Ends the relay when no stream follows it any more. Under the registry's
/// lock, so that no stream subscribes to a relay that is about to end.
fn retired_if_unused(fanout: &Fanout, room: &RoomId, relay: &Arc<Relay>) -> bool {
    let mut rooms = lock(&fanout.rooms);
    if lock(&relay.streams).iter().any(|w| w.strong_count() > 0) {
        return false;
    }
    unregister(&mut rooms, room, relay);
    true
}

/// Removes the room's entry if it is still this relay (a replaced room
/// may already have a new one).
fn unregister(rooms: &mut HashMap<RoomId, Weak<Relay>>, room: &RoomId, relay: &Arc<Relay>) {
    if rooms
        .get(room)
        .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(relay)))
    {
        rooms.remove(room);
    }
}
