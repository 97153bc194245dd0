//! How this instance reaches Redis: one connection type over a single
//! primary (at a fixed address, or the one Redis Sentinel names:
//! `primary.rs`, which opens a new connection when Redis is back or has
//! failed over) or a Redis Cluster (the async cluster client, which routes
//! each command by its first key, which carries the room's hash tag, and
//! learns the new owner of a slot after a failover). Both are cheap to
//! clone per call.
//!
//! `Blocking` is a connection of a reader's own, for its blocking reads of
//! a room's log, commands or replies.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::primary::Primary;
use super::target::RedisTarget;
use crate::backend::BackendError;

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
    pub async fn connect(target: &RedisTarget) -> anyhow::Result<Self> {
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
                return Ok(Self::Cluster(connection));
            }
        };
        Ok(Self::Primary(primary))
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
pub(crate) fn what_failed(e: &RedisError) -> &'static str {
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
