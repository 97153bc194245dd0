//! A room's engine writing its log into a [`RoomStore`], and a replica
//! following it: the two halves of running one room on one owner.
//!
//! [`LogWriter`] is the owner's [`EventSink`]: the engine reports each
//! change as it makes it (on the thread that made it, never blocking),
//! the writer numbers and buffers the record, and one task appends
//! everything buffered as one batch under the owner's fence (group
//! commit: every request that arrived while the previous batch was in
//! flight shares the next one). A request is answered once
//! [`LogWriter::wait_durable`] says its last record is in the log, as the
//! embedded journal answers after `fsync`. When the store refuses a batch
//! because another instance took the lease, the writer stops for good:
//! nothing it buffered is ever reported durable, so no visitor is told of
//! a change the new owner does not know.
//!
//! [`Replica`] is every instance's copy: the room's image plus the log
//! after it, each record applied by [`RoomImage::apply`], the very code
//! that replays the embedded journal at start. A new owner restores its
//! engine from an up-to-date replica ([`crate::engine::Room::restore`])
//! and goes on from the log's end.
//!
//! A batch is `(first record's number, count)` followed by that many
//! records (postcard, one after another); the numbers let a replica see a
//! gap or a repeat. A record is the engine's change, in the journal's
//! encoding, or the note that a command from another instance was applied,
//! with its answer: commands carry ids, and a new owner that finds a
//! command's id among the recent ones in its replica answers it again
//! rather than applying it twice. Besides, the owner's tally closes each
//! batch (the figures no change carries: where the permits are, the
//! counters), a replaced room starts with its new incarnation's image, and
//! a new owner notes its takeover.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, broadcast, watch};

use super::store::{Entry, Fence, Image, LogPos, RoomStore, StoreError};
use crate::engine::{
    AdmissionRecord, EventRecord, EventSink, Room, RoomEvent, RoomId, RoomImage, RoomTally,
};

/// One record of a room's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LogRecord {
    /// A change the engine made.
    Event(EventRecord),
    /// A command from another instance was applied, and this was its
    /// answer.
    Applied { id: u128, reply: Vec<u8> },
    /// The owner's figures as the batch left (the last record of each).
    Tally(Box<RoomTally>),
    /// The room was replaced by a new incarnation, as it starts.
    Created(Box<RoomImage>),
    /// A new owner took the room over with this fencing token: whatever
    /// the last owner had not yet written is lost, and the new owner goes
    /// on from the room as the log and image left it.
    Owner { token: u64 },
    /// A join spent this proof-of-work nonce, good until then (ms): every
    /// instance remembers it as it follows the log, so a solution spent
    /// under one owner stays spent under the next.
    Spent { nonce: [u8; 16], until_ms: u64 },
}

/// [`LogRecord`] as encoded without copying what it carries: serde
/// encodes a borrowed enum exactly as the owned one of the same shape.
#[derive(Serialize)]
enum LogRecordRef<'a> {
    Event(&'a EventRecord),
    Applied { id: u128, reply: &'a [u8] },
    Tally(&'a RoomTally),
    Created(&'a RoomImage),
    Owner { token: u64 },
    Spent { nonce: [u8; 16], until_ms: u64 },
}

/// The ids of the commands applied lately, with their answers: enough to
/// answer any command still in flight at a change of owner again, bounded
/// so a room's log and image do not grow with every command ever sent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    replies: HashMap<u128, Vec<u8>>,
    order: VecDeque<u128>,
}

impl Applied {
    /// Commands remembered; a command's sender gives up on it long before
    /// this many later ones have been applied.
    pub(crate) const KEPT: usize = 65_536;

    pub fn get(&self, id: u128) -> Option<&[u8]> {
        self.replies.get(&id).map(Vec::as_slice)
    }

    fn insert(&mut self, id: u128, reply: Vec<u8>) {
        if self.replies.insert(id, reply).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > Self::KEPT {
            if let Some(old) = self.order.pop_front() {
                self.replies.remove(&old);
            }
        }
    }
}

/// How far the writer has come, as published to waiting requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Progress {
    /// Every record up to this number is in the log.
    durable: u64,
    /// The log position of the batch holding `durable`.
    at: LogPos,
    /// The lease passed to another owner: nothing more becomes durable.
    fenced: bool,
    /// The last batch is in the log but its replicas have not confirmed
    /// it: nothing is acknowledged until they do.
    unconfirmed: bool,
    /// The last try to append failed because the store could not be
    /// reached: changes are refused at once until an append succeeds.
    unreachable: bool,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    count: u64,
    last: u64,
}

/// Why a change cannot be acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotDurable {
    /// This instance is no longer the room's owner.
    #[error("the room's lease passed to another owner")]
    Fenced,
    /// The store did not take the batch in time; the change may still
    /// land later, so the caller may not report it done.
    #[error("the room's log could not be written in time")]
    TimedOut,
    /// The store's replicas do not confirm the log's batches (the change
    /// is on the primary, but a failover could lose it).
    #[error("the room's log is not confirmed by enough replicas")]
    NotReplicated,
    /// The store cannot be reached: the change is held until it can, and
    /// may land then, but nobody is told it did.
    #[error("the room's log cannot be reached")]
    Unreachable,
}

