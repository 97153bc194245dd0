//! A line that was lost is said so. Two instances share a Redis without
//! persistence; visitors wait and are admitted; then Redis loses
//! everything (`FLUSHALL`, as a restart without persistence would). The
//! configured room starts again as a new line, and every visitor of the
//! old one is told plainly that their line was reset (410 `line_reset`,
//! the queue page saying so with a way to join again, the gate sending
//! them to it, their open stream ended), while operators get one
//! `room.reset` webhook, a log line and `narabu_line_resets_total`. New
//! joins work and are admitted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode as AxumStatus;
use axum::routing::post;
use futures_util::StreamExt;
use narabu::backend::redis::RedisOptions;
use narabu::config::{Backend as ConfigBackend, Config, Secret, WebhookConfig};
use narabu::engine::{RoomSettings, SystemClock};
use narabu::webhooks::signing::SigningKey;
use reqwest::StatusCode;
use serde_json::Value;

use narabu_testkit::app::{ADMIN_TOKEN, TestApp, Visitor, config, spawn_with};
use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::{eventually, room};

const HOOK_SECRET: &str = "whsec_aG9vay1zZWNyZXQtaG9vay1zZWNyZXQtaG9vay0wMQ==";

fn sale() -> RoomSettings {
    let mut r = room("sale", 2);
    r.tick = Duration::from_millis(100);
    r.join_limit_per_minute = 0;
    r
}

/// The webhook bodies received, in order.
type Received = Arc<Mutex<Vec<Value>>>;

async fn receiver() -> (String, Received) {
    async fn take(State(r): State<Received>, body: Bytes) -> AxumStatus {
        let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        r.lock().unwrap().push(value);
        AxumStatus::NO_CONTENT
    }
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let router = Router::new()
        .route("/hook", post(take))
        .with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (url, received)
}

async fn instance(redis: &RedisServer, hook: &str) -> TestApp {
    let options = RedisOptions {
        lease: Duration::from_secs(1),
        ..RedisOptions::new(redis.url())
    };
    let backend = narabu::backend::redis::connect(options, vec![sale()], Arc::new(SystemClock))
        .await
        .unwrap();
    let config = Config {
        backend: ConfigBackend::Redis(redis.url().into()),
        rooms: vec![sale()],
        webhooks: vec![WebhookConfig {
            url: hook.to_owned(),
            secret: SigningKey::parse(&Secret::new(HOOK_SECRET)).unwrap(),
            previous_secret: None,
            events: Vec::new(),
            queue_threshold: None,
        }],
        ..config()
    };
    spawn_with(config, backend).await
}

async fn status_of(app: &TestApp, v: &Visitor) -> (StatusCode, Value) {
    let r = app
        .client
        .get(app.url("/api/rooms/sale/status"))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

/// Sum of `narabu_line_resets_total{room="sale"}` over the instances.
async fn resets_counted(apps: &[&TestApp]) -> u64 {
    let mut total = 0;
    for app in apps {
        let text = app
            .client
            .get(app.url("/metrics"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        total += text
            .lines()
            .filter(|l| l.starts_with("narabu_line_resets_total{room=\"sale\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_redis_tells_every_old_ticket_its_line_was_reset() {
    let redis = RedisServer::start().await;
    let (hook, received) = receiver().await;
    let a = instance(&redis, &hook).await;
    let b = instance(&redis, &hook).await;

    let mut old = Vec::new();
    for i in 0..5 {
        old.push(if i % 2 == 0 { &a } else { &b }.join("sale").await);
    }
    eventually(
        "the first two admitted",
        Duration::from_secs(10),
        || async { a.status("sale", &old[1]).await["status"] == "admitted" },
    )
    .await;
    let mut stream = b.events("sale", &old[4]).await;
    let first = narabu_testkit::app::next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(first.event, "position");

    // Everything Redis held is gone.
    let mut con = redis.client().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.unwrap();

    // Each old ticket is told its line was reset, on either instance,
    // once the instances have noticed (their next read of the room's log
    // or lease finds it gone: within a moment, not at once).
    for (i, v) in old.iter().enumerate() {
        let app = if i % 2 == 0 { &b } else { &a };
        eventually(
            "an instance noticed the flushed Redis",
            Duration::from_secs(10),
            || async { status_of(app, v).await.0 == StatusCode::GONE },
        )
        .await;
        let (status, body) = status_of(app, v).await;
        assert_eq!(status, StatusCode::GONE, "{body}");
        assert_eq!(body["error"], "line_reset", "{body}");
        assert!(body["message"].as_str().unwrap().contains("join again"));
    }
    // The queue page says so in words, with a way to join the new line.
    let page = a
        .client
        .get(a.url("/queue/sale?return=/shop&lang=en"))
        .header("cookie", format!("narabu_sale={}", old[2].token))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await.unwrap();
    assert!(html.contains("The line was reset"), "{html}");
    assert!(html.contains("rejoin=1"), "{html}");
    // The gate sends an admitted visitor of the old line to the queue.
    let gate = a.gate("sale", Some(&old[0].token)).await;
    assert_eq!(gate.status(), StatusCode::UNAUTHORIZED);
    // A stream open on the old line ends (`reset`, or `closed` when its
    // instance saw the room replaced first), never hangs.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(e)) = stream.next().await {
            if e.event == "reset" || e.event == "closed" {
                return e.event;
            }
        }
        String::new()
    })
    .await
    .expect("the old stream ends");
    assert!(!ended.is_empty(), "the stream ended with an event");

    // New joins work: one carrying the old ticket gets a new one, at the
    // head of the new line, and the line moves again.
    let r = b
        .client
        .post(b.url("/api/rooms/sale/join"))
        .bearer_auth(&old[3].token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["number"], 1);
    let fresh = Visitor {
        token: body["ticket"].as_str().unwrap().to_owned(),
        number: 1,
        body,
    };
    let second = a.join("sale").await;
    assert_eq!(second.number, 2);
    eventually(
        "the new line is admitted",
        Duration::from_secs(10),
        || async {
            a.status("sale", &fresh).await["status"] == "admitted"
                && b.status("sale", &second).await["status"] == "admitted"
        },
    )
    .await;

    // Operators: one webhook for the reset, whichever instance found it,
    // and one count over the instances.
    eventually("room.reset delivered", Duration::from_secs(15), || async {
        received
            .lock()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "room.reset")
    })
    .await;
    let epoch = a
        .backend
        .epoch(&narabu::engine::RoomId::new("sale").unwrap())
        .await
        .unwrap();
    let resets: Vec<Value> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "room.reset")
        .cloned()
        .collect();
    assert_eq!(resets.len(), 1, "{resets:?}");
    assert_eq!(resets[0]["room"], "sale");
    assert_eq!(resets[0]["data"]["epoch"], epoch.to_string());
    assert_eq!(resets_counted(&[&a, &b]).await, 1);

    a.stop().await;
    b.stop().await;
}
