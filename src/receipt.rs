//! Receipts: what a visitor keeps of their place in line. The join answer
//! carries one, a JWT signed with the receipt key (Ed25519, published in
//! the same JWKS as the pass keys, so the keys at
//! `/.well-known/jwks.json` check it): the room, the line's epoch, the
//! ticket's id and number, its lane and when it joined. Nothing in it
//! names the visitor. With the room's admission record it lets anyone see
//! where that ticket stood and when it was let in; alone, it proves the
//! room handed out that number at that time.
//!
//! A receipt must never pass for a pass: its audience is
//! `receipt:{room}`, not the room (what passes and the shipped proxy
//! configurations check), it carries no `exp` (which the proxies require),
//! and its header's `typ` is [`TYPE`].
//!
//! [`verify`] is `narabu verify-receipt`'s check: the key comes from the
//! JWKS by the receipt's `kid`, and the algorithm from the key (never from
//! the receipt's own header).

use std::collections::HashSet;

use anyhow::{Context, bail};
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};

/// The `typ` of a receipt's header.
pub(crate) const TYPE: &str = "narabu-receipt+jwt";

/// The `aud` of a receipt of `room`.
pub fn audience(room: &str) -> String {
    format!("receipt:{room}")
}

/// What a receipt says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptClaims {
    /// The service (its public URL, or `narabu`).
    pub iss: String,
    /// `receipt:{room}`.
    pub aud: String,
    pub room: String,
    /// The line the ticket stands in: a room that starts again begins a
    /// new epoch.
    pub epoch: u64,
    /// The ticket's id: the order of joining, and what the opening draw
    /// and the admission record name.
    pub ticket: u64,
    /// Its number in its lane (1-based); `null` in the pre-queue before the
    /// opening draw.
    pub number: Option<u64>,
    /// Its lane, in a room with lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// When it joined, in Unix milliseconds.
    pub joined_at: u64,
    /// When this receipt was signed, in Unix seconds.
    pub iat: u64,
}

/// Why a receipt was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error("not a JWT")]
    Malformed,
    #[error("not a receipt: its header's typ is {0:?}, not {TYPE:?}")]
    NotAReceipt(Option<String>),
    #[error("the receipt names no key (kid)")]
    NoKid,
    #[error("no published key has the receipt's kid {0:?}")]
    UnknownKey(String),
    #[error("the published key {0:?} is not an EC P-256 or Ed25519 key")]
    UnusableKey(String),
    #[error("the signature does not check out with the published key")]
    BadSignature,
    #[error("the receipt is of room {got:?}, not {want:?}")]
    OtherRoom { want: String, got: String },
    #[error("the receipt's claims are not a receipt's: {0}")]
    BadClaims(String),
}

/// Checks `token` against the published keys `jwks` (a JWKS document) and,
/// when given, that it is a receipt of `room`.
pub fn verify(
    token: &str,
    jwks: &JwkSet,
    room: Option<&str>,
) -> Result<ReceiptClaims, ReceiptError> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| ReceiptError::Malformed)?;
    if header.typ.as_deref() != Some(TYPE) {
        return Err(ReceiptError::NotAReceipt(header.typ));
    }
    let kid = header.kid.ok_or(ReceiptError::NoKid)?;
    let jwk = jwks
        .find(&kid)
        .ok_or_else(|| ReceiptError::UnknownKey(kid.clone()))?;
    let alg = match &jwk.algorithm {
        AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
        _ => return Err(ReceiptError::UnusableKey(kid)),
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|_| ReceiptError::UnusableKey(kid.clone()))?;
    let mut validation = Validation::new(alg);
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims = HashSet::from(["aud".to_owned(), "iat".to_owned()]);
    let claims = jsonwebtoken::decode::<ReceiptClaims>(token, &key, &validation)
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidSignature
            | jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => ReceiptError::BadSignature,
            jsonwebtoken::errors::ErrorKind::Json(_)
            | jsonwebtoken::errors::ErrorKind::MissingRequiredClaim(_) => {
                ReceiptError::BadClaims(e.to_string())
            }
            _ => ReceiptError::Malformed,
        })?
        .claims;
    if claims.aud != audience(&claims.room) {
        return Err(ReceiptError::BadClaims(format!(
            "aud {:?} does not name room {:?}",
            claims.aud, claims.room
        )));
    }
    if let Some(want) = room
        && claims.room != want
    {
        return Err(ReceiptError::OtherRoom {
            want: want.to_owned(),
            got: claims.room,
        });
    }
    Ok(claims)
}

/// The most of a JWKS read: a few keys take a few hundred bytes.
const MAX_JWKS_BYTES: u64 = 64 * 1024;

