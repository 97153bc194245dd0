//! Web Push message encryption: `aes128gcm` (RFC 8188) keyed as RFC 8291
//! says.
//!
//! A push service relays messages it must not read, so each one is
//! encrypted to the subscription's key: a fresh P-256 key pair per message,
//! ECDH with the browser's `p256dh` key, two HKDF steps mixing in the
//! subscription's `auth` secret and a random salt, then one AES-128-GCM
//! record. The body starts with the header the browser needs to undo it:
//! `salt(16) | rs(4) | idlen(1) | keyid(65)`, the key id being the
//! ephemeral public key.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes128Gcm, Nonce};
use hkdf::Hkdf;
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use p256::{PublicKey, SecretKey};
use sha2::Sha256;

/// The record size announced in the header. One record holds the whole
/// message, so this only has to be at least the record's length.
const RECORD_SIZE: u32 = 4096;
/// After the plaintext of the last (here: only) record (RFC 8188 §2).
const LAST_RECORD_DELIMITER: u8 = 2;
const TAG_LEN: usize = 16;
const KEY_LEN: usize = 65;
/// Bytes before the record: salt, record size, key id length, key id.
pub(crate) const HEADER_LEN: usize = 16 + 4 + 1 + KEY_LEN;
/// The longest plaintext: push services must accept 4096-byte bodies
/// (RFC 8030 §7.2), and header, delimiter and tag take the rest.
pub const MAX_PLAINTEXT: usize = 4096 - HEADER_LEN - 1 - TAG_LEN;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EncryptError {
    #[error("the message is {0} bytes; a push message holds at most {MAX_PLAINTEXT}")]
    TooLong(usize),
}

/// `plaintext` encrypted to a subscription's `p256dh` key and `auth`
/// secret, with a fresh key pair and salt.
pub(crate) fn encrypt(
    plaintext: &[u8],
    ua_public: &PublicKey,
    auth: &[u8; 16],
) -> Result<Vec<u8>, EncryptError> {
    let ephemeral = loop {
        // A random 32-byte string is a valid scalar but for odds of 2^-32.
        if let Ok(key) = SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
            break key;
        }
    };
    encrypt_with(plaintext, ua_public, auth, &ephemeral, rand::random())
}

