use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use p256::pkcs8::EncodePrivateKey;

use super::*;

fn room() -> RoomId {
    RoomId::new("sale").unwrap()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The published key with id `kid`, as an independent JWT library reads it.
fn decoding_key(keys: &PassKeys, kid: &str) -> Option<DecodingKey> {
    let jwks: serde_json::Value = serde_json::from_str(keys.jwks()).unwrap();
    let jwk = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid)?;
    Some(match jwk["kty"].as_str().unwrap() {
        "EC" => {
            DecodingKey::from_ec_components(jwk["x"].as_str().unwrap(), jwk["y"].as_str().unwrap())
                .unwrap()
        }
        _ => DecodingKey::from_ed_components(jwk["x"].as_str().unwrap()).unwrap(),
    })
}

fn check(keys: &PassKeys, token: &str, aud: &str) -> Result<PassClaims, String> {
    let header = decode_header(token).map_err(|e| e.to_string())?;
    let kid = header.kid.expect("a kid");
    let alg = match keys.algorithm() {
        PassAlgorithm::ES256 => Algorithm::ES256,
        PassAlgorithm::EdDSA => Algorithm::EdDSA,
    };
    let mut validation = Validation::new(alg);
    validation.set_audience(&[aud]);
    validation.set_issuer(&["https://queue.example"]);
    validation.leeway = 0;
    let key = decoding_key(keys, &kid).ok_or("no such key")?;
    decode::<PassClaims>(token, &key, &validation)
        .map(|d| d.claims)
        .map_err(|e| e.to_string())
}

#[test]
fn passes_verify_with_the_published_key_and_say_what_they_should() {
    for alg in [PassAlgorithm::ES256, PassAlgorithm::EdDSA] {
        let keys = PassKeys::derived(alg, &[7; 32], None);
        let t = now();
        let token = keys.sign("https://queue.example", &room(), "42", t, t + 60);
        let claims = check(&keys, &token, "sale").unwrap();
        assert_eq!(
            claims,
            PassClaims {
                iss: "https://queue.example".into(),
                aud: "sale".into(),
                sub: "42".into(),
                iat: t,
                exp: t + 60,
            }
        );
        let header = decode_header(&token).unwrap();
        assert_eq!(header.kid.as_deref(), Some(keys.kid()));
        // Another room's audience, an expired pass, a changed claim:
        // refused.
        assert!(check(&keys, &token, "other").is_err(), "{alg:?}");
        let old = keys.sign("https://queue.example", &room(), "42", t - 120, t - 60);
        assert!(check(&keys, &old, "sale").is_err(), "{alg:?}");
        let (head, rest) = token.split_once('.').unwrap();
        let (_, signature) = rest.split_once('.').unwrap();
        let forged_claims = serde_json::json!({
            "iss": "https://queue.example", "aud": "sale", "sub": "43", "iat": t, "exp": t + 60
        });
        let forged = format!(
            "{head}.{}.{signature}",
            B64.encode(forged_claims.to_string())
        );
        assert!(check(&keys, &forged, "sale").is_err(), "{alg:?}");
    }
}

#[test]
fn every_instance_with_the_same_secret_derives_the_same_key() {
    let a = PassKeys::derived(PassAlgorithm::ES256, &[1; 32], None);
    let b = PassKeys::derived(PassAlgorithm::ES256, &[1; 32], None);
    let c = PassKeys::derived(PassAlgorithm::ES256, &[2; 32], None);
    assert_eq!(a.kid(), b.kid());
    assert_eq!(a.jwks(), b.jwks());
    assert_ne!(a.kid(), c.kid());
    // One instance's pass verifies with the other's published key.
    let t = now();
    let token = a.sign("https://queue.example", &room(), "1", t, t + 60);
    assert!(check(&b, &token, "sale").is_ok());
    assert!(check(&c, &token, "sale").is_err());
    // The algorithms' keys are unrelated.
    let ed = PassKeys::derived(PassAlgorithm::EdDSA, &[1; 32], None);
    assert_ne!(a.kid(), ed.kid());
}

