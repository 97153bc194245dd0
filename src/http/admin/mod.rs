//! The operators' JSON API under `/admin/`, its live event stream and the
//! dashboard page.
//!
//! Every call needs `Authorization: Bearer <admin token>` (the [`Admin`]
//! extractor, compared in constant time); with no token configured
//! everything under `/admin` answers 404, as if it did not exist. Handlers
//! are thin: they parse and validate, call one `Backend` operation, hand
//! the resulting snapshot to the monitor (which fires webhooks for the
//! change) and answer with the room as [`RoomBody`].
//!
//! `PUT` bodies are `[[rooms]]` tables in JSON and go through the config's
//! own parsing and validation (`RoomTable::into_settings`), so a room made
//! here obeys the same limits, with the same messages, as one in the file.
//! `PATCH` bodies use the same keys, each field left out, `null` or given
//! (`patch`); both answer 422 naming the field.

pub(crate) mod patch;
pub(crate) mod report;

use std::convert::Infallible;

use askama::Template;
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::ToSchema;

use super::access::AccessBook;
use super::api::{self, PurchaseBody};
use super::auth::require_admin;
use super::error::ApiError;
use super::extract::{Admin, Room};
use super::openapi::{DashboardEvent, ErrorBody, RoomParam};
use super::pages::PageError;
use super::rule_book::{RuleBook, RuleCount};
use super::state::AppState;
use crate::backend::{BackendError, RoomSnapshot, TicketRef};
use crate::config::{ConfigError, RoomTable};
use crate::engine::rules::Mode;
use crate::engine::{Departure, Handoff, LaneView, Order, Patch, RoomId, Timestamp};
use crate::monitor::{Sample, quantile};
use crate::token::MAX_TOKEN_LEN;

/// A room as operators see it: settings in the shape `PUT` accepts, live
/// counts, figures over the last minute and totals since creation.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Room)]
pub(crate) struct RoomBody {
    pub id: RoomId,
    /// The room's incarnation: bumped by every `PUT`, voiding old tickets.
    pub epoch: u64,
    /// `open`, `paused`, `scheduled` (before `opens_at`) or `closed`.
    #[schema(value_type = String, example = "open")]
    pub state: &'static str,
    /// `queue`, `passthrough`, `maintenance` or `sold_out`.
    pub mode: Mode,
    /// Units left to sell; `null` for a room that does not count stock.
    pub stock: Option<u64>,
    pub settings: RoomTable,
    pub capacity: u64,
    pub waiting: u64,
    pub admitted: u64,
    /// Permits given back while nobody waited.
    pub tray: u64,
    /// Permits in the worker's hand.
    pub held: u64,
    /// Permits still owed after a capacity decrease.
    pub debt: u64,
    pub admissions_per_second: f64,
    /// Waits from join to admission since the room was created (upper
    /// bound of the histogram bucket, ms).
    pub wait_p50_ms: Option<u64>,
    pub wait_p95_ms: Option<u64>,
    /// The same over the last minute.
    pub recent_wait_p50_ms: Option<u64>,
    pub recent_wait_p95_ms: Option<u64>,
    pub joins: u64,
    pub admissions: u64,
    pub handoffs: u64,
    pub releases: u64,
    pub leaves: u64,
    pub revocations: u64,
    pub expirations: u64,
    pub abandonments: u64,
    /// Tickets passed by at the head while their visitor was away.
    pub away_skips: u64,
    /// Away tickets whose visitor came back in time.
    pub away_returns: u64,
    pub peak_admitted: u64,
    pub opens_at: Option<Timestamp>,
    pub order: Order,
    /// SHA-256 of the lottery seed, published before the draw.
    pub lottery_commitment: Option<String>,
    /// The seed, once drawn, so anyone can check the shuffle.
    pub lottery_seed: Option<String>,
    /// Proof of work and enqueue tokens: the modes, the difficulty asked
    /// now, and which keys are set (never the keys themselves).
    #[schema(value_type = Object)]
    pub access: Value,
    /// Each priority lane: its weight, who waits in it and the permits
    /// its visitors hold; empty for a room without lanes.
    pub lanes: Vec<LaneView>,
    /// Waiting visitors who asked to be called back (Web Push).
    pub push_subscriptions: u64,
    /// Push messages this instance sent for the room (the room's owner
    /// sends them), by outcome: accepted by the push service, given up,
    /// answered gone (the subscription is then dropped), or dropped
    /// unsent (the queue was full).
    pub push_sent: u64,
    pub push_failed: u64,
    pub push_gone: u64,
    pub push_dropped: u64,
    /// Each traffic rule, in order, and the gate checks it decided on
    /// this instance; empty for a room without rules.
    pub rule_matches: Vec<RuleCount>,
    /// What autotune last read and chose, on the instance that tunes the
    /// room (its targets and bounds are in `settings.autotune`); `null`
    /// when it is off or another instance tunes it.
    pub autotune: Option<crate::autotune::tuner::TuneView>,
    pub updated_at: Timestamp,
}

