//! `GET /admin/rooms/{room}/report`: the sale's report (`crate::report`)
//! as JSON, or as CSV with `?format=csv` (or `Accept: text/csv`), during
//! the sale and after it, for as long as the room's line lives.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::super::error::ApiError;
use super::super::extract::{Admin, Room};
use super::super::openapi::{ErrorBody, RoomParam};
use super::super::state::AppState;
use crate::report::{Refusals, Report};

/// The sale's report
///
/// Joins and admissions per minute, waits (overall and by place in line),
/// time on the site, abandonment and away returns, refused joins by reason
/// (as this instance counted them), the admission rate against the
/// configured one, and the fairness figures of the room's admission
/// record. JSON, or CSV with `?format=csv` or `Accept: text/csv`.
#[utoipa::path(
    get,
    path = "/admin/rooms/{room}/report",
    tag = "admin",
    params(
        RoomParam,
        ("format" = Option<String>, Query, description = "`json` (the default) or `csv`.",
         pattern = "^(json|csv)$"),
    ),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The report.",
         content((Report = "application/json"), (String = "text/csv"))),
        (status = 400, description = "An unknown `format`.", body = ErrorBody),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room, or the admin API is off.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub async fn report(
    State(state): State<AppState>,
    _: Admin,
    Room(room): Room,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let format = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "format")
        .map(|(_, v)| v.into_owned());
    let csv = match format.as_deref() {
        Some("csv") => true,
        Some("json") => false,
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_field",
                format!("format: expected json or csv, got {other:?}"),
            ));
        }
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/csv")),
    };
    let record = state.backend.admission_record(&room).await?;
    let settings = state.backend.room(&room).await?.settings;
    let refused = state
        .metrics
        .joins_refused(room.as_str())
        .into_iter()
        .map(|(reason, count)| Refusals { reason, count })
        .collect();
    let report = crate::report::report(&record, &settings, refused);
    if csv {
        return Ok((
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/csv; charset=utf-8"),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ],
            crate::report::csv(&report),
        )
            .into_response());
    }
    Ok(Json(report).into_response())
}
