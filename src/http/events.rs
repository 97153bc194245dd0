//! The event stream a waiting visitor's page (or app) follows:
//! `position` events when something they can see changed (at most one a
//! second), one `admitted` event, `expired`/`left`/`closed` when the ticket
//! or room ends, and keep-alive comments.
//!
//! Tens of thousands of these are open at once, so a stream owns no timer
//! and polls nothing on its own: it sleeps until its ticket's signal fires
//! (an admission by hand-off reaches it at once, ahead of any broadcast),
//! the room view changes (after a tick; relayed a group of streams at a
//! time by `fanout`), or the shared heartbeat ticks. Each wake costs one
//! status read, which also counts as the visitor's activity, so an open
//! page keeps its place (the heartbeat wakes every stream, so that holds
//! however quiet the room).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName};
use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;

use super::api::{StatusBody, now_ms, rfc3339};
use super::error::ApiError;
use super::fanout::Subscription;
use super::limits::{ClientIp, StreamSlot};
use super::return_path::validate_return_path;
use super::room_id;
use super::state::AppState;
use super::ticket;
use crate::backend::{BackendError, TicketRef};
use crate::engine::{RoomId, TicketState};

/// At most one `position` event a second per stream.
const POSITION_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Default, Deserialize)]
pub struct EventsQuery {
    /// Where the page goes once admitted; echoed in the `admitted` event.
    #[serde(rename = "return")]
    return_path: Option<String>,
}

/// `GET /api/rooms/{room}/events`
pub async fn events(
    State(state): State<AppState>,
    Path(room): Path<String>,
    Query(query): Query<EventsQuery>,
    client: ClientIp,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let room = room_id(&room)?;
    let redirect = match query.return_path.as_deref() {
        None => None,
        Some(raw) => Some(validate_return_path(Some(raw))?),
    };
    let visitor = ticket::require(&state, &room, &headers)?;
    // Fail before the stream starts, with a proper status, for a ticket or
    // room that does not exist.
    state.backend.status(&room, visitor.ticket, true).await?;
    let slot = state.streams.acquire(client)?;
    // nginx buffers proxied responses unless told not to; a buffered event
    // stream would hold a visitor's admission back.
    Ok((
        [(HeaderName::from_static("x-accel-buffering"), "no")],
        Sse::new(stream(state, room, visitor.ticket, redirect, slot)),
    ))
}

/// What the visitor last saw, to send only changes.
#[derive(PartialEq)]
struct Shown {
    position: Option<u64>,
    eta: Option<(Option<u64>, Option<u64>)>,
    queue_length: u64,
    paused: bool,
}

fn stream(
    state: AppState,
    room: RoomId,
    ticket: TicketRef,
    redirect: Option<String>,
    slot: StreamSlot,
) -> impl Stream<Item = Result<Event, Infallible>> {
    async_stream::stream! {
        // Held for as long as the stream lives.
        let _slot = slot;
        let backend = state.backend.clone();
        let (subscription, signal) = match (
            state.fanout.subscribe(&backend, &room).await,
            backend.watch_ticket(&room, ticket).await,
        ) {
            (Ok(v), Ok(s)) => (v, s),
            _ => return,
        };
        let Subscription { waves: mut view, mut pending } = subscription;
        let mut heartbeat = state.heartbeat.clone();
        let mut shown: Option<Shown> = None;
        let mut last_sent: Option<Instant> = None;
        loop {
            let woken = signal.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // The view version this status read reflects.
            let seen = *view.borrow_and_update();

            let status = match backend.status(&room, ticket, true).await {
                Ok(status) => status,
                Err(BackendError::NoSuchTicket | BackendError::NoSuchRoom(_)) => {
                    yield Ok(Event::default().event("expired").data(r#"{"status":"expired"}"#));
                    return;
                }
                Err(_) => {
                    // The state store is briefly away: keep the stream and
                    // try again on the next wake (its own signal included,
                    // so a hand-off is not left for the heartbeat). The
                    // relay's wave is done with, so its group goes on.
                    pending.handled();
                    tokio::select! {
                        () = &mut woken => continue,
                        _ = heartbeat.changed() => continue,
                        () = state.shutdown.cancelled() => return,
                    }
                }
            };
            if status.closed {
                yield Ok(Event::default().event("closed").data(r#"{"status":"closed"}"#));
                return;
            }
            match status.state {
                TicketState::Admitted => {
                    let data = json!({
                        "status": "admitted",
                        "redirect": redirect,
                        "pass_expires_at": status.pass_expires_at.map(rfc3339),
                    });
                    yield Ok(Event::default().event("admitted").data(data.to_string()));
                    return;
                }
                TicketState::Waiting => {}
                _ => {
                    let body = StatusBody::new(&status, now_ms());
                    let name = if body.status == "left" { "left" } else { "expired" };
                    let data = json!({ "status": body.status });
                    yield Ok(Event::default().event(name).data(data.to_string()));
                    return;
                }
            }

            let now_shown = Shown {
                position: status.position,
                eta: status.eta.map(|e| (Some(e.low_secs), Some(e.high_secs))),
                queue_length: status.queue_length,
                paused: status.paused,
            };
            let mut held_back = false;
            if shown.as_ref() != Some(&now_shown) {
                match last_sent {
                    Some(at) if at.elapsed() < POSITION_INTERVAL => held_back = true,
                    _ => {
                        let body = StatusBody::new(&status, now_ms());
                        let data = serde_json::to_string(&body).unwrap_or_default();
                        yield Ok(Event::default().event("position").data(data));
                        shown = Some(now_shown);
                        last_sent = Some(Instant::now());
                    }
                }
            }
            pending.set(held_back);
            pending.handled();

            // Wait for something worth a status read.
            loop {
                tokio::select! {
                    biased;
                    () = state.shutdown.cancelled() => return,
                    () = &mut woken => break,
                    changed = view.changed() => {
                        if changed.is_err() {
                            // The room was replaced or the backend is going away.
                            yield Ok(Event::default().event("closed").data(r#"{"status":"closed"}"#));
                            return;
                        }
                        // Every wave is acknowledged: after the status read
                        // it leads to, or at once when there is none.
                        pending.owe();
                        let due = last_sent.is_none_or(|at| at.elapsed() >= POSITION_INTERVAL);
                        if *view.borrow_and_update() != seen {
                            // A new view: read it now if allowed to send,
                            // else on a retry wave once allowed.
                            if due {
                                break;
                            }
                            pending.set(true);
                        } else if pending.is_set() && due {
                            // A retry wave, and this stream has a change
                            // to show.
                            break;
                        }
                        // Nothing to do for this wave.
                        pending.handled();
                    }
                    _ = heartbeat.changed() => {
                        yield Ok(Event::default().comment("keep-alive"));
                        break;
                    }
                }
            }
        }
    }
}
