//! `narabu verify-draw URL`: anyone's check of a room's opening draw.
//!
//! It reads the draw's public record (`GET /api/rooms/{room}/draw`, or a
//! queue page's address, which names the room), checks that the seed
//! hashes to the commitment published before opening, and recomputes the
//! order from the seed and the ticket ids alone (SHA-256 of the seed, `/`
//! and each id; ascending): the published order must be exactly that. It
//! trusts nothing the server computed, only what it published.

use anyhow::{Context, bail};

use crate::engine::DrawMismatch;
use crate::http::draw::DrawBody;

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
pub fn record_url(input: &str) -> anyhow::Result<url::Url> {
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
pub fn judge(body: DrawBody) -> Verdict {
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
    let text = response.text().await.context("reading the draw record")?;
    if !status.is_success() {
        bail!(
            "{url} answered {status}: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    let body: DrawBody =
        serde_json::from_str(&text).with_context(|| format!("{url} is not a draw record"))?;
    Ok(judge(body))
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
