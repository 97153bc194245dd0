//! The conformance suite: the same test bodies run against the embedded
//! engine and the Redis backend (`conformance!` makes one test per body per
//! backend), on virtual time with workers off, so every timeout is checked
//! without sleeping. Each body checks the invariants of the admission model
//! that it can see: capacity (never more admitted than permits), order
//! (nobody overtakes), hand-off, tray, idempotence, conservation (every
//! permit accounted for), monotone positions. `changes` holds what spans
//! instances: operators' changes and the join limit.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use narabu::backend::{
    Backend, BackendError, JoinRequest, RoomPatch, RoomSnapshot, StreamsReport, TicketRef,
};
use narabu::engine::{
    Departure, Handoff, Identity, LotterySeed, Order, RoomId, TicketState, Timestamp,
};

use narabu_testkit::redis_server::{Harness, Kind, T0};
use narabu_testkit::room;

pub(crate) fn rid(s: &str) -> RoomId {
    RoomId::new(s).unwrap()
}

pub(crate) async fn join(b: &Arc<dyn Backend>, r: &str) -> TicketRef {
    b.join(&rid(r), JoinRequest::anonymous())
        .await
        .unwrap()
        .ticket
}

pub(crate) async fn state(b: &Arc<dyn Backend>, r: &str, t: TicketRef) -> TicketState {
    b.status(&rid(r), t, false).await.unwrap().state
}

pub(crate) async fn balanced(b: &Arc<dyn Backend>, r: &str) {
    let l = b.room(&rid(r)).await.unwrap().ledger;
    assert!(l.balances(), "ledger does not balance: {l:?}");
    assert!(l.admitted <= l.capacity, "over capacity: {l:?}");
}

/// Reads the room over and over while a test's tasks run, checking each
/// snapshot (capacity, say) as it goes; `stop` says how many it checked.
pub(crate) struct Watch {
    done: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<usize>,
}

impl Watch {
    pub(crate) fn start(b: &Arc<dyn Backend>, r: &'static str, check: fn(&RoomSnapshot)) -> Self {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = {
            let (b, done) = (b.clone(), done.clone());
            tokio::spawn(async move {
                let mut checks = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    check(&b.room(&rid(r)).await.unwrap());
                    checks += 1;
                    tokio::task::yield_now().await;
                }
                checks
            })
        };
        Self { done, task }
    }

    pub(crate) async fn stop(self) -> usize {
        self.done.store(true, std::sync::atomic::Ordering::Release);
        self.task.await.unwrap()
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(narabu_testkit::redis_server::Kind::Embedded).await })*
        }
        mod redis {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { super::$name(narabu_testkit::redis_server::Kind::Redis).await })*
        }
    };
}

mod changes;
pub(crate) mod feed;
pub(crate) mod lanes;
mod modes;
mod presence;

conformance!(
    admits_in_order_up_to_capacity,
    joining_twice_with_one_identity_gives_one_ticket,
    release_hands_off_to_the_head_at_once,
    hand_off_skips_abandoned_tickets,
    nobody_waiting_puts_the_permit_on_the_tray,
    stalled_permits_are_revoked_after_grace_and_idle,
    capacity_down_then_up,
    pause_stops_admission_and_resume_restarts_it,
    revoke_frees_once_and_late_release_frees_nothing,
    positions_never_go_up_and_reach_one,
    scheduled_opening_fifo_keeps_arrival_order,
    scheduled_opening_lottery_follows_the_published_seed,
    closed_room_refuses_joins,
    replaced_room_forgets_old_tickets,
    many_threads_keep_capacity_and_conservation,
    a_drifting_rate_alone_republishes_no_view,
);

