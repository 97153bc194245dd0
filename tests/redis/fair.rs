//! Fair access across instances on one Redis: a proof-of-work solution
//! admits one join whichever instances it is sent to (even at once), an
//! account holds one ticket whichever instance it joins through, and an
//! operator's change on one instance reaches the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::access::{ChallengeMode, EnqueueMode, SharedKey};
use narabu::backend::redis::RedisOptions;
use narabu::engine::{RoomId, RoomSettings, SystemClock};
use narabu_testkit::app::{ADMIN_TOKEN, TestApp, config, spawn_with};
use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::{Value, json};

const KEY: &str = "shared-origin-key-shared-origin-key-0001";

async fn instance(redis: &RedisServer, rooms: Vec<RoomSettings>) -> TestApp {
    let options = RedisOptions {
        run_workers: false,
        ..RedisOptions::new(redis.url())
    };
    let backend = narabu::backend::redis::connect(options, rooms, Arc::new(SystemClock))
        .await
        .unwrap();
    spawn_with(config(), backend).await
}

async fn join(app: &TestApp, room: &str, body: &Value) -> (StatusCode, Value) {
    let r = app
        .client
        .post(app.url(&format!("/api/rooms/{room}/join")))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

fn rooms() -> Vec<RoomSettings> {
    let mut pow = room("pow", 10);
    pow.access.challenge = ChallengeMode::Pow;
    pow.access.pow_difficulty = 8;
    pow.access.pow_difficulty_max = 8;
    let mut invite = room("invite", 10);
    invite.access.enqueue = EnqueueMode::Token;
    invite.access.enqueue_key = Some(SharedKey::new(KEY));
    vec![pow, invite, room("later", 10)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_solution_admits_one_join_across_instances() {
    let redis = RedisServer::start().await;
    let a = instance(&redis, rooms()).await;
    let b = instance(&redis, rooms()).await;

    // Solved once, sent to A; replayed on B.
    let (_, refused) = join(&a, "pow", &json!({})).await;
    let token = refused["challenge"]["token"].as_str().unwrap().to_owned();
    let solution = json!({"challenge": token, "counter": narabu::access::pow::solve(&token, 8)});
    let (status, _) = join(&a, "pow", &solution).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = join(&b, "pow", &solution).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert_eq!(body["reason"], "spent");

    // Another solution sent to both instances twenty times at once.
    let (_, refused) = join(&b, "pow", &json!({})).await;
    let token = refused["challenge"]["token"].as_str().unwrap().to_owned();
    let solution = json!({"challenge": token, "counter": narabu::access::pow::solve(&token, 8)});
    let attempts: Vec<_> = (0..20)
        .map(|i| {
            let target = if i % 2 == 0 { &a } else { &b };
            join(target, "pow", &solution)
        })
        .collect();
    let results = futures_util::future::join_all(attempts).await;
    let created = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|(s, b)| *s == StatusCode::CREATED || b["reason"] == "spent")
    );
    let s = a.backend.room(&RoomId::new("pow").unwrap()).await.unwrap();
    assert_eq!(s.stats.joins, 2, "two solutions, two tickets");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_holds_one_ticket_whichever_instance_it_joins_through() {
    let redis = RedisServer::start().await;
    let a = instance(&redis, rooms()).await;
    let b = instance(&redis, rooms()).await;
    let exp = narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) / 1000 + 600;
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"aud": "invite", "sub": "member-9", "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(KEY.as_bytes()),
    )
    .unwrap();
    let body = json!({ "enqueue_token": token });
    let (status, first) = join(&a, "invite", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    // Both instances at once, as two devices would.
    let (x, y) = tokio::join!(join(&a, "invite", &body), join(&b, "invite", &body));
    for (status, again) in [x, y] {
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again["number"], first["number"]);
    }
    let s = b
        .backend
        .room(&RoomId::new("invite").unwrap())
        .await
        .unwrap();
    assert_eq!(s.stats.joins, 1);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_s_change_on_one_instance_applies_on_the_others() {
    let redis = RedisServer::start().await;
    let a = instance(&redis, rooms()).await;
    let b = instance(&redis, rooms()).await;
    // B knows the room as open to all.
    assert_eq!(join(&b, "later", &json!({})).await.0, StatusCode::CREATED);
    let r = a
        .client
        .patch(a.url("/admin/rooms/later"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"challenge": "pow", "pow_difficulty": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        join(&a, "later", &json!({})).await.0,
        StatusCode::PRECONDITION_REQUIRED
    );
    // B's book follows the rooms' samples, once a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, body) = join(&b, "later", &json!({})).await;
        if status == StatusCode::PRECONDITION_REQUIRED {
            assert_eq!(body["challenge"]["difficulty"], 10);
            break;
        }
        assert!(Instant::now() < deadline, "B still lets joins in: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_changing_different_access_rules_at_once_both_succeed() {
    let redis = RedisServer::start().await;
    let a = instance(&redis, rooms()).await;
    let b = instance(&redis, rooms()).await;
    let patch = |app: &TestApp, body: Value| {
        app.client
            .patch(app.url("/admin/rooms/invite"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    for round in 0..10u8 {
        let bits = 10 + round;
        let key = format!("rotated-key-{round:02}-rotated-key-rotated-key");
        let (x, y) = tokio::join!(
            patch(&a, json!({"challenge": "pow", "pow_difficulty": bits})),
            patch(&b, json!({"enqueue_key": key, "enqueue_previous_key": KEY}))
        );
        assert_eq!(x.unwrap().status(), StatusCode::OK);
        assert_eq!(y.unwrap().status(), StatusCode::OK);
        // A's copy shows B's change a moment after B's answer (only an
        // instance's own changes are read back at once there); a change
        // lost to the other never shows.
        let deadline = Instant::now() + Duration::from_secs(5);
        let s = loop {
            let s = a
                .backend
                .room(&RoomId::new("invite").unwrap())
                .await
                .unwrap();
            let shown = s
                .settings
                .access
                .enqueue_key
                .as_ref()
                .map(SharedKey::expose);
            if shown == Some(key.as_str()) || Instant::now() > deadline {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let access = &s.settings.access;
        assert_eq!(access.challenge, ChallengeMode::Pow, "round {round}");
        assert_eq!(access.pow_difficulty, bits, "round {round}");
        assert_eq!(
            access.enqueue_key.as_ref().map(SharedKey::expose),
            Some(key.as_str()),
            "round {round}"
        );
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_solution_stays_spent_when_the_room_changes_owner() {
    let redis = RedisServer::start().await;
    let a = instance(&redis, rooms()).await;
    let b = instance(&redis, rooms()).await;
    let pow = RoomId::new("pow").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !a.backend.decides(&pow) && !b.backend.decides(&pow) {
        assert!(Instant::now() < deadline, "nobody owns the room");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Spent through the instance that does not own the room: it reaches
    // the owner as a command, and the log says it was spent.
    let (owner, other) = if a.backend.decides(&pow) {
        (a, b)
    } else {
        (b, a)
    };
    let (_, refused) = join(&other, "pow", &json!({})).await;
    let token = refused["challenge"]["token"].as_str().unwrap().to_owned();
    let solution = json!({"challenge": token, "counter": narabu::access::pow::solve(&token, 8)});
    let (status, body) = join(&other, "pow", &solution).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The owner stops and hands the room over: the other instance runs
    // it now, and the solution is still spent there.
    owner.stop().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !other.backend.decides(&pow) {
        assert!(Instant::now() < deadline, "the room was not taken over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = join(&other, "pow", &solution).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert_eq!(body["reason"], "spent");
    // A fresh solution still makes a ticket.
    let (_, refused) = join(&other, "pow", &json!({})).await;
    let token = refused["challenge"]["token"].as_str().unwrap().to_owned();
    let fresh = json!({"challenge": token, "counter": narabu::access::pow::solve(&token, 8)});
    assert_eq!(join(&other, "pow", &fresh).await.0, StatusCode::CREATED);
    other.stop().await;
}
