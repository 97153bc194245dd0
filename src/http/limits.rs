//! Per-address limits that keep bots from crowding out people: how many new
//! tickets one client address may take in a room per minute, and how many
//! event streams it may hold open.
//!
//! The join limit is the sliding-window counter of seed 002: two fixed
//! one-minute windows, the previous one weighted by how much of it still
//! overlaps the sliding minute. It needs two counters per (room, address),
//! has no burst at window edges worth exploiting, and its estimate errs on
//! the generous side only by the unevenness of the previous minute.
//!
//! The client address is the connection's peer, unless that peer is a
//! configured trusted proxy: then the right-most address in
//! `X-Forwarded-For` (or `Forwarded: for=`) that is not itself a trusted
//! proxy. IPv6 clients are counted per /64, the block one subscriber gets,
//! so a single host cannot escape the limit by cycling addresses.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use dashmap::DashMap;
use ipnet::IpNet;

use super::error::ApiError;
use super::state::AppState;
use crate::engine::RoomId;

const WINDOW_MS: u64 = 60_000;

/// The address a request is counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientIp(pub IpAddr);

impl ClientIp {
    /// The connection's peer, or the client a trusted proxy names.
    pub fn resolve(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> Self {
        let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
        if !is_trusted(&peer) {
            return Self(peer);
        }
        // Proxies append: walk from the nearest hop outwards and stop at the
        // first address no trusted proxy vouches for. Anything further left
        // was written by the client and may be forged.
        let hops = forwarded_for(headers);
        hops.iter()
            .rev()
            .find(|ip| !is_trusted(ip))
            .or(hops.first())
            .map_or(Self(peer), |ip| Self(*ip))
    }

    /// What the counters key on: the address, or its /64 for IPv6.
    fn key(self) -> IpAddr {
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

/// Addresses from `X-Forwarded-For` and `Forwarded`, in hop order; entries
/// that do not parse (obfuscated identifiers, `unknown`) are skipped.
fn forwarded_for(headers: &HeaderMap) -> Vec<IpAddr> {
    let mut hops = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let Ok(value) = value.to_str() else { continue };
        hops.extend(value.split(',').filter_map(|s| parse_ip(s.trim())));
    }
    if hops.is_empty() {
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

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        // Without connection info (a router driven in a unit test) every
        // request counts as one unspecified client.
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
        Ok(Self::resolve(
            peer,
            &parts.headers,
            &state.settings.trusted_proxies,
        ))
    }
}

/// The join route's state is an `Arc` (see `router`).
impl FromRequestParts<std::sync::Arc<AppState>> for ClientIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &std::sync::Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        <Self as FromRequestParts<AppState>>::from_request_parts(parts, state).await
    }
}

/// Two fixed windows of the sliding-window counter.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// Which minute `current` counts (Unix ms / 60 000).
    minute: u64,
    current: u32,
    previous: u32,
}

impl Window {
    /// Roll the windows forward to `minute`.
    fn at(self, minute: u64) -> Self {
        match minute.saturating_sub(self.minute) {
            0 => self,
            1 => Window {
                minute,
                current: 0,
                previous: self.current,
            },
            _ => Window {
                minute,
                current: 0,
                previous: 0,
            },
        }
    }

    /// Joins counted in the minute that ends now.
    fn estimate(&self, now_ms: u64) -> f64 {
        let into = (now_ms % WINDOW_MS) as f64 / WINDOW_MS as f64;
        f64::from(self.previous) * (1.0 - into) + f64::from(self.current)
    }

    /// How long until one more join fits under `limit` if nothing else
    /// joins: the previous window's weight decays linearly; when the current
    /// window alone is full, it must first become the previous one and decay.
    fn wait(&self, now_ms: u64, limit: u32) -> Duration {
        let room_for_one = f64::from(limit) - 1.0;
        let into = (now_ms % WINDOW_MS) as f64 / WINDOW_MS as f64;
        let (current, previous) = (f64::from(self.current), f64::from(self.previous));
        let fraction = if current <= room_for_one {
            if previous == 0.0 {
                0.0
            } else {
                // previous * (1 - f) + current <= limit - 1
                (1.0 - (room_for_one - current) / previous) - into
            }
        } else {
            // current * (1 - f) <= limit - 1, one window later
            (1.0 - into) + (1.0 - room_for_one / current)
        };
        // A millisecond over, so that float rounding never names a moment
        // at which the join is still refused.
        Duration::from_millis((fraction.max(0.0) * WINDOW_MS as f64).ceil() as u64 + 1)
    }
}

/// Joins per (room, client) per sliding minute.
#[derive(Debug, Default)]
pub struct JoinLimiter {
    windows: DashMap<(RoomId, IpAddr), Window>,
}

impl JoinLimiter {
    /// Count a join, or say how long to wait. `limit` 0 means no limit.
    pub fn check(
        &self,
        room: &RoomId,
        client: ClientIp,
        limit: u32,
        now_ms: u64,
    ) -> Result<(), Duration> {
        if limit == 0 {
            return Ok(());
        }
        let minute = now_ms / WINDOW_MS;
        let mut entry = self
            .windows
            .entry((room.clone(), client.key()))
            .or_insert(Window {
                minute,
                current: 0,
                previous: 0,
            });
        let window = entry.at(minute);
        if window.estimate(now_ms) + 1.0 > f64::from(limit) {
            *entry = window;
            return Err(window.wait(now_ms, limit).max(Duration::from_secs(1)));
        }
        *entry = Window {
            current: window.current + 1,
            ..window
        };
        Ok(())
    }

