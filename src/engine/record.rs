//! The room's public admission record: every admission, skip, return,
//! ending and the opening draw, in the order the room's journal (or, on
//! Redis, its log) holds them, each entry chained to the one before by
//! SHA-256. Anyone can fetch it and check that the line was followed; a
//! visitor who saved its head hash can later show it was not rewritten.
//!
//! It is a projection of the room's records, not a store of its own: a
//! backend calls [`AdmissionRecord::apply`] with each record as it is
//! applied, numbered as the journal or log numbers it, and keeps the
//! projection with the room's snapshot or image. A record already applied
//! (a number at or below [`AdmissionRecord::applied`]) changes nothing, so
//! a snapshot taken while records keep coming stays exact. Every instance
//! that applies the same records in the same order holds the same record.
//!
//! An entry says no more than its kind, the ticket's id, lane and number,
//! and the time: never an identity or a token. Its canonical line is
//!
//! ```text
//! {n} {kind} {ticket} {lane} {number} {at}
//! ```
//!
//! (`n` from 1; `number` 0 for a ticket without one; a `draw` entry's
//! `ticket` is how many tickets were drawn) and its hash is
//! `SHA-256("{previous hash, hex} {line}\n")`, the first entry's previous
//! hash being `SHA-256("narabu-record {room} {epoch}\n")`: a few lines of
//! shell with `sha256sum` recompute it.
//!
//! Records of a ticket may come before its join (the engine reports from
//! the thread that made each change); an entry for a ticket whose join has
//! not come yet waits for it, as the replica's replay does.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::event::EventRecord;
use super::rules::TicketState;
use super::ticket::TicketId;

/// A hash is kept for every this many entries; a page's hashes are
/// computed from the nearest one before it.
pub const CHECKPOINT: usize = 64;

/// What an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// The room opened and drew its pre-queue.
    Draw,
    /// A waiting ticket got a permit.
    Admit,
    /// The head passed a waiting ticket whose visitor was away.
    Skip,
    /// An away ticket's visitor came back: first in line again.
    Return,
    /// A ticket ended (released, revoked, expired, left, abandoned).
    End(TicketState),
    /// The room closed.
    Close,
}

impl EntryKind {
    /// The word in the canonical line and the JSON.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::Draw => "draw",
            Self::Admit => "admit",
            Self::Skip => "skip",
            Self::Return => "return",
            Self::Close => "close",
            Self::End(TicketState::Released) => "released",
            Self::End(TicketState::Revoked) => "revoked",
            Self::End(TicketState::Expired) => "expired",
            Self::End(TicketState::Left) => "left",
            Self::End(TicketState::Abandoned) => "abandoned",
            Self::End(_) => "ended",
        }
    }
}

/// One entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    /// The ticket's id (for `draw`: how many were drawn).
    pub ticket: u32,
    pub lane: u8,
    /// The ticket's number in its lane, from 1; 0 when it has none.
    pub number: u32,
    /// Unix milliseconds.
    pub at: u64,
}

impl Entry {
    /// The canonical line of entry `n` (from 1).
    pub(crate) fn line(&self, n: u64) -> String {
        format!(
            "{n} {} {} {} {} {}",
            self.kind.word(),
            self.ticket,
            self.lane,
            self.number,
            self.at
        )
    }
}

/// The hash before the first entry of `room`'s line `epoch`.
pub(crate) fn genesis(room: &str, epoch: u64) -> [u8; 32] {
    Sha256::digest(format!("narabu-record {room} {epoch}\n")).into()
}

/// The hash of an entry whose canonical line is `line`, after `previous`.
pub(crate) fn chain(previous: &[u8; 32], line: &str) -> [u8; 32] {
    Sha256::new()
        .chain_update(hex::encode(previous))
        .chain_update(b" ")
        .chain_update(line)
        .chain_update(b"\n")
        .finalize()
        .into()
}

/// A ticket's lane, number (0: none yet) and when it joined (what the
/// sale's report counts joins and waits from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Place {
    lane: u8,
    number: u32,
    joined_at: u64,
}

/// A lane no ticket has: the ticket's join has not been applied.
const UNKNOWN: u8 = u8::MAX;

/// The record of one line of a room.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionRecord {
    room: String,
    epoch: u64,
    /// The number of the last journal or log record applied.
    applied: u64,
    entries: Vec<Entry>,
    /// `checkpoints[k]`: the hash after `k * CHECKPOINT` entries.
    checkpoints: Vec<[u8; 32]>,
    head: [u8; 32],
    /// By ticket id.
    places: Vec<Place>,
    /// Entries of tickets whose join has not been applied yet.
    early: Vec<(TicketId, Entry)>,
}

/// A page of the record as served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// The line the record is of.
    pub epoch: u64,
    /// Entries in the whole record.
    pub total: u64,
    /// The hash of its last entry.
    pub head: [u8; 32],
    /// The hash before the page's first entry.
    pub previous: [u8; 32],
    pub entries: Vec<Chained>,
}

