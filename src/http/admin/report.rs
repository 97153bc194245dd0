//! `GET /admin/rooms/{room}/report`: the sale's report (`crate::report`)
//! as JSON, or as CSV with `?format=csv` (or `Accept: text/csv`), during
//! the sale and after it. When an operator replaces a room's line, the
//! line's report is kept (`report_keep`, thirty days by default) and
//! asked for by its epoch; `GET /admin/rooms/{room}/reports` lists them.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::super::error::ApiError;
use super::super::extract::{Admin, Room};
use super::super::openapi::{ErrorBody, RoomParam};
use super::super::state::AppState;
use crate::backend::KeptReport;
use crate::engine::RoomId;
use crate::report::{Refusals, Report};

/// The sale's report
///
/// Joins and admissions per minute, waits (overall and by place in line),
/// time on the site, abandonment and away returns, refused joins by reason
/// (as this instance counted them), the admission rate against the
/// configured one, and the fairness figures of the room's admission
/// record. JSON, or CSV with `?format=csv` or `Accept: text/csv`. The
/// report of the current line, or with `?epoch=` that of a line an
/// operator replaced, while it is kept.
#[utoipa::path(
    get,
    path = "/admin/rooms/{room}/report",
    tag = "admin",
    params(
        RoomParam,
        ("format" = Option<String>, Query, description = "`json` (the default) or `csv`.",
         pattern = "^(json|csv)$"),
        ("epoch" = Option<u64>, Query, description = "The line whose report to give (its epoch): the current line by default, or a replaced one while its report is kept (`GET /admin/rooms/{room}/reports` lists them)."),
    ),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The report.",
         content((Report = "application/json"), (String = "text/csv"))),
        (status = 400, description = "An unknown `format`, or an `epoch` that is not a number.", body = ErrorBody),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room, the admin API is off, or no report is kept of that line (`no_report`).", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn report(
    State(state): State<AppState>,
    _: Admin,
    Room(room): Room,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mut format = None;
    let mut epoch = None;
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*k {
            "format" => format = Some(v.into_owned()),
            "epoch" => {
                epoch = Some(v.parse::<u64>().map_err(|_| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "invalid_field",
                        format!("epoch: expected a line's epoch (a number), got {v:?}"),
                    )
                })?);
            }
            _ => {}
        }
    }
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
    let current = current_report(&state, &room).await?;
    let report = match epoch {
        Some(e) if e != current.epoch => state
            .backend
            .kept_reports(&room)
            .await?
            .into_iter()
            .find(|k| k.epoch == e)
            .map(|k| k.report)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "no_report",
                    format!("No report of line {e} of this room is kept."),
                )
            })?,
        _ => current,
    };
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

/// A kept report, as listed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct KeptReportInfo {
    /// The line's epoch: ask `GET /admin/rooms/{room}/report?epoch=` for it.
    pub epoch: u64,
    /// When an operator replaced the line (Unix ms).
    pub ended_at: u64,
    /// When its report goes (Unix ms).
    pub expires_at: u64,
    /// Where to fetch it: the epoch is a 64-bit number, which a JSON
    /// reader that keeps numbers as doubles (JavaScript, jq) rounds.
    #[schema(example = "/admin/rooms/sale/report?epoch=17513108947974171723")]
    pub url: String,
}

/// The reports kept of replaced lines
///
/// The room's earlier lines whose reports are still kept, newest first.
#[utoipa::path(
    get,
    path = "/admin/rooms/{room}/reports",
    tag = "admin",
    params(RoomParam),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The kept reports, newest line first.", body = Vec<KeptReportInfo>),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room, or the admin API is off.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn reports(
    State(state): State<AppState>,
    _: Admin,
    Room(room): Room,
) -> Result<Json<Vec<KeptReportInfo>>, ApiError> {
    let kept = state.backend.kept_reports(&room).await?;
    Ok(Json(
        kept.into_iter()
            .map(|k| KeptReportInfo {
                url: format!("/admin/rooms/{room}/report?epoch={}", k.epoch),
                epoch: k.epoch,
                ended_at: k.ended_at,
                expires_at: k.expires_at,
            })
            .collect(),
    ))
}

/// The report of the room's current line.
async fn current_report(state: &AppState, room: &RoomId) -> Result<Report, ApiError> {
    let record = state.backend.admission_record(room).await?;
    let settings = state.backend.room(room).await?.settings;
    let refused = state
        .metrics
        .joins_refused(room.as_str())
        .into_iter()
        .map(|(reason, count)| Refusals { reason, count })
        .collect();
    Ok(crate::report::report(&record, &settings, refused))
}

/// Keep the report of the room's current line, which an operator is about
/// to replace, for `report_keep` (not at all when that is zero, nor a line
/// nobody joined).
pub(super) async fn keep_current(state: &AppState, room: &RoomId) -> Result<(), ApiError> {
    let keep = state.settings.report_keep;
    if keep.is_zero() {
        return Ok(());
    }
    let report = current_report(state, room).await?;
    // A line nobody joined has nothing to report.
    if report.joins == 0 {
        return Ok(());
    }
    let now = state.clock.now_ms();
    let kept = KeptReport {
        epoch: report.epoch,
        ended_at: now,
        expires_at: now.saturating_add(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX)),
        report,
    };
    state.backend.keep_report(room, kept).await?;
    Ok(())
}
