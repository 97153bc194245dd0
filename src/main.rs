//! The `narabu` command: parse arguments and configuration, bind, serve.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use narabu::config::{Config, LogFormat};

#[derive(Parser)]
#[command(name = "narabu", version, about = "A fair virtual waiting room")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the waiting room (embedded engine and a default room unless a
    /// config file says otherwise).
    Serve {
        /// A TOML configuration file (see config/narabu.toml).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Listen address, overriding the config file.
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Data directory, overriding the config file.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Check a room's opening draw from its public record: the seed must
    /// hash to the commitment, and the order must be the one the seed
    /// gives. Exits 0 when it checks out, 1 when it does not (or cannot be
    /// read), 3 when the room has not drawn yet.
    VerifyDraw {
        /// The draw record (https://HOST/api/rooms/ROOM/draw) or the room's
        /// queue page (https://HOST/queue/ROOM).
        url: String,
    },
    /// Check a visitor's receipt against a room's published keys: the
    /// signature, that it is a receipt (not a pass), and its room. Prints
    /// what it says. Exits 0 when it checks out, 1 when it does not.
    VerifyReceipt {
        /// The receipt: the JWT itself, or a file holding it (or holding the
        /// JSON of GET /api/rooms/ROOM/receipt).
        receipt: String,
        /// The published keys: https://HOST/.well-known/jwks.json, or a
        /// file with that document.
        #[arg(long, value_name = "URL|FILE")]
        keys: String,
        /// The room the receipt must be of.
        #[arg(long)]
        room: Option<String>,
    },
    /// Check a room's admission record: the hash chain (naming the first
    /// entry that fails), the opening draw, admissions out of ticket order
    /// within a lane and what explains them, each lane's share against its
    /// weight, and where a receipt's ticket stood. Exits 0 when it checks
    /// out, 1 when the chain or the draw does not (or cannot be read), 2
    /// when admissions are out of order with nothing to explain them.
    VerifyRecord {
        /// The record (https://HOST/api/rooms/ROOM/record), the room's queue
        /// page, or a file of record pages (one JSON page, several one per
        /// line, or a JSON array of them).
        record: String,
        /// A receipt to find in the record (the JWT, or a file holding it).
        #[arg(long)]
        receipt: Option<String>,
        /// The published keys the receipt is checked with (default: the
        /// server's /.well-known/jwks.json, for a record read from a
        /// server).
        #[arg(long, value_name = "URL|FILE")]
        keys: Option<String>,
        /// A head hash saved earlier (a status answer's `record.head`): it
        /// must be on the chain.
        #[arg(long, value_name = "HEX")]
        head: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (config, listen, data_dir) = match cli.command {
        Command::Serve {
            config,
            listen,
            data_dir,
        } => (config, listen, data_dir),
        Command::VerifyDraw { url } => return verify_draw(&url),
        Command::VerifyReceipt {
            receipt,
            keys,
            room,
        } => return verify_receipt(&receipt, &keys, room.as_deref()),
        Command::VerifyRecord {
            record,
            receipt,
            keys,
            head,
        } => {
            return verify_record(
                &record,
                receipt.as_deref(),
                keys.as_deref(),
                head.as_deref(),
            );
        }
    };
    let mut config = match &config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("narabu: {e}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if let Err(e) = config.apply_env(|name| std::env::var(name).ok()) {
        eprintln!("narabu: {e}");
        return ExitCode::from(2);
    }
    if let Some(listen) = listen {
        config.listen = listen;
    }
    if let Some(dir) = data_dir {
        config.data_dir = dir;
    }
    // The page templates and message files are part of the configuration:
    // a broken one stops the start here, before anything listens (the
    // server loads them again, and checks them again, when it starts).
    if let Err(e) = narabu::http::pages::PageBook::load(&config) {
        eprintln!("narabu: {e}");
        return ExitCode::from(2);
    }
    init_logs(config.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("narabu: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(config.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("narabu: cannot listen on {}: {e}", config.listen);
                return ExitCode::FAILURE;
            }
        };
        if let Ok(addr) = listener.local_addr() {
            // Scripts and tests that pass port 0 read the address from here.
            println!("narabu listening on http://{addr}");
        }
        match narabu::server::run(listener, config, narabu::server::shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("narabu: {e:#}");
                ExitCode::FAILURE
            }
        }
    })
}

