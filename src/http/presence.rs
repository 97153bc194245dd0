//! Presence from the connection: the event streams this instance holds
//! keep their tickets' visitors present, at the cost of one report per
//! room and period, never a write per stream or per wake.
//!
//! A stream takes a [`StreamHold`] for its ticket when it opens and drops
//! it when the connection ends. The registry counts holds per ticket (which
//! is also where the per-ticket stream cap is kept: a visitor's tabs, not
//! an address shared by a whole carrier-grade NAT) and tells the room's
//! engine (`Backend::hold_streams`) which tickets' first stream here opened
//! and whose last one closed, within [`FRESH`] of the change, so a visitor
//! coming back from away is back in line at once and one who left goes
//! away one `away_grace` after the close. Between changes the report is
//! empty and only says this instance is still there, once per
//! `rules::renew_every(away_grace)`. An instance that dies reports nothing
//! more: the engine lets its tickets go one grace after its last report,
//! unless their browsers reconnect elsewhere. When the engine that answers
//! is not the one that heard the last report (the room changed owner), or
//! a report was lost, the next report lists every ticket held here.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use crate::backend::{Backend, StreamsHeard, StreamsReport, TicketRef};
use crate::engine::RoomId;
use crate::engine::rules;
use crate::locks::lock;

/// A change in the streams held is reported within this.
pub(crate) const FRESH: Duration = Duration::from_millis(500);
/// How often the registry looks for rooms due.
const LOOK: Duration = Duration::from_millis(250);

/// The streams this instance holds, per room and ticket.
#[derive(Debug)]
pub struct Presence {
    rooms: Mutex<HashMap<RoomId, RoomStreams>>,
    /// This instance, to the rooms' engines.
    holder: u64,
    /// Streams per ticket; 0 = no limit.
    per_ticket: u32,
}

#[derive(Debug)]
struct RoomStreams {
    open: HashMap<TicketRef, u32>,
    /// Tickets whose first stream opened or last one closed since the
    /// last report.
    changed: HashSet<TicketRef>,
    /// The tickets the room's engine was told are held here.
    reported: HashSet<TicketRef>,
    /// The engine that heard the last report; `None`: the next report
    /// lists every ticket held here.
    generation: Option<u64>,
    /// When this room's next report is due.
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
            holder: rand::random(),
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
            changed: HashSet::new(),
            reported: HashSet::new(),
            generation: None,
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
        if *count == 1 {
            streams.changed.insert(ticket);
            streams.due = streams.due.min(now + FRESH);
        }
        Ok(StreamHold {
            presence: self.clone(),
            room: room.clone(),
            ticket,
        })
    }

    /// Streams open here for a ticket.
    #[cfg(test)]
    pub(crate) fn streams(&self, room: &RoomId, ticket: TicketRef) -> u32 {
        lock(&self.rooms)
            .get(room)
            .and_then(|r| r.open.get(&ticket).copied())
            .unwrap_or(0)
    }

    /// Tickets whose presence this instance holds now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
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
                streams.changed.insert(ticket);
                streams.due = streams.due.min(Instant::now() + FRESH);
            }
        }
    }

    /// The rooms due now, each with its report; rooms with nothing held
    /// and nothing to tell are forgotten.
    fn take_due(&self, now: Instant) -> Vec<(RoomId, StreamsReport)> {
        let mut rooms = lock(&self.rooms);
        rooms.retain(|_, r| !r.open.is_empty() || !r.reported.is_empty() || !r.changed.is_empty());
        let mut due = Vec::new();
        for (room, streams) in rooms.iter_mut() {
            if streams.due > now {
                continue;
            }
            streams.due = now + streams.every;
            due.push((room.clone(), streams.report(self.holder)));
        }
        due
    }

    /// What the room's engine answered a report (or that it could not be
    /// sent).
    fn heard(&self, room: &RoomId, full: bool, answer: Option<StreamsHeard>, now: Instant) {
        let mut rooms = lock(&self.rooms);
        let Some(streams) = rooms.get_mut(room) else {
            return;
        };
        match answer {
            Some(heard) => {
                streams.every = rules::renew_every(heard.away_grace);
                streams.due = streams.due.min(now + streams.every);
                if full {
                    streams.generation = Some(heard.generation);
                } else if streams.generation != Some(heard.generation) {
                    // Another engine, which has not heard the earlier
                    // reports: tell it everything, now.
                    streams.generation = None;
                    streams.due = now;
                }
            }
            None => {
                // It may or may not have been heard: tell everything next
                // time, soon (the grace covers a miss).
                streams.generation = None;
                streams.due = streams.due.min(now + 2 * FRESH);
            }
        }
    }

    /// Report what is due until `stop`: one `Backend::hold_streams` per
    /// room due, the rooms side by side.
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
            let reports = due.into_iter().map(|(room, report)| {
                let backend = backend.clone();
                async move {
                    let answer = backend.hold_streams(&room, &report).await;
                    (room, report.full, answer)
                }
            });
            for (room, full, answer) in futures_util::future::join_all(reports).await {
                if let Err(e) = &answer {
                    tracing::debug!(room = %room, error = %e, "streams not reported");
                }
                self.heard(&room, full, answer.ok(), now);
            }
        }
    }
}

