//! The narrow store under a room run by a single owner: a log, an image, a
//! lease and a command bus, and nothing that decides.
//!
//! A room's engine runs on one instance at a time, its **owner**. Every
//! change the engine makes is a record; the owner appends records to the
//! room's log in batches, and every other instance follows the log into a
//! replica of its own. This trait is everything such a deployment asks of
//! the shared store, so the store can stay storage:
//!
//! - **Lease.** [`RoomStore::acquire`] takes a free lease and hands out a
//!   [`Fence`] whose token is higher than any token handed out for that
//!   room before; [`RoomStore::renew`] extends it only while it is still
//!   the holder's; [`RoomStore::release`] gives it up (a graceful
//!   hand-over) without ever touching a successor's.
//! - **Log.** [`RoomStore::append`] writes one batch atomically and only
//!   for the newest fence, so an owner that was paused past its lease
//!   cannot write beside its successor ([`StoreError::Fenced`]).
//!   [`RoomStore::read`] returns batches after a position, many at a time,
//!   waiting a bounded time for the next one when there is none;
//!   [`RoomStore::trim`] drops what an image covers.
//! - **Image.** The owner stores the engine's image as of a log position
//!   from time to time (fenced as well); a new instance starts from the
//!   image and the log after it.
//! - **Kept reports.** The report of a line an operator replaced, kept
//!   until it expires.
//! - **Bus.** An instance that does not own a room sends its writes to the
//!   owner as [`Command`]s and reads the [`Reply`]s addressed to it.
//!   Commands and replies travel in slices: one round trip carries all the
//!   requests that arrived together.
//!
//! What a batch, a command or an image holds is the engine's and the
//! backend's business: the store carries bytes.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;

use crate::engine::RoomId;

/// The right to write a room's log: who holds the lease, and the fencing
/// token that grows with every change of holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// Higher for every later holder of the room's lease.
    pub token: u64,
    /// The holder's instance name.
    pub holder: String,
    /// Where the holder's part of the log begins: the store marked the log
    /// when it handed out this lease, and whatever the holder appends comes
    /// after the mark, whatever an earlier holder wrote comes before it.
    pub mark: LogPos,
}

impl Fence {
    /// How the lease names its holder in the store: one value that a
    /// renewal and a release compare, so a successor's lease (another
    /// token) never matches.
    pub fn lease_value(&self) -> String {
        format!("{}/{}", self.holder, self.token)
    }
}

/// A place in a room's log, or in a command or reply stream: ordered, and
/// [`LogPos::START`] before everything.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct LogPos {
    pub ms: u64,
    pub seq: u64,
}

impl LogPos {
    pub const START: LogPos = LogPos { ms: 0, seq: 0 };
    /// After every position: a read after it waits its whole wait (or
    /// fails at once with the store), a sign that the store is there.
    pub(crate) const END: LogPos = LogPos {
        ms: u64::MAX,
        seq: u64::MAX,
    };

    /// The first position after this one that belongs to the holder of
    /// fencing token `token`: each holder's positions begin with its token
    /// (its mark, [`Fence::mark`], is `<token>-0`), so a later holder's
    /// are all above an earlier one's.
    pub(crate) fn next_for(self, token: u64) -> LogPos {
        if self.ms == token {
            LogPos {
                ms: token,
                seq: self.seq + 1,
            }
        } else {
            LogPos { ms: token, seq: 1 }
        }
    }
}

impl fmt::Display for LogPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl FromStr for LogPos {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || StoreError::Damaged(format!("not a log position: {s:?}"));
        let (ms, seq) = s.split_once('-').ok_or_else(bad)?;
        Ok(LogPos {
            ms: ms.parse().map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

/// One batch of a room's log, as appended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pos: LogPos,
    pub batch: Vec<u8>,
}

/// The engine's image of a room and the log position it covers up to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub at: LogPos,
    pub bytes: Vec<u8>,
}

/// A write sent to a room's owner by another instance.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Command {
    /// Unique per command: the owner applies a command once and answers a
    /// repeat with the first answer.
    pub id: u128,
    /// The instance to reply to.
    pub from: String,
    pub body: Vec<u8>,
}

/// The owner's answer to a [`Command`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The instance that sent the command.
    pub to: String,
    /// The command's id.
    pub id: u128,
    pub body: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A write with a fence that is no longer the room's newest: another
    /// instance took the lease since. The writer has stopped being the
    /// owner and must not answer the requests of that write as done.
    #[error("the room's lease passed to another owner")]
    Fenced,
    /// The store holds something this version cannot read, or that was
    /// written by another version (named in the message).
    #[error("{0}")]
    Damaged(String),
    /// The store cannot be reached; the message is safe to show and holds
    /// no secrets.
    #[error("the waiting room's state store is unavailable: {0}")]
    Unavailable(String),
    /// The batch is in the store, but not as many replicas as asked
    /// confirmed it in time: it is not acknowledged, since a failover
    /// could lose it.
    #[error("the store's replicas did not confirm the write in time")]
    NotReplicated,
}

