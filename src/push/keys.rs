//! The VAPID key pair (RFC 8292) and the `Authorization` header it signs.
//!
//! A browser binds each push subscription to the application server key it
//! was given, and a push service refuses messages not signed by that key.
//! So the key must be the same on every instance and across restarts: it
//! is derived from the instance secret (HKDF-SHA256, nothing stored in
//! Redis), or loaded from a PEM file an operator keeps. Rotating the
//! instance secret therefore changes the key and orphans every live
//! subscription; operators who rotate often configure a PEM key instead.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hkdf::Hkdf;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use p256::SecretKey;
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use p256::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use serde::Serialize;
use sha2::Sha256;

use crate::secret::Secret;

/// HKDF `info` for the VAPID key; the counter after it lets the rare
/// output that is not a valid scalar be replaced deterministically.
const DERIVE_INFO: &[u8] = b"narabu vapid p256 key v1\0";
/// How long a VAPID JWT is valid. RFC 8292 allows up to 24 hours; push
/// services compare with their own clocks, so half of that leaves room.
const TOKEN_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// A signed header is reused for this long per push service origin, so a
/// burst of "your turn" messages costs one signature, not thousands.
const TOKEN_REUSE: Duration = Duration::from_secs(3600);
/// Origins whose header is cached. Endpoints come from visitors, so the
/// cache is bounded; real traffic names a handful of push services.
const CACHE_ORIGINS: usize = 64;

/// Why a VAPID key or header could not be made. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum VapidError {
    #[error("the VAPID key file could not be read: {0}")]
    Read(std::io::Error),
    #[error(
        "the VAPID key file holds no P-256 private key (PEM `PRIVATE KEY` or `EC PRIVATE KEY` expected)"
    )]
    Pem,
    #[error("the VAPID contact must start with `mailto:` or `https://`")]
    Contact,
    #[error("the push endpoint has no origin to address the VAPID token to")]
    Audience,
    #[error("the VAPID token could not be signed")]
    Sign,
}

/// The application server's key pair.
///
/// `Debug` shows the public key only: the private key never reaches a log.
pub struct VapidKey {
    /// Kept for tests only: signing goes through `signing`.
    #[cfg(test)]
    secret: SecretKey,
    /// The same private key in the form `jsonwebtoken` signs with.
    signing: EncodingKey,
    /// The uncompressed public point, base64url without padding.
    public: String,
    contact: String,
    /// Signed headers by push service origin, with when each was signed.
    cache: Mutex<HashMap<String, (SystemTime, String)>>,
}

impl fmt::Debug for VapidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VapidKey")
            .field("public", &self.public)
            .field("contact", &self.contact)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Claims<'a> {
    aud: &'a str,
    exp: u64,
    sub: &'a str,
}

impl VapidKey {
    /// The key every instance sharing `secret` derives alike. `contact` is
    /// the JWT's `sub`, where a push service can reach the operator.
    pub fn derive(secret: &Secret, contact: &str) -> Result<Self, VapidError> {
        Self::from_seed(secret.expose().as_bytes(), contact)
    }

    /// The key derived from `seed`, keying material as strong as the
    /// instance secret (the server passes the ticket keyring's derivation
    /// for this use, which a key file or a configured secret both give).
    pub(crate) fn from_seed(seed: &[u8], contact: &str) -> Result<Self, VapidError> {
        let hk = Hkdf::<Sha256>::new(None, seed);
        // A 32-byte HKDF output is a valid scalar unless it is zero or at
        // least the group order, odds of about 2^-32; the next counter
        // gives another candidate, the same one on every instance.
        for counter in 0u8..=255 {
            let mut info = DERIVE_INFO.to_vec();
            info.push(counter);
            let mut bytes = [0u8; 32];
            hk.expand(&info, &mut bytes)
                .expect("32 bytes is a valid HKDF-SHA256 length");
            if let Ok(key) = SecretKey::from_slice(&bytes) {
                return Self::new(key, contact);
            }
        }
        unreachable!("256 HKDF outputs were all outside the P-256 scalar range")
    }

