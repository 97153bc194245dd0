//! What an operator sets for a room: its identity, its size and its timeouts.
//!
//! These are plain, already-validated values. Parsing and validation live in
//! `config` (for the TOML file) and in the admin API (for JSON); the engine
//! trusts what it is given here (a room's id, [`RoomId`], can only be built
//! from a valid name).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rules::Mode;
use crate::access::{AccessPatch, AccessSettings};
use crate::ids::RoomId;
use crate::patch::Patch;

/// How the pre-queue (visitors who joined before `opens_at`) is ordered at
/// opening.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Shuffle the pre-queue once, so arriving early or refreshing gains
    /// nothing; later arrivals queue first-come first-served behind it.
    #[default]
    Lottery,
    /// Keep arrival order for everyone.
    Fifo,
}

/// Everything the engine needs to run one room. Times are wall-clock Unix
/// milliseconds so that they survive a restart and cross instances.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomSettings {
    pub id: RoomId,
    /// Visitors admitted at once (the semaphore's permits).
    pub capacity: u32,
    /// How often the room's worker admits from the head and reaps timeouts.
    pub tick: Duration,
    /// An admitted visitor idle this long loses the permit.
    pub pass_idle: Duration,
    /// An admitted visitor who never shows up within this loses the permit.
    pub arrival_grace: Duration,
    /// A waiting visitor with no stream and no poll for this long is skipped.
    pub queue_idle: Duration,
    /// A waiting visitor whose stream closed (and who has not polled) for
    /// this long is away: skipped at the head, keeping the number, until
    /// they come back. Shorter than `queue_idle`.
    #[serde(default = "default_away_grace")]
    pub away_grace: Duration,
    /// New tickets per client address per minute, in any sliding minute;
    /// 0 = off. A coarse net against one machine taking the line, not a
    /// bot defence: thousands of real phones can share one address.
    pub join_limit_per_minute: u32,
    /// A cap on new admissions per minute, besides capacity; `None` = no cap.
    pub admit_per_minute: Option<u32>,
    /// Unix milliseconds at which the room opens; `None` = open now.
    pub opens_at: Option<u64>,
    pub order: Order,
    /// Admission stopped by an operator; joins still queue.
    pub paused: bool,
    /// How the room queues now (`rules::Mode`): the fair line,
    /// passthrough, maintenance or sold out.
    #[serde(default)]
    pub mode: Mode,
    /// Units left to sell; `None` for a room that does not count stock.
    /// Purchases reported on release take from it; at zero the room is
    /// sold out.
    #[serde(default)]
    pub stock: Option<u64>,
    /// What a join must show (proof of work, an enqueue token). The engine
    /// keeps these with the rest for the backends to store; the HTTP
    /// layer checks them before a join reaches the engine. Boxed: they are
    /// larger than everything else here and rarely read.
    pub access: Box<AccessSettings>,
    /// The directory of the room's own page templates, as the operator
    /// wrote it; `None` for the instance's pages. The engine only keeps it
    /// for the backends to store; the HTTP layer loads it.
    pub templates_dir: Option<String>,
    /// Priority lanes, in order (`rules::lanes`); empty for one line.
    /// Set when the room is made: a room's lanes do not change under the
    /// people standing in them.
    #[serde(default)]
    pub lanes: Vec<LaneSpec>,
    /// The lane of a join that names none; one of `lanes`' names, `None`
    /// when the room has no lanes.
    #[serde(default)]
    pub default_lane: Option<String>,
    /// How long a signed pass (the JWT proxies verify by themselves) is
    /// valid after the gate mints it. A released or revoked permit's pass
    /// stays valid until then, so this bounds the admissions beyond
    /// capacity to release rate × lifetime; a visitor asks the gate about
    /// once per lifetime.
    pub pass_lifetime: Duration,
    /// How many people ahead, at most, when a visitor who asked to be
    /// called back is told their turn nears; `None`: about two minutes of
    /// admissions at the room's rate (`rules::ahead_distance`).
    #[serde(default)]
    pub notify_ahead: Option<u32>,
    /// The gate's traffic rules (`crate::rules`), in order. Kept for the
    /// backends to store, like `access`; the HTTP layer compiles and
    /// applies them.
    #[serde(default)]
    pub rules: Vec<crate::rules::Rule>,
    /// The parts of the site (`crate::routes`) a gate without a room sends
    /// here. Kept for the backends to store; the HTTP layer routes by them.
    #[serde(default)]
    pub routes: Vec<crate::routes::Route>,
    /// Let the room's owner set `admit_per_minute` (and maybe `capacity`)
    /// from the origin's health (`crate::autotune`); `None`: off. Kept for
    /// the backends to store; the tuner reads it, and its rule is
    /// `rules::autotune`.
    #[serde(default)]
    pub autotune: Option<Box<crate::autotune::Autotune>>,
}

