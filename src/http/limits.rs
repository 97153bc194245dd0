//! Per-address limits that keep bots from crowding out people: which
//! address a request counts against, and how many event streams one
//! address may hold open. (How many new tickets an address may take per
//! minute is decided by the backend on each join, so that it holds across
//! instances: `rules::join_allowance`.)
//!
//! The client address is the connection's peer, unless that peer is a
//! configured trusted proxy: then the right-most address that is not
//! itself a trusted proxy in the one header the proxy is configured to
//! write (`client_ip_header`: `X-Forwarded-For`, or `Forwarded: for=`).
//! The other is never read, since a proxy that writes one passes the
//! client's own copy of the other through. IPv6 clients are counted per /64, the block one subscriber gets,
//! so a single host cannot escape the limit by cycling addresses.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use dashmap::DashMap;
use ipnet::IpNet;

use super::error::ApiError;
use super::state::AppState;
use crate::backend::join_log::JoinLog;
use crate::config::ClientIpHeader;
use crate::engine::RoomId;

/// The address a request is counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ClientIp(pub IpAddr);

impl ClientIp {
    /// The connection's peer, or the client a trusted proxy names.
    pub(crate) fn resolve(
        peer: IpAddr,
        headers: &HeaderMap,
        trusted: &[IpNet],
        header: ClientIpHeader,
    ) -> Self {
        let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
        if !is_trusted(&peer) {
            return Self(peer);
        }
        // Proxies append: walk from the nearest hop outwards and stop at the
        // first address no trusted proxy vouches for. Anything further left
        // was written by the client and may be forged.
        let hops = forwarded_for(headers, header);
        hops.iter()
            .rev()
            .find(|ip| !is_trusted(ip))
            .or(hops.first())
            .map_or(Self(peer), |ip| Self(*ip))
    }

    /// What the limits count: the address, or its /64 for IPv6.
    pub(crate) fn key(self) -> IpAddr {
        match self.0 {
            IpAddr::V4(v4) => IpAddr::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    IpAddr::V6(Ipv6Addr::from(bits))
                }
            },
        }
    }
}

/// Addresses from `header`, in hop order; entries that do not parse
/// (obfuscated identifiers, `unknown`) are skipped.
fn forwarded_for(headers: &HeaderMap, header: ClientIpHeader) -> Vec<IpAddr> {
    let mut hops = Vec::new();
    if header == ClientIpHeader::XForwardedFor {
        for value in headers.get_all("x-forwarded-for") {
            let Ok(value) = value.to_str() else { continue };
            hops.extend(value.split(',').filter_map(|s| parse_ip(s.trim())));
        }
    } else {
        for value in headers.get_all("forwarded") {
            let Ok(value) = value.to_str() else { continue };
            for element in value.split(',') {
                for pair in element.split(';') {
                    let Some((name, v)) = pair.trim().split_once('=') else {
                        continue;
                    };
                    if name.eq_ignore_ascii_case("for")
                        && let Some(ip) = parse_ip(v.trim().trim_matches('"'))
                    {
                        hops.push(ip);
                    }
                }
            }
        }
    }
    hops
}

/// `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]`, `[::1]:80`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// The address the connection comes from, where the server recorded it.
pub(crate) fn peer(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// Whether the connection comes from one of `trusted_proxies`, whose
/// forwarded headers are believed.
pub(crate) fn from_trusted_proxy(parts: &Parts, trusted: &[IpNet]) -> bool {
    peer(parts).is_some_and(|ip| trusted.iter().any(|net| net.contains(&ip)))
}

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // Without connection info (a router driven in a unit test) every
        // request counts as one unspecified client.
        let peer = peer(parts).unwrap_or(IpAddr::from([0, 0, 0, 0]));
        Ok(Self::resolve(
            peer,
            &parts.headers,
            &state.settings.trusted_proxies,
            state.settings.client_ip_header,
        ))
    }
}

/// Challenge fetches per client and room, in a sliding minute: a
/// challenge for each join the room's `join_limit_per_minute` allows an
/// address, and as many again for reloads and retries. Without it an
/// address could stock up on challenges for later, and every fetch costs
/// this instance an HMAC and a counted metric. Kept per instance: several
/// instances each allow this many, which is still bounded, and nothing is
/// written to the store for a request that makes no ticket.
#[derive(Debug, Default)]
pub(crate) struct ChallengeLimiter {
    log: JoinLog,
    swept_at: AtomicU64,
}

impl ChallengeLimiter {
    /// Challenge fetches allowed per join the room allows.
    pub(crate) const PER_JOIN: u32 = 2;
    /// How often addresses that stopped fetching are forgotten.
    const SWEEP_EVERY_MS: u64 = 30_000;

    /// Counts one fetch from `client`, or says how long until one more fits
    /// under a room's `join_limit` (0: no limit).
    pub(crate) fn fetch(
        &self,
        room: &RoomId,
        client: ClientIp,
        join_limit: u32,
        now: u64,
    ) -> Result<(), ApiError> {
        let limit = join_limit.saturating_mul(Self::PER_JOIN);
        let swept = self.swept_at.load(Ordering::Relaxed);
        if now >= swept + Self::SWEEP_EVERY_MS
            && self
                .swept_at
                .compare_exchange(swept, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.log.sweep(now);
        }
        match self
            .log
            .admit(room, client.key(), limit, now, || Ok::<_, ()>(()))
        {
            Ok(_) => Ok(()),
            Err(wait) => {
                let secs = u32::try_from(wait.as_secs_f64().ceil() as u64)
                    .unwrap_or(u32::MAX)
                    .max(1);
                Err(ApiError::new(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    "too_many_challenges",
                    format!(
                        "Too many challenges fetched from this address: at most {limit} a minute \
                         in this room. Solve one you have, or try again in {secs} s."
                    ),
                )
                .retry_after(secs))
            }
        }
    }
}

