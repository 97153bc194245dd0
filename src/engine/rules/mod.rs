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
//! - `presence`: what the head does with a ticket whose visitor may be gone
//! - `capacity`: where permits go when capacity changes
//! - `mode`: queueing modes (queue, passthrough, maintenance, sold out)
//!   and the stock a room has left
//! - `join_limit`: new tickets per address in a sliding minute
//! - `waits`: the wait histogram's buckets
//!
//! The embedded engine (`crate::engine::Room`) calls these on its atomics.
//! The Redis backend calls them on what its scripts return; the scripts
//! keep only the steps that must be atomic in Redis, and the constants they
//! need are generated here ([`lua_constants`]) and put in front of them.

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

pub use capacity::{Counter, GROW, Plan, SHRINK, Transfer, resize};
pub use join_limit::{JOIN_WINDOW_MS, join_allowance, join_window_start};
pub use lanes::{
    LANE_PICK_LUA, LaneLoad, LaneLoads, MAX_LANES, lane_order, lane_share, next_lane, shares,
};
pub use mode::{Mode, STOCK_MAX, StockTaken, mode_with_stock, take_stock};
pub use presence::{AtHead, PresenceTimeouts, RENEWALS_PER_GRACE, away_cutoff, renew_every};
pub use publish::{Visible, worth_publishing};
pub use rate::{AdmissionRate, AdmitCap};
pub use state::{Status, TicketState};
pub use status::{
    Eta, PassCutoffs, PassTimeouts, RoomFacts, StatusBody, TicketFacts, TicketStatus, eta,
    progress, quiet_cutoff, ticket_status,
};
pub use waits::{WAIT_BUCKETS_MS, wait_bucket};

/// The most tickets one room may issue: what the position index holds,
/// less a margin because the check and the append race.
pub const MAX_TICKETS: u64 = (crate::engine::departures::MAX_QUEUE - 4096) as u64;

/// How many waiting tickets one tick checks for quietness. Bounded so a
/// tick stays short with a million waiting; the sweep resumes where it
/// stopped, so the whole line is covered every `waiting / SWEEP_BUDGET`
/// ticks (100 s for a million at one tick a second), well inside the
/// default five-minute `queue_idle`.
pub const SWEEP_BUDGET: u32 = 10_000;

/// The constants the Redis scripts use, as Lua, from the tables above.
pub fn lua_constants() -> String {
    use std::fmt::Write;
    let mut lua = String::from("-- Generated from src/engine/rules at start-up.\n");
    for s in TicketState::ALL {
        let _ = writeln!(lua, "local {} = {}", s.name().to_uppercase(), s.code());
    }
    // The last bucket has no bound: a wait past every bound lands in it.
    let bounds: Vec<String> = WAIT_BUCKETS_MS[..WAIT_BUCKETS_MS.len() - 1]
        .iter()
        .map(u64::to_string)
        .collect();
    let _ = writeln!(lua, "local WAIT_BUCKETS = {{{}}}", bounds.join(", "));
    let _ = writeln!(lua, "local MAX_TICKETS = {MAX_TICKETS}");
    let _ = writeln!(lua, "local SWEEP_BUDGET = {SWEEP_BUDGET}");
    let _ = writeln!(lua, "local JOIN_WINDOW_MS = {JOIN_WINDOW_MS}");
    let _ = writeln!(lua, "local RESIZE_GROW = {}", GROW.to_lua());
    let _ = writeln!(lua, "local RESIZE_SHRINK = {}", SHRINK.to_lua());
    // Modes by what they do, as sets of the names stores keep them as.
    let modes = |keep: fn(Mode) -> bool| -> String {
        let names: Vec<String> = Mode::ALL
            .into_iter()
            .filter(|m| keep(*m))
            .map(|m| format!("{} = true", m.name()))
            .collect();
        format!("{{{}}}", names.join(", "))
    };
    let _ = writeln!(lua, "local MODE_ADMITS = {}", modes(Mode::admits));
    let _ = writeln!(
        lua,
        "local MODE_ADMITS_EVERYONE = {}",
        modes(Mode::admits_everyone)
    );
    let _ = writeln!(lua, "local MODE_CLOSES = {}", modes(Mode::closes));
    let _ = writeln!(lua, "local MODE_DEFAULT = '{}'", Mode::default().name());
    let _ = writeln!(lua, "local MODE_SOLD_OUT = '{}'", Mode::SoldOut.name());
    let ended: Vec<String> = TicketState::ALL
        .iter()
        .filter_map(|s| Some(format!("[{}] = 'c_{}'", s.code(), s.ended_counter()?)))
        .collect();
    let _ = writeln!(lua, "local ENDED_COUNTER = {{{}}}", ended.join(", "));
    // The states in which a ticket still holds its place or permit.
    let live: Vec<String> = TicketState::ALL
        .iter()
        .filter(|s| s.is_live())
        .map(|s| format!("[{}] = true", s.code()))
        .collect();
    let _ = writeln!(lua, "local LIVE = {{{}}}", live.join(", "));
    let _ = writeln!(lua, "local MAX_LANES = {MAX_LANES}");
    lua.push_str(LANE_PICK_LUA);
    lua
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lua_constants_come_from_the_tables() {
        let lua = lua_constants();
        assert!(lua.contains("local WAITING = 0\n"));
        assert!(lua.contains("local ABANDONED = 6\n"));
        assert!(lua.contains("local WAIT_BUCKETS = {100, 500, "));
        assert!(lua.contains(", 3600000}\n"));
        assert!(lua.contains("local MAX_TICKETS = 67104768\n"));
        assert!(lua.contains("local RESIZE_SHRINK = {from = {'hand', 'tray'}, to = 'debt'}\n"));
        assert!(lua.contains("[5] = 'c_leaves'"));
        assert!(lua.contains("local LIVE = {[0] = true, "));
        assert!(lua.contains("local MODE_ADMITS = {queue = true, passthrough = true}\n"));
        assert!(lua.contains("local MODE_CLOSES = {sold_out = true}\n"));
    }
}