    /// A key from PEM text: PKCS#8 (`PRIVATE KEY`, what `openssl genpkey`
    /// and py_vapid write) or SEC1 (`EC PRIVATE KEY`, `openssl ecparam`).
    pub fn from_pem(pem: &str, contact: &str) -> Result<Self, VapidError> {
        let key = SecretKey::from_pkcs8_pem(pem)
            .or_else(|_| SecretKey::from_sec1_pem(pem))
            .map_err(|_| VapidError::Pem)?;
        Self::new(key, contact)
    }

    /// [`VapidKey::from_pem`] from a file.
    pub(crate) fn from_pem_file(path: &std::path::Path, contact: &str) -> Result<Self, VapidError> {
        let pem = std::fs::read_to_string(path).map_err(VapidError::Read)?;
        Self::from_pem(&pem, contact)
    }

    fn new(secret: SecretKey, contact: &str) -> Result<Self, VapidError> {
        if !(contact.starts_with("mailto:") || contact.starts_with("https://")) {
            return Err(VapidError::Contact);
        }
        let der = secret.to_pkcs8_der().map_err(|_| VapidError::Pem)?;
        let public = B64.encode(secret.public_key().to_encoded_point(false).as_bytes());
        Ok(Self {
            signing: EncodingKey::from_ec_der(der.as_bytes()),
            #[cfg(test)]
            secret,
            public,
            contact: contact.to_owned(),
            cache: Mutex::default(),
        })
    }

    /// The public key as the page passes it to `pushManager.subscribe`
    /// (`applicationServerKey`): the uncompressed point, base64url.
    pub fn public_key(&self) -> &str {
        &self.public
    }

