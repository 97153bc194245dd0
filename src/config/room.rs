//! One room as an operator writes it: a `[[rooms]]` table in the config file,
//! or the JSON body of `PUT /admin/rooms/{room}`.
//!
//! [`RoomTable`] is the wire form (every key but `id` optional, durations as
//! `"10m"`, `opens_at` as RFC 3339) and [`RoomTable::into_settings`] turns it
//! into the engine's [`RoomSettings`], filling the documented defaults and
//! checking every limit. The same limits are available on their own as
//! [`validate_room`] for changes that do not go through a table (`PATCH`).

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::{ConfigError, join_field};
use crate::access::{AccessSettings, ChallengeMode, EnqueueMode, SharedKey};
use crate::engine::rules::{Mode, STOCK_MAX, mode_with_stock};
use crate::engine::{LaneSpec, Order, RoomId, RoomSettings};

/// Smallest and largest room: one permit up to a million (a bigger room is
/// not a waiting room any more).
pub(crate) const CAPACITY_MIN: u32 = 1;
pub(crate) const CAPACITY_MAX: u32 = 1_000_000;
/// A tick faster than 10 ms is busy-waiting; slower than a minute makes the
/// liveness promise ("a free permit meets a waiting ticket within a tick")
/// meaningless.
pub(crate) const TICK_MIN: Duration = Duration::from_millis(10);
pub(crate) const TICK_MAX: Duration = Duration::from_secs(60);
/// The longest timeout accepted, so that "now + timeout" in milliseconds can
/// never overflow and a typo like "10y" is caught rather than obeyed.
pub(crate) const TIMEOUT_MAX: Duration = Duration::from_secs(30 * 24 * 60 * 60);
/// 9999-12-30T22:00:00Z, the last whole millisecond `jiff` accepts, so the
/// admin API can always write an `opens_at` back as RFC 3339.
pub(crate) const OPENS_AT_MAX: u64 = 253_402_207_200_000;

/// The keys of one `[[rooms]]` table. Only `id` is required; every other key
/// falls back to the default of [`RoomSettings::new`].
///
/// It deserializes from TOML and from JSON alike, and serializes back to the
/// same shape, so the admin API can show a room in the form it accepts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RoomTable {
    /// The room. The path names it, so a `PUT` body may leave it out (the
    /// document marks it read-only); one that gives it must give the path's.
    #[schema(required = false, read_only)]
    pub id: RoomId,
    // The bounds in `schema` attributes repeat CAPACITY_MIN/MAX (the
    // attributes take literals only); a test in `http::openapi` keeps them
    // equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub capacity: Option<u32>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, example = "250ms")]
    pub tick: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, example = "10m")]
    pub pass_idle: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, example = "10m")]
    pub arrival_grace: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, example = "10m")]
    pub queue_idle: Option<Duration>,
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, example = "20s")]
    pub away_grace: Option<Duration>,
    /// How long a signed pass is valid (1s to 1h).
    #[serde(
        default,
        with = "opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, example = "60s")]
    pub pass_lifetime: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join_limit_per_minute: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub admit_per_minute: Option<u32>,
    /// Unix milliseconds; written as RFC 3339 with an offset.
    #[serde(
        default,
        with = "opt_opens_at",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub opens_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// `queue`, `passthrough`, `maintenance` or `sold_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Units left to sell; at 0 the room is sold out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock: Option<u64>,
    // Access: proof of work and enqueue tokens (crate::access).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<ChallengeMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 32)]
    pub pow_difficulty: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 32)]
    pub pow_difficulty_max: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub pow_rise_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueue: Option<EnqueueMode>,
    /// Shared keys are write-only: never written back out (the admin API
    /// shows whether one is set, not what it is).
    #[serde(default, skip_serializing)]
    #[schema(value_type = Option<String>, write_only)]
    pub enqueue_key: Option<SharedKey>,
    #[serde(default, skip_serializing)]
    #[schema(value_type = Option<String>, write_only)]
    pub enqueue_previous_key: Option<SharedKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueue_public_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueue_previous_public_key: Option<String>,
    /// The room's own page templates (and `messages/`), over the
    /// instance's; checked when the room is loaded or changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub templates_dir: Option<String>,
    /// Priority lanes (`[{name, weight}]`, at most 16): within a lane
    /// admission follows ticket order; across lanes permits are shared by
    /// weight. Set when the room is made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneSpec>,
    /// The lane of a join whose enqueue token names none (required with
    /// `lanes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_lane: Option<String>,
    /// How many people ahead, at most, when a visitor who asked to be
    /// called back (Web Push) is told their turn nears; by default about
    /// two minutes of admissions at the room's rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 200)]
    pub notify_ahead: Option<u32>,
    /// Traffic rules, tried in order on every gate check (and on joins);
    /// the first that matches decides (`bypass`, `queue`, `block` or
    /// `shadow`). A request no rule matches queues.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<crate::rules::Rule>,
    /// The parts of the site (host, path prefix) whose checks at `GET
    /// /gate`, without a room, come to this room; no two rooms may claim
    /// the same. Set when the room is made (with `PUT`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<crate::routes::Route>,
    /// Let Narabu set `admit_per_minute` (and, with capacity bounds,
    /// `capacity`) from the origin's health: bounds, targets and a signal
    /// (`probe`, `metrics`). Off when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<crate::autotune::Autotune>,
}

