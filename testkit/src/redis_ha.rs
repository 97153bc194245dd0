//! Replicated Redis for the failover tests: a primary with a replica
//! watched by three sentinels (`redis-server --sentinel`), and a Redis
//! Cluster whose masters may each have a replica. Every node is a real
//! process on free loopback ports in its own temp dir, killed on drop.
//!
//! Timeouts are short (a node is judged down after 1 s) so that a failover
//! takes seconds, not the production defaults' half minute.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use narabu::config::{RedisTarget, SentinelTarget};

use crate::redis_server::{RedisServer, free_port, wait_for_port};

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "narabu";

/// How long a node may be silent before sentinels or cluster peers call it
/// down.
pub const DOWN_AFTER_MS: u64 = 1000;

/// One `redis-server --sentinel` process.
pub struct Sentinel {
    pub port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Sentinel {
    /// A sentinel watching the primary on `primary_port`; two sentinels
    /// must agree that it is down.
    pub async fn start(primary_port: u16) -> Self {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        // Sentinel rewrites its file as it learns the replicas and peers.
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nprotected-mode no\n\
                 dir {dir}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.path().display(),
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        wait_for_port(port).await;
        Self {
            port,
            child,
            _dir: dir,
        }
    }

    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The primary's port as this sentinel names it now.
    pub async fn primary_port(&self) -> Option<u16> {
        let mut c = self.client().await;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query_async(&mut c)
            .await
            .ok()?;
        addr.map(|(_, port)| port)
    }

    /// How many replicas and other sentinels this sentinel knows.
    async fn known(&self) -> (usize, usize) {
        let mut c = self.client().await;
        let mut count = async |what: &str| {
            let list: redis::RedisResult<Vec<redis::Value>> = redis::cmd("SENTINEL")
                .arg(what)
                .arg(MASTER_NAME)
                .query_async(&mut c)
                .await;
            list.map(|l| l.len()).unwrap_or(0)
        };
        (count("REPLICAS").await, count("SENTINELS").await)
    }
}

/// A primary, its replicas and three sentinels.
pub struct SentinelSet {
    pub primary: RedisServer,
    pub replicas: Vec<RedisServer>,
    pub sentinels: Vec<Sentinel>,
}

impl SentinelSet {
    /// Starts the set and waits until every sentinel knows every replica
    /// and the other sentinels, so that a failover can be agreed on.
    /// The primary keeps an append-only file, so it can be restarted with
    /// its data.
    pub async fn start(replicas: usize) -> Self {
        let primary = RedisServer::start_persistent().await;
        let mut set = Self {
            replicas: Vec::new(),
            sentinels: Vec::new(),
            primary,
        };
        for _ in 0..replicas {
            set.replicas
                .push(RedisServer::start_replica_of(set.primary.port).await);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for r in &set.replicas {
            while !replica_in_sync(r.port).await {
                assert!(Instant::now() < deadline, "a replica did not sync");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        for _ in 0..3 {
            set.sentinels.push(Sentinel::start(set.primary.port).await);
        }
        // Sentinels find replicas and each other through the primary's
        // hello channel, every couple of seconds.
        let deadline = Instant::now() + Duration::from_secs(30);
        for s in &set.sentinels {
            while s.known().await != (replicas, 2) {
                assert!(
                    Instant::now() < deadline,
                    "the sentinels did not find each other and the replicas"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        set
    }

    /// Where Narabu finds the primary: the sentinels and the name.
    pub fn target(&self) -> RedisTarget {
        RedisTarget::Sentinel(SentinelTarget {
            sentinels: self
                .sentinels
                .iter()
                .map(|s| ("127.0.0.1".to_owned(), s.port))
                .collect(),
            master_name: MASTER_NAME.to_owned(),
            password: None,
            sentinel_password: None,
        })
    }

    /// Waits until every sentinel names a primary on another port than
    /// `old`, and returns that port.
    pub async fn wait_for_new_primary(&self, old: u16, within: Duration) -> u16 {
        let deadline = Instant::now() + within;
        loop {
            let mut named = Vec::new();
            for s in &self.sentinels {
                named.push(s.primary_port().await);
            }
            if let Some(Some(port)) = named.first()
                && *port != old
                && named.iter().all(|n| *n == Some(*port))
            {
                return *port;
            }
            assert!(Instant::now() < deadline, "no failover: {named:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Writes something on `node` and waits until `replicas` replicas have it,
/// so that everything written before is on them too.
pub async fn replicated(node: &RedisServer, key: &str, replicas: usize) {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut c = redis::Client::open(node.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("1")
        .query_async(&mut c)
        .await
        .unwrap();
    let acked: usize = redis::cmd("WAIT")
        .arg(replicas)
        .arg(5000)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(acked, replicas, "the replicas caught up");
}

/// A Redis Cluster on loopback: `masters` masters, each with `replicas`
/// replicas, slots spread by `redis-cli --cluster create`.
pub struct RedisCluster {
    /// Masters first, in slot order (the first holds slots from 0), then
    /// replicas.
    pub nodes: Vec<RedisServer>,
    pub masters: usize,
}

impl RedisCluster {
    pub async fn start(masters: usize, replicas: usize) -> Self {
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            nodes.push(RedisServer::start_cluster_node(DOWN_AFTER_MS).await);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli is installed with redis-server");
        assert!(
            created.status.success(),
            "{}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = Self { nodes, masters };
        let deadline = Instant::now() + Duration::from_secs(30);
        let total = cluster.nodes.len();
        for n in &cluster.nodes {
            // `cluster_state:ok` alone can come before a node has met
            // every other one (gossip takes a moment on a busy machine),
            // and a client that asks it then is sent to a node not yet
            // known: wait for the whole picture on every node.
            while !cluster_formed(n.port, total).await {
                assert!(Instant::now() < deadline, "the cluster did not form");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if replicas > 0 {
            for n in &cluster.nodes[masters..] {
                while !replica_in_sync(n.port).await {
                    assert!(Instant::now() < deadline, "a replica did not sync");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        cluster
    }

    /// The masters as seed nodes, as an operator would list them.
    pub fn target(&self) -> RedisTarget {
        RedisTarget::Cluster {
            nodes: self.nodes[..self.masters]
                .iter()
                .map(RedisServer::url)
                .collect(),
        }
    }

    /// The node (index into `nodes`) that holds `key` now, asked of a node
    /// that is up.
    pub async fn owner_of(&self, key: &str) -> Option<usize> {
        for n in &self.nodes {
            let Ok(mut c) = redis::Client::open(n.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
            else {
                continue;
            };
            let slot: redis::RedisResult<u16> = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(key)
                .query_async(&mut c)
                .await;
            // Each entry: [first slot, last slot, [ip, port, id] of the
            // master, then of each replica].
            let shards: redis::RedisResult<Vec<Vec<redis::Value>>> =
                redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await;
            let (Ok(slot), Ok(shards)) = (slot, shards) else {
                continue;
            };
            let int = |v: Option<&redis::Value>| match v {
                Some(redis::Value::Int(n)) => Some(*n),
                _ => None,
            };
            for shard in shards {
                let (Some(from), Some(to)) = (int(shard.first()), int(shard.get(1))) else {
                    continue;
                };
                if !(from..=to).contains(&i64::from(slot)) {
                    continue;
                }
                let Some(redis::Value::Array(master)) = shard.get(2) else {
                    return None;
                };
                let port = int(master.get(1))?;
                return self.nodes.iter().position(|n| i64::from(n.port) == port);
            }
            return None;
        }
        None
    }

    /// Waits until every node that is up reports the cluster ok.
    pub async fn wait_ok(&self, up: impl Fn(usize) -> bool, within: Duration) {
        let deadline = Instant::now() + within;
        for (i, n) in self.nodes.iter().enumerate() {
            if !up(i) {
                continue;
            }
            while !cluster_ok(n.port).await {
                assert!(Instant::now() < deadline, "the cluster is not ok again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn cluster_formed(port: u16, nodes: usize) -> bool {
    info(port, &["CLUSTER", "INFO"]).await.is_some_and(|i| {
        i.contains("cluster_state:ok")
            && i.contains("cluster_slots_ok:16384")
            && i.contains(&format!("cluster_known_nodes:{nodes}\r"))
    })
}

async fn cluster_ok(port: u16) -> bool {
    info(port, &["CLUSTER", "INFO"])
        .await
        .is_some_and(|i| i.contains("cluster_state:ok"))
}

/// Waits until `replica` has synced with its primary (a full sync first
/// takes a fork and a copy, seconds on a busy machine).
pub async fn wait_in_sync(replica: &RedisServer, within: Duration) {
    let deadline = Instant::now() + within;
    while !replica_in_sync(replica.port).await {
        assert!(Instant::now() < deadline, "the replica did not sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn replica_in_sync(port: u16) -> bool {
    info(port, &["INFO", "replication"])
        .await
        .is_some_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
}

/// A command's text answer from the node on `port`, if it is up.
async fn info(port: u16, command: &[&str]) -> Option<String> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    redis::cmd(command[0])
        .arg(&command[1..])
        .query_async(&mut c)
        .await
        .ok()
}
