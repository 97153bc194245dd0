//! Web Push wired into the service: the key pages subscribe with, the
//! subscription handed over with the ticket, and the call-backs the room's
//! engine decides, delivered to a push service played by
//! `tests/push_service.py` with the reference libraries. Runs on the
//! embedded backend, and on Redis with `NARABU_TEST_BACKEND=redis`.

#[path = "support/push_service.rs"]
mod push_service;

use narabu::config::{Config, PushConfig, Secret};
use narabu::push::VapidKey;
use std::time::Duration;

use narabu_testkit::app::{TestApp, Visitor, config, spawn_app, spawn_app_with};
use narabu_testkit::room;
use push_service::{CONTACT, PushService};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The test configuration with push on, sending to the local push service.
fn with_push() -> Config {
    Config {
        push: PushConfig {
            enabled: true,
            vapid_key_file: None,
            contact: CONTACT.to_owned(),
            allow_insecure_endpoints: true,
        },
        ..config()
    }
}

async fn get_key(app: &TestApp, room: &str) -> (StatusCode, Value) {
    let answer = app
        .client
        .get(app.url(&format!("/api/rooms/{room}/notify")))
        .send()
        .await
        .unwrap();
    (answer.status(), answer.json().await.unwrap())
}

#[tokio::test]
async fn the_key_is_served_when_push_is_on_and_the_same_on_every_instance() {
    let off = spawn_app(vec![room("sale", 1)]).await;
    let (status, body) = get_key(&off, "sale").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "push_off");
    off.stop().await;

    let one = spawn_app_with(with_push(), vec![room("sale", 1)]).await;
    let two = spawn_app_with(with_push(), vec![room("sale", 1)]).await;
    let (status, body) = get_key(&one, "sale").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let public = body["public_key"].as_str().unwrap().to_owned();
    // An uncompressed P-256 point, base64url: 65 bytes, 87 characters.
    assert_eq!(public.len(), 87);
    assert_eq!(get_key(&two, "sale").await.1["public_key"], public);
    // Not the key the secret itself would give: the keyring derives one
    // for this use alone.
    let raw = VapidKey::derive(&Secret::new(narabu_testkit::app::SECRET), CONTACT).unwrap();
    assert_ne!(raw.public_key(), public);
    let (status, body) = get_key(&one, "nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "unknown_room");
    one.stop().await;
    two.stop().await;

    let other = Config {
        secret: Some(Secret::new("another-secret-of-at-least-32-bytes-long")),
        ..with_push()
    };
    let other = spawn_app_with(other, vec![room("sale", 1)]).await;
    assert_ne!(get_key(&other, "sale").await.1["public_key"], public);
    other.stop().await;
}

#[tokio::test]
async fn an_operators_key_file_is_served_and_a_bad_one_stops_the_start() {
    let service = PushService::start().await;
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("vapid.pem");
    std::fs::write(&pem, &service.vapid_pem).unwrap();
    let mut config = with_push();
    config.push.vapid_key_file = Some(pem.clone());
    let app = spawn_app_with(config.clone(), vec![room("sale", 1)]).await;
    assert_eq!(
        get_key(&app, "sale").await.1["public_key"],
        service.vapid_public
    );
    app.stop().await;

    // A file that holds no key: the start fails, naming the file and not
    // quoting it.
    std::fs::write(&pem, "not a key, but secret-looking text").unwrap();
    config.data_dir = dir.path().join("data");
    config.backend = narabu::config::Backend::Embedded;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let error = narabu::server::run(listener, config, std::future::pending())
        .await
        .unwrap_err();
    let text = format!("{error:#}");
    assert!(text.contains("vapid.pem"), "{text}");
    assert!(!text.contains("secret-looking"), "{text}");
}

/// A room of one permit whose visitors are told when `ahead` or fewer are
/// ahead of them; a page closed for a second is away, and a place is kept
/// eight seconds (room enough for a busy machine between a visitor's last
/// sign of life and their return).
fn quick_room(id: &str, ahead: u32) -> narabu::engine::RoomSettings {
    narabu::engine::RoomSettings {
        notify_ahead: Some(ahead),
        away_grace: Duration::from_secs(1),
        queue_idle: Duration::from_secs(8),
        ..room(id, 1)
    }
}

