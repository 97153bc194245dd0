//! The visitor and app JSON API: join, status, leave, and the origin's
//! release. Browsers and apps use the same endpoints; the ticket travels as
//! the room cookie or as `Authorization: Bearer`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::access::{self, Proof};
use super::error::ApiError;
use super::extract::{MaybeVisitor, ReleaseKey, Room, Visitor};
use super::limits::ClientIp;
use super::openapi::{ErrorBody, RoomParam};
use super::origin::Provenance;
use super::passes;
use super::receipts;
use super::return_path::validate_return_path;
use super::shadow;
use super::state::AppState;
use super::ticket::{self, VisitorTicket};
use crate::access::PowError;
use crate::backend::{BackendError, JoinRequest, TicketRef};
use crate::engine::rules::{Mode, STOCK_MAX, StockTaken};
use crate::engine::{Binding, Departure, Identity, RoomId, StatusBody, TicketStatus};
use crate::rules::{Action, RequestView};

/// A join's answer: the ticket's token and its status (the same body as
/// `status`, with `ticket` first).
#[derive(Serialize, ToSchema)]
#[schema(as = Ticket)]
struct JoinBody<'a> {
    /// The ticket: send it back as `Authorization: Bearer` (apps), or let
    /// the room cookie set by this answer carry it (browsers).
    ticket: &'a str,
    #[serde(flatten)]
    status: StatusBody,
    /// For an admitted ticket: a signed pass (a JWT any proxy or app can
    /// verify with `/.well-known/jwks.json`), also set as cookie
    /// `narabu_{room}_jwt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pass: Option<String>,
    /// A signed receipt of this ticket (room, epoch, ticket id, number,
    /// lane, time of joining; no identity), checked with the keys at
    /// `/.well-known/jwks.json`: see `GET /api/rooms/{room}/receipt`.
    receipt: String,
    /// The room's admission record as it stands: how many entries, and
    /// the hash of the last (`GET /api/rooms/{room}/record`).
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<super::record::HeadBody>,
}

/// A status answer: the ticket's status and, once admitted, a signed pass.
#[derive(Serialize, ToSchema)]
#[schema(as = VisitorStatus)]
pub(crate) struct StatusAnswer {
    #[serde(flatten)]
    status: StatusBody,
    /// For an admitted ticket: a signed pass (a JWT any proxy or app can
    /// verify with `/.well-known/jwks.json`), also set as cookie
    /// `narabu_{room}_jwt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pass: Option<String>,
    /// The room's admission record as it stands: how many entries, and
    /// the hash of the last (`GET /api/rooms/{room}/record`).
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<super::record::HeadBody>,
}

/// The body a join may carry: a proof of work and an enqueue token, for
/// rooms that ask for them ([`Proof`]). Unknown keys are refused so that a
/// client relying on a future option finds out.
fn parse_join_body(body: &Bytes) -> Result<Proof, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Proof::default());
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_body(format!("The body is not valid JSON: {e}")))?;
    // `null` is "no proof" too: the document marks the body optional and
    // nullable, and generated clients send `null` for a body left out.
    if value.is_null() {
        return Ok(Proof::default());
    }
    if !value.is_object() {
        return Err(ApiError::bad_body(
            "The body must be a JSON object (or empty).",
        ));
    }
    super::extract::json_value(value)
}

/// The fewest characters an `Idempotency-Key` may have: a key is a
/// client's own retry id, and a short one is easy to guess or to share by
/// accident with another client.
const MIN_IDEMPOTENCY_KEY: usize = 16;

/// An `Idempotency-Key`, hashed with the room into the engine's 16-byte
/// identity.
fn idempotency_identity(room: &RoomId, headers: &HeaderMap) -> Result<Option<Identity>, ApiError> {
    let Some(key) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = key
        .to_str()
        .ok()
        .filter(|k| {
            (MIN_IDEMPOTENCY_KEY..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_idempotency_key",
                "Idempotency-Key must be 16 to 255 visible ASCII characters (a random id, such as a UUID).",
            )
        })?;
    let digest = Sha256::new()
        .chain_update(room.as_str())
        .chain_update([0])
        .chain_update(key)
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    Ok(Some(Identity(u128::from_be_bytes(id))))
}