impl RoomBody {
    pub(crate) fn new(
        s: &RoomSnapshot,
        recent: &Sample,
        now: Timestamp,
        access: &AccessBook,
        rules: &RuleBook,
    ) -> Self {
        let state = if s.view.closed {
            "closed"
        } else if !s.view.open {
            "scheduled"
        } else if s.settings.paused {
            "paused"
        } else {
            "open"
        };
        Self {
            id: s.settings.id.clone(),
            epoch: s.epoch,
            state,
            mode: s.settings.mode,
            stock: s.settings.stock,
            lanes: s.view.lanes.clone(),
            settings: RoomTable::from(&s.settings),
            capacity: s.ledger.capacity,
            waiting: s.view.waiting,
            admitted: s.ledger.admitted,
            tray: s.ledger.tray,
            held: s.ledger.held,
            debt: s.ledger.debt,
            admissions_per_second: recent.admit_rate,
            wait_p50_ms: quantile(&s.stats.waits, 0.5),
            wait_p95_ms: quantile(&s.stats.waits, 0.95),
            recent_wait_p50_ms: recent.wait_p50_ms,
            recent_wait_p95_ms: recent.wait_p95_ms,
            joins: s.stats.joins,
            admissions: s.stats.admissions,
            handoffs: s.stats.handoffs,
            releases: s.stats.releases,
            leaves: s.stats.leaves,
            revocations: s.stats.revocations,
            expirations: s.stats.expirations,
            abandonments: s.stats.abandonments,
            away_skips: s.stats.skips,
            away_returns: s.stats.returns,
            peak_admitted: s.stats.peak_admitted,
            opens_at: s.settings.opens_at.map(Timestamp),
            order: s.settings.order,
            lottery_commitment: s.view.lottery_commitment.clone(),
            lottery_seed: s.view.lottery_seed.clone(),
            access: super::access::summary(access, s),
            push_subscriptions: s.subscriptions,
            push_sent: 0,
            push_failed: 0,
            push_gone: 0,
            push_dropped: 0,
            rule_matches: rules.counts(&s.settings.id),
            autotune: None,
            updated_at: now,
        }
    }

    /// With this instance's push sends for the room.
    pub(crate) fn with_sends(mut self, push: Option<&crate::push::Push>) -> Self {
        if let Some(push) = push {
            (
                self.push_sent,
                self.push_failed,
                self.push_gone,
                self.push_dropped,
            ) = push.sends.of(self.id.as_str());
        }
        self
    }

    /// With what this instance's tuner read and chose for the room.
    pub(crate) fn with_tuning(mut self, tunes: &crate::autotune::tuner::TuneBook) -> Self {
        self.autotune = tunes.view(&self.id);
        self
    }
}

fn body(state: &AppState, s: &RoomSnapshot) -> RoomBody {
    RoomBody::new(
        s,
        &state.monitor.figures(s),
        state.clock.now(),
        &state.access,
        &state.rules,
    )
    .with_sends(state.push.as_deref())
    .with_tuning(&state.tunes)
}

/// A room's setting refused: `422 invalid_field` naming it, as a bad
/// field of any other JSON body is refused (`super::extract::json_body`).
fn invalid(e: &ConfigError) -> ApiError {
    let error = ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
        e.to_string(),
    );
    match e.field() {
        "" => error,
        field => error.with("field", field),
    }
}

/// A template directory that cannot be used: 422 naming the file, the
/// line and the reason, also as fields for tools.
fn invalid_pages(e: &PageError) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
        format!("templates_dir: {e}"),
    )
    .with("field", "templates_dir")
    .with("file", e.file.clone())
    .with("line", e.line)
    .with("reason", e.reason.clone())
}

