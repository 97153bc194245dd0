//! Delivery of push messages to the push services browsers name (RFC 8030).
//!
//! [`PushSender::send`] only puts a message on a bounded queue, so the
//! admission path never waits for a push service: a full queue drops the
//! message and counts it. A background task takes messages off the queue
//! and runs a few at a time; each is encrypted there (an ECDH per
//! message), signed with the VAPID key and POSTed, and retried with
//! backoff on 5xx, 429 and network errors, honouring `Retry-After`, for as
//! long as its TTL leaves it worth delivering. A `404` or `410` means the
//! browser has dropped the subscription: the outcome is [`Outcome::Gone`],
//! and the caller forgets the subscription. An endpoint whose host name
//! resolves only to internal addresses (see [`super::resolve`]) is not
//! tried again: the message [`Outcome::Failed`], and the subscription is
//! kept, since only the push service can say a subscription is gone, and
//! a resolver answering wrongly for a while must not lose real visitors'
//! calls (a ticket gets two calls at most, so a hostile one costs two
//! lookups).
//!
//! Outcomes are counted in `/metrics` (`narabu_push_messages_total` by
//! result) and, per message, handed back through a [`Receipt`]. Logs name
//! the push service by origin only: an endpoint's path is a capability.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::ece;
use super::keys::VapidKey;
use super::subscription::Subscription;
use crate::metrics::Metrics;

/// How the sender runs. The defaults suit production; tests shorten the
/// waits and allow a local `http:` push service.
#[derive(Clone, Debug)]
pub struct SenderConfig {
    /// Send to `http:` endpoints and to addresses and `localhost` too.
    /// Only for tests that play the push service locally.
    pub allow_insecure_endpoints: bool,
    /// Messages waiting to be sent; past this, new ones are dropped.
    pub queue: usize,
    /// Requests in flight at once. A message waiting to retry holds no
    /// slot, so a slow push service cannot stall the others.
    pub in_flight: usize,
    /// Tries per message, the first included.
    pub max_attempts: u32,
    /// The wait before the first retry when the push service names none;
    /// it doubles each time, up to `max_backoff`. A `Retry-After` is
    /// honoured as asked, as long as the message's TTL lasts.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    pub attempt_timeout: Duration,
}

impl Default for SenderConfig {
    fn default() -> Self {
        Self {
            allow_insecure_endpoints: false,
            queue: 4096,
            in_flight: 8,
            max_attempts: 5,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(10),
        }
    }
}

/// RFC 8030 §5.3: how hard the push service should try to wake the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Urgency {
    VeryLow,
    Low,
    #[default]
    Normal,
    /// For "it's your turn": the visitor has minutes to come back.
    High,
}

impl Urgency {
    pub(crate) fn header(self) -> &'static str {
        match self {
            Urgency::VeryLow => "very-low",
            Urgency::Low => "low",
            Urgency::Normal => "normal",
            Urgency::High => "high",
        }
    }
}

/// One message to one subscription.
#[derive(Clone, Debug)]
pub struct PushMessage {
    pub subscription: Subscription,
    /// The plaintext the service worker receives (at most
    /// [`ece::MAX_PLAINTEXT`] bytes).
    pub payload: Vec<u8>,
    /// How long the push service keeps it for a device that is offline;
    /// also how long retries go on. Zero: now or never, no retry.
    pub ttl: Duration,
    pub urgency: Urgency,
    /// RFC 8030 §5.4: a message waiting at the push service is replaced by
    /// a newer one with the same topic (so a stale "N ahead" is not shown
    /// after "your turn"). At most 32 base64url characters.
    pub topic: Option<String>,
}

/// How a message ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The push service accepted it.
    Sent,
    /// The subscription no longer exists (`404`/`410`): forget it.
    Gone,
    /// Refused, or given up after retries; the subscription may still work.
    Failed,
    /// Never tried: the queue was full, or the sender is off.
    Dropped,
}

impl Outcome {
    /// The `result` label in `/metrics`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::Gone => "gone",
            Outcome::Failed => "failed",
            Outcome::Dropped => "dropped",
        }
    }
}

