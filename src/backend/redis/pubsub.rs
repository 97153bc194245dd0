//! What this instance holds for its streams, and the one pub/sub channel.
//!
//! The [`Hub`] keeps, per room followed here, the current [`Replica`] (kept
//! by the room's follower from the change log), each stream's ticket
//! signal (woken by the follower when the log names the ticket), and the
//! streams' status reads on their way to Redis in batches.
//!
//! Scripts PUBLISH on one channel (`keys::CHANNEL`) only `r|room|epoch|`
//! when a room was (re)created, so that every instance runs a worker for
//! it; everything streams see travels by the room's change log, which pub/
//! sub (fire-and-forget) could not carry without losing messages.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use futures_util::StreamExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::batch::StatusBatches;
use super::conn::Subscriptions;
use super::keys::CHANNEL;
use super::replica::Replica;
use crate::backend::feed::RoomFeed;
use crate::engine::RoomId;
use crate::engine::rules::RoomFacts;

/// What this instance holds for its streams.
#[derive(Default)]
pub struct Hub {
    /// Each followed room's current replica (`None` until its follower's
    /// first snapshot).
    rooms: DashMap<RoomId, watch::Sender<Option<Arc<Replica>>>>,
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
    /// The subscription (re)connected: room creations may have been missed.
    Resubscribed,
}

impl Hub {
    fn slot(&self, room: &RoomId) -> watch::Sender<Option<Arc<Replica>>> {
        self.rooms
            .entry(room.clone())
            .or_insert_with(|| watch::Sender::new(None))
            .clone()
    }

    /// The room's current replica here, if its follower has one.
    pub fn replica(&self, room: &RoomId) -> Option<Arc<Replica>> {
        self.rooms.get(room).and_then(|r| r.borrow().clone())
    }

    /// The room's replica once its follower has one, waiting up to `within`.
    pub async fn wait_replica(&self, room: &RoomId, within: Duration) -> Option<Arc<Replica>> {
        let mut rx = self.slot(room).subscribe();
        let got = tokio::time::timeout(within, rx.wait_for(Option::is_some)).await;
        got.ok()?.ok()?.clone()
    }

    /// A replica (of a new incarnation) takes over the room; the one it
    /// replaces is retired, so its streams end.
    pub fn install(&self, room: &RoomId, replica: Arc<Replica>) {
        if let Some(old) = self.slot(room).send_replace(Some(replica)) {
            old.retire();
        }
    }

    /// This instance replaced the room: its replica is stale until the
    /// follower reads the new incarnation.
    pub fn retire(&self, room: &RoomId) {
        if let Some(old) = self.slot(room).send_replace(None) {
            old.retire();
        }
    }

    /// Every replica retired (the backend stops).
    pub fn retire_all(&self) {
        for r in self.rooms.iter() {
            if let Some(old) = r.send_replace(None) {
                old.retire();
            }
        }
    }

    /// What a ticket's status needs of the room, from the replica here.
    pub fn facts(&self, room: &RoomId, waiting: u64) -> Option<RoomFacts> {
        let mut facts = self.replica(room)?.room_facts();
        facts.waiting = waiting;
        Some(facts)
    }

    /// A view this instance just published: its streams need not wait for
    /// it to come back through the log.
    pub fn apply_view(&self, room: &RoomId, epoch: u64, view: crate::engine::RoomView) {
        if let Some(replica) = self.replica(room)
            && replica.epoch == epoch
            && replica.set_view(view)
        {
            replica.bump();
        }
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

    /// The log named this ticket: wake its stream, whose next status read
    /// goes first.
    pub fn notify_ticket(&self, room: &RoomId, epoch: u64, id: u64) {
        let key = (room.clone(), epoch, id);
        if let Some(n) = self.waiters.get(&key) {
            // The stream may be waiting on a read queued behind others:
            // move it up; else its next read goes first.
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

    /// Wake every stream of a room here (its follower missed entries).
    pub fn wake_room(&self, room: &RoomId) {
        for n in self.waiters.iter().filter(|w| &w.key().0 == room) {
            n.notify_waiters();
        }
    }

    /// Handle one message from the channel.
    fn handle(&self, payload: &str, events: &mpsc::UnboundedSender<HubEvent>) {
        let mut parts = payload.splitn(3, '|');
        let (Some("r"), Some(room)) = (parts.next(), parts.next()) else {
            return;
        };
        if let Ok(room) = RoomId::new(room) {
            let _ = events.send(HubEvent::RoomCreated(room));
        }
    }
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
    fn only_room_creations_travel_by_pub_sub() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        hub.handle("r|sale|7|", &tx);
        hub.handle("t|sale|7|3", &tx);
        hub.handle("r|BAD ROOM|7|", &tx);
        hub.handle("garbage", &tx);
        assert!(matches!(rx.try_recv(), Ok(HubEvent::RoomCreated(r)) if r.as_str() == "sale"));
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn ticket_news_wakes_only_its_ticket() {
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
        hub.notify_ticket(&room, 7, 3);
        hub.notify_ticket(&room, 8, 4);
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
