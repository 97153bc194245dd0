//! Images and replay: a room rebuilt from an image, or from an older image
//! plus the events since, is the same room (same tickets, numbers, states,
//! order and permits), also when the image was taken while many threads
//! were changing the room.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

const T0: u64 = 1_800_000_000_000;

/// Keeps every event, as a journal would.
#[derive(Default)]
struct Recorder(Mutex<Vec<EventRecord>>);

impl EventSink for Recorder {
    fn record(&self, event: RoomEvent<'_>) {
        self.0.lock().unwrap().push(event.into());
    }
}

impl Recorder {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn since(&self, from: usize) -> Vec<EventRecord> {
        self.0.lock().unwrap()[from..].to_vec()
    }
}

fn settings(capacity: u32) -> RoomSettings {
    let mut s = RoomSettings::new(RoomId::new("img").unwrap());
    s.capacity = capacity;
    s
}

fn recorded_room(s: RoomSettings, clock: &ManualClock) -> (Arc<Room>, Arc<Recorder>, RoomImage) {
    let rec = Arc::new(Recorder::default());
    let room = Room::create(s, Arc::new(clock.clone()), 42, Some(rec.clone()));
    let first = room.image();
    (room, rec, first)
}

/// What a visitor could see of every ticket.
fn summary(room: &Room) -> Vec<(TicketState, Option<u64>, Option<u64>)> {
    (0..room.issued())
        .map(|id| {
            let s = room.status(id).unwrap();
            (s.state, s.number, s.position)
        })
        .collect()
}

fn replay(mut image: RoomImage, events: &[EventRecord]) -> RoomImage {
    for e in events {
        image.apply(e.as_event());
    }
    image
}

fn assert_same(live: &Room, restored: &Room) {
    assert_eq!(summary(live), summary(restored));
    assert_eq!(live.waiting_count(), restored.waiting_count());
    assert_eq!(live.admitted_count(), restored.admitted_count());
    assert_eq!(live.settings(), restored.settings());
    let l = restored.ledger();
    assert!(l.balances(), "{l:?}");
    assert_eq!(
        l.held + l.tray,
        live.ledger().held + live.ledger().tray,
        "free permits"
    );
}

/// Joins with identities, admissions, hand-offs, leaves, releases, an
/// arrival and a capacity change.
fn busy_scenario(room: &Room, clock: &ManualClock) -> Vec<TicketId> {
    let ids: Vec<TicketId> = (0..20)
        .map(|i| room.join(Some(Identity(1000 + i))).unwrap().ticket)
        .collect();
    room.tick();
    room.touch(ids[0]);
    room.leave(ids[7]);
    room.release(ids[1]);
    clock.advance(Duration::from_secs(1));
    room.set_capacity(5);
    room.tick();
    room.revoke(ids[12]);
    room.leave(ids[2]);
    ids
}

#[test]
fn a_room_restored_from_its_image_is_the_same_room() {
    let clock = ManualClock::new(T0);
    let (room, _, _) = recorded_room(settings(3), &clock);
    let ids = busy_scenario(&room, &clock);
    let restored = Room::restore(room.image(), Arc::new(clock.clone()), None);
    assert_same(&room, &restored);
    assert_eq!(restored.epoch(), 42);
    // The same identity still gets the same ticket.
    let again = restored.join(Some(Identity(1005))).unwrap();
    assert_eq!((again.ticket, again.is_new), (ids[5], false));
    // And the line moves on in the same order in both.
    for r in [&room, &restored] {
        r.release(ids[0]);
    }
    assert_eq!(room.tick().admitted, restored.tick().admitted);
    assert_same(&room, &restored);
}

#[test]
fn replaying_the_events_onto_the_first_image_gives_the_same_room() {
    let clock = ManualClock::new(T0);
    let (room, rec, first) = recorded_room(settings(3), &clock);
    busy_scenario(&room, &clock);
    let image = replay(first, &rec.since(0));
    let restored = Room::restore(image, Arc::new(clock.clone()), None);
    assert_same(&room, &restored);
    assert_eq!(room.stats().joins, restored.stats().joins);
    assert_eq!(room.stats().admissions, restored.stats().admissions);
    assert_eq!(room.stats().leaves, restored.stats().leaves);
}