/// A message's outcome, for the caller who wants it (one that does not
/// simply drops the receipt).
#[derive(Debug)]
pub struct Receipt(Result<oneshot::Receiver<Outcome>, Outcome>);

impl Receipt {
    pub async fn outcome(self) -> Outcome {
        match self.0 {
            // A message abandoned at shutdown was not delivered.
            Ok(rx) => rx.await.unwrap_or(Outcome::Failed),
            Err(outcome) => outcome,
        }
    }
}

struct Job {
    message: PushMessage,
    done: oneshot::Sender<Outcome>,
}

/// The sending side: cheap to share, never blocks.
#[derive(Debug)]
pub struct PushSender {
    tx: mpsc::Sender<Job>,
    allow_insecure: bool,
    metrics: Arc<Metrics>,
}

impl PushSender {
    /// Starts the delivery task; it ends on `shutdown`, abandoning
    /// messages still queued or retrying.
    pub fn start(
        key: Arc<VapidKey>,
        config: SenderConfig,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Result<Self, reqwest::Error> {
        let client = client(&config)?;
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let allow_insecure = config.allow_insecure_endpoints;
        let worker = Worker {
            client,
            key,
            config,
            metrics: metrics.clone(),
        };
        tokio::spawn(dispatch(rx, Arc::new(worker), shutdown));
        Ok(Self {
            tx,
            allow_insecure,
            metrics,
        })
    }

    /// Queues `message` and returns at once.
    pub fn send(&self, message: PushMessage) -> Receipt {
        let refuse = |outcome: Outcome| {
            self.metrics.push_message(outcome.label());
            Receipt(Err(outcome))
        };
        if message
            .subscription
            .check_endpoint(self.allow_insecure)
            .is_err()
            || !message.topic.as_deref().is_none_or(valid_topic)
            || message.payload.len() > ece::MAX_PLAINTEXT
        {
            tracing::warn!(
                push_service = %message.subscription.push_service(),
                "push message refused before sending: endpoint, topic or length not allowed"
            );
            return refuse(Outcome::Failed);
        }
        // The browser said when the subscription ends; past that the push
        // service would answer 410 anyway.
        let now_ms = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        if message
            .subscription
            .expiration_time()
            .is_some_and(|end| u128::from(end) <= now_ms)
        {
            return refuse(Outcome::Gone);
        }
        let (done, rx) = oneshot::channel();
        match self.tx.try_send(Job { message, done }) {
            Ok(()) => Receipt(Ok(rx)),
            Err(e) => {
                let job = match e {
                    mpsc::error::TrySendError::Full(j) | mpsc::error::TrySendError::Closed(j) => j,
                };
                tracing::warn!(
                    push_service = %job.message.subscription.push_service(),
                    "push queue full: message dropped"
                );
                refuse(Outcome::Dropped)
            }
        }
    }
}

/// The HTTP client the sender posts with.
fn client(config: &SenderConfig) -> Result<reqwest::Client, reqwest::Error> {
    let builder = reqwest::Client::builder()
        .timeout(config.attempt_timeout)
        // A push service answers; it does not send us elsewhere, and a
        // redirect would carry the VAPID token to another origin.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("narabu/", env!("CARGO_PKG_VERSION")));
    if config.allow_insecure_endpoints {
        builder.build()
    } else {
        builder.dns_resolver(super::resolve::PublicOnly).build()
    }
}

/// RFC 8030 §5.4: up to 32 characters of the base64url alphabet.
fn valid_topic(topic: &str) -> bool {
    (1..=32).contains(&topic.len())
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

struct Worker {
    client: reqwest::Client,
    key: Arc<VapidKey>,
    config: SenderConfig,
    metrics: Arc<Metrics>,
}

async fn dispatch(mut rx: mpsc::Receiver<Job>, worker: Arc<Worker>, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(worker.config.in_flight.max(1)));
    loop {
        let job = tokio::select! {
            () = shutdown.cancelled() => return,
            job = rx.recv() => match job { Some(j) => j, None => return },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (worker, slots, stop) = (worker.clone(), slots.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                outcome = worker.deliver(&job.message, slot, &slots) => {
                    worker.metrics.push_message(outcome.label());
                    let _ = job.done.send(outcome);
                }
            }
        });
    }
}

