//! A visitor's ticket is theirs alone: an `Idempotency-Key` is a retry id
//! that never hands a ticket to someone else, a cross-site page cannot
//! make a visitor leave, a junk cookie planted beside theirs does not cost
//! them their place, and nothing that carries a ticket may be cached.

use narabu::access::ChallengeMode;
use narabu::config::Config;
use reqwest::StatusCode;
use reqwest::header::{CACHE_CONTROL, SET_COOKIE};
use serde_json::Value;
use sha2::{Digest, Sha256};

use narabu_testkit::app::{ADMIN_TOKEN, TestApp, spawn_app, spawn_app_with};
use narabu_testkit::room;

const KEY: &str = "2f1c9e1a-5b7d-4c1e-9a3b-0d6e8f7a1b2c";

async fn join_keyed(app: &TestApp, key: &str, token: Option<&str>) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .header("idempotency-key", key);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    request.send().await.unwrap()
}

fn ticket_of(body: &Value) -> String {
    body["ticket"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_repeated_key_without_its_ticket_gets_409_and_no_token() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let first = join_keyed(&app, KEY, None).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();

    // Someone who learnt the key, without the ticket: refused, nothing
    // to take away.
    let stolen = join_keyed(&app, KEY, None).await;
    assert_eq!(stolen.status(), StatusCode::CONFLICT);
    assert!(stolen.headers().get(SET_COOKIE).is_none());
    let body: Value = stolen.json().await.unwrap();
    assert_eq!(body["error"], "idempotency_key_used", "{body}");
    assert!(body.get("ticket").is_none(), "{body}");
    assert!(!body.to_string().contains(&ticket_of(&first)));

    // The holder retrying with its ticket gets it, as before.
    let retried = join_keyed(&app, KEY, Some(&ticket_of(&first))).await;
    assert_eq!(retried.status(), StatusCode::OK);
    let retried: Value = retried.json().await.unwrap();
    assert_eq!(retried["number"], first["number"]);
    // One ticket was made in all: the next is number 2.
    assert_eq!(app.join("sale").await.number, 2);
    app.stop().await;
}

#[tokio::test]
async fn a_repeated_key_skips_no_proof_of_work() {
    let mut pow = room("sale", 5);
    pow.access.challenge = ChallengeMode::Pow;
    pow.access.pow_difficulty = 4;
    pow.access.pow_difficulty_max = 4;
    let app = spawn_app(vec![pow]).await;
    let asked: Value = join_keyed(&app, KEY, None).await.json().await.unwrap();
    let token = asked["challenge"]["token"].as_str().unwrap().to_owned();
    let counter = (0u64..)
        .find(|n| Sha256::digest(format!("{token}{n}"))[0] >> 4 == 0)
        .unwrap();
    let solved = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .header("idempotency-key", KEY)
        .json(&serde_json::json!({"challenge": token, "counter": counter}))
        .send()
        .await
        .unwrap();
    assert_eq!(solved.status(), StatusCode::CREATED);

    let replayed = join_keyed(&app, KEY, None).await;
    assert_eq!(replayed.status(), StatusCode::CONFLICT);
    let body: Value = replayed.json().await.unwrap();
    assert!(body.get("ticket").is_none(), "{body}");
    app.stop().await;
}

#[tokio::test]
async fn a_short_idempotency_key_is_refused() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let short = join_keyed(&app, "0123456789abcde", None).await;
    assert_eq!(short.status(), StatusCode::BAD_REQUEST);
    let body: Value = short.json().await.unwrap();
    assert_eq!(body["error"], "bad_idempotency_key", "{body}");
    let ok = join_keyed(&app, "0123456789abcdef", None).await;
    assert_eq!(ok.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test]
async fn a_key_is_free_again_once_its_ticket_ended() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let first: Value = join_keyed(&app, KEY, None).await.json().await.unwrap();
    let left = app
        .client
        .post(app.url("/api/rooms/sale/leave"))
        .bearer_auth(ticket_of(&first))
        .send()
        .await
        .unwrap();
    assert_eq!(left.status(), StatusCode::NO_CONTENT);
    let again = join_keyed(&app, KEY, None).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    let again: Value = again.json().await.unwrap();
    assert_ne!(again["ticket"], first["ticket"]);
    assert_eq!(again["status"], "waiting");

    // Released by the origin: free as well.
    app.tick("sale").await;
    let release = app
        .client
        .post(app.url("/api/rooms/sale/release"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&serde_json::json!({"ticket": ticket_of(&again)}))
        .send()
        .await
        .unwrap();
    assert_eq!(release.status(), StatusCode::NO_CONTENT);
    let third = join_keyed(&app, KEY, None).await;
    assert_eq!(third.status(), StatusCode::CREATED);
    let third: Value = third.json().await.unwrap();
    assert_ne!(third["ticket"], again["ticket"]);
    app.stop().await;
}

async fn leave_with(
    app: &TestApp,
    cookie: Option<&str>,
    bearer: Option<&str>,
    headers: &[(&str, &str)],
) -> StatusCode {
    let mut request = app.client.post(app.url("/api/rooms/sale/leave"));
    if let Some(t) = cookie {
        request = request.header("cookie", format!("narabu_sale={t}"));
    }
    if let Some(t) = bearer {
        request = request.bearer_auth(t);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap().status()
}

#[tokio::test]
async fn a_cross_site_post_cannot_make_a_visitor_leave() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let v = app.join("sale").await;
    let host = app.base.trim_start_matches("http://").to_owned();

    let cross = [("origin", "https://evil.example")];
    assert_eq!(
        leave_with(&app, Some(&v.token), None, &cross).await,
        StatusCode::FORBIDDEN
    );
    let opaque = [("origin", "null")];
    assert_eq!(
        leave_with(&app, Some(&v.token), None, &opaque).await,
        StatusCode::FORBIDDEN
    );
    let site = [("sec-fetch-site", "same-site")];
    assert_eq!(
        leave_with(&app, Some(&v.token), None, &site).await,
        StatusCode::FORBIDDEN
    );
    let site = [("sec-fetch-site", "cross-site")];
    assert_eq!(
        leave_with(&app, Some(&v.token), None, &site).await,
        StatusCode::FORBIDDEN
    );
    // A cross-site join with the cookie is refused too.
    let join = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .header("cookie", format!("narabu_sale={}", v.token))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(join.status(), StatusCode::FORBIDDEN);
    let body: Value = join.json().await.unwrap();
    assert_eq!(body["error"], "cross_site_request", "{body}");
    assert_eq!(app.status("sale", &v).await["status"], "waiting");

    // The queue page's own form, and an app with its Bearer ticket.
    let origin = format!("http://{host}");
    let same = [
        ("origin", origin.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let w = app.join("sale").await;
    assert_eq!(
        leave_with(&app, Some(&w.token), None, &same).await,
        StatusCode::NO_CONTENT
    );
    let own = [("origin", origin.as_str())];
    let x = app.join("sale").await;
    assert_eq!(
        leave_with(&app, Some(&x.token), None, &own).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        leave_with(&app, None, Some(&v.token), &cross).await,
        StatusCode::NO_CONTENT
    );
    app.stop().await;
}

#[tokio::test]
async fn a_junk_cookie_of_the_same_name_does_not_cost_the_place() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let _ahead = app.join("sale").await;
    let v = app.join("sale").await;
    let cookies = format!("narabu_sale=junk; narabu_sale={}", v.token);

    let status = app
        .client
        .get(app.url("/api/rooms/sale/status"))
        .header("cookie", &cookies)
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), StatusCode::OK);
    let status: Value = status.json().await.unwrap();
    assert_eq!(status["number"], v.number);

    let page = app
        .client
        .get(app.url("/queue/sale"))
        .header("cookie", &cookies)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let set = page.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        set.starts_with(&format!("narabu_sale={};", v.token)),
        "{set}"
    );
    assert_eq!(app.join("sale").await.number, 3);

    app.tick("sale").await;
    app.tick("sale").await;
    let gate = app
        .client
        .get(app.url("/gate/sale"))
        .header(
            "cookie",
            format!("narabu_sale=junk; narabu_sale={}", _ahead.token),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(gate.status(), StatusCode::NO_CONTENT);
    app.stop().await;
}

