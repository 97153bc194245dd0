//! Who runs a room's engine: every instance that serves the room contends
//! for its lease, and the one holding it — the owner — runs the engine,
//! its worker and its log writer, until it stops or loses the lease.
//!
//! Taking a room over is the same steps whether the last owner handed it
//! over, crashed or was cut off: acquire the lease (a fencing token higher
//! than any before), load the room's image and follow its log to the end,
//! restore the engine from that replica ([`Room::restore`], as the
//! embedded deployment does at start) and go on appending after the last
//! record. Whatever the previous owner still writes is refused by the
//! fence, so no acknowledged change is lost and nothing it had not
//! acknowledged is half-kept.
//!
//! The owner renews its lease three times per lease period and stops being
//! the owner the moment a renewal fails or its writer is fenced; it runs
//! the worker's tick at the room's `tick`; and from time to time it stores
//! the engine's image and trims the log behind it, so a new owner or a new
//! instance reads little.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::room_log::{self, LogWriter, Replica, encode_image};
use super::store::{Fence, LogPos, RoomStore, StoreError};
use crate::engine::{AdmissionRecord, Callouts, Clock, EventSink, Room, RoomId, RoomSettings};

/// How an instance holds rooms.
#[derive(Clone, Debug)]
pub struct OwnerOptions {
    /// The lease: a dead owner's room is taken over within this.
    pub lease: Duration,
    /// How often the owner stores the engine's image and trims the log.
    pub image_every: Duration,
    /// Whether the owner runs the room's worker at the room's `tick` (off
    /// in tests that drive ticks themselves on virtual time).
    pub ticks: bool,
}

impl Default for OwnerOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(3),
            image_every: Duration::from_secs(30),
            ticks: true,
        }
    }
}

/// A room this instance owns: its engine and the writer of its log.
pub struct Owned {
    /// This owner made the room's line (it found no image): a new room, or
    /// one whose state the store lost.
    pub made: bool,
    room: std::sync::RwLock<Arc<Room>>,
    pub writer: Arc<LogWriter>,
    pub fence: Fence,
    clock: Arc<dyn Clock>,
    incarnation: Arc<std::sync::RwLock<u64>>,
    callouts: Option<Arc<dyn Callouts>>,
}

impl Owned {
    fn new(
        writer: Arc<LogWriter>,
        fence: Fence,
        clock: Arc<dyn Clock>,
        make: impl FnOnce(Arc<dyn EventSink>) -> Arc<Room>,
    ) -> Self {
        let incarnation = Arc::new(std::sync::RwLock::new(0));
        let sink = Arc::new(IncarnationSink {
            writer: writer.clone(),
            mine: 0,
            current: incarnation.clone(),
        });
        let room = make(sink);
        writer.tally_from(&room);
        Self {
            made: false,
            room: std::sync::RwLock::new(room),
            writer,
            fence,
            clock,
            incarnation,
            callouts: None,
        }
    }

    /// The engine of the room's current incarnation.
    pub fn room(&self) -> Arc<Room> {
        crate::locks::read(&self.room).clone()
    }

    /// Replace the room with a new incarnation (a new epoch: the old
    /// tickets are void), as one record of the log. The old engine is
    /// closed, and whatever it still does is kept out of the log, so no
    /// replica applies the old line's changes to the new one.
    pub(crate) fn replace(&self, settings: RoomSettings) -> Arc<Room> {
        let mut current = crate::locks::write(&self.incarnation);
        *current += 1;
        let sink = Arc::new(IncarnationSink {
            writer: self.writer.clone(),
            mine: *current,
            current: self.incarnation.clone(),
        });
        let room = Room::create(settings, self.clock.clone(), rand::random(), Some(sink));
        if let Some(callouts) = &self.callouts {
            room.set_callouts(callouts.clone());
        }
        self.writer.created(&room.image());
        drop(current);
        self.writer.tally_from(&room);
        let old = std::mem::replace(&mut *crate::locks::write(&self.room), room.clone());
        old.close();
        room
    }
}

/// An incarnation's sink: its events go to the log only while it is the
/// room's current incarnation.
struct IncarnationSink {
    writer: Arc<LogWriter>,
    mine: u64,
    current: Arc<std::sync::RwLock<u64>>,
}

impl EventSink for IncarnationSink {
    fn record(&self, event: crate::engine::RoomEvent<'_>) {
        // Held while appending, so a replacement's record cannot come
        // between the check and the append.
        let current = crate::locks::read(&self.current);
        if *current == self.mine {
            self.writer.record(event);
        }
    }
}

