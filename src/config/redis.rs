//! Where the Redis backend finds Redis: one server by URL, a Redis Cluster
//! by its seed nodes, or a primary that Redis Sentinel names (and renames
//! after a failover). The file's `redis_*` keys are checked here, together,
//! since they only make sense in some combinations.

use std::time::Duration;

use super::values::check_redis_url;
use super::{ConfigError, Secret};
pub use crate::backend::redis::target::{RedisTarget, RedisWait, SentinelTarget};

/// The file's `redis_*` keys as written.
#[derive(Default)]
pub(super) struct RedisKeys<'a> {
    pub url: Option<&'a str>,
    pub cluster_nodes: &'a [String],
    pub sentinels: &'a [String],
    pub master_name: Option<&'a str>,
    pub password: Option<&'a Secret>,
    pub sentinel_password: Option<&'a Secret>,
    pub wait_replicas: Option<u32>,
    pub wait_timeout: Option<Duration>,
}

impl RedisKeys<'_> {
    /// The first key that is set, for the error when the backend is not Redis.
    pub(super) fn first_set(&self) -> Option<&'static str> {
        [
            ("redis_url", self.url.is_some()),
            ("redis_cluster_nodes", !self.cluster_nodes.is_empty()),
            ("redis_sentinels", !self.sentinels.is_empty()),
            ("redis_master_name", self.master_name.is_some()),
            ("redis_password", self.password.is_some()),
            ("redis_sentinel_password", self.sentinel_password.is_some()),
            ("redis_wait_replicas", self.wait_replicas.is_some()),
            ("redis_wait_timeout", self.wait_timeout.is_some()),
        ]
        .into_iter()
        .find_map(|(key, set)| set.then_some(key))
    }

    /// `redis_wait_replicas` and `redis_wait_timeout`, checked against each
    /// other and the target.
    pub(super) fn wait(&self, target: &RedisTarget) -> Result<RedisWait, ConfigError> {
        let replicas = self.wait_replicas.unwrap_or(0);
        if replicas > RedisWait::MAX_REPLICAS {
            return Err(ConfigError::new(
                "redis_wait_replicas",
                format!(
                    "must be between 0 and {}, got {replicas}",
                    RedisWait::MAX_REPLICAS
                ),
            ));
        }
        let timeout = self.wait_timeout.unwrap_or(RedisWait::DEFAULT_TIMEOUT);
        if !(RedisWait::MIN_TIMEOUT..=RedisWait::MAX_TIMEOUT).contains(&timeout) {
            return Err(ConfigError::new(
                "redis_wait_timeout",
                "must be between 10ms and 1500ms (below the 2 s a Redis answer may take)",
            ));
        }
        if replicas == 0 && self.wait_timeout.is_some() {
            return Err(ConfigError::new(
                "redis_wait_timeout",
                "only used with redis_wait_replicas above 0",
            ));
        }
        if replicas > 0 && matches!(target, RedisTarget::Cluster { .. }) {
            return Err(ConfigError::new(
                "redis_wait_replicas",
                "not supported with redis_cluster_nodes (a Cluster's failover may lose the \
                 last acknowledged changes; use a primary with replicas and redis_sentinels)",
            ));
        }
        Ok(RedisWait { replicas, timeout })
    }

    /// The target these keys describe, or what is wrong with them.
    pub(super) fn target(&self) -> Result<RedisTarget, ConfigError> {
        if !self.sentinels.is_empty() {
            return self.sentinel().map(RedisTarget::Sentinel);
        }
        for (key, set) in [
            ("redis_master_name", self.master_name.is_some()),
            ("redis_password", self.password.is_some()),
            ("redis_sentinel_password", self.sentinel_password.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(
                    key,
                    "only used with redis_sentinels (a password for redis_url or \
                     redis_cluster_nodes goes in the URL: redis://:password@host:port)",
                ));
            }
        }
        if let Some(url) = self.url {
            check_redis_url("redis_url", url)?;
        }
        for (i, node) in self.cluster_nodes.iter().enumerate() {
            check_redis_url(&format!("redis_cluster_nodes[{i}]"), node)?;
        }
        match (self.url, self.cluster_nodes) {
            (None, []) => Err(ConfigError::new(
                "redis_url",
                "required with backend = \"redis\" (or redis_cluster_nodes, or \
                 redis_sentinels with redis_master_name)",
            )),
            (Some(url), []) => Ok(RedisTarget::Single {
                url: url.to_owned(),
            }),
            // redis_url beside the cluster's nodes is one more seed node.
            (url, nodes) => {
                let mut all: Vec<String> = url.map(str::to_owned).into_iter().collect();
                all.extend(nodes.iter().filter(|n| Some(n.as_str()) != url).cloned());
                Ok(RedisTarget::Cluster { nodes: all })
            }
        }
    }

    fn sentinel(&self) -> Result<SentinelTarget, ConfigError> {
        for (key, set) in [
            ("redis_url", self.url.is_some()),
            ("redis_cluster_nodes", !self.cluster_nodes.is_empty()),
        ] {
            if set {
                return Err(ConfigError::new(
                    key,
                    "not used with redis_sentinels, which name the primary: remove one of them",
                ));
            }
        }
        let mut sentinels = Vec::with_capacity(self.sentinels.len());
        for (i, address) in self.sentinels.iter().enumerate() {
            let field = format!("redis_sentinels[{i}]");
            let parsed = sentinel_address(address).ok_or_else(|| {
                ConfigError::new(
                    &field,
                    format!(
                        "must be a sentinel's host:port such as \"127.0.0.1:26379\", got {address:?}"
                    ),
                )
            })?;
            if let Some(j) = sentinels.iter().position(|s| *s == parsed) {
                return Err(ConfigError::new(
                    field,
                    format!("duplicate sentinel {address:?} (also redis_sentinels[{j}])"),
                ));
            }
            sentinels.push(parsed);
        }
        let master_name = self.master_name.ok_or_else(|| {
            ConfigError::new(
                "redis_master_name",
                "required with redis_sentinels: the name in the sentinels' \
                 `sentinel monitor <name> …`",
            )
        })?;
        if master_name.is_empty()
            || master_name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ConfigError::new(
                "redis_master_name",
                "must be a name without spaces, as in `sentinel monitor <name> …`",
            ));
        }
        for (key, secret) in [
            ("redis_password", self.password),
            ("redis_sentinel_password", self.sentinel_password),
        ] {
            if secret.is_some_and(Secret::is_empty) {
                return Err(ConfigError::new(
                    key,
                    "must not be empty (leave it out instead)",
                ));
            }
        }
        Ok(SentinelTarget {
            sentinels,
            master_name: master_name.to_owned(),
            password: self.password.cloned(),
            sentinel_password: self.sentinel_password.cloned(),
        })
    }
}

