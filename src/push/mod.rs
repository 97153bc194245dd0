//! Web Push: calling a visitor back when their page is closed.
//!
//! A visitor who asks to be told when their turn comes hands the queue
//! page's push subscription to Narabu ([`Subscription`]); at "N ahead" and
//! at "your turn" the room's owner hands a [`PushMessage`] to the
//! [`PushSender`], which delivers it to the push service the browser named,
//! by the standards alone and with no third party of ours:
//!
//! - [`keys`]: the VAPID key pair (RFC 8292), derived from the instance
//!   secret so every instance signs alike, or loaded from a PEM file; its
//!   public key is what the page subscribes with;
//! - [`ece`]: the `aes128gcm` message encryption (RFC 8291, RFC 8188), so
//!   the push service relays what it cannot read;
//! - [`sender`]: the bounded queue, the few sends at a time, the retries
//!   and the outcome ([`Outcome::Gone`] when the browser has dropped the
//!   subscription), counted in `/metrics`;
//! - [`resolve`]: the sender connects only to public addresses, whatever
//!   the endpoint's host name resolves to.
//!
//! Nothing here decides anything about rooms or tickets: the engine
//! decides when a call is due and keeps the subscription with the ticket,
//! and `crate::http::notify` words the message and hands it here ([`Push`]
//! bundles the key and the sender as the service runs them, and counts
//! each room's outcomes for operators).

pub mod ece;
pub(crate) mod keys;
pub(crate) mod resolve;
pub(crate) mod sender;
pub(crate) mod subscription;

pub(crate) use keys::VapidError;
pub use keys::VapidKey;
pub use sender::{Outcome, PushMessage, PushSender, SenderConfig, Urgency};
pub use subscription::Subscription;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::PushConfig;
use crate::metrics::Metrics;
use crate::token::Keyring;

/// What the keyring derives the VAPID key from (see [`Keyring::derive`]).
const VAPID_PURPOSE: &str = "web push vapid key";

/// Why push could not start. Names the file, never its contents.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PushStartError {
    #[error("push.vapid_key_file {path}: {source}")]
    KeyFile {
        path: std::path::PathBuf,
        source: VapidError,
    },
    #[error("push: {0}")]
    Key(VapidError),
    #[error("push: the HTTP client could not be built: {0}")]
    Client(reqwest::Error),
}

/// Messages by outcome, per room, as this instance sent them (the rooms'
/// owners send): what operators see beside each room.
#[derive(Debug, Default)]
pub(crate) struct Sends(dashmap::DashMap<String, [u64; 4]>);

impl Sends {
    pub(crate) fn count(&self, room: &str, outcome: Outcome) {
        let i = Self::slot(outcome);
        self.0.entry(room.to_owned()).or_default()[i] += 1;
    }

    /// (sent, failed, gone, dropped) for `room`.
    pub(crate) fn of(&self, room: &str) -> (u64, u64, u64, u64) {
        let c = self.0.get(room).map(|c| *c).unwrap_or_default();
        (c[0], c[1], c[2], c[3])
    }

    fn slot(outcome: Outcome) -> usize {
        match outcome {
            Outcome::Sent => 0,
            Outcome::Failed => 1,
            Outcome::Gone => 2,
            Outcome::Dropped => 3,
        }
    }
}

/// Push as the service runs it: the key pages subscribe with and the
/// sender that delivers. Built once at start when `[push]` is on.
#[derive(Debug)]
pub(crate) struct Push {
    pub key: Arc<VapidKey>,
    pub sender: PushSender,
    pub sends: Sends,
    /// Accept `http:` and local endpoints in subscriptions (tests only).
    pub allow_insecure_endpoints: bool,
}

impl Push {
    /// `None` when push is off. The key comes from the configured PEM
    /// file, or is derived from the ticket key.
    pub(crate) fn start(
        config: &PushConfig,
        keyring: &Keyring,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Result<Option<Self>, PushStartError> {
        if !config.enabled {
            return Ok(None);
        }
        let key = match &config.vapid_key_file {
            Some(path) => VapidKey::from_pem_file(path, &config.contact).map_err(|source| {
                PushStartError::KeyFile {
                    path: path.clone(),
                    source,
                }
            })?,
            None => {
                let (seed, _) = keyring.derive(VAPID_PURPOSE);
                VapidKey::from_seed(&seed, &config.contact).map_err(PushStartError::Key)?
            }
        };
        let key = Arc::new(key);
        let sender = PushSender::start(
            key.clone(),
            SenderConfig {
                allow_insecure_endpoints: config.allow_insecure_endpoints,
                ..SenderConfig::default()
            },
            metrics,
            shutdown,
        )
        .map_err(PushStartError::Client)?;
        Ok(Some(Self {
            key,
            sender,
            sends: Sends::default(),
            allow_insecure_endpoints: config.allow_insecure_endpoints,
        }))
    }
}
