//! Being called back by Web Push: what a page or app needs to subscribe
//! (`GET /api/rooms/{room}/notify`, the VAPID public key), and handing the
//! subscription over with the ticket (`POST`) or taking it back
//! (`DELETE`).
//!
//! The handlers only check and carry: when a message is due, and what it
//! says, is the engine's to decide; the room's owner hands it to the
//! sender. A subscription's endpoint is a capability (whoever knows it can
//! message the browser), so it never appears in logs or answers.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::extract::Room;
use super::openapi::{ErrorBody, RoomParam};
use super::state::AppState;

/// What a page subscribes with.
#[derive(Serialize, ToSchema)]
#[schema(as = PushKey)]
pub struct KeyBody {
    /// The VAPID public key (RFC 8292): the uncompressed P-256 point,
    /// base64url without padding, to pass to `pushManager.subscribe` as
    /// `applicationServerKey`.
    public_key: String,
}

/// The answer when push is off on this service.
pub fn push_off() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "push_off",
        "This waiting room does not send push notifications.",
    )
}

/// Push key
///
/// The key a browser subscribes to Web Push with, for this room's
/// call-backs ("N ahead", "your turn").
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/notify",
    tag = "visitors",
    params(RoomParam),
    responses(
        (status = 200, description = "Push is on: the application server key.", body = KeyBody),
        (status = 404, description = "No such room (`unknown_room`), or push is off (`push_off`).", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub async fn key(
    State(state): State<AppState>,
    Room(room): Room,
) -> Result<Json<KeyBody>, ApiError> {
    let Some(push) = state.push.clone() else {
        return Err(push_off());
    };
    state.backend.epoch(&room).await?;
    Ok(Json(KeyBody {
        public_key: push.key.public_key().to_owned(),
    }))
}
