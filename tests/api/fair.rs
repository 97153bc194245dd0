//! Fair access over HTTP, on whichever backend the suite runs on: proof of
//! work on join, invite-only rooms with enqueue tokens minted by PyJWT
//! (the reference implementation, not our own code), and the opening draw
//! anyone can check.

use std::process::Command;
use std::time::Duration;

use narabu::access::{ChallengeKeys, ChallengeMode, EnqueueMode, SharedKey};
use narabu::config::Secret;
use narabu::engine::{RoomId, RoomSettings};
use narabu::token::Keyring;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use narabu_testkit::app::{ADMIN_TOKEN, SECRET, TestApp, Visitor, spawn_app};
use narabu_testkit::{room, with_lanes};

const BITS: u8 = 8;

fn pow_room(id: &str) -> RoomSettings {
    let mut s = room(id, 5);
    s.access.challenge = ChallengeMode::Pow;
    s.access.pow_difficulty = BITS;
    s.access.pow_difficulty_max = BITS;
    s
}

/// A solver written from docs/fair-access.md's description alone: the smallest n
/// with SHA-256(token || decimal n) starting with `bits` zero bits.
fn solve(token: &str, bits: u8) -> u64 {
    (0u64..)
        .find(|n| {
            let d = Sha256::digest(format!("{token}{n}"));
            let top = u128::from_be_bytes(d[..16].try_into().unwrap());
            top.leading_zeros() >= u32::from(bits)
        })
        .unwrap()
}

