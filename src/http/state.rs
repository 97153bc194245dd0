//! What every handler shares: the backend, its clock, the keys and the
//! settings the HTTP layer needs, all decided once at start-up.

use std::ops::Deref;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::config::{Config, Secret};
use crate::engine::Clock;
use crate::token::Keyring;

/// The handlers' state: one reference count to clone per request (axum
/// clones a route's state for each), whatever it holds.
#[derive(Clone)]
pub(crate) struct AppState(Arc<Shared>);

impl AppState {
    pub(crate) fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub(crate) struct Shared {
    pub backend: Arc<dyn Backend>,
    /// The backend's clock: every time the HTTP layer shows or compares is
    /// read from it, so tests on virtual time see one time everywhere.
    pub clock: Arc<dyn Clock>,
    pub keys: Arc<Keyring>,
    /// Signs the passes proxies verify by themselves, and publishes their
    /// public keys.
    pub passes: Arc<crate::pass::PassKeys>,
    /// Web Push, when `[push]` is on: the key pages subscribe with, and
    /// the sender of the call-backs.
    pub push: Option<Arc<crate::push::Push>>,
    pub settings: Arc<HttpSettings>,
    /// Cancelled when the server shuts down; open streams end on it.
    pub shutdown: CancellationToken,
    /// The service's own counters, for `/metrics`.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Rooms sampled over time: the dashboard's history, windowed figures
    /// and webhook events.
    pub monitor: Arc<crate::monitor::Monitor>,
    /// Open event streams per client address (a coarse net).
    pub streams: Arc<super::limits::StreamLimiter>,
    /// The streams this instance holds per ticket: their cap, and the
    /// batched renewal of their visitors' presence.
    pub presence: Arc<super::presence::Presence>,
    /// The shards that own the event streams' connections and write
    /// their events.
    pub writers: Arc<super::events::Writers>,
    /// Each room's access rules, compiled, and its challenge difficulty.
    pub access: Arc<super::access::AccessBook>,
    /// Challenge fetches per client address and room.
    pub challenge_fetches: super::limits::ChallengeLimiter,
    /// Signs and checks proof-of-work challenges (a key derived from the
    /// ticket key for this use only).
    pub challenges: Arc<crate::access::ChallengeKeys>,
    /// The visitor pages each room shows (templates and languages).
    pub pages: Arc<super::pages::PageBook>,
    /// Each room's traffic rules, compiled, for the gate.
    pub rules: Arc<super::rule_book::RuleBook>,
    /// The site's routes: the room of a check at `GET /gate`.
    pub routes: Arc<super::rule_book::RouteBook>,
    /// What autotune last read and chose for the rooms it tunes here.
    pub tunes: Arc<crate::autotune::tuner::TuneBook>,
}

/// The parts of the configuration the HTTP layer reads.
#[derive(Debug)]
pub(crate) struct HttpSettings {
    pub cookie_secure: bool,
    /// Base for absolute queue URLs (e.g. `https://shop.example`); empty
    /// for relative URLs.
    pub public_url: String,
    pub admin_token: Option<Secret>,
    /// A key the origin's backend may use for `release` only.
    pub release_key: Option<Secret>,
    /// The token `/metrics` asks for, when set.
    pub metrics_token: Option<Secret>,
    /// How long an event stream may stay silent before a keep-alive (its
    /// current figures for a waiting visitor, else a comment), kept per
    /// shard of the stream writers: the cadence rule's refresh, so a line
    /// that moves needs no keep-alive besides its refreshes.
    pub keep_alive: std::time::Duration,
    pub on_backend_error: crate::config::OnBackendError,
    /// Peers whose forwarding headers name the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The header those proxies name the client in.
    pub client_ip_header: crate::config::ClientIpHeader,
    /// How long a replaced line's report is kept (zero: not kept).
    pub report_keep: std::time::Duration,
}

impl HttpSettings {
    pub(crate) fn from_config(config: &Config) -> Self {
        Self {
            cookie_secure: config.cookie_secure,
            public_url: config
                .public_url
                .as_deref()
                .unwrap_or("")
                .trim_end_matches('/')
                .to_owned(),
            admin_token: config.admin_token.clone(),
            release_key: config.release_key.clone(),
            metrics_token: config.metrics_token.clone(),
            keep_alive: std::time::Duration::from_millis(crate::engine::rules::REFRESH_MS),
            on_backend_error: config.on_backend_error,
            trusted_proxies: config.trusted_proxies.clone(),
            client_ip_header: config.client_ip_header,
            report_keep: config.report_keep,
        }
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("backend", &self.backend.kind())
            .finish_non_exhaustive()
    }
}
