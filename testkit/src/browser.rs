//! Headless Chromium for the browser tests (`tests/dashboard.rs`,
//! `tests/browser.rs`), driven by chromedriver over the W3C WebDriver
//! protocol through fantoccini. `scripts/test` installs Debian's `chromium`
//! and `chromium-driver`.
//!
//! Each `Driver` runs its own chromedriver on a free port and its own
//! browser profile, both gone when the test ends however it ends. The
//! methods are the few the tests use, each a WebDriver command that panics
//! with what it was asked to do when the browser refuses.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
pub use fantoccini::key::Key;
use fantoccini::wd::{Capabilities, WebDriverCompatibleCommand};
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// chromedriver with one browser session.
pub struct Driver {
    client: Client,
    chromedriver: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.chromedriver.kill();
        let _ = self.chromedriver.wait();
    }
}

impl Driver {
    /// A browser with JavaScript on.
    pub async fn start() -> Driver {
        Self::start_with(true).await
    }

    /// A browser with JavaScript on or off. Off is Chromium's content
    /// setting, as a visitor who turned scripts off has it; WebDriver's own
    /// scripts still run (they go through DevTools), so the test can look.
    pub async fn start_with(javascript: bool) -> Driver {
        Self::start_with_options(javascript, None).await
    }

    /// A browser whose visitor prefers these languages: what it sends as
    /// `Accept-Language` (e.g. `"fr-FR,fr"`), as set in its settings.
    pub async fn start_in_language(accept_language: &str) -> Driver {
        Self::start_with_options(true, Some(accept_language)).await
    }

    async fn start_with_options(javascript: bool, accept_language: Option<&str>) -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut chromedriver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is installed (scripts/test installs chromium-driver)");
        let profile = tempfile::tempdir().unwrap();
        let mut options = json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1300",
                     format!("--user-data-dir={}", profile.path().display())]
        });
        let mut prefs = serde_json::Map::new();
        if !javascript {
            prefs.insert(
                "profile.managed_default_content_settings.javascript".into(),
                json!(2),
            );
        }
        if let Some(languages) = accept_language {
            prefs.insert("intl.accept_languages".into(), json!(languages));
        }
        if !prefs.is_empty() {
            options["prefs"] = prefs.into();
        }
        let mut capabilities = Capabilities::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{port}");
        // chromedriver takes a moment to listen; a refused connection is
        // retried, anything else is an answer.
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => break client,
                Err(e) if Instant::now() < deadline => {
                    if let Ok(Some(status)) = chromedriver.try_wait() {
                        panic!("chromedriver exited ({status}): {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no browser session from chromedriver: {e}"),
            }
        };
        Driver {
            client,
            chromedriver,
            _profile: profile,
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("go to {url}: {e}"));
    }

    /// The address the browser is on now.
    pub async fn current_url(&self) -> String {
        self.client.current_url().await.unwrap().to_string()
    }

    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
    }

    /// An element's rendered text, as a visitor reads it.
    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.unwrap()
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        self.find(css)
            .await
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Picks an option of a `<select>` as a person does: a click on the
    /// list (which gives it the focus), then one on the option.
    pub async fn choose(&self, select_css: &str, value: &str) {
        self.click(select_css).await;
        self.click(&format!("{select_css} option[value=\"{value}\"]"))
            .await;
    }

    /// Presses and releases a key where the focus is, as a keyboard does
    /// (chromedriver's typing into a `<select>` never reaches the page's
    /// key listeners).
    pub async fn press(&self, key: Key) {
        let key = char::from(key);
        let keys = KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value: key })
            .then(KeyAction::Up { value: key });
        self.client
            .perform_actions(keys)
            .await
            .unwrap_or_else(|e| panic!("press {key:?}: {e}"));
    }

    pub async fn script(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// A script that finishes by calling its last argument.
    pub async fn script_async(&self, script: &str) -> Value {
        self.client
            .execute_async(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("{script}: {e}"))
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

    /// Makes the page see `prefers-color-scheme: scheme` (`light`, `dark`),
    /// through Chromium's DevTools, which chromedriver passes on.
    pub async fn prefer_color_scheme(&self, scheme: &str) {
        let command = ChromeDevTools(json!({
            "cmd": "Emulation.setEmulatedMedia",
            "params": {"features": [{"name": "prefers-color-scheme", "value": scheme}]}
        }));
        self.client
            .issue_cmd(command)
            .await
            .unwrap_or_else(|e| panic!("emulate {scheme}: {e}"));
    }

    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Ends the browser session (chromedriver stops on drop).
    pub async fn quit(self) {
        self.client.clone().close().await.unwrap();
    }
}

/// chromedriver's `goog/cdp/execute` extension command: one DevTools call.
#[derive(Debug)]
struct ChromeDevTools(Value);

impl WebDriverCompatibleCommand for ChromeDevTools {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        let session = session_id.expect("a session is open");
        base_url.join(&format!("session/{session}/goog/cdp/execute"))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(self.0.to_string()))
    }
}
