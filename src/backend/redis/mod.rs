//! The Redis backend: all room state in Redis (or Redis Cluster), shared by
//! every instance, so several Narabu instances behind a load balancer keep
//! one line per room.
//!
//! Each operation (join, status with activity, leave/release/revoke with
//! hand-off, the tick, and the operators' changes) is one Lua script run
//! atomically by EVALSHA in one round trip (`scripts.rs`, `*.lua`); the
//! scripts follow the embedded engine step for step, so the invariants of
//! the design brief hold across instances. Keys carry the room's hash tag
//! (`keys.rs`). One instance at a time runs a room's worker, elected with
//! an expiring, owner-checked lease (`lease.rs`). Admissions and room views
//! travel over pub/sub to the streams each instance holds (`pubsub.rs`);
//! the status reads those streams make go to Redis in batches (`batch.rs`).
//!
//! When Redis is away every call answers `BackendError::Unavailable` (503
//! with Retry-After; the gate follows `on_backend_error`), and the
//! connection manager reconnects by itself when it returns.

mod batch;
mod conn;
mod keys;
mod lease;
mod primary;
mod pubsub;
mod scripts;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use redis::{AsyncCommands, RedisResult, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Backend, BackendError, JoinOutcome, RoomPatch, RoomSnapshot, TicketRef, TicketSignal};
use crate::config::RedisTarget;
use crate::engine::{
    AdmissionRate, Clock, Departure, Eta, Handoff, Identity, LotterySeed, Order, PermitLedger,
    RoomId, RoomSettings, RoomStats, RoomView, TickReport, TicketState, TicketStatus,
    WAIT_BUCKETS_MS, WaitSnapshot,
};
use conn::{Conn, unavailable};
pub use keys::RoomKeys;
use lease::Lease;
use pubsub::{Hub, HubEvent};
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
}

impl RedisOptions {
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(5);

    /// `target` may be a URL, for one server.
    pub fn new(target: impl Into<RedisTarget>) -> Self {
        Self {
            target: target.into(),
            lease: Self::DEFAULT_LEASE,
            run_workers: true,
        }
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("target", &self.target)
            .field("lease", &self.lease)
            .field("run_workers", &self.run_workers)
            .finish_non_exhaustive()
    }
}

pub struct RedisBackend {
    weak: Weak<Self>,
    conn: Conn,
    scripts: Scripts,
    clock: Arc<dyn Clock>,
    options: RedisOptions,
    hub: Arc<Hub>,
    /// The configured rooms, created again if a Redis without persistence
    /// comes back empty.
    configured: Vec<RoomSettings>,
    workers: DashMap<RoomId, ()>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend").finish_non_exhaustive()
    }
}

/// A script's reply: an array whose first element says how it went.
struct Reply(Vec<Value>);

impl Reply {
    fn tag(&self) -> &str {
        match self.0.first() {
            Some(Value::BulkString(b)) => std::str::from_utf8(b).unwrap_or(""),
            Some(Value::SimpleString(s)) => s,
            _ => "",
        }
    }

    fn int(&self, i: usize) -> i64 {
        match self.0.get(i) {
            Some(Value::Int(n)) => *n,
            Some(Value::BulkString(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            _ => 0,
        }
    }

    fn text(&self, i: usize) -> String {
        match self.0.get(i) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::Int(n)) => n.to_string(),
            _ => String::new(),
        }
    }

    fn float(&self, i: usize) -> f64 {
        self.text(i).parse().unwrap_or(0.0)
    }

    fn u64(&self, i: usize) -> u64 {
        u64::try_from(self.int(i)).unwrap_or(0)
    }

    fn opt_u64(&self, i: usize) -> Option<u64> {
        u64::try_from(self.int(i)).ok()
    }
}

