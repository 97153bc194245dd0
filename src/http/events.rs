//! The event stream a waiting visitor's page (or app) follows:
//! `position` events when something they can see changed, at the cadence
//! `rules::due` sets (a noticeable change within a second, at most one a
//! second; a small one within `rules::REFRESH_MS` while the line moves),
//! one `admitted` event, `expired`/`left`/`closed` when the ticket
//! or room ends (`closed` says why: `sold_out` or `closed`), and keep-alive
//! comments.
//!
//! Tens of thousands of these are open at once, so a stream asks the store
//! nothing when the room changes: it reads its ticket once when it opens,
//! then counts its place from its room's feed on this instance
//! (`backend::feed`) when its room's relay (`fanout`) wakes it: once the
//! line has moved far enough for its place to change noticeably, at the
//! time the cadence sets, or when something every page shows changes.
//! Only its ticket's own news (an admission, an end),
//! which wakes it at once through the ticket's signal, ahead of any wave,
//! costs it a store read. Keep-alive comments are the connection's: a timer
//! per response, reset by every event, so an idle room wakes no stream.
//!
//! An open stream holds its visitor's presence (`presence`): while it
//! lives, its ticket is renewed with the others this instance holds, and
//! when it closes the ticket is away after the room's `away_grace` unless
//! a stream comes back. A stream whose ticket was skipped while away (its
//! renewal came late) brings it back at once with one touching read.
//!
//! Every event carries an SSE `id:` — the count ahead it showed, for a
//! position — and the stream starts with `retry:`. A browser that
//! reconnects sends the last id back as `Last-Event-ID`: its new stream
//! never shows more people ahead than that, and it is sent its current
//! state at once, an admission it missed included.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName};
use axum::response::IntoResponse;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;

use super::error::ApiError;
use super::extract::{ReturnTo, Visitor};
use super::limits::{ClientIp, StreamSlot};
use super::openapi::{ErrorBody, RoomParam};
use super::presence::StreamHold;
use super::state::AppState;
use crate::backend::feed::{Follow, Tracker};
use crate::backend::{BackendError, TicketRef};
use crate::engine::rules;
use crate::engine::{RoomId, Status, StatusBody, TicketState, TicketStatus, Timestamp};

/// What a browser waits before reconnecting a dropped stream.
const RETRY: Duration = Duration::from_secs(3);
/// The `id:` of an event that ends the stream.
const END_ID: &str = "end";

/// The `admitted` event.
#[derive(Serialize)]
struct Admitted<'a> {
    status: Status,
    redirect: Option<&'a str>,
    pass_expires_at: Option<Timestamp>,
}

