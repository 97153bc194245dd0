//! `narabu verify-draw URL`: anyone's check of a room's opening draw.
//!
//! It reads the draw's public record (`GET /api/rooms/{room}/draw`, or a
//! queue page's address, which names the room), checks that the seed
//! hashes to the commitment published before opening, and recomputes the
//! order from the seed and the ticket ids alone (SHA-256 of the seed, `/`
//! and each id; ascending): the published order must be exactly that. It
//! trusts nothing the server computed, only what it published.
//!
//! Nor does it trust the server with the terminal or the memory of the
//! person checking: the reply is read up to the size of the largest
//! record a real server can publish ([`MAX_RECORD_BYTES`]), anything the
//! server wrote is echoed only after a `server> ` prefix with its control
//! characters escaped ([`shown`]), so it cannot move the cursor, clear the
//! screen or begin a line of its own, and the verdict is the last line and
//! begins with [`VERDICT`], which no echoed line can.

use anyhow::{Context, bail};

use crate::engine::DrawMismatch;
use crate::engine::rules::MAX_TICKETS;
use crate::http::draw::DrawBody;

/// How the verdict line begins; every line that carries the server's text
/// begins with [`SERVER`] instead.
pub const VERDICT: &str = "==> ";
/// How every line that echoes the server's text begins.
pub const SERVER: &str = "server> ";

/// Decimal digits of the largest ticket id: ids count a room's tickets
/// from zero, so they stay below [`MAX_TICKETS`].
const ID_DIGITS: u64 = {
    let mut n = MAX_TICKETS;
    let mut digits = 0;
    while n > 0 {
        n /= 10;
        digits += 1;
    }
    digits
};

/// The largest draw record a server can publish: every ticket a room may
/// issue in its order (an id and a comma each), and room for the room's
/// id, the commitment, the seed and the field names. A longer reply is
/// not a draw record, and reading it would only spend the checker's
/// memory.
pub(crate) const MAX_RECORD_BYTES: u64 = MAX_TICKETS * (ID_DIGITS + 1) + 16 * 1024;

/// How much of an error reply is read and echoed.
const ERROR_BYTES: usize = 4 * 1024;
/// How many characters of one server string are echoed.
const SHOWN_CHARS: usize = 300;

/// The server's text made safe to print on one line of a terminal, and cut
/// short: see [`escaped`].
pub fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((end, _)) => format!("{}…", escaped(&text[..end])),
        None => escaped(text),
    }
}

/// Text made safe to print on one line of a terminal: control characters
/// (ESC, CR, LF, …), Unicode line separators and the bidi and other
/// invisible format characters that reorder or hide text are escaped as
/// `\u{…}`, and backslashes doubled so an escape cannot be forged.
pub fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || is_format(c) => {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out
}

