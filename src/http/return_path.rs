//! The `?return=` path of the queue page: where an admitted visitor is sent.
//!
//! It arrives from the visitor's own URL, so anyone can craft a link to
//! `/queue/sale?return=//evil.example` and hope Narabu redirects there with
//! its own good name (an open redirect). [`validate_return_path`] accepts
//! only a path on this site and refuses everything a browser, or a proxy on
//! the way, might read as another site:
//!
//! - it must start with one `/`, never `//` (a scheme-relative URL) nor
//!   `/\` (browsers treat `\` as `/`), so no scheme can come first either;
//! - no backslash anywhere, no control characters (tabs and line breaks are
//!   deleted by URL parsers, so `/<TAB>/evil` becomes `//evil`), no
//!   whitespace and no invisible formatting characters;
//! - no `.` or `..` segments. `/..//evil.example` is a path on this host as
//!   a browser resolves it (`..` cannot climb above the root, leaving
//!   `https://this.site//evil.example`), so it is not itself an open
//!   redirect; but that resolved path starts with `//`, and any hop that
//!   normalizes it and then redirects relatively (an origin adding a
//!   trailing slash, a proxy rewriting paths) would emit `//evil.example`.
//!   Browsers remove dot segments before sending a request, so a real return
//!   path never has one and refusing them costs nothing;
//! - no characters that Unicode normalization (NFKC) turns into `/`, `\` or
//!   dots, such as the fullwidth solidus `／`, for intermediaries that
//!   normalize;
//! - the same again after percent-decoding, repeatedly and
//!   case-insensitively, so `/%2F%2Fevil`, `/%5Cevil`, `/%09/evil` and
//!   double encodings like `/%252F%252Fevil` are caught. A decoded space
//!   (`%20`) is ordinary data and allowed.
//!
//! A valid path is returned as given, not decoded. The one change is that
//! non-ASCII characters are percent-encoded (as UTF-8, as a browser would),
//! so the result is always printable ASCII and can go into a `Location`
//! header as it is: `axum::response::Redirect` panics on anything else.

use std::borrow::Cow;

/// The longest return path accepted, in bytes as given.
pub(crate) const MAX_LEN: usize = 2048;

/// More layers of percent-encoding than this is not a real link.
const MAX_DECODE_ROUNDS: usize = 8;

/// Why a return path was refused. The messages are fit to show a visitor
/// and never repeat the path itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReturnPathError {
    #[error("the return address is longer than 2048 characters")]
    TooLong,
    #[error("the return address must be a path on this site, starting with a single '/'")]
    NotRelative,
    #[error("the return address must not contain a backslash")]
    Backslash,
    #[error(
        "the return address must not contain spaces, line breaks, control or invisible characters"
    )]
    ControlOrWhitespace,
    #[error("the return address must not contain '.' or '..' path segments")]
    DotSegment,
    #[error("the return address contains a character that imitates a slash, backslash or dot")]
    Lookalike,
    #[error("the return address is percent-encoded too many times over")]
    TooDeeplyEncoded,
}

/// `None` or empty gives `/`; otherwise the path, if it is a path on this
/// site (see the module documentation for every rule).
pub fn validate_return_path(raw: Option<&str>) -> Result<String, ReturnPathError> {
    let raw = match raw {
        None | Some("") => return Ok("/".to_owned()),
        Some(raw) => raw,
    };
    if raw.len() > MAX_LEN {
        return Err(ReturnPathError::TooLong);
    }
    if !raw.starts_with('/') {
        return Err(ReturnPathError::NotRelative);
    }
    // Decoded, a space is data; as given, it is not a URL character.
    if raw.chars().any(char::is_whitespace) {
        return Err(ReturnPathError::ControlOrWhitespace);
    }
    let mut form = Cow::Borrowed(raw.as_bytes());
    // The path ends at the first `?` or `#` as given. One that only
    // decoding produces (`%23`, `%3F`) is part of the path to a browser,
    // so dot segments after it still count: `/x%23/%2E%2E//evil.example`
    // resolves to `//evil.example` on this host.
    let path_end = raw.find(['?', '#']).unwrap_or(raw.len());
    let mut path = Cow::Borrowed(&raw.as_bytes()[..path_end]);
    for _ in 0..=MAX_DECODE_ROUNDS {
        check_form(&form)?;
        check_dot_segments(&path)?;
        match percent_decode_once(&form) {
            None => return Ok(encode_non_ascii(raw)),
            Some(decoded) => {
                form = Cow::Owned(decoded);
                if let Some(decoded) = percent_decode_once(&path) {
                    path = Cow::Owned(decoded);
                }
            }
        }
    }
    Err(ReturnPathError::TooDeeplyEncoded)
}

