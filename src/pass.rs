//! Signed passes: a short-lived JWT an admitted visitor carries, which any
//! proxy, edge or app can check with the public keys Narabu publishes
//! (`GET /.well-known/jwks.json`), so that a page view of an admitted
//! visitor does not have to ask the gate.
//!
//! A pass says `iss` (this service), `aud` (the room), `sub` (the ticket),
//! `iat` and `exp`, and names its key in the header's `kid`. It is signed
//! with ES256 (P-256) by default, or EdDSA (Ed25519).
//!
//! The signing key is either a PEM file or derived from the instance
//! secret with HKDF: every instance that shares the secret derives the
//! same key, so nothing private has to be stored anywhere else (not in
//! Redis). Rotation follows the ticket key's: the previous secret (or
//! previous key file) yields the previous key, which is published beside
//! the current one so passes it signed keep verifying until they expire;
//! only the current key signs.
//!
//! Receipts (`crate::receipt`) are signed with a key of their own,
//! Ed25519 whatever the pass algorithm, derived from the same seeds and
//! published in the same JWKS: every join signs one, and an ES256
//! signature costs about eight times an Ed25519 one (a hundred-odd
//! microseconds against fifteen on the machines measured), which would
//! cap a core's joins; nothing that checks passes (HAProxy, WebCrypto)
//! has to check receipts, and every JWT library does Ed25519.
//!
//! Nothing here prints a private key: `Debug` shows the key ids only, and
//! errors name files, never their contents.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hkdf::Hkdf;
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey, LineEnding};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ids::RoomId;
use crate::token::Keyring;

/// The signature algorithm of passes (`pass_algorithm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PassAlgorithm {
    /// ECDSA over P-256 with SHA-256: what every JWT library, HAProxy's
    /// `jwt_verify` and WebCrypto verify.
    #[default]
    ES256,
    /// Ed25519: smaller and faster, but not verified by HAProxy 2.6 nor by
    /// every browser's WebCrypto.
    EdDSA,
}

impl PassAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ES256 => "ES256",
            Self::EdDSA => "EdDSA",
        }
    }
}

/// Why the pass keys could not be loaded. Never quotes a key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PassKeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

/// The claims of a pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PassClaims {
    pub iss: String,
    pub aud: String,
    pub sub: String,
    pub iat: u64,
    pub exp: u64,
}

enum Signer {
    Es256(p256::ecdsa::SigningKey),
    EdDsa(ed25519_dalek::SigningKey),
}

enum Public {
    Es256(p256::PublicKey),
    EdDsa(ed25519_dalek::VerifyingKey),
}

impl Public {
    /// The JWK members that name the key (RFC 7638 order).
    fn jwk_members(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Es256(key) => {
                use p256::elliptic_curve::sec1::ToEncodedPoint;
                let point = key.to_encoded_point(false);
                let coord = |c: Option<&p256::FieldBytes>| c.map(|c| B64.encode(c));
                vec![
                    ("crv", "P-256".to_owned()),
                    ("kty", "EC".to_owned()),
                    ("x", coord(point.x()).unwrap_or_default()),
                    ("y", coord(point.y()).unwrap_or_default()),
                ]
            }
            Self::EdDsa(key) => vec![
                ("crv", "Ed25519".to_owned()),
                ("kty", "OKP".to_owned()),
                ("x", B64.encode(key.as_bytes())),
            ],
        }
    }

    /// The RFC 7638 thumbprint: a key id every instance computes alike
    /// from the key itself.
    fn thumbprint(&self) -> String {
        let canonical: serde_json::Map<String, serde_json::Value> = self
            .jwk_members()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into()))
            .collect();
        let json = serde_json::Value::Object(canonical).to_string();
        B64.encode(Sha256::digest(json.as_bytes()))
    }

    fn jwk(&self, alg: PassAlgorithm) -> serde_json::Value {
        let mut jwk: serde_json::Map<String, serde_json::Value> = self
            .jwk_members()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into()))
            .collect();
        jwk.insert("kid".into(), self.thumbprint().into());
        jwk.insert("use".into(), "sig".into());
        jwk.insert("alg".into(), alg.as_str().into());
        serde_json::Value::Object(jwk)
    }

    fn pem(&self) -> String {
        let pem = match self {
            Self::Es256(key) => key.to_public_key_pem(LineEnding::LF),
            Self::EdDsa(key) => key.to_public_key_pem(LineEnding::LF),
        };
        // Encoding a valid public key cannot fail.
        pem.unwrap_or_default()
    }
}

