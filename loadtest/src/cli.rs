//! The command line: scenarios, their options, and the checks made before
//! anything is sent. The tool only ever talks to this machine: a target
//! that is not a loopback address is refused outright.
//!
//! `--target` may be given several times (or as a comma list) for
//! instances sharing one Redis: `streams`, `joins` and `gate` spread their
//! connections over them; the scenarios that follow single visitors end to
//! end (`surge`, `article`) take one.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "loadtest",
    about = "Simulate visitors against a Narabu instance on this machine and report what happened"
)]
pub struct Cli {
    #[command(subcommand)]
    pub scenario: Scenario,
}

#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// N visitors arrive, wait on their event stream, hold the gate, leave; checks order and capacity.
    Surge(SurgeArgs),
    /// The seed's case: 20 users, 2 permits, arrivals and holds of 100-200 ms.
    Article(ArticleArgs),
    /// Gate checks with valid passes as fast as the connections allow.
    Gate(HammerArgs),
    /// Joins as fast as the connections allow (every join a new ticket).
    Joins(HammerArgs),
    /// Admitted visitors' page views through reverse proxies (each --proxy in turn), and
    /// Narabu's gate calls and CPU per view: a proxy that verifies passes against one that
    /// asks the gate on every request.
    Pages(PagesArgs),
    /// A trivial axum handler inside the tool, hammered the same way: the yardstick.
    Baseline(HammerArgs),
    /// K waiting event streams: server memory per stream, fan-out of one change, hand-off latency.
    Streams(StreamsArgs),
    /// A moving line with streams spread over its depths: the updates each waiting visitor
    /// is sent a second, by depth, and the server's CPU meanwhile.
    Cadence(CadenceArgs),
    /// A flood of joins without proof of work (and a bot with a fixed hash budget) against
    /// a `pow` room while honest visitors solve and join; also what a refused and a verified
    /// join cost the server next to a trivial handler.
    Bots(BotsArgs),
    /// Internal: one client process of `streams`, driven over stdin/stdout.
    #[command(hide = true)]
    StreamWorker,
    /// Internal: the baseline server in a process of its own.
    #[command(hide = true)]
    BaselineServer,
}

#[derive(Debug, Clone, Args)]
pub struct Common {
    /// The Narabu instance, e.g. http://127.0.0.1:8080 (loopback only); repeat it
    /// (or give a comma list) for several instances on one Redis.
    #[arg(
        long = "target",
        default_value = "http://127.0.0.1:8080",
        value_parser = parse_target,
        value_delimiter = ','
    )]
    pub targets: Vec<Target>,
    /// The room to queue in.
    #[arg(long, default_value = "default")]
    pub room: String,
    /// Stop after this many seconds whatever happens.
    #[arg(long, default_value_t = 60.0)]
    pub max_seconds: f64,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Admin token: read room stats from `/admin/rooms/{room}` when the server has that API.
    #[arg(long, env = "NARABU_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Spread connections over this many source addresses 127.0.0.2, 127.0.0.3, … (0: let the OS choose).
    #[arg(long, default_value_t = 0)]
    pub sources: u8,
}