async fn admits_in_order_up_to_capacity(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 2)]).await;
    let b = &h.backend;
    let mut tickets = Vec::new();
    for i in 0..5 {
        let j = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
        assert!(j.is_new);
        assert_eq!(j.status.number, Some(i + 1));
        assert_eq!(j.status.position, Some(i + 1));
        tickets.push(j.ticket);
    }
    let report = b.tick(&rid("r")).await.unwrap();
    assert_eq!(report.admitted.len(), 2);
    assert_eq!(state(b, "r", tickets[0]).await, TicketState::Admitted);
    assert_eq!(state(b, "r", tickets[1]).await, TicketState::Admitted);
    for (i, t) in tickets[2..].iter().enumerate() {
        let s = b.status(&rid("r"), *t, false).await.unwrap();
        assert_eq!(s.state, TicketState::Waiting);
        assert_eq!(s.position, Some(i as u64 + 1));
        assert_eq!(s.queue_length, 3);
    }
    // A second tick has no permits left.
    assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!(snap.ledger.admitted, 2);
    assert_eq!(snap.stats.joins, 5);
    assert_eq!(snap.stats.admissions, 2);
    balanced(b, "r").await;
    // Unknown tickets and rooms are errors, not panics.
    let bogus = TicketRef {
        epoch: tickets[0].epoch,
        id: 999,
    };
    assert_eq!(
        b.status(&rid("r"), bogus, true).await,
        Err(BackendError::NoSuchTicket)
    );
    let other_epoch = TicketRef {
        epoch: tickets[0].epoch ^ 1,
        id: 0,
    };
    assert_eq!(
        b.leave(&rid("r"), other_epoch).await,
        Err(BackendError::LineReset)
    );
    assert!(matches!(
        b.join(&rid("nope"), JoinRequest::anonymous()).await,
        Err(BackendError::NoSuchRoom(_))
    ));
}

async fn joining_twice_with_one_identity_gives_one_ticket(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let me = Identity(0xfeed_beef_u128 << 64 | 7);
    let first = b
        .join(&rid("r"), JoinRequest::with_identity(me))
        .await
        .unwrap();
    let other = b
        .join(&rid("r"), JoinRequest::with_identity(Identity(1)))
        .await
        .unwrap();
    let again = b
        .join(&rid("r"), JoinRequest::with_identity(me))
        .await
        .unwrap();
    assert!(first.is_new && other.is_new);
    assert!(!again.is_new);
    assert_eq!(first.ticket, again.ticket);
    assert_ne!(first.ticket, other.ticket);
    assert_eq!(again.status.number, Some(1));
    assert_eq!(b.room(&rid("r")).await.unwrap().stats.joins, 2);
}

async fn release_hands_off_to_the_head_at_once(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let c = join(b, "r").await;
    let d = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(state(b, "r", a).await, TicketState::Admitted);
    let gave = b.release(&rid("r"), a).await.unwrap();
    assert_eq!(gave, Departure::GaveBack(Handoff::To(c.id as u32)));
    // No tick in between: the head holds the permit now.
    assert_eq!(state(b, "r", c).await, TicketState::Admitted);
    assert_eq!(state(b, "r", a).await, TicketState::Released);
    // Releasing twice frees nothing.
    assert_eq!(
        b.release(&rid("r"), a).await.unwrap(),
        Departure::Nothing(TicketState::Released)
    );
    // A waiting ticket cannot be released, only leave.
    assert_eq!(
        b.release(&rid("r"), d).await.unwrap(),
        Departure::Nothing(TicketState::Waiting)
    );
    // Leave of the admitted one hands off too.
    assert_eq!(
        b.leave(&rid("r"), c).await.unwrap(),
        Departure::GaveBack(Handoff::To(d.id as u32))
    );
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!(snap.stats.handoffs, 2);
    assert_eq!(snap.ledger.admitted, 1);
    balanced(b, "r").await;
}