/// The visitor hands the push service's subscription for `path` over.
async fn subscribe(
    app: &TestApp,
    room: &str,
    v: &Visitor,
    service: &PushService,
    path: &str,
    lang: &str,
) -> reqwest::Response {
    let subscription = serde_json::to_value(service.subscription(path)).unwrap();
    app.client
        .post(app.url(&format!("/api/rooms/{room}/notify")))
        .bearer_auth(&v.token)
        .json(&json!({"subscription": subscription, "lang": lang}))
        .send()
        .await
        .unwrap()
}

/// The next message the push service got, decrypted, with how it came.
async fn next_message(service: &mut PushService) -> (Value, Value) {
    let report = service.next_report().await;
    assert_eq!(report["vapid"]["py_vapid"], true, "{report:#}");
    assert_eq!(report["headers"]["content-encoding"], "aes128gcm");
    let text = report["text"]
        .as_str()
        .unwrap_or_else(|| panic!("not decrypted: {report:#}"));
    (serde_json::from_str(text).unwrap(), report)
}

/// Ask until `done`, for at most ten seconds.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_subscriber_is_told_ahead_then_their_turn_in_their_language() {
    let mut service = PushService::start().await;
    let app = spawn_app_with(with_push(), vec![quick_room("sale", 1)]).await;
    let v: Vec<Visitor> = futures_join(&app, "sale", 4).await;
    let answer = subscribe(&app, "sale", &v[2], &service, "/push/ok/v2", "ja").await;
    assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    // The first is admitted; the third is one ahead.
    app.tick("sale").await;
    let (ahead, report) = next_message(&mut service).await;
    assert_eq!(report["path"], "/push/ok/v2");
    assert_eq!(ahead["kind"], "ahead", "{ahead:#}");
    assert_eq!(ahead["ahead"], 1);
    assert_eq!(ahead["number"], v[2].number);
    assert_eq!(ahead["room"], "sale");
    assert_eq!(ahead["title"], "まもなく順番です");
    assert_eq!(
        ahead["body"],
        "あなたの前にあと1人です。戻る準備をしてください。"
    );
    assert_eq!(report["headers"]["urgency"], "normal");
    for w in &v[1..] {
        app.status("sale", w).await;
    }
    // Two leave: the head reaches them.
    app.leave("sale", &v[0]).await;
    app.leave("sale", &v[1]).await;
    assert_eq!(app.status("sale", &v[2]).await["status"], "admitted");
    let (turn, report) = next_message(&mut service).await;
    assert_eq!(turn["kind"], "turn", "{turn:#}");
    assert_eq!(turn["number"], v[2].number);
    assert_eq!(turn["title"], "順番が来ました");
    assert_eq!(
        turn["body"],
        "2分以内に戻ると、列の順番がそのまま保たれます。"
    );
    assert_eq!(turn["url"], "/queue/sale?lang=ja");
    assert_eq!(report["headers"]["urgency"], "high");
    let ttl: u64 = report["headers"]["ttl"].as_str().unwrap().parse().unwrap();
    assert!((100..=120).contains(&ttl), "the arrival grace: {ttl}");
    // Nothing else: each call is made once.
    app.tick("sale").await;
    service.quiet(Duration::from_millis(500)).await;
    app.stop().await;
}

/// `n` visitors, in order.
async fn futures_join(app: &TestApp, room: &str, n: usize) -> Vec<Visitor> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(app.join(room).await);
    }
    out
}

