//! Where room state lives: one trait, two implementations.
//!
//! The HTTP layer sees only [`Backend`]. `embedded` runs the in-process
//! engine (`crate::engine`) with one worker task per room; `redis` keeps
//! every room in Redis so several instances share one line. A backend is
//! storage and the atomic steps the admission rules need; the rules
//! themselves (status, estimates, the caps, what a view change is worth)
//! are `crate::engine::rules`, which both call. The conformance suite runs
//! the same tests against each.
//!
//! A request crosses this boundary once: a join is one [`Backend::join`]
//! with everything it needs (the ticket the visitor carries, an
//! idempotency identity, the client address for the join limit).
//!
//! Tickets cross this boundary as a [`TicketRef`]: the ticket id plus the
//! room's epoch (its incarnation), both taken from a verified token, so a
//! ticket of a replaced room, or of a line whose state was lost, is told
//! so ([`BackendError::LineReset`]) rather than taken for another.

pub mod bus;
pub(crate) mod callouts;
mod calls;
pub mod embedded;
pub mod feed;
pub(crate) mod join_log;
pub(crate) mod journal;
mod kept_reports;
pub mod owned;
pub mod owner;
pub mod redis;
pub mod room_log;
mod spent;
pub mod store;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

pub use crate::engine::RoomPatch;
use crate::engine::rules::StockTaken;
use crate::engine::{
    Binding, Callback, Clock, Departure, DrawRecord, Identity, PermitLedger, RoomId, RoomSettings,
    RoomStats, RoomView, TickReport, TicketStatus,
};
use feed::{Follow, RoomFeed, TicketRead};

/// The report of a line an operator replaced, kept for a while after it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeptReport {
    /// The line's epoch.
    pub(crate) epoch: u64,
    /// When the line was replaced, and when its report goes (Unix ms).
    pub(crate) ended_at: u64,
    pub(crate) expires_at: u64,
    pub(crate) report: crate::report::Report,
}

/// A ticket of one incarnation of a room.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TicketRef {
    pub epoch: u64,
    pub id: u64,
}

/// One instance's report of the event streams it holds open for a room:
/// the tickets whose first stream here opened or whose last one closed
/// since its last report, or (`full`) every ticket it holds. Sent within
/// a moment of a change and once a period otherwise, as the instance's
/// sign that it is still there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamsReport {
    pub holder: u64,
    pub full: bool,
    pub opened: Vec<TicketRef>,
    pub closed: Vec<TicketRef>,
}

/// What the room's engine answered a [`StreamsReport`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamsHeard {
    /// The room's `away_grace`: the instance reports again well inside it.
    pub away_grace: Duration,
    /// Which engine heard it: another one than the last report's (the
    /// room changed owner, or restarted) has not heard the instance's
    /// earlier reports, so it is sent the whole list.
    pub generation: u64,
}

/// Everything a join needs, in one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The ticket the visitor already carries (verified): kept while live.
    pub held: Option<TicketRef>,
    /// When the carried ticket has ended: issue a new one (what the API
    /// does), or answer with the ended ticket (the queue page shows why the
    /// wait ended and offers to join again).
    pub replace_ended: bool,
    /// An idempotency identity (an `Idempotency-Key`, hashed): one ticket
    /// per identity.
    pub identity: Option<Identity>,
    /// How long the identity answers its ticket: for good (an enqueue
    /// token's account), or while the ticket lives (an `Idempotency-Key`).
    pub binding: Binding,
    /// The address the per-address join limit counts, already reduced to
    /// what is counted (an IPv6 address to its /64); `None` is not limited.
    pub client: Option<IpAddr>,
    /// The room's access rules found something missing or wrong (no proof
    /// of work, no enqueue token): a join that would make a new ticket is
    /// refused with [`BackendError::AccessDenied`], while a carried live
    /// ticket is still answered.
    pub refuse_new: bool,
    /// A verified proof-of-work solution: a new ticket spends its nonce,
    /// atomically with being issued, so one solution makes one ticket on
    /// every instance ([`BackendError::NonceSpent`] for a second).
    pub nonce: Option<NonceSpend>,
    /// The priority lane a new ticket queues in (`RoomSettings::lane_of`);
    /// 0 in a room without lanes. A lane the room no longer has (its
    /// settings were replaced meanwhile) queues in the default lane.
    pub lane: u8,
}

