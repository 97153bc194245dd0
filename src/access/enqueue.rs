//! Enqueue tokens: the origin's signed word that an account may join.
//!
//! An invite-only room (`enqueue = "token"`) accepts a join only with a
//! JWT the origin signed: HS256 with the shared `enqueue_key`, or EdDSA
//! (Ed25519) with the private half of `enqueue_public_key`. Its claims:
//!
//! - `aud`: the room id (a token for one room opens no other);
//! - `sub`: the account, which becomes the join identity: one account,
//!   one place, whatever the device;
//! - `exp`: when the token stops being accepted (required; 30 s of leeway
//!   for clocks that disagree), and `nbf` if the origin sets one;
//! - `lane` (optional): the lane the account queues in.
//!
//! Verification is the `jsonwebtoken` crate's; the algorithm is taken from
//! the header only to pick which keys to try (HS256: the shared keys,
//! EdDSA: the public keys), and any other algorithm is refused. The key an
//! operator retired (dropped from `enqueue_previous_*`) no longer verifies:
//! its tokens are refused as badly signed. Times are checked here against
//! the server's clock rather than by the crate, so that tests can run on
//! virtual time.
//!
//! A token whose header has `crit` is refused whatever it lists: RFC 7515
//! asks a recipient to refuse extensions marked critical that it does not
//! understand, and this verifier understands none. The crate does not look
//! at `crit`, so the header is read here first.

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::{AccessSettings, SharedKey};
use crate::ids::RoomId;

/// Seconds a token's `exp` and `nbf` may be off, for clocks that disagree.
pub(crate) const LEEWAY_SECS: u64 = 30;
/// Longer accounts are refused: an account id is an id, not a document.
pub(crate) const MAX_ACCOUNT_LEN: usize = 256;
/// Longer tokens are refused before any parsing.
pub(crate) const MAX_TOKEN_LEN: usize = 4096;
const MAX_LANE_LEN: usize = 64;

/// Why an enqueue token was refused. Messages name the problem, never the
/// token or a key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnqueueError {
    #[error("this room needs an enqueue token from the site that sent you here")]
    Missing,
    #[error("the enqueue token is not a JWT this room can read")]
    Malformed,
    #[error("the enqueue token is signed with {0}, which this room does not accept")]
    Algorithm(String),
    #[error(
        "the enqueue token's signature does not match this room's keys (forged, or signed with a retired key)"
    )]
    BadSignature,
    #[error("the enqueue token has expired")]
    Expired,
    #[error("the enqueue token is not valid yet")]
    NotYetValid,
    #[error("the enqueue token is for another room")]
    WrongRoom,
    #[error("the enqueue token has no `{0}` claim")]
    MissingClaim(&'static str),
    #[error("the enqueue token's `{0}` claim is not valid")]
    BadClaim(&'static str),
    #[error("the enqueue token names the lane {0:?}, which this room does not have")]
    UnknownLane(String),
    #[error(
        "the enqueue token marks header extensions as critical (`crit`), and this room understands none"
    )]
    Critical,
}

impl EnqueueError {
    /// The label for metrics and the `reason` of the API's error.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::Algorithm(_) => "algorithm",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongRoom => "wrong_room",
            Self::MissingClaim(_) => "missing_claim",
            Self::BadClaim(_) => "bad_claim",
            Self::UnknownLane(_) => "unknown_lane",
            Self::Critical => "critical_extension",
        }
    }
}

/// Who a verified token lets in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueuer {
    pub account: String,
    pub lane: Option<String>,
    /// Unix seconds.
    pub expires_at: u64,
}

#[derive(Deserialize)]
struct Claims {
    sub: Option<serde_json::Value>,
    exp: Option<serde_json::Value>,
    nbf: Option<serde_json::Value>,
    lane: Option<serde_json::Value>,
}

/// A room's enqueue keys, parsed once.
pub struct EnqueueVerifier {
    shared: Vec<DecodingKey>,
    public: Vec<DecodingKey>,
    hs256: Validation,
    eddsa: Validation,
}

impl std::fmt::Debug for EnqueueVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnqueueVerifier")
            .field("shared_keys", &self.shared.len())
            .field("public_keys", &self.public.len())
            .finish()
    }
}

fn validation(alg: Algorithm, room: &RoomId) -> Validation {
    let mut v = Validation::new(alg);
    v.set_audience(&[room.as_str()]);
    // `exp` and `sub` are checked in `enqueuer`: times against the
    // server's clock, and each claim's absence told from a bad value.
    v.set_required_spec_claims(&["aud"]);
    v.validate_exp = false;
    v.validate_nbf = false;
    v
}

fn shared_key(key: &SharedKey) -> DecodingKey {
    DecodingKey::from_secret(key.expose().as_bytes())
}

fn public_key(pem: &str) -> Result<DecodingKey, String> {
    DecodingKey::from_ed_pem(pem.as_bytes()).map_err(|e| {
        format!("must be an Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----): {e}")
    })
}

