//! Queueing modes on both backends, each switched live on a room with
//! people in it: `passthrough` admits everyone at once and still counts
//! them (so capacity holds again as soon as the room queues), `maintenance`
//! admits nobody and says so, `sold_out` closes the room for that reason
//! and can be lifted again.

use std::sync::Arc;

use narabu::backend::{Backend, BackendError, JoinRequest, RoomPatch};
use narabu::engine::rules::Mode;
use narabu::engine::{Departure, Handoff, TicketState};

use super::{join, rid, state};
use narabu_testkit::redis_server::{Harness, Kind};
use narabu_testkit::room;

conformance!(
    passthrough_admits_everyone_at_once_and_still_counts_them,
    maintenance_admits_nobody_and_the_status_says_why,
    sold_out_closes_the_room_and_can_be_lifted,
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
    let h = Harness::new(kind, vec![room("r", 1)]).await;
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
