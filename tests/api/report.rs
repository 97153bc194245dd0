//! The sale's report against the test's own count of the same run, on
//! whichever backend the suite runs on: the clock is the test's, so it
//! knows when each visitor joined, was admitted and left, and computes the
//! waits, time on the site, endings, shares and refusals itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use narabu::backend::Backend;
use narabu::engine::{ManualClock, RoomSettings};
use narabu_testkit::app::{ADMIN_TOKEN, TestApp, Visitor, config, spawn_with};
use narabu_testkit::redis_server::T0;
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The app on the test's clock, and the Redis server it runs on, if any
/// (kept for as long as the test runs).
async fn app_on(
    clock: &ManualClock,
    rooms: Vec<RoomSettings>,
) -> (TestApp, Option<narabu_testkit::redis_server::RedisServer>) {
    if std::env::var("NARABU_TEST_BACKEND").as_deref() == Ok("redis") {
        use narabu_testkit::redis_server::{RedisServer, owners_on, ticked_by_the_test};
        let redis = RedisServer::start().await;
        let backend: Arc<dyn Backend> = owners_on(
            &redis,
            rooms,
            Arc::new(clock.clone()),
            ticked_by_the_test(),
            narabu::config::RedisWait::OFF,
        )
        .await;
        return (spawn_with(config(), backend).await, Some(redis));
    }
    let backend =
        narabu::backend::embedded::EmbeddedBackend::without_workers(rooms, Arc::new(clock.clone()));
    (spawn_with(config(), backend).await, None)
}

/// Nearest-rank quantile, as the test understands it.
fn quantile(values: &[u64], q: f64) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The visitors admitted since `known` was noted.
async fn admitted_now(app: &TestApp, v: &[Visitor], known: &HashMap<usize, u64>) -> Vec<usize> {
    let mut new = Vec::new();
    for (i, w) in v.iter().enumerate() {
        if !known.contains_key(&i) && app.status("sale", w).await["status"] == "admitted" {
            new.push(i);
        }
    }
    new
}

