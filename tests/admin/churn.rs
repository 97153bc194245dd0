//! Lowering capacity while visitors churn: once the change is acknowledged,
//! nobody new is admitted until the count is below the new capacity, and
//! then it never goes above it again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use narabu::backend::embedded::EmbeddedBackend;
use narabu::engine::{RoomId, SystemClock};
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{admin, get_room};
use narabu_testkit::app::{TestApp, config, spawn_with};
use narabu_testkit::room;

const VISITORS: usize = 200;
const TASKS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lowering_capacity_from_50_to_5_under_churn_never_admits_more_than_5() {
    let mut settings = room("sale", 50);
    settings.tick = Duration::from_millis(10);
    settings.join_limit_per_minute = 0;
    let backend = EmbeddedBackend::new(vec![settings], Arc::new(SystemClock));
    let app = Arc::new(spawn_with(config(), backend.clone()).await);
    let engine = backend.engine_room(&RoomId::new("sale").unwrap()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));

    // Each task keeps its share of the 200 visitors in line: join, poll,
    // hold an admission briefly, leave, join again as someone new.
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let app = app.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut tokens: Vec<String> = Vec::new();
            for _ in 0..VISITORS / TASKS {
                tokens.push(join(&app).await);
            }
            let mut cycles = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for token in tokens.iter_mut() {
                    let status = app
                        .client
                        .get(app.url("/api/rooms/sale/status"))
                        .bearer_auth(&*token)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(status.status(), StatusCode::OK);
                    let body: Value = status.json().await.unwrap();
                    if body["status"] == "admitted" {
                        let left = app
                            .client
                            .post(app.url("/api/rooms/sale/leave"))
                            .bearer_auth(&*token)
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(left.status(), StatusCode::NO_CONTENT);
                        *token = join(&app).await;
                        cycles += 1;
                    }
                }
            }
            cycles
        }));
    }

    // Let it run full before the change.
    let deadline = Instant::now() + Duration::from_secs(20);
    while engine.admitted_count() < 40 {
        assert!(Instant::now() < deadline, "the room never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = admin(
        &app,
        reqwest::Method::PATCH,
        "/admin/rooms/sale",
        Some(json!({"capacity": 5})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["capacity"], 5);

    // From the acknowledgement on: the count never rises while above 5,
    // and once at or below 5 it stays there. Read the engine directly (as
    // fast as possible) and through the admin API.
    let mut previous = u64::MAX;
    let mut reached = false;
    let mut readings = 0u64;
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until || !reached {
        assert!(
            Instant::now() < deadline + Duration::from_secs(20),
            "never drained to 5"
        );
        let admitted = engine.admitted_count();
        if reached {
            assert!(admitted <= 5, "{admitted} admitted after draining to 5");
        } else {
            assert!(
                admitted <= previous,
                "admissions while over capacity: {previous} -> {admitted}"
            );
            reached = admitted <= 5;
        }
        previous = admitted;
        readings += 1;
        if readings.is_multiple_of(64) {
            let r = get_room(&app, "sale").await;
            let seen = r["admitted"].as_u64().unwrap();
            assert!(!reached || seen <= 5, "admin API shows {seen} admitted");
            assert_eq!(r["capacity"], 5);
        }
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut cycles = 0;
    for t in tasks {
        cycles += t.await.unwrap();
    }
    assert!(cycles > 20, "visitors churned ({cycles} admissions seen)");
    // Conservation at rest.
    let ledger = engine.ledger();
    assert!(ledger.admitted <= 5);
    assert_eq!(ledger.capacity, 5);
    assert!(readings > 100);
    let Ok(app) = Arc::try_unwrap(app) else {
        panic!("tasks still hold the app")
    };
    app.stop().await;
}

async fn join(app: &TestApp) -> String {
    let response = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    body["ticket"].as_str().unwrap().to_owned()
}
