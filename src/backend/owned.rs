//! Rooms shared by several instances through a [`RoomStore`]: each room's
//! owner runs the engine, the store holds the room's log and carries the
//! other instances' changes to the owner.
//!
//! Every instance contends for each room it serves ([`Contender`]); the one
//! holding the lease runs the engine and answers the room's commands. A
//! change — a join, a departure, an operator's patch, a tick — is a
//! [`Cmd`]: the owner applies it to its engine with the same calls the
//! embedded backend makes ([`calls`]), notes it applied with its answer in
//! the log, and answers once that is durable; another instance sends it
//! over the bus ([`Asker`]) and answers its client with the owner's
//! answer. A command keeps its id across retries, so a change of owner
//! while it travels applies it once (the new owner finds the id in its
//! replica) or not yet (it is sent again), never twice.
//!
//! Reads never leave the instance. Each instance follows each room's log
//! ([`Follower`]) and keeps a copy of the room by applying each record to
//! the engine's own types ([`Replayer`]; restored from the image at first,
//! or after falling behind a trimmed log), with the owner's figures for
//! what no record carries (where the permits are, the counters: its tally
//! closes every batch). Statuses, the gate, the streams and operators read
//! that copy, with the engine's code. After a change, the instance waits
//! until its copy holds the change's place in the log before answering, so
//! a visitor's next read shows at least what they were told; a sign of
//! life that changes nothing a visitor sees travels to the owner with the
//! others a moment later.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::bus::{self, AskError, Asker};
use super::calls;
use super::feed::{LineMoves, Placement, RoomFeed, TicketRead};
use super::join_log::JoinLog;
use super::owner::{Contender, Owned, OwnerOptions};
use super::room_log::{Follower, LogRecord, Moved, NotDurable, Replica};
use super::spent::SpentNonces;
use super::store::{Command, LogPos, RoomStore};
use super::{
    Backend, BackendError, Ending, JoinOutcome, JoinRequest, KeptReport, RoomPatch, RoomSnapshot,
    StreamsHeard, StreamsReport, TicketRef, TicketSignal,
};
use crate::engine::rules::StockTaken;
use crate::engine::{
    Callback, Clock, Departure, DrawRecord, Replayer, Room, RoomId, RoomSettings, TickReport,
    TicketId, TicketState, TicketStatus,
};
use crate::locks::{read, write};

/// How an instance serves shared rooms.
#[derive(Clone, Debug)]
pub struct OwnedOptions {
    pub owner: OwnerOptions,
    /// How long a change may take, owner changes included, before its
    /// client is told to try again.
    pub answer_within: Duration,
}

impl Default for OwnedOptions {
    fn default() -> Self {
        Self {
            owner: OwnerOptions::default(),
            answer_within: Duration::from_secs(5),
        }
    }
}

/// A change to a room, as sent to its owner.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Cmd {
    Join(JoinRequest),
    Depart(TicketRef, Ending),
    HoldStreams(StreamsReport),
    Subscribe(TicketRef, Callback),
    Unsubscribe(TicketRef),
    /// Signs of life (status polls, gate checks) gathered over a moment,
    /// each with when it was seen.
    Touch(Vec<(TicketRef, u64)>),
    Tick,
    Patch(RoomPatch),
    Purchase(u64),
    Close,
    /// Replace the room with a new incarnation.
    Put(RoomSettings),
}

/// What the owner answered a [`Cmd`].
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Answer {
    Joined { ticket: TicketRef, is_new: bool },
    Departed(Departure),
    Held(StreamsHeard),
    Done,
    Ticked(TickReport),
    Purchased(Option<StockTaken>),
    Unsubscribed(bool),
}

/// The owner's reply on the bus.
#[derive(Debug, Serialize, Deserialize)]
enum Wire {
    /// Applied: the answer (a `Result<Answer, BackendError>`, as logged)
    /// and where in the log it is durable.
    Done { at: LogPos, answer: Vec<u8> },
    /// Not applied by this owner (it lost the lease): ask again.
    Retry,
    /// Applied, but the log's replicas do not confirm it: not
    /// acknowledged.
    NotReplicated,
    /// Applied, but the owner cannot reach the log: not acknowledged.
    Unreachable,
}

/// This instance's copy of the room, as of a place in the room's log.
#[derive(Clone)]
struct View {
    at: LogPos,
    room: Arc<Room>,
}

/// One room on this instance.
struct Slot {
    owned: watch::Receiver<Option<Arc<Owned>>>,
    /// Follows the room's log into the replica the view is built from.
    follower: std::sync::OnceLock<Arc<Follower>>,
    view: watch::Sender<Option<View>>,
    /// Counts the views published, for the room's streams.
    changes: watch::Sender<u64>,
    /// The epoch of the first copy this instance served (0: none yet): a
    /// line this instance makes for another epoch replaces a lost one.
    first_epoch: std::sync::atomic::AtomicU64,
    /// The room's copy, kept by applying the log's records, and what
    /// stops the tasks that serve its streams.
    replay: std::sync::Mutex<Option<(Replayer, CancellationToken)>>,
    stop: CancellationToken,
}

