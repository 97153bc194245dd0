//! The gate a reverse proxy asks on every request to the protected site
//! (nginx `auth_request`, Traefik ForwardAuth, Caddy `forward_auth`, Envoy
//! ext_authz over HTTP): 204 lets the request through and renews the pass;
//! 401 sends the visitor to the queue. Whatever the input, the answer is
//! one of those (or 404 for a room that does not exist, 403 for a request
//! a room's traffic rule blocks), never a 5xx that would turn into an
//! error page at the proxy. Every answer is `Cache-Control: no-store`: it
//! is one visitor's.
//!
//! Before the ticket is looked at, the room's traffic rules
//! (`crate::rules`, compiled in the rule book) may let the request
//! through without one or refuse it; a room without rules costs nothing
//! here. `GET /gate`, without a room, is the gate for a whole site: the
//! rooms' routes (`crate::routes`) pick the room from the host and path
//! the proxy sends.
//!
//! A check is the one request a proxy may make for every page view, so it
//! is served ahead of the router ([`GateFirst`]): none of the layers every
//! other request passes through (request id, log span, the route's
//! timeout and header layers, the extractors) is worth its cost here. What
//! a check keeps of them it does itself, cheaply: the header limit, its
//! count and latency in the metrics (through handles resolved once), the
//! caller's own request id echoed, and a bound on the wait for the backend.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use tower::Service;
use tower::util::{Oneshot, ServiceExt};

use super::edge::HEADER_LIMIT;
use super::error::ApiError;
use super::extract::Room;
use super::limits::ClientIp;
use super::openapi::{ErrorBody, RoomParam};
use super::passes;
use super::return_path::validate_return_path;
use super::state::AppState;
use super::ticket;
use crate::backend::BackendError;
use crate::config::OnBackendError;
use crate::engine::{RoomId, TicketState, TicketStatus};
use crate::metrics::HttpLabels;
use crate::rules::{Action, RequestView};
use crate::token::PassClaim;

/// How long a check waits for the backend before answering as if it were
/// down (`on_backend_error`): a proxy's own timeout would otherwise turn
/// the wait into an error page. Longer than any healthy answer, shorter
/// than the proxies' timeouts (narabu.lua gives the gate 5 s).
const BACKEND_WAIT: Duration = Duration::from_secs(4);

static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static QUEUE: HeaderName = HeaderName::from_static("x-narabu-queue");
static PASS_EXPIRES: HeaderName = HeaderName::from_static("x-narabu-pass-expires");

/// What the query asks for: `redirect=1` answers a refusal with a 302 to
/// the queue page instead of 401; `pass=1` mints a signed pass for an
/// admitted visitor. Read by hand rather than with `Query`: any other
/// query, even a malformed one, is ignored instead of answered with 400,
/// and the common case (no query) costs nothing.
#[derive(Default)]
struct Asks {
    redirect: bool,
    pass: bool,
    /// `unrouted=pass`, at `GET /gate`: a request no room's route covers
    /// goes through (else it is refused).
    unrouted_pass: bool,
}

fn asks(request: &Parts) -> Asks {
    let mut asks = Asks::default();
    if let Some(q) = request.uri.query() {
        for (k, v) in form_urlencoded::parse(q.as_bytes()) {
            match (&*k, &*v) {
                ("redirect", "1") => asks.redirect = true,
                ("pass", "1") => asks.pass = true,
                ("unrouted", "pass") => asks.unrouted_pass = true,
                _ => {}
            }
        }
    }
    asks
}

