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
