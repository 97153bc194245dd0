//! Calling a visitor back: the tickets whose visitor asked to be told when
//! their turn nears and comes, and the rule of when to tell them.
//!
//! A visitor hands over a way to reach them (a Web Push subscription, kept
//! here as the opaque text the HTTP layer checked) with their language; it
//! lives and dies with the ticket. The room decides when a call is due:
//! "N ahead" once, when the ticket comes within the room's distance of the
//! head ([`rules::ahead_distance`](super::rules::ahead_distance), checked
//! each tick), and "your turn" when the head reaches it, admitted or, with
//! the page closed, skipped as away. Each call is reported as a record, so
//! a restarted room or a new owner knows it was made and makes it once;
//! the room hands it to its [`Callouts`], which only the deciding copy of
//! a room has (the embedded room, or the owner's): replicas never call.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use super::ticket::TicketId;
use crate::ids::RoomId;

/// How to reach a visitor, as they gave it. `Debug` leaves the
/// subscription out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Callback {
    /// The push subscription's JSON, as checked by whoever took it. It is
    /// a capability: never logged.
    pub subscription: String,
    /// The visitor's language when they asked (`en`, `ja`, `zh`, …), for
    /// the texts.
    pub lang: String,
}

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callback")
            .field("lang", &self.lang)
            .finish_non_exhaustive()
    }
}

/// A call due to a visitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notice {
    /// This many people are ahead of them now.
    Ahead { ahead: u32 },
    /// The head reached them. `until` (Unix ms) is when their place lapses
    /// if they do not come: the pass's arrival grace when admitted, or
    /// `queue_idle` after they were last seen when skipped while away.
    Turn { until: u64 },
}

impl Notice {
    pub fn is_turn(self) -> bool {
        matches!(self, Notice::Turn { .. })
    }
}

/// Where a deciding room hands its due calls. Implementations must be
/// quick and must not call back into the room (they run on the admission
/// path, some under the worker's lock): queue and return.
pub trait Callouts: Send + Sync + 'static {
    fn due(
        &self,
        room: &RoomId,
        epoch: u64,
        ticket: TicketId,
        number: Option<u64>,
        notice: Notice,
        callback: &Arc<Callback>,
    );
}

/// One ticket's callback and what has been said on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackState {
    #[serde(with = "shared")]
    pub callback: Arc<Callback>,
    pub ahead_sent: bool,
    pub turn_sent: bool,
}

impl CallbackState {
    pub(crate) fn new(callback: Callback) -> Self {
        Self {
            callback: Arc::new(callback),
            ahead_sent: false,
            turn_sent: false,
        }
    }

    /// A new way to reach the visitor in place of `old`: what was said on
    /// the old one stays said.
    pub(crate) fn replacing(callback: Callback, old: Option<&CallbackState>) -> Self {
        let mut kept = Self::new(callback);
        if let Some(old) = old {
            kept.ahead_sent = old.ahead_sent;
            kept.turn_sent = old.turn_sent;
        }
        kept
    }

    /// Mark `notice` as made; false when it had been already.
    pub(crate) fn mark(&mut self, notice: Notice) -> bool {
        let flag = if notice.is_turn() {
            &mut self.turn_sent
        } else {
            &mut self.ahead_sent
        };
        !std::mem::replace(flag, true)
    }
}

/// A shared callback as data: the callback itself.
mod shared {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Callback;

    pub(crate) fn serialize<S: Serializer>(c: &Arc<Callback>, s: S) -> Result<S::Ok, S::Error> {
        c.as_ref().serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Callback>, D::Error> {
        Callback::deserialize(d).map(Arc::new)
    }
}

/// The room's callbacks by ticket. The count lets the admission path skip
/// the map entirely in a room where nobody asked.
#[derive(Debug, Default)]
pub(crate) struct Callbacks {
    map: DashMap<TicketId, CallbackState>,
    count: AtomicUsize,
}

impl Callbacks {
    pub(crate) fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Keep `state` for `ticket`, replacing what was there.
    pub(crate) fn set(&self, ticket: TicketId, state: CallbackState) {
        if self.map.insert(ticket, state).is_none() {
            self.count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Forget `ticket`'s callback; whether it had one.
    pub(crate) fn remove(&self, ticket: TicketId) -> bool {
        let had = self.map.remove(&ticket).is_some();
        if had {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
        had
    }

    pub(crate) fn get(&self, ticket: TicketId) -> Option<CallbackState> {
        if self.is_empty() {
            return None;
        }
        self.map.get(&ticket).map(|e| e.value().clone())
    }

    /// Mark `notice` made for `ticket`: its callback, when it has one and
    /// the notice had not been made.
    pub(crate) fn mark(&self, ticket: TicketId, notice: Notice) -> Option<Arc<Callback>> {
        if self.is_empty() {
            return None;
        }
        let mut entry = self.map.get_mut(&ticket)?;
        entry.mark(notice).then(|| entry.callback.clone())
    }

    /// Tickets whose "ahead" call has not been made.
    pub(crate) fn awaiting_ahead(&self) -> Vec<TicketId> {
        if self.is_empty() {
            return Vec::new();
        }
        self.map
            .iter()
            .filter(|e| !e.ahead_sent && !e.turn_sent)
            .map(|e| *e.key())
            .collect()
    }
}