/// [`encrypt`] with the ephemeral key and salt given, which only the
/// known-answer tests do.
pub(crate) fn encrypt_with(
    plaintext: &[u8],
    ua_public: &PublicKey,
    auth: &[u8; 16],
    as_secret: &SecretKey,
    salt: [u8; 16],
) -> Result<Vec<u8>, EncryptError> {
    if plaintext.len() > MAX_PLAINTEXT {
        return Err(EncryptError::TooLong(plaintext.len()));
    }
    let as_public = as_secret.public_key().to_encoded_point(false);
    let ua_point = ua_public.to_encoded_point(false);
    let shared = p256::ecdh::diffie_hellman(as_secret.to_nonzero_scalar(), ua_public.as_affine());

    // RFC 8291 §3.4: the ECDH secret and the auth secret make the input
    // keying material, bound to both public keys.
    let mut key_info = Vec::with_capacity(14 + 2 * KEY_LEN);
    key_info.extend_from_slice(b"WebPush: info\0");
    key_info.extend_from_slice(ua_point.as_bytes());
    key_info.extend_from_slice(as_public.as_bytes());
    let mut ikm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(auth), shared.raw_secret_bytes())
        .expand(&key_info, &mut ikm)
        .expect("32 bytes is a valid HKDF-SHA256 length");

    // RFC 8188 §2.2 and §2.3: the content encryption key and nonce.
    let prk = Hkdf::<Sha256>::new(Some(&salt), &ikm);
    let mut cek = [0u8; 16];
    prk.expand(b"Content-Encoding: aes128gcm\0", &mut cek)
        .expect("16 bytes is a valid HKDF-SHA256 length");
    let mut nonce = [0u8; 12];
    // The first record's sequence number is 0, so the nonce is used as is.
    prk.expand(b"Content-Encoding: nonce\0", &mut nonce)
        .expect("12 bytes is a valid HKDF-SHA256 length");

    let mut record = Vec::with_capacity(plaintext.len() + 1);
    record.extend_from_slice(plaintext);
    record.push(LAST_RECORD_DELIMITER);
    let sealed = Aes128Gcm::new(&cek.into())
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: &record,
                aad: b"",
            },
        )
        .expect("AES-GCM seals any record this short");

    let mut body = Vec::with_capacity(HEADER_LEN + sealed.len());
    body.extend_from_slice(&salt);
    body.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    body.push(KEY_LEN as u8);
    body.extend_from_slice(as_public.as_bytes());
    body.extend_from_slice(&sealed);
    Ok(body)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

    /// The browser's side, to check round trips: the body decrypted with
    /// the subscription's private key.
    pub(crate) fn decrypt(body: &[u8], ua_secret: &SecretKey, auth: &[u8; 16]) -> Vec<u8> {
        let salt = &body[..16];
        let rs = u32::from_be_bytes(body[16..20].try_into().unwrap());
        assert_eq!(rs, RECORD_SIZE);
        assert_eq!(usize::from(body[20]), KEY_LEN);
        let as_public = PublicKey::from_sec1_bytes(&body[21..HEADER_LEN]).unwrap();
        let shared =
            p256::ecdh::diffie_hellman(ua_secret.to_nonzero_scalar(), as_public.as_affine());
        let mut key_info = b"WebPush: info\0".to_vec();
        key_info.extend_from_slice(ua_secret.public_key().to_encoded_point(false).as_bytes());
        key_info.extend_from_slice(&body[21..HEADER_LEN]);
        let mut ikm = [0u8; 32];
        Hkdf::<Sha256>::new(Some(auth), shared.raw_secret_bytes())
            .expand(&key_info, &mut ikm)
            .unwrap();
        let prk = Hkdf::<Sha256>::new(Some(salt), &ikm);
        let (mut cek, mut nonce) = ([0u8; 16], [0u8; 12]);
        prk.expand(b"Content-Encoding: aes128gcm\0", &mut cek)
            .unwrap();
        prk.expand(b"Content-Encoding: nonce\0", &mut nonce)
            .unwrap();
        let mut record = Aes128Gcm::new(&cek.into())
            .decrypt(Nonce::from_slice(&nonce), &body[HEADER_LEN..])
            .unwrap();
        assert_eq!(record.pop(), Some(LAST_RECORD_DELIMITER));
        record
    }

    fn b64(s: &str) -> Vec<u8> {
        B64.decode(s).unwrap()
    }

    /// RFC 8291 Appendix A, byte for byte: a derivation wrong on both
    /// sides would pass a round trip but not this.
    #[test]
    fn rfc_8291_appendix_a() {
        let plaintext = b"When I grow up, I want to be a watermelon";
        let as_secret =
            SecretKey::from_slice(&b64("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw")).unwrap();
        let ua_secret =
            SecretKey::from_slice(&b64("q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94")).unwrap();
        let ua_public = PublicKey::from_sec1_bytes(&b64(
            "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
        ))
        .unwrap();
        assert_eq!(ua_secret.public_key(), ua_public);
        assert_eq!(
            B64.encode(as_secret.public_key().to_encoded_point(false).as_bytes()),
            "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8"
        );
        let auth: [u8; 16] = b64("BTBZMqHH6r4Tts7J_aSIgg").try_into().unwrap();
        let salt: [u8; 16] = b64("DGv6ra1nlYgDCS1FRnbzlw").try_into().unwrap();
        let body = encrypt_with(plaintext, &ua_public, &auth, &as_secret, salt).unwrap();
        assert_eq!(
            B64.encode(&body),
            "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
        );
        assert_eq!(decrypt(&body, &ua_secret, &auth), plaintext);
    }

    #[test]
    fn each_message_has_its_own_key_and_salt() {
        let ua_secret = SecretKey::from_slice(&[7u8; 32]).unwrap();
        let auth = [9u8; 16];
        let text = "It's your turn".as_bytes();
        let a = encrypt(text, &ua_secret.public_key(), &auth).unwrap();
        let b = encrypt(text, &ua_secret.public_key(), &auth).unwrap();
        assert_ne!(a[..16], b[..16], "salt");
        assert_ne!(a[21..HEADER_LEN], b[21..HEADER_LEN], "ephemeral key");
        assert_eq!(a.len(), HEADER_LEN + text.len() + 1 + TAG_LEN);
        assert_eq!(decrypt(&a, &ua_secret, &auth), text);
        assert_eq!(decrypt(&b, &ua_secret, &auth), text);
    }

    #[test]
    fn the_longest_message_fits_a_4096_byte_body() {
        let ua = SecretKey::from_slice(&[7u8; 32]).unwrap();
        let longest = vec![b'x'; MAX_PLAINTEXT];
        let body = encrypt(&longest, &ua.public_key(), &[1; 16]).unwrap();
        assert_eq!(body.len(), 4096);
        assert_eq!(
            encrypt(&[b'x'; MAX_PLAINTEXT + 1], &ua.public_key(), &[1; 16]),
            Err(EncryptError::TooLong(MAX_PLAINTEXT + 1))
        );
    }
}
