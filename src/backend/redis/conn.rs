//! One connection type over a single Redis (the tokio `ConnectionManager`,
//! which reconnects by itself when Redis returns) or a Redis Cluster (the
//! async cluster client, which routes each script by its first key, the
//! room's hash-tagged meta key). Both are cheap to clone per call.

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};
use std::time::Duration;

use crate::backend::BackendError;

#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Short timeouts: a request must fail fast (503 with Retry-After) while
/// Redis is away rather than hold the visitor's connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

impl Conn {
    pub async fn connect(url: &str, cluster_nodes: &[String]) -> Result<Self, RedisError> {
        if cluster_nodes.is_empty() {
            let client = redis::Client::open(url)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(2)
                .set_max_delay(Duration::from_millis(500));
            Ok(Self::Single(
                ConnectionManager::new_with_config(client, config).await?,
            ))
        } else {
            let client = ClusterClient::builder(cluster_nodes.to_vec())
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .retries(2)
                .build()?;
            Ok(Self::Cluster(client.get_async_connection().await?))
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
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
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// A Redis failure as the HTTP layer may show it: the kind of failure,
/// never the URL (which may carry a password) nor server output.
pub fn unavailable(e: &RedisError) -> BackendError {
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
    BackendError::Unavailable(what.to_owned())
}