/// What one try came to.
enum Try {
    Done(Outcome),
    /// Worth asking again, after the push service's `Retry-After` if any.
    Again(Option<Duration>, String),
}

impl Worker {
    /// Sends `m`, holding `slot` while a request is out and giving it back
    /// while waiting to retry.
    async fn deliver(
        &self,
        m: &PushMessage,
        slot: OwnedSemaphorePermit,
        slots: &Arc<Semaphore>,
    ) -> Outcome {
        let mut first_slot = Some(slot);
        let push_service = m.subscription.push_service();
        let body = match ece::encrypt(&m.payload, m.subscription.p256dh(), m.subscription.auth()) {
            Ok(body) => body,
            Err(e) => {
                tracing::warn!(push_service, error = %e, "push message not encrypted");
                return Outcome::Failed;
            }
        };
        let started = Instant::now();
        let mut backoff = self.config.first_backoff;
        for attempt in 1..=self.config.max_attempts {
            let slot = match first_slot.take() {
                Some(s) => s,
                None => match slots.clone().acquire_owned().await {
                    Ok(s) => s,
                    Err(_) => return Outcome::Failed,
                },
            };
            // A retry tells the push service only the time left.
            let ttl = if attempt == 1 {
                m.ttl
            } else {
                m.ttl.saturating_sub(started.elapsed())
            };
            let (wait, problem) = match self.try_once(m, &body, ttl).await {
                Try::Done(outcome) => {
                    tracing::debug!(
                        push_service,
                        attempt,
                        outcome = outcome.label(),
                        "push message"
                    );
                    return outcome;
                }
                Try::Again(asked, problem) => (asked.unwrap_or(backoff), problem),
            };
            self.metrics.push_attempt_failed();
            tracing::warn!(push_service, attempt, problem, "push attempt failed");
            // Past its TTL the push service would drop it anyway.
            if attempt == self.config.max_attempts || started.elapsed() + wait >= m.ttl {
                break;
            }
            drop(slot);
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(self.config.max_backoff);
        }
        tracing::warn!(push_service, "push message given up");
        Outcome::Failed
    }

    async fn try_once(&self, m: &PushMessage, body: &[u8], ttl: Duration) -> Try {
        let endpoint = m.subscription.endpoint();
        let authorization = match self.key.authorization(endpoint, SystemTime::now()) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(push_service = %m.subscription.push_service(), error = %e, "no VAPID header");
                return Try::Done(Outcome::Failed);
            }
        };
        let mut request = self
            .client
            .post(endpoint.clone())
            .header(reqwest::header::AUTHORIZATION, authorization)
            .header(reqwest::header::CONTENT_ENCODING, "aes128gcm")
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .header("TTL", ttl.as_secs())
            .header("Urgency", m.urgency.header());
        if let Some(topic) = &m.topic {
            request = request.header("Topic", topic);
        }
        match request.body(body.to_vec()).send().await {
            Ok(r) => classify(r.status(), retry_after(r.headers(), SystemTime::now())),
            // The same name would resolve the same way.
            Err(e) if super::resolve::refused(&e) => {
                tracing::warn!(
                    push_service = %m.subscription.push_service(),
                    "push message refused: the endpoint's host resolves only to internal addresses"
                );
                Try::Done(Outcome::Failed)
            }
            // Without the error's text: it would name the endpoint.
            Err(e) if e.is_timeout() => Try::Again(None, "timed out".into()),
            Err(e) if e.is_connect() => Try::Again(None, "could not connect".into()),
            Err(_) => Try::Again(None, "request failed".into()),
        }
    }
}

fn classify(status: reqwest::StatusCode, retry_after: Option<Duration>) -> Try {
    match status.as_u16() {
        200..=299 => Try::Done(Outcome::Sent),
        404 | 410 => Try::Done(Outcome::Gone),
        408 | 429 | 500..=599 => Try::Again(retry_after, format!("answered {status}")),
        // 400 malformed, 401/403 VAPID refused, 413 too large: asking
        // again would get the same answer.
        other => {
            tracing::warn!(status = other, "push service refused the message");
            Try::Done(Outcome::Failed)
        }
    }
}