    /// The `Authorization` header for a message to `endpoint`:
    /// `vapid t=<ES256 JWT>,k=<public key>`, the JWT addressed to the push
    /// service's origin. No space after the comma: RFC 8292 allows one,
    /// but py_vapid, the reference, splits on the bare comma.
    pub(crate) fn authorization(
        &self,
        endpoint: &url::Url,
        now: SystemTime,
    ) -> Result<String, VapidError> {
        let origin = endpoint.origin();
        if !origin.is_tuple() {
            return Err(VapidError::Audience);
        }
        let aud = origin.ascii_serialization();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((signed, header)) = cache.get(&aud)
            && now
                .duration_since(*signed)
                .is_ok_and(|age| age < TOKEN_REUSE)
        {
            return Ok(header.clone());
        }
        let exp = (now + TOKEN_LIFETIME)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let claims = Claims {
            aud: &aud,
            exp,
            sub: &self.contact,
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::ES256), &claims, &self.signing)
            .map_err(|_| VapidError::Sign)?;
        let header = format!("vapid t={token},k={}", self.public);
        if cache.len() >= CACHE_ORIGINS {
            cache.clear();
        }
        cache.insert(aud, (now, header.clone()));
        Ok(header)
    }

    #[cfg(test)]
    pub(crate) fn secret_key(&self) -> &SecretKey {
        &self.secret
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{DecodingKey, Validation};

    const CONTACT: &str = "mailto:ops@example.com";

    fn secret(s: &str) -> Secret {
        Secret::new(s)
    }

    #[test]
    fn derived_keys_follow_the_secret_alone() {
        let a =
            VapidKey::derive(&secret("a-secret-of-at-least-thirty-two-bytes!"), CONTACT).unwrap();
        let b =
            VapidKey::derive(&secret("a-secret-of-at-least-thirty-two-bytes!"), CONTACT).unwrap();
        let c =
            VapidKey::derive(&secret("another-secret-of-thirty-two-bytes!!!"), CONTACT).unwrap();
        assert_eq!(a.public_key(), b.public_key());
        assert_ne!(a.public_key(), c.public_key());
        // The uncompressed point: 0x04, x, y.
        let raw = B64.decode(a.public_key()).unwrap();
        assert_eq!(raw.len(), 65);
        assert_eq!(raw[0], 4);
        assert_eq!(
            p256::PublicKey::from_sec1_bytes(&raw).unwrap(),
            a.secret_key().public_key()
        );
    }

    #[test]
    fn the_private_key_never_prints() {
        let key =
            VapidKey::derive(&secret("a-secret-of-at-least-thirty-two-bytes!"), CONTACT).unwrap();
        let d = key.secret_key().to_bytes();
        let printed = format!("{key:?}");
        assert!(printed.contains(key.public_key()));
        for form in [B64.encode(d), hex::encode(d), format!("{:?}", d.as_slice())] {
            assert!(!printed.contains(&form), "{printed}");
        }
        let der = key.secret_key().to_pkcs8_der().unwrap();
        assert!(!printed.contains(&B64.encode(der.as_bytes())));
        // Errors name the problem, never the file's contents.
        let pem = key.secret_key().to_pkcs8_pem(Default::default()).unwrap();
        let broken = pem.replace("PRIVATE KEY", "PUBLIC KEY");
        let e = VapidKey::from_pem(&broken, CONTACT).unwrap_err();
        assert!(!format!("{e} {e:?}").contains(&pem[30..60]));
    }

    #[test]
    fn pem_keys_load_in_both_forms() {
        let key =
            VapidKey::derive(&secret("a-secret-of-at-least-thirty-two-bytes!"), CONTACT).unwrap();
        let pkcs8 = key.secret_key().to_pkcs8_pem(Default::default()).unwrap();
        let sec1 = key.secret_key().to_sec1_pem(Default::default()).unwrap();
        for pem in [pkcs8.as_str(), sec1.as_str()] {
            let loaded = VapidKey::from_pem(pem, CONTACT).unwrap();
            assert_eq!(loaded.public_key(), key.public_key());
        }
        assert!(matches!(
            VapidKey::from_pem("not a key", CONTACT),
            Err(VapidError::Pem)
        ));
        assert!(matches!(
            VapidKey::from_pem_file(std::path::Path::new("/nonexistent/vapid.pem"), CONTACT),
            Err(VapidError::Read(_))
        ));
    }

    #[test]
    fn contacts_are_mailto_or_https() {
        let s = secret("a-secret-of-at-least-thirty-two-bytes!");
        assert!(VapidKey::derive(&s, "https://example.com/contact").is_ok());
        for bad in ["ops@example.com", "http://example.com", ""] {
            assert!(matches!(
                VapidKey::derive(&s, bad),
                Err(VapidError::Contact)
            ));
        }
    }

    #[test]
    fn the_header_carries_a_jwt_for_the_push_services_origin() {
        let key =
            VapidKey::derive(&secret("a-secret-of-at-least-thirty-two-bytes!"), CONTACT).unwrap();
        let endpoint = url::Url::parse("https://push.example.net:8443/wpush/v2/abc?x=1").unwrap();
        let now = SystemTime::now();
        let header = key.authorization(&endpoint, now).unwrap();
        let rest = header.strip_prefix("vapid t=").unwrap();
        let (token, k) = rest.split_once(",k=").unwrap();
        assert_eq!(k, key.public_key());

        let public = key.secret_key().public_key().to_encoded_point(false);
        let x = B64.encode(public.x().unwrap());
        let y = B64.encode(public.y().unwrap());
        let decoding = DecodingKey::from_ec_components(&x, &y).unwrap();
        let mut validation = Validation::new(Algorithm::ES256);
        validation.set_audience(&["https://push.example.net:8443"]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        let data =
            jsonwebtoken::decode::<serde_json::Value>(token, &decoding, &validation).unwrap();
        assert_eq!(data.claims["sub"], CONTACT);
        let exp = data.claims["exp"].as_u64().unwrap();
        let now_s = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        assert!(exp > now_s && exp <= now_s + 24 * 3600, "{exp} vs {now_s}");

        // Reused within the hour for that origin; signed anew after it
        // and for another origin.
        assert_eq!(key.authorization(&endpoint, now).unwrap(), header);
        let later = now + TOKEN_REUSE + Duration::from_secs(1);
        assert_ne!(key.authorization(&endpoint, later).unwrap(), header);
        let other = url::Url::parse("https://other.example.net/x").unwrap();
        assert_ne!(key.authorization(&other, now).unwrap(), header);
    }
}
