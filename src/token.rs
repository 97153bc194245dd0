//! The signed ticket token: what a visitor carries (cookie `narabu_{room}`
//! or `Authorization: Bearer`) to prove which ticket is theirs.
//!
//! A token is `base64url(payload) "." base64url(HMAC-SHA256(key, context ||
//! payload))`. The payload is binary: a version byte, the room's epoch and
//! the ticket number (big-endian `u64`s), then the room id. The epoch is a
//! random id of the room's incarnation, so a room deleted and created again
//! under the same name does not honour tickets from before.
//!
//! The token is opaque to visitors but not secret: it only has to be
//! unforgeable. Verification checks the MAC in constant time before looking
//! at the payload, with the current key and then the previous one, so a key
//! rotation keeps every ticket already handed out valid. Callers still have
//! to check that the claim's room and epoch match the room being asked for.
//!
//! The key is the configured `secret` or, on a single instance with none
//! configured, a random key kept in `data_dir/secret.key`
//! ([`Keyring::load_or_create`]), so a restart does not invalidate the queue.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::ids::RoomId;
use crate::secret::Secret;

/// The salt of the HKDF step from the instance secret to pass keys, so the
/// derived key has nothing in common with the ticket MACs made from the
/// same secret.
const PASS_SALT: &[u8] = b"narabu signed pass v1";

type HmacSha256 = Hmac<Sha256>;

/// What a ticket token says.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TicketClaim {
    pub room: RoomId,
    /// The room's incarnation.
    pub epoch: u64,
    pub ticket: u64,
}

/// Why a token was refused. The messages never contain key material or the
/// token itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a token this server could have made.
    #[error("the ticket token is malformed")]
    Malformed,
    /// Well-formed, but signed with neither the current nor the previous key.
    #[error("the ticket token's signature is not valid")]
    BadSignature,
}

/// What a pass says: this ticket was admitted and its pass runs until
/// `expires_at_ms`. The gate hands one out (as cookie
/// `narabu_{room}_pass`) only when it is set to fail open, so that while
/// the backend cannot be asked, a visitor who was let in a moment ago still
/// is, and nobody else.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PassClaim {
    pub room: RoomId,
    pub epoch: u64,
    pub ticket: u64,
    /// Unix ms.
    pub expires_at_ms: u64,
}

/// A ticket in the shadow line (a traffic rule's `shadow` action): the
/// same payload as a ticket's, under its own MAC context, so the two
/// read alike to anyone without the key and only the server tells them
/// apart, by which context the MAC verifies under.
const SHADOW_CONTEXT: &[u8] = b"narabu shadow ticket v1\0";

/// Which line a verified ticket token belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Line {
    Real,
    Shadow,
}

/// A different MAC context than tickets', so neither kind of token can be
/// passed off as the other.
const PASS_CONTEXT: &[u8] = b"narabu pass v1\0";
const PASS_HEADER_LEN: usize = 1 + 8 + 8 + 8;
/// The context of [`Keyring::derive`]: no ticket or pass MAC starts with it.
const DERIVE_CONTEXT: &[u8] = b"narabu derived key v1\0";

/// Why the key file could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyFileError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path}: holds fewer than {min} bytes, too short to be a signing key \
         (fix or remove it: removing it invalidates every ticket handed out)",
        min = Secret::MIN_LEN
    )]
    TooShort { path: PathBuf },
}

const VERSION: u8 = 1;
/// Binds the MAC to this use, so the same secret used for anything else
/// can never produce a valid ticket.
const CONTEXT: &[u8] = b"narabu ticket v1\0";
const HEADER_LEN: usize = 1 + 8 + 8;
const MAC_LEN: usize = 32;
/// base64url without padding of a 32-byte MAC.
const MAC_B64_LEN: usize = 43;
/// The longest token this server can make (a 64-byte room id); anything
/// longer is refused before any decoding work.
pub(crate) const MAX_TOKEN_LEN: usize =
    (HEADER_LEN + RoomId::MAX_LEN).div_ceil(3) * 4 + 1 + MAC_B64_LEN;

/// The name of the generated key inside the data directory.
pub(crate) const KEY_FILE: &str = "secret.key";

