//! Integration tests: the real server on 127.0.0.1:0, a real HTTP client
//! and a real SSE client.

mod autotune;
mod fair;
mod hostile;
mod modes;
mod openapi;
mod passes;
mod proxies;
mod python;
mod receipts;
mod record;
mod report;
mod rules;
mod streams;
mod verify_draw;
mod visitor;

use std::time::{Duration, Instant};

use narabu_testkit::app::{ADMIN_TOKEN, next_event, spawn_app};
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::Value;

#[tokio::test]
async fn capacity_two_with_ten_visitors_shows_positions_one_to_eight() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let mut visitors = Vec::new();
    for i in 1..=10 {
        let v = app.join("sale").await;
        assert_eq!(v.number, i);
        assert_eq!(v.body["status"], "waiting");
        visitors.push(v);
    }
    app.tick("sale").await;
    for v in &visitors[..2] {
        assert_eq!(app.status("sale", v).await["status"], "admitted");
    }
    for (i, v) in visitors[2..].iter().enumerate() {
        let s = app.status("sale", v).await;
        assert_eq!(s["status"], "waiting");
        assert_eq!(s["position"], (i + 1) as u64);
        assert_eq!(s["ahead"], i as u64);
        assert_eq!(s["queue_length"], 8);
    }
    app.stop().await;
}

#[tokio::test]
async fn joining_again_returns_the_same_ticket() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let url = app.url("/api/rooms/sale/join");
    let first = app.client.post(&url).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let cookie = first.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"));
    let first: Value = first.json().await.unwrap();
    let pair = cookie.split(';').next().unwrap().to_owned();

    // The cookie (a refresh, a double click) keeps the ticket.
    let again = app
        .client
        .post(&url)
        .header("cookie", &pair)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["number"], first["number"]);

    // An Idempotency-Key keeps an app's retried join from making a second
    // ticket; the retry carrying the ticket gets it back.
    let key = "k-123-4567-89ab-cdef";
    let keyed = || app.client.post(&url).header("idempotency-key", key);
    let a = keyed().send().await.unwrap();
    assert_eq!(a.status(), StatusCode::CREATED);
    let a: Value = a.json().await.unwrap();
    let b = keyed()
        .bearer_auth(a["ticket"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    let b: Value = b.json().await.unwrap();
    assert_eq!(a["ticket"], b["ticket"]);
    assert_ne!(a["number"], first["number"]);
    assert_eq!(keyed().send().await.unwrap().status(), StatusCode::CONFLICT);
    app.stop().await;
}

#[tokio::test]
async fn a_leave_hands_the_permit_to_the_next_stream_without_a_tick() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let first = app.join("sale").await;
    let second = app.join("sale").await;
    app.tick("sale").await;
    let mut stream = app.events("sale", &second).await;
    let hello = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(hello.event, "position");
    let hello: Value = serde_json::from_str(&hello.data).unwrap();
    assert_eq!(hello["position"], 1);

    // No worker runs in this app: only the hand-off can admit `second`.
    let started = Instant::now();
    assert_eq!(app.leave("sale", &first).await, StatusCode::NO_CONTENT);
    let admitted = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(admitted.event, "admitted", "{admitted:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(app.status("sale", &second).await["status"], "admitted");
    app.stop().await;
}

#[tokio::test]
async fn the_gate_lets_admitted_passes_through_and_sends_others_to_the_queue() {
    let app = spawn_app(vec![room("sale", 1), room("other", 1)]).await;
    let admitted = app.join("sale").await;
    let waiting = app.join("sale").await;
    let elsewhere = app.join("other").await;
    app.tick("sale").await;
    app.tick("other").await;

    let ok = app.gate("sale", Some(&admitted.token)).await;
    assert_eq!(ok.status(), StatusCode::NO_CONTENT);
    assert!(ok.headers().contains_key("x-narabu-pass-expires"));

    let refused = app.gate("sale", Some(&waiting.token)).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(refused.headers()["x-narabu-queue"], "/queue/sale");

    // No ticket: the original URI becomes the return path.
    let none = app
        .client
        .get(app.url("/gate/sale"))
        .header("x-original-uri", "/checkout?item=3")
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        none.headers()["x-narabu-queue"],
        "/queue/sale?return=%2Fcheckout%3Fitem%3D3"
    );

    // A forged ticket, an edited one, and one from another room.
    let mut edited = admitted.token.clone().into_bytes();
    edited[3] = if edited[3] == b'A' { b'B' } else { b'A' };
    for token in [
        "forged.token".to_owned(),
        String::from_utf8(edited).unwrap(),
        elsewhere.token.clone(),
        "x".repeat(5000),
    ] {
        let r = app.gate("sale", Some(&token)).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{token}");
    }
    // The other room's admitted ticket is good there, and only there.
    assert_eq!(
        app.gate("other", Some(&elsewhere.token)).await.status(),
        StatusCode::NO_CONTENT
    );

    // ForwardAuth style: a redirect instead of 401.
    let redirect = app
        .client
        .get(app.url("/gate/sale?redirect=1"))
        .header("x-forwarded-uri", "/tickets")
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), StatusCode::FOUND);
    assert_eq!(
        redirect.headers()["location"],
        "/queue/sale?return=%2Ftickets"
    );

    // A revoked ticket no longer passes.
    let sale = narabu::engine::RoomId::new("sale").unwrap();
    let epoch = app.backend.epoch(&sale).await.unwrap();
    app.backend
        .revoke(&sale, narabu::backend::TicketRef { epoch, id: 0 })
        .await
        .unwrap();
    assert_eq!(
        app.gate("sale", Some(&admitted.token)).await.status(),
        StatusCode::UNAUTHORIZED
    );
    // After the revocation the permit went to the next visitor.
    assert_eq!(
        app.gate("sale", Some(&waiting.token)).await.status(),
        StatusCode::NO_CONTENT
    );
    // Unknown rooms are 404, never a 5xx.
    assert_eq!(app.gate("nope", None).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        app.gate("Bad_Room", None).await.status(),
        StatusCode::NOT_FOUND
    );
    app.stop().await;
}

