//! A quick join-throughput probe over HTTP, for comparing
//! `durability = "fsync"` with `"off"` until the loadtest crate
//! covers it: `cargo run --release --example join_rate -- URL ROOM
//! CONNECTIONS SECONDS` against a running `narabu serve`. Prints joins per
//! second (201 answers only).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = args
        .get(1)
        .cloned()
        .unwrap_or("http://127.0.0.1:8080".into());
    let room = args.get(2).cloned().unwrap_or("default".into());
    let conns: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let secs: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(5);
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let http = reqwest::Client::new();
    let url = format!("{base}/api/rooms/{room}/join");
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let (http, url, ok, failed) = (http.clone(), url.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    match http.post(&url).send().await {
                        Ok(r) if r.status().as_u16() == 201 => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    let start = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = ok.load(Ordering::Relaxed);
    println!(
        "{n} joins in {elapsed:.2}s = {:.0} joins/s ({} failed, {conns} connections)",
        n as f64 / elapsed,
        failed.load(Ordering::Relaxed)
    );
}
