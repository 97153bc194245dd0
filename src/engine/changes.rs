//! When a room's streams look again: a counter that moves whenever what
//! they show may have changed, coalesced so that a burst of changes costs
//! one look.
//!
//! A departure that moves people forward (a leave, an abandonment, a pop)
//! is [`Changes::mark`]ed; the coalescer ([`Changes::coalesce`], one task
//! per room) moves the counter [`COALESCE`] after the first mark, so every
//! mark inside that window shares one wave of the room's streams, and a
//! leave reaches everyone behind it within tens of milliseconds instead of
//! at the worker's next tick. While the line keeps moving, its waves come
//! at most every [`WAVE_GAP`]: a stream shows at most one position a second
//! anyway, and each wave wakes every stream of the room. A change that must
//! show at once (a published room view) is [`Changes::bump`]ed. Streams follow the counter with
//! [`Changes::subscribe`] and recount their positions from the room's
//! position index when it moves; the counter's value means nothing else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

/// How long the first position change waits for others to share its wave.
/// Short next to what a visitor notices (and to the one-second cadence of a
/// stream's position events), long next to a burst of hand-offs.
pub(crate) const COALESCE: Duration = Duration::from_millis(20);

/// The least time between two coalesced moves.
pub(crate) const WAVE_GAP: Duration = Duration::from_millis(250);

/// The change counter of one room (or of one instance's replica of it).
#[derive(Debug)]
pub(crate) struct Changes {
    tx: watch::Sender<u64>,
    dirty: AtomicBool,
    wake: Notify,
}

impl Default for Changes {
    fn default() -> Self {
        Self {
            tx: watch::Sender::new(0),
            dirty: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }
}

impl Changes {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Follow the counter.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// Positions moved: the coalescer moves the counter within [`COALESCE`].
    /// Cheap enough for every pop and departure: one atomic swap, and a
    /// wake only for the first mark of a window.
    pub(crate) fn mark(&self) {
        if !self.dirty.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// Move the counter now (any pending mark rides along).
    pub(crate) fn bump(&self) {
        self.dirty.store(false, Ordering::Release);
        self.tx.send_modify(|v| *v += 1);
    }

    /// The coalescer: forever, wait for a mark, let the window pass, move
    /// the counter. Run it as a task for as long as the room lives.
    pub(crate) async fn coalesce(&self) {
        let mut last: Option<tokio::time::Instant> = None;
        loop {
            self.wake.notified().await;
            let now = tokio::time::Instant::now();
            let gap_ends = last.map_or(now, |at| at + WAVE_GAP);
            tokio::time::sleep_until(gap_ends.max(now + COALESCE)).await;
            if self.dirty.swap(false, Ordering::AcqRel) {
                self.tx.send_modify(|v| *v += 1);
                last = Some(tokio::time::Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn marks_in_one_window_share_one_move() {
        let changes = std::sync::Arc::new(Changes::new());
        let mut rx = changes.subscribe();
        let runner = changes.clone();
        tokio::spawn(async move { runner.coalesce().await });
        tokio::task::yield_now().await;
        changes.mark();
        changes.mark();
        tokio::time::sleep(COALESCE / 2).await;
        changes.mark();
        assert!(!rx.has_changed().unwrap());
        tokio::time::sleep(COALESCE).await;
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 1);
        // Nothing more was marked: the counter stays.
        tokio::time::sleep(COALESCE * 3).await;
        assert!(!rx.has_changed().unwrap());
        // A bump moves it at once and takes a pending mark with it.
        changes.mark();
        changes.bump();
        assert_eq!(*rx.borrow_and_update(), 2);
        tokio::time::sleep(WAVE_GAP).await;
        assert!(!rx.has_changed().unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_that_keeps_moving_moves_the_counter_at_most_every_gap() {
        let changes = std::sync::Arc::new(Changes::new());
        let mut rx = changes.subscribe();
        let runner = changes.clone();
        tokio::spawn(async move { runner.coalesce().await });
        tokio::task::yield_now().await;
        let start = tokio::time::Instant::now();
        let mut moves = Vec::new();
        // A departure every 10 ms for a second.
        for _ in 0..100 {
            changes.mark();
            tokio::time::sleep(Duration::from_millis(10)).await;
            if rx.has_changed().unwrap() {
                rx.borrow_and_update();
                moves.push(start.elapsed());
            }
        }
        // The first within the window; the rest a gap apart at least.
        assert!(
            moves[0] <= COALESCE + Duration::from_millis(10),
            "{moves:?}"
        );
        assert!(
            moves.windows(2).all(|w| w[1] - w[0] >= WAVE_GAP),
            "{moves:?}"
        );
        assert!((4..=5).contains(&moves.len()), "{moves:?}");
    }
}
