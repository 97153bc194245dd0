//! What spans instances, on both backends: operators' changes made at
//! once (each applied as one step, so none is lost) and the per-address
//! join limit (one log per room and address, whichever instance takes the
//! join). On Redis `Harness::instances` gives each instance its own
//! backend on the one Redis; embedded, one process is one instance.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use narabu::backend::{Backend, BackendError, JoinRequest, RoomPatch};
use narabu::engine::{Identity, Patch, RoomSettings, TicketState};

use super::{rid, state};
use narabu_testkit::redis_server::{Harness, Kind};
use narabu_testkit::room;

conformance!(
    the_join_limit_holds_across_instances,
    a_visitor_with_a_ticket_is_never_limited,
    a_carrier_nat_is_not_limited_by_default,
    concurrent_patches_of_different_fields_all_take_effect,
    a_patch_with_null_removes_the_cap_and_keeps_the_rest,
);

fn from(address: &str) -> JoinRequest {
    JoinRequest {
        client: Some(address.parse::<IpAddr>().unwrap()),
        ..JoinRequest::default()
    }
}

/// Join from `address` on instance `i` (of three): a new ticket, or how
/// long until one.
async fn try_join(h: &Harness, i: usize, address: &str) -> Result<(), Duration> {
    match h.backends[i % h.backends.len()]
        .join(&rid("r"), from(address))
        .await
    {
        Ok(j) => {
            assert!(j.is_new);
            Ok(())
        }
        Err(BackendError::JoinLimited { limit, retry_after }) => {
            assert_eq!(limit, 5);
            Err(retry_after)
        }
        Err(e) => panic!("join failed: {e}"),
    }
}

/// Five new tickets a minute per address, spread over three instances:
/// five in all, not five each; the window slides, and the wait named is
/// exactly until the oldest join leaves it.
async fn the_join_limit_holds_across_instances(kind: Kind) {
    let mut s = room("r", 1);
    s.join_limit_per_minute = 5;
    let h = Harness::instances(kind, vec![s], 3).await;
    // One join every 10 s: at 0, 10, 20, 30 and 40 s.
    for i in 0..5 {
        try_join(&h, i, "203.0.113.7").await.unwrap();
        h.clock.advance(Duration::from_secs(10));
    }
    // At 50 s every instance refuses: the first leaves the window at 60 s.
    for i in 0..3 {
        assert_eq!(
            try_join(&h, i, "203.0.113.7").await,
            Err(Duration::from_secs(10)),
            "instance {i}"
        );
    }
    // Another address has its own allowance, and a join with no address
    // (none known) is not limited.
    try_join(&h, 1, "198.51.100.1").await.unwrap();
    h.backends[2]
        .join(&rid("r"), JoinRequest::anonymous())
        .await
        .unwrap();
    // At 60 s one more fits, then the next waits for the join at 10 s.
    h.clock.advance(Duration::from_secs(10));
    try_join(&h, 2, "203.0.113.7").await.unwrap();
    assert_eq!(
        try_join(&h, 0, "203.0.113.7").await,
        Err(Duration::from_secs(10))
    );
    let snap = h.backend.room(&rid("r")).await.unwrap();
    assert_eq!(snap.stats.joins, 5 + 1 + 1 + 1);
}

/// Thousands of phones behind one carrier-grade NAT all join in the
/// opening minute: with the default limit every one gets a ticket, over
/// three instances. The limit still exists: a machine that keeps going
/// past it in the same minute is refused.
async fn a_carrier_nat_is_not_limited_by_default(kind: Kind) {
    let s = room("r", 1);
    let limit = s.join_limit_per_minute;
    assert_eq!(limit, RoomSettings::DEFAULT_JOIN_LIMIT_PER_MINUTE);
    let h = Harness::instances(kind, vec![s], 3).await;
    let phones = 4_000;
    // One join every 15 ms: the 4,000 joins span the opening minute.
    for i in 0..phones {
        let joined = h.backends[i % 3]
            .join(&rid("r"), from("192.0.2.1"))
            .await
            .unwrap_or_else(|e| panic!("phone {i} refused: {e}"));
        assert!(joined.is_new);
        h.clock.advance(Duration::from_millis(15));
    }
    let snap = h.backend.room(&rid("r")).await.unwrap();
    assert_eq!(snap.stats.joins, phones as u64);
    // A single machine flooding from the address meets the limit within
    // the same minute.
    let mut refused = None;
    for i in phones..2 * limit as usize {
        if let Err(e) = h.backends[i % 3].join(&rid("r"), from("192.0.2.1")).await {
            refused = Some((i, e));
            break;
        }
    }
    let (i, e) = refused.expect("the limit never held");
    assert!(matches!(e, BackendError::JoinLimited { .. }), "{e}");
    assert!(i < 2 * limit as usize);
}

