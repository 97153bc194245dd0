//! Receipts as a visitor and a sceptic check them: the join answer and the
//! queue page's link give a signed receipt; PyJWT, with the key
//! `PyJWKClient` finds in the live JWKS, and `narabu verify-receipt`
//! (keys by URL and from a file) accept it and refuse altered, forged,
//! other-room ones and a pass shown as a receipt.

use std::process::{Command, Output};

use base64::Engine as _;
use narabu::receipt::{ReceiptClaims, audience};
use narabu_testkit::app::{TestApp, spawn_app};
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::Value;

use super::passes::keys_of;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

fn claims_of(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&B64.decode(payload).unwrap()).unwrap()
}

/// Receipts nobody may accept as room `sale`'s, by name.
fn bad_receipts(live: &str, other_room: &str, pass: &str) -> Vec<(&'static str, String)> {
    let parts: Vec<&str> = live.split('.').collect();
    let mut moved: Value = claims_of(live);
    moved["number"] = 1.into();
    let altered = format!(
        "{}.{}.{}",
        parts[0],
        B64.encode(moved.to_string()),
        parts[2]
    );
    let claims: ReceiptClaims = serde_json::from_value(claims_of(live)).unwrap();
    let forged = keys_of("retired-secret-retired-secret-retired-0", None).sign_receipt(&claims);
    vec![
        ("altered", altered),
        ("forged", forged),
        ("other room", other_room.to_owned()),
        ("pass", pass.to_owned()),
    ]
}

/// PyJWT's verdict on each token as a receipt of `room`: `ok <claims>` or
/// the exception's name.
async fn pyjwt(jwks_url: String, room: &str, tokens: Vec<String>) -> Vec<String> {
    let script = r#"
import json, sys, jwt
from jwt import PyJWKClient
args = json.load(sys.stdin)
client = PyJWKClient(args["jwks"])
for token in args["tokens"]:
    try:
        if jwt.get_unverified_header(token).get("typ") != "narabu-receipt+jwt":
            raise ValueError("not a receipt")
        key = client.get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["ES256", "EdDSA"],
                            audience=args["aud"], issuer="narabu",
                            options={"require": ["iat", "aud", "iss"]})
        print("ok " + json.dumps(claims, sort_keys=True))
    except Exception as e:
        print(type(e).__name__)
"#;
    let input = serde_json::json!({"jwks": jwks_url, "aud": audience(room), "tokens": tokens});
    crate::python::lines(script, input, "PyJWT failed").await
}

async fn verify_receipt(receipt: String, keys: String) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_narabu"))
            .args([
                "verify-receipt",
                &receipt,
                "--keys",
                &keys,
                "--room",
                "sale",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

async fn pass_of_admitted(app: &TestApp) -> String {
    let (_, response) = super::passes::admitted(app, "other").await;
    let body: Value = response.json().await.unwrap();
    body["pass"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_gives_a_receipt_that_pyjwt_and_verify_receipt_accept_and_fakes_they_refuse() {
    let app = spawn_app(vec![room("sale", 1), room("other", 2)]).await;
    let _first = app.join("sale").await;
    let v = app.join("sale").await;
    let receipt = v.body["receipt"]
        .as_str()
        .expect("the join carries a receipt");
    let claims = claims_of(receipt);
    assert_eq!(claims["room"], "sale");
    assert_eq!(claims["aud"], "receipt:sale");
    assert_eq!(claims["number"], 2);
    assert!(claims["joined_at"].as_u64().unwrap() > 1_700_000_000_000);
    // No identity: the claims are these and only these.
    let mut names: Vec<&str> = claims
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "aud",
            "epoch",
            "iat",
            "iss",
            "joined_at",
            "number",
            "room",
            "ticket"
        ]
    );
    assert!(!receipt.contains(&v.token));

    // The queue page links the visitor's own receipt, which says the same.
    let page = app
        .client
        .get(app.url("/queue/sale"))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"href="/api/rooms/sale/receipt""#), "{page}");
    let linked = app
        .client
        .get(app.url("/api/rooms/sale/receipt"))
        .bearer_auth(&v.token)
        .send()
        .await
        .unwrap();
    assert_eq!(linked.status(), StatusCode::OK);
    let linked: Value = linked.json().await.unwrap();
    for field in ["room", "epoch", "ticket", "number", "joined_at"] {
        assert_eq!(linked["claims"][field], claims[field], "{field}");
    }
    let unauthenticated = app
        .client
        .get(app.url("/api/rooms/sale/receipt"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthenticated.status(), StatusCode::UNAUTHORIZED);

    let other = app.join("other").await.body["receipt"]
        .as_str()
        .unwrap()
        .to_owned();
    let pass = pass_of_admitted(&app).await;
    let bad = bad_receipts(receipt, &other, &pass);
    let mut tokens = vec![receipt.to_owned()];
    tokens.extend(bad.iter().map(|(_, t)| t.clone()));
    let verdicts = pyjwt(app.url("/.well-known/jwks.json"), "sale", tokens.clone()).await;
    assert!(verdicts[0].starts_with("ok "), "PyJWT: {}", verdicts[0]);
    for ((name, _), verdict) in bad.iter().zip(&verdicts[1..]) {
        let want = match *name {
            "altered" => "InvalidSignatureError",
            "forged" => "PyJWKClientError",
            "other room" => "InvalidAudienceError",
            _ => "ValueError",
        };
        assert_eq!(verdict, want, "PyJWT's verdict on the {name} receipt");
    }

    // verify-receipt: keys by URL, and from a file; the receipt as text,
    // and as the file the link serves.
    let dir = tempfile::tempdir().unwrap();
    let jwks_file = dir.path().join("jwks.json");
    let jwks = app
        .client
        .get(app.url("/.well-known/jwks.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    std::fs::write(&jwks_file, jwks).unwrap();
    let receipt_file = dir.path().join("receipt.json");
    std::fs::write(&receipt_file, linked.to_string()).unwrap();
    let by_url = app.url("/.well-known/jwks.json");
    let by_file = jwks_file.display().to_string();
    for (what, token, keys) in [
        ("text, keys by URL", receipt.to_owned(), by_url.clone()),
        (
            "file, keys from a file",
            receipt_file.display().to_string(),
            by_file.clone(),
        ),
    ] {
        let out = verify_receipt(token, keys).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{what}: {stdout}");
        let last = stdout.lines().last().unwrap();
        assert!(last.starts_with("==> VERIFIED"), "{what}: {stdout}");
        assert!(stdout.contains("number     2"), "{stdout}");
    }
    for (name, token) in &bad {
        let out = verify_receipt(token.clone(), by_file.clone()).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "the {name} receipt: {stdout}");
        assert!(
            stdout
                .lines()
                .last()
                .unwrap()
                .starts_with("==> NOT VERIFIED"),
            "the {name} receipt: {stdout}"
        );
    }
    app.stop().await;
}
