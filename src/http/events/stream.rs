//! One event stream between looks: what its visitor was last shown and
//! when, what it waits for, and the store reads its ticket's own news
//! costs. It has no task of its own: its shard (`writers`) calls
//! [`Stream::look`] when the line has moved far enough for its place to
//! change noticeably, at the time its cadence sets, or when something
//! every page shows changes, and [`Stream::poll_news`] when its ticket's
//! signal fires. What to send, and when, is the engine's cadence rule
//! (`rules::due`); this only carries it out and writes the bytes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::encode::{self, Tail};
use crate::backend::feed::{Follow, LineMoves, RoomFeed, TicketRead, Tracker};
use crate::backend::{Armed, Backend, BackendError, TicketRef, TicketSignal};
use crate::engine::rules;
use crate::engine::{RoomId, Status, TicketState, TicketStatus};

/// Never, for a stream's time or count.
pub(crate) const NEVER: u64 = u64::MAX;

type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pub(crate) struct Stream {
    pub room: RoomId,
    ticket: TicketRef,
    pub feed: Arc<dyn RoomFeed>,
    signal: TicketSignal,
    armed: Armed,
    tracker: Tracker,
    pub lane: u8,
    /// `"lane":"<name>",`, for a room with lanes.
    lane_field: Option<Box<[u8]>>,
    redirect: Option<Box<str>>,
    /// What the visitor was last shown, and when (the engine's clock).
    shown: Option<Box<TicketStatus>>,
    last_sent: Option<u64>,
    /// Look again once the lane's line, as copy `copy` counts it, has
    /// moved as far as `moves_at`; or at `at_ms`.
    copy: u64,
    moves_at: u64,
    pub at_ms: u64,
    /// The store read its signal asked for, in flight.
    reading: Option<Pending<Result<TicketRead, BackendError>>>,
    /// Bringing back a ticket skipped while this stream was open.
    recovering: Option<Pending<Option<TicketRead>>>,
}

/// What a look or a piece of news came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// Go on waiting (any bytes to send are in the buffer).
    Wait,
    /// The stream is over once the buffer is sent.
    End,
}

impl Stream {
    pub(crate) fn new(
        room: RoomId,
        ticket: TicketRef,
        follow: Follow,
        lane_name: Option<&str>,
        redirect: Option<String>,
        last_seen: Option<u64>,
    ) -> Self {
        let Follow {
            feed,
            signal,
            armed,
            ticket: read,
        } = follow;
        let lane = read.facts.lane;
        let mut tracker = Tracker::new(read);
        if let Some(ahead) = last_seen {
            tracker.seen(ahead);
        }
        Self {
            room,
            ticket,
            feed,
            signal,
            armed,
            tracker,
            lane,
            lane_field: encode::lane_field(lane_name),
            redirect: redirect.map(String::into_boxed_str),
            shown: None,
            last_sent: None,
            copy: 0,
            moves_at: 0,
            at_ms: NEVER,
            reading: None,
            recovering: None,
        }
    }

    /// Whether the line has moved as far as this stream waits for, or
    /// another copy of the room counts it now.
    pub(crate) fn moved_enough(&self, moved: LineMoves) -> bool {
        moved.copy != self.copy || moved.count >= self.moves_at
    }

    /// Its ticket's own news: when the signal fires, read the ticket from
    /// the store (listening for the next news already). `Some` when there
    /// is something new to look at, with the end of the stream written
    /// to `out` if the ticket or its line is gone.
    pub(crate) fn poll_news(
        &mut self,
        cx: &mut Context<'_>,
        backend: &Arc<dyn Backend>,
        out: &mut Vec<u8>,
    ) -> Option<Look> {
        let mut news = None;
        if self.armed.as_mut().poll(cx).is_ready() {
            self.armed = self.signal.arm();
            // The signal may fire again at once; polling registers it.
            let _ = self.armed.as_mut().poll(cx);
            let (backend, room, ticket) = (backend.clone(), self.room.clone(), self.ticket);
            self.reading = Some(Box::pin(
                async move { backend.read_ticket(&room, ticket).await },
            ));
        }
        if let Some(reading) = &mut self.reading
            && let Poll::Ready(read) = reading.as_mut().poll(cx)
        {
            self.reading = None;
            match read {
                Ok(read) => {
                    self.tracker.update(read);
                    news = Some(Look::Wait);
                }
                Err(BackendError::NoSuchTicket | BackendError::NoSuchRoom(_)) => {
                    encode::ending(out, Status::Expired);
                    return Some(Look::End);
                }
                Err(BackendError::LineReset) => {
                    encode::reset(out);
                    return Some(Look::End);
                }
                // The store is briefly away: the next wave (or signal)
                // tries again.
                Err(_) => {}
            }
        }
        if let Some(recovering) = &mut self.recovering
            && let Poll::Ready(read) = recovering.as_mut().poll(cx)
        {
            self.recovering = None;
            if let Some(read) = read {
                self.tracker.update(read);
            }
            news = Some(Look::Wait);
        }
        news
    }