/// The queue page URL for a refused request: the original URI (from the
/// proxy's `X-Original-URI` or `X-Forwarded-Uri`) becomes the return path
/// when it is a safe relative path.
pub(crate) fn queue_url(state: &AppState, room: &RoomId, headers: &HeaderMap) -> String {
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
    let mut response = Response::default();
    if redirect {
        *response.status_mut() = StatusCode::FOUND;
        response.headers_mut().insert(header::LOCATION, value);
    } else {
        *response.status_mut() = StatusCode::UNAUTHORIZED;
        response.headers_mut().insert(QUEUE.clone(), value);
    }
    response
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
        ("X-Forwarded-Method" = Option<String>, Header,
         description = "The visitor's method, for the room's traffic rules."),
        ("X-Forwarded-Host" = Option<String>, Header,
         description = "The host the visitor asked for, for the room's traffic rules (else `Host`)."),
    ),
    security(("ticket" = []), ()),
    responses(
        (status = 204, description = "An admitted visitor with a live pass: let the request through (the pass is renewed; with `?pass=1` a signed pass is set too). Or a request a `bypass` traffic rule lets through without a ticket.",
         headers(("X-Narabu-Pass-Expires" = String, description = "When the pass lapses without activity (RFC 3339)."),
                 ("Set-Cookie" = String, description = "With `?pass=1`: the signed pass (`narabu_{room}_jwt`); with `on_backend_error = \"open\"`: the fail-open pass."))),
        (status = 302, description = "`?redirect=1` and no live pass: to the queue.",
         headers(("Location" = String, description = "The queue page, with the return path."))),
        (status = 401, description = "No live pass, or a `shadow` traffic rule matches (its visitors never get through): send the visitor to the queue.",
         headers(("X-Narabu-Queue" = String, description = "The queue page, with the return path."))),
        (status = 403, description = "A `block` traffic rule of the room refuses the request.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
    ),
)]
pub(crate) async fn gate(
    State(state): State<AppState>,
    room: Result<Room, ApiError>,
    // The request rather than a `HeaderMap`, which would be a copy of
    // every header on each check.
    request: Request,
) -> Response {
    let (parts, _) = request.into_parts();
    let peer = super::limits::peer(&parts);
    check(&state, room.map(|Room(r)| r), &parts, peer).await
}

/// `GET /gate`: the gate for a whole site, the room picked by the rooms'
/// routes.
#[utoipa::path(
    get,
    path = "/gate",
    tag = "gate",
    params(
        ("redirect" = Option<String>, Query,
         description = "`1`: as for `/gate/{room}`."),
        ("pass" = Option<String>, Query,
         description = "`1`: as for `/gate/{room}`."),
        ("unrouted" = Option<String>, Query,
         description = "`pass`: let a request no room's route covers through (else it is refused with 403)."),
        ("X-Original-URI" = Option<String>, Header,
         description = "The path the visitor asked for (nginx): with the host, it picks the room."),
        ("X-Forwarded-Uri" = Option<String>, Header,
         description = "The same, as Traefik and Caddy send it."),
        ("X-Forwarded-Method" = Option<String>, Header,
         description = "The visitor's method, for the room's traffic rules."),
        ("X-Forwarded-Host" = Option<String>, Header,
         description = "The host the visitor asked for (else `Host`): with the path, it picks the room."),
    ),
    security((), ("ticket" = [])),
    responses(
        (status = 204, description = "As for `/gate/{room}`, in the room the routes picked; or, with `?unrouted=pass`, a request no route covers.",
         headers(("X-Narabu-Pass-Expires" = String, description = "When the pass lapses without activity (RFC 3339)."),
                 ("Set-Cookie" = String, description = "As for `/gate/{room}`."))),
        (status = 302, description = "`?redirect=1` and no live pass: to the room's queue.",
         headers(("Location" = String, description = "The room's queue page, with the return path."))),
        (status = 401, description = "No live pass for the room the routes picked, or a `shadow` traffic rule of it matches: send the visitor to its queue.",
         headers(("X-Narabu-Queue" = String, description = "The room's queue page, with the return path."))),
        (status = 403, description = "No room's route covers the request (`no_route`), or a `block` traffic rule of its room refuses it.", body = ErrorBody),
        (status = 404, description = "The room the routes picked was removed.", body = ErrorBody),
    ),
)]
pub(crate) async fn site_gate(State(state): State<AppState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let peer = super::limits::peer(&parts);
    check_site(&state, &parts, peer).await
}

