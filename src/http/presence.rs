//! Presence from the connection: the event streams this instance holds
//! keep their tickets' visitors present, renewed a room at a time in one
//! batched call per period, never a write per stream or per wake.
//!
//! A stream takes a [`StreamHold`] for its ticket when it opens and drops
//! it when the connection ends. The registry counts holds per ticket (which
//! is also where the per-ticket stream cap is kept: a visitor's tabs, not
//! an address shared by a whole carrier-grade NAT) and, for each room, runs
//! `Backend::renew` with every ticket it holds once per
//! `rules::renew_every(away_grace)`. A room with a new stream is renewed
//! within [`FRESH`], so a visitor coming back from away (or reconnecting
//! after an instance died) is back in line at once. A ticket whose last
//! stream here closed is renewed one last time, so its `away_grace` counts
//! from the close. An instance that dies renews nothing more: its streams'
//! tickets go away one grace after its last renewal, unless their browsers
//! reconnect elsewhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use crate::backend::{Backend, TicketRef};
use crate::engine::RoomId;
use crate::engine::rules;
use crate::sync::lock;

/// A room with a new stream is renewed within this.
pub const FRESH: Duration = Duration::from_millis(500);
/// How often the registry looks for rooms due.
const LOOK: Duration = Duration::from_millis(250);

/// The streams this instance holds, per room and ticket.
#[derive(Debug)]
pub struct Presence {
    rooms: Mutex<HashMap<RoomId, RoomStreams>>,
    /// Streams per ticket; 0 = no limit.
    per_ticket: u32,
}

#[derive(Debug)]
struct RoomStreams {
    open: HashMap<TicketRef, u32>,
    /// Tickets whose last stream here closed since the last renewal.
    closed: Vec<TicketRef>,
    /// When this room's next renewal is due.
    due: Instant,
    every: Duration,
}

/// One open stream's hold on its ticket's presence; dropping it (the
/// connection ended) lets the ticket go away after the grace.
#[derive(Debug)]
pub struct StreamHold {
    presence: Arc<Presence>,
    room: RoomId,
    ticket: TicketRef,
}

impl Presence {
    pub fn new(per_ticket: u32) -> Arc<Self> {
        Arc::new(Self {
            rooms: Mutex::new(HashMap::new()),
            per_ticket,
        })
    }

