//! The operators' view over time: samples every room once a second, keeps
//! fifteen minutes of history for the dashboard's charts, works out the
//! figures that need a time window (admissions per second and wait
//! percentiles over the last minute), and turns changes of a room's state
//! into webhook events.
//!
//! It reads rooms only through the `Backend` trait, so it works the same on
//! every backend. Admin handlers hand it the snapshot a change returned
//! ([`Monitor::observe`]), so a webhook for a pause leaves at once rather than
//! at the next sample, and each change is reported exactly once whichever
//! path sees it first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, LineReset, RoomSnapshot};
use crate::engine::rules::Mode;
use crate::engine::{RoomId, Timestamp, WaitSnapshot};
use crate::locks::lock;
use crate::webhooks::{EventType, WebhookEvent, Webhooks};

/// One sample a second, fifteen minutes of them.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);
pub(crate) const HISTORY: usize = 15 * 60;
/// The window of "per second" and wait percentiles.
const WINDOW_MS: u64 = 60_000;

/// One point of a room's charts.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Sample {
    /// Unix ms.
    pub t: u64,
    pub waiting: u64,
    pub admitted: u64,
    pub capacity: u64,
    /// Admissions per second over the last minute.
    pub admit_rate: f64,
    /// Median and 95th percentile of the waits that ended in admission in
    /// the last minute (ms); `None` when nobody was admitted.
    pub wait_p50_ms: Option<u64>,
    pub wait_p95_ms: Option<u64>,
}

/// What a room's counters were at a moment, to take differences over a
/// window.
#[derive(Clone, Debug)]
struct Raw {
    t: u64,
    admissions: u64,
    waits: WaitSnapshot,
}

/// The state whose changes are webhook events.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    epoch: u64,
    /// The room view's version: a snapshot older than the last one seen
    /// (a sample taken just before an operator's change) is ignored.
    version: u64,
    open: bool,
    paused: bool,
    closed: bool,
    capacity: u32,
}

#[derive(Debug, Default)]
struct RoomHistory {
    epoch: u64,
    samples: VecDeque<Sample>,
    raw: VecDeque<Raw>,
    last: Option<Observed>,
    /// Per webhook index: the queue is above its threshold (re-armed when
    /// it falls to 90% of it).
    above: HashMap<usize, bool>,
}

/// Everything the dashboard's stream sends each second.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overview {
    pub rooms: Vec<(RoomSnapshot, Sample)>,
}

pub struct Monitor {
    backend: Arc<dyn Backend>,
    webhooks: Arc<Webhooks>,
    rooms: Mutex<HashMap<RoomId, RoomHistory>>,
    tx: watch::Sender<Arc<Overview>>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

impl Monitor {
    /// Now, on the rooms' clock.
    fn now_ms(&self) -> u64 {
        self.backend.clock().now_ms()
    }
}

impl Monitor {
    pub(crate) fn new(backend: Arc<dyn Backend>, webhooks: Arc<Webhooks>) -> Arc<Self> {
        Arc::new(Self {
            backend,
            webhooks,
            rooms: Mutex::new(HashMap::new()),
            tx: watch::channel(Arc::new(Overview::default())).0,
        })
    }

