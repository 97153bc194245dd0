//! Finding and checking a visitor's ticket: the room cookie for browsers,
//! `Authorization: Bearer` for apps; and building that cookie.

use axum::http::{HeaderMap, header};
use cookie::{Cookie, SameSite};

use super::error::ApiError;
use super::state::AppState;
use crate::backend::TicketRef;
use crate::engine::RoomId;
use crate::token::{MAX_TOKEN_LEN, PassClaim, TicketClaim};

/// A verified ticket of the room being asked about.
#[derive(Debug, Clone)]
pub struct VisitorTicket {
    pub token: String,
    pub ticket: TicketRef,
}

pub fn cookie_name(room: &RoomId) -> String {
    format!("narabu_{room}")
}

/// The cookie holding a fail-open pass for `room`.
pub fn pass_cookie_name(room: &RoomId) -> String {
    format!("narabu_{room}_pass")
}

/// The value of cookie `narabu_{room}{suffix}`. Split by hand, as the
/// `cookie` crate's `split_parse` would (pairs split on `;`, name and
/// value trimmed, no percent-decoding), but without building a `Cookie`
/// for each pair or formatting the name: the gate does this on every
/// request to the protected site.
fn cookie_value(headers: &HeaderMap, room: &RoomId, suffix: &str) -> Option<String> {
    let is_ours = |name: &str| {
        name.strip_prefix("narabu_")
            .and_then(|rest| rest.strip_prefix(room.as_str()))
            == Some(suffix)
    };
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| is_ours(name.trim()))
        .map(|(_, value)| value.trim().to_owned())
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
pub fn live_pass(
    state: &AppState,
    room: &RoomId,
    ticket: TicketRef,
    headers: &HeaderMap,
    now_ms: u64,
) -> Option<PassClaim> {
    let token = cookie_value(headers, room, "_pass")?;
    let pass = state.keys.verify_pass(&token).ok()?;
    (&pass.room == room
        && pass.epoch == ticket.epoch
        && pass.ticket == ticket.id
        && pass.expires_at_ms > now_ms
        && pass.expires_at_ms <= now_ms.saturating_add(FAIL_OPEN_PASS_MS))
    .then_some(pass)
}

/// A `Set-Cookie` that removes the fail-open pass: a visitor who left, or
/// whose permit was released, has no pass left to show while the store
/// is away.
pub fn clear_pass_cookie(state: &AppState, room: &RoomId) -> Cookie<'static> {
    let mut cookie = Cookie::build((pass_cookie_name(room), ""))
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
pub fn pass_cookie(state: &AppState, pass: &PassClaim, now_ms: u64) -> Cookie<'static> {
    let secs = pass.expires_at_ms.saturating_sub(now_ms) / 1000;
    Cookie::build((pass_cookie_name(&pass.room), state.keys.sign_pass(pass)))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.settings.cookie_secure)
        .max_age(cookie::time::Duration::seconds(
            i64::try_from(secs).unwrap_or(i64::MAX),
        ))
        .build()
}

/// The raw token from the request: a Bearer header wins over the cookie.
fn raw_token(room: &RoomId, headers: &HeaderMap) -> Option<String> {
    if let Some(auth) = headers.get(header::AUTHORIZATION)
        && let Ok(auth) = auth.to_str()
        && let Some(token) = auth.strip_prefix("Bearer ")
    {
        return Some(token.trim().to_owned());
    }
    cookie_value(headers, room, "")
}

/// The visitor's ticket for `room`, if the request carries one.
/// A ticket that is present but forged, damaged or for another room is an
/// error, not an absence: the caller decides whether to start over.
pub fn find(
    state: &AppState,
    room: &RoomId,
    headers: &HeaderMap,
) -> Result<Option<VisitorTicket>, ApiError> {
    let Some(token) = raw_token(room, headers) else {
        return Ok(None);
    };
    if token.len() > MAX_TOKEN_LEN {
        return Err(crate::token::TokenError::Malformed.into());
    }
    let TicketClaim {
        room: claimed,
        epoch,
        ticket,
    } = state.keys.verify(&token)?;
    if &claimed != room {
        return Err(ApiError::wrong_room());
    }
    Ok(Some(VisitorTicket {
        token,
        ticket: TicketRef { epoch, id: ticket },
    }))
}

/// Like [`find`], but a ticket is required.
pub fn require(
    state: &AppState,
    room: &RoomId,
    headers: &HeaderMap,
) -> Result<VisitorTicket, ApiError> {
    find(state, room, headers)?.ok_or_else(ApiError::no_ticket)
}

pub fn sign(state: &AppState, room: &RoomId, ticket: TicketRef) -> String {
    state.keys.sign(&TicketClaim {
        room: room.clone(),
        epoch: ticket.epoch,
        ticket: ticket.id,
    })
}

/// The room cookie: HttpOnly (scripts never need it), SameSite=Lax (sent
/// when a visitor follows a link to the site, not on cross-site posts),
/// Secure when the site is served over HTTPS.
pub fn cookie(state: &AppState, room: &RoomId, token: String) -> Cookie<'static> {
    Cookie::build((cookie_name(room), token))
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
            "junk; narabu_sales=x; narabu_sale = t=1 ".parse().unwrap(),
        );
        assert_eq!(cookie_value(&headers, &room, "").as_deref(), Some("t=1"));
        assert_eq!(cookie_value(&headers, &room, "_pass").as_deref(), Some("p"));
        let other = RoomId::new("sal").unwrap();
        assert_eq!(cookie_value(&headers, &other, ""), None);
    }
}