#[tokio::test]
async fn bad_subscriptions_are_refused_naming_the_field_and_an_ended_ticket_is_not_waiting() {
    let service = PushService::start().await;
    let app = spawn_app_with(with_push(), vec![quick_room("sale", 1)]).await;
    let v = futures_join(&app, "sale", 2).await;
    let url = app.url("/api/rooms/sale/notify");
    let post = |body: String, token: Option<&str>| {
        let mut request = app.client.post(&url).body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.header("content-type", "application/json").send()
    };
    let answer = post("{}".into(), None).await.unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    let cases: [(String, StatusCode, &str, &str); 5] = [
        ("not json".into(), StatusCode::BAD_REQUEST, "bad_body", "JSON"),
        ("{}".into(), StatusCode::UNPROCESSABLE_ENTITY, "invalid_field", "subscription"),
        (
            json!({"subscription": {"endpoint": "https://x.example/p"}, "extra": 1}).to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            "extra",
        ),
        (
            json!({"subscription": {"endpoint": "nope", "keys": {"p256dh": "x", "auth": "y"}}})
                .to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_subscription",
            "endpoint",
        ),
        (
            json!({"subscription": {"endpoint": format!("http://127.0.0.1:{}/push/ok/1", service.port),
                                     "keys": {"p256dh": service.p256dh, "auth": "c2hvcnQ"}}})
            .to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_subscription",
            "keys.auth",
        ),
    ];
    for (body, status, code, names) in cases {
        let answer = post(body.clone(), Some(&v[1].token)).await.unwrap();
        assert_eq!(answer.status(), status, "{body}");
        let error: Value = answer.json().await.unwrap();
        assert_eq!(error["error"], code, "{body}: {error}");
        assert!(
            error["message"].as_str().unwrap().contains(names),
            "{body}: {error}"
        );
    }
    // Admitted: there is no turn left to call about.
    app.tick("sale").await;
    let answer = subscribe(&app, "sale", &v[0], &service, "/push/ok/0", "en").await;
    assert_eq!(answer.status(), StatusCode::CONFLICT);
    assert_eq!(
        answer.json::<Value>().await.unwrap()["error"],
        "not_waiting"
    );
    // Push off: the routes say so.
    app.stop().await;
    let off = spawn_app(vec![room("sale", 1)]).await;
    let w = off.join("sale").await;
    let answer = subscribe(&off, "sale", &w, &service, "/push/ok/0", "en").await;
    assert_eq!(answer.status(), StatusCode::NOT_FOUND);
    assert_eq!(answer.json::<Value>().await.unwrap()["error"], "push_off");
    off.stop().await;
}

