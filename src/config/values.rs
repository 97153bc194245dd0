//! Parsers and checks for the single values in the config file that are more
//! than a number or a word: addresses, networks and URLs.
//!
//! URLs are checked for shape only and never quoted back in an error, since
//! a Redis URL may carry a password and a webhook URL is often a token.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::ConfigError;

/// `scheme://rest` where rest is non-empty and free of spaces and control
/// characters. The URL itself is never quoted back: it may hold a password.
fn is_clean(text: &str) -> bool {
    !text.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn check_url(field: &str, url: &str, schemes: &[&str], expected: &str) -> Result<(), ConfigError> {
    let rest = url
        .split_once("://")
        .filter(|(scheme, _)| schemes.contains(&scheme.to_ascii_lowercase().as_str()))
        .map(|(_, rest)| rest);
    match rest {
        Some(rest) if !rest.is_empty() && !rest.starts_with('/') && is_clean(rest) => Ok(()),
        _ => Err(ConfigError::new(field, format!("must be {expected}"))),
    }
}

pub(super) fn check_redis_url(field: &str, url: &str) -> Result<(), ConfigError> {
    const EXPECTED: &str = "a Redis URL such as \"redis://127.0.0.1:6379\"";
    let lower = url.to_ascii_lowercase();
    // A unix socket is named by its path: `redis+unix:///run/redis.sock`.
    let socket_path = ["redis+unix://", "unix://"]
        .iter()
        .find_map(|scheme| lower.strip_prefix(scheme));
    match socket_path {
        Some(path) if path.len() > 1 && path.starts_with('/') && is_clean(path) => Ok(()),
        Some(_) => Err(ConfigError::new(field, format!("must be {EXPECTED}"))),
        None => check_url(field, url, &["redis", "rediss"], EXPECTED),
    }
}

pub(super) fn check_http_url(field: &str, url: &str) -> Result<(), ConfigError> {
    check_url(field, url, &["http", "https"], "an http:// or https:// URL")
}

/// A base URL: scheme and host (and maybe a path prefix), nothing after.
/// The trailing slash is dropped so `{public_url}/queue/{room}` joins cleanly.
pub(super) fn check_public_url(url: &str) -> Result<String, ConfigError> {
    check_http_url("public_url", url)?;
    if url.contains(['?', '#']) {
        return Err(ConfigError::new(
            "public_url",
            "must not have a query or fragment",
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

pub(super) fn listen_address<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(d)?;
    text.trim().parse().map(Some).map_err(|_| {
        de::Error::custom(format_args!(
            r#"expected an address and port such as "127.0.0.1:8080" or "[::]:8080", got {text:?}"#
        ))
    })
}

/// A trusted proxy: a network (`10.0.0.0/8`) or a single address.
pub(super) struct ProxyNet(pub(super) IpNet);

impl<'de> Deserialize<'de> for ProxyNet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NetVisitor;
        impl Visitor<'_> for NetVisitor {
            type Value = IpNet;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"an IP address or network such as "10.0.0.0/8""#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IpNet, E> {
                let v = v.trim();
                if let Ok(net) = v.parse::<IpNet>() {
                    // "10.1.2.3/8" means the network 10.0.0.0/8.
                    return Ok(net.trunc());
                }
                v.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
                    E::custom(format_args!(
                        r#"expected an IP address or network such as "10.0.0.0/8", got {v:?}"#
                    ))
                })
            }
        }
        d.deserialize_str(NetVisitor).map(ProxyNet)
    }
}