pub struct OwnedBackend {
    weak: std::sync::Weak<Self>,
    store: Arc<dyn RoomStore>,
    instance: String,
    clock: Arc<dyn Clock>,
    options: OwnedOptions,
    asker: Arc<Asker>,
    /// Whether an asker learns a command's answer from the room's log (its
    /// copy reads the owner's record of it) rather than from a reply: so
    /// unless the store acknowledges an append only once its replicas
    /// confirm it, which a follower cannot see.
    answers_from_log: bool,
    rooms: RwLock<HashMap<RoomId, Arc<Slot>>>,
    /// The join limit's log and the spent proof-of-work nonces of the
    /// rooms this instance owns (an owner change starts them afresh).
    joins: JoinLog,
    spent: SpentNonces,
    /// Where the rooms this instance owns hand their calls back.
    callouts: Arc<super::callouts::CallbackTap>,
    /// Lines this instance made again after the store lost them.
    resets: tokio::sync::broadcast::Sender<super::LineReset>,
    /// Signs of life on their way to the owners, by room.
    touches: std::sync::Mutex<HashMap<RoomId, Vec<(TicketRef, u64)>>>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for OwnedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedBackend")
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl OwnedBackend {
    /// Serve `rooms` through `store`: contend for each, follow each. Must be
    /// called inside a Tokio runtime.
    pub fn start(
        store: Arc<dyn RoomStore>,
        rooms: Vec<RoomSettings>,
        clock: Arc<dyn Clock>,
        options: OwnedOptions,
    ) -> Arc<Self> {
        let shutdown = CancellationToken::new();
        let instance = format!("{:016x}", rand::random::<u64>());
        let backend = Arc::new_cyclic(|weak| Self {
            weak: weak.clone(),
            asker: Asker::start(store.clone(), instance.clone(), shutdown.clone()),
            answers_from_log: !store.appends_wait_for_replicas(),
            store,
            instance,
            clock,
            options,
            rooms: RwLock::new(HashMap::new()),
            joins: JoinLog::default(),
            spent: SpentNonces::default(),
            callouts: super::callouts::CallbackTap::new(),
            touches: std::sync::Mutex::new(HashMap::new()),
            resets: tokio::sync::broadcast::channel(64).0,
            shutdown,
            tasks: TaskTracker::new(),
        });
        for settings in rooms {
            backend.serve_room(settings.id.clone(), Some(settings));
        }
        backend.tasks.spawn(share_rooms(Arc::downgrade(&backend)));
        backend
    }

    /// Contend for the room, follow its log and keep its view. `settings`
    /// make the room if nobody has yet; a room found in the store's list
    /// has none.
    fn serve_room(self: &Arc<Self>, id: RoomId, settings: Option<RoomSettings>) -> Arc<Slot> {
        let stop = self.shutdown.child_token();
        let followed: Arc<std::sync::OnceLock<std::sync::Weak<Follower>>> = Arc::default();
        let recorded = followed.clone();
        let contention = Contender {
            store: self.store.clone(),
            room: id.clone(),
            instance: self.instance.clone(),
            settings,
            clock: self.clock.clone(),
            options: self.options.owner.clone(),
            recorded: Some(Arc::new(move || {
                recorded
                    .get()?
                    .upgrade()?
                    .read(|r| r.map(|r| (r.last, r.at, r.record.clone())))
            })),
            callouts: Some(self.callouts.clone()),
        }
        .spawn(stop.clone());
        let slot = Arc::new(Slot {
            owned: contention.owned,
            follower: std::sync::OnceLock::new(),
            view: watch::channel(None).0,
            changes: watch::channel(0).0,
            first_epoch: std::sync::atomic::AtomicU64::new(0),
            replay: std::sync::Mutex::new(None),
            stop: stop.clone(),
        });
        let (viewed, clock) = (Arc::downgrade(&slot), self.clock.clone());
        let asker = self.answers_from_log.then(|| self.asker.clone());
        let backend = self.weak.clone();
        let owner = Arc::downgrade(&slot);
        let follower = Follower::observed(
            self.store.clone(),
            id.clone(),
            stop.clone(),
            move || owner.upgrade()?.owned.borrow().as_ref()?.writer.feed(),
            move |r, moved| {
                if let (Moved::Applied(records), Some(b)) = (moved, backend.upgrade()) {
                    b.note_spent(records);
                }
                if let Some(slot) = viewed.upgrade() {
                    view_moved(&slot, r, moved, &clock, asker.as_deref());
                }
            },
        );
        let _ = followed.set(Arc::downgrade(&follower));
        let _ = slot.follower.set(follower);
        self.tasks
            .spawn(answer_commands(self.clone(), id.clone(), slot.clone()));
        write(&self.rooms).insert(id, slot.clone());
        slot
    }

    /// Remember the proof-of-work nonces the log says were spent, so this
    /// instance refuses them again should it own the room.
    fn note_spent(&self, records: &[LogRecord]) {
        let now = self.clock.now_ms();
        for record in records {
            if let LogRecord::Spent { nonce, until_ms } = record {
                self.spent.spend(*nonce, *until_ms, now);
            }
        }
    }

    /// Whether this instance owns the room now.
    pub fn owns(&self, id: &RoomId) -> bool {
        self.slot(id)
            .is_ok_and(|slot| slot.owned.borrow().is_some())
    }

    fn slot(&self, id: &RoomId) -> Result<Arc<Slot>, BackendError> {
        read(&self.rooms)
            .get(id)
            .cloned()
            .ok_or_else(|| BackendError::NoSuchRoom(id.clone()))
    }

    /// The room's view once it holds the log up to `at`.
    async fn view_at(&self, slot: &Slot, at: LogPos) -> Result<View, BackendError> {
        // A copy this instance cannot keep up to date may be missing what
        // the owner did since (a ticket revoked, a pass released): no
        // answer is given from it, and the gate follows its setting.
        in_touch(slot).await?;
        let mut rx = slot.view.subscribe();
        let seen = tokio::time::timeout(
            self.options.answer_within,
            rx.wait_for(|v| v.as_ref().is_some_and(|v| v.at >= at)),
        )
        .await;
        match seen {
            Ok(Ok(v)) => Ok(v.clone().expect("waited for a view")),
            _ => Err(BackendError::Unavailable(
                "this instance's copy of the room is behind its log".into(),
            )),
        }
    }

    /// The room's view as it is now.
    async fn view(&self, id: &RoomId) -> Result<View, BackendError> {
        self.view_at(&*self.slot(id)?, LogPos::START).await
    }

    /// Make a change: on this instance when it owns the room, else on the
    /// owner; then wait until this instance's view holds it.
    async fn command(&self, id: &RoomId, cmd: Cmd) -> Result<(Answer, View), BackendError> {
        self.send_touches(id).await?;
        self.send(id, cmd).await
    }

    async fn send(&self, id: &RoomId, cmd: Cmd) -> Result<(Answer, View), BackendError> {
        let slot = self.slot(id)?;
        let body = postcard::to_allocvec(&cmd).expect("commands serialize");
        let cmd_id = Asker::new_id();
        let deadline = Instant::now() + self.options.answer_within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BackendError::Unavailable(
                    "the room's owner did not answer in time".into(),
                ));
            }
            // An instance that cannot read the room's log cannot reach
            // Redis: its client is told so within a moment, not after the
            // whole wait (the command may still land; its id keeps it once).
            in_touch(&slot).await?;
            let owned = slot.owned.borrow().clone();
            let wire = match owned {
                Some(o) => {
                    let (answer, n) = self.apply(&o, cmd_id, &body);
                    durable(&o, n, answer, left.min(ASK_WAIT)).await
                }
                None => match self
                    .asker
                    .ask(id, cmd_id, body.clone(), left.min(ASK_WAIT))
                    .await
                {
                    Ok(bytes) => postcard::from_bytes(&bytes).unwrap_or(Wire::Retry),
                    Err(AskError::TimedOut) => Wire::Retry,
                    // Redis cannot be reached (a failover, an outage): the
                    // client is told at once, not after the whole wait.
                    Err(AskError::Store(e)) => {
                        tracing::debug!(room = %id, error = %e, "command not sent");
                        Wire::Unreachable
                    }
                },
            };
            let (at, answer) = match wire {
                Wire::Done { at, answer } => (at, answer),
                Wire::NotReplicated => {
                    return Err(BackendError::NotReplicated {
                        retry_after: Duration::from_secs(1),
                    });
                }
                Wire::Unreachable => return Err(unreachable()),
                Wire::Retry => continue,
            };
            let answer: Result<Answer, BackendError> =
                postcard::from_bytes(&answer).map_err(|_| {
                    BackendError::Unavailable("the owner's answer cannot be read".into())
                })?;
            let view = self.view_at(&slot, at).await?;
            return Ok((answer?, view));
        }
    }

    /// Apply one command on the owner, once: a command applied before
    /// (asked again after a timeout, or by a previous owner) gets its
    /// first answer. The answer as logged, and the record to wait for.
    fn apply(&self, o: &Owned, id: u128, body: &[u8]) -> (Vec<u8>, u64) {
        let (answer, n, _) = self.apply_once(o, id, body);
        (answer, n)
    }

    /// [`Self::apply`], and whether the command was applied now (its
    /// answer is then in the records still to be written, where its
    /// asker's copy will read it) rather than before.
    fn apply_once(&self, o: &Owned, id: u128, body: &[u8]) -> (Vec<u8>, u64, bool) {
        if let Some(answer) = o.writer.applied(id) {
            return (answer, o.writer.appended(), false);
        }
        let answer = match postcard::from_bytes::<Cmd>(body) {
            Ok(Cmd::Put(settings)) => {
                o.replace(settings);
                Ok(Answer::Done)
            }
            Ok(Cmd::Join(request)) => {
                let nonce = request.nonce;
                let joined = self.run(&o.room(), Cmd::Join(request));
                // A new ticket spent its nonce: in the log, so whoever owns
                // the room next knows it (each instance notes it as it
                // follows the log).
                if let (Some(spend), Ok(Answer::Joined { is_new: true, .. })) = (nonce, &joined) {
                    o.writer.spent(spend.nonce, spend.until_ms);
                }
                joined
            }
            Ok(cmd) => self.run(&o.room(), cmd),
            Err(_) => Err(BackendError::Unavailable(
                "a command from another instance cannot be read".into(),
            )),
        };
        let answer = postcard::to_allocvec(&answer).expect("answers serialize");
        let n = o.writer.append_applied(id, answer.clone());
        (answer, n, true)
    }

    /// A command's effect on the engine: the same calls the embedded
    /// backend makes.
    fn run(&self, room: &Room, cmd: Cmd) -> Result<Answer, BackendError> {
        match cmd {
            Cmd::Join(request) => {
                let done = calls::join(room, &request, &self.joins, &self.spent, || 0)?;
                Ok(Answer::Joined {
                    ticket: TicketRef {
                        epoch: room.epoch(),
                        id: u64::from(done.ticket),
                    },
                    is_new: done.is_new,
                })
            }
            Cmd::Depart(t, how) => calls::depart(room, t, how).map(|(d, _)| Answer::Departed(d)),
            Cmd::HoldStreams(report) => Ok(Answer::Held(calls::hold_streams(room, &report))),
            Cmd::Subscribe(t, callback) => {
                calls::subscribe(room, t, callback).map(|_| Answer::Done)
            }
            Cmd::Unsubscribe(t) => {
                calls::unsubscribe(room, t).map(|(had, _)| Answer::Unsubscribed(had))
            }
            Cmd::Touch(tickets) => {
                for (t, at) in tickets {
                    if let Ok(id) = calls::ticket(room, t) {
                        room.touch_at(id, at);
                    }
                }
                Ok(Answer::Done)
            }
            Cmd::Tick => Ok(Answer::Ticked(room.tick())),
            Cmd::Patch(patch) => {
                if room.is_closed() {
                    return Err(BackendError::Closed(room.id().clone()));
                }
                room.patch(&patch);
                Ok(Answer::Done)
            }
            Cmd::Purchase(n) => Ok(Answer::Purchased(room.purchase(n))),
            Cmd::Close => {
                room.close();
                Ok(Answer::Done)
            }
            // Applied on the owner itself (see `apply`).
            Cmd::Put(_) => Err(unexpected()),
        }
    }

    /// Note a sign of life, sent with the others within [`TOUCH_EVERY`],
    /// or before this instance's next change to the room, whichever comes
    /// first (so the owner sees them in the order they happened).
    fn touched(&self, room: &RoomId, ticket: TicketRef) {
        let now = self.clock.now_ms();
        let first = {
            let mut touches = crate::locks::lock(&self.touches);
            let first = touches.is_empty();
            touches.entry(room.clone()).or_default().push((ticket, now));
            first
        };
        if first && let Some(me) = self.weak.upgrade() {
            self.tasks.spawn(async move {
                // Not once this instance is stopping: its rooms' next
                // owners count everyone as seen when they take over.
                tokio::select! {
                    () = me.shutdown.cancelled() => return,
                    () = tokio::time::sleep(TOUCH_EVERY) => {}
                }
                let rooms: Vec<RoomId> = crate::locks::lock(&me.touches).keys().cloned().collect();
                for room in rooms {
                    if let Err(e) = me.send_touches(&room).await {
                        tracing::debug!(room = %room, error = %e, "signs of life not sent");
                    }
                }
            });
        }
    }

    /// Send the signs of life gathered for `room`, if any.
    async fn send_touches(&self, room: &RoomId) -> Result<(), BackendError> {
        let Some(touches) = crate::locks::lock(&self.touches).remove(room) else {
            return Ok(());
        };
        self.send(room, Cmd::Touch(touches)).await.map(|_| ())
    }

    fn ticket_in(view: &View, t: TicketRef) -> Result<TicketId, BackendError> {
        calls::ticket(&view.room, t)
    }

    /// The view that knows ticket `t`. A ticket issued through another
    /// instance may be a moment ahead of this one's copy: an unknown ticket
    /// is looked for again once the copy has reached the end the log has
    /// now, and one whose join is in but waits for an earlier ticket's
    /// (reported a moment later by the owner) until that has come; it is
    /// refused only if it is still unknown then.
    async fn view_with(
        &self,
        room: &RoomId,
        t: TicketRef,
    ) -> Result<(View, TicketId), BackendError> {
        let slot = self.slot(room)?;
        let mut moves = slot.view.subscribe();
        let deadline = tokio::time::Instant::now() + self.options.answer_within;
        let mut looked_at_end = false;
        loop {
            let view = self.view_at(&slot, LogPos::START).await?;
            match Self::ticket_in(&view, t) {
                Err(BackendError::NoSuchTicket) => {}
                found => return found.map(|id| (view, id)),
            }
            let pending = TicketId::try_from(t.id).is_ok_and(|id| {
                crate::locks::lock(&slot.replay)
                    .as_ref()
                    .is_some_and(|(r, _)| r.is_pending(id))
            });
            if pending {
                if tokio::time::timeout_at(deadline, moves.changed())
                    .await
                    .is_err()
                {
                    return Err(BackendError::Unavailable(
                        "this instance's copy of the room is behind its log".into(),
                    ));
                }
                continue;
            }
            if looked_at_end {
                return Err(BackendError::NoSuchTicket);
            }
            looked_at_end = true;
            let end = self.store.last(room).await.map_err(|e| {
                BackendError::Unavailable(format!("the room's log cannot be read: {e}"))
            })?;
            match end {
                Some(end) if end > view.at => {
                    self.view_at(&slot, end).await?;
                }
                _ => return Err(BackendError::NoSuchTicket),
            }
        }
    }
}

