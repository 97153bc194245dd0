use proptest::prelude::*;

use super::*;

const KEY_A: &str = "key-a-0123456789abcdef0123456789abcdef";
const KEY_B: &str = "key-b-0123456789abcdef0123456789abcdef";
const KEY_C: &str = "key-c-0123456789abcdef0123456789abcdef";

fn ring(current: &str, previous: Option<&str>) -> Keyring {
    let previous = previous.map(Secret::new);
    Keyring::from_secrets(&Secret::new(current), previous.as_ref())
}

fn claim(room: &str, epoch: u64, ticket: u64) -> TicketClaim {
    TicketClaim {
        room: RoomId::new(room).expect("a valid test room"),
        epoch,
        ticket,
    }
}

/// A token over an arbitrary payload, correctly signed: for checking that
/// the payload is still validated after the signature passes.
fn forge(key: &str, payload: &[u8]) -> String {
    let tag = mac(&keyed(key.as_bytes()), payload).finalize().into_bytes();
    format!("{}.{}", B64.encode(payload), B64.encode(tag))
}

#[test]
fn round_trip() {
    let keys = ring(KEY_A, None);
    for c in [
        claim("sale", 7, 1),
        claim("a", 0, 0),
        claim("0", u64::MAX, u64::MAX),
        claim(&"z".repeat(RoomId::MAX_LEN), 1 << 63, 42),
    ] {
        let token = keys.sign(&c);
        assert_eq!(keys.verify(&token), Ok(c.clone()), "{token}");
    }
}

#[test]
fn tokens_are_compact_and_url_and_cookie_safe() {
    let keys = ring(KEY_A, None);
    let longest = keys.sign(&claim(&"z".repeat(RoomId::MAX_LEN), u64::MAX, u64::MAX));
    assert_eq!(longest.len(), MAX_TOKEN_LEN);
    let token = keys.sign(&claim("sale", 123, 456));
    assert!(token.len() < 80, "{token}");
    assert_eq!(token.matches('.').count(), 1);
    assert!(
        token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'),
        "{token}"
    );
    // Opaque: the room name is not readable in the token.
    assert!(!token.contains("sale"));
}

#[test]
fn every_single_byte_edit_is_refused() {
    let keys = ring(KEY_A, Some(KEY_B));
    let token = keys.sign(&claim("sale", 99, 12345));
    let bytes = token.as_bytes();
    for i in 0..bytes.len() {
        for b in 0..=255u8 {
            if b == bytes[i] {
                continue;
            }
            let mut edited = bytes.to_vec();
            edited[i] = b;
            if let Ok(edited) = String::from_utf8(edited) {
                assert!(
                    keys.verify(&edited).is_err(),
                    "editing byte {i} to {b:#04x} was accepted: {edited}"
                );
            }
        }
        let mut removed = bytes.to_vec();
        removed.remove(i);
        let removed = String::from_utf8(removed).expect("ASCII");
        assert!(keys.verify(&removed).is_err(), "removing byte {i}");
        for b in [b'A', b'-', b'.', b'='] {
            let mut inserted = bytes.to_vec();
            inserted.insert(i, b);
            let inserted = String::from_utf8(inserted).expect("ASCII");
            assert!(keys.verify(&inserted).is_err(), "inserting at {i}");
        }
    }
    for end in 0..bytes.len() {
        assert!(keys.verify(&token[..end]).is_err(), "truncated to {end}");
    }
}

#[test]
fn a_rotated_key_keeps_old_tickets_valid() {
    let old = ring(KEY_A, None);
    let rotated = ring(KEY_B, Some(KEY_A));
    let c = claim("sale", 1, 2);
    let old_token = old.sign(&c);
    assert_eq!(rotated.verify(&old_token), Ok(c.clone()));
    // New tickets are signed with the new key...
    let new_token = rotated.sign(&c);
    assert_ne!(new_token, old_token);
    assert_eq!(rotated.verify(&new_token), Ok(c.clone()));
    assert_eq!(old.verify(&new_token), Err(TokenError::BadSignature));
    // ...and a second rotation drops the oldest key.
    let again = ring(KEY_C, Some(KEY_B));
    assert_eq!(again.verify(&old_token), Err(TokenError::BadSignature));
    assert_eq!(again.verify(&new_token), Ok(c));
}

#[test]
fn an_unknown_key_is_refused() {
    let c = claim("sale", 1, 2);
    let token = ring(KEY_C, None).sign(&c);
    assert_eq!(
        ring(KEY_A, None).verify(&token),
        Err(TokenError::BadSignature)
    );
    assert_eq!(
        ring(KEY_A, Some(KEY_B)).verify(&token),
        Err(TokenError::BadSignature)
    );
}

#[test]
fn claims_differ_in_every_field() {
    let keys = ring(KEY_A, None);
    let base = keys.sign(&claim("sale", 1, 2));
    assert_ne!(base, keys.sign(&claim("sale", 9, 2)), "epoch");
    assert_ne!(base, keys.sign(&claim("sale", 1, 9)), "ticket");
    assert_ne!(base, keys.sign(&claim("sale2", 1, 2)), "room");
}