/// The published keys from an `http(s)://` address or a file.
pub async fn load_jwks(source: &str) -> anyhow::Result<JwkSet> {
    let text = if source.starts_with("http://") || source.starts_with("https://") {
        let url = url::Url::parse(source).with_context(|| format!("not a URL: {source}"))?;
        let mut response = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()?
            .get(url.clone())
            .header("accept", "application/json")
            .send()
            .await
            .with_context(|| format!("fetching {url}"))?;
        if !response.status().is_success() {
            bail!("{url} answered {}", response.status());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            body.extend_from_slice(&chunk);
            if body.len() as u64 > MAX_JWKS_BYTES {
                bail!("{url} is larger than any key set ({MAX_JWKS_BYTES} bytes); stopped reading");
            }
        }
        body
    } else {
        use std::io::Read as _;
        let file = std::fs::File::open(source).with_context(|| format!("reading {source}"))?;
        let mut body = Vec::new();
        file.take(MAX_JWKS_BYTES + 1)
            .read_to_end(&mut body)
            .with_context(|| format!("reading {source}"))?;
        if body.len() as u64 > MAX_JWKS_BYTES {
            bail!("{source} is larger than any key set ({MAX_JWKS_BYTES} bytes)");
        }
        body
    };
    serde_json::from_slice(&text)
        .with_context(|| format!("{source} is not a JWKS ({{\"keys\": [...]}})"))
}

/// A receipt as a person may pass it: the JWT itself, or a file holding
/// it or holding the JSON of `GET /api/rooms/{room}/receipt`.
pub fn read_token(input: &str) -> anyhow::Result<String> {
    let input = input.trim();
    let text = if input.starts_with("ey") && input.matches('.').count() == 2 {
        input.to_owned()
    } else {
        use std::io::Read as _;
        let mut text = String::new();
        std::fs::File::open(input)
            .with_context(|| format!("reading {input}"))?
            .take(MAX_JWKS_BYTES)
            .read_to_string(&mut text)
            .with_context(|| format!("reading {input}"))?;
        text
    };
    let text = text.trim();
    if text.starts_with('{') {
        let body: serde_json::Value =
            serde_json::from_str(text).context("the receipt file is not JSON")?;
        return body["receipt"]
            .as_str()
            .map(str::to_owned)
            .context("the JSON has no \"receipt\"");
    }
    Ok(text.to_owned())
}

/// The claims of a receipt without checking its signature: what
/// `verify-record` reads to find a visitor in a record it then checks.
pub fn claims_unverified(token: &str) -> Result<ReceiptClaims, ReceiptError> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).ok_or(ReceiptError::Malformed)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| ReceiptError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|e| ReceiptError::BadClaims(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::RoomId;
    use crate::pass::{PassAlgorithm, PassKeys};

    fn claims(room: &str) -> ReceiptClaims {
        ReceiptClaims {
            iss: "narabu".into(),
            aud: audience(room),
            room: room.into(),
            epoch: 1,
            ticket: 7,
            number: Some(8),
            lane: None,
            joined_at: 1_764_000_000_123,
            iat: 1_764_000_000,
        }
    }

    fn jwks(keys: &PassKeys) -> JwkSet {
        serde_json::from_str(keys.jwks()).unwrap()
    }

    #[test]
    fn a_receipt_verifies_with_its_keys_only_and_for_its_room_only() {
        for alg in [PassAlgorithm::ES256, PassAlgorithm::EdDSA] {
            let keys = PassKeys::derived(alg, &[1; 32], None);
            let other = PassKeys::derived(alg, &[2; 32], None);
            let receipt = keys.sign_receipt(&claims("sale"));
            assert_eq!(
                verify(&receipt, &jwks(&keys), Some("sale")).unwrap(),
                claims("sale")
            );
            assert_eq!(claims_unverified(&receipt).unwrap(), claims("sale"));
            assert!(matches!(
                verify(&receipt, &jwks(&other), None),
                Err(ReceiptError::UnknownKey(_))
            ));
            assert!(matches!(
                verify(&receipt, &jwks(&keys), Some("other")),
                Err(ReceiptError::OtherRoom { .. })
            ));
            // A pass is not a receipt, though the same key signed it.
            let pass = keys.sign("narabu", &RoomId::new("sale").unwrap(), "7", 1, 2);
            assert!(matches!(
                verify(&pass, &jwks(&keys), None),
                Err(ReceiptError::NotAReceipt(_))
            ));
            // A number moved forward breaks the signature.
            let mut parts: Vec<String> = receipt.split('.').map(str::to_owned).collect();
            let mut altered = claims("sale");
            altered.number = Some(1);
            use base64::Engine as _;
            parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(serde_json::to_vec(&altered).unwrap());
            assert!(matches!(
                verify(&parts.join("."), &jwks(&keys), None),
                Err(ReceiptError::BadSignature)
            ));
        }
    }
}