/// An instance's claim on one room: everything it needs to run the room
/// when it owns it.
pub struct Contender {
    pub store: Arc<dyn RoomStore>,
    pub room: RoomId,
    /// This instance's name, as the lease records its holder.
    pub instance: String,
    /// The room as created by whoever owns it first (no image yet); `None`
    /// for a room this instance only found in the store's list of rooms,
    /// which it takes over but never creates.
    pub settings: Option<RoomSettings>,
    pub clock: Arc<dyn Clock>,
    pub options: OwnerOptions,
    /// This instance's admission record of the room as it follows the log,
    /// which the owner stores with the image; `None` reads it back from
    /// the store each time.
    pub recorded: Option<Recorded>,
    /// Where the room, while this instance owns it, hands the calls back
    /// it finds due.
    pub callouts: Option<Arc<dyn Callouts>>,
}

/// The admission record as some replica holds it: the number of the last
/// record it took, the log position of that record's batch, the record.
pub(crate) type Recorded = Arc<dyn Fn() -> Option<(u64, LogPos, AdmissionRecord)> + Send + Sync>;

impl Contender {
    /// Contend for the room's lease until `stop`, publishing the engine
    /// whenever this instance owns the room (`None` while another does). On
    /// `stop` the lease is handed over at once; an instance that dies instead
    /// leaves it to lapse.
    pub fn spawn(self, stop: CancellationToken) -> Contention {
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(async move {
            let Contender {
                store,
                room,
                instance,
                settings,
                clock,
                options,
                recorded,
                callouts,
            } = self;
            let renew_every = options.lease / 3;
            let mut owned: Option<Arc<Owned>> = None;
            let mut renewed = Instant::now();
            let mut imaged = Instant::now();
            let mut ticked = Instant::now();
            // The first try comes at once: a room nobody holds (a new one,
            // or every instance starting together) gets an owner now.
            let mut first = true;
            loop {
                let period = match &owned {
                    _ if first => Duration::ZERO,
                    Some(o) => renew_every.min(o.room().settings().tick),
                    None => options.lease / 4,
                };
                first = false;
                tokio::select! {
                    () = stop.cancelled() => {
                        if let Some(o) = owned.take() {
                            o.writer.end_feed();
                            tx.send_replace(None);
                            let _ = store.release(&room, &o.fence).await;
                        }
                        return;
                    }
                    () = tokio::time::sleep(period) => {}
                }
                // A lease runs from when Redis took the request, which is
                // after it was sent: count ours from the sending, so this
                // instance never believes it holds a lease Redis has let go.
                let asked = Instant::now();
                let Some(o) = owned.clone() else {
                    match store.acquire(&room, &instance, options.lease).await {
                        Ok(Some(fence)) => {
                            match take_over(
                                &store,
                                &room,
                                fence.clone(),
                                &settings,
                                &clock,
                                &callouts,
                            )
                            .await
                            {
                                Ok(o) => {
                                    tracing::info!(room = %room, fence = fence.token, "this instance owns the room now");
                                    (renewed, imaged, ticked) =
                                        (asked, Instant::now(), Instant::now());
                                    owned = Some(o.clone());
                                    tx.send_replace(Some(o));
                                }
                                Err(e) => {
                                    tracing::warn!(room = %room, error = %e, "could not take the room over");
                                    let _ = store.release(&room, &fence).await;
                                }
                            }
                        }
                        Ok(None) => {}
                        Err(e) => tracing::debug!(room = %room, error = %e, "lease not acquired"),
                    }
                    continue;
                };
                if renewed.elapsed() >= renew_every {
                    let kept = store.renew(&room, &o.fence, options.lease).await;
                    if matches!(kept, Ok(true)) {
                        renewed = asked;
                    }
                }
                // Stop acting as owner while the lease still runs, before a
                // successor can hold it: once two renewals in a row failed,
                // the next check could come after the lease has lapsed.
                if o.writer.is_fenced() || renewed.elapsed() + renew_every >= options.lease {
                    tracing::info!(room = %room, "this instance no longer owns the room");
                    o.writer.end_feed();
                    owned = None;
                    tx.send_replace(None);
                    continue;
                }
                let engine = o.room();
                if options.ticks
                    && !engine.is_closed()
                    && ticked.elapsed() >= engine.settings().tick
                {
                    engine.tick();
                    ticked = Instant::now();
                }
                if imaged.elapsed() >= options.image_every {
                    if let Err(e) = store_image(store.as_ref(), &room, &o, recorded.as_ref()).await
                    {
                        tracing::warn!(room = %room, error = %e, "the room's image was not stored");
                    }
                    imaged = Instant::now();
                }
            }
        });
        Contention { owned: rx, task }
    }
}

/// A running contention for one room.
pub struct Contention {
    /// The engine while this instance owns the room.
    pub owned: watch::Receiver<Option<Arc<Owned>>>,
    /// Aborting it is what a crash does: the lease is left to lapse.
    pub task: tokio::task::JoinHandle<()>,
}