/// Loads and checks a room's page directory off the async threads (it
/// reads files and renders every page in every language).
async fn prepare_pages(
    state: &AppState,
    dir: Option<String>,
) -> Result<std::sync::Arc<super::pages::book::PageSet>, ApiError> {
    let book = state.pages.clone();
    tokio::task::spawn_blocking(move || book.prepare(dir.as_deref()))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "loading page templates panicked");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "The templates could not be loaded.",
            )
        })?
        .map_err(|e| invalid_pages(&e))
}

pub(crate) fn invalid_field(field: &str, message: impl Into<String>) -> ApiError {
    invalid(&ConfigError::new(field, message))
}

/// A JSON object body; anything else is refused before any field is read.
fn object(bytes: &Bytes) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            "The body must be a JSON object.",
        )),
        Err(e) => Err(ApiError::bad_body(format!("The body is not JSON: {e}"))),
    }
}

/// Reads a room table, the id coming from the path (a body may repeat it).
fn table(id: &RoomId, mut map: Map<String, Value>) -> Result<RoomTable, ApiError> {
    match map.get("id") {
        None => {
            map.insert("id".into(), Value::String(id.to_string()));
        }
        Some(Value::String(given)) if given == id.as_str() => {}
        Some(_) => {
            return Err(invalid_field(
                "id",
                format!("must be the room of the path, \"{id}\", when given"),
            ));
        }
    }
    serde_path_to_error::deserialize::<_, RoomTable>(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        invalid_field(&field, e.into_inner().to_string())
    })
}

// ----- rooms -------------------------------------------------------------

/// Every room.
#[derive(Serialize, ToSchema)]
#[schema(as = RoomList)]
pub(crate) struct RoomList {
    pub rooms: Vec<RoomBody>,
}

/// Every room with its live figures
#[utoipa::path(
    get,
    path = "/admin/rooms",
    tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "Every room.", body = RoomList),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "The admin API is off (no admin token configured).", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    _: Admin,
) -> Result<Json<RoomList>, ApiError> {
    let rooms: Vec<RoomBody> = state
        .backend
        .list_rooms()
        .await?
        .iter()
        .map(|s| body(&state, s))
        .collect();
    Ok(Json(RoomList { rooms }))
}

/// One room with its live figures
#[utoipa::path(
    get,
    path = "/admin/rooms/{room}",
    tag = "admin",
    params(RoomParam),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The room.", body = RoomBody),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room, or the admin API is off.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn get_room(
    State(state): State<AppState>,
    _: Admin,
    Room(room): Room,
) -> Result<Json<RoomBody>, ApiError> {
    let s = state.backend.room(&room).await?;
    Ok(Json(body(&state, &s)))
}

/// Create or replace a room
///
/// The body has the keys of a `[[rooms]]` table of the config file; `id`
/// may be left out. Replacing starts a new epoch: the old room's tickets
/// are void and its streams are told it closed.
#[utoipa::path(
    put,
    path = "/admin/rooms/{room}",
    tag = "admin",
    params(RoomParam),
    request_body(content = RoomTable, content_type = "application/json"),
    security(("admin" = [])),
    responses(
        (status = 201, description = "A new room.", body = RoomBody),
        (status = 200, description = "The room, replaced.", body = RoomBody),
        (status = 400, description = "The body is not JSON.", body = ErrorBody),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "The admin API is off, or the path names no possible room.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 422, description = "A field is unknown or out of range; the message names it.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn put_room(
    State(state): State<AppState>,
    _: Admin,
    Room(id): Room,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let settings = table(&id, object(&bytes)?)?
        .into_settings("")
        .map_err(|e| invalid(&e))?;
    let dir = settings.templates_dir.clone();
    let pages = prepare_pages(&state, dir.clone()).await?;
    // A route leads to one room: the others' routes as they stand.
    let others = state.backend.list_rooms().await?;
    let others: Vec<_> = others.into_iter().filter(|s| s.settings.id != id).collect();
    if !settings.routes.is_empty() {
        let claims = others
            .iter()
            .map(|s| (&s.settings.id, s.settings.routes.as_slice()))
            .chain([(&id, settings.routes.as_slice())]);
        if let Err(c) = crate::routes::RouteTable::build(claims) {
            return Err(invalid(&ConfigError::new(
                format!("routes[{}]", c.index),
                format!(
                    "the same route as room \"{}\": a route leads to one room",
                    c.first
                ),
            )));
        }
    }
    let existed = match state.backend.room(&id).await {
        Ok(_) => true,
        Err(BackendError::NoSuchRoom(_)) => false,
        Err(e) => return Err(e.into()),
    };
    // The line ends here: its report outlives it.
    if existed {
        report::keep_current(&state, &id).await?;
    }
    let s = state.backend.put_room(settings).await?;
    state.pages.install(&id, dir.as_deref(), pages);
    state.monitor.observe(&s);
    state.access.observe(&s, state.clock.now_ms());
    state.rules.observe(&s.settings);
    state
        .routes
        .rebuild(others.iter().map(|o| &o.settings).chain([&s.settings]));
    tracing::info!(room = %id, capacity = s.settings.capacity, replaced = existed, "admin: room put");
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(body(&state, &s))).into_response())
}