/// The signing keys: the current one signs, both verify.
#[derive(Clone)]
pub struct Keyring {
    current: HmacSha256,
    previous: Option<HmacSha256>,
    /// HKDF-Extract of each key for the signed passes ([`Self::pass_seeds`]).
    pass_seed: [u8; 32],
    previous_pass_seed: Option<[u8; 32]>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let previous = self.previous.as_ref().map(|_| "[redacted]");
        f.debug_struct("Keyring")
            .field("current", &"[redacted]")
            .field("previous", &previous)
            .finish()
    }
}

/// HMAC takes keys of any length; the configuration has already refused
/// short secrets, so this cannot fail in practice.
/// The HKDF pseudo-random key that the pass signing keys are expanded
/// from: the secret is the input keying material, so the derived keys are
/// as strong as it and tell nothing about it.
fn pass_seed(secret: &[u8]) -> [u8; 32] {
    let (prk, _) = hkdf::Hkdf::<Sha256>::extract(Some(PASS_SALT), secret);
    prk.into()
}

fn keyed(secret: &[u8]) -> HmacSha256 {
    match HmacSha256::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

impl Keyring {
    /// Keys from configured secrets (already checked to be long enough).
    pub fn from_secrets(current: &Secret, previous: Option<&Secret>) -> Self {
        Self {
            current: keyed(current.expose().as_bytes()),
            previous: previous.map(|p| keyed(p.expose().as_bytes())),
            pass_seed: pass_seed(current.expose().as_bytes()),
            previous_pass_seed: previous.map(|p| pass_seed(p.expose().as_bytes())),
        }
    }

    /// The configured secrets, or the key file in the data directory when
    /// no secret is configured. Given the three settings rather than the
    /// configuration, which names the key types and so sits above them.
    pub(crate) fn configured(
        secret: Option<&Secret>,
        previous: Option<&Secret>,
        data_dir: &Path,
    ) -> Result<Self, KeyFileError> {
        match secret {
            Some(secret) => Ok(Self::from_secrets(secret, previous)),
            None => Self::load_or_create(data_dir),
        }
    }

    /// Reads `data_dir/secret.key`, or creates it (and the directory) with a
    /// random 256-bit key, readable by the owner only.
    ///
    /// The file holds the key as 64 hex characters and those characters are
    /// the key, exactly as if they were configured as `secret`: an operator
    /// who moves to a configured secret (say, to add instances) can copy the
    /// file's contents into `NARABU_SECRET` and keep every ticket valid.
    ///
    /// Two processes starting at once agree on one key: the new key is
    /// written to a temporary file and linked into place only if no key file
    /// exists, so the loser reads the winner's key.
    pub(crate) fn load_or_create(data_dir: &Path) -> Result<Self, KeyFileError> {
        let path = data_dir.join(KEY_FILE);
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| KeyFileError::Io { path, source }
        };
        match fs::read(&path) {
            Ok(bytes) => return Self::from_key_file(&path, &bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path)(e)),
        }
        crate::private_files::create_dir_all(data_dir).map_err(io_err(data_dir))?;
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let key = hex::encode(raw);
        let tmp = data_dir.join(format!(".{KEY_FILE}.{}.tmp", hex::encode(&raw[..8])));
        write_private(&tmp, format!("{key}\n").as_bytes()).map_err(io_err(&tmp))?;
        let linked = fs::hard_link(&tmp, &path);
        // Best effort: a leftover temporary file holds an unused key only.
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(data_dir);
                Ok(Self::from_secrets(&Secret::new(key), None))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let bytes = fs::read(&path).map_err(io_err(&path))?;
                Self::from_key_file(&path, &bytes)
            }
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    fn from_key_file(path: &Path, bytes: &[u8]) -> Result<Self, KeyFileError> {
        warn_if_readable_by_others(path);
        let key = bytes.trim_ascii();
        if key.len() < Secret::MIN_LEN {
            return Err(KeyFileError::TooShort {
                path: path.to_path_buf(),
            });
        }
        Ok(Self {
            current: keyed(key),
            previous: None,
            pass_seed: pass_seed(key),
            previous_pass_seed: None,
        })
    }

    /// Key material for another use of the same secret (proof-of-work
    /// challenges), from the current key and the previous one: HMAC-SHA256
    /// of each key over a derivation context and `purpose`. A key derived
    /// for one purpose signs nothing that another purpose, or a ticket,
    /// would accept, and cannot be turned back into the secret.
    pub(crate) fn derive(&self, purpose: &str) -> ([u8; 32], Option<[u8; 32]>) {
        let derive = |key: &HmacSha256| -> [u8; 32] {
            mac_in(key, DERIVE_CONTEXT, purpose.as_bytes())
                .finalize()
                .into_bytes()
                .into()
        };
        (derive(&self.current), self.previous.as_ref().map(derive))
    }

    /// The seeds of the signed passes' keys, from the current key and the
    /// previous one (HKDF-Extract; `crate::pass` expands them): every
    /// instance that shares the secret derives the same pass keys.
    pub fn pass_seeds(&self) -> ([u8; 32], Option<[u8; 32]>) {
        (self.pass_seed, self.previous_pass_seed)
    }

    /// The token for a claim, signed with the current key.
    pub fn sign(&self, claim: &TicketClaim) -> String {
        self.sign_in(CONTEXT, claim)
    }

    /// The token for a ticket of the shadow line: it reads exactly like
    /// [`Self::sign`]'s.
    pub(crate) fn sign_shadow(&self, claim: &TicketClaim) -> String {
        self.sign_in(SHADOW_CONTEXT, claim)
    }

    fn sign_in(&self, context: &[u8], claim: &TicketClaim) -> String {
        let room = claim.room.as_str().as_bytes();
        let mut payload = Vec::with_capacity(HEADER_LEN + room.len());
        payload.push(VERSION);
        payload.extend_from_slice(&claim.epoch.to_be_bytes());
        payload.extend_from_slice(&claim.ticket.to_be_bytes());
        payload.extend_from_slice(room);
        let tag = mac_in(&self.current, context, &payload)
            .finalize()
            .into_bytes();
        let mut token = String::with_capacity(MAX_TOKEN_LEN);
        B64.encode_string(&payload, &mut token);
        token.push('.');
        B64.encode_string(tag, &mut token);
        token
    }

    /// The claim of a token signed with the current or the previous key.
    /// Never panics, whatever the input. A shadow line's ticket is not
    /// one: see [`Self::verify_line`].
    pub fn verify(&self, token: &str) -> Result<TicketClaim, TokenError> {
        match self.verify_line(token)? {
            (claim, Line::Real) => Ok(claim),
            (_, Line::Shadow) => Err(TokenError::BadSignature),
        }
    }

    /// The claim of a ticket token of either line, and which.
    pub(crate) fn verify_line(&self, token: &str) -> Result<(TicketClaim, Line), TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed);
        }
        let (payload_b64, tag_b64) = token.split_once('.').ok_or(TokenError::Malformed)?;
        if tag_b64.len() != MAC_B64_LEN {
            return Err(TokenError::Malformed);
        }
        // The decoder refuses non-canonical input (stray trailing bits), so
        // every token has exactly one spelling and no edit is harmless.
        // Decoded on the stack: the gate verifies a token on every check.
        let mut payload = [0u8; HEADER_LEN + RoomId::MAX_LEN + 2];
        let mut tag = [0u8; MAC_LEN + 2];
        let payload = B64
            .decode_slice(payload_b64, &mut payload)
            .ok()
            .and_then(|n| payload.get(..n))
            .ok_or(TokenError::Malformed)?;
        let tag = B64
            .decode_slice(tag_b64, &mut tag)
            .ok()
            .and_then(|n| tag.get(..n))
            .filter(|t| t.len() == MAC_LEN)
            .ok_or(TokenError::Malformed)?;
        let signed = |context: &[u8]| {
            let by = |key: &HmacSha256| mac_in(key, context, payload).verify_slice(tag).is_ok();
            by(&self.current) || self.previous.as_ref().is_some_and(by)
        };
        let line = if signed(CONTEXT) {
            Line::Real
        } else if signed(SHADOW_CONTEXT) {
            Line::Shadow
        } else {
            return Err(TokenError::BadSignature);
        };
        Ok((decode_payload(payload)?, line))
    }
}