async fn hand_off_skips_abandoned_tickets(kind: Kind) {
    let mut s = room("r", 1);
    s.queue_idle = Duration::from_secs(10);
    let h = Harness::new(kind, vec![s]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let quiet = join(b, "r").await;
    let live = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    h.clock.advance(Duration::from_secs(8));
    b.status(&rid("r"), live, true).await.unwrap();
    b.status(&rid("r"), a, true).await.unwrap();
    h.clock.advance(Duration::from_secs(8));
    // `quiet` was last seen 16 s ago, past queue_idle: skipped.
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::To(live.id as u32))
    );
    assert_eq!(state(b, "r", quiet).await, TicketState::Abandoned);
    // The view is published by the next tick.
    b.tick(&rid("r")).await.unwrap();
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!(snap.stats.abandonments, 1);
    assert_eq!(snap.view.waiting, 0, "{:?}", snap.view);
    balanced(b, "r").await;
}

async fn nobody_waiting_puts_the_permit_on_the_tray(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 2)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let c = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::Tray)
    );
    let l = b.room(&rid("r")).await.unwrap().ledger;
    assert_eq!((l.held, l.tray, l.admitted), (0, 1, 1));
    // The worker takes the tray back only when its hand is empty, and
    // admits with it.
    let d = join(b, "r").await;
    let report = b.tick(&rid("r")).await.unwrap();
    assert_eq!(report.from_tray, 1);
    assert_eq!(report.admitted, vec![d.id as u32]);
    assert_eq!(state(b, "r", c).await, TicketState::Admitted);
    balanced(b, "r").await;
}

async fn stalled_permits_are_revoked_after_grace_and_idle(kind: Kind) {
    let mut s = room("r", 2);
    s.arrival_grace = Duration::from_secs(60);
    s.pass_idle = Duration::from_secs(300);
    // `next` polls every half minute: present throughout.
    s.away_grace = Duration::from_secs(60);
    let h = Harness::new(kind, vec![s]).await;
    let b = &h.backend;
    let never = join(b, "r").await;
    let arrives = join(b, "r").await;
    let next = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    let st = b.status(&rid("r"), never, false).await.unwrap();
    assert_eq!(st.pass_expires_at, Some(Timestamp(T0 + 60_000)));
    h.clock.advance(Duration::from_secs(30));
    let st = b.status(&rid("r"), arrives, true).await.unwrap();
    assert_eq!(st.pass_expires_at, Some(Timestamp(T0 + 30_000 + 300_000)));
    b.status(&rid("r"), next, true).await.unwrap();
    h.clock.advance(Duration::from_secs(31));
    // `never` did not arrive within the grace: its permit goes to `next`.
    let report = b.tick(&rid("r")).await.unwrap();
    assert_eq!(report.expired, vec![never.id as u32]);
    assert_eq!(report.admitted, vec![next.id as u32]);
    assert_eq!(state(b, "r", never).await, TicketState::Expired);
    assert_eq!(state(b, "r", arrives).await, TicketState::Admitted);
    // A late release of the expired permit frees nothing.
    assert_eq!(
        b.release(&rid("r"), never).await.unwrap(),
        Departure::Nothing(TicketState::Expired)
    );
    // `arrives` goes idle past pass_idle.
    b.status(&rid("r"), next, true).await.unwrap();
    h.clock.advance(Duration::from_secs(280));
    b.status(&rid("r"), next, true).await.unwrap();
    let report = b.tick(&rid("r")).await.unwrap();
    assert_eq!(report.expired, vec![arrives.id as u32]);
    assert_eq!(state(b, "r", next).await, TicketState::Admitted);
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!(snap.stats.expirations, 2);
    assert_eq!((snap.ledger.held, snap.ledger.admitted), (1, 1));
    balanced(b, "r").await;
}

