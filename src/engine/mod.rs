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
pub mod record;
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

pub use callbacks::{Callback, CallbackState, Callouts, Notice};
pub use changes::{COALESCE, Changes, WAVE_GAP};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use departures::Departures;
pub use event::{EventRecord, EventSink, RoomEvent};
pub use holds::{HolderId, StreamReport};
pub use image::{RoomImage, TicketImage};
pub use lane::LaneIndex;
pub use lottery::{DrawMismatch, DrawRecord, LotterySeed};
pub use record::{AdmissionRecord, CHECKPOINT, Chained, Entry, EntryKind, Page};
pub use replay::Replayer;
pub use room::{Binding, Departure, Handoff, Identity, JoinError, Joined, Room, SubscribeError};
pub use rules::{
    AdmissionRate, Eta, Status, StatusBody, TicketState, TicketStatus, WAIT_BUCKETS_MS,
};
pub use settings::{
    InvalidRoomId, LaneSpec, Order, Patch, RoomId, RoomPatch, RoomSettings, UnknownLane,
};
pub use tally::RoomTally;
pub use ticket::TicketId;
pub use view::{LaneView, PermitLedger, RoomStats, RoomView, TickReport, WaitSnapshot};