/// How long signs of life gather before they travel to the owner: far
/// below any presence or idle timeout.
const TOUCH_EVERY: Duration = Duration::from_millis(250);
/// How long a read waits for this instance to read a room's log again
/// before it says Redis cannot be reached.
const BACK_IN_TOUCH: Duration = Duration::from_millis(500);
/// How long one ask waits before it is sent again (same id).
const ASK_WAIT: Duration = Duration::from_secs(1);

/// Wait until record `n` is in the log: the reply to send.
async fn durable(o: &Owned, n: u64, answer: Vec<u8>, within: Duration) -> Wire {
    Wire::after(o.writer.wait_durable(n, within).await, answer)
}

impl Wire {
    /// The reply to a command whose records were waited for.
    fn after(durable: Result<LogPos, NotDurable>, answer: Vec<u8>) -> Self {
        match durable {
            Ok(at) => Self::Done { at, answer },
            Err(NotDurable::NotReplicated) => Self::NotReplicated,
            Err(NotDurable::Unreachable) => Self::Unreachable,
            Err(NotDurable::Fenced | NotDurable::TimedOut) => Self::Retry,
        }
    }
}

/// The replica moved: apply the batch's records to the room's copy (or
/// start the copy again from the image), hand `asker`'s commands the
/// answers the batch records, and publish the view as of the replica's
/// place in the log.
fn view_moved(
    slot: &Arc<Slot>,
    replica: &Replica,
    moved: Moved<'_>,
    clock: &Arc<dyn Clock>,
    asker: Option<&Asker>,
) {
    if let (Moved::Applied(records), Some(asker)) = (moved, asker) {
        for record in records {
            if let LogRecord::Applied { id, reply } = record
                && asker.is_waiting(*id)
            {
                let done = Wire::Done {
                    at: replica.at,
                    answer: reply.clone(),
                };
                asker.deliver(
                    *id,
                    postcard::to_allocvec(&done).expect("replies serialize"),
                );
            }
        }
    }
    let mut replay = crate::locks::lock(&slot.replay);
    let records = match (moved, replay.is_some()) {
        (Moved::Applied(records), true) => records,
        _ => {
            renew_copy(&mut replay, slot, replica, clock);
            &[][..]
        }
    };
    for record in records {
        let Some((replayer, _)) = replay.as_mut() else {
            break;
        };
        match record {
            LogRecord::Event(event) => replayer.apply(event),
            LogRecord::Tally(tally) => replayer.room().adopt(tally),
            // A new incarnation, or a new owner that went on from the room
            // as the log left it (a join its predecessor had not written
            // whole is lost): the replica holds the room as it starts, and
            // the copy starts again from it, as the new owner's engine did.
            LogRecord::Created(_) | LogRecord::Owner { .. } => {
                renew_copy(&mut replay, slot, replica, clock);
                break;
            }
            LogRecord::Applied { .. } | LogRecord::Spent { .. } => {}
        }
    }
    let Some(room) = replay.as_ref().map(|(r, _)| r.room().clone()) else {
        return;
    };
    drop(replay);
    let _ = slot.first_epoch.compare_exchange(
        0,
        room.epoch(),
        std::sync::atomic::Ordering::AcqRel,
        std::sync::atomic::Ordering::Acquire,
    );
    slot.view.send_replace(Some(View {
        at: replica.at,
        room,
    }));
}

