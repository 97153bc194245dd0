//! Changing a room's access rules live, and storing them as named fields.
//!
//! An [`AccessPatch`] names only the rules an operator changes, so two
//! operators changing different rules at once both get their change (the
//! backends apply a patch in one step). [`AccessSettings::fields`] and
//! [`AccessSettings::from_fields`] are the rules as flat named strings, the
//! form a store that keeps a room as a hash of fields (Redis) writes and
//! reads; a patch writes only its own fields there.

use super::{AccessSettings, ChallengeMode, EnqueueMode, SharedKey};
use crate::engine::Patch;

/// Changes to a room's access rules: `None`/`Absent` leaves a rule as it
/// is; `Null` clears a key (retiring a previous key, say).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AccessPatch {
    pub challenge: Option<ChallengeMode>,
    pub pow_difficulty: Option<u8>,
    pub pow_difficulty_max: Option<u8>,
    pub pow_rise_per_second: Option<u32>,
    pub enqueue: Option<EnqueueMode>,
    pub enqueue_key: Patch<SharedKey>,
    pub enqueue_previous_key: Patch<SharedKey>,
    pub enqueue_public_key: Patch<String>,
    pub enqueue_previous_public_key: Patch<String>,
}

fn patch_into<T: Clone>(target: &mut Option<T>, patch: &Patch<T>) {
    match patch {
        Patch::Absent => {}
        Patch::Null => *target = None,
        Patch::Value(v) => *target = Some(v.clone()),
    }
}

impl AccessPatch {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    pub fn apply_to(&self, a: &mut AccessSettings) {
        if let Some(v) = self.challenge {
            a.challenge = v;
        }
        if let Some(v) = self.pow_difficulty {
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
        patch_into(&mut a.enqueue_key, &self.enqueue_key);
        patch_into(&mut a.enqueue_previous_key, &self.enqueue_previous_key);
        patch_into(&mut a.enqueue_public_key, &self.enqueue_public_key);
        patch_into(
            &mut a.enqueue_previous_public_key,
            &self.enqueue_previous_public_key,
        );
    }

    /// The stored fields this patch writes (a cleared key is `""`).
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let mut after = AccessSettings::default();
        self.apply_to(&mut after);
        let given = [
            self.challenge.is_some(),
            self.pow_difficulty.is_some(),
            self.pow_difficulty_max.is_some(),
            self.pow_rise_per_second.is_some(),
            self.enqueue.is_some(),
            !self.enqueue_key.is_absent(),
            !self.enqueue_previous_key.is_absent(),
            !self.enqueue_public_key.is_absent(),
            !self.enqueue_previous_public_key.is_absent(),
        ];
        after
            .fields()
            .into_iter()
            .zip(given)
            .filter_map(|(field, given)| given.then_some(field))
            .collect()
    }
}

impl AccessSettings {
    /// Every rule as a named field, in a fixed order; absent keys are `""`.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let key = |k: &Option<SharedKey>| k.as_ref().map_or(String::new(), |k| k.expose().into());
        let pem = |k: &Option<String>| k.clone().unwrap_or_default();
        vec![
            ("challenge", challenge_name(self.challenge).into()),
            ("pow_difficulty", self.pow_difficulty.to_string()),
            ("pow_difficulty_max", self.pow_difficulty_max.to_string()),
            ("pow_rise_per_second", self.pow_rise_per_second.to_string()),
            ("enqueue", enqueue_name(self.enqueue).into()),
            ("enqueue_key", key(&self.enqueue_key)),
            ("enqueue_previous_key", key(&self.enqueue_previous_key)),
            ("enqueue_public_key", pem(&self.enqueue_public_key)),
            (
                "enqueue_previous_public_key",
                pem(&self.enqueue_previous_public_key),
            ),
        ]
    }

    /// The rules from named fields; a field missing or unreadable keeps
    /// its default (a room stored before access rules existed is open).
    pub fn from_fields<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        let mut a = Self::default();
        let text = |k: &str| get(k).filter(|v| !v.is_empty());
        if text("challenge") == Some("pow") {
            a.challenge = ChallengeMode::Pow;
        }
        if text("enqueue") == Some("token") {
            a.enqueue = EnqueueMode::Token;
        }
        if let Some(v) = text("pow_difficulty").and_then(|v| v.parse().ok()) {
            a.pow_difficulty = v;
            a.pow_difficulty_max = v;
        }
        if let Some(v) = text("pow_difficulty_max").and_then(|v| v.parse().ok()) {
            a.pow_difficulty_max = v;
        }
        if let Some(v) = text("pow_rise_per_second").and_then(|v| v.parse().ok()) {
            a.pow_rise_per_second = v;
        }
        a.enqueue_key = text("enqueue_key").map(SharedKey::new);
        a.enqueue_previous_key = text("enqueue_previous_key").map(SharedKey::new);
        a.enqueue_public_key = text("enqueue_public_key").map(str::to_owned);
        a.enqueue_previous_public_key = text("enqueue_previous_public_key").map(str::to_owned);
        a
    }
}

fn challenge_name(c: ChallengeMode) -> &'static str {
    match c {
        ChallengeMode::None => "none",
        ChallengeMode::Pow => "pow",
    }
}

fn enqueue_name(e: EnqueueMode) -> &'static str {
    match e {
        EnqueueMode::Open => "open",
        EnqueueMode::Token => "token",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn full() -> AccessSettings {
        AccessSettings {
            challenge: ChallengeMode::Pow,
            pow_difficulty: 12,
            pow_difficulty_max: 18,
            pow_rise_per_second: 300,
            enqueue: EnqueueMode::Token,
            enqueue_key: Some(SharedKey::new("k".repeat(40))),
            enqueue_previous_key: None,
            enqueue_public_key: Some("pem".into()),
            enqueue_previous_public_key: None,
        }
    }

    #[test]
    fn settings_round_trip_through_named_fields() {
        for a in [AccessSettings::default(), full()] {
            let stored: HashMap<&str, String> = a.fields().into_iter().collect();
            let back = AccessSettings::from_fields(|k| stored.get(k).map(String::as_str));
            assert_eq!(back, a);
        }
        assert_eq!(
            AccessSettings::from_fields(|_| None),
            AccessSettings::default()
        );
    }

    #[test]
    fn a_patch_writes_only_its_own_fields() {
        let p = AccessPatch {
            pow_difficulty: Some(20),
            enqueue_previous_key: Patch::Null,
            ..AccessPatch::default()
        };
        assert_eq!(
            p.fields(),
            vec![
                ("pow_difficulty", "20".to_owned()),
                ("enqueue_previous_key", String::new())
            ]
        );
        let mut a = full();
        a.enqueue_previous_key = Some(SharedKey::new("old".repeat(20)));
        p.apply_to(&mut a);
        assert_eq!(a.pow_difficulty, 20);
        assert_eq!(a.enqueue_previous_key, None);
        assert_eq!(a.enqueue_key, full().enqueue_key, "untouched");
        assert!(AccessPatch::default().is_empty() && !p.is_empty());
    }
}