/// `Retry-After` as seconds or an HTTP date (RFC 9110 §10.2.3).
fn retry_after(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(value)
        .ok()?;
    let at = SystemTime::from(at);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};

    fn after(v: &str, now: SystemTime) -> Option<Duration> {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(v).unwrap());
        retry_after(&h, now)
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(
            after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(after("soon", now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    /// A push service on 127.0.0.1 answering 201 to anything, and how many
    /// connections it took.
    async fn local_push_service() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    // Headers, then the one-byte body.
                    while !request.ends_with(b"\r\n\r\nx") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n";
                    let _ = socket.write_all(answer).await;
                });
            }
        });
        (port, accepted)
    }

    #[tokio::test]
    async fn a_host_name_for_an_internal_address_is_refused_unless_local_endpoints_are_allowed() {
        use std::sync::atomic::Ordering::SeqCst;
        let (port, accepted) = local_push_service().await;
        // `localhost` by name: what any host name resolving to loopback
        // looks like to the sender.
        let endpoint = format!("http://localhost:{port}/push/1");
        let json = serde_json::json!({"endpoint": endpoint, "keys": {
            "p256dh": "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
            "auth": "BTBZMqHH6r4Tts7J_aSIgg"}});
        let message = PushMessage {
            subscription: Subscription::from_json(json.to_string().as_bytes(), true).unwrap(),
            payload: b"hi".to_vec(),
            ttl: Duration::from_secs(60),
            urgency: Urgency::High,
            topic: None,
        };
        let worker = |allow_insecure_endpoints| {
            let config = SenderConfig {
                allow_insecure_endpoints,
                ..SenderConfig::default()
            };
            Worker {
                client: client(&config).unwrap(),
                key: Arc::new(VapidKey::from_seed(&[7; 32], "mailto:ops@example.com").unwrap()),
                config,
                metrics: Arc::new(Metrics::new()),
            }
        };
        let outcome = |t: Try| match t {
            Try::Done(o) => Some(o),
            Try::Again(_, why) => panic!("would retry: {why}"),
        };
        // Refused once and for all, without a connection.
        let refused = worker(false).try_once(&message, b"x", message.ttl).await;
        assert_eq!(outcome(refused), Some(Outcome::Failed));
        assert_eq!(accepted.load(SeqCst), 0);
        // A test's local push service is reached when allowed.
        let sent = worker(true).try_once(&message, b"x", message.ttl).await;
        assert_eq!(outcome(sent), Some(Outcome::Sent));
        assert_eq!(accepted.load(SeqCst), 1);
    }

    #[test]
    fn statuses_decide_retry_and_gone() {
        use reqwest::StatusCode as S;
        let done = |s| match classify(s, None) {
            Try::Done(o) => Some(o),
            Try::Again(..) => None,
        };
        assert_eq!(done(S::CREATED), Some(Outcome::Sent));
        assert_eq!(done(S::GONE), Some(Outcome::Gone));
        assert_eq!(done(S::NOT_FOUND), Some(Outcome::Gone));
        for s in [
            S::BAD_REQUEST,
            S::UNAUTHORIZED,
            S::FORBIDDEN,
            S::PAYLOAD_TOO_LARGE,
        ] {
            assert_eq!(done(s), Some(Outcome::Failed), "{s}");
        }
        for s in [
            S::TOO_MANY_REQUESTS,
            S::SERVICE_UNAVAILABLE,
            S::INTERNAL_SERVER_ERROR,
        ] {
            assert_eq!(done(s), None, "{s}");
        }
    }

    #[test]
    fn topics_follow_rfc_8030() {
        assert!(valid_topic("ticket-abc_123"));
        assert!(valid_topic(&"a".repeat(32)));
        assert!(!valid_topic(&"a".repeat(33)));
        assert!(!valid_topic(""));
        assert!(!valid_topic("has space"));
        assert!(!valid_topic("slash/"));
    }

    #[test]
    fn urgency_headers() {
        assert_eq!(Urgency::High.header(), "high");
        assert_eq!(Urgency::VeryLow.header(), "very-low");
        assert_eq!(Urgency::default().header(), "normal");
    }
}