/// Change a running room
///
/// The mode, the stock left, capacity, pause or resume, open now, the
/// admission cap (`null` removes it), the tick, timeouts, the join limit, or the access rules (`null`
/// retires a previous enqueue key). Applies live, in one step: fields left
/// out stay as they are, so two operators changing different fields at
/// once both get their change. Lowering capacity admits nobody new until
/// the admitted count is below it.
#[utoipa::path(
    patch,
    path = "/admin/rooms/{room}",
    tag = "admin",
    params(RoomParam),
    request_body(content = patch::PatchBody, content_type = "application/json"),
    security(("admin" = [])),
    responses(
        (status = 200, description = "The room, changed.", body = RoomBody),
        (status = 400, description = "The body is not JSON.", body = ErrorBody),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room, or the admin API is off.", body = ErrorBody),
        (status = 410, description = "The room is closed.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 422, description = "A field is unknown, fixed or out of range; the message names it.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn patch_room(
    State(state): State<AppState>,
    _: Admin,
    Room(id): Room,
    bytes: Bytes,
) -> Result<Json<RoomBody>, ApiError> {
    let map = object(&bytes)?;
    if let Some(key) = map.keys().find(|k| !patch::PATCHABLE.contains(&k.as_str())) {
        let message = if patch::FIXED.contains(&key.as_str()) {
            "cannot be changed on a running room (PUT the room to replace it)".to_owned()
        } else {
            format!(
                "unknown field, expected one of {}",
                patch::PATCHABLE.join(", ")
            )
        };
        return Err(invalid_field(key, message));
    }
    let mut fields: patch::PatchBody = serde_path_to_error::deserialize(Value::Object(map))
        .map_err(|e| invalid_field(&e.path().to_string(), e.into_inner().to_string()))?;
    let lane_weights = fields.take_lane_weights();
    let mut change = fields.into_patch().map_err(|e| invalid(&e))?;
    let before = state.backend.room(&id).await?;
    state.monitor.observe(&before);
    change.lane_weights =
        patch::lane_weights(lane_weights, &before.settings).map_err(|e| invalid(&e))?;
    patch::check_access(&mut change, &before.settings).map_err(|e| invalid(&e))?;
    patch::check_mode(&change, &before.settings).map_err(|e| invalid(&e))?;
    let pages = match &change.templates_dir {
        Patch::Absent => None,
        Patch::Null => Some((None, prepare_pages(&state, None).await?)),
        Patch::Value(dir) => Some((
            Some(dir.clone()),
            prepare_pages(&state, Some(dir.clone())).await?,
        )),
    };
    let s = state.backend.patch_room(&id, change.clone()).await?;
    if let Some((dir, set)) = pages {
        state.pages.install(&id, dir.as_deref(), set);
    }
    state.monitor.observe(&s);
    state
        .monitor
        .mode_changed(before.settings.mode, &s, "operator");
    state.access.observe(&s, state.clock.now_ms());
    state.rules.observe(&s.settings);
    tracing::info!(
        room = %id,
        capacity = s.settings.capacity,
        previous_capacity = before.settings.capacity,
        paused = s.settings.paused,
        mode = %s.settings.mode,
        open_now = change.open_now,
        "admin: room changed"
    );
    Ok(Json(body(&state, &s)))
}

/// Close a room
///
/// Joins are refused, waiting visitors' streams get `closed` and their page
/// says so; admitted visitors keep their pass until they leave.
#[utoipa::path(
    delete,
    path = "/admin/rooms/{room}",
    tag = "admin",
    params(RoomParam),
    security(("admin" = [])),
    responses(
        (status = 204, description = "Closed (also when it already was)."),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room, or the admin API is off.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn delete_room(
    State(state): State<AppState>,
    _: Admin,
    Room(id): Room,
) -> Result<StatusCode, ApiError> {
    state.monitor.observe(&state.backend.room(&id).await?);
    state.backend.close_room(&id).await?;
    if let Ok(s) = state.backend.room(&id).await {
        state.monitor.observe(&s);
    }
    tracing::info!(room = %id, "admin: room closed");
    Ok(StatusCode::NO_CONTENT)
}

/// What a revocation did.
#[derive(Serialize, ToSchema)]
#[schema(as = Revoked)]
pub(crate) struct RevokeBody {
    /// Whether this call ended the ticket (false: it had already ended).
    pub revoked: bool,
    /// What the ticket was: `waiting`, `admitted`, or how it had ended.
    #[schema(value_type = String)]
    pub was: &'static str,
    /// Where an admitted ticket's permit went: `handed_to_next`, `tray` or
    /// `retired` (capacity was lowered).
    #[schema(value_type = Option<String>)]
    pub permit: Option<&'static str>,
}

/// Revoke a ticket
///
/// Takes a waiting ticket out of the line, or an admitted one's permit
/// (handed to the next in line). Revoking a ticket that already ended
/// frees nothing and says so.
#[utoipa::path(
    post,
    path = "/admin/rooms/{room}/revoke",
    tag = "admin",
    params(RoomParam),
    request_body(content = super::api::TicketBody, content_type = "application/json"),
    security(("admin" = [])),
    responses(
        (status = 200, description = "What the revocation did.", body = RevokeBody),
        (status = 400, description = "The body is not JSON.", body = ErrorBody),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room or ticket, or the admin API is off.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 422, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn revoke(
    State(state): State<AppState>,
    _: Admin,
    Room(id): Room,
    bytes: Bytes,
) -> Result<Json<RevokeBody>, ApiError> {
    let super::api::TicketBody { ticket: token } =
        super::extract::json_value(Value::Object(object(&bytes)?))?;
    let (ticket, departure) = revoke_ticket(&state, &id, &token).await?;
    let body = RevokeBody::from(departure);
    tracing::info!(
        room = %id,
        ticket = ticket.id,
        revoked = body.revoked,
        was = body.was,
        "admin: ticket revoked"
    );
    Ok(Json(body))
}

/// Why an operator's revocation was refused ([`ApiError`] says it over
/// HTTP).
#[derive(Debug)]
pub(crate) enum RevokeError {
    /// The token is no ticket of this room: why, for the `ticket` field.
    NotATicket(String),
    /// The room does not know the ticket; a ticket of a replaced room's
    /// earlier line is, to an operator, simply not in this room (visitors
    /// are told `line_reset`).
    UnknownTicket,
    /// The store could not answer.
    Backend(BackendError),
}

impl From<BackendError> for RevokeError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::NoSuchTicket | BackendError::LineReset => Self::UnknownTicket,
            e => Self::Backend(e),
        }
    }
}

/// Revokes the ticket `token` names in `room`: which ticket, and what its
/// departure did.
async fn revoke_ticket(
    state: &AppState,
    room: &RoomId,
    token: &str,
) -> Result<(TicketRef, Departure), RevokeError> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(RevokeError::NotATicket("is not a ticket token".into()));
    }
    let claim = state
        .keys
        .verify(token)
        .map_err(|e| RevokeError::NotATicket(e.to_string()))?;
    if claim.room != *room {
        return Err(RevokeError::NotATicket(format!(
            "belongs to the room \"{}\"",
            claim.room
        )));
    }
    let ticket = TicketRef {
        epoch: claim.epoch,
        id: claim.ticket,
    };
    Ok((ticket, state.backend.revoke(room, ticket).await?))
}

