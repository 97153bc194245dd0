//! Positions from the room's feed, on both backends: what a stream counts
//! from its instance's feed (the embedded engine's own index; on Redis the
//! instance's replica, fed by the room's change log) equals the store's
//! direct count (the engine's own count; Redis' rank in the queue) after a
//! random life of joins, leaves, hand-offs, revocations, abandonments,
//! capacity changes, ticks, and a lottery or first-come opening.
//!
//! On Redis the feed is read on a second instance that makes none of the
//! changes itself, so everything it knows came through the log.
//! `NARABU_FEED_SEED` replays a failing life.

use std::sync::Arc;
use std::time::Duration;

use narabu::backend::feed::Tracker;
use narabu::backend::{Backend, JoinRequest, RoomPatch, TicketRef};
use narabu::engine::{Clock, Order, RoomSettings, TicketState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::rid;
use narabu_testkit::redis_server::{Harness, Kind, T0};
use narabu_testkit::{room, with_lanes};

conformance!(
    feed_counts_equal_direct_counts_through_a_random_life,
    a_departure_reaches_the_feed_without_a_tick,
    an_admission_between_the_read_and_the_wait_still_wakes_the_stream,
);

pub(crate) fn seed() -> u64 {
    std::env::var("NARABU_FEED_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed)
}

/// The rooms a life is lived in: scheduled with a lottery, scheduled first
/// come first served, open from the start, and scheduled with a lottery and
/// two priority lanes.
pub(crate) fn rooms() -> Vec<RoomSettings> {
    let mut lottery = room("lottery", 3);
    lottery.opens_at = Some(T0 + 60_000);
    lottery.order = Order::Lottery;
    let mut fifo = room("fifo", 2);
    fifo.opens_at = Some(T0 + 60_000);
    fifo.order = Order::Fifo;
    let mut lanes = with_lanes(
        room("lanes", 3),
        &[("members", 1), ("general", 2)],
        "general",
    );
    lanes.opens_at = Some(T0 + 60_000);
    lanes.order = Order::Lottery;
    vec![lottery, fifo, room("open", 2), lanes]
}

/// The rooms of [`rooms`] by name, with how many lanes each has.
pub(crate) const ROOMS: [(&str, u8); 4] = [("lottery", 1), ("fifo", 1), ("open", 1), ("lanes", 2)];

/// A random life of one room, driven through one instance.
pub(crate) struct Life {
    pub room: &'static str,
    pub tickets: Vec<TicketRef>,
    /// Tickets that joined before the opening (their place comes from it).
    pub early: std::collections::HashSet<u64>,
    /// Joins pick one of this many lanes at random.
    lanes: u8,
    rng: StdRng,
}

impl Life {
    pub fn new(room: &'static str, lanes: u8, seed: u64) -> Self {
        Self {
            room,
            tickets: Vec::new(),
            early: std::collections::HashSet::new(),
            lanes,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn pick(&mut self) -> Option<TicketRef> {
        if self.tickets.is_empty() {
            return None;
        }
        Some(self.tickets[self.rng.random_range(0..self.tickets.len())])
    }

    /// One random step. Some steps only make sense in some states; a
    /// departure of a ticket already gone frees nothing, as in life.
    pub async fn step(&mut self, b: &Arc<dyn Backend>, h: &Harness) {
        let r = rid(self.room);
        match self.rng.random_range(0..100) {
            0..35 => {
                for _ in 0..self.rng.random_range(1..4) {
                    let lane = if self.lanes > 1 {
                        self.rng.random_range(0..self.lanes)
                    } else {
                        0
                    };
                    let j = b.join(&r, JoinRequest::in_lane(lane)).await.unwrap();
                    if j.status.number.is_none() {
                        self.early.insert(j.ticket.id);
                    }
                    self.tickets.push(j.ticket);
                }
            }
            35..50 => {
                if let Some(t) = self.pick() {
                    b.leave(&r, t).await.unwrap();
                }
            }
            50..55 => {
                if let Some(t) = self.pick() {
                    b.revoke(&r, t).await.unwrap();
                }
            }
            55..62 => {
                if let Some(t) = self.pick() {
                    let _ = b.release(&r, t).await.unwrap();
                }
            }
            62..80 => {
                b.tick(&r).await.unwrap();
            }
            80..86 => {
                let capacity = self.rng.random_range(1..6);
                b.patch_room(
                    &r,
                    RoomPatch {
                        capacity: Some(capacity),
                        ..RoomPatch::default()
                    },
                )
                .await
                .unwrap();
            }
            86..92 => {
                // Time passes: some are seen, the rest go quiet, and the
                // next tick (or pop) abandons them; passes lapse too.
                h.clock.advance(Duration::from_secs(4 * 60));
                for _ in 0..self.tickets.len() / 2 {
                    if let Some(t) = self.pick() {
                        let _ = b.status(&r, t, true).await;
                    }
                }
                h.clock.advance(Duration::from_secs(61));
            }
            _ => {
                // Past a scheduled opening: the next tick opens the room.
                h.clock.advance(Duration::from_secs(20));
            }
        }
    }
}

/// Every waiting ticket's count ahead, as `feed_on` counts it from its
/// feed, equals the store's direct count; drawn tickets are placed where
/// the store placed them. On Redis the feed follows the log a moment
/// behind: it may take until `within` to agree. Once an away ticket has
/// come back ahead of the line, the store shows those behind it no more
/// than it showed them before (positions never go up) while the feed
/// counts the returner: the feed's count may then be the larger.
pub(crate) async fn counts_agree(h: &Harness, feed_on: &Arc<dyn Backend>, life: &Life) {
    let r = rid(life.room);
    let feed = feed_on.feed(&r).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let returns = h.backend.room(&r).await.unwrap().stats.returns;
    loop {
        let mut wrong = Vec::new();
        let mut waiting = 0;
        for &t in &life.tickets {
            let s = h.backend.status(&r, t, false).await.unwrap();
            if s.state != TicketState::Waiting {
                continue;
            }
            let Some(number) = s.number else {
                // In the pre-queue: nowhere in line yet, on the feed too.
                if feed.placement(t.id).is_some() {
                    wrong.push(format!("ticket {} placed before the opening", t.id));
                }
                continue;
            };
            waiting += 1;
            // The feed places every ticket of a room with one line (its id
            // tells its place) and the drawn ones of a room with lanes; a
            // later joiner there brings its place in its own read.
            let placed = feed.placement(t.id).map(|p| p.qi + 1);
            let placed_right = match placed {
                None => life.lanes > 1 && !life.early.contains(&t.id),
                Some(p) => p == number,
            };
            let counted = feed.ahead(s.lane, number - 1);
            let agrees = match (counted, s.ahead) {
                (Some(c), Some(a)) if returns > 0 => c >= a,
                (c, a) => c == a,
            };
            if !placed_right || !agrees {
                wrong.push(format!(
                    "ticket {}: number {number}, ahead {:?}; the feed places it at {placed:?} with {counted:?} ahead",
                    t.id, s.ahead
                ));
            }
        }
        if wrong.is_empty() {
            // And a stream, starting from its ticket's read, shows the
            // store's position (once its instance has followed the log as
            // far, like the feed above).
            let mut stream_agrees = true;
            if let Some(&t) = life.tickets.iter().rev().find(|_| waiting > 0) {
                let s = h.backend.status(&r, t, false).await.unwrap();
                if s.state == TicketState::Waiting && s.number.is_some() {
                    let follow = feed_on.follow(&r, t).await.unwrap();
                    let mut tracker = Tracker::new(follow.ticket);
                    let shown = tracker.status(&*follow.feed, h.clock.now_ms());
                    // The follower's replica may not have read the draw
                    // that numbered the ticket yet: its number, like its
                    // count, may lag until the deadline.
                    stream_agrees = shown.number == s.number && shown.position == s.position;
                    assert!(
                        stream_agrees || tokio::time::Instant::now() < deadline,
                        "a stream's first number and count: {:?} {:?}, the store's: {:?} {:?}",
                        shown.number,
                        shown.position,
                        s.number,
                        s.position
                    );
                }
            }
            if stream_agrees {
                return;
            }
        }
        assert!(
            wrong.is_empty() || tokio::time::Instant::now() < deadline,
            "room {}, seed {}: the feed disagrees with the store:\n{}",
            life.room,
            seed(),
            wrong.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn feed_counts_equal_direct_counts_through_a_random_life(kind: Kind) {
    let h = Harness::instances(kind, rooms(), 2).await;
    let (driver, follower) = (h.backends[0].clone(), h.backends[1].clone());
    for (i, (name, lanes)) in ROOMS.into_iter().enumerate() {
        let mut life = Life::new(name, lanes, seed() + i as u64);
        // The follower watches from the start: everything it counts came
        // through the feed.
        follower.feed(&rid(name)).await.unwrap();
        for step in 0..60 {
            life.step(&driver, &h).await;
            if step % 4 == 3 {
                counts_agree(&h, &follower, &life).await;
            }
        }
        // Run the line down to its end: every count reaches zero.
        driver
            .patch_room(
                &rid(name),
                RoomPatch {
                    capacity: Some(1000),
                    ..RoomPatch::default()
                },
            )
            .await
            .unwrap();
        h.clock.advance(Duration::from_secs(120));
        driver.tick(&rid(name)).await.unwrap();
        counts_agree(&h, &follower, &life).await;
    }
}

/// A leave in the middle of the line moves everyone behind it on the feed
/// at once, without waiting for a tick (the worker is off here).
async fn a_departure_reaches_the_feed_without_a_tick(kind: Kind) {
    let h = Harness::instances(kind, vec![room("r", 1)], 2).await;
    let (driver, follower) = (h.backends[0].clone(), h.backends[1].clone());
    let mut tickets = Vec::new();
    for _ in 0..5 {
        let j = driver
            .join(&rid("r"), JoinRequest::anonymous())
            .await
            .unwrap();
        tickets.push(j.ticket);
    }
    let feed = follower.feed(&rid("r")).await.unwrap();
    let mut changes = feed.changes();
    changes.borrow_and_update();
    assert_eq!(feed.ahead(0, 4), Some(4));
    driver.leave(&rid("r"), tickets[1]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while feed.ahead(0, 4) != Some(3) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the leave moved the line on the feed");
    assert_eq!(feed.ahead(0, 2), Some(1));
    // And the streams were cued to count again (within the coalescing
    // window, not at a tick: there is none).
    tokio::time::timeout(Duration::from_secs(5), changes.changed())
        .await
        .expect("the feed's change counter moved")
        .unwrap();
}

/// A stream reads its ticket when it opens and only later waits on the
/// ticket's signal; an admission that lands in between must still wake it
/// (a signal keeps no permit for whoever was not waiting yet, so the wait
/// is armed before the read). Otherwise the visitor is admitted and never
/// told.
async fn an_admission_between_the_read_and_the_wait_still_wakes_the_stream(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let first = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
    let second = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
    b.tick(&rid("r")).await.unwrap();
    let follow = b.follow(&rid("r"), second.ticket).await.unwrap();
    assert_eq!(follow.ticket.facts.state, TicketState::Waiting);
    // The hand-off lands after the read, before anyone waits.
    b.release(&rid("r"), first.ticket).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), follow.armed)
        .await
        .expect("the admission woke the stream that read its ticket before it");
    let read = b.read_ticket(&rid("r"), second.ticket).await.unwrap();
    assert_eq!(read.facts.state, TicketState::Admitted);
}
