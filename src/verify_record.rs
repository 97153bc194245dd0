//! `narabu verify-record URL`: anyone's check of a room's admission
//! record (`GET /api/rooms/{room}/record`).
//!
//! It reads every page and checks the chain itself: entries numbered from
//! 1 without a gap, each page starting from the hash the one before ended
//! on, each entry's hash SHA-256 of the previous hash and the entry's
//! canonical line, the last one the head the server states (and, given
//! one, a head saved earlier somewhere on the chain). The first entry that
//! fails is named. On a live server it also checks the opening draw
//! (`verify-draw`'s check, and that the record numbered the drawn tickets
//! in the drawn order).
//!
//! Then it reports what the record shows of fairness: admissions out of
//! ticket order within a lane (a Kendall-tau distance, each late ticket
//! listed with what explains it: skipped while away and back later, or
//! recorded out of order within the same instant), each lane's share of
//! admissions against its weight, and, given a receipt, where that ticket
//! stood and when it was let in. Like `verify-draw`, it echoes the
//! server's text only behind `server> ` and escaped, and the verdict is
//! the last line.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, bail};

use crate::engine::record::{chain, genesis};
use crate::published_record::{EntryBody, LaneBody, RecordBody};
use crate::receipt::ReceiptClaims;

/// The most pages read: a room's record of ten million entries.
const MAX_PAGES: u64 = 10_000;
/// The most bytes of one page (a thousand entries of about 200 bytes).
const MAX_PAGE_BYTES: u64 = 4 * 1024 * 1024;
/// Late tickets listed one by one; more are counted.
pub const LISTED: usize = 50;

/// The record as read: the first page's header and every entry.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub room: String,
    pub epoch: u64,
    pub lanes: Vec<LaneBody>,
    /// The head the last page stated, and how many entries it counted.
    pub head: String,
    pub total: u64,
    pub pages: Vec<(u64, String)>,
    pub entries: Vec<EntryBody>,
}

/// Where the chain breaks, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broken {
    /// The entry (from 1) where the check failed; 0 for the record as a
    /// whole (its head).
    pub entry: u64,
    pub why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.entry == 0 {
            write!(f, "{}", self.why)
        } else {
            write!(f, "entry {}: {}", self.entry, self.why)
        }
    }
}

/// Pages from a record file: one page (`RecordBody`), or several, one per
/// line or as a JSON array.
pub fn pages_from_text(text: &str) -> anyhow::Result<Vec<RecordBody>> {
    let text = text.trim();
    if text.starts_with('[') {
        return serde_json::from_str(text).context("not a JSON array of record pages");
    }
    if let Ok(one) = serde_json::from_str::<RecordBody>(text) {
        return Ok(vec![one]);
    }
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("line {} is not a record page", i + 1))
        })
        .collect()
}

/// The pages put together; the header is the first page's, the head the
/// last's.
pub fn assemble(pages: Vec<RecordBody>) -> anyhow::Result<Fetched> {
    let Some(first) = pages.first() else {
        bail!("no record pages");
    };
    let mut fetched = Fetched {
        room: first.room.clone(),
        epoch: first.epoch,
        lanes: first.lanes.clone(),
        head: String::new(),
        total: 0,
        pages: Vec::new(),
        entries: Vec::new(),
    };
    for page in pages {
        fetched.head = page.head;
        fetched.total = page.total;
        fetched.pages.push((page.after, page.previous));
        fetched.entries.extend(page.entries);
    }
    Ok(fetched)
}

/// The record's address for what a person may paste: the record, or a
/// room's queue page (whose room the draw's address names alike).
pub fn record_url(input: &str) -> anyhow::Result<url::Url> {
    let url = url::Url::parse(input.trim()).with_context(|| format!("not a URL: {input}"))?;
    let is_record = url
        .path_segments()
        .is_some_and(|s| s.collect::<Vec<_>>().ends_with(&["record"]));
    let url = if is_record {
        sibling(&url, "draw")
    } else {
        url
    };
    Ok(sibling(&crate::verify::record_url(url.as_str())?, "record"))
}

/// `url` with its last path segment replaced by `last`, and no query.
pub fn sibling(url: &url::Url, last: &str) -> url::Url {
    let mut url = url.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop().push(last);
    }
    url.set_query(None);
    url.set_fragment(None);
    url
}

