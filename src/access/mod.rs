//! Who may join a room: proof of work, origin-signed enqueue tokens, and
//! the rule that one account holds one place.
//!
//! A room's [`AccessSettings`] are plain data stored with its other
//! settings (so every instance of a Redis-backed deployment sees the same
//! ones). Before a join can make a ticket, the HTTP layer checks what they
//! ask for with the pure functions here:
//!
//! - `pow`: a stateless challenge, signed and room-bound, whose solution is
//!   a counter found with SHA-256 alone ([`pow`] documents the bytes).
//!   Checking costs one HMAC and one SHA-256; a solution's nonce is then
//!   spent in the backend, so it admits one join across every instance.
//! - `enqueue`: a JWT the origin signs ([`enqueue`]): HS256 with a shared
//!   key or EdDSA with a public key, each with a previous key for
//!   rotation. Its `sub` (the account) becomes the join identity
//!   ([`account_identity`]), so an account holds one place in a room
//!   whatever the device, browser or address.
//!
//! [`RoomAccess`] is the compiled form (keys parsed once); the difficulty
//! may rise with the room's join rate ([`AccessSettings::difficulty`]).

pub(crate) mod enqueue;
mod patch;
pub mod pow;

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::{Identity, RoomId};

pub use enqueue::EnqueueVerifier;
pub(crate) use enqueue::{EnqueueError, is_lane_name};
pub(crate) use patch::AccessPatch;
pub use pow::ChallengeKeys;
pub(crate) use pow::{Challenge, PowError, Solved};

/// What a join must show besides itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChallengeMode {
    /// Nothing: anyone may join (the join limit still applies).
    #[default]
    None,
    /// A solved proof-of-work challenge.
    Pow,
}

/// Whether a join needs the origin's enqueue token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EnqueueMode {
    #[default]
    Open,
    /// An enqueue token signed by the origin; its account is the identity.
    Token,
}

/// A shared key (HS256): kept with the room's settings, never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SharedKey(String);

impl SharedKey {
    /// RFC 7518 asks HS256 keys to be at least as long as the hash.
    pub(crate) const MIN_LEN: usize = 32;

    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A room's access rules, as an operator sets them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessSettings {
    pub challenge: ChallengeMode,
    /// Leading zero bits a solution needs while joins are calm.
    pub pow_difficulty: u8,
    /// The most the difficulty rises to under a flood of joins; equal to
    /// `pow_difficulty` for a fixed difficulty.
    pub pow_difficulty_max: u8,
    /// Joins per second (over the room, every instance) above which each
    /// doubling of the join rate adds one bit, up to `pow_difficulty_max`.
    pub pow_rise_per_second: u32,
    pub enqueue: EnqueueMode,
    /// HS256 key, and the one it replaced (still accepted).
    pub enqueue_key: Option<SharedKey>,
    pub enqueue_previous_key: Option<SharedKey>,
    /// Ed25519 public keys (PEM, SubjectPublicKeyInfo) for EdDSA tokens.
    pub enqueue_public_key: Option<String>,
    pub enqueue_previous_public_key: Option<String>,
}

impl AccessSettings {
    /// About a second of WebCrypto hashing on a phone (2^15 hashes on
    /// average; the "Proof of work" section of docs/fair-access.md has the measurements).
    pub(crate) const DEFAULT_DIFFICULTY: u8 = 15;
    pub(crate) const DEFAULT_RISE_PER_SECOND: u32 = 50;
    /// How many bits below the room's current difficulty a solution is
    /// still accepted at ([`Self::least_accepted`]).
    pub(crate) const POW_SLACK_BITS: u8 = 1;

    /// The difficulty to ask when the room takes `joins_per_second`: the
    /// base, plus one bit for each doubling above `pow_rise_per_second`,
    /// at most `pow_difficulty_max`. Each bit doubles a solver's work, so
    /// a flood that doubles the join rate doubles what every join costs.
    pub(crate) fn difficulty(&self, joins_per_second: f64) -> u8 {
        let base = self.pow_difficulty;
        let max = self.pow_difficulty_max.max(base);
        let threshold = f64::from(self.pow_rise_per_second.max(1));
        if joins_per_second.is_nan() || joins_per_second <= threshold {
            return base;
        }
        let extra = (joins_per_second / threshold).log2().ceil();
        let extra = if extra.is_finite() {
            extra.min(f64::from(max - base)) as u8
        } else {
            max - base
        };
        base + extra
    }

