//! What handlers take from a request, checked once, here: the room named
//! in the path (a name that cannot be a room is 404 for every route), the
//! visitor's ticket for that room, operators' credentials, and JSON bodies
//! (one way to refuse a bad one, naming the field). A handler's signature
//! then says who may call it and about what.

use axum::extract::{FromRequestParts, Path, Query};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::auth;
use super::error::ApiError;
use super::return_path::validate_return_path;
use super::state::AppState;
use super::ticket::{self, VisitorTicket};
use crate::engine::RoomId;

/// The room of the path (`/…/{room}…`).
#[derive(Debug, Clone)]
pub(crate) struct Room(pub RoomId);

impl FromRequestParts<AppState> for Room {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::from(crate::engine::InvalidRoomId))?;
        Ok(Self(RoomId::new(&raw)?))
    }
}

/// The visitor's ticket for the room of the path (`Authorization: Bearer`,
/// else the room cookie), verified. Without one: 401.
#[derive(Debug, Clone)]
pub(crate) struct Visitor {
    pub room: RoomId,
    pub ticket: VisitorTicket,
}

impl FromRequestParts<AppState> for Visitor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Room(room) = Room::from_request_parts(parts, state).await?;
        let ticket = ticket::find(state, &room, &parts.headers)?.ok_or_else(ApiError::no_ticket)?;
        Ok(Self { room, ticket })
    }
}

/// The visitor's ticket if the request carries a good one for the room of
/// the path: a missing, damaged or foreign ticket reads as none, so that a
/// broken cookie never locks a visitor out (a join starts afresh, the gate
/// sends them to the queue).
#[derive(Debug, Clone)]
pub(crate) struct MaybeVisitor {
    pub room: RoomId,
    pub ticket: Option<VisitorTicket>,
}

impl FromRequestParts<AppState> for MaybeVisitor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Room(room) = Room::from_request_parts(parts, state).await?;
        let ticket = ticket::find(state, &room, &parts.headers).ok().flatten();
        Ok(Self { room, ticket })
    }
}

/// `?return=P` on an API route: where to send the visitor afterwards, a
/// relative path on this site (anything else is 400, never followed).
#[derive(Debug, Clone)]
pub(crate) struct ReturnTo(pub Option<String>);

#[derive(Deserialize)]
struct ReturnQuery {
    #[serde(rename = "return")]
    return_path: Option<String>,
}

impl FromRequestParts<AppState> for ReturnTo {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Query(query) = Query::<ReturnQuery>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_body(format!("The query was not understood: {e}")))?;
        match query.return_path {
            None => Ok(Self(None)),
            Some(raw) => Ok(Self(Some(validate_return_path(Some(&raw))?))),
        }
    }
}

/// An operator: the admin token in `Authorization: Bearer`. With no token
/// configured the admin API does not exist (404).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        auth::require_admin(state, &parts.headers).map(|()| Self)
    }
}

/// The origin's backend releasing a permit: the admin token or the
/// release key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReleaseKey;

impl FromRequestParts<AppState> for ReleaseKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        auth::require_release_key(state, &parts.headers).map(|()| Self)
    }
}

/// A JSON body read into `T`: `400 bad_body` when it is not JSON at all,
/// `422 invalid_field` when it does not fit `T`, naming the field (its
/// path, `subscription.keys.p256dh`) first in the message and in `field`,
/// whether it is missing, unknown or of the wrong kind. Every handler
/// that takes a JSON body refuses a bad one this same way.
pub(crate) fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("The body is not JSON: {e}")))?;
    json_value(value)
}

/// [`json_body`] of a body already read as JSON.
pub(crate) fn json_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.inner().to_string();
        // A missing field is the fault of the object around it (where the
        // path points); serde names the field in the message.
        let named = inner
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let field = match (e.path().to_string(), named) {
            (root, Some(name)) if root == "." => name.to_owned(),
            (path, Some(name)) => format!("{path}.{name}"),
            (path, None) => path,
        };
        if field == "." {
            return ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_field",
                format!("The body was not understood: {inner}"),
            );
        }
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("{field}: {inner}"),
        )
        .with("field", field)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        inner: Inner,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        count: u32,
    }

    fn field(e: &ApiError) -> Option<&serde_json::Value> {
        e.details.as_ref().and_then(|d| d.get("field"))
    }

    #[test]
    fn a_bad_body_is_refused_naming_what_is_wrong() {
        let e = json_body::<Outer>(b"{not json").unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "bad_body"));

        let e = json_body::<Outer>(br#"{"name": "a", "inner": {"count": "many"}}"#).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_field")
        );
        assert_eq!(field(&e), Some(&serde_json::json!("inner.count")));
        assert!(
            e.message.starts_with("inner.count: invalid type"),
            "{}",
            e.message
        );

        let e = json_body::<Outer>(br#"{"inner": {"count": 1}}"#).unwrap_err();
        assert_eq!(e.code, "invalid_field");
        assert!(
            e.message.starts_with("name: missing field `name`"),
            "{}",
            e.message
        );
        assert_eq!(field(&e), Some(&serde_json::json!("name")));

        let e = json_body::<Outer>(br#"{"name": "a", "inner": {}}"#).unwrap_err();
        assert_eq!(field(&e), Some(&serde_json::json!("inner.count")));

        let e = json_body::<Outer>(br#"{"name": "a", "inner": {"count": 1}, "x": 0}"#).unwrap_err();
        assert!(
            e.message.starts_with("x: unknown field `x`"),
            "{}",
            e.message
        );

        let e = json_body::<Outer>(b"5").unwrap_err();
        assert!(
            e.message.starts_with("The body was not understood"),
            "{}",
            e.message
        );

        assert_eq!(
            json_body::<Outer>(br#"{"name": "a", "inner": {"count": 1}}"#)
                .unwrap()
                .inner
                .count,
            1
        );
    }
}