/// The owner's sink: buffers the engine's records and appends them in
/// batches under its fence.
pub struct LogWriter {
    pending: Mutex<Pending>,
    /// The engine whose tally closes each batch, once it is built (the
    /// engine is made with the writer as its sink).
    tallied: Mutex<std::sync::Weak<Room>>,
    applied: Mutex<Applied>,
    wake: Arc<Notify>,
    progress: watch::Sender<Progress>,
    /// Each batch once it is durable, for this instance's own replica: the
    /// owner's copy follows its own appends here rather than reading them
    /// back from the store. Gone once the writer is fenced or its owner
    /// stops being the owner.
    feed: Mutex<Option<broadcast::Sender<Arc<Entry>>>>,
}

/// How many durable batches the owner's feed holds for a replica that is
/// slow to take them; one that falls further behind reads the store.
const FEED_DEPTH: usize = 1_024;

impl LogWriter {
    /// Start writing `room`'s log under `fence`, numbering records after
    /// `last` (the number of the last record already in the log) and
    /// positions after `at`.
    pub fn start(
        store: Arc<dyn RoomStore>,
        room: RoomId,
        fence: Fence,
        last: u64,
        at: LogPos,
    ) -> Arc<Self> {
        Self::start_with(store, room, fence, last, at, Applied::default())
    }

    /// [`Self::start`] for an owner taking a room over: the commands its
    /// replica knows were applied.
    pub fn start_with(
        store: Arc<dyn RoomStore>,
        room: RoomId,
        fence: Fence,
        last: u64,
        at: LogPos,
        applied: Applied,
    ) -> Arc<Self> {
        let (progress, _) = watch::channel(Progress {
            durable: last,
            at,
            fenced: false,
            unconfirmed: false,
            unreachable: false,
        });
        let writer = Arc::new(Self {
            pending: Mutex::new(Pending {
                last,
                ..Pending::default()
            }),
            applied: Mutex::new(applied),
            tallied: Mutex::new(std::sync::Weak::new()),
            wake: Arc::new(Notify::new()),
            progress,
            feed: Mutex::new(Some(broadcast::channel(FEED_DEPTH).0)),
        });
        tokio::spawn(run(
            Arc::downgrade(&writer),
            writer.wake.clone(),
            store,
            room,
            fence,
        ));
        writer
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Buffer one of the engine's changes; its number. Never waits on the
    /// store.
    pub(crate) fn append(&self, record: &EventRecord) -> u64 {
        // Encoded borrowed: the same bytes as `LogRecord::Event(record)`.
        let n = self.push(&LogRecordRef::Event(record));
        super::journal::note_appended(n);
        n
    }

    /// Close every batch with this engine's tally, so replicas show its
    /// figures.
    pub(crate) fn tally_from(&self, room: &Arc<Room>) {
        *self
            .tallied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::downgrade(room);
    }

    /// Note that a new owner, with this fencing token, goes on from here.
    pub(crate) fn owner(&self, token: u64) -> u64 {
        self.push(&LogRecordRef::Owner { token })
    }

    /// Note that a join spent this proof-of-work nonce.
    pub(crate) fn spent(&self, nonce: [u8; 16], until_ms: u64) -> u64 {
        self.push(&LogRecordRef::Spent { nonce, until_ms })
    }

    /// Start the room again as this new incarnation; its number.
    pub(crate) fn created(&self, image: &RoomImage) -> u64 {
        let n = self.push(&LogRecordRef::Created(image));
        super::journal::note_appended(n);
        n
    }

    /// Note that the command `id` was applied with this answer; its number.
    /// Wait for it to be durable before answering, so that a new owner
    /// answers the command again rather than applying it twice.
    pub fn append_applied(&self, id: u128, reply: Vec<u8>) -> u64 {
        let n = self.push(&LogRecordRef::Applied { id, reply: &reply });
        super::journal::note_appended(n);
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id, reply);
        n
    }

