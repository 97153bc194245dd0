//! The gate a reverse proxy asks on every request to the protected site
//! (nginx `auth_request`, Traefik ForwardAuth, Caddy `forward_auth`, Envoy
//! ext_authz over HTTP): 204 lets the request through and renews the pass;
//! 401 sends the visitor to the queue. Whatever the input, the answer is
//! one of those (or 404 for a room that does not exist), never a 5xx that
//! would turn into an error page at the proxy. The router marks every
//! answer `Cache-Control: no-store`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::extract::MaybeVisitor;
use super::openapi::{ErrorBody, RoomParam};
use super::passes;
use super::return_path::validate_return_path;
use super::state::AppState;
use super::ticket;
use crate::backend::BackendError;
use crate::config::OnBackendError;
use crate::engine::{RoomId, TicketState};
use crate::token::PassClaim;

/// What the query asks for: `redirect=1` answers a refusal with a 302 to
/// the queue page instead of 401; `pass=1` mints a signed pass for an
/// admitted visitor. Read by hand rather than with `Query`: any other
/// query, even a malformed one, is ignored instead of answered with 400,
/// and the common case (no query) costs nothing.
#[derive(Default)]
struct Asks {
    redirect: bool,
    pass: bool,
}

fn asks(request: &Request) -> Asks {
    let mut asks = Asks::default();
    if let Some(q) = request.uri().query() {
        for (k, v) in form_urlencoded::parse(q.as_bytes()) {
            match (&*k, &*v) {
                ("redirect", "1") => asks.redirect = true,
                ("pass", "1") => asks.pass = true,
                _ => {}
            }
        }
    }
    asks
}

/// The queue page URL for a refused request: the original URI (from the
/// proxy's `X-Original-URI` or `X-Forwarded-Uri`) becomes the return path
/// when it is a safe relative path.
pub fn queue_url(state: &AppState, room: &RoomId, headers: &HeaderMap) -> String {
    let original = ["x-original-uri", "x-forwarded-uri"]
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok());
    let base = format!("{}/queue/{room}", state.settings.public_url);
    match original.map(|uri| validate_return_path(Some(uri))) {
        Some(Ok(path)) if path != "/" || original == Some("/") => {
            let query: String = form_urlencoded::Serializer::new(String::new())
                .append_pair("return", &path)
                .finish();
            format!("{base}?{query}")
        }
        _ => base,
    }
}

fn refuse(state: &AppState, room: &RoomId, headers: &HeaderMap, redirect: bool) -> Response {
    let url = queue_url(state, room, headers);
    let value = HeaderValue::from_str(&url).unwrap_or_else(|_| HeaderValue::from_static("/"));
    if redirect {
        (StatusCode::FOUND, [(header::LOCATION, value)]).into_response()
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::HeaderName::from_static("x-narabu-queue"), value)],
        )
            .into_response()
    }
}