async fn a_visitor_with_a_ticket_is_never_limited(kind: Kind) {
    let mut s = room("r", 1);
    s.join_limit_per_minute = 1;
    let h = Harness::instances(kind, vec![s], 2).await;
    let address = "2001:db8::";
    let me = Identity(42);
    let first = h.backends[0]
        .join(
            &rid("r"),
            JoinRequest {
                identity: Some(me),
                ..from(address)
            },
        )
        .await
        .unwrap();
    assert!(first.is_new);
    assert!(matches!(
        h.backends[1].join(&rid("r"), from(address)).await,
        Err(BackendError::JoinLimited { .. })
    ));
    // The ticket carried (cookie or bearer), and the same identity again,
    // get the same ticket back from any instance, limit or not.
    for b in &h.backends {
        let again = b
            .join(
                &rid("r"),
                JoinRequest {
                    held: Some(first.ticket),
                    replace_ended: true,
                    ..from(address)
                },
            )
            .await
            .unwrap();
        assert_eq!((again.ticket, again.is_new), (first.ticket, false));
        let same = b
            .join(
                &rid("r"),
                JoinRequest {
                    identity: Some(me),
                    ..from(address)
                },
            )
            .await
            .unwrap();
        assert_eq!((same.ticket, same.is_new), (first.ticket, false));
    }
    // Once it has ended, a carried ticket is answered as it is, or replaced
    // by a new one, which counts against the limit.
    h.backend.leave(&rid("r"), first.ticket).await.unwrap();
    let ended = h.backends[1]
        .join(
            &rid("r"),
            JoinRequest {
                held: Some(first.ticket),
                ..from(address)
            },
        )
        .await
        .unwrap();
    assert_eq!(ended.status.state, TicketState::Left);
    assert!(!ended.is_new);
    assert!(matches!(
        h.backends[1]
            .join(
                &rid("r"),
                JoinRequest {
                    held: Some(first.ticket),
                    replace_ended: true,
                    ..from(address)
                },
            )
            .await,
        Err(BackendError::JoinLimited { .. })
    ));
    assert_eq!(
        state(&h.backend, "r", first.ticket).await,
        TicketState::Left
    );
}

/// Operators on two instances change different fields of one room at the
/// same moment, twenty times: every change takes effect.
async fn concurrent_patches_of_different_fields_all_take_effect(kind: Kind) {
    let h = Harness::instances(kind, vec![room("r", 5)], 2).await;
    for round in 0..20u32 {
        let patches = [
            RoomPatch {
                join_limit_per_minute: Some(100 + round),
                ..RoomPatch::default()
            },
            RoomPatch {
                admit_per_minute: Patch::Value(600 + round),
                ..RoomPatch::default()
            },
            RoomPatch {
                capacity: Some(10 + round),
                ..RoomPatch::default()
            },
            RoomPatch {
                paused: Some(round % 2 == 0),
                pass_idle: Some(Duration::from_secs(60 + u64::from(round))),
                ..RoomPatch::default()
            },
        ];
        let tasks: Vec<_> = patches
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let b: Arc<dyn Backend> = h.backends[i % 2].clone();
                tokio::spawn(async move { b.patch_room(&rid("r"), p).await.unwrap() })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // The reading instance's copy holds its own patches at once and
        // the other instance's once it has read the log that far.
        let reader = h.backends[1].clone();
        narabu_testkit::eventually(
            "the other instance's patches",
            Duration::from_secs(5),
            || {
                let reader = reader.clone();
                async move {
                    let s = reader.room(&rid("r")).await.unwrap().settings;
                    s.join_limit_per_minute == 100 + round && s.capacity == 10 + round
                }
            },
        )
        .await;
        let snap = h.backends[1].room(&rid("r")).await.unwrap();
        let s = &snap.settings;
        assert_eq!(s.join_limit_per_minute, 100 + round, "round {round}");
        assert_eq!(s.admit_per_minute, Some(600 + round), "round {round}");
        assert_eq!(s.capacity, 10 + round, "round {round}");
        assert_eq!(s.paused, round % 2 == 0, "round {round}");
        assert_eq!(s.pass_idle, Duration::from_secs(60 + u64::from(round)));
        assert!(snap.ledger.balances(), "{:?}", snap.ledger);
        assert_eq!(snap.ledger.held, u64::from(10 + round));
    }
}

async fn a_patch_with_null_removes_the_cap_and_keeps_the_rest(kind: Kind) {
    let mut s = room("r", 10);
    // One a second, one at a time.
    s.admit_per_minute = Some(60);
    s.queue_idle = Duration::from_secs(600);
    let h = Harness::new(kind, vec![s]).await;
    let b = &h.backend;
    for _ in 0..3 {
        super::join(b, "r").await;
    }
    assert_eq!(b.tick(&rid("r")).await.unwrap().admitted.len(), 1);
    assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    let snap = b
        .patch_room(
            &rid("r"),
            RoomPatch {
                admit_per_minute: Patch::Null,
                ..RoomPatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(snap.settings.admit_per_minute, None);
    assert_eq!(snap.settings.capacity, 10);
    assert_eq!(snap.settings.queue_idle, Duration::from_secs(600));
    // Without the cap, the rest go in at once.
    assert_eq!(b.tick(&rid("r")).await.unwrap().admitted.len(), 2);
    // Leaving a field out keeps it: a patch of nothing changes nothing.
    let same = b.patch_room(&rid("r"), RoomPatch::default()).await.unwrap();
    assert_eq!(same.settings, snap.settings);
}
