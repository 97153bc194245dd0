use super::*;

fn keys() -> ChallengeKeys {
    ChallengeKeys::new([1; 32], None)
}

fn room(name: &str) -> RoomId {
    RoomId::new(name).unwrap()
}

const NOW: u64 = 1_800_000_000_000;

#[test]
fn the_digest_is_sha256_of_the_token_and_the_decimal_counter() {
    // Computed with Python's hashlib, independently of this code.
    assert_eq!(
        hex::encode(digest("abc", 42)),
        "8216ac77f5c9ed66907b03f1d78b795e7cdd315cecd13df42cd7245d45e16b06"
    );
    assert_eq!(
        hex::encode(digest("x.y", u64::MAX)),
        "380be5e8b913c9abf96dd1fc68e03d6967fa7cdf8ff1bdb5c9f8b97f5d051741"
    );
    assert_eq!(
        digest("t", 0),
        <[u8; 32]>::from(Sha256::digest(b"t0")),
        "zero is written as one digit"
    );
}

#[test]
fn leading_zero_bits_count_from_the_first_byte_s_top_bit() {
    let mut d = [0xffu8; 32];
    assert_eq!(leading_zero_bits(&d), 0);
    d[0] = 0x01;
    assert_eq!(leading_zero_bits(&d), 7);
    d[0] = 0;
    d[1] = 0x10;
    assert_eq!(leading_zero_bits(&d), 11);
    assert_eq!(leading_zero_bits(&[0; 32]), 256);
}

#[test]
fn a_solved_challenge_is_accepted_once_checked() {
    let k = keys();
    let c = k.issue(&room("sale"), 8, NOW);
    assert_eq!(c.expires_at_ms, NOW + CHALLENGE_TTL_MS);
    let n = solve(&c.token, 8);
    assert!(leading_zero_bits(&digest(&c.token, n)) >= 8);
    let solved = k.check(&room("sale"), &c.token, n, 8, NOW + 1000).unwrap();
    assert_eq!(solved.expires_at_ms, c.expires_at_ms);
    // Two challenges never share a nonce.
    let other = k.issue(&room("sale"), 8, NOW);
    let other_n = solve(&other.token, 8);
    let other_solved = k
        .check(&room("sale"), &other.token, other_n, 8, NOW)
        .unwrap();
    assert_ne!(solved.nonce, other_solved.nonce);
}

#[test]
fn a_counter_that_does_not_solve_it_is_refused() {
    let k = keys();
    let c = k.issue(&room("sale"), 12, NOW);
    let wrong = (0..)
        .find(|&n| leading_zero_bits(&digest(&c.token, n)) < 12)
        .unwrap();
    assert_eq!(
        k.check(&room("sale"), &c.token, wrong, 12, NOW),
        Err(PowError::Wrong)
    );
    assert_eq!(
        k.check(&room("sale"), &c.token, MAX_COUNTER + 1, 0, NOW),
        Err(PowError::Wrong),
        "counters past 2^53 - 1 are refused"
    );
}

#[test]
fn room_expiry_difficulty_and_signature_are_checked() {
    let k = keys();
    let c = k.issue(&room("sale"), 4, NOW);
    let n = solve(&c.token, 4);
    assert_eq!(
        k.check(&room("other"), &c.token, n, 4, NOW),
        Err(PowError::OtherRoom)
    );
    assert_eq!(
        k.check(&room("sale"), &c.token, n, 4, c.expires_at_ms),
        Err(PowError::Expired)
    );
    assert_eq!(
        k.check(&room("sale"), &c.token, n, 5, NOW),
        Err(PowError::TooEasy),
        "a room that raised its difficulty refuses cheaper challenges"
    );
    // Another server's key, or an edited payload, is a forgery.
    let foreign = ChallengeKeys::new([2; 32], None);
    assert_eq!(
        foreign.check(&room("sale"), &c.token, n, 4, NOW),
        Err(PowError::Forged)
    );
    let (payload, tag) = c.token.split_once('.').unwrap();
    let mut raw = B64.decode(payload).unwrap();
    raw[1] = 0; // difficulty 0
    let edited = format!("{}.{tag}", B64.encode(&raw));
    assert_eq!(
        k.check(&room("sale"), &edited, 0, 0, NOW),
        Err(PowError::Forged)
    );
}

#[test]
fn the_previous_key_still_verifies_after_a_rotation() {
    let old = ChallengeKeys::new([1; 32], None);
    let c = old.issue(&room("sale"), 4, NOW);
    let n = solve(&c.token, 4);
    let rotated = ChallengeKeys::new([9; 32], Some([1; 32]));
    assert!(rotated.check(&room("sale"), &c.token, n, 4, NOW).is_ok());
    let new = rotated.issue(&room("sale"), 4, NOW);
    assert_eq!(
        old.check(&room("sale"), &new.token, solve(&new.token, 4), 4, NOW),
        Err(PowError::Forged)
    );
}

#[test]
fn garbage_is_malformed_and_never_panics() {
    let k = keys();
    let long = "a".repeat(MAX_CHALLENGE_LEN + 1);
    for bad in [
        "",
        ".",
        "abc",
        "a.b",
        "!!!.???",
        "AQ.AAAA",
        long.as_str(),
        "AQEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    ] {
        let got = k.check(&room("sale"), bad, 0, 0, NOW);
        assert!(
            matches!(got, Err(PowError::Malformed | PowError::Forged)),
            "{bad:?}: {got:?}"
        );
    }
    let c = k.issue(&room(&"a".repeat(64)), MAX_DIFFICULTY, NOW);
    assert!(c.token.len() <= MAX_CHALLENGE_LEN);
}

#[test]
fn derived_keys_differ_by_purpose_and_from_ticket_keys() {
    use crate::secret::Secret;
    use crate::token::Keyring;
    let ring = Keyring::from_secrets(&Secret::new("s".repeat(32)), None);
    let (a, prev) = ring.derive("pow challenge");
    let (b, _) = ring.derive("something else");
    assert_ne!(a, b);
    assert_eq!(prev, None);
    assert_eq!(ring.derive("pow challenge").0, a, "derivation is stable");
    let rotated = Keyring::from_secrets(
        &Secret::new("t".repeat(32)),
        Some(&Secret::new("s".repeat(32))),
    );
    assert_eq!(rotated.derive("pow challenge").1, Some(a));
}
