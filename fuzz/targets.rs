//! The bodies of the fuzz targets, shared word for word by the cargo-fuzz
//! binaries in `fuzz/fuzz_targets/` (libFuzzer, nightly) and by
//! `tests/fuzz_smoke.rs` (a bounded run on stable in the test suite), so
//! the two cannot drift apart. Each takes arbitrary bytes, must never
//! panic on them, and asserts the property its parser promises:
//!
//! - [`token`]: the only tokens `Keyring::verify` (tickets) and
//!   `Keyring::verify_pass` (fail-open passes) accept are ones the server
//!   signed, of that kind, in the one spelling it signs them; a mutated
//!   token is never accepted.
//! - [`return_path`]: whatever `validate_return_path` accepts is a path on
//!   this site: it starts with a single `/`, is printable ASCII, has no
//!   backslash, and resolves (WHATWG URL parser) on this site's origin,
//!   also after each round of percent-decoding.
//! - [`config`]: `Config::from_toml_str` never panics, every error names
//!   the file and a field (or a line and column), and no error shows the
//!   value of a secret.

use std::sync::OnceLock;

use narabu::config::{Config, Secret};
use narabu::http::return_path::validate_return_path;
use narabu::token::{Keyring, TicketClaim};

/// The signing keys of the token target; `fuzz/corpus/token/` holds tokens
/// signed with them, so the fuzzer starts from ones that verify.
pub const SECRET: &str = "fuzz-current-secret-0123456789abcdef";
pub const PREVIOUS_SECRET: &str = "fuzz-previous-secret-0123456789abcde";

/// Current and previous key, as after a rotation.
pub fn keyring() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| {
        Keyring::from_secrets(&Secret::new(SECRET), Some(&Secret::new(PREVIOUS_SECRET)))
    })
}

/// The previous key alone, to sign what the rotated-out key signed.
pub fn previous_keyring() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| Keyring::from_secrets(&Secret::new(PREVIOUS_SECRET), None))
}

/// Both kinds of token: the ticket, and the signed pass the gate hands out
/// while failing open.
pub fn token(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ticket = keyring().verify(text);
    if let Ok(claim) = &ticket {
        let signed = [keyring().sign(claim), previous_keyring().sign(claim)];
        assert!(
            signed.iter().any(|s| s == text),
            "accepted a ticket the server never signed: {text:?} as {claim:?}"
        );
    }
    let pass = keyring().verify_pass(text);
    if let Ok(claim) = &pass {
        let signed = [
            keyring().sign_pass(claim),
            previous_keyring().sign_pass(claim),
        ];
        assert!(
            signed.iter().any(|s| s == text),
            "accepted a pass the server never signed: {text:?} as {claim:?}"
        );
    }
    assert!(
        ticket.is_err() || pass.is_err(),
        "one token is both a ticket and a pass: {text:?}"
    );
}

/// Whether the token target's keys accept `text` as a ticket or a pass.
pub fn accepted(text: &str) -> bool {
    keyring().verify(text).is_ok() || keyring().verify_pass(text).is_ok()
}

/// Signs a claim with the current key (for seeds and mutations).
pub fn sign(room: &str, epoch: u64, ticket: u64) -> String {
    keyring().sign(&TicketClaim {
        room: narabu::engine::RoomId::new(room).expect("a valid room id"),
        epoch,
        ticket,
    })
}

pub fn return_path(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A refusal never repeats the path by construction (its error is a
    // fieldless enum), so only what is accepted needs checking. (A check
    // that the message does not contain the input found only inputs such
    // as `e '/` that are pieces of the fixed messages.)
    if let Ok(path) = validate_return_path(Some(text)) {
        assert_on_site(text, &path);
    }
}

/// `path` (accepted for `given`) is a path on this site, as given and after
/// every round of percent-decoding.
pub fn assert_on_site(given: &str, path: &str) {
    assert!(
        path.bytes().all(|b| b.is_ascii_graphic()),
        "{given:?} gave {path:?}, not printable ASCII (a Location header would refuse it)"
    );
    let base = url::Url::parse("https://narabu.example/queue/sale").unwrap();
    let mut form = path.as_bytes().to_vec();
    for _ in 0..16 {
        let text = String::from_utf8_lossy(&form);
        assert!(
            text.starts_with('/') && !text.starts_with("//"),
            "{given:?} accepted, but {text:?} does not start with a single '/'"
        );
        assert!(
            !text.contains('\\'),
            "{given:?} accepted with a backslash in {text:?}"
        );
        assert!(
            !text.chars().any(char::is_control),
            "{given:?} accepted with a control character in {text:?}"
        );
        let joined = base
            .join(&text)
            .unwrap_or_else(|e| panic!("{given:?} accepted but {text:?} is no URL: {e}"));
        assert_eq!(
            joined.host_str(),
            Some("narabu.example"),
            "{given:?} leaves the site as {joined}"
        );
        assert_eq!(
            joined.scheme(),
            "https",
            "{given:?} changes scheme: {joined}"
        );
        assert!(
            !joined.path().starts_with("//"),
            "{given:?} resolves to {joined}, a path a relative redirect would turn into another host"
        );
        match percent_decode(&form) {
            Some(decoded) => form = decoded,
            None => return,
        }
    }
}

/// One round of percent-decoding, written independently of the validator's
/// own; `None` when there is nothing left to decode.
fn percent_decode(input: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    let mut changed = false;
    while i < input.len() {
        if input[i] == b'%'
            && let Some(hex) = input.get(i + 1..i + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
            && hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            out.push(byte);
            i += 3;
            changed = true;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    changed.then_some(out)
}

const SECRET_KEYS: [&str; 4] = ["secret", "previous_secret", "admin_token", "release_key"];

pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Err(e) = Config::from_toml_str(text, "fuzz.toml") else {
        return;
    };
    let shown = e.to_string();
    assert_eq!(e.origin(), "fuzz.toml", "{shown}");
    assert!(
        !e.field().is_empty(),
        "an error that names no field: {shown}"
    );
    assert!(
        !e.message().is_empty(),
        "an error that says nothing: {shown}"
    );
    for value in secret_values(text) {
        assert!(
            !shown.contains(value),
            "the error shows the secret {value:?}: {shown}"
        );
    }
}

/// The values given to secret keys on `key = "value"` lines that look like
/// secrets (letters, digits and dashes, with both letters and digits) and
/// occur once in the text, so that seeing one in an error can only mean the
/// secret leaked. (Without the shape rule, `admin_token =
/// "2026-12-01T10:00:00+09:00"` "leaked" through the `opens_at` error's
/// example of a valid time.)
fn secret_values(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            let key = key.trim().trim_matches(['"', '\'']);
            SECRET_KEYS.contains(&key).then_some(())?;
            let value = value.trim().trim_matches(['"', '\'']);
            let secret_like = value.len() >= 12
                && value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && value.bytes().any(|b| b.is_ascii_alphabetic())
                && value.bytes().any(|b| b.is_ascii_digit());
            (secret_like && text.matches(value).count() == 1).then_some(value)
        })
        .collect()
}
