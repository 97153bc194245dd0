use super::*;

fn rising(base: u8, max: u8, at: u32) -> AccessSettings {
    AccessSettings {
        challenge: ChallengeMode::Pow,
        pow_difficulty: base,
        pow_difficulty_max: max,
        pow_rise_per_second: at,
        ..AccessSettings::default()
    }
}

#[test]
fn difficulty_adds_a_bit_per_doubling_of_the_join_rate() {
    let s = rising(14, 18, 100);
    assert_eq!(s.difficulty(0.0), 14);
    assert_eq!(s.difficulty(100.0), 14);
    assert_eq!(s.difficulty(100.1), 15);
    assert_eq!(s.difficulty(200.0), 15);
    assert_eq!(s.difficulty(201.0), 16);
    assert_eq!(s.difficulty(800.0), 17);
    assert_eq!(s.difficulty(1e9), 18, "never past the maximum");
    assert_eq!(s.difficulty(f64::INFINITY), 18);
    assert_eq!(s.difficulty(f64::NAN), 14);
    // Without a maximum above the base, it never rises.
    assert_eq!(rising(14, 14, 100).difficulty(1e6), 14);
}

#[test]
fn settings_limits_name_the_key() {
    assert!(AccessSettings::default().validate().is_ok());
    assert_eq!(rising(0, 0, 1).validate().unwrap_err().0, "pow_difficulty");
    assert_eq!(
        rising(33, 33, 1).validate().unwrap_err().0,
        "pow_difficulty"
    );
    assert_eq!(
        rising(16, 15, 1).validate().unwrap_err().0,
        "pow_difficulty_max"
    );
    assert_eq!(
        rising(16, 33, 1).validate().unwrap_err().0,
        "pow_difficulty_max"
    );
    assert_eq!(
        rising(16, 16, 0).validate().unwrap_err().0,
        "pow_rise_per_second"
    );
}

#[test]
fn an_account_maps_to_one_identity_per_room() {
    let sale = RoomId::new("sale").unwrap();
    let other = RoomId::new("other").unwrap();
    assert_eq!(account_identity(&sale, "a"), account_identity(&sale, "a"));
    assert_ne!(account_identity(&sale, "a"), account_identity(&sale, "b"));
    assert_ne!(account_identity(&sale, "a"), account_identity(&other, "a"));
    // The separator keeps "sale" + "1a" apart from "sale1" + "a".
    let sale1 = RoomId::new("sale1").unwrap();
    assert_ne!(account_identity(&sale, "1a"), account_identity(&sale1, "a"));
}
