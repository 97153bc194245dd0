//! Signed passes as others check them: PyJWT, the reference JWT library an
//! origin or edge would use, fetching the live JWKS with `PyJWKClient`,
//! verifies the passes a live Narabu mints and refuses forged, expired,
//! other-room and retired-key ones. `proxies.rs` holds HAProxy and nginx
//! to the same passes ([`bad_passes`]).

use std::time::Duration;

use narabu::config::Secret;
use narabu::engine::{RoomId, RoomSettings};
use narabu::pass::{PassAlgorithm, PassKeys};
use narabu::token::Keyring;
use narabu_testkit::app::{ADMIN_TOKEN, SECRET, TestApp, config, spawn_app, spawn_app_with};
use narabu_testkit::room;
use reqwest::StatusCode;
use reqwest::header::SET_COOKIE;
use serde_json::Value;

/// A room whose passes live `lifetime`.
pub fn room_with_pass(id: &str, capacity: u32, lifetime: Duration) -> RoomSettings {
    RoomSettings {
        pass_lifetime: lifetime,
        ..room(id, capacity)
    }
}

/// The keys the app publishes, as its JWKS.
async fn published_keys(app: &narabu_testkit::app::TestApp) -> Value {
    app.client
        .get(app.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn now_secs() -> u64 {
    narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) / 1000
}

/// The pass keys an instance with ticket key `secret` (and `previous`)
/// derives: the test signs passes of its own choosing with them.
pub fn keys_of(secret: &str, previous: Option<&str>) -> PassKeys {
    let previous = previous.map(Secret::new);
    let ring = Keyring::from_secrets(&Secret::new(secret), previous.as_ref());
    let (current, previous) = ring.pass_seeds();
    PassKeys::derived(PassAlgorithm::ES256, &current, previous.as_ref())
}

/// Another instance's key: not published by the test's Narabu, current or
/// previous.
const RETIRED_SECRET: &str = "retired-secret-retired-secret-retired-0";

/// A visitor admitted to `room` (the only one waiting: one tick admits
/// them), with their status answer.
pub async fn admitted(
    app: &TestApp,
    room: &str,
) -> (narabu_testkit::app::Visitor, reqwest::Response) {
    let v = app.join(room).await;
    app.tick(room).await;
    let response = app
        .client
        .get(app.url(&format!("/api/rooms/{room}/status")))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    (v, response)
}

/// The pass a live Narabu mints for a visitor admitted to `room`.
pub async fn live_pass(app: &TestApp, room: &str) -> String {
    let (_, response) = admitted(app, room).await;
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "admitted", "{body}");
    body["pass"]
        .as_str()
        .expect("an admitted status carries a pass")
        .to_owned()
}

/// Passes nobody may accept for room `sale` of the test's Narabu (ticket
/// key [`SECRET`]), by name: a live pass with a changed claim, one of
/// algorithm `none`, expired, for another room, signed with a key it does
/// not publish.
pub fn bad_passes(live: &str) -> Vec<(&'static str, String)> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let keys = keys_of(SECRET, None);
    let sale = RoomId::new("sale").unwrap();
    let now = now_secs();
    let parts: Vec<&str> = live.split('.').collect();
    let mut claims: Value = serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
    claims["sub"] = "999999".into();
    claims["exp"] = (now + 3600).into();
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        b64.encode(claims.to_string()),
        parts[2]
    );
    let none_header = b64.encode(r#"{"alg":"none","typ":"JWT"}"#);
    let unsigned = format!("{none_header}.{}.", b64.encode(claims.to_string()));
    // The old confusion: HS256 with the public key's PEM as the secret.
    let confused = {
        use hmac::Mac as _;
        let header = serde_json::json!({"alg": "HS256", "typ": "JWT", "kid": keys.kid()});
        let signed = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(keys.public_pem().as_bytes()).unwrap();
        mac.update(signed.as_bytes());
        format!("{signed}.{}", b64.encode(mac.finalize().into_bytes()))
    };
    vec![
        ("forged", forged),
        ("unsigned", unsigned),
        ("HS256 with the public key", confused),
        (
            "expired",
            keys.sign("narabu", &sale, "1", now - 120, now - 60),
        ),
        (
            "other room",
            keys.sign("narabu", &RoomId::new("other").unwrap(), "1", now, now + 60),
        ),
        (
            "retired key",
            keys_of(RETIRED_SECRET, None).sign("narabu", &sale, "1", now, now + 60),
        ),
    ]
}

