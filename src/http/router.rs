//! Every route of the service, listed once, with the middleware around it.

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::routing::{get, post};
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;

use super::edge::EdgeLayer;
use super::error::ApiError;
use super::state::AppState;
use super::{
    access, admin, api, assets, draw, events, gate, health, metrics, notify, openapi, passes,
    receipts, record, visitor,
};

/// Request bodies are tiny JSON objects; anything bigger is refused (413).
const BODY_LIMIT: usize = 16 * 1024;
/// Ordinary requests answer in milliseconds; event streams are exempt.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The service: gate checks answered first ([`gate::GateFirst`]), then
/// [`routes`] with the layers every other request passes through.
pub fn router(state: AppState) -> gate::GateFirst {
    let app = routes()
        // The request id, its log span, the metrics, the header limit and
        // nosniff; then the body limit. One `layer` call, so one boxed
        // service per route rather than one per layer.
        .layer(
            ServiceBuilder::new()
                .layer(EdgeLayer::new(state.metrics.clone()))
                .layer(RequestBodyLimitLayer::new(BODY_LIMIT)),
        )
        .with_state(state.clone());
    gate::GateFirst::new(state, app)
}

fn no_store() -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::overriding(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))
}

/// Every route, each with its own layers. Every one is described in the
/// OpenAPI document ([`openapi::ApiDoc`]), which a test checks by walking
/// this router.
pub fn routes() -> Router<AppState> {
    // Short requests get a timeout; the event stream lives as long as the
    // visitor waits, so it is routed outside that layer.
    let short = Router::new()
        // Join and status answers carry the ticket or the visitor's place:
        // one visitor's, never to be kept by a cache on the way.
        .route("/api/rooms/{room}/join", post(api::join).layer(no_store()))
        // Checks are answered ahead of the router (`gate::GateFirst`);
        // the route answers a room name written with percent-escapes.
        .route("/gate/{room}", get(gate::gate))
        .route("/gate", get(gate::site_gate))
        .route(
            "/api/rooms/{room}/status",
            get(api::status).layer(no_store()),
        )
        .route(
            "/api/rooms/{room}/receipt",
            get(receipts::receipt).layer(no_store()),
        )
        .route("/api/rooms/{room}/leave", post(api::leave))
        .route("/api/rooms/{room}/release", post(api::release))
        .route("/api/rooms/{room}/challenge", get(access::challenge))
        .route("/api/rooms/{room}/draw", get(draw::draw))
        .route("/api/rooms/{room}/record", get(record::record))
        .route(
            "/api/rooms/{room}/notify",
            get(notify::key)
                .post(notify::subscribe)
                .delete(notify::unsubscribe)
                .layer(no_store()),
        )
        // The public keys of signed passes, for proxies, edges and apps.
        .route("/.well-known/jwks.json", get(passes::jwks))
        .route("/.well-known/narabu-pass.pem", get(passes::pem))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(metrics::metrics))
        .route("/openapi.json", get(openapi::openapi_json))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ));
    let streams = Router::new().route(
        "/api/rooms/{room}/events",
        get(events::events).layer(no_store()),
    );
    // The admin API: every handler takes the token (`extract::Admin`; 404
    // with none set).
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
        .route("/admin/rooms/{room}/purchases", post(admin::purchases))
        .route("/admin/rooms/{room}/report", get(admin::report::report))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .route("/admin/events", get(admin::events));
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
        .fallback(not_found)
}

/// Unknown paths get the API's JSON error, not an empty body.
async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "There is nothing at this address.",
    )
}
