//! The shadow line: where a traffic rule's `shadow` action sends a
//! visitor. It answers like the real line (a ticket token of the same
//! shape, the same status and event bodies, numbers that move as the real
//! line moves) but never admits anyone, and the engine never hears of
//! it: no place is taken, no count changes, nothing is journalled,
//! recorded, reported or sent to a webhook.
//!
//! A shadow ticket is told apart by the server alone: its token is signed
//! under a MAC context of its own (`token::Line::Shadow`), over the same
//! payload as a real one. Its ticket id is the next queue index of the
//! real line when it joined (what a real join would have got; past the
//! shadow tickets placed there before, so many shadow joins in a row are
//! numbered as many real ones would be), and its
//! figures are counted from the room's feed as a real ticket's at that
//! index would be, except that the count ahead never falls below a floor
//! drawn from a per-ticket seed only the server can compute: the visitor
//! sees the line move, then wait just short of the head. Nothing is kept
//! per visitor but the count ahead and the time when it joined, for the
//! progress bar and the receipt, in a bounded map per room
//! ([`ShadowBook`]); a ticket it forgot shows its progress from where it
//! stands.
//!
//! A ticket handed to a handler that does not know the shadow line
//! names [`NOWHERE`], which no room has: at worst such a handler answers
//! as for a ticket of a reset line, and the real line is never touched.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::watch;

use super::error::ApiError;
use super::state::AppState;
use crate::backend::feed::{Follow, LineMoves, Placement, RoomFeed, TicketRead, Tracker};
use crate::backend::{BackendError, TicketRef, TicketSignal};
use crate::engine::rules::{RoomFacts, TicketFacts, TicketStatus};
use crate::engine::{RoomId, TicketState};
use crate::locks::lock;
use crate::token::TicketClaim;

/// The ticket a shadow visitor's [`super::ticket::VisitorTicket`] names
/// for handlers that ask the backend: of no room's incarnation (epochs
/// are random and never 0), so no real ticket is ever reached through it.
pub(crate) const NOWHERE: TicketRef = TicketRef {
    epoch: 0,
    id: u64::MAX,
};

/// A shadow ticket, as its token says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ShadowTicket {
    pub epoch: u64,
    /// The real line's next queue index when it joined: its place.
    pub id: u64,
}

impl ShadowTicket {
    /// The ticket as its holder may see it (a receipt names it).
    pub(crate) fn shown(self) -> TicketRef {
        TicketRef {
            epoch: self.epoch,
            id: self.id,
        }
    }
}

/// The fewest tickets a shadow ticket ever has ahead of it.
const MIN_FLOOR: u64 = 2;
/// How many more the seed may add.
const FLOOR_SPREAD: u64 = 9;
/// The joins a room's book remembers; the oldest go first.
const KEPT: usize = 4096;

/// What a shadow join saw, kept for the progress bar and the receipt.
#[derive(Clone, Copy, Debug)]
struct Placed {
    initial_ahead: u64,
    joined_at: u64,
    /// Its holder left the line.
    left: bool,
}

/// What this instance remembers of the shadow line's joins: per room, at
/// most [`KEPT`] of them.
#[derive(Debug, Default)]
pub(crate) struct ShadowBook {
    rooms: Mutex<HashMap<RoomId, BTreeMap<ShadowKey, Placed>>>,
    /// Per room, the last place handed out, in its incarnation.
    last: Mutex<HashMap<RoomId, ShadowKey>>,
}

type ShadowKey = (u64, u64);

impl ShadowBook {
    /// The place of a new shadow ticket: the real line's tail (`next`, its
    /// next queue index), or past the shadow tickets already placed there,
    /// as many joins in a row would have been numbered in the real line.
    fn place(&self, room: &RoomId, epoch: u64, next: u64) -> ShadowTicket {
        let mut last = lock(&self.last);
        let id = match last.get(room) {
            Some(&(e, id)) if e == epoch && id >= next => id + 1,
            _ => next,
        };
        last.insert(room.clone(), (epoch, id));
        ShadowTicket { epoch, id }
    }

    fn note(&self, room: &RoomId, ticket: ShadowTicket, placed: Placed) {
        let mut rooms = lock(&self.rooms);
        let joins = rooms.entry(room.clone()).or_default();
        joins.entry((ticket.epoch, ticket.id)).or_insert(placed);
        while joins.len() > KEPT {
            joins.pop_first();
        }
    }