/// Become the owner under `fence`: the replica from the image and the log
/// to its end, the engine restored from it, the writer after its last
/// record. A room without an image is created, its first image stored.
async fn take_over(
    store: &Arc<dyn RoomStore>,
    room: &RoomId,
    fence: Fence,
    settings: &Option<RoomSettings>,
    clock: &Arc<dyn Clock>,
    callouts: &Option<Arc<dyn Callouts>>,
) -> Result<Arc<Owned>, StoreError> {
    let replica = match Replica::load(store.as_ref(), room).await? {
        Some(mut replica) => {
            replica.catch_up(store.as_ref(), room).await?;
            Some(replica)
        }
        None => None,
    };
    let settings = match (&replica, settings) {
        (None, None) => {
            return Err(StoreError::Damaged(format!(
                "the room {room} has no image to start from"
            )));
        }
        (_, settings) => settings.clone(),
    };
    // A new line begins after this owner's mark: what an earlier owner
    // wrote before it belongs to a line the store no longer holds (it lost
    // the image), which no replica of the new one may read.
    let (last, at) = replica.as_ref().map_or((0, fence.mark), |r| (r.last, r.at));
    let applied = match &replica {
        Some(r) => r.applied.clone(),
        None => room_log::applied_before(store.as_ref(), room, fence.mark).await?,
    };
    let writer = LogWriter::start_with(
        store.clone(),
        room.clone(),
        fence.clone(),
        last,
        at,
        applied,
    );
    let fresh = replica.is_none();
    let tally = replica.as_ref().and_then(|r| r.tally.clone());
    let mut owned = Owned::new(writer, fence.clone(), clock.clone(), |sink| match replica {
        Some(replica) => Room::restore(replica.image, clock.clone(), Some(sink)),
        // A new line, whether the room is new or its state was lost: a new
        // incarnation, so a ticket of a lost line is told so, not taken
        // for another.
        None => Room::create(
            settings.expect("a room without an image has settings"),
            clock.clone(),
            rand::random(),
            Some(sink),
        ),
    });
    // Where the permits are (hand, tray, debt) and the counters no record
    // carries: as the last owner's tally left them, so the room goes on
    // exactly where it was.
    if let Some(tally) = &tally {
        owned.room().adopt(tally);
    }
    // Signs of life reach the owner, not the log: whoever was waiting,
    // away or admitted counts as seen now, so no one is skipped, abandoned
    // or expired because the room changed hands.
    if !fresh {
        owned.room().presume_seen(clock.now_ms());
    }
    // Replicas that followed the last owner's records one by one start
    // again from here, as this engine did: a join the last owner had not
    // written whole is lost to both alike.
    owned.writer.owner(fence.token);
    owned.made = fresh;
    if let Some(callouts) = callouts {
        owned.room().set_callouts(callouts.clone());
        owned.callouts = Some(callouts.clone());
    }
    if fresh {
        let image = owned.room().image();
        let record = AdmissionRecord::new(room.as_str(), image.epoch);
        let first = encode_image(0, fence.mark, &image, &Default::default(), None, &record);
        store.put_image(room, &fence, &first).await?;
    }
    Ok(Arc::new(owned))
}

/// Store the engine's image and trim the log it covers. The image is
/// copied after noting what is durable, so it holds at least every record
/// up to that point (and perhaps some after it, which a replica applies
/// again harmlessly); only batches wholly before that point are trimmed.
/// The admission record takes each record once, so it goes in exactly as
/// of a point in the log: this instance's replica's (which is never past
/// what is durable), the image's point then moving back to it.
async fn store_image(
    store: &dyn RoomStore,
    room: &RoomId,
    o: &Owned,
    recorded: Option<&Recorded>,
) -> Result<(), StoreError> {
    let engine = o.room();
    let followed = recorded
        .and_then(|f| f())
        .filter(|(_, _, r)| r.epoch() == engine.epoch());
    let (last, at, record) = match followed {
        Some(followed) => followed,
        None => {
            let Some(mut replica) = Replica::load(store, room).await? else {
                return Ok(());
            };
            replica.catch_up(store, room).await?;
            (replica.last, replica.at, replica.record)
        }
    };
    if record.epoch() != engine.epoch() {
        return Ok(());
    }
    let (durable, durable_at) = o.writer.durable_point();
    let (last, at) = (last.min(durable), at.min(durable_at));
    let image = engine.image();
    store
        .put_image(
            room,
            &o.fence,
            &encode_image(
                last,
                at,
                &image,
                &o.writer.applied_window(),
                Some(&engine.tally()),
                &record,
            ),
        )
        .await?;
    store.trim(room, at).await
}
