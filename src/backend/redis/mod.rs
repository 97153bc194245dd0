//! The Redis backend: all room state in Redis (or Redis Cluster), shared by
//! every instance, so several Narabu instances behind a load balancer keep
//! one line per room.
//!
//! Redis does what must be atomic across instances, one Lua script per
//! operation run by EVALSHA in one round trip (`scripts.rs`, `*.lua`):
//! issuing a number (with the join limit's log), popping the head (of the
//! lane the lane rule gives the permit to, in a room with priority lanes)
//! and moving a ticket's state, hand-off, revocation, the tick's admissions,
//! operators' changes. Each script answers with named fields
//! (`reply.rs`). Everything decided from what they answer is the engine's
//! rules (`crate::engine::rules`): a ticket's status and estimate, the
//! smoothed admission rate (computed by the worker after each tick), when
//! a view is worth publishing, the join limit's answer. Keys carry the
//! room's hash tag (`keys.rs`). One instance at a time runs a room's
//! worker, elected with an expiring, owner-checked lease (`lease.rs`,
//! `worker.rs`). Every script that changes what streams show appends to
//! the room's change log in the same step (`log.rs`); each instance follows
//! it with one task per room (`follower.rs`) into its own replica of the
//! room's view and each lane's position index (`replica.rs`), which its streams count
//! their places from, and wakes the streams of the tickets it names
//! (`pubsub.rs`'s hub). The status reads that remain (polls, a stream's
//! ticket after its signal) go to Redis in batches (`batch.rs`).
//!
//! When Redis is away every call answers `BackendError::Unavailable` (503
//! with Retry-After; the gate follows `on_backend_error`), and the
//! connection manager reconnects by itself when it returns.

mod ack;
mod batch;
mod conn;
mod follower;
mod keys;
mod lease;
mod log;
mod primary;
mod pubsub;
mod replica;
mod reply;
mod rooms;
mod scripts;
pub mod store;
mod worker;

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use redis::{AsyncCommands, RedisResult};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::feed::{RoomFeed, TicketRead};
use super::{
    Backend, BackendError, Ending, JoinOutcome, JoinRequest, RoomPatch, RoomSnapshot, TicketRef,
    TicketSignal,
};
use crate::config::{RedisTarget, RedisWait};
use crate::engine::rules::{self, RoomFacts, StockTaken};
use crate::engine::{
    Binding, Clock, Departure, DrawRecord, Handoff, RoomId, RoomSettings, TickReport, TicketId,
    TicketState, TicketStatus,
};
use conn::{Conn, unavailable};
pub use keys::RoomKeys;
use pubsub::Hub;
use reply::{Facts, Timeouts, decode};
use scripts::Scripts;

/// How to reach Redis and how this instance takes part.
#[derive(Clone)]
pub struct RedisOptions {
    /// One server, a Cluster, or the primary Sentinel names.
    pub target: RedisTarget,
    /// The worker lease: a dead worker's room is taken over within this.
    pub lease: Duration,
    /// Off in tests that drive `tick` themselves on virtual time.
    pub run_workers: bool,
    /// Whether changes wait for replicas before they are acknowledged.
    pub wait: RedisWait,
}

