//! The task that tunes rooms: once a second (with the monitor's samples)
//! it takes every room whose `autotune` is on and that this instance
//! decides for (`Backend::decides`: on Redis only the room's owner), reads
//! the signal since its last change, asks the engine's rule for the next
//! rate, and applies a change through `Backend::patch_room`, the path an
//! operator's `PATCH` takes, so it is journalled (and on Redis goes
//! through the owner) like any other change.
//!
//! Each change is told three ways: an `info` log line, the
//! `narabu_autotune_*` figures in `/metrics`, and a `room.autotuned`
//! webhook. What the tuner last read and chose is kept in a [`TuneBook`]
//! for the admin API and the dashboard.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Autotune;
use super::signal::Sources;
use crate::backend::{Backend, RoomSnapshot};
use crate::engine::rules::{Current, Memory, Mode, Signal, Verdict, decide};
use crate::engine::{Patch, RoomId, RoomPatch, Timestamp};
use crate::locks::lock;
use crate::metrics::Metrics;
use crate::monitor::Monitor;

/// What a room's tuner read and chose, as the admin API shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct TuneView {
    /// Whether this instance tunes the room (on Redis, its owner does;
    /// another instance shows the section but no readings).
    pub(crate) tuned_here: bool,
    /// The latency quantile held to the target (ms), as last read.
    pub(crate) latency_ms: Option<f64>,
    /// The share of failed requests, as last read.
    pub(crate) error_ratio: Option<f64>,
    /// The requests the reading stands on.
    pub(crate) samples: u32,
    /// Why the last decision was what it was (`errors`, `slow`,
    /// `recovering`, `rising`, `headroom`, `hold`, `idle`, `too_soon`,
    /// `no_signal`, `bounds`).
    pub(crate) verdict: Option<&'static str>,
    /// The admission rate a minute the tuner keeps.
    pub(crate) rate: Option<u32>,
    /// The rate the latest run of cuts (for latency or errors) began at,
    /// a tenth lower once that run was for latency over the target or
    /// errors: where the tuner found the origin's limit, and searches
    /// towards.
    pub(crate) ceiling: Option<u32>,
    /// When the tuner last changed the room.
    pub(crate) changed_at: Option<Timestamp>,
    /// When it last judged a reading (changed or held).
    pub(crate) decided_at: Option<Timestamp>,
    /// Changes made since this instance began tuning the room.
    pub(crate) changes: u64,
}

/// Each tuned room's latest reading and choice on this instance.
#[derive(Debug, Default)]
pub(crate) struct TuneBook {
    rooms: Mutex<HashMap<RoomId, TuneView>>,
}

impl TuneBook {
    /// The room's tuning as this instance knows it; `None` when it does
    /// not tune it.
    pub(crate) fn view(&self, room: &RoomId) -> Option<TuneView> {
        lock(&self.rooms).get(room).cloned()
    }
}

/// A tuned room's running state.
struct Tuned {
    epoch: u64,
    section: Autotune,
    sources: Sources,
    /// The last judgement (Unix ms) or, before any, when tuning began:
    /// the signal is read from there on.
    since_ms: u64,
    judged_ms: Option<u64>,
    /// What that judgement read.
    judged_latency_ms: Option<f64>,
    /// What the controller remembers between judgements.
    memory: Memory,
    changed_ms: Option<u64>,
}

