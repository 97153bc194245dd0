use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::{Value, json};

use super::*;

/// Test-only Ed25519 key pairs (made with `openssl genpkey -algorithm
/// ed25519`); nothing outside these tests trusts them.
pub(crate) const ED_A_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIDnotDEZaPvvkM4Cxd4JgVeLBUrru9Nm4RYBce/Nmgx4
-----END PRIVATE KEY-----
";
pub(crate) const ED_A_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEATEJGCNKgsqer+HkXMXcnVDAX8B91qiSI/XYEhhE6I3s=
-----END PUBLIC KEY-----
";
pub(crate) const ED_B_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJkO8/pn4K4wG2SiBudk18DLkxo8oRY18LakJlGLR+UM
-----END PRIVATE KEY-----
";
pub(crate) const ED_B_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAm5IevqXW17r6zh9ahkr8SMfjGYKOa7TmVp+VoQph4+Q=
-----END PUBLIC KEY-----
";

const KEY_1: &str = "enqueue-key-one-enqueue-key-one-0123";
const KEY_2: &str = "enqueue-key-two-enqueue-key-two-0123";
const NOW: u64 = 1_800_000_000;

fn room() -> RoomId {
    RoomId::new("presale").unwrap()
}

fn hs(key: &str, claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(key.as_bytes()),
    )
    .unwrap()
}

