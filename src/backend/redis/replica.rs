//! This instance's replica of one incarnation of a room: the latest view
//! and the main lane's position index, kept by the room's follower
//! (`follower.rs`) from the change log, read by the streams as their feed.
//!
//! It starts from a snapshot ([`Line`]: the head, the departed bitmap, the
//! back set, the view) and applies the log's events after it, so that the
//! count ahead of any queue slot here equals the rank Redis would give.
//! A reload (after a gap, or at the opening) builds a new index and swaps
//! it in whole, so a stream never counts from a half-built one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::log::Event;
use super::reply::list;
use crate::backend::feed::{Placement, RoomFeed};
use crate::engine::rules::RoomFacts;
use crate::engine::{Changes, LaneIndex, LotterySeed, RoomView};
use crate::sync::{read, write};

/// A snapshot of the line (`snapshot.lua`), less its departed bitmap.
#[derive(Clone, Debug, Deserialize)]
pub struct Line {
    pub epoch: String,
    pub open: bool,
    pub order: String,
    pub seed: String,
    pub drawn: u64,
    pub view: String,
    pub version: u64,
    pub head: u64,
    /// The queue index of the bitmap's first bit.
    pub from: u64,
    #[serde(deserialize_with = "list")]
    pub back: Vec<u64>,
    /// The log entry the snapshot reflects, and its seq.
    pub id: String,
    pub seq: u64,
}

impl Line {
    pub fn epoch(&self) -> Option<u64> {
        self.epoch.parse().ok()
    }

    fn room_view(&self) -> RoomView {
        let mut view: RoomView = serde_json::from_str(&self.view).unwrap_or_default();
        view.version = self.version;
        view
    }

    /// The index this line describes, with `bits` the departed bitmap from
    /// `from` on (Redis numbers a bitmap's bits from the top of each byte).
    fn index(&self, bits: &[u8]) -> LaneIndex {
        let head = u32::try_from(self.head).unwrap_or(u32::MAX);
        let from = self.from;
        let departed = bits.iter().enumerate().flat_map(move |(byte, &b)| {
            (0..8u64)
                .filter(move |bit| b & (0x80 >> bit) != 0)
                .map(move |bit| from + byte as u64 * 8 + bit)
        });
        let departed = departed
            .filter_map(|qi| u32::try_from(qi).ok())
            .filter(|&qi| qi >= head);
        let back: Vec<u32> = self
            .back
            .iter()
            .filter_map(|&qi| u32::try_from(qi).ok())
            .collect();
        LaneIndex::restored(head, departed, &back)
    }

    /// Each drawn ticket's queue index, by ticket id: the tickets issued
    /// before the opening are ids `0..drawn`, placed in the order the
    /// published seed gives them. `None` when nothing was drawn (a `fifo`
    /// room, where each ticket's queue index is its id).
    fn draw(&self) -> Option<Arc<[u32]>> {
        if !self.open || self.order != "lottery" || self.drawn == 0 {
            return None;
        }
        let seed: [u8; 32] = hex::decode(&self.seed).ok()?.try_into().ok()?;
        let ids: Vec<u32> = (0..u32::try_from(self.drawn).ok()?).collect();
        let mut qi_of = vec![0u32; ids.len()];
        for (qi, id) in LotterySeed(seed).draw(&ids).into_iter().enumerate() {
            qi_of[id as usize] = qi as u32;
        }
        Some(qi_of.into())
    }
}

