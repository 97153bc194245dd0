//! Every route of the service, listed once, with the middleware around it.

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::routing::{MethodRouter, get, post};
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
pub(crate) fn router(state: AppState) -> gate::GateFirst {
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
/// OpenAPI document ([`openapi::ApiDoc`]), which a test checks against
/// [`paths`].
pub(crate) fn routes() -> Router<AppState> {
    routes_and_paths().0
}

/// The path of every route [`routes`] serves, as written there.
pub fn paths() -> Vec<&'static str> {
    routes_and_paths().1
}

/// A router of these routes, each path noted in `paths` as it is added:
/// the list of paths is the one the router was built from.
fn group(
    routes: Vec<(&'static str, MethodRouter<AppState>)>,
    paths: &mut Vec<&'static str>,
) -> Router<AppState> {
    routes
        .into_iter()
        .fold(Router::new(), |router, (path, method)| {
            paths.push(path);
            router.route(path, method)
        })
}

fn routes_and_paths() -> (Router<AppState>, Vec<&'static str>) {
    let mut paths = Vec::new();
    // Short requests get a timeout; the event stream lives as long as the
    // visitor waits, so it is routed outside that layer.
    let short = group(
        vec![
            // Join and status answers carry the ticket or the visitor's
            // place: one visitor's, never to be kept by a cache on the way.
            ("/api/rooms/{room}/join", post(api::join).layer(no_store())),
            // Checks are answered ahead of the router (`gate::GateFirst`);
            // the route answers a room name written with percent-escapes.
            ("/gate/{room}", get(gate::gate)),
            ("/gate", get(gate::site_gate)),
            (
                "/api/rooms/{room}/status",
                get(api::status).layer(no_store()),
            ),
            (
                "/api/rooms/{room}/receipt",
                get(receipts::receipt).layer(no_store()),
            ),
            ("/api/rooms/{room}/leave", post(api::leave)),
            ("/api/rooms/{room}/release", post(api::release)),
            ("/api/rooms/{room}/challenge", get(access::challenge)),
            ("/api/rooms/{room}/draw", get(draw::draw)),
            ("/api/rooms/{room}/record", get(record::record)),
            (
                "/api/rooms/{room}/notify",
                get(notify::key)
                    .post(notify::subscribe)
                    .delete(notify::unsubscribe)
                    .layer(no_store()),
            ),
            // The public keys of signed passes, for proxies, edges and apps.
            ("/.well-known/jwks.json", get(passes::jwks)),
            ("/.well-known/narabu-pass.pem", get(passes::pem)),
            ("/healthz", get(health::healthz)),
            ("/readyz", get(health::readyz)),
            ("/metrics", get(metrics::metrics)),
            ("/openapi.json", get(openapi::openapi_json)),
        ],
        &mut paths,
    )
    .layer(TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        REQUEST_TIMEOUT,
    ));
    let streams = group(
        vec![(
            "/api/rooms/{room}/events",
            get(events::events).layer(no_store()),
        )],
        &mut paths,
    );
    // The admin API: every handler takes the token (`extract::Admin`; 404
    // with none set).
    let admin_api = group(
        vec![
            ("/admin/rooms", get(admin::list)),
            (
                "/admin/rooms/{room}",
                get(admin::get_room)
                    .put(admin::put_room)
                    .patch(admin::patch_room)
                    .delete(admin::delete_room),
            ),
            ("/admin/rooms/{room}/revoke", post(admin::revoke)),
            ("/admin/rooms/{room}/purchases", post(admin::purchases)),
            ("/admin/rooms/{room}/report", get(admin::report::report)),
            ("/admin/rooms/{room}/reports", get(admin::report::reports)),
        ],
        &mut paths,
    )
    .layer(TimeoutLayer::with_status_code(
        StatusCode::REQUEST_TIMEOUT,
        REQUEST_TIMEOUT,
    ));
    let admin_streams = group(vec![("/admin/events", get(admin::events))], &mut paths);
    // Pages carry a strict Content-Security-Policy: their script and styles
    // come from /static, never inline, and they may not be framed.
    let pages = group(
        vec![
            ("/queue/{room}", get(visitor::queue)),
            ("/admin", get(admin::dashboard)),
        ],
        &mut paths,
    )
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
    let assets = group(vec![(assets::PATH, get(assets::serve))], &mut paths);
    let router = short
        .merge(streams)
        .merge(pages)
        .merge(admin_api)
        .merge(admin_streams)
        .merge(assets)
        .fallback(not_found);
    (router, paths)
}

/// Unknown paths get the API's JSON error, not an empty body.
async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "There is nothing at this address.",
    )
}
