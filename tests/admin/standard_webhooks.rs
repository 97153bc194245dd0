//! Real deliveries from a running Narabu, checked by the Standard Webhooks
//! reference library (`standardwebhooks` from PyPI, which `scripts/test`
//! installs) in a small Python receiver: every delivery verifies with the
//! current secret and, during a rotation, with the previous one; a tampered
//! body, id or timestamp, a replay past the library's tolerance and an
//! unrelated secret are refused by the library.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use narabu::backend::embedded::EmbeddedBackend;
use narabu::config::{Config, Secret, WebhookConfig};
use narabu::engine::SystemClock;
use narabu::webhooks::EventType;
use narabu::webhooks::signing::SigningKey;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use super::admin;
use narabu_testkit::app::{config, spawn_with};
use narabu_testkit::room;

/// The version `scripts/test` installs; the test names it when missing.
const LIBRARY: &str = "standardwebhooks==1.1.0";
/// Rejections as the library words them.
const NO_MATCH: &str = "No matching signature found";
const TOO_OLD: &str = "Message timestamp too old";

fn whsec(key: &[u8]) -> String {
    format!("whsec_{}", STANDARD.encode(key))
}

fn key(secret: &str) -> SigningKey {
    SigningKey::parse(&Secret::new(secret)).unwrap()
}

/// The Python receiver, killed on drop.
struct Receiver {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    port: u16,
}

impl Receiver {
    async fn start(receivers: &Value) -> Receiver {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/admin/standard_webhooks_receiver.py"
        );
        let mut child = Command::new("python3")
            .arg(script)
            .arg(receivers.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the receiver starts")
            .unwrap()
            .unwrap_or_else(|| {
                panic!("the receiver did not start: is `{LIBRARY}` installed (pip install {LIBRARY}; scripts/test does)?")
            });
        let port = serde_json::from_str::<Value>(&first).unwrap()["port"]
            .as_u64()
            .unwrap() as u16;
        Receiver { child, lines, port }
    }

    async fn next_report(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(15), self.lines.next_line())
            .await
            .expect("a delivery within 15 s")
            .unwrap()
            .expect("the receiver is running");
        serde_json::from_str(&line).unwrap()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

#[tokio::test]
async fn deliveries_verify_with_the_standard_webhooks_library() {
    let current = whsec(&rand_key());
    let previous = whsec(&rand_key());
    // A receiver still on a plain secret: for the library, the same key is
    // `whsec_` and the base64 of the string (docs/operating.md's way off it).
    let plain = "plain-secret-from-before-the-standard-0123";
    let mut receiver = Receiver::start(&json!({
        "/hook": {"secret": current, "previous": previous},
        "/plain": {"secret": whsec(plain.as_bytes()), "previous": null},
    }))
    .await;
    let base = format!("http://127.0.0.1:{}", receiver.port);
    let config = Config {
        webhooks: vec![
            WebhookConfig {
                url: format!("{base}/hook"),
                secret: key(&current),
                previous_secret: Some(key(&previous)),
                events: Vec::new(),
                queue_threshold: None,
            },
            WebhookConfig {
                url: format!("{base}/plain"),
                secret: key(plain),
                previous_secret: None,
                events: vec![EventType::RoomPaused],
                queue_threshold: None,
            },
        ],
        ..config()
    };
    let backend = EmbeddedBackend::without_workers(vec![room("sale", 1)], Arc::new(SystemClock));
    let app = spawn_with(config, backend).await;

    let patch = |body: Value| admin(&app, Method::PATCH, "/admin/rooms/sale", Some(body));
    assert_eq!(patch(json!({"paused": true})).await.0, StatusCode::OK);
    assert_eq!(
        patch(json!({"paused": false, "capacity": 3})).await.0,
        StatusCode::OK
    );
    let (status, _) = admin(&app, Method::DELETE, "/admin/rooms/sale", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let mut seen = BTreeSet::new();
    while seen.len() < 5 {
        let report = receiver.next_report().await;
        let path = report["path"].as_str().unwrap().to_owned();
        let body: Value = serde_json::from_str(report["body"].as_str().unwrap()).unwrap();
        let kind = body["type"].as_str().unwrap().to_owned();
        let headers = &report["headers"];

        assert_eq!(report["current"], Value::Null, "{path} {kind}: {report}");
        assert_eq!(report["unrelated"], NO_MATCH, "{report}");
        for forged in ["body", "id", "timestamp"] {
            assert_eq!(report["tampered"][forged], NO_MATCH, "{forged}: {report}");
        }
        assert_eq!(report["tampered"]["old"], TOO_OLD, "{report}");
        assert_eq!(headers["webhook-id"], body["id"], "{report}");
        assert_eq!(body["room"], "sale");

        let signatures = headers["webhook-signature"].as_str().unwrap();
        if path == "/hook" {
            // Rotation: both secrets sign, and either verifies.
            assert_eq!(report["previous"], Value::Null, "{report}");
            assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
            assert!(headers.get("x-narabu-signature").is_none());
        } else {
            assert_eq!(signatures.split(' ').count(), 1, "{signatures}");
            assert!(headers["x-narabu-signature"].is_string(), "{report}");
            assert_eq!(body["event"], body["type"]);
        }
        assert!(seen.insert((path, kind)), "one delivery each: {seen:?}");
    }
    let expected: BTreeSet<(String, String)> = [
        ("/hook", "room.paused"),
        ("/hook", "room.resumed"),
        ("/hook", "room.capacity_changed"),
        ("/hook", "room.closed"),
        ("/plain", "room.paused"),
    ]
    .into_iter()
    .map(|(p, k)| (p.to_owned(), k.to_owned()))
    .collect();
    assert_eq!(seen, expected);
    app.stop().await;
}

fn rand_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    rand::fill(&mut key);
    key
}
