//! Web Push against the reference implementations: `tests/push_service.py`
//! plays the push service with a real subscription key pair, decrypts
//! every message Narabu sends with `http_ece` and checks its VAPID header
//! with `py_vapid` and PyJWT (all from PyPI, pinned in
//! tests/requirements.txt). Retries, `Retry-After`, `410 Gone` and the
//! bounded queue are checked against the same service.

use std::sync::Arc;
use std::time::Duration;

use narabu::config::Secret;
use narabu::metrics::Metrics;
use narabu::push::{
    Outcome, PushMessage, PushSender, SenderConfig, Subscription, Urgency, VapidKey,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[path = "support/push_service.rs"]
mod push_service;

use push_service::{CONTACT, PushService};

fn key() -> Arc<VapidKey> {
    let secret = Secret::new("push-test-secret-of-at-least-32-bytes!");
    Arc::new(VapidKey::derive(&secret, CONTACT).unwrap())
}

fn fast() -> SenderConfig {
    SenderConfig {
        allow_insecure_endpoints: true,
        first_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_secs(5),
        ..SenderConfig::default()
    }
}

fn message(sub: Subscription, text: &str, urgency: Urgency) -> PushMessage {
    PushMessage {
        subscription: sub,
        payload: text.as_bytes().to_vec(),
        ttl: Duration::from_secs(300),
        urgency,
        topic: None,
    }
}

/// What the references made of one message: it decrypts to `text` with
/// the subscription's key and with no other, and its VAPID header is
/// Narabu's key's, signed for this push service.
fn assert_delivered(report: &Value, text: &str, key: &VapidKey, port: u16) {
    assert_eq!(report["text"], text, "{report:#}");
    assert!(report["unrelated_key"]["error"].is_string(), "{report:#}");
    let h = &report["headers"];
    assert_eq!(h["content-encoding"], "aes128gcm", "{report:#}");
    assert_eq!(h["content-type"], "application/octet-stream", "{report:#}");
    let vapid = &report["vapid"];
    assert_eq!(vapid["py_vapid"], true, "{vapid:#}");
    assert_eq!(vapid["k"], key.public_key(), "{vapid:#}");
    assert!(
        vapid["header"].as_str().unwrap().starts_with("vapid t="),
        "{vapid:#}"
    );
    assert_eq!(vapid["jwt_header"]["alg"], "ES256", "{vapid:#}");
    assert_eq!(
        vapid["claims"]["aud"],
        format!("http://127.0.0.1:{port}"),
        "{vapid:#}"
    );
    assert_eq!(vapid["claims"]["sub"], CONTACT, "{vapid:#}");
    assert_eq!(vapid["sub_ok"], true, "{vapid:#}");
    let exp_in = vapid["exp_in"].as_i64().unwrap();
    assert!(exp_in > 3600 && exp_in <= 24 * 3600, "{vapid:#}");
    assert_eq!(vapid["unrelated_key"], "refused", "{vapid:#}");
}

#[tokio::test]
async fn messages_decrypt_and_verify_with_the_reference_libraries() {
    let mut service = PushService::start().await;
    let key = key();
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let sender = PushSender::start(key.clone(), fast(), metrics.clone(), stop.clone()).unwrap();

    let mut ahead = message(
        service.subscription("/push/ok/1"),
        r#"{"kind":"ahead","ahead":12}"#,
        Urgency::Normal,
    );
    ahead.ttl = Duration::from_secs(120);
    ahead.topic = Some("ticket-1".into());
    assert_eq!(sender.send(ahead).outcome().await, Outcome::Sent);
    let report = service.next_report().await;
    assert_delivered(
        &report,
        r#"{"kind":"ahead","ahead":12}"#,
        &key,
        service.port,
    );
    assert_eq!(report["headers"]["ttl"], "120", "{report:#}");
    assert_eq!(report["headers"]["urgency"], "normal", "{report:#}");
    assert_eq!(report["headers"]["topic"], "ticket-1", "{report:#}");

    // The turn: high urgency, and text beyond ASCII.
    let turn = "順番です — it's your turn";
    let receipt = sender.send(message(
        service.subscription("/push/ok/1"),
        turn,
        Urgency::High,
    ));
    assert_eq!(receipt.outcome().await, Outcome::Sent);
    let report = service.next_report().await;
    assert_delivered(&report, turn, &key, service.port);
    assert_eq!(report["headers"]["urgency"], "high", "{report:#}");
    assert_eq!(report["headers"]["ttl"], "300", "{report:#}");
    assert!(report["headers"].get("topic").is_none(), "{report:#}");

    // The longest message a push service must take arrives whole.
    let longest = "x".repeat(narabu::push::ece::MAX_PLAINTEXT);
    let receipt = sender.send(message(
        service.subscription("/push/ok/2"),
        &longest,
        Urgency::Low,
    ));
    assert_eq!(receipt.outcome().await, Outcome::Sent);
    let report = service.next_report().await;
    assert_eq!(report["length"], 4096);
    assert_delivered(&report, &longest, &key, service.port);

    assert_eq!(metrics.push_messages("sent"), 3);
    assert_eq!(metrics.push_messages("failed"), 0);
    stop.cancel();
}

#[tokio::test]
async fn an_operators_pem_key_made_by_py_vapid_signs_alike() {
    let mut service = PushService::start().await;
    let key = Arc::new(VapidKey::from_pem(&service.vapid_pem, CONTACT).unwrap());
    assert_eq!(key.public_key(), service.vapid_public);
    let stop = CancellationToken::new();
    let sender =
        PushSender::start(key.clone(), fast(), Arc::new(Metrics::new()), stop.clone()).unwrap();
    let receipt = sender.send(message(
        service.subscription("/push/ok/1"),
        "turn",
        Urgency::High,
    ));
    assert_eq!(receipt.outcome().await, Outcome::Sent);
    assert_delivered(&service.next_report().await, "turn", &key, service.port);
    stop.cancel();
}

#[tokio::test]
async fn gone_is_reported_and_busy_push_services_are_retried() {
    let mut service = PushService::start().await;
    let key = key();
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let config = SenderConfig {
        max_attempts: 3,
        ..fast()
    };
    let sender = PushSender::start(key.clone(), config, metrics.clone(), stop.clone()).unwrap();

    // 410: the browser dropped the subscription; asked once.
    let gone = sender.send(message(
        service.subscription("/push/gone/1"),
        "turn",
        Urgency::High,
    ));
    assert_eq!(gone.outcome().await, Outcome::Gone);
    let report = service.next_report().await;
    assert_eq!(report["answered"], 410);
    assert_delivered(&report, "turn", &key, service.port);
    service.quiet(Duration::from_millis(300)).await;

    // 503 with Retry-After: 1, then 201: the wait is the push service's,
    // not the 50 ms backoff.
    let flaky = sender.send(message(
        service.subscription("/push/flaky/1"),
        "turn",
        Urgency::High,
    ));
    assert_eq!(flaky.outcome().await, Outcome::Sent);
    let first = service.next_report().await;
    let second = service.next_report().await;
    assert_eq!(
        (first["answered"].as_u64(), second["answered"].as_u64()),
        (Some(503), Some(201))
    );
    let waited = second["at"].as_f64().unwrap() - first["at"].as_f64().unwrap();
    assert!(
        waited >= 0.9,
        "retried after {waited} s despite Retry-After: 1"
    );
    assert_delivered(&second, "turn", &key, service.port);
    // The retry announces only the TTL that is left.
    let ttl = second["headers"]["ttl"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .unwrap();
    assert!((298..300).contains(&ttl), "{second:#}");

    // 429 without Retry-After: the sender's own backoff.
    let limited = sender.send(message(
        service.subscription("/push/limited/1"),
        "ahead",
        Urgency::Normal,
    ));
    assert_eq!(limited.outcome().await, Outcome::Sent);
    assert_eq!(service.next_report().await["answered"], 429);
    assert_eq!(service.next_report().await["answered"], 201);

    // Always 503: given up after max_attempts.
    let down = sender.send(message(
        service.subscription("/push/down/1"),
        "ahead",
        Urgency::Normal,
    ));
    assert_eq!(down.outcome().await, Outcome::Failed);
    for _ in 0..3 {
        assert_eq!(service.next_report().await["answered"], 503);
    }
    service.quiet(Duration::from_millis(500)).await;

    // A message whose TTL is spent is not retried.
    let mut short = message(
        service.subscription("/push/down/2"),
        "ahead",
        Urgency::Normal,
    );
    short.ttl = Duration::ZERO;
    assert_eq!(sender.send(short).outcome().await, Outcome::Failed);
    assert_eq!(service.next_report().await["headers"]["ttl"], "0");
    service.quiet(Duration::from_millis(300)).await;

    // A subscription the browser said has ended is Gone without a try.
    let mut ended = serde_json::to_value(service.subscription("/push/ok/3")).unwrap();
    ended["expirationTime"] = json!(1_000_000_000_000u64);
    let ended = Subscription::from_json(ended.to_string().as_bytes(), true).unwrap();
    let receipt = sender.send(message(ended, "turn", Urgency::High));
    assert_eq!(receipt.outcome().await, Outcome::Gone);
    service.quiet(Duration::from_millis(300)).await;

    assert_eq!(metrics.push_messages("sent"), 2);
    assert_eq!(metrics.push_messages("gone"), 2);
    assert_eq!(metrics.push_messages("failed"), 2);
    let page = metrics.render(Vec::new());
    assert!(
        page.contains(r#"narabu_push_messages_total{result="gone"} 2"#),
        "{page}"
    );
    assert!(
        page.contains("narabu_push_attempt_failures_total 6"),
        "{page}"
    );
    stop.cancel();
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_waiting() {
    let service = PushService::start().await;
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    // One in flight, one queued, and every message held up for a while
    // by a push service that is down.
    let config = SenderConfig {
        queue: 1,
        in_flight: 1,
        max_attempts: 2,
        first_backoff: Duration::from_secs(2),
        ..fast()
    };
    let sender = PushSender::start(key(), config, metrics.clone(), stop.clone()).unwrap();
    let started = std::time::Instant::now();
    let receipts: Vec<_> = (0..20)
        .map(|i| {
            sender.send(message(
                service.subscription(&format!("/push/down/{i}")),
                "ahead",
                Urgency::Normal,
            ))
        })
        .collect();
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "send waited"
    );
    let mut dropped = 0;
    for r in receipts {
        match tokio::time::timeout(Duration::from_millis(100), r.outcome()).await {
            Ok(Outcome::Dropped) => dropped += 1,
            Ok(other) => panic!("{other:?} before any retry could end"),
            Err(_) => {}
        }
    }
    assert!(dropped >= 17, "only {dropped} of 20 dropped");
    assert_eq!(metrics.push_messages("dropped"), dropped);
    stop.cancel();
}

#[tokio::test]
async fn a_message_waiting_to_retry_does_not_hold_up_the_others() {
    let mut service = PushService::start().await;
    let stop = CancellationToken::new();
    let config = SenderConfig {
        in_flight: 1,
        max_attempts: 2,
        first_backoff: Duration::from_secs(3),
        ..fast()
    };
    let sender = PushSender::start(key(), config, Arc::new(Metrics::new()), stop.clone()).unwrap();
    let waiting = sender.send(message(
        service.subscription("/push/down/1"),
        "ahead",
        Urgency::Normal,
    ));
    assert_eq!(service.next_report().await["answered"], 503);
    let started = std::time::Instant::now();
    let turn = sender.send(message(
        service.subscription("/push/ok/1"),
        "turn",
        Urgency::High,
    ));
    assert_eq!(turn.outcome().await, Outcome::Sent);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the turn waited {:?} behind a retry",
        started.elapsed()
    );
    assert_eq!(service.next_report().await["answered"], 201);
    assert_eq!(waiting.outcome().await, Outcome::Failed);
    stop.cancel();
}

#[tokio::test]
async fn production_senders_refuse_local_and_plain_http_endpoints() {
    let mut service = PushService::start().await;
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let strict = SenderConfig {
        allow_insecure_endpoints: false,
        ..fast()
    };
    let sender = PushSender::start(key(), strict, metrics.clone(), stop.clone()).unwrap();
    let receipt = sender.send(message(
        service.subscription("/push/ok/1"),
        "turn",
        Urgency::High,
    ));
    assert_eq!(receipt.outcome().await, Outcome::Failed);
    service.quiet(Duration::from_millis(500)).await;
    assert_eq!(metrics.push_messages("failed"), 1);
    stop.cancel();
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Endpoints are capability URLs and the keys open the messages: logs
/// name the push service's origin, and nothing more of a subscription.
#[tokio::test]
async fn logs_name_the_push_service_and_no_more() {
    // The global subscriber, not a thread's default: with several
    // dispatchers about, tracing may cache a callsite as uninteresting
    // and this test would miss the very lines it checks. Logs of the
    // tests running alongside land here too, and must pass as well.
    static CAPTURED: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
    let captured = CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        captured
    });

    let mut service = PushService::start().await;
    let metrics = Arc::new(Metrics::new());
    let stop = CancellationToken::new();
    let config = SenderConfig {
        max_attempts: 2,
        ..fast()
    };
    let sender = PushSender::start(key(), config, metrics, stop.clone()).unwrap();
    for (path, want) in [
        ("/push/ok/SECRETPATH1", Outcome::Sent),
        ("/push/gone/SECRETPATH2", Outcome::Gone),
        ("/push/down/SECRETPATH3", Outcome::Failed),
    ] {
        let sub = service.subscription(path);
        tracing::info!(subscription = ?sub, "the engine logs a subscription");
        let receipt = sender.send(message(sub, "turn", Urgency::High));
        assert_eq!(receipt.outcome().await, want, "{path}");
    }
    // A message refused before sending logs too.
    let mut bad = message(
        service.subscription("/push/ok/SECRETPATH4"),
        "t",
        Urgency::High,
    );
    bad.topic = Some("not a valid topic".into());
    assert_eq!(sender.send(bad).outcome().await, Outcome::Failed);
    for _ in 0..4 {
        service.next_report().await;
    }
    stop.cancel();

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains(&format!("http://127.0.0.1:{}", service.port)),
        "the push service is named: {logs}"
    );
    assert!(logs.contains("push attempt failed"), "{logs}");
    for secret in [
        "SECRETPATH",
        "/push/",
        service.p256dh.as_str(),
        &service.p256dh[..24],
        service.auth.as_str(),
        "vapid t=",
    ] {
        assert!(!logs.contains(secret), "`{secret}` in the logs: {logs}");
    }
}
