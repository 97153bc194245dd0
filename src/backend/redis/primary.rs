//! The one Redis node that takes this instance's writes: at a fixed
//! address (`redis_url`), or the primary that Redis Sentinel names and
//! renames after a failover (`redis_sentinels`).
//!
//! The connection is opened when there is none, and dropped the moment its
//! socket closes (the connection's driver task ends), so the next request
//! opens a fresh one — even on an instance that sent nothing while Redis
//! was away: its first request after Redis is back does not fail. It is
//! also dropped on a timeout, or on `READONLY` from an old primary that
//! came back as a replica; a `READONLY` refusal is sent once more, to the
//! new primary, since it changed nothing. Only a Sentinel target asks the
//! sentinels again (the `redis` crate's client, which also checks that the
//! node they name calls itself a master).
//!
//! While no primary can be reached requests fail at once
//! (`BackendError::Unavailable`: 503 with Retry-After, and the gate follows
//! `on_backend_error`): one attempt to open a connection runs at a time,
//! bounded by `OPEN_TIMEOUT`, and the requests that waited for an attempt
//! that failed fail with it rather than each trying again in turn. On
//! Sentinel a background task also listens to the sentinels'
//! `+switch-master`, so a failover is followed at once.
//!
//! Scripts need no care here: `redis::Script` loads a script again when a
//! new primary answers NOSCRIPT.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisError, Value};
use redis::{RedisResult, ServerErrorKind};
use tokio_util::sync::CancellationToken;

use super::conn::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use super::target::SentinelTarget;

/// How long finding and opening the primary may take (the sentinels, the
/// node they name, the handshake).
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the primary is.
enum Locator {
    Fixed(redis::Client),
    Sentinel {
        client: tokio::sync::Mutex<SentinelClient>,
        master_name: String,
    },
}

pub struct Primary {
    weak: Weak<Self>,
    locator: Locator,
    /// Serialises opening: whoever waited uses the connection just opened.
    opening: tokio::sync::Mutex<()>,
    current: Mutex<Current>,
    stop: CancellationToken,
}

#[derive(Default)]
struct Current {
    connection: Option<(u64, MultiplexedConnection)>,
    /// The address of the node `connection` goes to, `host:port`.
    address: String,
    last_id: u64,
    /// Attempts to open that failed, so far.
    failures: u64,
}

impl Drop for Primary {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Primary {
    /// The server at `url`, connected once: a start without it fails here.
    pub async fn fixed(url: &str) -> RedisResult<Arc<Self>> {
        let primary = Self::new(Locator::Fixed(redis::Client::open(url)?));
        primary.connection().await?;
        Ok(primary)
    }

    /// The primary the sentinels name, found once: a start with no
    /// sentinel or no primary fails here, saying what went wrong.
    pub async fn sentinel(target: &SentinelTarget) -> anyhow::Result<Arc<Self>> {
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
        let primary = Self::new(Locator::Sentinel {
            client: tokio::sync::Mutex::new(builder.build()?),
            master_name: target.master_name.clone(),
        });
        if let Err(e) = primary.connection().await {
            anyhow::bail!(describe(&target.master_name, &e));
        }
        tokio::spawn(watch_announcements(
            Arc::downgrade(&primary),
            primary.stop.clone(),
        ));
        Ok(primary)
    }

    fn new(locator: Locator) -> Arc<Self> {
        Arc::new_cyclic(|weak| Self {
            weak: weak.clone(),
            locator,
            opening: tokio::sync::Mutex::new(()),
            current: Mutex::default(),
            stop: CancellationToken::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A client for the primary of the moment.
    pub async fn client(&self) -> RedisResult<redis::Client> {
        match &self.locator {
            Locator::Fixed(client) => Ok(client.clone()),
            Locator::Sentinel { client, .. } => {
                let mut sentinels = client.lock().await;
                within(OPEN_TIMEOUT, sentinels.async_get_client()).await
            }
        }
    }

    /// The connection to the primary, opened when there is none.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let failures = {
            let current = self.lock();
            if let Some(c) = current.connection.clone() {
                return Ok(c);
            }
            current.failures
        };
        let _opening = self.opening.lock().await;
        let id = {
            let mut current = self.lock();
            if let Some(c) = current.connection.clone() {
                return Ok(c);
            }
            if current.failures != failures {
                return Err(no_primary());
            }
            current.last_id += 1;
            current.last_id
        };
        let opened = within(OPEN_TIMEOUT, self.open(id)).await;
        let mut current = self.lock();
        match opened {
            Ok((address, connection)) => {
                current.connection = Some((id, connection.clone()));
                current.address = address;
                Ok((id, connection))
            }
            Err(e) => {
                if let Locator::Sentinel { master_name, .. } = &self.locator {
                    tracing::debug!(detail = %describe(master_name, &e), "no redis primary");
                }
                current.failures += 1;
                Err(e)
            }
        }
    }

    /// Open connection `id` to the primary. Over TCP this instance runs the
    /// connection's driver itself, to learn at once when the socket closes.
    async fn open(&self, id: u64) -> RedisResult<(String, MultiplexedConnection)> {
        let client = self.client().await?;
        let info = client.get_connection_info();
        let address = info.addr().to_string();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        if let Locator::Sentinel { master_name, .. } = &self.locator {
            tracing::info!(address = %info.addr(), master = %master_name, "redis primary named by the sentinels");
        }
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            // TLS or a unix socket: the crate drives it; a closed connection
            // is noticed by the request that meets it.
            let connection = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            return Ok((address, connection));
        };
        let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
        stream.set_nodelay(true)?;
        let (connection, driver) =
            MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
        let primary = self.weak.clone();
        tokio::spawn(async move {
            driver.await;
            if let Some(p) = primary.upgrade() {
                p.forget(id, "connection closed");
            }
        });
        Ok((address, connection))
    }

