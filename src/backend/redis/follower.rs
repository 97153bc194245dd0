//! One follower per room per instance: it reads the room's change log
//! (`XREAD BLOCK` on a connection of its own, so the blocking read holds
//! up nobody's command), keeps this instance's [`Replica`] of the room, and
//! wakes the streams here: the streams of tickets the log names (an
//! admission, an end) at once, every stream of the room in one coalesced
//! wave when positions or the view moved. Redis does the same small work
//! per change for each instance, however many streams it holds.
//!
//! Gap-free: every entry carries the next seq. A follower that starts late,
//! or finds a seq missing (the log was trimmed past it while it was away),
//! reloads a snapshot of the line (`snapshot.lua`: one call, the departed
//! bitmap read with GETRANGE) and follows on from the log entry it
//! reflects. A lost connection resumes from the last entry applied. An
//! opening or a new incarnation also reloads; entries read past such a
//! reload up to the snapshot's own position only wake their tickets'
//! streams, as the snapshot already holds their effect on the line.
//!
//! Every [`REPORT`] it records how far it has read (`follow.lua`), and the
//! log is trimmed behind the slowest live follower.

use std::collections::HashSet;
use std::sync::Weak;
use std::time::Duration;

use redis::AsyncCommands;
use redis::streams::{StreamReadOptions, StreamReadReply};
use tokio::time::Instant;

use super::RedisBackend;
use super::conn::{Blocking, unavailable};
use super::keys::RoomKeys;
use super::log::{Change, Entry, Event};
use super::replica::{Line, Replica};
use super::reply::decode;
use crate::backend::BackendError;
use crate::engine::RoomId;

/// How long one `XREAD` blocks: under the connection's response timeout.
const BLOCK: Duration = Duration::from_millis(1000);
/// Entries read at once.
const COUNT: usize = 1024;
/// How often a follower records how far it has read.
pub const REPORT: Duration = Duration::from_secs(2);
/// A follower not heard from for this long no longer holds the log back.
const STALE: Duration = Duration::from_secs(30);

/// A log position: an entry id and its seq.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Position {
    id: String,
    seq: u64,
}

/// Why a follower reloads the line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reload {
    /// Entries are missing: start over from the snapshot's position.
    Gap,
    /// The line changed as a whole (the opening, a new incarnation): reload
    /// it, then read on from here, the entries up to the snapshot's
    /// position for their tickets' news only.
    Line,
}

/// An entry id as numbers, for ordering.
fn id_key(id: &str) -> (u64, u64) {
    let (ms, n) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), n.parse().unwrap_or(0))
}

impl RedisBackend {
    /// Read a snapshot of the room's line and install it: a new replica for
    /// a new incarnation, else the current one reloaded. `None` when the
    /// room does not exist.
    async fn load_snapshot(&self, room: &RoomId) -> Result<Option<Position>, BackendError> {
        let keys = RoomKeys::new(room);
        let mut inv = self.scripts.snapshot.key(&keys.meta);
        inv.arg(&keys.prefix).arg(self.now());
        let parts: Vec<Vec<u8>> = inv
            .invoke_async(&mut self.con())
            .await
            .map_err(|e| unavailable(&e))?;
        let bad = || BackendError::Unavailable("bad snapshot from Redis".into());
        let json = std::str::from_utf8(parts.first().ok_or_else(bad)?).map_err(|_| bad())?;
        let lanes = parts.get(1).map_or(&[][..], Vec::as_slice);
        let bitmaps = parts.get(2..).unwrap_or_default();
        #[derive(serde::Deserialize)]
        #[serde(tag = "r", rename_all = "lowercase")]
        enum Snapshot {
            Ok(Line),
            NoRoom,
        }
        let line = match decode::<Snapshot>(json)? {
            Snapshot::Ok(line) => line,
            Snapshot::NoRoom => return Ok(None),
        };
        let Some(epoch) = line.epoch() else {
            return Err(BackendError::Unavailable("bad epoch in Redis".into()));
        };
        match self.hub.replica(room) {
            Some(current) if current.epoch == epoch => current.reload(&line, lanes, bitmaps),
            _ => self
                .hub
                .install(room, Replica::start(epoch, &line, lanes, bitmaps)),
        }
        Ok(Some(Position {
            id: line.id,
            seq: line.seq,
        }))
    }

    /// Start this instance's follower of a room, once.
    pub(super) fn ensure_follower(&self, room: &RoomId) {
        if self.shutdown.is_cancelled() || self.followers.insert(room.clone(), ()).is_some() {
            return;
        }
        self.tasks
            .spawn(run_follower(self.weak.clone(), room.clone()));
    }

