//! The embedded backend: rooms live in this process, on the lock-free
//! engine, each driven by its own worker task.
//!
//! Every operation is a direct call into `engine::Room`, so the invariants
//! are the engine's. The map of rooms is behind a `std::sync::RwLock`
//! rather than a Tokio lock: it is held only to clone an `Arc<Room>` out,
//! never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Backend, BackendError, JoinOutcome, RoomPatch, RoomSnapshot, TicketRef, TicketSignal};
use crate::engine::{
    Clock, Departure, Identity, JoinError, Room, RoomId, RoomSettings, RoomView, TickReport,
    TicketId, TicketStatus,
};

pub struct EmbeddedBackend {
    rooms: RwLock<HashMap<RoomId, RoomSlot>>,
    clock: Arc<dyn Clock>,
    /// Off in tests that drive `tick` themselves on virtual time.
    run_workers: bool,
    shutdown: CancellationToken,
    workers: TaskTracker,
}

struct RoomSlot {
    room: Arc<Room>,
    /// Stops this room's worker when the room is replaced.
    stop: CancellationToken,
}

impl std::fmt::Debug for EmbeddedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBackend").finish_non_exhaustive()
    }
}

impl EmbeddedBackend {
    /// Creates the rooms and starts one worker task per room. Must be
    /// called inside a Tokio runtime.
    pub fn new(rooms: Vec<RoomSettings>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::build(rooms, clock, true)
    }

    /// Rooms without worker tasks: the caller drives `tick`.
    pub fn without_workers(rooms: Vec<RoomSettings>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::build(rooms, clock, false)
    }

    fn build(rooms: Vec<RoomSettings>, clock: Arc<dyn Clock>, run_workers: bool) -> Arc<Self> {
        let backend = Arc::new(Self {
            rooms: RwLock::new(HashMap::new()),
            clock,
            run_workers,
            shutdown: CancellationToken::new(),
            workers: TaskTracker::new(),
        });
        for settings in rooms {
            backend.install(Room::new(settings, backend.clock.clone()));
        }
        backend
    }

    /// The engine room behind an id (for tests and the loadtest's checks).
    pub fn engine_room(&self, id: &RoomId) -> Option<Arc<Room>> {
        self.read().get(id).map(|s| s.room.clone())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<RoomId, RoomSlot>> {
        self.rooms
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn install(&self, room: Arc<Room>) {
        let stop = self.shutdown.child_token();
        if self.run_workers {
            self.workers.spawn(run_worker(room.clone(), stop.clone()));
        }
        let previous = self
            .rooms
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(room.id().clone(), RoomSlot { room, stop });
        if let Some(old) = previous {
            old.stop.cancel();
            old.room.close();
        }
    }

    fn get(&self, id: &RoomId) -> Result<Arc<Room>, BackendError> {
        self.engine_room(id)
            .ok_or_else(|| BackendError::NoSuchRoom(id.clone()))
    }

    /// The room and the engine's ticket id, if the ticket is of this
    /// incarnation and was ever issued.
    fn ticket(&self, id: &RoomId, t: TicketRef) -> Result<(Arc<Room>, TicketId), BackendError> {
        let room = self.get(id)?;
        let ticket = TicketId::try_from(t.id).map_err(|_| BackendError::NoSuchTicket)?;
        // Not `ticket >= room.issued()`: the count lags a push that
        // finished while an earlier slot is still being written, so a
        // ticket just issued could read as unknown.
        if t.epoch != room.epoch() || room.state_of(ticket).is_none() {
            return Err(BackendError::NoSuchTicket);
        }
        Ok((room, ticket))
    }

    fn snapshot(room: &Room) -> RoomSnapshot {
        RoomSnapshot {
            settings: room.settings(),
            epoch: room.epoch(),
            view: room.view(),
            stats: room.stats(),
            ledger: room.ledger(),
        }
    }
}

/// A room's worker: one tick every `tick`, re-reading the setting each time
/// so that operators can change it live.
async fn run_worker(room: Arc<Room>, stop: CancellationToken) {
    let mut next = tokio::time::Instant::now();
    loop {
        let tick = room.settings().tick.max(Duration::from_millis(1));
        next += tick;
        let now = tokio::time::Instant::now();
        if next < now {
            // Fell behind (a stalled machine): do not burst to catch up.
            next = now + tick;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        let report = room.tick();
        if report.opened {
            tracing::info!(room = %room.id(), "room opened");
        }
    }
}

#[async_trait]
impl Backend for EmbeddedBackend {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn ready(&self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn epoch(&self, room: &RoomId) -> Result<u64, BackendError> {
        Ok(self.get(room)?.epoch())
    }

    async fn join(
        &self,
        id: &RoomId,
        identity: Option<Identity>,
    ) -> Result<JoinOutcome, BackendError> {
        let room = self.get(id)?;
        let joined = room.join(identity).map_err(|e| match e {
            JoinError::Closed => BackendError::Closed(id.clone()),
            JoinError::Full => BackendError::Full(id.clone()),
        })?;
        let status = room
            .status(joined.ticket)
            .ok_or(BackendError::NoSuchTicket)?;
        Ok(JoinOutcome {
            ticket: TicketRef {
                epoch: room.epoch(),
                id: u64::from(joined.ticket),
            },
            is_new: joined.is_new,
            status,
        })
    }

    async fn status(
        &self,
        id: &RoomId,
        t: TicketRef,
        touch: bool,
    ) -> Result<TicketStatus, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        if touch {
            room.touch(ticket);
        }
        room.status(ticket).ok_or(BackendError::NoSuchTicket)
    }

    async fn leave(&self, id: &RoomId, t: TicketRef) -> Result<Departure, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        Ok(room.leave(ticket))
    }

    async fn release(&self, id: &RoomId, t: TicketRef) -> Result<Departure, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        Ok(room.release(ticket))
    }

    async fn revoke(&self, id: &RoomId, t: TicketRef) -> Result<Departure, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        Ok(room.revoke(ticket))
    }

