//! Priority lanes, on both backends: each lane is a line of its own
//! (numbers and positions count within it, nobody overtakes in it), the
//! room's permits are shared across lanes by weight, a lane with nobody
//! waiting lends its share and gets it back first, and capacity and
//! conservation hold for the room and per lane, also under many threads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use narabu::backend::{Backend, JoinRequest, StreamsReport, TicketRef};
use narabu::engine::{
    Departure, Handoff, LotterySeed, Order, RoomSettings, TicketState, TicketStatus,
};

use super::{Watch, balanced, rid};
use narabu_testkit::redis_server::{Harness, Kind, T0};
use narabu_testkit::{room, with_lanes};

conformance!(
    lanes_count_their_own_numbers_and_share_permits_by_weight,
    a_lane_with_nobody_waiting_lends_its_share_and_gets_it_back,
    positions_count_within_the_lane,
    the_opening_places_each_lane_in_drawn_order,
    lanes_hold_capacity_and_order_under_many_threads,
    new_weights_steer_the_next_permits,
);

const MEMBERS: u8 = 0;
const GENERAL: u8 = 1;

/// A room with `members` (weight 30) and `general` (70, the default).
pub(crate) fn laned(id: &str, capacity: u32) -> RoomSettings {
    with_lanes(
        room(id, capacity),
        &[("members", 30), ("general", 70)],
        "general",
    )
}

async fn join_in(b: &Arc<dyn Backend>, lane: u8) -> (TicketRef, TicketStatus) {
    let j = b.join(&rid("r"), JoinRequest::in_lane(lane)).await.unwrap();
    assert!(j.is_new);
    (j.ticket, j.status)
}

async fn status(b: &Arc<dyn Backend>, t: TicketRef) -> TicketStatus {
    b.status(&rid("r"), t, false).await.unwrap()
}

/// Each lane's (waiting, admitted) as the room's view shows them.
async fn lane_counts(b: &Arc<dyn Backend>) -> Vec<(u64, u64)> {
    let view = b.room(&rid("r")).await.unwrap().view;
    let names: Vec<&str> = view.lanes.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["members", "general"]);
    view.lanes.iter().map(|l| (l.waiting, l.admitted)).collect()
}

async fn lanes_count_their_own_numbers_and_share_permits_by_weight(kind: Kind) {
    let h = Harness::new(kind, vec![laned("r", 10)]).await;
    let b = &h.backend;
    let mut lanes: [Vec<TicketRef>; 2] = [Vec::new(), Vec::new()];
    for i in 0..20u64 {
        for lane in [MEMBERS, GENERAL] {
            let (t, s) = join_in(b, lane).await;
            assert_eq!(s.lane, lane);
            assert_eq!(s.number, Some(i + 1), "numbers count within the lane");
            assert_eq!(s.position, Some(i + 1));
            lanes[usize::from(lane)].push(t);
        }
    }
    // An out-of-range lane queues in the default lane.
    let (stray, s) = join_in(b, 9).await;
    assert_eq!((s.lane, s.number), (GENERAL, Some(21)));
    b.leave(&rid("r"), stray).await.unwrap();
    assert_eq!(lane_counts(b).await, vec![(20, 0), (20, 0)]);

    let admitted = b.tick(&rid("r")).await.unwrap().admitted;
    assert_eq!(admitted.len(), 10);
    // 30/70 of ten permits, each lane from its head in order.
    for (lane, share) in [(MEMBERS, 3), (GENERAL, 7)] {
        for (i, t) in lanes[usize::from(lane)].iter().enumerate() {
            let s = status(b, *t).await;
            if i < share {
                assert_eq!(s.state, TicketState::Admitted, "lane {lane} ticket {i}");
            } else {
                assert_eq!(s.state, TicketState::Waiting, "lane {lane} ticket {i}");
                assert_eq!(s.position, Some((i - share) as u64 + 1));
            }
        }
    }
    assert_eq!(lane_counts(b).await, vec![(17, 3), (13, 7)]);
    balanced(b, "r").await;

    // A permit given back goes where the weights say: general holds 6 of
    // its 7 after the release, so it takes it back; likewise members.
    let gave = b.release(&rid("r"), lanes[1][0]).await.unwrap();
    assert_eq!(
        gave,
        Departure::GaveBack(Handoff::To(lanes[1][7].id as u32))
    );
    let gave = b.release(&rid("r"), lanes[0][0]).await.unwrap();
    assert_eq!(
        gave,
        Departure::GaveBack(Handoff::To(lanes[0][3].id as u32))
    );
    assert_eq!(lane_counts(b).await, vec![(16, 3), (12, 7)]);
    // A revoked or expired permit counts out of its lane too.
    b.revoke(&rid("r"), lanes[0][1]).await.unwrap();
    assert_eq!(lane_counts(b).await, vec![(15, 3), (12, 7)]);
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!(snap.ledger.admitted, 10);
    balanced(b, "r").await;
}

