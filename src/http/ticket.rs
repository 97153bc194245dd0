//! Finding and checking a visitor's ticket: the room cookie for browsers,
//! `Authorization: Bearer` for apps; and building that cookie.

use axum::http::{HeaderMap, header};
use cookie::{Cookie, SameSite};

use super::error::ApiError;
use super::state::AppState;
use crate::backend::TicketRef;
use crate::engine::RoomId;
use crate::token::{MAX_TOKEN_LEN, TicketClaim};

/// A verified ticket of the room being asked about.
#[derive(Debug, Clone)]
pub struct VisitorTicket {
    pub token: String,
    pub ticket: TicketRef,
}

pub fn cookie_name(room: &RoomId) -> String {
    format!("narabu_{room}")
}

/// The raw token from the request: a Bearer header wins over the cookie.
fn raw_token(room: &RoomId, headers: &HeaderMap) -> Option<String> {
    if let Some(auth) = headers.get(header::AUTHORIZATION)
        && let Ok(auth) = auth.to_str()
        && let Some(token) = auth.strip_prefix("Bearer ")
    {
        return Some(token.trim().to_owned());
    }
    let name = cookie_name(room);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_owned())
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
