//! The one admission core: every rule of the waiting room written once, as
//! functions over plain data, whichever store holds the room.
//!
//! - `state`: ticket states, the codes stores keep them as, their names, and
//!   what a visitor is told (`waiting`, `admitted`, `expired`, `left`,
//!   `closed`)
//! - `status`: a ticket's place, progress, estimated wait and pass deadline
//!   from its facts and the room's; the one status type that goes out
//! - `rate`: the smoothed admission rate and the cap on admissions
//! - `publish`: when a changed room view is worth sending to every stream
//! - `cadence`: when a waiting visitor's stream sends them a change, and
//!   the wait as a page shows it
//! - `presence`: what the head does with a ticket whose visitor may be gone
//! - `capacity`: where permits go when capacity changes
//! - `mode`: queueing modes (queue, passthrough, maintenance, sold out)
//!   and the stock a room has left
//! - `join_limit`: new tickets per address in a sliding minute
//! - `waits`: the wait histogram's buckets
//! - `callback`: when a visitor who asked to be called back is told
//! - `autotune`: the next admission rate from the origin's health
//!
//! The engine (`crate::engine::Room`) calls these on its atomics, in both
//! deployments: embedded, and on each room's owner on Redis.

mod autotune;
mod cadence;
mod callback;
mod capacity;
mod join_limit;
mod lanes;
mod mode;
mod presence;
mod publish;
mod rate;
mod state;
mod status;
mod waits;

// What the other crates of the workspace use.
pub use mode::Mode;
pub use state::TicketState;
pub use status::TicketStatus;

pub(crate) use autotune::{Controller, Current, Decision, Memory, Signal, Verdict, decide};
pub(crate) use cadence::{Due, MIN_GAP_MS, REFRESH_MS, WaitUnit, due, moves_needed, wait_shown};
pub(crate) use callback::ahead_distance;
pub(crate) use capacity::{Counter, Transfer, resize};
pub(crate) use join_limit::{join_allowance, join_window_start};
pub(crate) use lanes::{LaneLoad, LaneLoads, MAX_LANES, lane_order};
pub(crate) use mode::{STOCK_MAX, StockTaken, mode_with_stock, take_stock};
pub(crate) use presence::{AtHead, PresenceTimeouts, renew_every};
pub(crate) use publish::worth_publishing;
pub(crate) use rate::{AdmissionRate, AdmitCap};
pub(crate) use state::Status;
pub(crate) use status::{
    Eta, PassTimeouts, RoomFacts, StatusBody, TicketFacts, quiet_cutoff, ticket_status,
};
pub(crate) use waits::{WAIT_BUCKETS_MS, wait_bucket};

// The backends' tests age a join window by hand.
#[cfg(test)]
pub(crate) use join_limit::JOIN_WINDOW_MS;

/// The most tickets one room may issue: what the position index holds,
/// less a margin because the check and the append race.
pub(crate) const MAX_TICKETS: u64 = (crate::engine::departures::MAX_QUEUE - 4096) as u64;

/// How many waiting tickets one tick checks for quietness. Bounded so a
/// tick stays short with a million waiting; the sweep resumes where it
/// stopped, so the whole line is covered every `waiting / SWEEP_BUDGET`
/// ticks (100 s for a million at one tick a second), well inside the
/// default five-minute `queue_idle`.
pub(crate) const SWEEP_BUDGET: u32 = 10_000;
