//! Queueing modes on both backends, each switched live on a room with
//! people in it: `passthrough` admits everyone at once and still counts
//! them (so capacity holds again as soon as the room queues), `maintenance`
//! admits nobody and says so, `sold_out` closes the room for that reason
//! and can be lifted again. Stock: purchases reported from several
//! instances at once take it to zero, never below, and exactly one of them
//! turns the room sold out.

use std::sync::Arc;
use std::time::Duration;

use narabu::backend::{Backend, BackendError, JoinRequest, RoomPatch};
use narabu::engine::Patch;
use narabu::engine::rules::Mode;
use narabu::engine::{Departure, Handoff, TicketState};

use super::{join, rid, state};
use narabu_testkit::redis_server::{Harness, Kind};
use narabu_testkit::room;

conformance!(
    passthrough_admits_everyone_at_once_and_still_counts_them,
    maintenance_admits_nobody_and_the_status_says_why,
    sold_out_closes_the_room_and_can_be_lifted,
    stock_runs_out_once_under_concurrent_purchases,
    stock_changes_with_the_room_and_zero_means_sold_out,
    a_paused_room_admits_nobody_in_passthrough,
);

async fn set_mode(b: &Arc<dyn Backend>, mode: Mode) {
    let snap = b
        .patch_room(
            &rid("r"),
            RoomPatch {
                mode: Some(mode),
                ..RoomPatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(snap.settings.mode, mode);
    assert_eq!(snap.view.mode, mode);
}

/// Every permit accounted for, borrowed ones included.
async fn conserved(b: &Arc<dyn Backend>) -> narabu::engine::PermitLedger {
    let l = b.room(&rid("r")).await.unwrap().ledger;
    assert!(l.balances(), "ledger does not balance: {l:?}");
    l
}

async fn passthrough_admits_everyone_at_once_and_still_counts_them(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 2)]).await;
    let b = &h.backend;
    // Three wait in a full room of two.
    let first = [join(b, "r").await, join(b, "r").await];
    b.tick(&rid("r")).await.unwrap();
    let waiting = join(b, "r").await;
    assert_eq!(state(b, "r", waiting).await, TicketState::Waiting);

    set_mode(b, Mode::Passthrough).await;
    // Whoever was waiting goes in at the next turn, past the permits.
    assert_eq!(
        b.tick(&rid("r")).await.unwrap().admitted,
        vec![waiting.id as u32]
    );
    // A new visitor is admitted by the join itself.
    let mut passed = vec![waiting];
    for _ in 0..3 {
        let j = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
        assert_eq!(j.status.state, TicketState::Admitted);
        assert_eq!(j.status.mode, Mode::Passthrough);
        passed.push(j.ticket);
    }
    b.tick(&rid("r")).await.unwrap();
    let l = conserved(b).await;
    // Counted: six admitted in a room of two, four permits borrowed.
    assert_eq!(
        (l.capacity, l.admitted, l.held, l.tray, l.debt),
        (2, 6, 0, 0, 4)
    );
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!(snap.stats.admissions, 6);

    // Back to the line: nobody new goes in until fewer than two are in.
    set_mode(b, Mode::Queue).await;
    let next = join(b, "r").await;
    assert_eq!(state(b, "r", next).await, TicketState::Waiting);
    for t in &passed {
        assert_eq!(
            b.leave(&rid("r"), *t).await.unwrap(),
            Departure::GaveBack(Handoff::Retired)
        );
        assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    }
    // Two are in (the first two): the next finisher hands off.
    assert_eq!(
        b.leave(&rid("r"), first[0]).await.unwrap(),
        Departure::GaveBack(Handoff::To(next.id as u32))
    );
    let l = conserved(b).await;
    assert_eq!((l.admitted, l.debt), (2, 0));
}

