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
