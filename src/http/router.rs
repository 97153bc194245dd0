//! Every route of the service, listed once, with the middleware around it.

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::routing::{get, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use super::state::AppState;
use super::{api, assets, events, gate, health, visitor};

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
    // Pages carry a strict Content-Security-Policy: their script and styles
    // come from /static, never inline, and they may not be framed.
    let pages = Router::new()
        .route("/queue/{room}", get(visitor::queue))
        .layer(SetResponseHeaderLayer::overriding(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
            ),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        ))
        .layer(SetResponseHeaderLayer::overriding(
            header::X_FRAME_OPTIONS,
            HeaderValue::from_static("DENY"),
        ));
    short
        .merge(streams)
        .merge(pages)
        .merge(assets::router())
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(TraceLayer::new_for_http())
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}