impl RoomTable {
    /// A table naming only the room: every setting at its default.
    #[cfg(test)]
    pub(crate) fn new(id: RoomId) -> Self {
        Self {
            id,
            capacity: None,
            tick: None,
            pass_idle: None,
            arrival_grace: None,
            queue_idle: None,
            away_grace: None,
            pass_lifetime: None,
            join_limit_per_minute: None,
            admit_per_minute: None,
            opens_at: None,
            order: None,
            paused: None,
            mode: None,
            stock: None,
            challenge: None,
            pow_difficulty: None,
            pow_difficulty_max: None,
            pow_rise_per_second: None,
            enqueue: None,
            enqueue_key: None,
            enqueue_previous_key: None,
            enqueue_public_key: None,
            enqueue_previous_public_key: None,
            templates_dir: None,
            lanes: Vec::new(),
            default_lane: None,
            notify_ahead: None,
            rules: Vec::new(),
            routes: Vec::new(),
            autotune: None,
        }
    }

    /// Fills in defaults and checks every limit. Errors name the field as
    /// `{field_prefix}.{key}` (e.g. `rooms[1].capacity`), or just `{key}`
    /// when the prefix is empty, as it is for an admin API body.
    pub(crate) fn into_settings(self, field_prefix: &str) -> Result<RoomSettings, ConfigError> {
        let mut s = RoomSettings::new(self.id.clone());
        if let Some(v) = self.capacity {
            s.capacity = v;
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
        s.admit_per_minute = self.admit_per_minute;
        s.opens_at = self.opens_at;
        if let Some(v) = self.order {
            s.order = v;
        }
        if let Some(v) = self.paused {
            s.paused = v;
        }
        let field = |name: &str| join_field(field_prefix, name);
        if let Some(v) = self.stock {
            check_stock(&field("stock"), v)?;
            s.stock = Some(v);
        }
        s.mode = stock_mode(&field("mode"), self.mode, s.stock)?.unwrap_or_default();
        self.fill_access(&mut s.access);
        s.templates_dir = self.templates_dir;
        s.lanes = self.lanes;
        s.default_lane = self.default_lane;
        s.notify_ahead = self.notify_ahead;
        s.rules = self.rules;
        s.routes = self.routes;
        s.autotune = self.autotune.map(Box::new);
        validate_room(&s, field_prefix)?;
        Ok(s)
    }
}

impl RoomTable {
    /// The access keys of this table over `a`. A new difficulty without a
    /// maximum keeps a fixed difficulty fixed, and a rising one rising.
    pub(crate) fn fill_access(&self, a: &mut AccessSettings) {
        if let Some(v) = self.challenge {
            a.challenge = v;
        }
        if let Some(v) = self.pow_difficulty {
            a.pow_difficulty_max = if a.pow_difficulty_max == a.pow_difficulty {
                v
            } else {
                a.pow_difficulty_max.max(v)
            };
            a.pow_difficulty = v;
        }
        if let Some(v) = self.pow_difficulty_max {
            a.pow_difficulty_max = v;
        }
        if let Some(v) = self.pow_rise_per_second {
            a.pow_rise_per_second = v;
        }
        if let Some(v) = self.enqueue {
            a.enqueue = v;
        }
        for (to, from) in [
            (&mut a.enqueue_key, &self.enqueue_key),
            (&mut a.enqueue_previous_key, &self.enqueue_previous_key),
        ] {
            if from.is_some() {
                to.clone_from(from);
            }
        }
        for (to, from) in [
            (&mut a.enqueue_public_key, &self.enqueue_public_key),
            (
                &mut a.enqueue_previous_public_key,
                &self.enqueue_previous_public_key,
            ),
        ] {
            if from.is_some() {
                to.clone_from(from);
            }
        }
    }
}

/// Every key written out, so that a table made from a room's settings
/// describes it completely, except shared keys (write-only).
impl From<&RoomSettings> for RoomTable {
    fn from(s: &RoomSettings) -> Self {
        Self {
            id: s.id.clone(),
            capacity: Some(s.capacity),
            tick: Some(s.tick),
            pass_idle: Some(s.pass_idle),
            arrival_grace: Some(s.arrival_grace),
            queue_idle: Some(s.queue_idle),
            away_grace: Some(s.away_grace),
            pass_lifetime: Some(s.pass_lifetime),
            join_limit_per_minute: Some(s.join_limit_per_minute),
            admit_per_minute: s.admit_per_minute,
            opens_at: s.opens_at,
            order: Some(s.order),
            paused: Some(s.paused),
            mode: Some(s.mode),
            stock: s.stock,
            challenge: Some(s.access.challenge),
            pow_difficulty: Some(s.access.pow_difficulty),
            pow_difficulty_max: Some(s.access.pow_difficulty_max),
            pow_rise_per_second: Some(s.access.pow_rise_per_second),
            enqueue: Some(s.access.enqueue),
            enqueue_key: None,
            enqueue_previous_key: None,
            enqueue_public_key: s.access.enqueue_public_key.clone(),
            enqueue_previous_public_key: s.access.enqueue_previous_public_key.clone(),
            templates_dir: s.templates_dir.clone(),
            lanes: s.lanes.clone(),
            default_lane: s.default_lane.clone(),
            notify_ahead: s.notify_ahead,
            rules: s.rules.clone(),
            routes: s.routes.clone(),
            autotune: s.autotune.as_deref().cloned(),
        }
    }
}

/// The largest `notify_ahead`: past a line of this length a call "N ahead"
/// tells nobody anything.
pub(crate) const MAX_NOTIFY_AHEAD: u32 = 1_000_000;

/// The limits every room must keep, however its settings were made.
pub(crate) fn validate_room(s: &RoomSettings, field_prefix: &str) -> Result<(), ConfigError> {
    let field = |name: &str| join_field(field_prefix, name);
    check_capacity(&field("capacity"), s.capacity)?;
    check_tick(&field("tick"), s.tick)?;
    for (name, value) in [
        ("pass_idle", s.pass_idle),
        ("arrival_grace", s.arrival_grace),
        ("queue_idle", s.queue_idle),
    ] {
        check_timeout(&field(name), value)?;
    }
    check_away_grace(&field("away_grace"), s.away_grace, s.queue_idle)?;
    check_pass_lifetime(&field("pass_lifetime"), s.pass_lifetime)?;
    if let Some(n) = s.notify_ahead
        && n > MAX_NOTIFY_AHEAD
    {
        return Err(ConfigError::new(
            field("notify_ahead"),
            format!("must be at most {MAX_NOTIFY_AHEAD}, got {n}"),
        ));
    }
    if let Some(cap) = s.admit_per_minute {
        check_admit_per_minute(&field("admit_per_minute"), cap)?;
    }
    s.access
        .validate()
        .map_err(|(key, message)| ConfigError::new(field(key), message))?;
    if let Some(dir) = &s.templates_dir {
        check_templates_dir(&field("templates_dir"), dir)?;
    }
    check_lanes(field_prefix, &s.lanes, s.default_lane.as_deref())?;
    check_rules(field_prefix, &s.rules)?;
    crate::routes::validate(&s.routes)
        .map_err(|(key, message)| ConfigError::new(join_field(field_prefix, &key), message))?;
    if let Some(a) = &s.autotune {
        check_autotune(field_prefix, a)?;
    }
    if let Some(at) = s.opens_at
        && at > OPENS_AT_MAX
    {
        return Err(ConfigError::new(
            field("opens_at"),
            "must be before the year 10000",
        ));
    }
    Ok(())
}

/// A room's autotune section, the failing key named
/// (`rooms[0].autotune.max_rate`).
pub(crate) fn check_autotune(
    field_prefix: &str,
    a: &crate::autotune::Autotune,
) -> Result<(), ConfigError> {
    a.validate()
        .map_err(|(key, message)| ConfigError::new(join_field(field_prefix, &key), message))
}

/// A room's traffic rules, the failing one named with its field
/// (`rooms[0].rules[2].network[1]`); each `network_file` is read, and one
/// that does not read is named with its line.
pub(crate) fn check_rules(
    field_prefix: &str,
    rules: &[crate::rules::Rule],
) -> Result<(), ConfigError> {
    crate::rules::validate(rules)
        .and_then(|()| crate::rules::check_files(rules))
        .map_err(|e| ConfigError::new(join_field(field_prefix, &e.field), e.message))
}

/// A directory path as text: what it holds is checked by the pages' own
/// loader, which names the file and line of what is wrong.
/// Lanes: at most [`RoomSettings::MAX_LANES`], names as an enqueue
/// token's `lane` claim allows them and each once, weights 1 to 1000, and
/// a `default_lane` that is one of them (required with lanes, refused
/// without).
pub(crate) fn check_lanes(
    field_prefix: &str,
    lanes: &[LaneSpec],
    default_lane: Option<&str>,
) -> Result<(), ConfigError> {
    let field = |name: &str| join_field(field_prefix, name);
    if lanes.len() > RoomSettings::MAX_LANES {
        return Err(ConfigError::new(
            field("lanes"),
            format!(
                "at most {} lanes, not {}",
                RoomSettings::MAX_LANES,
                lanes.len()
            ),
        ));
    }
    for (i, lane) in lanes.iter().enumerate() {
        let at = |key: &str| field(&format!("lanes[{i}].{key}"));
        if !crate::access::is_lane_name(&lane.name) {
            return Err(ConfigError::new(
                at("name"),
                "1 to 64 characters of a-z, 0-9, '-' and '_'",
            ));
        }
        if lanes[..i].iter().any(|l| l.name == lane.name) {
            return Err(ConfigError::new(
                at("name"),
                format!("{:?} names two lanes", lane.name),
            ));
        }
        if !(1..=1000).contains(&lane.weight) {
            return Err(ConfigError::new(
                at("weight"),
                format!("must be 1 to 1000, not {}", lane.weight),
            ));
        }
    }
    match (lanes.is_empty(), default_lane) {
        (true, None) => Ok(()),
        (true, Some(_)) => Err(ConfigError::new(
            field("default_lane"),
            "the room has no lanes (set `lanes` too)",
        )),
        (false, None) => Err(ConfigError::new(
            field("default_lane"),
            "required with `lanes`: the lane of joins whose enqueue token names none",
        )),
        (false, Some(name)) if lanes.iter().any(|l| l.name == name) => Ok(()),
        (false, Some(name)) => Err(ConfigError::new(
            field("default_lane"),
            format!("{name:?} is not one of the room's lanes"),
        )),
    }
}

pub(crate) fn check_templates_dir(field: &str, dir: &str) -> Result<(), ConfigError> {
    if dir.trim().is_empty() {
        return Err(ConfigError::new(
            field,
            "must name a directory (leave it out for the instance's pages)",
        ));
    }
    if dir.len() > 4096 || dir.contains('\0') {
        return Err(ConfigError::new(field, "is not a usable path"));
    }
    Ok(())
}

/// The limits of each setting on its own, for changes of a few fields
/// (`PATCH`): each field's limit depends on that field alone.
pub(crate) fn check_capacity(field: &str, capacity: u32) -> Result<(), ConfigError> {
    if (CAPACITY_MIN..=CAPACITY_MAX).contains(&capacity) {
        return Ok(());
    }
    Err(ConfigError::new(
        field,
        format!("must be between {CAPACITY_MIN} and {CAPACITY_MAX}, got {capacity}"),
    ))
}

pub(crate) fn check_tick(field: &str, tick: Duration) -> Result<(), ConfigError> {
    if (TICK_MIN..=TICK_MAX).contains(&tick) {
        return Ok(());
    }
    Err(ConfigError::new(
        field,
        format!(
            "must be between {} and {}, got {}",
            show(TICK_MIN),
            show(TICK_MAX),
            show(tick)
        ),
    ))
}

/// `pass_idle`, `arrival_grace`, `queue_idle`.
pub(crate) fn check_timeout(field: &str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::new(field, "must be more than 0"));
    }
    if value > TIMEOUT_MAX {
        return Err(ConfigError::new(
            field,
            format!("must be at most {}, got {}", show(TIMEOUT_MAX), show(value)),
        ));
    }
    Ok(())
}

