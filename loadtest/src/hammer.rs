//! Many keep-alive connections sending one kind of request as fast as the
//! answers come back, for a time or a count: the way gate checks, joins and
//! the baseline are all measured, so their ratios compare like with like.
//! Each connection has its own address, so one hammer can spread over
//! several instances sharing a Redis.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use serde::Serialize;

use crate::cli::Target;
use crate::http::Conn;
use crate::stats::Summary;

#[derive(Debug, Clone, Serialize)]
pub struct HammerResult {
    pub requests: u64,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub latency: Summary,
    pub elapsed_s: f64,
    pub per_second: f64,
}

pub struct Plan {
    pub target: Target,
    pub sources: u8,
    pub duration: Duration,
    /// 0: no limit but time.
    pub max_requests: u64,
    /// One connection each: where it goes and the prepared request it
    /// sends (whose Host header matches that address).
    pub requests: Vec<(SocketAddr, Vec<u8>)>,
    pub ok_status: u16,
}

pub async fn hammer(plan: Plan, bar: &ProgressBar) -> HammerResult {
    let issued = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + plan.duration;
    let mut tasks = Vec::new();
    for (i, (addr, req)) in plan.requests.into_iter().enumerate() {
        let issued = issued.clone();
        let source = crate::cli::source_address(&plan.target, plan.sources, i);
        let (max, ok_status) = (plan.max_requests, plan.ok_status);
        let bar = bar.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            let mut ok = 0u64;
            let mut conn: Option<Conn> = None;
            while Instant::now() < deadline {
                if max > 0 && issued.fetch_add(1, Ordering::Relaxed) >= max {
                    break;
                }
                if conn.as_ref().is_none_or(|c| c.broken) {
                    match Conn::connect(addr, source).await {
                        Ok(c) => conn = Some(c),
                        Err(e) => {
                            *errors
                                .entry(format!("connect: {:?}", e.kind()))
                                .or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    }
                }
                let c = conn.as_mut().expect("connected above");
                let t = Instant::now();
                match tokio::time::timeout_at(deadline.into(), c.call(&req)).await {
                    Err(_) => break,
                    Ok(Ok(r)) if r.status == ok_status => {
                        ok += 1;
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                        bar.inc(1);
                    }
                    Ok(Ok(r)) => *errors.entry(format!("HTTP {}", r.status)).or_default() += 1,
                    Ok(Err(e)) => {
                        *errors.entry(format!("io: {:?}", e.kind())).or_default() += 1;
                        conn = None;
                    }
                }
            }
            (ok, lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut ok = 0;
    for t in tasks {
        if let Ok((o, lat, errs)) = t.await {
            ok += o;
            all.extend(lat);
            for (k, v) in errs {
                *errors.entry(k).or_default() += v;
            }
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    let requests = ok + errors.values().sum::<u64>();
    HammerResult {
        requests,
        ok,
        errors,
        latency: Summary::of(&all),
        elapsed_s,
        per_second: ok as f64 / elapsed_s.max(1e-9),
    }
}