#[test]
fn garbage_is_refused_without_panicking() {
    let keys = ring(KEY_A, Some(KEY_B));
    let valid = keys.sign(&claim("sale", 1, 2));
    let (payload, tag) = valid.split_once('.').expect("a dot");
    let huge = "A".repeat(1 << 20);
    let huge_token = format!("{huge}.{tag}");
    let cases: Vec<String> = vec![
        String::new(),
        ".".into(),
        "..".into(),
        "a.b".into(),
        format!("{payload}."),
        format!(".{tag}"),
        format!("{payload}.{tag}="),
        format!("{payload}=.{tag}"),
        format!("{payload}.{tag}.{tag}"),
        format!("{payload}{tag}"),
        format!(" {valid}"),
        format!("{valid}\n"),
        valid.replace('-', "+").replace('_', "/"),
        format!("{payload}.{}", "A".repeat(43)),
        format!("{payload}.{}", "_".repeat(43)),
        format!("{payload}.{}", &tag[..42]),
        "é.é".into(),
        "\0.\0".into(),
        format!("{}.{tag}", "\u{1F600}".repeat(10)),
        huge.clone(),
        huge_token,
        format!("{payload}.{huge}"),
    ];
    for case in &cases {
        assert!(
            keys.verify(case).is_err(),
            "{:?}",
            &case[..case.len().min(80)]
        );
    }
}

#[test]
fn a_signed_but_invalid_payload_is_malformed() {
    let keys = ring(KEY_A, None);
    let header = |version: u8| {
        let mut p = vec![version];
        p.extend_from_slice(&[0; 16]);
        p
    };
    let with_room = |version: u8, room: &[u8]| {
        let mut p = header(version);
        p.extend_from_slice(room);
        p
    };
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![VERSION],
        header(VERSION)[..16].to_vec(),
        header(VERSION),
        with_room(2, b"sale"),
        with_room(0, b"sale"),
        with_room(VERSION, b"Sale"),
        with_room(VERSION, b"-sale"),
        with_room(VERSION, &[0xff, 0xfe]),
        with_room(VERSION, "z".repeat(65).as_bytes()),
    ];
    for payload in &cases {
        assert_eq!(
            keys.verify(&forge(KEY_A, payload)),
            Err(TokenError::Malformed),
            "{payload:?}"
        );
    }
    // The forging helper itself makes tokens the keyring accepts.
    let good = forge(KEY_A, &with_room(VERSION, b"sale"));
    assert_eq!(keys.verify(&good), Ok(claim("sale", 0, 0)));
}

#[test]
fn nothing_prints_key_material() {
    let keys = ring(KEY_A, Some(KEY_B));
    let shown = format!("{keys:?}");
    assert_eq!(
        shown,
        "Keyring { current: \"[redacted]\", previous: Some(\"[redacted]\") }"
    );
    for e in [TokenError::Malformed, TokenError::BadSignature] {
        let text = format!("{e} {e:?}");
        assert!(!text.contains("key-a") && !text.contains("key-b"), "{text}");
    }
    assert_eq!(
        format!("{:?}", ring(KEY_A, None)),
        "Keyring { current: \"[redacted]\", previous: None }"
    );
}

#[test]
fn load_or_create_is_stable_across_restarts() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let data_dir = dir.path().join("nested").join("narabu-data");
    let first = Keyring::load_or_create(&data_dir).expect("creates the key");
    let second = Keyring::load_or_create(&data_dir).expect("reads the key");
    let c = claim("sale", 5, 6);
    let token = first.sign(&c);
    assert_eq!(second.verify(&token), Ok(c.clone()));
    assert_eq!(second.sign(&c), token);

    let contents = fs::read_to_string(data_dir.join(KEY_FILE)).expect("the key file");
    let key = contents.strip_suffix('\n').expect("ends in a newline");
    assert_eq!(key.len(), 64);
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
    // The file's contents, configured as a secret, make the same key.
    let configured = Keyring::from_secrets(&Secret::new(key), None);
    assert_eq!(configured.verify(&token), Ok(c));
    // No temporary files are left behind.
    let entries: Vec<_> = fs::read_dir(&data_dir).expect("list").collect();
    assert_eq!(entries.len(), 1);

    let other = tempfile::tempdir().expect("a temp dir");
    let elsewhere = Keyring::load_or_create(other.path()).expect("another key");
    assert_eq!(elsewhere.verify(&token), Err(TokenError::BadSignature));
}

#[test]
fn concurrent_starts_agree_on_one_key() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let data_dir = dir.path().join("data");
    let rings: Vec<Keyring> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| Keyring::load_or_create(&data_dir)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic").expect("a key"))
            .collect()
    });
    let c = claim("sale", 1, 1);
    let token = rings[0].sign(&c);
    for r in &rings {
        assert_eq!(r.sign(&c), token);
    }
    let entries: Vec<_> = fs::read_dir(&data_dir).expect("list").collect();
    assert_eq!(entries.len(), 1, "only secret.key remains");
}

