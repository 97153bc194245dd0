//! Finding and checking a visitor's ticket: the room cookie for browsers,
//! `Authorization: Bearer` for apps; and building that cookie.

use axum::http::{HeaderMap, header};
use cookie::{Cookie, SameSite};

use super::error::ApiError;
use super::shadow::{NOWHERE, ShadowTicket};
use super::state::AppState;
use crate::backend::TicketRef;
use crate::engine::RoomId;
use crate::token::{Line, MAX_TOKEN_LEN, PassClaim, TicketClaim};

/// A verified ticket of the room being asked about.
#[derive(Debug, Clone)]
pub(crate) struct VisitorTicket {
    pub token: String,
    pub ticket: TicketRef,
    /// It came in the room cookie, which the browser sends by itself: a
    /// request that changes something must then prove it is the site's own
    /// ([`super::origin`]).
    pub from_cookie: bool,
    /// A ticket of the shadow line (`super::shadow`): `ticket` is then
    /// `shadow::NOWHERE`, and this is what the token says.
    pub shadow: Option<ShadowTicket>,
}

/// What the room's cookies start with. Served over HTTPS (`cookie_secure`)
/// they carry the `__Host-` prefix, which a browser accepts only from this
/// very host (Secure, `Path=/`, no `Domain`), so a sibling subdomain cannot
/// plant one.
pub(crate) fn cookie_prefix(state: &AppState) -> &'static str {
    if state.settings.cookie_secure {
        "__Host-narabu_"
    } else {
        "narabu_"
    }
}

pub(crate) fn cookie_name(state: &AppState, room: &RoomId) -> String {
    format!("{}{room}", cookie_prefix(state))
}

/// The cookie holding a fail-open pass for `room`.
pub(crate) fn pass_cookie_name(state: &AppState, room: &RoomId) -> String {
    format!("{}{room}_pass", cookie_prefix(state))
}

/// Every value of cookie `{prefix}{room}{suffix}`, in the order sent. Split
/// by hand, as the `cookie` crate's `split_parse` would (pairs split on
/// `;`, name and value trimmed, no percent-decoding), but without building
/// a `Cookie` for each pair or formatting the name: the gate does this on
/// every request to the protected site. All of them, because a sibling
/// subdomain can set a cookie of the same name that the browser may send
/// first: the caller takes the first that verifies.
fn cookie_values<'h>(
    headers: &'h HeaderMap,
    prefix: &'h str,
    room: &'h RoomId,
    suffix: &'h str,
) -> impl Iterator<Item = &'h str> + 'h {
    let is_ours = move |name: &str| {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix(room.as_str()))
            == Some(suffix)
    };
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.split_once('='))
        .filter(move |(name, _)| is_ours(name.trim()))
        .map(|(_, value)| value.trim())
}

/// How long a fail-open pass is honoured after the gate last renewed it
/// against the store. Short on purpose: while the store is away nobody can
/// be revoked, leave or be expired, so a pass that lived as long as the
/// real one (`pass_idle`) would keep a revoked or departed visitor in
/// beside the one who got their permit for the whole outage. Failing open
/// therefore rides out short blips; a longer outage ends in the queue.
pub const FAIL_OPEN_PASS_MS: u64 = 30_000;

/// The live pass for this very ticket, if the request carries one: signed
/// by us, for this room, ticket and incarnation, not yet expired, and
/// renewed within [`FAIL_OPEN_PASS_MS`] (a pass claiming a longer life is
/// not one this version issued).
pub(crate) fn live_pass(
    state: &AppState,
    room: &RoomId,
    ticket: TicketRef,
    headers: &HeaderMap,
    now_ms: u64,
) -> Option<PassClaim> {
    cookie_values(headers, cookie_prefix(state), room, "_pass").find_map(|token| {
        let pass = state.keys.verify_pass(token).ok()?;
        (&pass.room == room
            && pass.epoch == ticket.epoch
            && pass.ticket == ticket.id
            && pass.expires_at_ms > now_ms
            && pass.expires_at_ms <= now_ms.saturating_add(FAIL_OPEN_PASS_MS))
        .then_some(pass)
    })
}

/// A `Set-Cookie` that removes the fail-open pass: a visitor who left, or
/// whose permit was released, has no pass left to show while the store
/// is away.
pub(crate) fn clear_pass_cookie(state: &AppState, room: &RoomId) -> Cookie<'static> {
    let mut cookie = Cookie::build((pass_cookie_name(state, room), ""))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.settings.cookie_secure)
        .build();
    cookie.make_removal();
    cookie
}

