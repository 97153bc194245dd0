//! Liveness and readiness for orchestrators and load balancers.

use axum::extract::State;
use axum::http::StatusCode;

use super::state::AppState;

/// `GET /healthz`: the process answers.
pub async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: the backend can serve (Redis reachable, for instance).
pub async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    match state.backend.ready().await {
        Ok(()) => (StatusCode::OK, format!("ready ({})", state.backend.kind())),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}")),
    }
}
