//! Join throughput, measured, never asserted: one embedded instance, one
//! and three instances on one Redis, and a trivial axum handler in the same
//! run as the yardstick (throughput is always reported as a ratio to it). Run with
//! `cargo test --release --test redis measure -- --ignored --nocapture`.
//! The cost of waiting for a replica (`redis_wait_replicas`) is measured
//! the same way, 0 against 1 in one run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use narabu::backend::Backend;
use narabu::backend::embedded::EmbeddedBackend;
use narabu::backend::redis::RedisOptions;
use narabu::config::{Config, Secret};
use narabu::engine::SystemClock;

use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;

const CLIENTS: usize = 64;
const RUN: Duration = Duration::from_secs(4);

async fn serve(backend: Arc<dyn Backend>) -> String {
    let mut sale = room("sale", 100);
    sale.join_limit_per_minute = 0;
    let config = Config {
        secret: Some(Secret::new("test-secret-test-secret-test-secret-0123")),
        rooms: vec![sale],
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(narabu::server::serve(
        listener,
        config,
        backend,
        std::future::pending(),
    ));
    format!("http://{addr}")
}

async fn trivial() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", axum::routing::post(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

/// Requests per second over `CLIENTS` keep-alive clients spread over `urls`.
async fn rate(urls: Vec<String>) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let url = urls[i % urls.len()].clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            while start.elapsed() < RUN {
                let r = c.post(&url).send().await.unwrap();
                let status = r.status();
                assert!(
                    status.is_success(),
                    "{status} {}",
                    r.text().await.unwrap_or_default()
                );
                let _ = r.bytes().await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: run by hand in release mode"]
async fn measure_join_rates() {
    let trivial_rate = rate(vec![trivial().await]).await;

    let mut sale = room("sale", 100);
    sale.join_limit_per_minute = 0;
    let embedded = EmbeddedBackend::new(vec![sale.clone()], Arc::new(SystemClock));
    let base = serve(embedded).await;
    let embedded_rate = rate(vec![format!("{base}/api/rooms/sale/join")]).await;

    let redis = RedisServer::start().await;
    let mut urls = Vec::new();
    for _ in 0..3 {
        let b = narabu::backend::redis::connect(
            RedisOptions::new(redis.url()),
            vec![sale.clone()],
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
        urls.push(format!("{}/api/rooms/sale/join", serve(b).await));
    }
    let one_redis = rate(vec![urls[0].clone()]).await;
    let three_redis = rate(urls).await;
    println!("trivial handler:        {trivial_rate:>9.0} req/s");
    println!(
        "joins, embedded, 1:     {embedded_rate:>9.0} /s  ({:.2} x trivial)",
        embedded_rate / trivial_rate
    );
    println!(
        "joins, redis, 1 inst.:  {one_redis:>9.0} /s  ({:.2} x trivial, {:.2} x embedded)",
        one_redis / trivial_rate,
        one_redis / embedded_rate
    );
    println!(
        "joins, redis, 3 inst.:  {three_redis:>9.0} /s  ({:.2} x trivial, {:.2} x embedded)",
        three_redis / trivial_rate,
        three_redis / embedded_rate
    );
}

/// Stock reports racing on one Redis: reports a second and how many
/// compare-and-set calls of `purchase.lua` each report took (1.0 = no
/// retry), with one instance and with three, 64 reporters in all.
/// Run with `cargo test --release --test redis measure_purchases -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: run by hand in release mode"]
async fn measure_purchases_under_contention() {
    use narabu::engine::RoomId;

    let mut sale = room("sale", 100);
    sale.stock = Some(u64::MAX >> 24);
    let redis = RedisServer::start().await;
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for _ in 0..3 {
        let options = RedisOptions {
            run_workers: false,
            ..RedisOptions::new(redis.url())
        };
        backends.push(
            narabu::backend::redis::connect(options, vec![sale.clone()], Arc::new(SystemClock))
                .await
                .unwrap(),
        );
    }
    let mut con = redis.client().await;
    for instances in [1, 3] {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut con)
            .await
            .unwrap();
        let done = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..CLIENTS {
            let b = backends[i % instances].clone();
            let done = done.clone();
            tasks.push(tokio::spawn(async move {
                let room = RoomId::new("sale").unwrap();
                while start.elapsed() < RUN {
                    b.purchase(&room, 1).await.unwrap().unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let reports = done.load(Ordering::Relaxed);
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .unwrap();
        // A batch of the room's log is one XADD, whatever it holds.
        let calls = |cmd: &str| -> u64 {
            info.lines()
                .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
                .and_then(|l| l.split("calls=").nth(1))
                .and_then(|v| v.split(',').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let appends = calls("xadd");
        println!(
            "purchases, redis, {instances} inst., {CLIENTS} reporters: {:>7.0} /s, {:.2} appends a report ({appends} for {reports}), {} scripts",
            reports as f64 / start.elapsed().as_secs_f64(),
            appends as f64 / reports.max(1) as f64,
            calls("evalsha"),
        );
    }
}

/// Joins per second straight through a backend (no HTTP: the figure is
/// what waiting for a replica costs the store's side), `CLIENTS` at once.
async fn backend_rate(b: Arc<dyn Backend>) -> f64 {
    use narabu::backend::JoinRequest;
    use narabu::engine::RoomId;
    let room = RoomId::new("sale").unwrap();
    // Warm: this instance follows the room before the clock starts.
    b.join(&room, JoinRequest::anonymous()).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (b, room, done) = (b.clone(), room.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while start.elapsed() < RUN {
                b.join(&room, JoinRequest::anonymous()).await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: run by hand in release mode"]
async fn measure_join_rates_waiting_for_a_replica() {
    use narabu::config::RedisWait;
    use narabu_testkit::redis_ha::{replicated, wait_in_sync};

    let mut sale = room("sale", 100);
    sale.join_limit_per_minute = 0;
    let primary = RedisServer::start().await;
    let replica = RedisServer::start_replica_of(primary.port).await;
    wait_in_sync(&replica, Duration::from_secs(30)).await;
    replicated(&primary, "probe", 1).await;
    let mut rates = Vec::new();
    for replicas in [0, 1, 0, 1] {
        let options = RedisOptions {
            wait: RedisWait {
                replicas,
                timeout: RedisWait::DEFAULT_TIMEOUT,
            },
            run_workers: false,
            ..RedisOptions::new(primary.url())
        };
        let b = narabu::backend::redis::connect(options, vec![sale.clone()], Arc::new(SystemClock))
            .await
            .unwrap();
        rates.push((replicas, backend_rate(b.clone()).await));
        b.shutdown().await;
    }
    for (replicas, r) in &rates {
        println!("joins through the backend, redis + 1 replica, wait {replicas}: {r:>8.0} /s");
    }
    let mean = |n: u32| {
        let v: Vec<f64> = rates.iter().filter(|r| r.0 == n).map(|r| r.1).collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    println!(
        "waiting for 1 replica: {:.2} x the joins per second of not waiting",
        mean(1) / mean(0)
    );
}

/// The Redis CPU an owner's log costs per join, as the Redis process
/// reports it (`INFO cpu`), for batches of 1 to 128 join records appended
/// by the fenced step from 48 connections at once, against a join of
/// today's Redis backend (its join script, 48 callers at once) measured
/// first in the same run. Each record is a real join record as the
/// engine's journal encodes it. Run with
/// `cargo test --release --test redis measure_log_appends -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread")]
#[ignore]
async fn measure_log_appends() {
    use narabu::backend::redis::store::RedisStore;
    use narabu::backend::store::RoomStore;
    use narabu::engine::{EventRecord, RoomId};

    const CONNECTIONS: usize = 48;
    let redis = RedisServer::start().await;
    let sale = RoomId::new("sale").unwrap();
    let record = |ticket: u32| {
        postcard::to_allocvec(&EventRecord::Joined {
            ticket,
            identity: Some(u128::from(ticket) << 64),
            lane: 0,
            index: Some(ticket),
            ahead: ticket,
            at: 1_790_000_000_000,
        })
        .unwrap()
    };
    {
        let mut joins = room("sale", 100);
        joins.join_limit_per_minute = 0;
        let backend = Arc::new(
            narabu::backend::redis::connect(
                RedisOptions::new(redis.url()),
                vec![joins],
                Arc::new(SystemClock),
            )
            .await
            .unwrap(),
        );
        let before = redis_cpu(&redis).await;
        let joined = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..CONNECTIONS {
            let (backend, sale, joined) = (backend.clone(), sale.clone(), joined.clone());
            tasks.push(tokio::spawn(async move {
                while start.elapsed() < RUN {
                    backend
                        .join(&sale, narabu::backend::JoinRequest::anonymous())
                        .await
                        .unwrap();
                    joined.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = redis_cpu(&redis).await - before;
        let joins = joined.load(Ordering::Relaxed) as f64;
        println!(
            "join script (today's Redis backend): {:>9.0} joins/s, Redis CPU {:.2} µs per join",
            joins / secs,
            cpu * 1e6 / joins
        );
        backend.shutdown().await;
    }
    for batch in [1usize, 8, 32, 128] {
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut redis.client().await)
            .await
            .unwrap();
        // A room per connection: each log has one writer, which numbers
        // its own appends, as an owner does.
        let mut owners = Vec::new();
        for c in 0..CONNECTIONS {
            let room = RoomId::new(&format!("sale-{c}")).unwrap();
            let store = RedisStore::new(redis.client().await, redis.client().await);
            let fence = store
                .acquire(&room, "owner", Duration::from_secs(60))
                .await
                .unwrap()
                .unwrap();
            owners.push((store, room, fence));
        }
        let before = redis_cpu(&redis).await;
        let appended = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (c, (store, room, fence)) in owners.into_iter().enumerate() {
            let appended = appended.clone();
            let bytes: Vec<u8> = (0..batch)
                .flat_map(|i| record((c * batch + i) as u32))
                .collect();
            tasks.push(tokio::spawn(async move {
                let mut after = fence.mark;
                while start.elapsed() < RUN {
                    after = store.append(&room, &fence, after, &bytes).await.unwrap();
                    appended.fetch_add(batch as u64, Ordering::Relaxed);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = redis_cpu(&redis).await - before;
        let joins = appended.load(Ordering::Relaxed) as f64;
        println!(
            "batch {batch:>3}: {:>9.0} join records/s, Redis CPU {:.2} µs per join ({} bytes a record)",
            joins / secs,
            cpu * 1e6 / joins,
            record(1_000).len(),
        );
    }
}

/// The Redis process's CPU seconds so far (user + system).
async fn redis_cpu(redis: &RedisServer) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut redis.client().await)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_user:")
                .or_else(|| l.strip_prefix("used_cpu_sys:"))
        })
        .map(|v| v.trim().parse::<f64>().unwrap())
        .sum()
}