async fn capacity_down_then_up(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 3)]).await;
    let b = &h.backend;
    let mut t = Vec::new();
    for _ in 0..6 {
        t.push(join(b, "r").await);
    }
    b.tick(&rid("r")).await.unwrap();
    let patch = |c| RoomPatch {
        capacity: Some(c),
        ..RoomPatch::default()
    };
    let snap = b.patch_room(&rid("r"), patch(1)).await.unwrap();
    assert_eq!(snap.settings.capacity, 1);
    assert_eq!((snap.ledger.admitted, snap.ledger.debt), (3, 2));
    // Nobody new until the count is below the new capacity.
    assert_eq!(
        b.release(&rid("r"), t[0]).await.unwrap(),
        Departure::GaveBack(Handoff::Retired)
    );
    assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    assert_eq!(
        b.release(&rid("r"), t[1]).await.unwrap(),
        Departure::GaveBack(Handoff::Retired)
    );
    assert_eq!(
        b.release(&rid("r"), t[2]).await.unwrap(),
        Departure::GaveBack(Handoff::To(t[3].id as u32))
    );
    balanced(b, "r").await;
    // Up again: the worker's hand grows and the next tick admits.
    b.patch_room(&rid("r"), patch(3)).await.unwrap();
    let report = b.tick(&rid("r")).await.unwrap();
    assert_eq!(report.admitted, vec![t[4].id as u32, t[5].id as u32]);
    let l = b.room(&rid("r")).await.unwrap().ledger;
    assert_eq!((l.capacity, l.admitted, l.debt), (3, 3, 0));
    balanced(b, "r").await;
}

