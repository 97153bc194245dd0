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
//! Layout: `room` (queue, hand-off, reads, operators' controls), `worker`
//! (the tick), `ticket` (states and CAS), `departures` (exact positions),
//! `rate` (ETA and the admission cap), `lottery` (the verifiable opening
//! draw), `view` (what the outside sees), `clock` (real and virtual time).
//!
//! The invariants of the design brief hold for every sequence of calls:
//! capacity, fairness, liveness, conservation ([`PermitLedger`]),
//! idempotence and monotone positions. `model_tests` checks them against a
//! sequential reference model.

mod clock;
mod departures;
mod event;
mod image;
mod lottery;
mod rate;
mod room;
mod settings;
mod ticket;
mod view;
mod worker;

#[cfg(test)]
mod image_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod room_tests;
#[cfg(test)]
mod stress_tests;

pub use clock::{Clock, ManualClock, SystemClock};
pub use event::{EventRecord, EventSink, RoomEvent};
pub use image::{RoomImage, TicketImage};
pub use lottery::{DrawMismatch, DrawRecord, LotterySeed};
pub use rate::AdmissionRate;
pub use room::{Departure, Handoff, Identity, JoinError, Joined, Room};
pub use settings::{InvalidRoomId, Order, RoomId, RoomSettings};
pub use ticket::{TicketId, TicketState};
pub use view::{
    Eta, PermitLedger, RoomStats, RoomView, TickReport, TicketStatus, WAIT_BUCKETS_MS, WaitSnapshot,
};
