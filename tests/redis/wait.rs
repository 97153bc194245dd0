//! Acknowledged means replicated, when asked: with `redis_wait_replicas =
//! 1` a join and a leave (and its hand-off) are answered only once the
//! room's log on the replica has them; with the replica gone they fail
//! with 503, `Retry-After` and `not_replicated` instead of acknowledging
//! what a failover could lose, and they work again once it is back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::backend::redis::RedisOptions;
use narabu::config::{Backend as ConfigBackend, Config, RedisWait};
use narabu::engine::{RoomSettings, SystemClock};
use reqwest::StatusCode;
use serde_json::Value;

use narabu_testkit::app::{TestApp, Visitor, config, spawn_with};
use narabu_testkit::redis_ha::{replicated, wait_in_sync};
use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;

fn sale() -> RoomSettings {
    let mut r = room("sale", 1);
    r.join_limit_per_minute = 0;
    r
}

pub async fn waiting_instance(redis: &RedisServer, wait: RedisWait) -> TestApp {
    let options = RedisOptions {
        wait,
        run_workers: false,
        ..RedisOptions::new(redis.url())
    };
    let backend = narabu::backend::redis::connect(options, vec![sale()], Arc::new(SystemClock))
        .await
        .unwrap();
    let config = Config {
        backend: ConfigBackend::Redis(redis.url().into()),
        rooms: vec![sale()],
        redis_wait: wait,
        ..config()
    };
    spawn_with(config, backend).await
}

async fn post_join(app: &TestApp) -> reqwest::Response {
    app.client
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap()
}

/// A primary with a replica in sync, and a wait for that one replica.
async fn primary_and_replica() -> (RedisServer, RedisServer, RedisWait) {
    let primary = RedisServer::start_persistent().await;
    let replica = RedisServer::start_replica_of(primary.port).await;
    wait_in_sync(&replica, Duration::from_secs(30)).await;
    replicated(&primary, "probe", 1).await;
    let wait = RedisWait {
        replicas: 1,
        timeout: Duration::from_millis(200),
    };
    (primary, replica, wait)
}

/// With the replica there, everything is answered as usual: two join, the
/// first is admitted and leaves, handing its permit to the second.
async fn answered_as_usual(app: &TestApp) -> Visitor {
    let first = app.join("sale").await;
    let second = app.join("sale").await;
    app.tick("sale").await;
    assert_eq!(app.status("sale", &first).await["status"], "admitted");
    assert_eq!(app.leave("sale", &first).await, StatusCode::NO_CONTENT);
    assert_eq!(app.status("sale", &second).await["status"], "admitted");
    second
}

/// The replica has died: a join is refused as not replicated.
async fn refused_as_not_replicated(app: &TestApp) {
    let refused = post_join(app).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "not_replicated", "{body}");
}

/// The replica comes back and catches up: joins are answered again.
async fn joins_come_back(app: &TestApp, replica: &mut RedisServer) {
    replica.launch(&[]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = post_join(app).await;
        if r.status() == StatusCode::CREATED {
            break;
        }
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "joins did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_wait_for_the_replica_and_fail_with_503_without_it() {
    let (primary, mut replica, wait) = primary_and_replica().await;
    let app = waiting_instance(&primary, wait).await;
    answered_as_usual(&app).await;
    // What was acknowledged is in the room's log on the replica.
    let mut on_replica = replica.client().await;
    let batches: u64 = redis::cmd("XLEN")
        .arg("narabu:v7:{sale}:log")
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert!(batches > 0, "the log is on the replica");

    // The replica dies: no change is acknowledged any more.
    replica.kill();
    refused_as_not_replicated(&app).await;
    joins_come_back(&app, &mut replica).await;
    app.stop().await;
}
