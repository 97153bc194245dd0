//! `streams`: K visitors wait on their event streams. The tool reports the
//! server's memory per open stream (growth of its resident memory, read
//! from `/proc/PID/status`, divided by K), how long one room-view change
//! takes to reach every stream, and how fast a hand-off reaches the next
//! visitor's stream while they are all open.
//!
//! A process may open at most 20,000 files here, so the tool splits the
//! streams over several client processes — itself, re-executed with the
//! hidden `stream-worker` command and driven over stdin/stdout — each
//! connecting from its own source address (127.0.0.2, 127.0.0.3, …) so the
//! connections fit in the ephemeral port range. With `--workers 0` the
//! streams are tasks of this process (the tests use that).
//!
//! The sequence: `capacity` holders join and are admitted; K stream
//! visitors join behind them, then `--prefill` tickets without streams;
//! the streams open; a holder leaves, which hands its permit to stream 0
//! at once and changes every other visitor's position at the next tick
//! (the fan-out); then each newly admitted visitor leaves in turn, handing
//! off down the line (the hand-off latencies).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::api::Api;
use crate::cli::{StreamsArgs, default_workers};
use crate::http::{Conn, EventStream};
use crate::progress;
use crate::report::Report;
use crate::stats::Summary;

/// Streams connecting at once per client process: more would overflow
/// the server's accept backlog and cost retransmit delays, not speed.
const CONNECT_AT_ONCE: usize = 256;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    pub addr: SocketAddr,
    pub host: String,
    pub room: String,
    pub source: Option<IpAddr>,
}

/// What a worker tells the parent.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerMsg {
    /// Streams opened so far (progress).
    Opened(usize),
    /// Every stream is open and has had its first event (or failed).
    Ready { opened: usize, failed: usize },
    /// An event after `Ready`: stream index (the worker's own), name,
    /// wall-clock receive time (µs) and the server's `updated_at` (ms).
    Event {
        idx: usize,
        kind: String,
        recv_us: u64,
        updated_ms: Option<u64>,
    },
}

impl WorkerMsg {
    pub fn to_line(&self) -> String {
        match self {
            WorkerMsg::Opened(n) => format!("O {n}"),
            WorkerMsg::Ready { opened, failed } => format!("R {opened} {failed}"),
            WorkerMsg::Event {
                idx,
                kind,
                recv_us,
                updated_ms,
            } => format!(
                "E {idx} {kind} {recv_us} {}",
                updated_ms.map_or("-".to_owned(), |u| u.to_string())
            ),
        }
    }

    pub fn parse(line: &str) -> Option<Self> {
        let mut p = line.split_whitespace();
        match p.next()? {
            "O" => Some(WorkerMsg::Opened(p.next()?.parse().ok()?)),
            "R" => Some(WorkerMsg::Ready {
                opened: p.next()?.parse().ok()?,
                failed: p.next()?.parse().ok()?,
            }),
            "E" => Some(WorkerMsg::Event {
                idx: p.next()?.parse().ok()?,
                kind: p.next()?.to_owned(),
                recv_us: p.next()?.parse().ok()?,
                updated_ms: match p.next()? {
                    "-" => None,
                    u => Some(u.parse().ok()?),
                },
            }),
            _ => None,
        }
    }
}

pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The server's `updated_at` (RFC 3339) as Unix milliseconds.
pub fn updated_ms(data: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(data).ok()?;
    let ts: jiff::Timestamp = v.get("updated_at")?.as_str()?.parse().ok()?;
    u64::try_from(ts.as_millisecond()).ok()
}