/// Start the room's copy again from the replica's image. Its changes reach
/// the room's streams through the slot, whichever copy is current; the
/// previous copy's tasks stop.
fn renew_copy(
    replay: &mut Option<(Replayer, CancellationToken)>,
    slot: &Arc<Slot>,
    replica: &Replica,
    clock: &Arc<dyn Clock>,
) {
    let room = Room::restore(replica.image.clone(), clock.clone(), None);
    if let Some(tally) = &replica.tally {
        room.adopt(tally);
    }
    if let Some((before, stop)) = replay.take() {
        stop.cancel();
        room.take_watchers(before.room());
    }
    let stop = slot.stop.child_token();
    // Marks become waves, as on an engine that decides.
    let (waves, until) = (room.clone(), stop.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = until.cancelled() => {}
            () = waves.changes().coalesce() => {}
        }
    });
    let (slot_changes, until) = (slot.changes.clone(), stop.clone());
    let mut seen = room.changes().subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = until.cancelled() => return,
                r = seen.changed() => {
                    if r.is_err() {
                        return;
                    }
                    slot_changes.send_modify(|n| *n += 1);
                }
            }
        }
    });
    slot.changes.send_modify(|n| *n += 1);
    *replay = Some((Replayer::new(room), stop));
}

/// How often an instance looks for rooms other instances made.
const SHARE_EVERY: Duration = Duration::from_secs(1);

