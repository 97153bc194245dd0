//! A room's feed: what the event streams on this instance read, and are
//! woken by, instead of asking the store on every change.
//!
//! Each backend keeps one feed per room it serves streams for: the room's
//! latest view and the position index of each lane (`engine::LaneIndex`).
//! The embedded engine's room is its own feed; on Redis each instance
//! keeps a replica fed by the room's change log. A stream reads its ticket
//! once from the store when it opens ([`Follow`]), then counts its place
//! from the feed with the one core's functions ([`Tracker::status`]) each
//! time the feed's change counter moves, so a change costs the store
//! nothing per stream. Its ticket's own changes (an admission, an end) wake
//! it through its [`TicketSignal`], and only then does it read the store
//! again.

use std::sync::Arc;

use tokio::sync::watch;

use super::{Armed, TicketSignal};
use crate::engine::TicketState;
use crate::engine::rules::{self, RoomFacts, TicketFacts, TicketStatus};

/// Where a ticket drawn at the opening was placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub qi: u64,
    /// Tickets waiting ahead of it then, for the progress bar.
    pub initial_ahead: u64,
}

/// One room as this instance's streams see it.
pub trait RoomFeed: Send + Sync {
    /// Moves (coalesced) whenever positions or the room's view may have
    /// changed: the cue for streams to count again.
    fn changes(&self) -> watch::Receiver<u64>;

    /// What a status needs of the room now. A feed of a room that was
    /// replaced or closed says `closed`.
    fn room_facts(&self) -> RoomFacts;

    /// Tickets waiting ahead of queue index `qi` of `lane`; `None` when the
    /// head has passed it (it was admitted, skipped or left).
    fn ahead(&self, lane: u8, qi: u64) -> Option<u64>;

    /// Where a ticket that waited in the pre-queue was placed, once the
    /// room has opened.
    fn placement(&self, ticket: u64) -> Option<Placement>;

    /// How far `lane`'s line has moved on this instance's copy
    /// (`engine::LaneIndex::moves`), and which copy counted it.
    fn moves(&self, lane: u8) -> LineMoves;
}

/// How far a line has moved, as one copy of the room counts it: a place
/// in it can have fallen by at most the count's growth, while the copy
/// is the same (another copy counts afresh).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineMoves {
    /// Which copy of the room counted (`Room::copy`; 0: none).
    pub(crate) copy: u64,
    pub(crate) count: u64,
}

impl LineMoves {
    /// Of a room's copy.
    pub(crate) fn of(room: &crate::engine::Room, lane: u8) -> Self {
        Self {
            copy: room.copy(),
            count: room.lane(lane).map_or(0, |l| l.moves()),
        }
    }
}

/// A ticket as the store has it: its facts and the count ahead last shown
/// to its holder (never more than any before it), if it waits in line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TicketRead {
    pub facts: TicketFacts,
    pub ahead: Option<u64>,
}

/// What a stream follows: its room's feed, its ticket's signal, and its
/// ticket as read when the stream opened (after the signal was armed, so
/// no change in between is missed: `armed` fires for it).
pub struct Follow {
    pub feed: Arc<dyn RoomFeed>,
    pub signal: TicketSignal,
    pub armed: Armed,
    pub ticket: TicketRead,
}

/// One stream's ticket between store reads: its facts, and the least
/// count ahead it has shown, so what it shows never goes up.
#[derive(Clone, Debug)]
pub struct Tracker {
    facts: TicketFacts,
    lane: u8,
    floor: Option<u64>,
}

impl Tracker {
    pub fn new(read: TicketRead) -> Self {
        Self {
            facts: read.facts,
            lane: read.facts.lane,
            floor: read.ahead,
        }
    }

    /// A reconnecting client last saw `ahead` (from its `Last-Event-ID`):
    /// never show more than that.
    pub(crate) fn seen(&mut self, ahead: u64) {
        self.floor = Some(self.floor.map_or(ahead, |f| f.min(ahead)));
    }

    pub(crate) fn state(&self) -> TicketState {
        self.facts.state
    }

    /// The store's newer word on the ticket (after its signal fired).
    pub(crate) fn update(&mut self, read: TicketRead) {
        self.facts = read.facts;
        if let Some(ahead) = read.ahead {
            self.seen(ahead);
        }
    }

    /// The ticket's status now, counted from the feed.
    pub fn status(&mut self, feed: &dyn RoomFeed, now: u64) -> TicketStatus {
        let room = feed.room_facts();
        let mut ahead = None;
        if self.facts.state == TicketState::Waiting {
            if self.facts.index.is_none()
                && let Some(p) = feed.placement(self.facts.id)
            {
                self.facts.index = Some(p.qi);
                self.facts.initial_ahead = p.initial_ahead;
            }
            if let Some(qi) = self.facts.index {
                // The head passed it: its signal is on its way; until then
                // it shows where it was.
                if let Some(counted) = feed.ahead(self.lane, qi) {
                    self.seen(counted);
                }
                ahead = self.floor;
            }
        }
        rules::ticket_status(&self.facts, ahead, &room, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LaneIndex;

    struct Fixed {
        lane: LaneIndex,
        placed: Option<Placement>,
        changes: crate::engine::Changes,
    }

    impl RoomFeed for Fixed {
        fn changes(&self) -> watch::Receiver<u64> {
            self.changes.subscribe()
        }
        fn room_facts(&self) -> RoomFacts {
            RoomFacts {
                open: true,
                waiting: 10,
                ..RoomFacts::default()
            }
        }
        fn ahead(&self, _lane: u8, qi: u64) -> Option<u64> {
            self.lane.ahead(qi as u32)
        }
        fn placement(&self, _ticket: u64) -> Option<Placement> {
            self.placed
        }

        fn moves(&self, _lane: u8) -> LineMoves {
            LineMoves {
                copy: 1,
                count: self.lane.moves(),
            }
        }
    }

    fn waiting(index: Option<u64>) -> TicketRead {
        TicketRead {
            facts: TicketFacts {
                id: 7,
                index,
                ..TicketFacts::default()
            },
            ahead: None,
        }
    }

    #[test]
    fn counts_from_the_feed_and_never_goes_up() {
        let feed = Fixed {
            lane: LaneIndex::new(),
            placed: None,
            changes: Default::default(),
        };
        feed.lane.popped(0);
        feed.lane.popped(1);
        let mut t = Tracker::new(waiting(Some(5)));
        assert_eq!(t.status(&feed, 1).position, Some(4));
        feed.lane.departed(2);
        assert_eq!(t.status(&feed, 1).position, Some(3));
        // A returner goes ahead of everyone: the count grows, the shown
        // position does not.
        feed.lane.go_back(1);
        assert_eq!(feed.lane.ahead(5), Some(3));
        assert_eq!(t.status(&feed, 1).position, Some(3));
        // A reconnecting client saw less: that is the floor.
        t.seen(1);
        assert_eq!(t.status(&feed, 1).position, Some(2));
        // Passed by the head: shows its last place until told.
        feed.lane.popped(5);
        assert_eq!(t.status(&feed, 1).position, Some(2));
    }

    #[test]
    fn a_pre_queue_ticket_is_placed_from_the_feed() {
        let mut feed = Fixed {
            lane: LaneIndex::new(),
            placed: None,
            changes: Default::default(),
        };
        let mut t = Tracker::new(waiting(None));
        assert_eq!(t.status(&feed, 1).position, None);
        feed.placed = Some(Placement {
            qi: 3,
            initial_ahead: 3,
        });
        let s = t.status(&feed, 1);
        assert_eq!((s.number, s.position), (Some(4), Some(4)));
    }
}