impl RedisOptions {
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);

    /// `target` may be a URL, for one server.
    pub fn new(target: impl Into<RedisTarget>) -> Self {
        Self {
            target: target.into(),
            lease: Self::DEFAULT_LEASE,
            run_workers: true,
            wait: RedisWait::OFF,
        }
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("target", &self.target)
            .field("lease", &self.lease)
            .field("run_workers", &self.run_workers)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

pub struct RedisBackend {
    weak: Weak<Self>,
    conn: Conn,
    /// Replicas' confirmations, when changes wait for them.
    acks: Arc<ack::Acks>,
    scripts: Scripts,
    clock: Arc<dyn Clock>,
    options: RedisOptions,
    hub: Arc<Hub>,
    /// The configured rooms, created again if a Redis without persistence
    /// comes back empty.
    configured: Vec<RoomSettings>,
    workers: DashMap<RoomId, ()>,
    /// Rooms whose change log this instance follows.
    followers: DashMap<RoomId, ()>,
    /// This instance's name among the log's followers.
    instance: String,
    /// Each room's timeouts as last seen, to compute the cutoffs the tick
    /// and hand-offs compare stored times with. A script told cutoffs made
    /// with other timeouts than the room's answers with the room's, and is
    /// asked again.
    timeouts: DashMap<RoomId, Timeouts>,
    /// Lines this instance found lost and started again (`recover`).
    resets: tokio::sync::broadcast::Sender<super::LineReset>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

/// How many times a call is made again after a script said the caller's
/// timeouts were stale (each time with the room's).
const STALE_RETRIES: usize = 3;

impl RedisBackend {
    /// Connect, create the configured rooms that Redis does not have yet
    /// (rooms already there, made by another instance or changed by an
    /// operator, are kept), subscribe, and start the worker loops.
    pub async fn connect(
        options: RedisOptions,
        rooms: Vec<RoomSettings>,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Arc<Self>> {
        let (conn, subscriptions) = Conn::connect(&options.target).await?;
        if options.wait.is_on() {
            ack::check_replicas(&conn, options.wait).await;
        }
        let backend = Arc::new_cyclic(|weak| Self {
            weak: weak.clone(),
            conn,
            acks: ack::Acks::new(options.wait),
            scripts: Scripts::new(),
            clock,
            options,
            hub: Arc::new(Hub::default()),
            configured: rooms.clone(),
            workers: DashMap::new(),
            followers: DashMap::new(),
            instance: format!("{:016x}", rand::random::<u64>()),
            timeouts: DashMap::new(),
            resets: tokio::sync::broadcast::channel(64).0,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
        });
        for settings in rooms {
            let id = settings.id.clone();
            backend
                .create(settings, false)
                .await
                .map_err(|e| anyhow::anyhow!("creating room {id}: {e}"))?;
        }
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        backend.tasks.spawn(pubsub::run_subscriber(
            subscriptions,
            backend.hub.clone(),
            events_tx,
            backend.shutdown.clone(),
        ));
        backend
            .tasks
            .spawn(Self::supervise(Arc::downgrade(&backend), events_rx));
        Ok(backend)
    }

    fn con(&self) -> Conn {
        self.conn.clone()
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Run a room script with the room's meta key, prefix and `now`; its
    /// answer is JSON.
    async fn run(
        &self,
        script: &redis::Script,
        room: &RoomId,
        now: u64,
        args: &[&str],
    ) -> Result<String, BackendError> {
        let keys = RoomKeys::new(room);
        let mut inv = script.key(&keys.meta);
        inv.arg(&keys.prefix).arg(now);
        for a in args {
            inv.arg(*a);
        }
        inv.invoke_async(&mut self.con())
            .await
            .map_err(|e| unavailable(&e))
    }

    /// How long a call waits for a room's follower to read its first
    /// snapshot.
    const FIRST_SNAPSHOT: Duration = Duration::from_secs(2);

    /// This instance's replica of a room, once its follower has read it.
    async fn replica(&self, room: &RoomId) -> Result<Arc<replica::Replica>, BackendError> {
        if let Some(replica) = self.hub.replica(room) {
            return Ok(replica);
        }
        if self.shutdown.is_cancelled() {
            return Err(BackendError::Unavailable("shutting down".into()));
        }
        self.ensure_follower(room);
        self.hub
            .wait_replica(room, Self::FIRST_SNAPSHOT)
            .await
            .ok_or_else(|| BackendError::Unavailable("cannot read the room's line".into()))
    }

    /// What a status needs of the room: this instance's replica of its
    /// view, with the line's length the script counted.
    async fn room_facts(&self, room: &RoomId, waiting: u64) -> Result<RoomFacts, BackendError> {
        if let Some(facts) = self.hub.facts(room, waiting) {
            return Ok(facts);
        }
        let mut facts = match self.replica(room).await {
            Ok(replica) => replica.room_facts(),
            // No follower here (this instance is stopping): the view as
            // stored.
            Err(e) => self.stored_view(room).await.ok_or(e)?.facts(waiting),
        };
        facts.waiting = waiting;
        Ok(facts)
    }

    /// A room's last published view, read from Redis.
    async fn stored_view(&self, room: &RoomId) -> Option<crate::engine::RoomView> {
        let keys = RoomKeys::new(room);
        let (view, version): (Option<String>, Option<u64>) = redis::cmd("HMGET")
            .arg(&keys.meta)
            .arg("view")
            .arg("view_version")
            .query_async(&mut self.con())
            .await
            .ok()?;
        let mut view: crate::engine::RoomView = serde_json::from_str(&view?).ok()?;
        view.version = version.unwrap_or(0);
        Some(view)
    }

    fn status_of(facts: &Facts, room: &RoomFacts, now: u64) -> TicketStatus {
        rules::ticket_status(&facts.ticket(), facts.ahead(), room, now)
    }

    /// The quiet cutoff for a hand-off and the `queue_idle` it was made
    /// with, the away cutoff and the `away_grace` it was made with ('?'
    /// before this room's timeouts are known: the script then answers with
    /// them).
    fn quiet_args(&self, room: &RoomId, now: u64) -> [String; 4] {
        match self.timeouts.get(room) {
            Some(t) => {
                let [away_before, away_grace] = t.away_args(now);
                [
                    rules::quiet_cutoff(now, t.queue_idle_ms).to_string(),
                    t.queue_idle_ms.to_string(),
                    away_before,
                    away_grace,
                ]
            }
            None => ["0".into(), "?".into(), "0".into(), "?".into()],
        }
    }

    /// Send the queued status reads of one room, a batch per script call,
    /// until none are left.
    async fn flush_statuses(&self, key: batch::Key) {
        while let Some(reads) = self.hub.batches.take(&key) {
            let now = self.now();
            let mut args = Vec::with_capacity(1 + 2 * reads.len());
            args.push(if key.1 { "1" } else { "0" }.to_owned());
            for r in &reads {
                args.push(r.epoch.to_string());
                args.push(r.id.to_string());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let written = self.acks.before(&self.conn);
            let answer = match self.run(&self.scripts.status, &key.0, now, &args).await {
                Ok(raw) => decode::<reply::Status>(&raw),
                Err(e) => Err(e),
            };
            // What a read shows (an admission above all) is shown once the
            // replicas have it.
            let answer = match answer {
                Ok(status) => self
                    .acks
                    .confirm(&self.conn, written)
                    .await
                    .map(|()| status),
                Err(e) => Err(e),
            };
            match answer {
                Ok(reply::Status::Ok { w, t }) => {
                    for (read, one) in reads.into_iter().zip(t) {
                        let _ = read.reply.send(match one {
                            reply::OneStatus::Known(facts) => Ok((facts, w)),
                            reply::OneStatus::Unknown(_) => Err(BackendError::NoSuchTicket),
                        });
                    }
                }
                Ok(reply::Status::NoRoom) => {
                    for read in reads {
                        let _ = read
                            .reply
                            .send(Err(BackendError::NoSuchRoom(key.0.clone())));
                    }
                }
                Err(e) => {
                    for read in reads {
                        let _ = read.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// Run `f`; if the room is gone from Redis and is one of the
    /// configured rooms, create it again (`recover`, a reset line) and run
    /// `f` once more.
    async fn or_recovered<T, F, Fut>(&self, room: &RoomId, f: F) -> Result<T, BackendError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, BackendError>>,
    {
        match f().await {
            Err(BackendError::NoSuchRoom(_)) if self.recover(room).await => f().await,
            other => other,
        }
    }

    async fn join_once(
        &self,
        room: &RoomId,
        request: JoinRequest,
    ) -> Result<JoinOutcome, BackendError> {
        let now = self.now();
        let identity = request
            .identity
            .map(|i| format!("{:032x}", i.0))
            .unwrap_or_default();
        let (held_epoch, held_id) = request
            .held
            .map(|t| (t.epoch.to_string(), t.id.to_string()))
            .unwrap_or_default();
        let client = request.client.map(|c| c.to_string()).unwrap_or_default();
        let since = rules::join_window_start(now).to_string();
        let replace = if request.replace_ended { "1" } else { "0" };
        let refuse = if request.refuse_new { "1" } else { "0" };
        let (nonce, nonce_ttl) = request
            .nonce
            .map(|n| {
                let ttl = n.until_ms.saturating_sub(now).max(1);
                (hex::encode(n.nonce), ttl.to_string())
            })
            .unwrap_or_default();
        let lane = request.lane.to_string();
        let while_live = if request.binding == Binding::WhileLive {
            "1"
        } else {
            "0"
        };
        let written = self.acks.before(&self.conn);
        let raw = self
            .run(
                &self.scripts.join,
                room,
                now,
                &[
                    &identity,
                    &held_epoch,
                    &held_id,
                    replace,
                    &client,
                    &since,
                    refuse,
                    &nonce,
                    &nonce_ttl,
                    &lane,
                    while_live,
                ],
            )
            .await?;
        match decode::<reply::Join>(&raw)? {
            reply::Join::Ok {
                id,
                new,
                epoch,
                t,
                w,
            } => {
                let epoch = epoch
                    .parse()
                    .map_err(|_| BackendError::Unavailable("bad epoch in Redis".into()))?;
                self.acks.confirm(&self.conn, written).await?;
                let facts = self.room_facts(room, w).await?;
                Ok(JoinOutcome {
                    ticket: TicketRef { epoch, id },
                    is_new: new,
                    status: Self::status_of(&t, &facts, now),
                })
            }
            reply::Join::Limited { n, oldest, limit } => {
                match rules::join_allowance(limit, n, Some(oldest), now) {
                    Err(retry_after) => Err(BackendError::JoinLimited { limit, retry_after }),
                    // The log said full as of the script; a moment later
                    // it may not be: the visitor may try again at once.
                    Ok(()) => Err(BackendError::JoinLimited {
                        limit,
                        retry_after: Duration::from_millis(1),
                    }),
                }
            }
            reply::Join::Denied => Err(BackendError::AccessDenied),
            reply::Join::Spent => Err(BackendError::NonceSpent),
            reply::Join::Closed => Err(BackendError::Closed(room.clone())),
            reply::Join::SoldOut => Err(BackendError::SoldOut(room.clone())),
            reply::Join::Full => Err(BackendError::Full(room.clone())),
            reply::Join::NoRoom => Err(BackendError::NoSuchRoom(room.clone())),
            reply::Join::Reset => Err(BackendError::LineReset),
        }
    }

    /// One ticket's facts through the batched status reads.
    async fn read_facts(
        &self,
        room: &RoomId,
        t: TicketRef,
        touch: bool,
    ) -> Result<(reply::Facts, u64), BackendError> {
        match self
            .or_recovered(room, || self.read_facts_once(room, t, touch))
            .await
        {
            Err(BackendError::NoSuchTicket) => Err(self.why_unknown(room, t).await),
            other => other,
        }
    }

    /// Why a script did not know a ticket: it names another incarnation
    /// of the room (its line was reset), or a number never issued. Asked
    /// only then, so a known ticket costs no extra round trip.
    async fn why_unknown(&self, room: &RoomId, t: TicketRef) -> BackendError {
        match self.epoch(room).await {
            Ok(epoch) if epoch != t.epoch => BackendError::LineReset,
            Ok(_) => BackendError::NoSuchTicket,
            Err(e) => e,
        }
    }

    async fn read_facts_once(
        &self,
        room: &RoomId,
        t: TicketRef,
        touch: bool,
    ) -> Result<(reply::Facts, u64), BackendError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        // Before queuing: a read queued with nobody left to flush it would
        // leave its key marked as flushing, and every later read waiting.
        let Some(me) = self.weak.upgrade() else {
            return Err(BackendError::Unavailable("shutting down".into()));
        };
        let key = (room.clone(), touch);
        let urgent = self.hub.take_urgent(room, t.epoch, t.id);
        let read = batch::Pending {
            epoch: t.epoch,
            id: t.id,
            reply,
        };
        if self.hub.batches.push(&key, read, urgent) {
            // A task, not this caller, so that a caller going away (its
            // stream closed) never strands the reads queued behind it.
            self.tasks
                .spawn(async move { me.flush_statuses(key).await });
        }
        answer
            .await
            .unwrap_or_else(|_| Err(BackendError::Unavailable("status read dropped".into())))
    }
}

/// Tickets renewed per presence call (see `renew`).
const RENEW_CHUNK: usize = 500;

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    async fn ready(&self) -> Result<(), BackendError> {
        let pong: RedisResult<String> = redis::cmd("PING").query_async(&mut self.con()).await;
        pong.map(|_| ()).map_err(|e| unavailable(&e))
    }

    async fn draw(&self, room: &RoomId) -> Result<Option<DrawRecord>, BackendError> {
        let m = self.meta(room).await?;
        let field = |k: &str| m.get(k).filter(|v| !v.is_empty()).cloned();
        let Some(commitment) = field("commitment") else {
            return Ok(None);
        };
        if m.get("open").map(String::as_str) != Some("1") {
            return Ok(Some(DrawRecord {
                commitment,
                seed: None,
                order: None,
            }));
        }
        let epoch = m.get("epoch").cloned().unwrap_or_default();
        let list: Option<String> = self
            .con()
            .get(RoomKeys::new(room).draw(&epoch))
            .await
            .map_err(|e| unavailable(&e))?;
        let order = list
            .unwrap_or_default()
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse()
                    .map_err(|_| BackendError::Unavailable("bad draw record in Redis".into()))
            })
            .collect::<Result<Vec<TicketId>, _>>()?;
        Ok(Some(DrawRecord {
            commitment,
            seed: field("seed"),
            order: Some(order),
        }))
    }

    async fn epoch(&self, room: &RoomId) -> Result<u64, BackendError> {
        let keys = RoomKeys::new(room);
        let epoch: Option<String> = self
            .con()
            .hget(&keys.meta, "epoch")
            .await
            .map_err(|e| unavailable(&e))?;
        epoch
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| BackendError::NoSuchRoom(room.clone()))
    }

    async fn join(&self, room: &RoomId, request: JoinRequest) -> Result<JoinOutcome, BackendError> {
        self.or_recovered(room, || self.join_once(room, request.clone()))
            .await
    }

    async fn status(
        &self,
        room: &RoomId,
        t: TicketRef,
        touch: bool,
    ) -> Result<TicketStatus, BackendError> {
        let (facts, waiting) = self.read_facts(room, t, touch).await?;
        let room_facts = self.room_facts(room, waiting).await?;
        Ok(Self::status_of(&facts, &room_facts, self.now()))
    }

    async fn renew(&self, room: &RoomId, tickets: &[TicketRef]) -> Result<Duration, BackendError> {
        // One call per incarnation named (almost always one).
        let mut epochs: Vec<u64> = tickets.iter().map(|t| t.epoch).collect();
        epochs.sort_unstable();
        epochs.dedup();
        if epochs.is_empty() {
            epochs.push(0);
        }
        let mut grace = RoomSettings::DEFAULT_AWAY_GRACE;
        for epoch in epochs {
            let ids: Vec<String> = tickets
                .iter()
                .filter(|t| t.epoch == epoch)
                .map(|t| t.id.to_string())
                .collect();
            // Redis runs one script at a time: a renewal of an instance's
            // whole crowd in one call held it for hundreds of milliseconds
            // at 12,500 streams, and every leave and hand-off waited behind
            // it. Calls of a few hundred tickets let them in between; each
            // ticket's renewal stands on its own, so nothing needs them in
            // one step.
            let chunks: Vec<&[String]> = if ids.is_empty() {
                vec![&[]]
            } else {
                ids.chunks(RENEW_CHUNK).collect()
            };
            for chunk in chunks {
                let epoch = epoch.to_string();
                let mut args = vec![epoch.as_str()];
                args.extend(chunk.iter().map(String::as_str));
                let raw = self
                    .run(&self.scripts.presence, room, self.now(), &args)
                    .await?;
                match decode::<reply::Presence>(&raw)? {
                    reply::Presence::Ok { away_grace_ms, .. } => {
                        if away_grace_ms > 0 {
                            grace = Duration::from_millis(away_grace_ms);
                        }
                    }
                    reply::Presence::NoRoom => {
                        return Err(BackendError::NoSuchRoom(room.clone()));
                    }
                }
            }
        }
        Ok(grace)
    }

    async fn depart(
        &self,
        room: &RoomId,
        t: TicketRef,
        how: Ending,
    ) -> Result<Departure, BackendError> {
        let (epoch, id) = (t.epoch.to_string(), t.id.to_string());
        let mode = match how {
            Ending::Leave => "leave",
            Ending::Release => "release",
            Ending::Revoke => "revoke",
        };
        for _ in 0..STALE_RETRIES {
            let now = self.now();
            let [quiet_before, queue_idle, away_before, away_grace] = self.quiet_args(room, now);
            let written = self.acks.before(&self.conn);
            let raw = self
                .run(
                    &self.scripts.depart,
                    room,
                    now,
                    &[
                        &epoch,
                        &id,
                        mode,
                        &quiet_before,
                        &queue_idle,
                        &away_before,
                        &away_grace,
                    ],
                )
                .await?;
            let code = |s: u64| u32::try_from(s).unwrap_or(u32::MAX);
            let answer = decode::<reply::Depart>(&raw)?;
            if matches!(answer, reply::Depart::Left | reply::Depart::Gave { .. }) {
                // A departure, and the hand-off it made, count once the
                // replicas have them.
                self.acks.confirm(&self.conn, written).await?;
            }
            return Ok(match answer {
                reply::Depart::Left => Departure::LeftQueue,
                reply::Depart::Gave { to: Some(next), .. } => {
                    Departure::GaveBack(Handoff::To(code(next)))
                }
                reply::Depart::Gave { retired: true, .. } => Departure::GaveBack(Handoff::Retired),
                reply::Depart::Gave { .. } => Departure::GaveBack(Handoff::Tray),
                reply::Depart::Nothing { s } => {
                    Departure::Nothing(TicketState::from_code(s).unwrap_or(TicketState::Abandoned))
                }
                reply::Depart::NoTicket => return Err(self.why_unknown(room, t).await),
                reply::Depart::NoRoom => {
                    // A configured room whose line was lost: started
                    // again, and this ticket is of the old line.
                    return Err(if self.recover(room).await {
                        self.why_unknown(room, t).await
                    } else {
                        BackendError::NoSuchRoom(room.clone())
                    });
                }
                reply::Depart::Stale(timeouts) => {
                    self.timeouts.insert(room.clone(), timeouts);
                    continue;
                }
            });
        }
        Err(BackendError::Unavailable(
            "the room's timeouts kept changing".into(),
        ))
    }

    async fn tick(&self, room: &RoomId) -> Result<TickReport, BackendError> {
        Ok(self
            .tick_as(room, "")
            .await?
            .map(|(report, _)| report)
            .unwrap_or_default())
    }

    async fn feed(&self, room: &RoomId) -> Result<Arc<dyn RoomFeed>, BackendError> {
        if let Some(replica) = self.hub.replica(room) {
            return Ok(replica);
        }
        // Not followed here yet: an unknown room is told at once.
        self.epoch(room).await?;
        Ok(self.replica(room).await?)
    }

    async fn read_ticket(&self, room: &RoomId, t: TicketRef) -> Result<TicketRead, BackendError> {
        let (facts, _) = self.read_facts(room, t, false).await?;
        Ok(TicketRead {
            facts: facts.ticket(),
            ahead: facts.ahead(),
        })
    }

    async fn watch_ticket(
        &self,
        room: &RoomId,
        t: TicketRef,
    ) -> Result<TicketSignal, BackendError> {
        if self.epoch(room).await? != t.epoch {
            return Err(BackendError::LineReset);
        }
        let notify = self.hub.ticket_notify(room, t.epoch, t.id);
        let hub = self.hub.clone();
        let key = (room.clone(), t.epoch, t.id);
        Ok(TicketSignal::new(notify, move |n| {
            hub.forget_ticket_notify(key, n)
        }))
    }

    async fn list_rooms(&self) -> Result<Vec<RoomSnapshot>, BackendError> {
        let ids: Vec<String> = self
            .con()
            .smembers(keys::ROOMS)
            .await
            .map_err(|e| unavailable(&e))?;
        let mut out = Vec::new();
        for id in ids {
            let Ok(id) = RoomId::new(&id) else { continue };
            match self.room(&id).await {
                Ok(s) => out.push(s),
                Err(BackendError::NoSuchRoom(_)) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.settings.id.cmp(&b.settings.id));
        Ok(out)
    }

    async fn room(&self, room: &RoomId) -> Result<RoomSnapshot, BackendError> {
        let m = self.meta(room).await?;
        Ok(Self::snapshot_of(room, m))
    }

    async fn put_room(&self, settings: RoomSettings) -> Result<RoomSnapshot, BackendError> {
        let id = settings.id.clone();
        self.create(settings, true).await?;
        self.room(&id).await
    }

    async fn patch_room(
        &self,
        room: &RoomId,
        patch: RoomPatch,
    ) -> Result<RoomSnapshot, BackendError> {
        self.patch(room, &patch).await?;
        if patch.open_now {
            self.open(room, true).await?;
        }
        self.room(room).await
    }

    async fn purchase(
        &self,
        room: &RoomId,
        purchased: u64,
    ) -> Result<Option<StockTaken>, BackendError> {
        RedisBackend::purchase(self, room, purchased).await
    }

    async fn close_room(&self, room: &RoomId) -> Result<(), BackendError> {
        self.close(room).await
    }

    fn line_resets(&self) -> Option<tokio::sync::broadcast::Receiver<super::LineReset>> {
        Some(self.resets.subscribe())
    }

    async fn shutdown(&self) {
        self.shutdown.cancel();
        self.hub.retire_all();
        self.tasks.close();
        self.tasks.wait().await;
    }
}
