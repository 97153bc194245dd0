//! The primary that Redis Sentinel names, followed across failovers.
//!
//! The sentinels are asked for the primary (the `redis` crate's sentinel
//! client, which also checks that the node it names calls itself a master)
//! when there is no connection yet, and again whenever the one in use
//! fails: a connection error, a timeout, or `READONLY` from an old primary
//! that came back as a replica. While no primary can be found every request
//! fails at once (`BackendError::Unavailable`, so visitors get 503 with
//! Retry-After and the gate follows `on_backend_error`), asking the
//! sentinels again at most every `RETRY_AFTER`. A background task also
//! listens to the sentinels' `+switch-master` announcements, so a failover
//! is followed even by an instance that happened to send nothing meanwhile,
//! and the pub/sub subscriber moves to the new primary at once.
//!
//! Scripts need no care here: `redis::Script` loads a script again when the
//! new primary answers NOSCRIPT.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, Value};
use redis::{RedisResult, ServerErrorKind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::conn::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use crate::config::SentinelTarget;

/// How long one search for the primary may take (the sentinels, then the
/// node they name), and how soon after a failed search the next may start.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(2);
const RETRY_AFTER: Duration = Duration::from_millis(200);

pub struct Primary {
    master_name: String,
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Current>,
    /// Bumped when the sentinels announce a new primary.
    switched: watch::Sender<u64>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Current {
    connection: Option<(u64, MultiplexedConnection)>,
    next_id: u64,
    failed_at: Option<Instant>,
}

impl Drop for Primary {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Primary {
    /// The sentinels' client, and the primary found once: a start with no
    /// sentinel or no primary fails here, with what went wrong.
    pub async fn connect(target: &SentinelTarget) -> anyhow::Result<Arc<Self>> {
        let addrs = target
            .sentinels
            .iter()
            .map(|(host, port)| ConnectionAddr::Tcp(host.clone(), *port));
        let mut builder =
            SentinelClientBuilder::new(addrs, &target.master_name, SentinelServerType::Master)?;
        if let Some(p) = &target.password {
            builder = builder.set_client_to_redis_password(p.expose());
        }
        if let Some(p) = &target.sentinel_password {
            builder = builder.set_client_to_sentinel_password(p.expose());
        }
        let primary = Arc::new(Self {
            master_name: target.master_name.clone(),
            sentinels: tokio::sync::Mutex::new(builder.build()?),
            current: Mutex::default(),
            switched: watch::Sender::new(0),
            stop: CancellationToken::new(),
        });
        primary
            .connection()
            .await
            .map_err(|e| anyhow::anyhow!(primary.describe(&e)))?;
        tokio::spawn(watch_announcements(
            Arc::downgrade(&primary),
            primary.stop.clone(),
        ));
        Ok(primary)
    }

    /// What went wrong in a search, for the start-up error and the logs:
    /// never an address with a password in it.
    fn describe(&self, e: &RedisError) -> String {
        let name = &self.master_name;
        match e.kind() {
            ErrorKind::MasterNameNotFoundBySentinel => {
                format!("no sentinel knows a primary named {name:?} (redis_master_name)")
            }
            ErrorKind::InvalidClientConfig => {
                format!("no sentinel answered as a sentinel (redis_sentinels): {e}")
            }
            _ if e.is_timeout() => {
                format!("the sentinels or the primary {name:?} did not answer in time")
            }
            _ if e.kind() == ErrorKind::AuthenticationFailed => format!(
                "the primary {name:?} or a sentinel refused the password \
                 (redis_password, redis_sentinel_password)"
            ),
            _ => format!(
                "cannot reach the sentinels or the primary {name:?} ({:?})",
                e.kind()
            ),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection to the primary, found through the sentinels when
    /// there is none.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.lock().connection.clone() {
            return Ok(c);
        }
        // One search at a time; whoever waited for it uses its result.
        let mut sentinels = self.sentinels.lock().await;
        {
            let current = self.lock();
            if let Some(c) = current.connection.clone() {
                return Ok(c);
            }
            if current.failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER) {
                return Err(no_primary());
            }
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let found = tokio::time::timeout(DISCOVERY_TIMEOUT, async {
            let client = sentinels.async_get_client().await?;
            let address = client.get_connection_info().addr().to_string();
            let connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            Ok::<_, RedisError>((address, connection))
        })
        .await
        .unwrap_or_else(|_| Err(timed_out()));
        let mut current = self.lock();
        match found {
            Ok((address, connection)) => {
                tracing::info!(%address, master = %self.master_name, "redis primary found through the sentinels");
                current.next_id += 1;
                current.connection = Some((current.next_id, connection.clone()));
                current.failed_at = None;
                Ok((current.next_id, connection))
            }
            Err(e) => {
                tracing::debug!(detail = %self.describe(&e), "no redis primary");
                current.failed_at = Some(Instant::now());
                Err(e)
            }
        }
    }

    /// Stop using connection `id` (a newer one is left alone).
    fn forget(&self, id: u64) {
        let mut current = self.lock();
        if current.connection.as_ref().is_some_and(|(i, _)| *i == id) {
            current.connection = None;
            tracing::warn!(master = %self.master_name, "redis primary lost; asking the sentinels");
        }
    }

    /// Whether a request's failure means the primary is gone (or is one no
    /// more), and whether it may be sent again to the next primary: only a
    /// `READONLY` refusal is certain to have changed nothing.
    fn judge<T>(&self, id: u64, result: &RedisResult<T>) -> bool {
        let Err(e) = result else { return false };
        let read_only = e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if read_only
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_unrecoverable_error()
        {
            self.forget(id);
        }
        read_only
    }

    pub async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (id, mut con) = self.connection().await?;
        let result = con.req_packed_command(cmd).await;
        if !self.judge(id, &result) {
            return result;
        }
        let (_, mut con) = self.connection().await?;
        con.req_packed_command(cmd).await
    }

    pub async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let (id, mut con) = self.connection().await?;
        let result = con.req_packed_commands(pipeline, offset, count).await;
        if !self.judge(id, &result) {
            return result;
        }
        let (_, mut con) = self.connection().await?;
        con.req_packed_commands(pipeline, offset, count).await
    }

    /// A client for the current primary, for a pub/sub subscription.
    pub async fn client(&self) -> RedisResult<redis::Client> {
        let mut sentinels = self.sentinels.lock().await;
        tokio::time::timeout(DISCOVERY_TIMEOUT, sentinels.async_get_client())
            .await
            .unwrap_or_else(|_| Err(timed_out()))
    }

    /// Changes whenever the sentinels announce a new primary.
    pub fn switches(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer in time",
    ))
}

