//! Liveness and readiness for orchestrators and load balancers.

use axum::extract::State;
use axum::http::StatusCode;

use super::state::AppState;

/// Liveness: the process answers
#[utoipa::path(get, path = "/healthz", tag = "service",
    responses((status = 200, description = "`ok`.", content_type = "text/plain", body = String)))]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the backend can serve (Redis reachable, for instance)
#[utoipa::path(get, path = "/readyz", tag = "service",
    responses(
        (status = 200, description = "Ready.", content_type = "text/plain", body = String),
        (status = 503, description = "Not ready, and why.", content_type = "text/plain", body = String),
    ))]
pub(crate) async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    match state.backend.ready().await {
        Ok(()) => (StatusCode::OK, format!("ready ({})", state.backend.kind())),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}")),
    }
}