/// Reads every page of the record at `input`.
pub async fn fetch(input: &str) -> anyhow::Result<Fetched> {
    let base = record_url(input)?;
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    let mut pages = Vec::new();
    let mut after = 0u64;
    for _ in 0..MAX_PAGES {
        let mut url = base.clone();
        url.set_query(Some(&format!("after={after}")));
        let response = client
            .get(url.clone())
            .header("accept", "application/json")
            .send()
            .await
            .with_context(|| format!("fetching {url}"))?;
        let status = response.status();
        if !status.is_success() {
            let text = crate::verify::read_capped(response, 4096, true).await?;
            bail!(
                "{url} answered {status}; its reply began: \"{}\"",
                String::from_utf8_lossy(&text)
            );
        }
        let text = crate::verify::read_capped(response, MAX_PAGE_BYTES, false)
            .await
            .with_context(|| format!("reading {url}"))?;
        let page: RecordBody =
            serde_json::from_slice(&text).with_context(|| format!("{url} is not a record page"))?;
        let got = page.entries.len() as u64;
        let more = page.next.is_some() && got > 0;
        after = page.after + got;
        pages.push(page);
        if !more {
            return assemble(pages);
        }
    }
    bail!("the record runs past {MAX_PAGES} pages; stopped reading")
}

/// Checks the chain: numbering, each page's start, each hash, the head;
/// with `saved`, that a head saved earlier is on the chain. On success,
/// the entry the saved head is (0: the empty record's).
pub fn check_chain(r: &Fetched, saved: Option<&str>) -> Result<Option<u64>, Broken> {
    let mut hash = genesis(&r.room, r.epoch);
    let at = |n: u64, hash: &[u8; 32]| (n, hex::encode(hash));
    let mut seen = vec![at(0, &hash)];
    let mut pages = r.pages.iter().peekable();
    for (i, e) in r.entries.iter().enumerate() {
        let n = i as u64 + 1;
        if e.n != n {
            return Err(Broken {
                entry: n,
                why: format!(
                    "expected entry {n} here, found entry {} (an entry is missing or out of place)",
                    e.n
                ),
            });
        }
        while let Some((after, previous)) = pages.peek() {
            if *after > i as u64 {
                break;
            }
            if *after == i as u64 && *previous != hex::encode(hash) {
                return Err(Broken {
                    entry: n,
                    why: format!(
                        "the page starting here says the hash before it is {previous}, \
                         but the entries before end on {}",
                        hex::encode(hash)
                    ),
                });
            }
            pages.next();
        }
        let next = chain(&hash, &e.line());
        if hex::encode(next) != e.hash {
            return Err(Broken {
                entry: n,
                why: format!(
                    "its hash {} is not SHA-256 of the previous hash and its line \"{}\" (that is {}): \
                     this entry or one before it was changed",
                    e.hash,
                    e.line(),
                    hex::encode(next)
                ),
            });
        }
        hash = next;
        seen.push(at(n, &hash));
    }
    if r.entries.len() as u64 == r.total && hex::encode(hash) != r.head {
        return Err(Broken {
            entry: 0,
            why: format!(
                "the stated head {} is not the hash of the last entry ({})",
                r.head,
                hex::encode(hash)
            ),
        });
    }
    if (r.entries.len() as u64) < r.total {
        return Err(Broken {
            entry: r.entries.len() as u64 + 1,
            why: format!(
                "the record says it has {} entries, but only {} were served",
                r.total,
                r.entries.len()
            ),
        });
    }
    match saved {
        None => Ok(None),
        Some(saved) => seen
            .iter()
            .find(|(_, h)| h.eq_ignore_ascii_case(saved.trim()))
            .map(|(n, _)| Some(*n))
            .ok_or_else(|| Broken {
                entry: 0,
                why: format!(
                    "the saved head {} is not on the chain: the record was rewritten since it was saved",
                    saved.trim()
                ),
            }),
    }
}

/// A ticket admitted after tickets of its lane with higher numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Late {
    pub lane: u8,
    pub ticket: u64,
    pub number: u64,
    /// Its admission entry.
    pub entry: u64,
    /// How many of its lane with higher numbers were admitted before it.
    pub inversions: u64,
    /// Of those, how many are explained.
    pub explained: u64,
    /// What explains them, if anything.
    pub why: Option<String>,
}

/// The Kendall-tau distance of each lane's admissions from ticket order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Order {
    /// Admissions with a number, by lane.
    pub admitted: BTreeMap<u8, u64>,
    pub inversions: u64,
    pub unexplained: u64,
    pub late: Vec<Late>,
}