async fn pause_stops_admission_and_resume_restarts_it(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let c = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    let paused = RoomPatch {
        paused: Some(true),
        ..RoomPatch::default()
    };
    let snap = b.patch_room(&rid("r"), paused).await.unwrap();
    assert!(snap.settings.paused && snap.view.paused);
    assert!(b.status(&rid("r"), c, false).await.unwrap().paused);
    // While paused, a finisher's permit waits on the tray.
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::Tray)
    );
    assert!(b.tick(&rid("r")).await.unwrap().admitted.is_empty());
    assert_eq!(state(b, "r", c).await, TicketState::Waiting);
    b.patch_room(
        &rid("r"),
        RoomPatch {
            paused: Some(false),
            ..RoomPatch::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(b.tick(&rid("r")).await.unwrap().admitted, vec![c.id as u32]);
    balanced(b, "r").await;
}

async fn revoke_frees_once_and_late_release_frees_nothing(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let c = join(b, "r").await;
    let d = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(
        b.revoke(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::To(c.id as u32))
    );
    assert_eq!(
        b.release(&rid("r"), a).await.unwrap(),
        Departure::Nothing(TicketState::Revoked)
    );
    assert_eq!(b.revoke(&rid("r"), d).await.unwrap(), Departure::LeftQueue);
    assert_eq!(state(b, "r", d).await, TicketState::Revoked);
    assert_eq!(
        b.leave(&rid("r"), d).await.unwrap(),
        Departure::Nothing(TicketState::Revoked)
    );
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!(snap.stats.revocations, 2);
    assert_eq!(snap.ledger.admitted, 1);
    balanced(b, "r").await;
}

async fn positions_never_go_up_and_reach_one(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let mut t = Vec::new();
    for _ in 0..12 {
        t.push(join(b, "r").await);
    }
    let last = *t.last().unwrap();
    let mut seen = u64::MAX;
    let mut reached_one = false;
    for (i, ticket) in t.iter().enumerate().take(11) {
        let s = b.status(&rid("r"), last, true).await.unwrap();
        if s.state == TicketState::Waiting {
            let p = s.position.unwrap();
            assert!(p <= seen, "position went up: {seen} -> {p}");
            reached_one |= p == 1;
            seen = p;
        }
        // Every other ticket leaves from the middle; the rest get in.
        if i % 2 == 0 {
            b.leave(&rid("r"), *ticket).await.unwrap();
        } else {
            b.tick(&rid("r")).await.unwrap();
            b.release(&rid("r"), *ticket).await.unwrap();
        }
    }
    let s = b.status(&rid("r"), last, true).await.unwrap();
    if s.state == TicketState::Waiting {
        assert!(s.position.unwrap() <= seen);
        reached_one |= s.position == Some(1);
    }
    assert!(reached_one || s.state == TicketState::Admitted);
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(state(b, "r", last).await, TicketState::Admitted);
    assert!(reached_one, "position 1 was shown before admission");
}

async fn opening_with(kind: Kind, order: Order) -> (Vec<TicketRef>, Vec<u64>, Harness) {
    let mut s = room("r", 100);
    s.opens_at = Some(T0 + 60_000);
    s.order = order;
    let h = Harness::new(kind, vec![s]).await;
    let b = h.backend.clone();
    let mut pre = Vec::new();
    for _ in 0..30 {
        let j = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
        assert_eq!(j.status.number, None);
        assert_eq!(j.status.opens_at, Some(Timestamp(T0 + 60_000)));
        pre.push(j.ticket);
    }
    // One leaves the pre-queue before the draw.
    assert_eq!(
        b.leave(&rid("r"), pre[3]).await.unwrap(),
        Departure::LeftQueue
    );
    assert!(!b.tick(&rid("r")).await.unwrap().opened);
    h.clock.advance(Duration::from_secs(61));
    // Their pages are open: this instance holds their streams.
    let streams = StreamsReport {
        holder: 1,
        opened: pre.clone(),
        ..StreamsReport::default()
    };
    b.hold_streams(&rid("r"), &streams).await.unwrap();
    let report = b.tick(&rid("r")).await.unwrap();
    assert!(report.opened);
    assert_eq!(report.admitted.len(), 29);
    let late = b.join(&rid("r"), JoinRequest::anonymous()).await.unwrap();
    assert_eq!(late.status.number, Some(31));
    let mut numbers = Vec::new();
    for t in &pre {
        numbers.push(
            b.status(&rid("r"), *t, false)
                .await
                .unwrap()
                .number
                .unwrap(),
        );
    }
    (pre, numbers, h)
}

async fn scheduled_opening_fifo_keeps_arrival_order(kind: Kind) {
    let (_pre, numbers, h) = opening_with(kind, Order::Fifo).await;
    assert_eq!(numbers, (1..=30).collect::<Vec<u64>>());
    let view = h.backend.room(&rid("r")).await.unwrap().view;
    assert!(view.open && view.lottery_seed.is_none());
}

async fn scheduled_opening_lottery_follows_the_published_seed(kind: Kind) {
    let mut s = room("r", 1);
    s.opens_at = Some(T0 + 60_000);
    let h0 = Harness::new(kind, vec![s]).await;
    let before = h0.backend.room(&rid("r")).await.unwrap().view;
    assert!(before.lottery_commitment.is_some() && before.lottery_seed.is_none());
    drop(h0);

    let (pre, numbers, h) = opening_with(kind, Order::Lottery).await;
    let view = h.backend.room(&rid("r")).await.unwrap().view;
    let seed = hex::decode(view.lottery_seed.clone().unwrap()).unwrap();
    let seed = LotterySeed(seed.try_into().unwrap());
    assert_eq!(Some(seed.commitment()), view.lottery_commitment);
    let ids: Vec<u32> = pre.iter().map(|t| t.id as u32).collect();
    let drawn = seed.draw(&ids);
    for (t, n) in pre.iter().zip(&numbers) {
        let place = drawn.iter().position(|&d| d == t.id as u32).unwrap() as u64 + 1;
        assert_eq!(*n, place, "ticket {} is not where the seed puts it", t.id);
    }
    assert_ne!(numbers, (1..=30).collect::<Vec<u64>>());
}

async fn closed_room_refuses_joins(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    b.close_room(&rid("r")).await.unwrap();
    assert!(matches!(
        b.join(&rid("r"), JoinRequest::anonymous()).await,
        Err(BackendError::Closed(_))
    ));
    assert!(b.status(&rid("r"), a, false).await.unwrap().closed);
    assert!(b.room(&rid("r")).await.unwrap().view.closed);
    assert!(matches!(
        b.patch_room(&rid("r"), RoomPatch::default()).await,
        Err(BackendError::Closed(_))
    ));
}

async fn replaced_room_forgets_old_tickets(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let feed = b.feed(&rid("r")).await.unwrap();
    let mut changes = feed.changes();
    let snap = b.put_room(room("r", 5)).await.unwrap();
    assert_ne!(snap.epoch, a.epoch);
    assert_eq!(b.epoch(&rid("r")).await.unwrap(), snap.epoch);
    // Its line was reset: said so to every call, and to a join that
    // carries it without asking for a new ticket (the queue page's).
    assert_eq!(
        b.status(&rid("r"), a, true).await,
        Err(BackendError::LineReset)
    );
    assert_eq!(b.leave(&rid("r"), a).await, Err(BackendError::LineReset));
    assert_eq!(
        b.read_ticket(&rid("r"), a).await.map(|_| ()),
        Err(BackendError::LineReset)
    );
    let carried = |replace_ended| JoinRequest {
        held: Some(a),
        replace_ended,
        ..JoinRequest::anonymous()
    };
    assert_eq!(
        b.join(&rid("r"), carried(false)).await.map(|_| ()),
        Err(BackendError::LineReset)
    );
    let fresh = b.join(&rid("r"), carried(true)).await.unwrap();
    assert!(fresh.is_new);
    assert_eq!(fresh.ticket.epoch, snap.epoch);
    assert_eq!(fresh.status.number, Some(1));
    assert_eq!(snap.ledger.held, 5);
    // Streams of the old incarnation are told it is gone.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while !feed.room_facts().closed {
            if changes.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the old room's feed did not close");
    let ids: HashSet<_> = b
        .list_rooms()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.settings.id)
        .collect();
    assert!(ids.contains(&rid("r")));
}

