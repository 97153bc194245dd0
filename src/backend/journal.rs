//! The embedded backend's durable state: an append-only journal of room
//! events plus periodic snapshots, in the data directory.
//!
//! Files (`format` has the bytes): `journal-<first seq>.log` segments and
//! `snapshot-<seq>.bin`, the state of every room after the record with that
//! sequence number. Start-up loads the newest snapshot, replays the
//! segments after it (tolerating a torn tail on the newest one, refusing
//! damage anywhere else), and the backend rebuilds its rooms from the
//! result.
//!
//! Writing: rooms report events through [`Journal::append`], which frames
//! the record and adds it to an in-memory buffer under a short lock,
//! numbering it. One writer thread takes the whole buffer, writes it, and
//! (with `durability = "fsync"`) makes it durable with one `fdatasync`, then
//! publishes the highest durable sequence number. A join waits on that
//! ([`Journal::wait_durable`]) before it is answered: every join that
//! arrived during one fsync shares the next one (group commit).
//!
//! Compaction: [`Journal::rotate`] starts a new segment at a sequence
//! boundary `S`; the backend then copies its rooms out and
//! [`Journal::write_snapshot`] stores them as `snapshot-S`, after which
//! segments before the boundary are deleted. Rooms change while they are
//! copied, so the copy may already show events after `S`; replaying those
//! again is harmless because replay is idempotent (see `engine::image`).
//!
//! Why a small format of our own rather than a WAL crate or an embedded
//! store: the contract needs group commit tied to the engine's own event
//! numbering, snapshots cut at exactly those numbers, and start-up that
//! tells a torn last record (drop it, warn with the offset) from damage in
//! the middle (refuse, naming file and offset). With postcard for the
//! encoding and crc32c for checksums the rest is about 400 lines that do
//! exactly that.

mod format;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::embedded::Durability;
use crate::engine::{AdmissionRecord, EventRecord, RoomId, RoomImage};
use format::{Damage, FILE_HEADER, SEGMENT_MAGIC, SNAPSHOT_MAGIC};

/// One journal record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum Record {
    /// A room was created, or replaced by a new incarnation: its whole
    /// (empty) state.
    Created(Box<RoomImage>),
    /// A change of a room.
    Room { room: RoomId, event: EventRecord },
}

/// Every room, as stored in a snapshot, with each room's admission
/// record as of the journal record it names.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Snapshot {
    rooms: Vec<RoomImage>,
    records: Vec<(RoomId, AdmissionRecord)>,
}

/// Why start-up cannot trust the data directory.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error(
        "{file}: damaged at byte offset {offset}: {what}. The journal was changed after it \
         was written; Narabu will not start on it, to avoid silently losing tickets. Restore \
         the data directory from a backup, or move this file aside to start from what remains \
         (tickets recorded in it and after it are then lost)"
    )]
    Damaged {
        file: PathBuf,
        offset: u64,
        what: String,
    },
    #[error(
        "{file} was written by an earlier Narabu, in journal format {found}; this version \
         reads format {current} only. Start the earlier version on it until its rooms are \
         done, or move the data directory aside to start empty"
    )]
    OldFormat {
        file: PathBuf,
        found: u8,
        current: u8,
    },
    #[error(
        "{file}: records {expected} to {next} are missing (a journal segment was removed?). \
         Restore the data directory from a backup"
    )]
    Gap {
        file: PathBuf,
        expected: u64,
        next: u64,
    },
    #[error(
        "{dir}: another Narabu process is using this data directory. Stop it, or give \
         this one its own --data-dir"
    )]
    InUse { dir: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What start-up found.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub(crate) rooms: Vec<RoomImage>,
    /// Each room's admission record, with every record replayed.
    pub(crate) records: BTreeMap<RoomId, AdmissionRecord>,
    /// Records replayed after the snapshot.
    pub(crate) replayed: u64,
    /// The torn tail that was dropped, if any: (file, offset).
    pub(crate) torn: Option<(PathBuf, u64)>,
}

/// Progress of the writer, as published to waiting joins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Progress {
    durable: u64,
    failed: bool,
}

struct Pending {
    buf: Vec<u8>,
    last_seq: u64,
    writer_asleep: bool,
    rotate: bool,
    /// Set by the writer when it has rotated: the last sequence number in
    /// the old segments.
    rotated_at: Option<u64>,
    stop: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    rotated: Condvar,
    progress: watch::Sender<Progress>,
    /// Bytes appended since the last snapshot, to snapshot early when the
    /// journal grows fast.
    since_snapshot: AtomicU64,
}

