//! Redis as the rooms' store, for several instances that share rooms.
//!
//! Redis decides nothing here: it holds each room's log, image and lease
//! and carries commands to the room's owner and replies back
//! ([`store::RedisStore`], the [`RoomStore`](crate::backend::store::RoomStore)
//! on Redis, whose only scripts are the lease's acquisition and renewal and
//! the fenced image; the log's appends are fenced by their stream ids). The rooms themselves are run by
//! [`OwnedBackend`](crate::backend::owned::OwnedBackend), the engine on
//! each room's owner; [`connect`] puts the two together as a deployment
//! on Redis runs them. How this instance reaches one server, the primary
//! Sentinel names, or a Cluster is `conn.rs` and `primary.rs`.

mod conn;
mod primary;
pub mod store;
pub(crate) mod target;

use std::sync::Arc;
use std::time::Duration;

use super::owned::{OwnedBackend, OwnedOptions};
use super::owner::OwnerOptions;
use crate::engine::{Clock, RoomSettings};
use target::{RedisTarget, RedisWait};

/// How an instance serves its rooms on Redis.
#[derive(Clone)]
pub struct RedisOptions {
    /// One server, a Cluster, or the primary Sentinel names.
    pub target: RedisTarget,
    /// A room's lease: a dead owner's room is taken over within this.
    pub lease: Duration,
    /// Whether each room's owner runs the room's worker (off in tests that
    /// drive ticks themselves on virtual time).
    pub run_workers: bool,
    /// Whether changes wait for replicas before they are acknowledged.
    pub wait: RedisWait,
}

impl RedisOptions {
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(3);

    /// `target` may be a URL, for one server.
    pub fn new(target: impl Into<RedisTarget>) -> Self {
        Self {
            target: target.into(),
            lease: Self::DEFAULT_LEASE,
            run_workers: true,
            wait: RedisWait::OFF,
        }
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("target", &self.target)
            .field("lease", &self.lease)
            .field("run_workers", &self.run_workers)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// Connect to Redis (refusing a store written by an earlier Narabu) and
/// serve `rooms` there: contend for each, follow each, and make those that
/// Redis does not hold yet (rooms already there, made by another instance
/// or changed by an operator, are kept).
pub async fn connect(
    options: RedisOptions,
    rooms: Vec<RoomSettings>,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<Arc<OwnedBackend>> {
    let store = store::RedisStore::connect(&options.target, options.wait).await?;
    let owned = OwnedOptions {
        owner: OwnerOptions {
            lease: options.lease,
            ticks: options.run_workers,
            ..OwnerOptions::default()
        },
        ..OwnedOptions::default()
    };
    Ok(OwnedBackend::start(Arc::new(store), rooms, clock, owned))
}
