//! Headless Chromium for the browser tests, driven by chromedriver over the
//! W3C WebDriver protocol, spoken with the tests' HTTP client: the handful
//! of commands the tests need do not justify a WebDriver crate's dependency
//! tree. `scripts/test` installs Debian's `chromium` and `chromium-driver`.
//!
//! Shared by `tests/dashboard.rs` and `tests/browser.rs` (each includes it
//! with `#[path]`), so each test gets its own chromedriver on a free port,
//! stopped when the test ends however it ends.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

/// chromedriver with one browser session.
pub struct Driver {
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
    /// A browser with JavaScript on.
    pub async fn start() -> Driver {
        Self::start_with(true).await
    }

    /// A browser with JavaScript on or off. Off is Chromium's content
    /// setting, as a visitor who turned scripts off has it; WebDriver's own
    /// scripts still run (they go through DevTools), so the test can look.
    pub async fn start_with(javascript: bool) -> Driver {
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
        let mut options = json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1300",
                     format!("--user-data-dir={}", profile.path().display())]
        });
        if !javascript {
            options["prefs"] = json!({"profile.managed_default_content_settings.javascript": 2});
        }
        let created = driver
            .call(
                "POST",
                "/session",
                json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": options
                }}}),
            )
            .await;
        driver.session = created["sessionId"].as_str().unwrap().to_owned();
        // The profile lives as long as the browser; chromium removes nothing
        // itself, the tempdir does on drop at the end of the test process.
        std::mem::forget(profile);
        driver
    }

    /// One WebDriver command; `path` is relative to the session, except
    /// `/session` itself.
    pub async fn call(&self, method: &str, path: &str, body: Value) -> Value {
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

    pub async fn goto(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url })).await;
    }

    /// The address the browser is on now.
    pub async fn current_url(&self) -> String {
        let v = self.call("GET", "/url", Value::Null).await;
        v.as_str().unwrap().to_owned()
    }

    pub async fn find(&self, css: &str) -> String {
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

    /// An element's rendered text, as a visitor reads it.
    pub async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        let v = self
            .call("GET", &format!("/element/{id}/text"), Value::Null)
            .await;
        v.as_str().unwrap_or_default().to_owned()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.call("POST", &format!("/element/{id}/click"), json!({}))
            .await;
    }

    pub async fn script(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// A script that finishes by calling its last argument.
    pub async fn script_async(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/async",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// Polls a script until it returns true.
    pub async fn wait_until(&self, what: &str, script: &str) {
        self.wait_until_within(what, script, Duration::from_secs(20))
            .await;
    }

    pub async fn wait_until_within(&self, what: &str, script: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.script(script).await == Value::Bool(true) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn screenshot(&self, path: &Path) {
        let b64 = self.call("GET", "/screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Ends the browser session (chromedriver stops on drop).
    pub async fn quit(self) {
        self.call("DELETE", "", Value::Null).await;
    }
}
