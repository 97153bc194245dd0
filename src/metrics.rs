//! Prometheus metrics for `GET /metrics`, every name starting `narabu_`.
//!
//! Two kinds of figures end up on one page. Those the service counts as it
//! goes (HTTP requests and their latency by matched route and status,
//! webhook deliveries) live in a `prometheus-client` registry here. The
//! rooms' figures already live in the backend (the engine's atomics, or
//! Redis), so they are read at scrape time from [`RoomSnapshot`]s and
//! encoded by a short-lived collector: there is one source of truth, and
//! the counters on this page are the same numbers the admin API shows.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::backend::RoomSnapshot;
use crate::engine::WAIT_BUCKETS_MS;
use crate::engine::rules::Mode;

/// The Content-Type of what [`Metrics::render`] writes (OpenMetrics text,
/// which Prometheus reads natively).
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Static strings, so counting a request allocates nothing: the methods
/// are a fixed set and routes are interned ([`Metrics::route_label`]).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct HttpLabels {
    pub method: &'static str,
    /// The route as declared (`/api/rooms/:room/join`), never the raw path,
    /// so room names and probes cannot blow up the label space.
    pub route: &'static str,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WebhookLabels {
    /// `delivered`, `failed` (gave up after retries) or `dropped` (the
    /// delivery queue was full).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PushLabels {
    /// `sent`, `gone` (the browser dropped the subscription), `failed`
    /// (refused, or given up after retries) or `dropped` (the send queue
    /// was full).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RoomLabels {
    pub room: String,
}

/// A refused access check: the room and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusalLabels {
    pub room: String,
    pub reason: &'static str,
}

/// A room's traffic rule and what it did.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RuleLabels {
    pub room: String,
    pub rule: String,
    pub action: &'static str,
}

/// A change autotune made to a room, and why (`errors`, `slow`,
/// `headroom`, `bounds`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TuneLabels {
    pub room: String,
    pub verdict: &'static str,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// What autotune last read and chose for a room (`crate::autotune`).
#[derive(Debug, Default)]
struct Autotune {
    latency: Family<RoomLabels, FloatGauge>,
    error_ratio: Family<RoomLabels, FloatGauge>,
    rate: Family<RoomLabels, Gauge>,
    changes: Family<TuneLabels, Counter>,
}

