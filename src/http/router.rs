//! Every route of the service, listed once, with the middleware around it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use super::error::ApiError;
use super::state::AppState;
use super::{admin, api, assets, events, gate, health, metrics, visitor};
use crate::metrics::{HttpLabels, Metrics};

/// Request bodies are tiny JSON objects; anything bigger is refused (413).
const BODY_LIMIT: usize = 16 * 1024;
/// Headers beyond this (a cookie jar stuffed by a bot, a header flood) are
/// refused with 431 before any handler parses them. A visitor's own
/// headers, with one ticket cookie per room, are a few hundred bytes.
const HEADER_LIMIT: usize = 16 * 1024;
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
        .route("/metrics", get(metrics::metrics))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ));
    let streams = Router::new().route("/api/rooms/{room}/events", get(events::events));
    // The admin API: every route behind the token (404 with none set).
    let admin_api = Router::new()
        .route("/admin/rooms", get(admin::list))
        .route(
            "/admin/rooms/{room}",
            get(admin::get_room)
                .put(admin::put_room)
                .patch(admin::patch_room)
                .delete(admin::delete_room),
        )
        .route("/admin/rooms/{room}/revoke", post(admin::revoke))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .route("/admin/events", get(admin::events))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            admin::require_admin_layer,
        ));
    // Pages carry a strict Content-Security-Policy: their script and styles
    // come from /static, never inline, and they may not be framed.
    let pages = Router::new()
        .route("/queue/{room}", get(visitor::queue))
        .route("/admin", get(admin::dashboard))
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
        .merge(admin_api)
        .merge(assets::router())
        .layer(SetResponseHeaderLayer::if_not_present(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ))
        .fallback(not_found)
        .layer(RequestBodyLimitLayer::new(BODY_LIMIT))
        .layer(middleware::from_fn(limit_header_size))
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            count_request,
        ))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}

async fn limit_header_size(request: Request, next: Next) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if size > HEADER_LIMIT {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            format!("The request's headers are larger than {HEADER_LIMIT} bytes."),
        )
        .into_response();
    }
    next.run(request).await
}

/// Unknown paths get the API's JSON error, not an empty body.
async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "There is nothing at this address.",
    )
}

/// Each request's log span carries its request id (set by the outer
/// layer, or the caller's own `X-Request-Id`), so every line logged while
/// serving it can be found by the id the client saw. The query is left out:
/// it may carry a return path, never needed to trace a request.
fn request_span(request: &Request) -> tracing::Span {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        request_id = %id,
    )
}

/// Counts every request and its time to the response head, labelled by
/// the route that matched (never the raw path) and the status.
async fn count_request(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    // `/gate/:room` rather than axum's `/gate/{room}`: braces are legal in
    // a label value, but some Prometheus text parsers drop such lines.
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .replace('{', ":")
        .replace('}', "");
    let method = match *request.method() {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        // Arbitrary methods would grow the label set without bound.
        _ => "other",
    };
    let start = Instant::now();
    let response = next.run(request).await;
    metrics.observe_http(
        HttpLabels {
            method: method.to_owned(),
            route,
            status: response.status().as_u16(),
        },
        start.elapsed(),
    );
    response
}
