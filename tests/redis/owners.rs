//! Three instances on one Redis with `redis_engine = "owners"`, over HTTP:
//! one instance owns the room and runs its engine, the others send it
//! their visitors' changes and read their own replicas. Visitors spread
//! over the instances are admitted in ticket order, never more than
//! capacity at once; when the owner shuts down it hands the room over and
//! the line goes on from where it was on another instance, with every
//! acknowledged ticket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::backend::owned::{OwnedBackend, OwnedOptions};
use narabu::backend::owner::OwnerOptions;
use narabu::backend::redis::store::RedisStore;
use narabu::config::{Backend as BackendConfig, RedisEngine};
use narabu::engine::{RoomId, RoomSettings, SystemClock};
use reqwest::StatusCode;
use serde_json::Value;

use narabu_testkit::app::{TestApp, Visitor, config, spawn_with};
use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;

const LEASE: Duration = Duration::from_secs(1);

fn sale() -> RoomSettings {
    let mut r = room("sale", 3);
    r.tick = Duration::from_millis(50);
    r.join_limit_per_minute = 0;
    r
}

async fn instance(redis: &RedisServer) -> (TestApp, Arc<OwnedBackend>) {
    let store = RedisStore::open(&redis.url()).await.unwrap();
    let options = OwnedOptions {
        owner: OwnerOptions {
            lease: LEASE,
            ..OwnerOptions::default()
        },
        ..OwnedOptions::default()
    };
    let backend = OwnedBackend::start(
        Arc::new(store),
        vec![sale()],
        Arc::new(SystemClock),
        options,
    );
    let mut c = config();
    c.backend = BackendConfig::Redis(redis.url().into());
    c.redis_engine = RedisEngine::Owners;
    c.rooms = vec![sale()];
    (spawn_with(c, backend.clone()).await, backend)
}

async fn state(app: &TestApp, v: &Visitor) -> String {
    let s: Value = app.status("sale", v).await;
    s["status"].as_str().unwrap().to_owned()
}

/// Release every admitted visitor (through `release_on`), until all are
/// through, checking capacity on every instance's admin view as it goes;
/// the numbers in the order they were seen admitted.
async fn admit_all(apps: &[&TestApp], visitors: &[Visitor], within: Duration) -> Vec<u64> {
    let deadline = Instant::now() + within;
    let mut order = Vec::new();
    while order.len() < visitors.len() {
        assert!(
            Instant::now() < deadline,
            "only {} of {} admitted: {order:?}",
            order.len(),
            visitors.len()
        );
        for app in apps {
            let room = app.admin_room("sale").await;
            let admitted = room["admitted"].as_u64().unwrap();
            assert!(admitted <= 3, "over capacity on {}: {room}", app.base);
        }
        for (i, v) in visitors.iter().enumerate() {
            if order.contains(&v.number) {
                continue;
            }
            let app = apps[i % apps.len()];
            if state(app, v).await == "admitted" {
                order.push(v.number);
                let r = apps[(i + 1) % apps.len()]
                    .client
                    .post(apps[(i + 1) % apps.len()].url("/api/rooms/sale/leave"))
                    .bearer_auth(&v.token)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::NO_CONTENT, "leave of {}", v.number);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    order
}

/// Numbers seen admitted are in ticket order, give or take the capacity
/// (three admitted together are seen in whatever order the polls came).
fn in_order(order: &[u64]) {
    for (i, n) in order.iter().enumerate() {
        let seen_before = order[..i].iter().filter(|&&m| m > *n).count();
        assert!(
            seen_before < 3,
            "{n} was admitted after {seen_before} later tickets: {order:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_line_and_an_owner_hands_it_over() {
    let redis = RedisServer::start().await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(instance(&redis).await);
    }
    let sale_id = RoomId::new("sale").unwrap();
    // One of them owns the room.
    let deadline = Instant::now() + Duration::from_secs(5);
    let owner = loop {
        if let Some(i) = instances.iter().position(|(_, b)| b.owns(&sale_id)) {
            break i;
        }
        assert!(Instant::now() < deadline, "nobody owns the room");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        instances.iter().filter(|(_, b)| b.owns(&sale_id)).count(),
        1,
        "one owner"
    );
    // Visitors join on every instance in turn: one line, numbered in the
    // order their joins were acknowledged.
    let mut visitors = Vec::new();
    for i in 0..12 {
        visitors.push(instances[i % 3].0.join("sale").await);
    }
    let mut numbers: Vec<u64> = visitors.iter().map(|v| v.number).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (1..=12).collect::<Vec<_>>());
    // Each instance answers a ticket joined on another at once.
    for (i, v) in visitors.iter().enumerate() {
        let s = instances[(i + 2) % 3].0.status("sale", v).await;
        assert_eq!(s["number"].as_u64(), Some(v.number), "{s}");
    }
    let apps: Vec<&TestApp> = instances.iter().map(|(a, _)| a).collect();
    let first = admit_all(&apps, &visitors[..6], Duration::from_secs(20)).await;
    in_order(&first);

    // The owner shuts down: it hands the lease over, another instance
    // takes the room from the log and the line goes on.
    let (stopped, _) = instances.remove(owner);
    let handed = Instant::now();
    stopped.stop().await;
    let deadline = Instant::now() + LEASE * 5;
    while !instances.iter().any(|(_, b)| b.owns(&sale_id)) {
        assert!(Instant::now() < deadline, "nobody took the room over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "room taken over {:?} after the owner stopped",
        handed.elapsed()
    );
    let apps: Vec<&TestApp> = instances.iter().map(|(a, _)| a).collect();
    // Every acknowledged ticket is still there, with its number.
    for v in &visitors[6..] {
        let s = apps[0].status("sale", v).await;
        assert_eq!(s["number"].as_u64(), Some(v.number), "{s}");
    }
    let late = apps[1].join("sale").await;
    assert_eq!(late.number, 13, "numbering goes on after the hand-over");
    let mut rest = visitors[6..].to_vec();
    rest.push(late);
    let second = admit_all(&apps, &rest, Duration::from_secs(20)).await;
    in_order(&second);
    for (app, _) in instances {
        app.stop().await;
    }
}