fn ed(private: &str, claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::EdDSA),
        claims,
        &EncodingKey::from_ed_pem(private.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn claims() -> Value {
    json!({"aud": "presale", "sub": "account-17", "exp": NOW + 600})
}

fn settings(key: Option<&str>, previous: Option<&str>, public: Option<&str>) -> AccessSettings {
    AccessSettings {
        enqueue: super::super::EnqueueMode::Token,
        enqueue_key: key.map(SharedKey::new),
        enqueue_previous_key: previous.map(SharedKey::new),
        enqueue_public_key: public.map(str::to_owned),
        ..AccessSettings::default()
    }
}

fn verifier(s: &AccessSettings) -> EnqueueVerifier {
    s.validate().unwrap();
    EnqueueVerifier::new(&room(), s)
}

#[test]
fn a_good_hs256_token_names_the_account_and_lane() {
    let v = verifier(&settings(Some(KEY_1), None, None));
    let mut c = claims();
    c["lane"] = json!("members");
    let who = v.verify(Some(&hs(KEY_1, &c)), NOW).unwrap();
    assert_eq!(who.account, "account-17");
    assert_eq!(who.lane.as_deref(), Some("members"));
    assert_eq!(who.expires_at, NOW + 600);
    // `aud` may be a list that contains the room.
    c["aud"] = json!(["other", "presale"]);
    assert!(v.verify(Some(&hs(KEY_1, &c)), NOW).is_ok());
}

#[test]
fn a_good_eddsa_token_is_accepted_and_a_foreign_key_is_not() {
    let v = verifier(&settings(None, None, Some(ED_A_PUBLIC)));
    assert_eq!(
        v.verify(Some(&ed(ED_A_PRIVATE, &claims())), NOW)
            .unwrap()
            .account,
        "account-17"
    );
    assert_eq!(
        v.verify(Some(&ed(ED_B_PRIVATE, &claims())), NOW),
        Err(EnqueueError::BadSignature)
    );
    // Both public keys verify while one rotates out.
    let both = EnqueueVerifier::new(
        &room(),
        &AccessSettings {
            enqueue_previous_public_key: Some(ED_B_PUBLIC.into()),
            ..settings(None, None, Some(ED_A_PUBLIC))
        },
    );
    assert!(both.verify(Some(&ed(ED_B_PRIVATE, &claims())), NOW).is_ok());
    // HS256 is not accepted by a room with only a public key, so a token
    // "signed" with the public key as an HMAC secret gets nowhere.
    assert_eq!(
        v.verify(Some(&hs(ED_A_PUBLIC, &claims())), NOW),
        Err(EnqueueError::Algorithm("HS256".into()))
    );
}

#[test]
fn rotation_accepts_the_previous_key_until_it_is_retired() {
    let old_token = hs(KEY_1, &claims());
    let rotated = verifier(&settings(Some(KEY_2), Some(KEY_1), None));
    assert!(rotated.verify(Some(&old_token), NOW).is_ok());
    assert!(rotated.verify(Some(&hs(KEY_2, &claims())), NOW).is_ok());
    let retired = verifier(&settings(Some(KEY_2), None, None));
    assert_eq!(
        retired.verify(Some(&old_token), NOW),
        Err(EnqueueError::BadSignature)
    );
}

#[test]
fn each_refusal_has_its_reason() {
    let v = verifier(&settings(Some(KEY_1), None, None));
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims();
        f(&mut c);
        v.verify(Some(&hs(KEY_1, &c)), NOW)
    };
    assert_eq!(v.verify(None, NOW), Err(EnqueueError::Missing));
    assert_eq!(v.verify(Some("  "), NOW), Err(EnqueueError::Missing));
    assert_eq!(
        v.verify(Some("not.a.jwt"), NOW),
        Err(EnqueueError::Malformed)
    );
    assert_eq!(
        v.verify(Some(&"x".repeat(MAX_TOKEN_LEN + 1)), NOW),
        Err(EnqueueError::Malformed)
    );
    assert_eq!(
        v.verify(
            Some(&hs("someone-else-s-key-someone-else-s-key", &claims())),
            NOW
        ),
        Err(EnqueueError::BadSignature)
    );
    assert_eq!(
        with(&|c| c["exp"] = json!(NOW - LEEWAY_SECS)),
        Err(EnqueueError::Expired)
    );
    assert!(
        with(&|c| c["exp"] = json!(NOW - LEEWAY_SECS + 1)).is_ok(),
        "clocks may disagree by the leeway"
    );
    assert_eq!(
        with(&|c| c["nbf"] = json!(NOW + LEEWAY_SECS + 1)),
        Err(EnqueueError::NotYetValid)
    );
    assert_eq!(
        with(&|c| c["aud"] = json!("other-room")),
        Err(EnqueueError::WrongRoom)
    );
    for claim in ["aud", "sub", "exp"] {
        let got = with(&|c| {
            c.as_object_mut().unwrap().remove(claim);
        });
        assert_eq!(
            got.as_ref().map_err(EnqueueError::reason),
            Err("missing_claim"),
            "{claim}"
        );
    }
    assert_eq!(
        with(&|c| c["sub"] = json!(17)),
        Err(EnqueueError::BadClaim("sub"))
    );
    assert_eq!(
        with(&|c| c["sub"] = json!("")),
        Err(EnqueueError::BadClaim("sub"))
    );
    assert_eq!(
        with(&|c| c["lane"] = json!("Members!")),
        Err(EnqueueError::BadClaim("lane"))
    );
    // An unsigned token ("alg": "none") is refused before any key is tried.
    let unsigned = format!(
        "{}.{}.",
        B64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        B64.encode(claims().to_string())
    );
    assert!(matches!(
        v.verify(Some(&unsigned), NOW),
        Err(EnqueueError::Malformed | EnqueueError::Algorithm(_))
    ));
}

#[test]
fn the_settings_refuse_short_shared_keys_and_bad_pems() {
    let short = settings(Some("too-short"), None, None);
    assert_eq!(short.validate().unwrap_err().0, "enqueue_key");
    let bad_pem = settings(
        None,
        None,
        Some("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
    );
    assert_eq!(bad_pem.validate().unwrap_err().0, "enqueue_public_key");
    let no_key = settings(None, None, None);
    assert_eq!(no_key.validate().unwrap_err().0, "enqueue");
    let orphan = settings(None, Some(KEY_1), Some(ED_A_PUBLIC));
    assert_eq!(orphan.validate().unwrap_err().0, "enqueue_previous_key");
    // The key never shows in debug output.
    let s = settings(Some(KEY_1), None, None);
    assert!(!format!("{s:?}").contains(KEY_1));
}

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
