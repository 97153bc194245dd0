//! `loadtest SCENARIO [options]`: see `loadtest --help`. Exits 1 when an
//! invariant check failed, 2 on a usage or setup error.

use clap::Parser;
use loadtest::cli::{Cli, Scenario};

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("loadtest: cannot start the runtime: {e}");
            std::process::exit(2);
        }
    };
    let code = runtime.block_on(async {
        match &cli.scenario {
            Scenario::StreamWorker => done(loadtest::scenario::streams::worker_main().await),
            Scenario::BaselineServer => done(loadtest::baseline::server_main().await),
            scenario => match loadtest::run(scenario).await {
                Ok(report) => {
                    print!("{}", report.table());
                    let mut code = if report.invariants_held { 0 } else { 1 };
                    if let Some(p) = loadtest::json_path(scenario)
                        && let Err(e) = report.write_json(p)
                    {
                        eprintln!("loadtest: writing {}: {e}", p.display());
                        code = 2;
                    }
                    if let Some(p) = loadtest::svg_path(scenario)
                        && let Err(e) = report.write_svg(p)
                    {
                        eprintln!("loadtest: writing {}: {e}", p.display());
                        code = 2;
                    }
                    code
                }
                Err(e) => {
                    eprintln!("loadtest: {e:#}");
                    2
                }
            },
        }
    });
    // Worker processes and the baseline child are killed on drop.
    drop(runtime);
    std::process::exit(code);
}

fn done(r: anyhow::Result<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("loadtest: {e:#}");
            2
        }
    }
}
