use proptest::prelude::*;

use super::ReturnPathError::*;
use super::*;

fn check(raw: &str) -> Result<String, ReturnPathError> {
    validate_return_path(Some(raw))
}

#[track_caller]
fn refused(raw: &str, why: ReturnPathError) {
    assert_eq!(check(raw), Err(why), "{raw:?}");
}

#[test]
fn nothing_means_the_home_page() {
    assert_eq!(validate_return_path(None), Ok("/".to_owned()));
    assert_eq!(validate_return_path(Some("")), Ok("/".to_owned()));
}

#[test]
fn paths_on_this_site_are_returned_as_given() {
    for ok in [
        "/",
        "/checkout?item=3&x=%20y",
        "/a/b#frag",
        "/a/b/",
        "/a//b",
        "/a/b?next=//elsewhere&back=/x",
        "/search?q=a+b&q2=%E6%9D%B1%E4%BA%AC",
        "/legacy?q=%83%65%83%58%83%67",
        "/.well-known/security.txt",
        "/.../x",
        "/..a/b..",
        "/a.b/c.d",
        "/?",
        "/#",
        "/#/..//x",
        "/a?x=../../etc",
        "/a?x=a:b@c",
        "/@evil.example",
        "/evil.example",
        "/http://evil.example",
        "/javascript:alert(1)",
        "/100%",
        "/%zz",
        "/%2",
        "/%25",
        "/%2541",
        "/a%2Fb",
        "/a%20b",
        "/tickets/東京",
        "/%E3%80%80",
        "/q?café",
    ] {
        let got = check(ok).unwrap_or_else(|e| panic!("{ok:?} was refused: {e}"));
        if ok.is_ascii() {
            assert_eq!(got, ok, "returned as given");
        }
    }
}

#[test]
fn non_ascii_is_percent_encoded_for_the_location_header() {
    assert_eq!(
        check("/tickets/東京").as_deref(),
        Ok("/tickets/%E6%9D%B1%E4%BA%AC")
    );
    assert_eq!(check("/q?café#é").as_deref(), Ok("/q?caf%C3%A9#%C3%A9"));
    assert_eq!(check("/😀").as_deref(), Ok("/%F0%9F%98%80"));
}

#[test]
fn other_sites_are_refused() {
    for raw in [
        "//evil.com",
        "//evil.com/path",
        "///evil.com",
        "https://evil.com",
        "http:/evil.com",
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "evil.com",
        "%2F%2Fevil",
        "%2f%2fevil.com",
        "@evil.com",
        " /x",
        "./x",
        "../x",
        "?x",
        "#x",
        "\u{FF0F}\u{FF0F}evil.com",
        "\u{FEFF}/x",
    ] {
        refused(raw, NotRelative);
    }
}

#[test]
fn encoded_slashes_that_make_a_second_slash_are_refused() {
    for raw in [
        "/%2F%2Fevil.com",
        "/%2fevil.com",
        "/%2F",
        "/%2f%2f",
        "/%252F%252Fevil.com",
        "/%252fevil.com",
        "/%25252F/evil.com",
        "/%2F%5Cevil.com",
        "/%2f%5c",
    ] {
        refused(raw, NotRelative);
    }
}

#[test]
fn backslashes_are_refused_in_every_spelling() {
    for raw in [
        "/\\evil.com",
        "/\\\\evil.com",
        "\\\\evil",
        "/a\\b",
        "/%5Cevil",
        "/%5cevil",
        "/%5C%5Cevil.com",
        "/%255Cevil",
        "/%25255cevil",
        "/a?x=%5C",
    ] {
        // The first two start with '/'; the third does not.
        if raw.starts_with('/') {
            refused(raw, Backslash);
        } else {
            refused(raw, NotRelative);
        }
    }
}

#[test]
fn control_characters_and_whitespace_are_refused() {
    for raw in [
        "/\t/evil.com",
        "/\n/evil.com",
        "/\r\n/evil.com",
        "/x\0",
        "/x\u{7f}",
        "/a b",
        "/x\u{85}",
        "/\u{3000}/evil.com",
        "/\u{A0}x",
        "/%09/evil.com",
        "/%0A/evil.com",
        "/%0d%0aSet-Cookie:x=1",
        "/%00",
        "/x%7F",
        "/%2509/evil.com",
        "/%C2%85",
        "/%E2%80%A8",
        "/%E2%80%AE",
        "/%E2%80%8B/evil.com",
        "/%EF%BB%BF",
        "/\u{200B}",
        "/\u{202E}moc.live",
        "/\u{2066}x",
    ] {
        refused(raw, ControlOrWhitespace);
    }
}

