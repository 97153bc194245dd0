//! `gate`, `joins` and `baseline`: one kind of request as fast as the
//! connections allow, with the baseline hammered the same way in the same
//! run so that each throughput is also a ratio to a trivial handler. With
//! several `--target`s the connections go round-robin over them.
//!
//! On a shared machine the ratio moves with everyone else's load; the
//! servers' own CPU per request (`--server-pid`, from /proc, beside the
//! baseline's) moves much less. With `--redis`, Redis's own accounting
//! gives its time and commands per request too.

use std::time::Duration;

use anyhow::bail;

use crate::api::Api;
use crate::baseline;
use crate::cli::{HammerArgs, Target, secs, target_of};
use crate::hammer::{HammerResult, Plan, hammer};
use crate::probe::{PerUnit, ProcessCpu, RedisStats, redis_stats};
use crate::progress;
use crate::report::{Report, ratio};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gate,
    Joins,
    Baseline,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Gate => "gate",
            Kind::Joins => "joins",
            Kind::Baseline => "baseline",
        }
    }
}

fn plan(
    args: &HammerArgs,
    target: Target,
    requests: Vec<(std::net::SocketAddr, Vec<u8>)>,
    ok_status: u16,
) -> Plan {
    Plan {
        target,
        sources: args.common.sources,
        duration: secs(args.seconds.min(args.common.max_seconds)),
        max_requests: args.requests,
        requests,
        ok_status,
    }
}

/// CPU time of a set of processes, summed (µs); `None` if any cannot be read.
fn cpu_of(pids: &[u32]) -> Option<ProcessCpu> {
    (!pids.is_empty()).then(|| ProcessCpu::sum(pids.iter().map(|&p| ProcessCpu::read(p))))
}

fn cpu_per_request(before: Option<ProcessCpu>, after: Option<ProcessCpu>, ok: u64) -> Option<f64> {
    (ok > 0).then_some(after?.since(&before?)? / ok as f64)
}

/// The baseline's result and its server's CPU per request.
async fn run_baseline(
    args: &HammerArgs,
    kind: Kind,
) -> anyhow::Result<(HammerResult, Option<f64>)> {
    let server = if args.baseline_in_process {
        baseline::spawn_in_process().await?
    } else {
        baseline::spawn_process().await?
    };
    let target = Target { addr: server.addr };
    let api = Api::new(&target, &args.common.room);
    let (req, ok) = match kind {
        Kind::Joins => (api.join_request(), 201),
        Kind::Gate | Kind::Baseline => (api.gate_request("baseline-pass"), 204),
    };
    let bar = progress::spinner("baseline");
    let requests = vec![(server.addr, req); args.connections];
    let pids: Vec<u32> = server.pid.into_iter().collect();
    let before = cpu_of(&pids);
    let result = hammer(plan(args, target, requests, ok), &bar).await;
    let cpu = cpu_per_request(before, cpu_of(&pids), result.ok);
    bar.finish_and_clear();
    Ok((result, cpu))
}