/// Every instance serves every room: note the rooms this instance serves
/// (once they exist) in the store's list, and serve those others noted.
async fn share_rooms(backend: std::sync::Weak<OwnedBackend>) {
    let mut noted: std::collections::HashSet<RoomId> = std::collections::HashSet::new();
    loop {
        let Some(b) = backend.upgrade() else { return };
        let stop = b.shutdown.clone();
        match b.store.rooms().await {
            Ok(listed) => {
                // What the store lists now (it may have lost its data).
                noted.clear();
                for id in listed {
                    if b.slot(&id).is_err() {
                        tracing::info!(room = %id, "serving a room another instance made");
                        b.serve_room(id.clone(), None);
                    }
                    noted.insert(id);
                }
                let served: Vec<(RoomId, Arc<Slot>)> = read(&b.rooms)
                    .iter()
                    .map(|(id, slot)| (id.clone(), slot.clone()))
                    .collect();
                for (id, slot) in served {
                    if !noted.contains(&id)
                        && slot.view.borrow().is_some()
                        && b.store.add_room(&id).await.is_ok()
                    {
                        noted.insert(id);
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "the list of rooms could not be read"),
        }
        drop(b);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SHARE_EVERY) => {}
        }
    }
}

/// While this instance owns the room, answer the commands sent to it.
async fn answer_commands(backend: Arc<OwnedBackend>, id: RoomId, slot: Arc<Slot>) {
    let mut owned = slot.owned.clone();
    let stop = slot.stop.clone();
    let viewed = Arc::downgrade(&slot);
    drop(slot);
    loop {
        let current = owned.borrow_and_update().clone();
        if let Some(o) = &current
            && o.made
            && let Some(slot) = viewed.upgrade()
        {
            // This instance made the line of a room it had served before:
            // the store lost the room's state. Told once, by this instance.
            let epoch = o.room().epoch();
            let before = slot.first_epoch.load(std::sync::atomic::Ordering::Acquire);
            if before != 0 && before != epoch {
                tracing::warn!(room = %id, "the room's state was lost in Redis: it starts again as a new line");
                let _ = backend.resets.send(super::LineReset {
                    room: id.clone(),
                    epoch,
                });
            }
        }
        let serving = current.map(|o| {
            let until = stop.child_token();
            let b = backend.clone();
            let task = tokio::spawn(bus::serve(
                backend.store.clone(),
                id.clone(),
                until.clone(),
                move |commands: Vec<Command>| {
                    let (b, o) = (b.clone(), o.clone());
                    async move {
                        let applied: Vec<(Vec<u8>, u64, bool)> = commands
                            .iter()
                            .map(|c| b.apply_once(&o, c.id, &c.body))
                            .collect();
                        let last = applied.iter().map(|(_, n, _)| *n).max().unwrap_or(0);
                        let at = o.writer.wait_durable(last, b.options.answer_within).await;
                        let in_log = at.is_ok() && b.answers_from_log;
                        applied
                            .into_iter()
                            // A command applied now has its answer in the
                            // log, which its asker follows: no reply.
                            .map(|(answer, _, fresh)| {
                                (!(fresh && in_log)).then(|| {
                                    postcard::to_allocvec(&Wire::after(at.clone(), answer))
                                        .expect("replies serialize")
                                })
                            })
                            .collect()
                    }
                },
            ));
            (until, task)
        });
        tokio::select! {
            () = stop.cancelled() => return,
            r = owned.changed() => if r.is_err() { return },
        }
        if let Some((until, task)) = serving {
            until.cancel();
            let _ = task.await;
        }
    }
}

