//! Webhooks: room events POSTed as signed JSON to the URLs in `[[webhooks]]`.
//!
//! The events there are form one list, [`EventType`]; the monitor
//! (`crate::monitor`) decides when each happens and hands it to
//! [`Webhooks::send`], which only puts it on a bounded queue: nothing on the
//! admission path ever waits for a receiver. A background task takes
//! deliveries off the queue and runs each one in its own task (a few at a
//! time), retrying with exponential backoff. A full queue drops the
//! delivery; drops, retries and give-ups are logged and counted in
//! `/metrics`.
//!
//! Deliveries follow the Standard Webhooks specification ([`signing`]): the
//! body is `{"type", "timestamp", "id", "room", "data"}`, and each attempt
//! is signed with the receiver's own secret in the `webhook-id`,
//! `webhook-timestamp` and `webhook-signature` headers, so a receiver checks
//! it with a published library and refuses replays by id and time.
//! Logs name a receiver by scheme and host only, since a webhook URL's path
//! or query is often a credential itself.

pub mod signing;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::secret::RedactedUrl;
use signing::SigningKey;

/// Deliveries waiting to be sent; past this, new ones are dropped.
const QUEUE: usize = 1024;
/// Deliveries in flight at once, over all receivers.
const IN_FLIGHT: usize = 16;
/// Tries per delivery, the first included.
pub(crate) const MAX_ATTEMPTS: u32 = 6;
/// The wait before the first retry; it doubles each time (0.25 s … 8 s).
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// One webhook receiver.
#[derive(Clone)]
pub struct WebhookConfig {
    pub url: String,
    /// Signs each delivery (Standard Webhooks) so the receiver can check
    /// where it came from.
    pub secret: SigningKey,
    /// The secret before a rotation: deliveries are signed with both while
    /// the receiver moves to the new one.
    pub previous_secret: Option<SigningKey>,
    /// The events to send; empty means every event.
    pub events: Vec<EventType>,
    /// Also notify when a room's queue grows past this many waiting.
    pub queue_threshold: Option<u64>,
}

impl fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("url", &RedactedUrl(&self.url))
            .field("secret", &self.secret)
            .field("previous_secret", &self.previous_secret)
            .field("events", &self.events)
            .field("queue_threshold", &self.queue_threshold)
            .finish()
    }
}

