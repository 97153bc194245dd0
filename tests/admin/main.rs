//! Integration tests of the operators' side against the real server: the
//! admin API (auth, every endpoint's success and 422s, live changes under
//! load), `/metrics` and webhooks.

mod churn;
mod metrics;
mod pages;
mod standard_webhooks;
mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use narabu::backend::embedded::EmbeddedBackend;
use narabu::config::Config;
use narabu::engine::SystemClock;
use narabu_testkit::app::{
    ADMIN_TOKEN, TestApp, Visitor, config, next_event, spawn_app, spawn_with,
};
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::{Value, json};

pub async fn admin(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = app
        .client
        .request(method, app.url(path))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    (status, value)
}

pub async fn get_room(app: &TestApp, id: &str) -> Value {
    let (status, body) = admin(
        app,
        reqwest::Method::GET,
        &format!("/admin/rooms/{id}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

#[tokio::test]
async fn admin_is_absent_without_a_token() {
    let backend = EmbeddedBackend::without_workers(vec![room("sale", 2)], Arc::new(SystemClock));
    let app = spawn_with(
        Config {
            admin_token: None,
            ..config()
        },
        backend,
    )
    .await;
    for (method, path) in [
        ("GET", "/admin"),
        ("GET", "/admin/rooms"),
        ("GET", "/admin/rooms/sale"),
        ("PATCH", "/admin/rooms/sale"),
        ("DELETE", "/admin/rooms/sale"),
        ("POST", "/admin/rooms/sale/revoke"),
        ("GET", "/admin/events"),
    ] {
        let response = app
            .client
            .request(method.parse().unwrap(), app.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{method} {path}");
    }
    // The room is untouched and the rest of the service works.
    assert_eq!(app.join("sale").await.number, 1);
    app.stop().await;
}

#[tokio::test]
async fn admin_refuses_missing_and_wrong_tokens() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let wrong_len = "x".repeat(ADMIN_TOKEN.len());
    let almost = format!("{}X", &ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1]);
    let headers: [Option<String>; 6] = [
        None,
        Some(format!("Bearer {wrong_len}")),
        Some(format!("Bearer {almost}")),
        Some("Bearer ".into()),
        Some(format!("Basic {ADMIN_TOKEN}")),
        Some(ADMIN_TOKEN.into()),
    ];
    for header in headers {
        for (method, path) in [
            ("GET", "/admin/rooms"),
            ("PATCH", "/admin/rooms/sale"),
            ("DELETE", "/admin/rooms/sale"),
            ("GET", "/admin/events"),
        ] {
            let mut request = app.client.request(method.parse().unwrap(), app.url(path));
            if let Some(h) = &header {
                request = request.header("authorization", h);
            }
            let response = request.send().await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {header:?}"
            );
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["error"], "unauthorized");
            assert!(!body.to_string().contains(ADMIN_TOKEN));
        }
    }
    // Nothing changed, and the right token works.
    let body = get_room(&app, "sale").await;
    assert_eq!(body["state"], "open");
    // The dashboard page itself needs no header (the browser cannot send
    // one on navigation); it asks for the token.
    let page = app.client.get(app.url("/admin")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains("/static/admin.js?v="), "{html}");
    assert!(!html.contains("<script>"), "no inline script");
    app.stop().await;
}