/// A signed pass lives at least a second (its times are whole seconds)
/// and at most an hour: past that, a released permit's pass would let its
/// holder on for too long to call the room's capacity a limit.
pub(crate) const PASS_LIFETIME_MIN: Duration = Duration::from_secs(1);
pub(crate) const PASS_LIFETIME_MAX: Duration = Duration::from_secs(60 * 60);

pub(crate) fn check_pass_lifetime(field: &str, value: Duration) -> Result<(), ConfigError> {
    if (PASS_LIFETIME_MIN..=PASS_LIFETIME_MAX).contains(&value) {
        return Ok(());
    }
    Err(ConfigError::new(
        field,
        format!(
            "must be between {} and {}, got {}",
            show(PASS_LIFETIME_MIN),
            show(PASS_LIFETIME_MAX),
            show(value)
        ),
    ))
}

/// The shortest `away_grace`: below a second a stream's reconnect (the
/// browser waits a few seconds) could not keep its place.
pub(crate) const AWAY_GRACE_MIN: Duration = Duration::from_secs(1);

/// `away_grace`: at least a second, and shorter than `queue_idle` (an away
/// ticket must be able to come back before it is abandoned).
pub(crate) fn check_away_grace(
    field: &str,
    away_grace: Duration,
    queue_idle: Duration,
) -> Result<(), ConfigError> {
    if away_grace < AWAY_GRACE_MIN {
        return Err(ConfigError::new(
            field,
            format!(
                "must be at least {}, got {}",
                show(AWAY_GRACE_MIN),
                show(away_grace)
            ),
        ));
    }
    if away_grace >= queue_idle {
        return Err(ConfigError::new(
            field,
            format!(
                "must be shorter than queue_idle ({}), got {}",
                show(queue_idle),
                show(away_grace)
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check_stock(field: &str, stock: u64) -> Result<(), ConfigError> {
    if stock <= STOCK_MAX {
        return Ok(());
    }
    Err(ConfigError::new(
        field,
        format!("must be at most {STOCK_MAX}, got {stock}"),
    ))
}

/// The mode a room is given beside its stock (`rules::mode_with_stock`):
/// a stock of 0 is sold out, so another mode given with it is refused
/// rather than silently overridden. `None`: no mode given, none implied.
pub(crate) fn stock_mode(
    field: &str,
    mode: Option<Mode>,
    stock: Option<u64>,
) -> Result<Option<Mode>, ConfigError> {
    let implied = mode_with_stock(mode.unwrap_or_default(), stock);
    match mode {
        Some(m) if m != implied => Err(ConfigError::new(
            field,
            format!(
                "cannot be {m} while stock is 0 (the room is sold out: give more stock to reopen it)"
            ),
        )),
        _ if implied.closes() => Ok(Some(implied)),
        _ => Ok(mode),
    }
}

pub(crate) fn check_admit_per_minute(field: &str, cap: u32) -> Result<(), ConfigError> {
    if cap == 0 {
        return Err(ConfigError::new(
            field,
            "must be at least 1 (leave it out for no cap), got 0",
        ));
    }
    Ok(())
}

fn show(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

/// Durations as humans write them: "500ms", "1s", "10m", "1h 30m".
pub(crate) mod opt_duration {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<DurationText>::deserialize(d)?.map(|t| t.0))
    }

    struct DurationText(Duration);

    impl<'de> Deserialize<'de> for DurationText {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(DurationVisitor).map(DurationText)
        }
    }

    struct DurationVisitor;

    impl Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#"a duration such as "500ms", "1s" or "10m""#)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            humantime::parse_duration(v.trim()).map_err(|e| {
                E::custom(format_args!(
                    r#"expected a duration such as "500ms", "1s" or "10m", got {v:?} ({e})"#
                ))
            })
        }
    }
}

