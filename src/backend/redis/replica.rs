//! This instance's replica of one incarnation of a room: the latest view
//! and each lane's position index, kept by the room's follower
//! (`follower.rs`) from the change log, read by the streams as their feed.
//!
//! It starts from a snapshot ([`Line`]: each lane's head, departed bitmap
//! and back set, the view) and applies the log's events after it, so that
//! the count ahead of any queue slot of any lane here equals the rank Redis
//! would give. A reload (after a gap, or at the opening) builds new indices
//! and swaps them in whole, so a stream never counts from a half-built one.
//!
//! In a room with lanes a ticket's id no longer tells its queue index (each
//! lane numbers its own tickets), so the replica also keeps every ticket's
//! lane and queue index ([`Places`]): from the snapshot's one byte per
//! ticket and the draw, then from the log's join events.

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

/// One lane's line in a snapshot, less its departed bitmap.
#[derive(Clone, Debug, Deserialize)]
pub struct LaneLine {
    pub head: u64,
    /// The queue index of the bitmap's first bit.
    pub from: u64,
    #[serde(deserialize_with = "list")]
    pub back: Vec<u64>,
}

impl LaneLine {
    /// The index this lane's line describes, with `bits` the departed
    /// bitmap from `from` on (Redis numbers a bitmap's bits from the top of
    /// each byte).
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
}

/// A snapshot of the line (`snapshot.lua`), less its bitmaps.
#[derive(Clone, Debug, Deserialize)]
pub struct Line {
    pub epoch: String,
    pub open: bool,
    pub order: String,
    pub seed: String,
    pub drawn: u64,
    /// How many tickets the opening placed (every one issued before it).
    #[serde(default)]
    pub placed: u64,
    pub view: String,
    pub version: u64,
    /// Lane by lane; one for a room without lanes.
    pub lanes: Vec<LaneLine>,
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

    /// Each lane's index, from its departed bitmap; a lane whose bitmap is
    /// missing counts none departed.
    fn indices(&self, bitmaps: &[Vec<u8>]) -> Arc<[LaneIndex]> {
        let mut lanes: Vec<LaneIndex> = self
            .lanes
            .iter()
            .enumerate()
            .map(|(l, lane)| lane.index(bitmaps.get(l).map_or(&[][..], Vec::as_slice)))
            .collect();
        if lanes.is_empty() {
            lanes.push(LaneIndex::new());
        }
        lanes.into()
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

    /// Where each pre-queue ticket of an open room with lanes stands, from
    /// `lanes` (each pre-queue ticket's lane, one byte per id) and `drawn`
    /// (as [`Self::draw`] gives it): the opening placed the pre-queue lane
    /// by lane in drawn order. A ticket that joined later is not placed
    /// here: its own read gives its index. `None` for a room with one line,
    /// where a ticket's id tells its place.
    fn places(&self, lanes: &[u8], drawn: Option<&[u32]>) -> Option<Places> {
        if self.lanes.len() <= 1 || !self.open {
            return None;
        }
        let placed = usize::try_from(self.placed).ok()?.min(lanes.len());
        let mut order: Vec<u32> = (0..placed as u32).collect();
        if let Some(drawn) = drawn {
            for (id, &qi) in drawn.iter().enumerate() {
                if let Some(slot) = order.get_mut(qi as usize) {
                    *slot = id as u32;
                }
            }
        }
        let ids = order
            .into_iter()
            .chain(placed as u32..u32::try_from(lanes.len()).ok()?);
        let mut places = Places {
            lane: lanes.to_vec(),
            qi: vec![Places::UNKNOWN; lanes.len()],
        };
        let mut next = vec![0u32; self.lanes.len()];
        for id in ids {
            let lane = usize::from(lanes[id as usize]);
            if let Some(n) = next.get_mut(lane) {
                places.qi[id as usize] = *n;
                *n += 1;
            }
        }
        Some(places)
    }
}

/// Every ticket's lane and queue index in a room with lanes, by ticket id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Places {
    lane: Vec<u8>,
    qi: Vec<u32>,
}

impl Places {
    /// The queue index of a ticket not placed.
    const UNKNOWN: u32 = u32::MAX;

    fn of(&self, id: u64) -> Option<(u8, u32)> {
        let i = usize::try_from(id).ok()?;
        let qi = *self.qi.get(i)?;
        (qi != Self::UNKNOWN).then(|| (self.lane[i], qi))
    }
}

