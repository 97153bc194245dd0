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
use super::api;
use super::error::ApiError;
use super::extract::MaybeVisitor;
use super::i18n::Lang;
use super::limits::ClientIp;
use super::pages::{self, ClosedPage, ClosedReason, DrawLink, ErrorPage, PowForm, QueuePage};
use super::return_path::validate_return_path;
use super::state::AppState;
use crate::engine::rules::Mode;
use crate::engine::{RoomId, TicketState, TicketStatus, Timestamp};

#[derive(Debug, Default, Deserialize)]
pub struct QueueQuery {
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

fn error_page(lang: Lang, status: StatusCode) -> Response {
    pages::html(status, &ErrorPage::for_status(lang, status))
}

fn page_for_error(lang: Lang, e: &ApiError) -> Response {
    let status = match e.status {
        StatusCode::UNAUTHORIZED => StatusCode::BAD_REQUEST,
        other => other,
    };
    let mut response = error_page(lang, status);
    if let Some(secs) = e.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, secs.into());
    }
    response
}

/// `GET /queue/{room}?return=P&lang=L`
pub async fn queue(
    State(state): State<AppState>,
    visitor: Result<MaybeVisitor, ApiError>,
    Query(query): Query<QueueQuery>,
    client: ClientIp,
    headers: HeaderMap,
) -> Response {
    let accept = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    let lang = Lang::negotiate(query.lang.as_deref(), accept);
    let MaybeVisitor { room, ticket } = match visitor {
        Ok(v) => v,
        Err(e) => return page_for_error(lang, &e),
    };
    let Ok(return_path) = validate_return_path(query.return_path.as_deref()) else {
        return error_page(lang, StatusCode::BAD_REQUEST);
    };
    let rejoin_url = format!(
        "/queue/{room}?{}",
        query_string(&[
            ("return", &return_path),
            ("lang", lang.code()),
            ("rejoin", "1")
        ])
    );

    // An ended ticket in the cookie is shown as ended, not silently
    // replaced: the visitor should know they lost their place and why.
    // `?rejoin=1` really starts a new one.
    let rejoin = query.rejoin.is_some();
    let proof = Proof {
        enqueue_token: query.enqueue_token.clone(),
        ..Proof::default()
    };
    let joined = match api::join_room(&state, &room, ticket, &headers, client, rejoin, &proof).await
    {
        Ok(joined) => joined,
        Err(e) if e.code == "room_closed" || e.code == "sold_out" => {
            let reason = if e.code == "sold_out" {
                ClosedReason::SoldOut
            } else {
                ClosedReason::Closed
            };
            return pages::html(
                StatusCode::GONE,
                &ClosedPage {
                    lang,
                    t: lang.strings(),
                    room: room.to_string(),
                    reason,
                    rejoin_url: None,
                },
            );
        }
        Err(e) if e.code.starts_with("challenge_") => {
            let page_url = page_url(&room, &return_path, lang);
            let now = state.clock.now();
            return pow_page(
                now,
                lang,
                &room,
                &e,
                return_path,
                page_url,
                proof.enqueue_token,
            );
        }
        Err(e) if e.code.starts_with("enqueue_token_") => return invite_page(lang, &e),
        // The cookie's ticket names a line that was reset: said so, with
        // a way to join the new one.
        Err(e) if e.code == "line_reset" => {
            return pages::html(
                StatusCode::OK,
                &ClosedPage {
                    lang,
                    t: lang.strings(),
                    room: room.to_string(),
                    reason: ClosedReason::Reset,
                    rejoin_url: Some(rejoin_url),
                },
            );
        }
        Err(e) => return page_for_error(lang, &e),
    };
    if !joined.status.state.is_live() || joined.status.closed {
        return ended_page(lang, &room, &joined.status, rejoin_url);
    }
    let cookie = api::set_cookie(&state, &room, joined.token);
    if joined.status.state == TicketState::Admitted {
        return ([cookie], Redirect::to(&return_path)).into_response();
    }
    if proof.enqueue_token.is_some() {
        // The invitation did its work: the cookie holds the ticket now, and
        // the address (history, a shared screenshot) should not keep it.
        let clean = page_url(&room, &return_path, lang);
        return ([cookie], Redirect::to(&clean)).into_response();
    }
    let before_draw = joined.status.number.is_none();
    let mut page = queue_page(lang, &room, joined.status, return_path);
    if before_draw && let Ok(snapshot) = state.backend.room(&room).await {
        page.draw = snapshot.view.lottery_commitment.map(|commitment| DrawLink {
            commitment,
            url: format!("/api/rooms/{room}/draw"),
        });
    }
    ([cookie], pages::html(StatusCode::OK, &page)).into_response()
}