    /// Samples every room each second until `stop`.
    pub(crate) fn start(self: &Arc<Self>, stop: CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(SAMPLE_EVERY);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = interval.tick() => {}
                }
                this.sample().await;
            }
        });
    }

    /// Takes one sample of every room now and publishes the overview.
    pub(crate) async fn sample(&self) {
        let snapshots = match self.backend.list_rooms().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "monitor: cannot read the rooms");
                return;
            }
        };
        let t = self.now_ms();
        let rooms = snapshots
            .into_iter()
            .map(|s| {
                let sample = self.record(&s, t);
                (s, sample)
            })
            .collect();
        self.tx.send_replace(Arc::new(Overview { rooms }));
    }

    /// Follow the overview (one change a second).
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<Overview>> {
        self.tx.subscribe()
    }

    /// Each room's chart history, oldest first.
    pub(crate) fn history(&self) -> Vec<(RoomId, Vec<Sample>)> {
        let rooms = lock(&self.rooms);
        let mut out: Vec<_> = rooms
            .iter()
            .map(|(id, h)| (id.clone(), h.samples.iter().cloned().collect()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The windowed figures of a room right now, without recording a
    /// sample (for the admin API).
    pub(crate) fn figures(&self, s: &RoomSnapshot) -> Sample {
        let rooms = lock(&self.rooms);
        let raw = rooms
            .get(&s.settings.id)
            .filter(|h| h.epoch == s.epoch)
            .map(|h| &h.raw);
        window(s, self.now_ms(), raw)
    }

    /// A change of mode, announced by the one call that made it (an
    /// operator's `PATCH`, or the purchase that took the last unit), so
    /// that with several instances it is sent once: `room.mode_changed`,
    /// and `room.sold_out` when the room became sold out.
    pub(crate) fn mode_changed(&self, before: Mode, s: &RoomSnapshot, reason: &str) {
        let now = s.settings.mode;
        if before == now {
            return;
        }
        let changed = json!({ "previous_mode": before, "reason": reason });
        let e = event(EventType::RoomModeChanged, s, changed, self.now_ms());
        self.webhooks.send(&e, None);
        if now == Mode::SoldOut {
            let e = event(
                EventType::RoomSoldOut,
                s,
                json!({ "reason": reason }),
                self.now_ms(),
            );
            self.webhooks.send(&e, None);
        }
    }

    /// Autotune changed the room (`s`, as the change left it): sent by the
    /// one instance that tunes it. `extra` says from what and why.
    pub(crate) fn autotuned(&self, s: &RoomSnapshot, extra: serde_json::Value) {
        let e = event(EventType::RoomAutotuned, s, extra, self.now_ms());
        self.webhooks.send(&e, None);
    }

    /// A snapshot taken just before (to know what changed, even if no
    /// sample was taken yet) or just after an operator's change (to fire its
    /// webhooks now).
    pub(crate) fn observe(&self, s: &RoomSnapshot) {
        let mut rooms = lock(&self.rooms);
        let h = rooms.entry(s.settings.id.clone()).or_default();
        self.detect(h, s);
    }

    /// A room's line was found lost and started again here: tell the
    /// operators' receivers (`room.reset`, with the new line's figures).
    pub(crate) async fn line_reset(&self, reset: &LineReset) {
        let s = match self.backend.room(&reset.room).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(room = %reset.room, error = %e, "monitor: cannot read a reset room");
                return;
            }
        };
        let e = event(
            EventType::RoomReset,
            &s,
            json!({ "epoch": reset.epoch.to_string() }),
            self.now_ms(),
        );
        self.webhooks.send(&e, None);
    }

    fn record(&self, s: &RoomSnapshot, t: u64) -> Sample {
        let mut rooms = lock(&self.rooms);
        let h = rooms.entry(s.settings.id.clone()).or_default();
        if h.epoch != s.epoch {
            // A replaced room starts its charts again.
            h.samples.clear();
            h.raw.clear();
            h.epoch = s.epoch;
        }
        self.detect(h, s);
        h.raw.push_back(Raw {
            t,
            admissions: s.stats.admissions,
            waits: s.stats.waits.clone(),
        });
        while h.raw.front().is_some_and(|r| r.t + WINDOW_MS < t) {
            h.raw.pop_front();
        }
        let sample = window(s, t, Some(&h.raw));
        h.samples.push_back(sample.clone());
        while h.samples.len() > HISTORY {
            h.samples.pop_front();
        }
        sample
    }

    fn detect(&self, h: &mut RoomHistory, s: &RoomSnapshot) {
        let now = Observed {
            epoch: s.epoch,
            version: s.view.version,
            open: s.view.open,
            paused: s.settings.paused,
            closed: s.view.closed,
            capacity: s.settings.capacity,
        };
        let mut events: Vec<(EventType, serde_json::Value)> = Vec::new();
        if let Some(before) = &h.last
            && before.epoch == now.epoch
            && before.version > now.version
        {
            return;
        }
        match &h.last {
            // First sight, or a new incarnation: nothing changed yet.
            Some(before) if before.epoch == now.epoch => {
                if !before.open && now.open {
                    events.push((EventType::RoomOpened, json!({})));
                }
                if before.paused != now.paused {
                    let kind = if now.paused {
                        EventType::RoomPaused
                    } else {
                        EventType::RoomResumed
                    };
                    events.push((kind, json!({})));
                }
                if before.capacity != now.capacity {
                    events.push((
                        EventType::RoomCapacityChanged,
                        json!({ "previous_capacity": before.capacity }),
                    ));
                }
                if !before.closed && now.closed {
                    events.push((EventType::RoomClosed, json!({})));
                }
            }
            _ => {}
        }
        h.last = Some(now);
        for (kind, extra) in events {
            self.webhooks
                .send(&event(kind, s, extra, self.now_ms()), None);
        }
        for (target, threshold) in self.webhooks.thresholds() {
            let above = h.above.entry(target).or_insert(false);
            let waiting = s.view.waiting;
            if !*above && waiting > threshold {
                *above = true;
                let e = event(
                    EventType::QueueThreshold,
                    s,
                    json!({ "threshold": threshold }),
                    self.now_ms(),
                );
                self.webhooks.send(&e, Some(target));
            } else if *above && waiting <= threshold.saturating_mul(9) / 10 {
                *above = false;
            }
        }
    }
}

