//! The embedded backend: rooms live in this process, on the lock-free
//! engine, each driven by its own worker task.
//!
//! Every operation is a direct call into `engine::Room`, so the invariants
//! are the engine's. Opened on a data directory ([`EmbeddedBackend::open`]),
//! every room reports its changes to the [`Journal`], a join is answered
//! only once its record is durable, a snapshot compacts the journal
//! periodically and at shutdown, and start-up rebuilds the rooms from it.
//! The join limit's log is kept in process ([`JoinLog`]). The map of rooms
//! is behind a `std::sync::RwLock` rather than a Tokio lock: it is held
//! only to clone an `Arc<Room>` out, never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use dashmap::DashMap;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::calls;
use super::feed::{LineMoves, Placement, RoomFeed, TicketRead};
use super::join_log::JoinLog;
use super::journal::{self, Journal, JournalError, Record};
use super::{
    Backend, BackendError, Ending, JoinOutcome, JoinRequest, KeptReport, RoomPatch, RoomSnapshot,
    StreamsHeard, StreamsReport, TicketRef, TicketSignal,
};
use crate::engine::rules::StockTaken;
use crate::engine::{
    AdmissionRecord, Callback, Clock, Departure, DrawRecord, EventSink, Room, RoomEvent, RoomId,
    RoomImage, RoomSettings, TickReport, TicketId, TicketState, TicketStatus,
};
use crate::locks::{read, write};

/// When the embedded backend acknowledges a join.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Only after the join's journal record is on disk (fsync, shared by
    /// every join that arrived meanwhile): survives a crash or power cut.
    #[default]
    Fsync,
    /// At once; the journal is written in the background without fsync.
    /// Survives a process crash, but a power cut may lose the last
    /// moments. For measuring what durability costs.
    Off,
}

pub struct EmbeddedBackend {
    rooms: RwLock<HashMap<RoomId, RoomSlot>>,
    clock: Arc<dyn Clock>,
    /// Off in tests that drive `tick` themselves on virtual time.
    run_workers: bool,
    shutdown: CancellationToken,
    workers: TaskTracker,
    /// `None` for rooms kept in memory only (tests).
    journal: Option<Arc<Journal>>,
    /// Serialises snapshots (the periodic one and the last one).
    snapshot_lock: tokio::sync::Mutex<()>,
    /// Recent new tickets per (room, client address), for the join limit.
    joins: JoinLog,
    /// Proof-of-work nonces already used. Kept in memory only: a restart
    /// forgets them, so a solution could be used once more within its
    /// five minutes after one.
    spent: super::spent::SpentNonces,
    /// Where every room hands the calls back it finds due.
    callouts: Arc<super::callouts::CallbackTap>,
    /// The reports of lines operators replaced.
    reports: Arc<super::kept_reports::Shelf>,
}

/// Forwards one room's events to the journal, and remembers which record
/// admitted each admitted ticket, so that nobody is shown "admitted" (or
/// let through the gate) before that admission would survive a crash.
/// Each record also goes to the room's admission record, numbered as the
/// journal numbers it.
struct JournalSink {
    room: RoomId,
    /// `None` for a room kept in memory only.
    journal: Option<Arc<Journal>>,
    /// Admitted ticket → sequence number of its admission record
    /// (`u64::MAX` while it is being appended).
    admissions: DashMap<TicketId, u64>,
    /// The room's admission record. Held while a record is appended, so
    /// the record takes the room's records in the journal's order.
    record: std::sync::Mutex<Recorded>,
}

/// The admission record, and where it stood before each journal record
/// that added entries and is not yet durable: readers are shown the record
/// up to the first of those, so no one keeps a head a crash could take
/// back.
struct Recorded {
    record: AdmissionRecord,
    /// (entries, head) before the journal record `seq` was applied.
    pending: std::collections::VecDeque<(u64, [u8; 32], u64)>,
}

impl Recorded {
    /// Forget the marks of records now durable.
    fn settle(&mut self, journal: Option<&Journal>) {
        let Some(journal) = journal else { return };
        while let Some(&(_, _, seq)) = self.pending.front() {
            if !journal.is_durable(seq) {
                break;
            }
            self.pending.pop_front();
        }
    }

    /// What readers are shown: the record up to its first entry not yet
    /// durable.
    fn read(&mut self, journal: Option<&Journal>, after: u64, limit: usize) -> crate::engine::Page {
        self.settle(journal);
        match self.pending.front() {
            Some(&(n, head, _)) => self.record.read_first(n, head, after, limit),
            None => self.record.read(after, limit),
        }
    }
}

