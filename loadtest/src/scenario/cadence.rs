//! `cadence`: how many updates a waiting crowd is sent while its line
//! moves. A line of `--line` tickets, with `--streams` of them (spread
//! evenly over its depths) on event streams, admits `--rate` visitors a
//! second for `--seconds`; the tool counts the `position` events each
//! stream receives and reports them per waiting visitor and second,
//! overall and by depth, with the server's CPU over the same window.
//!
//! The room is set up through the admin API (so the tool needs
//! `--admin-token`): paused while the line fills, a capacity no line here
//! reaches, admissions capped at `--rate` a second (a steady line, as a
//! sale's), and presence timeouts longer than the run, so the tickets
//! without a stream are not skipped as away and the line moves at the
//! rate, not faster. Use a room of its own: the tool changes its settings.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;
use tokio::time::Instant;

use super::streams::{connect_all, join_many, start_workers, unix_us, wait_until_open};
use crate::api::Api;
use crate::cli::{CadenceArgs, default_workers};
use crate::probe::ProcessCpu;
use crate::report::Report;

/// Depth bands reported: the line cut in this many equal parts.
const BANDS: usize = 5;

pub async fn run(args: &CadenceArgs) -> anyhow::Result<Report> {
    let common = &args.common;
    let Some(admin) = common.admin_token.as_deref() else {
        bail!("cadence sets the room up through the admin API: give --admin-token");
    };
    let apis: Vec<Api> = common
        .targets
        .iter()
        .map(|t| Api::new(t, &common.room))
        .collect();
    let deadline = Instant::now() + crate::cli::secs(common.max_seconds);
    let mut controls = connect_all(&apis).await?;
    let setup = json!({
        "paused": true,
        "capacity": 1_000_000,
        "admit_per_minute": args.rate * 60,
        "queue_idle": "6h",
        "away_grace": "3h",
    });
    apis[0]
        .admin_patch(&mut controls[0], admin, &setup)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    // The line, in queue order; every stride-th ticket, from the middle
    // of its stride, gets a stream.
    let tickets = join_many(&apis, args.line, 32, "line", true).await?;
    let stride = (tickets.len() / args.streams).max(1);
    let visitors: Vec<(u64, String)> = tickets
        .iter()
        .skip(stride / 2)
        .step_by(stride)
        .take(args.streams)
        .cloned()
        .collect();
    // Depth of each stream (the tickets ahead of it), by stream index.
    let depth: Vec<u64> = visitors
        .iter()
        .map(|(number, _)| number.saturating_sub(tickets[0].0))
        .collect();
    drop(tickets);

    let workers = args
        .workers
        .unwrap_or_else(|| default_workers(visitors.len()));
    let w = start_workers(&apis, &visitors, workers).await?;
    let (opened, failed) = wait_until_open(&w, visitors.len(), apis.len(), deadline)
        .await?
        .iter()
        .fold((0, 0), |(o, f), (a, b)| (o + a, f + b));
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The line moves.
    let pids = &args.server_pids;
    let cpu_before: Vec<ProcessCpu> = pids.iter().map(|&p| ProcessCpu::read(p)).collect();
    let t0 = unix_us();
    apis[0]
        .admin_patch(&mut controls[0], admin, &json!({ "paused": false }))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let window = crate::cli::secs(args.seconds);
    tokio::time::sleep(window.min(deadline.saturating_duration_since(Instant::now()))).await;
    let t1 = unix_us();
    let cpu: Option<f64> = pids
        .iter()
        .zip(&cpu_before)
        .map(|(&p, before)| ProcessCpu::read(p).since(before))
        .sum();
    apis[0]
        .admin_patch(&mut controls[0], admin, &json!({ "paused": true }))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for stop in w.stops {
        stop();
    }

    // Each stream's position events in the window, and when it stopped
    // waiting (its `admitted`), so only its waiting time counts.
    let mut positions: HashMap<usize, u64> = HashMap::new();
    let mut admitted: HashMap<usize, u64> = HashMap::new();
    for e in w
        .events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|e| (t0..t1).contains(&e.recv_us))
    {
        match e.kind.as_str() {
            "position" => *positions.entry(e.idx).or_default() += 1,
            "admitted" => {
                admitted.entry(e.idx).or_insert(e.recv_us);
            }
            _ => {}
        }
    }
    let line = args.line.max(1);
    let mut band_events = [0u64; BANDS];
    let mut band_secs = [0f64; BANDS];
    for (idx, d) in depth.iter().enumerate() {
        let band = ((*d as usize) * BANDS / line as usize).min(BANDS - 1);
        let until = admitted.get(&idx).copied().unwrap_or(t1);
        band_secs[band] += until.saturating_sub(t0) as f64 / 1e6;
        band_events[band] += positions.get(&idx).copied().unwrap_or(0);
    }
    let events: u64 = band_events.iter().sum();
    let visitor_secs: f64 = band_secs.iter().sum();
    let per_visitor_second = events as f64 / visitor_secs.max(1e-9);
    let secs = (t1 - t0) as f64 / 1e6;

    let mut r = Report::new("cadence", &common.targets_label());
    r.row(
        "line",
        format!(
            "{} tickets, {} streams at depths {}…{} ({} open, {} failed)",
            args.line,
            visitors.len(),
            depth.first().copied().unwrap_or(0),
            depth.last().copied().unwrap_or(0),
            opened,
            failed
        ),
    );
    r.row(
        "moving",
        format!("{:.1} s at {} admissions a second", secs, args.rate),
    );
    r.row(
        "position events",
        format!(
            "{events} to waiting streams; {} streams admitted",
            admitted.len()
        ),
    );
    r.row(
        "updates per waiting visitor per second",
        format!("{per_visitor_second:.3}"),
    );
    for b in 0..BANDS {
        r.row(
            &format!("  depth {}–{} %", b * 100 / BANDS, (b + 1) * 100 / BANDS),
            format!(
                "{:.3} per visitor per second",
                band_events[b] as f64 / band_secs[b].max(1e-9)
            ),
        );
    }
    if let Some(cpu) = cpu {
        r.row(
            "server CPU while the line moved",
            format!(
                "{:.1} % of a core; {:.1} µs per position event",
                cpu / (secs * 1e6) * 100.0,
                cpu / events.max(1) as f64
            ),
        );
        r.figure("server_cpu_us", cpu);
    }
    r.figure("streams", visitors.len());
    r.figure("line", args.line);
    r.figure("rate", args.rate);
    r.figure("seconds", secs);
    r.figure("position_events", events);
    r.figure("updates_per_visitor_second", per_visitor_second);
    r.figure(
        "bands",
        (0..BANDS)
            .map(|b| band_events[b] as f64 / band_secs[b].max(1e-9))
            .collect::<Vec<_>>(),
    );
    r.invariants_held = failed == 0;
    Ok(r)
}