async fn post_join(app: &TestApp, room: &str, body: Value) -> (StatusCode, Value) {
    let r = app
        .client
        .post(app.url(&format!("/api/rooms/{room}/join")))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

async fn joins(app: &TestApp, room: &str) -> (u64, u64) {
    let s = app.backend.room(&RoomId::new(room).unwrap()).await.unwrap();
    (s.stats.joins, s.view.waiting)
}

async fn metrics(app: &TestApp) -> String {
    app.client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn the_challenge(body: &Value) -> (String, u8) {
    let c = &body["challenge"];
    assert_eq!(c["scheme"], "sha256-leading-zero-bits", "{body}");
    assert!(c["expires_at"].is_string(), "{body}");
    (
        c["token"].as_str().unwrap().to_owned(),
        c["difficulty"].as_u64().unwrap() as u8,
    )
}

#[tokio::test]
async fn a_pow_room_refuses_joins_without_a_good_solution_and_admits_each_solution_once() {
    let app = spawn_app(vec![pow_room("pow"), pow_room("other"), room("plain", 1)]).await;

    // No solution: 428 with a challenge to solve.
    let (status, body) = post_join(&app, "pow", json!({})).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert_eq!(body["error"], "challenge_required");
    let (token, bits) = the_challenge(&body);
    assert_eq!(bits, BITS);

    // Wrong, other-room, forged, expired and too-easy solutions are refused,
    // each with its reason and a fresh challenge.
    let wrong = (0..)
        .find(|n| {
            let d = Sha256::digest(format!("{token}{n}"));
            d[0] != 0
        })
        .unwrap();
    let from_other = {
        let (_, body) = post_join(&app, "other", json!({})).await;
        the_challenge(&body).0
    };
    let keys = ChallengeKeys::from_keyring(&Keyring::from_secrets(&Secret::new(SECRET), None));
    let pow = RoomId::new("pow").unwrap();
    let expired = keys.issue(
        &pow,
        BITS,
        narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) - 6 * 60_000,
    );
    let too_easy = keys.issue(
        &pow,
        BITS - 4,
        narabu::engine::Clock::now_ms(&narabu::engine::SystemClock),
    );
    let foreign = ChallengeKeys::from_keyring(&Keyring::from_secrets(
        &Secret::new("another-secret-another-secret-another-0"),
        None,
    ))
    .issue(
        &pow,
        BITS,
        narabu::engine::Clock::now_ms(&narabu::engine::SystemClock),
    );
    for (challenge, counter, reason) in [
        (token.clone(), wrong, "wrong"),
        (from_other.clone(), solve(&from_other, BITS), "other_room"),
        (
            expired.token.clone(),
            solve(&expired.token, BITS),
            "expired",
        ),
        (
            too_easy.token.clone(),
            solve(&too_easy.token, BITS - 4),
            "too_easy",
        ),
        (foreign.token.clone(), solve(&foreign.token, BITS), "forged"),
        ("not-a-challenge".into(), 0, "malformed"),
    ] {
        let (status, body) = post_join(
            &app,
            "pow",
            json!({"challenge": challenge, "counter": counter}),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::PRECONDITION_REQUIRED,
            "{reason}: {body}"
        );
        assert_eq!(body["error"], "challenge_failed", "{reason}: {body}");
        assert_eq!(body["reason"], reason, "{body}");
        the_challenge(&body);
    }
    assert_eq!(joins(&app, "pow").await, (0, 0), "no refusal made a ticket");

    // A good solution makes one ticket; replaying it makes none.
    let counter = solve(&token, BITS);
    let (status, body) =
        post_join(&app, "pow", json!({"challenge": token, "counter": counter})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["number"], 1);
    let (status, body) =
        post_join(&app, "pow", json!({"challenge": token, "counter": counter})).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert_eq!(body["reason"], "spent");
    assert_eq!(joins(&app, "pow").await, (1, 1));

    // The holder of a ticket comes back without solving anything.
    let visitor_token = {
        let (token, bits) = {
            let r = app
                .client
                .get(app.url("/api/rooms/pow/challenge"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            let body: Value = r.json().await.unwrap();
            (
                body["token"].as_str().unwrap().to_owned(),
                body["difficulty"].as_u64().unwrap() as u8,
            )
        };
        let (status, body) = post_join(
            &app,
            "pow",
            json!({"challenge": token, "counter": solve(&token, bits)}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
        body["ticket"].as_str().unwrap().to_owned()
    };
    let again = app
        .client
        .post(app.url("/api/rooms/pow/join"))
        .bearer_auth(&visitor_token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        again.status(),
        StatusCode::OK,
        "a live ticket needs no new proof"
    );
    assert_eq!(joins(&app, "pow").await, (2, 2));

    let page = metrics(&app).await;
    for line in [
        r#"narabu_challenges_refused_total{room="pow",reason="missing"} 1"#,
        r#"narabu_challenges_refused_total{room="pow",reason="wrong"} 1"#,
        r#"narabu_challenges_refused_total{room="pow",reason="spent"} 1"#,
        r#"narabu_challenges_refused_total{room="pow",reason="expired"} 1"#,
        r#"narabu_challenges_solved_total{room="pow"} 2"#,
    ] {
        assert!(page.contains(line), "missing {line} in\n{page}");
    }
    // A room without proof of work has no challenge to give.
    let plain = app
        .client
        .get(app.url("/api/rooms/plain/challenge"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::NOT_FOUND);
    let plain: Value = plain.json().await.unwrap();
    assert_eq!(plain["error"], "no_challenge");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_solution_sent_many_times_at_once_makes_one_ticket() {
    let app = spawn_app(vec![pow_room("pow")]).await;
    let (_, refused) = post_join(&app, "pow", json!({})).await;
    let (token, bits) = the_challenge(&refused);
    let solution = json!({"challenge": token, "counter": solve(&token, bits)});
    let attempts = (0..16).map(|_| post_join(&app, "pow", solution.clone()));
    let results = futures_util::future::join_all(attempts).await;
    let created = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "{results:?}");
    for (status, body) in &results {
        assert!(
            *status == StatusCode::CREATED || body["reason"] == "spent",
            "{status}: {body}"
        );
    }
    assert_eq!(joins(&app, "pow").await, (1, 1));
    app.stop().await;
}

async fn get_challenge(app: &TestApp, room: &str) -> reqwest::Response {
    app.client
        .get(app.url(&format!("/api/rooms/{room}/challenge")))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn challenges_fetched_while_calm_are_refused_once_a_flood_raised_the_difficulty() {
    let mut rising = room("rising", 1000);
    rising.access.challenge = ChallengeMode::Pow;
    rising.access.pow_difficulty = 4;
    rising.access.pow_difficulty_max = 9;
    rising.access.pow_rise_per_second = 1;
    let app = spawn_app(vec![rising]).await;

    // Stocked up while the room is calm: cheap challenges, solved ahead.
    let mut stock = Vec::new();
    for _ in 0..10 {
        let r = get_challenge(&app, "rising").await;
        assert_eq!(r.status(), StatusCode::OK);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["difficulty"], 4, "{body}");
        let token = body["token"].as_str().unwrap().to_owned();
        let counter = solve(&token, 4);
        stock.push(json!({"challenge": token, "counter": counter}));
    }

    // A flood (joins on any instance count: the store's join counter).
    let id = RoomId::new("rising").unwrap();
    for _ in 0..300 {
        app.backend
            .join(&id, narabu::backend::JoinRequest::anonymous())
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    loop {
        let now = app.admin_room("rising").await["access"]["pow_difficulty_now"].clone();
        if now == 9 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = joins(&app, "rising").await;

    // Every prepaid solution is refused, each with a challenge at the
    // difficulty asked now.
    for solution in stock {
        let (status, body) = post_join(&app, "rising", solution).await;
        assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
        assert_eq!(body["error"], "challenge_failed", "{body}");
        assert_eq!(body["reason"], "too_easy", "{body}");
        assert_eq!(the_challenge(&body).1, 9, "{body}");
    }
    assert_eq!(joins(&app, "rising").await, before, "no prepaid ticket");

    // One bit of slack: a solver the rise overtook by a step still gets
    // in; two steps is a new challenge.
    let keys = ChallengeKeys::from_keyring(&Keyring::from_secrets(&Secret::new(SECRET), None));
    let now = narabu::engine::Clock::now_ms(&narabu::engine::SystemClock);
    let one_below = keys.issue(&id, 8, now);
    let two_below = keys.issue(&id, 7, now);
    let (status, body) = post_join(
        &app,
        "rising",
        json!({"challenge": two_below.token, "counter": solve(&two_below.token, 7)}),
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert_eq!(body["reason"], "too_easy", "{body}");
    let (status, body) = post_join(
        &app,
        "rising",
        json!({"challenge": one_below.token, "counter": solve(&one_below.token, 8)}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn challenge_fetches_past_the_join_limit_get_429() {
    let mut limited = pow_room("limited");
    limited.join_limit_per_minute = 3;
    let app = spawn_app(vec![limited, pow_room("other")]).await;
    // Two a join: a challenge for each join the limit allows, and a retry.
    for i in 0..6 {
        let r = get_challenge(&app, "limited").await;
        assert_eq!(r.status(), StatusCode::OK, "fetch {i}");
    }
    let refused = get_challenge(&app, "limited").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "too_many_challenges", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("6 a minute"),
        "{body}"
    );
    // Another room's allowance is its own.
    assert_eq!(get_challenge(&app, "other").await.status(), StatusCode::OK);
    app.stop().await;
}

// ----- enqueue tokens ------------------------------------------------------

const HS_KEY: &str = "origin-shared-key-origin-shared-key-01";
const HS_KEY_NEW: &str = "origin-shared-key-rotated-shared-key-02";
/// Test-only Ed25519 keys (`openssl genpkey -algorithm ed25519`).
const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIDnotDEZaPvvkM4Cxd4JgVeLBUrru9Nm4RYBce/Nmgx4
-----END PRIVATE KEY-----
";
const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEATEJGCNKgsqer+HkXMXcnVDAX8B91qiSI/XYEhhE6I3s=
-----END PUBLIC KEY-----
";

/// Mints JWTs with PyJWT, the way an origin would: a list of
/// (claims, algorithm, key) in, one token per line out.
fn pyjwt(tokens: &[(Value, &str, &str)]) -> Vec<String> {
    let headed: Vec<_> = tokens
        .iter()
        .map(|(claims, alg, key)| (claims.clone(), *alg, *key, Value::Null))
        .collect();
    pyjwt_headed(&headed)
}

/// [`pyjwt`] with header fields of the test's own (`null` for none).
fn pyjwt_headed(tokens: &[(Value, &str, &str, Value)]) -> Vec<String> {
    let script = r#"
import json, sys, jwt
for item in json.load(sys.stdin):
    print(jwt.encode(item["claims"], item["key"], algorithm=item["alg"], headers=item["headers"]))
"#;
    let input: Vec<Value> = tokens
        .iter()
        .map(|(claims, alg, key, headers)| {
            json!({"claims": claims, "alg": alg, "key": key, "headers": headers})
        })
        .collect();
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&input).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "PyJWT failed (scripts/test installs PyJWT and cryptography): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn now_secs() -> u64 {
    narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) / 1000
}

async fn token_join(app: &TestApp, room: &str, token: &str) -> (StatusCode, Value) {
    post_join(app, room, json!({"enqueue_token": token})).await
}

#[tokio::test]
async fn enqueue_tokens_with_critical_header_extensions_are_refused() {
    let mut s = room("presale", 5);
    s.access.enqueue = EnqueueMode::Token;
    s.access.enqueue_key = Some(SharedKey::new(HS_KEY));
    s.access.enqueue_public_key = Some(ED_PUBLIC.into());
    let app = spawn_app(vec![s]).await;
    let exp = now_secs() + 600;
    let claims = |sub: &str| json!({"aud": "presale", "sub": sub, "exp": exp});
    let minted = pyjwt_headed(&[
        (
            claims("alice"),
            "HS256",
            HS_KEY,
            json!({"crit": ["x-must-check"], "x-must-check": true}),
        ),
        (claims("bob"), "EdDSA", ED_PRIVATE, json!({"crit": ["exp"]})),
        (claims("carol"), "HS256", HS_KEY, json!({"kid": "k1"})),
    ]);
    let [crit_hs, crit_ed, plain] = minted.as_slice() else {
        panic!("three tokens")
    };
    for token in [crit_hs, crit_ed] {
        let (status, body) = token_join(&app, "presale", token).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(body["error"], "enqueue_token_invalid", "{body}");
        assert_eq!(body["reason"], "critical_extension", "{body}");
        assert!(body["message"].as_str().unwrap().contains("crit"), "{body}");
    }
    assert_eq!(joins(&app, "presale").await, (0, 0));
    // Other header fields are no obstacle.
    let (status, body) = token_join(&app, "presale", plain).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn invite_only_rooms_take_pyjwt_tokens_one_place_per_account() {
    let mut s = room("presale", 5);
    s.access.enqueue = EnqueueMode::Token;
    s.access.enqueue_key = Some(SharedKey::new(HS_KEY));
    s.access.enqueue_public_key = Some(ED_PUBLIC.into());
    let app = spawn_app(vec![s, room("general", 5)]).await;
    let exp = now_secs() + 600;
    let claims = |sub: &str| json!({"aud": "presale", "sub": sub, "exp": exp});
    let minted = pyjwt(&[
        (claims("alice"), "HS256", HS_KEY),
        (claims("bob"), "EdDSA", ED_PRIVATE),
        (
            claims("mallory"),
            "HS256",
            "a-key-the-room-does-not-know-at-all-0",
        ),
        (
            json!({"aud": "presale", "sub": "late", "exp": now_secs() - 3600}),
            "HS256",
            HS_KEY,
        ),
        (
            json!({"aud": "general", "sub": "alice", "exp": exp}),
            "HS256",
            HS_KEY,
        ),
        (json!({"aud": "presale", "exp": exp}), "HS256", HS_KEY),
        (claims("carol"), "HS256", HS_KEY_NEW),
    ]);
    let [alice, bob, forged, expired, other_room, no_sub, carol_new] = minted.as_slice() else {
        panic!("seven tokens")
    };

    // Without a token: 401; with bad ones: 403 and the reason. No tickets.
    let (status, body) = post_join(&app, "presale", json!({})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"], "enqueue_token_required");
    for (token, reason) in [
        (forged, "bad_signature"),
        (expired, "expired"),
        (other_room, "wrong_room"),
        (no_sub, "missing_claim"),
        (carol_new, "bad_signature"),
    ] {
        let (status, body) = token_join(&app, "presale", token).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{reason}: {body}");
        assert_eq!(body["error"], "enqueue_token_invalid");
        assert_eq!(body["reason"], reason, "{body}");
        assert!(!body.to_string().contains(HS_KEY), "no key in errors");
    }
    assert_eq!(joins(&app, "presale").await, (0, 0));

    // Good tokens from PyJWT, HS256 and EdDSA, are accepted. The same
    // account from a second device (no cookie) gets its own ticket back.
    let (status, first) = token_join(&app, "presale", alice).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, second) = token_join(&app, "presale", alice).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["number"], first["number"]);
    assert_eq!(second["ticket"], first["ticket"]);
    let (status, body) = token_join(&app, "presale", bob).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(joins(&app, "presale").await, (2, 2));

    // Rotation: the new key signs, the old one still verifies...
    let patch = |body: Value| {
        app.client
            .patch(app.url("/admin/rooms/presale"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    let r = patch(json!({"enqueue_key": HS_KEY_NEW, "enqueue_previous_key": HS_KEY}))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let shown: Value = r.json().await.unwrap();
    assert!(
        !shown.to_string().contains(HS_KEY_NEW),
        "keys are write-only"
    );
    assert_eq!(shown["access"]["enqueue_keys"]["hs256_previous"], true);
    let dave = pyjwt(&[(claims("dave"), "HS256", HS_KEY)]).remove(0);
    assert_eq!(
        token_join(&app, "presale", carol_new).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        token_join(&app, "presale", &dave).await.0,
        StatusCode::CREATED
    );
    // ...until it is retired.
    let r = patch(json!({"enqueue_previous_key": null})).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let erin = pyjwt(&[(claims("erin"), "HS256", HS_KEY)]).remove(0);
    let (status, body) = token_join(&app, "presale", &erin).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["reason"], "bad_signature");

    let page = metrics(&app).await;
    for line in [
        r#"narabu_enqueue_tokens_refused_total{room="presale",reason="bad_signature"} 3"#,
        r#"narabu_enqueue_tokens_refused_total{room="presale",reason="expired"} 1"#,
        r#"narabu_enqueue_tokens_refused_total{room="presale",reason="missing"} 1"#,
    ] {
        assert!(page.contains(line), "missing {line}");
    }

    // The queue page takes the token from its address and drops it.
    let r = app
        .client
        .get(app.url(&format!(
            "/queue/presale?return=/shop&enqueue_token={carol_new}"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{:?}", r.text().await);
    let location = r.headers()["location"].to_str().unwrap();
    assert!(location.starts_with("/queue/presale?"), "{location}");
    assert!(!location.contains("enqueue_token"), "{location}");
    assert!(
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .starts_with("narabu_presale=")
    );
    // Without one, the page says the sale is by invitation.
    let r = app
        .client
        .get(app.url("/queue/presale?return=/shop"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("by invitation"));
    assert_eq!(
        joins(&app, "presale").await.0,
        4,
        "alice, bob, carol, dave, and nobody else"
    );
    app.stop().await;
}

/// A presale with a members lane: the lane comes from the origin's token
/// (minted by PyJWT), numbers and places count within it, ten permits go
/// 3/7 by weight, and the lanes show in the answers, the event stream, the
/// admin API and `/metrics`. A token naming a lane the room lacks is
/// refused and makes no ticket.
#[tokio::test]
async fn a_members_lane_gets_its_share_and_says_so_everywhere() {
    let mut s = room("presale", 10);
    s.access.enqueue = EnqueueMode::Token;
    s.access.enqueue_key = Some(SharedKey::new(HS_KEY));
    let s = with_lanes(s, &[("members", 30), ("general", 70)], "general");
    let app = spawn_app(vec![s]).await;
    app.backend
        .patch_room(
            &RoomId::new("presale").unwrap(),
            narabu::backend::RoomPatch {
                paused: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let exp = now_secs() + 600;
    let mut claims: Vec<(Value, &str, &str)> = Vec::new();
    for i in 0..8 {
        let member =
            json!({"aud": "presale", "sub": format!("m{i}"), "exp": exp, "lane": "members"});
        let general = json!({"aud": "presale", "sub": format!("g{i}"), "exp": exp});
        claims.push((member, "HS256", HS_KEY));
        claims.push((general, "HS256", HS_KEY));
    }
    claims.push((
        json!({"aud": "presale", "sub": "v", "exp": exp, "lane": "vip"}),
        "HS256",
        HS_KEY,
    ));
    let minted = pyjwt(&claims);

    let (status, body) = token_join(&app, "presale", &minted[16]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "unknown_lane");
    assert_eq!(body["reason"], "unknown_lane");
    assert!(body["message"].as_str().unwrap().contains("vip"), "{body}");
    assert_eq!(joins(&app, "presale").await, (0, 0));

    let mut visitors = Vec::new();
    for (i, token) in minted[..16].iter().enumerate() {
        let (status, body) = token_join(&app, "presale", token).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let lane = if i % 2 == 0 { "members" } else { "general" };
        assert_eq!(body["lane"], lane, "{body}");
        assert_eq!(
            body["number"],
            i as u64 / 2 + 1,
            "numbers count within the lane"
        );
        assert_eq!(body["position"], i as u64 / 2 + 1);
        visitors.push(Visitor {
            token: body["ticket"].as_str().unwrap().to_owned(),
            number: body["number"].as_u64().unwrap(),
            body,
        });
    }
    // The stream names the lane too.
    let mut stream = app.events("presale", &visitors[2]).await;
    let first = narabu_testkit::app::next_event(&mut stream, Duration::from_secs(5)).await;
    let data: Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(
        (data["lane"].as_str(), data["position"].as_u64()),
        (Some("members"), Some(2))
    );
    drop(stream);

    let r = app
        .client
        .patch(app.url("/admin/rooms/presale"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"paused": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    app.tick("presale").await;
    let admitted: Vec<&str> = {
        let mut v = Vec::new();
        for (i, visitor) in visitors.iter().enumerate() {
            if app.status("presale", visitor).await["status"] == "admitted" {
                v.push(if i % 2 == 0 { "members" } else { "general" });
            }
        }
        v
    };
    let members = admitted.iter().filter(|l| **l == "members").count();
    assert_eq!((members, admitted.len()), (3, 10), "{admitted:?}");
    let waiting = app.status("presale", &visitors[6]).await;
    assert_eq!(
        (waiting["lane"].as_str(), waiting["position"].as_u64()),
        (Some("members"), Some(1))
    );

    let room = app.admin_room("presale").await;
    assert_eq!(
        room["lanes"],
        json!([
            {"name": "members", "weight": 30, "waiting": 5, "admitted": 3},
            {"name": "general", "weight": 70, "waiting": 1, "admitted": 7},
        ])
    );
    assert_eq!(room["settings"]["default_lane"], "general");
    let page = metrics(&app).await;
    for line in [
        r#"narabu_room_lane_waiting{room="presale",lane="members"} 5"#,
        r#"narabu_room_lane_admitted{room="presale",lane="general"} 7"#,
        r#"narabu_enqueue_tokens_refused_total{room="presale",reason="unknown_lane"} 1"#,
    ] {
        assert!(page.contains(line), "missing {line}");
    }

    // The shares can be moved while the sale runs; the lanes themselves
    // cannot.
    let patch = |body: Value| {
        app.client
            .patch(app.url("/admin/rooms/presale"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    for (body, field, words) in [
        (
            json!({"lane_weights": {"vip": 5}}),
            "lane_weights.vip",
            "no lane",
        ),
        (
            json!({"lane_weights": {"members": 0}}),
            "lane_weights.members",
            "1 to 1000",
        ),
        (
            json!({"lane_weights": null}),
            "lane_weights",
            "cannot be null",
        ),
        (json!({"lanes": []}), "lanes", "cannot be changed"),
    ] {
        let r = patch(body.clone()).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let err: Value = r.json().await.unwrap();
        let message = err["message"].as_str().unwrap();
        assert!(
            message.starts_with(field) && message.contains(words),
            "{body}: {err}"
        );
    }
    let r = patch(json!({"lane_weights": {"members": 70, "general": 30}}))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let room: Value = r.json().await.unwrap();
    assert_eq!(
        room["settings"]["lanes"],
        json!([{"name": "members", "weight": 70}, {"name": "general", "weight": 30}])
    );
    app.stop().await;
}

// ----- the opening draw ------------------------------------------------

/// The few lines anyone can write: SHA-256 of the seed must be the
/// commitment, and each id's key is SHA-256(seed bytes || "/" || id).
fn recompute(seed_hex: &str, ids: &[u64]) -> (String, Vec<u64>) {
    let seed = hex::decode(seed_hex).unwrap();
    let commitment = hex::encode(Sha256::digest(&seed));
    let mut keyed: Vec<(Vec<u8>, u64)> = ids
        .iter()
        .map(|id| {
            let mut h = Sha256::new();
            h.update(&seed);
            h.update(format!("/{id}"));
            (h.finalize().to_vec(), *id)
        })
        .collect();
    keyed.sort();
    (commitment, keyed.into_iter().map(|(_, id)| id).collect())
}

#[tokio::test]
async fn the_opening_draw_is_public_and_recomputable_from_sha256_alone() {
    let opens_at = narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) + 1_500;
    let mut s = room("launch", 1);
    s.opens_at = Some(opens_at);
    let app = spawn_app(vec![s]).await;
    let mut visitors = Vec::new();
    for _ in 0..12 {
        // Before opening a ticket has no number yet.
        let (status, body) = post_join(&app, "launch", json!({})).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(body["number"], Value::Null);
        visitors.push(Visitor {
            token: body["ticket"].as_str().unwrap().to_owned(),
            number: 0,
            body,
        });
    }
    let draw_url = app.url("/api/rooms/launch/draw");
    // The draw's record, as anyone (no ticket) or a ticket's holder reads it.
    let draw = |query: String, holder: Option<String>| {
        let mut request = app.client.get(format!("{draw_url}{query}"));
        if let Some(token) = holder {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let sealed = draw(String::new(), None).await;
    let commitment = sealed["commitment"].as_str().unwrap().to_owned();
    assert_eq!(commitment.len(), 64);
    assert!(
        sealed.get("seed").is_none() && sealed.get("order").is_none(),
        "{sealed}"
    );

    // The waiting page shows the commitment and links to the record.
    let page = app
        .client
        .get(app.url("/queue/launch?return=/"))
        .header("cookie", format!("narabu_launch={}", visitors[0].token))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&commitment), "commitment on the page");
    assert!(page.contains("/api/rooms/launch/draw"));

    tokio::time::sleep(Duration::from_millis(
        opens_at.saturating_sub(narabu::engine::Clock::now_ms(&narabu::engine::SystemClock)) + 50,
    ))
    .await;
    app.tick("launch").await;
    let drawn = draw(String::new(), None).await;
    assert_eq!(drawn["commitment"], commitment.as_str());
    let seed = drawn["seed"].as_str().unwrap();
    let order: Vec<u64> = drawn["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(order.len(), 12);
    let mut ids = order.clone();
    ids.sort_unstable();
    let (recomputed_commitment, recomputed) = recompute(seed, &ids);
    assert_eq!(recomputed_commitment, commitment);
    assert_eq!(recomputed, order);

    // Each visitor finds their ticket and place; their number is it.
    let mut place_of = std::collections::HashMap::new();
    for v in &visitors {
        let mine = draw(String::new(), Some(v.token.clone())).await;
        let ticket = mine["ticket"].as_u64().unwrap();
        let place = mine["place"].as_u64().unwrap();
        assert_eq!(order[place as usize - 1], ticket);
        assert_eq!(app.status("launch", v).await["number"], place);
        place_of.insert(v.token.clone(), place);
    }
    let looked_up = draw(format!("?ticket={}", order[4]), None).await;
    assert_eq!(looked_up["place"], 5);

    // Admission follows the drawn order: capacity 1, each leave hands the
    // permit to the next in the draw.
    let mut admitted_places = Vec::new();
    for _ in 0..visitors.len() {
        let mut admitted = None;
        for v in &visitors {
            if app.status("launch", v).await["status"] == "admitted" {
                admitted = Some(v.clone());
            }
        }
        let v = admitted.expect("one visitor admitted");
        admitted_places.push(place_of[&v.token]);
        assert_eq!(app.leave("launch", &v).await, StatusCode::NO_CONTENT);
    }
    assert_eq!(admitted_places, (1..=12).collect::<Vec<u64>>());

    // `narabu verify-draw` agrees, from the record and from the queue page.
    for url in [draw_url.clone(), app.url("/queue/launch?return=/")] {
        // Asynchronously: the server runs on this test's one thread.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_narabu"))
            .args(["verify-draw", &url])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{url}: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("checks out") && stdout.contains("12 tickets"),
            "{stdout}"
        );
    }
    app.stop().await;
}