#[derive(Debug, Clone, Args)]
pub struct SurgeArgs {
    #[command(flatten)]
    pub common: Common,
    /// How many visitors arrive.
    #[arg(long, default_value_t = 200)]
    pub visitors: usize,
    /// Over how many seconds they arrive, evenly spread (0: all at once).
    #[arg(long, default_value_t = 0.0)]
    pub over: f64,
    /// Shortest time an admitted visitor stays, in ms.
    #[arg(long, default_value_t = 100)]
    pub hold_min_ms: u64,
    /// Longest time an admitted visitor stays, in ms.
    #[arg(long, default_value_t = 200)]
    pub hold_max_ms: u64,
    /// While holding, ask the gate this often (ms), as a proxy would per page.
    #[arg(long, default_value_t = 50)]
    pub gate_every_ms: u64,
    /// The room's capacity, to check the admitted count against (the admin stats give it too).
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Admissions reaching the tool this close together (ms) count as simultaneous in the order check.
    #[arg(long, default_value_t = 50.0)]
    pub order_slack_ms: f64,
    /// Share of visitors (0 to 0.9) who close their page while waiting: the surge then runs twice,
    /// everyone present and then with these gone, and compares admissions per permit-second
    /// (needs --capacity).
    #[arg(long, default_value_t = 0.0)]
    pub away_share: f64,
    /// With --away-share: the room is held paused (admin API) while visitors arrive and this long
    /// after (ms), so that those who closed their page are away, past the room's `away_grace`,
    /// before the line moves.
    #[arg(long, default_value_t = 2000)]
    pub away_wait_ms: u64,
    /// Share of visitors (0 to 0.9) who ask to be called back by Web Push, close their page, and
    /// come back when their turn message arrives: the surge then runs twice, everyone present and
    /// then with these away, and compares admissions per permit-second. The tool plays the push
    /// service on 127.0.0.1, so the server needs `[push] allow_insecure_endpoints = true` (needs
    /// --capacity and --admin-token; the line is held for --away-wait-ms as with --away-share).
    #[arg(long, default_value_t = 0.0)]
    pub subscribe_share: f64,
    /// With --subscribe-share: decrypt one push in this many and verify its VAPID signature.
    #[arg(long, default_value_t = 10)]
    pub decrypt_every: u64,
    /// With --away-share or --subscribe-share: the server's process ids, for its CPU in each run
    /// (and per push) from /proc.
    #[arg(long = "server-pid", value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// Write an SVG chart of queue length, admitted visitors and admissions per second.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ArticleArgs {
    #[command(flatten)]
    pub common: Common,
    /// Write an SVG chart of queue length, admitted visitors and admissions per second.
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct HammerArgs {
    #[command(flatten)]
    pub common: Common,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// How long to hammer, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Stop after this many requests (0: no limit but time).
    #[arg(long, default_value_t = 0)]
    pub requests: u64,
    /// Skip the baseline run (no ratios then).
    #[arg(long)]
    pub no_baseline: bool,
    /// Serve the baseline inside this process instead of a child process.
    #[arg(long, hide = true)]
    pub baseline_in_process: bool,
    /// The servers' process ids (repeat or comma list), to report their CPU
    /// per request from /proc; the baseline's is reported beside it.
    #[arg(long = "server-pid", value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// The servers' Redis (redis://127.0.0.1:PORT), to report Redis's time
    /// and commands per request from its own accounting (INFO commandstats).
    #[arg(long, value_parser = crate::probe::parse_redis_url)]
    pub redis: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct PagesArgs {
    #[command(flatten)]
    pub common: Common,
    /// A reverse proxy in front of the target and an origin, as host:port on
    /// loopback (repeat it: each is run in turn with the same visitors).
    #[arg(long = "proxy", value_parser = parse_proxy, required = true)]
    pub proxies: Vec<SocketAddr>,
    /// The protected page to ask for.
    #[arg(long, default_value = "/page")]
    pub path: String,
    /// Visitors (one keep-alive connection each).
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// How long each proxy's run lasts, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Browse at this many views a second per visitor (keeping the fresh
    /// pass each answer hands back) instead of as fast as possible.
    #[arg(long)]
    pub views_per_second: Option<f64>,
    /// Narabu's process ids, for its CPU per page view.
    #[arg(long = "server-pid", value_delimiter = ',')]
    pub server_pids: Vec<u32>,
}

/// A proxy's address: loopback only, like every target.
fn parse_proxy(s: &str) -> Result<SocketAddr, String> {
    parse_target(&format!("http://{s}")).map(|t| t.addr)
}

#[derive(Debug, Clone, Args)]
pub struct StreamsArgs {
    #[command(flatten)]
    pub common: Common,
    /// Waiting event streams to open.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Client processes to split into (0: all in this process).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The server's process id, to read its resident memory from /proc: one per
    /// --target, in the same order (repeat it or give a comma list).
    #[arg(long = "server-pid", value_delimiter = ',')]
    pub server_pids: Vec<u32>,
    /// The room's capacity: this many visitors are admitted first and hold the permits.
    #[arg(long, default_value_t = 1)]
    pub capacity: usize,
    /// Extra tickets queued behind the streams (e.g. 1000000), without streams.
    #[arg(long, default_value_t = 0)]
    pub prefill: u64,
    /// Hand-offs to time (each: an admitted visitor leaves, the next stream gets `admitted`).
    #[arg(long, default_value_t = 100)]
    pub handoffs: usize,
    /// Pause between hand-offs, in ms.
    #[arg(long, default_value_t = 20)]
    pub handoff_gap_ms: u64,
    /// Wait at most this long (s) for a second without position events before timing the fan-out.
    #[arg(long, default_value_t = 30.0)]
    pub quiet_max_seconds: f64,
    /// The instances' Redis (redis://127.0.0.1:PORT), to read its CPU and
    /// command counts around the fan-out's wave.
    #[arg(long, value_parser = crate::probe::parse_redis_url)]
    pub redis: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct CadenceArgs {
    #[command(flatten)]
    pub common: Common,
    /// Tickets in the line.
    #[arg(long, default_value_t = 100_000)]
    pub line: u64,
    /// Of them, this many (spread evenly over the line) on event streams.
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Admissions a second while the line moves.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// How long the line moves.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// Client processes to split the streams into (0: all in this process).
    #[arg(long)]
    pub workers: Option<usize>,
    /// The server's process ids, for its CPU while the line moves.
    #[arg(long = "server-pid", value_delimiter = ',')]
    pub server_pids: Vec<u32>,
}

#[derive(Debug, Clone, Args)]
pub struct BotsArgs {
    #[command(flatten)]
    pub common: Common,
    /// Honest visitors, who solve each challenge at full speed, join and wait their turn.
    #[arg(long, default_value_t = 100)]
    pub honest: usize,
    /// Over how many seconds the honest visitors arrive, evenly spread.
    #[arg(long, default_value_t = 5.0)]
    pub over: f64,
    /// How long an admitted honest visitor stays before leaving, in ms.
    #[arg(long, default_value_t = 50)]
    pub hold_ms: u64,
    /// Connections sending joins without a solution as fast as answers come back.
    #[arg(long, default_value_t = 16)]
    pub flood_connections: usize,
    /// How long the flood lasts, in seconds (the honest visitors may take longer).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// The paying bot's budget of SHA-256 hashes per second (0: no paying bot).
    #[arg(long, default_value_t = 100_000)]
    pub bot_hashes_per_second: u64,
    /// Seconds to hammer the trivial handler and refused joins for the cost figures (0: skip).
    #[arg(long, default_value_t = 3.0)]
    pub cost_seconds: f64,
    /// Joins with a verified solution to time for the cost figures (each solved first).
    #[arg(long, default_value_t = 300)]
    pub cost_solutions: usize,
    /// Connections for the cost figures.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// The server's process id, to read its CPU time per request from /proc.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Admissions reaching the tool this close together (ms) count as simultaneous in the order check.
    #[arg(long, default_value_t = 50.0)]
    pub order_slack_ms: f64,
    /// Serve the baseline inside this process instead of a child process.
    #[arg(long, hide = true)]
    pub baseline_in_process: bool,
}

impl Common {
    /// The first (for most scenarios the only) target.
    pub fn target(&self) -> Target {
        self.targets[0]
    }

    /// The targets as the report names them: one, or a comma list.
    pub fn targets_label(&self) -> String {
        self.targets
            .iter()
            .map(Target::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Which target the `i`-th of something (a stream, a connection) goes to:
/// round-robin, so `n` things spread over `targets` differ by at most one.
pub fn target_of(i: usize, targets: usize) -> usize {
    i % targets.max(1)
}

/// A validated target: a loopback socket address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
}

impl Target {
    pub fn host_header(&self) -> String {
        self.addr.to_string()
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}", self.addr)
    }
}

/// `http://HOST[:PORT][/]` where HOST is `localhost`, an address in
/// 127.0.0.0/8 or `[::1]`. Anything else is refused.
pub fn parse_target(s: &str) -> Result<Target, String> {
    let rest = s.strip_prefix("http://").ok_or_else(|| {
        format!(
            "target {s:?} must start with http:// (the tool speaks plain HTTP to this machine only)"
        )
    })?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "target {s:?} must be just scheme, host and port, like http://127.0.0.1:8080"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("target {s:?}: unclosed [ in the host"))?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port: u16 = match port {
        None => 80,
        Some(p) => p
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("target {s:?}: port {p:?} is not a port number"))?,
    };
    let ip: IpAddr = if host.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse().map_err(|_| {
            format!("target {s:?}: host {host:?} is not localhost or an IP address (no name lookups: loopback only)")
        })?
    };
    if !ip.is_loopback() {
        return Err(format!(
            "refusing target {s:?}: {ip} is not a loopback address; loadtest only runs against this machine (127.0.0.0/8 or ::1)"
        ));
    }
    Ok(Target {
        addr: SocketAddr::new(ip, port),
    })
}

/// Checks that clap's types cannot express.
pub fn validate(scenario: &Scenario) -> Result<(), String> {
    let common = |c: &Common| -> Result<(), String> {
        if c.targets.is_empty() {
            return Err("--target is required".into());
        }
        if c.targets.len() > 64 {
            return Err("at most 64 --target instances".into());
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(t) = c.targets.iter().find(|t| !seen.insert(t.addr)) {
            return Err(format!("--target {t} is given twice"));
        }
        if !(c.max_seconds > 0.0 && c.max_seconds <= 3600.0) {
            return Err("--max-seconds must be more than 0 and at most 3600".into());
        }
        if !valid_room(&c.room) {
            return Err(format!(
                "--room {:?} is not a room id ([a-z0-9][a-z0-9-]{{0,63}})",
                c.room
            ));
        }
        if c.sources > 250 {
            return Err("--sources must be at most 250".into());
        }
        Ok(())
    };
    let one_target = |c: &Common, name: &str| -> Result<(), String> {
        if c.targets.len() > 1 {
            return Err(format!(
                "{name} takes one --target (its checks follow each visitor on one instance); several are for streams, joins and gate"
            ));
        }
        Ok(())
    };
    match scenario {
        Scenario::Surge(a) => {
            common(&a.common)?;
            one_target(&a.common, "surge")?;
            if a.visitors == 0 || a.visitors > 15_000 {
                return Err("--visitors must be 1 to 15000 (each holds a connection)".into());
            }
            if !(0.0..=0.9).contains(&a.away_share) {
                return Err("--away-share must be 0 to 0.9".into());
            }
            if a.away_share > 0.0 && (a.capacity.is_none() || a.common.admin_token.is_none()) {
                return Err(
                    "--away-share needs --capacity (admissions per permit-second) and --admin-token (to hold the line while visitors arrive)"
                        .into(),
                );
            }
            if !(0.0..=0.9).contains(&a.subscribe_share) {
                return Err("--subscribe-share must be 0 to 0.9".into());
            }
            if a.subscribe_share > 0.0 {
                if a.away_share > 0.0 {
                    return Err(
                        "--subscribe-share and --away-share are separate runs: give one".into(),
                    );
                }
                if a.capacity.is_none() || a.common.admin_token.is_none() {
                    return Err(
                        "--subscribe-share needs --capacity (admissions per permit-second) and --admin-token (to hold the line while visitors arrive)"
                            .into(),
                    );
                }
                if a.decrypt_every == 0 {
                    return Err("--decrypt-every must be at least 1".into());
                }
            }
            if !(a.over >= 0.0 && a.over <= 3600.0) {
                return Err("--over must be 0 to 3600 seconds".into());
            }
            if a.hold_min_ms > a.hold_max_ms {
                return Err("--hold-min-ms must not exceed --hold-max-ms".into());
            }
            if a.gate_every_ms == 0 {
                return Err("--gate-every-ms must be at least 1".into());
            }
            if a.capacity == Some(0) {
                return Err("--capacity must be at least 1".into());
            }
            if a.order_slack_ms.is_nan() || a.order_slack_ms < 0.0 {
                return Err("--order-slack-ms must not be negative".into());
            }
            Ok(())
        }
        Scenario::Article(a) => {
            common(&a.common)?;
            one_target(&a.common, "article")
        }
        Scenario::Gate(a) | Scenario::Joins(a) | Scenario::Baseline(a) => {
            common(&a.common)?;
            if a.connections == 0 || a.connections > 10_000 {
                return Err("--connections must be 1 to 10000".into());
            }
            if !(a.seconds > 0.0 && a.seconds <= 600.0) {
                return Err("--seconds must be more than 0 and at most 600".into());
            }
            Ok(())
        }
        Scenario::Pages(a) => {
            common(&a.common)?;
            one_target(&a.common, "pages")?;
            if a.connections == 0 || a.connections > 64 {
                return Err("--connections must be 1 to 64 (each an admitted visitor)".into());
            }
            if !(a.seconds > 0.0 && a.seconds <= 3600.0) {
                return Err("--seconds must be more than 0 and at most 3600".into());
            }
            if a.views_per_second
                .is_some_and(|r| !(r > 0.0 && r <= 1000.0))
            {
                return Err("--views-per-second must be more than 0 and at most 1000".into());
            }
            if !a.path.starts_with('/') {
                return Err("--path must start with /".into());
            }
            Ok(())
        }
        Scenario::Streams(a) => {
            common(&a.common)?;
            if a.streams == 0 || a.streams > 200_000 {
                return Err("--streams must be 1 to 200000".into());
            }
            let workers = a.workers.unwrap_or_else(|| default_workers(a.streams));
            if workers > 64 {
                return Err("--workers must be at most 64".into());
            }
            if workers > 0 && a.streams.div_ceil(workers) > 18_000 {
                return Err(
                    "at most 18000 streams per client process (a process may open 20000 files): raise --workers".into(),
                );
            }
            if workers == 0 && a.streams > 18_000 {
                return Err("more than 18000 streams need --workers".into());
            }
            if a.capacity == 0 || a.capacity > 10_000 {
                return Err("--capacity must be 1 to 10000".into());
            }
            if a.prefill > 5_000_000 {
                return Err("--prefill must be at most 5000000".into());
            }
            if !(0.0..=600.0).contains(&a.quiet_max_seconds) {
                return Err("--quiet-max-seconds must be 0 to 600".into());
            }
            if a.handoffs >= a.streams {
                return Err("--handoffs must be fewer than --streams".into());
            }
            if !a.server_pids.is_empty() && a.server_pids.len() != a.common.targets.len() {
                return Err(format!(
                    "--server-pid given {} times for {} --target instances: give one per target, in the same order",
                    a.server_pids.len(),
                    a.common.targets.len()
                ));
            }
            let per_target = a.streams.div_ceil(a.common.targets.len());
            if per_target > 18_000 {
                return Err(format!(
                    "{per_target} streams per instance: a server process may open 20000 files, so add --target instances or open fewer streams"
                ));
            }
            Ok(())
        }
        Scenario::Cadence(a) => {
            common(&a.common)?;
            if a.streams == 0 || a.streams as u64 > a.line {
                return Err("--streams must be 1 to --line".into());
            }
            if a.line > 2_000_000 {
                return Err("--line must be at most 2000000".into());
            }
            if !(1..=1_000_000).contains(&a.rate) {
                return Err("--rate must be 1 to 1000000".into());
            }
            if !(a.seconds > 0.0 && a.seconds <= 600.0) {
                return Err("--seconds must be more than 0 and at most 600".into());
            }
            let workers = a.workers.unwrap_or_else(|| default_workers(a.streams));
            if workers > 64 || (workers > 0 && a.streams.div_ceil(workers) > 18_000) {
                return Err("at most 64 workers of at most 18000 streams each".into());
            }
            Ok(())
        }
        Scenario::Bots(a) => {
            common(&a.common)?;
            one_target(&a.common, "bots")?;
            if a.honest == 0 || a.honest > 10_000 {
                return Err("--honest must be 1 to 10000".into());
            }
            if !(a.over >= 0.0 && a.over <= 3600.0) {
                return Err("--over must be 0 to 3600 seconds".into());
            }
            if a.flood_connections > 1_000 {
                return Err("--flood-connections must be at most 1000".into());
            }
            if a.connections == 0 || a.connections > 1_000 {
                return Err("--connections must be 1 to 1000".into());
            }
            if !(a.seconds > 0.0 && a.seconds <= 600.0) {
                return Err("--seconds must be more than 0 and at most 600".into());
            }
            if !(0.0..=600.0).contains(&a.cost_seconds) {
                return Err("--cost-seconds must be 0 to 600".into());
            }
            if a.cost_solutions > 100_000 {
                return Err("--cost-solutions must be at most 100000".into());
            }
            if a.bot_hashes_per_second > 100_000_000 {
                return Err("--bot-hashes-per-second must be at most 100000000".into());
            }
            if a.order_slack_ms.is_nan() || a.order_slack_ms < 0.0 {
                return Err("--order-slack-ms must not be negative".into());
            }
            Ok(())
        }
        Scenario::StreamWorker | Scenario::BaselineServer => Ok(()),
    }
}

/// One client process per 5,000 streams.
pub fn default_workers(streams: usize) -> usize {
    streams.div_ceil(5_000)
}

pub fn valid_room(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// The `n`-th source address (127.0.0.2, 127.0.0.3, …) when spreading.
pub fn source_address(target: &Target, sources: u8, n: usize) -> Option<IpAddr> {
    if sources == 0 || !target.addr.is_ipv4() {
        return None;
    }
    let k = (n % usize::from(sources)) as u8;
    Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + k)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_targets_are_accepted() {
        assert_eq!(
            parse_target("http://127.0.0.1:8080").unwrap().addr,
            "127.0.0.1:8080".parse().unwrap()
        );
        assert_eq!(
            parse_target("http://localhost:9/").unwrap().addr,
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            parse_target("http://[::1]:81").unwrap().addr,
            "[::1]:81".parse().unwrap()
        );
        assert_eq!(parse_target("http://127.9.9.9").unwrap().addr.port(), 80);
    }

    #[test]
    fn everything_else_is_refused() {
        for bad in [
            "http://10.0.0.1:8080",
            "http://192.168.1.1",
            "http://0.0.0.0:80",
            "http://[::]:80",
            "http://example.com:80",
            "https://127.0.0.1:443",
            "127.0.0.1:8080",
            "http://127.0.0.1:8080/api",
            "http://user@127.0.0.1:80",
            "http://127.0.0.1:0",
            "http://127.0.0.1:99999",
            "http://",
        ] {
            assert!(parse_target(bad).is_err(), "{bad} should be refused");
        }
        let e = parse_target("http://10.1.2.3:80").unwrap_err();
        assert!(e.contains("not a loopback address"), "{e}");
    }

    #[test]
    fn arguments_are_validated() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
            validate(&cli.scenario)
        };
        assert!(parse(&["loadtest", "surge", "--visitors", "10"]).is_ok());
        assert!(parse(&["loadtest", "surge", "--visitors", "0"]).is_err());
        assert!(
            parse(&[
                "loadtest",
                "surge",
                "--hold-min-ms",
                "5",
                "--hold-max-ms",
                "1"
            ])
            .is_err()
        );
        assert!(parse(&["loadtest", "surge", "--room", "Bad_Room"]).is_err());
        let called_back = |extra: &[&str]| {
            let mut args = vec!["loadtest", "surge", "--subscribe-share", "0.3"];
            args.extend_from_slice(extra);
            parse(&args)
        };
        assert!(called_back(&["--capacity", "5", "--admin-token", "t"]).is_ok());
        assert!(called_back(&["--capacity", "5"]).is_err(), "no admin token");
        assert!(called_back(&["--admin-token", "t"]).is_err(), "no capacity");
        let both = [
            "--capacity",
            "5",
            "--admin-token",
            "t",
            "--away-share",
            "0.2",
        ];
        assert!(called_back(&both).is_err());
        let none = [
            "--capacity",
            "5",
            "--admin-token",
            "t",
            "--decrypt-every",
            "0",
        ];
        assert!(called_back(&none).is_err());
        assert!(parse(&["loadtest", "surge", "--subscribe-share", "0.95"]).is_err());
        assert!(parse(&["loadtest", "surge", "--target", "http://8.8.8.8:80"]).is_err());
        assert!(parse(&["loadtest", "gate", "--connections", "0"]).is_err());
        assert!(parse(&["loadtest", "gate", "--seconds", "-1"]).is_err());
        assert!(parse(&["loadtest", "streams", "--streams", "15000"]).is_ok());
        assert!(
            parse(&[
                "loadtest",
                "streams",
                "--streams",
                "40000",
                "--workers",
                "2"
            ])
            .is_err()
        );
        assert!(
            parse(&[
                "loadtest",
                "streams",
                "--streams",
                "30000",
                "--workers",
                "0"
            ])
            .is_err()
        );
        assert!(parse(&["loadtest", "streams", "--streams", "10", "--handoffs", "10"]).is_err());
        assert!(parse(&["loadtest", "baseline", "--max-seconds", "0"]).is_err());
        assert!(parse(&["loadtest", "nonsense"]).is_err());
    }