    /// Its holder left: its status says so from now on (on this
    /// instance, while the book remembers it).
    pub(crate) fn leave(&self, room: &RoomId, ticket: ShadowTicket, now: u64) {
        let mut rooms = lock(&self.rooms);
        let joins = rooms.entry(room.clone()).or_default();
        joins
            .entry((ticket.epoch, ticket.id))
            .or_insert(Placed {
                initial_ahead: 0,
                joined_at: now,
                left: false,
            })
            .left = true;
        while joins.len() > KEPT {
            joins.pop_first();
        }
    }

    fn placed(&self, room: &RoomId, ticket: ShadowTicket) -> Option<Placed> {
        lock(&self.rooms)
            .get(room)?
            .get(&(ticket.epoch, ticket.id))
            .copied()
    }
}

/// The least count ahead a shadow ticket shows: from a seed keyed by the
/// server's secret, so the ticket's holder cannot work it out.
fn floor(state: &AppState, room: &RoomId, ticket: ShadowTicket) -> u64 {
    let (key, _) = state.keys.derive("shadow line floor");
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
        return MIN_FLOOR;
    };
    mac.update(&ticket.epoch.to_be_bytes());
    mac.update(&ticket.id.to_be_bytes());
    mac.update(room.as_str().as_bytes());
    let digest = mac.finalize().into_bytes();
    let seed = u64::from_be_bytes(digest[..8].try_into().unwrap_or_default());
    MIN_FLOOR + seed % (FLOOR_SPREAD + 1)
}

/// The room's feed as one shadow ticket sees it: the real line's, with
/// the ticket's own count ahead kept at or above its floor (and the
/// line at least as long as the place shown).
struct ShadowFeed {
    real: Arc<dyn RoomFeed>,
    lane: u8,
    qi: u64,
    floor: u64,
    initial_ahead: u64,
}

impl RoomFeed for ShadowFeed {
    fn changes(&self) -> watch::Receiver<u64> {
        self.real.changes()
    }

    fn room_facts(&self) -> RoomFacts {
        let mut facts = self.real.room_facts();
        // A line is at least as long as the place in it shown.
        let ahead = self.ahead(self.lane, self.qi).unwrap_or(self.floor);
        facts.waiting = facts.waiting.max(ahead + 1);
        facts
    }

    fn ahead(&self, lane: u8, qi: u64) -> Option<u64> {
        let real = self.real.ahead(lane, qi);
        if lane == self.lane && qi == self.qi {
            // The head passing it would admit a real ticket: this one
            // stays just short of it.
            Some(real.unwrap_or(0).max(self.floor))
        } else {
            real
        }
    }

    fn placement(&self, _ticket: u64) -> Option<Placement> {
        // Joined before the room opened: placed where it would have
        // been had it joined now, once the room has opened.
        self.real.room_facts().open.then_some(Placement {
            qi: self.qi,
            initial_ahead: self.initial_ahead,
        })
    }

    fn moves(&self, lane: u8) -> LineMoves {
        self.real.moves(lane)
    }
}

/// What a status or a stream of a shadow ticket counts from.
struct Seen {
    feed: ShadowFeed,
    facts: TicketFacts,
}

async fn see(state: &AppState, room: &RoomId, ticket: ShadowTicket) -> Result<Seen, ApiError> {
    if state.backend.epoch(room).await? != ticket.epoch {
        return Err(BackendError::LineReset.into());
    }
    let now = state.clock.now_ms();
    let policy = state
        .access
        .policy(state.backend.as_ref(), room, now)
        .await?;
    let lane = policy.settings.lane_of(None).unwrap_or(0);
    let real = state.backend.feed(room).await?;
    let floor = floor(state, room, ticket);
    let open = real.room_facts().open;
    let placed = state
        .rules
        .shadow
        .placed(room, ticket)
        .unwrap_or_else(|| Placed {
            // Forgotten (or joined on another instance): its progress counts
            // from where it stands.
            initial_ahead: real.ahead(lane, ticket.id).unwrap_or(0).max(floor),
            joined_at: now,
            left: false,
        });
    let facts = TicketFacts {
        id: ticket.id,
        state: if placed.left {
            TicketState::Left
        } else {
            TicketState::Waiting
        },
        index: open.then_some(ticket.id),
        initial_ahead: placed.initial_ahead,
        joined_at: placed.joined_at,
        last_seen: now,
        lane,
        ..TicketFacts::default()
    };
    Ok(Seen {
        feed: ShadowFeed {
            real,
            lane,
            qi: ticket.id,
            floor,
            initial_ahead: placed.initial_ahead,
        },
        facts,
    })
}