/// The key limits of [`AccessSettings::validate`]: `Err((key, message))`.
pub(super) fn validate_keys(s: &AccessSettings) -> Result<(), (&'static str, String)> {
    for (name, key) in [
        ("enqueue_key", &s.enqueue_key),
        ("enqueue_previous_key", &s.enqueue_previous_key),
    ] {
        if let Some(k) = key
            && k.expose().len() < SharedKey::MIN_LEN
        {
            return Err((
                name,
                format!(
                    "must be at least {} bytes (an HS256 key as long as its hash), got {}",
                    SharedKey::MIN_LEN,
                    k.expose().len()
                ),
            ));
        }
    }
    for (name, pem) in [
        ("enqueue_public_key", &s.enqueue_public_key),
        (
            "enqueue_previous_public_key",
            &s.enqueue_previous_public_key,
        ),
    ] {
        if let Some(pem) = pem {
            public_key(pem).map_err(|m| (name, m))?;
        }
    }
    if s.enqueue_previous_key.is_some() && s.enqueue_key.is_none() {
        return Err((
            "enqueue_previous_key",
            "needs enqueue_key (the key that replaced it)".into(),
        ));
    }
    if s.enqueue_previous_public_key.is_some() && s.enqueue_public_key.is_none() {
        return Err((
            "enqueue_previous_public_key",
            "needs enqueue_public_key (the key that replaced it)".into(),
        ));
    }
    Ok(())
}

impl EnqueueVerifier {
    pub fn new(room: &RoomId, s: &AccessSettings) -> Self {
        let shared = [&s.enqueue_key, &s.enqueue_previous_key]
            .into_iter()
            .flatten()
            .map(shared_key)
            .collect();
        let public = [&s.enqueue_public_key, &s.enqueue_previous_public_key]
            .into_iter()
            .flatten()
            .filter_map(|pem| public_key(pem).ok())
            .collect();
        Self {
            shared,
            public,
            hs256: validation(Algorithm::HS256, room),
            eddsa: validation(Algorithm::EdDSA, room),
        }
    }

    /// The account a token lets in, at `now_secs` (Unix seconds).
    pub fn verify(&self, token: Option<&str>, now_secs: u64) -> Result<Enqueuer, EnqueueError> {
        let token = token
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(EnqueueError::Missing)?;
        if token.len() > MAX_TOKEN_LEN {
            return Err(EnqueueError::Malformed);
        }
        if names_critical_extensions(token) {
            return Err(EnqueueError::Critical);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| EnqueueError::Malformed)?;
        let (keys, validation) = match header.alg {
            Algorithm::HS256 => (&self.shared, &self.hs256),
            Algorithm::EdDSA => (&self.public, &self.eddsa),
            other => return Err(EnqueueError::Algorithm(format!("{other:?}"))),
        };
        if keys.is_empty() {
            return Err(EnqueueError::Algorithm(format!("{:?}", header.alg)));
        }
        let mut refusal = EnqueueError::BadSignature;
        for key in keys {
            match jsonwebtoken::decode::<Claims>(token, key, validation) {
                Ok(data) => return enqueuer(data.claims, now_secs),
                Err(e) => {
                    refusal = refusal_of(e.kind());
                    if refusal != EnqueueError::BadSignature {
                        break;
                    }
                }
            }
        }
        Err(refusal)
    }
}

/// Whether the token's header has a `crit` member. A header that does not
/// decode is left for the crate to call malformed.
fn names_critical_extensions(token: &str) -> bool {
    use base64::Engine as _;
    let Some((header, _)) = token.split_once('.') else {
        return false;
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|json| {
            serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&json).ok()
        })
        .is_some_and(|h| h.contains_key("crit"))
}

fn refusal_of(kind: &ErrorKind) -> EnqueueError {
    match kind {
        ErrorKind::InvalidSignature => EnqueueError::BadSignature,
        ErrorKind::InvalidAudience => EnqueueError::WrongRoom,
        ErrorKind::MissingRequiredClaim(_) => EnqueueError::MissingClaim("aud"),
        ErrorKind::InvalidAlgorithm => EnqueueError::Algorithm("another algorithm".into()),
        _ => EnqueueError::Malformed,
    }
}

/// A NumericDate (seconds, possibly fractional) as whole seconds.
fn seconds(v: &serde_json::Value) -> Option<u64> {
    let s = v.as_f64()?;
    (s.is_finite() && s >= 0.0).then(|| s.floor() as u64)
}

fn enqueuer(c: Claims, now: u64) -> Result<Enqueuer, EnqueueError> {
    let exp = c.exp.as_ref().ok_or(EnqueueError::MissingClaim("exp"))?;
    let exp = seconds(exp).ok_or(EnqueueError::BadClaim("exp"))?;
    if exp.saturating_add(LEEWAY_SECS) <= now {
        return Err(EnqueueError::Expired);
    }
    if let Some(nbf) = &c.nbf {
        let nbf = seconds(nbf).ok_or(EnqueueError::BadClaim("nbf"))?;
        if nbf > now.saturating_add(LEEWAY_SECS) {
            return Err(EnqueueError::NotYetValid);
        }
    }
    let account = match c.sub {
        Some(serde_json::Value::String(s))
            if !s.is_empty() && s.len() <= MAX_ACCOUNT_LEN && !s.chars().any(char::is_control) =>
        {
            s
        }
        None => return Err(EnqueueError::MissingClaim("sub")),
        Some(_) => return Err(EnqueueError::BadClaim("sub")),
    };
    let lane = match c.lane {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) if is_lane_name(&s) => Some(s),
        Some(_) => return Err(EnqueueError::BadClaim("lane")),
    };
    Ok(Enqueuer {
        account,
        lane,
        expires_at: exp,
    })
}

/// A lane's name: 1 to 64 lower-case letters, digits, `-` and `_`; what
/// a room's `lanes` and a token's `lane` claim may say alike.
pub(crate) fn is_lane_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_LANE_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests;
