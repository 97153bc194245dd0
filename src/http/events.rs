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

use axum::extract::State;
use axum::http::HeaderName;
use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use futures_util::Stream;
use serde::Serialize;
use tokio::time::Instant;

use super::error::ApiError;
use super::extract::{ReturnTo, Visitor};
use super::fanout::Subscription;
use super::limits::{ClientIp, StreamSlot};
use super::state::AppState;
use crate::backend::{BackendError, TicketRef};
use crate::engine::{RoomId, Status, TicketState, TicketStatus, Timestamp};

/// At most one `position` event a second per stream.
const POSITION_INTERVAL: Duration = Duration::from_secs(1);

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
        .data(format!(r#"{{"status":"{}"}}"#, status.name()))
}

/// `GET /api/rooms/{room}/events?return=P`
pub async fn events(
    State(state): State<AppState>,
    ReturnTo(redirect): ReturnTo,
    client: ClientIp,
    Visitor { room, ticket }: Visitor,
) -> Result<impl IntoResponse, ApiError> {
    // Fail before the stream starts, with a proper status, for a ticket or
    // room that does not exist.
    state.backend.status(&room, ticket.ticket, true).await?;
    let slot = state.streams.acquire(client)?;
    // nginx buffers proxied responses unless told not to; a buffered event
    // stream would hold a visitor's admission back.
    Ok((
        [(HeaderName::from_static("x-accel-buffering"), "no")],
        Sse::new(stream(state, room, ticket.ticket, redirect, slot)),
    ))
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
        // What the visitor last saw, to send only changes.
        let mut shown: Option<TicketStatus> = None;
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
                    yield Ok(ending(Status::Expired));
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
                yield Ok(ending(Status::Closed));
                return;
            }
            match status.status() {
                Status::Admitted => {
                    let data = Admitted {
                        status: Status::Admitted,
                        redirect: redirect.as_deref(),
                        pass_expires_at: status.pass_expires_at,
                    };
                    let data = serde_json::to_string(&data).unwrap_or_default();
                    yield Ok(Event::default().event("admitted").data(data));
                    return;
                }
                Status::Waiting => {}
                ended => {
                    yield Ok(ending(ended));
                    return;
                }
            }
            debug_assert_eq!(status.state, TicketState::Waiting);

            let mut held_back = false;
            if !shown.as_ref().is_some_and(|s| s.shows_same_as(&status)) {
                match last_sent {
                    Some(at) if at.elapsed() < POSITION_INTERVAL => held_back = true,
                    _ => {
                        let data = serde_json::to_string(&status).unwrap_or_default();
                        yield Ok(Event::default().event("position").data(data));
                        shown = Some(status);
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
                            yield Ok(ending(Status::Closed));
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
