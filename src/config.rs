//! Configuration, parsed and validated once at start-up into typed values.
//!
//! Everything downstream (engine, backends, HTTP) receives a [`Config`] whose
//! values are already checked: durations are `Duration`s, room names are
//! [`RoomId`]s, proxy networks are [`IpNet`]s, `opens_at` is Unix
//! milliseconds. Nothing re-parses a string later, so a bad setting stops the
//! server at start with a message naming the file, the field and the problem
//! (`config/narabu.toml: rooms[1].capacity: must be between 1 and 1000000,
//! got 0`) instead of surfacing during a sale.
//!
//! The order at start is: [`Config::load`] (or [`Config::default`] when no
//! file is given), then command-line overrides, then [`Config::apply_env`],
//! which takes secrets from the environment and checks the rules that depend
//! on both file and environment.
//!
//! Secrets are [`Secret`]s, which print as `[redacted]`; URLs that may carry
//! credentials (Redis passwords, webhook tokens) are redacted in `Debug` too,
//! so the whole `Config` can be logged.
//!
//! `config/narabu.toml` documents every key; its tests load it.

mod redis;
mod room;
mod values;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde::Deserialize;

use crate::engine::{RoomId, RoomSettings};
pub(crate) use crate::pass::PassAlgorithm;
use crate::webhooks::EventType;
use crate::webhooks::signing::SigningKey;

pub use crate::backend::embedded::Durability;
pub use crate::secret::Secret;
pub use crate::webhooks::WebhookConfig;
use redis::RedisKeys;
pub use redis::{RedisTarget, RedisWait, SentinelTarget};
pub(crate) use room::{
    CAPACITY_MAX, CAPACITY_MIN, MAX_NOTIFY_AHEAD, RoomTable, check_admit_per_minute,
    check_autotune, check_away_grace, check_capacity, check_pass_lifetime, check_rules,
    check_stock, check_templates_dir, check_tick, check_timeout, opt_duration, stock_mode,
};
use values::{ProxyNet, check_http_url, check_public_url, listen_address};

/// What is wrong with the configuration, and where.
///
/// Displays as `origin: field: message`, leaving out empty parts. It never
/// contains a secret's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    origin: String,
    field: String,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            origin: String::new(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn in_origin(mut self, origin: &str) -> Self {
        self.origin = origin.to_owned();
        self
    }

    /// The file (or `environment`) the bad value came from; empty for a
    /// value that came from elsewhere, such as an admin API body.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The field, as a path like `rooms[1].capacity`; for a syntax error, the
    /// line and column instead.
    pub fn field(&self) -> &str {
        &self.field
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [&self.origin, &self.field, &self.message];
        let mut first = true;
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            if !first {
                f.write_str(": ")?;
            }
            f.write_str(part)?;
            first = false;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

fn join_field(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}.{name}")
    }
}

/// Where room state lives.
#[derive(Clone, Debug)]
pub enum Backend {
    /// In process, journalled to `data_dir`: one instance.
    Embedded,
    /// In Redis (one server, a Cluster, or a primary named by Sentinel),
    /// shared by every instance.
    Redis(RedisTarget),
}

/// How rooms on Redis are run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum BackendKind {
    #[default]
    Embedded,
    Redis,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object a line, for log collectors.
    Json,
}

/// Which header a trusted proxy names the client in. Only that one is
/// read: a proxy passes on headers it does not write itself, so reading
/// any other would let a client pick its own address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For` (nginx, HAProxy, Traefik, most load balancers).
    #[default]
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=…`.
    #[serde(rename = "forwarded")]
    Forwarded,
}

/// What the gate answers when the backend cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBackendError {
    /// Refuse (send visitors to the queue): the origin is never flooded.
    #[default]
    Closed,
    /// Let visitors through: the sale goes on unprotected.
    Open,
}

/// Web Push (`[push]`): whether the queue page offers to call a visitor
/// back, and the VAPID key the messages are signed with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushConfig {
    pub enabled: bool,
    /// The VAPID private key (PEM); when absent, one is derived from the
    /// ticket key, so every instance sharing it signs alike and no private
    /// key is stored anywhere.
    pub vapid_key_file: Option<PathBuf>,
    /// Where push services can reach the operator: the VAPID JWT's `sub`,
    /// a `mailto:` or `https://` URL. Required when push is on.
    pub contact: String,
    /// Send to `http:` and local push endpoints too: only for tests that
    /// play the push service on this machine.
    pub allow_insecure_endpoints: bool,
}