impl EventSink for JournalSink {
    fn record(&self, event: RoomEvent<'_>) {
        if let RoomEvent::Admitted { ticket, .. } = event {
            self.admissions.insert(ticket, u64::MAX);
        }
        let record = Record::Room {
            room: self.room.clone(),
            event: event.into(),
        };
        let mut recorded = crate::locks::lock(&self.record);
        let seq = match &self.journal {
            Some(journal) => journal.append(&record),
            None => recorded.record.applied() + 1,
        };
        let before = (recorded.record.len(), recorded.record.head());
        if let Record::Room { event, .. } = &record {
            recorded.record.apply(seq, event);
        }
        if self.journal.is_some() && recorded.record.len() > before.0 {
            recorded.settle(self.journal.as_deref());
            recorded.pending.push_back((before.0, before.1, seq));
        }
        drop(recorded);
        match event {
            RoomEvent::Admitted { ticket, .. } => {
                self.admissions.insert(ticket, seq);
            }
            RoomEvent::Ended { ticket, .. } => {
                self.admissions.remove(&ticket);
            }
            _ => {}
        }
    }
}

impl JournalSink {
    /// The record to wait for before showing this ticket as admitted, if
    /// it may not be durable yet.
    fn admission_pending(&self, ticket: TicketId) -> Option<u64> {
        let journal = self.journal.as_ref()?;
        let seq = *self.admissions.get(&ticket)?;
        let seq = if seq == u64::MAX {
            journal.appended()
        } else {
            seq
        };
        if journal.is_durable(seq) {
            self.admissions.remove(&ticket);
            None
        } else {
            Some(seq)
        }
    }
}

/// Where the embedded backend keeps its state, and how.
#[derive(Clone, Debug)]
pub struct Persistence {
    pub data_dir: std::path::PathBuf,
    pub durability: Durability,
    pub snapshot_interval: Duration,
}

struct RoomSlot {
    room: Arc<Room>,
    sink: Arc<JournalSink>,
    /// Stops this room's worker when the room is replaced.
    stop: CancellationToken,
}

impl std::fmt::Debug for EmbeddedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBackend").finish_non_exhaustive()
    }
}

impl EmbeddedBackend {
    /// Creates the rooms and starts one worker task per room. Must be
    /// called inside a Tokio runtime.
    pub fn new(rooms: Vec<RoomSettings>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::build(rooms, clock, true)
    }

    /// Rooms without worker tasks: the caller drives `tick`.
    pub fn without_workers(rooms: Vec<RoomSettings>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::build(rooms, clock, false)
    }

    fn build(rooms: Vec<RoomSettings>, clock: Arc<dyn Clock>, run_workers: bool) -> Arc<Self> {
        let backend = Self::empty(clock, run_workers, None, None);
        if run_workers {
            backend.sweep_join_log();
        }
        for settings in rooms {
            backend.create(settings);
        }
        backend
    }

    fn empty(
        clock: Arc<dyn Clock>,
        run_workers: bool,
        journal: Option<Arc<Journal>>,
        data_dir: Option<&std::path::Path>,
    ) -> Arc<Self> {
        Arc::new(Self {
            reports: Arc::new(super::kept_reports::Shelf::new(data_dir)),
            rooms: RwLock::new(HashMap::new()),
            clock,
            run_workers,
            shutdown: CancellationToken::new(),
            workers: TaskTracker::new(),
            journal,
            snapshot_lock: tokio::sync::Mutex::new(()),
            joins: JoinLog::default(),
            spent: super::spent::SpentNonces::default(),
            callouts: super::callouts::CallbackTap::new(),
        })
    }