    /// Whether a touching read to bring the ticket back is under way.
    pub(crate) fn recovering(&self) -> bool {
        self.recovering.is_some()
    }

    /// A stream silent for a whole keep-alive period: its current figures
    /// keep the connection open, as a `position` event, whether or not
    /// they changed. `false` when it does not wait (its end is on the way
    /// through its signal): a comment does.
    pub(crate) fn keep_alive(&mut self, now: u64, out: &mut Vec<u8>, tail: &mut Tail) -> bool {
        let status = self.tracker.status(&*self.feed, now);
        if status.closed || status.status() != Status::Waiting {
            return false;
        }
        encode::position(out, &status, self.lane_field.as_deref(), tail);
        self.shown = Some(Box::new(status));
        self.last_sent = Some(now);
        true
    }

    /// Count the place from the feed and write what the cadence rule says
    /// is due into `out`; then note what to wait for. `recover`: bring
    /// back a ticket skipped while its stream was open (not again right
    /// after a try that did not).
    pub(crate) fn look(
        &mut self,
        now: u64,
        out: &mut Vec<u8>,
        tail: &mut Tail,
        backend: &Arc<dyn Backend>,
        recover: bool,
    ) -> Look {
        if recover && self.tracker.state() == TicketState::Away && self.recovering.is_none() {
            // Skipped while this stream was open (its report was late):
            // the visitor is plainly here, so back in line now, with one
            // touching read; its end wakes the stream.
            let (backend, room, ticket) = (backend.clone(), self.room.clone(), self.ticket);
            self.recovering = Some(Box::pin(async move {
                match backend.status(&room, ticket, true).await {
                    Ok(s) if s.state == TicketState::Waiting => {
                        backend.read_ticket(&room, ticket).await.ok()
                    }
                    _ => None,
                }
            }));
        }
        // How far the line had moved when a count was made: read first, so
        // the count is at least as new.
        let mut moved = self.feed.moves(self.lane);
        // A change between a look and its wait would be missed: look
        // again (a few times at most) while the line moved meanwhile.
        for _ in 0..3 {
            let status = self.tracker.status(&*self.feed, now);
            let first = self.last_sent.is_none();
            let start = out.len();
            if first {
                encode::retry(out);
            }
            if encode::final_event(out, &status, self.redirect.as_deref()) {
                return Look::End;
            }
            debug_assert!(self.tracker.state().is_queued());
            let due = match (&self.shown, self.last_sent) {
                (Some(shown), Some(sent_at)) => rules::due(shown, sent_at, &status),
                _ => rules::Due::At(now),
            };
            let look_at = match due {
                rules::Due::At(at) if at <= now => {
                    encode::position(out, &status, self.lane_field.as_deref(), tail);
                    self.shown = Some(Box::new(status.clone()));
                    self.last_sent = Some(now);
                    now + rules::REFRESH_MS
                }
                rules::Due::At(at) => {
                    out.truncate(start);
                    at
                }
                // Nothing new to show: look again a refresh from now, for
                // small changes no wave announces (the line's length).
                rules::Due::Never => {
                    out.truncate(start);
                    now + rules::REFRESH_MS
                }
            };
            // Look again when the line has moved enough for the place
            // shown to change noticeably (not while the one-second gap
            // holds a noticeable change back), or at the time due.
            let throttled =
                matches!(due, rules::Due::At(at) if at > now && at <= now + rules::MIN_GAP_MS);
            let needed = match (&self.shown, status.position) {
                (Some(shown), Some(place)) if !throttled => {
                    shown.position.map(|was| rules::moves_needed(was, place))
                }
                _ => None,
            };
            self.copy = moved.copy;
            self.moves_at = needed.map_or(NEVER, |n| moved.count.saturating_add(n.max(1)));
            self.at_ms = look_at;
            let since = self.feed.moves(self.lane);
            if !self.moved_enough(since) {
                break;
            }
            moved = since;
        }
        Look::Wait
    }
}
