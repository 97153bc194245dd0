//! Where the sender may connect: a push endpoint is chosen by whoever
//! subscribes, so without a check a visitor could have Narabu POST into
//! its own network (a metadata service, an admin port on loopback).
//!
//! A subscription naming an address or `localhost` is refused where it
//! arrives (`Subscription::check_endpoint`); a host name is only known
//! once resolved, so the sender's HTTP client resolves through
//! [`PublicOnly`], which keeps the addresses that lie outside private
//! networks and refuses a name that has none. The addresses it hands back
//! are the ones the client connects to, so a name that changes its answer
//! between a check and the connection (DNS rebinding) gains nothing.
//!
//! A request that goes through an HTTP proxy (`HTTPS_PROXY`) is resolved
//! by the proxy, not here: the proxy's own rules then apply.

use std::net::{IpAddr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Every address the name resolved to lies in a private network.
#[derive(Debug, thiserror::Error)]
#[error("the push endpoint's host resolves only to internal addresses")]
pub(crate) struct Refused;

/// The system resolver, less the internal addresses.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let public: Vec<SocketAddr> = resolved.filter(|a| !is_internal(a.ip())).collect();
            if public.is_empty() {
                return Err(Box::new(Refused) as _);
            }
            Ok(Box::new(public.into_iter()) as Addrs)
        })
    }
}

/// Whether `error`, or an error it came from, is a [`Refused`].
pub(crate) fn refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut e = Some(error);
    while let Some(now) = e {
        if now.is::<Refused>() {
            return true;
        }
        e = now.source();
    }
    false
}

/// Loopback, private, shared (carrier NAT), link-local, unique-local,
/// unspecified, broadcast and multicast addresses, and IPv4 ones mapped
/// into IPv6: none of them is a push service's.
pub(crate) fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                // 0.0.0.0/8, "this network"; 100.64.0.0/10, shared.
                || a == 0
                || (a == 100 && (b & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // fc00::/7, unique local; fe80::/10, link-local.
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr as _;

    #[test]
    fn internal_addresses_are_told_from_public_ones() {
        for internal in [
            "127.0.0.1",
            "127.1.2.3",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.1.1.1",
        ] {
            assert!(is_internal(internal.parse().unwrap()), "{internal}");
        }
        for public in [
            "8.8.8.8",
            "142.250.74.110",
            "100.128.0.1",
            "172.32.0.1",
            "2607:f8b0:4004:800::200e",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_internal(public.parse().unwrap()), "{public}");
        }
    }

    #[tokio::test]
    async fn a_name_for_loopback_is_refused() {
        let error = match PublicOnly
            .resolve(Name::from_str("localhost").unwrap())
            .await
        {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(e) => e,
        };
        assert!(refused(&*error), "{error}");
    }
}
