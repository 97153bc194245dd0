//! Writes that arrive at an instance which does not own the room travel to
//! the owner as commands, and the owner's answers travel back, over the
//! store's bus ([`RoomStore::send`], [`RoomStore::replies`]).
//!
//! [`Asker`] is an instance's side. Requests are gathered as group commit
//! gathers records: one task sends everything queued in one round trip per
//! room, and while a send is in flight the next requests queue behind it;
//! a lone request at a quiet moment goes at once, without waiting for
//! company. One task reads every reply addressed to the instance, many at
//! a time, and hands each to the request waiting for its id. A request not
//! answered in time fails as retryable: the command carries its id, so the
//! owner that finally sees it applies it once whatever the caller does.
//!
//! [`serve`] is the owner's side: it reads the room's commands in batches,
//! hands a whole batch to the engine's handler and sends the replies back
//! in one round trip. An answer the asker can read elsewhere (the room's
//! log carries each applied command's answer, and every instance follows
//! the log) need not travel at all: the handler says which do, and the
//! asker is handed the others with [`Asker::deliver`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::store::{Command, LogPos, Reply, RoomStore, StoreError};
use crate::engine::RoomId;

/// How long one read of the bus waits for something to arrive: under any
/// connection's response timeout.
const WAIT: Duration = Duration::from_millis(500);
/// At most this many slices of commands or replies in one read.
const BATCH: usize = 1_000;
/// The owner drops the commands it has read at most this often: a trim is
/// a round trip, and what it drops is only space (a command read again
/// after an owner change is answered from the log, not applied again).
const TRIM_EVERY: Duration = Duration::from_millis(250);

/// Why a command got no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// No answer in time (the owner is changing, or slow): the command may
    /// still be applied, once; ask again with the same id.
    #[error("the room's owner did not answer in time")]
    TimedOut,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// An instance's side of the bus.
pub struct Asker {
    store: Arc<dyn RoomStore>,
    instance: String,
    waiting: DashMap<u128, oneshot::Sender<Vec<u8>>>,
    queued: Mutex<HashMap<RoomId, Vec<Command>>>,
    wake: Arc<Notify>,
    sends: AtomicU64,
}

impl Asker {
    /// Start sending and reading replies for `instance` until `stop`.
    pub fn start(
        store: Arc<dyn RoomStore>,
        instance: String,
        stop: CancellationToken,
    ) -> Arc<Self> {
        let asker = Arc::new(Self {
            store,
            instance,
            waiting: DashMap::new(),
            queued: Mutex::new(HashMap::new()),
            wake: Arc::new(Notify::new()),
            sends: AtomicU64::new(0),
        });
        tokio::spawn(send_queued(
            Arc::downgrade(&asker),
            asker.wake.clone(),
            stop.clone(),
        ));
        tokio::spawn(read_replies(Arc::downgrade(&asker), stop));
        asker
    }

    /// A fresh command id: random, so ids of different instances and
    /// restarts never meet.
    pub fn new_id() -> u128 {
        rand::random()
    }

    /// Send a command to the room's owner and wait up to `within` for its
    /// answer. `id` is the command's identity: asking again with the same
    /// id after [`AskError::TimedOut`] never applies it twice.
    pub async fn ask(
        &self,
        room: &RoomId,
        id: u128,
        body: Vec<u8>,
        within: Duration,
    ) -> Result<Vec<u8>, AskError> {
        let (tx, rx) = oneshot::channel();
        self.waiting.insert(id, tx);
        self.queued
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(room.clone())
            .or_default()
            .push(Command {
                id,
                from: self.instance.clone(),
                body,
            });
        self.wake.notify_one();
        let answer = tokio::time::timeout(within, rx).await;
        self.waiting.remove(&id);
        match answer {
            Ok(Ok(body)) => Ok(body),
            _ => Err(AskError::TimedOut),
        }
    }

    /// Whether a command with this id waits for its answer here.
    pub(crate) fn is_waiting(&self, id: u128) -> bool {
        self.waiting.contains_key(&id)
    }