async fn a_lane_with_nobody_waiting_lends_its_share_and_gets_it_back(kind: Kind) {
    let h = Harness::new(kind, vec![laned("r", 10)]).await;
    let b = &h.backend;
    let mut general = Vec::new();
    for _ in 0..15 {
        general.push(join_in(b, GENERAL).await.0);
    }
    // Nobody in members: general takes every permit.
    assert_eq!(b.tick(&rid("r")).await.unwrap().admitted.len(), 10);
    assert_eq!(lane_counts(b).await, vec![(0, 0), (5, 10)]);
    let mut members = Vec::new();
    for _ in 0..5 {
        members.push(join_in(b, MEMBERS).await.0);
    }
    // Members came: each permit general gives back goes to them until
    // they hold their three, then general's turn comes again.
    for (k, expected) in [members[0], members[1], members[2], general[10], general[11]]
        .into_iter()
        .enumerate()
    {
        let gave = b.release(&rid("r"), general[k]).await.unwrap();
        assert_eq!(
            gave,
            Departure::GaveBack(Handoff::To(expected.id as u32)),
            "release {k}"
        );
    }
    assert_eq!(lane_counts(b).await, vec![(2, 3), (3, 7)]);
    balanced(b, "r").await;
}

async fn positions_count_within_the_lane(kind: Kind) {
    let h = Harness::instances(kind, vec![laned("r", 1)], 2).await;
    let (b, other) = (&h.backends[0], &h.backends[1]);
    let feed = other.feed(&rid("r")).await.unwrap();
    let mut lanes: [Vec<TicketRef>; 2] = [Vec::new(), Vec::new()];
    for lane in [
        GENERAL, MEMBERS, MEMBERS, GENERAL, MEMBERS, GENERAL, GENERAL,
    ] {
        lanes[usize::from(lane)].push(join_in(b, lane).await.0);
    }
    // One in the middle of members leaves: only members behind it move.
    b.leave(&rid("r"), lanes[0][1]).await.unwrap();
    let expect = [
        (lanes[0][0], Some(1)),
        (lanes[0][2], Some(2)),
        (lanes[1][0], Some(1)),
        (lanes[1][1], Some(2)),
        (lanes[1][2], Some(3)),
        (lanes[1][3], Some(4)),
    ];
    for (t, position) in expect {
        let s = status(b, t).await;
        assert_eq!(s.position, position, "ticket {}", t.id);
        // The other instance's feed counts the same, in the same lane.
        let qi = s.number.unwrap() - 1;
        let within = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if feed.ahead(s.lane, qi) == position.map(|p| p - 1) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            within.is_ok(),
            "ticket {} lane {}: the feed counts {:?} ahead, the store {:?}",
            t.id,
            s.lane,
            feed.ahead(s.lane, qi),
            position.map(|p| p - 1)
        );
    }
    assert_eq!(lane_counts(b).await, vec![(2, 0), (4, 0)]);
}

