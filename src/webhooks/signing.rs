//! Standard Webhooks signatures (<https://www.standardwebhooks.com>), so a
//! receiver checks a delivery with a published library rather than code of
//! its own.
//!
//! Each attempt carries `webhook-id` (the event's id, the same on every
//! retry), `webhook-timestamp` (Unix seconds of this attempt) and
//! `webhook-signature`: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`,
//! one per key, space-separated, so a receiver keeps verifying while its
//! secret is rotated. A receiver's secret is configured as the spec presents
//! it, `whsec_<base64 of the key>`.
//!
//! Secrets written before Narabu followed the standard (a plain string of at
//! least 32 bytes) are still accepted: the key is then the string's bytes,
//! and deliveries also carry the old `X-Narabu-Signature` header, so a
//! receiver written for it keeps working until it moves to the library.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_PAD_INDIFFERENT};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secret::Secret;

/// How the specification presents a symmetric secret.
pub(crate) const SECRET_PREFIX: &str = "whsec_";
/// The key lengths the specification asks for, in bytes (192 to 512 bits).
pub(crate) const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// The legacy signature header, sent only for plain (pre-standard) secrets.
pub(crate) const LEGACY_SIGNATURE_HEADER: &str = "x-narabu-signature";

/// A receiver's signing key. `Debug` never shows it.
#[derive(Clone)]
pub struct SigningKey {
    key: Vec<u8>,
    /// Configured as a plain string rather than `whsec_…`.
    legacy: bool,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.legacy {
            "SigningKey(plain, [redacted])"
        } else {
            "SigningKey(whsec, [redacted])"
        })
    }
}

impl SigningKey {
    /// Reads a configured secret: `whsec_<base64>` (24 to 64 bytes once
    /// decoded), or a plain string of at least [`Secret::MIN_LEN`] bytes.
    /// The error is a sentence for the configuration error; it never quotes
    /// the secret.
    pub fn parse(secret: &Secret) -> Result<Self, String> {
        let text = secret.expose();
        let Some(encoded) = text.strip_prefix(SECRET_PREFIX) else {
            if secret.len() < Secret::MIN_LEN {
                return Err(format!(
                    "must be a Standard Webhooks secret, `whsec_` and the base64 of \
                     {} to {} random bytes (make one with \
                     `echo whsec_$(openssl rand -base64 32)`); got {} bytes",
                    KEY_BYTES.start(),
                    KEY_BYTES.end(),
                    secret.len()
                ));
            }
            return Ok(Self {
                key: text.as_bytes().to_vec(),
                legacy: true,
            });
        };
        // Standard base64 only: the reference libraries drop characters
        // outside that alphabet, so a URL-safe key would become another key.
        let key = STANDARD_PAD_INDIFFERENT.decode(encoded).map_err(|_| {
            "must be `whsec_` followed by the key in standard base64 \
             (A-Z, a-z, 0-9, '+', '/'); this is not"
                .to_owned()
        })?;
        if !KEY_BYTES.contains(&key.len()) {
            return Err(format!(
                "the key after `whsec_` must be {} to {} bytes once decoded, got {} \
                 (make one with `echo whsec_$(openssl rand -base64 32)`)",
                KEY_BYTES.start(),
                KEY_BYTES.end(),
                key.len()
            ));
        }
        Ok(Self { key, legacy: false })
    }

    /// A plain secret from before the standard: deliveries also carry the
    /// legacy header.
    pub(crate) fn is_legacy(&self) -> bool {
        self.legacy
    }

    /// `v1,<base64 signature>` of one attempt.
    fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }

    /// The legacy header's value: `sha256=<hex HMAC-SHA256 of the body>`.
    pub(crate) fn legacy_signature(&self, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }
}

/// The `webhook-signature` header: the body signed with each key, current
/// first, space-separated.
pub(crate) fn signature_header<'a>(
    keys: impl IntoIterator<Item = &'a SigningKey>,
    id: &str,
    timestamp: u64,
    body: &[u8],
) -> String {
    keys.into_iter()
        .map(|k| k.sign(id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Result<SigningKey, String> {
        SigningKey::parse(&Secret::new(s))
    }

    /// The signing example of the reference libraries' own tests (the Go
    /// and C# `standardwebhooks` packages'; the Python one signs it alike).
    #[test]
    fn signs_like_the_reference_libraries() {
        let k = key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("a valid secret");
        assert!(!k.is_legacy());
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature_header([&k], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    /// The operators' guide's worked example (its signature made by the Python
    /// reference library) is what Narabu sends.
    #[test]
    fn the_documented_example_is_signed_as_shown() {
        let readme = include_str!("../../docs/operating.md");
        let k = key("whsec_cmVwbGFjZS13aXRoLW9wZW5zc2wtcmFuZC1iYXNlNjQtMzI=").expect("valid");
        let body = readme
            .lines()
            .find(|l| l.starts_with(r#"{"type":"room.paused""#))
            .expect("the example body");
        let signature = signature_header(
            [&k],
            "5f0c2a9e8d7b4c1a9e3f6d2b8a7c4e10",
            1796086800,
            body.as_bytes(),
        );
        assert_eq!(signature, "v1,xN7boyuS175aFdeFVnbGb4AcBPBSeU3+xnobUyvBd74=");
        assert!(readme.contains(&format!("webhook-signature: {signature}")));
    }

    #[test]
    fn every_key_signs_in_turn() {
        let a = key(&format!("whsec_{}", STANDARD.encode([1u8; 32]))).expect("valid");
        let b = key(&format!("whsec_{}", STANDARD.encode([2u8; 24]))).expect("valid");
        let both = signature_header([&a, &b], "id", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], signature_header([&a], "id", 1, b"{}"));
        assert_eq!(parts[1], signature_header([&b], "id", 1, b"{}"));
        assert_ne!(parts[0], parts[1]);
    }

    #[test]
    fn secrets_are_checked_without_being_quoted() {
        // Unpadded base64, as the reference libraries also accept.
        assert!(key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_ok());
        assert!(key(&format!("whsec_{}", STANDARD.encode([7u8; 64]))).is_ok());
        let short = key(&format!("whsec_{}", STANDARD.encode([7u8; 23]))).unwrap_err();
        assert!(
            short.contains("24 to 64 bytes once decoded, got 23"),
            "{short}"
        );
        let long = key(&format!("whsec_{}", STANDARD.encode([7u8; 65]))).unwrap_err();
        assert!(long.contains("got 65"), "{long}");
        // URL-safe base64 would be read as another key by the libraries.
        let url_safe = key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLa-_").unwrap_err();
        assert!(url_safe.contains("standard base64"), "{url_safe}");
        assert!(!url_safe.contains("MfKQ"));
        let plain = key("short-plain-secret").unwrap_err();
        assert!(
            plain.starts_with("must be a Standard Webhooks secret"),
            "{plain}"
        );
        assert!(!plain.contains("short-plain"));
        let legacy = key(&"p".repeat(32)).expect("a plain secret of 32 bytes");
        assert!(legacy.is_legacy());
        assert!(!format!("{legacy:?}").contains("ppp"));
    }

    #[test]
    fn legacy_signature_is_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2, with the key padded to the minimum length
        // the configuration takes, checked against an independent HMAC.
        let k = key("Jefe-Jefe-Jefe-Jefe-Jefe-Jefe-Jefe").expect("plain, long enough");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe-Jefe-Jefe-Jefe-Jefe-Jefe-Jefe")
            .expect("any length");
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            k.legacy_signature(b"what do ya want for nothing?"),
            format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
        );
    }
}
