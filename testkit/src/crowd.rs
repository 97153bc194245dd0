//! An origin that slows down with the crowd it serves, and a crowd to
//! send through a room to it: what autotune is tested and measured against.
//!
//! [`Origin`] is a real HTTP server on a free loopback port that shares
//! its time between the requests in flight: up to `knee` at once each
//! takes `base`; past it each takes `base × in_flight / knee` (a server
//! with `knee` workers, its throughput flat past the knee and its latency
//! growing with the crowd). It can be told to fail (`503` to every page).
//! It keeps the time each page took, for the test's own percentiles, and
//! shows them as a Prometheus histogram at `/metrics`.
//!
//! [`Crowd`] keeps a line of visitors waiting in a room; each, once
//! admitted, loads `pages` pages from the origin one after another and
//! leaves. It drives the room's worker itself (a tick every 50 ms), so it
//! runs the same over either backend the suite uses.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use narabu::backend::{Backend, JoinRequest};
use narabu::engine::{RoomId, TicketState};
use serde_json::{Value, json};

/// The origin's shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// A page's time while no more than `knee` are in flight.
    pub base: Duration,
    /// Requests served at once before each slows the others down.
    pub knee: u32,
}

/// The histogram's bounds at `/metrics` (seconds).
const BOUNDS: [f64; 12] = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.5, 5.0];

struct OriginState {
    shape: Shape,
    in_flight: AtomicU64,
    failing: AtomicBool,
    /// (finished at, took) of every page.
    served: Mutex<Vec<(Instant, Duration)>>,
    started: Instant,
}

pub struct Origin {
    /// `http://127.0.0.1:port`
    pub base: String,
    state: Arc<OriginState>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Counts a page in flight until it is answered or its client goes away
/// (a timed-out probe drops the handler mid-sleep).
struct InFlight(Arc<OriginState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn page(State(s): State<Arc<OriginState>>) -> (StatusCode, &'static str) {
    let started = Instant::now();
    let n = s.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
    let _in_flight = InFlight(s.clone());
    // Time-shared: the crowd's size when the page starts sets its pace.
    let knee = u64::from(s.shape.knee.max(1));
    let took = s.shape.base.mul_f64(n.max(knee) as f64 / knee as f64);
    tokio::time::sleep(took).await;
    s.served
        .lock()
        .unwrap()
        .push((Instant::now(), started.elapsed()));
    if s.failing.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "failing")
    } else {
        (StatusCode::OK, "a page")
    }
}

async fn metrics(State(s): State<Arc<OriginState>>) -> String {
    let served = s.served.lock().unwrap();
    let mut out = String::from("# TYPE origin_page_seconds histogram\n");
    for le in BOUNDS {
        let n = served.iter().filter(|(_, d)| d.as_secs_f64() <= le).count();
        out.push_str(&format!("origin_page_seconds_bucket{{le=\"{le}\"}} {n}\n"));
    }
    let sum: f64 = served.iter().map(|(_, d)| d.as_secs_f64()).sum();
    out.push_str(&format!(
        "origin_page_seconds_bucket{{le=\"+Inf\"}} {n}\norigin_page_seconds_sum {sum}\norigin_page_seconds_count {n}\n",
        n = served.len()
    ));
    out
}

impl Origin {
    pub async fn start(shape: Shape) -> Self {
        let state = Arc::new(OriginState {
            shape,
            in_flight: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            served: Mutex::new(Vec::new()),
            started: Instant::now(),
        });
        let app = Router::new()
            .route("/page", get(page))
            .route("/metrics", get(metrics))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base,
            state,
            server,
        }
    }

    /// Answer every page with `503` (`true`) or as usual.
    pub fn fail(&self, failing: bool) {
        self.state.failing.store(failing, Ordering::Release);
    }

    /// The `q` quantile of the pages finished in the last `within`, and
    /// how many there were.
    pub fn quantile(&self, q: f64, within: Duration) -> (Option<Duration>, usize) {
        let served = self.state.served.lock().unwrap();
        let from = Instant::now()
            .checked_sub(within)
            .unwrap_or(self.state.started);
        let mut took: Vec<Duration> = served
            .iter()
            .filter(|(at, _)| *at >= from)
            .map(|(_, d)| *d)
            .collect();
        took.sort();
        let n = took.len();
        if n == 0 {
            return (None, 0);
        }
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        (Some(took[rank - 1]), n)
    }
}

