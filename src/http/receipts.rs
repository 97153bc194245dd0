//! Receipts over HTTP: signing one for the join answer, and
//! `GET /api/rooms/{room}/receipt`, where the queue page's "your receipt"
//! link leads (the visitor's own, from their ticket). What a receipt says
//! and how it is checked is `crate::receipt`.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::ApiError;
use super::extract::Visitor;
use super::openapi::{ErrorBody, RoomParam};
use super::state::AppState;
use crate::backend::TicketRef;
use crate::engine::{RoomId, TicketStatus};
use crate::receipt::{ReceiptClaims, audience};

/// A receipt for `ticket` as it stands (`status`), in lane `lane` (its
/// name, in a room with lanes).
pub(crate) fn sign(
    state: &AppState,
    room: &RoomId,
    ticket: TicketRef,
    status: &TicketStatus,
    lane: Option<String>,
) -> String {
    let iss = match state.settings.public_url.as_str() {
        "" => "narabu",
        url => url,
    };
    let claims = ReceiptClaims {
        iss: iss.to_owned(),
        aud: audience(room.as_str()),
        room: room.as_str().to_owned(),
        epoch: ticket.epoch,
        ticket: ticket.id,
        number: status.number,
        lane,
        joined_at: status.joined_at.ms(),
        iat: state.clock.now_ms() / 1000,
    };
    state.passes.sign_receipt(&claims)
}

/// A visitor's receipt and what it says.
#[derive(Serialize, ToSchema)]
#[schema(as = Receipt)]
pub(crate) struct ReceiptBody {
    /// The receipt: a JWT (header `typ` `narabu-receipt+jwt`, `aud`
    /// `receipt:{room}`) signed with the keys at `/.well-known/jwks.json`.
    pub receipt: String,
    /// Its claims, as signed.
    #[schema(value_type = Object)]
    pub claims: ReceiptClaims,
    /// Where its keys are published.
    pub keys: &'static str,
}

/// The visitor's receipt
///
/// A signed receipt of the caller's ticket: room, epoch, ticket id, number,
/// lane and time of joining, and nothing that names the visitor. Keep it
/// to check the room's admission record against (`narabu verify-receipt`,
/// `narabu verify-record --receipt`).
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/receipt",
    tag = "visitors",
    params(RoomParam),
    security(("ticket" = [])),
    responses(
        (status = 200, description = "The receipt.", body = ReceiptBody),
        (status = 401, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset (the room started again).", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn receipt(
    State(state): State<AppState>,
    Visitor { room, ticket }: Visitor,
) -> Result<Json<ReceiptBody>, ApiError> {
    let (shown, status) = match ticket.shadow {
        Some(t) => (t.shown(), super::shadow::status(&state, &room, t).await?),
        None => (
            ticket.ticket,
            state.backend.status(&room, ticket.ticket, false).await?,
        ),
    };
    let lane = super::api::lane_name(&state, &room, status.lane).await;
    let token = sign(&state, &room, shown, &status, lane);
    let claims = crate::receipt::claims_unverified(&token).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("A receipt just signed does not read back: {e}"),
        )
    })?;
    Ok(Json(ReceiptBody {
        receipt: token,
        claims,
        keys: "/.well-known/jwks.json",
    }))
}