    /// The least difficulty a solution may have been asked at when the
    /// room asks `current` now: one bit of slack, so that a solver whose
    /// room rose by a step while it hashed is not sent back, but never a
    /// challenge fetched before a flood, when joins were cheap (the rise
    /// would then buy nothing), and never below the base.
    pub(crate) fn least_accepted(&self, current: u8) -> u8 {
        current
            .saturating_sub(Self::POW_SLACK_BITS)
            .max(self.pow_difficulty)
    }

    /// The limits these settings must keep: `Err((key, message))`.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        let bits = 1..=pow::MAX_DIFFICULTY;
        if !bits.contains(&self.pow_difficulty) {
            return Err((
                "pow_difficulty",
                format!(
                    "must be between 1 and {} leading zero bits, got {}",
                    pow::MAX_DIFFICULTY,
                    self.pow_difficulty
                ),
            ));
        }
        if !(self.pow_difficulty..=pow::MAX_DIFFICULTY).contains(&self.pow_difficulty_max) {
            return Err((
                "pow_difficulty_max",
                format!(
                    "must be between pow_difficulty ({}) and {}, got {}",
                    self.pow_difficulty,
                    pow::MAX_DIFFICULTY,
                    self.pow_difficulty_max
                ),
            ));
        }
        if self.pow_rise_per_second == 0 {
            return Err(("pow_rise_per_second", "must be at least 1".into()));
        }
        enqueue::validate_keys(self)?;
        if self.enqueue == EnqueueMode::Token
            && self.enqueue_key.is_none()
            && self.enqueue_public_key.is_none()
        {
            return Err((
                "enqueue",
                "\"token\" needs enqueue_key (HS256) or enqueue_public_key (EdDSA)".into(),
            ));
        }
        Ok(())
    }
}

impl Default for AccessSettings {
    fn default() -> Self {
        Self {
            challenge: ChallengeMode::None,
            pow_difficulty: Self::DEFAULT_DIFFICULTY,
            pow_difficulty_max: Self::DEFAULT_DIFFICULTY,
            pow_rise_per_second: Self::DEFAULT_RISE_PER_SECOND,
            enqueue: EnqueueMode::Open,
            enqueue_key: None,
            enqueue_previous_key: None,
            enqueue_public_key: None,
            enqueue_previous_public_key: None,
        }
    }
}

/// The join identity of an account in a room: the same account always
/// maps to the same ticket, and accounts of different rooms never meet.
/// A different domain than `Idempotency-Key`s, so neither can be made to
/// collide with the other.
pub(crate) fn account_identity(room: &RoomId, account: &str) -> Identity {
    let digest = Sha256::new()
        .chain_update(b"narabu account\0")
        .chain_update(room.as_str())
        .chain_update([0])
        .chain_update(account)
        .finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    Identity(u128::from_be_bytes(id))
}

/// A room's access rules, compiled: keys parsed once, ready to check.
#[derive(Debug)]
pub(crate) struct RoomAccess {
    pub settings: AccessSettings,
    /// Set when `enqueue = "token"`.
    pub enqueue: Option<EnqueueVerifier>,
}

impl RoomAccess {
    /// Compiles validated settings. Keys were checked by
    /// [`AccessSettings::validate`]; a key that still fails to load leaves
    /// the room refusing every token, never open.
    pub(crate) fn new(room: &RoomId, settings: AccessSettings) -> Self {
        let enqueue =
            (settings.enqueue == EnqueueMode::Token).then(|| EnqueueVerifier::new(room, &settings));
        Self { settings, enqueue }
    }

    pub(crate) fn needs_pow(&self) -> bool {
        self.settings.challenge == ChallengeMode::Pow
    }
}

#[cfg(test)]
mod tests;