/// A pass signed a moment ago, kept to hand out again (see
/// [`PassKeys::sign_or_reuse`]).
struct Recent {
    iat: u64,
    exp: u64,
    token: String,
}

/// How many passes may be kept before the expired ones are swept out.
const RECENT_SWEEP_AT: usize = 4096;

/// The instance's pass keys: the current one signs; it and the previous
/// one are published.
pub struct PassKeys {
    alg: PassAlgorithm,
    signer: Signer,
    /// `base64url(header) "."`, the same for every pass.
    header: String,
    /// The same for receipts, which say their type (`typ`) so that no
    /// verifier mistakes one for a pass.
    receipt_header: String,
    /// What signs receipts: the Ed25519 receipt key when the keys were
    /// derived or given seeds ([`PassKeys::with_receipt_seeds`]), else the
    /// pass key.
    receipt_signer: Option<Signer>,
    /// The published pass keys, current first.
    pass_jwks: Vec<serde_json::Value>,
    current_kid: String,
    previous_kid: Option<String>,
    jwks: String,
    pem: String,
    previous_pem: Option<String>,
    /// The last pass signed per room and ticket. Signing ES256 costs about
    /// a hundred times a gate check, and an app polling its status, or a
    /// visitor asking the gate for passes in a loop, would otherwise have
    /// one signed per request.
    recent: dashmap::DashMap<(RoomId, String), Recent>,
}

impl fmt::Debug for PassKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PassKeys")
            .field("alg", &self.alg)
            .field("current_kid", &self.current_kid)
            .field("previous_kid", &self.previous_kid)
            .finish_non_exhaustive()
    }
}

/// HKDF-Expand of a seed into a key of `alg`. For P-256 the 32 bytes must
/// be a scalar below the group order; the odd miss (about 2^-32) moves on
/// to the next counter.
fn derive_signer(alg: PassAlgorithm, seed: &[u8; 32]) -> Signer {
    derive_signer_for(alg, seed, "")
}

/// The receipts' key from a seed: Ed25519, under an HKDF label of its
/// own, so it is never a pass key.
fn derive_receipt_signer(seed: &[u8; 32]) -> Signer {
    derive_signer_for(PassAlgorithm::EdDSA, seed, "receipt ")
}

fn derive_signer_for(alg: PassAlgorithm, seed: &[u8; 32], purpose: &str) -> Signer {
    let hk = match Hkdf::<Sha256>::from_prk(seed) {
        Ok(hk) => hk,
        Err(_) => unreachable!("a 32-byte PRK is long enough for SHA-256"),
    };
    let mut okm = [0u8; 32];
    for counter in 0u8..=255 {
        let info = [
            format!("{purpose}{} signing key", alg.as_str()).as_bytes(),
            &[counter],
        ]
        .concat();
        if hk.expand(&info, &mut okm).is_err() {
            unreachable!("32 bytes is a valid HKDF-SHA256 output length");
        }
        match alg {
            PassAlgorithm::EdDSA => {
                return Signer::EdDsa(ed25519_dalek::SigningKey::from_bytes(&okm));
            }
            PassAlgorithm::ES256 => {
                if let Ok(key) = p256::ecdsa::SigningKey::from_slice(&okm) {
                    return Signer::Es256(key);
                }
            }
        }
    }
    unreachable!("256 HKDF outputs in a row are never all out of range")
}

impl Signer {
    fn public(&self) -> Public {
        match self {
            Self::Es256(key) => Public::Es256(key.verifying_key().into()),
            Self::EdDsa(key) => Public::EdDsa(key.verifying_key()),
        }
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        match self {
            Self::Es256(key) => {
                use p256::ecdsa::signature::Signer as _;
                let signature: p256::ecdsa::Signature = key.sign(message);
                signature.to_bytes().to_vec()
            }
            Self::EdDsa(key) => {
                use ed25519_dalek::Signer as _;
                key.sign(message).to_bytes().to_vec()
            }
        }
    }
}