fn state_of(n: i64) -> TicketState {
    match n {
        0 => TicketState::Waiting,
        1 => TicketState::Admitted,
        2 => TicketState::Released,
        3 => TicketState::Revoked,
        4 => TicketState::Expired,
        5 => TicketState::Left,
        _ => TicketState::Abandoned,
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A ticket status from the reply layout of `status_reply` in lib.lua,
/// starting at index `o`; computes what the embedded engine computes.
fn ticket_status(id: u64, r: &Reply, o: usize) -> TicketStatus {
    let state = state_of(r.int(o));
    let open = r.int(o + 8) == 1;
    let paused = r.int(o + 10) == 1;
    let closed = r.int(o + 11) == 1;
    let mut status = TicketStatus {
        id: u32::try_from(id).unwrap_or(u32::MAX),
        state,
        number: r.opt_u64(o + 1).map(|qi| qi + 1),
        position: None,
        ahead: None,
        eta: None,
        progress: 0.0,
        queue_length: r.u64(o + 7),
        joined_at: r.u64(o + 2),
        admitted_at: None,
        pass_expires_at: None,
        opens_at: if open { None } else { r.opt_u64(o + 9) },
        paused,
        closed,
    };
    match state {
        TicketState::Waiting => {
            if let Some(position) = r.opt_u64(o + 5) {
                let ahead = position.saturating_sub(1);
                let initial = r.u64(o + 6);
                status.position = Some(position);
                status.ahead = Some(ahead);
                status.progress = if initial == 0 {
                    1.0
                } else {
                    1.0 - (ahead.min(initial) as f64 / initial as f64)
                };
                if open && !paused && !closed {
                    let free = r.u64(o + 12) + r.u64(o + 13);
                    status.eta = if position <= free {
                        let tick = r.u64(o + 17).div_ceil(1000);
                        Some(Eta {
                            low_secs: 0,
                            expected_secs: tick,
                            high_secs: tick,
                        })
                    } else {
                        AdmissionRate {
                            mean: r.float(o + 14),
                            variance: r.float(o + 15),
                            primed: r.int(o + 16) == 1,
                        }
                        .eta(position)
                        .map(|(low, expected, high)| Eta {
                            low_secs: low,
                            expected_secs: expected,
                            high_secs: high,
                        })
                    };
                }
            }
        }
        TicketState::Admitted => {
            status.progress = 1.0;
            status.admitted_at = Some(r.u64(o + 3));
            status.pass_expires_at = r.opt_u64(o + 4);
        }
        _ => {}
    }
    status
}

fn departure(r: &Reply) -> Result<Departure, BackendError> {
    Ok(match r.tag() {
        "left" => Departure::LeftQueue,
        "gave" => Departure::GaveBack(match r.text(1).as_str() {
            "to" => Handoff::To(u32::try_from(r.int(2)).unwrap_or(u32::MAX)),
            "retired" => Handoff::Retired,
            _ => Handoff::Tray,
        }),
        "nothing" => Departure::Nothing(state_of(r.int(1))),
        "noticket" => return Err(BackendError::NoSuchTicket),
        other => {
            return Err(BackendError::Unavailable(format!(
                "unexpected reply from Redis: {other}"
            )));
        }
    })
}

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
        let backend = Arc::new_cyclic(|weak| Self {
            weak: weak.clone(),
            conn,
            scripts: Scripts::new(),
            clock,
            options,
            hub: Arc::new(Hub::default()),
            configured: rooms.clone(),
            workers: DashMap::new(),
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

    /// Run a room script with the room's meta key, prefix and now.
    async fn run(
        &self,
        script: &redis::Script,
        room: &RoomId,
        args: &[String],
    ) -> Result<Reply, BackendError> {
        let keys = RoomKeys::new(room);
        let mut inv = script.key(&keys.meta);
        inv.arg(&keys.prefix).arg(self.now());
        for a in args {
            inv.arg(a);
        }
        let values: Vec<Value> = inv
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| unavailable(&e))?;
        let reply = Reply(values);
        match reply.tag() {
            "noroom" => Err(BackendError::NoSuchRoom(room.clone())),
            _ => Ok(reply),
        }
    }

    /// Create a room (or replace it, with a new epoch).
    async fn create(&self, settings: RoomSettings, replace: bool) -> Result<u64, BackendError> {
        let epoch = rand::random::<u64>().max(1);
        let seed = LotterySeed::random();
        let lottery = settings.order == Order::Lottery;
        let args = vec![
            if replace { "1" } else { "0" }.to_owned(),
            epoch.to_string(),
            settings.capacity.to_string(),
            ms(settings.tick).to_string(),
            ms(settings.pass_idle).to_string(),
            ms(settings.arrival_grace).to_string(),
            ms(settings.queue_idle).to_string(),
            settings.join_limit_per_minute.to_string(),
            settings.admit_per_minute.unwrap_or(0).to_string(),
            settings.opens_at.map(|t| t.to_string()).unwrap_or_default(),
            match settings.order {
                Order::Lottery => "lottery",
                Order::Fifo => "fifo",
            }
            .to_owned(),
            if settings.paused { "1" } else { "0" }.to_owned(),
            if lottery {
                seed.to_hex()
            } else {
                String::new()
            },
            if lottery {
                seed.commitment()
            } else {
                String::new()
            },
        ];
        let reply = self.run(&self.scripts.create, &settings.id, &args).await?;
        let _: RedisResult<i64> = self.con().sadd(keys::ROOMS, settings.id.as_str()).await;
        self.ensure_worker(&settings.id);
        reply
            .text(1)
            .parse()
            .map_err(|_| BackendError::Unavailable("bad epoch in Redis".into()))
    }

    async fn meta(&self, room: &RoomId) -> Result<HashMap<String, String>, BackendError> {
        let keys = RoomKeys::new(room);
        let meta: HashMap<String, String> = self
            .con()
            .hgetall(&keys.meta)
            .await
            .map_err(|e| unavailable(&e))?;
        if !meta.contains_key("epoch") {
            return Err(BackendError::NoSuchRoom(room.clone()));
        }
        Ok(meta)
    }

    fn snapshot_of(room: &RoomId, m: &HashMap<String, String>) -> RoomSnapshot {
        let num = |k: &str| -> u64 { m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0) };
        let dur = |k: &str| Duration::from_millis(num(k));
        let mut settings = RoomSettings::new(room.clone());
        settings.capacity = u32::try_from(num("capacity")).unwrap_or(u32::MAX);
        settings.tick = dur("tick_ms");
        settings.pass_idle = dur("pass_idle_ms");
        settings.arrival_grace = dur("arrival_grace_ms");
        settings.queue_idle = dur("queue_idle_ms");
        settings.join_limit_per_minute = u32::try_from(num("join_limit")).unwrap_or(0);
        settings.admit_per_minute =
            Some(u32::try_from(num("admit_cap")).unwrap_or(0)).filter(|&c| c > 0);
        settings.opens_at = m.get("opens_at").and_then(|v| v.parse().ok());
        settings.order = if m.get("order").map(String::as_str) == Some("fifo") {
            Order::Fifo
        } else {
            Order::Lottery
        };
        settings.paused = num("paused") == 1;
        let mut view = m
            .get("view")
            .and_then(|v| pubsub::parse_view(v))
            .unwrap_or_default();
        // The published view changes on ticks and operators' actions;
        // operators want the line as it is now, as the embedded backend
        // reports it.
        view.waiting = num("waiting");
        view.admitted = num("admitted");
        view.held = num("hand");
        view.tray = num("tray");
        view.debt = num("debt");
        let mut waits = WaitSnapshot::default();
        for (i, c) in waits.counts.iter_mut().enumerate() {
            *c = num(&format!("w{}", i + 1));
        }
        waits.sum_ms = num("w_sum");
        debug_assert_eq!(waits.counts.len(), WAIT_BUCKETS_MS.len());
        RoomSnapshot {
            settings,
            epoch: num("epoch"),
            view,
            stats: RoomStats {
                joins: num("c_joins"),
                admissions: num("c_admissions"),
                handoffs: num("c_handoffs"),
                releases: num("c_releases"),
                leaves: num("c_leaves"),
                revocations: num("c_revocations"),
                expirations: num("c_expirations"),
                abandonments: num("c_abandonments"),
                peak_admitted: num("peak"),
                waits,
            },
            ledger: PermitLedger {
                capacity: num("capacity"),
                held: num("hand"),
                tray: num("tray"),
                admitted: num("admitted"),
                debt: num("debt"),
            },
        }
    }

    /// The opening: read the pre-queue, draw it (engine::lottery, which
    /// Redis' Lua cannot do: it has no SHA-256), and place it atomically.
    async fn open(&self, room: &RoomId, now_by_operator: bool) -> Result<(), BackendError> {
        let m = self.meta(room).await?;
        if m.get("open").map(String::as_str) == Some("1") {
            return Ok(());
        }
        let epoch = m.get("epoch").cloned().unwrap_or_default();
        let keys = RoomKeys::new(room);
        let ids: Vec<u32> = self
            .con()
            .lrange(keys.prequeue(&epoch), 0, -1)
            .await
            .map_err(|e| unavailable(&e))?;
        let mut ids = ids;
        ids.sort_unstable();
        let seed = m
            .get("seed")
            .filter(|s| !s.is_empty())
            .and_then(|s| hex::decode(s).ok())
            .and_then(|b| <[u8; 32]>::try_from(b).ok());
        let order = match (m.get("order").map(String::as_str), seed) {
            (Some("lottery"), Some(seed)) => LotterySeed(seed).draw(&ids),
            _ => ids,
        };
        let mut args = vec![
            if now_by_operator { "1" } else { "0" }.to_owned(),
            order.len().to_string(),
        ];
        args.extend(order.iter().map(u32::to_string));
        self.run(&self.scripts.open, room, &args).await?;
        tracing::info!(room = %room, drawn = order.len(), "room opened");
        Ok(())
    }

    /// One tick; `owner` is the worker's lease token ('' for a manual tick).
    async fn tick_as(
        &self,
        room: &RoomId,
        owner: &str,
    ) -> Result<Option<(TickReport, u64)>, BackendError> {
        let mut opened = false;
        for _ in 0..3 {
            let r = self
                .run(&self.scripts.tick, room, &[owner.to_owned()])
                .await?;
            match r.tag() {
                "notowner" => return Ok(None),
                "open_needed" => {
                    self.open(room, false).await?;
                    opened = true;
                }
                "ok" => {
                    let tick_ms = r.u64(1);
                    let mut report = TickReport {
                        opened,
                        from_tray: r.u64(2),
                        abandoned: r.u64(3),
                        ..TickReport::default()
                    };
                    let n = usize::try_from(r.int(4)).unwrap_or(0);
                    report.admitted = (0..n).map(|i| r.int(5 + i) as u32).collect();
                    let e = 5 + n;
                    let m = usize::try_from(r.int(e)).unwrap_or(0);
                    report.expired = (0..m).map(|i| r.int(e + 1 + i) as u32).collect();
                    return Ok(Some((report, tick_ms)));
                }
                other => {
                    return Err(BackendError::Unavailable(format!(
                        "unexpected reply from Redis: {other}"
                    )));
                }
            }
        }
        Err(BackendError::Unavailable("the room did not open".into()))
    }

    /// Start this instance's worker loop for a room, once.
    fn ensure_worker(&self, room: &RoomId) {
        if !self.options.run_workers || self.shutdown.is_cancelled() {
            return;
        }
        if self.workers.insert(room.clone(), ()).is_some() {
            return;
        }
        // The loop holds only a weak reference: it must not keep the
        // backend alive.
        self.tasks
            .spawn(run_worker(self.weak.clone(), room.clone()));
    }
}

impl RedisBackend {
    /// Follows room creations heard on the channel (and, every lease
    /// period, the room set, for messages missed while disconnected) so
    /// that every instance can take over any room's worker.
    async fn supervise(me: Weak<Self>, mut events: mpsc::UnboundedReceiver<HubEvent>) {
        let (stop, every) = match me.upgrade() {
            Some(b) => (b.shutdown.clone(), b.options.lease),
            None => return,
        };
        let mut scan = tokio::time::interval(every);
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                e = events.recv() => match e { Some(e) => Some(e), None => return },
                _ = scan.tick() => None,
            };
            let Some(backend) = me.upgrade() else { return };
            match event {
                Some(HubEvent::RoomCreated(room)) => {
                    backend.ensure_worker(&room);
                    backend.refresh_view(&room).await;
                }
                Some(HubEvent::Resubscribed) => {
                    for settings in backend.configured.clone() {
                        let _ = backend.create(settings, false).await;
                    }
                    for room in backend.hub.local_rooms() {
                        backend.refresh_view(&room).await;
                    }
                }
                None => {
                    let rooms: RedisResult<Vec<String>> = backend.con().smembers(keys::ROOMS).await;
                    for room in rooms.unwrap_or_default() {
                        if let Ok(room) = RoomId::new(&room) {
                            backend.ensure_worker(&room);
                        }
                    }
                }
            }
        }
    }

    /// Read a room's current view from Redis into the local watch.
    async fn refresh_view(&self, room: &RoomId) -> Option<watch::Receiver<RoomView>> {
        let keys = RoomKeys::new(room);
        let (epoch, view): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&keys.meta)
            .arg("epoch")
            .arg("view")
            .query_async(&mut self.con())
            .await
            .ok()?;
        let epoch = epoch?.parse().ok()?;
        let view = view
            .as_deref()
            .and_then(pubsub::parse_view)
            .unwrap_or_default();
        Some(self.hub.apply_view(room, epoch, view))
    }

    /// Send the queued status reads of one room, a batch per script call,
    /// until none are left.
    async fn flush_statuses(&self, key: batch::Key) {
        while let Some(reads) = self.hub.batches.take(&key) {
            let mut args = Vec::with_capacity(1 + 2 * reads.len());
            args.push(if key.1 { "1" } else { "0" }.to_owned());
            for r in &reads {
                args.push(r.epoch.to_string());
                args.push(r.id.to_string());
            }
            match self.run(&self.scripts.status, &key.0, &args).await {
                Ok(Reply(replies)) => {
                    for (read, one) in reads.into_iter().zip(replies) {
                        let one = Reply(match one {
                            Value::Array(v) => v,
                            _ => Vec::new(),
                        });
                        let _ = read.reply.send(match one.tag() {
                            "ok" => Ok(ticket_status(read.id, &one, 1)),
                            _ => Err(BackendError::NoSuchTicket),
                        });
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

    fn parse_ticket(&self, t: TicketRef) -> [String; 2] {
        [t.epoch.to_string(), t.id.to_string()]
    }

    async fn depart(
        &self,
        room: &RoomId,
        t: TicketRef,
        mode: &str,
    ) -> Result<Departure, BackendError> {
        let [epoch, id] = self.parse_ticket(t);
        let r = self
            .run(&self.scripts.depart, room, &[epoch, id, mode.to_owned()])
            .await?;
        departure(&r)
    }
}

/// A room's worker loop on this instance: contend for the lease; while
/// holding it, tick every `tick` and renew it every third of the lease;
/// on shutdown give it up.
async fn run_worker(me: Weak<RedisBackend>, room: RoomId) {
    use tokio::time::Instant;
    let (stop, ttl) = match me.upgrade() {
        Some(b) => (b.shutdown.clone(), b.options.lease),
        None => return,
    };
    let lease = Lease::new(RoomKeys::new(&room).lease, ttl);
    let renew_every = ttl / 3;
    let retry = renew_every.min(Duration::from_millis(500));
    let mut holding = false;
    let mut renewed_at = Instant::now();
    let mut next_tick = Instant::now();
    let mut wake = Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep_until(wake) => {}
        }
        let Some(backend) = me.upgrade() else { return };
        let mut con = backend.con();
        let now = Instant::now();
        if !holding {
            match lease.acquire(&mut con).await {
                Ok(true) => {
                    tracing::info!(room = %room, "this instance runs the room's worker");
                    holding = true;
                    renewed_at = now;
                    next_tick = now;
                }
                Ok(false) => {
                    wake = now + renew_every;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(room = %room, kind = ?e.kind(), "lease: redis error");
                    wake = now + retry;
                    continue;
                }
            }
        } else if now >= renewed_at + renew_every {
            match lease.extend(&mut con, &backend.scripts).await {
                Ok(true) => renewed_at = now,
                Ok(false) => {
                    tracing::warn!(room = %room, "lost the room's worker lease");
                    holding = false;
                    wake = now + renew_every;
                    continue;
                }
                Err(_) => {
                    wake = now + retry;
                    continue;
                }
            }
        }
        if now >= next_tick {
            match backend.tick_as(&room, &lease.token).await {
                Ok(Some((report, tick_ms))) => {
                    if report.opened {
                        tracing::info!(room = %room, "room opened");
                    }
                    next_tick = now + Duration::from_millis(tick_ms.max(1));
                }
                Ok(None) => {
                    holding = false;
                    wake = now + renew_every;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(room = %room, error = %e, "tick failed");
                    next_tick = now + retry;
                }
            }
        }
        wake = next_tick.min(renewed_at + renew_every);
    }
    if holding && let Some(backend) = me.upgrade() {
        let _ = lease.release(&mut backend.con(), &backend.scripts).await;
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn ready(&self) -> Result<(), BackendError> {
        let pong: RedisResult<String> = redis::cmd("PING").query_async(&mut self.con()).await;
        pong.map(|_| ()).map_err(|e| unavailable(&e))
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

    async fn join(
        &self,
        room: &RoomId,
        identity: Option<Identity>,
    ) -> Result<JoinOutcome, BackendError> {
        let identity = identity
            .map(|i| format!("{:032x}", i.0))
            .unwrap_or_default();
        let r = self.run(&self.scripts.join, room, &[identity]).await?;
        match r.tag() {
            "ok" => {}
            "closed" => return Err(BackendError::Closed(room.clone())),
            "full" => return Err(BackendError::Full(room.clone())),
            other => {
                return Err(BackendError::Unavailable(format!(
                    "unexpected reply from Redis: {other}"
                )));
            }
        }
        let id = r.u64(1);
        let status = ticket_status(id, &r, 4);
        let epoch = r
            .text(3)
            .parse()
            .map_err(|_| BackendError::Unavailable("bad epoch in Redis".into()))?;
        Ok(JoinOutcome {
            ticket: TicketRef { epoch, id },
            is_new: r.int(2) == 1,
            status,
        })
    }

    async fn status(
        &self,
        room: &RoomId,
        t: TicketRef,
        touch: bool,
    ) -> Result<TicketStatus, BackendError> {
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

    async fn leave(&self, room: &RoomId, t: TicketRef) -> Result<Departure, BackendError> {
        self.depart(room, t, "leave").await
    }

    async fn release(&self, room: &RoomId, t: TicketRef) -> Result<Departure, BackendError> {
        self.depart(room, t, "release").await
    }

    async fn revoke(&self, room: &RoomId, t: TicketRef) -> Result<Departure, BackendError> {
        self.depart(room, t, "revoke").await
    }

    async fn tick(&self, room: &RoomId) -> Result<TickReport, BackendError> {
        Ok(self
            .tick_as(room, "")
            .await?
            .map(|(report, _)| report)
            .unwrap_or_default())
    }

    async fn watch_room(&self, room: &RoomId) -> Result<watch::Receiver<RoomView>, BackendError> {
        if let Some(rx) = self.hub.subscribe_view(room) {
            return Ok(rx);
        }
        // Not followed here yet: read it (which also tells an unknown room).
        self.epoch(room).await?;
        self.refresh_view(room)
            .await
            .ok_or_else(|| BackendError::Unavailable("cannot read the room view".into()))
    }

    async fn watch_ticket(
        &self,
        room: &RoomId,
        t: TicketRef,
    ) -> Result<TicketSignal, BackendError> {
        if self.epoch(room).await? != t.epoch {
            return Err(BackendError::NoSuchTicket);
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
        Ok(Self::snapshot_of(room, &m))
    }

    async fn put_room(&self, settings: RoomSettings) -> Result<RoomSnapshot, BackendError> {
        let id = settings.id.clone();
        self.create(settings, true).await?;
        self.refresh_view(&id).await;
        self.room(&id).await
    }

    async fn patch_room(
        &self,
        room: &RoomId,
        patch: RoomPatch,
    ) -> Result<RoomSnapshot, BackendError> {
        let mut args = vec![
            patch.capacity.map(|c| c.to_string()).unwrap_or_default(),
            patch
                .paused
                .map(|p| if p { "1" } else { "0" }.to_owned())
                .unwrap_or_default(),
        ];
        match &patch.settings {
            Some(s) => args.extend([
                "1".to_owned(),
                ms(s.tick).to_string(),
                ms(s.pass_idle).to_string(),
                ms(s.arrival_grace).to_string(),
                ms(s.queue_idle).to_string(),
                s.join_limit_per_minute.to_string(),
                s.admit_per_minute.unwrap_or(0).to_string(),
            ]),
            None => args.push("0".to_owned()),
        }
        let r = self.run(&self.scripts.patch, room, &args).await?;
        if r.tag() == "closed" {
            return Err(BackendError::Closed(room.clone()));
        }
        if patch.open_now {
            self.open(room, true).await?;
        }
        self.room(room).await
    }

    async fn close_room(&self, room: &RoomId) -> Result<(), BackendError> {
        self.run(&self.scripts.close, room, &[]).await?;
        Ok(())
    }

    async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// The status layout of lib.lua's `status_reply`, after a tag.
    fn reply(state: i64, position: i64, open: i64, hand: i64) -> Reply {
        let mut v = vec![bulk("ok")];
        v.extend(
            [
                state, 4, 1_000, 2_000, 9_000, position, 8, 12, open, 5_000, 0, 0, hand, 0,
            ]
            .map(Value::Int),
        );
        v.extend([bulk("2.5"), bulk("0"), Value::Int(1), Value::Int(1_000)]);
        Reply(v)
    }

    #[test]
    fn a_waiting_ticket_reads_like_the_engine_computes_it() {
        let s = ticket_status(3, &reply(0, 5, 1, 0), 1);
        assert_eq!(s.state, TicketState::Waiting);
        assert_eq!((s.number, s.position, s.ahead), (Some(5), Some(5), Some(4)));
        assert!((s.progress - 0.5).abs() < 1e-9);
        assert_eq!(s.queue_length, 12);
        // 5 ahead at 2.5 a second.
        assert_eq!(s.eta.map(|e| e.expected_secs), Some(2));
        assert_eq!(s.opens_at, None);
        // With free permits in the worker's hand, the next tick takes it.
        let s = ticket_status(3, &reply(0, 2, 1, 3), 1);
        assert_eq!(s.eta.map(|e| e.expected_secs), Some(1));
        // Before opening: no estimate, and the opening time.
        let s = ticket_status(3, &reply(0, 2, 0, 3), 1);
        assert_eq!((s.eta, s.opens_at), (None, Some(5_000)));
    }

    #[test]
    fn an_admitted_ticket_carries_its_pass() {
        let s = ticket_status(3, &reply(1, -1, 1, 0), 1);
        assert_eq!(s.state, TicketState::Admitted);
        assert_eq!(
            (s.admitted_at, s.pass_expires_at),
            (Some(2_000), Some(9_000))
        );
        assert_eq!(s.position, None);
        assert!((s.progress - 1.0).abs() < 1e-9);
    }

    #[test]
    fn departures_map_to_the_engine_s() {
        let r = |v: Vec<Value>| departure(&Reply(v));
        assert_eq!(r(vec![bulk("left")]), Ok(Departure::LeftQueue));
        assert_eq!(
            r(vec![bulk("gave"), bulk("to"), Value::Int(7)]),
            Ok(Departure::GaveBack(Handoff::To(7)))
        );
        assert_eq!(
            r(vec![bulk("gave"), bulk("retired")]),
            Ok(Departure::GaveBack(Handoff::Retired))
        );
        assert_eq!(
            r(vec![bulk("nothing"), Value::Int(4)]),
            Ok(Departure::Nothing(TicketState::Expired))
        );
        assert_eq!(r(vec![bulk("noticket")]), Err(BackendError::NoSuchTicket));
        assert!(matches!(r(vec![]), Err(BackendError::Unavailable(_))));
    }
}
