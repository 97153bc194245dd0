//! `GET /api/rooms/{room}/draw`: the opening draw's public record, for
//! anyone, without credentials.
//!
//! Before opening it holds the commitment (SHA-256 of the secret seed);
//! after, also the seed and the pre-queue's ticket ids in drawn order, so
//! that anyone can recompute the order (`narabu verify-draw URL`, or a few
//! lines of shell in docs/fair-access.md) and see that nobody chose it. A visitor
//! finds their own place from their ticket: a request carrying one (the
//! room cookie, or `Authorization: Bearer`) gets its ticket id and place,
//! and `?ticket=<id>` looks any ticket up.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ApiError;
use super::extract::MaybeVisitor;
use super::openapi::{ErrorBody, RoomParam};
use super::state::AppState;
use crate::engine::{DrawRecord, TicketId};

/// The draw as published: the body of this endpoint and what
/// `narabu verify-draw` reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Draw)]
pub struct DrawBody {
    pub room: String,
    /// SHA-256 of the seed, hex: published before the draw.
    pub commitment: String,
    /// The seed, hex, once the room has opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<String>,
    /// The pre-queue's ticket ids in drawn order, once the room has opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<u32>>)]
    pub order: Option<Vec<TicketId>>,
    /// The ticket asked about (`?ticket=`, or the caller's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u32>)]
    pub ticket: Option<TicketId>,
    /// Its place in the draw, from 1; `null` when it was not drawn (it
    /// joined after opening) or the draw has not happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<Option<u64>>,
}

impl DrawBody {
    pub(crate) fn record(&self) -> DrawRecord {
        DrawRecord {
            commitment: self.commitment.clone(),
            seed: self.seed.clone(),
            order: self.order.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct DrawQuery {
    ticket: Option<String>,
}

/// The opening draw's public record
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/draw",
    tag = "visitors",
    params(
        RoomParam,
        ("ticket" = Option<String>, Query, description = "A ticket id to look up (a whole number)."),
    ),
    security((), ("ticket" = [])),
    responses(
        (status = 200, description = "The draw.", body = DrawBody),
        (status = 400, description = "`ticket` is not a ticket id.", body = ErrorBody),
        (status = 404, description = "No such room, or it has no opening draw.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn draw(
    State(state): State<AppState>,
    MaybeVisitor { room, ticket }: MaybeVisitor,
    Query(query): Query<DrawQuery>,
) -> Result<Json<DrawBody>, ApiError> {
    let record = state.backend.draw(&room).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_draw",
            "This room has no opening draw (it opened at once, or queues first come, first served).",
        )
    })?;
    let asked = match query.ticket.as_deref() {
        Some(id) => Some(id.trim().parse::<TicketId>().map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_ticket_id",
                "ticket: expected a ticket id (a whole number), as the draw's order lists them",
            )
        })?),
        // A broken or foreign ticket just means "nobody in particular".
        None => ticket.and_then(|v| TicketId::try_from(v.ticket.id).ok()),
    };
    let place = asked.map(|id| {
        record
            .order
            .as_ref()
            .and_then(|order| order.iter().position(|&t| t == id))
            .map(|i| i as u64 + 1)
    });
    Ok(Json(DrawBody {
        room: room.to_string(),
        commitment: record.commitment,
        seed: record.seed,
        order: record.order,
        ticket: asked,
        place,
    }))
}
