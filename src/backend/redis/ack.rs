//! Acknowledged means replicated, when asked (`redis_wait_replicas = N`):
//! a join, a departure (and the hand-off it makes), a tick's admissions
//! and a status read are answered only after `WAIT N timeout` reports N
//! replicas; otherwise the call fails with `BackendError::NotReplicated`
//! (503 with Retry-After) rather than acknowledge what a failover to a
//! replica could lose.
//!
//! `WAIT` blocks the connection it is sent on until the replicas have
//! everything that connection wrote, so one `WAIT` per request would queue
//! every request of this instance behind the one before. Calls are grouped
//! instead: a call whose script has answered asks for a round; one task
//! runs the rounds back to back, each one `INCR` and `WAIT` in a pipeline
//! on the shared connection, and every call that asked before a round
//! began is answered by it. The `INCR` is a write, so the round's `WAIT`
//! covers everything the primary had done by then, whichever connection
//! or instance did it (another instance's admission that a status read
//! shows, too).
//!
//! A `WAIT` on another connection than the write's proves nothing (after
//! a failover it asks the new primary about its own replicas): the call
//! notes the primary connection's id before its script and after, the
//! round before its pipeline and after, and only equal ids count.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::conn::{Conn, unavailable};
use crate::backend::BackendError;
use crate::config::RedisWait;
use crate::sync::lock;

/// The key each round increments (one small counter per deployment).
const ROUND_KEY: &str = "narabu:acks";

/// What a finished round found.
#[derive(Clone, Debug)]
struct Round {
    /// Rounds finished so far, this one included.
    number: u64,
    /// The connection the round ran on, or why it failed.
    outcome: Result<u64, BackendError>,
}

#[derive(Default)]
struct Pending {
    /// Rounds begun so far.
    begun: u64,
    /// A round is running (or about to).
    running: bool,
    /// Someone asked after the running round began.
    again: bool,
}

pub struct Acks {
    wait: RedisWait,
    pending: Mutex<Pending>,
    done: watch::Sender<Round>,
}

/// Where a write went: the primary connection before and after it.
#[derive(Clone, Copy, Debug)]
pub struct Written(Option<u64>);

impl Acks {
    pub fn new(wait: RedisWait) -> Arc<Self> {
        Arc::new(Self {
            wait,
            pending: Mutex::default(),
            done: watch::Sender::new(Round {
                number: 0,
                outcome: Ok(0),
            }),
        })
    }

    pub fn is_on(&self) -> bool {
        self.wait.is_on()
    }

    /// Notes the connection before a write ([`Acks::confirm`] checks it
    /// again after).
    pub fn before(&self, conn: &Conn) -> Written {
        Written(connection_id(conn))
    }

    /// Waits until the replicas have what was written since `before`;
    /// at once when waiting is off.
    pub async fn confirm(
        self: &Arc<Self>,
        conn: &Conn,
        before: Written,
    ) -> Result<(), BackendError> {
        if !self.is_on() {
            return Ok(());
        }
        let Some(id) = before.0.filter(|&id| connection_id(conn) == Some(id)) else {
            return Err(moved());
        };
        let mut done = self.done.subscribe();
        let need = {
            let mut p = lock(&self.pending);
            if p.running {
                p.again = true;
                p.begun + 1
            } else {
                p.running = true;
                p.begun += 1;
                let me = self.clone();
                let conn = conn.clone();
                tokio::spawn(async move { me.run(conn).await });
                p.begun
            }
        };
        let round = done
            .wait_for(|r| r.number >= need)
            .await
            .map_err(|_| BackendError::Unavailable("shutting down".into()))?
            .clone();
        match round.outcome {
            Ok(on) if on == id => Ok(()),
            Ok(_) => Err(moved()),
            Err(e) => Err(e),
        }
    }

    /// Runs rounds while anyone asks for one.
    async fn run(self: Arc<Self>, conn: Conn) {
        loop {
            let outcome = self.round(&conn).await;
            let (number, more) = {
                let mut p = lock(&self.pending);
                let number = p.begun;
                let more = p.again;
                if more {
                    p.again = false;
                    p.begun += 1;
                } else {
                    p.running = false;
                }
                (number, more)
            };
            self.done.send_replace(Round { number, outcome });
            if !more {
                return;
            }
        }
    }

    /// One `INCR` + `WAIT` on the shared connection.
    async fn round(&self, conn: &Conn) -> Result<u64, BackendError> {
        let Some(id) = connection_id(conn) else {
            return Err(moved());
        };
        let timeout_ms = u64::try_from(self.wait.timeout.as_millis()).unwrap_or(u64::MAX);
        let (acked,): (u32,) = redis::pipe()
            .cmd("INCR")
            .arg(ROUND_KEY)
            .ignore()
            .cmd("WAIT")
            .arg(self.wait.replicas)
            .arg(timeout_ms)
            .query_async(&mut conn.clone())
            .await
            .map_err(|e| unavailable(&e))?;
        if connection_id(conn) != Some(id) {
            return Err(moved());
        }
        if acked < self.wait.replicas {
            tracing::warn!(
                acked,
                wanted = self.wait.replicas,
                "redis replicas did not confirm in time: requests fail with 503 meanwhile"
            );
            return Err(BackendError::NotReplicated {
                retry_after: retry_after(self.wait.timeout),
            });
        }
        Ok(id)
    }
}

/// At start: say plainly when the primary has fewer replicas than every
/// change will wait for (a replica may still be on its way, so this is not
/// fatal; until it comes, changes fail with 503).
pub async fn check_replicas(conn: &Conn, wait: RedisWait) {
    let info: redis::RedisResult<String> = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn.clone())
        .await;
    let connected = info.ok().and_then(|text| {
        text.lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse::<u32>().ok())
    });
    match connected {
        Some(n) if n >= wait.replicas => {
            tracing::info!(
                replicas = n,
                wait_for = wait.replicas,
                "changes wait for redis replicas"
            );
        }
        Some(n) => tracing::warn!(
            replicas = n,
            wait_for = wait.replicas,
            "the redis primary has fewer replicas than redis_wait_replicas: joins and \
             admissions fail with 503 until enough are connected"
        ),
        None => tracing::warn!("could not read the redis primary's replicas (INFO replication)"),
    }
}

fn connection_id(conn: &Conn) -> Option<u64> {
    match conn {
        Conn::Primary(p) => p.connection_id(),
        // Refused at start (config): never waited on.
        Conn::Cluster(_) => None,
    }
}

/// The primary connection changed between a write and its `WAIT`.
fn moved() -> BackendError {
    BackendError::NotReplicated {
        retry_after: Duration::from_secs(1),
    }
}

/// At least a second, and the timeout again.
fn retry_after(timeout: Duration) -> Duration {
    (timeout * 2).max(Duration::from_secs(1))
}