/// The checks every form (as given, and each decoding of it) must pass,
/// besides [`check_dot_segments`] on its path part.
/// Decoded bytes need not be UTF-8 (legacy Shift_JIS queries are not), so
/// the byte checks come first and the character checks read the rest
/// lossily.
fn check_form(form: &[u8]) -> Result<(), ReturnPathError> {
    if form.starts_with(b"//") {
        return Err(ReturnPathError::NotRelative);
    }
    if form.contains(&b'\\') {
        return Err(ReturnPathError::Backslash);
    }
    if form.iter().any(|b| b.is_ascii_control()) {
        return Err(ReturnPathError::ControlOrWhitespace);
    }
    let text = String::from_utf8_lossy(form);
    for c in text.chars() {
        if c.is_control() || is_invisible(c) {
            return Err(ReturnPathError::ControlOrWhitespace);
        }
        if is_lookalike(c) {
            return Err(ReturnPathError::Lookalike);
        }
    }
    Ok(())
}

/// `path` is the path part of the return address (before its `?` or `#`
/// as given), in one of its decoded forms.
fn check_dot_segments(path: &[u8]) -> Result<(), ReturnPathError> {
    if String::from_utf8_lossy(path).split('/').any(is_dot_segment) {
        return Err(ReturnPathError::DotSegment);
    }
    Ok(())
}

/// Line and paragraph separators, zero-width and bidirectional formatting
/// characters: invisible in an address bar, and some break lines in logs.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
    )
}

/// Characters that NFKC folds into a string containing `/` or `\`
/// (fullwidth and small solidi, ℀ = "a/c"), or that imitate them.
/// Lookalike dots are handled in [`is_dot_segment`] instead, since they are
/// only a danger as a whole segment.
fn is_lookalike(c: char) -> bool {
    matches!(
        c,
        '\u{FF0F}' // fullwidth solidus
            | '\u{FF3C}' // fullwidth reverse solidus
            | '\u{FE68}' // small reverse solidus
            | '\u{2215}' // division slash
            | '\u{2044}' // fraction slash
            | '\u{2216}' // set minus
            | '\u{29F5}' // reverse solidus operator
            | '\u{29F8}' // big solidus
            | '\u{29F9}' // big reverse solidus
            | '\u{2100}' // account of, NFKC "a/c"
            | '\u{2101}' // addressed to the subject, "a/s"
            | '\u{2105}' // care of, "c/o"
            | '\u{2106}' // cada una, "c/u"
    )
}

/// `.` or `..`, also spelled with dots that NFKC folds into `.`.
fn is_dot_segment(segment: &str) -> bool {
    let mut dots = 0;
    for c in segment.chars() {
        dots += match c {
            '.' | '\u{FF0E}' | '\u{2024}' | '\u{FE52}' => 1,
            '\u{2025}' => 2,
            _ => return false,
        };
    }
    dots == 1 || dots == 2
}

/// One round of percent-decoding (`%` and two hex digits of either case);
/// a `%` not followed by two hex digits stays as it is. `None` when there
/// was nothing to decode.
fn percent_decode_once(input: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(input.len());
    let mut changed = false;
    let mut i = 0;
    while let Some(&b) = input.get(i) {
        let escape = match (b, input.get(i + 1), input.get(i + 2)) {
            (b'%', Some(&hi), Some(&lo)) => hex(hi).zip(hex(lo)),
            _ => None,
        };
        match escape {
            Some((hi, lo)) => {
                // Two hex digits fit a byte.
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
                changed = true;
                i += 3;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

fn encode_non_ascii(raw: &str) -> String {
    if raw.is_ascii() {
        return raw.to_owned();
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(raw.len() * 3);
    for c in raw.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push('%');
                out.push(char::from(HEX[usize::from(b >> 4)]));
                out.push(char::from(HEX[usize::from(b & 0xF)]));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