async fn maintenance_admits_nobody_and_the_status_says_why(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let c = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(state(b, "r", a).await, TicketState::Admitted);

    set_mode(b, Mode::Maintenance).await;
    let s = b.status(&rid("r"), c, false).await.unwrap();
    assert_eq!(
        (s.state, s.mode, s.closed),
        (TicketState::Waiting, Mode::Maintenance, false)
    );
    assert_eq!(s.eta, None, "nobody is admitted, so there is no estimate");
    assert_eq!(s.position, Some(1));
    // The admitted visitor keeps the pass; the permit it gives back waits.
    assert_eq!(
        b.status(&rid("r"), a, true).await.unwrap().state,
        TicketState::Admitted
    );
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::Tray)
    );
    assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    // Joins still queue.
    let d = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
    assert_eq!(d.status.state, TicketState::Waiting);
    assert_eq!(d.status.position, Some(2));

    set_mode(b, Mode::Queue).await;
    assert_eq!(b.tick(&rid("r")).await.unwrap().admitted, vec![c.id as u32]);
    conserved(b).await;
}

async fn sold_out_closes_the_room_and_can_be_lifted(kind: Kind) {
    let mut s = room("r", 1);
    s.join_limit_per_minute = 2;
    let h = Harness::new(kind, vec![s]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let c = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();

    set_mode(b, Mode::SoldOut).await;
    // Live tickets are told the room closed, and why.
    for t in [a, c] {
        let s = b.status(&rid("r"), t, false).await.unwrap();
        assert!(s.closed, "{s:?}");
        assert_eq!(s.closed_reason(), "sold_out");
        assert_eq!(s.status().name(), "closed");
    }
    assert!(matches!(
        b.join(&rid("r"), JoinRequest::anonymous()).await,
        Err(BackendError::SoldOut(_))
    ));
    // An address past its join limit is told the room is sold out, not to
    // come back in a minute; so is a join that lacks its proof of work.
    let from = |refuse_new| JoinRequest {
        client: Some("192.0.2.7".parse().unwrap()),
        refuse_new,
        ..JoinRequest::default()
    };
    set_mode(b, Mode::Queue).await;
    for _ in 0..2 {
        let t = b.join(&rid("r"), from(false)).await.unwrap().ticket;
        b.leave(&rid("r"), t).await.unwrap();
    }
    assert!(matches!(
        b.join(&rid("r"), from(false)).await,
        Err(BackendError::JoinLimited { .. })
    ));
    set_mode(b, Mode::SoldOut).await;
    for refuse_new in [false, true] {
        assert!(matches!(
            b.join(&rid("r"), from(refuse_new)).await,
            Err(BackendError::SoldOut(_))
        ));
    }
    // A finisher still gives the permit back; nobody is admitted.
    assert_eq!(
        b.release(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::Tray)
    );
    assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    assert_eq!(state(b, "r", c).await, TicketState::Waiting);

    // Lifted: the line is as it was.
    set_mode(b, Mode::Queue).await;
    let s = b.status(&rid("r"), c, false).await.unwrap();
    assert!(!s.closed);
    assert_eq!(s.position, Some(1));
    assert_eq!(b.tick(&rid("r")).await.unwrap().admitted, vec![c.id as u32]);
    assert!(b.join(&rid("r"), JoinRequest::anonymous()).await.is_ok());
    conserved(b).await;
}

/// 90 reports of one unit each, from three instances at once, on a stock
/// of 50: every unit is taken exactly once (the stock left after each
/// report is 49 down to 1 once each, then 0), it never goes below zero,
/// and exactly one report ends the sale.
async fn stock_runs_out_once_under_concurrent_purchases(kind: Kind) {
    let mut s = room("r", 5);
    s.stock = Some(50);
    let h = Harness::instances(kind, vec![s], 3).await;
    let waiting = join(&h.backend, "r").await;
    let mut tasks = Vec::new();
    for i in 0..90 {
        let b = h.backends[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            b.purchase(&rid("r"), 1)
                .await
                .unwrap()
                .expect("the room counts stock")
        }));
    }
    let mut lefts = Vec::new();
    let mut endings = 0;
    for t in tasks {
        let taken = t.await.unwrap();
        let mode = if taken.left == 0 {
            Mode::SoldOut
        } else {
            Mode::Queue
        };
        assert_eq!(taken.mode, mode);
        lefts.push(taken.left);
        endings += usize::from(taken.sold_out_now);
    }
    assert_eq!(endings, 1, "the sale ends once");
    lefts.sort_unstable();
    let mut want = vec![0; 41];
    want.extend(1..=49);
    assert_eq!(lefts, want);
    // Each report was answered on the instance it went to, once that
    // instance's copy held it; another instance's copy shows the last one
    // as soon as it has read the room's log that far.
    narabu_testkit::eventually(
        "the last report reaches every copy",
        Duration::from_secs(5),
        || async { h.backend.room(&rid("r")).await.unwrap().settings.stock == Some(0) },
    )
    .await;
    let snap = h.backend.room(&rid("r")).await.unwrap();
    assert_eq!(
        (snap.settings.stock, snap.settings.mode),
        (Some(0), Mode::SoldOut)
    );
    assert_eq!((snap.view.stock, snap.view.mode), (Some(0), Mode::SoldOut));
    let s = h.backend.status(&rid("r"), waiting, false).await.unwrap();
    assert!(s.closed && s.closed_reason() == "sold_out", "{s:?}");
    assert_eq!(s.stock, Some(0));
    assert!(matches!(
        h.backends[2]
            .join(&rid("r"), JoinRequest::anonymous())
            .await,
        Err(BackendError::SoldOut(_))
    ));
}

