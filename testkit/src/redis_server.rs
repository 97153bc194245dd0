//! A real `redis-server` for each test, on a free loopback port, in a temp
//! dir, killed on drop; and builders for both backends over one clock.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use narabu::backend::Backend;
use narabu::backend::embedded::EmbeddedBackend;
use narabu::backend::owned::{OwnedBackend, OwnedOptions};
use narabu::backend::owner::OwnerOptions;
use narabu::backend::redis::store::RedisStore;
use narabu::config::RedisWait;
use narabu::engine::{Clock, ManualClock, RoomSettings};

pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    persistent: bool,
    /// What kind of node it is (cluster node, replica), on every launch.
    role: Vec<String>,
}

/// A loopback port nothing listens on, for a server a test starts.
///
/// Not one the kernel picks (`bind(0)`): those come from the ephemeral
/// range, and between this check and the server's own bind the tests'
/// many outgoing connections take ports from that same range, so one of
/// them could take it first (a server that then fails to start). These
/// come from below the ephemeral range, each process walking its own
/// stretch of it from an offset its id picks.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % SPAN,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    loop {
        let port = (LOW + NEXT.fetch_add(1, Ordering::AcqRel) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

impl RedisServer {
    /// No persistence: state lives as long as the process.
    pub async fn start() -> Self {
        Self::start_with(false).await
    }

    /// With an append-only file in its dir, so a restart keeps the state.
    pub async fn start_persistent() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(persistent: bool) -> Self {
        Self::start_as(free_port(), persistent, Vec::new()).await
    }

    async fn start_as(port: u16, persistent: bool, role: Vec<String>) -> Self {
        let mut server = Self {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
            persistent,
            role,
        };
        // Another process's test may have taken the port between the check
        // and the start: then the server answering is not this one (it
        // failed to bind), and another port is tried.
        for _ in 0..5 {
            server.launch(&[]).await;
            if server.answers_as_itself().await {
                return server;
            }
            server.kill();
            server.port = free_port();
        }
        panic!("no free port for a redis-server of this test's own");
    }

    /// Whether the server on this port is the process this started.
    async fn answers_as_itself(&mut self) -> bool {
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let mut c = self.client().await;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .unwrap_or_default();
        info.lines()
            .any(|l| l.trim() == format!("process_id:{pid}"))
    }

    /// A replica of the server on `primary_port`, persistent like it.
    pub async fn start_replica_of(primary_port: u16) -> Self {
        let role = vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary_port.to_string(),
        ];
        Self::start_as(free_port(), true, role).await
    }

    /// A Redis Cluster node (not yet part of a cluster) that calls a peer
    /// down after `node_timeout_ms`, with an append-only file. Its bus
    /// port, port + 10000, must be free too.
    pub async fn start_cluster_node(node_timeout_ms: u64) -> Self {
        let port = loop {
            let p = free_port();
            if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
                break p;
            }
        };
        let role = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &node_timeout_ms.to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        Self::start_as(port, true, role).await
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Start the process (again), with `extra` arguments.
    pub async fn launch(&mut self, extra: &[&str]) {
        let port = self.port.to_string();
        let mut args: Vec<&str> = vec![
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ];
        if self.persistent {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            args.extend(["--appendonly", "no"]);
        }
        args.extend(self.role.iter().map(String::as_str));
        args.extend(extra);
        let child = Command::new("redis-server")
            .args(&args)
            .current_dir(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        self.child = Some(child);
        wait_for_port(self.port).await;
    }

    /// Kill the server (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn wait_for_port(port: u16) {
    for _ in 0..200 {
        if let Ok(mut c) = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
        {
            let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut c).await;
            if pong.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("redis-server on port {port} did not come up");
}

/// Rooms run by their owners on `redis` (the store opened and its schema
/// checked), with `owner`'s lease and ticks, waiting for `wait` replicas.
pub async fn owners_on(
    redis: &RedisServer,
    rooms: Vec<RoomSettings>,
    clock: Arc<dyn Clock>,
    owner: OwnerOptions,
    wait: RedisWait,
) -> Arc<OwnedBackend> {
    let store = RedisStore::connect(&redis.url().into(), wait)
        .await
        .unwrap();
    let options = OwnedOptions {
        owner,
        ..OwnedOptions::default()
    };
    OwnedBackend::start(Arc::new(store), rooms, clock, options)
}

/// An owner whose room ticks only when the test says so (virtual time).
pub fn ticked_by_the_test() -> OwnerOptions {
    OwnerOptions {
        ticks: false,
        ..OwnerOptions::default()
    }
}

/// Which backend a conformance test body runs against.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Embedded,
    /// Rooms run by their owners, with Redis as each room's log and bus.
    Redis,
}

/// A backend without workers on a manual clock, and what keeps it alive.
pub struct Harness {
    pub backend: Arc<dyn Backend>,
    /// `backend` and, for `instances`, the other instances: on Redis each
    /// its own backend (as another process would have) on the one Redis;
    /// embedded, the one backend again (one process has one).
    pub backends: Vec<Arc<dyn Backend>>,
    pub clock: ManualClock,
    _redis: Option<RedisServer>,
}

pub const T0: u64 = 1_800_000_000_000;

impl Harness {
    /// The Redis server of a Redis harness.
    pub fn redis(&self) -> &RedisServer {
        self._redis.as_ref().expect("a Redis harness")
    }

    pub async fn new(kind: Kind, rooms: Vec<RoomSettings>) -> Self {
        Self::instances(kind, rooms, 1).await
    }

    /// `n` instances sharing the rooms, on one clock.
    pub async fn instances(kind: Kind, rooms: Vec<RoomSettings>, n: usize) -> Self {
        let clock = ManualClock::new(T0);
        match kind {
            Kind::Embedded => {
                let backend: Arc<dyn Backend> =
                    EmbeddedBackend::without_workers(rooms, Arc::new(clock.clone()));
                Self {
                    backends: vec![backend.clone(); n],
                    backend,
                    clock,
                    _redis: None,
                }
            }
            Kind::Redis => {
                let server = RedisServer::start().await;
                let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
                for _ in 0..n {
                    backends.push(
                        owners_on(
                            &server,
                            rooms.clone(),
                            Arc::new(clock.clone()),
                            ticked_by_the_test(),
                            RedisWait::OFF,
                        )
                        .await,
                    );
                }
                Self {
                    backend: backends[0].clone(),
                    backends,
                    clock,
                    _redis: Some(server),
                }
            }
        }
    }
}