/// The counters the service keeps itself.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Family<HttpLabels, Histogram>,
    webhook_deliveries: Family<WebhookLabels, Counter>,
    webhook_attempt_failures: Counter,
    push_messages: Family<PushLabels, Counter>,
    push_attempt_failures: Counter,
    challenges_issued: Family<RoomLabels, Counter>,
    challenges_solved: Family<RoomLabels, Counter>,
    challenges_refused: Family<RefusalLabels, Counter>,
    enqueue_accepted: Family<RoomLabels, Counter>,
    enqueue_refused: Family<RefusalLabels, Counter>,
    line_resets: Family<RoomLabels, Counter>,
    /// Refused joins by room and reason, for the sale's report (which
    /// reads them back; the Prometheus families above only count).
    refused_joins: std::sync::Mutex<std::collections::BTreeMap<(String, String), u64>>,
    rule_matches: Family<RuleLabels, Counter>,
    autotune: Autotune,
    /// axum's matched path (`/gate/{room}`) to its label (`/gate/:room`).
    /// Keys are the router's declared routes, a fixed set, so the leaked
    /// labels are bounded; a hit takes a read lock and no allocation.
    routes: RwLock<HashMap<Box<str>, &'static str>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("narabu");
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by matched route and status",
            http_requests.clone(),
        );
        let http_duration = Family::<HttpLabels, Histogram>::new_with_constructor(|| {
            // 100 µs to ~13 s: gate checks sit at the bottom, slow
            // backends at the top.
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.0001, 4.0, 9,
            ))
        });
        registry.register_with_unit(
            "http_request_duration",
            "Time to the response head (for event streams: to the stream's start)",
            Unit::Seconds,
            http_duration.clone(),
        );
        let webhook_deliveries = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Webhook deliveries by outcome",
            webhook_deliveries.clone(),
        );
        let webhook_attempt_failures = Counter::default();
        registry.register(
            "webhook_attempt_failures",
            "Webhook attempts that failed (each retry counts)",
            webhook_attempt_failures.clone(),
        );
        let push_messages = Family::<PushLabels, Counter>::default();
        registry.register(
            "push_messages",
            "Web Push messages by outcome (sent, gone, failed, dropped)",
            push_messages.clone(),
        );
        let push_attempt_failures = Counter::default();
        registry.register(
            "push_attempt_failures",
            "Web Push attempts that failed (each retry counts)",
            push_attempt_failures.clone(),
        );
        fn family<L>(registry: &mut Registry, name: &str, help: &str) -> Family<L, Counter>
        where
            L: Clone
                + std::hash::Hash
                + Eq
                + EncodeLabelSet
                + std::fmt::Debug
                + Send
                + Sync
                + 'static,
        {
            let family = Family::<L, Counter>::default();
            registry.register(name, help, family.clone());
            family
        }
        let challenges_issued = family(
            &mut registry,
            "challenges_issued",
            "Proof-of-work challenges handed out, by room",
        );
        let challenges_solved = family(
            &mut registry,
            "challenges_solved",
            "Proof-of-work solutions accepted (each admits one join), by room",
        );
        let challenges_refused = family(
            &mut registry,
            "challenges_refused",
            "Joins refused for their proof of work, by room and reason (missing, malformed, forged, other_room, expired, too_easy, wrong, spent)",
        );
        let enqueue_accepted = family(
            &mut registry,
            "enqueue_tokens_accepted",
            "Enqueue tokens accepted, by room",
        );
        let enqueue_refused = family(
            &mut registry,
            "enqueue_tokens_refused",
            "Enqueue tokens refused, by room and reason (missing, malformed, algorithm, bad_signature, expired, not_yet_valid, wrong_room, missing_claim, bad_claim)",
        );
        let line_resets = family(
            &mut registry,
            "line_resets",
            "Lines found lost in the state store (a Redis restart without persistence, a flushed database) and started again, by room; counted by the instance that started it again",
        );
        let rule_matches = family(
            &mut registry,
            "rule_matches",
            "Gate checks a room's traffic rule decided, by room, rule (its name, or its index) and action",
        );
        let autotune = Autotune::default();
        registry.register_with_unit(
            "autotune_latency",
            "The origin's latency at the autotune quantile, as the room's tuner last read it, by room (on the instance that tunes it)",
            Unit::Seconds,
            autotune.latency.clone(),
        );
        registry.register(
            "autotune_error_ratio",
            "The origin's share of failed requests as the room's tuner last read it, by room",
            autotune.error_ratio.clone(),
        );
        registry.register(
            "autotune_rate",
            "The admission rate a minute autotune last chose, by room",
            autotune.rate.clone(),
        );
        registry.register(
            "autotune_changes",
            "Changes autotune made to a room's rate, by room and verdict (errors, slow, headroom, bounds)",
            autotune.changes.clone(),
        );
        Self {
            registry,
            autotune,
            refused_joins: Default::default(),
            line_resets,
            rule_matches,
            challenges_issued,
            challenges_solved,
            challenges_refused,
            enqueue_accepted,
            enqueue_refused,
            http_requests,
            http_duration,
            webhook_deliveries,
            webhook_attempt_failures,
            push_messages,
            push_attempt_failures,
            routes: RwLock::default(),
        }
    }

    /// The label for a route as axum declares it: `/gate/:room` rather
    /// than `/gate/{room}`, since braces are legal in a label value but
    /// some Prometheus text parsers drop such lines. Only pass declared
    /// routes (axum's `MatchedPath`), never raw paths: each new one is
    /// kept for the life of the process.
    pub(crate) fn route_label(&self, matched: &str) -> &'static str {
        let read = self.routes.read().unwrap_or_else(|e| e.into_inner());
        if let Some(label) = read.get(matched) {
            return label;
        }
        drop(read);
        let mut write = self.routes.write().unwrap_or_else(|e| e.into_inner());
        write.entry(matched.into()).or_insert_with(|| {
            Box::leak(matched.replace('{', ":").replace('}', "").into_boxed_str())
        })
    }

    pub(crate) fn observe_http(&self, labels: HttpLabels, took: Duration) {
        self.http_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        self.http_requests.get_or_create(&labels).inc();
    }

    /// The counter and the latency histogram of one label set, to keep:
    /// counting through them skips the label lookup (the gate counts every
    /// check this way).
    pub(crate) fn http_handles(&self, labels: HttpLabels) -> (Counter, Histogram) {
        (
            self.http_requests.get_or_create(&labels).clone(),
            self.http_duration.get_or_create(&labels).clone(),
        )
    }

    /// What a room's tuner read and the rate it keeps.
    pub(crate) fn autotune_read(
        &self,
        room: &str,
        latency_ms: Option<f64>,
        errors: Option<f64>,
        rate: u32,
    ) {
        let labels = RoomLabels {
            room: room.to_owned(),
        };
        if let Some(ms) = latency_ms {
            self.autotune
                .latency
                .get_or_create(&labels)
                .set(ms / 1000.0);
        }
        if let Some(e) = errors {
            self.autotune.error_ratio.get_or_create(&labels).set(e);
        }
        self.autotune
            .rate
            .get_or_create(&labels)
            .set(i64::from(rate));
    }

    /// A change autotune made.
    pub(crate) fn autotune_changed(&self, room: &str, verdict: &'static str) {
        self.autotune
            .changes
            .get_or_create(&TuneLabels {
                room: room.to_owned(),
                verdict,
            })
            .inc();
    }

    /// A room this instance no longer tunes: its gauges go, so a stale
    /// reading is not taken for a live one.
    pub(crate) fn autotune_stopped(&self, room: &str) {
        let labels = RoomLabels {
            room: room.to_owned(),
        };
        self.autotune.latency.remove(&labels);
        self.autotune.error_ratio.remove(&labels);
        self.autotune.rate.remove(&labels);
    }

    pub(crate) fn webhook_delivery(&self, result: &'static str) {
        self.webhook_deliveries
            .get_or_create(&WebhookLabels { result })
            .inc();
    }

    pub(crate) fn webhook_attempt_failed(&self) {
        self.webhook_attempt_failures.inc();
    }

    pub(crate) fn push_message(&self, result: &'static str) {
        self.push_messages
            .get_or_create(&PushLabels { result })
            .inc();
    }

    /// Push messages so far with this outcome, for the admin API.
    pub fn push_messages(&self, result: &'static str) -> u64 {
        self.push_messages
            .get_or_create(&PushLabels { result })
            .get()
    }

    pub(crate) fn push_attempt_failed(&self) {
        self.push_attempt_failures.inc();
    }

    fn room_count(family: &Family<RoomLabels, Counter>, room: &str) {
        family
            .get_or_create(&RoomLabels {
                room: room.to_owned(),
            })
            .inc();
    }

    /// A join refused, for the sale's report: `reason` is the error code
    /// the visitor got (`challenge_required`, `enqueue_token_invalid`,
    /// `too_many_joins`, …) or, for a refused proof or token, its reason.
    pub(crate) fn join_refused(&self, room: &str, reason: &str) {
        *crate::locks::lock(&self.refused_joins)
            .entry((room.to_owned(), reason.to_owned()))
            .or_default() += 1;
    }

    /// This instance's refused joins of `room`, by reason.
    pub(crate) fn joins_refused(&self, room: &str) -> Vec<(String, u64)> {
        crate::locks::lock(&self.refused_joins)
            .iter()
            .filter(|((r, _), _)| r == room)
            .map(|((_, reason), &n)| (reason.clone(), n))
            .collect()
    }

    fn refusal_count(family: &Family<RefusalLabels, Counter>, room: &str, reason: &'static str) {
        family
            .get_or_create(&RefusalLabels {
                room: room.to_owned(),
                reason,
            })
            .inc();
    }

    pub(crate) fn challenge_issued(&self, room: &str) {
        Self::room_count(&self.challenges_issued, room);
    }

    pub(crate) fn challenge_solved(&self, room: &str) {
        Self::room_count(&self.challenges_solved, room);
    }

    /// A join refused for its proof of work (`missing` when it had none).
    pub(crate) fn challenge_refused(&self, room: &str, reason: &'static str) {
        self.join_refused(room, &format!("proof of work: {reason}"));
        Self::refusal_count(&self.challenges_refused, room, reason);
    }

    pub(crate) fn enqueue_accepted(&self, room: &str) {
        Self::room_count(&self.enqueue_accepted, room);
    }

    pub(crate) fn enqueue_refused(&self, room: &str, reason: &'static str) {
        self.join_refused(room, &format!("enqueue token: {reason}"));
        Self::refusal_count(&self.enqueue_refused, room, reason);
    }

    /// A room's line was found lost and started again.
    /// A rule's counter, for the rule book to keep with the rule: a match
    /// is then one atomic add.
    pub(crate) fn rule_matches(&self, room: &str, rule: &str, action: &'static str) -> Counter {
        self.rule_matches
            .get_or_create(&RuleLabels {
                room: room.to_owned(),
                rule: rule.to_owned(),
                action,
            })
            .clone()
    }

    pub(crate) fn line_reset(&self, room: &str) {
        Self::room_count(&self.line_resets, room);
    }

    /// The whole page: the service's own counters, then every room's.
    pub fn render(&self, rooms: Vec<RoomSnapshot>) -> String {
        self.render_with(rooms, |_| 0)
    }

    /// [`Self::render`], with each room's calls dropped before the push
    /// sender took them (the backend counts those).
    pub(crate) fn render_with(
        &self,
        rooms: Vec<RoomSnapshot>,
        calls_dropped: impl Fn(&crate::engine::RoomId) -> u64,
    ) -> String {
        let mut out = String::new();
        let mut room_registry = Registry::with_prefix("narabu");
        let dropped = rooms
            .iter()
            .map(|s| calls_dropped(&s.settings.id))
            .collect();
        room_registry.register_collector(Box::new(RoomCollector(rooms, dropped)));
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry);
        let _ = prometheus_client::encoding::text::encode_registry(&mut out, &room_registry);
        let _ = prometheus_client::encoding::text::encode_eof(&mut out);
        out
    }
}