/// What a deployment with room owners asks of its shared store.
#[async_trait]
pub trait RoomStore: Send + Sync + 'static {
    // ----- rooms ------------------------------------------------------------

    /// Note that `room` exists (its first image is stored), so that every
    /// instance serves it, also one started without it in its
    /// configuration.
    async fn add_room(&self, room: &RoomId) -> Result<(), StoreError>;

    /// Every room noted so far.
    async fn rooms(&self) -> Result<Vec<RoomId>, StoreError>;

    // ----- lease ------------------------------------------------------------

    /// Take the room's lease for `holder` if nobody holds it: a fence with
    /// a token higher than every earlier one; `None` while another holds
    /// it.
    async fn acquire(
        &self,
        room: &RoomId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Fence>, StoreError>;

    /// Extend the lease if `fence` still holds it; false when it lapsed or
    /// passed on (the holder has stopped being the owner).
    async fn renew(&self, room: &RoomId, fence: &Fence, ttl: Duration) -> Result<bool, StoreError>;

    /// Give the lease up if `fence` still holds it, so another instance
    /// can take it at once rather than after it lapses.
    async fn release(&self, room: &RoomId, fence: &Fence) -> Result<bool, StoreError>;

    /// Who holds the room's lease now, as its lease value.
    async fn holder(&self, room: &RoomId) -> Result<Option<String>, StoreError>;

    // ----- log --------------------------------------------------------------

    /// Append one batch to the room's log at `fence`'s first position
    /// after `after` ([`LogPos::next_for`]), atomically and only while
    /// `fence` is the room's newest ([`StoreError::Fenced`] otherwise).
    ///
    /// The writer names the position, and gives each try a new one: a
    /// batch whose append failed may still have landed, and a store that
    /// failed over may have lost batches a copy already read; either way,
    /// the next batch lands above every position this writer ever tried,
    /// so no copy that read past a lost batch passes over a new one.
    async fn append(
        &self,
        room: &RoomId,
        fence: &Fence,
        after: LogPos,
        batch: &[u8],
    ) -> Result<LogPos, StoreError>;

    /// Up to `max` batches after `after`, oldest first. With none there
    /// yet, waits up to `wait` for the next (`Duration::ZERO`: no wait).
    async fn read(
        &self,
        room: &RoomId,
        after: LogPos,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Entry>, StoreError>;

    /// The position of the log's last batch, if any.
    async fn last(&self, room: &RoomId) -> Result<Option<LogPos>, StoreError>;

    /// Drop the batches at and before `upto` (an image covers them).
    async fn trim(&self, room: &RoomId, upto: LogPos) -> Result<(), StoreError>;

    // ----- image ------------------------------------------------------------

    /// Store the room's image as of `image.at`, only while `fence` is the
    /// room's newest.
    async fn put_image(
        &self,
        room: &RoomId,
        fence: &Fence,
        image: &Image,
    ) -> Result<(), StoreError>;

    async fn image(&self, room: &RoomId) -> Result<Option<Image>, StoreError>;

    // ----- kept reports -----------------------------------------------------

    /// Keep `report` (the report of the room's line `epoch`) for `ttl`,
    /// after which the store drops it by itself.
    async fn put_report(
        &self,
        room: &RoomId,
        epoch: u64,
        report: &[u8],
        ttl: Duration,
    ) -> Result<(), StoreError>;

    /// The room's reports that have not expired, in no order.
    async fn reports(&self, room: &RoomId) -> Result<Vec<Vec<u8>>, StoreError>;

    // ----- bus --------------------------------------------------------------

    /// Whether an append is acknowledged only once the store's replicas
    /// confirm it. A follower may read a batch before then, so a change's
    /// answer must come from its owner rather than from the log.
    fn appends_wait_for_replicas(&self) -> bool {
        false
    }

    /// Send commands to the room's owner, in one round trip.
    async fn send(&self, room: &RoomId, commands: &[Command]) -> Result<(), StoreError>;

    /// The owner's read of its commands: up to `max` after `after`,
    /// waiting up to `wait` when there are none.
    async fn receive(
        &self,
        room: &RoomId,
        after: LogPos,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(LogPos, Command)>, StoreError>;

    /// Forget the commands at and before `upto`: their effects and their
    /// ids are in the log.
    async fn consumed(&self, room: &RoomId, upto: LogPos) -> Result<(), StoreError>;

    /// Answer commands, each to the instance that sent it, in one round
    /// trip.
    async fn reply(&self, replies: &[Reply]) -> Result<(), StoreError>;

    /// The replies addressed to `instance`: up to `max` after `after`,
    /// waiting up to `wait` when there are none.
    async fn replies(
        &self,
        instance: &str,
        after: LogPos,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(LogPos, Reply)>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_order_as_numbers_and_round_trip() {
        let a: LogPos = "1700000000000-9".parse().unwrap();
        let b: LogPos = "1700000000000-10".parse().unwrap();
        let c: LogPos = "1700000000001-0".parse().unwrap();
        assert!(LogPos::START < a && a < b && b < c);
        assert_eq!(b.to_string().parse::<LogPos>().unwrap(), b);
        assert!("12".parse::<LogPos>().is_err());
        assert!("a-1".parse::<LogPos>().is_err());
    }

    #[test]
    fn a_successors_lease_value_never_matches() {
        let old = Fence {
            token: 7,
            holder: "a".into(),
            mark: LogPos { ms: 7, seq: 0 },
        };
        let new = Fence {
            token: 8,
            holder: "a".into(),
            mark: LogPos { ms: 8, seq: 0 },
        };
        assert_ne!(old.lease_value(), new.lease_value());
    }
}
