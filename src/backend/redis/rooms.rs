//! Rooms as a whole on Redis: creating and replacing them, operators'
//! changes, the opening draw, closing, reading a room for operators, and
//! publishing its view. Each change is one script; the view it leaves is
//! then built by the rules (`rules::Visible` decides whether it is worth
//! publishing) and published by `publish.lua`, ordered by the change it
//! reflects so an older view never replaces a newer one.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use redis::{AsyncCommands, RedisResult};
use serde_json::json;
use tokio::sync::mpsc;

use super::keys::{self, RoomKeys};
use super::pubsub::HubEvent;
use super::reply::{self, Timeouts, ViewFields, decode};
use super::{RedisBackend, RoomSnapshot, conn::unavailable};
use crate::access::AccessSettings;
use crate::backend::BackendError;
use crate::engine::rules::{AdmissionRate, AdmitCap, Mode, StockTaken, Visible};
use crate::engine::{
    LaneSpec, LotterySeed, Order, Patch, PermitLedger, RoomId, RoomPatch, RoomSettings, RoomStats,
    WAIT_BUCKETS_MS, WaitSnapshot,
};

fn ms(d: Duration) -> String {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).to_string()
}

fn flag(b: bool) -> &'static str {
    if b { "1" } else { "0" }
}

/// The stored fields of an admission cap: the per-minute figure operators
/// see, and the interval and tolerance the scripts' one GCRA step uses.
fn cap_fields(per_minute: Option<u32>) -> [(&'static str, String); 3] {
    let cap = AdmitCap::per_minute(per_minute);
    [
        ("admit_cap", per_minute.unwrap_or(0).to_string()),
        ("cap_interval_us", cap.interval_us.to_string()),
        ("cap_tolerance_us", cap.tolerance_us.to_string()),
    ]
}

impl RedisBackend {
    /// Create a room (or replace it, with a new epoch).
    pub(super) async fn create(
        &self,
        settings: RoomSettings,
        replace: bool,
    ) -> Result<u64, BackendError> {
        Ok(self.create_room(settings, replace).await?.0)
    }

    /// A configured room that Redis no longer has (it restarted without
    /// persistence, or its data was flushed) is created again, as a new
    /// line: tickets of the lost one name its old epoch and are told
    /// their line was reset. Of the instances that find it gone at once,
    /// the one whose create made the room reports the reset (a log line,
    /// and `line_resets` for the webhook and the metric). True when the
    /// room exists again.
    pub(super) async fn recover(&self, room: &RoomId) -> bool {
        let Some(settings) = self.configured.iter().find(|s| &s.id == room).cloned() else {
            return false;
        };
        match self.create_room(settings, false).await {
            Ok((epoch, true)) => {
                tracing::warn!(
                    room = %room,
                    epoch,
                    "the room's line was lost in Redis (a restart without persistence, or flushed data) and started again; tickets of the old line are told it was reset"
                );
                let _ = self.resets.send(crate::backend::LineReset {
                    room: room.clone(),
                    epoch,
                });
                true
            }
            Ok((_, false)) => true,
            Err(e) => {
                tracing::debug!(room = %room, error = %e, "could not create a lost room again");
                false
            }
        }
    }

    /// Create (or replace) a room: its epoch, and whether this call made
    /// it (false: it existed and was kept).
    async fn create_room(
        &self,
        settings: RoomSettings,
        replace: bool,
    ) -> Result<(u64, bool), BackendError> {
        let epoch = rand::random::<u64>().max(1);
        let seed = LotterySeed::random();
        let lottery = settings.order == Order::Lottery;
        let mut fields = json!({
            "capacity": settings.capacity.to_string(),
            "tick_ms": ms(settings.tick),
            "pass_idle_ms": ms(settings.pass_idle),
            "arrival_grace_ms": ms(settings.arrival_grace),
            "queue_idle_ms": ms(settings.queue_idle),
            "away_grace_ms": ms(settings.away_grace),
            "join_limit": settings.join_limit_per_minute.to_string(),
            "opens_at": settings.opens_at.map(|t| t.to_string()).unwrap_or_default(),
            "order": match settings.order {
                Order::Lottery => "lottery",
                Order::Fifo => "fifo",
            },
            "paused": flag(settings.paused),
            "mode": settings.mode.name(),
            "stock": settings.stock.map(|v| v.to_string()).unwrap_or_default(),
            "seed": if lottery { seed.to_hex() } else { String::new() },
            "commitment": if lottery { seed.commitment() } else { String::new() },
            "templates_dir": settings.templates_dir.clone().unwrap_or_default(),
            "lanes": settings
                .lanes
                .iter()
                .map(|l| json!({"name": l.name, "weight": l.weight}))
                .collect::<Vec<_>>(),
            "lane_def": settings.lane_of(None).unwrap_or(0),
        });
        for (k, v) in cap_fields(settings.admit_per_minute) {
            fields[k] = v.into();
        }
        fields["access"] = settings
            .access
            .fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into()))
            .collect::<serde_json::Map<_, _>>()
            .into();
        let now = self.now();
        let raw = self
            .run(
                &self.scripts.create,
                &settings.id,
                now,
                &[flag(replace), &epoch.to_string(), &fields.to_string()],
            )
            .await?;
        let _: RedisResult<i64> = self.con().sadd(keys::ROOMS, settings.id.as_str()).await;
        self.ensure_worker(&settings.id);
        match decode::<reply::Changed>(&raw)? {
            reply::Changed::Created { view } => {
                // The replica here is of the old incarnation: its streams
                // end now, and the follower reads the new one.
                self.hub.retire(&settings.id);
                self.publish(&settings.id, &view, true, "", None).await?;
                Ok((epoch, true))
            }
            reply::Changed::Exists { epoch } => epoch
                .parse()
                .map(|e| (e, false))
                .map_err(|_| BackendError::Unavailable("bad epoch in Redis".into())),
            other => Err(unexpected(&other)),
        }
    }

    /// An operator's change: only the fields given are written, in one
    /// script.
    pub(super) async fn patch(&self, room: &RoomId, patch: &RoomPatch) -> Result<(), BackendError> {
        let mut fields = serde_json::Map::new();
        let mut put = |k: &str, v: String| {
            fields.insert(k.to_owned(), v.into());
        };
        if let Some(v) = patch.capacity {
            put("capacity", v.to_string());
        }
        if let Some(v) = patch.paused {
            put("paused", flag(v).to_owned());
        }
        if let Some(v) = patch.mode {
            put("mode", v.name().to_owned());
        }
        match patch.stock {
            Patch::Absent => {}
            Patch::Null => put("stock", String::new()),
            Patch::Value(v) => put("stock", v.to_string()),
        }
        for (k, v) in [
            ("tick_ms", patch.tick),
            ("pass_idle_ms", patch.pass_idle),
            ("arrival_grace_ms", patch.arrival_grace),
            ("queue_idle_ms", patch.queue_idle),
            ("away_grace_ms", patch.away_grace),
        ] {
            if let Some(v) = v {
                put(k, ms(v));
            }
        }
        if let Some(v) = patch.join_limit_per_minute {
            put("join_limit", v.to_string());
        }
        let cap = match patch.admit_per_minute {
            Patch::Absent => None,
            Patch::Null => Some(None),
            Patch::Value(v) => Some(Some(v)),
        };
        if let Some(cap) = cap {
            for (k, v) in cap_fields(cap) {
                put(k, v);
            }
        }
        for (k, v) in patch.access.fields() {
            put(k, v);
        }
        match &patch.templates_dir {
            Patch::Absent => {}
            Patch::Null => put("templates_dir", String::new()),
            Patch::Value(v) => put("templates_dir", v.clone()),
        }
        // The lane rule reads each lane's weight from the room at every
        // pick, so the next permit already follows the new weights.
        for &(lane, weight) in &patch.lane_weights {
            put(&format!("lane_w{lane}"), weight.to_string());
        }
        let fields = serde_json::Value::Object(fields).to_string();
        let raw = self
            .run(&self.scripts.patch, room, self.now(), &[&fields])
            .await?;
        self.timeouts.remove(room);
        self.after_change(room, &raw).await
    }

    /// A reported purchase, taken off the stock in one script.
    pub(super) async fn purchase(
        &self,
        room: &RoomId,
        purchased: u64,
    ) -> Result<Option<StockTaken>, BackendError> {
        let raw = self
            .run(
                &self.scripts.purchase,
                room,
                self.now(),
                &[&purchased.to_string()],
            )
            .await?;
        match decode::<reply::Purchase>(&raw)? {
            reply::Purchase::Ok {
                left,
                before,
                mode,
                sold_out_now,
                view,
            } => {
                self.publish(room, &view, false, "", None).await?;
                Ok(Some(StockTaken {
                    left,
                    before: stored_mode(Some(&before)),
                    mode: stored_mode(Some(&mode)),
                    sold_out_now,
                }))
            }
            reply::Purchase::NoStock => Ok(None),
            reply::Purchase::NoRoom => Err(BackendError::NoSuchRoom(room.clone())),
        }
    }

    pub(super) async fn close(&self, room: &RoomId) -> Result<(), BackendError> {
        let raw = self.run(&self.scripts.close, room, self.now(), &[]).await?;
        self.after_change(room, &raw).await
    }

    /// Publish the view a change left, or say why there is none.
    async fn after_change(&self, room: &RoomId, raw: &str) -> Result<(), BackendError> {
        match decode::<reply::Changed>(raw)? {
            reply::Changed::Ok { view } => self.publish(room, &view, false, "", None).await,
            reply::Changed::Already => Ok(()),
            reply::Changed::Closed => Err(BackendError::Closed(room.clone())),
            reply::Changed::NoRoom => Err(BackendError::NoSuchRoom(room.clone())),
            other => Err(unexpected(&other)),
        }
    }

    /// Build the view from a script's stored fields and publish it if it
    /// shows anything new (or `force`). `owner` fences a worker's publish
    /// (and its `rate`, written back with it) by its lease.
    pub(super) async fn publish(
        &self,
        room: &RoomId,
        fields: &ViewFields,
        force: bool,
        owner: &str,
        rate: Option<AdmissionRate>,
    ) -> Result<(), BackendError> {
        let now = self.now();
        let mut view = fields.view();
        view.at_ms = now;
        let rate_args = match rate {
            Some(rate) => {
                view.rate = rate;
                [
                    rate.mean.to_string(),
                    rate.variance.to_string(),
                    flag(rate.primed).to_owned(),
                ]
            }
            None => Default::default(),
        };
        let signature = Visible::of(&view).signature();
        let json = serde_json::to_string(&view).unwrap_or_default();
        let raw = self
            .run(
                &self.scripts.publish,
                room,
                now,
                &[
                    owner,
                    &fields.change().to_string(),
                    flag(force),
                    &signature,
                    &json,
                    &rate_args[0],
                    &rate_args[1],
                    &rate_args[2],
                ],
            )
            .await?;
        match decode::<reply::Publish>(&raw)? {
            reply::Publish::Published { version } => {
                if let Some(epoch) = fields.epoch() {
                    view.version = version;
                    // This instance's streams need not wait for the
                    // message to come back from Redis.
                    self.hub.apply_view(room, epoch, view);
                }
                Ok(())
            }
            reply::Publish::Same | reply::Publish::Superseded | reply::Publish::NotOwner => Ok(()),
            reply::Publish::NoRoom => Err(BackendError::NoSuchRoom(room.clone())),
        }
    }

    pub(super) async fn meta(
        &self,
        room: &RoomId,
    ) -> Result<HashMap<String, String>, BackendError> {
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

    /// A room for operators, from its stored fields: the line as it is now,
    /// not as last published.
    pub(super) fn snapshot_of(room: &RoomId, m: HashMap<String, String>) -> RoomSnapshot {
        let f = ViewFields(m);
        let num = |k: &str| f.num(k);
        let dur = |k: &str| Duration::from_millis(num(k));
        let mut settings = RoomSettings::new(room.clone());
        settings.capacity = u32::try_from(num("capacity")).unwrap_or(u32::MAX);
        settings.tick = dur("tick_ms");
        settings.pass_idle = dur("pass_idle_ms");
        settings.arrival_grace = dur("arrival_grace_ms");
        settings.queue_idle = dur("queue_idle_ms");
        // A room stored before presence existed has no grace: the default.
        if f.0.contains_key("away_grace_ms") {
            settings.away_grace = dur("away_grace_ms");
        }
        settings.join_limit_per_minute = u32::try_from(num("join_limit")).unwrap_or(0);
        settings.admit_per_minute =
            Some(u32::try_from(num("admit_cap")).unwrap_or(0)).filter(|&c| c > 0);
        settings.opens_at = f.0.get("opens_at").and_then(|v| v.parse().ok());
        settings.order = if f.0.get("order").map(String::as_str) == Some("fifo") {
            Order::Fifo
        } else {
            Order::Lottery
        };
        settings.paused = num("paused") == 1;
        settings.mode = stored_mode(f.0.get("mode"));
        settings.stock = f.0.get("stock").and_then(|v| v.parse().ok());
        *settings.access = AccessSettings::from_fields(|k| f.0.get(k).map(String::as_str));
        settings.templates_dir = f.0.get("templates_dir").filter(|d| !d.is_empty()).cloned();
        settings.lanes = (0..num("lanes"))
            .map(|l| LaneSpec {
                name: f.0.get(&format!("lane_n{l}")).cloned().unwrap_or_default(),
                weight: u32::try_from(num(&format!("lane_w{l}"))).unwrap_or(u32::MAX),
            })
            .collect();
        settings.default_lane =
            f.0.get("lane_def")
                .and_then(|d| d.parse::<u8>().ok())
                .and_then(|d| settings.lane_name(d))
                .map(str::to_owned);
        let mut view = f.view();
        view.version = num("view_version");
        let mut waits = WaitSnapshot::default();
        for (i, c) in waits.counts.iter_mut().enumerate() {
            *c = num(&format!("w{}", i + 1));
        }
        waits.sum_ms = num("w_sum");
        debug_assert_eq!(waits.counts.len(), WAIT_BUCKETS_MS.len());
        RoomSnapshot {
            settings,
            epoch: num("epoch"),
            stats: RoomStats {
                joins: num("issued"),
                admissions: num("c_admissions"),
                handoffs: num("c_handoffs"),
                releases: num("c_releases"),
                leaves: num("c_leaves"),
                revocations: num("c_revocations"),
                expirations: num("c_expirations"),
                abandonments: num("c_abandonments"),
                skips: num("c_skips"),
                returns: num("c_returns"),
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
            view,
        }
    }

    /// The opening: read the pre-queue, draw it (`engine::LotterySeed`,
    /// which Redis' Lua cannot do: it has no SHA-256), and place it
    /// atomically.
    pub(super) async fn open(
        &self,
        room: &RoomId,
        now_by_operator: bool,
    ) -> Result<(), BackendError> {
        let m = self.meta(room).await?;
        if m.get("open").map(String::as_str) == Some("1") {
            return Ok(());
        }
        let epoch = m.get("epoch").cloned().unwrap_or_default();
        let keys = RoomKeys::new(room);
        let mut ids: Vec<u32> = self
            .con()
            .lrange(keys.prequeue(&epoch), 0, -1)
            .await
            .map_err(|e| unavailable(&e))?;
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
        let mut args = vec![flag(now_by_operator).to_owned(), order.len().to_string()];
        args.extend(order.iter().map(u32::to_string));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let raw = self
            .run(&self.scripts.open, room, self.now(), &args)
            .await?;
        self.after_change(room, &raw).await?;
        tracing::info!(room = %room, drawn = order.len(), "room opened");
        Ok(())
    }

    /// Start this instance's worker loop for a room, once.
    pub(super) fn ensure_worker(&self, room: &RoomId) {
        if !self.options.run_workers || self.shutdown.is_cancelled() {
            return;
        }
        if self.workers.insert(room.clone(), ()).is_some() {
            return;
        }
        // The loop holds only a weak reference: it must not keep the
        // backend alive.
        self.tasks
            .spawn(super::worker::run_worker(self.weak.clone(), room.clone()));
    }

    /// The room's timeouts as this instance last saw them.
    pub(super) fn timeouts_of(&self, room: &RoomId) -> Option<Timeouts> {
        self.timeouts.get(room).map(|t| *t)
    }

    /// Follows room creations heard on the channel (and, every lease
    /// period, the room set, for messages missed while disconnected) so
    /// that every instance can take over any room's worker.
    pub(super) async fn supervise(me: Weak<Self>, mut events: mpsc::UnboundedReceiver<HubEvent>) {
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
                    backend.timeouts.remove(&room);
                    backend.ensure_worker(&room);
                }
                Some(HubEvent::Resubscribed) => {
                    for settings in &backend.configured {
                        backend.recover(&settings.id).await;
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
}

/// A stored mode; a room stored before modes existed queues.
fn stored_mode(name: Option<&String>) -> Mode {
    name.and_then(|m| Mode::from_name(m)).unwrap_or_default()
}

fn unexpected(reply: &impl std::fmt::Debug) -> BackendError {
    tracing::warn!(?reply, "a Redis script answered out of turn");
    BackendError::Unavailable("unexpected reply from Redis".into())
}