/// The whole configuration, validated.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub backend: Backend,
    /// When joins are acknowledged (embedded backend).
    pub durability: Durability,
    /// How often the embedded backend compacts its journal into a snapshot.
    pub snapshot_interval: std::time::Duration,
    /// How long the report of a room's line is kept once an operator
    /// replaces the line (zero: not kept).
    pub report_keep: std::time::Duration,
    /// The ticket signing key; when absent, a key is kept in
    /// `data_dir/secret.key`.
    pub secret: Option<Secret>,
    /// The key before the last rotation; tickets it signed stay valid.
    pub previous_secret: Option<Secret>,
    /// How signed passes are signed (`ES256` or `EdDSA`).
    pub pass_algorithm: PassAlgorithm,
    /// The pass signing key (PEM); when absent, one is derived from the
    /// ticket key (`secret`, or the key file), so instances sharing it
    /// sign alike.
    pub pass_key_file: Option<PathBuf>,
    /// The pass key before the last rotation (private or public PEM): still
    /// published, so passes it signed verify until they expire.
    pub previous_pass_key_file: Option<PathBuf>,
    /// Bearer token for the admin API; the admin API is off without it.
    pub admin_token: Option<Secret>,
    /// Bearer key the origin's backend may use for `release` only.
    pub release_key: Option<Secret>,
    /// Bearer token `/metrics` asks for; open without it.
    pub metrics_token: Option<Secret>,
    /// Mark cookies `Secure` (set it when visitors reach Narabu over HTTPS);
    /// they are then named with the `__Host-` prefix.
    pub cookie_secure: bool,
    /// Peers whose `X-Forwarded-For` / `Forwarded` headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The one header trusted proxies name the client in.
    pub client_ip_header: ClientIpHeader,
    pub log_format: LogFormat,
    pub on_backend_error: OnBackendError,
    /// When a change counts as acknowledged on Redis (off: once the
    /// primary has it).
    pub redis_wait: RedisWait,
    /// Open event streams per client address, a coarse net against one
    /// host opening thousands; high by default, because a carrier-grade
    /// NAT puts many visitors behind one address. 0 turns it off.
    pub max_streams_per_address: u32,
    /// Open event streams per ticket on one instance (a visitor's tabs);
    /// 0 turns the limit off.
    pub max_streams_per_ticket: u32,
    /// Absolute base (`https://queue.example.com`, no trailing slash) for
    /// queue URLs handed to proxies; relative URLs when absent.
    pub public_url: Option<String>,
    pub webhooks: Vec<WebhookConfig>,
    /// The instance's own page templates (and `messages/`), over the
    /// built-in pages; every room without its own shows them.
    pub templates_dir: Option<PathBuf>,
    /// More languages for the pages, as message files (`ko.toml`).
    pub messages_dir: Option<PathBuf>,
    /// Web Push call-backs.
    pub push: PushConfig,
    /// At least one, ids unique.
    pub rooms: Vec<RoomSettings>,
}

impl Config {
    pub(crate) const DEFAULT_DATA_DIR: &str = "./narabu-data";
    pub(crate) const DEFAULT_ROOM: &str = "default";
    pub(crate) const DEFAULT_MAX_STREAMS_PER_ADDRESS: u32 = 2000;
    pub(crate) const DEFAULT_MAX_STREAMS_PER_TICKET: u32 = 4;
    pub(crate) const DEFAULT_SNAPSHOT_INTERVAL: std::time::Duration =
        std::time::Duration::from_secs(60);
    /// Thirty days: long enough to answer the complaints after a sale.
    pub(crate) const DEFAULT_REPORT_KEEP: std::time::Duration =
        std::time::Duration::from_secs(30 * 86_400);
    /// Ten years: a bound that still fits every store's expiry.
    pub(crate) const MAX_REPORT_KEEP: std::time::Duration =
        std::time::Duration::from_secs(3_650 * 86_400);