#[cfg(test)]
fn mac(key: &HmacSha256, payload: &[u8]) -> HmacSha256 {
    mac_in(key, CONTEXT, payload)
}

fn mac_in(key: &HmacSha256, context: &[u8], payload: &[u8]) -> HmacSha256 {
    let mut mac = key.clone();
    mac.update(context);
    mac.update(payload);
    mac
}

impl Keyring {
    /// The token for a pass, signed with the current key.
    pub fn sign_pass(&self, claim: &PassClaim) -> String {
        let room = claim.room.as_str().as_bytes();
        let mut payload = Vec::with_capacity(PASS_HEADER_LEN + room.len());
        payload.push(VERSION);
        payload.extend_from_slice(&claim.epoch.to_be_bytes());
        payload.extend_from_slice(&claim.ticket.to_be_bytes());
        payload.extend_from_slice(&claim.expires_at_ms.to_be_bytes());
        payload.extend_from_slice(room);
        let tag = mac_in(&self.current, PASS_CONTEXT, &payload)
            .finalize()
            .into_bytes();
        let mut token = B64.encode(&payload);
        token.push('.');
        B64.encode_string(tag, &mut token);
        token
    }

    /// The claim of a pass signed with the current or the previous key.
    /// Expiry is the caller's to check. Never panics, whatever the input.
    pub fn verify_pass(&self, token: &str) -> Result<PassClaim, TokenError> {
        if token.len() > MAX_TOKEN_LEN + 12 {
            return Err(TokenError::Malformed);
        }
        let (payload_b64, tag_b64) = token.split_once('.').ok_or(TokenError::Malformed)?;
        let payload = B64.decode(payload_b64).map_err(|_| TokenError::Malformed)?;
        let tag = B64.decode(tag_b64).map_err(|_| TokenError::Malformed)?;
        let signed_by = |key: &HmacSha256| {
            mac_in(key, PASS_CONTEXT, &payload)
                .verify_slice(&tag)
                .is_ok()
        };
        if !signed_by(&self.current) && !self.previous.as_ref().is_some_and(signed_by) {
            return Err(TokenError::BadSignature);
        }
        let (header, room) = payload
            .split_at_checked(PASS_HEADER_LEN)
            .ok_or(TokenError::Malformed)?;
        let number =
            |at: usize| <[u8; 8]>::try_from(&header[at..at + 8]).map_or(0, u64::from_be_bytes);
        let room = std::str::from_utf8(room).map_err(|_| TokenError::Malformed)?;
        match (header[0], RoomId::new(room)) {
            (VERSION, Ok(room)) => Ok(PassClaim {
                room,
                epoch: number(1),
                ticket: number(9),
                expires_at_ms: number(17),
            }),
            _ => Err(TokenError::Malformed),
        }
    }
}

