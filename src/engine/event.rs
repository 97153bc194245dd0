//! The room's change feed: what a room reports as it changes, so that a
//! backend can make its state durable without the engine knowing of files.
//!
//! A room built with an [`EventSink`] calls it right after every change
//! that a restart must keep: a join (with its number and identity), an
//! admission, every end of a ticket, a visitor's arrival, the opening draw,
//! settings and closing. The call happens on the thread that made the
//! change, after the compare-and-swap that made it, so a sink sees each
//! change exactly once. Events of different tickets may reach the sink in a
//! different order than they happened (two threads racing); replay
//! ([`super::RoomImage::apply`]) is built to tolerate that, because a
//! ticket's state only ever moves forward.

use serde::{Deserialize, Serialize};

use super::callbacks::{Callback, Notice};
use super::settings::RoomSettings;
use super::ticket::{TicketId, TicketState};
use crate::ids::Identity;

/// One change of a room.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RoomEvent<'a> {
    /// A ticket was issued. `index` is its queue index (number − 1), or
    /// `None` while it waits in the pre-queue.
    Joined {
        ticket: TicketId,
        identity: Option<Identity>,
        /// The lane it queues in; `index` is in that lane's line.
        lane: u8,
        index: Option<u32>,
        ahead: u32,
        at: u64,
    },
    /// A waiting ticket got a permit.
    Admitted { ticket: TicketId, at: u64 },
    /// A ticket reached a final state (released, revoked, expired, left,
    /// abandoned).
    Ended {
        ticket: TicketId,
        state: TicketState,
        at: u64,
    },
    /// An admitted visitor showed up for the first time: from now on the
    /// pass lapses after `pass_idle` rather than `arrival_grace`.
    Arrived { ticket: TicketId, at: u64 },
    /// The room opened; the pre-queue took queue indices `0..order.len()`
    /// in this order.
    Opened { order: &'a [TicketId], at: u64 },
    /// An operator changed settings (capacity, pause, timeouts, opening);
    /// this is the whole new set.
    Settings(&'a RoomSettings),
    /// The room was closed.
    Closed,
    /// The head passed a waiting ticket whose visitor was away: it keeps
    /// its number, out of the line, until they come back.
    Away { ticket: TicketId, at: u64 },
    /// An away ticket's visitor came back: first in line again.
    Back { ticket: TicketId, at: u64 },
    /// A waiting visitor asked to be called back (replacing any earlier
    /// way to reach them).
    Subscribed {
        ticket: TicketId,
        callback: &'a Callback,
    },
    /// The visitor no longer wants to be called back, or cannot be
    /// reached there any more.
    Unsubscribed { ticket: TicketId },
    /// A call was made (handed to the room's callouts): never again.
    Notified { ticket: TicketId, notice: Notice },
}

/// Receives a room's events. Implementations must be quick and must not
/// call back into the room: they run on the hot paths, some under the
/// worker's lock.
pub trait EventSink: Send + Sync + 'static {
    fn record(&self, event: RoomEvent<'_>);
}

/// An event as owned, serializable data: what a journal stores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum EventRecord {
    Joined {
        ticket: TicketId,
        identity: Option<u128>,
        lane: u8,
        index: Option<u32>,
        ahead: u32,
        at: u64,
    },
    Admitted {
        ticket: TicketId,
        at: u64,
    },
    Ended {
        ticket: TicketId,
        state: TicketState,
        at: u64,
    },
    Arrived {
        ticket: TicketId,
        at: u64,
    },
    Opened {
        order: Vec<TicketId>,
        at: u64,
    },
    /// Boxed: settings are many times larger than any other record and
    /// rare (an operator's change).
    Settings(Box<RoomSettings>),
    Closed,
    // Added after the others: a record's variant is its position, so
    // journals written before presence was recorded still read.
    Away {
        ticket: TicketId,
        at: u64,
    },
    Back {
        ticket: TicketId,
        at: u64,
    },
    Subscribed {
        ticket: TicketId,
        callback: Callback,
    },
    Unsubscribed {
        ticket: TicketId,
    },
    Notified {
        ticket: TicketId,
        notice: Notice,
    },
}

impl From<RoomEvent<'_>> for EventRecord {
    fn from(e: RoomEvent<'_>) -> Self {
        match e {
            RoomEvent::Joined {
                ticket,
                identity,
                lane,
                index,
                ahead,
                at,
            } => Self::Joined {
                ticket,
                identity: identity.map(|i| i.0),
                lane,
                index,
                ahead,
                at,
            },
            RoomEvent::Admitted { ticket, at } => Self::Admitted { ticket, at },
            RoomEvent::Ended { ticket, state, at } => Self::Ended { ticket, state, at },
            RoomEvent::Arrived { ticket, at } => Self::Arrived { ticket, at },
            RoomEvent::Opened { order, at } => Self::Opened {
                order: order.to_vec(),
                at,
            },
            RoomEvent::Settings(s) => Self::Settings(Box::new(s.clone())),
            RoomEvent::Closed => Self::Closed,
            RoomEvent::Away { ticket, at } => Self::Away { ticket, at },
            RoomEvent::Back { ticket, at } => Self::Back { ticket, at },
            RoomEvent::Subscribed { ticket, callback } => Self::Subscribed {
                ticket,
                callback: callback.clone(),
            },
            RoomEvent::Unsubscribed { ticket } => Self::Unsubscribed { ticket },
            RoomEvent::Notified { ticket, notice } => Self::Notified { ticket, notice },
        }
    }
}

impl EventRecord {
    pub(crate) fn as_event(&self) -> RoomEvent<'_> {
        match self {
            Self::Joined {
                ticket,
                identity,
                lane,
                index,
                ahead,
                at,
            } => RoomEvent::Joined {
                ticket: *ticket,
                identity: identity.map(Identity),
                lane: *lane,
                index: *index,
                ahead: *ahead,
                at: *at,
            },
            Self::Admitted { ticket, at } => RoomEvent::Admitted {
                ticket: *ticket,
                at: *at,
            },
            Self::Ended { ticket, state, at } => RoomEvent::Ended {
                ticket: *ticket,
                state: *state,
                at: *at,
            },
            Self::Arrived { ticket, at } => RoomEvent::Arrived {
                ticket: *ticket,
                at: *at,
            },
            Self::Opened { order, at } => RoomEvent::Opened { order, at: *at },
            Self::Settings(s) => RoomEvent::Settings(s),
            Self::Closed => RoomEvent::Closed,
            Self::Away { ticket, at } => RoomEvent::Away {
                ticket: *ticket,
                at: *at,
            },
            Self::Back { ticket, at } => RoomEvent::Back {
                ticket: *ticket,
                at: *at,
            },
            Self::Subscribed { ticket, callback } => RoomEvent::Subscribed {
                ticket: *ticket,
                callback,
            },
            Self::Unsubscribed { ticket } => RoomEvent::Unsubscribed { ticket: *ticket },
            Self::Notified { ticket, notice } => RoomEvent::Notified {
                ticket: *ticket,
                notice: *notice,
            },
        }
    }
}