#[cfg(unix)]
#[test]
fn the_key_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("a temp dir");
    Keyring::load_or_create(dir.path()).expect("creates the key");
    let mode = fs::metadata(dir.path().join(KEY_FILE))
        .expect("the key file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_short_key_file_is_an_error_and_left_alone() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join(KEY_FILE);
    fs::write(&path, "too short\n").expect("write");
    let e = Keyring::load_or_create(dir.path()).expect_err("too short");
    assert!(matches!(e, KeyFileError::TooShort { .. }), "{e}");
    let message = e.to_string();
    assert!(message.contains("secret.key"), "{message}");
    assert!(!message.contains("too short\n"), "{message}");
    assert_eq!(fs::read_to_string(&path).expect("read"), "too short\n");
}

#[test]
fn an_unusable_data_dir_is_an_io_error() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("a-file");
    fs::write(&file, "x").expect("write");
    let e = Keyring::load_or_create(&file).expect_err("not a directory");
    assert!(matches!(e, KeyFileError::Io { .. }), "{e}");
}

#[test]
fn a_configured_secret_comes_before_the_key_file() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let from_file = Keyring::configured(None, None, dir.path()).expect("creates a key file");
    assert!(dir.path().join(KEY_FILE).exists());

    let (current, previous) = (Secret::new(KEY_B), Secret::new(KEY_A));
    let configured =
        Keyring::configured(Some(&current), Some(&previous), dir.path()).expect("configured");
    let c = claim("default", 1, 1);
    assert_eq!(
        configured.verify(&ring(KEY_A, None).sign(&c)),
        Ok(c.clone())
    );
    assert_eq!(
        configured.verify(&from_file.sign(&c)),
        Err(TokenError::BadSignature)
    );
}

proptest! {
    #[test]
    fn any_string_is_refused_without_panicking(s in ".{0,200}") {
        prop_assert!(ring(KEY_A, Some(KEY_B)).verify(&s).is_err());
    }

    #[test]
    fn token_shaped_strings_are_refused(
        payload in "[A-Za-z0-9_-]{0,120}",
        tag in "[A-Za-z0-9_-]{40,46}",
    ) {
        let token = format!("{payload}.{tag}");
        prop_assert!(ring(KEY_A, None).verify(&token).is_err());
    }

    #[test]
    fn any_claim_round_trips(room in "[a-z0-9][a-z0-9-]{0,63}", epoch: u64, ticket: u64) {
        let keys = ring(KEY_A, None);
        let c = claim(&room, epoch, ticket);
        prop_assert_eq!(keys.verify(&keys.sign(&c)), Ok(c));
    }
}

#[test]
fn passes_round_trip_and_cannot_be_confused_with_tickets() {
    let keys = ring(KEY_A, None);
    let pass = PassClaim {
        room: RoomId::new("sale").unwrap(),
        epoch: 7,
        ticket: 42,
        expires_at_ms: 1_800_000_000_000,
    };
    let token = keys.sign_pass(&pass);
    assert_eq!(keys.verify_pass(&token), Ok(pass.clone()));
    // A pass is not a ticket, and a ticket is not a pass.
    assert!(keys.verify(&token).is_err());
    let ticket = keys.sign(&claim("sale", 7, 42));
    assert!(keys.verify_pass(&ticket).is_err());
    // Every single-byte edit is refused; another key is refused.
    for i in 0..token.len() {
        let mut edited = token.clone().into_bytes();
        edited[i] = if edited[i] == b'A' { b'B' } else { b'A' };
        let edited = String::from_utf8(edited).unwrap();
        if edited != token {
            assert!(keys.verify_pass(&edited).is_err(), "edit at {i}");
        }
    }
    assert!(ring(KEY_B, None).verify_pass(&token).is_err());
    assert!(ring(KEY_B, Some(KEY_A)).verify_pass(&token).is_ok());
}

proptest! {
    #[test]
    fn pass_verification_never_panics(s in ".{0,200}") {
        let _ = ring(KEY_A, None).verify_pass(&s);
    }
}

#[test]
fn a_shadow_ticket_reads_like_a_ticket_but_only_the_key_tells_them_apart() {
    let keys = ring(KEY_A, None);
    let c = claim("sale", 7, 41);
    let (real, shadow) = (keys.sign(&c), keys.sign_shadow(&c));
    // The same payload and length: only the MAC differs.
    assert_eq!(real.len(), shadow.len());
    assert_eq!(real.split('.').next(), shadow.split('.').next());
    assert_ne!(real, shadow);
    assert_eq!(keys.verify_line(&real), Ok((c.clone(), Line::Real)));
    assert_eq!(keys.verify_line(&shadow), Ok((c.clone(), Line::Shadow)));
    // What reads real tickets only never takes a shadow one for one.
    assert_eq!(keys.verify(&shadow), Err(TokenError::BadSignature));
    // Through a rotation, as tickets are.
    let rotated = ring(KEY_B, Some(KEY_A));
    assert_eq!(rotated.verify_line(&shadow), Ok((c.clone(), Line::Shadow)));
    assert!(ring(KEY_B, None).verify_line(&shadow).is_err());
}