#[tokio::test]
async fn answers_carrying_a_ticket_are_never_stored() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    for _ in 0..2 {
        let joined = join_keyed(&app, KEY, None).await;
        if joined.status() == StatusCode::CREATED {
            assert_eq!(joined.headers()[CACHE_CONTROL], "no-store");
        }
    }
    let v = app.join("sale").await;
    let again = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()[CACHE_CONTROL], "no-store");
    let status = app
        .client
        .get(app.url("/api/rooms/sale/status"))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap();
    assert_eq!(status.headers()[CACHE_CONTROL], "no-store");
    let events = app
        .client
        .get(app.url("/api/rooms/sale/events"))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK);
    assert_eq!(events.headers()[CACHE_CONTROL], "no-store");
    drop(events);
    app.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let v = app.join("sale").await;
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let status = app
            .client
            .get(app.url("/api/rooms/sale/status"))
            .header("authorization", format!("{scheme} {}", v.token))
            .send()
            .await
            .unwrap();
        assert_eq!(status.status(), StatusCode::OK, "{scheme}");
        let admin = app
            .client
            .get(app.url("/admin/rooms/sale"))
            .header("authorization", format!("{scheme} {ADMIN_TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(admin.status(), StatusCode::OK, "{scheme}");
    }
    app.stop().await;
}

#[tokio::test]
async fn with_cookie_secure_the_ticket_cookie_is_host_prefixed() {
    let config = Config {
        cookie_secure: true,
        ..narabu_testkit::app::config()
    };
    let app = spawn_app_with(config, vec![room("sale", 1)]).await;
    let joined = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), StatusCode::CREATED);
    let set = joined.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    let body: Value = joined.json().await.unwrap();
    let token = ticket_of(&body);
    assert!(
        set.starts_with(&format!("__Host-narabu_sale={token};")),
        "{set}"
    );
    assert!(set.contains("Secure") && set.contains("Path=/"), "{set}");
    assert!(!set.to_ascii_lowercase().contains("domain="), "{set}");

    let with = |cookie: String| {
        app.client
            .get(app.url("/api/rooms/sale/status"))
            .header("cookie", cookie)
            .send()
    };
    let prefixed = with(format!("__Host-narabu_sale={token}")).await.unwrap();
    assert_eq!(prefixed.status(), StatusCode::OK);
    // A sibling subdomain can set the bare name, never the prefixed one.
    let bare = with(format!("narabu_sale={token}")).await.unwrap();
    assert_eq!(bare.status(), StatusCode::UNAUTHORIZED);
    app.stop().await;
}