    /// Forget clients whose windows no longer count, so the map holds only
    /// the last two minutes' joiners.
    pub fn sweep(&self, now_ms: u64) {
        let minute = now_ms / WINDOW_MS;
        self.windows
            .retain(|_, w| minute.saturating_sub(w.minute) < 2);
    }

    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

/// Open event streams per client.
#[derive(Debug)]
pub struct StreamLimiter {
    open: DashMap<IpAddr, u32>,
    limit: u32,
}

/// One open stream; dropping it (the stream ended) frees the slot.
#[derive(Debug)]
pub struct StreamSlot {
    limiter: Arc<StreamLimiter>,
    key: Option<IpAddr>,
}

impl StreamLimiter {
    /// `limit` 0 means no limit.
    pub fn new(limit: u32) -> Arc<Self> {
        Arc::new(Self {
            open: DashMap::new(),
            limit,
        })
    }

    /// A slot for one more stream from `client`, if it has one left.
    pub fn acquire(self: &Arc<Self>, client: ClientIp) -> Result<StreamSlot, ApiError> {
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
    pub fn open(&self, client: ClientIp) -> u32 {
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

/// The 429 a join over the limit gets.
pub fn join_limited(limit: u32, wait: Duration) -> ApiError {
    let secs = u32::try_from(wait.as_secs_f64().ceil() as u64)
        .unwrap_or(u32::MAX)
        .max(1);
    ApiError::new(
        axum::http::StatusCode::TOO_MANY_REQUESTS,
        "too_many_joins",
        format!(
            "Too many new tickets from this address: at most {limit} a minute in this room. Try again in {secs} s."
        ),
    )
    .retry_after(secs)
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
        // From an untrusted peer the header is ignored.
        assert_eq!(
            ClientIp::resolve(ip("198.51.100.1"), &xff, &trusted).0,
            ip("198.51.100.1")
        );
        // From a trusted proxy: the right-most untrusted hop, not the
        // client-written left end.
        assert_eq!(
            ClientIp::resolve(ip("127.0.0.1"), &xff, &trusted).0,
            ip("203.0.113.7")
        );
        let fwd = headers(&[(
            "forwarded",
            "for=192.0.2.60;proto=http, for=\"[2001:db8::1]:4711\"",
        )]);
        assert_eq!(
            ClientIp::resolve(ip("10.0.0.1"), &fwd, &trusted).0,
            ip("2001:db8::1")
        );
        // Nothing usable: the peer itself.
        let junk = headers(&[("x-forwarded-for", "unknown, _hidden")]);
        assert_eq!(
            ClientIp::resolve(ip("127.0.0.1"), &junk, &trusted).0,
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
    fn the_sliding_window_allows_the_limit_per_minute() {
        let limiter = JoinLimiter::default();
        let room = RoomId::new("sale").unwrap();
        let client = ClientIp(ip("192.0.2.1"));
        let start = 10 * WINDOW_MS;
        for _ in 0..5 {
            limiter.check(&room, client, 5, start).unwrap();
        }
        let wait = limiter.check(&room, client, 5, start).unwrap_err();
        assert!(wait >= Duration::from_secs(60), "{wait:?}");
        // Another client and another room have their own windows.
        limiter
            .check(&room, ClientIp(ip("192.0.2.2")), 5, start)
            .unwrap();
        limiter
            .check(&RoomId::new("other").unwrap(), client, 5, start)
            .unwrap();
        // Half a minute into the next window, half of the previous five
        // still count: two more fit, not three.
        let later = start + WINDOW_MS + WINDOW_MS / 2;
        limiter.check(&room, client, 5, later).unwrap();
        limiter.check(&room, client, 5, later).unwrap();
        let wait = limiter.check(&room, client, 5, later).unwrap_err();
        assert!(wait <= Duration::from_secs(30), "{wait:?}");
        // A full idle minute later, the slate is clean.
        for _ in 0..5 {
            limiter
                .check(&room, client, 5, start + 3 * WINDOW_MS)
                .unwrap();
        }
        // Limit 0 is off.
        for _ in 0..1000 {
            limiter.check(&room, client, 0, start).unwrap();
        }
    }

    #[test]
    fn the_wait_it_names_is_enough() {
        let room = RoomId::new("sale").unwrap();
        let client = ClientIp(ip("192.0.2.1"));
        for limit in [1u32, 3, 7, 120] {
            for offset in [0, 1, 17_000, 59_999] {
                let limiter = JoinLimiter::default();
                let now = 5 * WINDOW_MS + offset;
                while limiter.check(&room, client, limit, now).is_ok() {}
                let wait = limiter.check(&room, client, limit, now).unwrap_err();
                let then = now + u64::try_from(wait.as_millis()).unwrap();
                assert!(
                    limiter.check(&room, client, limit, then).is_ok(),
                    "limit {limit} offset {offset}"
                );
            }
        }
    }

    #[test]
    fn sweeping_forgets_idle_clients() {
        let limiter = JoinLimiter::default();
        let room = RoomId::new("sale").unwrap();
        limiter
            .check(&room, ClientIp(ip("192.0.2.1")), 5, 0)
            .unwrap();
        limiter.sweep(WINDOW_MS);
        assert_eq!(limiter.len(), 1);
        limiter.sweep(2 * WINDOW_MS);
        assert!(limiter.is_empty());
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
