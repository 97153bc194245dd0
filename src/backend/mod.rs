//! Where room state lives: one trait, two implementations.
//!
//! The HTTP layer sees only [`Backend`]. `embedded` runs the in-process
//! engine (`crate::engine`) with one worker task per room; `redis` (issue 6)
//! keeps every room in Redis so several instances share one line. Both keep
//! the invariants of the design brief; the conformance suite runs the same
//! tests against each.
//!
//! Tickets cross this boundary as a [`TicketRef`]: the ticket id plus the
//! room's epoch (its incarnation), both taken from a verified token, so a
//! ticket of a deleted-and-recreated room is simply unknown.

pub mod embedded;
pub mod journal;
pub mod redis;
mod spent;

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Notify, watch};

use crate::engine::{
    Departure, DrawRecord, Identity, PermitLedger, RoomId, RoomSettings, RoomStats, RoomView,
    TickReport, TicketStatus,
};

/// A ticket of one incarnation of a room.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TicketRef {
    pub epoch: u64,
    pub id: u64,
}

/// A join's answer: the ticket and what its holder should see now.
#[derive(Clone, Debug, PartialEq)]
pub struct JoinOutcome {
    pub ticket: TicketRef,
    pub is_new: bool,
    pub status: TicketStatus,
}

/// Everything an operator sees of a room.
#[derive(Clone, Debug, PartialEq)]
pub struct RoomSnapshot {
    pub settings: RoomSettings,
    pub epoch: u64,
    pub view: RoomView,
    pub stats: RoomStats,
    pub ledger: PermitLedger,
}

/// Changes an operator can make to a running room. `None` leaves a field
/// as it is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoomPatch {
    pub capacity: Option<u32>,
    pub paused: Option<bool>,
    pub open_now: bool,
    /// Timeouts, tick, admission cap and join limit, already validated.
    pub settings: Option<RoomSettings>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("no room named {0}")]
    NoSuchRoom(RoomId),
    #[error("the room {0} is closed")]
    Closed(RoomId),
    #[error("the room {0} is full")]
    Full(RoomId),
    #[error("unknown ticket")]
    NoSuchTicket,
    /// The state store cannot be reached (Redis down); the message is safe
    /// to show and holds no secrets.
    #[error("the waiting room's state store is unavailable: {0}")]
    Unavailable(String),
}

/// Fires whenever a ticket's state may have changed (admitted, expired,
/// left). Streams wait on it so an admission reaches its visitor at once.
/// Dropping it tells the backend nobody listens any more.
pub struct TicketSignal {
    notify: Arc<Notify>,
    on_drop: Option<Box<dyn FnOnce(Arc<Notify>) + Send + Sync>>,
}

impl TicketSignal {
    pub fn new(
        notify: Arc<Notify>,
        on_drop: impl FnOnce(Arc<Notify>) + Send + Sync + 'static,
    ) -> Self {
        Self {
            notify,
            on_drop: Some(Box::new(on_drop)),
        }
    }

    pub fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for TicketSignal {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f(self.notify.clone());
        }
    }
}

impl std::fmt::Debug for TicketSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketSignal")
    }
}

/// The room operations the HTTP layer needs, for every backend.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// "embedded" or "redis", for logs and `/readyz`.
    fn kind(&self) -> &'static str;

    /// Whether the backend can serve requests now.
    async fn ready(&self) -> Result<(), BackendError>;

    /// The current epoch of a room, to check a token against.
    async fn epoch(&self, room: &RoomId) -> Result<u64, BackendError>;

    /// Take a ticket (idempotent per identity).
    async fn join(
        &self,
        room: &RoomId,
        identity: Option<Identity>,
    ) -> Result<JoinOutcome, BackendError>;

    /// A ticket's status. With `touch`, counts as activity (a poll, a live
    /// stream, a gate check; on an admitted ticket, its arrival).
    async fn status(
        &self,
        room: &RoomId,
        ticket: TicketRef,
        touch: bool,
    ) -> Result<TicketStatus, BackendError>;

    /// The visitor leaves the queue or gives its permit back (handed off).
    async fn leave(&self, room: &RoomId, ticket: TicketRef) -> Result<Departure, BackendError>;

    /// The origin releases an admitted ticket's permit.
    async fn release(&self, room: &RoomId, ticket: TicketRef) -> Result<Departure, BackendError>;

    /// An operator revokes a ticket's place or permit.
    async fn revoke(&self, room: &RoomId, ticket: TicketRef) -> Result<Departure, BackendError>;

    /// Spend a proof-of-work nonce: remember it until `until_ms` (Unix
    /// ms), atomically with the check, on every instance. False when it
    /// was spent already.
    async fn spend_nonce(
        &self,
        room: &RoomId,
        nonce: [u8; 16],
        until_ms: u64,
    ) -> Result<bool, BackendError>;

    /// The opening draw as published: `None` for a room without one.
    async fn draw(&self, room: &RoomId) -> Result<Option<DrawRecord>, BackendError>;

    /// Run one worker turn of a room now. Workers call it every tick; tests
    /// call it on virtual time with workers off.
    async fn tick(&self, room: &RoomId) -> Result<TickReport, BackendError>;

    /// Follow a room's view (position broadcasts).
    async fn watch_room(&self, room: &RoomId) -> Result<watch::Receiver<RoomView>, BackendError>;

    /// Be told when a ticket's state may have changed.
    async fn watch_ticket(
        &self,
        room: &RoomId,
        ticket: TicketRef,
    ) -> Result<TicketSignal, BackendError>;

    // ----- operators ------------------------------------------------------

    async fn list_rooms(&self) -> Result<Vec<RoomSnapshot>, BackendError>;

    async fn room(&self, room: &RoomId) -> Result<RoomSnapshot, BackendError>;

    /// Create a room, or replace one (a new epoch: old tickets are void).
    async fn put_room(&self, settings: RoomSettings) -> Result<RoomSnapshot, BackendError>;

    async fn patch_room(
        &self,
        room: &RoomId,
        patch: RoomPatch,
    ) -> Result<RoomSnapshot, BackendError>;

    /// Close a room: joins refused, streams told `closed`.
    async fn close_room(&self, room: &RoomId) -> Result<(), BackendError>;

    /// Stop workers and flush state; called once on graceful shutdown.
    async fn shutdown(&self);
}
