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
//! the streams open; the line pauses (with `--admin-token`; every page
//! shows it, so it is the change that reaches every stream: the fan-out)
//! and resumes, and a holder leaves, which hands its permit to stream 0 at
//! once; then each newly admitted visitor leaves in turn, handing off down
//! the line (the hand-off latencies). Without an admin token the holder's
//! leave is the fan-out's change, which under the cadence rule only the
//! streams near the head are sent.
//!
//! With several `--target`s (instances sharing one Redis) stream `i` goes
//! to target `i mod n`, so the instances hold equal shares, and every
//! leave goes to another instance than the one holding the next visitor's
//! stream: each hand-off crosses instances, as it would behind a load
//! balancer. Memory, fan-out and hand-off are then reported per instance
//! too (`--server-pid` once per target).

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
use crate::cli::{StreamsArgs, default_workers, target_of};
use crate::http::{Conn, EventStream};
use crate::probe::{PerUnit, ProcessCpu, RedisCost, redis_stats};
use crate::progress;
use crate::report::Report;
use crate::stats::Summary;

/// Streams connecting at once per client process: more would overflow
/// the server's accept backlog and cost retransmit delays, not speed.
const CONNECT_AT_ONCE: usize = 256;

/// How long Redis's background is sampled before the change.
const REDIS_IDLE_SAMPLE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// Each instance as (address, Host header).
    pub targets: Vec<(SocketAddr, String)>,
    pub room: String,
    pub source: Option<IpAddr>,
}

/// Opened and failed streams, one pair per target.
pub type PerTarget = Vec<(usize, usize)>;

/// What a worker tells the parent.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerMsg {
    /// Streams opened so far (progress).
    Opened(usize),
    /// Every stream is open and has had its first event (or failed):
    /// (opened, failed) for each target.
    Ready(PerTarget),
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
            WorkerMsg::Ready(per_target) => {
                let mut line = "R".to_owned();
                for (o, f) in per_target {
                    line.push_str(&format!(" {o} {f}"));
                }
                line
            }
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
            "R" => {
                let nums: Vec<usize> = p.map(|x| x.parse().ok()).collect::<Option<_>>()?;
                if nums.is_empty() || !nums.len().is_multiple_of(2) {
                    return None;
                }
                Some(WorkerMsg::Ready(
                    nums.chunks(2).map(|c| (c[0], c[1])).collect(),
                ))
            }
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

fn counters(n: usize) -> Arc<Vec<AtomicUsize>> {
    Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect())
}

