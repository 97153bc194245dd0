//! One field of a partial update, in three states.
//!
//! An operator's change to a room names only what it changes; the room's
//! settings (in the engine) and its access rules (in fair access) are
//! patched field by field with it, so it sits below both.

use serde::{Deserialize, Serialize};

/// One field of a partial update: left out, set to `null`, or given.
/// Deserialized from JSON with `#[serde(default)]`, so a missing key is
/// [`Patch::Absent`] and `null` is [`Patch::Null`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Patch<T> {
    #[default]
    Absent,
    Null,
    Value(T),
}

// In JSON a missing key is `Absent` (with `#[serde(default)]`) and `null`
// is `Null`. A compact format (a change sent to a room's owner) has no
// missing keys, so it carries all three as `Option<Option<T>>`.
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            return Ok(Option::<T>::deserialize(d)?.map_or(Self::Null, Self::Value));
        }
        Ok(match Option::<Option<T>>::deserialize(d)? {
            None => Self::Absent,
            Some(None) => Self::Null,
            Some(Some(v)) => Self::Value(v),
        })
    }
}

impl<T: Serialize> Serialize for Patch<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let nested = match self {
            Self::Absent => None,
            Self::Null => Some(None),
            Self::Value(v) => Some(Some(v)),
        };
        if s.is_human_readable() {
            return nested.flatten().serialize(s);
        }
        nested.serialize(s)
    }
}
