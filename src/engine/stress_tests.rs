//! Many threads against one room: joiners, finishers, a revoker and the
//! worker race each other; the invariants are checked from outside while
//! they run and once they are done.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;

use super::*;

const CAPACITY: u32 = 8;
const VISITOR_THREADS: usize = 4;
const JOINS_PER_THREAD: usize = 3_000;

#[test]
fn concurrent_joins_releases_and_ticks_keep_every_invariant() {
    stress(false, false);
}

#[test]
fn concurrent_revocations_and_expiries_keep_every_invariant() {
    stress(true, false);
}

/// The same in a room with two priority lanes, joined at random: every
/// invariant holds for the room, and order and exact positions per lane.
#[test]
fn concurrent_joins_in_two_lanes_keep_every_invariant_per_lane() {
    stress(true, true);
}

/// With `revocations`, a revoker thread and short pass timeouts take
/// permits away from visitors who still think they hold them, so the
/// visitors' own count is no longer a measure of capacity; the engine's
/// peak count and the ledger still are.
fn stress(revocations: bool, lanes: bool) {
    let clock = ManualClock::new(1_800_000_000_000);
    let mut s = RoomSettings::new(RoomId::new("stress").unwrap());
    s.capacity = CAPACITY;
    if revocations {
        s.arrival_grace = Duration::from_millis(40);
        s.pass_idle = Duration::from_millis(80);
    }
    s.queue_idle = Duration::from_secs(3600);
    if lanes {
        s.lanes = vec![
            LaneSpec {
                name: "members".into(),
                weight: 1,
            },
            LaneSpec {
                name: "general".into(),
                weight: 3,
            },
        ];
        s.default_lane = Some("general".into());
    }
    let room = Room::new(s, Arc::new(clock.clone()));

    // Visitors count themselves in when they see their admission and out
    // before they give the permit back: an external view of the capacity.
    let in_use = AtomicU64::new(0);
    let peak_in_use = AtomicU64::new(0);
    let left_while_waiting = Mutex::new(HashSet::new());
    let done = AtomicBool::new(false);

    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            while !done.load(Ordering::Acquire) {
                clock.advance(Duration::from_millis(1));
                room.tick();
                std::thread::yield_now();
            }
        });
        let revoker = scope.spawn(|| {
            let mut rng = rand::rng();
            while revocations && !done.load(Ordering::Acquire) {
                let issued = room.issued();
                if issued > 0 {
                    let id = rng.random_range(0..issued);
                    if room.revoke(id) == Departure::LeftQueue {
                        left_while_waiting.lock().unwrap().insert(id);
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let visitors: Vec<_> = (0..VISITOR_THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let mut rng = rand::rng();
                    let mut mine: Vec<TicketId> = Vec::new();
                    let mut holding: Vec<TicketId> = Vec::new();
                    for _ in 0..JOINS_PER_THREAD {
                        let lane = u8::from(lanes && rng.random_ratio(1, 3));
                        mine.push(room.join_in(None, lane).unwrap().ticket);
                        // Notice admissions among my waiting tickets.
                        mine.retain(|&id| match room.state_of(id).unwrap() {
                            // Some visitors walk away once admitted: their
                            // pass must lapse after arrival_grace.
                            TicketState::Admitted if revocations && rng.random_ratio(1, 10) => {
                                false
                            }
                            TicketState::Admitted => {
                                let n = in_use.fetch_add(1, Ordering::AcqRel) + 1;
                                peak_in_use.fetch_max(n, Ordering::AcqRel);
                                room.touch(id);
                                holding.push(id);
                                false
                            }
                            TicketState::Waiting => true,
                            _ => false,
                        });
                        if !mine.is_empty() && rng.random_ratio(1, 20) {
                            let id = mine.swap_remove(rng.random_range(0..mine.len()));
                            if room.leave(id) == Departure::LeftQueue {
                                left_while_waiting.lock().unwrap().insert(id);
                            }
                        }
                        if !holding.is_empty() && rng.random_ratio(1, 2) {
                            let id = holding.swap_remove(rng.random_range(0..holding.len()));
                            in_use.fetch_sub(1, Ordering::AcqRel);
                            room.leave(id);
                            // A double release must free nothing.
                            assert!(matches!(room.release(id), Departure::Nothing(_)));
                        }
                    }
                    for id in holding {
                        in_use.fetch_sub(1, Ordering::AcqRel);
                        room.release(id);
                    }
                })
            })
            .collect();
        for v in visitors {
            v.join().unwrap();
        }
        done.store(true, Ordering::Release);
        worker.join().unwrap();
        revoker.join().unwrap();
    });

    // Invariant 1, from the visitors' side and from the engine's.
    if !revocations {
        assert!(peak_in_use.load(Ordering::Acquire) <= u64::from(CAPACITY));
    }
    let stats = room.stats();
    assert!(stats.peak_admitted <= u64::from(CAPACITY), "{stats:?}");
    assert!(
        stats.admissions > 100,
        "the run admitted too little: {stats:?}"
    );
    assert!(stats.handoffs > 0, "{stats:?}");
    if revocations {
        assert!(stats.expirations > 0 && stats.revocations > 0, "{stats:?}");
    }

    // Invariant 4, at rest.
    room.tick();
    let ledger = room.ledger();
    assert!(ledger.balances(), "{ledger:?}");

    // Invariant 2, per lane: every ticket ever admitted stood ahead of
    // every ticket still waiting in its lane.
    let left = left_while_waiting.into_inner().unwrap();
    let mut last_admitted = [None; 2];
    let mut first_waiting = [None; 2];
    let mut positions = [Vec::new(), Vec::new()];
    for id in 0..room.issued() {
        let status = room.status(id).unwrap();
        let (lane, number) = (usize::from(status.lane), status.number.unwrap());
        match room.state_of(id).unwrap() {
            TicketState::Waiting => {
                first_waiting[lane] = first_waiting[lane].min(Some(number)).or(Some(number));
                positions[lane].push(status.position.unwrap());
            }
            TicketState::Left | TicketState::Abandoned => {}
            TicketState::Revoked if left.contains(&id) => {}
            _ => last_admitted[lane] = last_admitted[lane].max(Some(number)),
        }
    }
    for lane in 0..2 {
        if let (Some(a), Some(w)) = (last_admitted[lane], first_waiting[lane]) {
            assert!(
                a < w,
                "lane {lane}: ticket {w} still waits behind admitted ticket {a}"
            );
        }
        // Positions of those still waiting are exact: 1, 2, 3…
        let positions = &mut positions[lane];
        positions.sort_unstable();
        assert_eq!(*positions, (1..=positions.len() as u64).collect::<Vec<_>>());
    }
    // Each lane's counts are its tickets'.
    if lanes {
        for (i, view) in room.lane_views().iter().enumerate() {
            let count = |state| {
                (0..room.issued())
                    .filter(|&id| {
                        room.state_of(id) == Some(state) && room.status(id).unwrap().lane == i as u8
                    })
                    .count() as u64
            };
            assert_eq!(view.waiting, count(TicketState::Waiting), "lane {i}");
            assert_eq!(view.admitted, count(TicketState::Admitted), "lane {i}");
        }
    }
}
