//! What bots, scalpers and broken clients send, against the real server:
//! each case gets its status and a message that says why, never a 5xx or a
//! panic, and the line is the same for everyone else afterwards.

use std::sync::Arc;
use std::time::Duration;

use narabu::backend::embedded::EmbeddedBackend;
use narabu::config::{ClientIpHeader, Config, Secret};
use narabu::engine::SystemClock;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use narabu_testkit::app::{
    ADMIN_TOKEN, SECRET, TestApp, Visitor, config, spawn_app, spawn_app_with, spawn_with,
};
use narabu_testkit::room;

/// The line as the bystanders see it: everyone's number and position.
async fn line(app: &TestApp, room: &str, visitors: &[Visitor]) -> Vec<(u64, Value, Value)> {
    let mut seen = Vec::new();
    for v in visitors {
        let s = app.status(room, v).await;
        seen.push((v.number, s["status"].clone(), s["position"].clone()));
    }
    seen
}

async fn bystanders(app: &TestApp, room: &str) -> Vec<Visitor> {
    let mut v = Vec::new();
    for _ in 0..3 {
        v.push(app.join(room).await);
    }
    app.tick(room).await;
    v
}

/// The room's live figures, as the backend reports them to operators.
async fn live(app: &TestApp, room: &str) -> narabu::engine::RoomView {
    let id = narabu::engine::RoomId::new(room).unwrap();
    app.backend.room(&id).await.unwrap().view
}

fn json_error(body: &Value) -> (&str, &str) {
    (
        body["error"].as_str().unwrap_or_default(),
        body["message"].as_str().unwrap_or_default(),
    )
}

#[tokio::test]
async fn joins_over_the_limit_get_429_with_a_reason_and_take_no_ticket() {
    let mut limited = room("sale", 1);
    limited.join_limit_per_minute = 5;
    let app = spawn_app(vec![limited]).await;
    let people = bystanders(&app, "sale").await;
    let before = line(&app, "sale", &people).await;

    // Two more new tickets fit (3 already taken from this address) ...
    app.join("sale").await;
    app.join("sale").await;
    // ... then the API and the page both refuse, saying why and when.
    let refused = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=120).contains(&retry), "{retry}");
    let body: Value = refused.json().await.unwrap();
    let (code, message) = json_error(&body);
    assert_eq!(code, "too_many_joins");
    assert!(message.contains("5 a minute"), "{message}");

    let page = app.client.get(app.url("/queue/sale")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(page.headers().contains_key("retry-after"));
    assert!(page.headers().get("set-cookie").is_none());
    assert!(page.text().await.unwrap().contains("429"));

    // A visitor who already holds a ticket is not a new join: a refresh
    // of the page or a repeated join keeps working.
    let again = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .bearer_auth(&people[1].token)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    let page = app
        .client
        .get(app.url("/queue/sale"))
        .header("cookie", format!("narabu_sale={}", people[2].token))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);

    // Refused joins took no place in line.
    assert_eq!(live(&app, "sale").await.waiting, 4);
    assert_eq!(line(&app, "sale", &people).await, before);
    app.stop().await;
}