    /// Reads and validates a TOML file. Errors name the file as given.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("", format!("cannot read: {e}")).in_origin(&origin))?;
        Self::from_toml_str(&text, &origin)
    }

    /// Parses and validates TOML text; `origin_name` (usually the file name)
    /// starts every error message.
    pub fn from_toml_str(text: &str, origin_name: &str) -> Result<Config, ConfigError> {
        parse_file(text)
            .and_then(FileConfig::into_config)
            .map_err(|e| e.in_origin(origin_name))
    }

    /// Takes `NARABU_SECRET`, `NARABU_ADMIN_TOKEN` and `NARABU_METRICS_TOKEN`
    /// from `get` (the real
    /// environment in `main`, a map in tests); a set, non-empty variable
    /// overrides the file. Then checks the rules that need the final
    /// secrets: a Redis backend needs a configured `secret`, since every
    /// instance must sign with the same key, and `previous_secret` only
    /// makes sense beside a `secret`.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let from_env = |name: &str| -> Result<Option<Secret>, ConfigError> {
            match get(name).filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => {
                    let s = Secret::new(v);
                    check_secret(name, &s).map_err(|e| e.in_origin("environment"))?;
                    Ok(Some(s))
                }
            }
        };
        if let Some(s) = from_env("NARABU_SECRET")? {
            self.secret = Some(s);
        }
        if let Some(s) = from_env("NARABU_ADMIN_TOKEN")? {
            self.admin_token = Some(s);
        }
        if let Some(s) = from_env("NARABU_METRICS_TOKEN")? {
            self.metrics_token = Some(s);
        }
        if self.secret.is_none() {
            if matches!(self.backend, Backend::Redis(_)) {
                return Err(ConfigError::new(
                    "secret",
                    "required with backend = \"redis\", so that every instance signs tickets \
                     with the same key (set it in the file or in NARABU_SECRET)",
                ));
            }
            if self.previous_secret.is_some() {
                return Err(ConfigError::new(
                    "previous_secret",
                    "set only together with secret (or NARABU_SECRET)",
                ));
            }
        }
        Ok(())
    }
}

/// One embedded instance on 127.0.0.1:8080 with the default room: what
/// `narabu serve` runs with no arguments.
impl Default for Config {
    fn default() -> Self {
        let room = RoomId::new(Self::DEFAULT_ROOM).expect("\"default\" is a valid room id");
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from(Self::DEFAULT_DATA_DIR),
            backend: Backend::Embedded,
            durability: Durability::Fsync,
            snapshot_interval: Self::DEFAULT_SNAPSHOT_INTERVAL,
            report_keep: Self::DEFAULT_REPORT_KEEP,
            secret: None,
            previous_secret: None,
            pass_algorithm: PassAlgorithm::default(),
            pass_key_file: None,
            previous_pass_key_file: None,
            admin_token: None,
            release_key: None,
            metrics_token: None,
            cookie_secure: false,
            trusted_proxies: Vec::new(),
            client_ip_header: ClientIpHeader::XForwardedFor,
            log_format: LogFormat::Plain,
            on_backend_error: OnBackendError::Closed,
            redis_wait: RedisWait::OFF,
            max_streams_per_address: Self::DEFAULT_MAX_STREAMS_PER_ADDRESS,
            max_streams_per_ticket: Self::DEFAULT_MAX_STREAMS_PER_TICKET,
            public_url: None,
            webhooks: Vec::new(),
            templates_dir: None,
            messages_dir: None,
            push: PushConfig::default(),
            rooms: vec![RoomSettings::new(room)],
        }
    }
}