/// Many tasks join, leave and release at once while ticks run; the
/// admitted count never passes capacity and, at rest, every permit is
/// accounted for.
async fn many_threads_keep_capacity_and_conservation(kind: Kind) {
    const CAP: u64 = 5;
    let h = Harness::new(kind, vec![room("r", CAP as u32)]).await;
    let b = h.backend.clone();
    let watch = Watch::start(&b, "r", |snap| {
        let l = &snap.ledger;
        assert!(l.admitted <= CAP, "over capacity: {l:?}");
    });
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25u64 {
                let t = b
                    .join(&rid("r"), JoinRequest::anonymous())
                    .await
                    .unwrap()
                    .ticket;
                if (w + i) % 5 == 0 {
                    b.leave(&rid("r"), t).await.unwrap();
                }
                if (w + i) % 3 == 0 {
                    b.tick(&rid("r")).await.unwrap();
                }
                let s = b.status(&rid("r"), t, true).await.unwrap();
                if s.state == TicketState::Admitted {
                    b.release(&rid("r"), t).await.unwrap();
                    // A second release must free nothing.
                    assert!(matches!(
                        b.release(&rid("r"), t).await.unwrap(),
                        Departure::Nothing(_)
                    ));
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(watch.stop().await > 0);
    let snap = b.room(&rid("r")).await.unwrap();
    assert!(snap.ledger.balances(), "{:?}", snap.ledger);
    assert!(snap.stats.peak_admitted <= CAP);
    assert_eq!(snap.stats.joins, 200);
}

/// In a quiet room the smoothed admission rate decays a little on every
/// tick; the view (which wakes every waiting stream on every instance) is
/// republished only when the rate moves to another 25% band.
async fn a_drifting_rate_alone_republishes_no_view(kind: Kind) {
    let h = Harness::new(kind, vec![room("r", 1)]).await;
    let b = &h.backend;
    for _ in 0..3 {
        join(b, "r").await;
    }
    let version = || async { b.room(&rid("r")).await.unwrap().view.version };
    for _ in 0..2 {
        h.clock.advance(Duration::from_secs(1));
        b.tick(&rid("r")).await.unwrap();
    }
    let mut changes = 0;
    let mut last = version().await;
    // Five quiet seconds: the rate falls about 15%, so one band edge at most.
    for _ in 0..5 {
        h.clock.advance(Duration::from_secs(1));
        b.tick(&rid("r")).await.unwrap();
        let v = version().await;
        changes += usize::from(v != last);
        last = v;
    }
    assert!(
        changes <= 1,
        "the view was republished {changes} times in 5 quiet ticks"
    );
}