/// Start tuning; the task ends with `stop`.
pub(crate) fn start(
    backend: Arc<dyn Backend>,
    monitor: Arc<Monitor>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> Arc<TuneBook> {
    let book = Arc::new(TuneBook::default());
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("narabu-autotune/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default();
    let tuner = Tuner {
        backend,
        monitor,
        metrics,
        book: book.clone(),
        client,
        stop,
        rooms: HashMap::new(),
    };
    tokio::spawn(tuner.run());
    book
}

struct Tuner {
    backend: Arc<dyn Backend>,
    monitor: Arc<Monitor>,
    metrics: Arc<Metrics>,
    book: Arc<TuneBook>,
    client: reqwest::Client,
    stop: CancellationToken,
    rooms: HashMap<RoomId, Tuned>,
}

impl Tuner {
    async fn run(mut self) {
        let mut overview = self.monitor.subscribe();
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                changed = overview.changed() => if changed.is_err() { return },
            }
            let rooms = overview.borrow_and_update().clone();
            let mut seen = Vec::new();
            for (s, _) in &rooms.rooms {
                let id = &s.settings.id;
                let Some(section) = s.settings.autotune.as_deref().filter(|a| a.enabled) else {
                    continue;
                };
                if s.view.closed || !self.backend.decides(id) {
                    continue;
                }
                seen.push(id.clone());
                self.tune(s, section).await;
            }
            let gone: Vec<RoomId> = self
                .rooms
                .keys()
                .filter(|id| !seen.contains(id))
                .cloned()
                .collect();
            for id in gone {
                // Dropping the sources stops them.
                self.rooms.remove(&id);
                lock(&self.book.rooms).remove(&id);
                self.metrics.autotune_stopped(id.as_str());
                tracing::info!(room = %id, "autotune: no longer tuned here");
            }
        }
    }

    async fn tune(&mut self, s: &RoomSnapshot, section: &Autotune) {
        let id = &s.settings.id;
        let now_ms = self.backend.clock().now_ms();
        let fresh = self
            .rooms
            .get(id)
            .is_none_or(|t| t.epoch != s.epoch || t.section != *section);
        if fresh {
            // A new section (or a new line) starts its readings afresh.
            let sources = Sources::start(section, &self.client, self.backend.clock(), &self.stop);
            tracing::info!(room = %id, "autotune: tuning the room here");
            self.rooms.insert(
                id.clone(),
                Tuned {
                    epoch: s.epoch,
                    section: section.clone(),
                    sources,
                    since_ms: now_ms,
                    judged_ms: None,
                    judged_latency_ms: None,
                    memory: Memory::default(),
                    changed_ms: None,
                },
            );
        }
        let Some(t) = self.rooms.get_mut(id) else {
            return;
        };
        let signal = t.sources.signal(t.since_ms, now_ms, section.quantile);
        let admitting = s.view.open && !s.settings.paused && s.settings.mode == Mode::Queue;
        let current = Current {
            rate: s.settings.admit_per_minute,
            capacity: s.settings.capacity,
            demand: s.view.waiting > 0,
            last_judged_ms: t.judged_ms,
            previous_latency_ms: t.judged_latency_ms,
            memory: t.memory,
            now_ms,
        };
        let controller = section.controller();
        let decision = if admitting {
            decide(&controller, &current, &signal)
        } else {
            crate::engine::rules::Decision {
                verdict: Verdict::Idle,
                rate: current.rate.unwrap_or(controller.max_rate),
                capacity: current.capacity,
                memory: current.memory,
            }
        };
        // A judgement read a signal and decided on it: the next one reads
        // the origin from here on.
        if !matches!(decision.verdict, Verdict::TooSoon | Verdict::NoSignal) {
            t.judged_ms = Some(now_ms);
            t.judged_latency_ms = signal.latency_ms;
            t.since_ms = now_ms;
        }
        t.memory = decision.memory;
        let changes = current.rate != Some(decision.rate) || current.capacity != decision.capacity;
        let mut applied = false;
        if changes {
            applied = self.apply(s, &signal, decision).await;
            if applied && let Some(t) = self.rooms.get_mut(id) {
                t.changed_ms = Some(now_ms);
            }
        }
        let rate = if applied || !changes {
            Some(decision.rate)
        } else {
            s.settings.admit_per_minute
        };
        self.metrics.autotune_read(
            id.as_str(),
            signal.latency_ms,
            signal.error_ratio,
            rate.unwrap_or(0),
        );
        let (changed_ms, ceiling) = self
            .rooms
            .get(id)
            .map_or((None, None), |t| (t.changed_ms, t.memory.ceiling));
        let mut book = lock(&self.book.rooms);
        let view = book.entry(id.clone()).or_default();
        if decision.verdict == Verdict::TooSoon && view.verdict.is_some() {
            // Between judgements the last one stands.
            view.rate = rate;
            return;
        }
        *view = TuneView {
            tuned_here: true,
            latency_ms: signal.latency_ms.map(|l| (l * 10.0).round() / 10.0),
            error_ratio: signal.error_ratio,
            samples: signal.samples,
            verdict: Some(decision.verdict.name()),
            rate,
            ceiling,
            changed_at: changed_ms.map(Timestamp),
            decided_at: Some(Timestamp(now_ms)),
            changes: view.changes + u64::from(applied),
        };
    }

    /// Make the change as an operator's `PATCH` would; whether it was made.
    async fn apply(
        &self,
        s: &RoomSnapshot,
        signal: &Signal,
        d: crate::engine::rules::Decision,
    ) -> bool {
        let id = &s.settings.id;
        let patch = RoomPatch {
            admit_per_minute: Patch::Value(d.rate),
            capacity: (d.capacity != s.settings.capacity).then_some(d.capacity),
            ..RoomPatch::default()
        };
        let after = match self.backend.patch_room(id, patch).await {
            Ok(after) => after,
            Err(e) => {
                tracing::warn!(room = %id, error = %e, "autotune: the change was not made");
                return false;
            }
        };
        let verdict = d.verdict.name();
        tracing::info!(
            room = %id,
            verdict,
            previous_rate = ?s.settings.admit_per_minute,
            rate = d.rate,
            previous_capacity = s.settings.capacity,
            capacity = d.capacity,
            latency_ms = ?signal.latency_ms.map(|l| l.round()),
            error_ratio = ?signal.error_ratio,
            samples = signal.samples,
            "autotune: admission rate changed"
        );
        self.metrics.autotune_changed(id.as_str(), verdict);
        self.monitor.observe(&after);
        let mut data = json!({
            "rate": d.rate,
            "previous_rate": s.settings.admit_per_minute,
            "verdict": verdict,
            "signal": {
                "latency_ms": signal.latency_ms,
                "error_ratio": signal.error_ratio,
                "samples": signal.samples,
            },
        });
        if d.capacity != s.settings.capacity {
            data["previous_capacity"] = json!(s.settings.capacity);
        }
        self.monitor.autotuned(&after, data);
        true
    }
}