async fn stock_changes_with_the_room_and_zero_means_sold_out(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    // A room without stock counts nothing.
    assert_eq!(b.purchase(&rid("r"), 3).await.unwrap(), None);
    let t = join(b, "r").await;
    let stock = |v| RoomPatch {
        stock: Patch::Value(v),
        ..RoomPatch::default()
    };
    let snap = b.patch_room(&rid("r"), stock(4)).await.unwrap();
    assert_eq!((snap.settings.stock, snap.view.stock), (Some(4), Some(4)));
    let taken = b.purchase(&rid("r"), 3).await.unwrap().unwrap();
    assert_eq!(
        (taken.left, taken.mode, taken.sold_out_now),
        (1, Mode::Queue, false)
    );
    // The waiting page reads the stock left from the status.
    assert_eq!(b.status(&rid("r"), t, false).await.unwrap().stock, Some(1));
    // More than is left takes what is left.
    let taken = b.purchase(&rid("r"), 5).await.unwrap().unwrap();
    assert_eq!(
        (taken.left, taken.before, taken.sold_out_now),
        (0, Mode::Queue, true)
    );
    // Restocked and reopened in one change.
    let reopen = RoomPatch {
        mode: Some(Mode::Queue),
        ..stock(10)
    };
    let snap = b.patch_room(&rid("r"), reopen).await.unwrap();
    assert_eq!(
        (snap.settings.stock, snap.settings.mode),
        (Some(10), Mode::Queue)
    );
    assert!(!b.status(&rid("r"), t, false).await.unwrap().closed);
    // Stock no longer counted.
    let none = RoomPatch {
        stock: Patch::Null,
        ..RoomPatch::default()
    };
    assert_eq!(
        b.patch_room(&rid("r"), none).await.unwrap().view.stock,
        None
    );
    assert_eq!(b.purchase(&rid("r"), 1).await.unwrap(), None);
}

/// Pause stops admission in every mode: a passthrough join waits until the
/// room is resumed, and then goes in past the permits.
async fn a_paused_room_admits_nobody_in_passthrough(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let first = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    let pause = |paused| RoomPatch {
        paused: Some(paused),
        mode: Some(Mode::Passthrough),
        ..RoomPatch::default()
    };
    b.patch_room(&rid("r"), pause(true)).await.unwrap();
    let j = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
    assert_eq!(j.status.state, TicketState::Waiting);
    assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    b.patch_room(&rid("r"), pause(false)).await.unwrap();
    assert_eq!(
        b.tick(&rid("r")).await.unwrap().admitted,
        vec![j.ticket.id as u32]
    );
    assert_eq!(state(b, "r", first).await, TicketState::Admitted);
    let l = conserved(b).await;
    assert_eq!((l.admitted, l.debt), (2, 1));
}