/// `host:port`, `[v6]:port` or `redis://host:port`; the port is not 0.
fn sentinel_address(text: &str) -> Option<(String, u16)> {
    let text = text.strip_prefix("redis://").unwrap_or(text);
    let (host, port) = text.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let clean = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    clean.then(|| (host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Backend, Config};

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str(&format!("backend = \"redis\"\n{text}"), "test.toml")
    }

    fn target(text: &str) -> RedisTarget {
        match parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .backend
        {
            Backend::Redis(t) => t,
            Backend::Embedded => panic!("expected the redis backend"),
        }
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(c) => panic!("expected an error for:\n{text}\ngot {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn sentinels_name_the_primary() {
        let t = target(
            "redis_sentinels = [\"127.0.0.1:26379\", \"redis://sentinel-b:26380\", \"[::1]:26381\"]\n\
             redis_master_name = \"narabu\"\n\
             redis_password = \"primary-pw-hunter2\"\n\
             redis_sentinel_password = \"sentinel-pw-hunter2\"",
        );
        let RedisTarget::Sentinel(s) = &t else {
            panic!("expected Sentinel, got {t:?}")
        };
        assert_eq!(
            s.sentinels,
            [
                ("127.0.0.1".to_owned(), 26379),
                ("sentinel-b".to_owned(), 26380),
                ("::1".to_owned(), 26381)
            ]
        );
        assert_eq!(s.master_name, "narabu");
        assert_eq!(
            s.password.as_ref().map(Secret::expose),
            Some("primary-pw-hunter2")
        );
        assert_eq!(
            s.sentinel_password.as_ref().map(Secret::expose),
            Some("sentinel-pw-hunter2")
        );
        let shown = format!("{t:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("narabu") && shown.contains("26380"),
            "{shown}"
        );
    }

    /// The Sentinel example in `config/narabu.toml` is indented under its
    /// `#` (so that switching every other example on leaves it out: it
    /// cannot stand beside redis_url), and must hold on its own.
    #[test]
    fn the_sentinel_example_in_the_example_file_is_valid() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/narabu.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let example: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("#   redis_"))
            .collect();
        assert_eq!(example.len(), 6, "{example:?}");
        let text = format!("redis_{}", example.join("\nredis_"));
        let wait = parse(&text).unwrap().redis_wait;
        assert_eq!(
            (wait.replicas, wait.timeout),
            (1, RedisWait::DEFAULT_TIMEOUT)
        );
        let t = target(&text);
        let RedisTarget::Sentinel(s) = t else {
            panic!("expected Sentinel, got {t:?}")
        };
        assert_eq!(s.sentinels.len(), 3);
        assert!(s.password.is_some() && s.sentinel_password.is_some());
    }

    #[test]
    fn one_url_or_cluster_nodes() {
        assert!(matches!(
            target("redis_url = \"redis://127.0.0.1:6379\""),
            RedisTarget::Single { url } if url == "redis://127.0.0.1:6379"
        ));
        // Cluster nodes alone, and the URL already among them once.
        for text in [
            "redis_cluster_nodes = [\"redis://a:1\", \"redis://b:2\"]",
            "redis_url = \"redis://a:1\"\nredis_cluster_nodes = [\"redis://a:1\", \"redis://b:2\"]",
        ] {
            assert!(matches!(
                target(text),
                RedisTarget::Cluster { nodes } if nodes == ["redis://a:1", "redis://b:2"]
            ));
        }
    }

    #[test]
    fn sentinel_settings_that_do_not_fit_are_named() {
        let cases = [
            (
                "redis_sentinels = [\"127.0.0.1:26379\"]",
                "redis_master_name: required with redis_sentinels",
            ),
            (
                "redis_master_name = \"narabu\"",
                "redis_master_name: only used with redis_sentinels",
            ),
            (
                "redis_url = \"redis://a\"\nredis_password = \"pw\"",
                "redis_password: only used with redis_sentinels",
            ),
            (
                "redis_url = \"redis://a\"\nredis_sentinel_password = \"pw\"",
                "redis_sentinel_password: only used with redis_sentinels",
            ),
            (
                "redis_url = \"redis://a\"\nredis_sentinels = [\"a:1\"]\nredis_master_name = \"m\"",
                "redis_url: not used with redis_sentinels",
            ),
            (
                "redis_cluster_nodes = [\"redis://a\"]\nredis_sentinels = [\"a:1\"]\nredis_master_name = \"m\"",
                "redis_cluster_nodes: not used with redis_sentinels",
            ),
            (
                "redis_sentinels = [\"a:1\", \"b:2\", \"a:1\"]\nredis_master_name = \"m\"",
                "redis_sentinels[2]: duplicate sentinel \"a:1\" (also redis_sentinels[0])",
            ),
            (
                "redis_sentinels = [\"a:1\"]\nredis_master_name = \"my master\"",
                "redis_master_name: must be a name without spaces",
            ),
            (
                "redis_sentinels = [\"a:1\"]\nredis_master_name = \"\"",
                "redis_master_name: must be a name without spaces",
            ),
            (
                "redis_sentinels = [\"a:1\"]\nredis_master_name = \"m\"\nredis_password = \"\"",
                "redis_password: must not be empty",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.starts_with(&format!("test.toml: {want}")), "{text}\n{e}");
        }
        for bad in [
            "127.0.0.1",
            "host:0",
            "host:port",
            ":26379",
            "a b:1",
            "host:65536",
            "redis://",
            "",
        ] {
            let e = err(&format!(
                "redis_sentinels = [\"a:1\", \"{bad}\"]\nredis_master_name = \"m\""
            ));
            assert!(
                e.starts_with("test.toml: redis_sentinels[1]: must be a sentinel's host:port"),
                "{bad}: {e}"
            );
        }
        let e = Config::from_toml_str("redis_sentinels = [\"a:1\"]", "test.toml").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("test.toml: redis_sentinels: set, but backend is \"embedded\""),
            "{e}"
        );
    }

    #[test]
    fn waiting_for_replicas_is_checked_at_start() {
        let c = parse(
            "redis_sentinels = [\"a:1\"]\nredis_master_name = \"m\"\n\
             redis_wait_replicas = 1\nredis_wait_timeout = \"250ms\"",
        )
        .unwrap();
        assert_eq!(
            c.redis_wait,
            RedisWait {
                replicas: 1,
                timeout: Duration::from_millis(250)
            }
        );
        let c = parse("redis_url = \"redis://a\"\nredis_wait_replicas = 2").unwrap();
        assert_eq!(c.redis_wait.replicas, 2);
        assert_eq!(c.redis_wait.timeout, RedisWait::DEFAULT_TIMEOUT);
        assert!(
            !parse("redis_url = \"redis://a\"")
                .unwrap()
                .redis_wait
                .is_on()
        );
        let cases = [
            (
                "redis_url = \"redis://a\"\nredis_wait_replicas = 17",
                "redis_wait_replicas: must be between 0 and 16, got 17",
            ),
            (
                "redis_url = \"redis://a\"\nredis_wait_replicas = 1\nredis_wait_timeout = \"2s\"",
                "redis_wait_timeout: must be between 10ms and 1500ms",
            ),
            (
                "redis_url = \"redis://a\"\nredis_wait_replicas = 1\nredis_wait_timeout = \"1ms\"",
                "redis_wait_timeout: must be between 10ms and 1500ms",
            ),
            (
                "redis_url = \"redis://a\"\nredis_wait_timeout = \"100ms\"",
                "redis_wait_timeout: only used with redis_wait_replicas above 0",
            ),
            (
                "redis_cluster_nodes = [\"redis://a\"]\nredis_wait_replicas = 1",
                "redis_wait_replicas: not supported with redis_cluster_nodes",
            ),
            (
                "redis_url = \"redis://a\"\nredis_wait_replicas = -1",
                "redis_wait_replicas:",
            ),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.starts_with(&format!("test.toml: {want}")), "{text}\n{e}");
        }
        let e = Config::from_toml_str("redis_wait_replicas = 1", "test.toml").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("test.toml: redis_wait_replicas: set, but backend is \"embedded\""),
            "{e}"
        );
    }
}