/// Each gate answer is about one visitor's cookie: a CDN or shared cache in
/// front must never keep one and hand it to the next visitor.
#[tokio::test]
async fn no_gate_answer_may_be_cached() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let admitted = app.join("sale").await;
    let waiting = app.join("sale").await;
    app.tick("sale").await;
    let redirect = app
        .client
        .get(app.url("/gate/sale?redirect=1"))
        .header("cookie", format!("narabu_sale={}", waiting.token))
        .send()
        .await
        .unwrap();
    let answers = [
        (app.gate("sale", Some(&admitted.token)).await, 204),
        (app.gate("sale", Some(&waiting.token)).await, 401),
        (app.gate("sale", None).await, 401),
        (redirect, 302),
        (app.gate("nope", None).await, 404),
    ];
    for (answer, status) in answers {
        assert_eq!(answer.status().as_u16(), status);
        assert_eq!(
            answer.headers()["cache-control"],
            "no-store",
            "the {status} answer"
        );
    }
    app.stop().await;
}

/// Gate checks are answered ahead of the router, without its layers: the
/// answers are still counted per status, keep the header limit, echo a
/// proxy's request id, and a room name written with percent-escapes is
/// still understood (through the router).
#[tokio::test]
async fn gate_checks_skip_the_layers_but_keep_what_matters() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let admitted = app.join("sale").await;
    app.tick("sale").await;
    let get = |path: &str| app.client.get(app.url(path));
    let cookie = format!("narabu_sale={}", admitted.token);
    let ok = get("/gate/sale")
        .header("cookie", &cookie)
        .header("x-request-id", "proxy-id-1")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::NO_CONTENT);
    assert_eq!(ok.headers()["x-request-id"], "proxy-id-1");
    assert!(ok.headers().contains_key("x-narabu-pass-expires"));
    let escaped = get("/gate/s%61le")
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(escaped.status(), StatusCode::NO_CONTENT);
    let huge = get("/gate/sale")
        .header("cookie", format!("junk={}", "x".repeat(20_000)))
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(huge.headers()["x-content-type-options"], "nosniff");
    for bad in ["/gate/Sale", "/gate/sale/extra", "/gate/"] {
        let answer = get(bad).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "{bad}");
    }
    let head = app
        .client
        .head(app.url("/gate/sale"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), StatusCode::NO_CONTENT);
    let metrics = get("/metrics").send().await.unwrap().text().await.unwrap();
    let count = |method: &str, status: &str| {
        let labels = format!("{{method=\"{method}\",route=\"/gate/:room\",status=\"{status}\"}}");
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("narabu_http_requests_total{labels}")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    // One check through the fast path and the escaped one through the
    // router count alike; so do the refusals the fast path gives itself.
    assert_eq!(count("GET", "204"), Some(2), "{metrics}");
    assert_eq!(count("HEAD", "204"), Some(1), "{metrics}");
    assert_eq!(count("GET", "431"), Some(1), "{metrics}");
    assert_eq!(count("GET", "404"), Some(1), "{metrics}");
    app.stop().await;
}