/// PyJWT's verdict on each token: `ok <claims>` or the exception's name,
/// verifying with the key `PyJWKClient` finds in the live JWKS by `kid`.
async fn pyjwt(jwks_url: String, audience: &str, tokens: Vec<String>) -> Vec<String> {
    let script = r#"
import json, sys, jwt
from jwt import PyJWKClient
args = json.load(sys.stdin)
client = PyJWKClient(args["jwks"])
for token in args["tokens"]:
    try:
        key = client.get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["ES256", "EdDSA"],
                            audience=args["aud"], issuer="narabu",
                            options={"require": ["exp", "iat", "sub", "aud", "iss"]})
        print("ok " + json.dumps(claims, sort_keys=True))
    except Exception as e:
        print(type(e).__name__)
"#;
    let input = serde_json::json!({"jwks": jwks_url, "aud": audience, "tokens": tokens});
    crate::python::lines(
        script,
        input,
        "PyJWT failed (scripts/test installs PyJWT and cryptography)",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyjwt_verifies_live_passes_with_the_published_keys_and_refuses_bad_ones() {
    let app = spawn_app(vec![room("sale", 1), room("other", 1)]).await;
    let (v, response) = admitted(&app, "sale").await;
    let cookie = response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|c| c.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("narabu_sale_jwt="))
        .expect("the pass's cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("Max-Age=60"),
        "{cookie}"
    );
    let body: Value = response.json().await.unwrap();
    let pass = body["pass"].as_str().unwrap().to_owned();
    assert_eq!(
        cookie,
        format!("narabu_sale_jwt={pass}; HttpOnly; SameSite=Lax; Path=/; Max-Age=60")
    );
    let other = live_pass(&app, "other").await;

    let mut tokens = vec![pass.clone(), other.clone()];
    let bad = bad_passes(&pass);
    tokens.extend(bad.iter().map(|(_, t)| t.clone()));
    let verdicts = pyjwt(app.url("/.well-known/jwks.json"), "sale", tokens).await;

    let claims: Value = serde_json::from_str(
        verdicts[0]
            .strip_prefix("ok ")
            .unwrap_or_else(|| panic!("PyJWT refused a live pass: {}", verdicts[0])),
    )
    .unwrap();
    assert_eq!(claims["aud"], "sale");
    assert_eq!(claims["iss"], "narabu");
    // The ticket, as the gate knows it (its id), not the ticket's token.
    let sub = claims["sub"].as_str().unwrap();
    assert!(sub.parse::<u64>().is_ok(), "{claims}");
    assert!(!v.token.contains(sub) || sub.len() < 4, "{claims}");
    let (iat, exp) = (
        claims["iat"].as_u64().unwrap(),
        claims["exp"].as_u64().unwrap(),
    );
    assert!(exp - iat <= 60 && exp - iat >= 59, "{claims}");
    assert!(iat.abs_diff(now_secs()) <= 2, "{claims}");
    // Another room's live pass is not a pass for this room.
    assert_eq!(verdicts[1], "InvalidAudienceError");
    let expected = [
        ("forged", "InvalidSignatureError"),
        ("unsigned", "PyJWKClientError"),
        ("HS256 with the public key", "InvalidAlgorithmError"),
        ("expired", "ExpiredSignatureError"),
        ("other room", "InvalidAudienceError"),
        ("retired key", "PyJWKClientError"),
    ];
    for ((name, _), (verdict, (expected_name, error))) in
        bad.iter().zip(verdicts[2..].iter().zip(expected))
    {
        assert_eq!(*name, expected_name);
        assert_eq!(verdict, error, "PyJWT's verdict on the {name} pass");
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_keeps_its_passes_valid_and_a_retired_one_does_not() {
    // Narabu rotated from RETIRED_SECRET's successor: the previous key is
    // published beside the current one; the one before is gone.
    const PREVIOUS: &str = "previous-secret-previous-secret-previo0";
    let config = narabu::config::Config {
        previous_secret: Some(Secret::new(PREVIOUS)),
        ..config()
    };
    let app = spawn_app_with(config, vec![room("sale", 1)]).await;
    let jwks = published_keys(&app).await;
    let all = jwks["keys"].as_array().unwrap();
    for key in all {
        assert!(key.get("d").is_none(), "no private part: {key}");
    }
    // The pass keys, current then previous; the receipt keys (Ed25519,
    // current and previous) follow them.
    let keys: Vec<&Value> = all.iter().filter(|k| k["alg"] == "ES256").collect();
    assert_eq!(keys.len(), 2, "{jwks}");
    assert_eq!(keys[0]["kid"], keys_of(SECRET, None).kid());
    assert_eq!(keys[1]["kid"], keys_of(PREVIOUS, None).kid());
    for key in &keys {
        assert_eq!(key["kty"], "EC");
    }
    let receipt_keys = all.iter().filter(|k| k["alg"] == "EdDSA").count();
    assert_eq!(receipt_keys, 2, "{jwks}");
    let sale = RoomId::new("sale").unwrap();
    let now = now_secs();
    let signed_by = |secret| keys_of(secret, None).sign("narabu", &sale, "7", now, now + 60);
    let verdicts = pyjwt(
        app.url("/.well-known/jwks.json"),
        "sale",
        vec![
            signed_by(PREVIOUS),
            signed_by(RETIRED_SECRET),
            live_pass(&app, "sale").await,
        ],
    )
    .await;
    assert!(verdicts[0].starts_with("ok "), "{verdicts:?}");
    assert_eq!(verdicts[1], "PyJWKClientError", "{verdicts:?}");
    assert!(verdicts[2].starts_with("ok "), "{verdicts:?}");

    // The PEM form is the current key, and the previous one on request.
    let pem = |path: &str| {
        let url = app.url(path);
        let client = app.client.clone();
        async move { client.get(url).send().await.unwrap() }
    };
    let current = pem("/.well-known/narabu-pass.pem").await;
    assert_eq!(current.status(), StatusCode::OK);
    assert_eq!(
        current.text().await.unwrap(),
        keys_of(SECRET, None).public_pem()
    );
    let previous = pem("/.well-known/narabu-pass.pem?previous=1").await;
    assert_eq!(
        previous.text().await.unwrap(),
        keys_of(PREVIOUS, None).public_pem()
    );
    app.stop().await;
}

#[tokio::test]
async fn only_admitted_visitors_get_a_pass_and_leaving_clears_it() {
    let app = spawn_app(vec![room_with_pass("sale", 1, Duration::from_secs(5))]).await;
    let first = app.join("sale").await;
    assert!(first.body.get("pass").is_none(), "{}", first.body);
    app.tick("sale").await;
    let waiting = app.join("sale").await;
    // Joining again with an admitted ticket answers it with a pass.
    let again: Value = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .bearer_auth(&first.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["status"], "admitted", "{again}");
    assert!(
        again["pass"].as_str().is_some_and(|p| p.starts_with("ey")),
        "{again}"
    );
    let status = |v: &narabu_testkit::app::Visitor| {
        app.client
            .get(app.url("/api/rooms/sale/status"))
            .bearer_auth(&v.token)
            .send()
    };
    let answer = status(&waiting).await.unwrap();
    assert!(answer.headers().get(SET_COOKIE).is_none());
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["status"], "waiting");
    assert!(body.get("pass").is_none(), "{body}");

    let answer = status(&first).await.unwrap();
    let body: Value = answer.json().await.unwrap();
    let pass = body["pass"].as_str().unwrap();
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(pass.split('.').nth(1).unwrap())
        .unwrap();
    let payload: Value = serde_json::from_slice(&payload).unwrap();
    let lifetime = payload["exp"].as_u64().unwrap() - payload["iat"].as_u64().unwrap();
    assert!(
        (4..=5).contains(&lifetime),
        "the room's 5 s lifetime: {payload}"
    );

    // The gate mints one only when asked.
    let gate = |query: &'static str| {
        app.client
            .get(app.url(&format!("/gate/sale{query}")))
            .bearer_auth(&first.token)
            .send()
    };
    let plain = gate("").await.unwrap();
    assert_eq!(plain.status(), StatusCode::NO_CONTENT);
    assert!(plain.headers().get(SET_COOKIE).is_none());
    let asked = gate("?pass=1").await.unwrap();
    assert_eq!(asked.status(), StatusCode::NO_CONTENT);
    let cookie = asked.headers()[SET_COOKIE].to_str().unwrap();
    assert!(cookie.starts_with("narabu_sale_jwt=ey"), "{cookie}");
    let refused = app
        .client
        .get(app.url("/gate/sale?pass=1"))
        .bearer_auth(&waiting.token)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(refused.headers().get(SET_COOKIE).is_none());

    // Leaving removes the pass's cookie with the rest.
    let left = app
        .client
        .post(app.url("/api/rooms/sale/leave"))
        .bearer_auth(&first.token)
        .send()
        .await
        .unwrap();
    assert_eq!(left.status(), StatusCode::NO_CONTENT);
    let cleared: Vec<&str> = left
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|c| c.to_str().unwrap())
        .collect();
    assert!(
        cleared
            .iter()
            .any(|c| c.starts_with("narabu_sale_jwt=;") && c.contains("Max-Age=0")),
        "{cleared:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_pass_lifetime_is_a_room_setting_checked_like_the_others() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let admin = |method: reqwest::Method, body: Value| {
        app.client
            .request(method, app.url("/admin/rooms/sale"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    let room = app.admin_room("sale").await;
    assert_eq!(room["settings"]["pass_lifetime"], "1m", "{room}");
    for bad in ["0s", "500ms", "2h", "soon"] {
        let r = admin(
            reqwest::Method::PATCH,
            serde_json::json!({"pass_lifetime": bad}),
        )
        .await
        .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert!(status.is_client_error(), "{bad}: {status} {body}");
        assert!(
            body["message"].as_str().unwrap().contains("pass_lifetime"),
            "{bad}: {body}"
        );
    }
    let null = admin(
        reqwest::Method::PATCH,
        serde_json::json!({"pass_lifetime": null}),
    )
    .await
    .unwrap();
    assert_eq!(null.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let ok = admin(
        reqwest::Method::PATCH,
        serde_json::json!({"pass_lifetime": "15s"}),
    )
    .await
    .unwrap();
    assert!(ok.status().is_success(), "{}", ok.status());
    assert_eq!(
        app.admin_room("sale").await["settings"]["pass_lifetime"],
        "15s"
    );
    let put = admin(
        reqwest::Method::PUT,
        serde_json::json!({"capacity": 2, "pass_lifetime": "2h"}),
    )
    .await
    .unwrap();
    assert_eq!(put.status(), StatusCode::UNPROCESSABLE_ENTITY);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eddsa_passes_verify_with_the_published_okp_key() {
    let config = narabu::config::Config {
        pass_algorithm: PassAlgorithm::EdDSA,
        ..config()
    };
    let app = spawn_app_with(config, vec![room("sale", 1)]).await;
    let jwks = published_keys(&app).await;
    assert_eq!(jwks["keys"][0]["kty"], "OKP", "{jwks}");
    assert_eq!(jwks["keys"][0]["crv"], "Ed25519", "{jwks}");
    assert_eq!(jwks["keys"][0]["alg"], "EdDSA", "{jwks}");
    let pass = live_pass(&app, "sale").await;
    let mut tokens = vec![pass.clone()];
    // The same claims signed by the ES256 key the secret also derives:
    // not the published key, so refused.
    let es256 = keys_of(SECRET, None);
    let now = now_secs();
    tokens.push(es256.sign("narabu", &RoomId::new("sale").unwrap(), "1", now, now + 60));
    let verdicts = pyjwt(app.url("/.well-known/jwks.json"), "sale", tokens).await;
    assert!(verdicts[0].starts_with("ok "), "{verdicts:?}");
    assert_eq!(verdicts[1], "PyJWKClientError", "{verdicts:?}");
    app.stop().await;
}