/// A gate check, whichever way it came (ahead of the router, or through
/// it): the answer, marked `no-store`.
async fn check(
    state: &AppState,
    room: Result<RoomId, ApiError>,
    request: &Parts,
    peer: Option<IpAddr>,
) -> Response {
    let mut response = match room {
        Ok(room) => decide(state, &room, request, peer).await,
        Err(e) => e.into_response(),
    };
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// What the room's traffic rules say of a check: `Some` answer when a
/// rule lets it through or refuses it, `None` when it goes to the line.
fn apply_rules(
    state: &AppState,
    room: &RoomId,
    request: &Parts,
    peer: Option<IpAddr>,
) -> Option<Response> {
    let rules = state.rules.for_room(room)?;
    let headers = &request.headers;
    // Finding the client's address walks the forwarded headers: only
    // when some rule asks for it.
    let client = if rules.set.needs_client() {
        peer.map(|peer| {
            ClientIp::resolve(
                peer,
                headers,
                &state.settings.trusted_proxies,
                state.settings.client_ip_header,
            )
            .0
        })
    } else {
        None
    };
    match rules.judge(&RequestView::from_proxy(headers, client))? {
        Action::Queue => None,
        // Never through, whatever ticket it carries: to the queue, where
        // its join is sent to the shadow line.
        Action::Shadow => Some(refuse(state, room, headers, asks(request).redirect)),
        Action::Bypass => {
            let mut response = Response::new(axum::body::Body::empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            Some(response)
        }
        Action::Block => Some(blocked().into_response()),
    }
}

/// What a request a `block` rule matches is answered.
pub(crate) fn blocked() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "blocked",
        "This site does not accept this request.",
    )
}

async fn decide(
    state: &AppState,
    room: &RoomId,
    request: &Parts,
    peer: Option<IpAddr>,
) -> Response {
    if let Some(answer) = apply_rules(state, room, request, peer) {
        return answer;
    }
    let headers = &request.headers;
    let Asks { redirect, pass, .. } = asks(request);
    // A shadow line's ticket is never let through: as good as none.
    let held = ticket::find(state, room, headers).ok().flatten();
    let Some(visitor) = held.filter(|v| v.shadow.is_none()) else {
        // Without a ticket the answer is the queue, unless there is no such
        // room to queue for: a misconfigured proxy should see that plainly.
        if let Err(BackendError::NoSuchRoom(_)) = state.backend.epoch(room).await {
            return ApiError::from(BackendError::NoSuchRoom(room.clone())).into_response();
        }
        return refuse(state, room, headers, redirect);
    };
    // The embedded backend answers on the first poll; only an answer that
    // has to wait (on Redis) is worth a timer, which would otherwise be
    // set and cancelled on every check.
    let mut asked = std::pin::pin!(state.backend.status(room, visitor.ticket, true));
    let status = match futures_util::poll!(asked.as_mut()) {
        Poll::Ready(answer) => answer,
        Poll::Pending => match tokio::time::timeout(BACKEND_WAIT, asked).await {
            Ok(answer) => answer,
            Err(_) => Err(BackendError::Unavailable(
                "the backend did not answer the gate in time".into(),
            )),
        },
    };
    match status {
        Ok(status) if status.state == TicketState::Admitted && !status.closed => {
            let_through(state, room, &visitor, &status, pass).await
        }
        // A reset line sends the visitor to the queue page, which says so.
        Ok(_) | Err(BackendError::NoSuchTicket | BackendError::LineReset) => {
            refuse(state, room, headers, redirect)
        }
        Err(BackendError::NoSuchRoom(_)) => {
            ApiError::from(BackendError::NoSuchRoom(room.clone())).into_response()
        }
        Err(e) => {
            // The state store is down. When the operator chose to fail
            // open, a visitor whose signed pass (set by a check the store
            // answered, at most FAIL_OPEN_PASS_MS ago) has not run out goes
            // through; everyone else, the queue.
            tracing::warn!(room = %room, error = %e, "gate check failed");
            let open = state.settings.on_backend_error == OnBackendError::Open
                && ticket::live_pass(state, room, visitor.ticket, headers, state.clock.now_ms())
                    .is_some();
            if open {
                no_content()
            } else {
                refuse(state, room, headers, redirect)
            }
        }
    }
}