fn init_logs(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("NARABU_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,tower_http=warn"));
    let colour = colour(
        std::io::IsTerminal::is_terminal(&std::io::stdout()),
        std::env::var_os("NO_COLOR"),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Plain => builder.init(),
    }
}

/// Colour codes only for a person at a terminal: never in a file, a pipe
/// or a journal, and never when `NO_COLOR` is set to anything but empty
/// (the no-color.org convention).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

fn verify_draw(url: &str) -> ExitCode {
    use narabu::verify::{SERVER, VERDICT, Verdict, escaped, shown, verify};
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("narabu: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Whatever the server sent is echoed only after SERVER and escaped;
    // the last line, the verdict, alone begins with VERDICT.
    let echo = |draw: &narabu::http::draw::DrawBody| {
        println!("{SERVER}room        {}", shown(&draw.room));
        println!("{SERVER}commitment  {}", shown(&draw.commitment));
        if let Some(seed) = &draw.seed {
            println!("{SERVER}seed        {}", shown(seed));
        }
        if let Some(order) = &draw.order {
            println!("{SERVER}order       {} tickets", order.len());
        }
    };
    match runtime.block_on(verify(url)) {
        Ok(Verdict::Verified(draw)) => {
            echo(&draw);
            let n = draw.order.as_ref().map_or(0, Vec::len);
            println!(
                "{VERDICT}VERIFIED: the draw checks out: SHA-256(seed) is the commitment, \
                 and the order of the {n} tickets is exactly the seed's"
            );
            ExitCode::SUCCESS
        }
        Ok(Verdict::NotDrawn(draw)) => {
            echo(&draw);
            println!("{VERDICT}NOT DRAWN YET: only the commitment is published");
            ExitCode::from(3)
        }
        Ok(Verdict::Mismatch(draw, why)) => {
            echo(&draw);
            println!(
                "{VERDICT}NOT VERIFIED: the draw does NOT check out: {}",
                escaped(&why.to_string())
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("narabu: {}", escaped(&format!("{e:#}")));
            println!("{VERDICT}NOT VERIFIED: the draw could not be checked");
            ExitCode::FAILURE
        }
    }
}

fn verify_receipt(receipt: &str, keys: &str, room: Option<&str>) -> ExitCode {
    use narabu::verify::{SERVER, VERDICT, escaped, shown};
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("narabu: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let checked = runtime.block_on(async {
        let token = narabu::receipt::read_token(receipt)?;
        let jwks = narabu::receipt::load_jwks(keys).await?;
        anyhow::Ok(narabu::receipt::verify(&token, &jwks, room))
    });
    match checked {
        Ok(Ok(c)) => {
            println!("{SERVER}room       {}", shown(&c.room));
            println!("{SERVER}epoch      {}", c.epoch);
            println!("{SERVER}ticket     {}", c.ticket);
            match c.number {
                Some(n) => println!("{SERVER}number     {n}"),
                None => println!("{SERVER}number     (in the pre-queue: placed by the draw)"),
            }
            if let Some(lane) = &c.lane {
                println!("{SERVER}lane       {}", shown(lane));
            }
            println!(
                "{SERVER}joined at  {}",
                narabu::engine::Timestamp(c.joined_at)
            );
            println!("{SERVER}issuer     {}", shown(&c.iss));
            println!(
                "{VERDICT}VERIFIED: a receipt of room {}, signed with a published key",
                shown(&c.room)
            );
            ExitCode::SUCCESS
        }
        Ok(Err(why)) => {
            println!("{VERDICT}NOT VERIFIED: {}", escaped(&why.to_string()));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("narabu: {}", escaped(&format!("{e:#}")));
            println!("{VERDICT}NOT VERIFIED: the receipt could not be checked");
            ExitCode::FAILURE
        }
    }
}

fn verify_record(
    input: &str,
    receipt: Option<&str>,
    keys: Option<&str>,
    head: Option<&str>,
) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("narabu: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(check_record(input, receipt, keys, head))
}

async fn check_record(
    input: &str,
    receipt: Option<&str>,
    keys: Option<&str>,
    head: Option<&str>,
) -> ExitCode {
    use narabu::verify::{SERVER, VERDICT, escaped, shown};
    use narabu::verify_record as vr;
    let failed = |why: String| {
        println!("{VERDICT}NOT VERIFIED: {}", escaped(&why));
        ExitCode::FAILURE
    };
    let from_server = input.starts_with("http://") || input.starts_with("https://");
    let fetched = if from_server {
        vr::fetch(input).await
    } else {
        std::fs::read_to_string(input)
            .with_context_str(input)
            .and_then(|text| vr::pages_from_text(&text))
            .and_then(vr::assemble)
    };
    let record = match fetched {
        Ok(r) => r,
        Err(e) => {
            eprintln!("narabu: {}", escaped(&format!("{e:#}")));
            return failed("the record could not be read".into());
        }
    };
    println!("{SERVER}room        {}", shown(&record.room));
    println!("{SERVER}line        {}", record.epoch);
    println!("{SERVER}entries     {}", record.entries.len());
    println!("{SERVER}head        {}", shown(&record.head));
    let saved_at = match vr::check_chain(&record, head) {
        Ok(at) => at,
        Err(broken) => return failed(format!("the chain is broken at {broken}")),
    };
    println!(
        "chain: intact, {} entries from SHA-256(\"narabu-record {} {}\") to the head",
        record.entries.len(),
        shown(&record.room),
        record.epoch
    );
    if let Some(n) = saved_at {
        println!("saved head: entry {n} of the chain: nothing before it was rewritten");
    }
    if from_server {
        let draw = vr::record_url(input).map(|u| vr::sibling(&u, "draw").to_string());
        match narabu::verify::verify(draw.as_deref().unwrap_or(input)).await {
            Ok(narabu::verify::Verdict::Verified(draw)) => {
                let order = draw.order.unwrap_or_default();
                if let Err(broken) = vr::check_draw_numbers(&record, &order) {
                    return failed(format!("the draw's numbers do not match at {broken}"));
                }
                println!(
                    "draw: verified (seed matches its commitment), {} tickets numbered in drawn order",
                    order.len()
                );
            }
            Ok(narabu::verify::Verdict::NotDrawn(_)) => println!("draw: not drawn yet"),
            Ok(narabu::verify::Verdict::Mismatch(_, why)) => {
                return failed(format!("the draw does not check out: {why}"));
            }
            // A room without a draw answers 404.
            Err(e) if format!("{e:#}").contains("404") => {
                println!("draw: none (the room queues first come, first served)");
            }
            Err(e) => return failed(format!("the draw could not be read: {e:#}")),
        }
    }
    let order = vr::order(&record.entries);
    let lane_name = |lane: u8| {
        record
            .lanes
            .get(usize::from(lane))
            .map_or_else(|| "(the line)".to_owned(), |l| shown(&l.name))
    };
    println!(
        "order: {} inversions within lanes (Kendall-tau distance), {} explained, {} unexplained",
        order.inversions,
        order.inversions - order.unexplained,
        order.unexplained
    );
    for late in order.late.iter().take(vr::LISTED) {
        println!(
            "  lane {} ticket {} (number {}) admitted at entry {} after {} higher numbers: {}",
            lane_name(late.lane),
            late.ticket,
            late.number,
            late.entry,
            late.inversions,
            late.why.as_deref().unwrap_or("UNEXPLAINED")
        );
    }
    if order.late.len() > vr::LISTED {
        println!(
            "  … and {} more late tickets",
            order.late.len() - vr::LISTED
        );
    }
    let total: u64 = order.admitted.values().sum();
    let weights: u64 = record.lanes.iter().map(|l| u64::from(l.weight)).sum();
    for (&lane, &n) in &order.admitted {
        let weight = record
            .lanes
            .get(usize::from(lane))
            .map_or(String::new(), |l| {
                format!(
                    ", weight {} ({:.1}%)",
                    l.weight,
                    100.0 * f64::from(l.weight) / weights.max(1) as f64
                )
            });
        println!(
            "share: lane {}: {n} of {total} admissions ({:.1}%){weight}",
            lane_name(lane),
            100.0 * n as f64 / total.max(1) as f64
        );
    }
    if let Some(receipt) = receipt {
        let token = match narabu::receipt::read_token(receipt) {
            Ok(t) => t,
            Err(e) => return failed(format!("the receipt could not be read: {e:#}")),
        };
        let keys = keys.map(str::to_owned).or_else(|| {
            from_server
                .then(|| vr::record_url(input).ok())
                .flatten()
                .map(|u| format!("{}/.well-known/jwks.json", u.origin().ascii_serialization()))
        });
        let claims = match keys {
            Some(keys) => {
                let jwks = match narabu::receipt::load_jwks(&keys).await {
                    Ok(j) => j,
                    Err(e) => return failed(format!("the keys could not be read: {e:#}")),
                };
                match narabu::receipt::verify(&token, &jwks, Some(&record.room)) {
                    Ok(c) => {
                        println!("receipt: signature verified with the published keys");
                        c
                    }
                    Err(e) => return failed(format!("the receipt does not check out: {e}")),
                }
            }
            None => match narabu::receipt::claims_unverified(&token) {
                Ok(c) => {
                    println!("receipt: signature NOT checked (give --keys)");
                    c
                }
                Err(e) => return failed(format!("the receipt could not be read: {e}")),
            },
        };
        let s = vr::locate(&record, &claims);
        if let Some(m) = &s.mismatch {
            return failed(format!("the receipt does not match the record: {m}"));
        }
        println!(
            "receipt: ticket {} stood at number {} in lane {}, joined at {}",
            s.ticket,
            s.number,
            lane_name(s.lane),
            narabu::engine::Timestamp(claims.joined_at)
        );
        match s.admitted {
            Some((n, at)) => println!(
                "receipt: admitted at entry {n}, {} (after {:.1} s in line), {} admitted before it in its lane, {} of them with higher numbers",
                narabu::engine::Timestamp(at),
                at.saturating_sub(claims.joined_at) as f64 / 1000.0,
                s.before,
                s.before_higher
            ),
            None => println!("receipt: not admitted (yet)"),
        }
        if let Some((n, kind)) = &s.last {
            println!("receipt: last entry {n}: {kind}");
        }
    }
    if order.unexplained > 0 {
        println!(
            "{VERDICT}NOT FAIR: the chain is intact, but {} admissions are out of ticket order with nothing in the record to explain them",
            order.unexplained
        );
        return ExitCode::from(2);
    }
    println!(
        "{VERDICT}VERIFIED: the chain is intact and every admission out of ticket order is explained"
    );
    ExitCode::SUCCESS
}

/// `Context` for an I/O result, naming the file.
trait WithPath<T> {
    fn with_context_str(self, path: &str) -> anyhow::Result<T>;
}

impl<T> WithPath<T> for std::io::Result<T> {
    fn with_context_str(self, path: &str) -> anyhow::Result<T> {
        self.map_err(|e| anyhow::anyhow!("reading {path}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }
}
