//! `bots`: a flood against a room that asks proof of work, while honest
//! visitors join and wait their turn.
//!
//! Two phases, in one run:
//!
//! 1. **Cost.** The trivial handler, joins refused for lack of a solution
//!    (`428` with a fresh challenge) and joins with a verified solution
//!    (`201`, each with a solution of its own, solved beforehand) are each
//!    hammered the same way, so each throughput is a ratio to the
//!    yardstick; with `--server-pid` the server's CPU time per request is
//!    read from `/proc` too. The tickets made here leave at once.
//! 2. **Flood.** Bot connections send joins without a solution as fast as
//!    answers come back, and a bot solver with a fixed budget of hashes per
//!    second solves what it can, joins with each solution, and replays it
//!    once. Meanwhile honest visitors arrive, solve at full speed, join,
//!    follow their event stream until admitted and leave. The report gives
//!    the honest visitors' join latency (solving included, and the server's
//!    part alone) and their admission order, and checks that the flood got
//!    no ticket it did not pay for: no unsolved join and no replay made a
//!    ticket, and the bots hold at most as many tickets as they solved
//!    challenges.
//!
//! The solver is the documented scheme (SHA-256 of the token's bytes and
//! the counter in decimal, leading zero bits), written here so the tool
//! needs nothing of the server's code.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::api::{Api, Failure};
use crate::baseline;
use crate::cli::{BotsArgs, Target, secs, source_address};
use crate::hammer::{Plan, hammer};
use crate::http::{Conn, EventStream};
use crate::probe::ProcessCpu;
use crate::progress;
use crate::report::{Report, ratio};
use crate::stats::{self, Summary};

/// A challenge as the server hands it out.
#[derive(Debug, Clone)]
pub struct Challenge {
    pub token: String,
    pub difficulty: u32,
}

impl Challenge {
    /// The challenge in a `428` answer or in `GET …/challenge`.
    pub fn from_json(v: &Value) -> Option<Self> {
        let c = v.get("challenge").filter(|c| c.is_object()).unwrap_or(v);
        Some(Self {
            token: c.get("token")?.as_str()?.to_owned(),
            difficulty: u32::try_from(c.get("difficulty")?.as_u64()?).ok()?,
        })
    }

    /// The join body that spends `counter`.
    pub fn answer(&self, counter: u64) -> Value {
        json!({"challenge": self.token, "counter": counter})
    }
}

/// Leading zero bits of SHA-256(token bytes, counter in decimal).
pub fn zero_bits(token: &str, counter: u64) -> u32 {
    let d = Sha256::new()
        .chain_update(token.as_bytes())
        .chain_update(counter.to_string().as_bytes())
        .finalize();
    let mut bits = 0;
    for b in d {
        if b != 0 {
            return bits + b.leading_zeros();
        }
        bits += 8;
    }
    bits
}

/// Try counters `from..from + count`; the first that solves, if any.
pub fn search(c: &Challenge, from: u64, count: u64) -> Option<u64> {
    (from..from + count).find(|&n| zero_bits(&c.token, n) >= c.difficulty)
}

/// Solve at full speed on a blocking thread: the counter and the hashes
/// it took.
async fn solve(c: Challenge) -> (u64, u64) {
    tokio::task::spawn_blocking(move || {
        let n = search(&c, 0, u64::MAX).expect("a solution exists below 2^64");
        (n, n + 1)
    })
    .await
    .expect("the solver thread")
}

/// Ask for a challenge.
async fn challenge(api: &Api, conn: &mut Conn) -> Result<Challenge, Failure> {
    let r = api
        .send(conn, "challenge", &api.challenge_request())
        .await?;
    if r.status != 200 {
        return Err(Failure::http("challenge", r.status));
    }
    r.json()
        .as_ref()
        .and_then(Challenge::from_json)
        .ok_or_else(|| Failure("challenge: unreadable answer".into()))
}

pub async fn run(a: &BotsArgs) -> anyhow::Result<Report> {
    let common = &a.common;
    let target = common.target();
    let api = Api::new(&target, &common.room);
    let mut r = Report::new("bots", &common.targets_label());
    let difficulty = {
        // The room must ask for work, or there is nothing to measure.
        let mut conn = api.connect(None).await.map_err(anyhow::Error::msg)?;
        let c = challenge(&api, &mut conn).await.map_err(|e| {
            anyhow::anyhow!("{e}: the room must ask proof of work (challenge = \"pow\")")
        })?;
        r.row("difficulty", format!("{} bits", c.difficulty));
        r.figure("difficulty", c.difficulty);
        c.difficulty
    };
    if a.cost_seconds > 0.0 {
        cost(a, &api, &mut r).await?;
    }
    flood(a, &api, difficulty, &mut r).await?;
    Ok(r)
}