/// `opens_at`: an RFC 3339 time with an explicit offset, because a local
/// time would open the sale at a different instant on every server. TOML's
/// own datetime syntax (unquoted) is accepted as well as a string.
mod opt_opens_at {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(ms) => {
                let ts = i64::try_from(*ms)
                    .ok()
                    .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
                    .ok_or_else(|| serde::ser::Error::custom("opens_at is out of range"))?;
                s.collect_str(&ts)
            }
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Ok(Option::<OpensAt>::deserialize(d)?.map(|t| t.0))
    }

    struct OpensAt(u64);

    impl<'de> Deserialize<'de> for OpensAt {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(OpensAtVisitor).map(OpensAt)
        }
    }

    struct OpensAtVisitor;

    const EXPECTING: &str =
        r#"an RFC 3339 time with an offset, such as "2026-12-01T10:00:00+09:00""#;

    impl<'de> Visitor<'de> for OpensAtVisitor {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(EXPECTING)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse_rfc3339_ms(v).map_err(E::custom)
        }

        // TOML hands an unquoted datetime over as a one-entry map.
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<u64, A::Error> {
            let dt =
                toml::value::Datetime::deserialize(de::value::MapAccessDeserializer::new(map))?;
            parse_rfc3339_ms(&dt.to_string()).map_err(de::Error::custom)
        }
    }

    /// Unix milliseconds of an RFC 3339 time that carries its offset.
    pub(crate) fn parse_rfc3339_ms(text: &str) -> Result<u64, String> {
        let ts: jiff::Timestamp = text
            .trim()
            .parse()
            .map_err(|e| format!("expected {EXPECTING}, got {text:?} ({e})"))?;
        u64::try_from(ts.as_millisecond())
            .map_err(|_| format!("must be after 1970-01-01T00:00:00Z, got {text:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::opt_opens_at::parse_rfc3339_ms;
    use super::*;

    fn id(s: &str) -> RoomId {
        RoomId::new(s).expect("a valid test room id")
    }

    fn from_toml(text: &str) -> Result<RoomTable, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn only_id_is_required_and_the_rest_defaults() {
        let t = from_toml("id = \"sale\"").expect("a minimal table");
        assert_eq!(t, RoomTable::new(id("sale")));
        let s = t.into_settings("rooms[0]").expect("defaults are valid");
        assert_eq!(s, RoomSettings::new(id("sale")));
        assert!(from_toml("capacity = 5").is_err(), "id is required");
    }

    #[test]
    fn every_key_is_read() {
        let t = from_toml(
            r#"
            id = "sale"
            capacity = 500
            tick = "250ms"
            pass_idle = "15m"
            arrival_grace = "90s"
            queue_idle = "1h"
            join_limit_per_minute = 0
            admit_per_minute = 600
            opens_at = "2026-12-01T10:00:00+09:00"
            order = "fifo"
            paused = true
            "#,
        )
        .expect("a full table");
        let s = t.into_settings("rooms[0]").expect("valid");
        assert_eq!(s.capacity, 500);
        assert_eq!(s.tick, Duration::from_millis(250));
        assert_eq!(s.pass_idle, Duration::from_secs(15 * 60));
        assert_eq!(s.arrival_grace, Duration::from_secs(90));
        assert_eq!(s.queue_idle, Duration::from_secs(3600));
        assert_eq!(s.join_limit_per_minute, 0);
        assert_eq!(s.admit_per_minute, Some(600));
        // 2026-12-01T01:00:00Z
        assert_eq!(s.opens_at, Some(1_796_086_800_000));
        assert_eq!(s.order, Order::Fifo);
        assert!(s.paused);
    }

    #[test]
    fn opens_at_needs_an_offset_and_accepts_toml_datetimes() {
        let quoted = from_toml(
            r#"id = "a"
opens_at = "2026-12-01T01:00:00Z""#,
        )
        .expect("Z is an offset");
        let bare = from_toml("id = \"a\"\nopens_at = 2026-12-01T10:00:00+09:00")
            .expect("an unquoted TOML datetime");
        assert_eq!(quoted.opens_at, Some(1_796_086_800_000));
        assert_eq!(bare.opens_at, quoted.opens_at);

        for bad in [
            "opens_at = \"2026-12-01T10:00:00\"",
            "opens_at = 2026-12-01T10:00:00",
            "opens_at = 2026-12-01",
            "opens_at = \"tomorrow\"",
            "opens_at = \"1969-12-31T23:59:59Z\"",
            "opens_at = 1796086800000",
        ] {
            let err = from_toml(&format!("id = \"a\"\n{bad}"));
            assert!(err.is_err(), "{bad} should be refused");
        }
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.001Z"), Ok(1));
    }

    #[test]
    fn durations_are_human_strings_only() {
        for bad in [
            "tick = 1",
            "tick = \"1 parsec\"",
            "tick = \"\"",
            "tick = \"-1s\"",
        ] {
            assert!(from_toml(&format!("id = \"a\"\n{bad}")).is_err(), "{bad}");
        }
        let t = from_toml("id = \"a\"\ntick = \"1s 500ms\"").expect("compound duration");
        assert_eq!(t.tick, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = from_toml("id = \"a\"\ncapcity = 5").expect_err("a typo");
        assert!(err.message().contains("capcity"), "{err}");
    }

    #[test]
    fn limits_are_checked_with_the_field_named() {
        let cases: [(&str, &str); 12] = [
            (
                "capacity = 0",
                "rooms[1].capacity: must be between 1 and 1000000, got 0",
            ),
            (
                "capacity = 1000001",
                "rooms[1].capacity: must be between 1 and 1000000, got 1000001",
            ),
            (
                "tick = \"5ms\"",
                "rooms[1].tick: must be between 10ms and 1m, got 5ms",
            ),
            (
                "tick = \"61s\"",
                "rooms[1].tick: must be between 10ms and 1m, got 1m 1s",
            ),
            (
                "pass_idle = \"0s\"",
                "rooms[1].pass_idle: must be more than 0",
            ),
            (
                "arrival_grace = \"0ms\"",
                "rooms[1].arrival_grace: must be more than 0",
            ),
            (
                "queue_idle = \"0s\"",
                "rooms[1].queue_idle: must be more than 0",
            ),
            (
                "queue_idle = \"31days\"",
                "rooms[1].queue_idle: must be at most 30days, got ",
            ),
            (
                "pass_idle = \"10y\"",
                "rooms[1].pass_idle: must be at most 30days",
            ),
            (
                "admit_per_minute = 0",
                "rooms[1].admit_per_minute: must be at least 1",
            ),
            ("opens_at = \"9999-12-30T22:00:00Z\"", ""),
            ("capacity = 1", ""),
        ];
        for (line, want) in cases {
            let table = from_toml(&format!("id = \"a\"\n{line}")).expect("well-formed");
            match table.into_settings("rooms[1]") {
                Ok(_) => assert_eq!(want, "", "{line} should be refused"),
                Err(e) => {
                    assert!(!want.is_empty(), "{line} should be accepted, got {e}");
                    assert!(e.to_string().starts_with(want), "{line}: {e}");
                }
            }
        }
    }

    #[test]
    fn lanes_are_checked_with_the_field_named() {
        let two =
            r#"lanes = [{ name = "members", weight = 30 }, { name = "general", weight = 70 }]"#;
        let cases = [
            (format!("{two}\ndefault_lane = \"general\""), ""),
            (
                two.to_owned(),
                "rooms[1].default_lane: required with `lanes`",
            ),
            (
                format!("{two}\ndefault_lane = \"vip\""),
                "rooms[1].default_lane: \"vip\" is not one of the room's lanes",
            ),
            (
                "default_lane = \"general\"".to_owned(),
                "rooms[1].default_lane: the room has no lanes",
            ),
            (
                "lanes = [{ name = \"a\", weight = 1 }, { name = \"a\", weight = 2 }]\ndefault_lane = \"a\"".to_owned(),
                "rooms[1].lanes[1].name: \"a\" names two lanes",
            ),
            (
                "lanes = [{ name = \"Members!\", weight = 1 }]\ndefault_lane = \"Members!\"".to_owned(),
                "rooms[1].lanes[0].name: 1 to 64 characters",
            ),
            (
                "lanes = [{ name = \"a\", weight = 0 }]\ndefault_lane = \"a\"".to_owned(),
                "rooms[1].lanes[0].weight: must be 1 to 1000, not 0",
            ),
            (
                format!(
                    "lanes = [{}]\ndefault_lane = \"l0\"",
                    (0..17)
                        .map(|i| format!("{{ name = \"l{i}\", weight = 1 }}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "rooms[1].lanes: at most 16 lanes, not 17",
            ),
        ];
        for (lines, want) in cases {
            let table = from_toml(&format!("id = \"a\"\n{lines}")).expect("well-formed");
            match table.into_settings("rooms[1]") {
                Ok(s) => {
                    assert_eq!(want, "", "{lines} should be refused");
                    assert_eq!(s.lane_of(None), Ok(1));
                    assert_eq!(s.lane_of(Some("members")), Ok(0));
                    assert!(s.lane_of(Some("vip")).is_err());
                    // And back out in the shape it came in.
                    let back = RoomTable::from(&s);
                    assert_eq!(back.lanes.len(), 2);
                    assert_eq!(back.default_lane.as_deref(), Some("general"));
                }
                Err(e) => {
                    assert!(!want.is_empty(), "{lines} should be accepted, got {e}");
                    assert!(e.to_string().starts_with(want), "{lines}: {e}");
                }
            }
        }
        // A lane entry with an unknown key is a typo, caught.
        assert!(from_toml("id = \"a\"\nlanes = [{ name = \"a\", weigth = 1 }]").is_err());
    }

    #[test]
    fn edges_of_the_limits_are_accepted() {
        let mut t = RoomTable::new(id("a"));
        t.capacity = Some(CAPACITY_MAX);
        t.tick = Some(TICK_MIN);
        t.pass_idle = Some(TIMEOUT_MAX);
        t.arrival_grace = Some(Duration::from_millis(1));
        t.opens_at = Some(0);
        assert!(t.clone().into_settings("").is_ok());
        t.tick = Some(TICK_MAX);
        t.capacity = Some(CAPACITY_MIN);
        assert!(t.into_settings("").is_ok());
    }

    #[test]
    fn opens_at_max_is_the_last_representable_instant() {
        let last = i64::try_from(OPENS_AT_MAX).expect("fits");
        assert!(jiff::Timestamp::from_millisecond(last).is_ok());
        assert!(jiff::Timestamp::from_millisecond(last + 1).is_err());
        let mut s = RoomSettings::new(id("a"));
        s.opens_at = Some(OPENS_AT_MAX + 1);
        let e = validate_room(&s, "").expect_err("past the end");
        assert_eq!(e.field(), "opens_at");
        s.opens_at = Some(OPENS_AT_MAX);
        let json = serde_json::to_string(&RoomTable::from(&s)).expect("serializes");
        let back: RoomTable = serde_json::from_str(&json).expect("parses back");
        assert_eq!(back.opens_at, Some(OPENS_AT_MAX));
    }

    #[test]
    fn an_empty_prefix_names_the_bare_key() {
        let mut t = RoomTable::new(id("a"));
        t.capacity = Some(0);
        let e = t.into_settings("").expect_err("capacity 0");
        assert_eq!(e.field(), "capacity");
        assert_eq!(
            e.to_string(),
            "capacity: must be between 1 and 1000000, got 0"
        );
    }

    #[test]
    fn json_bodies_parse_like_tables() {
        let t: RoomTable = serde_json::from_str(
            r#"{"id":"sale","capacity":20,"tick":"500ms","opens_at":"2026-12-01T10:00:00+09:00","order":"lottery","paused":false}"#,
        )
        .expect("a JSON room");
        assert_eq!(t.capacity, Some(20));
        assert_eq!(t.tick, Some(Duration::from_millis(500)));
        assert_eq!(t.opens_at, Some(1_796_086_800_000));
        let nulls: RoomTable =
            serde_json::from_str(r#"{"id":"sale","tick":null,"opens_at":null}"#).expect("nulls");
        assert_eq!(nulls, RoomTable::new(id("sale")));
        for bad in [
            r#"{"id":"Sale"}"#,
            r#"{"capacity":3}"#,
            r#"{"id":"a","capacity":-1}"#,
            r#"{"id":"a","tick":1000}"#,
            r#"{"id":"a","order":"random"}"#,
            r#"{"id":"a","surprise":1}"#,
            r#"{"id":"a","opens_at":{"x":1}}"#,
            r#"[]"#,
        ] {
            assert!(serde_json::from_str::<RoomTable>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_round_trip_through_json() {
        let mut s = RoomSettings::new(id("sale"));
        s.capacity = 7;
        s.tick = Duration::from_millis(1500);
        s.admit_per_minute = Some(60);
        s.opens_at = Some(1_796_086_800_123);
        s.order = Order::Fifo;
        s.paused = true;
        let json = serde_json::to_string(&RoomTable::from(&s)).expect("serializes");
        assert!(json.contains(r#""tick":"1s 500ms""#), "{json}");
        assert!(
            json.contains(r#""opens_at":"2026-12-01T01:00:00.123Z""#),
            "{json}"
        );
        let back: RoomTable = serde_json::from_str(&json).expect("parses back");
        assert_eq!(back.into_settings("").expect("valid"), s);

        let bare = serde_json::to_string(&RoomTable::new(id("x"))).expect("serializes");
        assert_eq!(bare, r#"{"id":"x"}"#);
    }

    #[test]
    fn mode_and_stock_are_read_and_a_stock_of_zero_is_sold_out() {
        let settings = |text: &str| {
            from_toml(&format!("id = \"a\"\n{text}"))
                .expect("well-formed")
                .into_settings("rooms[0]")
        };
        let s = settings("mode = \"maintenance\"\nstock = 40").unwrap();
        assert_eq!((s.mode, s.stock), (Mode::Maintenance, Some(40)));
        assert_eq!(settings("").unwrap().mode, Mode::Queue);
        // Nothing left is sold out, said or not.
        assert_eq!(settings("stock = 0").unwrap().mode, Mode::SoldOut);
        assert_eq!(
            settings("stock = 0\nmode = \"sold_out\"").unwrap().mode,
            Mode::SoldOut
        );
        let e = settings("stock = 0\nmode = \"passthrough\"").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("rooms[0].mode: cannot be passthrough while stock is 0"),
            "{e}"
        );
        let e = settings("stock = 1000000000001").unwrap_err();
        assert!(
            e.to_string().starts_with("rooms[0].stock: must be at most"),
            "{e}"
        );
        assert!(from_toml("id = \"a\"\nmode = \"fifo\"").is_err());
        assert!(from_toml("id = \"a\"\nstock = -1").is_err());
        // Written back as read.
        let json =
            serde_json::to_string(&RoomTable::from(&settings("stock = 7").unwrap())).unwrap();
        assert!(json.contains(r#""mode":"queue","stock":7"#), "{json}");
    }

    #[test]
    fn access_keys_are_read_checked_and_shared_keys_never_written_back() {
        let t = from_toml(
            r#"
            id = "presale"
            challenge = "pow"
            pow_difficulty = 12
            pow_difficulty_max = 18
            pow_rise_per_second = 200
            enqueue = "token"
            enqueue_key = "a-shared-key-a-shared-key-a-shared-key"
            "#,
        )
        .expect("a table with access keys");
        let s = t.into_settings("rooms[0]").expect("valid");
        assert_eq!(s.access.challenge, ChallengeMode::Pow);
        assert_eq!(
            (s.access.pow_difficulty, s.access.pow_difficulty_max),
            (12, 18)
        );
        assert_eq!(s.access.pow_rise_per_second, 200);
        assert_eq!(s.access.enqueue, EnqueueMode::Token);
        let json = serde_json::to_string(&RoomTable::from(&s)).expect("serializes");
        assert!(!json.contains("a-shared-key"), "{json}");
        assert!(json.contains(r#""challenge":"pow""#), "{json}");

        // A difficulty alone is fixed.
        let fixed = from_toml("id = \"a\"\npow_difficulty = 20")
            .unwrap()
            .into_settings("")
            .unwrap();
        assert_eq!(fixed.access.pow_difficulty_max, 20);

        for (text, field, words) in [
            (
                "pow_difficulty = 0",
                "rooms[0].pow_difficulty",
                "between 1 and 32",
            ),
            (
                "pow_difficulty = 20\npow_difficulty_max = 19",
                "rooms[0].pow_difficulty_max",
                "between pow_difficulty (20) and 32",
            ),
            (
                "enqueue = \"token\"",
                "rooms[0].enqueue",
                "needs enqueue_key",
            ),
            (
                "enqueue_key = \"short\"",
                "rooms[0].enqueue_key",
                "at least 32 bytes",
            ),
            (
                "enqueue_public_key = \"not a pem\"",
                "rooms[0].enqueue_public_key",
                "Ed25519 public key in PEM",
            ),
        ] {
            let e = from_toml(&format!("id = \"a\"\n{text}"))
                .unwrap()
                .into_settings("rooms[0]")
                .unwrap_err();
            let shown = e.to_string();
            assert!(shown.starts_with(field), "{text}: {shown}");
            assert!(shown.contains(words), "{text}: {shown}");
            assert!(!shown.contains("short\""), "the key is not echoed: {shown}");
        }
        assert!(from_toml("id = \"a\"\nchallenge = \"captcha\"").is_err());
    }
}
