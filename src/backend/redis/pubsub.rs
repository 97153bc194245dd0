//! Push across instances. Scripts PUBLISH on one channel (`keys::CHANNEL`)
//! in the same atomic step that changes state: `t|room|epoch|id` when a
//! ticket changed (admitted, expired, left…), `v|room|epoch|version|{json}`
//! when a room view was published, `r|room|epoch|` when a room was
//! (re)created. Each
//! instance holds one subscription and fans messages out to the streams it
//! holds: a ticket's `Notify` (so an admission reaches its visitor at once,
//! whichever instance admitted it) and a room's `watch` of its view.
//!
//! Pub/sub is fire-and-forget: after a reconnect the hub wakes every local
//! waiter and asks for fresh views, so nothing stays stale for long.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use futures_util::StreamExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::batch::StatusBatches;
use super::conn::Subscriptions;
use super::keys::CHANNEL;
use crate::engine::RoomId;
use crate::engine::RoomView;
use crate::engine::rules::RoomFacts;

struct LocalRoom {
    epoch: u64,
    tx: watch::Sender<RoomView>,
}

/// What this instance holds for its streams.
#[derive(Default)]
pub struct Hub {
    rooms: DashMap<RoomId, LocalRoom>,
    waiters: DashMap<(RoomId, u64, u64), Arc<Notify>>,
    /// Tickets whose signal fired and whose stream has not read its status
    /// since: that read jumps the batch queue (`batch.rs`).
    urgent: DashMap<(RoomId, u64, u64), ()>,
    /// The streams' status reads on their way to Redis.
    pub batches: StatusBatches,
}

/// What the subscriber tells the backend beyond fan-out.
pub enum HubEvent {
    /// A room was created or replaced somewhere: run a worker for it.
    RoomCreated(RoomId),
    /// The subscription (re)connected: views may have been missed.
    Resubscribed,
}

impl Hub {
    pub fn subscribe_view(&self, room: &RoomId) -> Option<watch::Receiver<RoomView>> {
        self.rooms.get(room).map(|r| r.tx.subscribe())
    }

    /// What a ticket's status needs of the room, from the view followed
    /// here, if it is.
    pub fn facts(&self, room: &RoomId, waiting: u64) -> Option<RoomFacts> {
        self.rooms.get(room).map(|r| r.tx.borrow().facts(waiting))
    }

    /// Take a view read from Redis or heard on the channel. A view of
    /// another epoch replaces the room: the old sender is dropped, so the
    /// old incarnation's streams end.
    pub fn apply_view(
        &self,
        room: &RoomId,
        epoch: u64,
        view: RoomView,
    ) -> watch::Receiver<RoomView> {
        let mut entry = self.rooms.entry(room.clone()).or_insert_with(|| LocalRoom {
            epoch,
            tx: watch::Sender::new(view.clone()),
        });
        if entry.epoch != epoch {
            *entry = LocalRoom {
                epoch,
                tx: watch::Sender::new(view),
            };
        } else {
            entry.tx.send_if_modified(|current| {
                if view.version > current.version {
                    *current = view;
                    true
                } else {
                    false
                }
            });
        }
        entry.tx.subscribe()
    }

    /// Forget a room's local view if it is of an older epoch.
    fn replace_epoch(&self, room: &RoomId, epoch: u64) {
        self.rooms.remove_if(room, |_, r| r.epoch != epoch);
    }

    pub fn ticket_notify(&self, room: &RoomId, epoch: u64, id: u64) -> Arc<Notify> {
        self.waiters
            .entry((room.clone(), epoch, id))
            .or_default()
            .clone()
    }

    pub fn forget_ticket_notify(&self, key: (RoomId, u64, u64), notify: Arc<Notify>) {
        drop(notify);
        if self
            .waiters
            .remove_if(&key, |_, n| Arc::strong_count(n) == 1)
            .is_some()
        {
            self.urgent.remove(&key);
        }
    }

    fn notify_ticket(&self, room: &RoomId, epoch: u64, id: u64) {
        let key = (room.clone(), epoch, id);
        if let Some(n) = self.waiters.get(&key) {
            // The stream may be waiting on a read queued behind a
            // broadcast's: move it up; else its next read goes first.
            if !self.batches.promote(room, epoch, id) {
                self.urgent.insert(key.clone(), ());
            }
            n.notify_waiters();
        }
    }

    /// Whether this ticket's signal fired since its last status read.
    pub fn take_urgent(&self, room: &RoomId, epoch: u64, id: u64) -> bool {
        !self.urgent.is_empty() && self.urgent.remove(&(room.clone(), epoch, id)).is_some()
    }

    fn wake_everyone(&self) {
        for n in self.waiters.iter() {
            n.notify_waiters();
        }
    }

    pub fn local_rooms(&self) -> Vec<RoomId> {
        self.rooms.iter().map(|r| r.key().clone()).collect()
    }