#[test]
fn a_reused_key_points_at_its_newest_ticket_after_a_restart() {
    let clock = ManualClock::new(T0);
    let (room, rec, first) = recorded_room(settings(3), &clock);
    let key = Some(Identity(77));
    let old = room.join_bound(key, 0, Binding::WhileLive).unwrap();
    room.leave(old.ticket);
    let new = room.join_bound(key, 0, Binding::WhileLive).unwrap();
    assert!(new.is_new);
    let from_image = Room::restore(room.image(), Arc::new(clock.clone()), None);
    let replayed = Room::restore(replay(first, &rec.since(0)), Arc::new(clock.clone()), None);
    for restored in [from_image, replayed] {
        let again = restored.join_bound(key, 0, Binding::WhileLive).unwrap();
        assert_eq!((again.ticket, again.is_new), (new.ticket, false));
    }
}

#[test]
fn replay_tolerates_duplicates_and_one_ticket_events_out_of_order() {
    let clock = ManualClock::new(T0);
    let (room, rec, first) = recorded_room(settings(2), &clock);
    busy_scenario(&room, &clock);
    let events = rec.since(0);
    // Settings keep their order; ticket events come reversed and twice.
    let (settings_events, mut ticket_events): (Vec<_>, Vec<_>) = events
        .into_iter()
        .partition(|e| matches!(e, EventRecord::Settings(_) | EventRecord::Closed));
    ticket_events.reverse();
    let mut image = replay(first, &settings_events);
    image = replay(image, &ticket_events);
    image = replay(image, &ticket_events);
    let restored = Room::restore(image, Arc::new(clock.clone()), None);
    assert_same(&room, &restored);
}

#[test]
fn the_lottery_draw_survives_before_and_after_opening() {
    let clock = ManualClock::new(T0);
    let mut s = settings(2);
    s.opens_at = Some(T0 + 60_000);
    let (room, rec, first) = recorded_room(s, &clock);
    let early: Vec<TicketId> = (0..30).map(|_| room.join(None).unwrap().ticket).collect();
    room.leave(early[3]);
    // Restored before opening: same commitment, same draw later.
    let before = Room::restore(room.image(), Arc::new(clock.clone()), None);
    assert_eq!(
        before.view().lottery_commitment,
        room.view().lottery_commitment
    );
    clock.advance(Duration::from_secs(61));
    // Their pages are open: the instance renews their presence.
    room.renew(early.iter().copied());
    before.renew(early.iter().copied());
    assert!(room.tick().opened);
    assert!(before.tick().opened);
    assert_same(&room, &before);
    room.join(None).unwrap();
    // Replayed from the very first image, across the draw.
    let replayed = Room::restore(replay(first, &rec.since(0)), Arc::new(clock.clone()), None);
    assert_same(&room, &replayed);
    assert_eq!(replayed.view().lottery_seed, room.view().lottery_seed);
    assert_eq!(replayed.draw_record(), room.draw_record());
    let from_image = Room::restore(room.image(), Arc::new(clock.clone()), None);
    assert_eq!(from_image.draw_record(), room.draw_record());
    assert_eq!(room.draw_record().unwrap().order.unwrap().len(), 30);
}

/// A room with lanes, opened by a draw, then busy: restored from its image
/// and replayed from its first, each ticket keeps its lane, number and
/// place, and the lanes go on sharing permits the same way.
/// A room opening in a minute, with a members' lane (weight 1) and the
/// general one (weight 2, the default).
fn scheduled_with_lanes() -> RoomSettings {
    let mut s = settings(3);
    s.opens_at = Some(T0 + 60_000);
    s.lanes = vec![
        LaneSpec {
            name: "members".into(),
            weight: 1,
        },
        LaneSpec {
            name: "general".into(),
            weight: 2,
        },
    ];
    s.default_lane = Some("general".into());
    s
}