/// `GET /gate/{room}`
#[utoipa::path(
    get,
    path = "/gate/{room}",
    tag = "gate",
    params(
        RoomParam,
        ("redirect" = Option<String>, Query,
         description = "`1`: answer a visitor without a live pass with a 302 to the queue (ForwardAuth-style proxies)."),
        ("pass" = Option<String>, Query,
         description = "`1`: an admitted visitor's answer also sets a fresh signed pass (cookie `narabu_{room}_jwt`), for proxies that verify passes by themselves."),
        ("X-Original-URI" = Option<String>, Header,
         description = "The path the visitor asked for (nginx), for the queue's return path."),
        ("X-Forwarded-Uri" = Option<String>, Header,
         description = "The same, as Traefik and Caddy send it."),
    ),
    security((), ("ticket" = [])),
    responses(
        (status = 204, description = "An admitted visitor with a live pass: let the request through (the pass is renewed; with `?pass=1` a signed pass is set too).",
         headers(("X-Narabu-Pass-Expires" = String, description = "When the pass lapses without activity (RFC 3339)."),
                 ("Set-Cookie" = String, description = "With `?pass=1`: the signed pass (`narabu_{room}_jwt`); with `on_backend_error = \"open\"`: the fail-open pass."))),
        (status = 302, description = "`?redirect=1` and no live pass: to the queue.",
         headers(("Location" = String, description = "The queue page, with the return path."))),
        (status = 401, description = "No live pass: send the visitor to the queue.",
         headers(("X-Narabu-Queue" = String, description = "The queue page, with the return path."))),
        (status = 404, description = "No such room.", body = ErrorBody),
    ),
)]
pub async fn gate(
    State(state): State<AppState>,
    visitor: Result<MaybeVisitor, ApiError>,
    // The request rather than a `HeaderMap`, which would be a copy of
    // every header on each check.
    request: Request,
) -> Response {
    let headers = request.headers();
    let MaybeVisitor { room, ticket } = match visitor {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let Asks { redirect, pass } = asks(&request);
    let Some(visitor) = ticket else {
        // Without a pass the answer is the queue, unless there is no such
        // room to queue for: a misconfigured proxy should see that plainly.
        if let Err(BackendError::NoSuchRoom(_)) = state.backend.room(&room).await {
            return ApiError::from(BackendError::NoSuchRoom(room)).into_response();
        }
        return refuse(&state, &room, headers, redirect);
    };
    match state.backend.status(&room, visitor.ticket, true).await {
        Ok(status) if status.state == TicketState::Admitted && !status.closed => {
            let mut response = StatusCode::NO_CONTENT.into_response();
            // First among the cookies: nginx hands the first on.
            if pass && let Some(minted) = passes::mint(&state, &room, visitor.ticket, &status).await
            {
                passes::set_cookie(&state, &room, &minted, &mut response);
            }
            if let Some(expires) = status.pass_expires_at {
                if let Ok(v) = HeaderValue::from_str(&expires.to_string()) {
                    response
                        .headers_mut()
                        .insert(header::HeaderName::from_static("x-narabu-pass-expires"), v);
                }
                // Failing open needs something to trust while the backend
                // is away: a signed pass that runs out with the real one,
                // or sooner, a short while after this check (see
                // FAIL_OPEN_PASS_MS).
                if state.settings.on_backend_error == OnBackendError::Open {
                    let now = state.clock.now_ms();
                    let pass = PassClaim {
                        room: room.clone(),
                        epoch: visitor.ticket.epoch,
                        ticket: visitor.ticket.id,
                        expires_at_ms: expires
                            .ms()
                            .min(now.saturating_add(ticket::FAIL_OPEN_PASS_MS)),
                    };
                    let cookie = ticket::pass_cookie(&state, &pass, now);
                    if let Ok(v) = HeaderValue::from_str(&cookie.to_string()) {
                        response.headers_mut().append(header::SET_COOKIE, v);
                    }
                }
            }
            response
        }
        // A reset line sends the visitor to the queue page, which says so.
        Ok(_) | Err(BackendError::NoSuchTicket | BackendError::LineReset) => {
            refuse(&state, &room, headers, redirect)
        }
        Err(BackendError::NoSuchRoom(_)) => {
            ApiError::from(BackendError::NoSuchRoom(room)).into_response()
        }
        Err(e) => {
            // The state store is down. When the operator chose to fail
            // open, a visitor whose signed pass (set by a check the store
            // answered, at most FAIL_OPEN_PASS_MS ago) has not run out goes
            // through; everyone else, the queue.
            tracing::warn!(room = %room, error = %e, "gate check failed");
            let open = state.settings.on_backend_error == OnBackendError::Open
                && ticket::live_pass(&state, &room, visitor.ticket, headers, state.clock.now_ms())
                    .is_some();
            if open {
                StatusCode::NO_CONTENT.into_response()
            } else {
                refuse(&state, &room, headers, redirect)
            }
        }
    }
}