/// The outcome of joining, shared by the JSON API and the queue page.
pub(crate) struct Joined {
    pub ticket: TicketRef,
    pub token: String,
    pub status: TicketStatus,
    pub is_new: bool,
}

/// Why a join was refused, in the cases a page shows otherwise than as an
/// error: each carries the error the API answers with, so the JSON API and
/// the pages say the same, and the pages tell the cases apart by kind
/// rather than by the error's code.
#[derive(Debug)]
pub(crate) enum JoinRefused {
    /// The room is closed.
    Closed(ApiError),
    /// The room has sold out.
    SoldOut(ApiError),
    /// The ticket the visitor holds names a line that was reset.
    LineReset(ApiError),
    /// The room wants a solved proof of work: the error carries the
    /// challenge.
    Challenge(ApiError),
    /// The room wants an invitation (an enqueue token).
    Invitation(ApiError),
    /// Anything else.
    Other(ApiError),
}

impl JoinRefused {
    fn access(
        state: &AppState,
        room: &RoomId,
        policy: &access::Policy,
        refusal: access::Refusal,
    ) -> Self {
        let pow = matches!(refusal, access::Refusal::Pow(_));
        let error = access::refuse(state, room, policy, refusal);
        if pow {
            Self::Challenge(error)
        } else {
            Self::Invitation(error)
        }
    }
}

impl JoinRefused {
    /// The store's refusal of a join: the access rules' own answer when it
    /// refused a new ticket for what the join did not show (or a spent
    /// proof of work), counted in the metrics otherwise.
    fn by_store(
        state: &AppState,
        room: &RoomId,
        policy: &access::Policy,
        missing: Option<access::Refusal>,
        e: BackendError,
    ) -> Self {
        match e {
            BackendError::AccessDenied => {
                let refusal = missing.unwrap_or(access::Refusal::Pow(None));
                Self::access(state, room, policy, refusal)
            }
            BackendError::NonceSpent => {
                let spent = access::Refusal::Pow(Some(PowError::Spent));
                Self::access(state, room, policy, spent)
            }
            e => {
                let refused = Self::from(e);
                state
                    .metrics
                    .join_refused(room.as_str(), refused.error().code);
                refused
            }
        }
    }
}

impl From<ApiError> for JoinRefused {
    fn from(e: ApiError) -> Self {
        Self::Other(e)
    }
}

impl From<BackendError> for JoinRefused {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Closed(_) => Self::Closed(e.into()),
            BackendError::SoldOut(_) => Self::SoldOut(e.into()),
            BackendError::LineReset => Self::LineReset(e.into()),
            e => Self::Other(e.into()),
        }
    }
}

impl JoinRefused {
    /// The error the API answers with.
    fn error(&self) -> &ApiError {
        match self {
            Self::Closed(e)
            | Self::SoldOut(e)
            | Self::LineReset(e)
            | Self::Challenge(e)
            | Self::Invitation(e)
            | Self::Other(e) => e,
        }
    }
}

impl From<JoinRefused> for ApiError {
    fn from(r: JoinRefused) -> Self {
        match r {
            JoinRefused::Closed(e)
            | JoinRefused::SoldOut(e)
            | JoinRefused::LineReset(e)
            | JoinRefused::Challenge(e)
            | JoinRefused::Invitation(e)
            | JoinRefused::Other(e) => e,
        }
    }
}