/// The pass cookie the gate sets (for the proxy to hand on) when it fails
/// open: it lives as long as its claim, at most [`FAIL_OPEN_PASS_MS`],
/// renewed with every check the store answers.
pub(crate) fn pass_cookie(state: &AppState, pass: &PassClaim, now_ms: u64) -> Cookie<'static> {
    let secs = pass.expires_at_ms.saturating_sub(now_ms) / 1000;
    Cookie::build((
        pass_cookie_name(state, &pass.room),
        state.keys.sign_pass(pass),
    ))
    .path("/")
    .http_only(true)
    .same_site(SameSite::Lax)
    .secure(state.settings.cookie_secure)
    .max_age(cookie::time::Duration::seconds(
        i64::try_from(secs).unwrap_or(i64::MAX),
    ))
    .build()
}

/// The token of `Authorization: Bearer`; the scheme's name is
/// case-insensitive (RFC 9110), so `bearer` is as good.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// A token checked against this room: its ticket (and, for one of the
/// shadow line, what its token says), or why not.
fn check(
    state: &AppState,
    room: &RoomId,
    token: &str,
) -> Result<(TicketRef, Option<ShadowTicket>), ApiError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(crate::token::TokenError::Malformed.into());
    }
    let (
        TicketClaim {
            room: claimed,
            epoch,
            ticket,
        },
        line,
    ) = state.keys.verify_line(token)?;
    if &claimed != room {
        return Err(ApiError::wrong_room());
    }
    Ok(match line {
        Line::Real => (TicketRef { epoch, id: ticket }, None),
        Line::Shadow => (NOWHERE, Some(ShadowTicket { epoch, id: ticket })),
    })
}

/// The visitor's ticket for `room`, if the request carries one: a Bearer
/// header wins over the cookie; of several cookies of the room's name,
/// the first that verifies.
/// A ticket that is present but forged, damaged or for another room is an
/// error, not an absence: the caller decides whether to start over.
pub(crate) fn find(
    state: &AppState,
    room: &RoomId,
    headers: &HeaderMap,
) -> Result<Option<VisitorTicket>, ApiError> {
    if let Some(token) = bearer(headers) {
        let (ticket, shadow) = check(state, room, token)?;
        return Ok(Some(VisitorTicket {
            token: token.to_owned(),
            ticket,
            from_cookie: false,
            shadow,
        }));
    }
    let mut refused = None;
    for token in cookie_values(headers, cookie_prefix(state), room, "") {
        match check(state, room, token) {
            Ok((ticket, shadow)) => {
                return Ok(Some(VisitorTicket {
                    token: token.to_owned(),
                    ticket,
                    from_cookie: true,
                    shadow,
                }));
            }
            Err(e) => {
                refused.get_or_insert(e);
            }
        }
    }
    refused.map_or(Ok(None), Err)
}

pub(crate) fn sign(state: &AppState, room: &RoomId, ticket: TicketRef) -> String {
    state.keys.sign(&TicketClaim {
        room: room.clone(),
        epoch: ticket.epoch,
        ticket: ticket.id,
    })
}

/// The room cookie: HttpOnly (scripts never need it), SameSite=Lax (sent
/// when a visitor follows a link to the site, not on cross-site posts),
/// Secure when the site is served over HTTPS.
pub(crate) fn cookie(state: &AppState, room: &RoomId, token: String) -> Cookie<'static> {
    Cookie::build((cookie_name(state, room), token))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.settings.cookie_secure)
        .max_age(cookie::time::Duration::days(1))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_cookie_is_found_among_others() {
        let room = RoomId::new("sale").unwrap();
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, "a=b; narabu_sale_pass=p".parse().unwrap());
        headers.append(
            header::COOKIE,
            "junk; narabu_sales=x; narabu_sale = t=1 ; narabu_sale=u"
                .parse()
                .unwrap(),
        );
        let values = |room, suffix| {
            cookie_values(&headers, "narabu_", room, suffix)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(values(&room, ""), ["t=1", "u"]);
        assert_eq!(values(&room, "_pass"), ["p"]);
        let other = RoomId::new("sal").unwrap();
        assert!(values(&other, "").is_empty());
        assert_eq!(
            cookie_values(&headers, "__Host-narabu_", &room, "").count(),
            0
        );
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for auth in ["Bearer t", "bearer t", "BEARER  t "] {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, auth.parse().unwrap());
            assert_eq!(bearer(&headers), Some("t"), "{auth}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Basic dDp0".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
