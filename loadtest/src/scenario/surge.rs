//! `surge` and `article`: visitors arrive, join, follow their event stream
//! until `admitted`, use the gate for a while, and leave. The tool then
//! checks the invariants it can see from outside — admission in ticket
//! order among visitors who stayed, never more admitted than capacity
//! (from its own events, and from the admin stats when the server has that
//! API), positions that never go up — and times joins, waits and hand-offs.
//!
//! With `--away-share`, some visitors close their page while waiting
//! (their event stream ends right after its first event, and they never
//! come back): the server should pass them by at the head without giving
//! them a permit. The surge runs twice, everyone present and then with
//! those gone, and reports admissions of present visitors per
//! permit-second for both (`capacity` × the time from the first join to
//! the last admission) and their ratio.
//!
//! With `--subscribe-share`, some visitors instead ask to be called back
//! by Web Push (a real subscription, pointed at the push service the tool
//! plays on loopback, `crate::push`), close their page, and come back when
//! their "turn" message arrives. The report then says whether admissions
//! per permit-second held up against everyone present, whether those who
//! came back were let in ahead of everyone with a later number still in
//! line, and how many pushes the server sent per second and, with
//! `--server-pid`, at what CPU per push.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::api::{Api, Failure, find_number};
use crate::cli::{Common, source_address};
use crate::http::{Conn, EventStream};
use crate::probe::ProcessCpu;
use crate::progress;
use crate::push::PushSink;
use crate::report::Report;
use crate::stats::{self, Seen, Summary};

/// When each visitor arrives and how long it stays once admitted.
#[derive(Debug, Clone)]
pub struct Plan {
    pub arrivals_s: Vec<f64>,
    pub holds: Vec<Duration>,
    pub gate_every: Duration,
    pub capacity: Option<u64>,
    pub order_slack_ms: f64,
    /// Print each admission as it happens (the article).
    pub narrate: bool,
    /// Visitors who close their page while waiting.
    pub closers: Vec<bool>,
    /// Visitors who subscribe to Web Push, close their page, and come
    /// back on their turn message.
    pub subscribers: Vec<bool>,
    /// One push in this many is decrypted and its VAPID header verified.
    pub decrypt_every: u64,
    /// Hold the room paused (admin API) from the start until this many
    /// seconds in; the line moves from then on.
    pub pause_for_s: Option<f64>,
}

impl Plan {
    /// `n` visitors evenly over `over_s` seconds, holds drawn uniformly.
    pub fn surge(n: usize, over_s: f64, hold_ms: (u64, u64), rng: &mut impl Rng) -> Self {
        let arrivals_s = (0..n)
            .map(|i| {
                if n > 1 {
                    over_s * i as f64 / (n - 1) as f64
                } else {
                    0.0
                }
            })
            .collect();
        let holds = (0..n)
            .map(|_| Duration::from_millis(rng.random_range(hold_ms.0..=hold_ms.1)))
            .collect();
        Self {
            arrivals_s,
            holds,
            gate_every: Duration::from_millis(50),
            capacity: None,
            order_slack_ms: 50.0,
            narrate: false,
            closers: vec![false; n],
            subscribers: vec![false; n],
            decrypt_every: 10,
            pause_for_s: None,
        }
    }

    /// The same surge with `share` of the visitors, evenly spread through
    /// the line, asking to be called back and closing their page.
    pub fn with_subscribers(mut self, share: f64) -> Self {
        self.subscribers = spread(self.arrivals_s.len(), share);
        self
    }

    /// The same surge with `share` of the visitors, evenly spread through
    /// the line, closing their page while waiting.
    pub fn with_closers(mut self, share: f64) -> Self {
        self.closers = spread(self.arrivals_s.len(), share);
        self
    }

