//! Paced fan-out of a room's changes to the event streams.
//!
//! A change of the room's feed (its change counter moved: positions or the
//! view changed) used to wake every stream of the room at once (one
//! `watch` with 15,000 receivers). Tokio queues woken tasks first in,
//! first out, so a request that arrived during such a broadcast (above
//! all a `leave` whose hand-off admits the next visitor) waited behind all
//! 15,000 stream tasks. Here one relay task per room follows the feed and
//! wakes the streams a group at a time, yielding between groups: the
//! worker then drains the group, polls the I/O driver, and runs whatever
//! arrived meanwhile before the next group. A request waits behind one
//! group at most, and the broadcast as a whole does no more work.
//!
//! Streams held back by their one-event-a-second throttle count themselves
//! as pending instead of each arming a timer (timers expire in bursts,
//! unpaced); while any is pending the relay sends a retry wave every
//! [`RETRY`], paced like the others, and only pending streams act on it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::backend::feed::RoomFeed;
use crate::engine::RoomId;

/// Groups per room: at 15,000 streams about 230 a group, which fits a
/// Tokio worker's local run queue (256) and takes a few milliseconds.
const GROUPS: usize = 64;
/// The longest a wave waits for a group's streams before going on (a slow
/// store, a starved process).
const GROUP_WAIT: Duration = Duration::from_millis(50);
/// How often pending streams get another chance to send while held back.
const RETRY: Duration = Duration::from_millis(250);

/// What a stream follows: the relay's waves (the value is the feed's
/// change count; a retry wave repeats it) and the room's count of pending
/// streams.
pub struct Subscription {
    pub waves: watch::Receiver<u64>,
    pub pending: Pending,
}

/// A stream's mark as pending (a change to show once its throttle allows),
/// cleared when dropped; and its acknowledgement of waves.
pub struct Pending {
    count: Arc<AtomicUsize>,
    on: bool,
    wave: Arc<Wave>,
    owed: bool,
}

/// The group being woken: how many of its streams have yet to handle the
/// wave, and the relay waiting for them.
#[derive(Default)]
struct Wave {
    left: AtomicUsize,
    done: Notify,
}

impl Pending {
    /// This stream will handle the wave it was woken for after some work
    /// (a status read, an event); `handled` says when.
    pub fn owe(&mut self) {
        self.owed = true;
    }

    /// The wave this stream was woken for, if it owes one, is handled.
    pub fn handled(&mut self) {
        if !std::mem::take(&mut self.owed) {
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

    pub fn set(&mut self, on: bool) {
        if on != self.on {
            if on {
                self.count.fetch_add(1, Ordering::Relaxed);
            } else {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            self.on = on;
        }
    }

    pub fn is_set(&self) -> bool {
        self.on
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.set(false);
        self.handled();
    }
}

/// The relays of every room with open streams.
#[derive(Default)]
pub struct Fanout {
    rooms: Mutex<HashMap<RoomId, Weak<Relay>>>,
}

/// One room's relay: a version counter per group of streams.
struct Relay {
    /// The feed's change counter this relay follows, to tell a relay of a
    /// replaced room (a new feed) from the current one.
    changes: watch::Receiver<u64>,
    groups: Vec<watch::Sender<u64>>,
    next: AtomicUsize,
    pending: Arc<AtomicUsize>,
    wave: Arc<Wave>,
}

impl Fanout {
    /// A receiver that changes when the room's feed does, paced with the
    /// room's other streams; it closes when the feed does.
    pub fn subscribe(self: &Arc<Self>, room: &RoomId, feed: &dyn RoomFeed) -> Subscription {
        let changes = feed.changes();
        let mut rooms = self.lock();
        if let Some(relay) = rooms.get(room).and_then(Weak::upgrade)
            && relay.changes.same_channel(&changes)
        {
            return relay.subscribe();
        }
        let relay = Arc::new(Relay {
            changes: changes.clone(),
            groups: (0..GROUPS).map(|_| watch::channel(0).0).collect(),
            next: AtomicUsize::new(0),
            pending: Arc::default(),
            wave: Arc::default(),
        });
        rooms.insert(room.clone(), Arc::downgrade(&relay));
        let receiver = relay.subscribe();
        tokio::spawn(run(self.clone(), room.clone(), relay, changes));
        receiver
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RoomId, Weak<Relay>>> {
        self.rooms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Relay {
    fn subscribe(&self) -> Subscription {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.groups.len();
        Subscription {
            waves: self.groups[i].subscribe(),
            pending: Pending {
                count: self.pending.clone(),
                on: false,
                wave: self.wave.clone(),
                owed: false,
            },
        }
    }

    fn unused(&self) -> bool {
        self.groups.iter().all(|g| g.receiver_count() == 0)
    }
}

/// Until the feed's counter closes (the room is gone or replaced), or no
/// stream follows the room any more. Dropping the relay closes every
/// group, which tells its streams.
async fn run(
    fanout: Arc<Fanout>,
    room: RoomId,
    relay: Arc<Relay>,
    mut changes: watch::Receiver<u64>,
) {
    let mut version = 0u64;
    loop {
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
                if retired_if_unused(&fanout, &room, &relay) {
                    return;
                }
                version += 1;
            }
            // Checked on a timer rather than when a stream marks itself:
            // the last group may do so after the wave loop has ended.
            () = tokio::time::sleep(RETRY) => {
                if retired_if_unused(&fanout, &room, &relay) {
                    return;
                }
                if relay.pending.load(Ordering::Relaxed) == 0 {
                    continue;
                }
            }
        }
        for group in &relay.groups {
            let streams = group.receiver_count();
            if streams == 0 {
                continue;
            }
            relay.wave.left.store(streams, Ordering::Release);
            let done = relay.wave.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            group.send_replace(version);
            let _ = tokio::time::timeout(GROUP_WAIT, done).await;
        }
    }
    unregister(&mut fanout.lock(), &room, &relay);
}

/// Ends the relay when no stream follows it any more. Under the registry's
/// lock, so that no stream subscribes to a relay that is about to end.
fn retired_if_unused(fanout: &Fanout, room: &RoomId, relay: &Arc<Relay>) -> bool {
    let mut rooms = fanout.lock();
    if !relay.unused() {
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