/// One entry as served: its number, the entry and its hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chained {
    pub n: u64,
    pub entry: Entry,
    pub hash: [u8; 32],
}

impl AdmissionRecord {
    /// The empty record of `room`'s line `epoch`.
    pub fn new(room: &str, epoch: u64) -> Self {
        let first = genesis(room, epoch);
        Self {
            room: room.to_owned(),
            epoch,
            applied: 0,
            entries: Vec::new(),
            checkpoints: vec![first],
            head: first,
            places: Vec::new(),
            early: Vec::new(),
        }
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The number of the last record applied.
    pub(crate) fn applied(&self) -> u64 {
        self.applied
    }

    /// Entries so far.
    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The hash of the last entry (the genesis hash while empty).
    pub(crate) fn head(&self) -> [u8; 32] {
        self.head
    }

    fn place(&mut self, id: TicketId) -> &mut Place {
        let i = id as usize;
        if self.places.len() <= i {
            self.places.resize(
                i + 1,
                Place {
                    lane: UNKNOWN,
                    number: 0,
                    joined_at: 0,
                },
            );
        }
        &mut self.places[i]
    }

    fn push(&mut self, entry: Entry) {
        let n = self.entries.len() as u64 + 1;
        self.head = chain(&self.head, &entry.line(n));
        self.entries.push(entry);
        if self.entries.len().is_multiple_of(CHECKPOINT) {
            self.checkpoints.push(self.head);
        }
    }

    /// An entry of ticket `ticket`: now, or once its join is applied.
    fn of_ticket(&mut self, kind: EntryKind, ticket: TicketId, at: u64) {
        let place = *self.place(ticket);
        let entry = Entry {
            kind,
            ticket,
            lane: place.lane,
            number: place.number,
            at,
        };
        if place.lane == UNKNOWN {
            self.early.push((ticket, entry));
        } else {
            self.push(entry);
        }
    }

    /// Apply record `n` of the room's journal or log (0: not numbered,
    /// always applied).
    pub fn apply(&mut self, n: u64, record: &EventRecord) {
        if n != 0 {
            if n <= self.applied {
                return;
            }
            self.applied = n;
        }
        match record {
            EventRecord::Joined {
                ticket,
                lane,
                index,
                at,
                ..
            } => {
                let place = self.place(*ticket);
                if place.lane != UNKNOWN {
                    return;
                }
                *place = Place {
                    lane: *lane,
                    number: index.map_or(0, |i| i + 1),
                    joined_at: *at,
                };
                let place = *place;
                if self.early.iter().any(|(t, _)| t == ticket) {
                    let (held, rest): (Vec<_>, Vec<_>) =
                        self.early.drain(..).partition(|(t, _)| t == ticket);
                    self.early = rest;
                    for (_, entry) in held {
                        self.push(Entry {
                            lane: place.lane,
                            number: place.number,
                            ..entry
                        });
                    }
                }
            }
            EventRecord::Admitted { ticket, at } => self.of_ticket(EntryKind::Admit, *ticket, *at),
            EventRecord::Away { ticket, at } => self.of_ticket(EntryKind::Skip, *ticket, *at),
            EventRecord::Back { ticket, at } => self.of_ticket(EntryKind::Return, *ticket, *at),
            EventRecord::Ended { ticket, state, at } => {
                self.of_ticket(EntryKind::End(*state), *ticket, *at);
            }
            EventRecord::Opened { order, at } => {
                let mut next = [0u32; 256];
                for &id in order {
                    let place = self.place(id);
                    let lane = if place.lane == UNKNOWN { 0 } else { place.lane };
                    next[usize::from(lane)] += 1;
                    place.lane = lane;
                    place.number = next[usize::from(lane)];
                }
                self.push(Entry {
                    kind: EntryKind::Draw,
                    ticket: u32::try_from(order.len()).unwrap_or(u32::MAX),
                    lane: 0,
                    number: 0,
                    at: *at,
                });
            }
            EventRecord::Closed => self.push(Entry {
                kind: EntryKind::Close,
                ticket: 0,
                lane: 0,
                number: 0,
                at: 0,
            }),
            // Call-backs are a visitor's own business, not the line's order.
            EventRecord::Arrived { .. }
            | EventRecord::Settings(_)
            | EventRecord::Subscribed { .. }
            | EventRecord::Unsubscribed { .. }
            | EventRecord::Notified { .. } => {}
        }
    }

    /// Every entry, in order.
    pub(crate) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Every ticket whose join was applied: id, lane, number (0: none)
    /// and when it joined.
    pub(crate) fn tickets(&self) -> impl Iterator<Item = (TicketId, u8, u32, u64)> + '_ {
        self.places
            .iter()
            .enumerate()
            .filter(|(_, p)| p.lane != UNKNOWN)
            .map(|(id, p)| (id as TicketId, p.lane, p.number, p.joined_at))
    }

