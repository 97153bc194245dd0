//! The body of `PATCH /admin/rooms/{room}`: each field left out, `null`,
//! or given ([`Patch`]), read into a validated [`RoomPatch`] that the
//! backend applies in one step. Each field is checked on its own, with the
//! config file's rules and words, so no current value needs to be read
//! first.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::access::{AccessPatch, ChallengeMode, EnqueueMode, SharedKey};
use crate::config::{
    ConfigError, check_admit_per_minute, check_autotune, check_away_grace, check_capacity,
    check_pass_lifetime, check_rules, check_stock, check_templates_dir, check_tick, check_timeout,
    opt_duration, stock_mode,
};
use crate::engine::rules::Mode;
use crate::engine::{Patch, RoomPatch, RoomSettings};

/// The keys `PATCH` accepts: a room's running settings. `id`, `order` and
/// `opens_at` shape a room's line and need a `PUT`.
pub(crate) const PATCHABLE: [&str; 27] = [
    "capacity",
    "paused",
    "mode",
    "stock",
    "open_now",
    "admit_per_minute",
    "notify_ahead",
    "tick",
    "pass_idle",
    "arrival_grace",
    "queue_idle",
    "away_grace",
    "pass_lifetime",
    "join_limit_per_minute",
    "challenge",
    "pow_difficulty",
    "pow_difficulty_max",
    "pow_rise_per_second",
    "enqueue",
    "enqueue_key",
    "enqueue_previous_key",
    "enqueue_public_key",
    "enqueue_previous_public_key",
    "templates_dir",
    "lane_weights",
    "rules",
    "autotune",
];

/// Keys of a room that a running room cannot change (its lanes: nobody's
/// place changes under them).
pub(crate) const FIXED: [&str; 6] = ["id", "order", "opens_at", "lanes", "default_lane", "routes"];

/// Each key left out keeps its value; `null` clears the optional ones
/// (`admit_per_minute`, the enqueue keys) and is refused for the others.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[schema(as = RoomPatch)]
#[serde(deny_unknown_fields)]
pub(crate) struct PatchBody {
    #[serde(default)]
    #[schema(value_type = u32, required = false, minimum = 1, maximum = 1_000_000)]
    capacity: Patch<u32>,
    #[serde(default)]
    #[schema(value_type = bool, required = false)]
    paused: Patch<bool>,
    #[serde(default)]
    #[schema(value_type = Mode, required = false)]
    mode: Patch<Mode>,
    #[serde(default)]
    #[schema(value_type = Option<u64>)]
    stock: Patch<u64>,
    #[serde(default, deserialize_with = "open_now")]
    #[schema(value_type = Option<bool>)]
    open_now: Patch<bool>,
    #[serde(default, deserialize_with = "duration")]
    #[schema(value_type = String, required = false, example = "250ms")]
    tick: Patch<Duration>,
    #[serde(default, deserialize_with = "duration")]
    #[schema(value_type = String, required = false, example = "10m")]
    pass_idle: Patch<Duration>,
    #[serde(default, deserialize_with = "duration")]
    #[schema(value_type = String, required = false, example = "10m")]
    arrival_grace: Patch<Duration>,
    #[serde(default, deserialize_with = "duration")]
    #[schema(value_type = String, required = false, example = "10m")]
    queue_idle: Patch<Duration>,
    #[serde(default, deserialize_with = "duration")]
    #[schema(value_type = String, required = false, example = "20s")]
    away_grace: Patch<Duration>,
    #[serde(default, deserialize_with = "duration")]
    #[schema(value_type = String, required = false, example = "60s")]
    pass_lifetime: Patch<Duration>,
    #[serde(default)]
    #[schema(value_type = u32, required = false)]
    join_limit_per_minute: Patch<u32>,
    #[serde(default)]
    #[schema(value_type = Option<u32>, minimum = 1)]
    admit_per_minute: Patch<u32>,
    /// People ahead at the "N ahead" call-back; `null` for the default
    /// (about two minutes of admissions).
    #[serde(default)]
    #[schema(value_type = Option<u32>, maximum = 1000000)]
    notify_ahead: Patch<u32>,
    #[serde(default)]
    #[schema(value_type = ChallengeMode, required = false)]
    challenge: Patch<ChallengeMode>,
    #[serde(default)]
    #[schema(value_type = u8, required = false, minimum = 1, maximum = 32)]
    pow_difficulty: Patch<u8>,
    #[serde(default)]
    #[schema(value_type = u8, required = false, minimum = 1, maximum = 32)]
    pow_difficulty_max: Patch<u8>,
    #[serde(default)]
    #[schema(value_type = u32, required = false, minimum = 1)]
    pow_rise_per_second: Patch<u32>,
    #[serde(default)]
    #[schema(value_type = EnqueueMode, required = false)]
    enqueue: Patch<EnqueueMode>,
    #[serde(default)]
    #[schema(value_type = Option<String>, write_only)]
    enqueue_key: Patch<SharedKey>,
    #[serde(default)]
    #[schema(value_type = Option<String>, write_only)]
    enqueue_previous_key: Patch<SharedKey>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    enqueue_public_key: Patch<String>,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    enqueue_previous_public_key: Patch<String>,
    /// The room's own page templates; `null` for the instance's.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    templates_dir: Patch<String>,
    /// New weights (1 to 1000) of some of the room's priority lanes, by
    /// name: `{"members": 50}`. The next permits follow them.
    #[serde(default)]
    #[schema(value_type = std::collections::BTreeMap<String, u32>, required = false)]
    lane_weights: Patch<std::collections::BTreeMap<String, u32>>,
    /// The room's traffic rules, all of them, in order; `null` or `[]`
    /// for none.
    #[serde(default)]
    #[schema(value_type = Option<Vec<crate::rules::Rule>>)]
    rules: Patch<Vec<crate::rules::Rule>>,
    /// The room's autotune section, all of it; `null` turns it off.
    #[serde(default)]
    #[schema(value_type = Option<crate::autotune::Autotune>)]
    autotune: Patch<crate::autotune::Autotune>,
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Patch<Duration>, D::Error> {
    Ok(opt_duration::deserialize(d)?.map_or(Patch::Null, Patch::Value))
}

fn open_now<'de, D: Deserializer<'de>>(d: D) -> Result<Patch<bool>, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Bool(b) => Ok(Patch::Value(b)),
        serde_json::Value::Null => Ok(Patch::Null),
        _ => Err(serde::de::Error::custom("must be true or false")),
    }
}