    /// Stop using connection `id` (a newer one is left alone).
    fn forget(&self, id: u64, why: &str) {
        let mut current = self.lock();
        if current.connection.as_ref().is_some_and(|(i, _)| *i == id) {
            current.connection = None;
            tracing::warn!(why, "redis primary connection dropped");
        }
    }

    /// Whether a request's failure means the connection is no good (or the
    /// node is a primary no more), and whether it may be sent again: only a
    /// `READONLY` refusal is certain to have changed nothing.
    fn judge<T>(&self, id: u64, result: &RedisResult<T>) -> bool {
        let Err(e) = result else { return false };
        let read_only = e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
        if read_only {
            self.forget(id, "the node is a replica now");
        } else if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_timeout()
            || e.is_unrecoverable_error()
        {
            self.forget(id, "request failed");
        }
        read_only
    }

    /// The connection for a request: a primary that cannot be found is,
    /// to the request, one that cannot be reached.
    async fn for_request(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        self.connection().await.map_err(|e| match e.kind() {
            ErrorKind::MasterNameNotFoundBySentinel
            | ErrorKind::NoValidReplicasFoundBySentinel
            | ErrorKind::EmptySentinelList => no_primary(),
            _ => e,
        })
    }

    pub async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (id, mut con) = self.for_request().await?;
        let result = con.req_packed_command(cmd).await;
        if !self.judge(id, &result) {
            return result;
        }
        let (_, mut con) = self.for_request().await?;
        con.req_packed_command(cmd).await
    }

    pub async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let (id, mut con) = self.for_request().await?;
        let result = con.req_packed_commands(pipeline, offset, count).await;
        if !self.judge(id, &result) {
            return result;
        }
        let (_, mut con) = self.for_request().await?;
        con.req_packed_commands(pipeline, offset, count).await
    }

    /// The database the URL selects (always 0 on Sentinel).
    pub fn db(&self) -> i64 {
        match &self.locator {
            Locator::Fixed(client) => client.get_connection_info().redis_settings().db(),
            Locator::Sentinel { .. } => 0,
        }
    }
}

async fn within<T>(limit: Duration, f: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    tokio::time::timeout(limit, f).await.unwrap_or_else(|_| {
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer in time",
        )))
    })
}

fn no_primary() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "no redis primary reachable",
    ))
}

/// What went wrong in finding the primary, for the start-up error and the
/// logs: never an address with a password in it.
fn describe(name: &str, e: &RedisError) -> String {
    match e.kind() {
        ErrorKind::MasterNameNotFoundBySentinel => {
            format!("no sentinel knows a primary named {name:?} (redis_master_name)")
        }
        ErrorKind::InvalidClientConfig => {
            "no sentinel answered as a sentinel (redis_sentinels)".to_owned()
        }
        ErrorKind::AuthenticationFailed => format!(
            "the primary {name:?} or a sentinel refused the password \
             (redis_password, redis_sentinel_password)"
        ),
        _ if e.is_timeout() => {
            format!("the sentinels or the primary {name:?} did not answer in time")
        }
        _ => format!(
            "cannot reach the sentinels or the primary {name:?} ({:?})",
            e.kind()
        ),
    }
}

/// Listen to the sentinels' `+switch-master` (`<name> <old ip> <old port>
/// <new ip> <new port>`) and drop a connection to any other node than the
/// new primary at once. Holds the primary only while handling a message,
/// so dropping the backend ends it.
async fn watch_announcements(primary: Weak<Primary>, stop: CancellationToken) {
    loop {
        let subscribed = async {
            let client = {
                let p = primary.upgrade()?;
                let Locator::Sentinel { client, .. } = &p.locator else {
                    return None;
                };
                let mut sentinels = client.lock().await;
                within(OPEN_TIMEOUT, sentinels.async_get_sentinel_client())
                    .await
                    .ok()?
            };
            let mut pubsub = within(CONNECT_TIMEOUT, client.get_async_pubsub())
                .await
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
                let Locator::Sentinel { master_name, .. } = &p.locator else {
                    return;
                };
                let words: Vec<&str> = text.split(' ').collect();
                if let [name, _, _, ip, port] = words[..]
                    && name == master_name
                {
                    tracing::warn!(announcement = %text, "the sentinels switched the redis primary");
                    let new = format!("{ip}:{port}");
                    let stale = {
                        let current = p.lock();
                        current
                            .connection
                            .as_ref()
                            .filter(|_| current.address != new)
                            .map(|(id, _)| *id)
                    };
                    if let Some(id) = stale {
                        p.forget(id, "the sentinels named a new primary");
                    }
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