fn sum(counters: &[AtomicUsize]) -> usize {
    counters.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// One client's streams, each a (target index, ticket) pair: open them
/// all, report when each has had its first event, then report every later
/// event until `stop` completes.
pub async fn worker_core(
    cfg: WorkerConfig,
    tokens: Vec<(usize, String)>,
    out: mpsc::UnboundedSender<WorkerMsg>,
    stop: impl std::future::Future<Output = ()>,
) {
    let apis: Vec<Api> = cfg
        .targets
        .iter()
        .map(|(addr, host)| Api {
            addr: *addr,
            host: host.clone(),
            room: cfg.room.clone(),
        })
        .collect();
    let n = tokens.len();
    let gate = Arc::new(tokio::sync::Semaphore::new(CONNECT_AT_ONCE));
    let ready = Arc::new(AtomicBool::new(false));
    let (first, failed) = (counters(apis.len()), counters(apis.len()));
    let mut tasks = Vec::with_capacity(n);
    for (idx, (t, token)) in tokens.into_iter().enumerate() {
        let t = t.min(apis.len() - 1);
        let (api, gate, ready, first, failed, out) = (
            apis[t].clone(),
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
                failed[t].fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut got_first = false;
            loop {
                let event = stream.next_event().await;
                let recv_us = unix_us();
                let Ok(Some(e)) = event else {
                    if !got_first {
                        failed[t].fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                };
                if !got_first {
                    got_first = true;
                    first[t].fetch_add(1, Ordering::Relaxed);
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
        let (f, x) = (sum(&first), sum(&failed));
        let _ = out.send(WorkerMsg::Opened(f));
        if f + x >= n {
            ready.store(true, Ordering::Release);
            let per_target = first
                .iter()
                .zip(failed.iter())
                .map(|(o, f)| (o.load(Ordering::Relaxed), f.load(Ordering::Relaxed)))
                .collect();
            let _ = out.send(WorkerMsg::Ready(per_target));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.await;
    for t in tasks {
        t.abort();
    }
}

/// The hidden `stream-worker` command: a JSON config line, `TARGET TOKEN`
/// one a line, `go`; then messages on stdout until stdin closes.
pub async fn worker_main() -> anyhow::Result<()> {
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let cfg: WorkerConfig = serde_json::from_str(&lines.next_line().await?.context("no config")?)?;
    let mut tokens = Vec::new();
    loop {
        match lines.next_line().await? {
            Some(l) if l == "go" => break,
            Some(l) => {
                let (t, token) = l.split_once(' ').context("a token line without target")?;
                tokens.push((t.parse()?, token.to_owned()));
            }
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
pub(crate) struct Ev {
    pub idx: usize,
    pub kind: String,
    pub recv_us: u64,
    updated_ms: Option<u64>,
}

pub(crate) struct Workers {
    pub events: Arc<Mutex<Vec<Ev>>>,
    /// Each stream's first `admitted` event (receive time, µs): the
    /// hand-off loop polls this every half millisecond, and scanning all
    /// events instead (hundreds of thousands with 50,000 streams) took a
    /// core from the servers being measured.
    admitted: Arc<Mutex<HashMap<usize, u64>>>,
    pub ready: Arc<Mutex<Vec<Option<PerTarget>>>>,
    pub opened: Arc<Vec<AtomicUsize>>,
    pub stops: Vec<Box<dyn FnOnce() + Send>>,
}

pub(crate) fn resident_kib(pid: u32) -> Option<u64> {
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

/// `n` joins over `connections` connections, round-robin over the
/// instances. With `keep`, the tickets in queue order; without, each answer
/// is only checked for 201, all a million-ticket prefill can afford.
pub(crate) async fn join_many(
    apis: &[Api],
    n: u64,
    connections: usize,
    label: &str,
    keep: bool,
) -> anyhow::Result<Vec<(u64, String)>> {
    let bar = progress::bar(n, label);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..connections.min(n as usize).max(1) {
        let api = apis[target_of(c, apis.len())].clone();
        let (next, bar, label) = (next.clone(), bar.clone(), label.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
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
                if keep {
                    let t = api
                        .join(&mut conn)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    got.push((t.number, t.token));
                } else {
                    let r = conn.call(&req).await?;
                    if r.status != 201 {
                        bail!("{label} join answered HTTP {}", r.status);
                    }
                }
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

/// Where the leave before hand-off `h` goes: the instance before the one
/// holding visitor `h`'s stream, so with several instances every hand-off
/// crosses from one instance to another.
pub fn leave_target(h: usize, targets: usize) -> usize {
    let n = targets.max(1);
    (target_of(h, n) + n - 1) % n
}

/// One instance's share of the figures.
#[derive(Debug, Clone, Serialize)]
struct InstanceFigures {
    target: String,
    server_pid: Option<u32>,
    streams_open: usize,
    streams_failed: usize,
    rss_before_kib: Option<u64>,
    rss_after_kib: Option<u64>,
    memory_per_stream_kib: Option<f64>,
    /// From the leave.
    fanout: Summary,
    /// From the first `updated_at` stamped on the change.
    fanout_from_stamp: Summary,
    /// The process's CPU during the fan-out's wave ÷ the streams it updated.
    cpu_us_per_update: Option<f64>,
    /// Redis's time and commands for the change, net of its background,
    /// an equal share per instance.
    redis_per_change: Option<PerUnit>,
    handoff: Summary,
}

fn per_stream_kib(before: Option<u64>, after: Option<u64>, opened: usize) -> Option<f64> {
    match (before, after) {
        (Some(a), Some(b)) if opened > 0 => Some(b.saturating_sub(a) as f64 / opened as f64),
        _ => None,
    }
}

pub(crate) async fn connect_all(apis: &[Api]) -> anyhow::Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(apis.len());
    for api in apis {
        conns.push(
            api.connect(None)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        );
    }
    Ok(conns)
}

pub async fn run(args: &StreamsArgs) -> anyhow::Result<Report> {
    let common = &args.common;
    let apis: Vec<Api> = common
        .targets
        .iter()
        .map(|t| Api::new(t, &common.room))
        .collect();
    let n_targets = apis.len();
    let api = &apis[0];
    let deadline = Instant::now() + crate::cli::secs(common.max_seconds);
    let k = args.streams;
    let workers = args.workers.unwrap_or_else(|| default_workers(k));
    let pid = |t: usize| args.server_pids.get(t).copied();
    let rss_all = || -> Vec<Option<u64>> {
        (0..n_targets)
            .map(|t| pid(t).and_then(resident_kib))
            .collect()
    };
    // One control connection per instance, for the leaves.
    let mut controls = connect_all(&apis).await?;

    // 1. Holders take every permit.
    let holders = join_many(&apis, args.capacity as u64, 8, "holders", true).await?;
    let admitted_by = Instant::now() + Duration::from_secs(10);
    for (_, token) in &holders {
        loop {
            let s = api
                .status(&mut controls[0], token)
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
    let visitors = join_many(&apis, k as u64, 16, "stream tickets", true).await?;
    if args.prefill > 0 {
        join_many(&apis, args.prefill, 32, "prefill", false).await?;
    }
    // Let the tick publish the joins before measuring.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rss_before = rss_all();

    // 4. Open the streams.
    let w = start_workers(&apis, &visitors, workers).await?;
    let per_target = wait_until_open(&w, k, n_targets, deadline).await?;
    let (opened, failed) = per_target
        .iter()
        .fold((0, 0), |(o, f), (a, b)| (o + a, f + b));
    // Past the one-position-event-a-second throttle, and settled.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rss_after = rss_all();
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
        .status(&mut controls[0], &visitors[0].1)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if first_status["status"] != "waiting" {
        bail!(
            "the first stream visitor is {} before any hand-off: the room's capacity is larger than --capacity {}",
            first_status["status"],
            args.capacity
        );
    }

    // 5. The fan-out: a holder leaves (at another instance than stream
    // 0's); stream 0 is admitted at once, and everyone else's position
    // changes at the next tick.
    let mark = w.events.lock().unwrap_or_else(|p| p.into_inner()).len();
    let cpu_before: Vec<Option<ProcessCpu>> = (0..n_targets)
        .map(|t| pid(t).map(ProcessCpu::read))
        .collect();
    // Redis's background (ticks, leases, blocked log reads timing out),
    // sampled over a quiet spell so it can be taken out of the wave's
    // figures.
    let redis_idle = match &args.redis {
        Some(url) => {
            let before = redis_stats(url).await?;
            let from = Instant::now();
            tokio::time::sleep(REDIS_IDLE_SAMPLE).await;
            let cost = redis_stats(url).await?.since(&before);
            Some((cost, from.elapsed().as_secs_f64()))
        }
        None => None,
    };
    let redis_before = match &args.redis {
        Some(url) => Some((redis_stats(url).await?, Instant::now())),
        None => None,
    };
    let t0 = unix_us();
    let lt = leave_target(0, n_targets);
    // The wave: with the admin API, the line pauses, which every page
    // shows (a leave moves everyone by one place, which only those near
    // the head are sent under the cadence rule); without it, the leave.
    let by_pause = common.admin_token.is_some();
    if let Some(admin) = common.admin_token.as_deref() {
        apis[lt]
            .admin_patch(
                &mut controls[lt],
                admin,
                &serde_json::json!({ "paused": true }),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    } else {
        apis[lt]
            .leave(&mut controls[lt], &holders[0].1)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let want = if by_pause {
        opened
    } else {
        opened.saturating_sub(1)
    };
    // Long enough for a slow fan-out (50,000 streams reading their status
    // from one Redis took 6 s) to be timed to its last delivery rather
    // than cut off.
    let fan_by = Instant::now() + Duration::from_secs(20);
    let fanout: HashMap<usize, (u64, Option<u64>)> = loop {
        let got = collect_positions(&w.events, mark, t0);
        if got.len() >= want || Instant::now() > fan_by || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let cpu_after: Vec<Option<ProcessCpu>> = (0..n_targets)
        .map(|t| pid(t).map(ProcessCpu::read))
        .collect();
    let redis_wave = match (&args.redis, redis_before) {
        (Some(url), Some((before, from))) => Some((
            redis_stats(url).await?.since(&before),
            from.elapsed().as_secs_f64(),
        )),
        _ => None,
    };
    let redis_cost = redis_wave.as_ref().map(|(c, _)| c.clone());
    // One view change's share, net of the background, for the whole
    // Redis and for each instance (Redis cannot tell the instances'
    // commands apart, so each gets an equal share).
    let redis_per_change: Option<PerUnit> =
        redis_wave.as_ref().map(|(wave, secs)| match &redis_idle {
            Some((idle, idle_secs)) if *idle_secs > 0.0 => {
                wave.per_unit(Some(idle), secs / idle_secs, 1.0)
            }
            _ => wave.per_unit(None, 1.0, 1.0),
        });
    let redis_per_instance: Option<PerUnit> =
        redis_wave.as_ref().map(|(wave, secs)| match &redis_idle {
            Some((idle, idle_secs)) if *idle_secs > 0.0 => {
                wave.per_unit(Some(idle), secs / idle_secs, n_targets as f64)
            }
            _ => wave.per_unit(None, 1.0, n_targets as f64),
        });
    // Every delivery is timed from the leave (the change itself), and also
    // from the earliest `updated_at` any instance stamped on it (when the
    // first stream counted its new place), so that the per-instance
    // figures include the hop through Redis.
    let from_leave = |keep: &dyn Fn(usize) -> bool| -> Vec<f64> {
        fanout
            .iter()
            .filter(|(idx, _)| keep(**idx))
            .map(|(_, (recv, _))| recv.saturating_sub(t0) as f64 / 1000.0)
            .collect()
    };
    let reference_ms = fanout.values().filter_map(|(_, u)| *u).min();
    let fan_of = |keep: &dyn Fn(usize) -> bool| -> Vec<f64> {
        match reference_ms {
            Some(r) => fanout
                .iter()
                .filter(|(idx, _)| keep(**idx))
                .map(|(_, (recv, _))| *recv as f64 / 1000.0 - r as f64)
                .collect(),
            None => Vec::new(),
        }
    };
    let fan_ms = from_leave(&|_| true);
    let stamp_ms = fan_of(&|_| true);
    // Streams whose previous event came less than a second before the
    // change wait out the server's one-event-a-second throttle; the rest
    // show the broadcast itself.
    let previous = last_positions_before(&w.events, t0);
    let free_ms = from_leave(&|idx| {
        previous
            .get(&idx)
            .is_none_or(|p| t0.saturating_sub(*p) >= 1_000_000)
    });
    // Each instance's CPU over the wave, per stream it updated.
    let cpu_per_update: Vec<Option<f64>> = (0..n_targets)
        .map(|t| {
            let updated = fanout
                .keys()
                .filter(|&&idx| target_of(idx, n_targets) == t)
                .count();
            let spent = cpu_after[t]?.since(&cpu_before[t]?)?;
            (updated > 0).then(|| spent / updated as f64)
        })
        .collect();

    // 6. Hand-offs down the line, each leave at another instance than the
    // next visitor's stream.
    let mut handoff_ms: Vec<(usize, f64)> = Vec::new();
    let mut leave_at = t0;
    let mut timeouts = 0;
    // Every hand-off's leave is a view change too: Redis's cost over them
    // all, per leave, averages out the lumpy background (ticks, leases)
    // that one wave cannot.
    let redis_handoffs_before = match &args.redis {
        Some(url) if args.handoffs > 1 => Some((redis_stats(url).await?, Instant::now())),
        _ => None,
    };
    if let (true, Some(admin)) = (by_pause, common.admin_token.as_deref()) {
        // The line resumes, and settles; then the holder's leave admits
        // stream 0: the first hand-off.
        apis[lt]
            .admin_patch(
                &mut controls[lt],
                admin,
                &serde_json::json!({ "paused": false }),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        leave_at = unix_us();
        apis[lt]
            .leave(&mut controls[lt], &holders[0].1)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    for h in 0..args.handoffs {
        if h > 0 {
            tokio::time::sleep(Duration::from_millis(args.handoff_gap_ms)).await;
            let lt = leave_target(h, n_targets);
            leave_at = unix_us();
            if apis[lt]
                .leave(&mut controls[lt], &visitors[h - 1].1)
                .await
                .is_err()
            {
                controls[lt] = apis[lt]
                    .connect(None)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                timeouts += 1;
                continue;
            }
        }
        let by = Instant::now() + Duration::from_secs(3);
        loop {
            let got = w
                .admitted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&h)
                .copied();
            if let Some(recv) = got {
                handoff_ms.push((h, (recv as f64 - leave_at as f64) / 1000.0));
                break;
            }
            if Instant::now() > by || Instant::now() > deadline {
                timeouts += 1;
                break;
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }
    let leaves = args.handoffs.saturating_sub(1).saturating_sub(timeouts);
    let redis_per_leave: Option<PerUnit> = match (&args.redis, redis_handoffs_before) {
        (Some(url), Some((before, from))) if leaves > 0 => {
            let cost = redis_stats(url).await?.since(&before);
            let secs = from.elapsed().as_secs_f64();
            Some(match &redis_idle {
                Some((idle, idle_secs)) if *idle_secs > 0.0 => {
                    cost.per_unit(Some(idle), secs / idle_secs, leaves as f64)
                }
                _ => cost.per_unit(None, 1.0, leaves as f64),
            })
        }
        _ => None,
    };
    // Give the permits back and close the streams.
    let _ = api
        .leave(
            &mut controls[0],
            &visitors[args.handoffs.saturating_sub(1)].1,
        )
        .await;
    for (_, token) in holders.iter().skip(1) {
        let _ = api.leave(&mut controls[0], token).await;
    }
    for stop in w.stops {
        stop();
    }

    let instances: Vec<InstanceFigures> = (0..n_targets)
        .map(|t| {
            let on_t = |idx: usize| target_of(idx, n_targets) == t;
            let (o, f) = per_target[t];
            InstanceFigures {
                target: common.targets[t].to_string(),
                server_pid: pid(t),
                streams_open: o,
                streams_failed: f,
                rss_before_kib: rss_before[t],
                rss_after_kib: rss_after[t],
                memory_per_stream_kib: per_stream_kib(rss_before[t], rss_after[t], o),
                fanout: Summary::of(&from_leave(&on_t)),
                fanout_from_stamp: Summary::of(&fan_of(&on_t)),
                cpu_us_per_update: cpu_per_update[t],
                redis_per_change: redis_per_instance,
                handoff: Summary::of(
                    &handoff_ms
                        .iter()
                        .filter(|(h, _)| on_t(*h))
                        .map(|(_, ms)| *ms)
                        .collect::<Vec<_>>(),
                ),
            }
        })
        .collect();
    // Over several instances: the summed growth over the summed streams
    // (the single-instance figure when there is one). A process given for
    // several targets counts once.
    let total = |v: &[Option<u64>]| {
        (0..n_targets)
            .filter(|&t| !(0..t).any(|u| pid(u).is_some() && pid(u) == pid(t)))
            .map(|t| v[t])
            .sum::<Option<u64>>()
    };
    let (rss_before_sum, rss_after_sum) = (total(&rss_before), total(&rss_after));
    let per_stream = per_stream_kib(rss_before_sum, rss_after_sum, opened);

    let mut r = Report::new("streams", &common.targets_label());
    let fan = Summary::of(&fan_ms);
    let handoff = Summary::of(&handoff_ms.iter().map(|(_, ms)| *ms).collect::<Vec<_>>());
    r.invariants_held = failed == 0;
    r.row(
        "streams",
        format!("{opened} open, {failed} failed, {workers} client processes"),
    );
    if n_targets > 1 {
        r.row(
            "instances",
            format!("{n_targets}; every hand-off's leave goes to another instance than the admitted stream's"),
        );
    }
    r.row("prefilled tickets", args.prefill.to_string());
    r.row(
        "server memory per stream",
        match (per_stream, rss_before_sum, rss_after_sum) {
            (Some(p), Some(a), Some(b)) => format!("{p:.1} KiB (RSS {a} → {b} KiB)"),
            _ => "n/a (pass --server-pid)".to_owned(),
        },
    );
    r.row(
        "fan-out of one change (from the change: the pause, or the leave)",
        if fan.count == 0 {
            "no deliveries".to_owned()
        } else {
            format!(
                "first {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, last {:.1} ms ({} of {want} streams)",
                fan.min_ms, fan.p50_ms, fan.p99_ms, fan.max_ms, fan.count
            )
        },
    );
    let stamp = Summary::of(&stamp_ms);
    r.row(
        "the same, from the first stream's count",
        format!(
            "p50 {:.1} ms, p99 {:.1} ms, last {:.1} ms",
            stamp.p50_ms, stamp.p99_ms, stamp.max_ms
        ),
    );
    r.row(
        "server CPU per stream update",
        cpu_per_update
            .iter()
            .map(|c| c.map_or("n/a".to_owned(), |us| format!("{us:.1} µs")))
            .collect::<Vec<_>>()
            .join(", "),
    );
    if let Some(cost) = &redis_cost {
        r.row("Redis during the wave", redis_row(cost));
    }
    if let Some((idle, secs)) = &redis_idle {
        r.row(
            "Redis background",
            format!(
                "{:.0} µs time, {:.1} commands a second (sampled over {secs:.1} s before the change)",
                idle.time_us as f64 / secs,
                idle.calls as f64 / secs
            ),
        );
    }
    if let (Some(all), Some(each)) = (&redis_per_change, &redis_per_instance) {
        r.row("Redis per view change (net)", per_change_row(all));
        if n_targets > 1 {
            r.row("the same per instance (÷ instances)", per_change_row(each));
        }
    }
    if let Some(p) = &redis_per_leave {
        r.row(
            "Redis per change over the hand-offs (net)",
            per_change_row(p),
        );
    }
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
    if n_targets > 1 {
        for (t, i) in instances.iter().enumerate() {
            r.row(
                &format!("instance {t} ({})", i.target),
                format!(
                    "{} open, {} failed; {}; {}; {}; fan-out first {:.1} / p50 {:.1} / p99 {:.1} / last {:.1} ms; hand-off {}",
                    i.streams_open,
                    i.streams_failed,
                    i.memory_per_stream_kib
                        .map_or("memory n/a".to_owned(), |m| format!("{m:.1} KiB/stream")),
                    i.cpu_us_per_update
                        .map_or("CPU n/a".to_owned(), |c| format!("{c:.1} µs CPU/update")),
                    i.redis_per_change.map_or("Redis n/a".to_owned(), |p| format!(
                        "Redis {:.0} µs, {:.1} commands per change",
                        p.time_us, p.calls
                    )),
                    i.fanout.min_ms,
                    i.fanout.p50_ms,
                    i.fanout.p99_ms,
                    i.fanout.max_ms,
                    i.handoff.show()
                ),
            );
        }
    }
    r.figure("streams_open", opened);
    r.figure("streams_failed", failed);
    r.figure("workers", workers);
    r.figure("prefill", args.prefill);
    r.figure("rss_before_kib", rss_before_sum);
    r.figure("rss_after_kib", rss_after_sum);
    r.figure("memory_per_stream_kib", per_stream);
    r.figure(
        "memory_per_stream_kib_max",
        instances
            .iter()
            .filter_map(|i| i.memory_per_stream_kib)
            .reduce(f64::max),
    );
    r.figure("fanout", fan);
    r.figure("fanout_from_stamp", stamp);
    r.figure(
        "cpu_us_per_update",
        cpu_per_update.iter().flatten().copied().reduce(f64::max),
    );
    r.figure("redis_wave", &redis_cost);
    r.figure("redis_wave_seconds", redis_wave.as_ref().map(|(_, s)| *s));
    r.figure("redis_idle", redis_idle.as_ref().map(|(c, _)| c));
    r.figure("redis_idle_seconds", redis_idle.as_ref().map(|(_, s)| *s));
    r.figure("redis_per_change", redis_per_change);
    r.figure("redis_per_change_per_instance", redis_per_instance);
    r.figure("redis_per_handoff_change", redis_per_leave);
    r.figure("fanout_delivered", fan.count);
    r.figure("quiet_before_change", quiet);
    r.figure("fanout_not_throttled", free);
    r.figure("handoff", handoff);
    r.figure("handoff_timeouts", timeouts);
    r.figure("instances", &instances);
    Ok(r)
}

/// One change's net Redis cost, in a line.
fn per_change_row(p: &PerUnit) -> String {
    format!(
        "{:.0} µs Redis time (scripts, log appends and reads), {:.1} commands ({:.1} scripts, {:.1} appends, {:.1} log reads); Redis CPU {:.0} µs{}",
        p.time_us,
        p.calls,
        p.evalsha,
        p.xadd,
        p.xread,
        p.cpu_us,
        p.main_cpu_us
            .map_or(String::new(), |m| format!(" (main thread {m:.0} µs)"))
    )
}

/// Redis's share of one change, in a line.
fn redis_row(cost: &RedisCost) -> String {
    let top: Vec<String> = cost
        .by_command
        .iter()
        .map(|(name, calls)| format!("{name} {calls}"))
        .collect();
    format!(
        "{:.2} ms time (scripts, log appends and reads), {:.2} ms CPU, {} commands ({} scripts, {} appends, {} log reads): {}",
        cost.time_us as f64 / 1000.0,
        cost.cpu_ms,
        cost.calls,
        cost.evalsha,
        cost.xadd,
        cost.xread,
        top.join(", ")
    )
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

/// Which worker holds stream `i` and which target that stream goes to.
pub fn placement(i: usize, workers: usize, targets: usize) -> (usize, usize) {
    (i % workers.max(1), target_of(i, targets))
}

/// Wait until every client process has opened its `k` streams' share and
/// had their first events (or failed them): opened and failed per target.
pub(crate) async fn wait_until_open(
    w: &Workers,
    k: usize,
    n_targets: usize,
    deadline: Instant,
) -> anyhow::Result<PerTarget> {
    let bar = progress::bar(k as u64, "streams open");
    loop {
        let n_ready = w
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flatten()
            .count();
        bar.set_position(sum(&w.opened) as u64);
        if n_ready == w.stops.len() {
            break;
        }
        if Instant::now() > deadline {
            bail!("the streams did not all open before --max-seconds");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish_and_clear();
    let mut per_target: PerTarget = vec![(0, 0); n_targets];
    for ready in w
        .ready
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .flatten()
    {
        for (sum, (o, f)) in per_target.iter_mut().zip(ready) {
            sum.0 += o;
            sum.1 += f;
        }
    }
    Ok(per_target)
}

/// Start the client processes (or tasks): stream `i` goes to worker
/// `i % workers`, which connects from 127.0.0.(2 + worker), and to target
/// `i % targets`.
pub(crate) async fn start_workers(
    apis: &[Api],
    visitors: &[(u64, String)],
    workers: usize,
) -> anyhow::Result<Workers> {
    let count = workers.max(1);
    let events: Arc<Mutex<Vec<Ev>>> = Arc::new(Mutex::new(Vec::new()));
    let admitted: Arc<Mutex<HashMap<usize, u64>>> = Arc::default();
    let ready = Arc::new(Mutex::new(vec![None; count]));
    let opened = counters(count);
    let mut stops: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
    for wk in 0..count {
        let tokens: Vec<(usize, String)> = visitors
            .iter()
            .enumerate()
            .filter_map(|(i, (_, t))| {
                let (w, target) = placement(i, count, apis.len());
                (w == wk).then(|| (target, t.clone()))
            })
            .collect();
        let source = match apis[0].addr {
            SocketAddr::V4(_) => Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (wk % 250) as u8))),
            SocketAddr::V6(_) => None,
        };
        let cfg = WorkerConfig {
            targets: apis.iter().map(|a| (a.addr, a.host.clone())).collect(),
            room: apis[0].room.clone(),
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
            for (target, token) in &tokens {
                input.push_str(&format!("{target} {token}\n"));
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
        let (events, admitted, ready, opened) = (
            events.clone(),
            admitted.clone(),
            ready.clone(),
            opened.clone(),
        );
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                match m {
                    WorkerMsg::Opened(n) => opened[wk].store(n, Ordering::Relaxed),
                    WorkerMsg::Ready(per_target) => {
                        ready.lock().unwrap_or_else(|p| p.into_inner())[wk] = Some(per_target);
                    }
                    WorkerMsg::Event {
                        idx,
                        kind,
                        recv_us,
                        updated_ms,
                    } => {
                        let idx = idx * count + wk;
                        if kind == "admitted" {
                            admitted
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .entry(idx)
                                .or_insert(recv_us);
                        }
                        events.lock().unwrap_or_else(|p| p.into_inner()).push(Ev {
                            idx,
                            kind,
                            recv_us,
                            updated_ms,
                        });
                    }
                }
            }
        });
    }
    Ok(Workers {
        events,
        admitted,
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
            WorkerMsg::Ready(vec![(3, 1)]),
            WorkerMsg::Ready(vec![(1250, 0), (1249, 1), (0, 0), (7, 2)]),
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
        assert_eq!(WorkerMsg::parse("R"), None);
        assert_eq!(WorkerMsg::parse("R 1 2 3"), None);
        assert_eq!(WorkerMsg::parse("E 1 position notanumber -"), None);
    }

    #[test]
    fn streams_spread_evenly_over_instances_and_workers() {
        // The bench's shape: 50,000 streams, 10 client processes, 4 instances.
        let (k, workers, targets) = (50_000, 10, 4);
        let mut per_worker = vec![0; workers];
        let mut per_target = vec![0; targets];
        for i in 0..k {
            let (w, t) = placement(i, workers, targets);
            per_worker[w] += 1;
            per_target[t] += 1;
        }
        assert_eq!(per_worker, vec![5_000; workers]);
        assert_eq!(per_target, vec![12_500; targets]);
        // One instance: everything on it; uneven counts differ by one at most.
        assert!((0..100).all(|i| placement(i, 3, 1).1 == 0));
        let mut uneven = vec![0; 3];
        for i in 0..10 {
            uneven[placement(i, 4, 3).1] += 1;
        }
        assert_eq!(uneven, vec![4, 3, 3]);
    }

    #[test]
    fn every_hand_off_crosses_instances() {
        for targets in 2..=5 {
            for h in 0..50 {
                let leave = leave_target(h, targets);
                assert!(leave < targets);
                // Visitor h's stream sits on target_of(h): the leave admitting
                // them goes elsewhere.
                assert_ne!(leave, target_of(h, targets), "h {h}, {targets} targets");
            }
        }
        assert_eq!(leave_target(7, 1), 0);
    }

    #[test]
    fn memory_per_stream_needs_both_readings_and_streams() {
        assert_eq!(per_stream_kib(Some(1000), Some(3000), 100), Some(20.0));
        assert_eq!(per_stream_kib(Some(1000), Some(900), 100), Some(0.0));
        assert_eq!(per_stream_kib(None, Some(3000), 100), None);
        assert_eq!(per_stream_kib(Some(1000), Some(3000), 0), None);
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
