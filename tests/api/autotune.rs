//! Autotune against a real origin whose pages slow down past a knee in the
//! crowd it serves (`narabu_testkit::crowd`): from a rate far too high and
//! one far too low the tuner moves the right way and settles with the
//! origin's p95 near the target; it backs off when the origin fails; it
//! never leaves the bounds; nobody admitted loses their permit. Each change
//! is a `room.autotuned` webhook, a count in `/metrics` and the admin
//! view's reading.
//!
//! The origin: 100 ms a page up to 4 in flight, time-shared past that (40
//! pages a second at most); each visitor loads 4 pages, so the origin
//! copes with up to 10 visitors a second (600 a minute) and its p95 rises
//! steeply as the rate nears that. The target is a p95 of 400 ms. Bounds
//! are asserted, never speed: settling is given a generous, stated time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use narabu::config::{Secret, WebhookConfig};
use narabu::webhooks::signing::SigningKey;
use narabu_testkit::app::{ADMIN_TOKEN, TestApp, config, spawn_app_with};
use narabu_testkit::crowd::{Crowd, Origin, SHAPE, room_body};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::atomic::Ordering;

const TARGET_MS: u64 = 400;
const MIN_RATE: u64 = 30;
const MAX_RATE: u64 = 1800;
/// How long the tuner is given to settle, from either side.
const SETTLE_WITHIN: Duration = Duration::from_secs(150);

/// The test's room, its rate starting at `start`.
fn room(origin: &Origin, start: u64) -> Value {
    room_body(origin, start, TARGET_MS, Some((MIN_RATE, MAX_RATE)))
}

