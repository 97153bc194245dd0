//! How this instance reaches Redis: one connection type over a single
//! primary (at a fixed address, or the one Redis Sentinel names:
//! `primary.rs`, which opens a new connection when Redis is back or has
//! failed over) or a Redis Cluster (the async cluster client, which routes
//! each script by its first key, the room's hash-tagged meta key, and
//! learns the new owner of a slot after a failover). Both are cheap to
//! clone per call.
//!
//! `Blocking` is a connection of a follower's own, for its blocking reads
//! of a room's change log. `Subscriptions` is the other half: where the
//! pub/sub subscriber
//! connects, again after each loss. A Cluster propagates PUBLISH to every
//! node, so any reachable node will do; otherwise it is the primary of the
//! moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::watch;

use super::primary::Primary;
use crate::backend::BackendError;
use crate::config::RedisTarget;

#[derive(Clone)]
pub enum Conn {
    Primary(Arc<Primary>),
    Cluster(ClusterConnection),
}

/// Short timeouts: a request must fail fast (503 with Retry-After) while
/// Redis is away rather than hold the visitor's connection.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub(super) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

impl Conn {
    /// Connect to the target, failing with a message fit for an operator
    /// (never a URL, which may hold a password) when it cannot be reached.
    pub async fn connect(target: &RedisTarget) -> anyhow::Result<(Self, Subscriptions)> {
        let unreachable = |e: RedisError| anyhow::anyhow!(unavailable(&e));
        let primary = match target {
            RedisTarget::Single { url } => Primary::fixed(url).await.map_err(unreachable)?,
            RedisTarget::Sentinel(target) => Primary::sentinel(target).await?,
            RedisTarget::Cluster { nodes } => {
                // A retry (after MOVED, or a lost node while the slots are
                // fetched again) waits 50-100 ms, not the crate's 1.28 s
                // at least: a request whose master died fails fast.
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .retries(2)
                    .min_retry_wait(50)
                    .max_retry_wait(100)
                    .build()
                    .map_err(unreachable)?;
                let connection = client.get_async_connection().await.map_err(unreachable)?;
                let clients = nodes
                    .iter()
                    .map(|n| redis::Client::open(n.as_str()))
                    .collect::<RedisResult<Vec<_>>>()
                    .map_err(unreachable)?;
                let subscriptions = Subscriptions::Cluster {
                    nodes: clients,
                    next: AtomicUsize::new(0),
                };
                return Ok((Self::Cluster(connection), subscriptions));
            }
        };
        Ok((
            Self::Primary(primary.clone()),
            Subscriptions::Primary(primary),
        ))
    }
}

/// Where the pub/sub subscriber connects.
pub enum Subscriptions {
    Primary(Arc<Primary>),
    /// The seed nodes, tried in turn from the last one that answered.
    Cluster {
        nodes: Vec<redis::Client>,
        next: AtomicUsize,
    },
}

impl Subscriptions {
    /// A pub/sub connection to a node that hears every PUBLISH.
    pub async fn connect(&self) -> RedisResult<PubSub> {
        let within = |client: redis::Client| async move {
            tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
                .await
                .unwrap_or_else(|_| {
                    Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no answer in time",
                    )))
                })
        };
        match self {
            Self::Primary(primary) => within(primary.client().await?).await,
            Self::Cluster { nodes, next } => {
                let start = next.load(Ordering::Relaxed);
                let mut last = None;
                for k in 0..nodes.len() {
                    let i = (start + k) % nodes.len();
                    match within(nodes[i].clone()).await {
                        Ok(pubsub) => {
                            // Come back to this node first next time.
                            next.store(i, Ordering::Relaxed);
                            return Ok(pubsub);
                        }
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.expect("a cluster has at least one node"))
            }
        }
    }

    /// Changes when the node to subscribe to has changed (a Sentinel
    /// failover), so that the subscriber moves even if its old connection
    /// stays open; `None` where there is nothing to watch.
    pub fn switches(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Self::Primary(primary) => Some(primary.switches()),
            Self::Cluster { .. } => None,
        }
    }
}

/// A connection of its own, for a read that blocks on the server (a
/// follower's `XREAD BLOCK`), which on a shared connection would hold up
/// every command queued behind it. Opened anew after each failure: to the
/// primary of the moment, or into the cluster.
pub enum Blocking {
    Primary(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub async fn blocking(&self, target: &RedisTarget) -> RedisResult<Blocking> {
        match (self, target) {
            (_, RedisTarget::Cluster { nodes }) => {
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .retries(2)
                    .build()?;
                Ok(Blocking::Cluster(client.get_async_connection().await?))
            }
            (Self::Primary(primary), _) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                let client = primary.client().await?;
                Ok(Blocking::Primary(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ))
            }
            (Self::Cluster(_), _) => Err(RedisError::from((
                redis::ErrorKind::Client,
                "a cluster connection without cluster nodes",
            ))),
        }
    }
}

impl ConnectionLike for Blocking {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Primary(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Primary(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Primary(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Primary(p) => Box::pin(p.command(cmd)),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Primary(p) => Box::pin(p.pipeline(pipeline, offset, count)),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Primary(p) => p.db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// A Redis failure as the HTTP layer may show it: the kind of failure,
/// never the URL (which may carry a password) nor server output.
pub fn unavailable(e: &RedisError) -> BackendError {
    BackendError::Unavailable(what_failed(e).to_owned())
}

/// The kind of a Redis failure, in words safe to show anyone.
pub fn what_failed(e: &RedisError) -> &'static str {
    let what = if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        "cannot reach Redis"
    } else if e.is_timeout() {
        "Redis did not answer in time"
    } else {
        // A script or server error: worth an operator's look. Server
        // replies name the script and line, never a URL or password.
        tracing::warn!(kind = ?e.kind(), detail = e.detail().unwrap_or(""), "redis refused an operation");
        "Redis refused the operation"
    };
    tracing::debug!(kind = ?e.kind(), "redis error");
    what
}