/// Unicode characters that are not control characters but still change
/// how a line reads: separators, bidi overrides and isolates, zero-width
/// characters and the byte-order mark.
fn is_format(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

/// What a check found.
#[derive(Debug)]
pub enum Verdict {
    /// The commitment matches the seed and the order is the seed's.
    Verified(DrawBody),
    /// The room has not opened yet: only the commitment is known.
    NotDrawn(DrawBody),
    /// The record does not check out.
    Mismatch(DrawBody, DrawMismatch),
}

/// The record's address for what a person may paste: the record itself,
/// or a room's queue page (`…/queue/{room}?…`).
pub(crate) fn record_url(input: &str) -> anyhow::Result<url::Url> {
    let mut url = url::Url::parse(input.trim()).with_context(|| format!("not a URL: {input}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("not an http(s) URL: {input}");
    }
    let segments: Vec<String> = url
        .path_segments()
        .map(|s| s.map(str::to_owned).collect())
        .unwrap_or_default();
    let tail: Vec<&str> = segments.iter().map(String::as_str).collect();
    match tail.as_slice() {
        [.., "api", "rooms", _, "draw"] => {}
        [prefix @ .., "queue", room] => {
            let path = prefix
                .iter()
                .chain(&["api", "rooms", room, "draw"])
                .copied()
                .collect::<Vec<_>>()
                .join("/");
            url.set_path(&format!("/{path}"));
            url.set_query(None);
        }
        _ => bail!(
            "expected a draw record (…/api/rooms/ROOM/draw) or a queue page (…/queue/ROOM): {input}"
        ),
    }
    url.set_fragment(None);
    Ok(url)
}

/// Judges a record already fetched.
pub(crate) fn judge(body: DrawBody) -> Verdict {
    if body.seed.is_none() && body.order.is_none() {
        return Verdict::NotDrawn(body);
    }
    if body.seed.is_none() || body.order.is_none() {
        return Verdict::Mismatch(body, DrawMismatch::BadSeed);
    }
    match body.record().verify() {
        Ok(()) => Verdict::Verified(body),
        Err(e) => Verdict::Mismatch(body, e),
    }
}

/// Fetches and judges the draw at `input`.
pub async fn verify(input: &str) -> anyhow::Result<Verdict> {
    let url = record_url(input)?;
    let response = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()?
        .get(url.clone())
        .header("accept", "application/json")
        .send()
        .await
        .with_context(|| format!("fetching {url}"))?;
    let status = response.status();
    if !status.is_success() {
        let text = read_capped(response, ERROR_BYTES as u64, true).await?;
        bail!(
            "{url} answered {status}; its reply began: \"{}\"",
            String::from_utf8_lossy(&text)
        );
    }
    if let Some(len) = response.content_length()
        && len > MAX_RECORD_BYTES
    {
        bail!(
            "{url} announced a reply of {len} bytes, more than the largest possible draw record ({MAX_RECORD_BYTES} bytes); not reading it"
        );
    }
    let text = read_capped(response, MAX_RECORD_BYTES, false)
        .await
        .with_context(|| format!("reading the draw record from {url}"))?;
    let body: DrawBody =
        serde_json::from_slice(&text).with_context(|| format!("{url} is not a draw record"))?;
    Ok(judge(body))
}

/// Reads at most `cap` bytes of a reply: past it, an error, or with
/// `cut` what was read so far.
pub(crate) async fn read_capped(
    mut response: reqwest::Response,
    cap: u64,
    cut: bool,
) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if (body.len() + chunk.len()) as u64 > cap {
            if cut {
                let room = cap as usize - body.len();
                body.extend_from_slice(&chunk[..room]);
                return Ok(body);
            }
            bail!(
                "the reply is larger than the largest possible draw record ({cap} bytes); stopped reading"
            );
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::LotterySeed;

    #[test]
    fn queue_pages_and_records_name_the_record() {
        for (input, want) in [
            (
                "https://shop.example/api/rooms/sale/draw",
                "https://shop.example/api/rooms/sale/draw",
            ),
            (
                "https://shop.example/queue/sale?return=/buy&lang=ja",
                "https://shop.example/api/rooms/sale/draw",
            ),
            (
                "http://127.0.0.1:8080/waiting/queue/sale",
                "http://127.0.0.1:8080/waiting/api/rooms/sale/draw",
            ),
        ] {
            assert_eq!(record_url(input).unwrap().as_str(), want, "{input}");
        }
        for bad in [
            "ftp://x/api/rooms/a/draw",
            "https://x/elsewhere",
            "not a url",
        ] {
            assert!(record_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_text_is_escaped_and_cut() {
        assert_eq!(shown("sale"), "sale");
        assert_eq!(
            shown("a\u{1b}[2J\r\nb\\c\u{202e}d"),
            "a\\u{1b}[2J\\u{d}\\u{a}b\\\\c\\u{202e}d"
        );
        let long = "x".repeat(1000);
        assert_eq!(shown(&long).chars().count(), SHOWN_CHARS + 1);
    }

    #[test]
    fn judging_tells_verified_from_tampered_and_not_yet_drawn() {
        let seed = LotterySeed([9; 32]);
        let order = seed.draw(&[1, 2, 3, 5, 8, 13]);
        let body = DrawBody {
            room: "sale".into(),
            commitment: seed.commitment(),
            seed: Some(seed.to_hex()),
            order: Some(order.clone()),
            ticket: None,
            place: None,
        };
        assert!(matches!(judge(body.clone()), Verdict::Verified(_)));
        let mut reversed = body.clone();
        reversed.order.as_mut().unwrap().reverse();
        assert!(matches!(judge(reversed), Verdict::Mismatch(..)));
        let sealed = DrawBody {
            seed: None,
            order: None,
            ..body.clone()
        };
        assert!(matches!(judge(sealed), Verdict::NotDrawn(_)));
        let half = DrawBody {
            order: None,
            ..body
        };
        assert!(matches!(judge(half), Verdict::Mismatch(..)));
    }
}