#[tokio::test]
async fn forwarded_addresses_count_only_behind_a_trusted_proxy() {
    let mut limited = room("sale", 1);
    limited.join_limit_per_minute = 2;
    let join_as = |app: &TestApp, forwarded: &'static str| {
        app.client
            .post(app.url("/api/rooms/sale/join"))
            .header("x-forwarded-for", forwarded)
            .send()
    };

    // Not trusted: the header is the client's own claim and changes nothing.
    let app = spawn_app(vec![limited.clone()]).await;
    let mut codes = Vec::new();
    for forwarded in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        codes.push(join_as(&app, forwarded).await.unwrap().status());
    }
    assert_eq!(
        codes,
        [
            StatusCode::CREATED,
            StatusCode::CREATED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    app.stop().await;

    // Trusted (the test client is the proxy on 127.0.0.1): each forwarded
    // client has its own allowance, and a client-written prefix is ignored.
    let behind_proxy = Config {
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..config()
    };
    let backend = EmbeddedBackend::without_workers(vec![limited], Arc::new(SystemClock));
    let app = spawn_with(behind_proxy, backend).await;
    let mut codes = Vec::new();
    for forwarded in [
        "203.0.113.1",
        "203.0.113.1",
        "203.0.113.2",
        "6.6.6.6, 203.0.113.1",
        "7.7.7.7, 203.0.113.2",
    ] {
        codes.push(join_as(&app, forwarded).await.unwrap().status());
    }
    assert_eq!(
        codes,
        [
            StatusCode::CREATED,
            StatusCode::CREATED,
            StatusCode::CREATED,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::CREATED,
        ]
    );
    app.stop().await;
}

#[tokio::test]
async fn behind_a_forwarded_proxy_a_clients_own_x_forwarded_for_is_ignored() {
    let mut limited = room("sale", 1);
    limited.join_limit_per_minute = 3;
    // The test client is a proxy on 127.0.0.1 that writes RFC 7239
    // `Forwarded` and passes the client's X-Forwarded-For through.
    let behind_proxy = Config {
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        client_ip_header: ClientIpHeader::Forwarded,
        ..config()
    };
    let app = spawn_app_with(behind_proxy, vec![limited]).await;
    let join_as = |forwarded: &str, claimed: &str| {
        app.client
            .post(app.url("/api/rooms/sale/join"))
            .header("forwarded", format!("for={forwarded};proto=https"))
            .header("x-forwarded-for", claimed)
            .send()
    };
    let mut codes = Vec::new();
    for claimed in [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
    ] {
        codes.push(join_as("203.0.113.5", claimed).await.unwrap().status());
    }
    assert_eq!(
        codes,
        [
            StatusCode::CREATED,
            StatusCode::CREATED,
            StatusCode::CREATED,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "the client chose its address"
    );
    // The proxy's `Forwarded` is honoured: another client, its own allowance;
    // and a client-written element before the proxy's counts for nothing.
    let other = join_as("\"[2001:db8::7]:4711\"", "203.0.113.5")
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::CREATED);
    let prefixed = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .header("forwarded", "for=192.0.2.99, for=203.0.113.5")
        .send()
        .await
        .unwrap();
    assert_eq!(prefixed.status(), StatusCode::TOO_MANY_REQUESTS);
    app.stop().await;
}

#[tokio::test]
async fn with_a_metrics_token_metrics_need_it() {
    const TOKEN: &str = "metrics-token-metrics-token-metrics-0123";
    let closed = Config {
        metrics_token: Some(Secret::new(TOKEN)),
        ..config()
    };
    let app = spawn_app_with(closed, vec![room("sale", 1)]).await;
    let scrape = |auth: Option<&str>| {
        let mut r = app.client.get(app.url("/metrics"));
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.send()
    };
    for auth in [
        None,
        Some("Bearer metrics-token-metrics-token-metrics-0124".to_owned()),
        Some(format!("Bearer {ADMIN_TOKEN}")),
        Some(format!("Basic {TOKEN}")),
        Some(format!("Bearer {}", &TOKEN[..10])),
    ] {
        let r = scrape(auth.as_deref()).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        let body: Value = r.json().await.unwrap();
        let (code, message) = json_error(&body);
        assert_eq!(code, "unauthorized");
        assert!(!message.contains(TOKEN), "{message}");
    }
    let r = scrape(Some(&format!("Bearer {TOKEN}"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains(r#"room="sale""#));
    app.stop().await;

    // Without the setting, /metrics stays open as before.
    let app = spawn_app(vec![room("sale", 1)]).await;
    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn concurrent_joins_from_one_address_get_exactly_the_limit() {
    let mut limited = room("sale", 1);
    limited.join_limit_per_minute = 10;
    let app = spawn_app(vec![limited]).await;
    let mut tasks = Vec::new();
    for _ in 0..60 {
        let client = app.client.clone();
        let url = app.url("/api/rooms/sale/join");
        tasks.push(tokio::spawn(async move {
            client.post(url).send().await.unwrap().status()
        }));
    }
    let mut created = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::CREATED => created += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((created, refused), (10, 50));
    assert_eq!(
        live(&app, "sale").await.waiting,
        10,
        "no ticket lost or extra"
    );
    app.stop().await;
}

#[tokio::test]
async fn open_streams_are_capped_per_address() {
    let capped = Config {
        max_streams_per_address: 2,
        ..config()
    };
    let backend = EmbeddedBackend::without_workers(vec![room("sale", 1)], Arc::new(SystemClock));
    let app = spawn_with(capped, backend).await;
    let people = bystanders(&app, "sale").await;
    let first = app.events("sale", &people[1]).await;
    let _second = app.events("sale", &people[2]).await;
    let third = app
        .client
        .get(app.url("/api/rooms/sale/events"))
        .bearer_auth(&people[2].token)
        .send()
        .await
        .unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(third.headers().contains_key("retry-after"));
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"], "too_many_streams");

    // Closing a stream gives its slot back.
    drop(first);
    let mut reopened = None;
    for _ in 0..50 {
        let r = app
            .client
            .get(app.url("/api/rooms/sale/events"))
            .bearer_auth(&people[1].token)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            reopened = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reopened.is_some(), "the closed stream's slot came back");
    drop(reopened);
    app.stop().await;
}

#[tokio::test]
async fn bad_tokens_are_refused_and_change_nothing() {
    let app = spawn_app(vec![room("sale", 1), room("other", 1)]).await;
    let people = bystanders(&app, "sale").await;
    let before = line(&app, "sale", &people).await;
    let elsewhere = app.join("other").await;
    let good = people[1].token.clone();

    let mut edited = good.clone().into_bytes();
    let middle = edited.len() / 2;
    edited[middle] = if edited[middle] == b'A' { b'B' } else { b'A' };
    let cases = [
        ("forged", "bm90IGEgdGlja2V0.c2lnbmF0dXJl".to_owned()),
        ("truncated", good[..good.len() - 5].to_owned()),
        ("edited", String::from_utf8(edited).unwrap()),
        ("cross-room", elsewhere.token.clone()),
        ("empty", String::new()),
        ("binary-ish", "%00%ff~~".to_owned()),
        ("huge", "A".repeat(4000)),
    ];
    for (what, token) in &cases {
        for path in [
            "/api/rooms/sale/status",
            "/api/rooms/sale/events",
            "/api/rooms/sale/leave",
        ] {
            let request = if path.ends_with("leave") {
                app.client.post(app.url(path))
            } else {
                app.client.get(app.url(path))
            };
            let r = request
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{what} at {path}");
            let body: Value = r.json().await.unwrap();
            let (code, message) = json_error(&body);
            assert!(!code.is_empty() && !message.is_empty(), "{what}: {body}");
            assert!(!message.contains(token.as_str()) || token.is_empty());
        }
        // At the gate, a refusal; on the page, a fresh ticket instead of
        // an error (a broken cookie must not lock a visitor out).
        assert_eq!(
            app.gate("sale", Some(token)).await.status(),
            StatusCode::UNAUTHORIZED,
            "{what}"
        );
    }
    // A token under a rotated-out key: the same backend behind a server
    // that signs with a new key and no longer knows the old one.
    let rotated = Config {
        secret: Some(Secret::new("a-brand-new-secret-a-brand-new-secret-0123")),
        ..config()
    };
    let app2 = spawn_with(rotated, app.backend.clone()).await;
    let r = app2
        .client
        .get(app2.url("/api/rooms/sale/status"))
        .bearer_auth(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    app2.stop().await;
    // With the old key kept as the previous one, it is honoured.
    let rotating = Config {
        secret: Some(Secret::new("a-brand-new-secret-a-brand-new-secret-0123")),
        previous_secret: Some(Secret::new(SECRET)),
        ..config()
    };
    let app3 = spawn_with(rotating, app.backend.clone()).await;
    let r = app3
        .client
        .get(app3.url("/api/rooms/sale/status"))
        .bearer_auth(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    app3.stop().await;

    assert_eq!(line(&app, "sale", &people).await, before);
    app.stop().await;
}

#[tokio::test]
async fn bad_room_names_paths_and_methods_get_4xx() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let people = bystanders(&app, "sale").await;
    let before = line(&app, "sale", &people).await;
    let long = "a".repeat(65);
    for name in [
        long.as_str(),
        "%E3%81%82",
        "Sale",
        "bad_room",
        "-sale",
        "sa%20le",
        "..",
        "%2e%2e",
        "sale%00",
    ] {
        for (method, path) in [
            ("POST", format!("/api/rooms/{name}/join")),
            ("GET", format!("/api/rooms/{name}/status")),
            ("GET", format!("/api/rooms/{name}/events")),
            ("GET", format!("/gate/{name}")),
            ("GET", format!("/queue/{name}")),
        ] {
            let r = app
                .client
                .request(method.parse().unwrap(), app.url(&path))
                .send()
                .await
                .unwrap();
            assert!(
                r.status().is_client_error(),
                "{method} {path}: {}",
                r.status()
            );
            assert_ne!(
                r.status(),
                StatusCode::UNAUTHORIZED,
                "{path}: the room is the problem"
            );
        }
    }
    // Unknown routes: a JSON 404. Wrong methods: 405 naming the allowed.
    let r = app
        .client
        .get(app.url("/wp-admin/setup.php"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "not_found");
    for (method, path) in [
        ("GET", "/api/rooms/sale/join"),
        ("DELETE", "/api/rooms/sale/status"),
        ("POST", "/gate/sale"),
        ("PUT", "/queue/sale"),
    ] {
        let r = app
            .client
            .request(method.parse().unwrap(), app.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert!(r.headers().contains_key("allow"));
    }
    assert_eq!(line(&app, "sale", &people).await, before);
    app.stop().await;
}

#[tokio::test]
async fn oversized_and_malformed_requests_are_refused() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let people = bystanders(&app, "sale").await;
    let before = line(&app, "sale", &people).await;

    // A stuffed cookie jar, and a flood of headers.
    let r = app
        .client
        .get(app.url("/queue/sale"))
        .header("cookie", format!("junk={}", "x".repeat(20_000)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    let mut flood = app.client.get(app.url("/gate/sale"));
    for i in 0..150 {
        flood = flood.header(format!("x-flood-{i}"), "y".repeat(150));
    }
    let status = flood.send().await.unwrap().status();
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

    // Bodies: too big, not JSON, the wrong shape.
    let post = |body: Vec<u8>, content_type: &'static str| {
        app.client
            .post(app.url("/api/rooms/sale/join"))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let big = post(vec![b' '; 64 * 1024], "application/json")
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let broken = post(b"{\"identity\":".to_vec(), "application/json")
        .await
        .unwrap();
    assert_eq!(broken.status(), StatusCode::BAD_REQUEST);
    assert_eq!(broken.json::<Value>().await.unwrap()["error"], "bad_body");
    let release = app
        .client
        .post(app.url("/api/rooms/sale/release"))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body("{\"ticket\": 42}")
        .send()
        .await
        .unwrap();
    assert!(
        matches!(
            release.status(),
            StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY
        ),
        "{}",
        release.status()
    );

    // Template output is escaped: markup in the query never comes back as
    // markup.
    let page = app
        .client
        .get(app.url(
            "/queue/sale?return=%2F%22%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E&lang=%3Cscript%3E",
        ))
        .send()
        .await
        .unwrap();
    let status = page.status();
    let text = page.text().await.unwrap();
    assert!(
        status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
        "{status}"
    );
    assert!(!text.contains("<script>alert"), "{text}");
    assert!(!text.contains("\"><script"), "{text}");

    assert_eq!(line(&app, "sale", &people).await, before);
    app.stop().await;
}

#[tokio::test]
async fn a_client_that_stalls_mid_body_is_cut_off() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let address = app.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    // Promise a body, send a little of it, then go quiet.
    socket
        .write_all(
            b"POST /api/rooms/sale/join HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\"",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the server hung up on the stalled client");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    // Nobody joined.
    let view = live(&app, "sale").await;
    assert_eq!(view.waiting + view.admitted, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_client_that_trickles_its_headers_is_hung_up_on() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let address = app.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    // Slowloris: a request line and one header, then nothing more.
    socket
        .write_all(b"GET /gate/sale HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(40), socket.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection was closed by the server");
    // Whatever it said (hyper closes without a response), it served nothing.
    assert!(!String::from_utf8_lossy(&answer).contains(" 204 "));
    app.stop().await;
}

/// Reads one response (head, then a body of its `content-length`) from a
/// raw connection, keeping any bytes after it for the next.
async fn read_response(socket: &mut tokio::net::TcpStream, pending: &mut Vec<u8>) -> String {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end + 4]).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .map_or(0, |n| n.trim().parse::<usize>().unwrap());
            if pending.len() >= end + 4 + length {
                let whole: Vec<u8> = pending.drain(..end + 4 + length).collect();
                return String::from_utf8_lossy(&whole).into_owned();
            }
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut chunk))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(
            n > 0,
            "closed early; read so far: {}",
            String::from_utf8_lossy(pending)
        );
        pending.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn a_connection_that_asks_the_gate_gets_every_answer_in_order_then_anything_else() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let admitted = app.join("sale").await;
    app.tick("sale").await;
    let cookie = format!("narabu_sale={}", admitted.token);
    let address = app.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    // Three checks in one send (a stranger, the admitted visitor, a room
    // that does not exist), then a request the gate path does not serve:
    // four answers, in order, on one connection.
    let sent = format!(
        "GET /gate/sale HTTP/1.1\r\nHost: x\r\nX-Request-Id: one\r\n\r\n\
         GET /gate/sale?pass=1 HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\r\n\
         GET /gate/nosuch HTTP/1.1\r\nHost: x\r\n\r\n\
         GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    );
    socket.write_all(sent.as_bytes()).await.unwrap();
    let mut pending = Vec::new();
    let stranger = read_response(&mut socket, &mut pending).await;
    assert!(stranger.starts_with("HTTP/1.1 401 "), "{stranger}");
    assert!(stranger.contains("x-request-id: one\r\n"), "{stranger}");
    assert!(stranger.contains("x-narabu-queue: "), "{stranger}");
    let passed = read_response(&mut socket, &mut pending).await;
    assert!(passed.starts_with("HTTP/1.1 204 "), "{passed}");
    assert!(passed.contains("set-cookie: narabu_sale_jwt="), "{passed}");
    let missing = read_response(&mut socket, &mut pending).await;
    assert!(missing.starts_with("HTTP/1.1 404 "), "{missing}");
    assert!(missing.contains("\"unknown_room\""), "{missing}");
    let health = read_response(&mut socket, &mut pending).await;
    assert!(health.starts_with("HTTP/1.1 200 "), "{health}");

    // A gate connection that then trickles a head is hung up on, as the
    // first request's would be.
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    socket
        .write_all(b"GET /gate/sale HTTP/1.1\r\nHost: x\r\n\r\nGET /gate/sale HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut pending = Vec::new();
    let first = read_response(&mut socket, &mut pending).await;
    assert!(first.starts_with("HTTP/1.1 401 "), "{first}");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(40), socket.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server never hung up");
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));

    // HTTP/1.0 without keep-alive: one answer, then the server closes.
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    socket
        .write_all(b"GET /gate/sale HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer))
        .await
        .expect("closed after the answer")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
    assert!(answer.contains("connection: close\r\n"), "{answer}");
    app.stop().await;
}