/// The file as written: every key optional, checked in `into_config`.
#[derive(Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct FileConfig {
    #[serde(deserialize_with = "listen_address")]
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    backend: BackendKind,
    durability: Durability,
    #[serde(with = "room::opt_duration")]
    snapshot_interval: Option<std::time::Duration>,
    #[serde(with = "room::opt_duration")]
    report_keep: Option<std::time::Duration>,
    redis_url: Option<String>,
    redis_cluster_nodes: Vec<String>,
    redis_sentinels: Vec<String>,
    redis_master_name: Option<String>,
    redis_password: Option<Secret>,
    redis_sentinel_password: Option<Secret>,
    redis_wait_replicas: Option<u32>,
    #[serde(with = "room::opt_duration")]
    redis_wait_timeout: Option<std::time::Duration>,
    secret: Option<Secret>,
    previous_secret: Option<Secret>,
    pass_algorithm: PassAlgorithm,
    pass_key_file: Option<PathBuf>,
    previous_pass_key_file: Option<PathBuf>,
    admin_token: Option<Secret>,
    release_key: Option<Secret>,
    metrics_token: Option<Secret>,
    cookie_secure: bool,
    trusted_proxies: Vec<ProxyNet>,
    client_ip_header: ClientIpHeader,
    log_format: LogFormat,
    on_backend_error: OnBackendError,
    max_streams_per_address: Option<u32>,
    max_streams_per_ticket: Option<u32>,
    public_url: Option<String>,
    webhooks: Vec<WebhookTable>,
    templates_dir: Option<PathBuf>,
    messages_dir: Option<PathBuf>,
    push: Option<PushTable>,
    rooms: Option<Vec<RoomTable>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PushTable {
    #[serde(default = "push_enabled_default")]
    enabled: bool,
    vapid_key_file: Option<PathBuf>,
    contact: Option<String>,
    #[serde(default)]
    allow_insecure_endpoints: bool,
}

/// A `[push]` table turns push on unless it says `enabled = false`.
fn push_enabled_default() -> bool {
    true
}

impl PushTable {
    fn into_config(self) -> Result<PushConfig, ConfigError> {
        if self
            .vapid_key_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::new("push.vapid_key_file", "must not be empty"));
        }
        let contact = match self.contact {
            Some(c) if c.starts_with("mailto:") || c.starts_with("https://") => {
                if c.len() > 256 || c.chars().any(char::is_control) {
                    return Err(ConfigError::new(
                        "push.contact",
                        "must be a URL of at most 256 characters without control characters",
                    ));
                }
                c
            }
            Some(_) => {
                return Err(ConfigError::new(
                    "push.contact",
                    "must start with `mailto:` or `https://` (where push services can reach you)",
                ));
            }
            None if self.enabled => {
                return Err(ConfigError::new(
                    "push.contact",
                    "is required when push is on: a `mailto:` or `https://` URL where push \
                     services can reach you",
                ));
            }
            None => String::new(),
        };
        Ok(PushConfig {
            enabled: self.enabled,
            vapid_key_file: self.vapid_key_file,
            contact,
            allow_insecure_endpoints: self.allow_insecure_endpoints,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookTable {
    url: String,
    secret: Secret,
    previous_secret: Option<Secret>,
    #[serde(default)]
    events: Vec<String>,
    queue_threshold: Option<u64>,
}

/// Keys whose values are secrets: errors about them never quote the value.
const SECRET_KEYS: [&str; 5] = [
    "secret",
    "previous_secret",
    "admin_token",
    "release_key",
    "metrics_token",
];

fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
    let deserializer =
        toml::Deserializer::parse(text).map_err(|e| syntax_error(text, e.message(), e.span()))?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let inner = e.inner();
        let path = e.path().to_string();
        if path.is_empty() || path == "." {
            return syntax_error(text, inner.message(), inner.span());
        }
        let is_secret = matches!(
            e.path().iter().next_back(),
            Some(serde_path_to_error::Segment::Map { key }) if SECRET_KEYS.contains(&key.as_str())
        );
        let message = if is_secret {
            "must be a string (the value is not shown: it is a secret)".to_owned()
        } else {
            inner.message().to_owned()
        };
        let message = match inner.span() {
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                format!("{message} (line {line}, column {column})")
            }
            None => message,
        };
        ConfigError::new(path, message)
    })
}