fn no_content() -> Response {
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// The answer for an admitted visitor: through, with the pass the proxy
/// asked for and, when the gate fails open, a signed pass to trust while
/// the state store is away.
async fn let_through(
    state: &AppState,
    room: &RoomId,
    visitor: &ticket::VisitorTicket,
    status: &TicketStatus,
    pass: bool,
) -> Response {
    let mut response = no_content();
    // First among the cookies: nginx hands the first on.
    if pass && let Some(minted) = passes::mint(state, room, visitor.ticket, status).await {
        passes::set_cookie(state, room, &minted, &mut response);
    }
    let Some(expires) = status.pass_expires_at else {
        return response;
    };
    if let Ok(v) = HeaderValue::from_str(&expires.to_string()) {
        response.headers_mut().insert(PASS_EXPIRES.clone(), v);
    }
    // Failing open needs something to trust while the backend is away: a
    // signed pass that runs out with the real one, or sooner, a short while
    // after this check (see FAIL_OPEN_PASS_MS).
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
        let cookie = ticket::pass_cookie(state, &pass, now);
        if let Ok(v) = HeaderValue::from_str(&cookie.to_string()) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    response
}

/// The gate's own metric handles, one pair per answer it gives, resolved
/// on first use: counting a check is then two atomic updates, not two
/// label-set lookups.
struct GateMetrics {
    metrics: Arc<crate::metrics::Metrics>,
    /// 204, 302, 401, 403, 404, 431.
    slots: [OnceLock<(Counter, Histogram)>; 6],
}

impl GateMetrics {
    fn observe(&self, status: StatusCode, took: Duration, site: bool) {
        if site {
            // The site's gate keeps its own route label, counted the
            // ordinary way.
            return self.metrics.observe_http(
                HttpLabels {
                    method: "GET",
                    route: SITE_GATE,
                    status: status.as_u16(),
                },
                took,
            );
        }
        let slot = match status.as_u16() {
            204 => 0,
            302 => 1,
            401 => 2,
            403 => 3,
            404 => 4,
            431 => 5,
            other => {
                return self.metrics.observe_http(
                    HttpLabels {
                        method: "GET",
                        route: ROUTE_LABEL,
                        status: other,
                    },
                    took,
                );
            }
        };
        let (count, duration) = self.slots[slot].get_or_init(|| {
            self.metrics.http_handles(HttpLabels {
                method: "GET",
                route: ROUTE_LABEL,
                status: status.as_u16(),
            })
        });
        count.inc();
        duration.observe(took.as_secs_f64());
    }
}

/// The route's label, as the router's matched path gives it to the other
/// routes' metrics.
const ROUTE_LABEL: &str = "/gate/:room";

/// The service a connection is served by: `GET /gate/{room}` answered
/// here, everything else by the router. The route stays in the router too
/// (the OpenAPI document walks it, and a room name that needs
/// percent-decoding goes that way).
#[derive(Clone)]
pub(crate) struct GateFirst {
    state: AppState,
    app: Router,
    metrics: Arc<GateMetrics>,
}

impl GateFirst {
    pub(crate) fn new(state: AppState, app: Router) -> Self {
        let metrics = Arc::new(GateMetrics {
            metrics: state.metrics.clone(),
            slots: Default::default(),
        });
        Self {
            state,
            app,
            metrics,
        }
    }
}

/// Whether a request is a gate check: for a room, or for the site
/// (`GET /gate`, the room picked by the rooms' routes).
pub(crate) fn is_gate_check(method: &Method, path: &str) -> bool {
    gate_room(method, path).is_some() || (method == Method::GET && path == SITE_GATE)
}

const SITE_GATE: &str = "/gate";

/// A check at `GET /gate`: the room the site's routes pick, or, when
/// none covers the request, through (`?unrouted=pass`) or refused.
async fn check_site(state: &AppState, request: &Parts, peer: Option<IpAddr>) -> Response {
    if let Some(room) = state.routes.pick(&request.headers) {
        return check(state, Ok(room), request, peer).await;
    }
    let mut response = if asks(request).unrouted_pass {
        let mut response = Response::new(axum::body::Body::empty());
        *response.status_mut() = StatusCode::NO_CONTENT;
        response
    } else {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "no_route",
            "No room's route covers this request.",
        )
        .into_response()
    };
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// The room of a gate check's path, when it can be taken as it is.
pub(crate) fn gate_room<'a>(method: &Method, path: &'a str) -> Option<&'a str> {
    if method != Method::GET {
        return None;
    }
    let room = path.strip_prefix("/gate/")?;
    (!room.is_empty() && !room.contains(['/', '%'])).then_some(room)
}

type GateFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl Service<Request> for GateFirst {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<GateFuture, Oneshot<Router, Request>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let peer = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip());
        self.serve(request, peer)
    }
}

impl GateFirst {
    /// What the service does with a request, for a connection that knows
    /// its peer without the request carrying it (an extension would be an
    /// allocation per check).
    pub(crate) fn serve(
        &self,
        request: Request,
        peer: Option<IpAddr>,
    ) -> Either<GateFuture, Oneshot<Router, Request>> {
        if !is_gate_check(request.method(), request.uri().path()) {
            return Either::Right(self.app.clone().oneshot(request));
        }
        let (request, _) = request.into_parts();
        let answer = self.answer(request, peer);
        Either::Left(Box::pin(async move { Ok(answer.await) }))
    }
}

impl GateFirst {
    /// Answer a gate check ([`is_gate_check`]): what
    /// [`GateFirst`]'s service does with one, and what the hyper-less
    /// connection path calls for the checks it reads itself.
    pub(crate) fn answer(
        &self,
        request: Parts,
        peer: Option<IpAddr>,
    ) -> impl Future<Output = Response> + Send + 'static {
        let state = self.state.clone();
        let metrics = self.metrics.clone();
        async move {
            let start = Instant::now();
            let site = request.uri.path() == SITE_GATE;
            let too_large = request
                .headers
                .iter()
                .map(|(name, value)| name.as_str().len() + value.len() + 4)
                .sum::<usize>()
                > HEADER_LIMIT;
            let mut response = if too_large {
                ApiError::new(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "headers_too_large",
                    format!("The request's headers are larger than {HEADER_LIMIT} bytes."),
                )
                .into_response()
            } else if site {
                check_site(&state, &request, peer).await
            } else {
                let room = gate_room(&request.method, request.uri.path())
                    .map(RoomId::new)
                    .unwrap_or(Err(crate::engine::InvalidRoomId))
                    .map_err(ApiError::from);
                check(&state, room, &request, peer).await
            };
            if let Some(id) = request.headers.get(&REQUEST_ID) {
                response
                    .headers_mut()
                    .insert(REQUEST_ID.clone(), id.clone());
            }
            // Only an error has a body a browser could sniff.
            if response.status().is_client_error() && response.status() != StatusCode::UNAUTHORIZED
            {
                response.headers_mut().insert(
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                );
            }
            metrics.observe(response.status(), start.elapsed(), site);
            response
        }
    }
}