/// A proof-of-work nonce to remember until its challenge expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NonceSpend {
    pub(crate) nonce: [u8; 16],
    /// Unix ms.
    pub(crate) until_ms: u64,
}

impl JoinRequest {
    /// A fresh join with no identity, no carried ticket and no limit.
    pub fn anonymous() -> Self {
        Self::default()
    }

    pub fn with_identity(identity: Identity) -> Self {
        Self {
            identity: Some(identity),
            ..Self::default()
        }
    }

    /// A fresh join queueing in `lane`.
    pub fn in_lane(lane: u8) -> Self {
        Self {
            lane,
            ..Self::default()
        }
    }
}

/// A join's answer: the ticket and what its holder should see now.
#[derive(Clone, Debug, PartialEq)]
pub struct JoinOutcome {
    pub ticket: TicketRef,
    /// False when the visitor already held this ticket.
    pub is_new: bool,
    pub status: TicketStatus,
}

/// How a ticket is given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ending {
    /// The visitor leaves the line, or gives its permit back.
    Leave,
    /// The origin releases an admitted ticket's permit.
    Release,
    /// An operator takes the ticket's place or permit away.
    Revoke,
}

/// Everything an operator sees of a room.
#[derive(Clone, Debug, PartialEq)]
pub struct RoomSnapshot {
    pub settings: RoomSettings,
    pub epoch: u64,
    pub view: RoomView,
    pub stats: RoomStats,
    pub ledger: PermitLedger,
    /// Waiting tickets whose visitor asked to be called back.
    pub subscriptions: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum BackendError {
    #[error("no room named {0}")]
    NoSuchRoom(RoomId),
    #[error("the room {0} is closed")]
    Closed(RoomId),
    /// The room is in mode `sold_out`: no new tickets.
    #[error("the room {0} is sold out")]
    SoldOut(RoomId),
    #[error("the room {0} is full")]
    Full(RoomId),
    #[error("unknown ticket")]
    NoSuchTicket,
    /// The ticket names an incarnation of the room that is gone: the line
    /// it stood in was reset (its state lost, or the room replaced), so
    /// its holder has to join again.
    #[error("the line this ticket stood in was reset")]
    LineReset,
    /// The join lacks what the room asks of a new ticket (see
    /// [`JoinRequest::refuse_new`]).
    #[error("this room asks more of a new ticket")]
    AccessDenied,
    /// The join's proof-of-work solution was used before.
    #[error("this proof of work has been used already")]
    NonceSpent,
    /// The client address made `limit` new tickets in the last minute.
    #[error("too many new tickets from this address: at most {limit} a minute")]
    JoinLimited { limit: u32, retry_after: Duration },
    /// The change was made, but the replicas did not confirm it in time
    /// (`redis_wait_replicas`): it is not acknowledged, since a failover
    /// could lose it. The caller may try again after `retry_after`.
    #[error("the change was not confirmed by enough replicas in time")]
    NotReplicated { retry_after: Duration },
    /// The state store cannot be reached (Redis down); the message is safe
    /// to show and holds no secrets.
    #[error("the waiting room's state store is unavailable: {0}")]
    Unavailable(String),
    /// A call back was asked for a ticket that no longer waits.
    #[error("this ticket is not waiting any more")]
    NotWaiting(crate::engine::TicketState),
}

/// A room's line found lost in the store and started again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineReset {
    pub room: RoomId,
    /// The new line's incarnation.
    pub epoch: u64,
}

/// Fires whenever a ticket's state may have changed (admitted, expired,
/// left). Streams wait on it so an admission reaches its visitor at once.
/// Dropping it tells the backend nobody listens any more.
pub struct TicketSignal {
    notify: Arc<Notify>,
    on_drop: Option<Box<dyn FnOnce(Arc<Notify>) + Send + Sync>>,
}