/// An error with no field path to name (TOML syntax): name the place.
fn syntax_error(text: &str, message: &str, span: Option<std::ops::Range<usize>>) -> ConfigError {
    let Some(span) = span else {
        return ConfigError::new("", message);
    };
    let (line, column) = line_column(text, span.start);
    let message = if line_sets_secret(text, span.start) {
        "cannot be parsed (the line is not shown: it sets a secret)"
    } else {
        message
    };
    ConfigError::new(format!("line {line}, column {column}"), message)
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.as_bytes().get(..offset).unwrap_or_default();
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

fn line_sets_secret(text: &str, offset: usize) -> bool {
    let offset = offset.min(text.len());
    let bytes = text.as_bytes();
    let start = bytes[..offset]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = String::from_utf8_lossy(&bytes[start..]);
    let line = line.lines().next().unwrap_or_default();
    let key = line.split('=').next().unwrap_or_default();
    let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
    SECRET_KEYS.contains(&key)
}

fn check_secret(field: &str, secret: &Secret) -> Result<(), ConfigError> {
    if secret.len() < Secret::MIN_LEN {
        return Err(ConfigError::new(
            field,
            format!(
                "must be at least {} bytes, got {} (make one with `openssl rand -hex 32`)",
                Secret::MIN_LEN,
                secret.len()
            ),
        ));
    }
    Ok(())
}

impl FileConfig {
    fn into_config(self) -> Result<Config, ConfigError> {
        let defaults = Config::default();
        let (backend, redis_wait) = self.backend()?;
        for (field, secret) in [
            ("secret", &self.secret),
            ("previous_secret", &self.previous_secret),
            ("admin_token", &self.admin_token),
            ("release_key", &self.release_key),
            ("metrics_token", &self.metrics_token),
        ] {
            if let Some(s) = secret {
                check_secret(field, s)?;
            }
        }
        let data_dir = self.data_dir.unwrap_or(defaults.data_dir);
        if data_dir.as_os_str().is_empty() {
            return Err(ConfigError::new("data_dir", "must not be empty"));
        }
        let snapshot_interval = self.snapshot_interval.unwrap_or(defaults.snapshot_interval);
        if !(std::time::Duration::from_millis(100)..=std::time::Duration::from_secs(86_400))
            .contains(&snapshot_interval)
        {
            return Err(ConfigError::new(
                "snapshot_interval",
                "must be between 100ms and 24h",
            ));
        }
        let report_keep = self.report_keep.unwrap_or(defaults.report_keep);
        if report_keep > Config::MAX_REPORT_KEEP {
            return Err(ConfigError::new("report_keep", "must be at most 3650d"));
        }
        let public_url = match self.public_url {
            None => None,
            Some(url) => Some(check_public_url(&url)?),
        };
        let webhooks = self
            .webhooks
            .into_iter()
            .enumerate()
            .map(|(i, w)| w.into_config(&format!("webhooks[{i}]")))
            .collect::<Result<_, _>>()?;
        for (field, dir) in [
            ("templates_dir", &self.templates_dir),
            ("messages_dir", &self.messages_dir),
        ] {
            if let Some(dir) = dir {
                check_templates_dir(field, &dir.to_string_lossy())?;
            }
        }
        for (field, path) in [
            ("pass_key_file", &self.pass_key_file),
            ("previous_pass_key_file", &self.previous_pass_key_file),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(ConfigError::new(field, "must not be empty"));
            }
        }
        if self.previous_pass_key_file.is_some() && self.pass_key_file.is_none() {
            return Err(ConfigError::new(
                "previous_pass_key_file",
                "set only together with pass_key_file (a derived pass key rotates with \
                 secret and previous_secret)",
            ));
        }
        let push = match self.push {
            None => defaults.push,
            Some(table) => table.into_config()?,
        };
        let rooms = match self.rooms {
            None => defaults.rooms,
            Some(tables) => rooms_from_tables(tables)?,
        };
        Ok(Config {
            listen: self.listen.unwrap_or(defaults.listen),
            data_dir,
            backend,
            durability: self.durability,
            snapshot_interval,
            report_keep,
            secret: self.secret,
            previous_secret: self.previous_secret,
            pass_algorithm: self.pass_algorithm,
            pass_key_file: self.pass_key_file,
            previous_pass_key_file: self.previous_pass_key_file,
            admin_token: self.admin_token,
            release_key: self.release_key,
            metrics_token: self.metrics_token,
            cookie_secure: self.cookie_secure,
            trusted_proxies: self.trusted_proxies.into_iter().map(|p| p.0).collect(),
            client_ip_header: self.client_ip_header,
            log_format: self.log_format,
            on_backend_error: self.on_backend_error,
            redis_wait,
            max_streams_per_address: self
                .max_streams_per_address
                .unwrap_or(defaults.max_streams_per_address),
            max_streams_per_ticket: self
                .max_streams_per_ticket
                .unwrap_or(defaults.max_streams_per_ticket),
            public_url,
            webhooks,
            templates_dir: self.templates_dir,
            messages_dir: self.messages_dir,
            push,
            rooms,
        })
    }

    fn backend(&self) -> Result<(Backend, RedisWait), ConfigError> {
        let redis = RedisKeys {
            url: self.redis_url.as_deref(),
            cluster_nodes: &self.redis_cluster_nodes,
            sentinels: &self.redis_sentinels,
            master_name: self.redis_master_name.as_deref(),
            password: self.redis_password.as_ref(),
            sentinel_password: self.redis_sentinel_password.as_ref(),
            wait_replicas: self.redis_wait_replicas,
            wait_timeout: self.redis_wait_timeout,
        };
        match self.backend {
            // A Redis setting beside the embedded backend usually means a
            // forgotten `backend = "redis"`: instances would then each run
            // their own queue, which is unfair, so it is an error.
            BackendKind::Embedded => match redis.first_set() {
                Some(key) => Err(ConfigError::new(
                    key,
                    "set, but backend is \"embedded\" (add backend = \"redis\", or remove it)",
                )),
                None => Ok((Backend::Embedded, RedisWait::OFF)),
            },
            BackendKind::Redis => {
                let target = redis.target()?;
                let wait = redis.wait(&target)?;
                Ok((Backend::Redis(target), wait))
            }
        }
    }
}