pub struct Replica {
    pub epoch: u64,
    view: RwLock<RoomView>,
    lane: RwLock<Arc<LaneIndex>>,
    drawn: RwLock<Option<Arc<[u32]>>>,
    changes: Changes,
    retired: AtomicBool,
    stop: CancellationToken,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl Replica {
    /// A replica from a snapshot, with its coalescer running until it is
    /// retired.
    pub fn start(epoch: u64, line: &Line, bits: &[u8]) -> Arc<Self> {
        let replica = Arc::new(Self {
            epoch,
            view: RwLock::new(line.room_view()),
            lane: RwLock::new(Arc::new(line.index(bits))),
            drawn: RwLock::new(line.draw()),
            changes: Changes::new(),
            retired: AtomicBool::new(false),
            stop: CancellationToken::new(),
        });
        let me = replica.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = me.stop.cancelled() => {}
                () = me.changes.coalesce() => {}
            }
        });
        replica
    }

    /// Start again from a newer snapshot of the same incarnation; streams
    /// look again at once.
    pub fn reload(&self, line: &Line, bits: &[u8]) {
        *write(&self.lane) = Arc::new(line.index(bits));
        let keep = read(&self.drawn).is_some();
        if !keep {
            *write(&self.drawn) = line.draw();
        }
        self.set_view(line.room_view());
        self.changes.bump();
    }

    /// Apply one event; `true` when positions moved.
    pub fn apply(&self, event: &Event) -> bool {
        let lane = read(&self.lane).clone();
        match *event {
            Event::Pop { lane: 0, qi, .. } => lane.popped(qi),
            Event::Dep {
                lane: 0,
                qi: Some(qi),
                ..
            } => lane.departed(qi),
            Event::Back { lane: 0, qi, .. } => lane.go_back(qi),
            _ => return false,
        }
        true
    }

    /// Take a newer view (an older one, as a late message, is ignored);
    /// `true` when taken.
    pub fn set_view(&self, view: RoomView) -> bool {
        let mut current = write(&self.view);
        if view.version >= current.version {
            *current = view;
            true
        } else {
            false
        }
    }

    /// Positions moved: streams look again within the coalescing window.
    pub fn mark(&self) {
        self.changes.mark();
    }

    /// The view changed: streams look again now.
    pub fn bump(&self) {
        self.changes.bump();
    }

    /// The room was replaced (or this instance stops): its streams are told
    /// it closed.
    pub fn retire(&self) {
        if !self.retired.swap(true, Ordering::AcqRel) {
            self.changes.bump();
            self.stop.cancel();
        }
    }
}

impl RoomFeed for Replica {
    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn room_facts(&self) -> RoomFacts {
        let view = read(&self.view);
        let mut facts = view.facts(view.waiting);
        facts.closed |= self.retired.load(Ordering::Acquire);
        facts
    }

    fn ahead(&self, lane: u8, qi: u64) -> Option<u64> {
        if lane != 0 {
            return None;
        }
        read(&self.lane).ahead(u32::try_from(qi).ok()?)
    }

    fn placement(&self, ticket: u64) -> Option<Placement> {
        if !read(&self.view).open {
            return None;
        }
        let qi = match read(&self.drawn).as_deref() {
            Some(drawn) if ticket < drawn.len() as u64 => u64::from(drawn[ticket as usize]),
            _ => ticket,
        };
        Some(Placement {
            qi,
            initial_ahead: self.ahead(0, qi).unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(head: u64, from: u64) -> Line {
        Line {
            epoch: "7".into(),
            open: true,
            order: "fifo".into(),
            seed: String::new(),
            drawn: 0,
            view: String::new(),
            version: 3,
            head,
            from,
            back: vec![2],
            id: "0-0".into(),
            seq: 0,
        }
    }

    #[test]
    fn the_bitmap_reads_top_bit_first() {
        // Head 10, bitmap from 8: slots 8 (below the head) and 11, 17 departed.
        let bits = [0b1001_0000, 0b0100_0000];
        let index = line(10, 8).index(&bits);
        assert_eq!(index.head(), 10);
        // One returner (2) ahead of everyone; 11 departed.
        assert_eq!(index.ahead(10), Some(1));
        assert_eq!(index.ahead(12), Some(2));
        assert_eq!(index.ahead(18), Some(7));
        assert_eq!(index.ahead(2), Some(0));
        assert_eq!(index.ahead(9), None);
    }

    #[test]
    fn a_lottery_opening_is_drawn_again_from_the_seed() {
        let seed = LotterySeed([9; 32]);
        let l = Line {
            order: "lottery".into(),
            seed: seed.to_hex(),
            drawn: 50,
            ..line(0, 0)
        };
        let qi_of = l.draw().unwrap();
        let order = seed.draw(&(0..50).collect::<Vec<_>>());
        for (qi, id) in order.iter().enumerate() {
            assert_eq!(qi_of[*id as usize] as usize, qi);
        }
        assert!(line(0, 0).draw().is_none());
    }
}
