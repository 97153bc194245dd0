//! Autotune's figures: how long the tuner takes to settle from a rate far
//! too high and one far too low, the origin's p95 after settling, and the
//! rate it admits against the best fixed rate a sweep of the same origin
//! finds. The origin is the tests' (`narabu_testkit::crowd`: pages slow
//! down past a knee in the crowd they serve), the server runs in this
//! process on the embedded backend, and a crowd of visitors keeps the line
//! full and loads four pages each once admitted.
//!
//! ```text
//! cargo run --release --example autotune             # the figures
//! SWEEP_SECONDS=5 RUN_SECONDS=40 cargo run --example autotune   # a smoke run
//! ```
//!
//! Prints a Markdown table (`scripts/bench-autotune` wraps it with the
//! machine's load). With `TRACE` set, each tuned run also writes a line a
//! second to stderr: the start, the second, the origin's p95 over the last
//! five seconds (ms), the tuner's last reading (ms) and verdict, the rate,
//! and the visitors admitted so far, to chart how the rate moved. Measure on a quiet machine: the origin's latencies are
//! timers, but a busy machine delays them.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use narabu_testkit::app::{ADMIN_TOKEN, TestApp, config, spawn_app_with};
use narabu_testkit::crowd::{Crowd, Origin, SHAPE, room_body};

const TARGET_MS: u64 = 400;
const MIN_RATE: u64 = 30;
const MAX_RATE: u64 = 1800;
/// The window of a "p95 now": the last five seconds of pages.
const NOW: Duration = Duration::from_secs(5);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh origin, server and crowd with the room `body` builds.
async fn run(body: impl FnOnce(&Origin) -> serde_json::Value) -> (TestApp, Origin, Crowd) {
    let origin = Origin::start(SHAPE).await;
    let app = spawn_app_with(config(), Vec::new()).await;
    let put = app
        .client
        .put(app.url("/admin/rooms/tuned"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body(&origin))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    let crowd = Crowd::start(app.backend.clone(), "tuned", &origin.base, 40, 4);
    (app, origin, crowd)
}

/// At a fixed rate for `secs` (the first third a warm-up): the origin's
/// p95 and the admissions a minute over the rest.
async fn fixed(rate: u64, secs: u64) -> (Duration, f64) {
    let (app, origin, crowd) = run(|o| room_body(o, rate, TARGET_MS, None)).await;
    let warm = Duration::from_secs(secs / 3);
    tokio::time::sleep(warm).await;
    let before = crowd.counts.admitted.load(Ordering::Acquire);
    let measured = Duration::from_secs(secs) - warm;
    tokio::time::sleep(measured).await;
    let admitted = crowd.counts.admitted.load(Ordering::Acquire) - before;
    let (p95, _) = origin.quantile(0.95, measured);
    drop(crowd);
    app.stop().await;
    (
        p95.unwrap_or_default(),
        admitted as f64 * 60.0 / measured.as_secs_f64(),
    )
}

struct Tuned {
    /// Seconds until, for the rest of the run, the p95 of the last five
    /// seconds stayed under the target and the tuner's rate within a
    /// quarter of where it ended; `None`: it never did (with ten seconds
    /// to spare).
    settled_after: Option<u64>,
    p95_after: Option<Duration>,
    admitted_per_minute: f64,
    rate_at_end: u64,
}

async fn tuned(start: u64, secs: u64) -> Tuned {
    let (app, origin, crowd) =
        run(|o| room_body(o, start, TARGET_MS, Some((MIN_RATE, MAX_RATE)))).await;
    let target = Duration::from_millis(TARGET_MS);
    let trace = std::env::var_os("TRACE").is_some();
    // Each second: admitted so far, the p95 of the last five seconds,
    // the rate the tuner keeps.
    let mut seconds = Vec::new();
    let started = Instant::now();
    for s in 1..=secs {
        tokio::time::sleep_until((started + Duration::from_secs(s)).into()).await;
        let (p95, _) = origin.quantile(0.95, NOW);
        let room = app.admin_room("tuned").await;
        let rate = room["settings"]["admit_per_minute"].as_u64().unwrap_or(0);
        if trace {
            let a = &room["autotune"];
            eprintln!(
                "{start}\t{s}\t{}\t{}\t{}\t{rate}\t{}",
                p95.map_or(0, |p| p.as_millis()),
                a["latency_ms"].as_f64().map_or(0.0, f64::round),
                a["verdict"].as_str().unwrap_or("-"),
                crowd.counts.admitted.load(Ordering::Acquire),
            );
        }
        seconds.push((crowd.counts.admitted.load(Ordering::Acquire), p95, rate));
    }
    let rate_at_end = seconds.last().map_or(0, |s| s.2);
    let near_end = |r: u64| r.abs_diff(rate_at_end) * 4 <= rate_at_end;
    let good =
        |(_, p, r): &(u64, Option<Duration>, u64)| p.is_some_and(|p| p <= target) && near_end(*r);
    let settled = (0..seconds.len())
        .find(|&i| seconds[i..].iter().all(good))
        .filter(|&i| i + 10 < seconds.len());
    let (p95_after, admitted_per_minute) = match settled {
        Some(i) => {
            let stretch = Duration::from_secs((seconds.len() - i) as u64);
            let (p95, _) = origin.quantile(0.95, stretch);
            let admitted = seconds[seconds.len() - 1].0 - seconds[i].0;
            (p95, admitted as f64 * 60.0 / stretch.as_secs_f64())
        }
        None => (None, 0.0),
    };
    drop(crowd);
    app.stop().await;
    Tuned {
        settled_after: settled.map(|i| i as u64 + 1),
        p95_after,
        admitted_per_minute,
        rate_at_end,
    }
}

#[tokio::main]
async fn main() {
    let sweep_secs = env("SWEEP_SECONDS", 30);
    let run_secs = env("RUN_SECONDS", 180);
    let target = Duration::from_millis(TARGET_MS);
    println!(
        "Origin: {} ms a page up to {} in flight, time-shared past that; 4 pages a visit; target p95 {TARGET_MS} ms\n",
        SHAPE.base.as_millis(),
        SHAPE.knee
    );
    println!("| fixed rate (a minute) | origin p95 | admitted a minute |\n|---|---|---|");
    let mut best = 0.0f64;
    for rate in (120..=780).step_by(60) {
        let (p95, admitted) = fixed(rate, sweep_secs).await;
        println!("| {rate} | {p95:.0?} | {admitted:.0} |");
        if p95 <= target {
            best = best.max(admitted);
        }
    }
    println!("\nBest fixed rate under the target: {best:.0} admitted a minute\n");
    println!(
        "| tuned from | settled after | origin p95 after | admitted a minute after | ÷ best fixed | rate at the end |\n|---|---|---|---|---|---|"
    );
    for (name, start) in [("far too high", MAX_RATE), ("far too low", MIN_RATE)] {
        let t = tuned(start, run_secs).await;
        let settled = t
            .settled_after
            .map_or("not within the run".to_owned(), |s| format!("{s} s"));
        let ratio = if best > 0.0 {
            format!("{:.2}", t.admitted_per_minute / best)
        } else {
            "–".to_owned()
        };
        println!(
            "| {name} ({start}/min) | {settled} | {:.0?} | {:.0} | {ratio} | {} |",
            t.p95_after.unwrap_or_default(),
            t.admitted_per_minute,
            t.rate_at_end
        );
    }
}
