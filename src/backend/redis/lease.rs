//! The per-room worker lease: exactly one instance runs a room's worker.
//!
//! Acquire with `SET key token NX PX lease` (only when nobody holds it, and
//! it expires by itself if the holder dies); renew with a compare-and-extend
//! script well before expiry (a third of the lease), so a holder never
//! extends a lease that lapsed and went to someone else; give it up on
//! shutdown with a compare-and-delete, so a slow holder never deletes its
//! successor's lease. The tick script also checks the token (fencing): a
//! worker paused past its lease cannot admit beside the new holder.

use std::time::Duration;

use redis::AsyncCommands;
use redis::RedisResult;
use redis::aio::ConnectionLike;

use super::scripts::Scripts;

pub struct Lease {
    pub key: String,
    pub token: String,
    pub ttl: Duration,
}

impl Lease {
    pub fn new(key: String, ttl: Duration) -> Self {
        Self {
            key,
            token: format!("{:032x}", rand::random::<u128>()),
            ttl,
        }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Take the lease if it is free.
    pub async fn acquire<C: ConnectionLike + Send + Sync>(&self, con: &mut C) -> RedisResult<bool> {
        let opts = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(self.ttl_ms()));
        let set: Option<String> = con.set_options(&self.key, &self.token, opts).await?;
        Ok(set.is_some())
    }

    /// Extend the lease if it is still ours.
    pub async fn extend<C: ConnectionLike + Send + Sync>(
        &self,
        con: &mut C,
        scripts: &Scripts,
    ) -> RedisResult<bool> {
        let n: i64 = scripts
            .lease_extend
            .key(&self.key)
            .arg(&self.token)
            .arg(self.ttl_ms())
            .invoke_async(con)
            .await?;
        Ok(n == 1)
    }

    /// Give the lease up if it is still ours.
    pub async fn release<C: ConnectionLike + Send + Sync>(
        &self,
        con: &mut C,
        scripts: &Scripts,
    ) -> RedisResult<bool> {
        let n: i64 = scripts
            .lease_release
            .key(&self.key)
            .arg(&self.token)
            .invoke_async(con)
            .await?;
        Ok(n == 1)
    }
}