/// Join idempotently, in one call to the backend: the visitor's live
/// ticket (cookie or Bearer) is kept; otherwise the room's access rules
/// are checked ([`access::clear`]) and an enqueue token's account or an
/// `Idempotency-Key` maps to one ticket; otherwise a new ticket, which
/// counts against the client address's join limit and spends the join's
/// proof of work. With `replace_ended` off, an ended ticket is answered as
/// it is rather than replaced.
pub(crate) async fn join_room(
    state: &AppState,
    room: &RoomId,
    held: Option<VisitorTicket>,
    headers: &HeaderMap,
    client: ClientIp,
    replace_ended: bool,
    proof: &Proof,
) -> Result<Joined, JoinRefused> {
    let policy = state
        .access
        .policy(state.backend.as_ref(), room, state.clock.now_ms())
        .await?;
    // The room's traffic rules judge the join too, on what it carries (the
    // client, the host, headers and cookies): a blocked network cannot
    // queue, and a shadowed one is answered from the shadow line, which
    // the backend never hears of.
    let verdict = state
        .rules
        .for_room(room)
        .and_then(|rules| rules.judge(&RequestView::of_join(headers, client.0)));
    match verdict {
        Some(Action::Block) => return Err(super::gate::blocked().into()),
        Some(Action::Shadow) => return join_shadow(state, room, held, &policy, proof).await,
        _ => {}
    }
    // A shadow ticket no rule sends back to the shadow line (the rule was
    // removed, or its holder moved) is no ticket in the real one.
    let held = held.filter(|v| v.shadow.is_none());
    // What the rules find missing only matters if a new ticket is made:
    // a visitor who holds a live ticket keeps it without showing anything.
    let (cleared, refusal) = match access::clear(state, room, &policy, proof) {
        Ok(cleared) => (cleared, None),
        Err(refusal) => (access::Cleared::default(), Some(refusal)),
    };
    let (identity, binding) = match cleared.identity {
        Some(account) => (Some(account), Binding::Lasting),
        None => (idempotency_identity(room, headers)?, Binding::WhileLive),
    };
    let request = JoinRequest {
        held: held.as_ref().map(|v| v.ticket),
        replace_ended,
        identity,
        binding,
        client: Some(client.key()),
        refuse_new: refusal.is_some(),
        nonce: cleared.nonce(),
        lane: cleared.lane,
    };
    let outcome = state
        .backend
        .join(room, request)
        .await
        .map_err(|e| JoinRefused::by_store(state, room, &policy, refusal, e))?;
    if outcome.is_new {
        access::admitted(state, room, &cleared);
    }
    let holds_it = held.as_ref().is_some_and(|v| v.ticket == outcome.ticket);
    // A key is a retry id, not a credential: whoever learns it must not get
    // the ticket it made. A client that holds the ticket needs no token.
    if !outcome.is_new && binding == Binding::WhileLive && identity.is_some() && !holds_it {
        return Err(ApiError::idempotency_key_used().into());
    }
    let token = match held {
        Some(v) if v.ticket == outcome.ticket => v.token,
        _ => ticket::sign(state, room, outcome.ticket),
    };
    Ok(Joined {
        ticket: outcome.ticket,
        token,
        status: outcome.status,
        is_new: outcome.is_new,
    })
}

/// A join a `shadow` rule sends to the shadow line: answered there, where
/// the backend never hears of it. A new shadow ticket must clear the room's
/// access rules like any other.
async fn join_shadow(
    state: &AppState,
    room: &RoomId,
    held: Option<VisitorTicket>,
    policy: &access::Policy,
    proof: &Proof,
) -> Result<Joined, JoinRefused> {
    let held = held.and_then(|v| v.shadow);
    if held.is_none()
        && let Err(refusal) = access::clear(state, room, policy, proof)
    {
        return Err(JoinRefused::access(state, room, policy, refusal));
    }
    let (ticket, token, status, is_new) = shadow::join(state, room, held).await?;
    Ok(Joined {
        ticket: ticket.shown(),
        token,
        status,
        is_new,
    })
}

pub(crate) fn set_cookie(
    state: &AppState,
    room: &RoomId,
    token: String,
) -> (header::HeaderName, String) {
    (
        header::SET_COOKIE,
        ticket::cookie(state, room, token).to_string(),
    )
}