/// Declares the event types once: the enum, its wire names and the list a
/// configuration's `events` is checked against. A new event is one line
/// here, plus the place that decides when it happens.
macro_rules! event_types {
    ($($(#[$doc:meta])* $variant:ident => $name:literal,)*) => {
        /// A kind of room event, named on the wire by [`EventType::name`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum EventType {
            $($(#[$doc])* $variant,)*
        }

        impl EventType {
            /// Every event type, in the order docs/operating.md lists them.
            pub(crate) const ALL: &[EventType] = &[$(EventType::$variant,)*];

            /// The `type` receivers see, such as `room.paused`.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(EventType::$variant => $name,)*
                }
            }
        }
    };
}

event_types! {
    /// A scheduled room opened: its pre-queue was drawn and admission began.
    RoomOpened => "room.opened",
    /// An operator paused admission.
    RoomPaused => "room.paused",
    /// An operator resumed admission.
    RoomResumed => "room.resumed",
    /// An operator changed the capacity (`data.previous_capacity` says from what).
    RoomCapacityChanged => "room.capacity_changed",
    /// The room was closed (deleted).
    RoomClosed => "room.closed",
    /// The room's mode changed (`data.mode`, `data.previous_mode`), by an
    /// operator or because its stock ran out.
    RoomModeChanged => "room.mode_changed",
    /// The room became sold out (`data.reason`: `stock` when a reported
    /// purchase took the last unit, `operator` for a change of mode).
    RoomSoldOut => "room.sold_out",
    /// The room's line was found lost in the state store (a Redis restart
    /// without persistence, a flushed database) and started again: every
    /// ticket of the old line is void (`data.epoch` names the new line).
    RoomReset => "room.reset",
    /// Autotune changed the room's admission rate (`data.rate`,
    /// `data.previous_rate`, a minute; `data.verdict` says why, `data.signal`
    /// what it read; `data.capacity` when it moved the capacity too).
    RoomAutotuned => "room.autotuned",
    /// The queue grew past a receiver's `queue_threshold` (sent to that
    /// receiver only; `data.threshold` says which).
    QueueThreshold => "queue.threshold",
}

impl EventType {
    /// The event type with this wire name.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|e| e.name() == name)
    }

    /// Every wire name, comma-separated, for error messages.
    pub(crate) fn names() -> String {
        Self::ALL
            .iter()
            .map(|e| e.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One room event, the same for every receiver and every retry.
#[derive(Clone, Debug)]
pub(crate) struct WebhookEvent {
    /// Unique per event: the `webhook-id` receivers deduplicate by.
    pub id: String,
    pub kind: EventType,
    pub room: String,
    /// When it happened, RFC 3339 (each attempt's own time is in
    /// `webhook-timestamp`).
    pub timestamp: String,
    /// What the room looked like (capacity, waiting, admitted, paused…).
    pub data: serde_json::Value,
}

/// The body as receivers get it: the payload layout Standard Webhooks
/// recommends (`type`, `timestamp`, `data`), with the event id and room
/// beside them.
#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    timestamp: &'a str,
    id: &'a str,
    room: &'a str,
    data: &'a serde_json::Value,
    /// The names `type` and `timestamp` had before, sent only to receivers
    /// with a plain (pre-standard) secret, which may still read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    event: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<&'a str>,
}

impl WebhookEvent {
    /// The exact bytes sent and signed.
    pub(crate) fn body(&self, legacy: bool) -> Bytes {
        let body = Body {
            kind: self.kind.name(),
            timestamp: &self.timestamp,
            id: &self.id,
            room: &self.room,
            data: &self.data,
            event: legacy.then(|| self.kind.name()),
            at: legacy.then_some(self.timestamp.as_str()),
        };
        // A struct of strings and a JSON value always serializes.
        Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
    }
}

struct Delivery {
    target: usize,
    kind: EventType,
    id: String,
    body: Bytes,
}

/// The sending side; cheap to share.
pub(crate) struct Webhooks {
    targets: Arc<Vec<WebhookConfig>>,
    tx: Option<mpsc::Sender<Delivery>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks")
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

/// Scheme and host of a URL, for logs.
fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!("{}://{}", u.scheme(), u.host_str().unwrap_or("?")),
        Err(_) => "[unparsable url]".to_owned(),
    }
}

impl Webhooks {
    /// Starts the delivery task (when any receiver is configured). It ends
    /// on `shutdown`; deliveries still retrying then are abandoned.
    pub(crate) fn start(
        targets: Vec<WebhookConfig>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let targets = Arc::new(targets);
        for target in targets.iter().filter(|t| t.secret.is_legacy()) {
            tracing::warn!(
                receiver = %redacted(&target.url),
                "webhook secret is a plain string, not a Standard Webhooks `whsec_` secret: \
                 deliveries also carry the old X-Narabu-Signature header; move the receiver \
                 to a Standard Webhooks library, then configure the secret as whsec_ and \
                 its base64 (docs/operating.md, Webhooks)"
            );
        }
        if targets.is_empty() {
            return Arc::new(Self {
                targets,
                tx: None,
                metrics,
            });
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let client = reqwest::Client::builder()
            .timeout(ATTEMPT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("narabu/", env!("CARGO_PKG_VERSION")))
            .build();
        match client {
            Ok(client) => {
                tokio::spawn(dispatch(
                    rx,
                    client,
                    targets.clone(),
                    metrics.clone(),
                    shutdown,
                ));
            }
            Err(e) => tracing::error!(error = %e, "webhooks are off: cannot build an HTTP client"),
        }
        Arc::new(Self {
            targets,
            tx: Some(tx),
            metrics,
        })
    }

    /// Webhooks that want `queue.threshold` events, with their threshold.
    pub(crate) fn thresholds(&self) -> Vec<(usize, u64)> {
        self.targets
            .iter()
            .enumerate()
            .filter(|(_, t)| wants(t, EventType::QueueThreshold))
            .filter_map(|(i, t)| t.queue_threshold.map(|n| (i, n)))
            .collect()
    }

    /// Queue an event for every receiver that wants it (`only`: just that
    /// receiver). Never waits.
    pub(crate) fn send(&self, event: &WebhookEvent, only: Option<usize>) {
        let Some(tx) = &self.tx else { return };
        // Serialized once per body form, however many receivers.
        let mut bodies: [Option<Bytes>; 2] = [None, None];
        for (i, target) in self.targets.iter().enumerate() {
            if only.is_some_and(|o| o != i) || !wants(target, event.kind) {
                continue;
            }
            let legacy = target.secret.is_legacy();
            let body = bodies[usize::from(legacy)].get_or_insert_with(|| event.body(legacy));
            let delivery = Delivery {
                target: i,
                kind: event.kind,
                id: event.id.clone(),
                body: body.clone(),
            };
            if tx.try_send(delivery).is_err() {
                self.metrics.webhook_delivery("dropped");
                tracing::warn!(
                    receiver = %redacted(&target.url),
                    event = event.kind.name(),
                    "webhook queue full: delivery dropped"
                );
            }
        }
    }
}

fn wants(target: &WebhookConfig, kind: EventType) -> bool {
    target.events.is_empty() || target.events.contains(&kind)
}

async fn dispatch(
    mut rx: mpsc::Receiver<Delivery>,
    client: reqwest::Client,
    targets: Arc<Vec<WebhookConfig>>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    loop {
        let delivery = tokio::select! {
            () = shutdown.cancelled() => return,
            d = rx.recv() => match d { Some(d) => d, None => return },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (client, targets, metrics, stop) = (
            client.clone(),
            targets.clone(),
            metrics.clone(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = deliver(&client, &targets[delivery.target], &delivery, &metrics) => {}
            }
            drop(slot);
        });
    }
}

async fn deliver(
    client: &reqwest::Client,
    target: &WebhookConfig,
    d: &Delivery,
    metrics: &Metrics,
) {
    let event = d.kind.name();
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=MAX_ATTEMPTS {
        let result = request(client, target, d).send().await;
        let (retry, problem) = match result {
            Ok(r) if r.status().is_success() => {
                metrics.webhook_delivery("delivered");
                tracing::debug!(receiver = %redacted(&target.url), event, attempt, "webhook delivered");
                return;
            }
            Ok(r) => {
                let s = r.status();
                // A 4xx other than timeout or rate limit will not change
                // by asking again.
                let retry = s.is_server_error() || s.as_u16() == 408 || s.as_u16() == 429;
                (retry, format!("answered {s}"))
            }
            // Without the URL: it may hold a token.
            Err(e) => (true, describe(&e)),
        };
        metrics.webhook_attempt_failed();
        tracing::warn!(
            receiver = %redacted(&target.url),
            event,
            attempt,
            problem,
            "webhook attempt failed"
        );
        if !retry || attempt == MAX_ATTEMPTS {
            break;
        }
        tokio::time::sleep(backoff).await;
        backoff *= 2;
    }
    metrics.webhook_delivery("failed");
    tracing::error!(receiver = %redacted(&target.url), event, "webhook given up");
}

/// One attempt, signed now: each attempt has its own `webhook-timestamp`,
/// so a retry late in the backoff is still within a receiver's tolerance.
fn request(
    client: &reqwest::Client,
    target: &WebhookConfig,
    d: &Delivery,
) -> reqwest::RequestBuilder {
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_secs());
    let keys = std::iter::once(&target.secret).chain(&target.previous_secret);
    let request = client
        .post(&target.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("webhook-id", &d.id)
        .header("webhook-timestamp", timestamp)
        .header(
            "webhook-signature",
            signing::signature_header(keys, &d.id, timestamp, &d.body),
        );
    let request = if target.secret.is_legacy() {
        request
            .header(
                signing::LEGACY_SIGNATURE_HEADER,
                target.secret.legacy_signature(&d.body),
            )
            .header("x-narabu-event", d.kind.name())
            .header("x-narabu-delivery", &d.id)
    } else {
        request
    };
    request.body(d.body.clone())
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "could not connect".into()
    } else {
        "request failed".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> WebhookEvent {
        WebhookEvent {
            id: "0123abcd".into(),
            kind: EventType::RoomPaused,
            room: "sale".into(),
            timestamp: "2026-12-01T10:00:00Z".into(),
            data: serde_json::json!({"paused": true}),
        }
    }

    #[test]
    fn the_body_has_the_standard_layout() {
        let body: serde_json::Value = serde_json::from_slice(&event().body(false)).expect("JSON");
        assert_eq!(
            body,
            serde_json::json!({
                "type": "room.paused",
                "timestamp": "2026-12-01T10:00:00Z",
                "id": "0123abcd",
                "room": "sale",
                "data": {"paused": true},
            })
        );
        // Plain secrets also get the old names, so old receivers still
        // find them.
        let legacy: serde_json::Value = serde_json::from_slice(&event().body(true)).expect("JSON");
        assert_eq!(legacy["type"], "room.paused");
        assert_eq!(legacy["event"], "room.paused");
        assert_eq!(legacy["at"], "2026-12-01T10:00:00Z");
    }

    #[test]
    fn every_event_type_has_one_dotted_name() {
        let names: std::collections::HashSet<&str> =
            EventType::ALL.iter().map(|e| e.name()).collect();
        assert_eq!(names.len(), EventType::ALL.len());
        for e in EventType::ALL {
            assert_eq!(EventType::from_name(e.name()), Some(*e));
            assert!(e.name().contains('.') && !e.name().contains(' '));
        }
        assert_eq!(EventType::from_name("room.pasued"), None);
    }

    #[test]
    fn logs_show_only_scheme_and_host() {
        assert_eq!(
            redacted("https://user:pw@hooks.example.com/t/SECRET?k=v"),
            "https://hooks.example.com"
        );
        assert_eq!(redacted("not a url"), "[unparsable url]");
    }
}