impl From<Departure> for RevokeBody {
    fn from(departure: Departure) -> Self {
        let (revoked, was, permit) = match departure {
            Departure::LeftQueue => (true, "waiting", None),
            Departure::GaveBack(h) => (
                true,
                "admitted",
                Some(match h {
                    Handoff::To(_) => "handed_to_next",
                    Handoff::Tray => "tray",
                    Handoff::Retired => "retired",
                }),
            ),
            Departure::Nothing(s) => (false, s.name(), None),
        };
        Self {
            revoked,
            was,
            permit,
        }
    }
}

/// The body of `POST /admin/rooms/{room}/purchases`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PurchaseReport {
    /// Units sold.
    #[schema(minimum = 1)]
    pub purchased: u64,
}

/// Report purchases
///
/// Sales the origin could not report with a release (a phone order, a
/// batch), taken off the room's stock like a release's `purchased`; the
/// report that takes the last unit turns the room sold out.
#[utoipa::path(
    post,
    path = "/admin/rooms/{room}/purchases",
    tag = "admin",
    params(RoomParam),
    request_body(content = PurchaseReport, content_type = "application/json"),
    security(("admin" = [])),
    responses(
        (status = 200, description = "What the report did.", body = PurchaseBody),
        (status = 400, description = "The body is not JSON.", body = ErrorBody),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "No such room, or the admin API is off.", body = ErrorBody),
        (status = 409, description = "The room does not count stock.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 422, description = "`purchased` is missing or out of range.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn purchases(
    State(state): State<AppState>,
    _: Admin,
    Room(id): Room,
    bytes: Bytes,
) -> Result<Json<PurchaseBody>, ApiError> {
    let report: PurchaseReport = super::extract::json_value(Value::Object(object(&bytes)?))?;
    let Some(taken) = api::record_purchase(&state, &id, report.purchased).await? else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_stock",
            "This room does not count stock: give it one first (PATCH {\"stock\": n}).",
        ));
    };
    Ok(Json(PurchaseBody::new(
        report.purchased,
        Some(taken),
        taken.mode,
    )))
}