fn read_pem(path: &Path) -> Result<String, PassKeyError> {
    std::fs::read_to_string(path).map_err(|source| PassKeyError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, alg: PassAlgorithm, what: &str) -> PassKeyError {
    PassKeyError::Invalid {
        path: path.to_path_buf(),
        what: format!("{what} (pass_algorithm is {})", alg.as_str()),
    }
}

/// A private key of `alg` from PEM: PKCS#8 (`BEGIN PRIVATE KEY`), or for
/// P-256 also SEC1 (`BEGIN EC PRIVATE KEY`, what `openssl ecparam
/// -genkey` writes).
fn signer_from_pem(alg: PassAlgorithm, path: &Path, pem: &str) -> Result<Signer, PassKeyError> {
    let signer = match alg {
        PassAlgorithm::ES256 => p256::SecretKey::from_pkcs8_pem(pem)
            .or_else(|_| p256::SecretKey::from_sec1_pem(pem))
            .ok()
            .map(|k| Signer::Es256(k.into())),
        PassAlgorithm::EdDSA => ed25519_dalek::SigningKey::from_pkcs8_pem(pem)
            .ok()
            .map(Signer::EdDsa),
    };
    signer.ok_or_else(|| invalid(path, alg, "not a PEM private key of this algorithm"))
}

/// The previous key from PEM: its private key, or only its public key
/// (SPKI, `BEGIN PUBLIC KEY`), which is all that publishing it needs.
fn public_from_pem(alg: PassAlgorithm, path: &Path, pem: &str) -> Result<Public, PassKeyError> {
    if let Ok(signer) = signer_from_pem(alg, path, pem) {
        return Ok(signer.public());
    }
    let public = match alg {
        PassAlgorithm::ES256 => p256::PublicKey::from_public_key_pem(pem)
            .ok()
            .map(Public::Es256),
        PassAlgorithm::EdDSA => ed25519_dalek::VerifyingKey::from_public_key_pem(pem)
            .ok()
            .map(Public::EdDsa),
    };
    public.ok_or_else(|| {
        invalid(
            path,
            alg,
            "not a PEM private or public key of this algorithm",
        )
    })
}

impl PassKeys {
    fn new(alg: PassAlgorithm, signer: Signer, previous: Option<Public>) -> Self {
        let current = signer.public();
        let current_kid = current.thumbprint();
        let header = serde_json::json!({"alg": alg.as_str(), "typ": "JWT", "kid": current_kid});
        let receipt_header = serde_json::json!({
            "alg": alg.as_str(),
            "typ": crate::receipt::TYPE,
            "kid": current_kid,
        });
        let mut keys = vec![current.jwk(alg)];
        // A previous key equal to the current one (a rotation not begun)
        // is published once.
        let previous = previous.filter(|p| p.thumbprint() != current_kid);
        keys.extend(previous.as_ref().map(|p| p.jwk(alg)));
        Self {
            alg,
            header: format!("{}.", B64.encode(header.to_string())),
            receipt_header: format!("{}.", B64.encode(receipt_header.to_string())),
            receipt_signer: None,
            current_kid,
            previous_kid: previous.as_ref().map(Public::thumbprint),
            jwks: serde_json::json!({ "keys": keys }).to_string(),
            pass_jwks: keys,
            pem: current.pem(),
            previous_pem: previous.as_ref().map(Public::pem),
            signer,
            recent: dashmap::DashMap::new(),
        }
    }

    /// Keys derived from seeds (HKDF pseudo-random keys made from the
    /// current and previous instance secrets, `Keyring::pass_seeds`).
    pub fn derived(alg: PassAlgorithm, current: &[u8; 32], previous: Option<&[u8; 32]>) -> Self {
        let previous_key = previous.map(|seed| derive_signer(alg, seed).public());
        Self::new(alg, derive_signer(alg, current), previous_key)
            .with_receipt_seeds(current, previous)
    }

    /// Receipts signed with the Ed25519 key derived from these seeds (the
    /// previous one's key published too, while rotating), beside the pass
    /// keys in the JWKS.
    pub(crate) fn with_receipt_seeds(
        mut self,
        current: &[u8; 32],
        previous: Option<&[u8; 32]>,
    ) -> Self {
        let signer = derive_receipt_signer(current);
        let public = signer.public();
        let kid = public.thumbprint();
        let header = serde_json::json!({
            "alg": PassAlgorithm::EdDSA.as_str(),
            "typ": crate::receipt::TYPE,
            "kid": kid,
        });
        let mut keys = self.pass_jwks.clone();
        keys.push(public.jwk(PassAlgorithm::EdDSA));
        let previous = previous
            .map(|seed| derive_receipt_signer(seed).public())
            .filter(|p| p.thumbprint() != kid);
        keys.extend(previous.map(|p| p.jwk(PassAlgorithm::EdDSA)));
        self.jwks = serde_json::json!({ "keys": keys }).to_string();
        self.receipt_header = format!("{}.", B64.encode(header.to_string()));
        self.receipt_signer = Some(signer);
        self
    }

    /// Keys from PEM files: the current private key and, while rotating,
    /// the previous key (private or public).
    pub(crate) fn from_files(
        alg: PassAlgorithm,
        current: &Path,
        previous: Option<&Path>,
    ) -> Result<Self, PassKeyError> {
        let signer = signer_from_pem(alg, current, &read_pem(current)?)?;
        let previous = match previous {
            Some(path) => Some(public_from_pem(alg, path, &read_pem(path)?)?),
            None => None,
        };
        Ok(Self::new(alg, signer, previous))
    }

    /// The keys the configuration asks for: its key files (`current` and
    /// `previous`), or keys derived from the ticket key (`keyring`, the
    /// configured secret or the key file).
    pub(crate) fn load(
        alg: PassAlgorithm,
        current: Option<&Path>,
        previous: Option<&Path>,
        keyring: &Keyring,
    ) -> Result<Self, PassKeyError> {
        match current {
            Some(current) => {
                let (seed, previous_seed) = keyring.pass_seeds();
                Ok(Self::from_files(alg, current, previous)?
                    .with_receipt_seeds(&seed, previous_seed.as_ref()))
            }
            None => {
                let (current, previous) = keyring.pass_seeds();
                Ok(Self::derived(alg, &current, previous.as_ref()))
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn algorithm(&self) -> PassAlgorithm {
        self.alg
    }

    /// The id of the key that signs now.
    pub fn kid(&self) -> &str {
        &self.current_kid
    }

    /// `{"keys": [current, previous]}`, as `/.well-known/jwks.json` serves it.
    pub(crate) fn jwks(&self) -> &str {
        &self.jwks
    }

    /// The current public key as SPKI PEM (what HAProxy's `jwt_verify` and
    /// WebCrypto's `importKey("spki")` take).
    pub fn public_pem(&self) -> &str {
        &self.pem
    }

    /// The previous public key as SPKI PEM, while rotating.
    pub(crate) fn previous_public_pem(&self) -> Option<&str> {
        self.previous_pem.as_deref()
    }

    /// A pass for ticket `sub` of `room` valid until at most `exp` (Unix
    /// seconds): the one signed for it last if that still runs at least
    /// `fresh_for` seconds past `now` and no later than `exp`, else a new
    /// one from `now`. Answers the token, its `iat` and its `exp`.
    pub(crate) fn sign_or_reuse(
        &self,
        iss: &str,
        room: &RoomId,
        sub: &str,
        now: u64,
        exp: u64,
        fresh_for: u64,
    ) -> (String, u64, u64) {
        let key = (room.clone(), sub.to_owned());
        if let Some(r) = self.recent.get(&key)
            && r.exp >= now.saturating_add(fresh_for)
            && r.exp <= exp
            && r.iat <= now
        {
            return (r.token.clone(), r.iat, r.exp);
        }
        let token = self.sign(iss, room, sub, now, exp);
        if self.recent.len() >= RECENT_SWEEP_AT {
            self.recent.retain(|_, r| r.exp > now);
        }
        self.recent.insert(
            key,
            Recent {
                iat: now,
                exp,
                token: token.clone(),
            },
        );
        (token, now, exp)
    }

    /// A pass for ticket `sub` of `room`, from `iat` to `exp` (Unix
    /// seconds), issued by `iss`.
    pub fn sign(&self, iss: &str, room: &RoomId, sub: &str, iat: u64, exp: u64) -> String {
        let claims = PassClaims {
            iss: iss.to_owned(),
            aud: room.as_str().to_owned(),
            sub: sub.to_owned(),
            iat,
            exp,
        };
        self.sign_json(&self.header, &claims)
    }

    /// A visitor's receipt, signed with the receipt key (the pass key
    /// when there is none), under a header of its own type; the same
    /// published keys check it.
    pub fn sign_receipt(&self, claims: &crate::receipt::ReceiptClaims) -> String {
        let signer = self.receipt_signer.as_ref().unwrap_or(&self.signer);
        Self::sign_json_with(signer, &self.receipt_header, claims)
    }

    fn sign_json(&self, header: &str, claims: &impl Serialize) -> String {
        Self::sign_json_with(&self.signer, header, claims)
    }

    fn sign_json_with(signer: &Signer, header: &str, claims: &impl Serialize) -> String {
        let payload = serde_json::to_vec(claims).unwrap_or_default();
        let mut token = String::with_capacity(header.len() + 300);
        token.push_str(header);
        B64.encode_string(payload, &mut token);
        let signature = signer.sign(token.as_bytes());
        token.push('.');
        B64.encode_string(signature, &mut token);
        token
    }
}

#[cfg(test)]
mod tests;
