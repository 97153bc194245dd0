//! The yardstick: a trivial axum handler for the same paths the scenarios
//! hit, served like Narabu (its own process, a multi-threaded tokio
//! runtime) and hammered the same way in the same run. Throughputs are
//! reported as ratios to it, which hold on a noisy shared machine where
//! absolute numbers do not.

use std::net::SocketAddr;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpListener;

pub fn router() -> Router {
    Router::new()
        .route("/gate/{room}", get(|| async { StatusCode::NO_CONTENT }))
        .route(
            "/api/rooms/{room}/join",
            post(|| async { (StatusCode::CREATED, "{}") }),
        )
        // Any other path: a page, for the `pages` scenario's origin
        // behind the proxies.
        .fallback(|| async { "page" })
}

/// A running baseline server; dropping it stops it.
pub struct Baseline {
    pub addr: SocketAddr,
    /// The serving process, when it is one of its own.
    pub pid: Option<u32>,
    _child: Option<tokio::process::Child>,
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Baseline {
    /// The baseline's process, when it has one of its own (for its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self._child.as_ref().and_then(tokio::process::Child::id)
    }
}

/// Serve the baseline in a process of its own (the tool re-executed with
/// the hidden `baseline-server` command), like the server it is compared to.
pub async fn spawn_process() -> anyhow::Result<Baseline> {
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .arg("baseline-server")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).await?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("the baseline server did not start: {line:?}"))?;
    Ok(Baseline {
        addr,
        pid: child.id(),
        _child: Some(child),
        _stop: None,
    })
}

/// Serve the baseline on a runtime of its own inside this process (tests,
/// where the current executable is the test harness).
pub async fn spawn_in_process() -> anyhow::Result<Baseline> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a runtime for the baseline");
        rt.block_on(async move {
            let listener = TcpListener::from_std(std_listener).expect("listener");
            let _ = axum::serve(listener, router())
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
    });
    Ok(Baseline {
        addr,
        pid: None,
        _child: None,
        _stop: Some(stop),
    })
}

/// The hidden `baseline-server` command: serve until stdin closes.
pub async fn server_main() -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    axum::serve(listener, router())
        .with_graceful_shutdown(async {
            let mut sink = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        })
        .await?;
    Ok(())
}