    /// The seed's case: 20 users arriving 100-200 ms apart, each holding
    /// its permit 100-200 ms, 2 permits.
    pub fn article(rng: &mut impl Rng) -> Self {
        let mut t = 0.0;
        let arrivals_s = (0..20)
            .map(|i| {
                if i > 0 {
                    t += rng.random_range(100..=200) as f64 / 1000.0;
                }
                t
            })
            .collect();
        let holds = (0..20)
            .map(|_| Duration::from_millis(rng.random_range(100..=200)))
            .collect();
        Self {
            arrivals_s,
            holds,
            gate_every: Duration::from_millis(25),
            capacity: Some(2),
            order_slack_ms: 50.0,
            narrate: true,
            closers: vec![false; 20],
            subscribers: vec![false; 20],
            decrypt_every: 10,
            pause_for_s: None,
        }
    }
}

/// `share` of `n` places, evenly spread.
fn spread(n: usize, share: f64) -> Vec<bool> {
    (0..n)
        .map(|i| (i as f64 * share).floor() != ((i + 1) as f64 * share).floor())
        .collect()
}

/// What a visitor does while waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Stays,
    /// Closes the page and never comes back.
    Closes,
    /// Asks to be called back, closes the page, comes back when called.
    Subscribes,
}

/// What happened to one visitor, in seconds from the start.
#[derive(Debug, Clone, Default)]
struct Visitor {
    number: Option<u64>,
    join_sent: Option<f64>,
    joined: Option<f64>,
    admitted: Option<f64>,
    left: Option<f64>,
    error: Option<Failure>,
    /// The error came after admission (the visitor still "stayed").
    error_after_admission: bool,
    position_rises: u32,
    gate_ok: u32,
    gate_refused: u32,
    /// Closed the page while waiting.
    closed: bool,
    /// Handed a push subscription over.
    subscribed: bool,
    /// Its turn message arrived.
    called: Option<f64>,
    /// Back with the page open: its first event after the call.
    returned: Option<f64>,
}

impl Visitor {
    /// Admitted with the page open: stayed, or came back.
    fn admitted_present(&self) -> Option<f64> {
        (!self.closed || self.returned.is_some())
            .then_some(self.admitted)
            .flatten()
    }
}

struct Shared {
    start: Instant,
    visitors: Mutex<Vec<Visitor>>,
    /// When a held line was let go (seconds from the start).
    resumed: Mutex<Option<f64>>,
}

impl Shared {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
    fn update(&self, i: usize, f: impl FnOnce(&mut Visitor)) {
        let mut v = self.visitors.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut v[i]);
    }
}

