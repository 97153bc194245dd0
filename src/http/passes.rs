//! Signed passes over HTTP: the published keys (`/.well-known/jwks.json`
//! for JWT libraries and edges, `/.well-known/narabu-pass.pem` for HAProxy
//! and njs, which take a PEM public key), minting a pass for an admitted
//! ticket, and the cookie that carries it.
//!
//! The gate mints a pass only when asked (`?pass=1`, what the verifying
//! proxy configurations send when a visitor's pass is missing or has run
//! out): signing costs far more than the rest of a gate check, and a proxy
//! that asks the gate on every request has no use for one.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use cookie::{Cookie, SameSite};

use super::state::AppState;
use super::ticket::cookie_prefix;
use crate::backend::TicketRef;
use crate::engine::{RoomId, TicketState, TicketStatus};

/// Published keys change only on a restart with new keys; a cache may keep
/// them a few minutes (a pass signed with a key a verifier does not know
/// yet only costs one gate check).
const KEYS_CACHE: &str = "public, max-age=300";

/// `GET /.well-known/jwks.json`
#[utoipa::path(
    get,
    path = "/.well-known/jwks.json",
    tag = "gate",
    responses(
        (status = 200, description = "The public keys of signed passes (RFC 7517): the current key, and the previous one while rotating. A pass names its key in the header's `kid`.",
         content_type = "application/json", body = Object),
    ),
)]
pub(crate) async fn jwks(State(state): State<AppState>) -> Response {
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static(KEYS_CACHE)),
        ],
        state.passes.jwks().to_owned(),
    )
        .into_response()
}

/// `GET /.well-known/narabu-pass.pem`
#[utoipa::path(
    get,
    path = "/.well-known/narabu-pass.pem",
    tag = "gate",
    params(("previous" = Option<String>, Query,
            description = "`1`: the previous key instead (404 when not rotating).")),
    responses(
        (status = 200, description = "The current public key of signed passes, as SPKI PEM (`BEGIN PUBLIC KEY`): what HAProxy's `jwt_verify` and WebCrypto's `importKey(\"spki\")` take.",
         content_type = "application/x-pem-file", body = String),
        (status = 404, description = "`?previous=1` and no previous key."),
    ),
)]
pub(crate) async fn pem(
    State(state): State<AppState>,
    uri: axum::http::Uri,
) -> Result<Response, super::error::ApiError> {
    let previous = uri.query().is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "previous" && v == "1")
    });
    let pem = if previous {
        state.passes.previous_public_pem().ok_or_else(|| {
            super::error::ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                "There is no previous pass key (no rotation under way).",
            )
        })?
    } else {
        state.passes.public_pem()
    };
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-pem-file"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static(KEYS_CACHE)),
        ],
        pem.to_owned(),
    )
        .into_response())
}

/// The cookie holding the signed pass for `room`.
pub(crate) fn cookie_name(state: &AppState, room: &RoomId) -> String {
    format!("{}{room}_jwt", cookie_prefix(state))
}

/// A minted pass and its lifetime in whole seconds, for the cookie.
pub(crate) struct Minted {
    pub token: String,
    pub max_age_secs: u64,
}

/// A signed pass for an admitted ticket: valid for the room's
/// `pass_lifetime`, or less if the permit lapses sooner without activity.
/// `None` for a ticket not admitted (or a room that cannot be read now:
/// the visitor is then simply asked again next time).
pub(crate) async fn mint(
    state: &AppState,
    room: &RoomId,
    ticket: TicketRef,
    status: &TicketStatus,
) -> Option<Minted> {
    if status.state != TicketState::Admitted || status.closed {
        return None;
    }
    let lapses_ms = status.pass_expires_at?.ms();
    let lifetime = state.backend.room(room).await.ok()?.settings.pass_lifetime;
    let now_ms = state.clock.now_ms();
    let lifetime_ms = u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX);
    let exp_ms = now_ms.saturating_add(lifetime_ms).min(lapses_ms);
    let (now, exp) = (now_ms / 1000, exp_ms / 1000);
    let iss = match state.settings.public_url.as_str() {
        "" => "narabu",
        url => url,
    };
    // A pass with at least half its life left is handed out again rather
    // than signed anew.
    let fresh_for = lifetime.as_secs() / 2;
    let (token, _, exp) =
        state
            .passes
            .sign_or_reuse(iss, room, &ticket.id.to_string(), now, exp, fresh_for);
    Some(Minted {
        token,
        max_age_secs: exp.saturating_sub(now),
    })
}

/// The pass's cookie: HttpOnly and SameSite=Lax like the room cookie; it
/// goes away with the pass.
pub(crate) fn cookie(state: &AppState, room: &RoomId, minted: &Minted) -> Cookie<'static> {
    Cookie::build((cookie_name(state, room), minted.token.clone()))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.settings.cookie_secure)
        .max_age(cookie::time::Duration::seconds(
            i64::try_from(minted.max_age_secs).unwrap_or(i64::MAX),
        ))
        .build()
}

/// A `Set-Cookie` that removes the signed pass (a visitor who left).
pub(crate) fn clear_cookie(state: &AppState, room: &RoomId) -> Cookie<'static> {
    let mut cookie = Cookie::build((cookie_name(state, room), ""))
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(state.settings.cookie_secure)
        .build();
    cookie.make_removal();
    cookie
}

/// Appends the pass's cookie to a response.
pub(crate) fn set_cookie(
    state: &AppState,
    room: &RoomId,
    minted: &Minted,
    response: &mut Response,
) {
    if let Ok(v) = HeaderValue::from_str(&cookie(state, room, minted).to_string()) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
}