/// One priority lane: its name (what an enqueue token's `lane` claim says)
/// and its weight, its share of the room's permits while it has people
/// waiting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LaneSpec {
    /// Lower-case letters, digits, `-` and `_`, at most 64 characters.
    #[schema(example = "members")]
    pub name: String,
    /// 1 to 1000.
    #[schema(example = 30, minimum = 1, maximum = 1000)]
    pub weight: u32,
}

/// A join named a lane the room does not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this room has no lane named {0:?}")]
pub(crate) struct UnknownLane(pub String);

fn default_away_grace() -> Duration {
    RoomSettings::DEFAULT_AWAY_GRACE
}

impl RoomSettings {
    pub(crate) const DEFAULT_CAPACITY: u32 = 100;
    /// Long enough for a phone passing through a tunnel.
    pub(crate) const DEFAULT_AWAY_GRACE: Duration = Duration::from_secs(20);
    /// High enough that a carrier-grade NAT with a few thousand phones
    /// behind one address, all joining in the opening minute, is never
    /// refused (each visitor needs one new ticket; twice that is headroom
    /// for private windows and second devices), low enough that one
    /// machine cannot fill the line at line rate. Bots are for proof of
    /// work and enqueue tokens to stop.
    pub const DEFAULT_JOIN_LIMIT_PER_MINUTE: u32 = 10_000;
    /// A minute: a visitor browsing asks the gate about once a minute,
    /// and a released permit's pass lets its holder on for at most that.
    pub(crate) const DEFAULT_PASS_LIFETIME: Duration = Duration::from_secs(60);

    /// A room with the documented defaults.
    pub fn new(id: RoomId) -> Self {
        Self {
            id,
            capacity: Self::DEFAULT_CAPACITY,
            tick: Duration::from_secs(1),
            pass_idle: Duration::from_secs(10 * 60),
            arrival_grace: Duration::from_secs(2 * 60),
            queue_idle: Duration::from_secs(5 * 60),
            away_grace: Self::DEFAULT_AWAY_GRACE,
            join_limit_per_minute: Self::DEFAULT_JOIN_LIMIT_PER_MINUTE,
            admit_per_minute: None,
            opens_at: None,
            order: Order::Lottery,
            paused: false,
            mode: Mode::Queue,
            stock: None,
            access: Box::default(),
            templates_dir: None,
            lanes: Vec::new(),
            default_lane: None,
            pass_lifetime: Self::DEFAULT_PASS_LIFETIME,
            notify_ahead: None,
            rules: Vec::new(),
            routes: Vec::new(),
            autotune: None,
        }
    }

    /// The most lanes a room may have.
    pub(crate) const MAX_LANES: usize = super::rules::MAX_LANES;

    /// The lane a join goes to: the one it names, else the default.
    pub(crate) fn lane_of(&self, name: Option<&str>) -> Result<u8, UnknownLane> {
        let Some(name) = name.or(self.default_lane.as_deref()) else {
            return Ok(0);
        };
        match self.lanes.iter().position(|l| l.name == name) {
            Some(i) => Ok(i as u8),
            // A room without lanes queues everyone in its one line, a
            // token's lane claim included.
            None if self.lanes.is_empty() => Ok(0),
            None => Err(UnknownLane(name.to_owned())),
        }
    }

    /// A lane's name; `None` for a room without lanes.
    pub(crate) fn lane_name(&self, lane: u8) -> Option<&str> {
        self.lanes.get(usize::from(lane)).map(|l| l.name.as_str())
    }

    /// Each lane's weight, in order (`[1]` for a room without lanes).
    pub(crate) fn lane_weights(&self) -> Vec<u32> {
        if self.lanes.is_empty() {
            return vec![1];
        }
        self.lanes.iter().map(|l| l.weight).collect()
    }
}