    /// What a reader is served: up to `limit` entries after the first
    /// `after`, and the record's length and head.
    pub fn read(&self, after: u64, limit: usize) -> Page {
        self.read_first(self.len(), self.head, after, limit)
    }

    /// [`Self::read`] of the record's first `n` entries, whose last hash
    /// is `head` (what a backend shows while later entries are not yet
    /// durable).
    pub(crate) fn read_first(&self, n: u64, head: [u8; 32], after: u64, limit: usize) -> Page {
        let n = n.min(self.len());
        let after = after.min(n);
        let (previous, entries) = if after == n {
            (head, Vec::new())
        } else {
            let room = usize::try_from(n - after).unwrap_or(usize::MAX);
            self.page(after, limit.min(room))
        };
        Page {
            epoch: self.epoch,
            total: n,
            head,
            previous,
            entries,
        }
    }

    /// Up to `limit` entries after the first `after`, with their hashes,
    /// and the hash before them.
    pub(crate) fn page(&self, after: u64, limit: usize) -> ([u8; 32], Vec<Chained>) {
        let after = usize::try_from(after)
            .unwrap_or(usize::MAX)
            .min(self.entries.len());
        if after == self.entries.len() {
            return (self.head, Vec::new());
        }
        let from = after / CHECKPOINT;
        let mut hash = self.checkpoints[from.min(self.checkpoints.len() - 1)];
        let start = from * CHECKPOINT;
        for (i, entry) in self.entries[start..after].iter().enumerate() {
            hash = chain(&hash, &entry.line((start + i) as u64 + 1));
        }
        let previous = hash;
        let end = after.saturating_add(limit).min(self.entries.len());
        let page = self.entries[after..end]
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let n = (after + i) as u64 + 1;
                hash = chain(&hash, &entry.line(n));
                Chained {
                    n,
                    entry: *entry,
                    hash,
                }
            })
            .collect();
        (previous, page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(ticket: TicketId, lane: u8, index: Option<u32>) -> EventRecord {
        EventRecord::Joined {
            ticket,
            identity: Some(42),
            lane,
            index,
            ahead: 0,
            at: 1,
        }
    }

    #[test]
    fn entries_chain_and_pages_recompute_the_same_hashes() {
        let mut r = AdmissionRecord::new("sale", 1);
        let mut n = 0;
        let mut apply = |r: &mut AdmissionRecord, e: EventRecord| {
            n += 1;
            r.apply(n, &e);
        };
        for id in 0..200 {
            apply(&mut r, joined(id, 0, Some(id)));
            apply(
                &mut r,
                EventRecord::Admitted {
                    ticket: id,
                    at: 1000 + u64::from(id),
                },
            );
        }
        assert_eq!(r.len(), 200);
        let (before, all) = r.page(0, 1000);
        assert_eq!(before, genesis("sale", 1));
        assert_eq!(all.last().unwrap().hash, r.head());
        let mut hash = genesis("sale", 1);
        for c in &all {
            hash = chain(&hash, &c.entry.line(c.n));
            assert_eq!(hash, c.hash);
        }
        assert_eq!(all[4].entry.line(5), "5 admit 4 0 5 1004");
        let (prev, page) = r.page(130, 10);
        assert_eq!(prev, all[129].hash);
        assert_eq!(page[0], all[130]);
        // The first entries alone, as a backend shows them while the rest
        // are not durable: their head, and no entry past them.
        let shown = r.read_first(100, all[99].hash, 95, 1000);
        assert_eq!((shown.total, shown.head), (100, all[99].hash));
        assert_eq!(shown.entries.len(), 5);
        assert_eq!(
            r.read_first(100, all[99].hash, 500, 0).previous,
            all[99].hash
        );
        // A record applied again changes nothing.
        let head = r.head();
        r.apply(3, &EventRecord::Admitted { ticket: 1, at: 5 });
        assert_eq!(r.head(), head);
    }

    #[test]
    fn an_entry_before_its_join_waits_for_it_and_the_draw_numbers_each_lane() {
        let mut r = AdmissionRecord::new("sale", 1);
        r.apply(1, &EventRecord::Admitted { ticket: 0, at: 5 });
        assert!(r.is_empty());
        r.apply(2, &joined(0, 1, Some(0)));
        let (_, page) = r.page(0, 10);
        assert_eq!((page[0].entry.lane, page[0].entry.number), (1, 1));
        r.apply(3, &joined(1, 0, None));
        r.apply(4, &joined(2, 1, None));
        r.apply(5, &joined(3, 0, None));
        r.apply(
            6,
            &EventRecord::Opened {
                order: vec![3, 2, 1],
                at: 9,
            },
        );
        r.apply(7, &EventRecord::Admitted { ticket: 1, at: 10 });
        let (_, page) = r.page(1, 10);
        assert_eq!(page[0].entry.line(2), "2 draw 3 0 0 9");
        assert_eq!(page[1].entry.line(3), "3 admit 1 0 2 10");
    }
}