    /// Hand a waiting command its answer, found other than on the bus.
    pub(crate) fn deliver(&self, id: u128, answer: Vec<u8>) {
        if let Some((_, tx)) = self.waiting.remove(&id) {
            let _ = tx.send(answer);
        }
    }

    /// Round trips made to send commands so far (each carries every command
    /// queued for one room when it left).
    pub fn sends(&self) -> u64 {
        self.sends.load(Ordering::Relaxed)
    }
}

async fn send_queued(asker: Weak<Asker>, wake: Arc<Notify>, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
        }
        let Some(a) = asker.upgrade() else { return };
        let queued = std::mem::take(
            &mut *a
                .queued
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for (room, commands) in queued {
            a.sends.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = a.store.send(&room, &commands).await {
                // The askers time out and may ask again with the same ids.
                tracing::debug!(room = %room, error = %e, "commands not sent");
            }
        }
    }
}

async fn read_replies(asker: Weak<Asker>, stop: CancellationToken) {
    // Replies left from an earlier run of this instance name match no
    // waiting id and are passed over; starting at the stream's start
    // rather than "now" does not depend on this host's clock agreeing
    // with Redis's, which numbers the entries.
    let mut after = LogPos::START;
    loop {
        let Some(a) = asker.upgrade() else { return };
        let (store, instance) = (a.store.clone(), a.instance.clone());
        drop(a);
        let from = after;
        let read = tokio::select! {
            () = stop.cancelled() => return,
            r = store.replies(&instance, from, BATCH, WAIT) => r,
        };
        let Some(a) = asker.upgrade() else { return };
        match read {
            Ok(replies) => {
                for (pos, reply) in replies {
                    after = pos;
                    if let Some((_, tx)) = a.waiting.remove(&reply.id) {
                        let _ = tx.send(reply.body);
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "replies not read");
                drop(a);
                tokio::time::sleep(WAIT).await;
            }
        }
    }
}

/// The owner's side: read the room's commands in batches, answer each
/// batch with `handle` (which returns, for each command in order, the
/// reply to send, or `None` when the asker learns the answer otherwise),
/// and send the replies back, until `stop`.
pub async fn serve<F, Fut>(
    store: Arc<dyn RoomStore>,
    room: RoomId,
    stop: CancellationToken,
    mut handle: F,
) where
    F: FnMut(Vec<Command>) -> Fut,
    Fut: Future<Output = Vec<Option<Vec<u8>>>>,
{
    let mut after = LogPos::START;
    let mut trimmed = tokio::time::Instant::now();
    loop {
        let read = tokio::select! {
            () = stop.cancelled() => return,
            r = store.receive(&room, after, BATCH, WAIT) => r,
        };
        let commands = match read {
            Ok(c) if c.is_empty() => continue,
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(room = %room, error = %e, "commands not read");
                tokio::time::sleep(WAIT).await;
                continue;
            }
        };
        let last = commands.last().map_or(after, |(pos, _)| *pos);
        let senders: Vec<(String, u128)> = commands
            .iter()
            .map(|(_, c)| (c.from.clone(), c.id))
            .collect();
        let bodies = handle(commands.into_iter().map(|(_, c)| c).collect()).await;
        let replies: Vec<Reply> = senders
            .into_iter()
            .zip(bodies)
            .filter_map(|((to, id), body)| {
                Some(Reply {
                    to,
                    id,
                    body: body?,
                })
            })
            .collect();
        if !replies.is_empty()
            && let Err(e) = store.reply(&replies).await
        {
            tracing::debug!(room = %room, error = %e, "replies not sent");
        }
        after = last;
        if trimmed.elapsed() >= TRIM_EVERY {
            trimmed = tokio::time::Instant::now();
            if let Err(e) = store.consumed(&room, last).await {
                tracing::debug!(room = %room, error = %e, "commands not trimmed");
            }
        }
    }
}
