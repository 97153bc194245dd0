//! Scenario tests of one room on virtual time.

use std::sync::Arc;
use std::time::Duration;

use super::*;

const T0: u64 = 1_800_000_000_000;

fn room_with(capacity: u32, f: impl FnOnce(&mut RoomSettings)) -> (Arc<Room>, ManualClock) {
    let clock = ManualClock::new(T0);
    let mut s = RoomSettings::new(RoomId::new("test").unwrap());
    s.capacity = capacity;
    f(&mut s);
    (Room::new(s, Arc::new(clock.clone())), clock)
}

fn room(capacity: u32) -> (Arc<Room>, ManualClock) {
    room_with(capacity, |_| {})
}

fn join_n(room: &Room, n: usize) -> Vec<TicketId> {
    (0..n).map(|_| room.join(None).unwrap().ticket).collect()
}

fn state(room: &Room, id: TicketId) -> TicketState {
    room.state_of(id).unwrap()
}

fn position(room: &Room, id: TicketId) -> Option<u64> {
    room.status(id).unwrap().position
}

#[test]
fn joins_only_queue_and_the_worker_admits_from_the_head() {
    let (room, _) = room(2);
    let ids = join_n(&room, 10);
    assert!(
        ids.iter()
            .all(|&id| state(&room, id) == TicketState::Waiting)
    );
    let numbers: Vec<_> = ids
        .iter()
        .map(|&id| room.status(id).unwrap().number.unwrap())
        .collect();
    assert_eq!(numbers, (1..=10).collect::<Vec<_>>());

    let report = room.tick();
    assert_eq!(report.admitted, ids[..2].to_vec());
    let positions: Vec<_> = ids[2..].iter().map(|&id| position(&room, id)).collect();
    assert_eq!(positions, (1..=8).map(Some).collect::<Vec<_>>());
    assert_eq!(room.admitted_count(), 2);
    assert!(room.ledger().balances());
}

#[test]
fn the_same_identity_gets_the_same_ticket() {
    let (room, _) = room(1);
    let a = room.join(Some(Identity(7))).unwrap();
    let b = room.join(Some(Identity(7))).unwrap();
    let c = room.join(Some(Identity(8))).unwrap();
    assert!(a.is_new && !b.is_new && c.is_new);
    assert_eq!(a.ticket, b.ticket);
    assert_eq!(a.number, b.number);
    assert_ne!(a.ticket, c.ticket);
    assert_eq!(room.waiting_count(), 2);
}

#[test]
fn a_while_live_identity_is_free_again_once_its_ticket_ended() {
    let (room, _) = room(1);
    let lane = 0;
    let key = Some(Identity(7));
    let a = room.join_bound(key, lane, Binding::WhileLive).unwrap();
    let again = room.join_bound(key, lane, Binding::WhileLive).unwrap();
    assert_eq!((again.ticket, again.is_new), (a.ticket, false));
    room.leave(a.ticket);
    assert_eq!(room.ticket_bound(Identity(7), Binding::WhileLive), None);
    let b = room.join_bound(key, lane, Binding::WhileLive).unwrap();
    assert!(b.is_new);
    assert_ne!(b.ticket, a.ticket);
    assert_eq!(room.ticket_of(Identity(7)), Some(b.ticket));

    // An account holds its one place for good, ended or not.
    let account = Some(Identity(8));
    let c = room.join(account).unwrap();
    room.leave(c.ticket);
    let d = room.join(account).unwrap();
    assert_eq!((d.ticket, d.is_new), (c.ticket, false));
}

#[test]
fn a_finisher_hands_its_permit_straight_to_the_head() {
    let (room, _) = room(1);
    let ids = join_n(&room, 3);
    room.tick();
    let notify = room.ticket_notify(ids[1]);
    {
        let woken = notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();

        assert_eq!(room.leave(ids[0]), Departure::GaveBack(Handoff::To(ids[1])));
        assert_eq!(state(&room, ids[1]), TicketState::Admitted);
        assert_eq!(position(&room, ids[2]), Some(1));
        // The next visitor's watcher was told at once, without a tick.
        let waker = futures_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(woken.as_mut().poll(&mut cx).is_ready());
    }
    room.forget_ticket_notify(ids[1], notify);
}