pub async fn run(name: &str, common: &Common, plan: Plan) -> anyhow::Result<Report> {
    let api = Api::new(&common.target(), &common.room);
    let n = plan.arrivals_s.len();
    let shared = Arc::new(Shared {
        start: Instant::now(),
        visitors: Mutex::new(vec![Visitor::default(); n]),
        resumed: Mutex::new(None),
    });
    let held = match (plan.pause_for_s, &common.admin_token) {
        (Some(secs), Some(token)) => Some(hold_line(&api, token, &shared, secs).await?),
        _ => None,
    };
    let sink = if plan.subscribers.iter().any(|&s| s) {
        let mut conn = api.connect(None).await.map_err(|e| anyhow::anyhow!(e.0))?;
        let key = api
            .push_key(&mut conn)
            .await
            .map_err(|e| anyhow::anyhow!(e.0))?;
        Some(Arc::new(
            PushSink::start(shared.start, &common.room, key, plan.decrypt_every).await?,
        ))
    } else {
        None
    };
    let deadline = shared.start + crate::cli::secs(common.max_seconds);
    let bar = progress::bar(n as u64, "admitted");

    // The admin stats, when the server has them: the admitted count and
    // capacity the server itself reports.
    let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin = common.admin_token.clone().map(|token| {
        let api = api.clone();
        tokio::spawn(async move { poll_admin(api, token, deadline, admin_stopped).await })
    });

    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let api = api.clone();
        let shared = shared.clone();
        let source = source_address(&common.target(), common.sources, i);
        let arrive = shared.start + crate::cli::secs(plan.arrivals_s[i]);
        let hold = plan.holds[i];
        let gate_every = plan.gate_every;
        let narrate = plan.narrate;
        let role = if plan.subscribers.get(i).copied().unwrap_or(false) {
            Role::Subscribes
        } else if plan.closers.get(i).copied().unwrap_or(false) {
            Role::Closes
        } else {
            Role::Stays
        };
        let bar = bar.clone();
        let sink = sink.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(arrive).await;
            let run = visitor(
                i,
                &api,
                source,
                (hold, gate_every),
                &shared,
                narrate,
                role,
                sink.as_deref(),
                &bar,
            );
            if tokio::time::timeout_at(deadline, run).await.is_err() {
                shared.update(i, |v| {
                    if v.joined.is_none() {
                        v.error = Some(Failure("cut off by --max-seconds before joining".into()));
                    }
                });
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Some(h) = held {
        h.await??;
    }
    bar.finish_and_clear();
    let end = shared.now();
    // Asked to stop rather than aborted: an aborted poller would take what
    // it saw with it.
    let _ = stop_admin.send(());
    let admin_seen = match admin {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    let visitors = shared
        .visitors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let resumed = *shared.resumed.lock().unwrap_or_else(|p| p.into_inner());
    let mut report = summarize(name, common, &plan, &visitors, end, admin_seen, resumed);
    if let Some(sink) = sink {
        pushes(&mut report, &sink.seen());
    }
    Ok(report)
}

/// What the push service the tool played received.
fn pushes(r: &mut Report, seen: &crate::push::SinkSeen) {
    let per_second = seen.per_second();
    r.row(
        "pushes received",
        format!(
            "{} ({} turn, {} ahead), {per_second:.1}/s",
            seen.received, seen.turns, seen.aheads
        ),
    );
    r.row(
        "pushes checked (sample)",
        format!(
            "{} decrypted and VAPID-verified; {}",
            seen.decrypted,
            if seen.bad.is_empty() {
                "none bad".to_owned()
            } else {
                seen.bad
                    .iter()
                    .map(|(k, v)| format!("{k} ×{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
    );
    r.row("turn messages repeated", seen.repeated_turns.to_string());
    r.figure("pushes", seen);
    r.figure("pushes_per_second", per_second);
    r.invariants_held &= seen.bad.is_empty()
        && seen.repeated_turns == 0
        && (seen.received == 0 || seen.decrypted > 0);
}

#[allow(clippy::too_many_arguments)]
async fn visitor(
    i: usize,
    api: &Api,
    source: Option<IpAddr>,
    (hold, gate_every): (Duration, Duration),
    shared: &Shared,
    narrate: bool,
    role: Role,
    sink: Option<&PushSink>,
    bar: &indicatif::ProgressBar,
) {
    let fail = |e: Failure| {
        shared.update(i, |v| {
            v.error_after_admission = v.admitted.is_some();
            v.error = Some(e);
        });
    };
    let mut conn = match api.connect(source).await {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    shared.update(i, |v| v.join_sent = Some(shared.now()));
    let ticket = match api.join(&mut conn).await {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    shared.update(i, |v| {
        v.joined = Some(shared.now());
        v.number = Some(ticket.number);
    });
    let called = match (role, sink) {
        (Role::Subscribes, Some(sink)) => {
            let (subscription, called) = sink.subscribe(i, ticket.number);
            if let Err(e) = api.subscribe(&mut conn, &ticket.token, &subscription).await {
                return fail(e);
            }
            shared.update(i, |v| v.subscribed = true);
            Some(called)
        }
        _ => None,
    };

    // Follow the event stream on the same connection until admitted.
    let mut stream = match open_events(api, conn, &ticket.token).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    if role != Role::Stays {
        // Sees where it stands, then closes the page.
        let first = stream.next_event().await;
        drop(stream);
        shared.update(i, |v| v.closed = true);
        if let Ok(Some(e)) = first
            && e.event == "admitted"
        {
            shared.update(i, |v| v.admitted = Some(shared.now()));
            bar.inc(1);
            return;
        }
        let Some(called) = called else {
            bar.inc(1);
            return;
        };
        // Away until the turn message comes (or the run's deadline).
        let Ok(at) = called.await else { return };
        shared.update(i, |v| v.called = Some(at));
        let conn = match api.connect(source).await {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        stream = match open_events(api, conn, &ticket.token).await {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
    }
    let returning = role == Role::Subscribes;
    let mut last_position = u64::MAX;
    let mut first = true;
    loop {
        let event = stream.next_event().await;
        if returning && first {
            shared.update(i, |v| v.returned = Some(shared.now()));
        }
        first = false;
        match event {
            Ok(Some(e)) if e.event == "position" => {
                let body: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_default();
                if let Some(p) = body.get("position").and_then(serde_json::Value::as_u64) {
                    if p > last_position {
                        shared.update(i, |v| v.position_rises += 1);
                    }
                    last_position = p;
                }
            }
            Ok(Some(e)) if e.event == "admitted" => {
                let at = shared.now();
                let joined = shared.visitors.lock().unwrap_or_else(|p| p.into_inner())[i]
                    .joined
                    .unwrap_or(at);
                shared.update(i, |v| v.admitted = Some(at));
                bar.inc(1);
                if narrate {
                    bar.suspend(|| {
                        println!(
                            "+{:>6.0} ms  ticket #{:<3} admitted after {:>5.0} ms in line (holds {} ms)",
                            at * 1000.0,
                            ticket.number,
                            (at - joined) * 1000.0,
                            hold.as_millis()
                        );
                    });
                }
                break;
            }
            Ok(Some(e)) => return fail(Failure(format!("events: {} before admission", e.event))),
            Ok(None) => return fail(Failure("events: stream ended before admission".into())),
            Err(e) => return fail(Failure::io("events", &e)),
        }
    }
    // The stream ends after `admitted`; reuse the connection if it did.
    let _ = tokio::time::timeout(Duration::from_millis(500), stream.next_event()).await;
    let mut conn = stream.into_conn();
    if conn.broken {
        conn = match api.connect(source).await {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
    }

    // Hold the permit, passing the gate as a proxy would on each page.
    let until = Instant::now() + hold;
    loop {
        match api.gate(&mut conn, &ticket.token).await {
            Ok(true) => shared.update(i, |v| v.gate_ok += 1),
            Ok(false) => shared.update(i, |v| v.gate_refused += 1),
            Err(e) => return fail(e),
        }
        if Instant::now() + gate_every >= until {
            break;
        }
        tokio::time::sleep(gate_every).await;
    }
    tokio::time::sleep_until(until).await;
    shared.update(i, |v| v.left = Some(shared.now()));
    if let Err(e) = api.leave(&mut conn, &ticket.token).await {
        fail(e);
    }
}

/// The ticket's event stream, opened on `conn`.
async fn open_events(api: &Api, mut conn: Conn, token: &str) -> Result<EventStream, Failure> {
    let head = conn
        .open(&api.events_request(token))
        .await
        .map_err(|e| Failure::io("events", &e))?;
    if head.status != 200 {
        return Err(Failure::http("events", head.status));
    }
    Ok(EventStream::new(conn, &head))
}

/// Pause the room now and let it go `secs` after the start, from a task;
/// the task's answer says whether the resume went through.
async fn hold_line(
    api: &Api,
    token: &str,
    shared: &Arc<Shared>,
    secs: f64,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
    let mut conn = api.connect(None).await.map_err(|e| anyhow::anyhow!(e.0))?;
    let pause = serde_json::json!({"paused": true});
    api.admin_patch(&mut conn, token, &pause)
        .await
        .map_err(|e| anyhow::anyhow!("pausing the room: {}", e.0))?;
    let (api, token, shared) = (api.clone(), token.to_owned(), shared.clone());
    Ok(tokio::spawn(async move {
        tokio::time::sleep_until(shared.start + crate::cli::secs(secs)).await;
        let mut conn = api.connect(None).await.map_err(|e| anyhow::anyhow!(e.0))?;
        *shared.resumed.lock().unwrap_or_else(|p| p.into_inner()) = Some(shared.now());
        let resume = serde_json::json!({"paused": false});
        api.admin_patch(&mut conn, &token, &resume)
            .await
            .map_err(|e| anyhow::anyhow!("resuming the room: {}", e.0))
    }))
}

/// Admissions of visitors with their page open (who kept it open, or came
/// back to it when called), per permit-second: `capacity` permits from the
/// first join (or from when a held line was let go) to the last such
/// admission.
fn per_permit_second(visitors: &[Visitor], capacity: u64, resumed: Option<f64>) -> f64 {
    let first = resumed.unwrap_or_else(|| {
        visitors
            .iter()
            .filter_map(|v| v.join_sent)
            .fold(f64::INFINITY, f64::min)
    });
    let present: Vec<f64> = visitors
        .iter()
        .filter_map(Visitor::admitted_present)
        .collect();
    let last = present.iter().copied().fold(0.0, f64::max);
    if present.is_empty() || capacity == 0 || last <= first {
        return 0.0;
    }
    present.len() as f64 / (capacity as f64 * (last - first))
}

/// Who is away in the second run of [`run_twice`].
#[derive(Debug, Clone, Copy)]
pub enum Absence {
    /// This share closes the page for good.
    Close(f64),
    /// This share asks to be called back, closes the page, and comes back
    /// when called.
    Subscribe(f64),
}

/// The surge twice: everyone present, then with some away; the second
/// report carries both rates and their ratio and, with `server_pids`, the
/// server's CPU in each run (and, for subscribers, per push received).
pub async fn run_twice(
    common: &Common,
    plan: Plan,
    absence: Absence,
    server_pids: &[u32],
) -> anyhow::Result<Report> {
    let capacity = plan.capacity.unwrap_or(1);
    let cpu = || {
        (!server_pids.is_empty())
            .then(|| ProcessCpu::sum(server_pids.iter().map(|&p| ProcessCpu::read(p))))
    };
    let before = cpu();
    let present = run("surge (everyone present)", common, plan.clone()).await?;
    let between = cpu();
    let base = present.figure_f64("admissions_per_permit_second");
    let (name, away_plan, share) = match absence {
        Absence::Close(share) => (
            "surge (some close their page)",
            plan.with_closers(share),
            share,
        ),
        Absence::Subscribe(share) => (
            "surge (some ask to be called back and close their page)",
            plan.with_subscribers(share),
            share,
        ),
    };
    let mut away = run(name, common, away_plan).await?;
    let after = cpu();
    let with = away.figure_f64("admissions_per_permit_second");
    let ratio = if base > 0.0 { with / base } else { 0.0 };
    away.row(
        "everyone present: admissions per permit-second",
        format!("{base:.3} (capacity {capacity})"),
    );
    away.row(
        "ratio (with pages closed ÷ everyone present)",
        format!("{ratio:.3} (target ≥ 0.95)"),
    );
    away.figure("present_admissions_per_permit_second", base);
    away.figure("away_share", share);
    away.figure("ratio_to_everyone_present", ratio);
    let spent = |a: Option<ProcessCpu>, b: Option<ProcessCpu>| {
        a.zip(b).and_then(|(a, b)| b.since(&a)).map(|us| us / 1e6)
    };
    let (cpu_present, cpu_away) = (spent(before, between), spent(between, after));
    if let Some((present_s, away_s)) = cpu_present.zip(cpu_away) {
        away.row(
            "server CPU (everyone present → this run)",
            format!("{present_s:.2} s → {away_s:.2} s"),
        );
        away.figure("server_cpu_s_present", present_s);
        away.figure("server_cpu_s", away_s);
        let sends = away.figures["pushes"]["received"].as_u64().unwrap_or(0);
        if let Absence::Subscribe(_) = absence
            && sends > 0
        {
            // All of the run's CPU over its pushes bounds a push's cost
            // from above; the run's CPU beyond the everyone-present run's
            // is what calling visitors back added (subscribing, sending,
            // coming back), per push.
            let all_ms = away_s * 1e3 / sends as f64;
            let marginal_ms = (away_s - present_s) * 1e3 / sends as f64;
            away.row(
                "server CPU per push",
                format!(
                    "{marginal_ms:.3} ms beyond everyone present ({all_ms:.3} ms counting all of the run)"
                ),
            );
            away.figure("server_cpu_ms_per_push_marginal", marginal_ms);
            away.figure("server_cpu_ms_per_push_all", all_ms);
        }
    }
    away.invariants_held &= present.invariants_held;
    Ok(away)
}

/// How long after a visitor's stream reopens the room's engine has surely
/// heard they are back: the stream brings its ticket back with a read
/// as it starts; the rest is room for a busy machine.
const BACK_KNOWN_WITHIN_S: f64 = 0.25;

/// The subscribers' side of a run: how many were called and came back,
/// and whether those who came back were let in ahead of everyone with a
/// later number. Whether that held.
fn called_back(r: &mut Report, visitors: &[Visitor], slack_ms: f64) -> bool {
    let subscribed: Vec<&Visitor> = visitors.iter().filter(|v| v.subscribed).collect();
    let called = subscribed.iter().filter(|v| v.called.is_some()).count();
    let returned: Vec<(u64, f64, Option<f64>)> = subscribed
        .iter()
        .filter_map(|v| Some((v.number?, v.returned?, v.admitted)))
        .collect();
    // When the room surely knew: a stream's return reaches the room's
    // engine with the instance's next presence report.
    let known: Vec<(u64, f64, Option<f64>)> = returned
        .iter()
        .map(|&(n, back, admitted)| (n, back + BACK_KNOWN_WITHIN_S, admitted))
        .collect();
    let admitted = returned.iter().filter(|r| r.2.is_some()).count();
    let everyone: Vec<(u64, f64)> = visitors
        .iter()
        .filter_map(|v| Some((v.number?, v.admitted_present()?)))
        .collect();
    let violations = crate::stats::return_order_violations(&known, &everyone, slack_ms);

    let call_to_admitted_ms: Vec<f64> = subscribed
        .iter()
        .filter_map(|v| Some((v.admitted? - v.called?) * 1000.0))
        .collect();
    r.row(
        "called back",
        format!(
            "{} subscribed, {called} called, {} came back, {admitted} admitted",
            subscribed.len(),
            returned.len()
        ),
    );
    r.row(
        "turn message → admitted",
        Summary::of(&call_to_admitted_ms).show(),
    );
    r.row(
        "order (those who came back)",
        format!(
            "{violations} overtaken among {} (from {BACK_KNOWN_WITHIN_S} s after their return, slack {slack_ms} ms)",
            returned.len()
        ),
    );
    r.figure("subscribed", subscribed.len());
    r.figure("called", called);
    r.figure("came_back", returned.len());
    r.figure("came_back_admitted", admitted);
    r.figure("call_to_admitted", Summary::of(&call_to_admitted_ms));
    r.figure("came_back_order_violations", violations);
    violations == 0 && admitted == returned.len()
}

/// The most admitted and the capacity the admin stats showed.
#[derive(Debug, Clone, Copy, Default)]
struct AdminSeen {
    polls: u64,
    max_admitted: u64,
    capacity: Option<u64>,
}

async fn poll_admin(
    api: Api,
    token: String,
    deadline: Instant,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Option<AdminSeen> {
    let seen = Arc::new(Mutex::new(AdminSeen::default()));
    let result = seen.clone();
    let work = async move {
        let mut conn: Option<Conn> = None;
        loop {
            if conn.as_ref().is_none_or(|c| c.broken) {
                conn = api.connect(None).await.ok();
            }
            let Some(c) = conn.as_mut() else { return };
            match api.admin_room(c, &token).await {
                Ok(Some(v)) => {
                    let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                    s.polls += 1;
                    if let Some(a) = find_number(&v, "admitted") {
                        s.max_admitted = s.max_admitted.max(a);
                    }
                    if let Some(c) = find_number(&v, "capacity") {
                        s.capacity = Some(c);
                    }
                }
                // No admin API (404) or the token is refused: no stats.
                Ok(None) => return,
                Err(_) => conn = None,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        () = work => {}
        () = tokio::time::sleep_until(deadline) => {}
        _ = stop => {}
    }
    let s = *result.lock().unwrap_or_else(|p| p.into_inner());
    (s.polls > 0).then_some(s)
}

fn summarize(
    name: &str,
    common: &Common,
    plan: &Plan,
    visitors: &[Visitor],
    end: f64,
    admin: Option<AdminSeen>,
    resumed: Option<f64>,
) -> Report {
    let mut r = Report::new(name, &common.targets_label());
    let n = visitors.len();
    let joined: Vec<&Visitor> = visitors.iter().filter(|v| v.joined.is_some()).collect();
    let admitted = visitors.iter().filter(|v| v.admitted.is_some()).count();
    let left = visitors
        .iter()
        .filter(|v| v.left.is_some() && v.error.is_none())
        .count();

    let first_join = joined
        .iter()
        .filter_map(|v| v.join_sent)
        .fold(f64::INFINITY, f64::min);
    let last_join = joined.iter().filter_map(|v| v.joined).fold(0.0, f64::max);
    let joins_per_s = if joined.is_empty() {
        0.0
    } else {
        joined.len() as f64 / (last_join - first_join).max(1e-6)
    };
    let join_ms: Vec<f64> = joined
        .iter()
        .filter_map(|v| Some((v.joined? - v.join_sent?) * 1000.0))
        .collect();
    let wait_ms: Vec<f64> = visitors
        .iter()
        .filter_map(|v| Some((v.admitted? - v.joined?) * 1000.0))
        .collect();

    let mut seen = Vec::new();
    for v in visitors {
        if let Some(t) = v.joined {
            seen.push(Seen::Joined(t));
        }
        if let Some(t) = v.admitted {
            seen.push(Seen::Admitted(t));
        }
        if let Some(t) = v.left {
            seen.push(Seen::Left(t));
        }
    }
    let handoff_ms: Vec<f64> = stats::handoff_latencies(&seen)
        .into_iter()
        .map(|s| s * 1000.0)
        .collect();

    // Capacity from the tool's own events: admitted from when the event
    // arrived to when the leave was sent, both inside the server's own
    // interval, so this never over-counts.
    let intervals: Vec<(f64, f64)> = visitors
        .iter()
        .filter_map(|v| Some((v.admitted?, v.left.unwrap_or(end))))
        .collect();
    let most_admitted = stats::max_overlap(&intervals) as u64;
    let capacity = plan.capacity.or(admin.and_then(|a| a.capacity));

    // Order among visitors who stayed (no error while waiting), in ms as
    // the slack is.
    let stayed: Vec<(u64, Option<f64>)> = visitors
        .iter()
        .filter(|v| !v.closed)
        .filter(|v| v.error.is_none() || v.error_after_admission)
        .filter_map(|v| Some((v.number?, v.admitted.map(|at| at * 1000.0))))
        .collect();
    let order_violations = stats::order_violations(&stayed, plan.order_slack_ms);
    let position_rises: u32 = visitors.iter().map(|v| v.position_rises).sum();
    let gate_refused: u32 = visitors.iter().map(|v| v.gate_refused).sum();
    let gate_ok: u32 = visitors.iter().map(|v| v.gate_ok).sum();

    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for v in visitors {
        if let Some(e) = &v.error {
            *errors.entry(e.0.clone()).or_default() += 1;
        }
    }

    let capacity_ok = capacity.is_none_or(|c| most_admitted <= c);
    let admin_ok = match (admin, capacity) {
        (Some(a), Some(c)) => a.max_admitted <= c,
        _ => true,
    };
    r.invariants_held = order_violations == 0 && capacity_ok && admin_ok && position_rises == 0;
    if plan.subscribers.iter().any(|&s| s) {
        r.invariants_held &= called_back(&mut r, visitors, plan.order_slack_ms);
    }

    r.row(
        "visitors",
        format!(
            "{n} ({} joined, {admitted} admitted, {left} left)",
            joined.len()
        ),
    );
    r.row("joins/s", format!("{joins_per_s:.0}"));
    r.row("join latency", Summary::of(&join_ms).show());
    r.row("join → admitted", Summary::of(&wait_ms).show());
    r.row(
        "hand-off (leave → next admitted)",
        Summary::of(&handoff_ms).show(),
    );
    r.row(
        "gate while admitted",
        format!("{gate_ok} passed, {gate_refused} refused"),
    );
    r.row(
        "errors",
        if errors.is_empty() {
            "none".to_owned()
        } else {
            errors
                .iter()
                .map(|(k, v)| format!("{k} ×{v}"))
                .collect::<Vec<_>>()
                .join(", ")
        },
    );
    r.row(
        "order (stayed visitors)",
        format!(
            "{order_violations} violations among {} (slack {} ms)",
            stayed.len(),
            plan.order_slack_ms
        ),
    );
    r.row(
        "most admitted at once (own events)",
        match capacity {
            Some(c) => format!(
                "{most_admitted} ≤ capacity {c}: {}",
                if capacity_ok { "ok" } else { "EXCEEDED" }
            ),
            None => format!("{most_admitted} (capacity unknown: pass --capacity or --admin-token)"),
        },
    );
    r.row(
        "most admitted at once (admin stats)",
        match admin {
            Some(a) => format!(
                "{} in {} polls{}",
                a.max_admitted,
                a.polls,
                if admin_ok { "" } else { ": EXCEEDED capacity" }
            ),
            None => "n/a (no --admin-token, or the server has no admin room stats)".to_owned(),
        },
    );
    r.row("positions going up", position_rises.to_string());

    r.figure("visitors", n);
    r.figure("joined", joined.len());
    r.figure("admitted", admitted);
    r.figure("left", left);
    r.figure("joins_per_second", joins_per_s);
    r.figure("join_latency", Summary::of(&join_ms));
    r.figure("join_to_admitted", Summary::of(&wait_ms));
    r.figure("handoff", Summary::of(&handoff_ms));
    r.figure("errors", &errors);
    r.figure("order_violations", order_violations);
    r.figure("stayed", stayed.len());
    r.figure("most_admitted_own", most_admitted);
    r.figure("capacity", capacity);
    r.figure("most_admitted_admin", admin.map(|a| a.max_admitted));
    r.figure("position_rises", position_rises);
    r.figure("gate_ok", gate_ok);
    r.figure("gate_refused", gate_refused);
    r.figure("elapsed_s", end);
    if let Some(c) = capacity {
        let rate = per_permit_second(visitors, c, resumed);
        r.row(
            "admissions per permit-second (present visitors)",
            format!("{rate:.3}"),
        );
        r.figure("admissions_per_permit_second", rate);
    }
    r.figure("closed_pages", visitors.iter().filter(|v| v.closed).count());
    r.series = stats::series(&seen, 0.1, end);
    r
}
