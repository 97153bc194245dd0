//! Push across instances. Scripts PUBLISH on one channel (`keys::CHANNEL`)
//! in the same atomic step that changes state: `t|room|epoch|id` when a
//! ticket changed (admitted, expired, left…), `v|room|epoch|{json}` when a
//! room view changed, `r|room|epoch|` when a room was (re)created. Each
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
use serde::Deserialize;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::batch::StatusBatches;
use super::conn::Subscriptions;
use super::keys::CHANNEL;
use crate::engine::{AdmissionRate, RoomId, RoomView};

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
                if let Some(view) = rest.and_then(parse_view) {
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

/// The view as the scripts publish it (cjson: numbers may come as floats,
/// 64-bit values as strings).
#[derive(Deserialize)]
struct ViewWire {
    #[serde(default)]
    version: f64,
    #[serde(default)]
    at_ms: String,
    capacity: f64,
    waiting: f64,
    admitted: f64,
    held: f64,
    tray: f64,
    debt: f64,
    paused: bool,
    open: bool,
    closed: bool,
    opens_at: Option<String>,
    lottery_commitment: Option<String>,
    lottery_seed: Option<String>,
    rate_mean: String,
    rate_var: String,
    rate_primed: bool,
    admissions_total: f64,
    #[serde(default)]
    join_limit_per_minute: f64,
}

/// Parse a published view; `None` for anything malformed.
pub fn parse_view(json: &str) -> Option<RoomView> {
    let w: ViewWire = serde_json::from_str(json).ok()?;
    let rate = AdmissionRate {
        mean: w.rate_mean.parse().unwrap_or(0.0),
        variance: w.rate_var.parse().unwrap_or(0.0),
        primed: w.rate_primed,
    };
    Some(RoomView {
        version: w.version as u64,
        at_ms: w.at_ms.parse().unwrap_or(0),
        capacity: w.capacity as u32,
        waiting: w.waiting as u64,
        admitted: w.admitted as u64,
        held: w.held as u64,
        tray: w.tray as u64,
        debt: w.debt as u64,
        paused: w.paused,
        open: w.open,
        closed: w.closed,
        opens_at: w.opens_at.and_then(|s| s.parse().ok()),
        lottery_commitment: w.lottery_commitment,
        lottery_seed: w.lottery_seed,
        admit_rate: rate.mean,
        rate,
        admissions_total: w.admissions_total as u64,
        join_limit_per_minute: w.join_limit_per_minute as u32,
    })
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
    fn a_published_view_parses() {
        let json = r#"{"capacity":5,"waiting":3,"admitted":2,"held":3,"tray":0,"debt":0,
            "paused":false,"open":true,"closed":false,"opens_at":"1700000000000",
            "lottery_commitment":null,"lottery_seed":null,"rate_mean":"1.5","rate_var":"0",
            "rate_primed":true,"admissions_total":7,"version":4,"at_ms":"1700000000123"}"#;
        let v = parse_view(json).unwrap();
        assert_eq!((v.capacity, v.waiting, v.admitted, v.version), (5, 3, 2, 4));
        assert_eq!(v.opens_at, Some(1_700_000_000_000));
        assert_eq!(v.at_ms, 1_700_000_000_123);
        assert!((v.admit_rate - 1.5).abs() < 1e-9);
        assert!(parse_view("{").is_none());
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
