//! Web Push wired into the service: the key pages subscribe with, the
//! subscription handed over with the ticket, and the call-backs the room's
//! engine decides, delivered to a push service played by
//! `tests/push_service.py` with the reference libraries. Runs on the
//! embedded backend, and on Redis with `NARABU_TEST_BACKEND=redis`.

#[path = "support/push_service.rs"]
mod push_service;

use narabu::config::{Config, PushConfig, Secret};
use narabu::push::VapidKey;
use narabu_testkit::app::{TestApp, config, spawn_app, spawn_app_with};
use narabu_testkit::room;
use push_service::{CONTACT, PushService};
use reqwest::StatusCode;
use serde_json::Value;

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
