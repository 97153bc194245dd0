//! What must never be shown: secret strings (signing keys, the admin
//! token, webhook secrets) and the parts of URLs that may carry one.
//!
//! Configuration is logged at start-up and errors travel into logs and HTTP
//! responses, so the only way to read a `Secret` is to ask for it by name
//! ([`Secret::expose`]); every formatting path prints `[redacted]`.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A secret value. `Debug` and `Display` print `[redacted]`.
///
/// It is deliberately neither `Serialize` nor `PartialEq`: nothing should
/// write a secret back out, and comparing secrets is the token module's job,
/// done in constant time.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// The shortest secret the configuration accepts, in bytes: a 256-bit
    /// key, or 32 characters of a passphrase.
    pub(crate) const MIN_LEN: usize = 32;

    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the few places that must use it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// Length in bytes (UTF-8), which is what the minimum is measured in.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const REDACTED: &str = "[redacted]";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Shows a URL's scheme and host only: user info may hold a password, and
/// the path or query of a webhook URL is often a token itself.
pub(crate) struct RedactedUrl<'a>(pub &'a str);

impl fmt::Debug for RedactedUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some((scheme, rest)) = self.0.split_once("://") else {
            return f.write_str("\"[redacted]\"");
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let host = match authority.rsplit_once('@') {
            Some((_, host)) => format!("[redacted]@{host}"),
            None => authority.to_owned(),
        };
        let tail = if tail.is_empty() { "" } else { "/[redacted]" };
        write!(f, "\"{scheme}://{host}{tail}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_never_shows_the_value() {
        let s = Secret::new("hunter2-hunter2-hunter2-hunter2-hunter2");
        assert_eq!(format!("{s}"), "[redacted]");
        assert_eq!(format!("{s:?}"), "[redacted]");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some([redacted])");
        assert_eq!(s.expose(), "hunter2-hunter2-hunter2-hunter2-hunter2");
        assert_eq!(s.len(), 39);
    }

    #[test]
    fn deserializes_from_a_string() {
        let s: Secret = serde_json::from_str("\"abc\"").expect("a JSON string");
        assert_eq!(s.expose(), "abc");
        assert!(serde_json::from_str::<Secret>("12").is_err());
    }
}