impl TicketSignal {
    pub(crate) fn new(
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

    /// A wait for the signal's next firing that counts from now: armed
    /// before a read of the ticket, it cannot miss a change that lands
    /// between the read and the wait (the signal keeps no permit for
    /// whoever was not yet waiting).
    pub fn arm(&self) -> Armed {
        let mut armed = Box::pin(self.notify.clone().notified_owned());
        armed.as_mut().enable();
        armed
    }
}

/// A [`TicketSignal`]'s next firing, already registered.
pub(crate) type Armed = std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>;

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

    /// The clock the rooms run on: the HTTP layer reads "now" from it too.
    fn clock(&self) -> Arc<dyn Clock>;

    /// Whether this instance decides for the room now: where a room's own
    /// background work (autotune) runs, so that it runs once. On Redis,
    /// the room's owner; a backend of one instance decides every room.
    fn decides(&self, _room: &RoomId) -> bool {
        true
    }

    /// Whether the backend can serve requests now.
    async fn ready(&self) -> Result<(), BackendError>;

    /// The current epoch of a room, to check a token against.
    async fn epoch(&self, room: &RoomId) -> Result<u64, BackendError>;

    /// Take a ticket, or keep the one the visitor holds: idempotent per
    /// carried ticket and per identity; a join that makes a new ticket
    /// counts against the client address's join limit.
    async fn join(&self, room: &RoomId, request: JoinRequest) -> Result<JoinOutcome, BackendError>;

    /// A ticket's status. With `touch`, counts as activity (a poll, a live
    /// stream, a gate check; on an admitted ticket, its arrival).
    async fn status(
        &self,
        room: &RoomId,
        ticket: TicketRef,
        touch: bool,
    ) -> Result<TicketStatus, BackendError>;

    /// Hear an instance's report of the streams it holds (see
    /// [`StreamsReport`]): an open stream keeps its visitor present; an
    /// instance not heard from for a whole `away_grace` lets go of all its
    /// tickets. Tickets of another incarnation, or unknown, are passed
    /// over.
    async fn hold_streams(
        &self,
        room: &RoomId,
        report: &StreamsReport,
    ) -> Result<StreamsHeard, BackendError>;

    /// Give a ticket up: leave (handing a permit on), release, revoke.
    async fn depart(
        &self,
        room: &RoomId,
        ticket: TicketRef,
        how: Ending,
    ) -> Result<Departure, BackendError>;

    /// Keep a way to call the ticket's visitor back (replacing an earlier
    /// one): the room calls when their turn nears and comes. Only for a
    /// ticket still waiting ([`BackendError::NotWaiting`]).
    async fn subscribe(
        &self,
        room: &RoomId,
        ticket: TicketRef,
        callback: Callback,
    ) -> Result<(), BackendError>;

    /// Forget the ticket's way to call back; whether it had one.
    async fn unsubscribe(&self, room: &RoomId, ticket: TicketRef) -> Result<bool, BackendError>;

    /// The calls the rooms this instance decides find due, to the first
    /// who asks (the push sender). `None` once taken.
    fn callbacks(&self) -> Option<tokio::sync::mpsc::Receiver<callouts::CallbackDue>> {
        None
    }

    /// `room`'s calls this instance dropped, its hand-off to the sender
    /// being full.
    fn callbacks_dropped(&self, _room: &RoomId) -> u64 {
        0
    }

    /// The opening draw as published: `None` for a room without one.
    async fn draw(&self, room: &RoomId) -> Result<Option<DrawRecord>, BackendError>;

    /// The room's admission record as this instance holds it: up to
    /// `limit` entries after the first `after`, with its head.
    async fn record(
        &self,
        room: &RoomId,
        after: u64,
        limit: usize,
    ) -> Result<crate::engine::Page, BackendError>;

    /// A copy of the room's whole admission record, for the sale's report.
    async fn admission_record(
        &self,
        room: &RoomId,
    ) -> Result<crate::engine::AdmissionRecord, BackendError>;

