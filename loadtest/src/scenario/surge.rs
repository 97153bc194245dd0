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

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::api::{Api, Failure, find_number};
use crate::cli::{Common, source_address};
use crate::http::{Conn, EventStream};
use crate::progress;
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
            pause_for_s: None,
        }
    }

    /// The same surge with `share` of the visitors, evenly spread through
    /// the line, closing their page while waiting.
    pub fn with_closers(mut self, share: f64) -> Self {
        let n = self.arrivals_s.len();
        self.closers = (0..n)
            .map(|i| (i as f64 * share).floor() != ((i + 1) as f64 * share).floor())
            .collect();
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
            pause_for_s: None,
        }
    }
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
        let closes = plan.closers.get(i).copied().unwrap_or(false);
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(arrive).await;
            let run = visitor(
                i, &api, source, hold, gate_every, &shared, narrate, closes, &bar,
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
    Ok(summarize(
        name, common, &plan, &visitors, end, admin_seen, resumed,
    ))
}

#[allow(clippy::too_many_arguments)]
async fn visitor(
    i: usize,
    api: &Api,
    source: Option<IpAddr>,
    hold: Duration,
    gate_every: Duration,
    shared: &Shared,
    narrate: bool,
    closes: bool,
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

    // Follow the event stream on the same connection until admitted.
    let head = match conn.open(&api.events_request(&ticket.token)).await {
        Ok(h) => h,
        Err(e) => return fail(Failure::io("events", &e)),
    };
    if head.status != 200 {
        return fail(Failure::http("events", head.status));
    }
    let mut stream = EventStream::new(conn, &head);
    if closes {
        // Sees where it stands, then closes the page for good.
        let first = stream.next_event().await;
        shared.update(i, |v| v.closed = true);
        bar.inc(1);
        if let Ok(Some(e)) = first
            && e.event == "admitted"
        {
            shared.update(i, |v| v.admitted = Some(shared.now()));
        }
        return;
    }
    let mut last_position = u64::MAX;
    loop {
        match stream.next_event().await {
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

/// Admissions of visitors who kept their page open, per permit-second:
/// `capacity` permits from the first join (or from when a held line was
/// let go) to the last such admission.
fn per_permit_second(visitors: &[Visitor], capacity: u64, resumed: Option<f64>) -> f64 {
    let first = resumed.unwrap_or_else(|| {
        visitors
            .iter()
            .filter_map(|v| v.join_sent)
            .fold(f64::INFINITY, f64::min)
    });
    let present: Vec<f64> = visitors
        .iter()
        .filter(|v| !v.closed)
        .filter_map(|v| v.admitted)
        .collect();
    let last = present.iter().copied().fold(0.0, f64::max);
    if present.is_empty() || capacity == 0 || last <= first {
        return 0.0;
    }
    present.len() as f64 / (capacity as f64 * (last - first))
}

/// The surge twice: everyone present, then with `share` of the visitors
/// closing their page while waiting; the second report carries both
/// rates and their ratio.
pub async fn run_with_absences(common: &Common, plan: Plan, share: f64) -> anyhow::Result<Report> {
    let capacity = plan.capacity.unwrap_or(1);
    let present = run("surge (everyone present)", common, plan.clone()).await?;
    let base = present.figure_f64("admissions_per_permit_second");
    let mut away = run(
        "surge (some close their page)",
        common,
        plan.with_closers(share),
    )
    .await?;
    let with = away.figure_f64("admissions_per_permit_second");
    let ratio = if base > 0.0 { with / base } else { 0.0 };
    away.row(
        "everyone present: admissions per permit-second",
        format!("{base:.3} (capacity {capacity})"),
    );
    away.row(
        "ratio (with closed pages ÷ everyone present)",
        format!("{ratio:.3} (target ≥ 0.95)"),
    );
    away.figure("present_admissions_per_permit_second", base);
    away.figure("away_share", share);
    away.figure("ratio_to_everyone_present", ratio);
    away.invariants_held &= present.invariants_held;
    Ok(away)
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

    // Order among visitors who stayed (no error while waiting).
    let stayed: Vec<(u64, Option<f64>)> = visitors
        .iter()
        .filter(|v| !v.closed)
        .filter(|v| v.error.is_none() || v.error_after_admission)
        .filter_map(|v| Some((v.number?, v.admitted)))
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