    #[test]
    fn several_targets_are_repeated_or_comma_listed() {
        let targets = |args: &[&str]| match Cli::try_parse_from(args).unwrap().scenario {
            Scenario::Streams(a) => (a.common.targets, a.server_pids),
            Scenario::Joins(a) | Scenario::Gate(a) => (a.common.targets, Vec::new()),
            _ => unreachable!(),
        };
        let addr = |p: u16| Target {
            addr: SocketAddr::from(([127, 0, 0, 1], p)),
        };
        // None given: the default, one target.
        assert_eq!(targets(&["loadtest", "joins"]).0, vec![addr(8080)]);
        let (t, pids) = targets(&[
            "loadtest",
            "streams",
            "--target",
            "http://127.0.0.1:1",
            "--target",
            "http://127.0.0.1:2,http://127.0.0.1:3",
            "--server-pid",
            "10,11",
            "--server-pid",
            "12",
        ]);
        assert_eq!(t, vec![addr(1), addr(2), addr(3)]);
        assert_eq!(pids, vec![10, 11, 12]);
        let gate = targets(&[
            "loadtest",
            "gate",
            "--target",
            "http://127.0.0.1:1,http://[::1]:2",
        ]);
        assert_eq!(gate.0.len(), 2);
    }

    #[test]
    fn several_targets_are_checked() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
            validate(&cli.scenario)
        };
        let four = "http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3,http://127.0.0.1:4";
        // The bench's run: 50,000 streams over four instances, 10 processes.
        assert!(
            parse(&[
                "loadtest",
                "streams",
                "--target",
                four,
                "--streams",
                "50000",
                "--workers",
                "10",
                "--server-pid",
                "1,2,3,4"
            ])
            .is_ok()
        );
        // 50,000 on one instance cannot fit in its 20,000 files.
        assert!(
            parse(&[
                "loadtest",
                "streams",
                "--streams",
                "50000",
                "--workers",
                "10"
            ])
            .is_err()
        );
        // One pid per target, or none.
        assert!(
            parse(&[
                "loadtest",
                "streams",
                "--target",
                four,
                "--server-pid",
                "1,2"
            ])
            .is_err()
        );
        assert!(parse(&["loadtest", "streams", "--target", four]).is_ok());
        // Each target is guarded: one outside loopback refuses the lot.
        for bad in [
            "http://127.0.0.1:1,http://10.0.0.1:2",
            "http://127.0.0.1:1,example.com:80",
        ] {
            assert!(
                parse(&["loadtest", "joins", "--target", bad]).is_err(),
                "{bad}"
            );
        }
        assert!(
            parse(&[
                "loadtest",
                "gate",
                "--target",
                "http://127.0.0.1:1",
                "--target",
                "http://192.168.0.1:80"
            ])
            .is_err()
        );
        assert!(
            parse(&[
                "loadtest",
                "joins",
                "--target",
                "http://127.0.0.1:1,http://localhost:1"
            ])
            .is_err()
        );
        // Surge and article follow each visitor on one instance.
        assert!(parse(&["loadtest", "surge", "--target", four]).is_err());
        assert!(parse(&["loadtest", "article", "--target", four]).is_err());
        assert!(parse(&["loadtest", "joins", "--target", four]).is_ok());
    }

    #[test]
    fn source_addresses_cycle_from_127_0_0_2() {
        let t = parse_target("http://127.0.0.1:1").unwrap();
        assert_eq!(source_address(&t, 0, 5), None);
        assert_eq!(source_address(&t, 3, 0), Some("127.0.0.2".parse().unwrap()));
        assert_eq!(source_address(&t, 3, 4), Some("127.0.0.3".parse().unwrap()));
        let v6 = parse_target("http://[::1]:1").unwrap();
        assert_eq!(source_address(&v6, 3, 0), None);
    }
}
