//! The visitor and app JSON API: join, status, leave, and the origin's
//! release. Browsers and apps use the same endpoints; the ticket travels as
//! the room cookie or as `Authorization: Bearer`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::access::{self, Proof};
use super::error::ApiError;
use super::limits::{self, ClientIp};
use super::return_path::validate_return_path;
use super::room_id;
use super::state::AppState;
use super::ticket::{self, VisitorTicket};
use crate::backend::{BackendError, TicketRef};
use crate::engine::{Departure, Identity, RoomId, TicketState, TicketStatus};

/// A ticket's status as JSON: the body of `status`, of `join` (with the
/// token) and of every `position` event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
    pub status: &'static str,
    pub number: Option<u64>,
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub eta_seconds: Option<u64>,
    pub eta_low_seconds: Option<u64>,
    pub eta_high_seconds: Option<u64>,
    pub progress: f64,
    pub queue_length: u64,
    pub paused: bool,
    pub opens_at: Option<String>,
    pub pass_expires_at: Option<String>,
    pub updated_at: String,
}

/// The API's name for a ticket state; a closed room overrides it.
pub fn status_name(status: &TicketStatus) -> &'static str {
    if status.closed && status.state.is_live() {
        return "closed";
    }
    match status.state {
        TicketState::Waiting => "waiting",
        TicketState::Admitted => "admitted",
        TicketState::Released | TicketState::Left => "left",
        TicketState::Revoked | TicketState::Expired | TicketState::Abandoned => "expired",
    }
}

pub fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl StatusBody {
    pub fn new(status: &TicketStatus, now_ms: u64) -> Self {
        Self {
            ticket: None,
            status: status_name(status),
            number: status.number,
            position: status.position,
            ahead: status.ahead,
            eta_seconds: status.eta.map(|e| e.expected_secs),
            eta_low_seconds: status.eta.map(|e| e.low_secs),
            eta_high_seconds: status.eta.map(|e| e.high_secs),
            progress: (status.progress * 1000.0).round() / 1000.0,
            queue_length: status.queue_length,
            paused: status.paused,
            opens_at: status.opens_at.map(rfc3339),
            pass_expires_at: status.pass_expires_at.map(rfc3339),
            updated_at: rfc3339(now_ms),
        }
    }
}

pub fn now_ms() -> u64 {
    crate::engine::Clock::now_ms(&crate::engine::SystemClock)
}

/// The body a join may carry: a proof of work and an enqueue token, for
/// rooms that ask for them ([`Proof`]). Unknown keys are refused so that a
/// client relying on a future option finds out.
fn parse_join_body(body: &Bytes) -> Result<Proof, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Proof::default());
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("The body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_body(
            "The body must be a JSON object (or empty).",
        ));
    }
    serde_json::from_value::<Proof>(value).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("The join request was not understood: {e}"),
        )
    })
}

/// An `Idempotency-Key`, hashed with the room into the engine's 16-byte
/// identity.
fn idempotency_identity(room: &RoomId, headers: &HeaderMap) -> Result<Option<Identity>, ApiError> {
    let Some(key) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_idempotency_key",
                "Idempotency-Key must be 1 to 255 visible ASCII characters.",
            )
        })?;
    let digest = Sha256::new()
        .chain_update(room.as_str())
        .chain_update([0])
        .chain_update(key)
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    Ok(Some(Identity(u128::from_be_bytes(id))))
}

/// The outcome of joining, shared by the JSON API and the queue page.
pub struct Joined {
    pub ticket: TicketRef,
    pub token: String,
    pub status: TicketStatus,
    pub is_new: bool,
}