/// Twelve joins before the opening, every third in the members' lane.
fn early_in_lanes(room: &Room) -> Vec<TicketId> {
    (0..12)
        .map(|i| room.join_in(None, (i % 3 == 0) as u8 ^ 1).unwrap().ticket)
        .collect()
}

#[test]
fn lanes_survive_images_and_replay() {
    let clock = ManualClock::new(T0);
    let (room, rec, first) = recorded_room(scheduled_with_lanes(), &clock);
    let early = early_in_lanes(&room);
    clock.advance(Duration::from_secs(61));
    room.renew(early.iter().copied());
    assert!(room.tick().opened);
    for i in 0..9u8 {
        room.join_in(Some(Identity(u128::from(i) + 7)), i % 2)
            .unwrap();
    }
    room.leave(early[5]);
    room.release(room.tick().admitted.first().copied().unwrap_or(early[0]));
    let lanes = |r: &Room| -> Vec<(TicketState, u8, Option<u64>, Option<u64>)> {
        (0..r.issued())
            .map(|id| {
                let s = r.status(id).unwrap();
                (s.state, s.lane, s.number, s.position)
            })
            .collect()
    };
    let restored = Room::restore(room.image(), Arc::new(clock.clone()), None);
    let replayed = Room::restore(replay(first, &rec.since(0)), Arc::new(clock.clone()), None);
    for other in [&restored, &replayed] {
        assert_same(&room, other);
        assert_eq!(lanes(&room), lanes(other));
        assert_eq!(room.lane_views(), other.lane_views());
        assert_eq!(room.draw_record(), other.draw_record());
    }
    clock.advance(Duration::from_secs(1));
    let next = |r: &Room| {
        // Presence is not journalled: every page is open, on each.
        r.renew(0..r.issued());
        r.set_capacity(8);
        r.tick().admitted
    };
    let expected = next(&room);
    assert!(!expected.is_empty());
    assert_eq!(next(&restored), expected);
    assert_eq!(next(&replayed), expected);
}

#[test]
fn lost_joins_leave_placeholders_and_numbers_keep_their_meaning() {
    let clock = ManualClock::new(T0);
    let (room, rec, first) = recorded_room(settings(1), &clock);
    for _ in 0..5 {
        room.join(None).unwrap();
    }
    let mut events = rec.since(0);
    // The join of ticket 2 never became durable.
    events.retain(|e| !matches!(e, EventRecord::Joined { ticket: 2, .. }));
    let restored = Room::restore(replay(first, &events), Arc::new(clock.clone()), None);
    assert_eq!(restored.state_of(2), Some(TicketState::Left));
    let s = restored.status(4).unwrap();
    assert_eq!((s.number, s.position), (Some(5), Some(4)));
    assert!(restored.ledger().balances());
}

#[test]
fn time_spent_down_counts() {
    let clock = ManualClock::new(T0);
    let mut s = settings(2);
    s.arrival_grace = Duration::from_secs(60);
    s.pass_idle = Duration::from_secs(600);
    s.queue_idle = Duration::from_secs(300);
    // Present while down: this is about timeouts counting, not presence.
    s.away_grace = Duration::from_secs(299);
    let (room, _, _) = recorded_room(s, &clock);
    let ids: Vec<TicketId> = (0..4).map(|_| room.join(None).unwrap().ticket).collect();
    room.tick();
    room.touch(ids[0]); // arrived: pass_idle applies
    let image = room.image();
    // Down for two minutes: ids[1] never arrived within its grace.
    clock.advance(Duration::from_secs(120));
    let restored = Room::restore(image, Arc::new(clock.clone()), None);
    let report = restored.tick();
    assert_eq!(report.expired, vec![ids[1]]);
    assert_eq!(restored.state_of(ids[0]), Some(TicketState::Admitted));
    // The freed permit goes to the next in line, in order.
    assert_eq!(report.admitted, vec![ids[2]]);
    assert_eq!(restored.state_of(ids[3]), Some(TicketState::Waiting));
    assert!(restored.ledger().balances());
    // Down past queue_idle: quiet waiters are skipped.
    let image = restored.image();
    clock.advance(Duration::from_secs(400));
    let restored = Room::restore(image, Arc::new(clock.clone()), None);
    restored.tick();
    assert_eq!(restored.state_of(ids[3]), Some(TicketState::Abandoned));
}