/// Counts, with a Fenwick tree over numbers, how many earlier admissions
/// of the lane had a higher number than each one; explains them by the
/// ticket's skip before its admission (its visitor was away when the head
/// passed, and was put first in line on coming back), or, for admissions
/// at the same instant or earlier, by two threads recording them in the
/// other order.
pub fn order(entries: &[EntryBody]) -> Order {
    let mut skipped: HashMap<u64, (u64, Option<u64>)> = HashMap::new();
    let mut lanes: BTreeMap<u8, Vec<&EntryBody>> = BTreeMap::new();
    for e in entries {
        match e.kind.as_str() {
            "skip" => {
                skipped.entry(e.ticket).or_insert((e.n, None));
            }
            "return" => {
                if let Some(s) = skipped.get_mut(&e.ticket) {
                    s.1.get_or_insert(e.n);
                }
            }
            "admit" if e.number > 0 => lanes.entry(e.lane).or_default().push(e),
            _ => {}
        }
    }
    let mut out = Order::default();
    for (lane, admits) in lanes {
        out.admitted.insert(lane, admits.len() as u64);
        let most = admits.iter().map(|e| e.number).max().unwrap_or(0) as usize;
        let mut tree = vec![0u64; most + 1];
        let mut latest_at: BTreeMap<u64, u64> = BTreeMap::new();
        for (seen, e) in admits.iter().enumerate() {
            let mut i = e.number as usize;
            let mut not_above = 0;
            while i > 0 {
                not_above += tree[i];
                i &= i - 1;
            }
            let above = seen as u64 - not_above;
            if above > 0 {
                // Admitted no later than every higher number before it:
                // the same instant, recorded in the other order.
                let same_instant = latest_at.range(e.number + 1..).all(|(_, &at)| at >= e.at);
                let (explained, why) = match skipped.get(&e.ticket) {
                    Some(&(skip, back)) if skip < e.n => (
                        above,
                        Some(match back {
                            Some(back) => format!(
                                "skipped while away (entry {skip}), back in line (entry {back}): first in line on return"
                            ),
                            None => format!("skipped while away (entry {skip})"),
                        }),
                    ),
                    _ if same_instant => (
                        above,
                        Some("admitted at the same instant as the higher numbers before it (recorded in the other order)".into()),
                    ),
                    _ => (0, None),
                };
                out.inversions += above;
                out.unexplained += above - explained;
                out.late.push(Late {
                    lane,
                    ticket: e.ticket,
                    number: e.number,
                    entry: e.n,
                    inversions: above,
                    explained,
                    why,
                });
            }
            let mut i = e.number as usize;
            while i <= most {
                tree[i] += 1;
                i += i & i.wrapping_neg();
            }
            let at = latest_at.entry(e.number).or_insert(e.at);
            *at = (*at).max(e.at);
        }
    }
    out
}

/// Where a receipt's ticket stands in the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Standing {
    pub ticket: u64,
    pub lane: u8,
    pub number: u64,
    /// Its admission entry and time, if it was admitted.
    pub admitted: Option<(u64, u64)>,
    /// Admitted in its lane before it (all of them, and those with higher
    /// numbers).
    pub before: u64,
    pub before_higher: u64,
    /// Its last entry other than the admission (an ending, a skip).
    pub last: Option<(u64, String)>,
    /// What does not match the receipt.
    pub mismatch: Option<String>,
}

/// Finds a receipt's ticket in the record.
pub fn locate(r: &Fetched, claims: &ReceiptClaims) -> Standing {
    let mut s = Standing {
        ticket: claims.ticket,
        lane: 0,
        number: claims.number.unwrap_or(0),
        admitted: None,
        before: 0,
        before_higher: 0,
        last: None,
        mismatch: None,
    };
    if claims.room != r.room || claims.epoch != r.epoch {
        s.mismatch = Some(format!(
            "the receipt is of room {} line {}, the record of room {} line {}",
            claims.room, claims.epoch, r.room, r.epoch
        ));
        return s;
    }
    let mine: Vec<&EntryBody> = r
        .entries
        .iter()
        .filter(|e| e.ticket == claims.ticket && e.kind != "draw" && e.kind != "close")
        .collect();
    if let Some(e) = mine.first() {
        s.lane = e.lane;
        s.number = e.number;
        if let Some(n) = claims.number
            && n != e.number
        {
            s.mismatch = Some(format!(
                "the receipt says number {n}, the record number {}",
                e.number
            ));
        }
        let lane_name = r.lanes.get(usize::from(e.lane)).map(|l| l.name.as_str());
        if claims.lane.as_deref() != lane_name {
            s.mismatch = Some(format!(
                "the receipt says lane {:?}, the record lane {:?}",
                claims.lane, lane_name
            ));
        }
    }
    if let Some(admit) = mine.iter().find(|e| e.kind == "admit") {
        s.admitted = Some((admit.n, admit.at));
        for e in r.entries.iter().take_while(|e| e.n < admit.n) {
            if e.kind == "admit" && e.lane == s.lane && e.number > 0 {
                s.before += 1;
                if e.number > s.number {
                    s.before_higher += 1;
                }
            }
        }
    }
    s.last = mine
        .iter()
        .rfind(|e| e.kind != "admit")
        .map(|e| (e.n, e.kind.clone()));
    s
}

