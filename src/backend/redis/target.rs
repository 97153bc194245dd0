//! Where an instance finds Redis and when a change counts as acknowledged
//! there: what the Redis backend is given to connect with. The
//! configuration reads these from the file's `redis_*` keys and checks
//! them together; they live with the backend that uses them, so the
//! backend never reaches back into the configuration.

use std::fmt;
use std::time::Duration;

use crate::secret::{RedactedUrl, Secret};

/// How to reach Redis.
#[derive(Clone)]
pub enum RedisTarget {
    /// One server (or anything that keeps one address, such as a proxy).
    Single { url: String },
    /// A Redis Cluster: any reachable node tells the client the others.
    Cluster { nodes: Vec<String> },
    /// A primary found through Sentinel, followed across failovers.
    Sentinel(SentinelTarget),
}

/// A primary that a set of sentinels monitors under one name.
#[derive(Clone)]
pub struct SentinelTarget {
    /// The sentinels, as `host:port`.
    pub sentinels: Vec<(String, u16)>,
    /// The name the sentinels monitor the primary under
    /// (`sentinel monitor <name> …`).
    pub master_name: String,
    /// The primary's (and its replicas') `requirepass`.
    pub password: Option<Secret>,
    /// The sentinels' own `requirepass`, when they have one.
    pub sentinel_password: Option<Secret>,
}

impl From<String> for RedisTarget {
    fn from(url: String) -> Self {
        Self::Single { url }
    }
}

impl From<&str> for RedisTarget {
    fn from(url: &str) -> Self {
        Self::Single {
            url: url.to_owned(),
        }
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Single { url } => f
                .debug_struct("Single")
                .field("url", &RedactedUrl(url))
                .finish(),
            Self::Cluster { nodes } => {
                let nodes: Vec<_> = nodes.iter().map(|n| RedactedUrl(n)).collect();
                f.debug_struct("Cluster").field("nodes", &nodes).finish()
            }
            Self::Sentinel(s) => f
                .debug_struct("Sentinel")
                .field("sentinels", &s.sentinels)
                .field("master_name", &s.master_name)
                .field("password", &s.password)
                .field("sentinel_password", &s.sentinel_password)
                .finish(),
        }
    }
}

/// When a change counts as acknowledged on Redis: with `replicas` above
/// 0, a join, an admission or a release is answered only after `WAIT`
/// reports that many replicas have it, within `timeout` (else the request
/// fails with 503 and Retry-After), so a failover cannot lose it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisWait {
    pub replicas: u32,
    pub timeout: Duration,
}

impl RedisWait {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);
    /// Below the connection's response timeout (2 s), so a `WAIT` that
    /// runs its course is never taken for a dead connection.
    pub(crate) const MAX_TIMEOUT: Duration = Duration::from_millis(1500);
    pub(crate) const MIN_TIMEOUT: Duration = Duration::from_millis(10);
    /// More replicas than anyone runs is a typo.
    pub(crate) const MAX_REPLICAS: u32 = 16;

    /// Off: answered once the primary has it.
    pub const OFF: Self = Self {
        replicas: 0,
        timeout: Self::DEFAULT_TIMEOUT,
    };

    pub(crate) fn is_on(&self) -> bool {
        self.replicas > 0
    }
}

impl Default for RedisWait {
    fn default() -> Self {
        Self::OFF
    }
}
