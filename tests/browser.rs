//! The visitor's whole trip in a real browser: headless Chromium asks a real
//! nginx (running the shipped `config/nginx.conf`) for a protected page,
//! lands on Narabu's queue page, watches its place change without a reload,
//! and is carried to the origin page when the visitor holding the only
//! permit leaves. A second browser with JavaScript turned off makes the
//! same trip on the page's `<noscript>` meta refresh alone. axe-core, run
//! inside the waiting page, finds no serious or critical accessibility
//! violations. A third browser follows an invitation to a presale room
//! that asks a proof of work, which the page solves in a Web Worker.
//!
//! A fourth trip cuts the page's event stream (a relay between Chromium and
//! Narabu drops the connection): the browser's own EventSource reconnects
//! with `Last-Event-ID`, and the admission that came while it was away
//! carries the visitor on at once.
//!
//! Screenshots for a person to look at go to `target/e2e/`: `queue-waiting`
//! (and `-dark`), `origin-reached`, `nojs-queue-waiting`, `nojs-origin-reached`,
//! `pow-queue-waiting`, `pow-origin-reached`.
//!
//! axe-core comes from the npm registry, installed under `target/e2e/node`
//! the first time (never committed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::backend::embedded::EmbeddedBackend;
use narabu::engine::SystemClock;
use narabu_testkit::app::{config, spawn_with};
use narabu_testkit::browser::Driver;
use narabu_testkit::proxy::{Kind, Proxy, spawn_origin};
use narabu_testkit::relay::Relay;
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::Value;

fn e2e_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/e2e")
}

/// `axe.min.js`, installed from the npm registry when missing: once per
/// run, since the tests that use it run at once and two `npm install`s
/// into one directory undo each other's files.
fn axe_source() -> String {
    static SOURCE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SOURCE.get_or_init(install_axe).clone()
}

fn install_axe() -> String {
    let prefix = e2e_dir().join("node");
    let script = prefix.join("node_modules/axe-core/axe.min.js");
    if !script.exists() {
        std::fs::create_dir_all(&prefix).unwrap();
        let status = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&prefix)
            .arg("axe-core@4")
            .status()
            .expect("npm is installed (scripts/test installs it)");
        assert!(status.success(), "npm install axe-core failed");
    }
    std::fs::read_to_string(&script).unwrap()
}

/// Runs axe-core in the page the browser shows; its violations, each as
/// `{id, impact, help, nodes}`.
async fn axe_violations(driver: &Driver) -> Vec<Value> {
    let loaded = driver
        .script(&format!("{}\n;return typeof axe.run", axe_source()))
        .await;
    assert_eq!(loaded, "function", "axe-core loaded into the page");
    let result = driver
        .script_async(
            "var done = arguments[arguments.length - 1];
             axe.run(document).then(function (r) {
               done({passes: r.passes.length, violations: r.violations.map(function (v) {
                 return {id: v.id, impact: v.impact, help: v.help,
                         nodes: v.nodes.map(function (n) { return n.target.join(' '); })};
               })});
             }, function (e) { done({error: String(e)}); });",
        )
        .await;
    let passes = result["passes"].as_u64().unwrap_or(0);
    println!("axe-core: {passes} rules passed");
    // A run that checked nothing would find nothing.
    assert!(passes > 10, "axe-core did not run its rules: {result}");
    result["violations"].as_array().unwrap().clone()
}

