//! Whether a request that a visitor's ticket cookie authenticates comes
//! from this site itself. The browser sends the cookie on its own (a
//! `SameSite=Lax` cookie even on a cross-site top-level form post in some
//! browsers, and on any request from a sibling subdomain, which is "same
//! site"), so a request that changes something for the visitor (leave,
//! join) must show it is not another page's doing. A Bearer ticket needs no
//! such proof: nothing sends it without the client's own code.
//!
//! `Sec-Fetch-Site`, when sent, decides: the browser sets it and no page
//! can forge it, and it does not depend on how a proxy rewrote `Host`.
//! Otherwise `Origin`, when sent, must name this host: `X-Forwarded-Host`
//! from a trusted proxy, else `Host`. A request with neither (a non-browser
//! client, an old browser's same-origin form) is let through.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};

use super::error::ApiError;
use super::state::AppState;

/// Where a request says it comes from, read once from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Provenance {
    same_origin: bool,
}

impl Provenance {
    /// Refuse (403) a request from another site or origin.
    pub(crate) fn require_same_origin(self) -> Result<(), ApiError> {
        if self.same_origin {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "cross_site_request",
                "This request came from another site or origin; a ticket cookie only \
                 counts on requests from this site's own pages (apps send the ticket \
                 as Authorization: Bearer).",
            ))
        }
    }
}

impl FromRequestParts<AppState> for Provenance {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let trusted = super::limits::from_trusted_proxy(parts, &state.settings.trusted_proxies);
        let host = request_host(
            &parts.headers,
            parts.uri.authority().map(|a| a.as_str()),
            trusted,
        );
        Ok(Self {
            same_origin: is_same_origin(&parts.headers, host),
        })
    }
}

/// The host the client asked for: a trusted proxy's `X-Forwarded-Host`
/// (its first entry: the client's own), else `Host` (or HTTP/2's
/// `:authority`).
fn request_host<'h>(
    headers: &'h HeaderMap,
    authority: Option<&'h str>,
    trusted: bool,
) -> Option<&'h str> {
    let forwarded = trusted
        .then(|| headers.get("x-forwarded-host")?.to_str().ok())
        .flatten()
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    forwarded
        .or_else(|| headers.get(header::HOST)?.to_str().ok())
        .or(authority)
}

fn is_same_origin(headers: &HeaderMap, host: Option<&str>) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let (Ok(origin), Some(host)) = (origin.to_str(), host) else {
        return false;
    };
    // `null` (a sandboxed frame, a redirect across origins) has no scheme.
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default = match scheme {
        "http" => Some("80"),
        "https" => Some("443"),
        _ => None,
    };
    let (origin_host, origin_port) = split_port(authority);
    let (host_name, host_port) = split_port(host.trim());
    // A proxy that passes on `Host` without its port (nginx's `$host`)
    // leaves only the name to compare.
    origin_host.eq_ignore_ascii_case(host_name)
        && host_port.is_none_or(|port| Some(port) == origin_port.or(default))
}

/// A `host[:port]` as its name and its port, if it names one.
fn split_port(authority: &str) -> (&str, Option<&str>) {
    // An IPv6 literal keeps its colons inside brackets.
    let name_end = authority.rfind(']').map_or(0, |i| i + 1);
    match authority[name_end..].rfind(':') {
        Some(i) => {
            let at = name_end + i;
            (&authority[..at], Some(&authority[at + 1..]))
        }
        None => (authority, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(pairs: &[(&'static str, &str)], host: Option<&str>) -> bool {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        is_same_origin(&headers, host)
    }

    #[test]
    fn origins_are_compared_with_the_requested_host() {
        let host = Some("shop.example");
        assert!(same(&[], host));
        assert!(same(&[("origin", "https://shop.example")], host));
        assert!(same(
            &[("origin", "https://SHOP.example")],
            Some("shop.example:443")
        ));
        assert!(same(
            &[("origin", "http://127.0.0.1:8080")],
            Some("127.0.0.1:8080")
        ));
        assert!(same(&[("origin", "http://[::1]:8080")], Some("[::1]:8080")));
        // A Host without its port (nginx's `$host`): the name decides.
        assert!(same(
            &[("origin", "http://127.0.0.1:8080")],
            Some("127.0.0.1")
        ));
        assert!(!same(
            &[("origin", "http://127.0.0.1:9090")],
            Some("127.0.0.1:8080")
        ));
        assert!(!same(&[("origin", "https://evil.example")], host));
        assert!(!same(&[("origin", "https://a.shop.example")], host));
        assert!(!same(&[("origin", "null")], host));
        assert!(!same(&[("origin", "https://shop.example")], None));
    }

    #[test]
    fn sec_fetch_site_decides_when_sent() {
        let host = Some("shop.example");
        assert!(same(&[("sec-fetch-site", "same-origin")], host));
        assert!(same(&[("sec-fetch-site", "none")], host));
        assert!(!same(&[("sec-fetch-site", "same-site")], host));
        assert!(!same(&[("sec-fetch-site", "cross-site")], host));
        // Behind a proxy that rewrote Host, the browser's word still holds.
        let rewritten = [
            ("sec-fetch-site", "same-origin"),
            ("origin", "https://shop.example"),
        ];
        assert!(same(&rewritten, Some("127.0.0.1:8080")));
    }

    #[test]
    fn forwarded_host_counts_only_from_a_trusted_proxy() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "127.0.0.1:8080".parse().unwrap());
        headers.insert("x-forwarded-host", "shop.example, inner".parse().unwrap());
        assert_eq!(request_host(&headers, None, true), Some("shop.example"));
        assert_eq!(request_host(&headers, None, false), Some("127.0.0.1:8080"));
    }
}