fn rooms_from_tables(tables: Vec<RoomTable>) -> Result<Vec<RoomSettings>, ConfigError> {
    if tables.is_empty() {
        return Err(ConfigError::new(
            "rooms",
            "at least one room is needed (leave rooms out for the default room)",
        ));
    }
    let mut rooms: Vec<RoomSettings> = Vec::with_capacity(tables.len());
    for (i, table) in tables.into_iter().enumerate() {
        let prefix = format!("rooms[{i}]");
        if let Some(first) = rooms.iter().position(|r| r.id == table.id) {
            return Err(ConfigError::new(
                format!("{prefix}.id"),
                format!("duplicate room id \"{}\" (also rooms[{first}])", table.id),
            ));
        }
        rooms.push(table.into_settings(&prefix)?);
    }
    if let Err(c) =
        crate::routes::RouteTable::build(rooms.iter().map(|r| (&r.id, r.routes.as_slice())))
    {
        let at = |id: &RoomId| rooms.iter().position(|r| r.id == *id).unwrap_or(0);
        return Err(ConfigError::new(
            format!("rooms[{}].routes[{}]", at(&c.second), c.index),
            format!(
                "the same route as rooms[{}] (\"{}\"): a route leads to one room",
                at(&c.first),
                c.first
            ),
        ));
    }
    Ok(rooms)
}

impl WebhookTable {
    fn into_config(self, prefix: &str) -> Result<WebhookConfig, ConfigError> {
        check_http_url(&join_field(prefix, "url"), &self.url)?;
        let key = |field: &str, secret: &Secret| {
            SigningKey::parse(secret).map_err(|e| ConfigError::new(join_field(prefix, field), e))
        };
        let secret = key("secret", &self.secret)?;
        let previous_secret = match &self.previous_secret {
            Some(s) => Some(key("previous_secret", s)?),
            None => None,
        };
        let events = self
            .events
            .iter()
            .enumerate()
            .map(|(i, name)| {
                EventType::from_name(name).ok_or_else(|| {
                    // Event names are not secret; quote them (escaped).
                    ConfigError::new(
                        format!("{prefix}.events[{i}]"),
                        format!(
                            "unknown event {name:?}; the events are {}",
                            EventType::names()
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.queue_threshold == Some(0) {
            return Err(ConfigError::new(
                join_field(prefix, "queue_threshold"),
                "must be at least 1 (leave it out for no threshold), got 0",
            ));
        }
        Ok(WebhookConfig {
            url: self.url,
            secret,
            previous_secret,
            events,
            queue_threshold: self.queue_threshold,
        })
    }
}

#[cfg(test)]
mod tests;