/// Join the queue
///
/// Answers at once with a ticket; it never waits for a permit. Joining
/// again with the same ticket (cookie or Bearer) or enqueue token's account
/// answers the same ticket (200). An `Idempotency-Key` is a client-side
/// retry id: a retried join with it makes no second ticket while the first
/// lives, but it never hands out that ticket's token — a client that does
/// not send the ticket itself gets 409 (`idempotency_key_used`). Once the
/// ticket ends the key is free and makes a new ticket. Rooms with
/// `challenge = "pow"` or `enqueue = "token"` want the proof in the body;
/// without it the answer is 403 with what is missing (and a fresh
/// challenge).
#[utoipa::path(
    post,
    path = "/api/rooms/{room}/join",
    tag = "visitors",
    params(
        RoomParam,
        ("Idempotency-Key" = Option<String>, Header,
         description = "A client-side retry id (16 to 255 visible ASCII characters, e.g. a UUID): \
                        one live ticket per key and room. It does not recover the ticket's token: \
                        a repeat from a client without the ticket is 409.",
         pattern = r"^[!-~]{16,255}$"),
    ),
    request_body(content = Option<Proof>, content_type = "application/json",
                 description = "Empty (or `null`), or the proof a room asks for."),
    security((), ("ticket" = [])),
    responses(
        (status = 201, description = "A new ticket; the room cookie is set.", body = JoinBody),
        (status = 200, description = "The ticket this visitor already holds.", body = JoinBody),
        (status = 400, description = "The body is not JSON, or a bad `Idempotency-Key`.", body = ErrorBody),
        (status = 403, description = "The room wants a solved challenge or an enqueue token; or the ticket cookie came on a request from another site (`cross_site_request`); or a `block` traffic rule refuses the client (`blocked`).", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 409, description = "The `Idempotency-Key` already made a live ticket this request does not carry (`idempotency_key_used`); no token is given.", body = ErrorBody),
        (status = 410, description = "The room is closed.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 422, description = "The body has an unknown or mistyped field.", body = ErrorBody),
        (status = 429, description = "Too many new tickets from this address.", body = ErrorBody),
        (status = 503, description = "The room is full, or the store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn join(
    State(state): State<AppState>,
    MaybeVisitor { room, ticket }: MaybeVisitor,
    provenance: Provenance,
    client: ClientIp,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if ticket.as_ref().is_some_and(|t| t.from_cookie) {
        provenance.require_same_origin()?;
    }
    let proof = parse_join_body(&body)?;
    let joined = join_room(&state, &room, ticket, &headers, client, true, &proof).await?;
    let code = if joined.is_new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let minted = passes::mint(&state, &room, joined.ticket, &joined.status).await;
    let status = status_body(&state, &room, &joined.status).await;
    let receipt = receipts::sign(
        &state,
        &room,
        joined.ticket,
        &joined.status,
        status.lane.clone(),
    );
    let body = Json(JoinBody {
        ticket: &joined.token,
        status,
        pass: minted.as_ref().map(|m| m.token.clone()),
        receipt,
        record: super::record::head(&state, &room).await,
    })
    .into_response();
    let mut response = (code, [set_cookie(&state, &room, joined.token)], body).into_response();
    if let Some(minted) = &minted {
        passes::set_cookie(&state, &room, minted, &mut response);
    }
    Ok(response)
}

/// A ticket's status
///
/// Place in line, people ahead, estimated wait; also counts as the
/// visitor's activity (a waiting ticket polled this way stays present).
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/status",
    tag = "visitors",
    params(RoomParam),
    security(("ticket" = [])),
    responses(
        (status = 200, description = "The ticket's status; once admitted, with a signed pass (also set as cookie `narabu_{room}_jwt`).", body = StatusAnswer),
        (status = 401, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset (the room started again): join again.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn status(
    State(state): State<AppState>,
    Visitor { room, ticket }: Visitor,
) -> Result<Response, ApiError> {
    let status = match ticket.shadow {
        Some(t) => shadow::status(&state, &room, t).await?,
        None => state.backend.status(&room, ticket.ticket, true).await?,
    };
    let minted = passes::mint(&state, &room, ticket.ticket, &status).await;
    let mut response = Json(StatusAnswer {
        status: status_body(&state, &room, &status).await,
        pass: minted.as_ref().map(|m| m.token.clone()),
        record: super::record::head(&state, &room).await,
    })
    .into_response();
    if let Some(minted) = &minted {
        passes::set_cookie(&state, &room, minted, &mut response);
    }
    Ok(response)
}

/// A status as it goes out, naming the ticket's lane in a room with lanes.
pub(crate) async fn status_body(
    state: &AppState,
    room: &RoomId,
    status: &TicketStatus,
) -> StatusBody {
    let lane = lane_name(state, room, status.lane).await;
    StatusBody::named(status, lane.as_deref())
}

/// What the room calls a lane; `None` in a room without lanes.
pub(crate) async fn lane_name(state: &AppState, room: &RoomId, lane: u8) -> Option<String> {
    state
        .access
        .lane_name(state.backend.as_ref(), room, lane, state.clock.now_ms())
        .await
}

/// Leave
///
/// Leave the queue, or give the permit back (handed to the next visitor at
/// once). The queue page's form (a browser without JavaScript) is sent
/// back to the queue page, which then says the visitor left.
#[utoipa::path(
    post,
    path = "/api/rooms/{room}/leave",
    tag = "visitors",
    params(RoomParam),
    security(("ticket" = [])),
    responses(
        (status = 204, description = "Left (also when the ticket had already ended)."),
        (status = 303, description = "A form post: back to the queue page."),
        (status = 401, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 403, description = "The ticket cookie came on a request from another site or origin (`cross_site_request`); a Bearer ticket is never refused so.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset (the room started again): join again.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn leave(
    State(state): State<AppState>,
    Visitor { room, ticket }: Visitor,
    provenance: Provenance,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if ticket.from_cookie {
        provenance.require_same_origin()?;
    }
    match ticket.shadow {
        Some(t) => {
            // As a real departure would: an unknown room or a reset line
            // is said so.
            shadow::status(&state, &room, t).await?;
            state.rules.shadow.leave(&room, t, state.clock.now_ms());
        }
        None => {
            state.backend.leave(&room, ticket.ticket).await?;
        }
    }
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if is_form {
        let back = form_urlencoded::parse(&body)
            .find(|(k, _)| k == "return")
            .and_then(|(_, v)| validate_return_path(Some(&v)).ok())
            .unwrap_or_else(|| "/".to_owned());
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("return", &back)
            .finish();
        return Ok(without_pass(
            &state,
            &room,
            Redirect::to(&format!("/queue/{room}?{query}")).into_response(),
        ));
    }
    Ok(without_pass(
        &state,
        &room,
        StatusCode::NO_CONTENT.into_response(),
    ))
}

/// Adds the removal of the pass cookies to a departure's answer: a
/// fail-open pass left in the browser would still open the gate while the
/// store is away, and a signed pass would still open a verifying proxy
/// until it expires.
fn without_pass(state: &AppState, room: &RoomId, mut response: Response) -> Response {
    for cookie in [
        ticket::clear_pass_cookie(state, room),
        passes::clear_cookie(state, room),
    ] {
        if let Ok(v) = header::HeaderValue::from_str(&cookie.to_string()) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    response
}

/// A body naming one ticket: what the origin's backend releases, and what
/// an operator revokes.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TicketBody {
    /// The visitor's ticket, as the join answered it.
    pub ticket: String,
}

/// The body of a release: the visitor's ticket and, optionally, the units
/// they bought.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseRequest {
    /// The visitor's ticket, as the join answered it.
    pub ticket: String,
    /// Units bought, taken off a stock-aware room's stock.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub purchased: Option<u64>,
}

/// What a reported purchase did: the answer of a release that carried
/// `purchased`, and of the operators' purchase report.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Purchase)]
pub(crate) struct PurchaseBody {
    /// For a release: whether a permit was given back (false: the ticket
    /// held none; the purchase counts all the same).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
    pub purchased: u64,
    /// Units left; `null` for a room that does not count stock.
    pub stock: Option<u64>,
    /// The room's mode after the report.
    pub mode: Mode,
    /// This report took the last unit and turned the room sold out.
    pub sold_out: bool,
}

/// Take a reported purchase off the room's stock (one atomic step on any
/// backend). The report that sells the room out announces it
/// (`room.mode_changed`, `room.sold_out`), so that is done once whichever
/// instance took it. `None` for a room that does not count stock.
pub(crate) async fn record_purchase(
    state: &AppState,
    room: &RoomId,
    purchased: u64,
) -> Result<Option<StockTaken>, ApiError> {
    if !(1..=STOCK_MAX).contains(&purchased) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            format!("purchased: must be between 1 and {STOCK_MAX}, got {purchased}"),
        ));
    }
    let taken = state.backend.purchase(room, purchased).await?;
    if let Some(t) = taken {
        tracing::info!(room = %room, purchased, left = t.left, sold_out = t.sold_out_now, "purchase recorded");
        if t.sold_out_now
            && let Ok(s) = state.backend.room(room).await
        {
            state.monitor.observe(&s);
            state.monitor.mode_changed(t.before, &s, "stock");
        }
    }
    Ok(taken)
}

impl PurchaseBody {
    pub(crate) fn new(purchased: u64, taken: Option<StockTaken>, mode: Mode) -> Self {
        Self {
            released: None,
            purchased,
            stock: taken.map(|t| t.left),
            mode: taken.map_or(mode, |t| t.mode),
            sold_out: taken.is_some_and(|t| t.sold_out_now),
        }
    }
}

/// Release a visitor's permit
///
/// The origin's backend gives a visitor's permit back when the purchase is
/// done; it goes to the next in line at once. Needs the release key (or
/// the admin token). With `purchased: n` the purchase is taken off the
/// room's stock first (so a permit freed by the last sale goes to nobody),
/// and the answer is 200 with what the report did; without it, 204, or 409
/// for a ticket that holds no permit.
#[utoipa::path(
    post,
    path = "/api/rooms/{room}/release",
    tag = "origin",
    params(RoomParam),
    request_body(content = ReleaseRequest, content_type = "application/json"),
    security(("release" = [])),
    responses(
        (status = 200, description = "With `purchased`: what the report did.", body = PurchaseBody),
        (status = 204, description = "The permit is back and handed on."),
        (status = 401, description = "No release key, or a damaged ticket or one of another room.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset (the room started again): join again.", body = ErrorBody),
        (status = 409, description = "The ticket holds no permit.", body = ErrorBody),
        (status = 413, description = "The body is too large."),
        (status = 400, description = "The body is not JSON (`bad_body`).", body = ErrorBody),
        (status = 422, description = "The body is not `{\"ticket\": …, \"purchased\": n}` (`invalid_field`, naming the field).", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn release(
    State(state): State<AppState>,
    _: ReleaseKey,
    Room(room): Room,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ReleaseRequest = super::extract::json_body(&body)?;
    let claim = state.keys.verify(&request.ticket)?;
    if claim.room != room {
        return Err(ApiError::wrong_room());
    }
    let ticket = TicketRef {
        epoch: claim.epoch,
        id: claim.ticket,
    };
    let Some(purchased) = request.purchased else {
        return match state.backend.release(&room, ticket).await? {
            Departure::GaveBack(_) => Ok(without_pass(
                &state,
                &room,
                StatusCode::NO_CONTENT.into_response(),
            )),
            Departure::LeftQueue | Departure::Nothing(_) => Err(ApiError::new(
                StatusCode::CONFLICT,
                "not_admitted",
                "This ticket holds no permit (never admitted, or already released or expired).",
            )),
        };
    };
    let taken = record_purchase(&state, &room, purchased).await?;
    let released = match state.backend.release(&room, ticket).await {
        Ok(d) => matches!(d, Departure::GaveBack(_)),
        Err(BackendError::NoSuchTicket) => false,
        Err(e) => return Err(e.into()),
    };
    let mode = match taken {
        Some(t) => t.mode,
        None => state.backend.room(&room).await?.settings.mode,
    };
    let body = PurchaseBody {
        released: Some(released),
        ..PurchaseBody::new(purchased, taken, mode)
    };
    Ok(without_pass(&state, &room, Json(body).into_response()))
}
