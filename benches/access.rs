//! What fair access costs the server per join: issuing a proof-of-work
//! challenge, checking a solution (one HMAC and one SHA-256, plus the
//! signature check of the token), refusing a forged one, and verifying an
//! enqueue token (HS256 and EdDSA). A solver's side is measured too: the
//! hashes per second one core does with this crate's SHA-256.
//!
//! `cargo bench --bench access`; figures go into BENCHMARKS.md.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use narabu::access::pow::{digest, solve};
use narabu::access::{AccessSettings, ChallengeKeys, EnqueueMode, EnqueueVerifier, SharedKey};
use narabu::engine::RoomId;
use serde_json::json;

/// A test-only Ed25519 key pair (`openssl genpkey -algorithm ed25519`).
const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIDnotDEZaPvvkM4Cxd4JgVeLBUrru9Nm4RYBce/Nmgx4
-----END PRIVATE KEY-----
";
const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEATEJGCNKgsqer+HkXMXcnVDAX8B91qiSI/XYEhhE6I3s=
-----END PUBLIC KEY-----
";
const KEY: &str = "bench-shared-key-bench-shared-key-0001";
const NOW: u64 = 1_800_000_000_000;

fn pow(c: &mut Criterion) {
    let room = RoomId::new("sale").unwrap();
    let keys = ChallengeKeys::new([7; 32], None);
    c.bench_function("challenge: issue", |b| {
        b.iter(|| black_box(keys.issue(&room, 15, NOW)))
    });
    let challenge = keys.issue(&room, 12, NOW);
    let counter = solve(&challenge.token, 12);
    c.bench_function("challenge: check a solution", |b| {
        b.iter(|| {
            black_box(
                keys.check(&room, &challenge.token, counter, 12, NOW)
                    .unwrap(),
            )
        })
    });
    let forged = format!("{}x", &challenge.token[..challenge.token.len() - 1]);
    c.bench_function("challenge: refuse a forged one", |b| {
        b.iter(|| black_box(keys.check(&room, &forged, counter, 12, NOW).unwrap_err()))
    });
    c.bench_function("solver: one SHA-256 of token and counter", |b| {
        let mut n = 0u64;
        b.iter(|| {
            n += 1;
            black_box(digest(&challenge.token, n))
        })
    });
}

fn enqueue(c: &mut Criterion) {
    let room = RoomId::new("presale").unwrap();
    let claims = json!({"aud": "presale", "sub": "account-17", "exp": NOW / 1000 + 600});
    let settings = AccessSettings {
        enqueue: EnqueueMode::Token,
        enqueue_key: Some(SharedKey::new(KEY)),
        enqueue_public_key: Some(ED_PUBLIC.into()),
        ..AccessSettings::default()
    };
    let verifier = EnqueueVerifier::new(&room, &settings);
    let hs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(KEY.as_bytes()),
    )
    .unwrap();
    let ed = jsonwebtoken::encode(
        &Header::new(Algorithm::EdDSA),
        &claims,
        &EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap(),
    )
    .unwrap();
    c.bench_function("enqueue token: verify HS256", |b| {
        b.iter(|| black_box(verifier.verify(Some(&hs), NOW / 1000).unwrap()))
    });
    c.bench_function("enqueue token: verify EdDSA", |b| {
        b.iter(|| black_box(verifier.verify(Some(&ed), NOW / 1000).unwrap()))
    });
}

criterion_group!(benches, pow, enqueue);
criterion_main!(benches);