/// A field that cannot be cleared: `null` is refused, rather than read as
/// "leave it" or as "the default".
fn required<T>(field: &str, value: Patch<T>) -> Result<Option<T>, ConfigError> {
    match value {
        Patch::Absent => Ok(None),
        Patch::Null => Err(ConfigError::new(
            field,
            "cannot be null (leave it out to keep the current value)",
        )),
        Patch::Value(v) => Ok(Some(v)),
    }
}

impl PatchBody {
    /// The lanes' new weights by name, to check against the room's lanes
    /// ([`lane_weights`]); taken out before [`Self::into_patch`].
    pub(crate) fn take_lane_weights(&mut self) -> Patch<std::collections::BTreeMap<String, u32>> {
        std::mem::take(&mut self.lane_weights)
    }

    /// The change, every field checked.
    pub(crate) fn into_patch(self) -> Result<RoomPatch, ConfigError> {
        let capacity = required("capacity", self.capacity)?;
        if let Some(c) = capacity {
            check_capacity("capacity", c)?;
        }
        let tick = required("tick", self.tick)?;
        if let Some(t) = tick {
            check_tick("tick", t)?;
        }
        let mut timeouts = [
            ("pass_idle", self.pass_idle, None),
            ("arrival_grace", self.arrival_grace, None),
            ("queue_idle", self.queue_idle, None),
        ];
        for (name, value, checked) in &mut timeouts {
            *checked = required(name, *value)?;
            if let Some(v) = checked {
                check_timeout(name, *v)?;
            }
        }
        let [(_, _, pass_idle), (_, _, arrival_grace), (_, _, queue_idle)] = timeouts;
        let pass_lifetime = required("pass_lifetime", self.pass_lifetime)?;
        if let Some(v) = pass_lifetime {
            check_pass_lifetime("pass_lifetime", v)?;
        }
        if let Patch::Value(dir) = &self.templates_dir {
            check_templates_dir("templates_dir", dir)?;
        }
        let rules = match self.rules {
            Patch::Absent => None,
            Patch::Null => Some(Vec::new()),
            Patch::Value(rules) => {
                check_rules("", &rules)?;
                Some(rules)
            }
        };
        let autotune = match self.autotune {
            Patch::Absent => Patch::Absent,
            Patch::Null => Patch::Null,
            Patch::Value(a) => {
                check_autotune("", &a)?;
                Patch::Value(Box::new(a))
            }
        };
        if let Patch::Value(cap) = self.admit_per_minute {
            check_admit_per_minute("admit_per_minute", cap)?;
        }
        if let Patch::Value(n) = self.notify_ahead
            && n > crate::config::MAX_NOTIFY_AHEAD
        {
            return Err(ConfigError::new(
                "notify_ahead",
                format!(
                    "must be at most {}, got {n}",
                    crate::config::MAX_NOTIFY_AHEAD
                ),
            ));
        }
        let mut mode = required("mode", self.mode)?;
        if let Patch::Value(stock) = self.stock {
            check_stock("stock", stock)?;
            mode = stock_mode("mode", mode, Some(stock))?;
        }
        Ok(RoomPatch {
            capacity,
            paused: required("paused", self.paused)?,
            mode,
            stock: self.stock,
            open_now: matches!(self.open_now, Patch::Value(true)),
            tick,
            pass_idle,
            arrival_grace,
            queue_idle,
            away_grace: required("away_grace", self.away_grace)?,
            pass_lifetime,
            join_limit_per_minute: required("join_limit_per_minute", self.join_limit_per_minute)?,
            admit_per_minute: self.admit_per_minute,
            notify_ahead: self.notify_ahead,
            access: AccessPatch {
                challenge: required("challenge", self.challenge)?,
                pow_difficulty: required("pow_difficulty", self.pow_difficulty)?,
                pow_difficulty_max: required("pow_difficulty_max", self.pow_difficulty_max)?,
                pow_rise_per_second: required("pow_rise_per_second", self.pow_rise_per_second)?,
                enqueue: required("enqueue", self.enqueue)?,
                enqueue_key: self.enqueue_key,
                enqueue_previous_key: self.enqueue_previous_key,
                enqueue_public_key: self.enqueue_public_key,
                enqueue_previous_public_key: self.enqueue_previous_public_key,
            },
            templates_dir: self.templates_dir,
            lane_weights: Vec::new(),
            rules,
            autotune,
        })
    }
}

