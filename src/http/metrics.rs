//! `GET /metrics`: Prometheus text, every name starting `narabu_`. The
//! rooms are read from the backend at scrape time (see `crate::metrics`),
//! so the counters here are the ones the admin API shows. With
//! `metrics_token` set, a scrape must carry it as a bearer token.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;

/// Prometheus metrics
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses(
        (status = 200, description = "Prometheus text; every name starts with `narabu_`.",
         content_type = "application/openmetrics-text", body = String),
        (status = 401, description = "A `metrics_token` is configured and this request does not carry it.", body = super::openapi::ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = super::openapi::ErrorBody),
    ))]
pub(crate) async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    super::auth::require_metrics_token(&state, &headers)?;
    let rooms = state.backend.list_rooms().await?;
    let backend = &state.backend;
    let text = state
        .metrics
        .render_with(rooms, |room| backend.callbacks_dropped(room));
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        )],
        text,
    )
        .into_response())
}
