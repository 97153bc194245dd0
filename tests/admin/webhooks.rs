//! Webhooks reach a receiver on loopback, signed as Standard Webhooks, and
//! are retried when the receiver fails. Here the signatures are checked by
//! the test's own HMAC; `standard_webhooks.rs` checks them with the
//! reference library.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use narabu::backend::embedded::EmbeddedBackend;
use narabu::config::{Config, Secret, WebhookConfig};
use narabu::engine::SystemClock;
use narabu::webhooks::EventType;
use narabu::webhooks::signing::SigningKey;
use serde_json::{Value, json};
use sha2::Sha256;

use super::admin;
use narabu_testkit::app::{config, spawn_with};
use narabu_testkit::room;

/// A Standard Webhooks secret: the key is the base64 after `whsec_`.
const HOOK_SECRET: &str = "whsec_aG9vay1zZWNyZXQtaG9vay1zZWNyZXQtaG9vay0wMQ==";
const HOOK_KEY: &[u8] = b"hook-secret-hook-secret-hook-01";
/// A plain secret, as configured before Standard Webhooks: the key is the
/// string itself, and the old header comes too.
const CLOSED_ONLY_SECRET: &str = "second-secret-second-secret-second-02";

/// One attempt: path, delivery id, event, body, whether the signature held.
type Attempt = (String, String, String, Value, bool);