/// Checks that the record numbered the drawn tickets, within each lane,
/// in the draw's order; the draw record is `verify-draw`'s.
pub fn check_draw_numbers(r: &Fetched, order: &[u32]) -> Result<(), Broken> {
    let place: HashMap<u64, usize> = order
        .iter()
        .enumerate()
        .map(|(i, &id)| (u64::from(id), i))
        .collect();
    if let Some(e) = r.entries.iter().find(|e| e.kind == "draw")
        && e.ticket != order.len() as u64
    {
        return Err(Broken {
            entry: e.n,
            why: format!(
                "the draw entry counts {} tickets, the draw record {}",
                e.ticket,
                order.len()
            ),
        });
    }
    let mut numbered: BTreeMap<u8, BTreeMap<u64, (usize, u64)>> = BTreeMap::new();
    for e in &r.entries {
        if let Some(&p) = place.get(&e.ticket)
            && e.number > 0
            && e.kind != "draw"
        {
            numbered
                .entry(e.lane)
                .or_default()
                .insert(e.number, (p, e.n));
        }
    }
    for by_number in numbered.values() {
        let mut last = None;
        for (&number, &(p, n)) in by_number {
            if let Some((lp, ln)) = last
                && lp > p
            {
                return Err(Broken {
                    entry: n,
                    why: format!(
                        "number {number} went to a ticket drawn before the one numbered lower at entry {ln}"
                    ),
                });
            }
            last = Some((p, n));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64, kind: &str, ticket: u64, number: u64, at: u64) -> EntryBody {
        EntryBody {
            n,
            kind: kind.into(),
            ticket,
            lane: 0,
            number,
            at,
            hash: String::new(),
        }
    }

    #[test]
    fn records_and_queue_pages_name_the_record() {
        for (input, want) in [
            (
                "https://record.example/api/rooms/sale/record?after=3",
                "https://record.example/api/rooms/sale/record",
            ),
            (
                "https://shop.example/queue/sale?return=/buy",
                "https://shop.example/api/rooms/sale/record",
            ),
        ] {
            assert_eq!(record_url(input).unwrap().as_str(), want, "{input}");
        }
        assert!(record_url("https://x/elsewhere").is_err());
    }

    #[test]
    fn a_skipped_visitor_returning_explains_its_inversions_and_others_do_not() {
        let entries = vec![
            entry(1, "skip", 0, 1, 10),
            entry(2, "admit", 1, 2, 11),
            entry(3, "return", 0, 1, 12),
            entry(4, "admit", 0, 1, 13),
            entry(5, "admit", 3, 4, 14),
            entry(6, "admit", 2, 3, 15),
        ];
        let o = order(&entries);
        assert_eq!(o.inversions, 2);
        assert_eq!(o.unexplained, 1);
        assert_eq!(o.late[0].ticket, 0);
        assert!(o.late[0].why.as_deref().unwrap().contains("entry 1"));
        assert_eq!((o.late[1].ticket, o.late[1].why.clone()), (2, None));
    }

    #[test]
    fn the_chain_check_names_the_entry_that_was_changed() {
        let mut hash = genesis("sale", 7);
        let mut entries = Vec::new();
        for n in 1..=5 {
            let mut e = entry(n, "admit", n - 1, n, 100 + n);
            hash = chain(&hash, &e.line());
            e.hash = hex::encode(hash);
            entries.push(e);
        }
        let record = Fetched {
            room: "sale".into(),
            epoch: 7,
            lanes: Vec::new(),
            head: hex::encode(hash),
            total: 5,
            pages: vec![(0, hex::encode(genesis("sale", 7)))],
            entries,
        };
        assert_eq!(check_chain(&record, None), Ok(None));
        let third = record.entries[2].hash.clone();
        assert_eq!(check_chain(&record, Some(&third)), Ok(Some(3)));
        let mut swapped = record.clone();
        swapped.entries[3].ticket = 9;
        assert_eq!(check_chain(&swapped, None).unwrap_err().entry, 4);
        let mut removed = record.clone();
        removed.entries.remove(1);
        assert_eq!(check_chain(&removed, None).unwrap_err().entry, 2);
        let mut rewritten = record.clone();
        rewritten.head = "00".repeat(32);
        assert_eq!(check_chain(&rewritten, None).unwrap_err().entry, 0);
        assert!(check_chain(&record, Some(&"ab".repeat(32))).is_err());
    }
}
