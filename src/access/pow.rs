//! Proof of work on join: a stateless challenge the server signs and a
//! solution any browser or app can find with SHA-256 alone.
//!
//! A challenge is a token, `base64url(payload) "." base64url(tag)` without
//! padding, like a ticket. The payload is a version byte (1), the
//! difficulty (one byte: leading zero bits), the expiry (Unix ms, a
//! big-endian `u64`), a random 16-byte nonce, and the room id. The tag is
//! HMAC-SHA256 over a context string and the payload, keyed with a key
//! derived from the server's signing key for this use only, so a challenge
//! can never pass for a ticket or a pass, nor the other way round.
//!
//! **The solution** is a counter: a whole number `n` (0 ≤ n < 2^53, so that
//! JavaScript can hold it) such that
//!
//! ```text
//! SHA-256( challenge token (its ASCII bytes) || n in decimal ASCII )
//! ```
//!
//! starts with at least `difficulty` zero bits (most significant bit of the
//! first byte first). With `difficulty = d` a solver needs 2^d hashes on
//! average. In Python:
//!
//! ```text
//! n = 0
//! while int.from_bytes(sha256(f"{token}{n}".encode()).digest(), "big") >> (256 - d):
//!     n += 1
//! ```
//!
//! Issuing a challenge costs one HMAC; checking a solution one HMAC and
//! one SHA-256, and nothing is stored until a solution is accepted: then
//! its nonce is spent (remembered until the challenge expires) so that one
//! solution admits one join. That memory is the backend's, so that it holds
//! across instances; this module only says which nonce and until when.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::ids::RoomId;

type HmacSha256 = Hmac<Sha256>;

/// How long a challenge may be solved and used. Long enough for a slow
/// phone at the highest difficulty a room may ask; short enough that the
/// spent nonces to remember stay few.
pub(crate) const CHALLENGE_TTL_MS: u64 = 5 * 60_000;
/// The most leading zero bits a room may ask: 2^32 hashes is hours on a
/// phone already.
pub(crate) const MAX_DIFFICULTY: u8 = 32;
/// The largest counter accepted: JavaScript's largest safe integer.
pub(crate) const MAX_COUNTER: u64 = (1 << 53) - 1;

const VERSION: u8 = 1;
const CONTEXT: &[u8] = b"narabu challenge v1\0";
const NONCE_LEN: usize = 16;
const HEADER_LEN: usize = 1 + 1 + 8 + NONCE_LEN;
const TAG_LEN: usize = 32;
/// The longest challenge this server makes (a 64-byte room id); longer
/// input is refused before any decoding.
pub(crate) const MAX_CHALLENGE_LEN: usize = (HEADER_LEN + RoomId::MAX_LEN).div_ceil(3) * 4 + 1 + 43;

/// The keys challenges are signed with: derived from the current signing
/// key, and from the previous one so that a key rotation does not void
/// challenges being solved.
#[derive(Clone)]
pub struct ChallengeKeys {
    current: HmacSha256,
    previous: Option<HmacSha256>,
}

impl fmt::Debug for ChallengeKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChallengeKeys([redacted])")
    }
}

impl ChallengeKeys {
    /// The purpose challenge keys are derived for from the signing keys.
    const PURPOSE: &str = "proof-of-work challenges";

    /// The challenge keys of a server with these signing keys.
    pub fn from_keyring(keys: &crate::token::Keyring) -> Self {
        let (current, previous) = keys.derive(Self::PURPOSE);
        Self::new(current, previous)
    }

    /// Keys from already-derived key material (see
    /// [`crate::token::Keyring::derive`]).
    pub fn new(current: [u8; 32], previous: Option<[u8; 32]>) -> Self {
        let keyed = |k: [u8; 32]| match HmacSha256::new_from_slice(&k) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        Self {
            current: keyed(current),
            previous: previous.map(keyed),
        }
    }

    fn tag(key: &HmacSha256, payload: &[u8]) -> HmacSha256 {
        let mut mac = key.clone();
        mac.update(CONTEXT);
        mac.update(payload);
        mac
    }

    /// A fresh challenge for `room`, expiring [`CHALLENGE_TTL_MS`] from
    /// `now_ms`.
    pub fn issue(&self, room: &RoomId, difficulty: u8, now_ms: u64) -> Challenge {
        self.issue_with_nonce(room, difficulty, now_ms, rand::random())
    }

    fn issue_with_nonce(
        &self,
        room: &RoomId,
        difficulty: u8,
        now_ms: u64,
        nonce: [u8; NONCE_LEN],
    ) -> Challenge {
        let expires_at_ms = now_ms.saturating_add(CHALLENGE_TTL_MS);
        let mut payload = Vec::with_capacity(HEADER_LEN + room.as_str().len());
        payload.push(VERSION);
        payload.push(difficulty);
        payload.extend_from_slice(&expires_at_ms.to_be_bytes());
        payload.extend_from_slice(&nonce);
        payload.extend_from_slice(room.as_str().as_bytes());
        let tag = Self::tag(&self.current, &payload).finalize().into_bytes();
        let mut token = String::with_capacity(MAX_CHALLENGE_LEN);
        B64.encode_string(&payload, &mut token);
        token.push('.');
        B64.encode_string(tag, &mut token);
        Challenge {
            token,
            difficulty,
            expires_at_ms,
        }
    }

