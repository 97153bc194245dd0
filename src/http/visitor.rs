//! The queue page a visitor's browser lands on: `GET /queue/{room}`.
//!
//! It joins idempotently (a live ticket in the room cookie is kept), sets
//! the cookie, and shows the wait; once admitted it answers 303 to the
//! return path, so a page without JavaScript gets there by its meta
//! refresh. A ticket that ended shows why, with a way to join again that
//! really starts a new ticket (`?rejoin=1`); so does a ticket whose line
//! was reset.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::access::Proof;
use super::api::{self, JoinRefused};
use super::error::ApiError;
use super::extract::MaybeVisitor;
use super::i18n::Lang;
use super::limits::ClientIp;
use super::openapi::RoomParam;
use super::pages::{
    self, ClosedPage, ClosedReason, DrawLink, ErrorPage, Page, PowForm, QueuePage, QueueUrls, Visit,
};
use super::passes::Minted;
use super::return_path::validate_return_path;
use super::state::AppState;
use super::ticket::VisitorTicket;
use crate::engine::rules::Mode;
use crate::engine::{RoomId, TicketState, TicketStatus};

#[derive(Debug, Default, Deserialize)]
pub(crate) struct QueueQuery {
    #[serde(rename = "return")]
    return_path: Option<String>,
    lang: Option<String>,
    /// Start a new ticket even if the cookie holds an ended one.
    rejoin: Option<String>,
    /// The origin's invitation to an invite-only room; dropped from the
    /// address once used.
    enqueue_token: Option<String>,
}

fn query_string(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

fn error_page(state: &AppState, visit: &Visit, status: StatusCode) -> Response {
    state
        .pages
        .render(status, visit, &Page::Error(ErrorPage::for_status(status)))
}

fn page_for_error(state: &AppState, visit: &Visit, e: &ApiError) -> Response {
    // A browser never sends an Idempotency-Key: one reused here (409) is a
    // crafted request, as damaged as a forged cookie.
    let status = match e.status {
        StatusCode::UNAUTHORIZED | StatusCode::CONFLICT => StatusCode::BAD_REQUEST,
        other => other,
    };
    let mut response = error_page(state, visit, status);
    if let Some(secs) = e.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, secs.into());
    }
    response
}

