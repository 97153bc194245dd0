//! Start-up and shutdown: build the backend from the validated config,
//! serve the router on a listener, run the heartbeat, and on shutdown stop
//! accepting, end every event stream and let the workers finish their tick.
//!
//! `run` takes a bound listener so tests can serve on `127.0.0.1:0`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::backend::embedded::EmbeddedBackend;
use crate::backend::redis::{RedisBackend, RedisOptions};
use crate::config::{self, Config};
use crate::engine::SystemClock;
use crate::http::router::router;
use crate::http::state::{AppState, HttpSettings};
use crate::token::Keyring;

/// Build the backend the configuration names.
pub async fn backend(config: &Config) -> anyhow::Result<Arc<dyn Backend>> {
    match &config.backend {
        config::Backend::Embedded => Ok(EmbeddedBackend::new(
            config.rooms.clone(),
            Arc::new(SystemClock),
        )),
        config::Backend::Redis { url, cluster_nodes } => {
            let options = RedisOptions {
                cluster_nodes: cluster_nodes.clone(),
                ..RedisOptions::new(url.clone())
            };
            let backend =
                RedisBackend::connect(options, config.rooms.clone(), Arc::new(SystemClock))
                    .await
                    .context("starting the Redis backend")?;
            Ok(backend)
        }
    }
}

/// Serve until `shutdown` completes, then shut down gracefully.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let backend = backend(&config).await?;
    serve(listener, config, backend, shutdown).await
}

/// Serve over a given backend (tests pass one they can drive directly).
pub async fn serve(
    listener: TcpListener,
    config: Config,
    backend: Arc<dyn Backend>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let keys = Keyring::from_config(&config).context("loading the ticket signing key")?;
    let settings = Arc::new(HttpSettings::from_config(&config));
    if settings.admin_token.is_none() {
        tracing::info!("no admin token configured: the admin API is off");
    }
    let stop = CancellationToken::new();
    let (beat_tx, heartbeat) = watch::channel(0u64);
    let beat_every = settings.keep_alive;
    let beat_stop = stop.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(beat_every);
        interval.tick().await;
        let mut n = 0u64;
        loop {
            tokio::select! {
                () = beat_stop.cancelled() => return,
                _ = interval.tick() => {
                    n += 1;
                    beat_tx.send_replace(n);
                }
            }
        }
    });
    let state = AppState {
        backend: backend.clone(),
        keys: Arc::new(keys),
        settings,
        shutdown: stop.clone(),
        heartbeat,
    };
    let app = router(state);
    tracing::info!(
        addr = %listener.local_addr()?,
        backend = backend.kind(),
        rooms = config.rooms.len(),
        "narabu is serving"
    );
    let graceful_stop = stop.clone();
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: ending streams, finishing the last tick");
        // Streams end on this, which lets graceful shutdown complete.
        graceful_stop.cancel();
    })
    .await
    .context("serving HTTP")?;
    stop.cancel();
    backend.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