/// Polls the browser's address (a WebDriver command, so it works with the
/// page's scripts off) until it is `want`.
async fn wait_for_url(driver: &Driver, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let now = driver.current_url().await;
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "still on {now}, not {want}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn assert_screenshot(path: &Path) {
    let size = std::fs::metadata(path).unwrap().len();
    assert!(size > 5_000, "{} is a real screenshot", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_waits_through_nginx_and_reaches_the_origin_with_and_without_javascript() {
    let mut sale = room("sale", 1);
    sale.tick = Duration::from_millis(200);
    sale.join_limit_per_minute = 0;
    // The room's worker runs, as in production: nothing here ticks by hand.
    let backend = EmbeddedBackend::new(vec![sale], Arc::new(SystemClock));
    let app = spawn_with(config(), backend).await;
    let origin = spawn_origin().await;
    let nginx = Proxy::start(Kind::Nginx, app.base.trim_start_matches("http://"), &origin).await;
    let shots = e2e_dir();

    // A first visitor holds the only permit; a second waits behind them.
    let first = app.join("sale").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.status("sale", &first).await["status"] != "admitted" {
        assert!(Instant::now() < deadline, "the worker admits the first");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = app.join("sale").await;
    assert_eq!(second.body["position"], 1);

    // The browser asks for a protected page and is sent to the queue,
    // third in line counting the one admitted: position 2.
    let browser = Driver::start().await;
    browser
        .goto(&format!("{}/tickets?seat=a1", nginx.base))
        .await;
    let queue = format!("{}/queue/sale?return=%2Ftickets%3Fseat%3Da1", nginx.base);
    assert_eq!(browser.current_url().await, queue);
    browser
        .wait_until(
            "the queue page shows position 2",
            "return document.getElementById('position').textContent === '2'",
        )
        .await;
    // axe-core in every language, and in the light and the dark colour
    // scheme (the page follows the visitor's), since contrast is checked
    // on the colours shown. Each language is a fresh page load.
    for (lang, scheme) in [
        ("ja", "light"),
        ("zh", "dark"),
        ("en", "dark"),
        ("en", "light"),
    ] {
        browser.goto(&format!("{queue}&lang={lang}")).await;
        browser.prefer_color_scheme(scheme).await;
        let violations = axe_violations(&browser).await;
        for v in &violations {
            println!("axe ({lang}, {scheme}): {v}");
        }
        let serious: Vec<&Value> = violations
            .iter()
            .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
            .collect();
        assert!(
            serious.is_empty(),
            "serious accessibility violations ({lang}, {scheme}): {serious:?}"
        );
        if scheme == "dark" && lang == "en" {
            browser
                .screenshot(&shots.join("queue-waiting-dark.png"))
                .await;
        }
    }
    browser
        .wait_until(
            "the queue page still shows position 2",
            "return document.documentElement.lang === 'en' && \
             document.getElementById('position').textContent === '2'",
        )
        .await;
    // A mark on this very document: a reload would lose it.
    browser
        .script("window.narabuSamePage = true; return true")
        .await;
    browser.screenshot(&shots.join("queue-waiting.png")).await;
    assert_screenshot(&shots.join("queue-waiting.png"));

    // The visitor ahead leaves: the page moves to position 1 in place.
    assert_eq!(app.leave("sale", &second).await, StatusCode::NO_CONTENT);
    browser
        .wait_until(
            "the page shows position 1 without reloading",
            "return window.narabuSamePage === true && \
             document.getElementById('position').textContent === '1' && \
             document.getElementById('ahead').textContent === '0'",
        )
        .await;

    // The permit holder leaves: the permit is handed to the browser's
    // ticket, the page hears it on its event stream and goes back to the
    // page it asked for, which nginx now lets through to the origin.
    assert_eq!(app.leave("sale", &first).await, StatusCode::NO_CONTENT);
    browser
        .wait_until(
            "the browser reaches the origin page",
            "return location.pathname === '/tickets' && \
             document.body.innerText.indexOf('origin page /tickets') >= 0",
        )
        .await;
    assert_eq!(
        browser.current_url().await,
        format!("{}/tickets?seat=a1", nginx.base)
    );
    browser.screenshot(&shots.join("origin-reached.png")).await;
    assert_screenshot(&shots.join("origin-reached.png"));

    // Without JavaScript, behind the browser that now holds the permit.
    let plain = Driver::start_with(false).await;
    plain.goto(&format!("{}/tickets", nginx.base)).await;
    let queue_url = format!("{}/queue/sale?return=%2Ftickets", nginx.base);
    assert_eq!(plain.current_url().await, queue_url);
    assert_eq!(plain.text("#position").await, "1");
    let page = plain.text("body").await;
    assert!(
        page.contains("This page refreshes every"),
        "the <noscript> note shows, so scripts are off: {page}"
    );
    // With scripts off, the <noscript> in the head is parsed as markup: its
    // meta refresh is live.
    let refresh = plain
        .script(
            "var m = document.querySelector('noscript meta[http-equiv=refresh]'); \
             return m ? m.getAttribute('content') : null",
        )
        .await;
    let seconds: u64 = refresh
        .as_str()
        .unwrap_or_else(|| panic!("no live meta refresh: {refresh}"))
        .parse()
        .unwrap();
    assert!((5..=60).contains(&seconds), "refresh every {seconds} s");
    plain
        .screenshot(&shots.join("nojs-queue-waiting.png"))
        .await;
    assert_screenshot(&shots.join("nojs-queue-waiting.png"));

    // The first browser gives its permit back from its own page.
    let left = browser
        .script_async(
            "var done = arguments[arguments.length - 1];
             fetch('/api/rooms/sale/leave', {method: 'POST', credentials: 'same-origin'})
               .then(function (r) { done(r.status); }, function (e) { done(String(e)); });",
        )
        .await;
    assert_eq!(left, 204);

    // The next refresh finds the ticket admitted and the server sends the
    // browser on to the origin.
    wait_for_url(
        &plain,
        &format!("{}/tickets", nginx.base),
        Duration::from_secs(seconds + 15),
    )
    .await;
    assert_eq!(plain.text("body").await, "origin page /tickets");
    plain
        .screenshot(&shots.join("nojs-origin-reached.png"))
        .await;
    assert_screenshot(&shots.join("nojs-origin-reached.png"));

    plain.quit().await;
    browser.quit().await;
    drop(nginx);
    app.stop().await;
}

/// An invite-only room that also asks a proof of work, as a presale would
/// be set up: the origin's invitation link goes through nginx to the
/// queue page, which solves the challenge in a Web Worker with WebCrypto,
/// joins with the solution and the invitation, drops the invitation from
/// the address, waits, and carries the visitor to the origin page once
/// admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_solves_the_proof_of_work_and_follows_an_invitation_to_the_origin() {
    use narabu::access::{ChallengeMode, EnqueueMode, SharedKey};
    use serde_json::json;
    const KEY: &str = "browser-test-shared-key-browser-test-01";
    const BITS: u8 = 14;
    let mut sale = room("sale", 1);
    sale.tick = Duration::from_millis(200);
    sale.access.challenge = ChallengeMode::Pow;
    sale.access.pow_difficulty = BITS;
    sale.access.pow_difficulty_max = BITS;
    sale.access.enqueue = EnqueueMode::Token;
    sale.access.enqueue_key = Some(SharedKey::new(KEY));
    let backend = EmbeddedBackend::new(vec![sale], Arc::new(SystemClock));
    let app = spawn_with(config(), backend).await;
    let origin = spawn_origin().await;
    let nginx = Proxy::start(Kind::Nginx, app.base.trim_start_matches("http://"), &origin).await;
    let exp = narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) / 1000 + 600;
    let invite = |account: &str| {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &json!({"aud": "sale", "sub": account, "exp": exp}),
            &jsonwebtoken::EncodingKey::from_secret(KEY.as_bytes()),
        )
        .unwrap()
    };

    // Another fan's app holds the only permit, so the browser will wait.
    let client = reqwest::Client::new();
    let join = |body: Value| {
        client
            .post(app.url("/api/rooms/sale/join"))
            .json(&body)
            .send()
    };
    let refused: Value = join(json!({"enqueue_token": invite("fan-0")}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let challenge = refused["challenge"]["token"].as_str().unwrap().to_owned();
    let counter = narabu::access::pow::solve(&challenge, BITS);
    let first: Value = join(json!({
        "enqueue_token": invite("fan-0"), "challenge": challenge, "counter": counter
    }))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let first = first["ticket"].as_str().unwrap().to_owned();

    let browser = Driver::start().await;
    browser
        .goto(&format!(
            "{}/queue/sale?return=%2Ftickets&enqueue_token={}",
            nginx.base,
            invite("fan-1")
        ))
        .await;
    // Solved, joined, and reloaded as an ordinary waiting page whose
    // address no longer carries the invitation.
    browser
        .wait_until_within(
            "the page has a ticket and waits at position 1",
            "return !document.getElementById('pow') && \
             document.getElementById('position').textContent === '1'",
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(
        browser.current_url().await,
        format!("{}/queue/sale?return=%2Ftickets&lang=en", nginx.base)
    );
    browser
        .screenshot(&e2e_dir().join("pow-queue-waiting.png"))
        .await;

    let left = client
        .post(app.url("/api/rooms/sale/leave"))
        .bearer_auth(&first)
        .send()
        .await
        .unwrap();
    assert_eq!(left.status(), StatusCode::NO_CONTENT);
    browser
        .wait_until_within(
            "the browser reaches the origin page",
            "return location.pathname === '/tickets' && \
             document.body.innerText.indexOf('origin page /tickets') >= 0",
            Duration::from_secs(30),
        )
        .await;
    browser
        .screenshot(&e2e_dir().join("pow-origin-reached.png"))
        .await;

    // Two accounts, two tickets, each from a solved join.
    let s = app
        .backend
        .room(&narabu::engine::RoomId::new("sale").unwrap())
        .await
        .unwrap();
    assert_eq!(s.stats.joins, 2);
    let metrics = client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"narabu_challenges_solved_total{room="sale"} 2"#),
        "{metrics}"
    );
    browser.quit().await;
    drop(nginx);
    app.stop().await;
}

/// Whether the server has answered an event stream (its request counter).
async fn events_answered(app: &narabu_testkit::app::TestApp) -> bool {
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap();
    let text = metrics.text().await.unwrap();
    text.lines().any(|l| {
        l.starts_with("narabu_http_requests_total{")
            && l.contains("route=\"/api/rooms/:room/events\"")
            && l.contains("status=\"200\"")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_reconnects_and_gets_the_admission_it_missed() {
    // Nothing ticks here but the test: only the hand-off admits.
    let backend = EmbeddedBackend::without_workers(vec![room("sale", 1)], Arc::new(SystemClock));
    let app = spawn_with(config(), backend).await;
    let holder = app.join("sale").await;
    app.tick("sale").await;
    assert_eq!(app.status("sale", &holder).await["status"], "admitted");
    let server = app.base.trim_start_matches("http://").parse().unwrap();
    let relay = Relay::start(server).await;
    let browser = Driver::start().await;
    browser
        .goto(&format!("http://{}/queue/sale?return=%2Fdone", relay.addr))
        .await;
    browser
        .wait_until(
            "the page shows position 1",
            "return document.getElementById('position').textContent === '1'",
        )
        .await;
    // The page's stream is open (the server answered it).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !events_answered(&app).await {
        assert!(
            Instant::now() < deadline,
            "the page opened its event stream"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The network drops the stream; the page notices.
    relay.cut();
    browser
        .wait_until(
            "the page marks itself stale",
            "return document.getElementById('queue').classList.contains('is-stale')",
        )
        .await;
    // Meanwhile the holder leaves: the permit goes to the browser's ticket.
    assert_eq!(app.leave("sale", &holder).await, StatusCode::NO_CONTENT);
    relay.reopen();
    // EventSource reconnects by itself after the stream's `retry:` (3 s),
    // and the admission it missed sends it on.
    browser
        .wait_until_within(
            "the browser goes on to its return path",
            "return location.pathname === '/done'",
            Duration::from_secs(15),
        )
        .await;
    // The relay saw the reconnection (a connection of its own, made after
    // the cut) name the last event the page had: ahead 0.
    let reconnected: Vec<String> = relay
        .heads()
        .into_iter()
        .filter(|h| h.starts_with("GET /api/rooms/sale/events"))
        .collect();
    assert!(
        reconnected
            .iter()
            .any(|h| h.to_ascii_lowercase().contains("\r\nlast-event-id: 0\r\n")),
        "the reconnection names the last event it had: {reconnected:?}"
    );
    browser.quit().await;
    app.stop().await;
}

/// What the page's script handed the Push API and then the service: the
/// browser's own push service cannot be reached from these machines, so
/// `PushManager.subscribe` is watched (its arguments kept) and answers
/// with a subscription made here, of the shape browsers return.
const WATCH_PUSH: &str = r#"
  var sub = SUBSCRIPTION;
  window.__narabu = {asked: 0, subscribe: null, sent: null};
  Notification.requestPermission = function () {
    window.__narabu.asked += 1;
    return Promise.resolve("granted");
  };
  PushManager.prototype.subscribe = function (options) {
    var key = new Uint8Array(options.applicationServerKey);
    var b64 = btoa(String.fromCharCode.apply(null, key))
      .replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    window.__narabu.subscribe = {userVisibleOnly: options.userVisibleOnly, key: b64};
    return Promise.resolve({toJSON: function () { return sub; }});
  };
  var realFetch = window.fetch;
  window.fetch = function (url, init) {
    if (init && init.method === "POST") window.__narabu.sent = JSON.parse(init.body);
    return realFetch.apply(this, arguments);
  };
  return true;
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_page_offers_to_call_back_registers_its_worker_and_subscribes() {
    use narabu::config::{Config, PushConfig};
    use p256::elliptic_curve::sec1::ToEncodedPoint as _;

    let backend = EmbeddedBackend::without_workers(vec![room("sale", 1)], Arc::new(SystemClock));
    let push = Config {
        push: PushConfig {
            enabled: true,
            vapid_key_file: None,
            contact: "mailto:ops@example.com".into(),
            allow_insecure_endpoints: false,
        },
        ..config()
    };
    let app = spawn_with(push, backend).await;
    let holder = app.join("sale").await;
    app.tick("sale").await;
    assert_eq!(app.status("sale", &holder).await["status"], "admitted");
    let key: Value = app
        .client
        .get(app.url("/api/rooms/sale/notify"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let served_key = key["public_key"].as_str().unwrap().to_owned();

    let browser = Driver::start_in_language("ja").await;
    browser.goto(&app.url("/queue/sale?return=%2Fdone")).await;
    browser
        .wait_until(
            "the control is shown",
            "var b = document.getElementById('notify-button');
             return !!b && !document.getElementById('notify').hidden",
        )
        .await;
    assert_eq!(browser.text("#notify-button").await, "順番が来たら通知する");
    assert_eq!(
        browser
            .script("return document.getElementById('notify-button').getAttribute('aria-pressed')")
            .await,
        "false"
    );
    // Nothing asked the visitor anything yet.
    assert_eq!(
        browser.script("return Notification.permission").await,
        "default"
    );
    let serious: Vec<Value> = axe_violations(&browser)
        .await
        .into_iter()
        .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
        .collect();
    assert!(serious.is_empty(), "{serious:#?}");

    // The subscription a browser would give: a real P-256 key and secret.
    let secret = p256::SecretKey::from_slice(&[7u8; 32]).unwrap();
    let point = secret.public_key().to_encoded_point(false);
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let subscription = serde_json::json!({
        "endpoint": "https://push.example.net/wpush/v2/abc",
        "expirationTime": null,
        "keys": {"p256dh": b64.encode(point.as_bytes()), "auth": b64.encode([7u8; 16])},
    });
    let watched = browser
        .script(&WATCH_PUSH.replace("SUBSCRIPTION", &subscription.to_string()))
        .await;
    assert_eq!(watched, true);
    browser.click("#notify-button").await;
    browser
        .wait_until(
            "the control says the notifications are on",
            "return document.getElementById('notify-button').getAttribute('aria-pressed') === 'true'",
        )
        .await;
    let seen = browser.script("return window.__narabu").await;
    assert_eq!(seen["asked"], 1, "{seen:#}");
    assert_eq!(seen["subscribe"]["userVisibleOnly"], true, "{seen:#}");
    assert_eq!(seen["subscribe"]["key"], served_key.as_str(), "{seen:#}");
    assert_eq!(seen["sent"]["subscription"], subscription, "{seen:#}");
    assert_eq!(seen["sent"]["lang"], "ja", "{seen:#}");
    // The service worker from static/ is registered and running.
    let worker = browser
        .script_async(
            "var done = arguments[arguments.length - 1];
             navigator.serviceWorker.getRegistrations().then(function (rs) {
               done(rs.map(function (r) {
                 var w = r.active || r.waiting || r.installing;
                 return w ? w.scriptURL : null;
               }));
             }, function (e) { done(String(e)); });",
        )
        .await;
    assert!(
        worker.as_array().is_some_and(|ws| ws.iter().any(|w| w
            .as_str()
            .is_some_and(|u| u.contains("/static/narabu-sw.js")))),
        "{worker}"
    );
    // The service took what the page sent.
    let room = app.admin_room("sale").await;
    assert_eq!(room["push_subscriptions"], 1, "{room:#}");

    // Pressed again: off.
    browser.click("#notify-button").await;
    browser
        .wait_until(
            "the control says the notifications are off",
            "return document.getElementById('notify-button').getAttribute('aria-pressed') === 'false'",
        )
        .await;
    assert_eq!(app.admin_room("sale").await["push_subscriptions"], 0);
    browser.quit().await;
    app.stop().await;
}