#[tokio::test]
async fn rooms_show_settings_and_live_figures() {
    let app = spawn_app(vec![room("sale", 2), room("other", 5)]).await;
    let visitors = [
        app.join("sale").await,
        app.join("sale").await,
        app.join("sale").await,
        app.join("sale").await,
        app.join("sale").await,
    ];
    app.tick("sale").await;
    assert_eq!(
        app.leave("sale", &visitors[0]).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.leave("sale", &visitors[4]).await,
        StatusCode::NO_CONTENT
    );

    let (status, list) = admin(&app, reqwest::Method::GET, "/admin/rooms", None).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = list["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["other", "sale"]);

    let r = get_room(&app, "sale").await;
    assert_eq!(r["capacity"], 2);
    assert_eq!(r["settings"]["capacity"], 2);
    assert_eq!(r["settings"]["tick"], "1s");
    assert_eq!(r["state"], "open");
    // Two admitted at the tick; one left, handing its permit to number 3.
    assert_eq!(r["admitted"], 2);
    assert_eq!(r["waiting"], 1, "{r}");
    assert_eq!(r["joins"], 5);
    assert_eq!(r["admissions"], 3);
    assert_eq!(r["handoffs"], 1);
    assert_eq!(r["releases"], 1);
    assert_eq!(r["leaves"], 1);
    assert_eq!(r["revocations"], 0);
    assert_eq!(r["abandonments"], 0);
    assert_eq!(r["tray"], 0);
    assert_eq!(r["debt"], 0);
    assert_eq!(r["order"], "lottery");
    // Admitted within a second of joining: the first bucket bounds below 1s.
    assert!(r["wait_p50_ms"].as_u64().unwrap() <= 1_000, "{r}");
    assert!(r["wait_p95_ms"].as_u64().unwrap() >= r["wait_p50_ms"].as_u64().unwrap());
    assert!(r["admissions_per_second"].is_number());
    assert!(r.get("lottery_commitment").is_some());

    let (status, body) = admin(&app, reqwest::Method::GET, "/admin/rooms/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "unknown_room");
    let (status, _) = admin(&app, reqwest::Method::GET, "/admin/rooms/Bad_Name", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test]
async fn put_creates_and_replaces_rooms_with_the_config_rules() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let put = reqwest::Method::PUT;

    let (status, created) = admin(
        &app,
        put.clone(),
        "/admin/rooms/flash",
        Some(json!({"capacity": 20, "tick": "500ms", "order": "fifo", "join_limit_per_minute": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["id"], "flash");
    assert_eq!(created["capacity"], 20);
    assert_eq!(created["settings"]["tick"], "500ms");
    assert_eq!(created["order"], "fifo");
    let v = app.join("flash").await;
    assert_eq!(v.number, 1);

    // Replacing: a new epoch, old tickets void.
    let (status, replaced) = admin(
        &app,
        put.clone(),
        "/admin/rooms/flash",
        Some(json!({"id": "flash", "capacity": 3, "opens_at": "2030-01-01T00:00:00+09:00"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    assert_ne!(replaced["epoch"], created["epoch"]);
    assert_eq!(replaced["state"], "scheduled");
    assert_eq!(replaced["opens_at"], "2029-12-31T15:00:00Z");
    assert_eq!(replaced["joins"], 0);
    let stale = app
        .client
        .get(app.url("/api/rooms/flash/status"))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap();
    // The old ticket's line was reset by the replacement, and is told so.
    assert_eq!(stale.status(), StatusCode::GONE);
    let stale: Value = stale.json().await.unwrap();
    assert_eq!(stale["error"], "line_reset");

    for (body, field) in [
        (
            json!({"capacity": 0}),
            "capacity: must be between 1 and 1000000, got 0",
        ),
        (json!({"capacity": "many"}), "capacity: invalid type"),
        (json!({"capacity": -4}), "capacity: invalid value"),
        (
            json!({"tick": "5ms"}),
            "tick: must be between 10ms and 1m, got 5ms",
        ),
        (json!({"tick": 1000}), "tick: invalid type"),
        (json!({"pass_idle": "0s"}), "pass_idle: must be more than 0"),
        (
            json!({"admit_per_minute": 0}),
            "admit_per_minute: must be at least 1",
        ),
        (
            json!({"opens_at": "tomorrow"}),
            "opens_at: expected an RFC 3339 time",
        ),
        (json!({"order": "random"}), "order: unknown variant"),
        (json!({"capcity": 5}), "capcity: unknown field `capcity`"),
        (json!({"id": "other"}), "id: must be the room of the path"),
    ] {
        let (status, err) =
            admin(&app, put.clone(), "/admin/rooms/flash", Some(body.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {err}");
        assert_eq!(err["error"], "invalid_field");
        let message = err["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{body}: {message}");
    }
    let (status, err) = admin(&app, put.clone(), "/admin/rooms/flash", Some(json!([1]))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    let raw = app
        .client
        .put(app.url("/admin/rooms/flash"))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    let (status, _) = admin(&app, put, "/admin/rooms/NO", Some(json!({}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // None of the refused bodies changed the room.
    assert_eq!(get_room(&app, "flash").await["capacity"], 3);
    app.stop().await;
}

#[tokio::test]
async fn patch_changes_a_running_room() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let patch = reqwest::Method::PATCH;
    let visitors = [
        app.join("sale").await,
        app.join("sale").await,
        app.join("sale").await,
    ];

    let (status, r) = admin(
        &app,
        patch.clone(),
        "/admin/rooms/sale",
        Some(json!({"paused": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["state"], "paused");
    app.tick("sale").await;
    assert_eq!(app.status("sale", &visitors[0]).await["status"], "waiting");

    let (_, r) = admin(
        &app,
        patch.clone(),
        "/admin/rooms/sale",
        Some(json!({"paused": false, "capacity": 1, "admit_per_minute": 600, "pass_idle": "20m", "tick": "250ms"})),
    )
    .await;
    assert_eq!(r["state"], "open");
    assert_eq!(r["capacity"], 1);
    assert_eq!(r["settings"]["admit_per_minute"], 600);
    assert_eq!(r["settings"]["pass_idle"], "20m");
    assert_eq!(r["settings"]["tick"], "250ms");
    app.tick("sale").await;
    assert_eq!(app.status("sale", &visitors[0]).await["status"], "admitted");
    assert_eq!(app.status("sale", &visitors[1]).await["status"], "waiting");

    let (_, r) = admin(
        &app,
        patch.clone(),
        "/admin/rooms/sale",
        Some(json!({"admit_per_minute": null})),
    )
    .await;
    assert!(r["settings"].get("admit_per_minute").is_none(), "{r}");
    assert_eq!(r["settings"]["pass_idle"], "20m", "other settings stay");

    for (body, message) in [
        (
            json!({"capacity": 0}),
            "capacity: must be between 1 and 1000000",
        ),
        (
            json!({"capacity": 1_000_001}),
            "capacity: must be between 1 and 1000000",
        ),
        (
            json!({"queue_idle": "31days"}),
            "queue_idle: must be at most 30days",
        ),
        (json!({"paused": "yes"}), "paused: invalid type"),
        (json!({"open_now": 1}), "open_now: must be true or false"),
        (
            json!({"order": "fifo"}),
            "order: cannot be changed on a running room",
        ),
        (
            json!({"opens_at": "2030-01-01T00:00:00Z"}),
            "opens_at: cannot be changed",
        ),
        (
            json!({"lanes": [{"name": "members", "weight": 1}]}),
            "lanes: cannot be changed on a running room (PUT the room",
        ),
        (
            json!({"default_lane": "members"}),
            "default_lane: cannot be changed",
        ),
        (
            json!({"lane_weights": {"members": 5}}),
            "lane_weights: the room has no lanes",
        ),
        (json!({"capacty": 3}), "capacty: unknown field"),
    ] {
        let (status, err) =
            admin(&app, patch.clone(), "/admin/rooms/sale", Some(body.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {err}");
        assert!(
            err["message"].as_str().unwrap().starts_with(message),
            "{body}: {err}"
        );
    }
    assert_eq!(get_room(&app, "sale").await["capacity"], 1);
    let (status, _) = admin(
        &app,
        patch.clone(),
        "/admin/rooms/nope",
        Some(json!({"capacity": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Open now: a scheduled room draws its pre-queue at once.
    let (status, _) = admin(
        &app,
        reqwest::Method::PUT,
        "/admin/rooms/later",
        Some(
            json!({"capacity": 5, "opens_at": "2099-01-01T00:00:00Z", "join_limit_per_minute": 0}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let early = app
        .client
        .post(app.url("/api/rooms/later/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(early.status(), StatusCode::CREATED);
    let body: Value = early.json().await.unwrap();
    assert!(body["number"].is_null(), "in the pre-queue: {body}");
    let early = Visitor {
        token: body["ticket"].as_str().unwrap().to_owned(),
        number: 0,
        body,
    };
    assert_eq!(app.status("later", &early).await["status"], "waiting");
    let (_, r) = admin(
        &app,
        patch,
        "/admin/rooms/later",
        Some(json!({"open_now": true})),
    )
    .await;
    assert_eq!(r["state"], "open", "{r}");
    assert!(
        r["lottery_seed"].is_string(),
        "the draw's seed is published: {r}"
    );
    app.tick("later").await;
    assert_eq!(app.status("later", &early).await["status"], "admitted");
    app.stop().await;
}

#[tokio::test]
async fn delete_closes_the_room_and_tells_waiting_visitors() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let first = app.join("sale").await;
    let waiting = app.join("sale").await;
    app.tick("sale").await;
    let mut stream = app.events("sale", &waiting).await;
    let event = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(event.event, "position");

    let (status, body) = admin(&app, reqwest::Method::DELETE, "/admin/rooms/sale", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let event = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(event.event, "closed");

    assert_eq!(get_room(&app, "sale").await["state"], "closed");
    let join = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(join.status(), StatusCode::GONE);
    assert_eq!(app.status("sale", &waiting).await["status"], "closed");
    // The waiting visitor's page says the room closed.
    let page = app
        .client
        .get(app.url("/queue/sale"))
        .header("cookie", format!("narabu_sale={}", waiting.token))
        .send()
        .await
        .unwrap();
    let html = page.text().await.unwrap();
    assert!(html.to_lowercase().contains("closed"), "{html}");
    // Closing twice is harmless; changing a closed room is refused.
    let (status, _) = admin(&app, reqwest::Method::DELETE, "/admin/rooms/sale", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = admin(
        &app,
        reqwest::Method::PATCH,
        "/admin/rooms/sale",
        Some(json!({"capacity": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::GONE);
    let (status, _) = admin(&app, reqwest::Method::DELETE, "/admin/rooms/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    drop(first);
    app.stop().await;
}

#[tokio::test]
async fn revoke_takes_a_permit_back_once() {
    let app = spawn_app(vec![room("sale", 1), room("other", 1)]).await;
    let a = app.join("sale").await;
    let b = app.join("sale").await;
    let c = app.join("sale").await;
    app.tick("sale").await;
    assert_eq!(app.status("sale", &a).await["status"], "admitted");

    let revoke = |token: Value| {
        admin(
            &app,
            reqwest::Method::POST,
            "/admin/rooms/sale/revoke",
            Some(token),
        )
    };
    let (status, r) = revoke(json!({"ticket": a.token})).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(
        r,
        json!({"revoked": true, "was": "admitted", "permit": "handed_to_next"})
    );
    assert_eq!(app.status("sale", &a).await["status"], "expired");
    assert_eq!(app.status("sale", &b).await["status"], "admitted");
    // Again: nothing more is freed.
    let (_, r) = revoke(json!({"ticket": a.token})).await;
    assert_eq!(r["revoked"], false);
    assert_eq!(r["was"], "revoked");
    let (_, r) = revoke(json!({"ticket": c.token})).await;
    assert_eq!(
        r,
        json!({"revoked": true, "was": "waiting", "permit": null})
    );
    let room = get_room(&app, "sale").await;
    assert_eq!(room["admitted"], 1);
    assert_eq!(room["waiting"], 0);
    assert_eq!(room["revocations"], 2, "both revocations count");

    let other = app.join("other").await;
    for (body, message) in [
        (json!({}), "ticket: missing field"),
        (json!({"ticket": 5}), "ticket: invalid type"),
        (
            json!({"ticket": "garbage"}),
            "ticket: the ticket token is malformed",
        ),
        (
            json!({"ticket": other.token}),
            "ticket: belongs to the room \"other\"",
        ),
        (json!({"ticket": b.token, "why": "x"}), "why: unknown field"),
    ] {
        let (status, err) = revoke(body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {err}");
        assert!(
            err["message"].as_str().unwrap().starts_with(message),
            "{body}: {err}"
        );
    }
    assert_eq!(app.status("sale", &b).await["status"], "admitted");

    // A ticket of the room's line before a PUT replaced it is not in this
    // room: 404, as the document says, not the visitors' 410.
    let (status, _) = admin(
        &app,
        reqwest::Method::PUT,
        "/admin/rooms/sale",
        Some(json!({"capacity": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, err) = revoke(json!({"ticket": b.token})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{err}");
    assert_eq!(err["error"], "unknown_ticket");
    app.stop().await;
}
