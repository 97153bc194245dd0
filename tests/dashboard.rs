//! The operators' dashboard in headless Chromium: it loads, takes the admin
//! token, shows a room with live figures and charts, and a capacity change
//! made with its controls reaches the engine. A screenshot is saved to
//! `target/e2e/dashboard.png` for a person to look at.
//!
//! The browser is driven by chromedriver over the W3C WebDriver protocol
//! (`narabu_testkit::browser`, shared with `tests/browser.rs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::backend::embedded::EmbeddedBackend;
use narabu::backend::{Backend, JoinRequest};
use narabu::engine::rules::Mode;
use narabu::engine::{RoomId, SystemClock};
use narabu_testkit::app::{ADMIN_TOKEN, config, spawn_with};
use narabu_testkit::browser::{Driver, Key};
use narabu_testkit::crowd::{Origin, SHAPE, room_body};
use narabu_testkit::{room, with_lanes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_takes_the_token_shows_rooms_and_changes_capacity() {
    let mut sale = room("sale", 50);
    sale.tick = std::time::Duration::from_millis(200);
    sale.join_limit_per_minute = 0;
    // A second room with priority lanes, to show them.
    let mut later = with_lanes(
        room("later", 10),
        &[("members", 1), ("general", 3)],
        "general",
    );
    // And traffic rules, to show their counts.
    later.rules = serde_json::from_value(serde_json::json!([
        {"name": "health", "action": "bypass", "path_prefix": ["/healthz"]},
        {"action": "block", "user_agent": ["BadBot"]},
    ]))
    .unwrap();
    // Tuned from an origin of its own, to show autotune's figures.
    let origin = Origin::start(SHAPE).await;
    let section = room_body(&origin, 100, 400, Some((30, 600)))["autotune"].clone();
    later.autotune = Some(Box::new(serde_json::from_value(section).unwrap()));
    let backend = EmbeddedBackend::new(vec![sale, later], Arc::new(SystemClock));
    let app = spawn_with(config(), backend.clone()).await;
    // Some line to draw: visitors join over a few seconds.
    let mut visitors = Vec::new();
    for _ in 0..80 {
        visitors.push(app.join("sale").await);
    }

    let driver = Driver::start().await;
    driver.goto(&app.url("/admin")).await;
    driver
        .wait_until(
            "the login form shows",
            "return !document.getElementById('login').hidden",
        )
        .await;
    // The token goes to sessionStorage only, never a cookie or the URL.
    driver.type_into("#token", ADMIN_TOKEN).await;
    driver.click("#login-submit").await;
    driver
        .wait_until(
            "the room appears with its figures",
            "var e = document.getElementById('fig-admitted-sale'); \
             return !!e && e.textContent.indexOf('/ 50') > 0",
        )
        .await;
    let stored = driver
        .script(
            "return [sessionStorage.getItem('narabu_admin_token'), document.cookie, location.href]",
        )
        .await;
    // Each lane of a room with lanes: weight, waiting / admitted.
    for lane in [0, 0, 1] {
        backend
            .join(&RoomId::new("later").unwrap(), JoinRequest::in_lane(lane))
            .await
            .unwrap();
    }
    driver
        .wait_until(
            "the lanes figure shows both lanes, and one line elsewhere",
            "var l = document.getElementById('fig-lanes-later').textContent; \
             return /^members \\(1\\): \\d+ \\/ \\d+ · general \\(3\\): \\d+ \\/ \\d+$/.test(l) && \
             document.getElementById('fig-lanes-sale').textContent === 'one line'",
        )
        .await;
    // Each rule's matches, as /metrics counts them.
    for (path, agent) in [
        ("/healthz", "Mozilla/5.0"),
        ("/healthz/db", "x"),
        ("/", "BadBot/1"),
    ] {
        let checked = app
            .client
            .get(app.url("/gate/later"))
            .header("x-original-uri", path)
            .header("user-agent", agent)
            .send()
            .await
            .unwrap();
        assert!(checked.status().is_success() || checked.status() == 403);
    }
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains(r#"narabu_rule_matches_total{room="later",rule="health",action="bypass"} 2"#),
        "{metrics}"
    );
    driver
        .wait_until(
            "the rules figure shows each rule's matches, and none elsewhere",
            "return document.getElementById('fig-rules-later').textContent === \
             'health (bypass): 2 · 1 (block): 1' && \
             document.getElementById('fig-rules-sale').textContent === 'none'",
        )
        .await;
    // Autotune: off, or what the tuner read against its targets.
    driver
        .wait_until(
            "the autotune figure shows the reading against the target, and off elsewhere",
            "var t = document.getElementById('fig-autotune-later').textContent; \
             return /^p95 .+ \\/ 400ms · errors .+ \\/ 5\\.0 % · .+\\/min \\(30–600\\)/.test(t) && \
             document.getElementById('fig-autotune-sale').textContent === 'off'",
        )
        .await;
    assert_eq!(stored[0], ADMIN_TOKEN);
    assert_eq!(stored[1], "");
    assert!(!stored[2].as_str().unwrap().contains(ADMIN_TOKEN));
    driver
        .wait_until(
            "the event stream is live",
            "return document.getElementById('conn').textContent === 'live'",
        )
        .await;

    // A few samples for the charts, with the line moving between them.
    for leaving in visitors[..20].chunks(5) {
        for v in leaving {
            app.leave("sale", v).await;
        }
        next_refresh(&driver, "sale").await;
    }
    for _ in 0..30 {
        visitors.push(app.join("sale").await);
    }

    // The capacity control reaches the engine, even when the operator
    // looks elsewhere and the figures refresh before they press the button.
    driver.type_into("#cap-input-sale", "7").await;
    driver.click("#room-sale h2").await;
    next_refresh(&driver, "sale").await;
    driver.click("#cap-set-sale").await;
    let engine = backend.engine_room(&RoomId::new("sale").unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.settings().capacity != 7 {
        assert!(
            Instant::now() < deadline,
            "the capacity change never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(engine.ledger().capacity, 7);
    driver
        .wait_until(
            "the page shows the new capacity",
            "return document.getElementById('cap-sale').textContent === 'capacity 7'",
        )
        .await;

    // Pause from the page, too.
    driver.click("#pause-sale").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !engine.settings().paused {
        assert!(Instant::now() < deadline, "pause never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver
        .wait_until(
            "the badge says paused and the charts have lines",
            "return document.getElementById('state-sale').textContent === 'paused' && \
             document.querySelectorAll('#chart-queue-sale path.line').length === 1 && \
             document.querySelectorAll('#chart-admitted-sale path.line').length === 2",
        )
        .await;
    // The picture shows the pause on the charts too.
    next_refresh(&driver, "sale").await;
    driver
        .script("document.getElementById('room-sale').scrollIntoView()")
        .await;
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/e2e/dashboard.png");
    driver.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);

    // A choice in the mode selector taken back with Escape shows the room's
    // mode again. The first Escape closes the list, which the click on it
    // opened and WebDriver's pick of an option leaves open; the second
    // takes the choice back (or does nothing if it already had).
    driver.choose("#mode-sale", "passthrough").await;
    driver.press(Key::Escape).await;
    driver.press(Key::Escape).await;
    driver
        .wait_until(
            "Escape puts the room's mode back",
            "return document.getElementById('mode-sale').value === 'queue'",
        )
        .await;

    // The mode selector switches the room live, and the badge says so. What
    // the operator picked stays picked while the page refreshes around it,
    // with the focus on the list or elsewhere, until they press the button.
    driver.choose("#mode-sale", "maintenance").await;
    next_refresh(&driver, "sale").await;
    driver.click("#room-sale h2").await;
    next_refresh(&driver, "sale").await;
    assert_eq!(
        driver
            .script("return document.getElementById('mode-sale').value")
            .await,
        "maintenance"
    );
    driver.click("#mode-set-sale").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.mode() != Mode::Maintenance {
        assert!(Instant::now() < deadline, "the mode change never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    driver
        .wait_until(
            "the badge shows the mode",
            "return document.getElementById('state-sale').textContent === 'maintenance' && \
             document.getElementById('mode-sale').value === 'maintenance'",
        )
        .await;

    // Forgetting the token returns to the form.
    driver.click("#signout").await;
    driver
        .wait_until(
            "the token is forgotten",
            "return sessionStorage.getItem('narabu_admin_token') === null && \
             !document.getElementById('login').hidden",
        )
        .await;
    driver.quit().await;
    app.stop().await;
}

/// Samples on the room's queue chart: one more each time the stream
/// brings an update (a change made from the page redraws the same ones).
fn samples_drawn(room: &str) -> String {
    format!(
        "(function () {{ var p = document.querySelector('#chart-queue-{room} path.line'); \
         return p ? (p.getAttribute('d').match(/[ML]/g) || []).length : 0; }})()"
    )
}

/// Waits until the page has redrawn the room from an update it had not
/// received when this was called.
async fn next_refresh(driver: &Driver, room: &str) {
    let drawn = samples_drawn(room);
    let seen = driver.script(&format!("return {drawn}")).await;
    driver
        .wait_until(
            "the page refreshes from the stream",
            &format!("return {drawn} > {seen}"),
        )
        .await;
}

/// The sale's report on the dashboard: a button on the room opens it with
/// its figures and two charts (joins and admissions per minute, waits by
/// place in line), drawn from the report the admin API serves. A
/// screenshot is saved to `target/e2e/report.png`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sale_report_shows_its_figures_and_charts() {
    let mut sale = room("sale", 4);
    sale.tick = std::time::Duration::from_millis(100);
    sale.join_limit_per_minute = 0;
    let backend = EmbeddedBackend::new(vec![sale], Arc::new(SystemClock));
    let app = spawn_with(config(), backend.clone()).await;
    let mut visitors = Vec::new();
    for _ in 0..30 {
        visitors.push(app.join("sale").await);
    }
    // Admitted ones give their permits back as the line moves.
    let id = RoomId::new("sale").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut released = 0;
    while released < 12 {
        assert!(Instant::now() < deadline, "the line never moved");
        for v in &visitors {
            if app.status("sale", v).await["status"] == "admitted" {
                let claim = narabu::token::Keyring::from_secrets(
                    &narabu::config::Secret::new(narabu_testkit::app::SECRET),
                    None,
                )
                .verify(&v.token)
                .unwrap();
                let t = narabu::backend::TicketRef {
                    epoch: claim.epoch,
                    id: claim.ticket,
                };
                if backend.release(&id, t).await.is_ok() {
                    released += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    app.leave("sale", &visitors[29]).await;

    let driver = Driver::start().await;
    driver.goto(&app.url("/admin")).await;
    driver
        .wait_until(
            "the login form shows",
            "return !document.getElementById('login').hidden",
        )
        .await;
    driver.type_into("#token", ADMIN_TOKEN).await;
    driver.click("#login-submit").await;
    driver
        .wait_until(
            "the room appears",
            "return !!document.getElementById('report-open-sale')",
        )
        .await;
    driver.click("#report-open-sale").await;
    driver
        .wait_until(
            "the report shows its figures and both charts with bars",
            "var t = document.getElementById('report-figures-sale'); \
             return !!t && /Admissions/.test(t.textContent) && \
             document.querySelectorAll('#report-timeline-sale rect.bar').length >= 2 && \
             document.querySelectorAll('#report-waits-sale rect.bar').length >= 3",
        )
        .await;
    let figures = driver
        .script("return document.getElementById('report-figures-sale').textContent")
        .await;
    let figures = figures.as_str().unwrap();
    assert!(figures.contains("Joins30"), "{figures}");
    assert!(figures.contains("0 unexplained"), "{figures}");
    driver
        .script("document.getElementById('report-sale').scrollIntoView()")
        .await;
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/e2e/report.png");
    driver.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    driver.quit().await;
    app.stop().await;
}