/// New lane weights by name, checked against the room's lanes: each name
/// one of them, each weight 1 to 1000. Lanes themselves are set when a
/// room is made; their weights may change while it runs.
pub(crate) fn lane_weights(
    weights: Patch<std::collections::BTreeMap<String, u32>>,
    current: &RoomSettings,
) -> Result<Vec<(u8, u32)>, ConfigError> {
    let weights = match weights {
        Patch::Absent => return Ok(Vec::new()),
        Patch::Null => {
            return Err(ConfigError::new(
                "lane_weights",
                "cannot be null (leave it out to keep the current weights)",
            ));
        }
        Patch::Value(w) => w,
    };
    if current.lanes.is_empty() && !weights.is_empty() {
        return Err(ConfigError::new(
            "lane_weights",
            "the room has no lanes (they are set when a room is made)",
        ));
    }
    weights
        .into_iter()
        .map(|(name, weight)| {
            let field = format!("lane_weights.{name}");
            let lane = current
                .lanes
                .iter()
                .position(|l| l.name == name)
                .ok_or_else(|| ConfigError::new(&field, "the room has no lane of this name"))?;
            if !(1..=1000).contains(&weight) {
                return Err(ConfigError::new(
                    &field,
                    format!("must be 1 to 1000, not {weight}"),
                ));
            }
            Ok((lane as u8, weight))
        })
        .collect()
}

/// `away_grace` must stay shorter than `queue_idle`, whichever of the two
/// the patch changes.
fn check_presence(patch: &RoomPatch, current: &RoomSettings) -> Result<(), ConfigError> {
    if patch.away_grace.is_none() && patch.queue_idle.is_none() {
        return Ok(());
    }
    check_away_grace(
        "away_grace",
        patch.away_grace.unwrap_or(current.away_grace),
        patch.queue_idle.unwrap_or(current.queue_idle),
    )
}

/// The access rules a patch leaves must hold together (a maximum not below
/// the difficulty, a key for invite-only, a previous key only beside a
/// current one), checked against the room as it is. A new difficulty
/// without a maximum keeps a fixed difficulty fixed (the maximum follows
/// it) and a rising one rising.
pub(crate) fn check_access(
    patch: &mut RoomPatch,
    current: &RoomSettings,
) -> Result<(), ConfigError> {
    check_presence(patch, current)?;
    let a = &mut patch.access;
    if a.is_empty() {
        return Ok(());
    }
    let now = &current.access;
    if let Some(d) = a.pow_difficulty
        && a.pow_difficulty_max.is_none()
    {
        a.pow_difficulty_max = Some(if now.pow_difficulty_max == now.pow_difficulty {
            d
        } else {
            now.pow_difficulty_max.max(d)
        });
    }
    let mut next = (**now).clone();
    a.apply_to(&mut next);
    next.validate()
        .map_err(|(field, message)| ConfigError::new(field, message))
}