fn futures_waker() -> std::task::Waker {
    std::task::Waker::noop().clone()
}

use std::future::Future;

#[test]
fn with_nobody_waiting_the_permit_goes_to_the_tray_and_back_to_the_hand() {
    let (room, _) = room(1);
    let a = room.join(None).unwrap().ticket;
    room.tick();
    assert_eq!(room.release(a), Departure::GaveBack(Handoff::Tray));
    let l = room.ledger();
    assert_eq!((l.held, l.tray, l.admitted), (0, 1, 0));
    let b = room.join(None).unwrap().ticket;
    let report = room.tick();
    assert_eq!(report.admitted, vec![b]);
    let l = room.ledger();
    assert_eq!((l.held, l.tray, l.admitted), (0, 0, 1));
}

#[test]
fn releasing_twice_or_after_revocation_frees_nothing() {
    let (room, _) = room(1);
    let ids = join_n(&room, 3);
    room.tick();
    assert!(matches!(room.release(ids[0]), Departure::GaveBack(_)));
    assert_eq!(
        room.release(ids[0]),
        Departure::Nothing(TicketState::Released)
    );
    assert_eq!(
        room.revoke(ids[1]),
        Departure::GaveBack(Handoff::To(ids[2]))
    );
    assert_eq!(room.leave(ids[1]), Departure::Nothing(TicketState::Revoked));
    assert_eq!(room.admitted_count(), 1);
    assert!(room.ledger().balances());
    // Releasing a ticket that is still waiting frees nothing either.
    let d = room.join(None).unwrap().ticket;
    assert_eq!(room.release(d), Departure::Nothing(TicketState::Waiting));
    assert_eq!(room.release(9_999), Departure::Nothing(TicketState::Left));
}

#[test]
fn a_pass_that_never_arrives_or_goes_idle_is_revoked_by_the_worker() {
    let (room, clock) = room_with(2, |s| {
        s.arrival_grace = Duration::from_secs(120);
        s.pass_idle = Duration::from_secs(600);
        // Waiting pages that look in rarely still count as present here.
        s.away_grace = Duration::from_secs(299);
    });
    let ids = join_n(&room, 4);
    room.tick();
    // The first visitor arrives (a gate check); the second never does.
    clock.advance(Duration::from_secs(1));
    room.touch(ids[0]);
    clock.advance(Duration::from_secs(119));
    assert!(room.tick().expired.is_empty());
    clock.advance(Duration::from_secs(1));
    let report = room.tick();
    assert_eq!(report.expired, vec![ids[1]]);
    assert_eq!(report.admitted, vec![ids[2]]);
    // A late release of the expired ticket frees nothing.
    assert_eq!(room.leave(ids[1]), Departure::Nothing(TicketState::Expired));

    // The first goes idle: 600 s after its last sign of life.
    room.touch(ids[2]);
    // ids[3] still waits, its page open (a stream touches it now and then).
    clock.advance(Duration::from_secs(240));
    room.touch(ids[3]);
    clock.advance(Duration::from_secs(241));
    let report = room.tick();
    assert_eq!(report.expired, vec![ids[0]]);
    assert_eq!(report.admitted, vec![ids[3]]);
    assert!(room.ledger().balances());
    assert_eq!(room.stats().expirations, 2);
}

#[test]
fn quiet_waiters_are_skipped_and_swept() {
    let (room, clock) = room_with(1, |s| {
        s.queue_idle = Duration::from_secs(300);
        // Present between polls: this is about going quiet, not away.
        s.away_grace = Duration::from_secs(299);
    });
    let ids = join_n(&room, 4);
    room.tick();
    clock.advance(Duration::from_secs(200));
    // ids[2] keeps polling; ids[1] and ids[3] go quiet.
    room.touch(ids[2]);
    room.touch(ids[0]);
    clock.advance(Duration::from_secs(101));
    let report = room.tick();
    assert_eq!(report.abandoned, 2);
    assert_eq!(state(&room, ids[1]), TicketState::Abandoned);
    assert_eq!(position(&room, ids[2]), Some(1));
    assert_eq!(
        room.leave(ids[0]),
        Departure::GaveBack(Handoff::To(ids[2])),
        "the hand-off skips the abandoned ticket"
    );
}

