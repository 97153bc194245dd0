//! The admission engine: one fair semaphore per room, lock-free on its hot
//! paths, knowing nothing of HTTP.
//!
//! A [`Room`] has `capacity` permits. Everyone queues: [`Room::join`] only
//! appends a ticket and answers at once. The room's worker calls
//! [`Room::tick`] once per tick to hand the permits in its hand to the head
//! of the queue. When an admitted visitor finishes ([`Room::leave`],
//! [`Room::release`]) the permit goes straight to the next waiting ticket;
//! only when nobody waits does it go onto the tray, which the worker takes
//! back into its hand when its hand is empty. Stalled permits are taken back
//! by the worker, quiet waiters are skipped, and every change of a ticket is
//! a compare-and-swap on its state.
//!
//! Layout: `rules` (the one admission core: every rule as a function over
//! plain data), `room` (queue, hand-off, reads, operators' controls),
//! `worker` (the tick), `ticket` (states and CAS), `holds` (presence from
//! the instances' open streams), `departures` and `lane` (the position
//! index: departures counted per queue slot, the head, the back set),
//! `changes` (when streams look again, coalesced), `lottery` (the
//! verifiable opening draw), `view` (the room view and counters),
//! `callbacks` (the visitors who asked to be called back, and when),
//! `settings`, `event`/`image`/`replay`/`tally` (the change feed, the room
//! as data, and a copy kept from them), `clock` (real and virtual time).
//!
//! These invariants hold for every sequence of calls: capacity (never more
//! admitted than permits), fairness (admission in queue order), liveness (a
//! free permit meets a waiting ticket within a tick), conservation
//! ([`PermitLedger`]), idempotence (one ticket per identity; a second
//! release frees nothing) and monotone positions. `model_tests` checks them
//! against a sequential reference model.

mod callbacks;
mod changes;
mod clock;
mod departures;
mod event;
mod holds;
mod image;
mod lane;
mod lottery;
pub(crate) mod record;
mod replay;
mod room;
pub mod rules;
mod settings;
mod tally;
mod ticket;
mod view;
mod worker;

#[cfg(test)]
mod callback_tests;
#[cfg(test)]
mod image_tests;
#[cfg(test)]
mod room_tests;
#[cfg(test)]
mod stress_tests;

// What the server binary, the integration tests, benches and examples use.
pub use callbacks::{Callback, Notice};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use event::{EventRecord, EventSink};
pub use image::RoomImage;
pub use lottery::LotterySeed;
pub use record::{AdmissionRecord, CHECKPOINT, Entry};
pub use room::{Departure, Handoff, JoinError, Room};
pub use rules::{TicketState, TicketStatus};
pub use settings::{LaneSpec, Order, RoomPatch, RoomSettings};
pub use ticket::TicketId;
pub use view::{PermitLedger, RoomView};

// Named below the engine, since fair access speaks of them too; found here.
pub(crate) use crate::ids::InvalidRoomId;
pub use crate::ids::{Identity, RoomId};
pub use crate::patch::Patch;

pub(crate) use callbacks::{CallbackState, Callouts};
pub(crate) use event::RoomEvent;
pub(crate) use holds::StreamReport;
pub(crate) use lottery::{DrawMismatch, DrawRecord};
pub(crate) use record::{EntryKind, Page};
pub(crate) use replay::Replayer;
pub(crate) use room::{Binding, Joined, SubscribeError};
pub(crate) use rules::{Eta, Status, StatusBody, WAIT_BUCKETS_MS};
pub(crate) use tally::RoomTally;
pub(crate) use view::{LaneView, RoomStats, TickReport, WaitSnapshot};

// The backends' tests build a feed and a position index by hand.
#[cfg(test)]
pub(crate) use {changes::Changes, lane::LaneIndex};