pub struct Replica {
    pub epoch: u64,
    view: RwLock<RoomView>,
    lanes: RwLock<Arc<[LaneIndex]>>,
    drawn: RwLock<Option<Arc<[u32]>>>,
    /// `None` for a room with one line.
    places: RwLock<Option<Places>>,
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
    /// A replica from a snapshot (`lanes`: each ticket's lane, one byte
    /// per id; `bitmaps`: each lane's departed bitmap), with its coalescer
    /// running until it is retired.
    pub fn start(epoch: u64, line: &Line, lanes: &[u8], bitmaps: &[Vec<u8>]) -> Arc<Self> {
        let drawn = line.draw();
        let places = line.places(lanes, drawn.as_deref());
        let replica = Arc::new(Self {
            epoch,
            view: RwLock::new(line.room_view()),
            lanes: RwLock::new(line.indices(bitmaps)),
            drawn: RwLock::new(drawn),
            places: RwLock::new(places),
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
    pub fn reload(&self, line: &Line, lanes: &[u8], bitmaps: &[Vec<u8>]) {
        *write(&self.lanes) = line.indices(bitmaps);
        let keep = read(&self.drawn).is_some();
        if !keep {
            *write(&self.drawn) = line.draw();
        }
        let drawn = read(&self.drawn).clone();
        *write(&self.places) = line.places(lanes, drawn.as_deref());
        self.set_view(line.room_view());
        self.changes.bump();
    }

    /// Apply one event; `true` when positions moved.
    pub fn apply(&self, event: &Event) -> bool {
        let lanes = read(&self.lanes).clone();
        let index = |lane: u8| lanes.get(usize::from(lane));
        match *event {
            Event::Pop { lane, qi, .. } => match index(lane) {
                Some(index) => index.popped(qi),
                None => return false,
            },
            Event::Dep {
                lane, qi: Some(qi), ..
            } => match index(lane) {
                Some(index) => index.departed(qi),
                None => return false,
            },
            Event::Back { lane, qi, .. } => match index(lane) {
                Some(index) => index.go_back(qi),
                None => return false,
            },
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
        let lanes = read(&self.lanes).clone();
        lanes.get(usize::from(lane))?.ahead(u32::try_from(qi).ok()?)
    }

    fn placement(&self, ticket: u64) -> Option<Placement> {
        if !read(&self.view).open {
            return None;
        }
        if let Some(places) = read(&self.places).as_ref() {
            let (lane, qi) = places.of(ticket)?;
            let qi = u64::from(qi);
            return Some(Placement {
                qi,
                initial_ahead: self.ahead(lane, qi).unwrap_or(0),
            });
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
            placed: 0,
            view: String::new(),
            version: 3,
            lanes: vec![LaneLine {
                head,
                from,
                back: vec![2],
            }],
            id: "0-0".into(),
            seq: 0,
        }
    }

    #[test]
    fn the_bitmap_reads_top_bit_first() {
        // Head 10, bitmap from 8: slots 8 (below the head) and 11, 17 departed.
        let bits = [0b1001_0000, 0b0100_0000];
        let index = line(10, 8).lanes[0].index(&bits);
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

    #[test]
    fn lanes_number_their_own_tickets_in_drawn_order() {
        let seed = LotterySeed([3; 32]);
        // Tickets 0..6 drawn, 6 joined the pre-queue after the draw was
        // read; the pre-queue's lanes are stored, later joins' are not
        // (their own read gives their place).
        let lanes = [0u8, 1, 1, 0, 1, 0, 1];
        let l = Line {
            order: "lottery".into(),
            seed: seed.to_hex(),
            drawn: 6,
            placed: 7,
            lanes: vec![line(0, 0).lanes[0].clone(), line(0, 0).lanes[0].clone()],
            ..line(0, 0)
        };
        let drawn = l.draw();
        let places = l.places(&lanes, drawn.as_deref()).unwrap();
        let mut next = [0u32; 2];
        let order = seed.draw(&(0..6).collect::<Vec<_>>());
        for id in order.into_iter().chain(6..7) {
            let lane = lanes[id as usize];
            assert_eq!(
                places.of(u64::from(id)),
                Some((lane, next[usize::from(lane)]))
            );
            next[usize::from(lane)] += 1;
        }
        assert_eq!(next, [3, 4]);
        assert_eq!(places.of(7), None);
        // One line: a ticket's id tells its place.
        assert!(line(0, 0).places(&lanes, None).is_none());
    }
}