#[test]
fn lowering_capacity_admits_nobody_new_until_below_it() {
    let (room, _) = room(4);
    let ids = join_n(&room, 10);
    room.tick();
    assert_eq!(room.admitted_count(), 4);
    room.set_capacity(2);
    // Nobody is revoked; the next two finishers retire their permits.
    assert_eq!(room.admitted_count(), 4);
    assert_eq!(room.leave(ids[0]), Departure::GaveBack(Handoff::Retired));
    room.tick();
    assert_eq!(room.admitted_count(), 3);
    assert_eq!(room.leave(ids[1]), Departure::GaveBack(Handoff::Retired));
    assert_eq!(room.admitted_count(), 2);
    // At the new capacity, a finisher hands off again.
    assert_eq!(room.leave(ids[2]), Departure::GaveBack(Handoff::To(ids[4])));
    assert!(room.ledger().balances());
    assert_eq!(room.stats().peak_admitted, 4);

    room.set_capacity(5);
    let report = room.tick();
    assert_eq!(report.admitted, ids[5..8].to_vec());
    assert_eq!(room.admitted_count(), 5);
    assert!(room.ledger().balances());
}

#[test]
fn pausing_stops_admission_and_resuming_restarts_it() {
    let (room, _) = room(1);
    let ids = join_n(&room, 3);
    room.tick();
    room.set_paused(true);
    assert_eq!(room.leave(ids[0]), Departure::GaveBack(Handoff::Tray));
    assert!(room.tick().admitted.is_empty());
    assert_eq!(room.status(ids[1]).unwrap().eta, None);
    room.set_paused(false);
    assert_eq!(room.tick().admitted, vec![ids[1]]);
}

#[test]
fn a_scheduled_room_draws_its_pre_queue_at_opening() {
    let (room, clock) = room_with(1, |s| s.opens_at = Some(T0 + 60_000));
    let early: Vec<_> = join_n(&room, 50);
    let commitment = room.view().lottery_commitment.clone().unwrap();
    let sealed = room.draw_record().unwrap();
    assert_eq!(
        (sealed.seed, sealed.order),
        (None, None),
        "nothing before opening"
    );
    assert_eq!(room.view().lottery_seed, None);
    assert!(
        early
            .iter()
            .all(|&id| room.status(id).unwrap().number.is_none())
    );
    assert!(room.tick().admitted.is_empty(), "closed until opens_at");

    room.leave(early[3]);
    clock.advance(Duration::from_secs(60));
    // Their pages are open: the instance renews their presence.
    room.renew(early.iter().copied());
    let report = room.tick();
    assert!(report.opened);
    let late = room.join(None).unwrap();
    assert_eq!(
        late.number,
        Some(51),
        "later arrivals queue behind the draw"
    );

    // Anyone can recompute the order from the revealed seed.
    let seed_hex = room.view().lottery_seed.clone().unwrap();
    let mut seed = [0u8; 32];
    hex::decode_to_slice(&seed_hex, &mut seed).unwrap();
    let seed = LotterySeed(seed);
    assert_eq!(seed.commitment(), commitment);
    let expected = seed.draw(&early);
    let mut by_number = early.clone();
    by_number.sort_by_key(|&id| room.status(id).unwrap().number.unwrap());
    assert_eq!(by_number, expected);
    assert_ne!(expected, early, "50 early joiners should be shuffled");
    // The published record is exactly that order, and checks out.
    let record = room.draw_record().unwrap();
    assert_eq!(record.commitment, commitment);
    assert_eq!(record.seed.as_deref(), Some(seed_hex.as_str()));
    assert_eq!(record.order.as_ref(), Some(&expected));
    assert_eq!(record.verify(), Ok(()));

    // The first drawn ticket that did not leave was admitted.
    let first = *expected.iter().find(|&&id| id != early[3]).unwrap();
    assert_eq!(report.admitted, vec![first]);
    // Positions count only those still waiting (the leaver is skipped).
    let waiting = room.waiting_count();
    assert_eq!(room.status(late.ticket).unwrap().position, Some(waiting));
}

