//! Changing a room's access rules live.
//!
//! An [`AccessPatch`] names only the rules an operator changes, so two
//! operators changing different rules at once both get their change (the
//! engine applies a patch in one step).

use super::{AccessSettings, ChallengeMode, EnqueueMode, SharedKey};
use crate::patch::Patch;

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
    pub(crate) fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    pub(crate) fn apply_to(&self, a: &mut AccessSettings) {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_patch_changes_only_its_own_rules() {
        let p = AccessPatch {
            pow_difficulty: Some(20),
            enqueue_previous_key: Patch::Null,
            ..AccessPatch::default()
        };
        let mut a = full();
        a.enqueue_previous_key = Some(SharedKey::new("old".repeat(20)));
        p.apply_to(&mut a);
        assert_eq!(a.pow_difficulty, 20);
        assert_eq!(a.enqueue_previous_key, None);
        assert_eq!(a.enqueue_key, full().enqueue_key, "untouched");
        assert!(AccessPatch::default().is_empty() && !p.is_empty());
    }
}