    /// Forget join-limit logs that no longer count, every half minute.
    fn sweep_join_log(self: &Arc<Self>) {
        let me = Arc::downgrade(self);
        let stop = self.shutdown.clone();
        self.workers.spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(30));
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                let Some(me) = me.upgrade() else { return };
                me.joins.sweep(me.clock.now_ms());
            }
        });
    }

    /// Rooms kept in `persistence.data_dir`: the rooms found there come
    /// back as they were (tickets, numbers, order, passes); configured
    /// rooms not found there are created. Found rooms keep the settings
    /// they had (operators may have changed them live). Starts the worker
    /// tasks and the periodic snapshot; must run inside a Tokio runtime.
    pub async fn open(
        rooms: Vec<RoomSettings>,
        clock: Arc<dyn Clock>,
        persistence: Persistence,
        run_workers: bool,
    ) -> Result<Arc<Self>, JournalError> {
        let dir = persistence.data_dir.clone();
        let durability = persistence.durability;
        let (journal, recovered) =
            tokio::task::spawn_blocking(move || Journal::open(&dir, durability))
                .await
                .map_err(|e| JournalError::Io {
                    path: persistence.data_dir.clone(),
                    source: std::io::Error::other(e),
                })??;
        let backend = Self::empty(
            clock,
            run_workers,
            Some(journal.clone()),
            Some(&persistence.data_dir),
        );
        backend.sweep_join_log();
        let mut found = std::collections::HashSet::new();
        let mut records = recovered.records;
        for image in recovered.rooms {
            let id = image.settings.id.clone();
            let record = records
                .remove(&id)
                .filter(|r| r.epoch() == image.epoch)
                .unwrap_or_else(|| AdmissionRecord::new(id.as_str(), image.epoch));
            let sink = backend.sink(&id, record);
            let room = Room::restore(image, backend.clock.clone(), Some(sink.clone()));
            tracing::info!(
                room = %id,
                waiting = room.waiting_count(),
                admitted = room.admitted_count(),
                "room restored from the data directory"
            );
            found.insert(id);
            backend.install(room, sink);
        }
        if recovered.replayed > 0 || recovered.torn.is_some() {
            tracing::info!(records = recovered.replayed, "journal replayed");
        }
        for settings in rooms {
            if !found.contains(&settings.id) {
                backend.create(settings);
            }
        }
        // Start on a compact journal, and make the new rooms durable.
        backend.snapshot().await.map_err(|e| JournalError::Io {
            path: persistence.data_dir.clone(),
            source: std::io::Error::other(e),
        })?;
        let periodic = backend.clone();
        let stop = backend.shutdown.clone();
        backend.workers.spawn(async move {
            periodic
                .snapshot_periodically(persistence.snapshot_interval, stop)
                .await;
        });
        Ok(backend)
    }

    fn sink(&self, room: &RoomId, record: AdmissionRecord) -> Arc<JournalSink> {
        Arc::new(JournalSink {
            room: room.clone(),
            journal: self.journal.clone(),
            admissions: DashMap::new(),
            record: std::sync::Mutex::new(Recorded {
                record,
                pending: Default::default(),
            }),
        })
    }

    /// With `durability = "fsync"`, wait until record `seq` (and all
    /// before it) is on disk; 0 waits for nothing.
    async fn durable(&self, seq: u64) -> Result<(), BackendError> {
        if seq == 0 {
            return Ok(());
        }
        if let Some(journal) = &self.journal
            && journal.durability() == Durability::Fsync
        {
            journal
                .wait_durable(seq)
                .await
                .map_err(|()| BackendError::Unavailable("the journal cannot be written".into()))?;
        }
        Ok(())
    }

    /// Wait, if needed, until a ticket's admission is durable.
    async fn admission_durable(&self, id: &RoomId, ticket: TicketId) -> Result<(), BackendError> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        if journal.durability() != Durability::Fsync {
            return Ok(());
        }
        let pending = self
            .read()
            .get(id)
            .map(|s| s.sink.clone())
            .and_then(|sink| sink.admission_pending(ticket));
        if let Some(seq) = pending {
            journal
                .wait_durable(seq)
                .await
                .map_err(|()| BackendError::Unavailable("the journal cannot be written".into()))?;
        }
        Ok(())
    }

    /// A new room (or a new incarnation of one), journalled first.
    fn create(&self, settings: RoomSettings) -> Arc<Room> {
        let epoch = rand::random();
        let sink = self.sink(
            &settings.id,
            AdmissionRecord::new(settings.id.as_str(), epoch),
        );
        let room = Room::create(settings, self.clock.clone(), epoch, Some(sink.clone()));
        if let Some(journal) = &self.journal {
            journal.append(&Record::Created(Box::new(room.image())));
        }
        self.install(room.clone(), sink);
        room
    }

    /// Compact the journal: start a new segment, copy every room out, and
    /// store the copy as a snapshot.
    pub async fn snapshot(&self) -> Result<(), String> {
        let Some(journal) = self.journal.clone() else {
            return Ok(());
        };
        let _one_at_a_time = self.snapshot_lock.lock().await;
        let rooms: Vec<(Arc<Room>, Arc<JournalSink>)> = self
            .read()
            .values()
            .map(|s| (s.room.clone(), s.sink.clone()))
            .collect();
        let rotating = journal.clone();
        let seq = tokio::task::spawn_blocking(move || rotating.rotate())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        // Each admission record as of a journal record it names (the
        // record's own order), and the rooms copied after: replay then
        // applies exactly the records after that one to the admission
        // record, and idempotently the others to the rooms. The snapshot
        // waits until the admission records' last records are on disk, so
        // it never holds one a crash could take back.
        let records: Vec<(RoomId, AdmissionRecord)> = rooms
            .iter()
            .map(|(room, sink)| {
                let record = crate::locks::lock(&sink.record).record.clone();
                (room.id().clone(), record)
            })
            .collect();
        let images: Vec<RoomImage> = rooms.iter().map(|(room, _)| room.image()).collect();
        let newest = records.iter().map(|(_, r)| r.applied()).max().unwrap_or(0);
        journal
            .wait_durable(newest)
            .await
            .map_err(|()| "the journal cannot be written".to_owned())?;
        tokio::task::spawn_blocking(move || journal.write_snapshot(seq, images, records))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    async fn snapshot_periodically(&self, every: Duration, stop: CancellationToken) {
        /// Snapshot early when this much journal piles up.
        const MAX_JOURNAL: u64 = 256 << 20;
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(250).min(every)) => {}
            }
            let big = self
                .journal
                .as_ref()
                .is_some_and(|j| j.since_snapshot() > MAX_JOURNAL);
            if last.elapsed() >= every || big {
                if let Err(e) = self.snapshot().await {
                    tracing::error!(error = %e, "snapshot failed; the journal keeps growing");
                }
                last = tokio::time::Instant::now();
            }
        }
    }

    /// The engine room behind an id (for tests and the loadtest's checks).
    pub fn engine_room(&self, id: &RoomId) -> Option<Arc<Room>> {
        self.read().get(id).map(|s| s.room.clone())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<RoomId, RoomSlot>> {
        read(&self.rooms)
    }

    fn install(&self, room: Arc<Room>, sink: Arc<JournalSink>) {
        room.set_callouts(self.callouts.clone());
        let stop = self.shutdown.child_token();
        if self.run_workers {
            self.workers.spawn(run_worker(room.clone(), stop.clone()));
        }
        // Even without workers (virtual-time tests drive the ticks), a
        // departure reaches the room's streams within the window.
        let (coalesced, until) = (room.clone(), self.shutdown.clone());
        self.workers.spawn(async move {
            tokio::select! {
                () = until.cancelled() => {}
                () = coalesced.changes().coalesce() => {}
            }
        });
        let previous = write(&self.rooms).insert(room.id().clone(), RoomSlot { room, sink, stop });
        if let Some(old) = previous {
            old.stop.cancel();
            old.room.close();
        }
    }

    fn get(&self, id: &RoomId) -> Result<Arc<Room>, BackendError> {
        self.engine_room(id)
            .ok_or_else(|| BackendError::NoSuchRoom(id.clone()))
    }

    /// The room and the engine's ticket id (see [`calls::ticket`]).
    fn ticket(&self, id: &RoomId, t: TicketRef) -> Result<(Arc<Room>, TicketId), BackendError> {
        let room = self.get(id)?;
        let ticket = calls::ticket(&room, t)?;
        Ok((room, ticket))
    }

    /// A join's answer, once its record (`seq`) and, for an admitted
    /// ticket, its admission are durable.
    async fn joined(
        &self,
        room: &Room,
        ticket: TicketId,
        is_new: bool,
        seq: u64,
    ) -> Result<JoinOutcome, BackendError> {
        self.durable(seq).await?;
        if room.state_of(ticket) == Some(TicketState::Admitted) {
            self.admission_durable(room.id(), ticket).await?;
        }
        let status = room.status(ticket).ok_or(BackendError::NoSuchTicket)?;
        Ok(JoinOutcome {
            ticket: TicketRef {
                epoch: room.epoch(),
                id: u64::from(ticket),
            },
            is_new,
            status,
        })
    }
}

