//! The calls a room decides are due, on their way out of the backend.
//!
//! Only the copy of a room that decides has callouts (the embedded room,
//! or the room's owner on Redis), so each call leaves exactly one
//! instance. The tap is a bounded queue the room hands each call to
//! without waiting; whoever delivers (the push sender) takes the other
//! end once. A full queue drops the call and counts it, by room, for
//! `/metrics`: the admission path never waits for a delivery.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::TicketRef;
use crate::engine::{Callback, Callouts, Notice, RoomId, TicketId};

/// Calls waiting to be taken; past this, new ones are dropped.
const QUEUE: usize = 4096;

/// A call due to one visitor.
#[derive(Clone, Debug)]
pub struct CallbackDue {
    pub room: RoomId,
    pub ticket: TicketRef,
    /// Its queue number, as the visitor knows it.
    pub number: Option<u64>,
    pub notice: Notice,
    pub callback: Arc<Callback>,
}

/// The backend's end of the calls.
#[derive(Debug)]
pub(crate) struct CallbackTap {
    tx: mpsc::Sender<CallbackDue>,
    rx: std::sync::Mutex<Option<mpsc::Receiver<CallbackDue>>>,
    dropped: dashmap::DashMap<RoomId, u64>,
}

impl CallbackTap {
    pub(crate) fn new() -> Arc<Self> {
        let (tx, rx) = mpsc::channel(QUEUE);
        Arc::new(Self {
            tx,
            rx: std::sync::Mutex::new(Some(rx)),
            dropped: dashmap::DashMap::new(),
        })
    }

    /// The receiving end, to the first who asks.
    pub(crate) fn take(&self) -> Option<mpsc::Receiver<CallbackDue>> {
        crate::locks::lock(&self.rx).take()
    }

    /// `room`'s calls dropped because nobody took them in time.
    pub(crate) fn dropped(&self, room: &RoomId) -> u64 {
        self.dropped.get(room).map_or(0, |n| *n)
    }
}

impl Callouts for CallbackTap {
    fn due(
        &self,
        room: &RoomId,
        epoch: u64,
        ticket: TicketId,
        number: Option<u64>,
        notice: Notice,
        callback: &Arc<Callback>,
    ) {
        let due = CallbackDue {
            room: room.clone(),
            ticket: TicketRef {
                epoch,
                id: u64::from(ticket),
            },
            number,
            notice,
            callback: callback.clone(),
        };
        if let Err(e) = self.tx.try_send(due) {
            let room = e.into_inner().room;
            *self.dropped.entry(room).or_default() += 1;
        }
    }
}
