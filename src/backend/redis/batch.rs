//! Status reads in batches. Every waiting stream reads its ticket's status
//! when the room view changes, so one change on an instance holding 12,500
//! streams meant 12,500 EVALSHA round trips queued on one connection at
//! once: Redis spent its time on per-call overhead, the queue outgrew the
//! response timeout, and streams failed with 503 while opening. Reads that
//! arrive while a batch is in flight now wait for the next one and go to
//! Redis together, as one `status` script call (`status.lua`); an idle instance still
//! sends a lone read at once.
//!
//! A read for a ticket whose signal just fired (an admission by hand-off)
//! jumps the queue, so it is not held behind a broadcast's reads: one
//! already queued when the signal arrives is moved to the front, and one
//! made after it goes to the front.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::BackendError;
use super::reply::Facts;
use crate::engine::RoomId;

/// Tickets per script call: large enough that a broadcast's reads take a
/// few calls, small enough that one call keeps Redis busy for only a few
/// milliseconds (a hand-off's read waits for at most the call in flight).
pub const MAX_BATCH: usize = 256;

/// Reads of one room, with or without counting as activity.
pub type Key = (RoomId, bool);

/// A read's answer: the ticket's facts and the room's count of waiting
/// tickets.
pub type Answer = Result<(Facts, u64), BackendError>;

pub struct Pending {
    pub epoch: u64,
    pub id: u64,
    pub reply: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Pending>,
    flushing: bool,
}

#[derive(Default)]
pub struct StatusBatches {
    queues: Mutex<HashMap<Key, Queue>>,
}

impl StatusBatches {
    /// Queue a read; `true` when nobody is flushing this key, so the
    /// caller must start a flusher.
    pub fn push(&self, key: &Key, read: Pending, urgent: bool) -> bool {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let q = queues.entry(key.clone()).or_default();
        if urgent {
            q.waiting.push_front(read);
        } else {
            q.waiting.push_back(read);
        }
        !std::mem::replace(&mut q.flushing, true)
    }

    /// Move a queued read of this ticket to the front; `false` when none
    /// is queued (it may be in flight, or not made yet).
    pub fn promote(&self, room: &RoomId, epoch: u64, id: u64) -> bool {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let mut promoted = false;
        for touch in [true, false] {
            let Some(q) = queues.get_mut(&(room.clone(), touch)) else {
                continue;
            };
            if let Some(at) = q
                .waiting
                .iter()
                .position(|p| p.epoch == epoch && p.id == id)
                && let Some(read) = q.waiting.remove(at)
            {
                q.waiting.push_front(read);
                promoted = true;
            }
        }
        promoted
    }

    /// The next batch for the flusher of `key`, or `None` when the queue is
    /// empty (the flusher then stops, and the next read starts another).
    pub fn take(&self, key: &Key) -> Option<Vec<Pending>> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let q = queues.get_mut(key)?;
        // Readers that gave up (their stream closed) need no answer.
        q.waiting.retain(|p| !p.reply.is_closed());
        if q.waiting.is_empty() {
            queues.remove(key);
            return None;
        }
        let n = q.waiting.len().min(MAX_BATCH);
        Some(q.waiting.drain(..n).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(id: u64) -> (Pending, oneshot::Receiver<Answer>) {
        let (reply, rx) = oneshot::channel();
        (
            Pending {
                epoch: 1,
                id,
                reply,
            },
            rx,
        )
    }

    #[test]
    fn one_flusher_per_key_in_batches_urgent_first() {
        let b = StatusBatches::default();
        let key = (RoomId::new("r").unwrap(), true);
        let other = (RoomId::new("r").unwrap(), false);
        let mut keep = Vec::new();
        for id in 0..(MAX_BATCH as u64 + 10) {
            let (p, rx) = read(id);
            keep.push(rx);
            // Only the first read starts a flusher.
            assert_eq!(b.push(&key, p, false), id == 0);
        }
        let (p, rx) = read(999);
        keep.push(rx);
        assert!(!b.push(&key, p, true));
        let (p, _gone) = read(5);
        assert!(b.push(&other, p, false), "another key has its own flusher");
        let first = b.take(&key).unwrap();
        assert_eq!(first.len(), MAX_BATCH);
        assert_eq!(first[0].id, 999, "the urgent read goes first");
        assert_eq!(b.take(&key).unwrap().len(), 11);
        assert!(b.take(&key).is_none());
        // The queue stopped: the next read starts a flusher again.
        let (p, _rx) = read(1);
        assert!(b.push(&key, p, false));
        // A read already queued when its ticket's signal fires moves up.
        let mut keep = Vec::new();
        for id in 2..6 {
            let (p, rx) = read(id);
            keep.push(rx);
            b.push(&key, p, false);
        }
        assert!(b.promote(&key.0, 1, 4));
        assert!(!b.promote(&key.0, 1, 99));
        assert!(!b.promote(&key.0, 2, 3), "another epoch's ticket");
        let ids: Vec<u64> = b.take(&key).unwrap().iter().map(|p| p.id).collect();
        assert_eq!(ids, vec![4, 1, 2, 3, 5]);
        // Abandoned reads are dropped, not sent.
        drop(_gone);
        assert!(b.take(&other).is_none());
    }
}