/// The origin the autotune test and figures use: 100 ms a page up to 4
/// in flight (40 pages a second at most).
pub const SHAPE: Shape = Shape {
    base: Duration::from_millis(100),
    knee: 4,
};

/// A room (`PUT` body) of capacity 1000 admitting `start` a minute, tuned
/// between `bounds` to a p95 of `target_ms` from a probe of the origin's
/// page and its `/metrics` histogram, judging every second; `bounds`
/// `None` leaves autotune off (a fixed rate).
pub fn room_body(origin: &Origin, start: u64, target_ms: u64, bounds: Option<(u64, u64)>) -> Value {
    let mut body = json!({ "capacity": 1000, "admit_per_minute": start });
    if let Some((min_rate, max_rate)) = bounds {
        body["autotune"] = json!({
            "min_rate": min_rate,
            "max_rate": max_rate,
            "target_latency": format!("{target_ms}ms"),
            "quantile": 0.95,
            "max_error_ratio": 0.05,
            "interval": "1s",
            "step": 0.25,
            "min_samples": 3,
            "probe": { "url": format!("{}/page", origin.base), "every": "200ms", "window": "5s" },
            "metrics": {
                "url": format!("{}/metrics", origin.base),
                "histogram": "origin_page_seconds",
                "every": "500ms",
                "window": "5s",
            },
        });
    }
    body
}

/// The crowd's figures so far.
#[derive(Debug, Default)]
pub struct Counts {
    pub joined: AtomicU64,
    pub admitted: AtomicU64,
    pub done: AtomicU64,
    /// Admitted visitors whose ticket ended otherwise than by their own
    /// leaving (revoked, expired): autotune must never cause one.
    pub lost: AtomicU64,
}

/// Visitors kept waiting in a room, visiting the origin once admitted.
pub struct Crowd {
    pub counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Crowd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.driver.abort();
    }
}

impl Crowd {
    /// Keep `waiting` visitors in line in `room`; each admitted one loads
    /// `pages` pages of `origin` in turn and leaves.
    pub fn start(
        backend: Arc<dyn Backend>,
        room: &str,
        origin: &str,
        waiting: u64,
        pages: u32,
    ) -> Self {
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let room = RoomId::new(room).unwrap();
        let url = format!("{origin}/page");
        let client = reqwest::Client::new();
        let driver = {
            let (counts, stop) = (counts.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                while !stop.load(Ordering::Acquire) {
                    tick.tick().await;
                    let _ = backend.tick(&room).await;
                    let in_line = counts
                        .joined
                        .load(Ordering::Acquire)
                        .saturating_sub(counts.admitted.load(Ordering::Acquire));
                    for _ in in_line..waiting {
                        counts.joined.fetch_add(1, Ordering::AcqRel);
                        tokio::spawn(visit(
                            backend.clone(),
                            room.clone(),
                            client.clone(),
                            url.clone(),
                            pages,
                            counts.clone(),
                            stop.clone(),
                        ));
                    }
                }
            })
        };
        Self {
            counts,
            stop,
            driver,
        }
    }
}

async fn visit(
    backend: Arc<dyn Backend>,
    room: RoomId,
    client: reqwest::Client,
    url: String,
    pages: u32,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) {
    let Ok(joined) = backend.join(&room, JoinRequest::anonymous()).await else {
        counts.admitted.fetch_add(1, Ordering::AcqRel); // out of the line
        return;
    };
    let ticket = joined.ticket;
    let Ok(signal) = backend.watch_ticket(&room, ticket).await else {
        return;
    };
    loop {
        let armed = signal.arm();
        match backend.status(&room, ticket, true).await.map(|s| s.state) {
            Ok(TicketState::Admitted) => break,
            Ok(TicketState::Waiting | TicketState::Away) => {}
            _ => {
                counts.admitted.fetch_add(1, Ordering::AcqRel);
                return;
            }
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), armed).await;
    }
    counts.admitted.fetch_add(1, Ordering::AcqRel);
    for _ in 0..pages {
        if stop.load(Ordering::Acquire) {
            return;
        }
        if let Ok(r) = client.get(&url).send().await {
            let _ = r.bytes().await;
        }
        // Still holding the permit between pages.
        match backend.status(&room, ticket, true).await.map(|s| s.state) {
            Ok(TicketState::Admitted) => {}
            _ => {
                counts.lost.fetch_add(1, Ordering::AcqRel);
                return;
            }
        }
    }
    let _ = backend.leave(&room, ticket).await;
    counts.done.fetch_add(1, Ordering::AcqRel);
}