pub async fn run(args: &HammerArgs, kind: Kind) -> anyhow::Result<Report> {
    let common = &args.common;
    let mut r = Report::new(kind.name(), &common.targets_label());
    let (base, base_cpu) = if kind == Kind::Baseline || !args.no_baseline {
        let (b, cpu) = run_baseline(args, kind).await?;
        (Some(b), cpu)
    } else {
        (None, None)
    };
    let mut passes = Vec::new();
    let apis: Vec<Api> = common
        .targets
        .iter()
        .map(|t| Api::new(t, &common.room))
        .collect();
    let api_for = |i: usize| &apis[target_of(i, apis.len())];
    let api = &apis[0];
    let pids = &args.server_pids;
    let mut cpu_before = None;
    let mut redis_before: Option<RedisStats> = None;
    let measured = match kind {
        Kind::Baseline => None,
        Kind::Joins => {
            let bar = progress::spinner("joins");
            let requests = (0..args.connections)
                .map(|i| (api_for(i).addr, api_for(i).join_request()))
                .collect();
            let p = plan(args, common.target(), requests, 201);
            (cpu_before, redis_before) = readings(pids, args.redis.as_deref()).await?;
            let res = hammer(p, &bar).await;
            bar.finish_and_clear();
            Some(res)
        }
        Kind::Gate => {
            passes = admitted_passes(api, args.connections.min(16)).await?;
            let requests = (0..args.connections)
                .map(|i| {
                    let a = api_for(i);
                    (a.addr, a.gate_request(&passes[i % passes.len()]))
                })
                .collect();
            let bar = progress::spinner("gate checks");
            (cpu_before, redis_before) = readings(pids, args.redis.as_deref()).await?;
            let res = hammer(plan(args, common.target(), requests, 204), &bar).await;
            bar.finish_and_clear();
            Some(res)
        }
    };
    let ok = measured.as_ref().map_or(0, |m| m.ok);
    let server_cpu = if pids.is_empty() {
        None
    } else {
        cpu_per_request(cpu_before, cpu_of(pids), ok)
    };
    let redis_per_request: Option<PerUnit> = match (&args.redis, &redis_before) {
        (Some(url), Some(before)) if ok > 0 => Some(
            redis_stats(url)
                .await?
                .since(before)
                .per_unit(None, 1.0, ok as f64),
        ),
        _ => None,
    };
    // Give the permits back.
    if !passes.is_empty()
        && let Ok(mut conn) = api.connect(None).await
    {
        for p in &passes {
            let _ = api.leave(&mut conn, p).await;
        }
    }

    let show = |h: &HammerResult| {
        format!(
            "{:.0}/s ({} ok in {:.2} s; latency {})",
            h.per_second,
            h.ok,
            h.elapsed_s,
            h.latency.show()
        )
    };
    if let Some(b) = &base {
        r.row("baseline (trivial axum handler)", show(b));
        r.figure("baseline", b);
    }
    if let Some(m) = &measured {
        r.row(&format!("{} throughput", kind.name()), show(m));
        r.figure(kind.name(), m);
        let errors = m
            .errors
            .iter()
            .map(|(k, v)| format!("{k} ×{v}"))
            .collect::<Vec<_>>();
        r.row(
            "errors",
            if errors.is_empty() {
                "none".to_owned()
            } else {
                errors.join(", ")
            },
        );
        if let Some(b) = &base {
            let x = ratio(m.per_second, b.per_second);
            r.row("ratio to baseline", format!("{x:.2}"));
            r.figure("ratio_to_baseline", x);
        }
        r.invariants_held = m.ok > 0;
    }
    if server_cpu.is_some() || base_cpu.is_some() {
        let us = |c: Option<f64>| c.map_or("n/a".to_owned(), |c| format!("{c:.1} µs"));
        r.row(
            "server CPU per request",
            format!(
                "{} (the baseline's: {}){}",
                us(server_cpu),
                us(base_cpu),
                match (server_cpu, base_cpu) {
                    (Some(s), Some(b)) if s > 0.0 => format!("; baseline ÷ server {:.2}", b / s),
                    _ => String::new(),
                }
            ),
        );
        r.figure("server_cpu_us_per_request", server_cpu);
        r.figure("baseline_cpu_us_per_request", base_cpu);
    }
    if let Some(p) = &redis_per_request {
        r.row(
            "Redis per request",
            format!(
                "{:.1} µs Redis time (scripts, log appends and reads), {:.1} commands ({:.2} scripts, {:.2} appends); Redis CPU {:.1} µs{}",
                p.time_us,
                p.calls,
                p.evalsha,
                p.xadd,
                p.cpu_us,
                p.main_cpu_us
                    .map_or(String::new(), |m| format!(" (main thread {m:.1} µs)"))
            ),
        );
        r.figure("redis_per_request", p);
    }
    r.row("connections", args.connections.to_string());
    if common.targets.len() > 1 {
        r.row(
            "instances",
            format!(
                "{} (connections round-robin over them)",
                common.targets.len()
            ),
        );
        r.figure("instances", common.targets.len());
    }
    Ok(r)
}

/// The servers' CPU and Redis's counters, right before the measured run.
async fn readings(
    pids: &[u32],
    redis: Option<&str>,
) -> anyhow::Result<(Option<ProcessCpu>, Option<RedisStats>)> {
    let cpu = cpu_of(pids);
    let stats = match redis {
        Some(url) => Some(redis_stats(url).await?),
        None => None,
    };
    Ok((cpu, stats))
}

/// Up to `n` visitors admitted by the room, whose passes the gate checks.
pub(crate) async fn admitted_passes(api: &Api, n: usize) -> anyhow::Result<Vec<String>> {
    let mut conn = api
        .connect(None)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut tokens = Vec::new();
    for _ in 0..n.max(1) {
        tokens.push(
            api.join(&mut conn)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .token,
        );
    }
    // Admission happens at the room's next tick.
    let by = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut admitted = Vec::new();
    while tokio::time::Instant::now() < by {
        admitted.clear();
        for t in &tokens {
            let s = api
                .status(&mut conn, t)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if s["status"] == "admitted" {
                admitted.push(t.clone());
            }
        }
        if admitted.len() == tokens.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if admitted.is_empty() {
        bail!("no visitor was admitted within 10 s: is the room full, paused or not open yet?");
    }
    // The ones never admitted leave the line.
    for t in tokens.iter().filter(|t| !admitted.contains(t)) {
        let _ = api.leave(&mut conn, t).await;
    }
    Ok(admitted)
}
