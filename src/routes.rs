//! Routes: one gate for a whole site. A room may claim parts of the site
//! by host and path prefix; `GET /gate` without a room picks the room
//! whose route is the most specific for what the visitor asked for, so a
//! proxy needs one gate for a site with several sections behind rooms of
//! their own.
//!
//! Specificity: a route naming the host exactly beats one naming a
//! `*.domain`, which beats one naming no host; among those, the longer
//! path prefix wins. Two rooms may not claim the same route: [`RouteTable::build`]
//! refuses that, naming both, at start and when an operator puts a room.

use serde::{Deserialize, Serialize};

/// The most routes a room may claim.
pub(crate) const MAX_ROUTES: usize = 64;

/// A part of the site a room claims.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// `shop.example.com`, or `*.example.com` for every subdomain; none
    /// for every host.
    #[serde(default)]
    #[schema(example = "shop.example.com")]
    pub host: Option<String>,
    /// The paths that start with it (`/presale/`); `/` for every path.
    #[schema(example = "/presale/")]
    pub path_prefix: String,
}

impl Route {
    /// How specific the route is: larger wins.
    fn rank(&self) -> (u8, usize) {
        let host = match self.host.as_deref() {
            None => 0,
            Some(h) if h.starts_with("*.") => 1,
            Some(_) => 2,
        };
        (host, self.path_prefix.len())
    }

    fn matches(&self, host: Option<&str>, path: &str) -> bool {
        let host_ok = match (self.host.as_deref(), host) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(pattern), Some(host)) => crate::rules::host_matches(pattern, host),
        };
        host_ok && path.starts_with(&self.path_prefix)
    }
}

/// Checks one room's routes, naming the first field that is wrong
/// (`routes[1].path_prefix`).
pub(crate) fn validate(routes: &[Route]) -> Result<(), (String, String)> {
    if routes.len() > MAX_ROUTES {
        return Err((
            "routes".into(),
            format!("at most {MAX_ROUTES} routes, not {}", routes.len()),
        ));
    }
    for (i, r) in routes.iter().enumerate() {
        if !r.path_prefix.starts_with('/') || r.path_prefix.len() > 1024 {
            return Err((
                format!("routes[{i}].path_prefix"),
                "a path starting with '/', at most 1024 characters".into(),
            ));
        }
        if let Some(h) = &r.host
            && !crate::rules::is_host_pattern(h)
        {
            return Err((
                format!("routes[{i}].host"),
                "a host name in lower case without a port (shop.example.com), or *. and a domain"
                    .into(),
            ));
        }
        if routes[..i].contains(r) {
            return Err((format!("routes[{i}]"), "given twice".into()));
        }
    }
    Ok(())
}

/// Two rooms claim the same route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conflict<R> {
    /// The room that claimed it first, and the one that claims it again,
    /// with the route's index in that room's list.
    pub first: R,
    pub second: R,
    pub index: usize,
}

/// Every room's routes, most specific first. `R` names a room (the
/// engine's room id): the table only hands it back.
#[derive(Debug)]
pub(crate) struct RouteTable<R> {
    routes: Vec<(Route, R)>,
}

impl<R> Default for RouteTable<R> {
    fn default() -> Self {
        Self { routes: Vec::new() }
    }
}

impl<R: Clone> RouteTable<R> {
    /// The table of these rooms' routes, or the first route two rooms
    /// claim.
    pub(crate) fn build<'a>(
        rooms: impl IntoIterator<Item = (&'a R, &'a [Route])>,
    ) -> Result<Self, Conflict<R>>
    where
        R: 'a,
    {
        let mut routes: Vec<(Route, R)> = Vec::new();
        for (room, claimed) in rooms {
            for (index, route) in claimed.iter().enumerate() {
                if let Some((_, first)) = routes.iter().find(|(r, _)| r == route) {
                    return Err(Conflict {
                        first: first.clone(),
                        second: room.clone(),
                        index,
                    });
                }
                routes.push((route.clone(), room.clone()));
            }
        }
        // Stable: among equal ranks (which cannot both match one request
        // unless they are the same route) the order does not matter.
        routes.sort_by_key(|(r, _)| std::cmp::Reverse(r.rank()));
        Ok(Self { routes })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The room whose route fits the request best.
    pub(crate) fn pick(&self, host: Option<&str>, path: &str) -> Option<&R> {
        self.routes
            .iter()
            .find(|(r, _)| r.matches(host, path))
            .map(|(_, room)| room)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RoomId;

    fn route(host: Option<&str>, path: &str) -> Route {
        Route {
            host: host.map(str::to_owned),
            path_prefix: path.to_owned(),
        }
    }

    fn id(s: &str) -> RoomId {
        RoomId::new(s).unwrap()
    }

    #[test]
    fn the_most_specific_route_wins() {
        let (site, presale, partner, shop) = (id("site"), id("presale"), id("partner"), id("shop"));
        let claims = [
            (&site, vec![route(None, "/")]),
            (&presale, vec![route(None, "/presale/")]),
            (&partner, vec![route(Some("*.partners.example.com"), "/")]),
            (&shop, vec![route(Some("shop.example.com"), "/")]),
        ];
        let table = RouteTable::build(claims.iter().map(|(r, v)| (*r, v.as_slice()))).unwrap();
        let pick = |host, path| table.pick(host, path).map(RoomId::as_str);
        assert_eq!(pick(None, "/presale/day-1"), Some("presale"));
        assert_eq!(pick(None, "/about"), Some("site"));
        assert_eq!(
            pick(Some("a.partners.example.com"), "/presale/x"),
            Some("partner")
        );
        assert_eq!(pick(Some("shop.example.com"), "/presale/x"), Some("shop"));
        assert_eq!(
            pick(Some("other.example.com"), "/presale/x"),
            Some("presale")
        );
        let only = RouteTable::build([(&presale, &[route(None, "/presale/")][..])]).unwrap();
        assert_eq!(only.pick(None, "/about"), None);
    }

    #[test]
    fn two_rooms_may_not_claim_one_route() {
        let (a, b) = (id("a"), id("b"));
        let routes = [route(None, "/x/"), route(Some("h.example.com"), "/")];
        let again = [route(Some("h.example.com"), "/")];
        let e = RouteTable::build([(&a, &routes[..]), (&b, &again[..])]).unwrap_err();
        assert_eq!(
            e,
            Conflict {
                first: a,
                second: b,
                index: 0
            }
        );
    }

    #[test]
    fn bad_routes_are_named() {
        assert_eq!(
            validate(&[route(None, "x")]).unwrap_err().0,
            "routes[0].path_prefix"
        );
        assert_eq!(
            validate(&[route(None, "/"), route(Some("A.com"), "/")])
                .unwrap_err()
                .0,
            "routes[1].host"
        );
        assert_eq!(
            validate(&[route(None, "/"), route(None, "/")])
                .unwrap_err()
                .0,
            "routes[1]"
        );
    }
}