    /// Hold a ticket's presence for one more stream, if its cap allows.
    pub fn hold(
        self: &Arc<Self>,
        room: &RoomId,
        ticket: TicketRef,
    ) -> Result<StreamHold, ApiError> {
        let mut rooms = lock(&self.rooms);
        let now = Instant::now();
        let streams = rooms.entry(room.clone()).or_insert_with(|| RoomStreams {
            open: HashMap::new(),
            closed: Vec::new(),
            due: now + FRESH,
            every: rules::renew_every(crate::engine::RoomSettings::DEFAULT_AWAY_GRACE),
        });
        let count = streams.open.entry(ticket).or_insert(0);
        if self.per_ticket > 0 && *count >= self.per_ticket {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "This ticket already has {} event streams open; close one (another tab) first.",
                    self.per_ticket
                ),
            )
            .retry_after(5));
        }
        *count += 1;
        streams.due = streams.due.min(now + FRESH);
        Ok(StreamHold {
            presence: self.clone(),
            room: room.clone(),
            ticket,
        })
    }

    /// Streams open here for a ticket.
    pub fn streams(&self, room: &RoomId, ticket: TicketRef) -> u32 {
        lock(&self.rooms)
            .get(room)
            .and_then(|r| r.open.get(&ticket).copied())
            .unwrap_or(0)
    }

    /// Tickets whose presence this instance holds now.
    pub fn held(&self) -> usize {
        lock(&self.rooms).values().map(|r| r.open.len()).sum()
    }

    fn release(&self, room: &RoomId, ticket: TicketRef) {
        let mut rooms = lock(&self.rooms);
        let Some(streams) = rooms.get_mut(room) else {
            return;
        };
        if let Some(count) = streams.open.get_mut(&ticket) {
            *count -= 1;
            if *count == 0 {
                streams.open.remove(&ticket);
                streams.closed.push(ticket);
            }
        }
    }

    /// The rooms due now, each with the tickets to renew; rooms left with
    /// nothing to renew are forgotten.
    fn take_due(&self, now: Instant) -> Vec<(RoomId, Vec<TicketRef>)> {
        let mut rooms = lock(&self.rooms);
        rooms.retain(|_, r| !r.open.is_empty() || !r.closed.is_empty());
        let mut due = Vec::new();
        for (room, streams) in rooms.iter_mut() {
            if streams.due > now {
                continue;
            }
            let mut tickets: Vec<TicketRef> = streams.open.keys().copied().collect();
            tickets.append(&mut streams.closed);
            streams.due = now + streams.every;
            due.push((room.clone(), tickets));
        }
        due
    }

    fn renewed(&self, room: &RoomId, away_grace: Duration, at: Instant) {
        if let Some(streams) = lock(&self.rooms).get_mut(room) {
            streams.every = rules::renew_every(away_grace);
            streams.due = streams.due.min(at + streams.every);
        }
    }

    /// Renew what is due until `stop`: one `Backend::renew` per room due,
    /// the rooms side by side.
    pub async fn run(self: Arc<Self>, backend: Arc<dyn Backend>, stop: CancellationToken) {
        let mut look = tokio::time::interval(LOOK);
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = look.tick() => {}
            }
            let now = Instant::now();
            let due = self.take_due(now);
            let renewals = due.into_iter().map(|(room, tickets)| {
                let backend = backend.clone();
                async move {
                    let answer = backend.renew(&room, &tickets).await;
                    (room, answer)
                }
            });
            for (room, answer) in futures_util::future::join_all(renewals).await {
                match answer {
                    Ok(grace) => self.renewed(&room, grace, now),
                    // The next period tries again; the grace covers a miss.
                    Err(e) => tracing::debug!(room = %room, error = %e, "presence renewal failed"),
                }
            }
        }
    }
}

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.presence.release(&self.room, self.ticket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(id: u64) -> TicketRef {
        TicketRef { epoch: 1, id }
    }

    #[test]
    fn streams_are_capped_per_ticket_not_per_address() {
        let p = Presence::new(2);
        let room = RoomId::new("r").unwrap();
        let a = p.hold(&room, ticket(1)).unwrap();
        let b = p.hold(&room, ticket(1)).unwrap();
        assert_eq!(p.hold(&room, ticket(1)).unwrap_err().status, 429);
        // Another visitor (behind the same address or not) is not limited.
        let c = p.hold(&room, ticket(2)).unwrap();
        drop(a);
        assert_eq!(p.streams(&room, ticket(1)), 1);
        let _a = p.hold(&room, ticket(1)).unwrap();
        drop((b, c));
        assert_eq!(p.held(), 1);
    }

    #[test]
    fn a_closed_ticket_is_renewed_once_more_then_forgotten() {
        let p = Presence::new(0);
        let room = RoomId::new("r").unwrap();
        let a = p.hold(&room, ticket(1)).unwrap();
        let _b = p.hold(&room, ticket(2)).unwrap();
        let start = Instant::now();
        // Nothing is due before the fresh window.
        assert!(p.take_due(start).is_empty());
        let due = p.take_due(start + FRESH);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1.len(), 2);
        drop(a);
        let later = start + FRESH + Duration::from_secs(60);
        let mut due = p.take_due(later);
        let mut tickets = due.pop().unwrap().1;
        tickets.sort_by_key(|t| t.id);
        assert_eq!(tickets, [ticket(1), ticket(2)]);
        // Ticket 1 is no longer renewed.
        let due = p.take_due(later + Duration::from_secs(60));
        assert_eq!(due[0].1, [ticket(2)]);
    }
}