    async fn tick(&self, id: &RoomId) -> Result<TickReport, BackendError> {
        Ok(self.get(id)?.tick())
    }

    async fn watch_room(&self, id: &RoomId) -> Result<watch::Receiver<RoomView>, BackendError> {
        Ok(self.get(id)?.subscribe_view())
    }

    async fn watch_ticket(&self, id: &RoomId, t: TicketRef) -> Result<TicketSignal, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        let notify = room.ticket_notify(ticket);
        Ok(TicketSignal::new(notify, move |n| {
            room.forget_ticket_notify(ticket, n);
        }))
    }

    async fn list_rooms(&self) -> Result<Vec<RoomSnapshot>, BackendError> {
        let rooms: Vec<Arc<Room>> = self.read().values().map(|s| s.room.clone()).collect();
        let mut out: Vec<RoomSnapshot> = rooms.iter().map(|r| Self::snapshot(r)).collect();
        out.sort_by(|a, b| a.settings.id.cmp(&b.settings.id));
        Ok(out)
    }

    async fn room(&self, id: &RoomId) -> Result<RoomSnapshot, BackendError> {
        let room = self.get(id)?;
        Ok(Self::snapshot(&room))
    }

    async fn put_room(&self, settings: RoomSettings) -> Result<RoomSnapshot, BackendError> {
        let room = Room::new(settings, self.clock.clone());
        self.install(room.clone());
        Ok(Self::snapshot(&room))
    }

    async fn patch_room(
        &self,
        id: &RoomId,
        patch: RoomPatch,
    ) -> Result<RoomSnapshot, BackendError> {
        let room = self.get(id)?;
        if room.is_closed() {
            return Err(BackendError::Closed(id.clone()));
        }
        if let Some(settings) = &patch.settings {
            room.update_settings(settings);
        }
        if let Some(capacity) = patch.capacity {
            room.set_capacity(capacity);
        }
        if let Some(paused) = patch.paused {
            room.set_paused(paused);
        }
        if patch.open_now {
            room.open_now();
        }
        Ok(Self::snapshot(&room))
    }

    async fn close_room(&self, id: &RoomId) -> Result<(), BackendError> {
        let room = self.get(id)?;
        room.close();
        if let Some(slot) = self.read().get(id) {
            slot.stop.cancel();
        }
        Ok(())
    }

    async fn shutdown(&self) {
        self.shutdown.cancel();
        self.workers.close();
        self.workers.wait().await;
    }
}
