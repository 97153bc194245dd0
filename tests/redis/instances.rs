//! Several Narabu instances on one Redis, over HTTP: visitors spread over
//! the instances are admitted in global queue order, never more than
//! capacity at once, and a leave on one instance reaches a stream held by
//! another. Then the faults: the worker's instance dies (a real process,
//! killed with SIGKILL), and Redis itself goes away and comes back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use narabu::backend::Backend;
use narabu::backend::redis::RedisOptions;
use narabu::config::{Backend as BackendConfig, Config, OnBackendError, Secret};
use narabu::engine::{RoomId, RoomSettings, SystemClock};
use redis::AsyncCommands;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::oneshot;

use narabu_testkit::process::NarabuProcess;
use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;

const SECRET: &str = "test-secret-test-secret-test-secret-0123";
const ADMIN: &str = "admin-token-admin-token-admin-token-0123";

struct Instance {
    base: String,
    backend: Arc<narabu::backend::owned::OwnedBackend>,
    stop: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Instance {
    async fn start(redis: &RedisServer, rooms: Vec<RoomSettings>, lease: Duration) -> Self {
        Self::start_with(redis, rooms, lease, OnBackendError::Closed).await
    }

    async fn start_with(
        redis: &RedisServer,
        rooms: Vec<RoomSettings>,
        lease: Duration,
        on_backend_error: OnBackendError,
    ) -> Self {
        let options = RedisOptions {
            lease,
            ..RedisOptions::new(redis.url())
        };
        let backend =
            narabu::backend::redis::connect(options, rooms.clone(), Arc::new(SystemClock))
                .await
                .unwrap();
        let config = Config {
            secret: Some(Secret::new(SECRET)),
            admin_token: Some(Secret::new(ADMIN)),
            backend: BackendConfig::Redis(redis.url().into()),
            rooms,
            on_backend_error,
            ..Config::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let dyn_backend: Arc<dyn Backend> = backend.clone();
        let server = tokio::spawn(narabu::server::serve(
            listener,
            config,
            dyn_backend,
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            base: format!("http://{addr}"),
            backend,
            stop: Some(stop),
            server,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.server).await;
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn join(c: &reqwest::Client, base: &str, room: &str) -> (String, u64) {
    let r = c
        .post(format!("{base}/api/rooms/{room}/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let body: Value = r.json().await.unwrap();
    (
        body["ticket"].as_str().unwrap().to_owned(),
        body["number"].as_u64().unwrap(),
    )
}

async fn status(c: &reqwest::Client, base: &str, room: &str, token: &str) -> String {
    let r = c
        .get(format!("{base}/api/rooms/{room}/status"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body: Value = r.json().await.unwrap();
    body["status"].as_str().unwrap().to_owned()
}

type Events = std::pin::Pin<
    Box<
        dyn Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

async fn events(c: &reqwest::Client, base: &str, room: &str, token: &str) -> Events {
    let r = c
        .get(format!("{base}/api/rooms/{room}/events"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    Box::pin(r.bytes_stream().eventsource())
}

/// The next event other than `position`, within a bound.
async fn next_non_position(stream: &mut Events, within: Duration) -> Option<String> {
    tokio::time::timeout(within, async {
        while let Some(Ok(e)) = stream.next().await {
            if e.event != "position" && e.event != "message" {
                return Some(e.event);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_admit_in_global_order_and_hand_off_across_instances() {
    let redis = RedisServer::start().await;
    let mut sale = room("sale", 2);
    // A long tick: after the first, only hand-offs admit anyone, so every
    // admission below was pushed across instances, not picked up by a tick.
    sale.tick = Duration::from_secs(60);
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Instance::start(&redis, vec![sale.clone()], Duration::from_secs(1)).await);
    }
    let c = client();
    let mut visitors = Vec::new();
    for i in 0..8 {
        let (token, number) = join(&c, &instances[i % 3].base, "sale").await;
        assert_eq!(number, i as u64 + 1, "numbers follow one global line");
        visitors.push(token);
    }
    // Each visitor's stream sits on an instance other than the one it joined.
    let mut streams = Vec::new();
    for (i, token) in visitors.iter().enumerate() {
        streams.push(events(&c, &instances[(i + 1) % 3].base, "sale", token).await);
    }
    instances[2]
        .backend
        .tick(&RoomId::new("sale").unwrap())
        .await
        .unwrap();
    for s in streams.iter_mut().take(2) {
        assert_eq!(
            next_non_position(s, Duration::from_secs(10))
                .await
                .as_deref(),
            Some("admitted")
        );
    }
    let room_id = RoomId::new("sale").unwrap();
    for i in 0..6 {
        // Visitor i leaves through a third instance.
        let leave = c
            .post(instances[(i + 2) % 3].url("/api/rooms/sale/leave"))
            .bearer_auth(&visitors[i])
            .send()
            .await
            .unwrap();
        assert_eq!(leave.status(), StatusCode::NO_CONTENT);
        // The next in line (number i + 3), streaming elsewhere, gets in.
        let event = next_non_position(&mut streams[i + 2], Duration::from_secs(10)).await;
        assert_eq!(
            event.as_deref(),
            Some("admitted"),
            "visitor {} not admitted",
            i + 3
        );
        for (j, token) in visitors.iter().enumerate() {
            let s = status(&c, &instances[j % 3].base, "sale", token).await;
            let expected = if j <= i {
                "left"
            } else if j <= i + 2 {
                "admitted"
            } else {
                "waiting"
            };
            assert_eq!(s, expected, "visitor {} after {} left", j + 1, i + 1);
        }
        let ledger = instances[i % 3]
            .backend
            .room(&room_id)
            .await
            .unwrap()
            .ledger;
        assert!(ledger.admitted <= 2 && ledger.balances(), "{ledger:?}");
    }
    let snap = instances[0].backend.room(&room_id).await.unwrap();
    assert_eq!(snap.stats.handoffs, 6);
    assert!(snap.stats.peak_admitted <= 2);
    for i in instances {
        i.stop().await;
    }
}

/// The origin reports purchases through three instances at once, 25 units
/// in stock and 40 buyers: the stock left that the answers report is every
/// value from 24 down to 1 once and then 0 (never below), exactly one
/// answer says it ended the sale, and a visitor still waiting, streaming
/// on another instance, is told that the room closed as sold out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_runs_out_once_under_purchases_through_three_instances() {
    let redis = RedisServer::start().await;
    let mut sale = room("sale", 40);
    sale.stock = Some(25);
    sale.tick = Duration::from_secs(60);
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Instance::start(&redis, vec![sale.clone()], Duration::from_secs(1)).await);
    }
    let c = client();
    let mut buyers = Vec::new();
    for i in 0..40 {
        buyers.push(join(&c, &instances[i % 3].base, "sale").await.0);
    }
    // Releases hand permits on until the stock runs out: with more people
    // waiting than releases, the last of them is still waiting at the end.
    let mut waiting = String::new();
    for i in 0..41 {
        waiting = join(&c, &instances[i % 3].base, "sale").await.0;
    }
    instances[1]
        .backend
        .tick(&RoomId::new("sale").unwrap())
        .await
        .unwrap();
    let mut stream = events(&c, &instances[2].base, "sale", &waiting).await;

    let mut reports = Vec::new();
    for (i, token) in buyers.iter().enumerate() {
        let request = c
            .post(instances[i % 3].url("/api/rooms/sale/release"))
            .bearer_auth(ADMIN)
            .json(&serde_json::json!({ "ticket": token, "purchased": 1 }))
            .send();
        reports.push(tokio::spawn(request));
    }
    let mut lefts = Vec::new();
    let mut endings = 0;
    for r in reports {
        let r = r.await.unwrap().unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["released"], true, "{body}");
        lefts.push(body["stock"].as_u64().unwrap());
        endings += usize::from(body["sold_out"] == true);
    }
    assert_eq!(endings, 1, "the sale ends once");
    lefts.sort_unstable();
    let mut want = vec![0; 16];
    want.extend(1..=24);
    assert_eq!(lefts, want);

    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(e)) = stream.next().await {
            if e.event != "position" {
                return Some(e);
            }
        }
        None
    })
    .await
    .unwrap()
    .expect("the stream ends with an event");
    assert_eq!(closed.event, "closed");
    let data: Value = serde_json::from_str(&closed.data).unwrap();
    assert_eq!(data["reason"], "sold_out");
    for i in &instances {
        let joined = c.post(i.url("/api/rooms/sale/join")).send().await.unwrap();
        assert_eq!(joined.status(), StatusCode::GONE);
        let room: Value = c
            .get(i.url("/admin/rooms/sale"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            (&room["stock"], &room["mode"]),
            (&serde_json::json!(0), &serde_json::json!("sold_out"))
        );
    }
    for i in instances {
        i.stop().await;
    }
}

/// A narabu process on Redis, killed with SIGKILL on drop.
fn process(redis: &RedisServer) -> NarabuProcess {
    NarabuProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_narabu")),
        &format!(
            r#"backend = "redis"
redis_url = "{url}"
secret = "{SECRET}"

[[rooms]]
id = "sale"
capacity = 1
tick = "200ms"
"#,
            url = redis.url()
        ),
    )
}

async fn wait_until<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_worker_instance_hands_the_room_to_another() {
    let redis = RedisServer::start().await;
    let mut con = redis.client().await;
    let lease_key = "narabu:v7:{sale}:lease";
    let mut a = process(&redis);
    let holder = {
        let con = con.clone();
        wait_until(Duration::from_secs(20), move || {
            let mut con = con.clone();
            async move { con.exists::<_, bool>(lease_key).await.unwrap_or(false) }
        })
        .await
    };
    assert!(
        holder,
        "the first instance took the worker lease; it logged:\n{}",
        a.log()
    );
    let owner_a: String = con.get(lease_key).await.unwrap();

    let mut sale = room("sale", 1);
    sale.tick = Duration::from_millis(200);
    let b = Instance::start(&redis, vec![sale], RedisOptions::DEFAULT_LEASE).await;
    let c = client();
    let (first, _) = join(&c, &b.base, "sale").await;
    let (second, _) = join(&c, &b.base, "sale").await;
    // The process's worker admits the first.
    assert!(
        wait_until(Duration::from_secs(10), || async {
            status(&c, &b.base, "sale", &first).await == "admitted"
        })
        .await
    );
    assert_eq!(status(&c, &b.base, "sale", &second).await, "waiting");

    a.kill();
    // A second permit needs a worker's tick to be handed out.
    let patch = narabu::backend::RoomPatch {
        capacity: Some(2),
        ..Default::default()
    };
    b.backend
        .patch_room(&RoomId::new("sale").unwrap(), patch)
        .await
        .unwrap();
    // Within one lease (3 s) plus a tick, with room for a slow machine.
    assert!(
        wait_until(Duration::from_secs(30), || async {
            status(&c, &b.base, "sale", &second).await == "admitted"
        })
        .await,
        "admissions did not resume after the worker's instance died"
    );
    let owner_b: String = con.get(lease_key).await.unwrap();
    assert_ne!(owner_a, owner_b);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_going_away_answers_503_and_recovers_by_itself() {
    let mut redis = RedisServer::start_persistent().await;
    let mut sale = room("sale", 1);
    sale.tick = Duration::from_millis(100);
    let app = Instance::start(&redis, vec![sale], Duration::from_secs(1)).await;
    let c = client();
    let (pass, _) = join(&c, &app.base, "sale").await;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            status(&c, &app.base, "sale", &pass).await == "admitted"
        })
        .await
    );
    let gate = |c: reqwest::Client, url: String, token: String| async move {
        c.get(url)
            .header("cookie", format!("narabu_sale={token}"))
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(
        gate(c.clone(), app.url("/gate/sale"), pass.clone()).await,
        StatusCode::NO_CONTENT
    );

    redis.kill();
    let r = c
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unavailable");
    assert!(!body["message"].as_str().unwrap().contains("redis://"));
    // The gate fails closed by default: back to the queue, never a 5xx.
    assert_eq!(
        gate(c.clone(), app.url("/gate/sale"), pass.clone()).await,
        StatusCode::UNAUTHORIZED
    );
    let ready = c.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);

    redis.launch(&[]).await;
    assert!(
        wait_until(Duration::from_secs(20), || async {
            c.post(app.url("/api/rooms/sale/join"))
                .send()
                .await
                .map(|r| r.status() == StatusCode::CREATED)
                .unwrap_or(false)
        })
        .await,
        "joins did not recover after Redis came back"
    );
    // The state survived (Redis with an append-only file): the pass holds.
    assert_eq!(status(&c, &app.base, "sale", &pass).await, "admitted");
    assert_eq!(
        gate(c.clone(), app.url("/gate/sale"), pass.clone()).await,
        StatusCode::NO_CONTENT
    );
    app.stop().await;
}

/// `on_backend_error = "open"`: while Redis is away, a visitor whose pass
/// was live when last checked still goes through, by the signed pass
/// cookie the gate set then; a waiting visitor and a forged pass do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_open_lets_only_live_passes_through() {
    let mut redis = RedisServer::start_persistent().await;
    let mut sale = room("sale", 1);
    sale.tick = Duration::from_millis(100);
    let app = Instance::start_with(
        &redis,
        vec![sale],
        Duration::from_secs(1),
        OnBackendError::Open,
    )
    .await;
    let c = client();
    let (admitted, _) = join(&c, &app.base, "sale").await;
    let (waiting, _) = join(&c, &app.base, "sale").await;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            status(&c, &app.base, "sale", &admitted).await == "admitted"
        })
        .await
    );
    let check = |cookies: String| {
        let c = c.clone();
        let url = app.url("/gate/sale");
        async move { c.get(url).header("cookie", cookies).send().await.unwrap() }
    };
    // While the backend answers, the gate hands the admitted visitor a pass.
    let ok = check(format!("narabu_sale={admitted}")).await;
    assert_eq!(ok.status(), StatusCode::NO_CONTENT);
    let set = ok.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.starts_with("narabu_sale_pass=") && set.contains("HttpOnly"),
        "{set}"
    );
    let pass = set.split(';').next().unwrap().to_owned();
    let waiting_check = check(format!("narabu_sale={waiting}")).await;
    assert_eq!(waiting_check.status(), StatusCode::UNAUTHORIZED);
    assert!(waiting_check.headers().get("set-cookie").is_none());

