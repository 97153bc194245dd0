//! The names every layer shares: a room's id and a join's identity.
//!
//! They sit below the engine, which keys rooms and tickets by them, and
//! below fair access, which derives an account's identity in a room, so
//! neither of the two has to import the other for them. The engine
//! re-exports both, where the other crates of the workspace find them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A room's name: `[a-z0-9][a-z0-9-]{0,63}`. It appears in URLs, cookie names
/// and Redis keys, so nothing else may get in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(transparent)]
#[schema(value_type = String, pattern = r"^[a-z0-9][a-z0-9-]{0,63}$", example = "sale")]
pub struct RoomId(String);

/// Why a string is not a room name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("room ids are 1 to 64 characters of a-z, 0-9 and '-', starting with a letter or digit")]
pub struct InvalidRoomId;

impl RoomId {
    pub(crate) const MAX_LEN: usize = 64;

    pub fn new(name: &str) -> Result<Self, InvalidRoomId> {
        let bytes = name.as_bytes();
        let valid_char = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
        match bytes.first() {
            Some(first)
                if bytes.len() <= Self::MAX_LEN
                    && *first != b'-'
                    && bytes.iter().all(valid_char) =>
            {
                Ok(Self(name.to_owned()))
            }
            _ => Err(InvalidRoomId),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RoomId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RoomId {
    type Err = InvalidRoomId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl<'de> Deserialize<'de> for RoomId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        RoomId::new(&s).map_err(serde::de::Error::custom)
    }
}

/// Who a join is for, so that the same visitor joining twice (double click,
/// refresh, retried request) gets the same ticket. The HTTP layer derives it
/// from an `Idempotency-Key` or similar, hashed, so the engine stores 16
/// bytes whatever the key's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Identity(pub u128);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_ids_follow_the_contract() {
        for ok in ["a", "0", "sale", "big-sale-2026", &"a".repeat(64)] {
            assert!(RoomId::new(ok).is_ok(), "{ok} should be valid");
        }
        for bad in [
            "",
            "-a",
            "A",
            "sale_1",
            "säle",
            "a b",
            "a/b",
            &"a".repeat(65),
        ] {
            assert_eq!(
                RoomId::new(bad),
                Err(InvalidRoomId),
                "{bad} should be invalid"
            );
        }
    }
}