/// The queue page's own address, without an enqueue token.
fn page_url(room: &RoomId, return_path: &str, lang: Lang) -> String {
    format!(
        "/queue/{room}?{}",
        query_string(&[("return", return_path), ("lang", lang.code())])
    )
}

/// The queue page before a ticket: its script solves the challenge the
/// join was refused with, then joins.
fn pow_page(
    now: Timestamp,
    lang: Lang,
    room: &RoomId,
    refusal: &ApiError,
    return_path: String,
    page_url: String,
    enqueue_token: Option<String>,
) -> Response {
    let challenge = refusal
        .details
        .as_ref()
        .and_then(|d| d.get("challenge"))
        .and_then(|c| Some((c.get("token")?.as_str()?, c.get("difficulty")?.as_u64()?)));
    let Some((token, difficulty)) = challenge else {
        return page_for_error(lang, refusal);
    };
    // No ticket yet: nothing about the line to show.
    let none = TicketStatus {
        id: 0,
        state: TicketState::Waiting,
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
    let mut page = queue_page(lang, room, none, return_path);
    page.pow = Some(PowForm {
        token: token.to_owned(),
        difficulty: u8::try_from(difficulty).unwrap_or(u8::MAX),
        join_url: format!("/api/rooms/{room}/join"),
        page_url,
        enqueue_token,
    });
    pages::html(StatusCode::OK, &page)
}

/// An invite-only room reached without a (valid) invitation.
fn invite_page(lang: Lang, refusal: &ApiError) -> Response {
    let t = lang.strings();
    let message = if refusal.status == StatusCode::UNAUTHORIZED {
        t.fair.invite_body
    } else {
        t.fair.invite_invalid_body
    };
    let page = ErrorPage {
        lang,
        t,
        status: StatusCode::FORBIDDEN.as_u16(),
        title: t.fair.invite_title.into(),
        message: message.into(),
    };
    pages::html(StatusCode::FORBIDDEN, &page)
}

fn ended_page(lang: Lang, room: &RoomId, status: &TicketStatus, rejoin_url: String) -> Response {
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
    pages::html(
        code,
        &ClosedPage {
            lang,
            t: lang.strings(),
            room: room.to_string(),
            reason,
            rejoin_url: (!closed).then_some(rejoin_url),
        },
    )
}

/// How often a page without JavaScript reloads: a quarter of the expected
/// wait, between 5 s and a minute, so a long line does not hammer the site.
fn refresh_seconds(status: &TicketStatus) -> u32 {
    let quarter = status.eta.map_or(10, |e| e.expected_secs / 4);
    quarter.clamp(u64::from(pages::MIN_REFRESH_SECONDS), 60) as u32
}

fn queue_page(lang: Lang, room: &RoomId, status: TicketStatus, return_path: String) -> QueuePage {
    let ret = query_string(&[("return", &return_path)]);
    QueuePage {
        lang,
        t: lang.strings(),
        room: room.to_string(),
        refresh_seconds: refresh_seconds(&status),
        status,
        events_url: format!("/api/rooms/{room}/events?{ret}"),
        status_url: format!("/api/rooms/{room}/status"),
        leave_url: format!("/api/rooms/{room}/leave"),
        return_path,
        pow: None,
        draw: None,
    }
}