#[test]
fn an_image_taken_under_load_plus_the_events_after_it_is_the_final_room() {
    let clock = ManualClock::new(T0);
    let (room, rec, _) = recorded_room(settings(8), &clock);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (cut, image) = std::thread::scope(|s| {
        for t in 0..4u128 {
            let room = &room;
            s.spawn(move || {
                for i in 0..400u128 {
                    let id = room.join(Some(Identity(t * 10_000 + i))).unwrap().ticket;
                    match i % 5 {
                        0 => {
                            room.leave(id);
                        }
                        1 => {
                            room.release(id.saturating_sub(3));
                        }
                        2 => {
                            room.touch(id.saturating_sub(5));
                        }
                        _ => {}
                    }
                }
            });
        }
        let stop = &stop;
        let room = &room;
        s.spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                room.tick();
                std::thread::yield_now();
            }
        });
        // A snapshot in the middle: fix the cut, then copy the room.
        std::thread::sleep(Duration::from_millis(5));
        let cut = rec.len();
        let image = room.image();
        std::thread::sleep(Duration::from_millis(5));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (cut, image)
    });
    room.tick();
    let restored = Room::restore(
        replay(image, &rec.since(cut)),
        Arc::new(clock.clone()),
        None,
    );
    assert_same(&room, &restored);
    assert_eq!(room.issued(), 1600);
}

/// A replica following the records one at a time (as an instance that
/// does not own the room does) after its first image.
fn follow(first: RoomImage, records: &[EventRecord], clock: &ManualClock) -> Replayer {
    let mut replica = Replayer::new(Room::restore(first, Arc::new(clock.clone()), None));
    for r in records {
        replica.apply(r);
    }
    replica
}

#[test]
fn a_replica_following_the_records_is_the_same_room() {
    let clock = ManualClock::new(T0);
    let (room, rec, first) = recorded_room(settings(3), &clock);
    let ids = busy_scenario(&room, &clock);
    // Someone goes away and comes back, someone leaves while away.
    clock.advance(Duration::from_secs(60 * 60));
    room.renew(ids[10..].iter().copied());
    room.release(ids[1]);
    room.touch(ids[7]);
    let replica = follow(first, &rec.since(0), &clock);
    assert!(replica.is_settled());
    replica.room().adopt(&room.tally());
    assert_same(&room, replica.room());
    assert_eq!(room.stats(), replica.room().stats());
    assert_eq!(room.ledger(), replica.room().ledger());
    // Everything but the last sign of life, which travels to the owner
    // only (presence renewals and polls are not records).
    let facts = |r: &Room, id| {
        r.ticket_facts(id).map(|(mut f, ahead)| {
            f.last_seen = 0;
            (f, ahead)
        })
    };
    for id in 0..room.issued() {
        assert_eq!(facts(&room, id), facts(replica.room(), id), "ticket {id}");
    }
}

#[test]
fn a_replica_follows_lanes_and_a_lottery_opening() {
    let clock = ManualClock::new(T0);
    let mut s = scheduled_with_lanes();
    s.order = Order::Lottery;
    let (room, rec, first) = recorded_room(s, &clock);
    let early = early_in_lanes(&room);
    room.leave(early[2]);
    clock.advance(Duration::from_secs(61));
    room.renew(early.iter().copied());
    assert!(room.tick().opened);
    for i in 0..9u8 {
        room.join_in(Some(Identity(u128::from(i) + 7)), i % 2)
            .unwrap();
    }
    room.leave(early[5]);
    room.release(room.tick().admitted.first().copied().unwrap_or(early[0]));
    room.set_capacity(5);
    room.tick();
    let replica = follow(first, &rec.since(0), &clock);
    replica.room().adopt(&room.tally());
    assert_same(&room, replica.room());
    assert_eq!(room.lane_views(), replica.room().lane_views());
    assert_eq!(room.draw_record(), replica.room().draw_record());
    assert_eq!(room.settings(), replica.room().settings());
}