impl RoomStreams {
    /// The next report: what changed since the last one, or everything
    /// held here for an engine that may not know it.
    fn report(&mut self, holder: u64) -> StreamsReport {
        let mut report = StreamsReport {
            holder,
            ..StreamsReport::default()
        };
        if self.generation.is_none() {
            report.full = true;
            self.changed.clear();
            self.reported = self.open.keys().copied().collect();
            report.opened = self.reported.iter().copied().collect();
            return report;
        }
        for ticket in self.changed.drain() {
            let open = self.open.contains_key(&ticket);
            if open && self.reported.insert(ticket) {
                report.opened.push(ticket);
            } else if !open && self.reported.remove(&ticket) {
                report.closed.push(ticket);
            }
        }
        report
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

    fn heard(generation: u64) -> Option<StreamsHeard> {
        Some(StreamsHeard {
            away_grace: Duration::from_secs(21),
            generation,
        })
    }

    fn sorted(mut tickets: Vec<TicketRef>) -> Vec<TicketRef> {
        tickets.sort_by_key(|t| t.id);
        tickets
    }

    #[test]
    fn changes_are_reported_once_and_quiet_periods_send_only_a_heartbeat() {
        let p = Presence::new(0);
        let room = RoomId::new("r").unwrap();
        let a = p.hold(&room, ticket(1)).unwrap();
        let _b = p.hold(&room, ticket(2)).unwrap();
        let _b2 = p.hold(&room, ticket(2)).unwrap();
        let start = Instant::now();
        // Nothing is due before the fresh window.
        assert!(p.take_due(start).is_empty());
        // The first report lists everything held here.
        let mut due = p.take_due(start + FRESH);
        let (_, first) = due.pop().unwrap();
        assert!(first.full);
        assert_eq!(sorted(first.opened), [ticket(1), ticket(2)]);
        p.heard(&room, true, heard(7), start + FRESH);
        // A quiet period: a report that names nothing, one period later.
        let t = start + FRESH;
        assert!(p.take_due(t + Duration::from_secs(6)).is_empty());
        let (_, quiet) = p.take_due(t + Duration::from_secs(7)).pop().unwrap();
        assert!(!quiet.full && quiet.opened.is_empty() && quiet.closed.is_empty());
        p.heard(&room, false, heard(7), t + Duration::from_secs(7));
        // A close (and an open) is reported within the fresh window.
        let t = t + Duration::from_secs(8);
        drop(a);
        let _c = p.hold(&room, ticket(3)).unwrap();
        let (_, change) = p.take_due(Instant::now() + FRESH).pop().unwrap();
        assert!(!change.full);
        assert_eq!(change.opened, [ticket(3)]);
        assert_eq!(change.closed, [ticket(1)]);
        p.heard(&room, false, heard(7), t);
        // A stream that opens and closes between two reports is not
        // reported at all.
        let d = p.hold(&room, ticket(4)).unwrap();
        drop(d);
        let (_, nothing) = p.take_due(Instant::now() + FRESH).pop().unwrap();
        assert!(nothing.opened.is_empty() && nothing.closed.is_empty());
    }

    #[test]
    fn another_engine_or_a_lost_report_gets_the_whole_list() {
        let p = Presence::new(0);
        let room = RoomId::new("r").unwrap();
        let _a = p.hold(&room, ticket(1)).unwrap();
        let start = Instant::now() + FRESH;
        let (_, first) = p.take_due(start).pop().unwrap();
        p.heard(&room, first.full, heard(7), start);
        let _b = p.hold(&room, ticket(2)).unwrap();
        // The delta reaches a new owner's engine: it hears the open, and
        // the whole list follows at once.
        let t = Instant::now() + FRESH;
        let (_, delta) = p.take_due(t).pop().unwrap();
        assert!(!delta.full);
        p.heard(&room, false, heard(8), t);
        let (_, full) = p.take_due(t).pop().unwrap();
        assert!(full.full);
        assert_eq!(sorted(full.opened), [ticket(1), ticket(2)]);
        p.heard(&room, true, heard(8), t);
        // A report that could not be sent: the next one, soon, is whole.
        let _c = p.hold(&room, ticket(3)).unwrap();
        let t = Instant::now() + FRESH;
        let (_, lost) = p.take_due(t).pop().unwrap();
        assert!(!lost.full);
        p.heard(&room, false, None, t);
        let (_, again) = p.take_due(t + 2 * FRESH).pop().unwrap();
        assert!(again.full);
        assert_eq!(sorted(again.opened), [ticket(1), ticket(2), ticket(3)]);
    }
}
