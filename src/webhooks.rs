//! Webhooks: room events POSTed as signed JSON to the URLs in `[[webhooks]]`.
//!
//! Events (`room.opened`, `room.paused`, `room.resumed`,
//! `room.capacity_changed`, `room.closed`, `queue.threshold`) are decided by
//! the monitor (`crate::monitor`) and handed to [`Webhooks::send`], which
//! only puts them on a bounded queue: nothing on the admission path ever
//! waits for a receiver. A background task takes deliveries off the queue
//! and runs each one in its own task (a few at a time), retrying with
//! exponential backoff. A full queue drops the delivery; drops, retries
//! and give-ups are logged and counted in `/metrics`.
//!
//! Each body is signed with the receiver's own secret:
//! `X-Narabu-Signature: sha256=<hex HMAC-SHA256 of the exact body>`. The
//! body carries its event id and time, so a receiver can refuse replays.
//! Logs name a receiver by scheme and host only, since a webhook URL's path
//! or query is often a credential itself.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::config::WebhookConfig;
use crate::metrics::Metrics;

/// Deliveries waiting to be sent; past this, new ones are dropped.
const QUEUE: usize = 1024;
/// Deliveries in flight at once, over all receivers.
const IN_FLIGHT: usize = 16;
/// Tries per delivery, the first included.
pub const MAX_ATTEMPTS: u32 = 6;
/// The wait before the first retry; it doubles each time (0.25 s … 8 s).
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

pub const SIGNATURE_HEADER: &str = "x-narabu-signature";

/// One room event, as receivers get it.
#[derive(Clone, Debug, Serialize)]
pub struct WebhookEvent {
    /// Unique per event (the same for every receiver and every retry).
    pub id: String,
    pub event: &'static str,
    pub room: String,
    /// RFC 3339.
    pub at: String,
    /// What the room looked like (capacity, waiting, admitted, paused…).
    pub data: serde_json::Value,
}

struct Delivery {
    target: usize,
    event: &'static str,
    id: String,
    body: Arc<Vec<u8>>,
}

/// The sending side; cheap to share.
pub struct Webhooks {
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

/// The HMAC-SHA256 signature header value for a body.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
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
    pub fn start(
        targets: Vec<WebhookConfig>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let targets = Arc::new(targets);
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
    pub fn thresholds(&self) -> Vec<(usize, u64)> {
        self.targets
            .iter()
            .enumerate()
            .filter(|(_, t)| wants(t, "queue.threshold"))
            .filter_map(|(i, t)| t.queue_threshold.map(|n| (i, n)))
            .collect()
    }

    /// Queue an event for every receiver that wants it (`only`: just that
    /// receiver). Never waits.
    pub fn send(&self, event: &WebhookEvent, only: Option<usize>) {
        let Some(tx) = &self.tx else { return };
        let body = match serde_json::to_vec(event) {
            Ok(b) => Arc::new(b),
            Err(_) => return,
        };
        for (i, target) in self.targets.iter().enumerate() {
            if only.is_some_and(|o| o != i) || !wants(target, event.event) {
                continue;
            }
            let delivery = Delivery {
                target: i,
                event: event.event,
                id: event.id.clone(),
                body: body.clone(),
            };
            if tx.try_send(delivery).is_err() {
                self.metrics.webhook_delivery("dropped");
                tracing::warn!(
                    receiver = %redacted(&target.url),
                    event = event.event,
                    "webhook queue full: delivery dropped"
                );
            }
        }
    }
}

fn wants(target: &WebhookConfig, event: &str) -> bool {
    target.events.is_empty() || target.events.iter().any(|e| e == event)
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
    let sig = signature(target.secret.expose().as_bytes(), &d.body);
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=MAX_ATTEMPTS {
        let result = client
            .post(&target.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, &sig)
            .header("x-narabu-event", d.event)
            .header("x-narabu-delivery", &d.id)
            .body(d.body.as_ref().clone())
            .send()
            .await;
        let (retry, problem) = match result {
            Ok(r) if r.status().is_success() => {
                metrics.webhook_delivery("delivered");
                tracing::debug!(receiver = %redacted(&target.url), event = d.event, attempt, "webhook delivered");
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
            event = d.event,
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
    tracing::error!(receiver = %redacted(&target.url), event = d.event, "webhook given up");
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

    #[test]
    fn signature_is_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
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