/// Join idempotently: a live ticket in the cookie (or Bearer) is kept;
/// otherwise the room's access rules are checked ([`access::clear`]), and
/// an enqueue token's account or an `Idempotency-Key` maps to one ticket;
/// otherwise a new ticket.
pub async fn join_room(
    state: &AppState,
    room: &RoomId,
    headers: &HeaderMap,
    client: ClientIp,
    proof: &Proof,
) -> Result<Joined, ApiError> {
    // A broken or foreign cookie must not lock a visitor out: start afresh.
    if let Ok(Some(VisitorTicket { token, ticket })) = ticket::find(state, room, headers) {
        match state.backend.status(room, ticket, true).await {
            Ok(status) if status.state.is_live() => {
                return Ok(Joined {
                    ticket,
                    token,
                    status,
                    is_new: false,
                });
            }
            Ok(_) | Err(BackendError::NoSuchTicket) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let policy = state
        .access
        .policy(state.backend.as_ref(), room, now_ms())
        .await?;
    let cleared = access::clear(state, room, &policy, proof)?;
    let identity = match cleared.identity {
        Some(account) => Some(account),
        None => idempotency_identity(room, headers)?,
    };
    // Only a join that may make a new ticket counts against the address.
    let limit = state
        .backend
        .watch_room(room)
        .await?
        .borrow()
        .join_limit_per_minute;
    state
        .joins
        .check(room, client, limit, now_ms())
        .map_err(|wait| limits::join_limited(limit, wait))?;
    access::spend(state, room, &policy, &cleared).await?;
    let outcome = state.backend.join(room, identity).await?;
    let token = ticket::sign(state, room, outcome.ticket);
    Ok(Joined {
        ticket: outcome.ticket,
        token,
        status: outcome.status,
        is_new: outcome.is_new,
    })
}

pub fn set_cookie(state: &AppState, room: &RoomId, token: String) -> (header::HeaderName, String) {
    (
        header::SET_COOKIE,
        ticket::cookie(state, room, token).to_string(),
    )
}

/// `POST /api/rooms/{room}/join`
pub async fn join(
    State(state): State<Arc<AppState>>,
    Path(room): Path<String>,
    client: ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let room = room_id(&room)?;
    let proof = parse_join_body(&body)?;
    let joined = join_room(&state, &room, &headers, client, &proof).await?;
    let mut body = StatusBody::new(&joined.status, now_ms());
    body.ticket = Some(joined.token.clone());
    let code = if joined.is_new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, [set_cookie(&state, &room, joined.token)], Json(body)).into_response())
}

/// `GET /api/rooms/{room}/status` — also counts as activity.
pub async fn status(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: HeaderMap,
) -> Result<Json<StatusBody>, ApiError> {
    let room = room_id(&room)?;
    let visitor = ticket::require(&state, &room, &headers)?;
    let status = state.backend.status(&room, visitor.ticket, true).await?;
    Ok(Json(StatusBody::new(&status, now_ms())))
}

/// `POST /api/rooms/{room}/leave` — leave the queue, or give the permit
/// back (handed to the next visitor at once). The queue page's form (a
/// browser without JavaScript) is sent back to the queue page, which then
/// says the visitor left.
pub async fn leave(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let room = room_id(&room)?;
    let visitor = ticket::require(&state, &room, &headers)?;
    state.backend.leave(&room, visitor.ticket).await?;
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if is_form {
        let back = form_urlencoded::parse(&body)
            .find(|(k, _)| k == "return")
            .and_then(|(_, v)| validate_return_path(Some(&v)).ok())
            .unwrap_or_else(|| "/".to_owned());
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("return", &back)
            .finish();
        return Ok(Redirect::to(&format!("/queue/{room}?{query}")).into_response());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseRequest {
    ticket: String,
}

/// `POST /api/rooms/{room}/release` — the origin's backend gives a
/// visitor's permit back when the purchase is done. Needs the admin token
/// (or the release key) as `Authorization: Bearer`.
pub async fn release(
    State(state): State<AppState>,
    Path(room): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    super::auth::require_release_key(&state, &headers)?;
    let room = room_id(&room)?;
    let request: ReleaseRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("Expected {{\"ticket\": \"<token>\"}}: {e}"),
        )
    })?;
    let claim = state.keys.verify(&request.ticket)?;
    if claim.room != room {
        return Err(ApiError::wrong_room());
    }
    let ticket = TicketRef {
        epoch: claim.epoch,
        id: claim.ticket,
    };
    match state.backend.release(&room, ticket).await? {
        Departure::GaveBack(_) => Ok(StatusCode::NO_CONTENT),
        Departure::LeftQueue | Departure::Nothing(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_admitted",
            "This ticket holds no permit (never admitted, or already released or expired).",
        )),
    }
}