#[tokio::test]
async fn a_gone_subscription_is_dropped_a_busy_service_retried_and_off_means_off() {
    let mut service = PushService::start().await;
    let app = spawn_app_with(with_push(), vec![quick_room("sale", 9)]).await;
    let v = futures_join(&app, "sale", 5).await;
    for (i, path) in [(1, "/push/flaky/1"), (2, "/push/gone/2"), (3, "/push/ok/3")] {
        let answer = subscribe(&app, "sale", &v[i], &service, path, "en").await;
        assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    }
    assert_eq!(app.admin_room("sale").await["push_subscriptions"], 3);
    // Turned off again: no call at all.
    let off = app
        .client
        .delete(app.url("/api/rooms/sale/notify"))
        .bearer_auth(&v[3].token)
        .send()
        .await
        .unwrap();
    assert_eq!(off.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.admin_room("sale").await["push_subscriptions"], 2);
    app.tick("sale").await;
    let mut reports = Vec::new();
    for _ in 0..3 {
        reports.push(service.next_report().await);
    }
    reports.sort_by(|x, y| {
        (x["path"].as_str(), x["at"].as_f64())
            .partial_cmp(&(y["path"].as_str(), y["at"].as_f64()))
            .unwrap()
    });
    let seen: Vec<_> = reports
        .iter()
        .map(|r| (r["path"].as_str().unwrap(), r["answered"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            ("/push/flaky/1", 503),
            ("/push/flaky/1", 201),
            ("/push/gone/2", 410)
        ]
    );
    for r in &reports {
        let text: Value = serde_json::from_str(r["text"].as_str().unwrap()).unwrap();
        assert_eq!(text["kind"], "ahead");
    }
    // The push service said the second one is gone: it is forgotten.
    until("the gone subscription is dropped", async || {
        let room = app.admin_room("sale").await;
        room["push_subscriptions"] == 1 && room["push_gone"] == 1 && room["push_sent"] == 1
    })
    .await;
    // The flaky one hears its turn; the gone one hears nothing more.
    for w in &v[1..] {
        app.status("sale", w).await;
    }
    app.leave("sale", &v[0]).await;
    let (turn, report) = next_message(&mut service).await;
    assert_eq!(report["path"], "/push/flaky/1");
    assert_eq!(turn["kind"], "turn");
    app.leave("sale", &v[1]).await;
    assert_eq!(app.status("sale", &v[2]).await["status"], "admitted");
    service.quiet(Duration::from_millis(500)).await;
    app.stop().await;
}

#[tokio::test]
async fn a_subscriber_who_closed_the_page_is_skipped_called_and_first_on_return() {
    let mut service = PushService::start().await;
    let app = spawn_app_with(with_push(), vec![quick_room("sale", 0)]).await;
    // a is admitted; b and c ask to be called and close their page; d
    // keeps its page open.
    let v = futures_join(&app, "sale", 4).await;
    let (a, b, c, d) = (&v[0], &v[1], &v[2], &v[3]);
    subscribe(&app, "sale", b, &service, "/push/ok/b", "en").await;
    subscribe(&app, "sale", c, &service, "/push/ok/c", "zh").await;
    app.tick("sale").await;
    let (ahead, report) = next_message(&mut service).await;
    assert_eq!(
        (report["path"].as_str(), ahead["kind"].as_str()),
        (Some("/push/ok/b"), Some("ahead"))
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    app.status("sale", d).await;
    app.status("sale", a).await;
    // The permit skips b and c (away) and goes to d.
    app.leave("sale", a).await;
    assert_eq!(app.status("sale", d).await["status"], "admitted");
    let admitted = app.admin_room("sale").await;
    assert_eq!(admitted["admitted"], 1, "{admitted:#}");
    let mut turns = Vec::new();
    for _ in 0..2 {
        let (turn, report) = next_message(&mut service).await;
        assert_eq!(turn["kind"], "turn", "{turn:#}");
        turns.push((report["path"].as_str().unwrap().to_owned(), turn));
    }
    turns.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(turns[0].0, "/push/ok/b");
    assert_eq!(turns[0].1["number"], b.number);
    assert_eq!(turns[0].1["title"], "It's your turn");
    // Their place is kept for queue_idle (8 s) after they were last seen.
    assert_eq!(
        turns[0].1["body"],
        "Come back within 1 min to keep your place in line."
    );
    assert_eq!(turns[1].0, "/push/ok/c");
    assert_eq!(turns[1].1["title"], "轮到您了");
    // e joins after, and keeps polling.
    let e = app.join("sale").await;
    // b comes back in time: first in line again, ahead of e.
    until("b is back in line", async || {
        app.status("sale", b).await["position"] == 1
    })
    .await;
    app.leave("sale", d).await;
    assert_eq!(app.status("sale", b).await["status"], "admitted");
    assert_eq!(app.status("sale", &e).await["status"], "waiting");
    // c comes back too late: the place was given up.
    tokio::time::sleep(Duration::from_millis(8_500)).await;
    app.status("sale", &e).await;
    app.status("sale", b).await;
    app.tick("sale").await;
    let late = app.status("sale", c).await;
    assert_ne!(late["status"], "waiting", "{late:#}");
    assert_ne!(late["status"], "admitted", "{late:#}");
    app.leave("sale", b).await;
    assert_eq!(app.status("sale", &e).await["status"], "admitted");
    service.quiet(Duration::from_millis(300)).await;
    app.stop().await;
}

#[tokio::test]
async fn a_subscription_and_what_was_said_survive_a_restart_and_end_with_the_ticket() {
    use narabu::backend::embedded::{EmbeddedBackend, Persistence};
    use narabu::backend::{Backend, JoinRequest};
    use narabu::engine::{Callback, Notice, RoomId, SystemClock};

    let dir = tempfile::tempdir().unwrap();
    let open = || async {
        EmbeddedBackend::open(
            vec![quick_room("sale", 0)],
            std::sync::Arc::new(SystemClock),
            Persistence {
                data_dir: dir.path().to_owned(),
                durability: narabu::config::Durability::Fsync,
                snapshot_interval: Duration::from_secs(3600),
            },
            false,
        )
        .await
        .unwrap()
    };
    let id = RoomId::new("sale").unwrap();
    let callback = Callback {
        subscription: r#"{"endpoint":"https://push.example/x","keys":{}}"#.into(),
        lang: "ja".into(),
    };
    let backend = open().await;
    let mut due = backend.callbacks().unwrap();
    let mut tickets = Vec::new();
    for _ in 0..3 {
        let joined = backend.join(&id, JoinRequest::anonymous()).await.unwrap();
        tickets.push(joined.ticket);
    }
    backend
        .subscribe(&id, tickets[1], callback.clone())
        .await
        .unwrap();
    backend
        .subscribe(&id, tickets[2], callback.clone())
        .await
        .unwrap();
    // One admitted; the second is next: its "ahead" call is made.
    backend.tick(&id).await.unwrap();
    let call = due.recv().await.unwrap();
    assert_eq!(call.ticket, tickets[1]);
    assert_eq!(call.notice, Notice::Ahead { ahead: 0 });
    assert_eq!(backend.room(&id).await.unwrap().subscriptions, 2);
    backend.shutdown().await;
    drop(backend);

    // After the restart: both kept, the call made is not made again.
    let backend = open().await;
    let mut due = backend.callbacks().unwrap();
    assert_eq!(backend.room(&id).await.unwrap().subscriptions, 2);
    backend.leave(&id, tickets[0]).await.unwrap();
    backend.tick(&id).await.unwrap();
    let mut calls = Vec::new();
    while let Ok(call) = due.try_recv() {
        calls.push((call.ticket, call.notice.is_turn()));
    }
    assert_eq!(calls, [(tickets[1], true), (tickets[2], false)]);
    // A ticket that ends takes its subscription along, for good.
    backend.leave(&id, tickets[2]).await.unwrap();
    assert_eq!(backend.room(&id).await.unwrap().subscriptions, 1);
    backend.shutdown().await;
    drop(backend);
    let backend = open().await;
    assert_eq!(backend.room(&id).await.unwrap().subscriptions, 1);
    backend.shutdown().await;
}

#[tokio::test]
async fn calls_dropped_from_a_full_hand_off_are_counted_by_room_in_metrics() {
    use narabu::backend::embedded::EmbeddedBackend;
    use narabu::backend::{Backend, JoinRequest};
    use narabu::engine::{Callback, RoomId, SystemClock};
    use narabu_testkit::app::spawn_with;

    // Nobody takes the calls (push is off on the service below), so the
    // hand-off fills: it holds 4096, and every subscriber is within reach
    // of the "N ahead" call at the first tick.
    const HAND_OFF: usize = 4096;
    const OVER: usize = 8;
    let settings = narabu::engine::RoomSettings {
        notify_ahead: Some(u32::MAX),
        ..room("sale", 1)
    };
    let backend: std::sync::Arc<dyn Backend> = EmbeddedBackend::new(
        vec![settings.clone(), room("other", 1)],
        std::sync::Arc::new(SystemClock),
    );
    let id = RoomId::new("sale").unwrap();
    let callback = Callback {
        subscription: r#"{"endpoint":"https://push.example/x","keys":{}}"#.into(),
        lang: "en".into(),
    };
    // The first is admitted at the tick; the rest subscribe.
    backend.join(&id, JoinRequest::anonymous()).await.unwrap();
    for _ in 0..HAND_OFF + OVER {
        let ticket = backend
            .join(&id, JoinRequest::anonymous())
            .await
            .unwrap()
            .ticket;
        backend
            .subscribe(&id, ticket, callback.clone())
            .await
            .unwrap();
    }
    backend.tick(&id).await.unwrap();
    let app = spawn_with(
        Config {
            rooms: vec![settings, room("other", 1)],
            ..config()
        },
        backend,
    )
    .await;
    let page = app.metrics().await;
    let line = |room: &str| format!("narabu_room_push_calls_dropped_total{{room=\"{room}\"}} ");
    let value = |room: &str| {
        page.lines()
            .find_map(|l| l.strip_prefix(&line(room)))
            .unwrap_or_else(|| panic!("no {} in\n{page}", line(room)))
            .to_owned()
    };
    assert_eq!(value("sale"), OVER.to_string());
    assert_eq!(value("other"), "0");
    assert!(
        page.contains("# TYPE narabu_room_push_calls_dropped counter"),
        "{page}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_new_owner_keeps_the_subscriptions_and_makes_each_call_once() {
    use narabu::backend::redis::{RedisOptions, connect};
    use narabu::config::{Backend as ConfigBackend, RedisTarget};
    use narabu::engine::{RoomId, SystemClock};
    use narabu_testkit::app::spawn_with;
    use narabu_testkit::redis_server::RedisServer;

    let mut service = PushService::start().await;
    let redis = RedisServer::start().await;
    let target = RedisTarget::Single { url: redis.url() };
    let settings = narabu::engine::RoomSettings {
        notify_ahead: Some(0),
        away_grace: Duration::from_secs(30),
        queue_idle: Duration::from_secs(60),
        ..room("sale", 1)
    };
    let id = RoomId::new("sale").unwrap();
    let start = || async {
        let options = RedisOptions {
            lease: Duration::from_secs(1),
            run_workers: false,
            ..RedisOptions::new(target.clone())
        };
        let backend = connect(
            options,
            vec![settings.clone()],
            std::sync::Arc::new(SystemClock),
        )
        .await
        .unwrap();
        let config = Config {
            backend: ConfigBackend::Redis(target.clone()),
            rooms: vec![settings.clone()],
            ..with_push()
        };
        (spawn_with(config, backend.clone()).await, backend)
    };
    let (a, a_backend) = start().await;
    until("a owns the room", async || a_backend.owns(&id)).await;
    let (b, b_backend) = start().await;
    assert!(!b_backend.owns(&id));
    // Everything through b, which only relays to the owner.
    let v = futures_join(&b, "sale", 3).await;
    for (w, path) in [(&v[1], "/push/ok/v1"), (&v[2], "/push/ok/v2")] {
        let answer = subscribe(&b, "sale", w, &service, path, "en").await;
        assert_eq!(answer.status(), StatusCode::NO_CONTENT);
    }
    b.tick("sale").await;
    let (ahead, report) = next_message(&mut service).await;
    assert_eq!(
        (report["path"].as_str(), ahead["kind"].as_str()),
        (Some("/push/ok/v1"), Some("ahead"))
    );
    service.quiet(Duration::from_millis(300)).await;

    // The owner steps down; b takes the room over from the log.
    a.stop().await;
    until("b owns the room", async || b_backend.owns(&id)).await;
    assert_eq!(b.admin_room("sale").await["push_subscriptions"], 2);
    b.leave("sale", &v[0]).await;
    b.tick("sale").await;
    let mut calls = Vec::new();
    for _ in 0..2 {
        let (message, report) = next_message(&mut service).await;
        calls.push((
            report["path"].as_str().unwrap().to_owned(),
            message["kind"].as_str().unwrap().to_owned(),
        ));
    }
    calls.sort();
    assert_eq!(
        calls,
        [
            ("/push/ok/v1".to_owned(), "turn".to_owned()),
            ("/push/ok/v2".to_owned(), "ahead".to_owned())
        ],
        "the new owner calls what is due, and not the call the old one made"
    );
    service.quiet(Duration::from_millis(500)).await;
    b.stop().await;
}
