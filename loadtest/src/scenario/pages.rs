//! `pages`: admitted visitors' page views through reverse proxies in front
//! of Narabu, and how often Narabu's gate is asked for them.
//!
//! Each `--proxy` is hammered in turn, in the same run, with the same
//! visitors (their room cookie and their signed pass): a proxy that
//! verifies passes itself (`config/haproxy-verify.cfg`) against one that
//! asks the gate on every request (`config/haproxy.cfg`). Narabu's own
//! metrics count the gate calls each run made, and its CPU per page view
//! is read from /proc with `--server-pid`.
//!
//! With `--views-per-second`, each visitor browses at that pace instead
//! of as fast as it can, keeping the fresh pass a proxy hands back
//! (`Set-Cookie`), as a browser does: the gate calls per 1,000 page views
//! of visitors who browse for a while.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::api::Api;
use crate::cli::{PagesArgs, Target, secs};
use crate::hammer::{Plan, hammer};
use crate::http::{Conn, request};
use crate::probe::ProcessCpu;
use crate::progress;
use crate::report::{Report, ratio};

/// One visitor: its ticket and its current signed pass.
#[derive(Clone)]
struct Visitor {
    ticket: String,
    pass: String,
}

impl Visitor {
    fn cookie(&self, room: &str) -> String {
        format!(
            "narabu_{room}={}; narabu_{room}_jwt={}",
            self.ticket, self.pass
        )
    }

    /// Take a fresh pass from a proxy's answer.
    fn keep(&mut self, room: &str, set_cookies: &[String]) {
        let name = format!("narabu_{room}_jwt=");
        for c in set_cookies {
            if let Some(rest) = c.strip_prefix(&name) {
                let value = rest.split(';').next().unwrap_or("");
                if !value.is_empty() {
                    self.pass = value.to_owned();
                }
            }
        }
    }
}