    /// Checks a solution for `room`: our signature, this room, not expired,
    /// at least `min_difficulty`, and the hash. On success, the nonce to
    /// spend and until when it must be remembered. Never panics.
    pub fn check(
        &self,
        room: &RoomId,
        token: &str,
        counter: u64,
        min_difficulty: u8,
        now_ms: u64,
    ) -> Result<Solved, PowError> {
        let claim = self.verify(token)?;
        if claim.room != room.as_str() {
            return Err(PowError::OtherRoom);
        }
        if claim.expires_at_ms <= now_ms {
            return Err(PowError::Expired);
        }
        if claim.difficulty < min_difficulty {
            return Err(PowError::TooEasy);
        }
        if counter > MAX_COUNTER
            || leading_zero_bits(&digest(token, counter)) < u32::from(claim.difficulty)
        {
            return Err(PowError::Wrong);
        }
        Ok(Solved {
            nonce: claim.nonce,
            expires_at_ms: claim.expires_at_ms,
        })
    }

    fn verify(&self, token: &str) -> Result<Claim, PowError> {
        if token.len() > MAX_CHALLENGE_LEN {
            return Err(PowError::Malformed);
        }
        let (payload_b64, tag_b64) = token.split_once('.').ok_or(PowError::Malformed)?;
        let payload = B64.decode(payload_b64).map_err(|_| PowError::Malformed)?;
        let tag = B64.decode(tag_b64).map_err(|_| PowError::Malformed)?;
        if tag.len() != TAG_LEN {
            return Err(PowError::Malformed);
        }
        let signed_by = |key: &HmacSha256| Self::tag(key, &payload).verify_slice(&tag).is_ok();
        if !signed_by(&self.current) && !self.previous.as_ref().is_some_and(signed_by) {
            return Err(PowError::Forged);
        }
        let (header, room) = payload
            .split_at_checked(HEADER_LEN)
            .ok_or(PowError::Malformed)?;
        let room = std::str::from_utf8(room).map_err(|_| PowError::Malformed)?;
        if header[0] != VERSION {
            return Err(PowError::Malformed);
        }
        let mut expires = [0u8; 8];
        expires.copy_from_slice(&header[2..10]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&header[10..]);
        Ok(Claim {
            room: room.to_owned(),
            difficulty: header[1],
            expires_at_ms: u64::from_be_bytes(expires),
            nonce,
        })
    }
}

struct Claim {
    room: String,
    difficulty: u8,
    expires_at_ms: u64,
    nonce: [u8; NONCE_LEN],
}

/// A challenge as handed to a solver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub token: String,
    pub difficulty: u8,
    pub expires_at_ms: u64,
}

/// An accepted solution: spend `nonce` until `expires_at_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Solved {
    pub nonce: [u8; NONCE_LEN],
    pub expires_at_ms: u64,
}

/// Why a solution was refused. The messages are safe to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PowError {
    #[error("the challenge is not one this server issued (malformed)")]
    Malformed,
    #[error("the challenge's signature is not valid")]
    Forged,
    #[error("the challenge was issued for another room")]
    OtherRoom,
    #[error("the challenge has expired")]
    Expired,
    #[error("the challenge is easier than this room now asks")]
    TooEasy,
    #[error("the counter does not solve the challenge")]
    Wrong,
    #[error("this solution has already been used")]
    Spent,
}

impl PowError {
    /// The label for metrics and the `reason` of the API's error.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Forged => "forged",
            Self::OtherRoom => "other_room",
            Self::Expired => "expired",
            Self::TooEasy => "too_easy",
            Self::Wrong => "wrong",
            Self::Spent => "spent",
        }
    }
}

/// SHA-256 of the token followed by the counter in decimal.
pub fn digest(token: &str, counter: u64) -> [u8; 32] {
    // The counter in decimal without allocating: at most 20 digits.
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut n = counter;
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    Sha256::new()
        .chain_update(token.as_bytes())
        .chain_update(&digits[start..])
        .finalize()
        .into()
}

/// Leading zero bits of a digest, most significant bit first.
pub(crate) fn leading_zero_bits(digest: &[u8; 32]) -> u32 {
    let mut bits = 0;
    for &b in digest {
        if b != 0 {
            return bits + b.leading_zeros();
        }
        bits += 8;
    }
    bits
}

/// The smallest counter that solves `token` at `difficulty`: what a
/// browser's worker does, for tests, the load generator and the docs.
pub fn solve(token: &str, difficulty: u8) -> u64 {
    (0..=MAX_COUNTER)
        .find(|&n| leading_zero_bits(&digest(token, n)) >= u32::from(difficulty))
        .unwrap_or(MAX_COUNTER)
}

#[cfg(test)]
mod tests;
