//! The push service of `tests/push_service.py`, started and read from
//! Rust: the test binaries that check Web Push share it.

#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use narabu::push::Subscription;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

pub const LIBRARIES: &str = "http-ece==1.2.1 py-vapid==1.9.6 pyjwt==2.10.1";
pub const CONTACT: &str = "mailto:operator@example.com";

/// The Python push service, killed on drop.
pub struct PushService {
    _child: Child,
    pub lines: Lines<BufReader<ChildStdout>>,
    pub port: u16,
    pub p256dh: String,
    pub auth: String,
    /// A VAPID key py_vapid made, and its public key as py_vapid gives it.
    pub vapid_pem: String,
    pub vapid_public: String,
}

impl PushService {
    pub async fn start() -> PushService {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/push_service.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the push service starts")
            .unwrap()
            .unwrap_or_else(|| {
                panic!("the push service did not start: are `{LIBRARIES}` installed (pip install -r tests/requirements.txt; scripts/test does)?")
            });
        let first: Value = serde_json::from_str(&first).unwrap();
        PushService {
            _child: child,
            lines,
            port: first["port"].as_u64().unwrap() as u16,
            p256dh: first["p256dh"].as_str().unwrap().to_owned(),
            auth: first["auth"].as_str().unwrap().to_owned(),
            vapid_pem: first["vapid_pem"].as_str().unwrap().to_owned(),
            vapid_public: first["vapid_public"].as_str().unwrap().to_owned(),
        }
    }

    /// The subscription the browser would hand the page for this path.
    pub fn subscription(&self, path: &str) -> Subscription {
        let json = json!({
            "endpoint": format!("http://127.0.0.1:{}{path}", self.port),
            "expirationTime": null,
            "keys": {"p256dh": self.p256dh, "auth": self.auth},
        });
        Subscription::from_json(json.to_string().as_bytes(), true).unwrap()
    }

    pub async fn next_report(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(15), self.lines.next_line())
            .await
            .expect("a message within 15 s")
            .unwrap()
            .expect("the push service is running");
        serde_json::from_str(&line).unwrap()
    }

    /// Nothing more arrives within `within`.
    pub async fn quiet(&mut self, within: Duration) {
        if let Ok(line) = tokio::time::timeout(within, self.lines.next_line()).await {
            panic!("unexpected request: {line:?}");
        }
    }
}