thread_local! {
    /// The last sequence number appended by this thread, so that a request
    /// waits for exactly its own records (the engine reports a change on
    /// the thread that made it) rather than for everything appended since.
    static LAST_APPENDED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Make a change and return, with its result, the last record it appended
/// on this thread (0: none), the number its caller waits on to be durable.
pub(crate) fn recording<T>(change: impl FnOnce() -> T) -> (T, u64) {
    LAST_APPENDED.with(|c| c.set(0));
    let out = change();
    (out, LAST_APPENDED.with(std::cell::Cell::get))
}

/// Note that this thread just appended record `seq` to a room's records
/// (the journal, or a room's log on its owner), for [`recording`].
pub(crate) fn note_appended(seq: u64) {
    LAST_APPENDED.with(|c| c.set(seq));
}

fn lock(m: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The open journal of one data directory.
pub(crate) struct Journal {
    dir: PathBuf,
    durability: Durability,
    shared: Arc<Shared>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Held open with an exclusive lock for as long as the journal lives:
    /// two processes appending to one journal would interleave records.
    /// The OS drops the lock when the process dies, even by SIGKILL.
    _lock: std::fs::File,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn segment_name(seq: u64) -> String {
    format!("journal-{seq:020}.log")
}

fn snapshot_name(seq: u64) -> String {
    format!("snapshot-{seq:020}.bin")
}

/// `prefix-<20 digits>.ext` files in `dir`, by number.
fn numbered(dir: &Path, prefix: &str, ext: &str) -> Result<Vec<(u64, PathBuf)>, JournalError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(ext))
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

impl Journal {
    /// Open (creating it if needed) the journal in `dir`, recover what it
    /// holds, and start the writer on a fresh segment.
    pub(crate) fn open(
        dir: &Path,
        durability: Durability,
    ) -> Result<(Arc<Self>, Recovered), JournalError> {
        crate::private_files::create_dir_all(dir).map_err(io_err(dir))?;
        let lock_path = dir.join("LOCK");
        let lock = crate::private_files::open(
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true),
            &lock_path,
        )
        .map_err(io_err(&lock_path))?;
        if lock.try_lock().is_err() {
            return Err(JournalError::InUse {
                dir: dir.to_owned(),
            });
        }
        let (recovered, last_seq) = recover(dir)?;
        let first = last_seq + 1;
        let file = new_segment(dir, first)?;
        let (progress, _) = watch::channel(Progress {
            durable: last_seq,
            failed: false,
        });
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                last_seq,
                writer_asleep: false,
                rotate: false,
                rotated_at: None,
                stop: false,
            }),
            wake: Condvar::new(),
            rotated: Condvar::new(),
            progress,
            since_snapshot: AtomicU64::new(0),
        });
        let writer = Writer {
            dir: dir.to_owned(),
            file,
            fsync: durability == Durability::Fsync,
            shared: shared.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("narabu-journal".into())
            .spawn(move || writer.run())
            .map_err(io_err(dir))?;
        let journal = Arc::new(Self {
            dir: dir.to_owned(),
            durability,
            shared,
            writer: Mutex::new(Some(handle)),
            _lock: lock,
        });
        Ok((journal, recovered))
    }

    pub(crate) fn durability(&self) -> Durability {
        self.durability
    }

    /// Add a record; returns its sequence number. Never blocks on I/O.
    pub(crate) fn append(&self, record: &Record) -> u64 {
        let mut frame = Vec::with_capacity(64);
        format::encode_frame(record, &mut frame);
        self.shared
            .since_snapshot
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        let mut p = lock(&self.shared.pending);
        p.buf.extend_from_slice(&frame);
        p.last_seq += 1;
        let seq = p.last_seq;
        note_appended(seq);
        if p.writer_asleep {
            p.writer_asleep = false;
            self.shared.wake.notify_one();
        }
        seq
    }

    /// The number of the last record appended so far.
    pub(crate) fn appended(&self) -> u64 {
        lock(&self.shared.pending).last_seq
    }

    /// Wait until every record up to `seq` is on disk. Errors when the
    /// journal cannot be written (disk full, I/O error).
    pub(crate) async fn wait_durable(&self, seq: u64) -> Result<(), ()> {
        let mut rx = self.shared.progress.subscribe();
        match rx.wait_for(|p| p.durable >= seq || p.failed).await {
            Ok(p) if !p.failed => Ok(()),
            _ => Err(()),
        }
    }

    /// Whether every record up to `seq` is on disk.
    pub(crate) fn is_durable(&self, seq: u64) -> bool {
        self.shared.progress.borrow().durable >= seq
    }

    /// Bytes journalled since the last snapshot.
    pub(crate) fn since_snapshot(&self) -> u64 {
        self.shared.since_snapshot.load(Ordering::Relaxed)
    }

    /// Start a new segment; returns the last sequence number in the old
    /// ones. Blocks until the writer has switched.
    pub(crate) fn rotate(&self) -> Result<u64, JournalError> {
        let mut p = lock(&self.shared.pending);
        p.rotate = true;
        p.rotated_at = None;
        self.shared.wake.notify_one();
        loop {
            if let Some(at) = p.rotated_at.take() {
                return Ok(at);
            }
            if p.stop || self.shared.progress.borrow().failed {
                return Err(JournalError::Io {
                    path: self.dir.clone(),
                    source: std::io::Error::other("the journal writer has stopped"),
                });
            }
            p = self
                .shared
                .rotated
                .wait(p)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Store every room as the state after record `seq` (from
    /// [`Self::rotate`]), then delete what it makes redundant.
    pub(crate) fn write_snapshot(
        &self,
        seq: u64,
        rooms: Vec<RoomImage>,
        records: Vec<(RoomId, AdmissionRecord)>,
    ) -> Result<(), JournalError> {
        let mut bytes = format::file_header(SNAPSHOT_MAGIC, seq).to_vec();
        format::encode_frame(&Snapshot { rooms, records }, &mut bytes);
        let path = self.dir.join(snapshot_name(seq));
        format::write_atomically(&path, &bytes).map_err(io_err(&path))?;
        self.shared.since_snapshot.store(0, Ordering::Relaxed);
        for (n, old) in numbered(&self.dir, "snapshot-", ".bin")? {
            if n < seq {
                std::fs::remove_file(&old).map_err(io_err(&old))?;
            }
        }
        for (first, old) in numbered(&self.dir, "journal-", ".log")? {
            if first <= seq {
                std::fs::remove_file(&old).map_err(io_err(&old))?;
            }
        }
        format::sync_dir(&self.dir).map_err(io_err(&self.dir))
    }

    /// Write out what is pending and stop the writer.
    pub(crate) fn close(&self) {
        {
            let mut p = lock(&self.shared.pending);
            p.stop = true;
            self.shared.wake.notify_one();
        }
        let handle = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

fn new_segment(dir: &Path, first: u64) -> Result<File, JournalError> {
    let path = dir.join(segment_name(first));
    let mut f = crate::private_files::open(
        OpenOptions::new().create(true).truncate(true).write(true),
        &path,
    )
    .map_err(io_err(&path))?;
    f.write_all(&format::file_header(SEGMENT_MAGIC, first))
        .and_then(|()| f.sync_all())
        .and_then(|()| format::sync_dir(dir))
        .map_err(io_err(&path))?;
    Ok(f)
}

struct Writer {
    dir: PathBuf,
    file: File,
    fsync: bool,
    shared: Arc<Shared>,
}

impl Writer {
    fn run(mut self) {
        let mut buf = Vec::new();
        loop {
            let (last, rotate, stop) = {
                let mut p = lock(&self.shared.pending);
                while p.buf.is_empty() && !p.rotate && !p.stop {
                    p.writer_asleep = true;
                    p = self
                        .shared
                        .wake
                        .wait(p)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                std::mem::swap(&mut buf, &mut p.buf);
                (p.last_seq, std::mem::take(&mut p.rotate), p.stop)
            };
            if let Err(e) = self.write(&buf, last) {
                tracing::error!(
                    dir = %self.dir.display(),
                    error = %e,
                    "cannot write the journal: joins are refused until restart"
                );
                self.shared.progress.send_modify(|p| p.failed = true);
                let mut p = lock(&self.shared.pending);
                p.stop = true;
                self.shared.rotated.notify_all();
                return;
            }
            buf.clear();
            if rotate {
                match new_segment(&self.dir, last + 1) {
                    Ok(f) => self.file = f,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start a journal segment");
                        self.shared.progress.send_modify(|p| p.failed = true);
                    }
                }
                let mut p = lock(&self.shared.pending);
                p.rotated_at = Some(last);
                self.shared.rotated.notify_all();
            }
            if stop {
                return;
            }
        }
    }

    fn write(&mut self, buf: &[u8], last: u64) -> std::io::Result<()> {
        if !buf.is_empty() {
            self.file.write_all(buf)?;
            if self.fsync {
                self.file.sync_data()?;
            }
        }
        self.shared.progress.send_if_modified(|p| {
            let moved = p.durable < last;
            p.durable = p.durable.max(last);
            moved
        });
        Ok(())
    }
}

/// A file of an older journal format is refused by name, never decoded.
fn older_format(path: &Path, bytes: &[u8]) -> Result<(), JournalError> {
    match format::older_version(bytes) {
        Some(found) => Err(JournalError::OldFormat {
            file: path.to_owned(),
            found,
            current: format::VERSION,
        }),
        None => Ok(()),
    }
}

/// Load the newest snapshot and replay the segments after it.
fn recover(dir: &Path) -> Result<(Recovered, u64), JournalError> {
    let mut rooms: BTreeMap<RoomId, RoomImage> = BTreeMap::new();
    let mut records: BTreeMap<RoomId, AdmissionRecord> = BTreeMap::new();
    let mut last_seq = 0;
    if let Some((_, path)) = numbered(dir, "snapshot-", ".bin")?.pop() {
        let bytes = std::fs::read(&path).map_err(io_err(&path))?;
        older_format(&path, &bytes)?;
        let damaged = |offset, what| JournalError::Damaged {
            file: path.clone(),
            offset,
            what,
        };
        let seq = format::read_header(&bytes, SNAPSHOT_MAGIC).map_err(|d| match d {
            Damage::TornTail { offset } => damaged(offset, "snapshot is truncated".into()),
            Damage::Corrupt { offset, what } => damaged(offset, what),
        })?;
        let frames = format::read_frames::<Snapshot>(&bytes);
        match (frames.damage, frames.items.len()) {
            (None, 1) => {}
            (Some(Damage::Corrupt { offset, what }), _) => return Err(damaged(offset, what)),
            (Some(Damage::TornTail { offset }), _) => {
                return Err(damaged(offset, "snapshot is truncated".into()));
            }
            (None, n) => return Err(damaged(FILE_HEADER as u64, format!("{n} frames, not 1"))),
        }
        for snapshot in frames.items {
            for image in snapshot.rooms {
                rooms.insert(image.settings.id.clone(), image);
            }
            records.extend(snapshot.records);
        }
        last_seq = seq;
    }
    let segments: Vec<_> = numbered(dir, "journal-", ".log")?
        .into_iter()
        .filter(|(first, _)| *first > last_seq)
        .collect();
    let mut recovered = Recovered::default();
    let count = segments.len();
    for (i, (first, path)) in segments.into_iter().enumerate() {
        let newest = i + 1 == count;
        if first != last_seq + 1 {
            return Err(JournalError::Gap {
                file: path,
                expected: last_seq + 1,
                next: first,
            });
        }
        let bytes = std::fs::read(&path).map_err(io_err(&path))?;
        older_format(&path, &bytes)?;
        let damaged = |offset, what| JournalError::Damaged {
            file: path.clone(),
            offset,
            what,
        };
        let frames = match format::read_header(&bytes, SEGMENT_MAGIC) {
            Ok(seq) if seq == first => format::read_frames::<Record>(&bytes),
            Ok(seq) => {
                return Err(damaged(
                    8,
                    format!("header says it starts at record {seq}, its name says {first}"),
                ));
            }
            Err(Damage::TornTail { offset }) => format::Frames {
                items: Vec::new(),
                damage: Some(Damage::TornTail { offset }),
            },
            Err(Damage::Corrupt { offset, what }) => return Err(damaged(offset, what)),
        };
        match frames.damage {
            None => {}
            Some(Damage::Corrupt { offset, what }) => return Err(damaged(offset, what)),
            Some(Damage::TornTail { offset }) if newest => {
                tracing::warn!(
                    file = %path.display(),
                    offset,
                    "the journal ends in a torn record (a write cut short by a crash): \
                     dropping the bytes from this offset on"
                );
                // Cut it off so this segment reads clean from now on, when
                // it is no longer the newest.
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err(&path))?;
                f.set_len(offset.max(FILE_HEADER as u64))
                    .and_then(|()| f.sync_all())
                    .map_err(io_err(&path))?;
                if offset < FILE_HEADER as u64 {
                    f.set_len(0).map_err(io_err(&path))?;
                    let mut f = f;
                    f.write_all(&format::file_header(SEGMENT_MAGIC, first))
                        .and_then(|()| f.sync_all())
                        .map_err(io_err(&path))?;
                }
                recovered.torn = Some((path.clone(), offset));
            }
            Some(Damage::TornTail { offset }) => {
                return Err(damaged(
                    offset,
                    "an older journal segment ends in a torn record".into(),
                ));
            }
        }
        for record in frames.items {
            last_seq += 1;
            recovered.replayed += 1;
            match record {
                Record::Created(image) => {
                    let id = image.settings.id.clone();
                    records.insert(id.clone(), AdmissionRecord::new(id.as_str(), image.epoch));
                    rooms.insert(id, *image);
                }
                Record::Room { room, event } => {
                    if let Some(image) = rooms.get_mut(&room) {
                        image.apply(event.as_event());
                        records
                            .entry(room)
                            .or_insert_with_key(|id| AdmissionRecord::new(id.as_str(), image.epoch))
                            .apply(last_seq, &event);
                    }
                }
            }
        }
    }
    recovered.rooms = rooms.into_values().collect();
    recovered.records = records;
    Ok((recovered, last_seq))
}
