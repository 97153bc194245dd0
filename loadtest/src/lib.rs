//! The load test tool: simulated visitors against a Narabu instance on
//! this machine, and a report of what they saw. Operators run it before a
//! sale to find their limits; the project uses it to hold Narabu to the
//! performance targets recorded in BENCHMARKS.md and to check its
//! invariants (order, capacity, positions that never go up) from outside,
//! over the same HTTP API browsers use.
//!
//! `cli` parses and guards (loopback targets only), `scenario` holds the
//! scenarios, `http`/`sse`/`api` are the lean client side, `stats` the
//! report's arithmetic and `report` its table, JSON and chart.

pub mod api;
pub mod baseline;
pub mod cli;
pub mod hammer;
pub mod http;
pub mod probe;
pub mod progress;
pub mod push;
pub mod report;
pub mod scenario;
pub mod sse;
pub mod stats;

use cli::{Scenario, StreamsArgs};
use report::Report;

/// Run a parsed scenario and hand back its report (hidden helper commands
/// are run by `main`, not here).
pub async fn run(scenario: &Scenario) -> anyhow::Result<Report> {
    use scenario::hammered::{self, Kind};
    use scenario::surge::Absence;
    cli::validate(scenario).map_err(anyhow::Error::msg)?;
    match scenario {
        Scenario::Surge(a) => {
            let mut rng = rand::rng();
            let mut plan = scenario::surge::Plan::surge(
                a.visitors,
                a.over,
                (a.hold_min_ms, a.hold_max_ms),
                &mut rng,
            );
            plan.gate_every = std::time::Duration::from_millis(a.gate_every_ms);
            plan.capacity = a.capacity;
            plan.order_slack_ms = a.order_slack_ms;
            plan.decrypt_every = a.decrypt_every;
            let absence = if a.subscribe_share > 0.0 {
                Some(Absence::Subscribe(a.subscribe_share))
            } else {
                (a.away_share > 0.0).then_some(Absence::Close(a.away_share))
            };
            if let Some(absence) = absence {
                plan.pause_for_s = Some(a.over + a.away_wait_ms as f64 / 1000.0);
                return scenario::surge::run_twice(&a.common, plan, absence, &a.server_pids).await;
            }
            scenario::surge::run("surge", &a.common, plan).await
        }
        Scenario::Article(a) => {
            let plan = scenario::surge::Plan::article(&mut rand::rng());
            scenario::surge::run("article", &a.common, plan).await
        }
        Scenario::Gate(a) => hammered::run(a, Kind::Gate).await,
        Scenario::Joins(a) => hammered::run(a, Kind::Joins).await,
        Scenario::Baseline(a) => hammered::run(a, Kind::Baseline).await,
        Scenario::Pages(a) => scenario::pages::run(a).await,
        Scenario::Streams(a) => streams(a).await,
        Scenario::Cadence(a) => scenario::cadence::run(a).await,
        Scenario::Bots(a) => scenario::bots::run(a).await,
        Scenario::StreamWorker | Scenario::BaselineServer => {
            anyhow::bail!("internal command")
        }
    }
}

async fn streams(a: &StreamsArgs) -> anyhow::Result<Report> {
    scenario::streams::run(a).await
}

/// Where the chart goes, for the scenarios that draw one.
pub fn svg_path(scenario: &Scenario) -> Option<&std::path::Path> {
    match scenario {
        Scenario::Surge(a) => a.svg.as_deref(),
        Scenario::Article(a) => a.svg.as_deref(),
        _ => None,
    }
}

pub fn json_path(scenario: &Scenario) -> Option<&std::path::Path> {
    match scenario {
        Scenario::Surge(a) => a.common.json.as_deref(),
        Scenario::Article(a) => a.common.json.as_deref(),
        Scenario::Gate(a) | Scenario::Joins(a) | Scenario::Baseline(a) => a.common.json.as_deref(),
        Scenario::Streams(a) => a.common.json.as_deref(),
        Scenario::Pages(a) => a.common.json.as_deref(),
        Scenario::Cadence(a) => a.common.json.as_deref(),
        Scenario::Bots(a) => a.common.json.as_deref(),
        Scenario::StreamWorker | Scenario::BaselineServer => None,
    }
}