/// An operator's change to a running room, already validated: each field
/// left `None` stays as it is. Applied as one step, so two changes of
/// different fields made at once both take effect.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoomPatch {
    pub capacity: Option<u32>,
    pub paused: Option<bool>,
    /// A new mode; sold out when the stock given is 0
    /// (`rules::mode_with_stock`).
    pub mode: Option<Mode>,
    /// Set the stock left (`Null`: stop counting it).
    pub stock: Patch<u64>,
    /// Open a scheduled room now (its pre-queue is drawn at once).
    pub open_now: bool,
    pub tick: Option<Duration>,
    pub pass_idle: Option<Duration>,
    pub arrival_grace: Option<Duration>,
    pub queue_idle: Option<Duration>,
    pub away_grace: Option<Duration>,
    pub pass_lifetime: Option<Duration>,
    pub join_limit_per_minute: Option<u32>,
    /// `Null` removes the cap.
    pub admit_per_minute: Patch<u32>,
    /// `Null` goes back to the rate-based default.
    pub notify_ahead: Patch<u32>,
    /// Proof of work and enqueue tokens, rule by rule.
    pub access: AccessPatch,
    /// `Null` goes back to the instance's pages.
    pub templates_dir: Patch<String>,
    /// New weights of some of the room's lanes, by lane index (already
    /// checked against the room's lanes).
    pub lane_weights: Vec<(u8, u32)>,
    /// The room's new traffic rules, all of them (already checked).
    pub rules: Option<Vec<crate::rules::Rule>>,
    /// The room's autotune section, all of it (already checked); `Null`
    /// turns autotune off.
    pub autotune: Patch<Box<crate::autotune::Autotune>>,
}

impl RoomPatch {
    /// The settings with this change made (opening is an action, not a
    /// setting: see `open_now`).
    pub(crate) fn apply_to(&self, s: &mut RoomSettings) {
        if let Some(v) = self.capacity {
            s.capacity = v;
        }
        if let Some(v) = self.paused {
            s.paused = v;
        }
        if let Some(v) = self.mode {
            s.mode = v;
        }
        match self.stock {
            Patch::Absent => {}
            Patch::Null => s.stock = None,
            Patch::Value(v) => s.stock = Some(v),
        }
        if let Some(v) = self.tick {
            s.tick = v;
        }
        if let Some(v) = self.pass_idle {
            s.pass_idle = v;
        }
        if let Some(v) = self.arrival_grace {
            s.arrival_grace = v;
        }
        if let Some(v) = self.queue_idle {
            s.queue_idle = v;
        }
        if let Some(v) = self.away_grace {
            s.away_grace = v;
        }
        if let Some(v) = self.pass_lifetime {
            s.pass_lifetime = v;
        }
        if let Some(v) = self.join_limit_per_minute {
            s.join_limit_per_minute = v;
        }
        match self.admit_per_minute {
            Patch::Absent => {}
            Patch::Null => s.admit_per_minute = None,
            Patch::Value(v) => s.admit_per_minute = Some(v),
        }
        match self.notify_ahead {
            Patch::Absent => {}
            Patch::Null => s.notify_ahead = None,
            Patch::Value(v) => s.notify_ahead = Some(v),
        }
        self.access.apply_to(&mut s.access);
        match &self.templates_dir {
            Patch::Absent => {}
            Patch::Null => s.templates_dir = None,
            Patch::Value(v) => s.templates_dir = Some(v.clone()),
        }
        if let Some(rules) = &self.rules {
            s.rules.clone_from(rules);
        }
        match &self.autotune {
            Patch::Absent => {}
            Patch::Null => s.autotune = None,
            Patch::Value(a) => s.autotune = Some(a.clone()),
        }
        for &(lane, weight) in &self.lane_weights {
            if let Some(l) = s.lanes.get_mut(usize::from(lane)) {
                l.weight = weight;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_field_has_three_states() {
        #[derive(Deserialize)]
        struct Body {
            #[serde(default)]
            cap: Patch<u32>,
        }
        let parse = |json: &str| serde_json::from_str::<Body>(json).unwrap().cap;
        assert_eq!(parse("{}"), Patch::Absent);
        assert_eq!(parse(r#"{"cap": null}"#), Patch::Null);
        assert_eq!(parse(r#"{"cap": 5}"#), Patch::Value(5));
        let mut s = RoomSettings::new(RoomId::new("a").unwrap());
        s.admit_per_minute = Some(60);
        let keep = RoomPatch {
            capacity: Some(7),
            ..RoomPatch::default()
        };
        keep.apply_to(&mut s);
        assert_eq!((s.capacity, s.admit_per_minute), (7, Some(60)));
        let clear = RoomPatch {
            admit_per_minute: Patch::Null,
            ..RoomPatch::default()
        };
        clear.apply_to(&mut s);
        assert_eq!((s.capacity, s.admit_per_minute), (7, None));
    }
}
