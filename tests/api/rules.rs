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

/// The server behind a proxy on 127.0.0.1, which it trusts to name the
/// client (`X-Forwarded-For`).
pub async fn behind_local_proxy(rooms: Vec<narabu::engine::RoomSettings>) -> TestApp {
    spawn_app_with(
        narabu::config::Config {
            trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
            ..config()
        },
        rooms,
    )
    .await
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
    let app = behind_local_proxy(vec![room("sale", 1)]).await;
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

/// A join as a browser sends it from `client` (through the trusted proxy
/// on 127.0.0.1), with the ticket it holds.
async fn join_from(
    app: &TestApp,
    room: &str,
    client: &str,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = app
        .client
        .post(app.url(&format!("/api/rooms/{room}/join")))
        .header("x-forwarded-for", client);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let code = response.status();
    (code, response.json().await.unwrap())
}

async fn status_of(app: &TestApp, room: &str, token: &str) -> Value {
    let response = app
        .client
        .get(app.url(&format!("/api/rooms/{room}/status")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

/// A `shadow` rule: its network's joins get tickets and figures that look
/// like the real line's and move with it, but never a place in it, never
/// through the gate, and never a change to what the real line sees.
#[tokio::test]
async fn a_shadow_network_queues_in_a_line_that_never_admits_and_the_real_line_never_sees_it() {
    let mut sale = room("sale", 1);
    sale.rules = serde_json::from_value(json!([
        {"name": "scrapers", "action": "shadow", "network": ["203.0.113.0/24"]},
        {"name": "bad-net", "action": "block", "network": ["198.51.100.0/24"]},
    ]))
    .unwrap();
    let app = behind_local_proxy(vec![sale]).await;
    // Fifteen real visitors (more than a shadow ticket's floor); the
    // first is let in.
    let mut real = Vec::new();
    for i in 1..=15 {
        let (code, body) = join_from(&app, "sale", &format!("192.0.2.{i}"), None).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        real.push(body);
    }
    app.tick("sale").await;
    let before: Vec<Value> = {
        let mut v = Vec::new();
        for r in &real {
            v.push(status_of(&app, "sale", r["ticket"].as_str().unwrap()).await);
        }
        v
    };
    assert_eq!(before[0]["status"], "admitted");
    assert_eq!(before[2]["position"], 2);

    // Shadow joins: the same answer, to the byte shape.
    let mut shadows = Vec::new();
    for i in 1..=4 {
        let (code, body) = join_from(&app, "sale", &format!("203.0.113.{i}"), None).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        assert_eq!(keys(&body), keys(&real[2]), "{body}");
        let (token, real_token) = (
            body["ticket"].as_str().unwrap(),
            real[2]["ticket"].as_str().unwrap(),
        );
        assert_eq!(token.len(), real_token.len());
        assert_eq!(body["status"], "waiting");
        assert!(body["number"].as_u64().unwrap() >= 16, "{body}");
        // Behind the real line, and never at its head.
        assert!(body["position"].as_u64().unwrap() >= 3, "{body}");
        assert!(body["eta_seconds"].is_u64() || body["eta_seconds"].is_null());
        assert!(
            body["queue_length"].as_u64() >= body["position"].as_u64(),
            "{body}"
        );
        shadows.push(body);
    }
    // Joins in a row are numbered, and placed, one behind the other, as
    // in the real line.
    let numbers: Vec<u64> = shadows
        .iter()
        .map(|s| s["number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [16, 17, 18, 19]);
    let places: Vec<u64> = shadows
        .iter()
        .map(|s| s["position"].as_u64().unwrap())
        .collect();
    assert!(places.windows(2).all(|w| w[1] == w[0] + 1), "{places:?}");
    // Joining again with the ticket: the same one.
    let first = shadows[0]["ticket"].as_str().unwrap();
    let (code, again) = join_from(&app, "sale", "203.0.113.1", Some(first)).await;
    assert_eq!(code, StatusCode::OK, "{again}");
    assert_eq!(again["number"], shadows[0]["number"]);

    // The real line saw nothing: the same counts and places, and the next
    // real join gets the number it would have had anyway.
    let view = app.admin_room("sale").await;
    assert_eq!(view["waiting"], 14, "{view}");
    for (r, was) in real.iter().zip(&before) {
        let now = status_of(&app, "sale", r["ticket"].as_str().unwrap()).await;
        assert_eq!(
            (
                &now["status"],
                &now["number"],
                &now["position"],
                &now["queue_length"]
            ),
            (
                &was["status"],
                &was["number"],
                &was["position"],
                &was["queue_length"]
            ),
        );
    }
    let (_, last) = join_from(&app, "sale", "192.0.2.16", None).await;
    assert_eq!(last["number"], 16, "{last}");
    // (The shadow line's numbers overlap the real line's: only someone
    // holding tickets of both could see it.)
    real.push(last);

    // The status and the receipt of a shadow ticket answer as a real
    // one's do; the gate never lets it through, from any network.
    let shadow_status = status_of(&app, "sale", first).await;
    assert_eq!(keys(&shadow_status), keys(&before[2]));
    assert_eq!(shadow_status["status"], "waiting");
    let receipt = app
        .client
        .get(app.url("/api/rooms/sale/receipt"))
        .bearer_auth(first)
        .send()
        .await
        .unwrap();
    assert_eq!(receipt.status(), StatusCode::OK);
    // A gate check with the ticket's cookie, from `client`.
    let gate_from = |token: &str, client: &str| {
        app.client
            .get(app.url("/gate/sale"))
            .header("cookie", format!("narabu_sale={token}"))
            .header("x-forwarded-for", client)
            .send()
    };
    let gate = gate_from(first, "192.0.2.50").await.unwrap();
    assert_eq!(gate.status(), StatusCode::UNAUTHORIZED);
    // An admitted real ticket shown from the shadow network: not through.
    let admitted = real[0]["ticket"].as_str().unwrap();
    let from_shadow = gate_from(admitted, "203.0.113.9").await.unwrap();
    assert_eq!(from_shadow.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        app.gate("sale", Some(admitted)).await.status(),
        StatusCode::NO_CONTENT
    );

    // The real line drains to nobody; the shadow tickets move with it,
    // then wait just short of the head, for ever.
    let last_number = shadows[3]["number"].as_u64().unwrap();
    let mut positions = Vec::new();
    for chunk in real.chunks(4) {
        for r in chunk {
            let visitor = narabu_testkit::app::Visitor {
                token: r["ticket"].as_str().unwrap().to_owned(),
                number: 0,
                body: Value::Null,
            };
            app.leave("sale", &visitor).await;
        }
        app.tick("sale").await;
        let s = status_of(&app, "sale", shadows[3]["ticket"].as_str().unwrap()).await;
        assert_eq!(s["status"], "waiting", "{s}");
        assert_eq!(s["number"].as_u64(), Some(last_number));
        assert!(s["queue_length"].as_u64() >= s["position"].as_u64(), "{s}");
        positions.push(s["position"].as_u64().unwrap());
    }
    assert!(positions.iter().all(|&p| p >= 3), "{positions:?}");
    assert!(
        positions.windows(2).all(|w| w[1] <= w[0]),
        "a place never goes up: {positions:?}"
    );
    assert!(positions[3] < shadows[3]["position"].as_u64().unwrap());
    assert_eq!(app.admin_room("sale").await["waiting"], 0);

    // Its event stream: a real-looking position, no admission.
    let mut events = app
        .events(
            "sale",
            &narabu_testkit::app::Visitor {
                token: first.to_owned(),
                number: 0,
                body: Value::Null,
            },
        )
        .await;
    let event =
        narabu_testkit::app::next_event(&mut events, std::time::Duration::from_secs(5)).await;
    assert_eq!(event.event, "position");
    let data: Value = serde_json::from_str(&event.data).unwrap();
    assert_eq!(data["status"], "waiting");
    assert!(data["position"].as_u64().unwrap() >= 3, "{data}");
    drop(events);

    // Leaving: as a real ticket leaves.
    let left = app
        .client
        .post(app.url("/api/rooms/sale/leave"))
        .bearer_auth(first)
        .send()
        .await
        .unwrap();
    assert_eq!(left.status(), StatusCode::NO_CONTENT);
    assert_eq!(status_of(&app, "sale", first).await["status"], "left");

    // A blocked network cannot join either.
    let (code, body) = join_from(&app, "sale", "198.51.100.3", None).await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "blocked");

    // Counted per rule: five shadow joins and one gate check.
    let view = app.admin_room("sale").await;
    assert_eq!(
        view["rule_matches"][0],
        json!({"rule": "scrapers", "action": "shadow", "matches": 6}),
        "{view}"
    );
    assert_eq!(view["joins"], 16, "{view}");

    // A shadow rule on a page is refused: a join asks for no page.
    let (code, body) = send(
        &app,
        reqwest::Method::PATCH,
        "sale",
        json!({"rules": [{"action": "shadow", "path_prefix": ["/checkout"]}]}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("rules[0].path_prefix"),
        "{body}"
    );
}

/// Puts `text` in `file` at once, as an operator should (written aside,
/// renamed into place): a reader never sees it half written.
pub fn replace_file(file: &std::path::Path, text: &str) {
    let aside = file.with_extension("new");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, file).unwrap();
}

/// A rule's network file: changed, it applies without a restart; broken,
/// the list read before holds; changed without its size or time moving,
/// `SIGHUP` reads it again.
#[tokio::test]
async fn a_network_file_is_read_again_when_it_changes_and_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("blocked.txt");
    std::fs::write(&file, "198.51.100.0/24\n").unwrap();
    let mut sale = room("sale", 1);
    sale.rules = serde_json::from_value(json!([
        {"name": "listed", "action": "block", "network_file": file.to_str().unwrap()},
    ]))
    .unwrap();
    let app = behind_local_proxy(vec![sale]).await;
    let browser = "Mozilla/5.0";
    let status = |client: &'static str| {
        let app = &app;
        async move { check(app, "sale", "/", client, browser).await.status() }
    };
    // Waits, within a bound, for `client` to be answered `want`.
    let until = |client: &'static str, want: StatusCode| async move {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while status(client).await != want {
            assert!(
                std::time::Instant::now() < deadline,
                "{client} never got {want}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    };
    assert_eq!(status("198.51.100.7").await, StatusCode::FORBIDDEN);
    assert_eq!(status("203.0.113.7").await, StatusCode::UNAUTHORIZED);

    // Changed: taken up within a few seconds.
    replace_file(&file, "203.0.113.0/24\n");
    until("203.0.113.7", StatusCode::FORBIDDEN).await;
    assert_eq!(status("198.51.100.7").await, StatusCode::UNAUTHORIZED);

    // Broken: the list read before holds (well past two looks at it).
    let broken = "198.51.100.0/24\nnot a network\n";
    replace_file(&file, broken);
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(status("203.0.113.7").await, StatusCode::FORBIDDEN);
    assert_eq!(status("198.51.100.7").await, StatusCode::UNAUTHORIZED);

    // Fixed with the broken file's size and time: nothing to notice, until
    // SIGHUP says to read every file again.
    let stamp = std::fs::metadata(&file).unwrap().modified().unwrap();
    let fixed = format!("198.51.100.0/24\n#{}\n", "-".repeat(broken.len() - 18));
    assert_eq!(fixed.len(), broken.len());
    // Written aside and renamed into place: never seen with another time.
    let aside = dir.path().join("aside.txt");
    std::fs::write(&aside, &fixed).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&aside)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    std::fs::rename(&aside, &file).unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(status("198.51.100.7").await, StatusCode::UNAUTHORIZED);
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    until("198.51.100.7", StatusCode::FORBIDDEN).await;
    assert_eq!(status("203.0.113.7").await, StatusCode::UNAUTHORIZED);

    // A file that does not read is refused on a change, naming the rule,
    // the field, the file and its line.
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "# scrapers\n10.0.0.0/33\n").unwrap();
    let (code, body) = send(
        &app,
        reqwest::Method::PATCH,
        "sale",
        json!({"rules": [
            {"action": "queue"},
            {"action": "shadow", "network_file": bad.to_str().unwrap()},
        ]}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("rules[1].network_file") && message.contains("bad.txt: line 2"),
        "{body}"
    );
}