#[test]
fn a_fifo_room_keeps_arrival_order_and_can_be_opened_early() {
    let (room, _) = room_with(2, |s| {
        s.opens_at = Some(T0 + 3_600_000);
        s.order = Order::Fifo;
    });
    let ids = join_n(&room, 5);
    assert_eq!(room.view().lottery_commitment, None);
    room.open_now();
    let numbers: Vec<_> = ids
        .iter()
        .map(|&id| room.status(id).unwrap().number.unwrap())
        .collect();
    assert_eq!(numbers, vec![1, 2, 3, 4, 5]);
    assert_eq!(room.draw_record(), None, "a fifo room has no draw");
    assert_eq!(room.tick().admitted, ids[..2].to_vec());
}

#[test]
fn the_admission_cap_paces_admissions() {
    let (room, clock) = room_with(100, |s| s.admit_per_minute = Some(120));
    join_n(&room, 50);
    assert_eq!(room.tick().admitted.len(), 2, "two per second");
    clock.advance(Duration::from_millis(500));
    assert_eq!(room.tick().admitted.len(), 1);
    clock.advance(Duration::from_millis(500));
    assert_eq!(room.tick().admitted.len(), 1);
}

#[test]
fn the_eta_follows_the_observed_rate() {
    let (room, clock) = room(1);
    let ids = join_n(&room, 30);
    room.tick();
    for (i, &id) in ids.iter().enumerate().take(10) {
        clock.advance(Duration::from_secs(1));
        room.leave(id);
        room.tick();
        let _ = i;
    }
    let status = room.status(ids[20]).unwrap();
    let eta = status.eta.expect("a rate has been observed");
    assert!(eta.low_secs <= eta.expected_secs && eta.expected_secs <= eta.high_secs);
    assert!((8..=12).contains(&eta.expected_secs), "{eta:?}");
    // 11 of the 20 who were ahead at join have gone.
    assert!((status.progress - 0.55).abs() < 1e-9, "{}", status.progress);
}

#[test]
fn a_closed_room_refuses_joins_and_stops_admitting() {
    let (room, _) = room(1);
    let a = room.join(None).unwrap().ticket;
    room.close();
    assert_eq!(room.join(None), Err(JoinError::Closed));
    assert!(room.tick().admitted.is_empty());
    assert!(room.view().closed);
    assert!(room.status(a).unwrap().closed);
}

#[test]
fn the_view_is_published_only_when_something_changed() {
    let (room, _) = room(1);
    let mut rx = room.subscribe_view();
    rx.mark_unchanged();
    room.tick();
    assert!(!rx.has_changed().unwrap());
    room.join(None).unwrap();
    room.tick();
    assert!(rx.has_changed().unwrap());
    assert_eq!(rx.borrow_and_update().admitted, 1);
}

fn streams(holder: u64, full: bool, opened: &[TicketId], closed: &[TicketId]) -> StreamReport {
    StreamReport {
        holder,
        full,
        opened: opened.to_vec(),
        closed: closed.to_vec(),
    }
}