/// A shadow ticket's status now.
pub(crate) async fn status(
    state: &AppState,
    room: &RoomId,
    ticket: ShadowTicket,
) -> Result<TicketStatus, ApiError> {
    let seen = see(state, room, ticket).await?;
    let mut tracker = Tracker::new(TicketRead {
        facts: seen.facts,
        ahead: None,
    });
    Ok(tracker.status(&seen.feed, state.clock.now_ms()))
}

/// What an event stream of a shadow ticket follows: its own view of the
/// room's feed, and a signal that never fires (it is never admitted, and
/// never ends but with its room).
pub(crate) async fn follow(
    state: &AppState,
    room: &RoomId,
    ticket: ShadowTicket,
) -> Result<Follow, ApiError> {
    let seen = see(state, room, ticket).await?;
    let signal = TicketSignal::new(Arc::default(), |_| {});
    let armed = signal.arm();
    Ok(Follow {
        feed: Arc::new(seen.feed),
        signal,
        armed,
        ticket: TicketRead {
            facts: seen.facts,
            ahead: None,
        },
    })
}

/// A join the rules sent to the shadow line: the holder's shadow ticket
/// again, or a new one at the real line's tail. The room's refusals (no
/// such room, closed, sold out) are the real line's.
pub(crate) async fn join(
    state: &AppState,
    room: &RoomId,
    held: Option<ShadowTicket>,
) -> Result<(ShadowTicket, String, TicketStatus, bool), ApiError> {
    let snapshot = state.backend.room(room).await?;
    if snapshot.view.closed {
        return Err(BackendError::Closed(room.clone()).into());
    }
    if snapshot.view.mode.closes() {
        return Err(BackendError::SoldOut(room.clone()).into());
    }
    let (ticket, is_new) = match held.filter(|t| t.epoch == snapshot.epoch) {
        Some(t) => (t, false),
        None => (
            state
                .rules
                .shadow
                .place(room, snapshot.epoch, snapshot.stats.joins),
            true,
        ),
    };
    if is_new {
        let lane = snapshot.settings.lane_of(None).unwrap_or(0);
        let ahead = if snapshot.view.open {
            state
                .backend
                .feed(room)
                .await?
                .ahead(lane, ticket.id)
                .unwrap_or(0)
        } else {
            0
        };
        state.rules.shadow.note(
            room,
            ticket,
            Placed {
                initial_ahead: ahead.max(floor(state, room, ticket)),
                joined_at: state.clock.now_ms(),
                left: false,
            },
        );
    }
    let token = state.keys.sign_shadow(&TicketClaim {
        room: room.clone(),
        epoch: ticket.epoch,
        ticket: ticket.id,
    });
    let status = status(state, room, ticket).await?;
    Ok((ticket, token, status, is_new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadow_joins_are_placed_behind_each_other_and_the_real_line() {
        let book = ShadowBook::default();
        let room = RoomId::new("sale").unwrap();
        let ids = |epoch, next| book.place(&room, epoch, next).id;
        // Three in a row at a tail of 10: 10, 11, 12.
        assert_eq!([ids(1, 10), ids(1, 10), ids(1, 10)], [10, 11, 12]);
        // The real line moved past them: its tail again.
        assert_eq!(ids(1, 20), 20);
        assert_eq!(ids(1, 15), 21);
        // A new incarnation of the room counts afresh.
        assert_eq!(ids(2, 3), 3);
        // Another room has its own.
        assert_eq!(book.place(&RoomId::new("b").unwrap(), 2, 0).id, 0);
    }

    #[test]
    fn the_book_forgets_its_oldest_joins_first() {
        let book = ShadowBook::default();
        let room = RoomId::new("sale").unwrap();
        let placed = Placed {
            initial_ahead: 5,
            joined_at: 1,
            left: false,
        };
        for id in 0..(KEPT as u64 + 10) {
            book.note(&room, ShadowTicket { epoch: 1, id }, placed);
        }
        assert!(
            book.placed(&room, ShadowTicket { epoch: 1, id: 9 })
                .is_none()
        );
        assert!(
            book.placed(&room, ShadowTicket { epoch: 1, id: 10 })
                .is_some()
        );
        let t = ShadowTicket { epoch: 1, id: 500 };
        book.leave(&room, t, 2);
        assert!(book.placed(&room, t).unwrap().left);
    }
}