/// A webhook receiver keeping the `room.autotuned` bodies.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let app = axum::Router::new()
        .route(
            "/hook",
            post(
                |State(seen): State<Arc<Mutex<Vec<Value>>>>, Json(body): Json<Value>| async move {
                    if body["type"] == "room.autotuned" {
                        seen.lock().unwrap().push(body);
                    }
                    StatusCode::NO_CONTENT
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

struct Tuned {
    /// The rate the room started at, to tell the runs' lines apart.
    from: u64,
    app: TestApp,
    origin: Origin,
    crowd: Crowd,
    hooks: Arc<Mutex<Vec<Value>>>,
}

async fn start(start_rate: u64) -> Tuned {
    let origin = Origin::start(SHAPE).await;
    let (hook, hooks) = receiver().await;
    let mut c = config();
    c.webhooks = vec![WebhookConfig {
        url: hook,
        secret: SigningKey::parse(&Secret::new("a-plain-secret-for-the-autotune-test")).unwrap(),
        previous_secret: None,
        events: Vec::new(),
        queue_threshold: None,
    }];
    let app = spawn_app_with(c, Vec::new()).await;
    let put = app
        .client
        .put(app.url("/admin/rooms/tuned"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&room(&origin, start_rate))
        .send()
        .await
        .unwrap();
    assert_eq!(
        put.status(),
        StatusCode::CREATED,
        "{}",
        put.text().await.unwrap()
    );
    let crowd = Crowd::start(app.backend.clone(), "tuned", &origin.base, 40, 4);
    Tuned {
        from: start_rate,
        app,
        origin,
        crowd,
        hooks,
    }
}

impl Tuned {
    /// The rate now, and the tuner's reading as the admin API shows it.
    async fn rate(&self) -> (u64, Value) {
        let room = self.app.admin_room("tuned").await;
        let rate = room["settings"]["admit_per_minute"].as_u64().unwrap();
        assert!(
            (MIN_RATE..=MAX_RATE).contains(&rate),
            "the rate left its bounds: {rate}"
        );
        (rate, room["autotune"].clone())
    }

    /// Waits for the first change and returns the rate it set.
    async fn first_change(&self, from: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (rate, _) = self.rate().await;
            if rate != from {
                return rate;
            }
            assert!(Instant::now() < deadline, "no change in 30 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the tuner has found the origin's limit (it has cut the
    /// rate for latency or errors once) and the origin's p95 has stayed
    /// under 1.25 × the target for ten seconds running (over five-second
    /// stretches, each with pages in it); returns the rate then. Fails
    /// past [`SETTLE_WITHIN`].
    async fn settle(&self, started: Instant) -> u64 {
        let limit = Duration::from_millis(TARGET_MS * 5 / 4);
        let mut good_since: Option<Instant> = None;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (rate, reading) = self.rate().await;
            let found_the_limit = reading["ceiling"].is_u64();
            let (p95, pages) = self.origin.quantile(0.95, Duration::from_secs(5));
            // The trajectory, shown when the test fails.
            eprintln!(
                "from {}, {:?}: rate {rate}, origin p95 {p95:?} over {pages} pages; tuner {reading}",
                self.from,
                started.elapsed()
            );
            // Settled: the tuner has met the origin's limit (from below,
            // it climbs until it does), it is off the floor it may have
            // cut to while the origin worked off the first seconds' crowd,
            // and the origin is quick.
            let good = found_the_limit
                && rate > MIN_RATE * 2
                && pages >= 20
                && p95.is_some_and(|p| p <= limit);
            match (good, good_since) {
                (true, None) => good_since = Some(Instant::now()),
                (true, Some(since)) if since.elapsed() >= Duration::from_secs(10) => {
                    eprintln!(
                        "from {}: settled at {rate} a minute after {:?}",
                        self.from,
                        started.elapsed()
                    );
                    return rate;
                }
                (false, _) => good_since = None,
                _ => {}
            }
            assert!(
                started.elapsed() < SETTLE_WITHIN,
                "not settled within {SETTLE_WITHIN:?}: rate {rate}, p95 {p95:?} over {pages} pages"
            );
        }
    }

    /// After settling: the origin's p95 over the next `stretch` stays
    /// under 1.5 × the target, and the rate never drops to the floor.
    async fn holds(&self, stretch: Duration) {
        let until = Instant::now() + stretch;
        while Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (rate, _) = self.rate().await;
            assert!(
                rate > MIN_RATE * 2,
                "the rate fell to {rate} on a healthy origin"
            );
        }
        let (p95, pages) = self.origin.quantile(0.95, stretch);
        let p95 = p95.unwrap();
        eprintln!(
            "from {}: origin p95 {p95:?} over {pages} pages in the {stretch:?} after settling",
            self.from
        );
        assert!(pages > 50, "only {pages} pages in {stretch:?}");
        assert!(
            p95 <= Duration::from_millis(TARGET_MS * 3 / 2),
            "p95 {p95:?} after settling"
        );
    }

    /// The crowd goes home first: on Redis, an owner hands its rooms over
    /// at shutdown, which visitors still at work would hold up.
    async fn finish(self) {
        drop(self.crowd);
        self.app.stop().await;
    }

    /// Nobody admitted lost a permit, and every change was told.
    async fn nobody_revoked_and_changes_told(&self) {
        assert_eq!(self.crowd.counts.lost.load(Ordering::Acquire), 0);
        let room = self.app.admin_room("tuned").await;
        assert_eq!(room["revocations"], 0);
        assert_eq!(room["expirations"], 0);
        let changes = room["autotune"]["changes"].as_u64().unwrap();
        assert!(changes > 0);
        let hooks = self.hooks.lock().unwrap().clone();
        assert!(!hooks.is_empty(), "no room.autotuned webhook");
        let last = &hooks[hooks.len() - 1];
        assert!(last["data"]["rate"].is_u64() && last["data"]["verdict"].is_string());
        let metrics = self.app.metrics().await;
        assert!(
            metrics.contains("narabu_autotune_changes_total{room=\"tuned\""),
            "{metrics}"
        );
        assert!(metrics.contains("narabu_autotune_rate{room=\"tuned\"}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_far_too_high_it_backs_off_and_settles_under_the_target() {
    let t = start(MAX_RATE).await;
    let started = Instant::now();
    let first = t.first_change(MAX_RATE).await;
    assert!(first < MAX_RATE, "a rate far too high went up: {first}");
    let (_, reading) = t.rate().await;
    assert_eq!(reading["tuned_here"], true);
    assert!(reading["changed_at"].is_string());
    let settled = t.settle(started).await;
    assert!(settled < MAX_RATE / 2, "settled at {settled}");
    t.holds(Duration::from_secs(15)).await;
    t.nobody_revoked_and_changes_told().await;
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_far_too_low_it_climbs_and_settles_under_the_target() {
    let t = start(MIN_RATE).await;
    let started = Instant::now();
    let first = t.first_change(MIN_RATE).await;
    assert!(first > MIN_RATE, "a rate far too low went down: {first}");
    let settled = t.settle(started).await;
    // The origin copes with far more than the floor: the tuner found some
    // of it (a fixed rate of 4 × the floor is comfortably under the knee).
    assert!(settled >= MIN_RATE * 4, "settled at {settled}");
    t.holds(Duration::from_secs(15)).await;
    t.nobody_revoked_and_changes_told().await;
    t.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_backs_off_when_the_origin_fails() {
    let t = start(300).await;
    // Healthy at 300 a minute: the tuner climbs or holds, never cuts to
    // the floor.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (before, _) = t.rate().await;
    assert!(before >= 150, "cut to {before} on a healthy origin");
    t.origin.fail(true);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rate, reading) = t.rate().await;
        if rate == MIN_RATE {
            assert_eq!(reading["verdict"], "errors", "{reading}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still at {rate} a minute, a minute after the origin began failing: {reading}"
        );
    }
    let hooks = t.hooks.lock().unwrap().clone();
    assert!(
        hooks.iter().any(|h| h["data"]["verdict"] == "errors"),
        "{hooks:?}"
    );
    t.nobody_revoked_and_changes_told().await;
    t.finish().await;
}

#[tokio::test]
async fn a_bad_section_is_refused_with_its_field_named() {
    let origin = Origin::start(SHAPE).await;
    let app = spawn_app_with(config(), vec![narabu_testkit::room("plain", 10)]).await;
    let patch = |body: Value| {
        app.client
            .patch(app.url("/admin/rooms/plain"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    let refused = |field: &'static str, body: Value| {
        let sent = patch(body);
        async move {
            let refused = sent.await.unwrap();
            assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
            let body: Value = refused.json().await.unwrap();
            let message = body["message"].as_str().unwrap().to_owned();
            assert!(message.starts_with(&format!("{field}:")), "{body}");
        }
    };
    let mut section = room(&origin, 100)["autotune"].clone();
    section["max_rate"] = json!(10);
    refused("autotune.max_rate", json!({ "autotune": section })).await;
    let mut section = room(&origin, 100)["autotune"].clone();
    section["probe"]["url"] = json!("ftp://origin/");
    refused("autotune.probe.url", json!({ "autotune": section })).await;
    // A good one is kept and shown; null turns it off.
    let section = room(&origin, 100)["autotune"].clone();
    assert_eq!(
        patch(json!({ "autotune": section }))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let shown = app.admin_room("plain").await;
    assert_eq!(shown["settings"]["autotune"]["target_latency"], "400ms");
    assert_eq!(shown["settings"]["autotune"]["min_rate"], MIN_RATE);
    assert_eq!(
        patch(json!({ "autotune": null })).await.unwrap().status(),
        StatusCode::OK
    );
    assert!(app.admin_room("plain").await["settings"]["autotune"].is_null());
    app.stop().await;
}