#[test]
fn a_replica_of_a_room_many_threads_change_is_the_same_room() {
    // The records of concurrent joins, admissions and departures come in
    // whatever order the threads reported them.
    let clock = ManualClock::new(T0);
    let (room, rec, first) = recorded_room(settings(40), &clock);
    std::thread::scope(|scope| {
        for t in 0..4u128 {
            let room = room.clone();
            scope.spawn(move || {
                for i in 0..300u128 {
                    let j = room.join(Some(Identity(t * 10_000 + i))).unwrap();
                    if i % 3 == 0 {
                        room.leave(j.ticket);
                    }
                    if i % 50 == 0 {
                        room.tick();
                    }
                }
            });
        }
        let room = room.clone();
        scope.spawn(move || {
            for _ in 0..100 {
                for id in room.tick().admitted {
                    room.release(id);
                }
            }
        });
    });
    let replica = follow(first, &rec.since(0), &clock);
    assert!(replica.is_settled());
    replica.room().adopt(&room.tally());
    assert_same(&room, replica.room());
    assert_eq!(room.stats(), replica.room().stats());
}

/// A paused room of capacity 1 whose first ticket was skipped at the head
/// (away) while the next was admitted and a third waits behind: the
/// clock, the room, its records, its first image and the skipped ticket.
fn skipped_at_the_head() -> (ManualClock, Arc<Room>, Arc<Recorder>, RoomImage, TicketId) {
    let clock = ManualClock::new(T0);
    let mut s = settings(0);
    s.away_grace = Duration::from_secs(10);
    s.queue_idle = Duration::from_secs(30);
    let (room, rec, first) = recorded_room(s, &clock);
    room.set_capacity(1);
    let gone = room.join(None).unwrap().ticket;
    clock.advance(Duration::from_millis(11_550));
    let _first = room.join(None).unwrap().ticket;
    let _second = room.join(None).unwrap().ticket;
    room.tick();
    assert_eq!(room.state_of(gone), Some(TicketState::Away));
    room.set_paused(true);
    (clock, room, rec, first, gone)
}

#[test]
fn a_replica_counts_a_returned_ticket_that_then_ended_out_of_the_line() {
    let (clock, room, rec, first, gone) = skipped_at_the_head();
    // It comes back, then is revoked; someone joins.
    room.touch(gone);
    room.revoke(gone);
    let last = room.join(None).unwrap().ticket;
    let replica = follow(first, &rec.since(0), &clock);
    replica.room().adopt(&room.tally());
    assert_eq!(room.status(last).unwrap().position, Some(2));
    assert_eq!(replica.room().status(last).unwrap().position, Some(2));
}

#[test]
fn a_new_owner_counts_a_returned_ticket_that_then_ended_out_of_the_line() {
    let (clock, room, rec, first, gone) = skipped_at_the_head();
    // The room changes hands: the new owner starts from the image.
    let rec2 = Arc::new(Recorder::default());
    let owner = Room::restore(room.image(), Arc::new(clock.clone()), Some(rec2.clone()));
    owner.adopt(&room.tally());
    owner.presume_seen(clock.now_ms());
    owner.touch(gone);
    owner.revoke(gone);
    let last = owner.join(None).unwrap().ticket;
    assert_eq!(owner.status(last).unwrap().position, Some(2));
    let mut records = rec.since(0);
    records.extend(rec2.since(0));
    let replica = follow(first, &records, &clock);
    replica.room().adopt(&owner.tally());
    assert_eq!(replica.room().status(last).unwrap().position, Some(2));
}