/// The engine's room is its own feed: its streams count from its own
/// position index and follow its own change counter.
struct EngineFeed(Arc<Room>);

impl RoomFeed for EngineFeed {
    fn changes(&self) -> watch::Receiver<u64> {
        self.0.changes().subscribe()
    }

    fn room_facts(&self) -> crate::engine::rules::RoomFacts {
        self.0.facts()
    }

    fn ahead(&self, lane: u8, qi: u64) -> Option<u64> {
        self.0.lane(lane)?.ahead(u32::try_from(qi).ok()?)
    }

    fn placement(&self, ticket: u64) -> Option<Placement> {
        let (qi, initial_ahead) = self.0.placement(TicketId::try_from(ticket).ok()?)?;
        Some(Placement {
            qi: u64::from(qi),
            initial_ahead: u64::from(initial_ahead),
        })
    }
    fn moves(&self, lane: u8) -> LineMoves {
        LineMoves::of(&self.0, lane)
    }
}

/// A room's worker: one tick every `tick`, re-reading the setting each time
/// so that operators can change it live.
async fn run_worker(room: Arc<Room>, stop: CancellationToken) {
    let mut next = tokio::time::Instant::now();
    loop {
        let tick = room.settings().tick.max(Duration::from_millis(1));
        next += tick;
        let now = tokio::time::Instant::now();
        if next < now {
            // Fell behind (a stalled machine): do not burst to catch up.
            next = now + tick;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        let report = room.tick();
        if report.opened {
            tracing::info!(room = %room.id(), "room opened");
        }
    }
}

#[async_trait]
impl Backend for EmbeddedBackend {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    async fn ready(&self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn epoch(&self, room: &RoomId) -> Result<u64, BackendError> {
        Ok(self.get(room)?.epoch())
    }

    async fn draw(&self, room: &RoomId) -> Result<Option<DrawRecord>, BackendError> {
        Ok(self.get(room)?.draw_record())
    }

    async fn record(
        &self,
        room: &RoomId,
        after: u64,
        limit: usize,
    ) -> Result<crate::engine::Page, BackendError> {
        let sink = self
            .read()
            .get(room)
            .map(|s| s.sink.clone())
            .ok_or_else(|| BackendError::NoSuchRoom(room.clone()))?;
        Ok(crate::locks::lock(&sink.record).read(sink.journal.as_deref(), after, limit))
    }

    async fn admission_record(&self, room: &RoomId) -> Result<AdmissionRecord, BackendError> {
        let sink = self
            .read()
            .get(room)
            .map(|s| s.sink.clone())
            .ok_or_else(|| BackendError::NoSuchRoom(room.clone()))?;
        Ok(crate::locks::lock(&sink.record).record.clone())
    }

    async fn keep_report(&self, room: &RoomId, kept: KeptReport) -> Result<(), BackendError> {
        let (shelf, room, now) = (self.reports.clone(), room.clone(), self.clock.now_ms());
        tokio::task::spawn_blocking(move || shelf.keep(&room, &kept, now))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(not_kept)
    }

    async fn kept_reports(&self, room: &RoomId) -> Result<Vec<KeptReport>, BackendError> {
        let (shelf, room, now) = (self.reports.clone(), room.clone(), self.clock.now_ms());
        tokio::task::spawn_blocking(move || shelf.list(&room, now))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(not_kept)
    }

    async fn join(&self, id: &RoomId, request: JoinRequest) -> Result<JoinOutcome, BackendError> {
        let room = self.get(id)?;
        let journal = self.journal.clone();
        let done = calls::join(&room, &request, &self.joins, &self.spent, || {
            journal.as_ref().map_or(0, |j| j.appended())
        })?;
        self.joined(&room, done.ticket, done.is_new, done.wait_for)
            .await
    }

    async fn status(
        &self,
        id: &RoomId,
        t: TicketRef,
        touch: bool,
    ) -> Result<TicketStatus, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        if touch {
            room.touch(ticket);
        }
        if room.state_of(ticket) == Some(TicketState::Admitted) {
            self.admission_durable(id, ticket).await?;
        }
        room.status(ticket).ok_or(BackendError::NoSuchTicket)
    }

    async fn hold_streams(
        &self,
        id: &RoomId,
        report: &StreamsReport,
    ) -> Result<StreamsHeard, BackendError> {
        Ok(calls::hold_streams(&*self.get(id)?, report))
    }

    async fn depart(
        &self,
        id: &RoomId,
        t: TicketRef,
        how: Ending,
    ) -> Result<Departure, BackendError> {
        let (departure, appended) = calls::depart(&*self.get(id)?, t, how)?;
        self.durable(appended).await?;
        Ok(departure)
    }

    async fn subscribe(
        &self,
        id: &RoomId,
        t: TicketRef,
        callback: Callback,
    ) -> Result<(), BackendError> {
        let appended = calls::subscribe(&*self.get(id)?, t, callback)?;
        self.durable(appended).await
    }

    async fn unsubscribe(&self, id: &RoomId, t: TicketRef) -> Result<bool, BackendError> {
        let (had, appended) = calls::unsubscribe(&*self.get(id)?, t)?;
        self.durable(appended).await?;
        Ok(had)
    }

    fn callbacks(&self) -> Option<tokio::sync::mpsc::Receiver<super::callouts::CallbackDue>> {
        self.callouts.take()
    }

    fn callbacks_dropped(&self, room: &RoomId) -> u64 {
        self.callouts.dropped(room)
    }

    async fn tick(&self, id: &RoomId) -> Result<TickReport, BackendError> {
        Ok(self.get(id)?.tick())
    }

    async fn feed(&self, id: &RoomId) -> Result<Arc<dyn RoomFeed>, BackendError> {
        Ok(Arc::new(EngineFeed(self.get(id)?)))
    }

    async fn read_ticket(&self, id: &RoomId, t: TicketRef) -> Result<TicketRead, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        if room.state_of(ticket) == Some(TicketState::Admitted) {
            self.admission_durable(id, ticket).await?;
        }
        let (facts, ahead) = room
            .ticket_facts(ticket)
            .ok_or(BackendError::NoSuchTicket)?;
        Ok(TicketRead { facts, ahead })
    }

    async fn watch_ticket(&self, id: &RoomId, t: TicketRef) -> Result<TicketSignal, BackendError> {
        let (room, ticket) = self.ticket(id, t)?;
        let notify = room.ticket_notify(ticket);
        Ok(TicketSignal::new(notify, move |n| {
            room.forget_ticket_notify(ticket, n);
        }))
    }

    async fn list_rooms(&self) -> Result<Vec<RoomSnapshot>, BackendError> {
        let rooms: Vec<Arc<Room>> = self.read().values().map(|s| s.room.clone()).collect();
        let mut out: Vec<RoomSnapshot> = rooms.iter().map(|r| calls::snapshot(r)).collect();
        out.sort_by(|a, b| a.settings.id.cmp(&b.settings.id));
        Ok(out)
    }

    async fn room(&self, id: &RoomId) -> Result<RoomSnapshot, BackendError> {
        let room = self.get(id)?;
        Ok(calls::snapshot(&room))
    }

    async fn put_room(&self, settings: RoomSettings) -> Result<RoomSnapshot, BackendError> {
        // An operator's change is acknowledged only once it would survive
        // a crash, like a visitor's join.
        let (room, appended) = journal::recording(|| self.create(settings));
        self.durable(appended).await?;
        Ok(calls::snapshot(&room))
    }

    async fn patch_room(
        &self,
        id: &RoomId,
        patch: RoomPatch,
    ) -> Result<RoomSnapshot, BackendError> {
        let room = self.get(id)?;
        if room.is_closed() {
            return Err(BackendError::Closed(id.clone()));
        }
        let ((), appended) = journal::recording(|| room.patch(&patch));
        self.durable(appended).await?;
        Ok(calls::snapshot(&room))
    }

    async fn purchase(
        &self,
        id: &RoomId,
        purchased: u64,
    ) -> Result<Option<StockTaken>, BackendError> {
        let room = self.get(id)?;
        let (taken, appended) = journal::recording(|| room.purchase(purchased));
        self.durable(appended).await?;
        Ok(taken)
    }

    async fn close_room(&self, id: &RoomId) -> Result<(), BackendError> {
        let room = self.get(id)?;
        let ((), closed) = journal::recording(|| room.close());
        if let Some(slot) = self.read().get(id) {
            slot.stop.cancel();
        }
        self.durable(closed).await
    }

    async fn shutdown(&self) {
        self.shutdown.cancel();
        self.workers.close();
        self.workers.wait().await;
        if let Some(journal) = &self.journal {
            match self.snapshot().await {
                Ok(()) => tracing::info!("state saved to the data directory"),
                Err(e) => {
                    tracing::error!(error = %e, "final snapshot failed; the journal has it all")
                }
            }
            let journal = journal.clone();
            let _ = tokio::task::spawn_blocking(move || journal.close()).await;
        }
    }
}

/// A report the data directory could not keep or give back: the message
/// names no path (it is shown to operators through the API).
fn not_kept(e: std::io::Error) -> BackendError {
    tracing::error!(error = %e, "kept reports: the data directory failed");
    BackendError::Unavailable("the data directory cannot keep reports now".into())
}