    /// The answer of command `id`, if it was applied lately.
    pub fn applied(&self, id: u128) -> Option<Vec<u8>> {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
            .map(<[u8]>::to_vec)
    }

    /// The commands applied lately, as an image stores them.
    pub fn applied_window(&self) -> Applied {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn push(&self, record: &LogRecordRef<'_>) -> u64 {
        let mut p = self.pending();
        // Serializing plain data into a Vec cannot fail.
        let bytes = std::mem::take(&mut p.bytes);
        p.bytes = postcard::to_extend(record, bytes).expect("records always serialize");
        p.count += 1;
        p.last += 1;
        let n = p.last;
        drop(p);
        self.wake.notify_one();
        n
    }

    /// The number of the last record buffered so far.
    pub fn appended(&self) -> u64 {
        self.pending().last
    }

    /// Wait until every record up to `n` is in the log; the position of
    /// the batch that holds it (a replica that reached it shows the
    /// change). A store that cannot be reached fails the wait once it has
    /// stayed so for [`UNREACHABLE_GRACE`] (a connection cut once is opened
    /// again at once, and the batch goes through).
    pub async fn wait_durable(&self, n: u64, within: Duration) -> Result<LogPos, NotDurable> {
        let mut rx = self.progress.subscribe();
        let grace = within.min(UNREACHABLE_GRACE);
        let settled = |p: &Progress| p.durable >= n || p.fenced || p.unconfirmed;
        let first = tokio::time::timeout(grace, rx.wait_for(settled))
            .await
            .map(|reached| reached.map(|p| *p));
        let reached = match first {
            Ok(reached) => Ok(reached),
            Err(_) if rx.borrow().unreachable => return Err(NotDurable::Unreachable),
            Err(_) => {
                tokio::time::timeout(within - grace, rx.wait_for(|p| settled(p) || p.unreachable))
                    .await
                    .map(|reached| reached.map(|p| *p))
            }
        };
        match reached {
            Ok(Ok(p)) if p.durable >= n => Ok(p.at),
            Ok(Ok(p)) if p.unconfirmed && !p.fenced => Err(NotDurable::NotReplicated),
            Ok(Ok(p)) if p.unreachable && !p.fenced => Err(NotDurable::Unreachable),
            Ok(_) => Err(NotDurable::Fenced),
            Err(_) => Err(NotDurable::TimedOut),
        }
    }

    /// Every record up to the first number is in the log, in batches at or
    /// before the position: what an image copied from the engine after
    /// this call may say it covers.
    pub fn durable_point(&self) -> (u64, LogPos) {
        let p = *self.progress.borrow();
        (p.durable, p.at)
    }

    /// Whether the store has refused this writer for a newer owner.
    pub fn is_fenced(&self) -> bool {
        self.progress.borrow().fenced
    }

    /// The batches made durable from now on, in log order, while this
    /// writer is its room's; `None` once it is not.
    pub(crate) fn feed(&self) -> Option<broadcast::Receiver<Arc<Entry>>> {
        self.feed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(broadcast::Sender::subscribe)
    }

    /// End the feed: this instance no longer owns the room, so another
    /// writer's batches may follow in the log, which only the store shows.
    pub(crate) fn end_feed(&self) {
        self.feed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

impl EventSink for LogWriter {
    fn record(&self, event: RoomEvent<'_>) {
        self.append(&event.into());
    }
}

/// The writer's task: one batch in flight at a time, holding everything
/// buffered when it left. Stops when the writer is dropped or fenced.
async fn run(
    writer: std::sync::Weak<LogWriter>,
    wake: Arc<Notify>,
    store: Arc<dyn RoomStore>,
    room: RoomId,
    fence: Fence,
) {
    let mut backoff = Duration::from_millis(10);
    // The last position this writer tried: the next try lands above it,
    // whether that try landed or not.
    let mut tried = fence.mark;
    loop {
        let Some(w) = writer.upgrade() else { return };
        let tallied = w
            .tallied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .upgrade();
        let (bytes, count, last) = {
            let mut p = w.pending();
            // The tally closing a batch must be at least as new as every
            // record before it, or a copy would end on figures older than
            // its records (a permit shown both in hand and admitted). The
            // engine reports a change just after making it, so a record
            // may come in while the tally is taken: take it again then.
            // (A tally newer than a record still to come is mended by the
            // batch that brings the record, with its own tally.)
            if p.count > 0
                && let Some(room) = &tallied
            {
                for tries in 1..=TALLY_TRIES {
                    let before = p.last;
                    drop(p);
                    let tally = room.tally();
                    p = w.pending();
                    if p.last == before || tries == TALLY_TRIES {
                        let bytes = std::mem::take(&mut p.bytes);
                        p.bytes = postcard::to_extend(&LogRecordRef::Tally(&tally), bytes)
                            .expect("records always serialize");
                        p.count += 1;
                        p.last += 1;
                        break;
                    }
                }
            }
            (
                std::mem::take(&mut p.bytes),
                std::mem::take(&mut p.count),
                p.last,
            )
        };
        if count == 0 {
            drop(w);
            // `notify_one` keeps a permit when nobody waits, so a record
            // buffered since the check above is not missed.
            // Dropped writers are noticed within a second.
            let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
            continue;
        }
        let first = last + 1 - count;
        let mut batch = postcard::to_allocvec(&(first, count)).expect("numbers serialize");
        batch.extend_from_slice(&bytes);
        loop {
            let result = store.append(&room, &fence, tried, &batch).await;
            tried = match &result {
                Ok(at) => *at,
                Err(_) => tried.next_for(fence.token),
            };
            match result {
                Ok(at) => {
                    // The feed first: a request told its change is durable
                    // waits for this instance's copy to hold it.
                    if let Some(feed) = w
                        .feed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .as_ref()
                    {
                        let _ = feed.send(Arc::new(Entry {
                            pos: at,
                            batch: std::mem::take(&mut batch),
                        }));
                    }
                    w.progress.send_modify(|p| {
                        p.durable = last;
                        p.at = at;
                        p.unconfirmed = false;
                        p.unreachable = false;
                    });
                    backoff = Duration::from_millis(10);
                    break;
                }
                Err(StoreError::Fenced) => {
                    w.end_feed();
                    w.progress.send_modify(|p| p.fenced = true);
                    tracing::info!(room = %room, "lost the room's lease; its log is another owner's now");
                    return;
                }
                Err(StoreError::NotReplicated) => {
                    // The batch is in the log; appended again once replicas
                    // are back (a replica passes over the records it has),
                    // it is acknowledged when they confirm it.
                    w.progress.send_modify(|p| p.unconfirmed = true);
                    tracing::warn!(room = %room, "the room's log is not confirmed by enough replicas; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => {
                    // The batch is retried whole, in order, before anything
                    // buffered after it: the log never holds a gap.
                    w.progress
                        .send_if_modified(|p| !std::mem::replace(&mut p.unreachable, true));
                    tracing::warn!(room = %room, error = %e, "the room's log could not be written; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// How long a change waits for a store that cannot be reached before it
/// is refused.
const UNREACHABLE_GRACE: Duration = Duration::from_millis(500);

/// How many times a batch's tally is taken while records keep coming in;
/// the last one closes the batch whatever came in (the next batch's tally
/// mends it).
const TALLY_TRIES: usize = 8;

/// A batch's records, with the number of the first.
pub(crate) fn decode(entry: &Entry) -> Result<(u64, Vec<LogRecord>), StoreError> {
    let damaged = |what: &str| StoreError::Damaged(format!("log entry {}: {what}", entry.pos));
    // A new owner's mark in the log, which fences the owners before it.
    if entry.batch.is_empty() {
        return Ok((0, Vec::new()));
    }
    let ((first, count), mut rest): ((u64, u64), _) =
        postcard::take_from_bytes(&entry.batch).map_err(|_| damaged("no batch header"))?;
    let mut records = Vec::new();
    for _ in 0..count {
        let (record, after) = postcard::take_from_bytes::<LogRecord>(rest)
            .map_err(|_| damaged("a record this version cannot read"))?;
        records.push(record);
        rest = after;
    }
    if !rest.is_empty() {
        return Err(damaged("bytes after the last record"));
    }
    Ok((first, records))
}

/// An instance's copy of a room: its image and how far into the log it is.
#[derive(Clone, Debug)]
pub struct Replica {
    pub image: RoomImage,
    /// The commands applied lately, with their answers.
    pub applied: Applied,
    /// The number of the last record applied.
    pub last: u64,
    /// The owner's figures as of the last batch applied.
    pub tally: Option<RoomTally>,
    /// The log position of the last batch applied.
    pub at: LogPos,
    /// The room's admission record, exactly as of `last`.
    pub record: AdmissionRecord,
    /// The last owner's takeover this replica applied: its number and
    /// fencing token. A takeover's batch may be in the log twice (appended
    /// again after the store failed to confirm it), and the second is
    /// passed over rather than taken for a log that began again.
    taken_over: Option<(u64, u64)>,
}

/// A room's image as stored: the number of the last record it holds
/// (it may hold some after it too: replay is idempotent), and the log
/// position after which the records it may lack begin. The admission
/// record must be exactly as of `last` (it takes each record once).
pub fn encode_image(
    last: u64,
    at: LogPos,
    image: &RoomImage,
    applied: &Applied,
    tally: Option<&RoomTally>,
    record: &AdmissionRecord,
) -> Image {
    Image {
        at,
        bytes: postcard::to_allocvec(&(last, image, applied, tally, record))
            .expect("images serialize"),
    }
}

/// The commands an earlier line of the room applied in what is left of
/// its log before `mark`, with their answers: a store that lost the room's
/// image may still hold batches its owner appended afterwards, and a new
/// line must answer those commands as they were answered, not apply them
/// again (they would join tickets nobody holds).
pub(crate) async fn applied_before(
    store: &dyn RoomStore,
    room: &RoomId,
    mark: LogPos,
) -> Result<Applied, StoreError> {
    let mut applied = Applied::default();
    let mut at = LogPos::START;
    loop {
        let entries = store.read(room, at, 1_000, Duration::ZERO).await?;
        for entry in entries.iter().take_while(|e| e.pos < mark) {
            // A batch this version cannot read holds nothing to answer.
            for record in decode(entry).map(|(_, r)| r).unwrap_or_default() {
                if let LogRecord::Applied { id, reply } = record {
                    applied.insert(id, reply);
                }
            }
        }
        match entries.last() {
            Some(last) if last.pos < mark => at = last.pos,
            _ => return Ok(applied),
        }
    }
}

impl Replica {
    /// A replica of a room just created: its first image, before any log.
    #[cfg(test)]
    pub(crate) fn new(image: RoomImage) -> Self {
        Self {
            record: AdmissionRecord::new(image.settings.id.as_str(), image.epoch),
            image,
            applied: Applied::default(),
            last: 0,
            tally: None,
            at: LogPos::START,
            taken_over: None,
        }
    }

    /// Start from the stored image, if any.
    pub async fn load(store: &dyn RoomStore, room: &RoomId) -> Result<Option<Self>, StoreError> {
        let Some(stored) = store.image(room).await? else {
            return Ok(None);
        };
        type Stored = (u64, RoomImage, Applied, Option<RoomTally>, AdmissionRecord);
        let (last, image, applied, tally, record): Stored = postcard::from_bytes(&stored.bytes)
            .map_err(|_| StoreError::Damaged(format!("the image of {room} cannot be read")))?;
        let record = if record.epoch() == image.epoch {
            record
        } else {
            AdmissionRecord::new(room.as_str(), image.epoch)
        };
        Ok(Some(Self {
            record,
            image,
            applied,
            last,
            tally,
            at: stored.at,
            taken_over: None,
        }))
    }

    /// Apply one batch. Records already applied are passed over; a batch
    /// that starts past the next record means some were lost to this
    /// replica (a trimmed log), which only a newer image can mend.
    pub(crate) fn apply(&mut self, entry: &Entry) -> Result<(), StoreError> {
        let (first, records) = decode(entry)?;
        self.apply_decoded(entry, first, &records).map(|_| ())
    }

    /// [`Self::apply`] of a decoded batch; how many of its first records
    /// were applied before.
    fn apply_decoded(
        &mut self,
        entry: &Entry,
        first: u64,
        records: &[LogRecord],
    ) -> Result<usize, StoreError> {
        if first > self.last + 1 {
            return Err(StoreError::Damaged(format!(
                "log entry {}: records {} to {} are missing",
                entry.pos,
                self.last + 1,
                first - 1
            )));
        }
        // A successor numbers its takeover after the last record; one
        // numbered at or before it starts a log that began again (the
        // store lost its data and a new line was made), which only the new
        // image describes, unless it is the takeover this replica applied
        // at that number, appended again.
        let restarted = (first..).zip(records).any(|(n, r)| match r {
            LogRecord::Owner { token } => n <= self.last && self.taken_over != Some((n, *token)),
            _ => false,
        });
        if restarted {
            return Err(StoreError::Damaged(format!(
                "log entry {}: the room's log started again",
                entry.pos
            )));
        }
        let seen = usize::try_from((self.last + 1).saturating_sub(first))
            .unwrap_or(usize::MAX)
            .min(records.len());
        for (n, record) in (first..).zip(records) {
            if n > self.last {
                match record {
                    LogRecord::Event(event) => {
                        self.image.apply(event.as_event());
                        self.record.apply(n, event);
                    }
                    LogRecord::Applied { id, reply } => self.applied.insert(*id, reply.clone()),
                    LogRecord::Tally(tally) => self.tally = Some((**tally).clone()),
                    LogRecord::Created(image) => {
                        self.image = (**image).clone();
                        self.record = AdmissionRecord::new(image.settings.id.as_str(), image.epoch);
                        self.tally = None;
                    }
                    LogRecord::Owner { token } => self.taken_over = Some((n, *token)),
                    LogRecord::Spent { .. } => {}
                }
                self.last = n;
            }
        }
        self.at = self.at.max(entry.pos);
        Ok(seen)
    }

    /// Read and apply what the log holds after this replica, many batches
    /// at a time, until it is at the log's end.
    pub async fn catch_up(
        &mut self,
        store: &dyn RoomStore,
        room: &RoomId,
    ) -> Result<(), StoreError> {
        loop {
            let entries = store.read(room, self.at, 1_000, Duration::ZERO).await?;
            if entries.is_empty() {
                return Ok(());
            }
            for entry in &entries {
                self.apply(entry)?;
            }
        }
    }
}

/// A replica kept up to date by a task of its own: what an instance that
/// does not own a room reads statuses, positions and the gate from, and
/// what a read that follows the visitor's own write waits on
/// ([`Follower::reached`]), so nobody is shown an older state than they
/// were told.
pub struct Follower {
    replica: std::sync::RwLock<Option<Replica>>,
    reached: watch::Sender<LogPos>,
    observe: Box<Observer>,
    /// Whether the last read of the store succeeded: while it does not,
    /// the replica may be missing what others have written.
    in_touch: watch::Sender<bool>,
}

/// What a [`Follower`] calls each time its replica moves.
type Observer = dyn Fn(&Replica, Moved<'_>) + Send + Sync;

/// How a [`Follower`]'s replica moved, as its observer is told.
#[derive(Clone, Copy, Debug)]
pub enum Moved<'a> {
    /// It starts again from a stored image (at first, or after falling
    /// behind a trimmed log).
    Loaded,
    /// It applied one batch of the log: the records it had not applied
    /// before, in order.
    Applied(&'a [LogRecord]),
}

impl Follower {
    /// Follow `room`'s log from its image until `stop`: many batches a
    /// read, a blocking read while there is nothing new. A log trimmed
    /// past this replica (it fell behind an image) is read again from the
    /// newer image.
    pub fn spawn(
        store: Arc<dyn RoomStore>,
        room: RoomId,
        stop: tokio_util::sync::CancellationToken,
    ) -> Arc<Self> {
        Self::observed(store, room, stop, || None, |_, _: Moved<'_>| {})
    }

    /// [`Self::spawn`], calling `observe` with the replica each time it
    /// moves (under the replica's lock, so the observer sees every batch,
    /// in order, once). While `local` offers a feed (this instance owns
    /// the room: [`LogWriter::feed`]), the replica takes the owner's
    /// batches from it instead of reading them back from the store.
    pub fn observed(
        store: Arc<dyn RoomStore>,
        room: RoomId,
        stop: tokio_util::sync::CancellationToken,
        local: impl Fn() -> Option<broadcast::Receiver<Arc<Entry>>> + Send + Sync + 'static,
        observe: impl Fn(&Replica, Moved<'_>) + Send + Sync + 'static,
    ) -> Arc<Self> {
        let follower = Arc::new(Self {
            replica: std::sync::RwLock::new(None),
            reached: watch::channel(LogPos::START).0,
            observe: Box::new(observe),
            in_touch: watch::channel(true).0,
        });
        let me = Arc::downgrade(&follower);
        tokio::spawn(async move {
            let mut lost_for = Duration::ZERO;
            loop {
                if stop.is_cancelled() {
                    return;
                }
                let Some(follower) = me.upgrade() else { return };
                let at = follower.read(|r| r.map(|r| r.at));
                // Reads go to the store without the lock; a batch read is
                // applied under it, briefly, in place.
                let step = match (at, at.and_then(|_| local())) {
                    (None, _) => Replica::load(store.as_ref(), &room)
                        .await
                        .map(|loaded| follower.replace(loaded)),
                    (Some(_), Some(feed)) => {
                        drop(follower);
                        Self::follow_feed(&me, store.as_ref(), &room, feed, &stop).await
                    }
                    (Some(at), None) => match store.read(&room, at, 1_000, FOLLOW_WAIT).await {
                        Ok(entries) => follower.apply(&entries),
                        Err(e) => Err(e),
                    },
                };
                let Some(follower) = me.upgrade() else { return };
                let reached_store =
                    !matches!(&step, Err(e) if !matches!(e, StoreError::Damaged(_)));
                follower
                    .in_touch
                    .send_if_modified(|was| std::mem::replace(was, reached_store) != reached_store);
                if reached_store {
                    lost_for = Duration::ZERO;
                }
                let pause = match step {
                    Ok(()) if at.is_some() => continue,
                    // No image yet: the room is being created.
                    Ok(()) => Duration::from_millis(50),
                    Err(StoreError::Damaged(why)) => {
                        tracing::info!(room = %room, why, "replica starts again from the image");
                        follower.replace(None);
                        Duration::from_millis(50)
                    }
                    // Soon at first (a connection cut once is opened again
                    // at once), then less and less often.
                    Err(e) => {
                        tracing::debug!(room = %room, error = %e, "the log could not be read");
                        lost_for = (lost_for * 2).clamp(Duration::from_millis(20), FOLLOW_WAIT);
                        lost_for
                    }
                };
                drop(follower);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        });
        follower
    }

    /// Follow the owner's own feed until it ends (this instance no longer
    /// owns the room), the store cannot be read, or `stop`. The feed holds
    /// what is made durable after it was taken, so the store is read up to
    /// its end first; a batch both read and fed is passed over the second
    /// time, as is any repeat. A feed this replica fell behind is made up
    /// for from the store.
    async fn follow_feed(
        me: &std::sync::Weak<Self>,
        store: &dyn RoomStore,
        room: &RoomId,
        mut feed: broadcast::Receiver<Arc<Entry>>,
        stop: &tokio_util::sync::CancellationToken,
    ) -> Result<(), StoreError> {
        let catch_up = || async {
            loop {
                let Some(at) = me.upgrade().and_then(|f| f.read(|r| r.map(|r| r.at))) else {
                    return Ok(());
                };
                let entries = store.read(room, at, 1_000, Duration::ZERO).await?;
                let Some(follower) = me.upgrade() else {
                    return Ok(());
                };
                follower.apply(&entries)?;
                if entries.len() < 1_000 {
                    follower.touched();
                    return Ok(());
                }
            }
        };
        catch_up().await?;
        // A read that waits where nothing is ever written: it ends when
        // its wait is over, or at once when the store is lost, so this
        // copy stops counting as in touch as soon as a reading one would.
        // Redis passes it over at each append (the log's ids are all below
        // it), at no cost worth counting.
        let watch = || store.read(room, LogPos::END, 1, FOLLOW_WAIT);
        let mut watching = Box::pin(watch());
        loop {
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                watched = &mut watching => {
                    watched?;
                    let Some(follower) = me.upgrade() else {
                        return Ok(());
                    };
                    follower.touched();
                    watching = Box::pin(watch());
                }
                next = feed.recv() => match next {
                    Ok(entry) => {
                        let Some(follower) = me.upgrade() else {
                            return Ok(());
                        };
                        // A batch past a gap (one this replica missed,
                        // which cannot happen while the feed is whole) is
                        // read from the store, with what it missed.
                        if follower.apply(std::slice::from_ref(&*entry)).is_err() {
                            drop(follower);
                            catch_up().await?;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => catch_up().await?,
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
            }
        }
    }

    fn replace(&self, replica: Option<Replica>) {
        let mut guard = self
            .replica
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = replica;
        let at = guard.as_ref().map(|r| {
            (self.observe)(r, Moved::Loaded);
            r.at
        });
        drop(guard);
        if let Some(at) = at {
            self.reached.send_replace(at);
        }
    }

    fn apply(&self, entries: &[Entry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut guard = self
            .replica
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(replica) = guard.as_mut() else {
            return Ok(());
        };
        for entry in entries {
            let (first, records) = decode(entry)?;
            let seen = replica.apply_decoded(entry, first, &records)?;
            (self.observe)(replica, Moved::Applied(&records[seen..]));
        }
        let at = replica.at;
        drop(guard);
        self.reached.send_replace(at);
        Ok(())
    }

    /// The store answered (a read, or the owner's append fed here).
    fn touched(&self) {
        self.in_touch
            .send_if_modified(|was| !std::mem::replace(was, true));
    }

    /// Whether the store answered the last read: when it did not, the
    /// replica may lack changes written since (by an owner that can still
    /// reach it), so it is no ground for an answer.
    pub(crate) fn in_touch(&self) -> bool {
        *self.in_touch.borrow()
    }

    /// Wait, up to `within`, until the store answers a read again (at once
    /// when it does now); whether it did.
    pub(crate) async fn back_in_touch(&self, within: Duration) -> bool {
        if self.in_touch() {
            return true;
        }
        let mut rx = self.in_touch.subscribe();
        matches!(
            tokio::time::timeout(within, rx.wait_for(|in_touch| *in_touch)).await,
            Ok(Ok(_))
        )
    }

    /// Read the replica as it is now (`None` before the room's image is
    /// there).
    pub fn read<R>(&self, f: impl FnOnce(Option<&Replica>) -> R) -> R {
        let guard = self
            .replica
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(guard.as_ref())
    }

    /// Wait up to `within` until the replica has applied the log up to
    /// `pos` (a write's position, as its owner acknowledged it); false if
    /// it has not by then.
    pub async fn reached(&self, pos: LogPos, within: Duration) -> bool {
        let mut rx = self.reached.subscribe();
        matches!(
            tokio::time::timeout(within, rx.wait_for(|at| *at >= pos)).await,
            Ok(Ok(_))
        )
    }
}

/// How long one read of the log waits for something new.
const FOLLOW_WAIT: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applied_window_forgets_the_oldest_beyond_its_bound() {
        let mut applied = Applied::default();
        for id in 0..(Applied::KEPT as u128 + 10) {
            applied.insert(id, vec![id as u8]);
        }
        applied.insert(20, vec![0]);
        assert_eq!(applied.replies.len(), Applied::KEPT);
        assert_eq!(applied.get(9), None);
        assert_eq!(applied.get(10), Some(&[10u8][..]));
        assert_eq!(
            applied.get(20),
            Some(&[0u8][..]),
            "a repeat keeps one entry"
        );
    }

    /// A log entry at `seq` holding `records`, numbered from `first`.
    fn entry(seq: u64, first: u64, records: &[LogRecord]) -> Entry {
        let mut batch = postcard::to_allocvec(&(first, records.len() as u64)).unwrap();
        for r in records {
            batch = postcard::to_extend(r, batch).unwrap();
        }
        Entry {
            pos: LogPos { ms: 7, seq },
            batch,
        }
    }

    #[test]
    fn a_takeover_appended_twice_is_passed_over_but_another_at_its_number_starts_again() {
        let settings = crate::engine::RoomSettings::new(RoomId::new("r").unwrap());
        let room = Room::create(settings, Arc::new(crate::engine::SystemClock), 1, None);
        let mut replica = Replica::new(room.image());
        let takeover = [LogRecord::Owner { token: 7 }];
        replica.apply(&entry(1, 1, &takeover)).unwrap();
        // Appended again after the store did not confirm it: the same
        // takeover at the same number, which follows on as before.
        replica.apply(&entry(2, 1, &takeover)).unwrap();
        assert_eq!((replica.last, replica.at.seq), (1, 2));
        // Another owner numbered at or before the last record: the log began
        // again (a store that lost its data), which only its image mends.
        let again = replica
            .apply(&entry(3, 1, &[LogRecord::Owner { token: 9 }]))
            .unwrap_err();
        assert!(again.to_string().contains("started again"), "{again}");
    }

    #[test]
    fn a_borrowed_record_encodes_as_the_owned_one() {
        let event = EventRecord::Arrived { ticket: 3, at: 9 };
        let borrowed = postcard::to_allocvec(&LogRecordRef::Event(&event)).unwrap();
        let owned = postcard::to_allocvec(&LogRecord::Event(event)).unwrap();
        assert_eq!(borrowed, owned);
        let borrowed = postcard::to_allocvec(&LogRecordRef::Applied {
            id: 5,
            reply: b"ok",
        })
        .unwrap();
        let owned = postcard::to_allocvec(&LogRecord::Applied {
            id: 5,
            reply: b"ok".to_vec(),
        })
        .unwrap();
        assert_eq!(borrowed, owned);
    }
}