    redis.kill();
    // The admitted visitor with the pass goes on; without it, or with the
    // pass on someone else's ticket, or edited, the queue.
    assert_eq!(
        check(format!("narabu_sale={admitted}; {pass}"))
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        check(format!("narabu_sale={admitted}")).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        check(format!("narabu_sale={waiting}; {pass}"))
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let mut edited = pass.clone().into_bytes();
    let at = edited.len() - 3;
    edited[at] = if edited[at] == b'A' { b'B' } else { b'A' };
    let edited = String::from_utf8(edited).unwrap();
    assert_eq!(
        check(format!("narabu_sale={admitted}; {edited}"))
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    app.stop().await;
}

/// While failing open nobody can be revoked or leave, so a pass is trusted
/// only a short while after the store last renewed it, not for
/// `pass_idle`: a visitor revoked before the outage is refused once that
/// short while is over. Leaving removes the pass cookie at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_open_trusts_a_pass_only_briefly_and_leaving_clears_it() {
    let mut redis = RedisServer::start_persistent().await;
    let mut sale = room("sale", 2);
    sale.tick = Duration::from_millis(100);
    let app = Instance::start_with(
        &redis,
        vec![sale],
        Duration::from_secs(1),
        OnBackendError::Open,
    )
    .await;
    let c = client();
    let (revoked, _) = join(&c, &app.base, "sale").await;
    let (leaving, _) = join(&c, &app.base, "sale").await;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            status(&c, &app.base, "sale", &revoked).await == "admitted"
                && status(&c, &app.base, "sale", &leaving).await == "admitted"
        })
        .await
    );
    let check = |cookies: String| {
        let c = c.clone();
        let url = app.url("/gate/sale");
        async move { c.get(url).header("cookie", cookies).send().await.unwrap() }
    };
    let ok = check(format!("narabu_sale={revoked}")).await;
    assert_eq!(ok.status(), StatusCode::NO_CONTENT);
    let issued = Instant::now();
    let set = ok.headers()["set-cookie"].to_str().unwrap().to_owned();
    let max_age: u64 = set
        .split(';')
        .find_map(|p| p.trim().strip_prefix("Max-Age="))
        .expect("a Max-Age")
        .parse()
        .unwrap();
    assert!(max_age <= 30, "a short-lived pass, not pass_idle: {set}");
    let pass = set.split(';').next().unwrap().to_owned();

    // Leaving answers with the pass cookie's removal.
    let left = c
        .post(app.url("/api/rooms/sale/leave"))
        .bearer_auth(&leaving)
        .send()
        .await
        .unwrap();
    assert_eq!(left.status(), StatusCode::NO_CONTENT);
    let removal = left
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("narabu_sale_pass="))
        .expect("the pass cookie removed");
    assert!(removal.contains("Max-Age=0"), "{removal}");

    let revoke = c
        .post(app.url("/admin/rooms/sale/revoke"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"ticket": revoked}))
        .send()
        .await
        .unwrap();
    assert_eq!(revoke.status(), StatusCode::OK);
    redis.kill();
    // The store cannot say the pass was revoked; once the short while
    // since its last renewal is over, it no longer opens the gate.
    let after = Duration::from_millis(narabu::http::ticket::FAIL_OPEN_PASS_MS + 1_000);
    tokio::time::sleep(after.saturating_sub(issued.elapsed())).await;
    assert_eq!(
        check(format!("narabu_sale={revoked}; {pass}"))
            .await
            .status(),
        StatusCode::UNAUTHORIZED
    );
    app.stop().await;
}
