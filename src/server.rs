//! Start-up and shutdown: build the backend from the validated config,
//! serve the router on a listener, and on shutdown stop accepting, end
//! every event stream and let the workers finish their tick.
//!
//! `run` takes a bound listener so tests can serve on `127.0.0.1:0`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as AutoBuilder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::ChallengeKeys;
use crate::backend::Backend;
use crate::backend::embedded::{EmbeddedBackend, Persistence};
use crate::backend::redis::{self, RedisOptions};
use crate::config::{self, Config};
use crate::connections::{self, First, Rewind};
use crate::engine::SystemClock;
use crate::http::access::AccessBook;
use crate::http::limits::StreamLimiter;
use crate::http::pages::PageBook;
use crate::http::presence::Presence;
use crate::http::router::router;
use crate::http::rule_book::{RouteBook, RuleBook};
use crate::http::state::{AppState, HttpSettings, Shared};
use crate::metrics::Metrics;
use crate::monitor::Monitor;
use crate::pass::PassKeys;
use crate::token::Keyring;
use crate::webhooks::Webhooks;

/// Build the backend the configuration names.
pub(crate) async fn backend(config: &Config) -> anyhow::Result<Arc<dyn Backend>> {
    match &config.backend {
        config::Backend::Embedded => Ok(EmbeddedBackend::open(
            config.rooms.clone(),
            Arc::new(SystemClock),
            Persistence {
                data_dir: config.data_dir.clone(),
                durability: config.durability,
                snapshot_interval: config.snapshot_interval,
            },
            true,
        )
        .await
        .context("loading the embedded state from the data directory")?),
        config::Backend::Redis(target) => {
            let options = RedisOptions {
                wait: config.redis_wait,
                ..RedisOptions::new(target.clone())
            };
            // Boxed: the connection's future is deep enough that holding it
            // inline overflows the compiler's layout depth in `main`.
            let connecting = Box::pin(redis::connect(
                options,
                config.rooms.clone(),
                Arc::new(SystemClock),
            ));
            let backend = connecting.await.context("starting the Redis backend")?;
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
    let keys = Keyring::configured(
        config.secret.as_ref(),
        config.previous_secret.as_ref(),
        &config.data_dir,
    )
    .context("loading the ticket signing key")?;
    let passes = PassKeys::load(
        config.pass_algorithm,
        config.pass_key_file.as_deref(),
        config.previous_pass_key_file.as_deref(),
        &keys,
    )
    .context("loading the pass signing key")?;
    // Before anything serves: a broken template stops the start here.
    let pages = Arc::new(PageBook::load(&config).context("loading the page templates")?);
    let settings = Arc::new(HttpSettings::from_config(&config));
    if settings.admin_token.is_none() {
        tracing::info!("no admin token configured: the admin API is off");
    }
    let stop = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let webhooks = Webhooks::start(config.webhooks.clone(), metrics.clone(), stop.clone());
    let push =
        crate::push::Push::start(&config.push, &keys, metrics.clone(), stop.clone())?.map(Arc::new);
    if let Some(push) = &push {
        tracing::info!(public_key = push.key.public_key(), "web push is on");
    }
    if let Some(push) = &push
        && let Some(due) = backend.callbacks()
    {
        crate::http::notify::deliver(
            due,
            push.clone(),
            backend.clone(),
            pages.clone(),
            stop.clone(),
        );
    }
    let monitor = Monitor::new(backend.clone(), webhooks);
    monitor.start(stop.clone());
    let tunes = crate::autotune::tuner::start(
        backend.clone(),
        monitor.clone(),
        metrics.clone(),
        stop.clone(),
    );
    follow_resets(
        backend.as_ref(),
        monitor.clone(),
        metrics.clone(),
        stop.clone(),
    );
    let access = Arc::new(AccessBook::default());
    // Every room's rules before the first check; the monitor's samples
    // keep them current from here on.
    let rules = Arc::new(RuleBook::new(metrics.clone()));
    let routes = Arc::new(RouteBook::default());
    crate::http::rule_book::watch_files(rules.clone(), stop.clone());
    match backend.list_rooms().await {
        Ok(rooms) => {
            rooms.iter().for_each(|s| rules.observe(&s.settings));
            routes.rebuild(rooms.iter().map(|s| &s.settings));
        }
        Err(e) => {
            tracing::warn!(error = %e, "rooms not read at start; their rules apply from the first sample")
        }
    }
    let presence = Presence::new(config.max_streams_per_ticket);
    tokio::spawn(presence.clone().run(backend.clone(), stop.clone()));
    follow_rooms(
        &monitor,
        access.clone(),
        pages.clone(),
        rules.clone(),
        routes.clone(),
        stop.clone(),
        backend.clock(),
    );
    let writers = crate::http::events::Writers::start(
        backend.clone(),
        backend.clock(),
        settings.keep_alive,
        stop.clone(),
    );
    let state = AppState::new(Shared {
        clock: backend.clock(),
        access,
        challenges: Arc::new(ChallengeKeys::from_keyring(&keys)),
        challenge_fetches: Default::default(),
        pages,
        rules,
        routes,
        tunes,
        streams: StreamLimiter::new(config.max_streams_per_address),
        presence: presence.clone(),
        writers: writers.clone(),
        metrics,
        monitor,
        backend: backend.clone(),
        keys: Arc::new(keys),
        passes: Arc::new(passes),
        push,
        settings,
        shutdown: stop.clone(),
    });
    let app = router(state);
    tracing::info!(
        addr = %listener.local_addr()?,
        backend = backend.kind(),
        rooms = config.rooms.len(),
        "narabu is serving"
    );
    accept_loop(listener, app, shutdown, stop.clone()).await;
    stop.cancel();
    // The writers end every stream they hold (their connections close).
    if tokio::time::timeout(DRAIN_TIMEOUT, writers.closed())
        .await
        .is_err()
    {
        tracing::warn!("the stream writers had not ended after {DRAIN_TIMEOUT:?}");
    }
    backend.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Headers must arrive within this, or the connection is closed: a
/// slowloris client trickling header bytes would otherwise hold a socket
/// (and one of the process's 20,000 files) for as long as it likes.
/// Reports each line the backend found lost and started again: counted in
/// `/metrics` and sent to the webhooks (the backend logs it).
fn follow_resets(
    backend: &dyn Backend,
    monitor: Arc<Monitor>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let Some(mut resets) = backend.line_resets() else {
        return;
    };
    tokio::spawn(async move {
        loop {
            let reset = tokio::select! {
                () = stop.cancelled() => return,
                r = resets.recv() => r,
            };
            match reset {
                Ok(reset) => {
                    metrics.line_reset(reset.room.as_str());
                    monitor.line_reset(&reset).await;
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// Feeds every room's sample to the access, page and rule books each
/// second, so rules and pages changed on another instance apply here and
/// the join rate is known.
fn follow_rooms(
    monitor: &Monitor,
    access: Arc<AccessBook>,
    pages: Arc<PageBook>,
    rules: Arc<RuleBook>,
    routes: Arc<RouteBook>,
    stop: CancellationToken,
    clock: Arc<dyn crate::engine::Clock>,
) {
    let mut overview = monitor.subscribe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                changed = overview.changed() => if changed.is_err() { return },
            }
            let rooms = overview.borrow_and_update().clone();
            let now = clock.now_ms();
            for (snapshot, _) in &rooms.rooms {
                access.observe(snapshot, now);
                pages.observe(snapshot);
                rules.observe(&snapshot.settings);
            }
            routes.rebuild(rooms.rooms.iter().map(|(s, _)| &s.settings));
        }
    });
}

const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for in-flight requests once streams have ended.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Accept connections and serve each with hyper until `shutdown`, then
/// end every stream (`stop`) and let open requests finish. A connection
/// whose first request is an event stream is served by `connections` instead.
///
/// Served with hyper-util directly rather than `axum::serve` for the
/// connection settings it does not expose: the header read timeout (which
/// needs a timer) above all.
async fn accept_loop(
    listener: TcpListener,
    app: crate::http::gate::GateFirst,
    shutdown: impl Future<Output = ()> + Send + 'static,
    stop: CancellationToken,
) {
    let mut builder = AutoBuilder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let graceful = GracefulShutdown::new();
    // Every connection task, hyper's and those served without it alike, so that
    // shutdown can wait for the streams to say goodbye.
    let connections = TaskTracker::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (socket, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of files or memory for a moment: back off rather
                    // than spin, and keep serving the connections we have.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = socket.set_nodelay(true);
        let router = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let stop = stop.clone();
        connections.spawn(async move {
            let mut socket = socket;
            // The slowloris bound holds on this path too, and a connection
            // that has not sent a whole head by shutdown is just closed.
            let first = tokio::select! {
                () = stop.cancelled() => return,
                first = tokio::time::timeout(
                    HEADER_READ_TIMEOUT,
                    connections::read_first(&mut socket, peer),
                ) => match first {
                    Ok(first) => first,
                    Err(_) => return,
                },
            };
            let (socket, prefix) = match first {
                First::Closed => return,
                First::Stream(request) => return connections::serve(socket, request, router).await,
                First::Gate(buf) => {
                    let served = connections::gate::serve(
                        socket,
                        buf,
                        router.clone(),
                        peer.ip(),
                        HEADER_READ_TIMEOUT,
                        stop,
                    );
                    match served.await {
                        connections::gate::Ended::Closed => return,
                        connections::gate::Ended::Handoff(socket, rest) => (socket, rest),
                    }
                }
                First::Other(prefix) => (socket, prefix),
            };
            let service =
                hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                    // A gate check is handed the address itself (a map
                    // would be allocated on every check); every other
                    // route may read it from the request.
                    if !request.uri().path().starts_with("/gate/") {
                        request.extensions_mut().insert(ConnectInfo(peer));
                    }
                    router.serve(request.map(axum::body::Body::new), Some(peer.ip()))
                });
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(Rewind::new(prefix, socket)), service);
            if let Err(e) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!("shutting down: ending streams, finishing the last tick");
    // Streams end on this, which lets their connections close.
    stop.cancel();
    connections.close();
    let drained = async {
        graceful.shutdown().await;
        connections.wait().await;
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
        tracing::warn!("some connections were still open after {DRAIN_TIMEOUT:?}");
    }
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