    /// Apply what the log says after `at`: the position reached, and
    /// whether the line must be reloaded from a snapshot.
    fn apply(
        &self,
        room: &RoomId,
        reply: StreamReadReply,
        mut at: Position,
        reloaded_to: Option<&str>,
    ) -> (Position, Option<Reload>) {
        let Some(replica) = self.hub.replica(room) else {
            return (at, Some(Reload::Line));
        };
        let mut wake = HashSet::new();
        let (mut moved, mut viewed, mut reload) = (false, false, None);
        for entry in reply.keys.into_iter().flat_map(|k| k.ids) {
            let parsed = Entry::parse(&entry.map);
            if parsed.as_ref().is_none_or(|p| p.seq != at.seq + 1) {
                // Entries were lost to trimming (or one is unreadable):
                // every stream here may have missed its ticket's news.
                self.hub.wake_room(room);
                reload = Some(Reload::Gap);
                break;
            }
            let Some(parsed) = parsed else { break };
            // Already in the line the last snapshot read: news only.
            let news_only = reloaded_to.is_some_and(|to| id_key(&entry.id) <= id_key(to));
            at = Position {
                id: entry.id,
                seq: parsed.seq,
            };
            match parsed.change {
                Change::Events(events) => {
                    for event in &events {
                        if let Some(id) = event.ticket() {
                            wake.insert(id);
                        }
                        if news_only {
                            continue;
                        }
                        if event == &Event::Open {
                            reload = Some(Reload::Line);
                        } else {
                            moved |= replica.apply(event);
                        }
                    }
                }
                Change::View(view) if !news_only => viewed |= replica.set_view(*view),
                Change::Epoch(epoch) if !news_only && epoch != replica.epoch => {
                    reload = Some(Reload::Line);
                }
                Change::Unknown if !news_only => reload = Some(Reload::Line),
                _ => {}
            }
            if reload.is_some() {
                break;
            }
        }
        // Admissions and ends first: those streams must not wait behind
        // the wave.
        for id in wake {
            self.hub.notify_ticket(room, replica.epoch, id);
        }
        if viewed {
            replica.bump();
        } else if moved {
            replica.mark();
        }
        (at, reload)
    }

    /// Record how far this instance has read, and trim behind the slowest.
    async fn report(&self, room: &RoomId, at: &Position) {
        let now = self.now();
        let stale = now.saturating_sub(STALE.as_millis() as u64).to_string();
        let _ = self
            .run(
                &self.scripts.follow,
                room,
                now,
                &[&self.instance, &at.id, &stale],
            )
            .await;
    }
}

/// The follower task: until shutdown.
async fn run_follower(me: Weak<RedisBackend>, room: RoomId) {
    let Some(stop) = me.upgrade().map(|b| b.shutdown.clone()) else {
        return;
    };
    let log = RoomKeys::new(&room).log;
    let mut conn: Option<Blocking> = None;
    let mut at: Option<Position> = None;
    // After a reload that was not for a gap: where its snapshot stood.
    let mut reloaded_to: Option<String> = None;
    let mut reported = Instant::now();
    let mut backoff = Duration::from_millis(100);
    let options = StreamReadOptions::default()
        .block(BLOCK.as_millis() as usize)
        .count(COUNT);
    loop {
        if stop.is_cancelled() {
            return;
        }
        let Some(backend) = me.upgrade() else { return };
        let Some(from) = at.clone() else {
            match backend.load_snapshot(&room).await {
                Ok(Some(position)) => {
                    at = Some(position);
                    reloaded_to = None;
                    backoff = Duration::from_millis(100);
                }
                Ok(None) => {
                    drop(backend);
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(BLOCK) => {}
                    }
                }
                Err(_) => {
                    drop(backend);
                    pause(&stop, backoff).await;
                    backoff = (backoff * 2).min(BLOCK);
                }
            }
            continue;
        };
        if conn.is_none() {
            match backend.conn.blocking(&backend.options.target).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(room = %room, kind = ?e.kind(), "follower: cannot connect");
                    drop(backend);
                    pause(&stop, backoff).await;
                    backoff = (backoff * 2).min(BLOCK);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        drop(backend);
        let (keys, ids) = ([&log], [&from.id]);
        let read: redis::RedisResult<Option<StreamReadReply>> = tokio::select! {
            () = stop.cancelled() => return,
            r = c.xread_options(&keys, &ids, &options) => r,
        };
        let Some(backend) = me.upgrade() else { return };
        match read {
            Err(e) => {
                // Resume from the last entry applied once reconnected; a
                // trim meanwhile shows as a gap.
                tracing::debug!(room = %room, kind = ?e.kind(), "follower: read failed");
                conn = None;
                drop(backend);
                pause(&stop, backoff).await;
                backoff = (backoff * 2).min(BLOCK);
                continue;
            }
            Ok(None) => {}
            Ok(Some(reply)) => {
                backoff = Duration::from_millis(100);
                let (reached, reload) = backend.apply(&room, reply, from, reloaded_to.as_deref());
                if reloaded_to
                    .as_deref()
                    .is_some_and(|to| id_key(&reached.id) >= id_key(to))
                {
                    reloaded_to = None;
                }
                at = Some(reached);
                if let Some(why) = reload {
                    match (backend.load_snapshot(&room).await, why) {
                        (Ok(Some(snap)), Reload::Gap) => at = Some(snap),
                        (Ok(Some(snap)), Reload::Line) => reloaded_to = Some(snap.id),
                        // No room, or Redis away: start over.
                        _ => at = None,
                    }
                }
            }
        }
        if let Some(position) = &at
            && reported.elapsed() >= REPORT
        {
            backend.report(&room, position).await;
            reported = Instant::now();
        }
    }
}

/// Wait before trying again, unless stopped.
async fn pause(stop: &tokio_util::sync::CancellationToken, backoff: Duration) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(backoff) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_order_as_numbers() {
        assert!(id_key("1700000000000-10") > id_key("1700000000000-9"));
        assert!(id_key("1700000000001-0") > id_key("1700000000000-99"));
        assert_eq!(id_key("0-0"), (0, 0));
    }
}