    /// Keep the report of the room's line, which an operator is replacing,
    /// until `kept.expires_at`; every instance finds it there.
    async fn keep_report(&self, room: &RoomId, kept: KeptReport) -> Result<(), BackendError>;

    /// The room's kept reports that have not expired, newest line first.
    async fn kept_reports(&self, room: &RoomId) -> Result<Vec<KeptReport>, BackendError>;

    /// Run one worker turn of a room now. Workers call it every tick; tests
    /// call it on virtual time with workers off.
    async fn tick(&self, room: &RoomId) -> Result<TickReport, BackendError>;

    /// The room's feed on this instance: its view, its position index, and
    /// the change counter its streams follow.
    async fn feed(&self, room: &RoomId) -> Result<Arc<dyn RoomFeed>, BackendError>;

    /// Be told when a ticket's state may have changed.
    async fn watch_ticket(
        &self,
        room: &RoomId,
        ticket: TicketRef,
    ) -> Result<TicketSignal, BackendError>;

    /// A ticket's facts as stored (no sign of life is counted), for a
    /// stream to count its place from.
    async fn read_ticket(
        &self,
        room: &RoomId,
        ticket: TicketRef,
    ) -> Result<TicketRead, BackendError>;

    /// Everything a stream follows: the feed, the ticket's signal (armed
    /// first, so nothing between it and the read is missed), the ticket.
    async fn follow(&self, room: &RoomId, ticket: TicketRef) -> Result<Follow, BackendError> {
        let feed = self.feed(room).await?;
        let signal = self.watch_ticket(room, ticket).await?;
        let armed = signal.arm();
        let ticket = self.read_ticket(room, ticket).await?;
        Ok(Follow {
            feed,
            signal,
            armed,
            ticket,
        })
    }

    // ----- operators ------------------------------------------------------

    async fn list_rooms(&self) -> Result<Vec<RoomSnapshot>, BackendError>;

    async fn room(&self, room: &RoomId) -> Result<RoomSnapshot, BackendError>;

    /// Create a room, or replace one (a new epoch: old tickets are void).
    async fn put_room(&self, settings: RoomSettings) -> Result<RoomSnapshot, BackendError>;

    /// Change a running room: the fields given, in one atomic step.
    async fn patch_room(
        &self,
        room: &RoomId,
        patch: RoomPatch,
    ) -> Result<RoomSnapshot, BackendError>;

    /// The origin sold `purchased` units: taken off the room's stock in one
    /// atomic step, never below zero; the step that takes the last unit
    /// turns the room sold out. `None` when the room does not count stock.
    async fn purchase(
        &self,
        room: &RoomId,
        purchased: u64,
    ) -> Result<Option<StockTaken>, BackendError>;

    /// Close a room: joins refused, streams told `closed`.
    async fn close_room(&self, room: &RoomId) -> Result<(), BackendError>;

    /// Stop workers and flush state; called once on graceful shutdown.
    async fn shutdown(&self);

    /// Rooms whose line this instance found lost in the store and started
    /// again (one message per reset, on the one instance that did it), for
    /// the operators' webhook and metric. `None` for a backend that cannot
    /// lose a line.
    fn line_resets(&self) -> Option<tokio::sync::broadcast::Receiver<LineReset>> {
        None
    }

    // ----- shorthands -----------------------------------------------------

    /// The visitor leaves the queue or gives its permit back (handed off).
    async fn leave(&self, room: &RoomId, ticket: TicketRef) -> Result<Departure, BackendError> {
        self.depart(room, ticket, Ending::Leave).await
    }

    /// The origin releases an admitted ticket's permit.
    async fn release(&self, room: &RoomId, ticket: TicketRef) -> Result<Departure, BackendError> {
        self.depart(room, ticket, Ending::Release).await
    }

    /// An operator revokes a ticket's place or permit.
    async fn revoke(&self, room: &RoomId, ticket: TicketRef) -> Result<Departure, BackendError> {
        self.depart(room, ticket, Ending::Revoke).await
    }
}