/// An event that ends the stream: `{"status": ...}`.
fn ending(status: Status) -> Event {
    Event::default()
        .event(status.name())
        .id(END_ID)
        .data(format!(r#"{{"status":"{}"}}"#, status.name()))
}

/// The event that ends a stream whose line was reset (its ticket names
/// an incarnation of the room that is gone).
fn reset_event() -> Event {
    Event::default()
        .event("reset")
        .id(END_ID)
        .data(r#"{"status":"reset"}"#)
}

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

/// The `closed` event: `{"status": "closed", "reason": "sold_out"}`, or
/// `"closed"` for a room an operator closed or replaced.
fn closed(reason: &str) -> Event {
    Event::default()
        .event(Status::Closed.name())
        .id(END_ID)
        .data(format!(r#"{{"status":"closed","reason":"{reason}"}}"#))
}

/// Follow a ticket as Server-Sent Events
///
/// `position` events (data as the `status` answer) when the visitor
/// would notice the change, at most one a second, and smaller changes
/// every 20 s while the line moves; one `admitted` event (`{status, redirect,
/// pass_expires_at}`), or `expired`, `left` (`{status}`) or `closed`
/// (`{status, reason}`, the reason `closed` or `sold_out`), which end the
/// stream; keep-alive comments in between. Each event has an `id`
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
        (status = 200, description = "The stream.", content_type = "text/event-stream", body = String),
        (status = 400, description = "`return` is not a relative path on this site.", body = ErrorBody),
        (status = 401, description = "No ticket, a damaged one, or one of another room.", body = ErrorBody),
        (status = 404, description = "No such room.", body = ErrorBody),
        (status = 410, description = "The line this ticket stood in was reset (the room started again): join again.", body = ErrorBody),
        (status = 429, description = "Too many open streams from this address, or for this ticket.", body = ErrorBody),
        (status = 503, description = "The store is briefly unavailable.", body = ErrorBody),
    ),
)]
pub async fn events(
    State(state): State<AppState>,
    ReturnTo(redirect): ReturnTo,
    client: ClientIp,
    headers: HeaderMap,
    Visitor { room, ticket }: Visitor,
) -> Result<impl IntoResponse, ApiError> {
    // Fail before the stream starts, with a proper status, for a ticket or
    // room that does not exist; the stream starts from what this read.
    let follow = state.backend.follow(&room, ticket.ticket).await?;
    let hold = state.presence.hold(&room, ticket.ticket)?;
    let slot = state.streams.acquire(client)?;
    let keep_alive = KeepAlive::new()
        .interval(state.settings.keep_alive)
        .text("keep-alive");
    let events = stream(
        state,
        room,
        ticket.ticket,
        Opened {
            follow,
            redirect,
            slot,
            hold,
            last_seen: last_seen(&headers),
        },
    );
    // nginx buffers proxied responses unless told not to; a buffered event
    // stream would hold a visitor's admission back.
    Ok((
        [(HeaderName::from_static("x-accel-buffering"), "no")],
        Sse::new(events).keep_alive(keep_alive),
    ))
}

/// What a stream starts from.
struct Opened {
    follow: Follow,
    redirect: Option<String>,
    /// Held for as long as the stream lives.
    slot: StreamSlot,
    /// The ticket's presence, held for as long as the stream lives.
    hold: StreamHold,
    last_seen: Option<u64>,
}

/// The event for a status that ends the stream, if it does.
fn final_event(status: &TicketStatus, redirect: Option<&str>) -> Option<Event> {
    if status.closed {
        return Some(closed(status.closed_reason()));
    }
    match status.status() {
        Status::Waiting => None,
        Status::Admitted => {
            let data = Admitted {
                status: Status::Admitted,
                redirect,
                pass_expires_at: status.pass_expires_at,
            };
            let data = serde_json::to_string(&data).unwrap_or_default();
            Some(Event::default().event("admitted").id(END_ID).data(data))
        }
        ended => Some(ending(ended)),
    }
}

fn position(status: &TicketStatus, lane: Option<&str>) -> Event {
    let data = serde_json::to_string(&StatusBody::named(status, lane)).unwrap_or_default();
    let event = Event::default().event("position").data(data);
    match status.ahead {
        Some(ahead) => event.id(ahead.to_string()),
        None => event,
    }
}

fn stream(
    state: AppState,
    room: RoomId,
    ticket: TicketRef,
    opened: Opened,
) -> impl Stream<Item = Result<Event, Infallible>> {
    async_stream::stream! {
        let Opened { follow, redirect, slot, hold, last_seen } = opened;
        let _held = (slot, hold);
        let backend = state.backend.clone();
        // `woken` was armed before the ticket was read, and is re-armed
        // before every later read: a change between a read and the wait
        // still wakes the stream.
        let Follow { feed, signal, armed: mut woken, ticket: read } = follow;
        let lane_code = read.facts.lane;
        let waves = state.fanout.subscribe(&room, feed.clone(), lane_code, state.clock.clone());
        // A ticket's lane is its own for life: named once.
        let lane = super::api::lane_name(&state, &room, lane_code).await;
        let mut tracker = Tracker::new(read);
        if let Some(ahead) = last_seen {
            tracker.seen(ahead);
        }
        // What the visitor last saw and when, to send only what the
        // cadence rule says; the first event goes at once, with the
        // reconnection delay.
        let mut shown: Option<TicketStatus> = None;
        let mut last_sent: Option<u64> = None;
        loop {
            if tracker.state() == TicketState::Away {
                // Skipped while this stream was open (its report was
                // late): the visitor is plainly here, so back in line now.
                if let Ok(status) = backend.status(&room, ticket, true).await
                    && status.state == TicketState::Waiting
                    && let Ok(read) = backend.read_ticket(&room, ticket).await
                {
                    tracker.update(read);
                }
            }
            // How far the line had moved when this count was made: read
            // first, so the count is at least as new.
            let moved = feed.moves(lane_code);
            let now = state.clock.now_ms();
            let status = tracker.status(&*feed, now);
            if let Some(end) = final_event(&status, redirect.as_deref()) {
                yield Ok(if last_sent.is_none() { end.retry(RETRY) } else { end });
                return;
            }
            debug_assert!(tracker.state().is_queued());

            let due = match (&shown, last_sent) {
                (Some(shown), Some(sent_at)) => rules::due(shown, sent_at, &status),
                _ => rules::Due::At(now),
            };
            let look_at = match due {
                rules::Due::At(at) if at <= now => {
                    let event = position(&status, lane.as_deref());
                    yield Ok(if last_sent.is_none() { event.retry(RETRY) } else { event });
                    shown = Some(status.clone());
                    last_sent = Some(now);
                    Some(now + rules::REFRESH_MS)
                }
                rules::Due::At(at) => Some(at),
                // Nothing new to show: look again a refresh from now, for
                // small changes no wave announces (the line's length).
                rules::Due::Never => Some(now + rules::REFRESH_MS),
            };
            // Look again when the line has moved enough for the place
            // shown to change noticeably (not while the one-second gap
            // holds a noticeable change back), or at the time due.
            let throttled = matches!(due, rules::Due::At(at) if at > now && at <= now + rules::MIN_GAP_MS);
            let needed = match (&shown, status.position) {
                (Some(shown), Some(place)) if !throttled => {
                    shown.position.map(|was| rules::moves_needed(was, place))
                }
                _ => None,
            };
            waves.wake_when(moved, needed, look_at);
            waves.handled();
            if waves.due_now(feed.moves(lane_code)) {
                continue;
            }

            // Wait for something worth counting again.
            tokio::select! {
                biased;
                () = state.shutdown.cancelled() => return,
                () = &mut woken => {
                    // The ticket's own news: read it from the store,
                    // listening for the next already.
                    woken = signal.arm();
                    match backend.read_ticket(&room, ticket).await {
                        Ok(read) => tracker.update(read),
                        Err(BackendError::NoSuchTicket | BackendError::NoSuchRoom(_)) => {
                            yield Ok(ending(Status::Expired));
                            return;
                        }
                        Err(BackendError::LineReset) => {
                            yield Ok(reset_event());
                            return;
                        }
                        // The store is briefly away: the next wave (or
                        // signal) tries again.
                        Err(_) => {}
                    }
                }
                live = waves.woken() => {
                    if !live {
                        // The room was replaced or the backend is going away.
                        yield Ok(closed("closed"));
                        return;
                    }
                }
            }
        }
    }
}
