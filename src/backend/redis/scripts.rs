//! The Lua scripts, one per operation, each run atomically by EVALSHA in
//! one round trip (`redis::Script` sends EVALSHA and loads the script on
//! NOSCRIPT, so a restarted or failed-over Redis is handled). Each room
//! script is built at start from three parts: the constants generated from
//! the Rust rules (`rules::lua_constants`: state codes, wait buckets,
//! limits, the capacity plans), `lib.lua` (ticket records, queue, hand-off,
//! the view's stored fields) and the script's own body.
//!
//! Time: every script takes "now" from the calling instance's clock rather
//! than Redis' TIME, so that the engine's `Clock` (and the conformance
//! suite's virtual time) drives both backends alike. Instances are expected
//! to run NTP; a skew of a few ms only moves timeouts by that much and
//! never affects order or capacity, which depend on the script's atomicity
//! alone.

use redis::Script;

use crate::engine::rules;

const LIB: &str = include_str!("lib.lua");

fn room_script(constants: &str, body: &str) -> Script {
    Script::new(&format!("{constants}{LIB}\n{body}"))
}

pub struct Scripts {
    pub join: Script,
    pub status: Script,
    pub presence: Script,
    pub depart: Script,
    pub tick: Script,
    pub publish: Script,
    pub create: Script,
    pub patch: Script,
    pub open: Script,
    pub close: Script,
    pub purchase: Script,
    pub snapshot: Script,
    pub follow: Script,
    pub lease_extend: Script,
    pub lease_release: Script,
}

impl Scripts {
    pub fn new() -> Self {
        let c = rules::lua_constants();
        Self {
            join: room_script(&c, include_str!("join.lua")),
            status: room_script(&c, include_str!("status.lua")),
            presence: room_script(&c, include_str!("presence.lua")),
            depart: room_script(&c, include_str!("depart.lua")),
            tick: room_script(&c, include_str!("tick.lua")),
            publish: room_script(&c, include_str!("publish.lua")),
            create: room_script(&c, include_str!("create.lua")),
            patch: room_script(&c, include_str!("patch.lua")),
            open: room_script(&c, include_str!("open.lua")),
            close: room_script(&c, include_str!("close.lua")),
            purchase: room_script(&c, include_str!("purchase.lua")),
            snapshot: room_script(&c, include_str!("snapshot.lua")),
            follow: room_script(&c, include_str!("follow.lua")),
            lease_extend: Script::new(include_str!("lease_extend.lua")),
            lease_release: Script::new(include_str!("lease_release.lua")),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