/// The rooms as they were when the scrape began, and each one's push
/// calls dropped, in the same order.
#[derive(Debug)]
struct RoomCollector(Vec<RoomSnapshot>, Vec<u64>);

type RoomLabel = [(&'static str, String); 1];

fn label(s: &RoomSnapshot) -> RoomLabel {
    [("room", s.settings.id.to_string())]
}

/// The engine's wait histogram, in the shape Prometheus wants (seconds).
struct WaitHistogram<'a>(&'a crate::engine::WaitSnapshot);

impl std::fmt::Debug for WaitHistogram<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WaitHistogram")
    }
}

impl EncodeMetric for WaitHistogram<'_> {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        let buckets: Vec<(f64, u64)> = WAIT_BUCKETS_MS
            .iter()
            .zip(self.0.counts)
            .map(|(&bound, count)| {
                let le = if bound == u64::MAX {
                    f64::MAX
                } else {
                    bound as f64 / 1000.0
                };
                (le, count)
            })
            .collect();
        encoder.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            self.0.sum_ms as f64 / 1000.0,
            self.0.total(),
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl Collector for RoomCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        type Get = fn(&RoomSnapshot) -> u64;
        let gauges: [(&str, &str, Get); 5] = [
            ("room_waiting", "Tickets waiting in line", |s| {
                s.view.waiting
            }),
            ("room_admitted", "Visitors holding a permit", |s| {
                s.ledger.admitted
            }),
            ("room_capacity", "Visitors the room admits at once", |s| {
                s.ledger.capacity
            }),
            ("room_tray", "Permits on the tray", |s| s.ledger.tray),
            (
                "room_paused",
                "1 while an operator has paused admission",
                |s| u64::from(s.settings.paused),
            ),
        ];
        for (name, help, get) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &self.0 {
                let value = i64::try_from(get(s)).unwrap_or(i64::MAX);
                ConstGauge::new(value).encode(family.encode_family(&label(s))?)?;
            }
        }
        // One series per mode, 1 for the room's own: the usual shape of an
        // enum in Prometheus, so `narabu_room_mode{mode="sold_out"} == 1`
        // is an alert rule.
        let mut family = encoder.encode_descriptor(
            "room_mode",
            "1 for the mode the room is in (queue, passthrough, maintenance, sold_out)",
            None,
            MetricType::Gauge,
        )?;
        for s in &self.0 {
            for mode in Mode::ALL {
                let labels = [
                    ("room", s.settings.id.to_string()),
                    ("mode", mode.name().to_owned()),
                ];
                ConstGauge::new(i64::from(s.settings.mode == mode))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        // Per priority lane, for rooms with lanes: is each lane getting
        // its share, and how long is it?
        type LaneGet = fn(&crate::engine::LaneView) -> u64;
        let lane_gauges: [(&str, &str, LaneGet); 2] = [
            (
                "room_lane_waiting",
                "Tickets waiting in a priority lane",
                |l| l.waiting,
            ),
            (
                "room_lane_admitted",
                "Permits a priority lane's visitors hold",
                |l| l.admitted,
            ),
        ];
        for (name, help, get) in lane_gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &self.0 {
                for lane in &s.view.lanes {
                    let labels = [
                        ("room", s.settings.id.to_string()),
                        ("lane", lane.name.clone()),
                    ];
                    let value = i64::try_from(get(lane)).unwrap_or(i64::MAX);
                    ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "room_stock",
            "Units left to sell, for rooms that count stock",
            None,
            MetricType::Gauge,
        )?;
        for s in &self.0 {
            if let Some(stock) = s.settings.stock {
                let value = i64::try_from(stock).unwrap_or(i64::MAX);
                ConstGauge::new(value).encode(family.encode_family(&label(s))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "room_push_subscriptions",
            "Waiting visitors who asked to be called back by Web Push",
            None,
            MetricType::Gauge,
        )?;
        for s in &self.0 {
            let value = i64::try_from(s.subscriptions).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(family.encode_family(&label(s))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "room_push_calls_dropped",
            "Push calls to visitors (N ahead, your turn) dropped before the sender took them: the hand-off queue was full",
            None,
            MetricType::Counter,
        )?;
        for (s, &dropped) in self.0.iter().zip(&self.1) {
            ConstCounter::new(dropped).encode(family.encode_family(&label(s))?)?;
        }
        let counters: [(&str, &str, Get); 9] = [
            ("room_joins", "Tickets issued", |s| s.stats.joins),
            (
                "room_admissions",
                "Tickets admitted (by the worker or by hand-off)",
                |s| s.stats.admissions,
            ),
            (
                "room_releases",
                "Permits given back by visitors or the origin",
                |s| s.stats.releases,
            ),
            ("room_leaves", "Waiting tickets that left the line", |s| {
                s.stats.leaves
            }),
            ("room_revocations", "Tickets revoked by operators", |s| {
                s.stats.revocations
            }),
            (
                "room_expirations",
                "Permits taken back from stalled visitors",
                |s| s.stats.expirations,
            ),
            (
                "room_abandonments",
                "Waiting tickets skipped for going quiet",
                |s| s.stats.abandonments,
            ),
            (
                "room_away_skips",
                "Tickets passed by at the head while their visitor was away",
                |s| s.stats.skips,
            ),
            (
                "room_away_returns",
                "Away tickets whose visitor came back in time",
                |s| s.stats.returns,
            ),
        ];
        for (name, help, get) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &self.0 {
                ConstCounter::new(get(s)).encode(family.encode_family(&label(s))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "room_wait",
            "Wait from join to admission",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for s in &self.0 {
            WaitHistogram(&s.stats.waits).encode(family.encode_family(&label(s))?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_figures_are_named_and_labelled() {
        let m = Metrics::new();
        m.observe_http(
            HttpLabels {
                method: "GET",
                route: m.route_label("/gate/{room}"),
                status: 204,
            },
            Duration::from_micros(300),
        );
        m.webhook_delivery("dropped");
        let text = m.render(Vec::new());
        assert!(
            text.contains(
                r#"narabu_http_requests_total{method="GET",route="/gate/:room",status="204"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains("narabu_http_request_duration_seconds_bucket{"));
        assert!(text.contains(r#"narabu_webhook_deliveries_total{result="dropped"} 1"#));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn route_labels_are_interned() {
        let m = Metrics::new();
        let a = m.route_label("/api/rooms/{room}/join");
        assert_eq!(a, "/api/rooms/:room/join");
        assert!(std::ptr::eq(a, m.route_label("/api/rooms/{room}/join")));
    }
}