/// The queue page (HTML)
///
/// Joins idempotently and sets the room cookie; shows the wait, or sends an
/// admitted visitor to the return path.
#[utoipa::path(
    get,
    path = "/queue/{room}",
    tag = "visitors",
    params(
        RoomParam,
        ("return" = Option<String>, Query, description = "A relative path on this site to go to once admitted."),
        ("lang" = Option<String>, Query, description = "The page's language (`en`, `ja`, `zh`); else `Accept-Language`."),
        ("rejoin" = Option<String>, Query, description = "Start a new ticket even if the cookie holds an ended one."),
        ("enqueue_token" = Option<String>, Query, description = "The origin's invitation to an invite-only room."),
    ),
    security((), ("ticket" = [])),
    responses(
        (status = 200, description = "The queue page, or a page saying why the ticket ended.", content_type = "text/html", body = String),
        (status = 303, description = "Admitted: to the return path (or to the page's own address without an invitation)."),
        (status = 400, description = "A bad return path or a damaged request.", content_type = "text/html", body = String),
        (status = 403, description = "The room wants a solved challenge or an invitation: the page says how.", content_type = "text/html", body = String),
        (status = 404, description = "No such room.", content_type = "text/html", body = String),
        (status = 410, description = "The room is closed.", content_type = "text/html", body = String),
        (status = 429, description = "Too many new tickets from this address.", content_type = "text/html", body = String),
        (status = 503, description = "The room is full, or the store is briefly unavailable.", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn queue(
    State(state): State<AppState>,
    visitor: Result<MaybeVisitor, ApiError>,
    Query(query): Query<QueueQuery>,
    client: ClientIp,
    headers: HeaderMap,
) -> Response {
    let room = visitor.as_ref().ok().map(|v| &v.room);
    let mut visit = visit_of(&state, room, &query, &headers);
    let MaybeVisitor { room, ticket } = match visitor {
        Ok(v) => v,
        Err(e) => return page_for_error(&state, &visit, &e),
    };
    visit.room = room.to_string();
    let Ok(return_path) = validate_return_path(query.return_path.as_deref()) else {
        return error_page(&state, &visit, StatusCode::BAD_REQUEST);
    };
    visit.return_path = return_path;
    let proof = Proof {
        enqueue_token: query.enqueue_token.clone(),
        ..Proof::default()
    };
    let entered = enter(&state, &room, ticket, &headers, client, &query, &proof).await;
    answer(&state, &visit, &room, proof.enqueue_token, entered)
}

/// The language and room a page is shown in, before anything is decided.
fn visit_of(
    state: &AppState,
    room: Option<&RoomId>,
    query: &QueueQuery,
    headers: &HeaderMap,
) -> Visit {
    let accept = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    // The room's languages, which its templates directory may add to.
    let room_name = room.map(RoomId::to_string);
    let languages = state
        .pages
        .for_room(room_name.as_deref().unwrap_or_default())
        .languages
        .clone();
    Visit {
        lang: languages.negotiate(query.lang.as_deref(), accept),
        room: String::new(),
        return_path: "/".into(),
    }
}

/// What the queue page has to show once the visitor has joined (or kept
/// their ticket); a refused join is a [`JoinRefused`].
enum Entered {
    /// The ticket in the cookie has ended, or its room closed.
    Ended(TicketStatus),
    /// Admitted: on to the return path, with a signed pass where the room
    /// gives them.
    Admitted { token: String, pass: Option<Minted> },
    /// An invitation made the ticket: back to the page without it.
    Invited { token: String },
    /// Waiting in line.
    Waiting {
        token: String,
        status: TicketStatus,
        lane: Option<String>,
        /// The opening draw's commitment, for a ticket that has no number
        /// yet.
        draw: Option<String>,
    },
}

/// Joins for the queue page and gathers what it shows. An ended ticket in
/// the cookie is shown as ended, not silently replaced: the visitor should
/// know they lost their place and why; `?rejoin=1` really starts a new one.
async fn enter(
    state: &AppState,
    room: &RoomId,
    ticket: Option<VisitorTicket>,
    headers: &HeaderMap,
    client: ClientIp,
    query: &QueueQuery,
    proof: &Proof,
) -> Result<Entered, JoinRefused> {
    let rejoin = query.rejoin.is_some();
    let joined = api::join_room(state, room, ticket, headers, client, rejoin, proof).await?;
    if !joined.status.state.is_live() || joined.status.closed {
        return Ok(Entered::Ended(joined.status));
    }
    if joined.status.state == TicketState::Admitted {
        // With a signed pass, a verifying proxy lets the visitor through
        // to the return path without asking the gate.
        let pass = super::passes::mint(state, room, joined.ticket, &joined.status).await;
        return Ok(Entered::Admitted {
            token: joined.token,
            pass,
        });
    }
    if proof.enqueue_token.is_some() {
        // The invitation did its work: the cookie holds the ticket now, and
        // the address (history, a shared screenshot) should not keep it.
        return Ok(Entered::Invited {
            token: joined.token,
        });
    }
    let before_draw = joined.status.number.is_none();
    let lane = api::lane_name(state, room, joined.status.lane).await;
    let mut draw = None;
    if before_draw && let Ok(snapshot) = state.backend.room(room).await {
        draw = snapshot.view.lottery_commitment;
    }
    Ok(Entered::Waiting {
        token: joined.token,
        status: joined.status,
        lane,
        draw,
    })
}

/// The queue page's answer to each outcome: every status, page and cookie
/// it sends after a join is chosen here.
fn answer(
    state: &AppState,
    visit: &Visit,
    room: &RoomId,
    enqueue_token: Option<String>,
    entered: Result<Entered, JoinRefused>,
) -> Response {
    let return_path = &visit.return_path;
    let rejoin_url = format!(
        "/queue/{room}?{}",
        query_string(&[
            ("return", return_path),
            ("lang", visit.lang.code()),
            ("rejoin", "1")
        ])
    );
    let entered = match entered {
        Ok(entered) => entered,
        Err(JoinRefused::Closed(_)) => return closed_page(state, visit, ClosedReason::Closed),
        Err(JoinRefused::SoldOut(_)) => return closed_page(state, visit, ClosedReason::SoldOut),
        Err(JoinRefused::Challenge(e)) => {
            let page_url = page_url(room, return_path, &visit.lang);
            return pow_page(state, visit, room, &e, page_url, enqueue_token);
        }
        Err(JoinRefused::Invitation(e)) => return invite_page(state, visit, &e),
        // The cookie's ticket names a line that was reset: said so, with
        // a way to join the new one.
        Err(JoinRefused::LineReset(_)) => {
            let page = Page::Closed(ClosedPage {
                reason: ClosedReason::Reset,
                rejoin_url: Some(rejoin_url),
            });
            return state.pages.render(StatusCode::OK, visit, &page);
        }
        Err(JoinRefused::Other(e)) => return page_for_error(state, visit, &e),
    };
    match entered {
        Entered::Ended(status) => ended_page(state, visit, &status, rejoin_url),
        Entered::Admitted { token, pass } => {
            let cookie = api::set_cookie(state, room, token);
            let mut response = ([cookie], Redirect::to(return_path)).into_response();
            if let Some(minted) = &pass {
                super::passes::set_cookie(state, room, minted, &mut response);
            }
            response
        }
        Entered::Invited { token } => {
            let cookie = api::set_cookie(state, room, token);
            let clean = page_url(room, return_path, &visit.lang);
            ([cookie], Redirect::to(&clean)).into_response()
        }
        Entered::Waiting {
            token,
            status,
            lane,
            draw,
        } => {
            let cookie = api::set_cookie(state, room, token);
            let mut page = queue_page(room, status, return_path);
            page.lane = lane;
            if state.push.is_some() && page.status.status() == crate::engine::Status::Waiting {
                page.urls.notify = Some(format!("/api/rooms/{room}/notify"));
            }
            page.draw = draw.map(|commitment| DrawLink {
                commitment,
                url: format!("/api/rooms/{room}/draw"),
            });
            let page = Page::Queue(Box::new(page));
            ([cookie], state.pages.render(StatusCode::OK, visit, &page)).into_response()
        }
    }
}

/// The page of a room that takes no one any more.
fn closed_page(state: &AppState, visit: &Visit, reason: ClosedReason) -> Response {
    let page = Page::Closed(ClosedPage {
        reason,
        rejoin_url: None,
    });
    state.pages.render(StatusCode::GONE, visit, &page)
}

/// The queue page's own address, without an enqueue token.
fn page_url(room: &RoomId, return_path: &str, lang: &Lang) -> String {
    format!(
        "/queue/{room}?{}",
        query_string(&[("return", return_path), ("lang", lang.code())])
    )
}

/// The queue page before a ticket: its script solves the challenge the
/// join was refused with, then joins.
fn pow_page(
    state: &AppState,
    visit: &Visit,
    room: &RoomId,
    refusal: &ApiError,
    page_url: String,
    enqueue_token: Option<String>,
) -> Response {
    let now = state.clock.now();
    let challenge = refusal
        .details
        .as_ref()
        .and_then(|d| d.get("challenge"))
        .and_then(|c| Some((c.get("token")?.as_str()?, c.get("difficulty")?.as_u64()?)));
    let Some((token, difficulty)) = challenge else {
        return page_for_error(state, visit, refusal);
    };
    // No ticket yet: nothing about the line to show.
    let none = TicketStatus {
        id: 0,
        state: TicketState::Waiting,
        lane: 0,
        number: None,
        position: None,
        ahead: None,
        eta: None,
        progress: 0.0,
        queue_length: 0,
        paused: false,
        closed: false,
        mode: Mode::Queue,
        stock: None,
        joined_at: now,
        admitted_at: None,
        pass_expires_at: None,
        opens_at: None,
        at: now,
    };
    let mut page = queue_page(room, none, &visit.return_path);
    page.pow = Some(PowForm {
        token: token.to_owned(),
        difficulty: u8::try_from(difficulty).unwrap_or(u8::MAX),
        join_url: format!("/api/rooms/{room}/join"),
        page_url,
        enqueue_token,
    });
    state
        .pages
        .render(StatusCode::OK, visit, &Page::Queue(Box::new(page)))
}

/// An invite-only room reached without a (valid) invitation.
fn invite_page(state: &AppState, visit: &Visit, refusal: &ApiError) -> Response {
    let t = visit.lang.strings();
    let message = if refusal.status == StatusCode::UNAUTHORIZED {
        &t.fair.invite_body
    } else {
        &t.fair.invite_invalid_body
    };
    let page = ErrorPage {
        status: StatusCode::FORBIDDEN,
        wording: Some((t.fair.invite_title.clone(), message.clone())),
    };
    state
        .pages
        .render(StatusCode::FORBIDDEN, visit, &Page::Error(page))
}

fn ended_page(
    state: &AppState,
    visit: &Visit,
    status: &TicketStatus,
    rejoin_url: String,
) -> Response {
    let reason = if status.closed && status.mode.closes() {
        ClosedReason::SoldOut
    } else if status.closed {
        ClosedReason::Closed
    } else if matches!(status.state, TicketState::Left | TicketState::Released) {
        ClosedReason::Left
    } else {
        ClosedReason::Expired
    };
    let closed = matches!(reason, ClosedReason::Closed | ClosedReason::SoldOut);
    let code = if closed {
        StatusCode::GONE
    } else {
        StatusCode::OK
    };
    let page = Page::Closed(ClosedPage {
        reason,
        rejoin_url: (!closed).then_some(rejoin_url),
    });
    state.pages.render(code, visit, &page)
}

/// How often a page without JavaScript reloads: a quarter of the expected
/// wait, between 5 s and a minute, so a long line does not hammer the site.
fn refresh_seconds(status: &TicketStatus) -> u32 {
    let quarter = status.eta.map_or(10, |e| e.expected_secs / 4);
    quarter.clamp(u64::from(pages::MIN_REFRESH_SECONDS), 60) as u32
}

fn queue_page(room: &RoomId, status: TicketStatus, return_path: &str) -> QueuePage {
    let ret = query_string(&[("return", return_path)]);
    QueuePage {
        refresh_seconds: refresh_seconds(&status),
        status,
        lane: None,
        urls: QueueUrls {
            events: format!("/api/rooms/{room}/events?{ret}"),
            status: format!("/api/rooms/{room}/status"),
            leave: format!("/api/rooms/{room}/leave"),
            receipt: format!("/api/rooms/{room}/receipt"),
            notify: None,
        },
        pow: None,
        draw: None,
    }
}