#[derive(Clone, Default)]
struct Receiver {
    /// Every attempt: path, delivery id, event, body, signature was valid.
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

async fn receive(
    State(r): State<Receiver>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let path = uri.path().to_owned();
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mac = |key: &[u8], parts: &[&[u8]]| {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        for part in parts {
            mac.update(part);
        }
        mac.finalize().into_bytes()
    };
    let (key, legacy) = if path == "/hook" {
        (HOOK_KEY, false)
    } else {
        (CLOSED_ONLY_SECRET.as_bytes(), true)
    };
    let delivery = header("webhook-id");
    let timestamp = header("webhook-timestamp");
    let signed = mac(
        key,
        &[delivery.as_bytes(), b".", timestamp.as_bytes(), b".", &body],
    );
    let expected = format!("v1,{}", STANDARD.encode(signed));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let fresh = timestamp.parse::<u64>().is_ok_and(|t| t.abs_diff(now) <= 5);
    let mut valid = fresh && header("webhook-signature") == expected;
    // A plain secret: the old header comes too, and only then.
    let old = format!("sha256={}", hex::encode(mac(key, &[&body])));
    if legacy {
        valid &= header("x-narabu-signature") == old && header("x-narabu-delivery") == delivery;
    } else {
        valid &= !headers.contains_key("x-narabu-signature");
    }
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let event = value["type"].as_str().unwrap_or("").to_owned();
    let mut attempts = r.attempts.lock().unwrap();
    // Fail the first attempt of every delivery to the main hook.
    let first = !attempts.iter().any(|a| a.0 == path && a.1 == delivery);
    attempts.push((path.clone(), delivery, event, value, valid));
    if path == "/hook" && first {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    }
}

async fn wait_for(r: &Receiver, what: &str, done: impl Fn(&[Attempt]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if done(&r.attempts.lock().unwrap()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {:?}",
            r.attempts.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn webhooks_are_signed_retried_and_filtered() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new()
        .route("/hook", post(receive))
        .route("/closed-only", post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let config = Config {
        webhooks: vec![
            WebhookConfig {
                url: format!("http://{addr}/hook"),
                secret: SigningKey::parse(&Secret::new(HOOK_SECRET)).unwrap(),
                previous_secret: None,
                events: Vec::new(),
                queue_threshold: Some(3),
            },
            WebhookConfig {
                url: format!("http://{addr}/closed-only"),
                secret: SigningKey::parse(&Secret::new(CLOSED_ONLY_SECRET)).unwrap(),
                previous_secret: None,
                events: vec![EventType::RoomClosed],
                queue_threshold: None,
            },
        ],
        ..config()
    };
    let backend = EmbeddedBackend::without_workers(vec![room("sale", 1)], Arc::new(SystemClock));
    let app = spawn_with(config, backend).await;
    let patch = |body: Value| {
        admin(
            &app,
            reqwest::Method::PATCH,
            "/admin/rooms/sale",
            Some(body),
        )
    };

    let (status, _) = patch(json!({"paused": true})).await;
    assert_eq!(status, StatusCode::OK);
    // The first attempt fails (500); the retry succeeds.
    wait_for(&receiver, "room.paused delivered twice", |a| {
        a.iter().filter(|x| x.2 == "room.paused").count() == 2
    })
    .await;
    {
        let attempts = receiver.attempts.lock().unwrap();
        let paused: Vec<_> = attempts.iter().filter(|x| x.2 == "room.paused").collect();
        assert_eq!(paused[0].1, paused[1].1, "a retry keeps its delivery id");
        assert_eq!(paused[0].3, paused[1].3, "and its body");
        let body = &paused[0].3;
        assert_eq!(body["type"], "room.paused");
        assert_eq!(body["room"], "sale");
        assert_eq!(body["data"]["paused"], true);
        assert_eq!(body["id"].as_str(), Some(paused[0].1.as_str()));
        assert!(body["timestamp"].is_string());
        assert!(
            body.get("event").is_none(),
            "old names only for plain secrets"
        );
        assert!(attempts.iter().all(|a| a.4), "every signature is valid");
    }

    patch(json!({"paused": false, "capacity": 4})).await;
    wait_for(&receiver, "resumed and capacity_changed", |a| {
        let delivered = |e: &str| a.iter().filter(|x| x.2 == e).count() == 2;
        delivered("room.resumed") && delivered("room.capacity_changed")
    })
    .await;
    {
        let attempts = receiver.attempts.lock().unwrap();
        let cap = attempts
            .iter()
            .find(|x| x.2 == "room.capacity_changed")
            .unwrap();
        assert_eq!(cap.3["data"]["capacity"], 4);
        assert_eq!(cap.3["data"]["previous_capacity"], 1);
    }

    // The queue grows past 3: one threshold event, not one per sample.
    for _ in 0..5 {
        app.join("sale").await;
    }
    wait_for(&receiver, "queue.threshold", |a| {
        a.iter().filter(|x| x.2 == "queue.threshold").count() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let (status, _) = admin(&app, reqwest::Method::DELETE, "/admin/rooms/sale", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    wait_for(&receiver, "closed to both", |a| {
        a.iter()
            .any(|x| x.0 == "/closed-only" && x.2 == "room.closed")
            && a.iter()
                .filter(|x| x.0 == "/hook" && x.2 == "room.closed")
                .count()
                == 2
    })
    .await;
    let attempts = receiver.attempts.lock().unwrap().clone();
    let threshold: Vec<_> = attempts
        .iter()
        .filter(|x| x.2 == "queue.threshold")
        .collect();
    assert_eq!(threshold.len(), 2, "one event, retried once: {threshold:?}");
    assert_eq!(threshold[0].3["data"]["threshold"], 3);
    let per_path: HashMap<&str, Vec<&str>> = attempts.iter().fold(HashMap::new(), |mut m, a| {
        m.entry(a.0.as_str()).or_default().push(a.2.as_str());
        m
    });
    assert_eq!(
        per_path["/closed-only"],
        ["room.closed"],
        "the filter holds"
    );
    let legacy = attempts.iter().find(|a| a.0 == "/closed-only").unwrap();
    assert_eq!(legacy.3["event"], "room.closed", "the old names are kept");
    assert_eq!(legacy.3["at"], legacy.3["timestamp"]);
    assert!(attempts.iter().all(|a| a.4), "every signature is valid");

    // Failed attempts and deliveries are counted.
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"narabu_webhook_deliveries_total{result="delivered"} 6"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("narabu_webhook_attempt_failures_total 5"),
        "{metrics}"
    );
    drop(attempts);
    app.stop().await;
}

/// Mode changes are announced by the call that made them, once each: an
/// operator's, and the purchase that took the last unit (with
/// `room.sold_out`); later purchases and the monitor's samples add none.
/// The mode and stock gauges follow.
#[tokio::test]
async fn mode_changes_and_the_end_of_a_sale_are_announced_once() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new()
        .route("/modes", post(receive))
        .with_state(receiver.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let config = Config {
        webhooks: vec![WebhookConfig {
            url: format!("http://{addr}/modes"),
            secret: SigningKey::parse(&Secret::new(CLOSED_ONLY_SECRET)).unwrap(),
            previous_secret: None,
            events: vec![EventType::RoomModeChanged, EventType::RoomSoldOut],
            queue_threshold: None,
        }],
        ..config()
    };
    let mut sale = room("sale", 1);
    sale.stock = Some(2);
    let backend = EmbeddedBackend::without_workers(vec![sale], Arc::new(SystemClock));
    let app = spawn_with(config, backend).await;

    let (status, _) = admin(
        &app,
        reqwest::Method::PATCH,
        "/admin/rooms/sale",
        Some(json!({"mode": "maintenance"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    wait_for(&receiver, "maintenance announced", |a| a.len() == 1).await;
    for _ in 0..3 {
        let (status, _) = admin(
            &app,
            reqwest::Method::POST,
            "/admin/rooms/sale/purchases",
            Some(json!({"purchased": 1})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    wait_for(&receiver, "sold out announced", |a| a.len() == 3).await;
    // Samples come every second: none of them repeats an announcement.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let attempts = receiver.attempts.lock().unwrap().clone();
    let seen: Vec<(&str, &Value)> = attempts
        .iter()
        .map(|a| (a.2.as_str(), &a.3["data"]))
        .collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0].0, "room.mode_changed");
    assert_eq!(
        (
            &seen[0].1["mode"],
            &seen[0].1["previous_mode"],
            &seen[0].1["reason"]
        ),
        (&json!("maintenance"), &json!("queue"), &json!("operator"))
    );
    assert_eq!(seen[1].0, "room.mode_changed");
    assert_eq!(
        (
            &seen[1].1["mode"],
            &seen[1].1["previous_mode"],
            &seen[1].1["reason"]
        ),
        (&json!("sold_out"), &json!("maintenance"), &json!("stock"))
    );
    assert_eq!(seen[2].0, "room.sold_out");
    assert_eq!(
        (&seen[2].1["reason"], &seen[2].1["stock"]),
        (&json!("stock"), &json!(0))
    );
    assert!(attempts.iter().all(|a| a.4), "every signature is valid");

    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"narabu_room_mode{room="sale",mode="sold_out"} 1"#,
        r#"narabu_room_mode{room="sale",mode="queue"} 0"#,
        r#"narabu_room_stock{room="sale"} 0"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    app.stop().await;
}
