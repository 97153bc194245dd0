//! The calls a room decides are due, on their way out of the backend.
//!
//! Only the copy of a room that decides has callouts (the embedded room,
//! or the room's owner on Redis), so each call leaves exactly one
//! instance. The tap is a bounded queue the room hands each call to
//! without waiting; whoever delivers (the push sender) takes the other
//! end once. A full queue drops the call and counts it: the admission
//! path never waits for a delivery.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
pub struct CallbackTap {
    tx: mpsc::Sender<CallbackDue>,
    rx: std::sync::Mutex<Option<mpsc::Receiver<CallbackDue>>>,
    dropped: AtomicU64,
}

impl CallbackTap {
    pub fn new() -> Arc<Self> {
        let (tx, rx) = mpsc::channel(QUEUE);
        Arc::new(Self {
            tx,
            rx: std::sync::Mutex::new(Some(rx)),
            dropped: AtomicU64::new(0),
        })
    }

    /// The receiving end, to the first who asks.
    pub fn take(&self) -> Option<mpsc::Receiver<CallbackDue>> {
        crate::locks::lock(&self.rx).take()
    }

    /// Calls dropped because nobody took them in time.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
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
        if self.tx.try_send(due).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}