#[tokio::test]
async fn a_waiting_visitors_position_never_goes_up() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let mut ahead = Vec::new();
    for _ in 0..6 {
        ahead.push(app.join("sale").await);
    }
    let me = app.join("sale").await;
    app.tick("sale").await;
    let mut stream = app.events("sale", &me).await;
    let mut positions = Vec::new();
    let first: Value =
        serde_json::from_str(&next_event(&mut stream, Duration::from_secs(5)).await.data).unwrap();
    positions.push(first["position"].as_u64().unwrap());
    // People ahead leave or finish; newcomers join behind.
    for v in &ahead {
        app.leave("sale", v).await;
        app.join("sale").await;
        app.tick("sale").await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let s = app.status("sale", &me).await;
        if s["status"] == "admitted" {
            break;
        }
        positions.push(s["position"].as_u64().unwrap());
    }
    // The stream told the same story, in its own order.
    let mut streamed = vec![first["position"].as_u64().unwrap()];
    while let Ok(Some(Ok(e))) = tokio::time::timeout(
        Duration::from_millis(300),
        futures_util::StreamExt::next(&mut stream),
    )
    .await
    {
        if e.event == "position" {
            let v: Value = serde_json::from_str(&e.data).unwrap();
            streamed.push(v["position"].as_u64().unwrap());
        }
    }
    for seen in [&positions, &streamed] {
        assert!(seen.windows(2).all(|w| w[1] <= w[0]), "{seen:?}");
    }
    assert!(streamed.len() > 1, "the stream never moved: {streamed:?}");
    assert_eq!(first["position"], 6);
    app.stop().await;
}