fn no_primary() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "no redis primary reachable",
    ))
}

/// Listen to the sentinels' `+switch-master` (`<name> <old ip> <old port>
/// <new ip> <new port>`) and drop the connection to the old primary at
/// once. Holds the primary only while handling a message, so dropping the
/// backend ends it.
async fn watch_announcements(primary: Weak<Primary>, stop: CancellationToken) {
    loop {
        let subscribed = async {
            let client = {
                let p = primary.upgrade()?;
                let mut sentinels = p.sentinels.lock().await;
                let found =
                    tokio::time::timeout(DISCOVERY_TIMEOUT, sentinels.async_get_sentinel_client())
                        .await;
                found.ok()?.ok()?
            };
            let mut pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
                .await
                .ok()?
                .ok()?;
            pubsub.subscribe("+switch-master").await.ok()?;
            Some(pubsub)
        };
        let subscribed = tokio::select! {
            () = stop.cancelled() => return,
            s = subscribed => s,
        };
        if let Some(mut pubsub) = subscribed {
            let mut messages = pubsub.on_message();
            loop {
                let msg = tokio::select! {
                    () = stop.cancelled() => return,
                    msg = messages.next() => msg,
                };
                let Some(msg) = msg else { break };
                let Ok(text) = msg.get_payload::<String>() else {
                    continue;
                };
                let Some(p) = primary.upgrade() else { return };
                if text.split(' ').next() == Some(p.master_name.as_str()) {
                    tracing::warn!(announcement = %text, "the sentinels switched the redis primary");
                    let id = p.lock().connection.as_ref().map(|(id, _)| *id);
                    if let Some(id) = id {
                        p.forget(id);
                    }
                    p.switched.send_modify(|n| *n += 1);
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
