//! Every route of the service, listed once, with the middleware around it.

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, StatusCode};
use axum::routing::{get, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use super::state::AppState;
use super::{api, events, gate, health};

/// Request bodies are tiny JSON objects; anything bigger is refused (413).
const BODY_LIMIT: usize = 16 * 1024;
/// Ordinary requests answer in milliseconds; event streams are exempt.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub fn router(state: AppState) -> Router {
    let request_id = HeaderName::from_static("x-request-id");
    // Short requests get a timeout; the event stream lives as long as the
    // visitor waits, so it is routed outside that layer.
    let short = Router::new()
        .route("/api/rooms/{room}/join", post(api::join))
        .route("/api/rooms/{room}/status", get(api::status))
        .route("/api/rooms/{room}/leave", post(api::leave))
        .route("/api/rooms/{room}/release", post(api::release))
        .route("/gate/{room}", get(gate::gate))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ));
    let streams = Router::new().route("/api/rooms/{room}/events", get(events::events));
    short
        .merge(streams)
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(TraceLayer::new_for_http())
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}