// ----- the live stream ----------------------------------------------------

/// The dashboard's live stream
///
/// Server-Sent Events: first a `history` event with every room's last
/// fifteen minutes of samples, then an `update` event each second with
/// every room and its newest sample. The dashboard reads it with `fetch`
/// (so it can send the token header; `EventSource` cannot).
#[utoipa::path(
    get,
    path = "/admin/events",
    tag = "admin",
    security(("admin" = [])),
    responses(
        (status = 200, description = "The stream: `history` once, then an `update` a second.", content_type = "text/event-stream", body = DashboardEvent),
        (status = 401, description = "No admin token, or a wrong one.", body = ErrorBody),
        (status = 404, description = "The admin API is off.", body = ErrorBody),
    ),
)]
pub(crate) async fn events(
    State(state): State<AppState>,
    _: Admin,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut updates = state.monitor.subscribe();
    let shutdown = state.shutdown.clone();
    let stream = async_stream::stream! {
        let history: Map<String, Value> = state
            .monitor
            .history()
            .into_iter()
            .map(|(id, samples)| (id.to_string(), json!(samples)))
            .collect();
        yield Ok(Event::default().event("history").data(json!({ "rooms": history }).to_string()));
        loop {
            let overview = updates.borrow_and_update().clone();
            let rooms: Vec<Value> = overview
                .rooms
                .iter()
                .map(|(s, sample)| json!({ "room": RoomBody::new(s, sample, state.clock.now(), &state.access, &state.rules).with_sends(state.push.as_deref()).with_tuning(&state.tunes), "sample": sample }))
                .collect();
            if !rooms.is_empty() {
                yield Ok(Event::default().event("update").data(json!({ "rooms": rooms }).to_string()));
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = updates.changed() => if changed.is_err() { return },
            }
        }
    };
    Sse::new(stream)
}

// ----- the dashboard page -----------------------------------------------

#[derive(Template)]
#[template(path = "admin.html")]
struct Dashboard;

/// The operators' dashboard (HTML)
///
/// The page itself holds nothing secret; it asks for the token and sends it
/// with each call. Absent (404) when the admin API is off.
#[utoipa::path(
    get,
    path = "/admin",
    tag = "admin",
    responses(
        (status = 200, description = "The dashboard.", content_type = "text/html", body = String),
        (status = 404, description = "The admin API is off.", body = ErrorBody),
    ),
)]
pub(crate) async fn dashboard(State(state): State<AppState>) -> Response {
    if state.settings.admin_token.is_none() {
        return require_admin(&state, &HeaderMap::new())
            .err()
            .map(IntoResponse::into_response)
            .unwrap_or_else(|| StatusCode::NOT_FOUND.into_response());
    }
    match Dashboard.render() {
        Ok(body) => super::pages::html(StatusCode::OK, body),
        Err(e) => {
            tracing::error!(error = %e, "rendering the dashboard failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
