//! One error type for the JSON API: `{"error": code, "message": sentence}`
//! with a fitting status. Internal details are logged, never sent.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::backend::BackendError;
use crate::engine::InvalidRoomId;
use crate::http::admin::{RevokeError, invalid_field};
use crate::http::return_path::ReturnPathError;
use crate::token::TokenError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Seconds for a `Retry-After` header (503, 429).
    pub retry_after: Option<u32>,
    /// More fields beside `error` and `message` (a refused join's fresh
    /// challenge, the reason a token was refused).
    pub details: Option<Box<serde_json::Map<String, serde_json::Value>>>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    message: &'a str,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    details: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            details: None,
        }
    }

    /// Adds a field to the body (`error` and `message` cannot be replaced).
    pub(crate) fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        if key != "error" && key != "message" {
            self.details
                .get_or_insert_default()
                .insert(key.to_owned(), value.into());
        }
        self
    }

    pub(crate) fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    pub(crate) fn no_ticket() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "no_ticket",
            "No ticket was sent: join the queue first (cookie or Authorization: Bearer).",
        )
    }

    pub(crate) fn wrong_room() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "wrong_room",
            "This ticket belongs to another room.",
        )
    }

    /// A join repeated an `Idempotency-Key` whose live ticket it does not
    /// carry.
    pub(crate) fn idempotency_key_used() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "idempotency_key_used",
            "This Idempotency-Key already made a ticket that is still live; \
             send that ticket (cookie or Bearer) to see it, or use a new key.",
        )
    }

    pub(crate) fn bad_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_body", message)
    }
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        let message = e.to_string();
        match e {
            BackendError::NoSuchRoom(_) => {
                Self::new(StatusCode::NOT_FOUND, "unknown_room", message)
            }
            BackendError::Closed(_) => Self::new(StatusCode::GONE, "room_closed", message),
            BackendError::NotWaiting(_) => Self::new(
                StatusCode::CONFLICT,
                "not_waiting",
                "This ticket is not waiting any more: there is no turn to be called for.",
            ),
            BackendError::SoldOut(_) => Self::new(StatusCode::GONE, "sold_out", message),
            BackendError::Full(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "room_full", message).retry_after(30)
            }
            BackendError::JoinLimited { limit, retry_after } => {
                let secs = u32::try_from(retry_after.as_secs_f64().ceil() as u64)
                    .unwrap_or(u32::MAX)
                    .max(1);
                Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_joins",
                    format!(
                        "Too many new tickets from this address: at most {limit} a minute in this room. Try again in {secs} s."
                    ),
                )
                .retry_after(secs)
            }
            // The join answers these with the room's own refusal (a fresh
            // challenge, the token's reason); elsewhere they are generic.
            BackendError::AccessDenied | BackendError::NonceSpent => {
                Self::new(StatusCode::FORBIDDEN, "access_denied", message)
            }
            BackendError::NoSuchTicket => Self::new(
                StatusCode::UNAUTHORIZED,
                "unknown_ticket",
                "This ticket is not known in this room (the room may have been reset): join again.",
            ),
            BackendError::LineReset => Self::new(
                StatusCode::GONE,
                "line_reset",
                "The line this ticket stood in was reset (the room started again): join again for a new ticket.",
            ),
            BackendError::NotReplicated { retry_after } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_replicated",
                "The waiting room could not confirm this change on its standby copies in time; please retry in a moment.",
            )
            .retry_after(
                u32::try_from(retry_after.as_secs_f64().ceil() as u64)
                    .unwrap_or(u32::MAX)
                    .max(1),
            ),
            BackendError::Unavailable(_) => {
                tracing::warn!(error = %message, "backend unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "The waiting room is briefly unavailable; please retry in a few seconds.",
                )
                .retry_after(5)
            }
        }
    }
}

impl From<RevokeError> for ApiError {
    fn from(e: RevokeError) -> Self {
        match e {
            RevokeError::NotATicket(why) => invalid_field("ticket", why),
            RevokeError::UnknownTicket => Self::new(
                StatusCode::NOT_FOUND,
                "unknown_ticket",
                "This ticket is not known in this room (the room may have been replaced).",
            ),
            RevokeError::Backend(e) => e.into(),
        }
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_ticket", e.to_string())
    }
}

impl From<InvalidRoomId> for ApiError {
    fn from(e: InvalidRoomId) -> Self {
        Self::new(StatusCode::NOT_FOUND, "unknown_room", e.to_string())
    }
}

impl From<ReturnPathError> for ApiError {
    fn from(e: ReturnPathError) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_return_path", e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(Body {
                error: self.code,
                message: &self.message,
                details: self.details.as_deref(),
            }),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