/// Open event streams per client.
#[derive(Debug)]
pub(crate) struct StreamLimiter {
    open: DashMap<IpAddr, u32>,
    limit: u32,
}

/// One open stream; dropping it (the stream ended) frees the slot.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    limiter: Arc<StreamLimiter>,
    key: Option<IpAddr>,
}

impl StreamLimiter {
    /// `limit` 0 means no limit.
    pub(crate) fn new(limit: u32) -> Arc<Self> {
        Arc::new(Self {
            open: DashMap::new(),
            limit,
        })
    }

    /// A slot for one more stream from `client`, if it has one left.
    pub(crate) fn acquire(self: &Arc<Self>, client: ClientIp) -> Result<StreamSlot, ApiError> {
        if self.limit == 0 {
            return Ok(StreamSlot {
                limiter: self.clone(),
                key: None,
            });
        }
        let key = client.key();
        let mut open = self.open.entry(key).or_insert(0);
        if *open >= self.limit {
            return Err(ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "This address already has {} event streams open; close one (another tab) first.",
                    self.limit
                ),
            )
            .retry_after(5));
        }
        *open += 1;
        Ok(StreamSlot {
            limiter: self.clone(),
            key: Some(key),
        })
    }

    /// Streams open from `client` now.
    #[cfg(test)]
    pub(crate) fn open(&self, client: ClientIp) -> u32 {
        self.open.get(&client.key()).map_or(0, |n| *n)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            // Remove the entry at zero so the map holds only live clients.
            self.limiter.open.remove_if_mut(&key, |_, n| {
                *n = n.saturating_sub(1);
                *n == 0
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let trusted: Vec<IpNet> = vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
        ];
        let xff = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.2.3")]);
        let x = ClientIpHeader::XForwardedFor;
        let f = ClientIpHeader::Forwarded;
        // From an untrusted peer the header is ignored.
        assert_eq!(
            ClientIp::resolve(ip("198.51.100.1"), &xff, &trusted, x).0,
            ip("198.51.100.1")
        );
        // From a trusted proxy: the right-most untrusted hop, not the
        // client-written left end.
        assert_eq!(
            ClientIp::resolve(ip("127.0.0.1"), &xff, &trusted, x).0,
            ip("203.0.113.7")
        );
        let fwd = headers(&[(
            "forwarded",
            "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"",
        )]);
        assert_eq!(
            ClientIp::resolve(ip("10.0.0.1"), &fwd, &trusted, f).0,
            ip("2001:db8::1")
        );
        // Only the configured header is read: the other is the client's.
        assert_eq!(
            ClientIp::resolve(ip("10.0.0.1"), &fwd, &trusted, x).0,
            ip("10.0.0.1")
        );
        let both = headers(&[
            ("x-forwarded-for", "198.51.100.66"),
            ("forwarded", "for=203.0.113.9"),
        ]);
        assert_eq!(
            ClientIp::resolve(ip("10.0.0.1"), &both, &trusted, f).0,
            ip("203.0.113.9")
        );
        assert_eq!(
            ClientIp::resolve(ip("10.0.0.1"), &both, &trusted, x).0,
            ip("198.51.100.66")
        );
        // Nothing usable: the peer itself.
        let junk = headers(&[("x-forwarded-for", "unknown, _hidden")]);
        assert_eq!(
            ClientIp::resolve(ip("127.0.0.1"), &junk, &trusted, x).0,
            ip("127.0.0.1")
        );
    }

    #[test]
    fn ipv6_clients_are_counted_per_64() {
        let a = ClientIp(ip("2001:db8:1:2:aaaa::1"));
        let b = ClientIp(ip("2001:db8:1:2:bbbb::9"));
        let c = ClientIp(ip("2001:db8:1:3::1"));
        assert_eq!(a.key(), b.key());
        assert_ne!(a.key(), c.key());
        assert_eq!(ClientIp(ip("::ffff:192.0.2.1")).key(), ip("192.0.2.1"));
    }

    #[test]
    fn stream_slots_are_given_back() {
        let limiter = StreamLimiter::new(2);
        let client = ClientIp(ip("192.0.2.1"));
        let a = limiter.acquire(client).unwrap();
        let b = limiter.acquire(client).unwrap();
        assert_eq!(limiter.acquire(client).unwrap_err().status, 429);
        assert!(limiter.acquire(ClientIp(ip("192.0.2.2"))).is_ok());
        drop(a);
        let c = limiter.acquire(client).unwrap();
        drop((b, c));
        assert_eq!(limiter.open(client), 0);
        assert!(limiter.open.get(&client.key()).is_none());
    }

    #[test]
    fn many_threads_never_exceed_the_stream_cap() {
        let limiter = StreamLimiter::new(5);
        let client = ClientIp(ip("192.0.2.1"));
        let peak = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..2000 {
                        if let Ok(slot) = limiter.acquire(client) {
                            peak.fetch_max(
                                limiter.open(client),
                                std::sync::atomic::Ordering::Relaxed,
                            );
                            drop(slot);
                        }
                    }
                });
            }
        });
        assert!(peak.into_inner() <= 5);
        assert_eq!(limiter.open(client), 0);
    }
}
