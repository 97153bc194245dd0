//! Calling visitors back: when the room finds each call due, that each is
//! made once, and that the callbacks and what was said survive an image
//! and a replica, as the other ticket data do.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

const T0: u64 = 1_800_000_000_000;

/// One call: the ticket, its number, what is said, in which language.
type Call = (TicketId, Option<u64>, Notice, String);

/// The calls a room hands out, in order.
#[derive(Default)]
struct Calls(Mutex<Vec<Call>>);

impl Callouts for Calls {
    fn due(
        &self,
        _room: &RoomId,
        _epoch: u64,
        ticket: TicketId,
        number: Option<u64>,
        notice: Notice,
        callback: &Arc<Callback>,
    ) {
        self.0
            .lock()
            .unwrap()
            .push((ticket, number, notice, callback.lang.clone()));
    }
}

impl Calls {
    fn take(&self) -> Vec<Call> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// Every event as a record, as a journal keeps them.
#[derive(Default)]
struct Records(Mutex<Vec<EventRecord>>);

impl EventSink for Records {
    fn record(&self, event: RoomEvent<'_>) {
        self.0.lock().unwrap().push(event.into());
    }
}

fn callback(lang: &str) -> Callback {
    Callback {
        subscription: r#"{"endpoint":"https://push.example/x"}"#.into(),
        lang: lang.into(),
    }
}

fn room_with(
    f: impl FnOnce(&mut RoomSettings),
) -> (Arc<Room>, ManualClock, Arc<Calls>, Arc<Records>) {
    let clock = ManualClock::new(T0);
    let mut s = RoomSettings::new(RoomId::new("test").unwrap());
    s.capacity = 1;
    s.queue_idle = Duration::from_secs(300);
    s.away_grace = Duration::from_secs(20);
    s.arrival_grace = Duration::from_secs(120);
    f(&mut s);
    let records = Arc::new(Records::default());
    let room = Room::create(s, Arc::new(clock.clone()), 7, Some(records.clone()));
    let calls = Arc::new(Calls::default());
    room.set_callouts(calls.clone());
    (room, clock, calls, records)
}

fn join_n(room: &Room, n: usize) -> Vec<TicketId> {
    (0..n).map(|_| room.join(None).unwrap().ticket).collect()
}

#[test]
fn ahead_once_within_the_distance_then_the_turn_at_the_head() {
    let (room, clock, calls, _) = room_with(|s| s.notify_ahead = Some(2));
    let ids = join_n(&room, 6);
    room.subscribe(ids[5], callback("ja")).unwrap();
    assert_eq!(room.callback_count(), 1);
    for id in &ids {
        room.touch(*id);
    }
    // Five ahead, then (one admitted) four: not yet within two.
    room.tick();
    assert!(calls.take().is_empty());
    let mut seen = Vec::new();
    for i in 0..5 {
        clock.advance(Duration::from_secs(1));
        room.touch(ids[5]);
        room.leave(ids[i]);
        room.tick();
        seen.extend(calls.take());
    }
    assert_eq!(
        seen,
        vec![
            (ids[5], Some(6), Notice::Ahead { ahead: 2 }, "ja".into()),
            (
                ids[5],
                Some(6),
                Notice::Turn {
                    until: clock.now_ms() + 120_000
                },
                "ja".into()
            ),
        ]
    );
    assert_eq!(room.state_of(ids[5]), Some(TicketState::Admitted));
    // Nothing twice, and the callback ends with the ticket.
    room.tick();
    assert!(calls.take().is_empty());
    room.leave(ids[5]);
    assert_eq!(room.callback_count(), 0);
}

#[test]
fn a_visitor_away_at_their_turn_is_skipped_and_told_by_when_to_come_back() {
    let (room, clock, calls, _) = room_with(|s| s.notify_ahead = Some(0));
    let ids = join_n(&room, 3);
    room.subscribe(ids[1], callback("en")).unwrap();
    room.tick();
    assert_eq!(room.state_of(ids[0]), Some(TicketState::Admitted));
    // ids[1] closed the page: away after the grace.
    let last_seen = clock.now_ms();
    clock.advance(Duration::from_secs(30));
    room.touch(ids[2]);
    room.leave(ids[0]);
    assert_eq!(room.state_of(ids[1]), Some(TicketState::Away));
    assert_eq!(room.state_of(ids[2]), Some(TicketState::Admitted));
    assert_eq!(
        calls.take(),
        vec![
            (ids[1], Some(2), Notice::Ahead { ahead: 0 }, "en".into()),
            (
                ids[1],
                Some(2),
                Notice::Turn {
                    until: last_seen + 300_000
                },
                "en".into()
            )
        ]
    );
    // Back within queue_idle: first in line, and told nothing again.
    clock.advance(Duration::from_secs(60));
    room.touch(ids[1]);
    room.leave(ids[2]);
    assert_eq!(room.state_of(ids[1]), Some(TicketState::Admitted));
    assert!(calls.take().is_empty());
}

#[test]
fn only_a_waiting_ticket_is_called_back_and_unsubscribing_stops_the_calls() {
    let (room, _, calls, _) = room_with(|s| s.notify_ahead = Some(10));
    let ids = join_n(&room, 3);
    room.tick();
    assert_eq!(
        room.subscribe(ids[0], callback("en")),
        Err(SubscribeError::NotWaiting(TicketState::Admitted))
    );
    room.subscribe(ids[1], callback("en")).unwrap();
    room.subscribe(ids[2], callback("en")).unwrap();
    assert!(room.unsubscribe(ids[2]));
    assert!(!room.unsubscribe(ids[2]));
    room.tick();
    assert_eq!(
        calls.take(),
        vec![(ids[1], Some(2), Notice::Ahead { ahead: 0 }, "en".into())]
    );
    // A new subscription keeps what was said already.
    room.subscribe(ids[1], callback("zh")).unwrap();
    room.tick();
    assert!(calls.take().is_empty());
    assert_eq!(room.callback_of(ids[1]).unwrap().callback.lang, "zh");
}

#[test]
fn callbacks_and_what_was_said_survive_an_image_and_a_replica() {
    let (room, _, calls, records) = room_with(|s| s.notify_ahead = Some(1));
    let ids = join_n(&room, 4);
    room.subscribe(ids[2], callback("ja")).unwrap();
    room.subscribe(ids[3], callback("zh")).unwrap();
    room.tick();
    assert_eq!(calls.take().len(), 1, "ids[2] is one ahead");

    // A restart from the image: the call made is not made again; the
    // other one still is when due.
    let restored = Room::restore(room.image(), room.clock.clone(), None);
    let again = Arc::new(Calls::default());
    restored.set_callouts(again.clone());
    assert_eq!(restored.callback_count(), 2);
    assert!(restored.callback_of(ids[2]).unwrap().ahead_sent);
    restored.leave(ids[0]);
    restored.tick();
    restored.leave(ids[1]);
    let made = again.take();
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(made.iter().any(|c| c.0 == ids[2] && c.2.is_turn()));
    assert!(
        made.iter()
            .any(|c| c.0 == ids[3] && c.2 == Notice::Ahead { ahead: 1 })
    );

    // A replica applying the records one by one knows the same, and a
    // replica never calls.
    let mut image = room.image();
    image.tickets.clear();
    image.queues.iter_mut().for_each(Vec::clear);
    let fresh = Room::create(room.settings(), room.clock.clone(), 7, None);
    let mut replayer = Replayer::new(fresh);
    let silent = Arc::new(Calls::default());
    replayer.room().set_callouts(silent.clone());
    for record in records.0.lock().unwrap().iter() {
        replayer.apply(record);
    }
    let replica = replayer.room();
    assert_eq!(replica.callback_count(), 2);
    assert!(replica.callback_of(ids[2]).unwrap().ahead_sent);
    assert!(!replica.callback_of(ids[3]).unwrap().ahead_sent);
    assert_eq!(replica.callback_of(ids[3]).unwrap().callback.lang, "zh");
    assert!(silent.take().is_empty());

    // The image applied record by record says the same.
    let mut applied = RoomImage {
        tickets: Vec::new(),
        ..room.image()
    };
    for record in records.0.lock().unwrap().iter() {
        applied.apply(record.as_event());
    }
    assert!(
        applied.tickets[ids[2] as usize]
            .callback
            .as_ref()
            .unwrap()
            .ahead_sent
    );
    // An end forgets the callback everywhere.
    room.leave(ids[3]);
    let last = records.0.lock().unwrap().last().cloned().unwrap();
    replayer.apply(&last);
    applied.apply(last.as_event());
    assert_eq!(room.callback_count(), 1);
    assert_eq!(replayer.room().callback_count(), 1);
    assert!(applied.tickets[ids[3] as usize].callback.is_none());
}

#[test]
fn images_with_and_without_callbacks_read_back_as_stored() {
    let (room, _, _, _) = room_with(|s| s.notify_ahead = Some(5));
    let ids = join_n(&room, 3);
    room.subscribe(ids[1], callback("ja")).unwrap();
    room.tick();
    let image = room.image();
    let bytes = postcard::to_allocvec(&image).unwrap();
    let back: RoomImage = postcard::from_bytes(&bytes).unwrap();
    assert_eq!(back, image);
    let plain = Room::new(
        RoomSettings::new(RoomId::new("p").unwrap()),
        room.clock.clone(),
    );
    join_n(&plain, 2);
    let image = plain.image();
    let back: RoomImage = postcard::from_bytes(&postcard::to_allocvec(&image).unwrap()).unwrap();
    assert_eq!(back, image);
}

#[test]
fn a_visitor_admitted_while_subscribing_is_still_told_their_turn() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const N: usize = 20_000;
    let (room, _clock, calls, _) = room_with(|_| {});
    let ids = join_n(&room, N);
    room.tick();
    assert_eq!(room.state_of(ids[0]), Some(TicketState::Admitted));
    // One thread subscribes each ticket in turn while another hands the
    // one permit down the line: each admission races the subscription
    // of the ticket it admits. A ticket leaves only once its own
    // subscription is done, so every subscription that was taken belongs
    // to a ticket that is admitted afterwards or meanwhile.
    let subscribed = AtomicUsize::new(0);
    let kept: Vec<bool> = std::thread::scope(|s| {
        s.spawn(|| {
            for (i, id) in ids.iter().enumerate().take(N - 1) {
                while subscribed.load(Ordering::Acquire) <= i {
                    std::hint::spin_loop();
                }
                for _ in 0..(i * 104_729) % 600 {
                    std::hint::spin_loop();
                }
                room.leave(*id);
            }
        });
        ids.iter()
            .enumerate()
            .map(|(i, id)| {
                // Both sides start a little later each time, over a
                // spread longer than a hand-off, so the admissions land
                // at every point of a subscription.
                for _ in 0..(i * 7_919) % 600 {
                    std::hint::spin_loop();
                }
                let ok = room.subscribe(*id, callback("en")).is_ok();
                subscribed.fetch_add(1, Ordering::Release);
                ok
            })
            .collect()
    });
    let told: std::collections::HashSet<TicketId> = calls
        .take()
        .into_iter()
        .filter(|c| c.2.is_turn())
        .map(|c| c.0)
        .collect();
    let missed: Vec<usize> = (0..N)
        .filter(|&i| kept[i] && !told.contains(&ids[i]))
        .collect();
    assert!(kept.iter().any(|k| *k), "no subscription was taken");
    assert_eq!(missed, Vec::<usize>::new(), "admitted without being told");
}
