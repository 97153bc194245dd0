//! Traffic rules over HTTP: set with the admin API (refused with the
//! rule and field named when wrong), applied by the gate to what the
//! proxy says the visitor asked for, and counted. Runs on either backend
//! (`NARABU_TEST_BACKEND`).

use narabu_testkit::app::{ADMIN_TOKEN, TestApp, config, spawn_app_with};
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn send(
    app: &TestApp,
    method: reqwest::Method,
    room: &str,
    body: Value,
) -> (StatusCode, Value) {
    let response = app
        .client
        .request(method, app.url(&format!("/admin/rooms/{room}")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

/// A gate check as nginx sends it: the original URI and method, the
/// visitor's user agent, and the address chain it was given.
async fn check(
    app: &TestApp,
    room: &str,
    uri: &str,
    client: &str,
    agent: &str,
) -> reqwest::Response {
    app.client
        .get(app.url(&format!("/gate/{room}")))
        .header("x-original-uri", uri)
        .header("x-forwarded-method", "GET")
        .header("x-forwarded-for", client)
        .header("user-agent", agent)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn rules_set_live_let_through_block_and_queue_and_are_counted() {
    let app = spawn_app_with(
        narabu::config::Config {
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            ..config()
        },
        vec![room("sale", 1)],
    )
    .await;
    let browser = "Mozilla/5.0";
    // No rules: the line.
    assert_eq!(
        check(&app, "sale", "/healthz", "192.0.2.1", browser)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );

    // A wrong rule is refused whole, naming the rule and the field.
    let (code, body) = send(
        &app,
        reqwest::Method::PATCH,
        "sale",
        json!({"rules": [
            {"action": "bypass", "path_prefix": ["/healthz"]},
            {"action": "block", "network": ["198.51.100.0/33"]},
        ]}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("rules[1].network"),
        "{body}"
    );
    let (code, body) = send(
        &app,
        reqwest::Method::PATCH,
        "sale",
        json!({"rules": [
            {"action": "bypass", "path_prefix": ["health"]},
        ]}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("rules[0].path_prefix[0]"),
        "{body}"
    );
    assert_eq!(
        check(&app, "sale", "/healthz", "192.0.2.1", browser)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );

    let (code, body) = send(&app, reqwest::Method::PATCH, "sale", json!({"rules": [
        {"name": "health", "action": "bypass", "path_prefix": ["/healthz"], "method": ["GET"]},
        {"name": "bad-net", "action": "block", "network": ["198.51.100.0/24"]},
        {"name": "crawlers", "action": "bypass", "path": ["/events/*"], "user_agent": ["Googlebot"]},
    ]})).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        body["settings"]["rules"][1]["network"],
        json!(["198.51.100.0/24"])
    );

    // Through without a ticket, and nobody joins the line for it.
    let through = check(&app, "sale", "/healthz?full=1", "198.51.100.7", browser).await;
    assert_eq!(through.status(), StatusCode::NO_CONTENT);
    assert!(through.headers().get("set-cookie").is_none());
    // The network, whatever the page.
    let blocked = check(&app, "sale", "/tickets", "198.51.100.7", browser).await;
    assert_eq!(blocked.status(), StatusCode::FORBIDDEN);
    assert_eq!(blocked.json::<Value>().await.unwrap()["error"], "blocked");
    // A crawler on a public page, not on the rest.
    let bot = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";
    assert_eq!(
        check(&app, "sale", "/events/final", "192.0.2.1", bot)
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        check(&app, "sale", "/events/final/seats", "192.0.2.1", bot)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        check(&app, "sale", "/events/final", "192.0.2.1", browser)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    // A client's own forwarded address counts only through a trusted
    // proxy: this one is the nearest hop.
    assert_eq!(
        check(&app, "sale", "/tickets", "198.51.100.7, 192.0.2.9", browser)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );

    let view = app.admin_room("sale").await;
    assert_eq!(view["waiting"], 0);
    assert_eq!(
        view["rule_matches"],
        json!([
            {"rule": "health", "action": "bypass", "matches": 1},
            {"rule": "bad-net", "action": "block", "matches": 1},
            {"rule": "crawlers", "action": "bypass", "matches": 1},
        ])
    );
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
        metrics
            .contains(r#"narabu_rule_matches_total{room="sale",rule="bad-net",action="block"} 1"#),
        "{metrics}"
    );

    // PUT replaces the room with its rules; `null` clears them.
    let (code, body) = send(
        &app,
        reqwest::Method::PUT,
        "other",
        json!({"rules": [
            {"action": "block", "method": ["POST"]},
            {"action": "maybe"},
        ]}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("rules[1].action"),
        "{body}"
    );
    let (code, body) = send(
        &app,
        reqwest::Method::PUT,
        "other",
        json!({"rules": [
            {"action": "bypass", "host": ["*.example.com"]},
        ]}),
    )
    .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let on_host = app
        .client
        .get(app.url("/gate/other"))
        .header("x-forwarded-host", "shop.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(on_host.status(), StatusCode::NO_CONTENT);
    let (code, _) = send(&app, reqwest::Method::PATCH, "sale", json!({"rules": null})).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        check(&app, "sale", "/healthz", "192.0.2.1", browser)
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(app.admin_room("sale").await["rule_matches"], json!([]));
}

/// `GET /gate` without a room: the rooms' routes pick it; a request no
/// route covers is refused, or let through with `?unrouted=pass`; a route
/// already claimed is refused naming the room that holds it.
#[tokio::test]
async fn the_site_gate_routes_by_host_and_path() {
    let mut presale = room("presale", 1);
    presale.routes = serde_json::from_value(json!([{"path_prefix": "/presale/"}])).unwrap();
    let app = spawn_app_with(config(), vec![presale, room("other", 1)]).await;
    let site = |uri: &str, query: &str| {
        app.client
            .get(app.url(&format!("/gate{query}")))
            .header("x-original-uri", uri)
            .header("x-forwarded-host", "shop.example.com")
            .send()
    };
    let refused = site("/presale/a", "").await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(
        refused.headers()["x-narabu-queue"]
            .to_str()
            .unwrap()
            .starts_with("/queue/presale?return=")
    );
    let unrouted = site("/about", "").await.unwrap();
    assert_eq!(unrouted.status(), StatusCode::FORBIDDEN);
    assert_eq!(unrouted.json::<Value>().await.unwrap()["error"], "no_route");
    assert_eq!(
        site("/about", "?unrouted=pass").await.unwrap().status(),
        StatusCode::NO_CONTENT
    );

    // The same route for another room: refused, naming the holder.
    let (code, body) = send(
        &app,
        reqwest::Method::PUT,
        "other",
        json!({"routes": [{"path_prefix": "/x/"}, {"path_prefix": "/presale/"}]}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("routes[1]") && message.contains("\"presale\""),
        "{body}"
    );
    let (code, body) = send(
        &app,
        reqwest::Method::PATCH,
        "other",
        json!({"routes": [{"path_prefix": "/x/"}]}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("routes: cannot be changed on a running room"),
        "{body}"
    );
    // A host route of its own: the host's requests go there at once.
    let (code, body) = send(
        &app,
        reqwest::Method::PUT,
        "other",
        json!({"routes": [{"host": "shop.example.com", "path_prefix": "/"}]}),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let to_other = site("/presale/a", "").await.unwrap();
    assert!(
        to_other.headers()["x-narabu-queue"]
            .to_str()
            .unwrap()
            .starts_with("/queue/other?return=")
    );
}