    /// Handle one message from the channel.
    fn handle(&self, payload: &str, events: &mpsc::UnboundedSender<HubEvent>) {
        let mut parts = payload.splitn(4, '|');
        let (Some(kind), Some(room), Some(epoch), rest) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let (Ok(room), Ok(epoch)) = (RoomId::new(room), epoch.parse::<u64>()) else {
            return;
        };
        match kind {
            "t" => {
                if let Some(id) = rest.and_then(|r| r.parse::<u64>().ok()) {
                    self.notify_ticket(&room, epoch, id);
                }
            }
            "v" => {
                let view = rest
                    .and_then(|r| r.split_once('|'))
                    .and_then(|(version, json)| {
                        let mut view = parse_view(json)?;
                        view.version = version.parse().ok()?;
                        Some(view)
                    });
                if let Some(view) = view {
                    // Only rooms someone here follows are kept up to date.
                    if self.rooms.contains_key(&room) {
                        self.apply_view(&room, epoch, view);
                    }
                }
            }
            "r" => {
                self.replace_epoch(&room, epoch);
                let _ = events.send(HubEvent::RoomCreated(room));
            }
            _ => {}
        }
    }
}

/// Parse a published view (JSON of `RoomView`, as `RedisBackend::publish`
/// writes it); `None` for anything malformed.
pub fn parse_view(json: &str) -> Option<RoomView> {
    serde_json::from_str(json).ok()
}

/// Keep one subscription open for the life of the backend, reconnecting
/// after Redis goes away, and moving to the new primary after a Sentinel
/// failover.
pub async fn run_subscriber(
    subscriptions: Subscriptions,
    hub: Arc<Hub>,
    events: mpsc::UnboundedSender<HubEvent>,
    stop: CancellationToken,
) {
    let mut first = true;
    let mut switches = subscriptions.switches();
    loop {
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            c = subscriptions.connect() => c,
        };
        match connected {
            Ok(mut pubsub) => {
                if pubsub.subscribe(CHANNEL).await.is_ok() {
                    if !first {
                        hub.wake_everyone();
                        let _ = events.send(HubEvent::Resubscribed);
                    }
                    first = false;
                    if let Some(s) = switches.as_mut() {
                        s.mark_unchanged();
                    }
                    let mut messages = pubsub.on_message();
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => return,
                            () = switched(&mut switches) => break,
                            msg = messages.next() => match msg {
                                Some(msg) => {
                                    if let Ok(payload) = msg.get_payload::<String>() {
                                        hub.handle(&payload, &events);
                                    }
                                }
                                None => break,
                            }
                        }
                    }
                    tracing::warn!("redis subscription lost; reconnecting");
                }
            }
            Err(e) => tracing::debug!(kind = ?e.kind(), "redis subscription: cannot connect"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// Completes when the node to subscribe to changed; never without one.
async fn switched(switches: &mut Option<watch::Receiver<u64>>) {
    if let Some(s) = switches
        && s.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_view_replaces_an_older_one_only() {
        let hub = Hub::default();
        let room = RoomId::new("r").unwrap();
        let rx = hub.apply_view(&room, 7, RoomView::default());
        let (tx, _rx) = mpsc::unbounded_channel();
        let view = RoomView {
            waiting: 3,
            ..RoomView::default()
        };
        let json = serde_json::to_string(&view).unwrap();
        hub.handle(&format!("v|r|7|4|{json}"), &tx);
        assert_eq!((rx.borrow().version, rx.borrow().waiting), (4, 3));
        let older = serde_json::to_string(&RoomView::default()).unwrap();
        hub.handle(&format!("v|r|7|3|{older}"), &tx);
        hub.handle("v|r|7|9|{", &tx);
        assert_eq!((rx.borrow().version, rx.borrow().waiting), (4, 3));
        assert_eq!(hub.facts(&room, 11).map(|f| f.waiting), Some(11));
    }

    #[test]
    fn ticket_messages_wake_only_their_ticket() {
        let hub = Hub::default();
        let room = RoomId::new("r").unwrap();
        let n = hub.ticket_notify(&room, 7, 3);
        let other = hub.ticket_notify(&room, 7, 4);
        let woken = n.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let not_woken = other.notified();
        tokio::pin!(not_woken);
        not_woken.as_mut().enable();
        let (tx, _rx) = mpsc::unbounded_channel();
        hub.handle("t|r|7|3", &tx);
        hub.handle("garbage", &tx);
        hub.handle("t|R|7|3", &tx);
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(woken.as_mut().poll(&mut cx).is_ready());
        assert!(not_woken.as_mut().poll(&mut cx).is_pending());
        // The woken ticket's next status read is urgent, once.
        assert!(hub.take_urgent(&room, 7, 3));
        assert!(!hub.take_urgent(&room, 7, 3));
        assert!(!hub.take_urgent(&room, 7, 4));
    }
}