/// Narabu's gate calls so far, from its `/metrics`.
async fn gate_calls(api: &Api) -> anyhow::Result<u64> {
    let mut conn = api
        .connect(None)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let r = conn
        .call(&request("GET", "/metrics", &api.host, &[], b""))
        .await
        .context("reading /metrics")?;
    if r.status != 200 {
        bail!(
            "/metrics answered {} (set no metrics_token for this run)",
            r.status
        );
    }
    let text = String::from_utf8_lossy(&r.body);
    Ok(text
        .lines()
        .filter(|l| l.starts_with("narabu_http_requests_total{") && l.contains("/gate/"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// Admitted visitors with a signed pass each (the status answer's `pass`).
async fn visitors(api: &Api, n: usize) -> anyhow::Result<Vec<Visitor>> {
    let tickets = super::hammered::admitted_passes(api, n).await?;
    let mut conn = api
        .connect(None)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut out = Vec::new();
    for ticket in tickets {
        let status = api
            .status(&mut conn, &ticket)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let Some(pass) = status["pass"].as_str() else {
            bail!("an admitted status carried no pass: is this Narabu older than signed passes?");
        };
        out.push(Visitor {
            ticket,
            pass: pass.to_owned(),
        });
    }
    Ok(out)
}

fn cpu_of(pids: &[u32]) -> Option<ProcessCpu> {
    (!pids.is_empty()).then(|| ProcessCpu::sum(pids.iter().map(|&p| ProcessCpu::read(p))))
}

/// What one proxy's run measured.
#[derive(serde::Serialize)]
struct ProxyRun {
    proxy: String,
    views: u64,
    per_second: f64,
    gate_calls: u64,
    gate_calls_per_1000_views: f64,
    narabu_cpu_us_per_view: Option<f64>,
    errors: std::collections::BTreeMap<String, u64>,
}

pub async fn run(args: &PagesArgs) -> anyhow::Result<Report> {
    let common = &args.common;
    let api = Api::new(&common.target(), &common.room);
    let mut r = Report::new("pages", &common.targets_label());
    let visitors = visitors(&api, args.connections.min(64)).await?;
    let mut runs = Vec::new();
    for proxy in &args.proxies {
        let proxy_target = Target { addr: *proxy };
        let host = proxy_target.host_header();
        let calls_before = gate_calls(&api).await?;
        let cpu_before = cpu_of(&args.server_pids);
        let (views, per_second, errors) = match args.views_per_second {
            None => {
                let requests = (0..args.connections)
                    .map(|i| {
                        let v = &visitors[i % visitors.len()];
                        let cookie = v.cookie(&common.room);
                        (
                            *proxy,
                            request("GET", &args.path, &host, &[("Cookie", &cookie)], b""),
                        )
                    })
                    .collect();
                let plan = Plan {
                    target: proxy_target,
                    sources: common.sources,
                    duration: secs(args.seconds.min(common.max_seconds)),
                    max_requests: 0,
                    requests,
                    ok_status: 200,
                };
                let bar = progress::spinner(&format!("page views through {proxy}"));
                let h = hammer(plan, &bar).await;
                bar.finish_and_clear();
                (h.ok, h.per_second, h.errors)
            }
            Some(rate) => paced(args, *proxy, &host, &visitors, rate).await,
        };
        let gate_calls = gate_calls(&api).await? - calls_before;
        let cpu = match (cpu_before, cpu_of(&args.server_pids)) {
            (Some(b), Some(a)) if views > 0 => a.since(&b).map(|us| us / views as f64),
            _ => None,
        };
        runs.push(ProxyRun {
            proxy: proxy.to_string(),
            views,
            per_second,
            gate_calls,
            gate_calls_per_1000_views: if views > 0 {
                gate_calls as f64 * 1000.0 / views as f64
            } else {
                0.0
            },
            narabu_cpu_us_per_view: cpu,
            errors,
        });
    }
    // Give the permits back.
    if let Ok(mut conn) = api.connect(None).await {
        for v in &visitors {
            let _ = api.leave(&mut conn, &v.ticket).await;
        }
    }
    for run in &runs {
        r.row(
            &format!("through {}", run.proxy),
            format!(
                "{} views, {:.0}/s; {} gate calls = {:.1} per 1,000 views; Narabu CPU {} per view{}",
                run.views,
                run.per_second,
                run.gate_calls,
                run.gate_calls_per_1000_views,
                run.narabu_cpu_us_per_view
                    .map_or("n/a".to_owned(), |c| format!("{c:.1} µs")),
                if run.errors.is_empty() {
                    String::new()
                } else {
                    format!("; errors {:?}", run.errors)
                }
            ),
        );
    }
    if let [first, second, ..] = runs.as_slice() {
        let x = ratio(first.per_second, second.per_second);
        r.row("first ÷ second proxy", format!("{x:.2}"));
        r.figure("ratio_first_to_second", x);
    }
    r.row("visitors", visitors.len().to_string());
    r.invariants_held = runs.iter().all(|run| run.views > 0);
    r.figure("runs", &runs);
    Ok(r)
}

/// Each visitor browses at `rate` views a second for the run's length,
/// keeping the pass the proxy hands back; answers the views, their rate
/// and the errors.
async fn paced(
    args: &PagesArgs,
    proxy: SocketAddr,
    host: &str,
    visitors: &[Visitor],
    rate: f64,
) -> (u64, f64, std::collections::BTreeMap<String, u64>) {
    let every = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let started = Instant::now();
    let deadline = started + secs(args.seconds.min(args.common.max_seconds));
    let room = args.common.room.clone();
    let mut tasks = Vec::new();
    for v in visitors.iter().take(args.connections).cloned() {
        let (path, host, room) = (args.path.clone(), host.to_owned(), room.clone());
        tasks.push(tokio::spawn(async move {
            let mut v = v;
            let mut views = 0u64;
            let mut errors = std::collections::BTreeMap::<String, u64>::new();
            let mut conn: Option<Conn> = None;
            let mut next = Instant::now();
            while next < deadline {
                tokio::time::sleep_until(next.into()).await;
                next += every;
                if conn.as_ref().is_none_or(|c| c.broken) {
                    match Conn::connect(proxy, None).await {
                        Ok(c) => conn = Some(c),
                        Err(e) => {
                            *errors
                                .entry(format!("connect: {:?}", e.kind()))
                                .or_default() += 1;
                            continue;
                        }
                    }
                }
                let req = request("GET", &path, &host, &[("Cookie", &v.cookie(&room))], b"");
                match conn.as_mut().expect("connected above").call(&req).await {
                    Ok(answer) if answer.status == 200 => {
                        views += 1;
                        v.keep(&room, &answer.set_cookies);
                    }
                    Ok(answer) => {
                        *errors.entry(format!("HTTP {}", answer.status)).or_default() += 1;
                    }
                    Err(e) => {
                        *errors.entry(format!("io: {:?}", e.kind())).or_default() += 1;
                        conn = None;
                    }
                }
            }
            (views, errors)
        }));
    }
    let mut views = 0;
    let mut errors = std::collections::BTreeMap::new();
    for t in tasks {
        if let Ok((n, errs)) = t.await {
            views += n;
            for (k, c) in errs {
                *errors.entry(k).or_default() += c;
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    (views, views as f64 / elapsed, errors)
}