fn event(kind: EventType, s: &RoomSnapshot, extra: serde_json::Value, now_ms: u64) -> WebhookEvent {
    let mut data = json!({
        "capacity": s.settings.capacity,
        "waiting": s.view.waiting,
        "admitted": s.ledger.admitted,
        "paused": s.settings.paused,
        "open": s.view.open,
        "closed": s.view.closed,
        "mode": s.settings.mode,
        "stock": s.settings.stock,
    });
    if let (Some(d), Some(extra)) = (data.as_object_mut(), extra.as_object()) {
        d.extend(extra.clone());
    }
    let mut id = [0u8; 16];
    rand::fill(&mut id);
    WebhookEvent {
        id: hex::encode(id),
        kind,
        room: s.settings.id.to_string(),
        timestamp: Timestamp(now_ms).to_string(),
        data,
    }
}

/// The figures over the last minute, from the oldest raw point in it.
fn window(s: &RoomSnapshot, t: u64, raw: Option<&VecDeque<Raw>>) -> Sample {
    let oldest = raw.and_then(|r| r.iter().find(|p| p.t + WINDOW_MS >= t));
    let (admit_rate, waits) = match oldest {
        Some(o) if t > o.t => {
            // Right after start-up the window is short: at least a second,
            // so three quick admissions do not read as a hundred a second.
            let secs = ((t - o.t) as f64 / 1000.0).max(1.0);
            let rate = s.stats.admissions.saturating_sub(o.admissions) as f64 / secs;
            let mut delta = s.stats.waits.clone();
            for (now, then) in delta.counts.iter_mut().zip(o.waits.counts) {
                *now = now.saturating_sub(then);
            }
            delta.sum_ms = delta.sum_ms.saturating_sub(o.waits.sum_ms);
            (rate, delta)
        }
        _ => (0.0, WaitSnapshot::default()),
    };
    Sample {
        t,
        waiting: s.view.waiting,
        admitted: s.ledger.admitted,
        capacity: u64::from(s.settings.capacity),
        admit_rate: (admit_rate * 100.0).round() / 100.0,
        wait_p50_ms: quantile(&waits, 0.5),
        wait_p95_ms: quantile(&waits, 0.95),
    }
}

/// The longest finite wait bucket: a quantile in the open-ended bucket
/// above it is shown as this ("an hour or more") rather than as u64::MAX.
const WAIT_CAP_MS: u64 = 3_600_000;

/// A wait quantile (bucket upper bound, ms), capped for display.
pub(crate) fn quantile(w: &WaitSnapshot, q: f64) -> Option<u64> {
    w.quantile_ms(q).map(|v| v.min(WAIT_CAP_MS))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::backend::embedded::EmbeddedBackend;
    use crate::engine::{RoomSettings, SystemClock};

    async fn snapshot() -> RoomSnapshot {
        let id = RoomId::new("sale").expect("valid");
        let backend = EmbeddedBackend::without_workers(
            vec![RoomSettings::new(id.clone())],
            Arc::new(SystemClock),
        );
        backend.room(&id).await.expect("the room")
    }

    #[tokio::test]
    async fn figures_are_differences_over_the_last_minute() {
        let mut s = snapshot().await;
        let mut then = s.stats.waits.clone();
        then.counts[0] = 10; // ten waits under 100 ms, a minute ago or more
        s.stats.waits = then.clone();
        s.stats.waits.counts[0] = 10;
        s.stats.waits.counts[4] = 30; // thirty 2-5 s waits since
        s.stats.admissions = 100;
        let raw: VecDeque<Raw> = [
            Raw {
                t: 0,
                admissions: 0,
                waits: WaitSnapshot::default(),
            },
            Raw {
                t: 30_000,
                admissions: 40,
                waits: then,
            },
        ]
        .into();
        // At 90 s the first point is out of the window: 60 in 60 s.
        let w = window(&s, 90_000, Some(&raw));
        assert_eq!(w.admit_rate, 1.0);
        assert_eq!(w.wait_p50_ms, Some(5_000));
        assert_eq!(w.wait_p95_ms, Some(5_000));
        // Right after start, a short window counts as at least a second.
        let recent: VecDeque<Raw> = raw.iter().skip(1).cloned().collect();
        let w = window(&s, 30_100, Some(&recent));
        assert_eq!(w.admit_rate, 60.0);
        let empty = window(&s, 1, None);
        assert_eq!((empty.admit_rate, empty.wait_p50_ms), (0.0, None));
    }

    #[test]
    fn open_ended_waits_are_capped_for_display() {
        let mut w = WaitSnapshot::default();
        w.counts[w.counts.len() - 1] = 1;
        assert_eq!(quantile(&w, 0.5), Some(WAIT_CAP_MS));
    }
}