/// A room's feed on this instance: its view and the count of views, for
/// one incarnation of the room (a replaced room's streams are told it
/// closed).
struct ViewFeed {
    slot: Arc<Slot>,
    epoch: u64,
}

impl ViewFeed {
    fn room(&self) -> Option<Arc<Room>> {
        self.slot
            .view
            .borrow()
            .as_ref()
            .map(|v| v.room.clone())
            .filter(|r| r.epoch() == self.epoch)
    }
}

impl RoomFeed for ViewFeed {
    fn changes(&self) -> watch::Receiver<u64> {
        self.slot.changes.subscribe()
    }

    fn room_facts(&self) -> crate::engine::rules::RoomFacts {
        self.room().map_or_else(
            || crate::engine::rules::RoomFacts {
                closed: true,
                ..Default::default()
            },
            |r| r.facts(),
        )
    }

    fn ahead(&self, lane: u8, qi: u64) -> Option<u64> {
        self.room()?.lane(lane)?.ahead(u32::try_from(qi).ok()?)
    }

    fn placement(&self, ticket: u64) -> Option<Placement> {
        let (qi, initial_ahead) = self.room()?.placement(TicketId::try_from(ticket).ok()?)?;
        Some(Placement {
            qi: u64::from(qi),
            initial_ahead: u64::from(initial_ahead),
        })
    }
    fn moves(&self, lane: u8) -> LineMoves {
        self.room()
            .map_or_else(LineMoves::default, |r| LineMoves::of(&r, lane))
    }
}