fn decode_payload(payload: &[u8]) -> Result<TicketClaim, TokenError> {
    let (header, room) = payload
        .split_at_checked(HEADER_LEN)
        .ok_or(TokenError::Malformed)?;
    let (version, numbers) = header.split_first().ok_or(TokenError::Malformed)?;
    let (epoch, ticket) = numbers.split_at(8);
    let to_u64 = |b: &[u8]| <[u8; 8]>::try_from(b).map(u64::from_be_bytes);
    let room = std::str::from_utf8(room).map_err(|_| TokenError::Malformed)?;
    match (version, to_u64(epoch), to_u64(ticket), RoomId::new(room)) {
        (&VERSION, Ok(epoch), Ok(ticket), Ok(room)) => Ok(TicketClaim {
            room,
            epoch,
            ticket,
        }),
        _ => Err(TokenError::Malformed),
    }
}

/// Creates `path` (failing if it exists) with mode 0600 and durably writes
/// `contents`.
fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut file =
        crate::private_files::open(fs::OpenOptions::new().write(true).create_new(true), path)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// Makes the new directory entry durable; failing to is not worth refusing
/// to start over (the worst case is a new key after a power cut).
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

fn warn_if_readable_by_others(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                path = %path.display(),
                "the ticket signing key file is readable by other users; chmod 600 it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests;