/// One client's streams: open them all, report when each has had its
/// first event, then report every later event until `stop` completes.
pub async fn worker_core(
    cfg: WorkerConfig,
    tokens: Vec<String>,
    out: mpsc::UnboundedSender<WorkerMsg>,
    stop: impl std::future::Future<Output = ()>,
) {
    let api = Api {
        addr: cfg.addr,
        host: cfg.host.clone(),
        room: cfg.room.clone(),
    };
    let n = tokens.len();
    let gate = Arc::new(tokio::sync::Semaphore::new(CONNECT_AT_ONCE));
    let ready = Arc::new(AtomicBool::new(false));
    let (first, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::with_capacity(n);
    for (idx, token) in tokens.into_iter().enumerate() {
        let (api, gate, ready, first, failed, out) = (
            api.clone(),
            gate.clone(),
            ready.clone(),
            first.clone(),
            failed.clone(),
            out.clone(),
        );
        let source = cfg.source;
        tasks.push(tokio::spawn(async move {
            let mut permit = Some(gate.acquire_owned().await);
            let opened = async {
                let mut conn = Conn::connect(api.addr, source).await.ok()?;
                let head = conn.open(&api.events_request(&token)).await.ok()?;
                (head.status == 200).then(|| EventStream::new(conn, &head))
            };
            let Some(mut stream) = opened.await else {
                failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut got_first = false;
            loop {
                let event = stream.next_event().await;
                let recv_us = unix_us();
                let Ok(Some(e)) = event else {
                    if !got_first {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                };
                if !got_first {
                    got_first = true;
                    first.fetch_add(1, Ordering::Relaxed);
                    // The connect slot is freed once the stream is live.
                    permit.take();
                }
                if ready.load(Ordering::Acquire) {
                    let updated_ms = updated_ms(&e.data);
                    let _ = out.send(WorkerMsg::Event {
                        idx,
                        kind: e.event,
                        recv_us,
                        updated_ms,
                    });
                }
            }
        }));
    }
    loop {
        let (f, x) = (
            first.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
        );
        let _ = out.send(WorkerMsg::Opened(f));
        if f + x >= n {
            ready.store(true, Ordering::Release);
            let _ = out.send(WorkerMsg::Ready {
                opened: f,
                failed: x,
            });
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.await;
    for t in tasks {
        t.abort();
    }
}

/// The hidden `stream-worker` command: a JSON config line, tokens one a
/// line, `go`; then messages on stdout until stdin closes.
pub async fn worker_main() -> anyhow::Result<()> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let cfg: WorkerConfig = serde_json::from_str(&lines.next_line().await?.context("no config")?)?;
    let mut tokens = Vec::new();
    loop {
        match lines.next_line().await? {
            Some(l) if l == "go" => break,
            Some(l) => tokens.push(l),
            None => bail!("stdin closed before go"),
        }
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stop = async move { while let Ok(Some(_)) = lines.next_line().await {} };
    let core = tokio::spawn(worker_core(cfg, tokens, tx, stop));
    let mut stdout = tokio::io::BufWriter::new(tokio::io::stdout());
    while let Some(msg) = rx.recv().await {
        stdout.write_all(msg.to_line().as_bytes()).await?;
        stdout.write_all(b"\n").await?;
        if rx.is_empty() {
            stdout.flush().await?;
        }
    }
    let _ = core.await;
    Ok(())
}

/// A parent-side event, with the stream's global index.
#[derive(Debug, Clone)]
struct Ev {
    idx: usize,
    kind: String,
    recv_us: u64,
    updated_ms: Option<u64>,
}

/// A worker's streams once ready: (opened, failed).
type Opened = (usize, usize);

struct Workers {
    events: Arc<Mutex<Vec<Ev>>>,
    ready: Arc<Mutex<Vec<Option<Opened>>>>,
    opened: Arc<Vec<AtomicUsize>>,
    stops: Vec<Box<dyn FnOnce() + Send>>,
}

fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

async fn join_many(
    api: &Api,
    n: u64,
    connections: usize,
    label: &str,
) -> anyhow::Result<Vec<(u64, String)>> {
    let bar = progress::bar(n, label);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..connections.min(n as usize).max(1) {
        let (api, next, bar) = (api.clone(), next.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            let mut conn = api
                .connect(None)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            while next.fetch_add(1, Ordering::Relaxed) < n {
                if conn.broken {
                    conn = api
                        .connect(None)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                let t = api
                    .join(&mut conn)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                got.push((t.number, t.token));
                bar.inc(1);
            }
            anyhow::Ok(got)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    bar.finish_and_clear();
    all.sort_by_key(|(n, _)| *n);
    Ok(all)
}

pub async fn run(args: &StreamsArgs) -> anyhow::Result<Report> {
    let common = &args.common;
    let api = Api::new(&common.target, &common.room);
    let deadline = Instant::now() + crate::cli::secs(common.max_seconds);
    let k = args.streams;
    let workers = args.workers.unwrap_or_else(|| default_workers(k));
    let mut control = api
        .connect(None)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    // 1. Holders take every permit.
    let holders = join_many(&api, args.capacity as u64, 8, "holders").await?;
    let admitted_by = Instant::now() + Duration::from_secs(10);
    for (_, token) in &holders {
        loop {
            let s = api
                .status(&mut control, token)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if s["status"] == "admitted" {
                break;
            }
            if Instant::now() > admitted_by {
                bail!(
                    "a holder was not admitted within 10 s: is the room's capacity --capacity ({}), and is it open?",
                    args.capacity
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // 2. The stream visitors, in queue order; 3. tickets behind them.
    let visitors = join_many(&api, k as u64, 16, "stream tickets").await?;
    if args.prefill > 0 {
        join_many_discard(&api, args.prefill, 32).await?;
    }
    // Let the tick publish the joins before measuring.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rss_before = args.server_pid.and_then(resident_kib);

    // 4. Open the streams.
    let w = start_workers(&api, common, &visitors, workers).await?;
    let bar = progress::bar(k as u64, "streams open");
    loop {
        let n_ready = w
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .count();
        bar.set_position(
            w.opened
                .iter()
                .map(|o| o.load(Ordering::Relaxed) as u64)
                .sum(),
        );
        if n_ready == w.stops.len() {
            break;
        }
        if Instant::now() > deadline {
            bail!("the streams did not all open before --max-seconds");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish_and_clear();
    let (opened, failed) = w
        .ready
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .flatten()
        .fold((0, 0), |(o, f), (a, b)| (o + a, f + b));
    // Past the one-position-event-a-second throttle, and settled.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rss_after = args.server_pid.and_then(resident_kib);
    // Wait for a quiet spell: while the smoothed admission rate decays the
    // view changes every tick and each stream may just have had a
    // (throttled) event, which would time the throttle, not the fan-out.
    let quiet_for = Duration::from_millis(1200);
    let quiet_by = Instant::now() + crate::cli::secs(args.quiet_max_seconds);
    let quiet = loop {
        let last = w
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .rev()
            .find(|e| e.kind == "position")
            .map(|e| e.recv_us);
        let since = last.map_or(Duration::MAX, |t| {
            Duration::from_micros(unix_us().saturating_sub(t))
        });
        if since >= quiet_for {
            break true;
        }
        if Instant::now() > quiet_by || Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let first_status = api
        .status(&mut control, &visitors[0].1)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if first_status["status"] != "waiting" {
        bail!(
            "the first stream visitor is {} before any hand-off: the room's capacity is larger than --capacity {}",
            first_status["status"],
            args.capacity
        );
    }

    // 5. The fan-out: a holder leaves; stream 0 is admitted at once, and
    // everyone else's position changes at the next tick.
    let mark = w.events.lock().unwrap_or_else(|p| p.into_inner()).len();
    let t0 = unix_us();
    api.leave(&mut control, &holders[0].1)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let want = opened.saturating_sub(1);
    let fan_by = Instant::now() + Duration::from_secs(6);
    let fanout: HashMap<usize, (u64, Option<u64>)> = loop {
        let got = collect_positions(&w.events, mark, t0);
        if got.len() >= want || Instant::now() > fan_by || Instant::now() > deadline {
            // A little longer for stragglers once most arrived.
            break got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let reference_ms = fanout.values().filter_map(|(_, u)| *u).min();
    let fan_ms: Vec<f64> = match reference_ms {
        Some(r) => fanout
            .values()
            .map(|(recv, _)| *recv as f64 / 1000.0 - r as f64)
            .collect(),
        None => Vec::new(),
    };
    // Streams whose previous event came less than a second before the
    // change wait out the server's one-event-a-second throttle; the rest
    // show the broadcast itself.
    let free_ms: Vec<f64> = match reference_ms {
        Some(r) => {
            let previous = last_positions_before(&w.events, t0);
            fanout
                .iter()
                .filter(|(idx, _)| {
                    previous
                        .get(idx)
                        .is_none_or(|p| (r as f64) - (*p as f64 / 1000.0) >= 1000.0)
                })
                .map(|(_, (recv, _))| *recv as f64 / 1000.0 - r as f64)
                .collect()
        }
        None => Vec::new(),
    };

    // 6. Hand-offs down the line.
    let mut handoff_ms = Vec::new();
    let mut leave_at = t0;
    let mut timeouts = 0;
    for h in 0..args.handoffs {
        if h > 0 {
            tokio::time::sleep(Duration::from_millis(args.handoff_gap_ms)).await;
            leave_at = unix_us();
            if api.leave(&mut control, &visitors[h - 1].1).await.is_err() {
                control = api
                    .connect(None)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                timeouts += 1;
                continue;
            }
        }
        let by = Instant::now() + Duration::from_secs(3);
        loop {
            let got = find_admitted(&w.events, mark, h);
            if let Some(recv) = got {
                handoff_ms.push((recv as f64 - leave_at as f64) / 1000.0);
                break;
            }
            if Instant::now() > by || Instant::now() > deadline {
                timeouts += 1;
                break;
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }
    // Give the permits back and close the streams.
    let _ = api
        .leave(&mut control, &visitors[args.handoffs.saturating_sub(1)].1)
        .await;
    for (_, token) in holders.iter().skip(1) {
        let _ = api.leave(&mut control, token).await;
    }
    for stop in w.stops {
        stop();
    }

    let mut r = Report::new("streams", &common.target.to_string());
    let per_stream = match (rss_before, rss_after) {
        (Some(a), Some(b)) if opened > 0 => Some(b.saturating_sub(a) as f64 / opened as f64),
        _ => None,
    };
    let fan = Summary::of(&fan_ms);
    let handoff = Summary::of(&handoff_ms);
    r.invariants_held = failed == 0;
    r.row(
        "streams",
        format!("{opened} open, {failed} failed, {workers} client processes"),
    );
    r.row("prefilled tickets", args.prefill.to_string());
    r.row(
        "server memory per stream",
        match (per_stream, rss_before, rss_after) {
            (Some(p), Some(a), Some(b)) => format!("{p:.1} KiB (RSS {a} → {b} KiB)"),
            _ => "n/a (pass --server-pid)".to_owned(),
        },
    );
    r.row(
        "fan-out of one change",
        if fan.count == 0 {
            "no deliveries".to_owned()
        } else {
            format!(
                "first {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, last {:.1} ms ({} of {want} streams)",
                fan.min_ms, fan.p50_ms, fan.p99_ms, fan.max_ms, fan.count
            )
        },
    );
    let free = Summary::of(&free_ms);
    r.row(
        "fan-out, streams not throttled",
        if free.count == 0 {
            "none (every stream had an event within the second before)".to_owned()
        } else {
            format!(
                "first {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, last {:.1} ms ({} streams)",
                free.min_ms, free.p50_ms, free.p99_ms, free.max_ms, free.count
            )
        },
    );
    r.row(
        "quiet before the change",
        if quiet {
            "yes (no position event for 1.2 s)".to_owned()
        } else {
            format!(
                "no: the view kept changing for {} s, so the fan-out includes the 1 s throttle",
                args.quiet_max_seconds
            )
        },
    );
    r.row("hand-off (leave → admitted)", handoff.show());
    r.row("hand-offs not seen within 3 s", timeouts.to_string());
    r.figure("streams_open", opened);
    r.figure("streams_failed", failed);
    r.figure("workers", workers);
    r.figure("prefill", args.prefill);
    r.figure("rss_before_kib", rss_before);
    r.figure("rss_after_kib", rss_after);
    r.figure("memory_per_stream_kib", per_stream);
    r.figure("fanout", fan);
    r.figure("fanout_delivered", fan.count);
    r.figure("quiet_before_change", quiet);
    r.figure("fanout_not_throttled", free);
    r.figure("handoff", handoff);
    r.figure("handoff_timeouts", timeouts);
    Ok(r)
}

async fn join_many_discard(api: &Api, n: u64, connections: usize) -> anyhow::Result<()> {
    let bar = progress::bar(n, "prefill");
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (api, next, bar) = (api.clone(), next.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let req = api.join_request();
            let mut conn = api
                .connect(None)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            while next.fetch_add(1, Ordering::Relaxed) < n {
                if conn.broken {
                    conn = api
                        .connect(None)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                }
                let r = conn.call(&req).await?;
                if r.status != 201 {
                    bail!("prefill join answered HTTP {}", r.status);
                }
                bar.inc(1);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    bar.finish_and_clear();
    Ok(())
}

/// The first `position` event after `t0_us` of each stream.
fn collect_positions(
    events: &Mutex<Vec<Ev>>,
    mark: usize,
    t0_us: u64,
) -> HashMap<usize, (u64, Option<u64>)> {
    let ev = events.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = HashMap::new();
    for e in &ev[mark.min(ev.len())..] {
        if e.kind == "position" && e.recv_us >= t0_us {
            out.entry(e.idx).or_insert((e.recv_us, e.updated_ms));
        }
    }
    out
}

/// Each stream's last `position` event before `t0_us`.
fn last_positions_before(events: &Mutex<Vec<Ev>>, t0_us: u64) -> HashMap<usize, u64> {
    let ev = events.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = HashMap::new();
    for e in ev.iter() {
        if e.kind == "position" && e.recv_us < t0_us {
            out.insert(e.idx, e.recv_us);
        }
    }
    out
}

fn find_admitted(events: &Mutex<Vec<Ev>>, mark: usize, idx: usize) -> Option<u64> {
    let ev = events.lock().unwrap_or_else(|p| p.into_inner());
    ev[mark.min(ev.len())..]
        .iter()
        .find(|e| e.idx == idx && e.kind == "admitted")
        .map(|e| e.recv_us)
}

/// Start the client processes (or tasks): stream `i` goes to worker
/// `i % workers`, which connects from 127.0.0.(2 + worker).
async fn start_workers(
    api: &Api,
    common: &crate::cli::Common,
    visitors: &[(u64, String)],
    workers: usize,
) -> anyhow::Result<Workers> {
    let count = workers.max(1);
    let events: Arc<Mutex<Vec<Ev>>> = Arc::new(Mutex::new(Vec::new()));
    let ready = Arc::new(Mutex::new(vec![None; count]));
    let opened: Arc<Vec<AtomicUsize>> = Arc::new((0..count).map(|_| AtomicUsize::new(0)).collect());
    let mut stops: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
    for wk in 0..count {
        let tokens: Vec<String> = visitors
            .iter()
            .skip(wk)
            .step_by(count)
            .map(|(_, t)| t.clone())
            .collect();
        let source = match common.target.addr {
            SocketAddr::V4(_) => Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (wk % 250) as u8))),
            SocketAddr::V6(_) => None,
        };
        let cfg = WorkerConfig {
            addr: api.addr,
            host: api.host.clone(),
            room: api.room.clone(),
            source,
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<WorkerMsg>();
        if workers == 0 {
            let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(worker_core(cfg, tokens, tx, async move {
                let _ = stop_rx.await;
            }));
            stops.push(Box::new(move || {
                let _ = stop_tx.send(());
            }));
        } else {
            let mut child = tokio::process::Command::new(std::env::current_exe()?)
                .arg("stream-worker")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("starting a stream worker process")?;
            let mut stdin = child.stdin.take().context("worker stdin")?;
            let stdout = child.stdout.take().context("worker stdout")?;
            let mut input = serde_json::to_string(&cfg)?;
            input.push('\n');
            for t in &tokens {
                input.push_str(t);
                input.push('\n');
            }
            input.push_str("go\n");
            stdin.write_all(input.as_bytes()).await?;
            stdin.flush().await?;
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    if let Some(m) = WorkerMsg::parse(&l) {
                        let _ = tx.send(m);
                    }
                }
            });
            stops.push(Box::new(move || {
                drop(stdin);
                drop(child);
            }));
        }
        let (events, ready, opened) = (events.clone(), ready.clone(), opened.clone());
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                match m {
                    WorkerMsg::Opened(n) => opened[wk].store(n, Ordering::Relaxed),
                    WorkerMsg::Ready { opened, failed } => {
                        ready.lock().unwrap_or_else(|p| p.into_inner())[wk] =
                            Some((opened, failed));
                    }
                    WorkerMsg::Event {
                        idx,
                        kind,
                        recv_us,
                        updated_ms,
                    } => events.lock().unwrap_or_else(|p| p.into_inner()).push(Ev {
                        idx: idx * count + wk,
                        kind,
                        recv_us,
                        updated_ms,
                    }),
                }
            }
        });
    }
    Ok(Workers {
        events,
        ready,
        opened,
        stops,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_messages_round_trip() {
        for m in [
            WorkerMsg::Opened(12),
            WorkerMsg::Ready {
                opened: 3,
                failed: 1,
            },
            WorkerMsg::Event {
                idx: 7,
                kind: "position".into(),
                recv_us: 1_700_000_000_000_000,
                updated_ms: Some(1_700_000_000_000),
            },
            WorkerMsg::Event {
                idx: 0,
                kind: "admitted".into(),
                recv_us: 5,
                updated_ms: None,
            },
        ] {
            assert_eq!(WorkerMsg::parse(&m.to_line()), Some(m));
        }
        assert_eq!(WorkerMsg::parse("X 1"), None);
        assert_eq!(WorkerMsg::parse("E 1 position notanumber -"), None);
    }

    #[test]
    fn updated_at_is_read_as_unix_ms() {
        assert_eq!(
            updated_ms(r#"{"updated_at":"2026-01-01T00:00:00.123Z"}"#),
            Some(1_767_225_600_123)
        );
        assert_eq!(updated_ms(r#"{"status":"admitted"}"#), None);
    }
}