#[async_trait]
impl Backend for OwnedBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    fn decides(&self, room: &RoomId) -> bool {
        self.owns(room)
    }

    /// Ready while every room's log can be read.
    async fn ready(&self) -> Result<(), BackendError> {
        let reading = read(&self.rooms)
            .values()
            .all(|slot| slot.follower.get().is_none_or(|f| f.in_touch()));
        if reading { Ok(()) } else { Err(unreachable()) }
    }

    async fn epoch(&self, room: &RoomId) -> Result<u64, BackendError> {
        Ok(self.view(room).await?.room.epoch())
    }

    async fn join(&self, room: &RoomId, request: JoinRequest) -> Result<JoinOutcome, BackendError> {
        let (answer, _) = self.command(room, Cmd::Join(request)).await?;
        let Answer::Joined { ticket, is_new } = answer else {
            return Err(unexpected());
        };
        let (view, id) = self.view_with(room, ticket).await?;
        let status = view.room.status(id).ok_or(BackendError::NoSuchTicket)?;
        Ok(JoinOutcome {
            ticket,
            is_new,
            status,
        })
    }

    async fn status(
        &self,
        room: &RoomId,
        ticket: TicketRef,
        touch: bool,
    ) -> Result<TicketStatus, BackendError> {
        let (mut view, mut id) = self.view_with(room, ticket).await?;
        if touch {
            // A sign of life that changes what the visitor is shown (an away
            // visitor back in line, an admitted one arriving) is made before
            // answering; the rest only keep a waiting ticket alive, and
            // travel to the owner together a moment later.
            let changes = match view.room.state_of(id) {
                Some(TicketState::Away) => true,
                Some(TicketState::Admitted) => view
                    .room
                    .ticket_facts(id)
                    .is_some_and(|(facts, _)| !facts.arrived),
                _ => false,
            };
            if changes {
                let now = self.clock.now_ms();
                self.command(room, Cmd::Touch(vec![(ticket, now)])).await?;
                (view, id) = self.view_with(room, ticket).await?;
            } else {
                self.touched(room, ticket);
            }
        }
        view.room.status(id).ok_or(BackendError::NoSuchTicket)
    }

    async fn hold_streams(
        &self,
        room: &RoomId,
        report: &StreamsReport,
    ) -> Result<StreamsHeard, BackendError> {
        match self
            .command(room, Cmd::HoldStreams(report.clone()))
            .await?
            .0
        {
            Answer::Held(heard) => Ok(heard),
            _ => Err(unexpected()),
        }
    }

    async fn depart(
        &self,
        room: &RoomId,
        ticket: TicketRef,
        how: Ending,
    ) -> Result<Departure, BackendError> {
        match self.command(room, Cmd::Depart(ticket, how)).await?.0 {
            Answer::Departed(d) => Ok(d),
            _ => Err(unexpected()),
        }
    }

    async fn subscribe(
        &self,
        room: &RoomId,
        ticket: TicketRef,
        callback: Callback,
    ) -> Result<(), BackendError> {
        match self
            .command(room, Cmd::Subscribe(ticket, callback))
            .await?
            .0
        {
            Answer::Done => Ok(()),
            _ => Err(unexpected()),
        }
    }

    async fn unsubscribe(&self, room: &RoomId, ticket: TicketRef) -> Result<bool, BackendError> {
        match self.command(room, Cmd::Unsubscribe(ticket)).await?.0 {
            Answer::Unsubscribed(had) => Ok(had),
            _ => Err(unexpected()),
        }
    }

    fn callbacks(&self) -> Option<tokio::sync::mpsc::Receiver<super::callouts::CallbackDue>> {
        self.callouts.take()
    }

    fn callbacks_dropped(&self, room: &RoomId) -> u64 {
        self.callouts.dropped(room)
    }

    async fn draw(&self, room: &RoomId) -> Result<Option<DrawRecord>, BackendError> {
        Ok(self.view(room).await?.room.draw_record())
    }

    async fn keep_report(&self, room: &RoomId, kept: KeptReport) -> Result<(), BackendError> {
        let bytes = serde_json::to_vec(&kept).map_err(|_| unexpected())?;
        let ttl = Duration::from_millis(kept.expires_at.saturating_sub(self.clock.now_ms()));
        self.store
            .put_report(room, kept.epoch, &bytes, ttl)
            .await
            .map_err(|e| BackendError::Unavailable(e.to_string()))
    }

    async fn kept_reports(&self, room: &RoomId) -> Result<Vec<KeptReport>, BackendError> {
        let now = self.clock.now_ms();
        let mut kept: Vec<KeptReport> = self
            .store
            .reports(room)
            .await
            .map_err(|e| BackendError::Unavailable(e.to_string()))?
            .iter()
            // One this version cannot read is passed over, as is one
            // expired by this instance's clock that Redis still holds.
            .filter_map(|b| serde_json::from_slice::<KeptReport>(b).ok())
            .filter(|k| k.expires_at > now)
            .collect();
        kept.sort_by_key(|k| std::cmp::Reverse(k.epoch));
        Ok(kept)
    }

    async fn record(
        &self,
        room: &RoomId,
        after: u64,
        limit: usize,
    ) -> Result<crate::engine::Page, BackendError> {
        let slot = self.slot(room)?;
        in_touch(&slot).await?;
        slot.follower
            .get()
            .and_then(|f| f.read(|r| r.map(|r| r.record.read(after, limit))))
            .ok_or_else(|| BackendError::Unavailable("the room's log is not read yet".into()))
    }

    async fn admission_record(
        &self,
        room: &RoomId,
    ) -> Result<crate::engine::AdmissionRecord, BackendError> {
        let slot = self.slot(room)?;
        in_touch(&slot).await?;
        slot.follower
            .get()
            .and_then(|f| f.read(|r| r.map(|r| r.record.clone())))
            .ok_or_else(|| BackendError::Unavailable("the room's log is not read yet".into()))
    }

    async fn tick(&self, room: &RoomId) -> Result<TickReport, BackendError> {
        match self.command(room, Cmd::Tick).await?.0 {
            Answer::Ticked(report) => Ok(report),
            _ => Err(unexpected()),
        }
    }

    async fn feed(&self, room: &RoomId) -> Result<Arc<dyn RoomFeed>, BackendError> {
        let slot = self.slot(room)?;
        let epoch = self.view_at(&slot, LogPos::START).await?.room.epoch();
        Ok(Arc::new(ViewFeed { slot, epoch }))
    }

    async fn watch_ticket(
        &self,
        room: &RoomId,
        ticket: TicketRef,
    ) -> Result<TicketSignal, BackendError> {
        let (view, id) = self.view_with(room, ticket).await?;
        let notify = view.room.ticket_notify(id);
        // Forgotten on the copy of the moment: the one it was taken from
        // may have been replaced since, handing its watchers on.
        let slot = std::sync::Arc::downgrade(&self.slot(room)?);
        Ok(TicketSignal::new(notify, move |n| {
            let copy = slot.upgrade().and_then(|s| s.view.borrow().clone());
            if let Some(view) = copy {
                view.room.forget_ticket_notify(id, n);
            }
        }))
    }

    async fn read_ticket(
        &self,
        room: &RoomId,
        ticket: TicketRef,
    ) -> Result<TicketRead, BackendError> {
        let (view, id) = self.view_with(room, ticket).await?;
        let (facts, ahead) = view
            .room
            .ticket_facts(id)
            .ok_or(BackendError::NoSuchTicket)?;
        Ok(TicketRead { facts, ahead })
    }

    async fn list_rooms(&self) -> Result<Vec<RoomSnapshot>, BackendError> {
        let ids: Vec<RoomId> = read(&self.rooms).keys().cloned().collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(calls::snapshot(&self.view(&id).await?.room));
        }
        out.sort_by(|a, b| a.settings.id.cmp(&b.settings.id));
        Ok(out)
    }

    async fn room(&self, room: &RoomId) -> Result<RoomSnapshot, BackendError> {
        Ok(calls::snapshot(&self.view(room).await?.room))
    }

    async fn put_room(&self, settings: RoomSettings) -> Result<RoomSnapshot, BackendError> {
        let id = settings.id.clone();
        if self.slot(&id).is_ok() {
            let (_, view) = self.command(&id, Cmd::Put(settings)).await?;
            return Ok(calls::snapshot(&view.room));
        }
        let me = self
            .weak
            .upgrade()
            .ok_or_else(|| BackendError::Unavailable("this instance is shutting down".into()))?;
        let slot = me.serve_room(id.clone(), Some(settings));
        let view = self.view_at(&slot, LogPos::START).await?;
        Ok(calls::snapshot(&view.room))
    }

    async fn patch_room(
        &self,
        room: &RoomId,
        patch: RoomPatch,
    ) -> Result<RoomSnapshot, BackendError> {
        let (_, view) = self.command(room, Cmd::Patch(patch)).await?;
        Ok(calls::snapshot(&view.room))
    }

    async fn purchase(
        &self,
        room: &RoomId,
        purchased: u64,
    ) -> Result<Option<StockTaken>, BackendError> {
        match self.command(room, Cmd::Purchase(purchased)).await?.0 {
            Answer::Purchased(taken) => Ok(taken),
            _ => Err(unexpected()),
        }
    }

    async fn close_room(&self, room: &RoomId) -> Result<(), BackendError> {
        self.command(room, Cmd::Close).await.map(|_| ())
    }

    fn line_resets(&self) -> Option<tokio::sync::broadcast::Receiver<super::LineReset>> {
        Some(self.resets.subscribe())
    }

    async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Whether this instance reads the room's log: a connection lost for a
/// moment is opened again at once, so this waits that long
/// ([`BACK_IN_TOUCH`]), not for an outage.
async fn in_touch(slot: &Slot) -> Result<(), BackendError> {
    match slot.follower.get() {
        Some(follower) if !follower.back_in_touch(BACK_IN_TOUCH).await => Err(unreachable()),
        _ => Ok(()),
    }
}

fn unreachable() -> BackendError {
    BackendError::Unavailable("Redis cannot be reached".into())
}

fn unexpected() -> BackendError {
    BackendError::Unavailable("the room's owner answered another question".into())
}