// ----- the cost of a refused join and of a verified one ------------------

/// One kind of request hammered for the cost phase, with the CPU a
/// process spent meanwhile.
struct Measured {
    per_second: f64,
    ok: u64,
    errors: BTreeMap<String, u64>,
    cpu_us_per_ok: Option<f64>,
}

async fn measure(
    a: &BotsArgs,
    target: Target,
    requests: Vec<(std::net::SocketAddr, Vec<u8>)>,
    ok_status: u16,
    max_requests: u64,
    pid: Option<u32>,
    label: &str,
) -> Measured {
    let before = pid.map(ProcessCpu::read);
    let bar = progress::spinner(label);
    let res = hammer(
        Plan {
            target,
            sources: a.common.sources,
            duration: secs(a.cost_seconds.min(a.common.max_seconds)),
            max_requests,
            requests,
            ok_status,
        },
        &bar,
    )
    .await;
    bar.finish_and_clear();
    let cpu = pid
        .zip(before)
        .and_then(|(p, b)| ProcessCpu::read(p).since(&b));
    Measured {
        per_second: res.per_second,
        ok: res.ok,
        errors: res.errors,
        cpu_us_per_ok: cpu.filter(|_| res.ok > 0).map(|us| us / res.ok as f64),
    }
}

async fn cost(a: &BotsArgs, api: &Api, r: &mut Report) -> anyhow::Result<()> {
    let server = if a.baseline_in_process {
        baseline::spawn_in_process().await?
    } else {
        baseline::spawn_process().await?
    };
    let base_target = Target { addr: server.addr };
    let base_api = Api::new(&base_target, &a.common.room);
    let conns = a.connections;
    let base = measure(
        a,
        base_target,
        vec![(server.addr, base_api.join_request()); conns],
        201,
        0,
        server.pid(),
        "baseline",
    )
    .await;
    drop(server);

    let refused = measure(
        a,
        a.common.target(),
        vec![(api.addr, api.join_request()); conns],
        428,
        0,
        a.server_pid,
        "refused joins",
    )
    .await;

    // Each verified join spends a solution of its own, solved now.
    let bar = progress::bar(a.cost_solutions as u64, "solving");
    let mut conn = api.connect(None).await.map_err(anyhow::Error::msg)?;
    let mut bodies = Vec::with_capacity(a.cost_solutions);
    for _ in 0..a.cost_solutions {
        let c = challenge(api, &mut conn)
            .await
            .map_err(anyhow::Error::msg)?;
        let (counter, _) = solve(c.clone()).await;
        bodies.push(api.join_request_with(&c.answer(counter)));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let verified = verified_joins(a, api, bodies).await;
    let v = &verified.0;

    let show = |m: &Measured| {
        let cpu = m
            .cpu_us_per_ok
            .map(|us| format!(", server CPU {us:.1} µs each"))
            .unwrap_or_default();
        format!("{:.0}/s ({} answered{cpu})", m.per_second, m.ok)
    };
    r.row("cost: baseline (trivial handler)", show(&base));
    r.row(
        "cost: refused join (428 + challenge)",
        format!(
            "{}; ratio to baseline {:.2}",
            show(&refused),
            ratio(refused.per_second, base.per_second)
        ),
    );
    r.row(
        "cost: join with a verified solution (201)",
        format!(
            "{}; ratio to baseline {:.2}",
            show(v),
            ratio(v.per_second, base.per_second)
        ),
    );
    let mut errors = refused.errors.clone();
    for (k, n) in &v.errors {
        *errors.entry(k.clone()).or_default() += n;
    }
    if !errors.is_empty() {
        r.row(
            "cost: unexpected answers",
            errors
                .iter()
                .map(|(k, n)| format!("{k} ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    for (name, m) in [
        ("cost_baseline", &base),
        ("cost_refused", &refused),
        ("cost_verified", v),
    ] {
        r.figure(
            name,
            json!({"per_second": m.per_second, "ok": m.ok, "errors": m.errors,
                   "cpu_us_per_request": m.cpu_us_per_ok}),
        );
    }
    r.figure(
        "refused_ratio_to_baseline",
        ratio(refused.per_second, base.per_second),
    );
    r.figure(
        "verified_ratio_to_baseline",
        ratio(v.per_second, base.per_second),
    );
    // The tickets made here leave, so the flood phase starts on an empty line.
    for t in &verified.1 {
        let _ = api.leave(&mut conn, t).await;
    }
    Ok(())
}

/// Send each prepared join once, over `--connections` connections: the
/// throughput and the tickets made.
async fn verified_joins(a: &BotsArgs, api: &Api, bodies: Vec<Vec<u8>>) -> (Measured, Vec<String>) {
    let before = a.server_pid.map(ProcessCpu::read);
    let queue = Arc::new(Mutex::new(bodies));
    let tickets = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..a.connections {
        let (api, queue, tickets, errors) =
            (api.clone(), queue.clone(), tickets.clone(), errors.clone());
        let source = source_address(&a.common.target(), a.common.sources, i);
        tasks.push(tokio::spawn(async move {
            let mut conn: Option<Conn> = None;
            loop {
                let Some(req) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop() else {
                    return;
                };
                if conn.as_ref().is_none_or(|c| c.broken) {
                    conn = api.connect(source).await.ok();
                }
                let Some(c) = conn.as_mut() else { return };
                let key = match api.send(c, "join", &req).await {
                    Ok(r) if r.status == 201 => {
                        if let Some(t) = crate::api::parse_ticket(&r) {
                            tickets
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .push(t.token);
                        }
                        continue;
                    }
                    Ok(r) => format!("HTTP {}", r.status),
                    Err(e) => e.0,
                };
                *errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(key)
                    .or_default() += 1;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let tickets = std::mem::take(&mut *tickets.lock().unwrap_or_else(|p| p.into_inner()));
    let ok = tickets.len() as u64;
    let cpu = a
        .server_pid
        .zip(before)
        .and_then(|(p, b)| ProcessCpu::read(p).since(&b));
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|p| p.into_inner()));
    (
        Measured {
            per_second: ok as f64 / elapsed.max(1e-9),
            ok,
            errors,
            cpu_us_per_ok: cpu.filter(|_| ok > 0).map(|us| us / ok as f64),
        },
        tickets,
    )
}

// ----- the flood and the honest visitors ---------------------------------

/// What one honest visitor saw, in seconds from the flood's start.
#[derive(Debug, Clone, Default)]
struct Honest {
    number: Option<u64>,
    arrived: Option<f64>,
    solved_in: Option<f64>,
    /// The join that carried the solution, request to answer.
    server_join: Option<f64>,
    joined: Option<f64>,
    admitted: Option<f64>,
    error: Option<String>,
}

/// What the bots got.
#[derive(Debug, Default)]
struct BotTally {
    flood_requests: AtomicU64,
    flood_refused: AtomicU64,
    /// A join without a solution that made a ticket: must stay 0.
    unpaid_tickets: AtomicU64,
    flood_other: Mutex<BTreeMap<String, u64>>,
    hashes: AtomicU64,
    solutions: AtomicU64,
    paid_tickets: AtomicU64,
    replays: AtomicU64,
    /// A replayed solution that made a ticket: must stay 0.
    replay_tickets: AtomicU64,
}

async fn flood(a: &BotsArgs, api: &Api, difficulty: u32, r: &mut Report) -> anyhow::Result<()> {
    let start = Instant::now();
    let until = start + secs(a.seconds.min(a.common.max_seconds));
    let deadline = start + secs(a.common.max_seconds);
    let tally = Arc::new(BotTally::default());
    let mut bots = Vec::new();
    for i in 0..a.flood_connections {
        let (api, tally) = (api.clone(), tally.clone());
        let source = source_address(&a.common.target(), a.common.sources, i);
        bots.push(tokio::spawn(async move {
            flooder(&api, source, until, &tally).await;
        }));
    }
    if a.bot_hashes_per_second > 0 {
        let (api, tally) = (api.clone(), tally.clone());
        let budget = a.bot_hashes_per_second;
        bots.push(tokio::spawn(async move {
            paying_bot(&api, budget, until, &tally).await;
        }));
    }

    let visitors = Arc::new(Mutex::new(vec![Honest::default(); a.honest]));
    let bar = progress::bar(a.honest as u64, "honest admitted");
    let mut tasks = Vec::new();
    for i in 0..a.honest {
        let (api, visitors, bar) = (api.clone(), visitors.clone(), bar.clone());
        let at = if a.honest > 1 {
            a.over * i as f64 / (a.honest - 1) as f64
        } else {
            0.0
        };
        let hold = Duration::from_millis(a.hold_ms);
        let source = source_address(&a.common.target(), a.common.sources, i + 7);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + secs(at)).await;
            let work = honest(i, &api, source, hold, start, &visitors, &bar);
            if tokio::time::timeout_at(deadline, work).await.is_err() {
                update(&visitors, i, |v| {
                    v.error
                        .get_or_insert_with(|| "cut off by --max-seconds".into());
                });
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    bar.finish_and_clear();
    for b in bots {
        let _ = b.await;
    }
    let visitors = visitors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    summarize(
        a,
        &visitors,
        &tally,
        difficulty,
        start.elapsed().as_secs_f64(),
        r,
    );
    Ok(())
}

fn update(visitors: &Mutex<Vec<Honest>>, i: usize, f: impl FnOnce(&mut Honest)) {
    f(&mut visitors.lock().unwrap_or_else(|p| p.into_inner())[i]);
}

/// Joins without a solution, as fast as the answers come back.
async fn flooder(api: &Api, source: Option<std::net::IpAddr>, until: Instant, t: &BotTally) {
    let req = api.join_request();
    let mut conn: Option<Conn> = None;
    while Instant::now() < until {
        if conn.as_ref().is_none_or(|c| c.broken) {
            conn = api.connect(source).await.ok();
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let answer = tokio::time::timeout_at(until, api.send(c, "flood", &req)).await;
        if answer.is_err() {
            return;
        }
        t.flood_requests.fetch_add(1, Ordering::Relaxed);
        let key = match answer {
            Err(_) => return,
            Ok(Ok(r)) if r.status == 428 => {
                t.flood_refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(Ok(r)) if r.status == 200 || r.status == 201 => {
                t.unpaid_tickets.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Ok(Ok(r)) => format!("HTTP {}", r.status),
            Ok(Err(e)) => {
                conn = None;
                e.0
            }
        };
        *t.flood_other
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }
}

/// A bot with a fixed hashing budget: it solves what the budget allows,
/// joins with each solution, replays it once, and leaves its ticket (so
/// the honest visitors' waits measure the flood, not bots' places).
async fn paying_bot(api: &Api, per_second: u64, until: Instant, t: &BotTally) {
    const BATCH: u64 = 1024;
    let Ok(mut conn) = api.connect(None).await else {
        return;
    };
    let started = Instant::now();
    'challenges: while Instant::now() < until {
        let Ok(c) = challenge(api, &mut conn).await else {
            return;
        };
        let mut next = 0u64;
        loop {
            // Keep to the budget: hashes so far never run ahead of it.
            let spent = t.hashes.load(Ordering::Relaxed);
            let allowed_at = started + Duration::from_secs_f64(spent as f64 / per_second as f64);
            if allowed_at >= until {
                return;
            }
            tokio::time::sleep_until(allowed_at).await;
            let batch = BATCH.min(per_second.max(1));
            let found = {
                let c = c.clone();
                tokio::task::spawn_blocking(move || search(&c, next, batch))
                    .await
                    .ok()
                    .flatten()
            };
            t.hashes
                .fetch_add(found.map_or(batch, |n| n - next + 1), Ordering::Relaxed);
            next += batch;
            let Some(counter) = found else { continue };
            t.solutions.fetch_add(1, Ordering::Relaxed);
            let body = api.join_request_with(&c.answer(counter));
            let Ok(first) = api.send(&mut conn, "bot join", &body).await else {
                return;
            };
            let ticket = (first.status == 201)
                .then(|| crate::api::parse_ticket(&first))
                .flatten();
            if ticket.is_some() {
                t.paid_tickets.fetch_add(1, Ordering::Relaxed);
            }
            // The same solution again, without the ticket: must be refused.
            t.replays.fetch_add(1, Ordering::Relaxed);
            if let Ok(again) = api.send(&mut conn, "bot replay", &body).await
                && (again.status == 200 || again.status == 201)
            {
                t.replay_tickets.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(ticket) = ticket {
                let _ = api.leave(&mut conn, &ticket.token).await;
            }
            continue 'challenges;
        }
    }
}

/// An honest visitor: asks, solves, joins, waits for `admitted`, leaves.
async fn honest(
    i: usize,
    api: &Api,
    source: Option<std::net::IpAddr>,
    hold: Duration,
    start: Instant,
    visitors: &Mutex<Vec<Honest>>,
    bar: &indicatif::ProgressBar,
) {
    let now = || start.elapsed().as_secs_f64();
    let fail = |e: String| update(visitors, i, |v| v.error = Some(e));
    update(visitors, i, |v| v.arrived = Some(now()));
    let mut conn = match api.connect(source).await {
        Ok(c) => c,
        Err(e) => return fail(e.0),
    };
    // A join as a client does it: without a solution first; the 428 says
    // what to solve.
    let c = match api.send(&mut conn, "join", &api.join_request()).await {
        Ok(r) if r.status == 428 => match r.json().as_ref().and_then(Challenge::from_json) {
            Some(c) => c,
            None => return fail("join: 428 without a challenge".into()),
        },
        Ok(r) => return fail(format!("join: HTTP {} before solving", r.status)),
        Err(e) => return fail(e.0),
    };
    let solving = Instant::now();
    let (counter, _) = solve(c.clone()).await;
    let solved_in = solving.elapsed().as_secs_f64();
    let sent = Instant::now();
    let answer = match api
        .send(
            &mut conn,
            "join",
            &api.join_request_with(&c.answer(counter)),
        )
        .await
    {
        Ok(r) => r,
        Err(e) => return fail(e.0),
    };
    let server_join = sent.elapsed().as_secs_f64();
    if answer.status != 201 {
        return fail(format!("join with a solution: HTTP {}", answer.status));
    }
    let Some(ticket) = crate::api::parse_ticket(&answer) else {
        return fail("join: unreadable answer".into());
    };
    update(visitors, i, |v| {
        v.solved_in = Some(solved_in);
        v.server_join = Some(server_join);
        v.joined = Some(now());
        v.number = Some(ticket.number);
    });
    let head = match conn.open(&api.events_request(&ticket.token)).await {
        Ok(h) if h.status == 200 => h,
        Ok(h) => return fail(format!("events: HTTP {}", h.status)),
        Err(e) => return fail(Failure::io("events", &e).0),
    };
    let mut stream = EventStream::new(conn, &head);
    loop {
        match stream.next_event().await {
            Ok(Some(e)) if e.event == "admitted" => break,
            Ok(Some(e)) if e.event == "position" => {}
            Ok(Some(e)) => return fail(format!("events: {} before admission", e.event)),
            Ok(None) => return fail("events: ended before admission".into()),
            Err(e) => return fail(Failure::io("events", &e).0),
        }
    }
    update(visitors, i, |v| v.admitted = Some(now()));
    bar.inc(1);
    tokio::time::sleep(hold).await;
    let mut conn = match api.connect(source).await {
        Ok(c) => c,
        Err(e) => return fail(e.0),
    };
    if let Err(e) = api.leave(&mut conn, &ticket.token).await {
        fail(e.0);
    }
}

fn summarize(
    a: &BotsArgs,
    visitors: &[Honest],
    t: &BotTally,
    difficulty: u32,
    elapsed: f64,
    r: &mut Report,
) {
    let ms = |f: fn(&Honest) -> Option<f64>| -> Vec<f64> {
        visitors.iter().filter_map(f).map(|s| s * 1000.0).collect()
    };
    let total = Summary::of(&ms(|v| Some(v.joined? - v.arrived?)));
    let server = Summary::of(&ms(|v| v.server_join));
    let solving = Summary::of(&ms(|v| v.solved_in));
    let waited = Summary::of(&ms(|v| Some(v.admitted? - v.joined?)));
    let joined = visitors.iter().filter(|v| v.joined.is_some()).count();
    let admitted = visitors.iter().filter(|v| v.admitted.is_some()).count();
    let stayed: Vec<(u64, Option<f64>)> = visitors
        .iter()
        .filter(|v| v.error.is_none())
        .filter_map(|v| Some((v.number?, v.admitted)))
        .collect();
    let order_violations = stats::order_violations(&stayed, a.order_slack_ms);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for v in visitors {
        if let Some(e) = &v.error {
            *errors.entry(e.clone()).or_default() += 1;
        }
    }
    let get = |x: &AtomicU64| x.load(Ordering::Relaxed);
    let (requests, refused, unpaid) = (
        get(&t.flood_requests),
        get(&t.flood_refused),
        get(&t.unpaid_tickets),
    );
    let (hashes, solutions, paid) = (get(&t.hashes), get(&t.solutions), get(&t.paid_tickets));
    let (replays, replay_tickets) = (get(&t.replays), get(&t.replay_tickets));
    let other = t
        .flood_other
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let flood_s = a.seconds.min(elapsed);

    r.invariants_held = unpaid == 0
        && replay_tickets == 0
        && paid <= solutions
        && order_violations == 0
        && admitted == a.honest;

    r.row(
        "honest visitors",
        format!("{} ({joined} joined, {admitted} admitted)", a.honest),
    );
    r.row("honest: arrival → ticket (solving included)", total.show());
    r.row("honest: solving", solving.show());
    r.row("honest: the join with the solution", server.show());
    r.row("honest: ticket → admitted", waited.show());
    r.row(
        "honest: admission order",
        format!(
            "{order_violations} violations among {} (slack {} ms)",
            stayed.len(),
            a.order_slack_ms
        ),
    );
    r.row(
        "honest: errors",
        if errors.is_empty() {
            "none".to_owned()
        } else {
            errors
                .iter()
                .map(|(k, n)| format!("{k} ×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
    );
    r.row(
        "flood: joins without a solution",
        format!(
            "{requests} in {flood_s:.1} s ({:.0}/s) over {} connections: {refused} refused with 428, {unpaid} tickets{}",
            requests as f64 / flood_s.max(1e-9),
            a.flood_connections,
            if other.is_empty() {
                String::new()
            } else {
                format!(
                    ", other: {}",
                    other
                        .iter()
                        .map(|(k, n)| format!("{k} ×{n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ),
    );
    let expected = hashes as f64 / 2f64.powi(difficulty as i32);
    r.row(
        "flood: paying bot",
        format!(
            "{hashes} hashes ({} /s budget): {solutions} solutions (expected ≈ {expected:.1}), {paid} tickets; {replays} replays, {replay_tickets} tickets from them",
            a.bot_hashes_per_second
        ),
    );
    r.row(
        "flood: tickets not paid for",
        format!(
            "{}",
            unpaid + replay_tickets + paid.saturating_sub(solutions)
        ),
    );

    r.figure("honest", a.honest);
    r.figure("honest_joined", joined);
    r.figure("honest_admitted", admitted);
    r.figure("honest_join_total", total);
    r.figure("honest_join_server", server);
    r.figure("honest_solving", solving);
    r.figure("honest_wait", waited);
    r.figure("honest_errors", &errors);
    r.figure("order_violations", order_violations);
    r.figure("flood_requests", requests);
    r.figure("flood_refused", refused);
    r.figure("flood_other", &other);
    r.figure("unpaid_tickets", unpaid);
    r.figure("bot_hashes", hashes);
    r.figure("bot_solutions", solutions);
    r.figure("bot_paid_tickets", paid);
    r.figure("bot_replays", replays);
    r.figure("bot_replay_tickets", replay_tickets);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_solver_finds_what_the_scheme_asks() {
        let c = Challenge {
            token: "AQ8AAAGi.sale.x".into(),
            difficulty: 8,
        };
        let n = search(&c, 0, 1 << 20).unwrap();
        assert!(zero_bits(&c.token, n) >= 8);
        assert!((0..n).all(|m| zero_bits(&c.token, m) < 8));
        // A search that stops short finds nothing, and resumes.
        assert_eq!(search(&c, 0, n), None);
        assert_eq!(search(&c, n, 1), Some(n));
    }

    #[test]
    fn challenges_are_read_from_a_refusal_and_from_the_endpoint() {
        let refusal = json!({"error": "challenge_required",
            "challenge": {"token": "t", "difficulty": 12}});
        let c = Challenge::from_json(&refusal).unwrap();
        assert_eq!((c.token.as_str(), c.difficulty), ("t", 12));
        let plain = json!({"token": "u", "difficulty": 3});
        assert_eq!(Challenge::from_json(&plain).unwrap().token, "u");
        assert!(Challenge::from_json(&json!({"error": "x"})).is_none());
    }
}