/// A room out of stock stays sold out: another mode needs more stock with
/// it (checked against the room as it is, like the access rules).
pub(crate) fn check_mode(patch: &RoomPatch, current: &RoomSettings) -> Result<(), ConfigError> {
    let stock = match patch.stock {
        Patch::Absent => current.stock,
        Patch::Null => None,
        Patch::Value(v) => Some(v),
    };
    stock_mode("mode", patch.mode, stock).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(json: &str) -> Result<RoomPatch, String> {
        let body: PatchBody = serde_json::from_str(json).map_err(|e| e.to_string())?;
        body.into_patch().map_err(|e| e.to_string())
    }

    #[test]
    fn left_out_null_and_given_are_three_things() {
        assert_eq!(patch("{}").unwrap(), RoomPatch::default());
        let p = patch(r#"{"capacity": 5, "tick": "250ms", "admit_per_minute": null}"#).unwrap();
        assert_eq!(p.capacity, Some(5));
        assert_eq!(p.tick, Some(Duration::from_millis(250)));
        assert_eq!(p.admit_per_minute, Patch::Null);
        assert_eq!(p.paused, None);
        assert_eq!(p.notify_ahead, Patch::Absent);
        assert_eq!(
            patch(r#"{"notify_ahead": 50}"#).unwrap().notify_ahead,
            Patch::Value(50)
        );
        assert_eq!(
            patch(r#"{"notify_ahead": null}"#).unwrap().notify_ahead,
            Patch::Null
        );
        assert_eq!(
            patch(r#"{"admit_per_minute": 60}"#)
                .unwrap()
                .admit_per_minute,
            Patch::Value(60)
        );
        assert!(patch(r#"{"open_now": true}"#).unwrap().open_now);
        assert!(!patch(r#"{"open_now": null}"#).unwrap().open_now);
    }

    #[test]
    fn a_stock_of_zero_sells_the_room_out() {
        let p = patch(r#"{"stock": 0}"#).unwrap();
        assert_eq!((p.stock, p.mode), (Patch::Value(0), Some(Mode::SoldOut)));
        let p = patch(r#"{"stock": 5, "mode": "passthrough"}"#).unwrap();
        assert_eq!(
            (p.stock, p.mode),
            (Patch::Value(5), Some(Mode::Passthrough))
        );
        assert_eq!(patch(r#"{"stock": null}"#).unwrap().stock, Patch::Null);
        let e = patch(r#"{"stock": 0, "mode": "queue"}"#).unwrap_err();
        assert!(
            e.starts_with("mode: cannot be queue while stock is 0"),
            "{e}"
        );
        // Against the room as it is: out of stock stays sold out.
        let mut room = RoomSettings::new(crate::engine::RoomId::new("a").unwrap());
        room.stock = Some(0);
        room.mode = Mode::SoldOut;
        let reopen = patch(r#"{"mode": "queue"}"#).unwrap();
        assert!(check_mode(&reopen, &room).is_err());
        assert!(check_mode(&patch(r#"{"mode": "queue", "stock": 3}"#).unwrap(), &room).is_ok());
        assert!(
            check_mode(
                &patch(r#"{"mode": "queue", "stock": null}"#).unwrap(),
                &room
            )
            .is_ok()
        );
    }

    #[test]
    fn each_field_is_checked_with_the_config_s_words() {
        for (json, want) in [
            (
                r#"{"capacity": 0}"#,
                "capacity: must be between 1 and 1000000",
            ),
            (r#"{"capacity": null}"#, "capacity: cannot be null"),
            (
                r#"{"notify_ahead": 1000001}"#,
                "notify_ahead: must be at most 1000000",
            ),
            (r#"{"tick": "1h"}"#, "tick: must be between 10ms and 1m"),
            (r#"{"queue_idle": "0s"}"#, "queue_idle: must be more than 0"),
            (r#"{"pass_idle": null}"#, "pass_idle: cannot be null"),
            (
                r#"{"admit_per_minute": 0}"#,
                "admit_per_minute: must be at least 1",
            ),
            (
                r#"{"join_limit_per_minute": null}"#,
                "join_limit_per_minute: cannot be null",
            ),
        ] {
            let err = patch(json).unwrap_err();
            assert!(err.starts_with(want), "{json}: {err}");
        }
        assert!(
            patch(r#"{"open_now": 1}"#)
                .unwrap_err()
                .contains("must be true or false")
        );
    }
}
