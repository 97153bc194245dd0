//! The chained admission record as anyone checks it, on whichever backend
//! the suite runs on: a sale with churn (admissions, a leave, a
//! revocation, a visitor away at their turn and back, releases handing
//! permits on) leaves a record whose chain `narabu verify-record` finds
//! intact, with the one admission out of ticket order explained by the
//! skip; the head in status answers is the record's; entries carry no
//! identity; and a record edited by hand (an entry changed, one removed,
//! the head rewritten, a page starting from another hash) is refused,
//! naming the entry.

use std::process::{Command, Output};
use std::time::Duration;

use narabu::backend::Backend;
use narabu::engine::RoomSettings;
use narabu_testkit::app::{ADMIN_TOKEN, TestApp, Visitor, spawn_app};
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub async fn verify_record(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_narabu"))
            .arg("verify-record")
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Every page of the record, read `limit` entries at a time.
pub async fn pages(app: &TestApp, room: &str, limit: u64) -> Vec<Value> {
    let mut pages = Vec::new();
    let mut after = 0;
    loop {
        let page: Value = app
            .client
            .get(app.url(&format!(
                "/api/rooms/{room}/record?after={after}&limit={limit}"
            )))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let got = page["entries"].as_array().unwrap().len() as u64;
        let next = page["next"].is_string();
        after += got;
        pages.push(page);
        if !next {
            return pages;
        }
    }
}

/// The chain recomputed here, from the definition (not the server's code).
fn rehash(room: &str, epoch: u64, pages: &[Value]) -> String {
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut prev = hex(&Sha256::digest(format!("narabu-record {room} {epoch}\n")));
    for page in pages {
        assert_eq!(page["previous"], prev.as_str());
        for e in page["entries"].as_array().unwrap() {
            let line = format!(
                "{} {} {} {} {} {}",
                e["n"],
                e["kind"].as_str().unwrap(),
                e["ticket"],
                e["lane"],
                e["number"],
                e["at"]
            );
            prev = hex(&Sha256::digest(format!("{prev} {line}\n")));
            assert_eq!(e["hash"], prev.as_str(), "{line}");
        }
    }
    prev
}

async fn release(app: &TestApp, room: &str, v: &Visitor) {
    let r = app
        .client
        .post(app.url(&format!("/api/rooms/{room}/release")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"ticket": v.token}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

async fn revoke(app: &TestApp, room: &str, v: &Visitor) {
    let r = app
        .client
        .post(app.url(&format!("/admin/rooms/{room}/revoke")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"ticket": v.token}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
}

/// A room whose visitors count as away one second after they were last
/// heard.
pub fn quick_away(id: &str, capacity: u32) -> RoomSettings {
    RoomSettings {
        away_grace: Duration::from_secs(1),
        ..room(id, capacity)
    }
}

/// The churn: eight join, two are admitted, one leaves, one is revoked,
/// one is away when the head reaches it (skipped, then back and admitted
/// after a higher number), and two releases hand their permits on.
/// Returns the visitors and the one who was away.
pub async fn churn(app: &TestApp, room: &str) -> (Vec<Visitor>, Visitor) {
    let mut v = Vec::new();
    for _ in 0..8 {
        v.push(app.join(room).await);
    }
    app.tick(room).await;
    assert_eq!(app.leave(room, &v[2]).await, StatusCode::NO_CONTENT);
    revoke(app, room, &v[3]).await;
    // v[4] goes quiet past its away grace; the others behind it stay.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for w in &v[5..] {
        app.status(room, w).await;
    }
    release(app, room, &v[0]).await;
    assert_eq!(app.status(room, &v[5]).await["status"], "admitted");
    // Back: first in line again, ahead of number 7 and 8.
    assert_eq!(app.status(room, &v[4]).await["status"], "waiting");
    release(app, room, &v[1]).await;
    assert_eq!(app.status(room, &v[4]).await["status"], "admitted");
    (v.clone(), v[4].clone())
}

/// A change made to a record by hand.
type Edit = Box<dyn Fn(&mut Value)>;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_churned_sales_record_checks_out_and_a_record_edited_by_hand_is_refused() {
    let app = spawn_app(vec![quick_away("sale", 2)]).await;
    let (visitors, away) = churn(&app, "sale").await;

    let pages = pages(&app, "sale", 3).await;
    assert!(pages.len() > 2, "read in pages of three");
    let epoch = pages[0]["epoch"].as_u64().unwrap();
    let head = rehash("sale", epoch, &pages);
    assert_eq!(pages.last().unwrap()["head"], head.as_str());
    let entries: Vec<Value> = pages
        .iter()
        .flat_map(|p| p["entries"].as_array().unwrap().clone())
        .collect();
    let kinds: Vec<&str> = entries
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    for kind in ["admit", "left", "revoked", "skip", "return", "released"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    // Nothing but these fields: no identity, no token.
    for e in &entries {
        let mut keys: Vec<&String> = e.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            ["at", "hash", "kind", "lane", "n", "number", "ticket"]
        );
    }
    let text = serde_json::to_string(&pages).unwrap();
    for v in &visitors {
        assert!(!text.contains(&v.token));
    }
    // The head every status answer carries is the record's.
    let status = app.status("sale", &visitors[7]).await;
    assert_eq!(status["record"]["head"], head.as_str(), "{status}");
    assert_eq!(status["record"]["entries"], entries.len());

    // The command, from the server, with the away visitor's receipt.
    let receipt = away.body["receipt"].as_str().unwrap().to_owned();
    let out = verify_record(vec![
        app.url("/api/rooms/sale/record"),
        "--receipt".into(),
        receipt,
        "--head".into(),
        head.clone(),
    ])
    .await;
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains(
            "1 inversions within lanes (Kendall-tau distance), 1 explained, 0 unexplained"
        ),
        "{said}"
    );
    assert!(said.contains("skipped while away"), "{said}");
    assert!(said.contains("receipt: signature verified"), "{said}");
    assert!(said.contains("stood at number 5"), "{said}");
    assert!(said.contains("1 of them with higher numbers"), "{said}");
    assert!(
        said.lines().last().unwrap().starts_with("==> VERIFIED"),
        "{said}"
    );

    // Edited by hand, saved to a file, checked again.
    let dir = tempfile::tempdir().unwrap();
    let whole: Value = app
        .client
        .get(app.url("/api/rooms/sale/record"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let file = dir.path().join("record.json");
    std::fs::write(&file, whole.to_string()).unwrap();
    let out = verify_record(vec![file.display().to_string()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));

    let edits: Vec<(&str, Edit, &str)> = vec![
        (
            "two entries swapped",
            Box::new(|r: &mut Value| r["entries"].as_array_mut().unwrap().swap(2, 3)),
            "at entry 3:",
        ),
        (
            "an entry removed",
            Box::new(|r: &mut Value| {
                r["entries"].as_array_mut().unwrap().remove(4);
            }),
            "at entry 5:",
        ),
        (
            "a number moved",
            Box::new(|r: &mut Value| r["entries"][6]["number"] = json!(1)),
            "at entry 7:",
        ),
        (
            "the head rewritten",
            Box::new(|r: &mut Value| r["head"] = json!("0".repeat(64))),
            "the stated head",
        ),
        (
            "the page started elsewhere",
            Box::new(|r: &mut Value| r["previous"] = json!("1".repeat(64))),
            "at entry 1:",
        ),
    ];
    for (what, edit, names) in edits {
        let mut edited = whole.clone();
        edit(&mut edited);
        std::fs::write(&file, edited.to_string()).unwrap();
        let out = verify_record(vec![file.display().to_string()]).await;
        let said = stdout(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {said}");
        let verdict = said.lines().last().unwrap();
        assert!(
            verdict.starts_with("==> NOT VERIFIED: the chain is broken"),
            "{what}: {said}"
        );
        assert!(verdict.contains(names), "{what}: {verdict}");
    }
    // A saved head the record no longer has: rewritten since.
    std::fs::write(&file, whole.to_string()).unwrap();
    let out = verify_record(vec![
        file.display().to_string(),
        "--head".into(),
        "ab".repeat(32),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("is not on the chain"));
    app.stop().await;
}

#[tokio::test]
async fn bad_pages_are_refused_with_the_field_named() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    for (query, field) in [
        ("after=-1", "after"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("after=x", "after"),
    ] {
        let r = app
            .client
            .get(app.url(&format!("/api/rooms/sale/record?{query}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["message"].as_str().unwrap().starts_with(field),
            "{body}"
        );
    }
    let r = app
        .client
        .get(app.url("/api/rooms/nope/record"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    app.stop().await;
}

const HS_KEY: &str = "origin-shared-key-origin-shared-key-01";

/// A launch with a members lane (30) beside the general one (70), joined
/// by enqueue tokens, with an opening draw an hour away.
fn launch() -> RoomSettings {
    use narabu::access::{EnqueueMode, SharedKey};
    let mut s = quick_away("launch", 2);
    s.access.enqueue = EnqueueMode::Token;
    s.access.enqueue_key = Some(SharedKey::new(HS_KEY));
    s.opens_at = Some(narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) + 3_600_000);
    narabu_testkit::with_lanes(s, &[("members", 30), ("general", 70)], "general")
}

/// Joins `n` visitors to the launch, alternating lanes, accounts from
/// `first`.
async fn token_joins(app: &TestApp, first: usize, n: usize) -> Vec<Visitor> {
    let exp = narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) / 1000 + 600;
    let mut out = Vec::new();
    for i in first..first + n {
        let mut claims = json!({"aud": "launch", "sub": format!("a{i}"), "exp": exp});
        if i % 2 == 0 {
            claims["lane"] = json!("members");
        }
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::default(),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(HS_KEY.as_bytes()),
        )
        .unwrap();
        let r = app
            .client
            .post(app.url("/api/rooms/launch/join"))
            .json(&json!({"enqueue_token": token}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let body: Value = r.json().await.unwrap();
        out.push(Visitor {
            token: body["ticket"].as_str().unwrap().to_owned(),
            number: body["number"].as_u64().unwrap_or(0),
            body,
        });
    }
    out
}

/// Before the change: six join the pre-queue, the room opens (the draw),
/// two are admitted, one of them released, one visitor leaves.
async fn before_the_change(app: &TestApp) -> Vec<Visitor> {
    let v = token_joins(app, 0, 6).await;
    app.backend
        .patch_room(
            &narabu::engine::RoomId::new("launch").unwrap(),
            narabu::backend::RoomPatch {
                open_now: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    app.tick("launch").await;
    app.tick("launch").await;
    let admitted: Vec<&Visitor> = {
        let mut a = Vec::new();
        for w in &v {
            if app.status("launch", w).await["status"] == "admitted" {
                a.push(w);
            }
        }
        a
    };
    assert!(!admitted.is_empty(), "the opening admits");
    release(app, "launch", admitted[0]).await;
    for w in &v {
        if app.status("launch", w).await["status"] == "waiting" {
            assert_eq!(app.leave("launch", w).await, StatusCode::NO_CONTENT);
            break;
        }
    }
    v
}

/// After it: four more join (first come, first served now), and every
/// permit is handed on until all have had their turn.
async fn after_the_change(app: &TestApp, before: &[Visitor]) {
    let later = token_joins(app, 6, 4).await;
    for _ in 0..8 {
        for w in before.iter().chain(&later) {
            let s = app.status("launch", w).await;
            if s["status"] == "admitted" {
                release(app, "launch", w).await;
            }
        }
        app.tick("launch").await;
    }
}

/// The record read whole, as a sceptic would check it; its head.
async fn checked(app: &TestApp, saved: Option<&str>) -> (String, String) {
    let mut args = vec![app.url("/api/rooms/launch/record")];
    if let Some(head) = saved {
        args.extend(["--head".to_owned(), head.to_owned()]);
    }
    let out = verify_record(args).await;
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("draw: verified"), "{said}");
    assert!(said.contains("0 unexplained"), "{said}");
    assert!(said.contains("share: lane general:"), "{said}");
    let body: Value = app
        .client
        .get(app.url("/api/rooms/launch/record"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (body["head"].as_str().unwrap().to_owned(), said)
}

/// On the embedded backend: a snapshot in the middle, a restart after; on
/// Redis: two instances that must serve the same record, then the owner
/// stops and the other takes the room over (from the image it stored and
/// the log after it). Either way the record afterwards goes on from the
/// same head, and checks out with the saved head on its chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_survives_a_restart_or_an_owner_change_with_lanes_and_a_draw() {
    use narabu_testkit::app::{config, spawn_with};
    if std::env::var("NARABU_TEST_BACKEND").as_deref() == Ok("redis") {
        use narabu::backend::owner::OwnerOptions;
        use narabu_testkit::redis_server::{RedisServer, owners_on};
        let redis = RedisServer::start().await;
        let options = OwnerOptions {
            ticks: false,
            image_every: Duration::from_millis(200),
            lease: Duration::from_secs(2),
        };
        let mut apps = Vec::new();
        for _ in 0..2 {
            let backend = owners_on(
                &redis,
                vec![launch()],
                std::sync::Arc::new(narabu::engine::SystemClock),
                options.clone(),
                narabu::config::RedisWait::OFF,
            )
            .await;
            apps.push((backend.clone(), spawn_with(config(), backend).await));
        }
        let visitors = before_the_change(&apps[0].1).await;
        // Images are stored and the log trimmed behind them meanwhile.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let (head, _) = checked(&apps[0].1, None).await;
        let mut same = false;
        for _ in 0..100 {
            let other: Value = apps[1]
                .1
                .client
                .get(apps[1].1.url("/api/rooms/launch/record"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if other["head"] == head.as_str() {
                same = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(same, "the other instance serves the same record");
        let id = narabu::engine::RoomId::new("launch").unwrap();
        let owner = usize::from(!apps[0].0.owns(&id));
        let (backend, app) = apps.remove(owner);
        app.stop().await;
        backend.shutdown().await;
        drop(backend);
        let (_, app) = apps.remove(0);
        after_the_change(&app, &visitors).await;
        let (after, said) = checked(&app, Some(&head)).await;
        assert_ne!(after, head);
        assert!(said.contains("saved head: entry"), "{said}");
        assert!(said.contains("share: lane members:"), "{said}");
        // An instance that starts now reads the room from its stored image
        // (the log before it trimmed) and serves the same record.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let late = owners_on(
            &redis,
            vec![launch()],
            std::sync::Arc::new(narabu::engine::SystemClock),
            options.clone(),
            narabu::config::RedisWait::OFF,
        )
        .await;
        let late_app = spawn_with(config(), late.clone()).await;
        let want = pages(&app, "launch", 1000).await;
        let mut same = false;
        for _ in 0..100 {
            if pages(&late_app, "launch", 1000).await == want {
                same = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            same,
            "an instance started from the image serves the same record"
        );
        late_app.stop().await;
        late.shutdown().await;
        app.stop().await;
    } else {
        use narabu::backend::embedded::{EmbeddedBackend, Persistence};
        let dir = tempfile::tempdir().unwrap();
        let open = || async {
            EmbeddedBackend::open(
                vec![launch()],
                std::sync::Arc::new(narabu::engine::SystemClock),
                Persistence {
                    data_dir: dir.path().to_owned(),
                    durability: narabu::config::Durability::Fsync,
                    snapshot_interval: Duration::from_secs(3600),
                },
                false,
            )
            .await
            .unwrap()
        };
        let backend = open().await;
        let app = spawn_with(config(), backend.clone()).await;
        let v = token_joins(&app, 100, 2).await;
        backend.snapshot().await.unwrap();
        let mut visitors = before_the_change(&app).await;
        visitors.extend(v);
        let (head, _) = checked(&app, None).await;
        let whole = pages(&app, "launch", 1000).await;
        app.stop().await;
        backend.shutdown().await;
        drop(backend);

        let backend = open().await;
        let app = spawn_with(config(), backend.clone()).await;
        assert_eq!(
            pages(&app, "launch", 1000).await,
            whole,
            "the same record after the restart"
        );
        after_the_change(&app, &visitors).await;
        let (after, said) = checked(&app, Some(&head)).await;
        assert_ne!(after, head);
        assert!(said.contains("saved head: entry"), "{said}");
        assert!(said.contains("share: lane members:"), "{said}");
        app.stop().await;
        backend.shutdown().await;
    }
}

/// docs/fair-access.md's few lines of shell (curl, jq, sha256sum), run as they are
/// against a live record of two pages, find the chain intact and end on
/// the head the server states; so does `verify-record`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_shell_recipe_checks_the_chain() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fair-access.md"))
            .unwrap();
    let start = readme
        .find("# The record's chain with curl, jq and sha256sum")
        .expect("docs/fair-access.md has the recipe");
    let recipe = &readme[start..start + readme[start..].find("```").unwrap()];
    let app = spawn_app(vec![room("sale", 700)]).await;
    // Two pages' worth: 600 admissions and 600 departures.
    let mut visitors = Vec::new();
    for _ in 0..600 {
        visitors.push(app.join("sale").await);
    }
    app.tick("sale").await;
    for v in &visitors {
        app.leave("sale", v).await;
    }
    let head: Value = app
        .client
        .get(app.url("/api/rooms/sale/record"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = app.url("/api/rooms/sale/record");
    let script = recipe.replace(
        "URL=https://queue.example.com/api/rooms/sale/record",
        &format!("URL={url}"),
    );
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || {
            Command::new("bash")
                .args(["-c", &script])
                .current_dir(dir)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let said = stdout(&out);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&format!(
            "chain intact: 1200 entries, head {}",
            head["head"].as_str().unwrap()
        )),
        "{said}"
    );
    assert!(head["next"].is_string(), "more than one page");
    // verify-record reads both pages too.
    let out = verify_record(vec![url]).await;
    let said = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("entries     1200"), "{said}");
    app.stop().await;
}
