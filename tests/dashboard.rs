//! The operators' dashboard in headless Chromium: it loads, takes the admin
//! token, shows a room with live figures and charts, and a capacity change
//! made with its controls reaches the engine. A screenshot is saved to
//! `target/e2e/dashboard.png` for a person to look at.
//!
//! The browser is driven by chromedriver over the W3C WebDriver protocol,
//! spoken here with the test's HTTP client: the handful of commands needed
//! do not justify a WebDriver crate's dependency tree. `scripts/test`
//! installs Debian's `chromium` and `chromium-driver`.

#[path = "api/support.rs"]
#[allow(dead_code)]
mod support;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use narabu::backend::embedded::EmbeddedBackend;
use narabu::engine::{RoomId, SystemClock};
use serde_json::{Value, json};
use support::{ADMIN_TOKEN, config, room, spawn_with};

/// chromedriver, stopped when the test ends however it ends.
struct Driver {
    child: Child,
    base: String,
    client: reqwest::Client,
    session: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Driver {
    async fn start() -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is installed (scripts/test installs chromium-driver)");
        let mut driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
            session: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = driver
                .client
                .get(format!("{}/status", driver.base))
                .send()
                .await
                && r.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let created = driver
            .call(
                "POST",
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": "/usr/bin/chromium",
                        "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                                 "--disable-dev-shm-usage", "--window-size=1400,1300",
                                 format!("--user-data-dir={}", profile.path().display())]
                    }
                }}}),
            )
            .await;
        driver.session = created["sessionId"].as_str().unwrap().to_owned();
        // The profile lives as long as the browser; chromium removes nothing
        // itself, the tempdir does on drop at the end of the test process.
        std::mem::forget(profile);
        driver
    }

    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = if path == "/session" {
            format!("{}{path}", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let request = match method {
            "GET" => self.client.get(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.post(url).json(&body),
        };
        let response = request.send().await.unwrap();
        let status = response.status();
        let value: Value = response.json().await.unwrap();
        assert!(status.is_success(), "{method} {path}: {value}");
        value["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url })).await;
    }

    async fn find(&self, css: &str) -> String {
        let v = self
            .call(
                "POST",
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("{css}: {v}"))
            .to_owned()
    }

    async fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.call("POST", &format!("/element/{id}/click"), json!({}))
            .await;
    }

    async fn script(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Polls a script until it returns true.
    async fn wait_until(&self, what: &str, script: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.script(script).await == Value::Bool(true) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn screenshot(&self, path: &std::path::Path) {
        let b64 = self.call("GET", "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_takes_the_token_shows_rooms_and_changes_capacity() {
    let mut sale = room("sale", 50);
    sale.tick = std::time::Duration::from_millis(200);
    sale.join_limit_per_minute = 0;
    let backend = EmbeddedBackend::new(vec![sale, room("later", 10)], Arc::new(SystemClock));
    let app = spawn_with(config(), backend.clone()).await;
    // Some line to draw: visitors join over a few seconds.
    let mut visitors = Vec::new();
    for _ in 0..80 {
        visitors.push(app.join("sale").await);
    }

    let driver = Driver::start().await;
    driver.goto(&app.url("/admin")).await;
    driver
        .wait_until(
            "the login form shows",
            "return !document.getElementById('login').hidden",
        )
        .await;
    // The token goes to sessionStorage only, never a cookie or the URL.
    driver.type_into("#token", ADMIN_TOKEN).await;
    driver.click("#login-submit").await;
    driver
        .wait_until(
            "the room appears with its figures",
            "var e = document.getElementById('fig-admitted-sale'); \
             return !!e && e.textContent.indexOf('/ 50') > 0",
        )
        .await;
    let stored = driver
        .script(
            "return [sessionStorage.getItem('narabu_admin_token'), document.cookie, location.href]",
        )
        .await;
    assert_eq!(stored[0], ADMIN_TOKEN);
    assert_eq!(stored[1], "");
    assert!(!stored[2].as_str().unwrap().contains(ADMIN_TOKEN));
    driver
        .wait_until(
            "the event stream is live",
            "return document.getElementById('conn').textContent === 'live'",
        )
        .await;

    // Let a few samples accumulate for the charts, with the line moving.
    for v in visitors.iter().take(20) {
        app.leave("sale", v).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    for _ in 0..30 {
        visitors.push(app.join("sale").await);
    }

    // The capacity control reaches the engine.
    driver.type_into("#cap-input-sale", "7").await;
    driver.click("#cap-set-sale").await;
    let engine = backend.engine_room(&RoomId::new("sale").unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.settings().capacity != 7 {
        assert!(
            Instant::now() < deadline,
            "the capacity change never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(engine.ledger().capacity, 7);
    driver
        .wait_until(
            "the page shows the new capacity",
            "return document.getElementById('cap-sale').textContent === 'capacity 7'",
        )
        .await;

    // Pause from the page, too.
    driver.click("#pause-sale").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !engine.settings().paused {
        assert!(Instant::now() < deadline, "pause never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver
        .wait_until(
            "the badge says paused and the charts have lines",
            "return document.getElementById('state-sale').textContent === 'paused' && \
             document.querySelectorAll('#chart-queue-sale path.line').length === 1 && \
             document.querySelectorAll('#chart-admitted-sale path.line').length === 2",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    driver
        .script("document.getElementById('room-sale').scrollIntoView()")
        .await;
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/e2e/dashboard.png");
    driver.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);

    // Forgetting the token returns to the form.
    driver.click("#signout").await;
    driver
        .wait_until(
            "the token is forgotten",
            "return sessionStorage.getItem('narabu_admin_token') === null && \
             !document.getElementById('login').hidden",
        )
        .await;
    driver.call("DELETE", "", Value::Null).await;
    drop(driver);
    app.stop().await;
}