async fn post(app: &TestApp, path: &str, body: Value) -> StatusCode {
    app.client
        .post(app.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reports_figures_are_the_tests_own_count_of_the_run() {
    let clock = ManualClock::new(T0);
    let mut s = room("sale", 2);
    s.join_limit_per_minute = 6;
    let (app, _redis) = app_on(&clock, vec![s]).await;
    let now = || narabu::engine::Clock::now_ms(&clock);

    // Six join a second apart; the seventh from the same address is
    // refused by the join limit.
    let mut joined: HashMap<usize, u64> = HashMap::new();
    let mut v: Vec<Visitor> = Vec::new();
    for i in 0..6 {
        joined.insert(i, now());
        v.push(app.join("sale").await);
        clock.advance(Duration::from_secs(1));
    }
    let refused = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    let mut admitted: HashMap<usize, u64> = HashMap::new();
    let mut left_site: HashMap<usize, u64> = HashMap::new();
    clock.set(T0 + 10_000);
    app.tick("sale").await;
    for i in admitted_now(&app, &v, &admitted).await {
        admitted.insert(i, now());
    }
    clock.set(T0 + 11_000);
    assert_eq!(app.leave("sale", &v[2]).await, StatusCode::NO_CONTENT);
    clock.set(T0 + 16_000);
    assert_eq!(
        post(
            &app,
            "/api/rooms/sale/release",
            json!({"ticket": v[0].token})
        )
        .await,
        StatusCode::NO_CONTENT
    );
    left_site.insert(0, now());
    for i in admitted_now(&app, &v, &admitted).await {
        admitted.insert(i, now());
    }
    clock.set(T0 + 17_000);
    assert!(
        post(
            &app,
            "/admin/rooms/sale/revoke",
            json!({"ticket": v[4].token})
        )
        .await
        .is_success()
    );
    clock.set(T0 + 20_000);
    assert_eq!(
        post(
            &app,
            "/api/rooms/sale/release",
            json!({"ticket": v[1].token})
        )
        .await,
        StatusCode::NO_CONTENT
    );
    left_site.insert(1, now());
    for i in admitted_now(&app, &v, &admitted).await {
        admitted.insert(i, now());
    }
    assert_eq!(admitted.len(), 4, "two at the tick, one per release");

    let report: Value = app
        .client
        .get(app.url("/admin/rooms/sale/report"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let waits: Vec<u64> = admitted.iter().map(|(i, at)| at - joined[i]).collect();
    let on_site: Vec<u64> = left_site.iter().map(|(i, at)| at - admitted[i]).collect();
    assert_eq!(report["joins"], 6, "{report}");
    assert_eq!(report["admissions"], admitted.len());
    for (q, key) in [(0.5, "p50_ms"), (0.9, "p90_ms"), (0.99, "p99_ms")] {
        assert_eq!(
            report["waits"][key],
            quantile(&waits, q),
            "waits {key}: {report}"
        );
        assert_eq!(
            report["time_on_site"][key],
            quantile(&on_site, q),
            "time on site {key}"
        );
    }
    // Places 1 to 9: every admission here.
    assert_eq!(report["waits_by_place"][0]["from"], 1);
    assert_eq!(report["waits_by_place"][0]["count"], admitted.len());
    let e = &report["endings"];
    assert_eq!(
        (
            e["released"].as_u64(),
            e["left"].as_u64(),
            e["revoked"].as_u64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(e["abandonment"], 1.0 / 6.0);
    // Every join and admission fell in the sale's first minute.
    assert_eq!(report["timeline"][0]["at"], T0 - T0 % 60_000);
    assert_eq!(report["timeline"][0]["joins"], 6);
    assert_eq!(report["timeline"][0]["admissions"], admitted.len());
    assert_eq!(report["fairness"]["unexplained"], 0);
    assert_eq!(
        report["fairness"]["shares"][0]["admissions"],
        admitted.len()
    );
    assert_eq!(report["fairness"]["shares"][0]["share"], 1.0);
    let refusals = report["refused"].as_array().unwrap();
    assert_eq!(refusals.len(), 1, "{report}");
    assert_eq!(refusals[0]["count"], 1);
    let record: Value = app
        .client
        .get(app.url("/api/rooms/sale/record"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(report["fairness"]["head"], record["head"]);

    // The same figures as CSV.
    let csv = app
        .client
        .get(app.url("/admin/rooms/sale/report?format=csv"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(csv.headers()["content-type"], "text/csv; charset=utf-8");
    let csv = csv.text().await.unwrap();
    assert!(csv.starts_with("section,key,value\n"), "{csv}");
    assert!(
        csv.contains(&format!("waits,p50_ms,{}\n", quantile(&waits, 0.5))),
        "{csv}"
    );
    assert!(csv.contains("endings,released,2\n"), "{csv}");
    // Operators only.
    let anonymous = app
        .client
        .get(app.url("/admin/rooms/sale/report"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    app.stop().await;
}

async fn get_json(app: &TestApp, path: &str) -> (StatusCode, Value) {
    let r = app
        .client
        .get(app.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_lines_report_is_kept_for_thirty_days_then_gone() {
    const DAY_MS: u64 = 86_400_000;
    let clock = ManualClock::new(T0);
    let (app, _redis) = app_on(&clock, vec![room("sale", 5)]).await;
    for _ in 0..3 {
        app.join("sale").await;
    }
    app.tick("sale").await;
    let (_, live) = get_json(&app, "/admin/rooms/sale/report").await;
    assert_eq!(
        (live["joins"].as_u64(), live["admissions"].as_u64()),
        (Some(3), Some(3))
    );
    let epoch = live["epoch"].as_u64().unwrap();

    // An operator replaces the line: its report is kept.
    let put = app
        .client
        .put(app.url("/admin/rooms/sale"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"capacity": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    let (_, now) = get_json(&app, "/admin/rooms/sale/report").await;
    assert_ne!(now["epoch"].as_u64(), Some(epoch), "a new line");
    assert_eq!(now["joins"].as_u64(), Some(0));
    let (status, list) = get_json(&app, "/admin/rooms/sale/reports").await;
    assert_eq!(status, StatusCode::OK);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["epoch"].as_u64(), Some(epoch));
    assert_eq!(list[0]["ended_at"].as_u64(), Some(T0));
    assert_eq!(list[0]["expires_at"].as_u64(), Some(T0 + 30 * DAY_MS));
    assert_eq!(
        list[0]["url"],
        format!("/admin/rooms/sale/report?epoch={epoch}")
    );
    let (status, kept) = get_json(&app, &format!("/admin/rooms/sale/report?epoch={epoch}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(kept, live, "the kept report is the line's report");
    let csv = app
        .client
        .get(app.url(&format!(
            "/admin/rooms/sale/report?epoch={epoch}&format=csv"
        )))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(csv.status(), StatusCode::OK);
    assert!(csv.text().await.unwrap().contains(&epoch.to_string()));

    // A line nobody joined leaves nothing to keep.
    let put = app
        .client
        .put(app.url("/admin/rooms/sale"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"capacity": 6}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    let (_, list) = get_json(&app, "/admin/rooms/sale/reports").await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");

    let (status, err) = get_json(&app, "/admin/rooms/sale/report?epoch=12345").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(err["error"], "no_report");
    let (status, _) = get_json(&app, "/admin/rooms/sale/report?epoch=soon").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Thirty days on, it is gone.
    clock.advance(Duration::from_millis(30 * DAY_MS - 1));
    let (_, list) = get_json(&app, "/admin/rooms/sale/reports").await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "not yet");
    clock.advance(Duration::from_millis(1));
    let (_, list) = get_json(&app, "/admin/rooms/sale/reports").await;
    assert_eq!(list, json!([]));
    let (status, _) = get_json(&app, &format!("/admin/rooms/sale/report?epoch={epoch}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