async fn the_opening_places_each_lane_in_drawn_order(kind: Kind) {
    let mut s = laned("r", 100);
    s.opens_at = Some(T0 + 60_000);
    s.order = Order::Lottery;
    let h = Harness::new(kind, vec![s]).await;
    let b = &h.backend;
    let mut pre = Vec::new();
    for i in 0..24u8 {
        let lane = if i % 3 == 0 { MEMBERS } else { GENERAL };
        let (t, s) = join_in(b, lane).await;
        assert_eq!((s.number, s.lane), (None, lane));
        pre.push((t, lane));
    }
    h.clock.advance(Duration::from_secs(61));
    let all: Vec<TicketRef> = pre.iter().map(|(t, _)| *t).collect();
    let streams = StreamsReport {
        holder: 1,
        opened: all.clone(),
        ..StreamsReport::default()
    };
    b.hold_streams(&rid("r"), &streams).await.unwrap();
    b.patch_room(
        &rid("r"),
        narabu::backend::RoomPatch {
            paused: Some(true),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(b.tick(&rid("r")).await.unwrap().opened);
    // The public record lists every pre-queue ticket in drawn order.
    let draw = b.draw(&rid("r")).await.unwrap().unwrap();
    draw.verify().unwrap();
    let seed = LotterySeed(hex::decode(draw.seed.unwrap()).unwrap().try_into().unwrap());
    let mut ids: Vec<u32> = all.iter().map(|t| t.id as u32).collect();
    ids.sort_unstable();
    let drawn = seed.draw(&ids);
    assert_eq!(draw.order.unwrap(), drawn);
    // Each lane took its tickets in that order, numbered within the lane.
    let lane_of: HashMap<u32, u8> = pre.iter().map(|(t, l)| (t.id as u32, *l)).collect();
    let mut next = [0u64; 2];
    for id in drawn {
        let lane = lane_of[&id];
        next[usize::from(lane)] += 1;
        let t = all.iter().find(|t| t.id as u32 == id).unwrap();
        let s = status(b, *t).await;
        assert_eq!(s.lane, lane);
        assert_eq!(s.number, Some(next[usize::from(lane)]), "ticket {id}");
        assert_eq!(s.position, Some(next[usize::from(lane)]), "ticket {id}");
    }
    assert_eq!(next, [8, 16]);
}

/// Eight tasks join in random lanes, leave, tick and release at once.
/// Capacity holds for the room throughout; at the end the ledger balances,
/// each lane's counts add up, and in every lane nobody waiting was passed
/// over by anyone behind them.
async fn lanes_hold_capacity_and_order_under_many_threads(kind: Kind) {
    const CAP: u64 = 4;
    let h = Harness::new(kind, vec![laned("r", CAP as u32)]).await;
    let b = h.backend.clone();
    let watch = Watch::start(&b, "r", |snap| {
        assert!(
            snap.ledger.admitted <= CAP,
            "over capacity: {:?}",
            snap.ledger
        );
        let in_lanes: u64 = snap.view.lanes.iter().map(|l| l.admitted).sum();
        assert!(
            in_lanes <= CAP,
            "lanes over capacity: {:?}",
            snap.view.lanes
        );
    });
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in 0..20u64 {
                let lane = ((w * 7 + i * 3) % 5 == 0) as u8;
                let lane = if lane == 1 { MEMBERS } else { GENERAL };
                let t = b
                    .join(&rid("r"), JoinRequest::in_lane(lane))
                    .await
                    .unwrap()
                    .ticket;
                mine.push(t);
                if (w + i) % 7 == 0 {
                    b.leave(&rid("r"), t).await.unwrap();
                }
                if (w + i) % 3 == 0 {
                    b.tick(&rid("r")).await.unwrap();
                }
                if (w + i) % 2 == 0
                    && let Some(&old) = mine.get(mine.len().saturating_sub(3))
                {
                    let _ = b.release(&rid("r"), old).await.unwrap();
                }
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert!(watch.stop().await > 0);
    balanced(&b, "r").await;
    let snap = b.room(&rid("r")).await.unwrap();
    assert!(snap.stats.peak_admitted <= CAP);
    assert_eq!(snap.stats.joins, 160);
    // Per lane: the counts the view shows are the tickets' own, and no
    // waiting ticket has a lower number than one that got a permit.
    let mut waiting = [0u64; 2];
    let mut admitted = [0u64; 2];
    let mut lowest_waiting = [u64::MAX; 2];
    let mut highest_served = [0u64; 2];
    for t in &all {
        let s = status(&b, *t).await;
        let lane = usize::from(s.lane);
        let number = s.number.unwrap();
        match s.state {
            TicketState::Waiting => {
                waiting[lane] += 1;
                lowest_waiting[lane] = lowest_waiting[lane].min(number);
            }
            TicketState::Admitted => {
                admitted[lane] += 1;
                highest_served[lane] = highest_served[lane].max(number);
            }
            TicketState::Released => highest_served[lane] = highest_served[lane].max(number),
            _ => {}
        }
    }
    let view: Vec<(u64, u64)> = snap
        .view
        .lanes
        .iter()
        .map(|l| (l.waiting, l.admitted))
        .collect();
    assert_eq!(
        view,
        vec![(waiting[0], admitted[0]), (waiting[1], admitted[1])]
    );
    for lane in 0..2 {
        assert!(
            highest_served[lane] < lowest_waiting[lane],
            "lane {lane}: number {} got a permit while number {} still waits",
            highest_served[lane],
            lowest_waiting[lane]
        );
    }
}

/// An operator moves the shares of a running room: members 30 → 70,
/// general 70 → 30. Nobody admitted loses a permit; each permit freed from
/// then on goes by the new weights, until the room holds 7 members and 3
/// others; the room's settings and view show the new weights.
async fn new_weights_steer_the_next_permits(kind: Kind) {
    let h = Harness::new(kind, vec![laned("r", 10)]).await;
    let b = &h.backend;
    let mut lanes: [Vec<TicketRef>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..12 {
        for lane in [MEMBERS, GENERAL] {
            lanes[usize::from(lane)].push(join_in(b, lane).await.0);
        }
    }
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(lane_counts(b).await, vec![(9, 3), (5, 7)]);
    let snap = b
        .patch_room(
            &rid("r"),
            narabu::backend::RoomPatch {
                lane_weights: vec![(MEMBERS, 70), (GENERAL, 30)],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let weights: Vec<u32> = snap.settings.lanes.iter().map(|l| l.weight).collect();
    assert_eq!(weights, [70, 30]);
    // Nothing moved by itself.
    assert_eq!(lane_counts(b).await, vec![(9, 3), (5, 7)]);
    // General gives back four permits: each goes to members.
    for (k, next) in (0..4).zip(3..) {
        let gave = b.release(&rid("r"), lanes[1][k]).await.unwrap();
        assert_eq!(
            gave,
            Departure::GaveBack(Handoff::To(lanes[0][next].id as u32)),
            "release {k}"
        );
    }
    assert_eq!(lane_counts(b).await, vec![(5, 7), (5, 3)]);
    // At 7/3 a member's permit goes back to a member, a general one to
    // general.
    let gave = b.release(&rid("r"), lanes[0][0]).await.unwrap();
    assert_eq!(
        gave,
        Departure::GaveBack(Handoff::To(lanes[0][7].id as u32))
    );
    let gave = b.release(&rid("r"), lanes[1][4]).await.unwrap();
    assert_eq!(
        gave,
        Departure::GaveBack(Handoff::To(lanes[1][7].id as u32))
    );
    let view = b.room(&rid("r")).await.unwrap().view;
    let shown: Vec<u32> = view.lanes.iter().map(|l| l.weight).collect();
    assert_eq!(shown, [70, 30]);
    balanced(b, "r").await;
}