#[test]
fn the_previous_key_is_published_and_a_retired_one_is_not() {
    let old = PassKeys::derived(PassAlgorithm::ES256, &[1; 32], None);
    let rotated = PassKeys::derived(PassAlgorithm::ES256, &[2; 32], Some(&[1; 32]));
    let retired = PassKeys::derived(PassAlgorithm::ES256, &[3; 32], Some(&[2; 32]));
    let jwks: serde_json::Value = serde_json::from_str(rotated.jwks()).unwrap();
    let kids = |alg: &str| -> Vec<String> {
        jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| k["alg"] == alg)
            .map(|k| k["kid"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(kids("ES256"), [rotated.kid(), old.kid()]);
    // The receipt keys, current and previous, beside them.
    assert_eq!(kids("EdDSA").len(), 2);
    assert!(rotated.previous_public_pem().is_some());
    let t = now();
    let token = old.sign("https://queue.example", &room(), "1", t, t + 60);
    assert!(check(&rotated, &token, "sale").is_ok());
    assert!(retired.jwks().find(old.kid()).is_none());
    // A previous key equal to the current one is published once.
    let same = PassKeys::derived(PassAlgorithm::ES256, &[1; 32], Some(&[1; 32]));
    assert_eq!(same.jwks(), old.jwks());
}

#[test]
fn keys_load_from_pem_files_and_name_only_the_file_when_they_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let secret = p256::SecretKey::from_slice(&[9; 32]).unwrap();
    let pkcs8 = secret.to_pkcs8_pem(LineEnding::LF).unwrap();
    let sec1 = secret.to_sec1_pem(LineEnding::LF).unwrap();
    let public = secret
        .public_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let pkcs8_path = write("pkcs8.pem", &pkcs8);
    let sec1_path = write("sec1.pem", &sec1);
    let public_path = write("public.pem", &public);
    let a = PassKeys::from_files(PassAlgorithm::ES256, &pkcs8_path, None).unwrap();
    let b = PassKeys::from_files(PassAlgorithm::ES256, &sec1_path, Some(&public_path)).unwrap();
    assert_eq!(a.kid(), b.kid());
    assert_eq!(a.public_pem(), public);
    let derived = PassKeys::derived(PassAlgorithm::ES256, &[5; 32], None);
    let with_previous =
        PassKeys::from_files(PassAlgorithm::ES256, &pkcs8_path, Some(&public_path)).unwrap();
    assert_eq!(
        with_previous.jwks(),
        a.jwks(),
        "same key twice: published once"
    );
    assert_ne!(derived.kid(), a.kid());

    // A public key cannot sign; a P-256 key is not an Ed25519 one; a file
    // of junk is refused: the error names the file, never what is in it.
    let junk = write("junk.pem", "hunter2-private-material");
    for (alg, path) in [
        (PassAlgorithm::ES256, &public_path),
        (PassAlgorithm::EdDSA, &pkcs8_path),
        (PassAlgorithm::ES256, &junk),
    ] {
        let error = PassKeys::from_files(alg, path, None)
            .unwrap_err()
            .to_string();
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        assert!(!error.contains("MIG"), "{error}");
    }
    let missing = PassKeys::from_files(PassAlgorithm::ES256, &dir.path().join("none"), None);
    assert!(matches!(missing, Err(PassKeyError::Io { .. })));
}

#[test]
fn debug_output_never_shows_a_private_key() {
    let secret = p256::SecretKey::from_slice(&[9; 32]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key.pem");
    let pem = secret.to_pkcs8_pem(LineEnding::LF).unwrap();
    std::fs::write(&path, &*pem).unwrap();
    let keys = PassKeys::from_files(PassAlgorithm::ES256, &path, None).unwrap();
    let debug = format!("{keys:?} {keys:#?}");
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    for secretish in [
        body.as_str(),
        &B64.encode([9u8; 32]),
        &hex::encode([9u8; 32]),
        "SigningKey",
    ] {
        assert!(!debug.contains(secretish), "{debug}");
    }
    assert!(debug.contains(keys.kid()), "{debug}");
    // Neither do the published forms carry the private scalar.
    assert!(!keys.jwks().contains(&B64.encode([9u8; 32])));
    assert!(!keys.jwks().contains("\"d\""));
}

#[test]
fn a_fresh_pass_is_handed_out_again_and_a_stale_one_is_not() {
    let keys = PassKeys::derived(PassAlgorithm::ES256, &[7; 32], None);
    let (sale, t) = (room(), now());
    let (a, iat, exp) = keys.sign_or_reuse("narabu", &sale, "1", t, t + 60, 30);
    assert_eq!((iat, exp), (t, t + 60));
    // Half its life left: the same pass.
    let again = keys.sign_or_reuse("narabu", &sale, "1", t + 30, t + 90, 30);
    assert_eq!(again, (a.clone(), t, t + 60));
    // Less than that, or another ticket: a new one.
    let (b, iat, exp) = keys.sign_or_reuse("narabu", &sale, "1", t + 31, t + 91, 30);
    assert_ne!(b, a);
    assert_eq!((iat, exp), (t + 31, t + 91));
    let (c, _, _) = keys.sign_or_reuse("narabu", &sale, "2", t + 31, t + 91, 30);
    assert_ne!(c, b);
    // A pass that would outlive what is allowed now (the permit lapses
    // sooner, or the lifetime was shortened) is not handed out again.
    let (d, _, exp) = keys.sign_or_reuse("https://queue.example", &sale, "1", t + 32, t + 50, 10);
    assert_ne!(d, b);
    assert_eq!(exp, t + 50);
    assert!(check(&keys, &d, "sale").is_ok());
}

/// Receipts are signed with the Ed25519 receipt key whatever the pass
/// algorithm (a join signs one, and ES256 costs several times as much),
/// under a key id of their own that the same JWKS publishes.
#[test]
fn receipts_are_signed_with_their_own_ed25519_key() {
    for alg in [PassAlgorithm::ES256, PassAlgorithm::EdDSA] {
        let keys = PassKeys::derived(alg, &[4; 32], None);
        let claims = crate::receipt::ReceiptClaims {
            iss: "narabu".into(),
            aud: crate::receipt::audience("sale"),
            room: "sale".into(),
            epoch: 1,
            ticket: 1,
            number: Some(2),
            lane: None,
            joined_at: 1_764_237_600_123,
            iat: 1_764_237_600,
        };
        let receipt = keys.sign_receipt(&claims);
        let header = jsonwebtoken::decode_header(&receipt).unwrap();
        assert_eq!(header.alg, jsonwebtoken::Algorithm::EdDSA);
        let kid = header.kid.unwrap();
        assert_ne!(kid, keys.kid());
        assert!(keys.jwks().contains(&kid));
        let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_str(keys.jwks()).unwrap();
        assert!(crate::receipt::verify(&receipt, &jwks, Some("sale")).is_ok());
    }
}
