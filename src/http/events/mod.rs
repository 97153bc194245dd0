//! The event stream a waiting visitor's page (or app) follows:
//! `position` events when something they can see changed, at the cadence
//! `rules::due` sets (a noticeable change within a second, at most one a
//! second; a small one within `rules::REFRESH_MS` while the line moves),
//! one `admitted` event, `expired`/`left`/`closed` when the ticket
//! or room ends (`closed` says why: `sold_out` or `closed`), and, after
//! `rules::REFRESH_MS` without an event, the current `position` again to
//! keep the connection open.
//!
//! Tens of thousands of these are open at once, so a stream is not a task:
//! the handler checks the request, reads the ticket once and hands the
//! stream to a shard of the stream writers (`writers`), which owns its
//! connection from then on (`connections` gives it the socket itself; on a
//! connection hyper serves, the writer feeds the response body). A stream
//! asks the store nothing when the room changes: it counts its place from
//! its room's feed on this instance (`backend::feed`), and only when the
//! line has moved far enough for its place to change noticeably, at the
//! time the cadence sets, or when something every page shows changes. Only
//! its ticket's own news (an admission, an end), which wakes it at once
//! through the ticket's signal, ahead of any wave, costs it a store read.
//!
//! An open stream holds its visitor's presence (`presence`): while it
//! lives, its ticket is reported held with the others this instance holds,
//! and when it closes the ticket is away after the room's `away_grace`
//! unless a stream comes back. A stream whose ticket was skipped while away
//! (its report came late) brings it back at once with one touching read.
//!
//! Every event carries an SSE `id:` — the count ahead it showed, for a
//! position — and the stream starts with `retry:`. A browser that
//! reconnects sends the last id back as `Last-Event-ID`: its new stream
//! never shows more people ahead than that, and it is sent its current
//! state at once, an admission it missed included.

mod encode;
mod sink;
mod stream;
mod wheel;
mod writers;

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

pub(crate) use sink::Sink;
pub(crate) use writers::{Start, Writers};

use super::error::ApiError;
use super::extract::{ReturnTo, Visitor};
use super::limits::ClientIp;
use super::openapi::{ErrorBody, RoomParam, VisitorEvent};
use super::state::AppState;
use super::ticket::VisitorTicket;
use crate::backend::feed::Follow;
use crate::engine::RoomId;
use crate::locks::lock;

/// The count ahead a reconnecting client last saw, from `Last-Event-ID`.
fn last_seen(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("last-event-id")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A stream on its way to its writer, in the response's extensions: the
/// connection that takes it first writes it (`connections` with the socket, or
/// the response body when hyper sends it).
#[derive(Clone)]
pub(crate) struct Handoff(Arc<Mutex<Option<Start>>>);

impl Handoff {
    pub(crate) fn take(&self) -> Option<Start> {
        lock(&self.0).take()
    }
}

/// Follow a ticket as Server-Sent Events
///
/// `position` events (data as the `status` answer) when the visitor
/// would notice the change, at most one a second, and smaller changes
/// every 20 s while the line moves; one `admitted` event (`{status, redirect,
/// pass_expires_at}`), or `expired`, `left` (`{status}`) or `closed`
/// (`{status, reason}`, the reason `closed` or `sold_out`), which end the
/// stream; after 20 s without an event, the current `position` again as a
/// keep-alive. Each event has an `id`
/// (the count ahead it showed): send it back as `Last-Event-ID` on
/// reconnecting.
#[utoipa::path(
    get,
    path = "/api/rooms/{room}/events",
    tag = "visitors",
    params(
        RoomParam,
        ("return" = Option<String>, Query,
         description = "A relative path on this site for the `admitted` event's `redirect`."),
        ("Last-Event-ID" = Option<String>, Header,
         description = "The `id` of the last event seen, when reconnecting."),
    ),
    security(("ticket" = [])),
    responses(
        (status = 200, description = "The stream: `position` events while waiting, then one that ends it.", content_type = "text/event-stream", body = VisitorEvent),
        (status = 400, description = "`return` is not a relative path on this site.", body = ErrorBody),
        (status = 401, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset (the room started again): join again.", body = ErrorBody),
        (status = 429, description = "Too many open streams from this address, or for this ticket.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub(crate) async fn events(
    State(state): State<AppState>,
    ReturnTo(redirect): ReturnTo,
    client: ClientIp,
    headers: HeaderMap,
    Visitor { room, ticket }: Visitor,
) -> Result<Response, ApiError> {
    let (follow, held) = open(&state, &room, &ticket, client).await?;
    // A ticket's lane is its own for life: named once.
    let lane = super::api::lane_name(&state, &room, follow.ticket.facts.lane).await;
    let stream = stream::Stream::new(
        room,
        ticket.ticket,
        follow,
        lane.as_deref(),
        redirect,
        last_seen(&headers),
    );
    Ok(stream_response(Start {
        stream,
        held,
        writers: state.writers.clone(),
    }))
}

/// Reads what a stream starts from and takes what it holds while open
/// (its place among the client's streams and, for a real ticket, its
/// presence), so that a ticket or room that does not exist, or a client
/// over its limits, is refused with a proper status before the stream
/// starts.
async fn open(
    state: &AppState,
    room: &RoomId,
    ticket: &VisitorTicket,
    client: ClientIp,
) -> Result<(Follow, Box<dyn Send + Sync>), ApiError> {
    Ok(match ticket.shadow {
        // Nothing to hold: the backend knows no such ticket.
        Some(t) => (
            super::shadow::follow(state, room, t).await?,
            Box::new(state.streams.acquire(client)?),
        ),
        None => {
            let follow = state.backend.follow(room, ticket.ticket).await?;
            let hold = state.presence.hold(room, ticket.ticket)?;
            let slot = state.streams.acquire(client)?;
            (follow, Box::new((slot, hold)))
        }
    })
}

/// The stream's response: its headers, and the stream handed on to
/// whichever writes it first (`connections` with the socket, or the
/// response body when hyper sends it).
fn stream_response(start: Start) -> Response {
    let handoff = Handoff(Arc::new(Mutex::new(Some(start))));
    let mut response =
        axum::body::Body::new(sink::StreamBody::new(handoff.clone())).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx buffers proxied responses unless told not to; a buffered event
    // stream would hold a visitor's admission back.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response.extensions_mut().insert(handoff);
    response
}