#[test]
fn an_open_stream_keeps_its_visitor_present_without_renewals() {
    let (room, clock) = room_with(0, |s| {
        s.away_grace = Duration::from_secs(20);
        s.queue_idle = Duration::from_secs(300);
    });
    let ids = join_n(&room, 3);
    // One holder holds the first two tickets' streams; nothing more is
    // heard of any ticket but that the holder is still there.
    room.hold_streams(&streams(9, true, &ids[..2], &[]));
    for _ in 0..6 {
        clock.advance(Duration::from_secs(10));
        room.hold_streams(&streams(9, false, &[], &[]));
        room.tick();
    }
    room.patch(&RoomPatch {
        capacity: Some(3),
        ..RoomPatch::default()
    });
    let admitted = room.tick().admitted;
    // The held ones are admitted; the third, quiet for a minute, skipped.
    assert_eq!(admitted, ids[..2].to_vec());
    assert_eq!(state(&room, ids[2]), TicketState::Away);
    // Its stream opens: it is back at once, first in line.
    room.hold_streams(&streams(9, false, &[ids[2]], &[]));
    assert_eq!(state(&room, ids[2]), TicketState::Waiting);
    assert_eq!(room.tick().admitted, [ids[2]]);
    // An admitted ticket whose stream is open keeps its pass too.
    clock.advance(Duration::from_secs(600));
    room.hold_streams(&streams(9, false, &[], &[]));
    room.tick();
    assert!(
        ids.iter()
            .all(|&id| state(&room, id) == TicketState::Admitted)
    );
    assert_eq!(room.holders(), [(9, 3)]);
}

#[test]
fn a_closed_stream_counts_from_the_close_and_a_silent_holder_lapses() {
    let (room, clock) = room_with(0, |s| {
        s.away_grace = Duration::from_secs(20);
        s.queue_idle = Duration::from_secs(300);
    });
    let ids = join_n(&room, 4);
    room.hold_streams(&streams(1, false, &[ids[0], ids[1]], &[]));
    room.hold_streams(&streams(2, false, &[ids[2], ids[3]], &[]));
    clock.advance(Duration::from_secs(30));
    // Holder 1 closes ticket 0's stream; holder 2 falls silent after this.
    room.hold_streams(&streams(1, false, &[], &[ids[0]]));
    room.hold_streams(&streams(2, false, &[], &[]));
    clock.advance(Duration::from_secs(15));
    room.hold_streams(&streams(1, false, &[], &[]));
    room.tick();
    // Within a grace of the close and of holder 2's last report: all
    // present.
    room.patch(&RoomPatch {
        capacity: Some(1),
        ..RoomPatch::default()
    });
    assert_eq!(room.tick().admitted, [ids[0]]);
    clock.advance(Duration::from_secs(6));
    room.hold_streams(&streams(1, false, &[], &[]));
    // Holder 2 was last heard 21 s ago: it lapses, and its tickets count as
    // seen then, so they are away; ticket 1's holder is still there.
    room.tick();
    assert_eq!(room.holders(), [(1, 1)]);
    room.patch(&RoomPatch {
        capacity: Some(4),
        ..RoomPatch::default()
    });
    assert_eq!(room.tick().admitted, [ids[1]]);
    assert_eq!(state(&room, ids[2]), TicketState::Away);
    assert_eq!(state(&room, ids[3]), TicketState::Away);
}

#[test]
fn a_whole_list_replaces_what_was_known_of_its_holder() {
    let (room, clock) = room_with(0, |s| {
        s.away_grace = Duration::from_secs(20);
    });
    let ids = join_n(&room, 3);
    let generation = room.hold_streams(&streams(5, false, &[ids[0], ids[1]], &[]));
    clock.advance(Duration::from_secs(30));
    // The holder's whole list no longer has ticket 0: let go, seen now.
    assert_eq!(
        room.hold_streams(&streams(5, true, &[ids[1], ids[2]], &[])),
        generation,
        "the same engine answers with the same generation"
    );
    assert_eq!(room.holders(), [(5, 2)]);
    clock.advance(Duration::from_secs(21));
    room.hold_streams(&streams(5, false, &[], &[]));
    room.patch(&RoomPatch {
        capacity: Some(3),
        ..RoomPatch::default()
    });
    assert_eq!(room.tick().admitted, ids[1..].to_vec());
    assert_eq!(state(&room, ids[0]), TicketState::Away);
    // Another engine of the room (restored from its image) has another
    // generation and knows no holder.
    let copy = Room::restore(room.image(), Arc::new(clock.clone()), None);
    assert!(copy.holders().is_empty());
    assert_ne!(copy.hold_streams(&streams(5, false, &[], &[])), generation);
}
