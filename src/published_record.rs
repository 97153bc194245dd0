//! The admission record as it is published: the JSON of a page of it.
//! The API serves it (`GET /api/rooms/{room}/record`), `narabu
//! verify-record` reads and checks it, and the sale's report counts its
//! entries the way that check does; keeping the format here, apart from
//! all three, lets each depend on it and none on another. What an entry
//! is and how it hashes is `crate::engine::record`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One entry as published.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = RecordEntry)]
pub struct EntryBody {
    /// Its place in the record, from 1.
    pub n: u64,
    /// `draw`, `admit`, `skip`, `return`, `released`, `revoked`,
    /// `expired`, `left`, `abandoned` or `close`.
    pub kind: String,
    /// The ticket's id (for `draw`: how many tickets were drawn).
    pub ticket: u64,
    /// The ticket's lane, as an index into `lanes` (0 in a room without
    /// lanes).
    pub lane: u8,
    /// Its number in its lane, from 1; 0 when it has none.
    pub number: u64,
    /// Unix milliseconds.
    pub at: u64,
    /// SHA-256 (hex) of the previous entry's hash (hex), a space, this
    /// entry's line `n kind ticket lane number at` and a newline.
    pub hash: String,
}

impl EntryBody {
    /// The canonical line its hash covers.
    pub(crate) fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.n, self.kind, self.ticket, self.lane, self.number, self.at
        )
    }
}

/// A lane as the record names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = RecordLane)]
pub struct LaneBody {
    pub name: String,
    pub weight: u32,
}

/// A page of the record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Record)]
pub struct RecordBody {
    pub room: String,
    /// The line the record is of; the first entry's previous hash is
    /// SHA-256 of `narabu-record {room} {epoch}` and a newline.
    pub epoch: u64,
    /// Entries in the whole record now.
    pub total: u64,
    /// The hash of the record's last entry now (hex).
    pub head: String,
    /// The entries this page starts after.
    pub after: u64,
    /// The hash before this page's first entry (hex).
    pub previous: String,
    /// The room's lanes by index, with their weights (empty: no lanes).
    pub lanes: Vec<LaneBody>,
    pub entries: Vec<EntryBody>,
    /// The next page, while there is one.
    pub next: Option<String>,
}