#[tokio::test]
async fn bad_requests_get_clear_json_errors() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let post = |path: &str, body: &'static str| {
        app.client
            .post(app.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: [(&str, &str, StatusCode, &str); 5] = [
        (
            "/api/rooms/nope/join",
            "",
            StatusCode::NOT_FOUND,
            "unknown_room",
        ),
        (
            "/api/rooms/sale/join",
            "{not json",
            StatusCode::BAD_REQUEST,
            "bad_body",
        ),
        (
            "/api/rooms/sale/join",
            "[1,2]",
            StatusCode::BAD_REQUEST,
            "bad_body",
        ),
        (
            "/api/rooms/sale/join",
            r#"{"vip":true}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
        ),
        (
            "/api/rooms/sale/leave",
            "",
            StatusCode::UNAUTHORIZED,
            "no_ticket",
        ),
    ];
    for (path, body, status, code) in cases {
        let r = post(path, body).await.unwrap();
        assert_eq!(r.status(), status, "{path} {body}");
        let json: Value = r.json().await.unwrap();
        assert_eq!(json["error"], code);
        assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let status = app
        .client
        .get(app.url("/api/rooms/sale/status"))
        .bearer_auth("garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), StatusCode::UNAUTHORIZED);
    let json: Value = status.json().await.unwrap();
    assert_eq!(json["error"], "invalid_ticket");

    // The origin's release needs the admin or release key.
    let v = app.join("sale").await;
    app.tick("sale").await;
    let release = |auth: &'static str| {
        app.client
            .post(app.url("/api/rooms/sale/release"))
            .bearer_auth(auth)
            .json(&serde_json::json!({ "ticket": v.token }))
            .send()
    };
    assert_eq!(
        release("wrong").await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        release(ADMIN_TOKEN).await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        release(ADMIN_TOKEN).await.unwrap().status(),
        StatusCode::CONFLICT
    );
    app.stop().await;
}

#[tokio::test]
async fn the_queue_page_renders_in_three_languages() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let get = |query: &str, accept: &'static str| {
        app.client
            .get(app.url(&format!("/queue/sale{query}")))
            .header("accept-language", accept)
            .send()
    };
    let en = get("?return=/checkout", "en-US").await.unwrap();
    assert_eq!(en.status(), StatusCode::OK);
    let csp = en.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("default-src 'self'") && !csp.contains("unsafe-inline"));
    assert!(en.headers().contains_key("set-cookie"));
    let en = en.text().await.unwrap();
    assert!(en.contains("lang=\"en\"") && en.contains("aria-live"));
    assert!(en.contains("http-equiv=\"refresh\""));

    let ja = get("", "ja,en;q=0.5").await.unwrap().text().await.unwrap();
    assert!(ja.contains("lang=\"ja\""));
    let zh = get("?lang=zh", "en").await.unwrap().text().await.unwrap();
    assert!(zh.contains("lang=\"zh-Hans\""));
    assert_ne!(en, ja);
    assert_ne!(ja, zh);
    app.stop().await;
}

#[tokio::test]
async fn an_admitted_visitor_is_sent_on_and_a_leaver_sees_they_left() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let page = app
        .client
        .get(app.url("/queue/sale?return=/buy"))
        .send()
        .await
        .unwrap();
    let cookie = page.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    app.tick("sale").await;
    let again = app
        .client
        .get(app.url("/queue/sale?return=/buy"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::SEE_OTHER);
    assert_eq!(again.headers()["location"], "/buy");

    // The no-JS leave form comes back to the page, which says so.
    let left = app
        .client
        .post(app.url("/api/rooms/sale/leave"))
        .header("cookie", &cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("return=%2Fbuy")
        .send()
        .await
        .unwrap();
    assert_eq!(left.status(), StatusCode::SEE_OTHER);
    assert_eq!(left.headers()["location"], "/queue/sale?return=%2Fbuy");
    let page = app
        .client
        .get(app.url("/queue/sale?return=/buy"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("rejoin=1"));
    app.stop().await;
}

#[tokio::test]
async fn open_redirect_attempts_are_refused() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    for evil in [
        "//evil.example",
        "https://evil.example",
        "/\\evil.example",
        "%2F%2Fevil.example",
        "/%2F%2Fevil.example",
        "/%5Cevil.example",
        "javascript:alert(1)",
        "/%252F%252Fevil.example",
    ] {
        let url = format!(
            "{}/queue/sale?return={}",
            app.base,
            evil.replace('\\', "%5C")
        );
        let r = app.client.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{evil}");
        assert!(!r.headers().contains_key("location"));
        let events = app
            .client
            .get(app.url(&format!(
                "/api/rooms/sale/events?return={}",
                evil.replace('\\', "%5C")
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(events.status(), StatusCode::BAD_REQUEST, "{evil}");
    }
    app.stop().await;
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let h = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(h.status(), StatusCode::OK);
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let s = app
        .client
        .get(app.url("/static/queue.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(s.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let _first = app.join("sale").await;
    let second = app.join("sale").await;
    let mut stream = app.events("sale", &second).await;
    next_event(&mut stream, Duration::from_secs(5)).await;
    // `stop` waits for graceful shutdown, which needs the stream to end.
    app.stop().await;
    let rest = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::StreamExt::next(&mut stream),
    )
    .await;
    assert!(
        matches!(rest, Ok(None) | Ok(Some(Err(_)))),
        "the stream ended"
    );
}