#[test]
fn dot_segments_are_refused() {
    // `/..//evil.com` resolves, in a browser, to `//evil.com` on this host:
    // harmless there, but one relative redirect away from leaving the site.
    for raw in [
        "/..//evil.com",
        "/../evil.com",
        "/..",
        "/.",
        "/./",
        "/a/../b",
        "/a/./b",
        "/a/..?x",
        "/a/.#x",
        "/%2e%2e//evil.com",
        "/%2E%2E/%2Fevil.com",
        "/.%2e//evil.com",
        "/%252e%252e//evil.com",
        "/\u{FF0E}\u{FF0E}//evil.com",
        "/\u{2025}//evil.com",
        "/%EF%BC%8E%EF%BC%8E//evil.com",
        // Found by fuzzing: a decoded `#` or `?` is still path to a browser.
        "/%0%2332/%2E%2E//32/%2E%2e",
        "/x%23/%2E%2E//evil.com",
        "/x%3F/%2e%2e//evil.com",
        "/x%2523/%252e%252e//evil.com",
    ] {
        refused(raw, DotSegment);
    }
}

#[test]
fn unicode_lookalikes_are_refused() {
    for raw in [
        "/\u{FF0F}evil.com",
        "/\u{FF3C}evil.com",
        "/\u{FE68}evil.com",
        "/\u{2215}\u{2215}evil.com",
        "/\u{2044}evil.com",
        "/\u{2216}evil",
        "/\u{2100}",
        "/%EF%BC%8Fevil.com",
        "/%EF%BC%BCevil.com",
        "/%25EF%25BC%258Fevil.com",
    ] {
        refused(raw, Lookalike);
    }
}

#[test]
fn length_is_limited() {
    let longest = format!("/{}", "a".repeat(MAX_LEN - 1));
    assert_eq!(check(&longest).as_deref(), Ok(longest.as_str()));
    refused(&format!("/{}", "a".repeat(MAX_LEN)), TooLong);
    refused(&"/".repeat(100_000), TooLong);
}

#[test]
fn deep_encoding_is_refused() {
    // Eight layers still decode to a refusal...
    let eight = format!("/%{}2Fevil", "25".repeat(7));
    refused(&eight, NotRelative);
    // ...and past that nothing is accepted, whatever it decodes to.
    let many = format!("/%{}41", "25".repeat(20));
    refused(&many, TooDeeplyEncoded);
    let legit_but_deep = format!("/a%{}20b", "25".repeat(8));
    refused(&legit_but_deep, TooDeeplyEncoded);
    let seven = format!("/a%{}20b", "25".repeat(7));
    assert!(check(&seven).is_ok());
}

#[test]
fn messages_are_human_and_do_not_echo_the_input() {
    for e in [
        TooLong,
        NotRelative,
        Backslash,
        ControlOrWhitespace,
        DotSegment,
        Lookalike,
        TooDeeplyEncoded,
    ] {
        let text = e.to_string();
        assert!(text.starts_with("the return address "), "{text}");
    }
}

fn is_header_safe(s: &str) -> bool {
    s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

proptest! {
    #[test]
    fn never_panics_and_accepted_paths_stay_on_this_site(
        raw in prop_oneof![".{0,64}", "/.{0,64}", "/[ -~]{0,64}"],
    ) {
        if let Ok(path) = check(&raw) {
            prop_assert!(path.starts_with('/'));
            prop_assert!(!path.starts_with("//"));
            prop_assert!(!path.contains('\\'));
            prop_assert!(is_header_safe(&path), "{:?}", path);
        }
    }

    #[test]
    fn encoded_paths_never_decode_off_site(
        raw in "/[a-z/%25FfCc5.2Ee?#]{0,24}",
    ) {
        if let Ok(path) = check(&raw) {
            let mut form = path.into_bytes();
            while let Some(decoded) = percent_decode_once(&form) {
                prop_assert!(!decoded.starts_with(b"//"), "{:?}", raw);
                prop_assert!(!decoded.contains(&b'\\'), "{:?}", raw);
                form = decoded;
            }
        }
    }
}
