//! Presence on both backends: a ticket's visitor is present while an
//! instance holds a live stream of theirs (reported when it opens and
//! when it closes, with one report per period in between whatever the
//! crowd) or while a status read is younger than `away_grace`. A ticket
//! away when the head reaches it is skipped without taking a permit, keeps
//! its number, and when its visitor comes back within `queue_idle` it is
//! next in line, ahead of everyone still waiting who joined later;
//! positions shown to the others never go up. An instance that stops
//! reporting (it was killed) takes its streams' presence with it one grace
//! after its last report.

use std::time::Duration;

use narabu::backend::{Backend, RoomPatch, StreamsReport, TicketRef};
use narabu::engine::{Departure, Handoff, RoomSettings, TicketState};

use super::{balanced, join, rid, state};
use narabu_testkit::redis_server::{Harness, Kind};
use narabu_testkit::room;

conformance!(
    a_closed_streams_ticket_is_skipped_free_and_comes_back_first,
    a_status_poll_counts_as_presence,
    a_killed_instances_streams_go_away_after_its_lease,
    an_away_ticket_quiet_past_queue_idle_is_abandoned,
    an_away_ticket_can_leave,
    another_instance_counts_skips_and_returns_from_the_feed,
    a_crowd_held_by_one_instance_stays_on_its_reports_alone,
);

const GRACE: Duration = Duration::from_secs(20);

fn presence_room(capacity: u32) -> RoomSettings {
    let mut s = room("r", capacity);
    s.away_grace = GRACE;
    s.queue_idle = Duration::from_secs(300);
    s
}

/// Instance `holder`'s report: the tickets whose streams opened and
/// closed there since its last one (both empty: it is still there).
async fn streams(
    b: &std::sync::Arc<dyn Backend>,
    holder: u64,
    opened: &[TicketRef],
    closed: &[TicketRef],
) {
    let report = StreamsReport {
        holder,
        full: false,
        opened: opened.to_vec(),
        closed: closed.to_vec(),
    };
    let heard = b.hold_streams(&rid("r"), &report).await.unwrap();
    assert_eq!(heard.away_grace, GRACE);
}

async fn position(b: &std::sync::Arc<dyn Backend>, t: TicketRef) -> Option<u64> {
    b.status(&rid("r"), t, false).await.unwrap().position
}

async fn a_closed_streams_ticket_is_skipped_free_and_comes_back_first(kind: Kind) {
    let h = Harness::new(kind, vec![presence_room(1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let x = join(b, "r").await;
    let y = join(b, "r").await;
    let z = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(state(b, "r", a).await, TicketState::Admitted);
    streams(b, 1, &[x, y, z], &[]).await;
    // x's page closes; y's and z's streams stay open.
    streams(b, 1, &[], &[x]).await;
    h.clock.advance(Duration::from_secs(15));
    streams(b, 1, &[], &[]).await;
    h.clock.advance(Duration::from_secs(10));
    assert_eq!(position(b, z).await, Some(3));
    // x's stream closed 25 s ago: the hand-off passes it by, and its
    // number costs no permit.
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::To(y.id as u32))
    );
    let away = b.status(&rid("r"), x, false).await.unwrap();
    assert_eq!(away.state, TicketState::Away);
    assert_eq!((away.number, away.position), (Some(2), None));
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!((snap.stats.skips, snap.ledger.admitted), (1, 1));
    assert_eq!(snap.ledger.held + snap.ledger.tray, 0, "{:?}", snap.ledger);
    balanced(b, "r").await;
    assert_eq!(position(b, z).await, Some(1));
    // Someone joins after x's turn passed.
    let w = join(b, "r").await;
    assert_eq!(position(b, w).await, Some(2));
    // x's visitor comes back (a stream reopens) well within queue_idle: it
    // is next in line, ahead of z and w, who joined after it.
    h.clock.advance(Duration::from_secs(60));
    streams(b, 1, &[x, w], &[]).await;
    let back = b.status(&rid("r"), x, false).await.unwrap();
    assert_eq!(back.state, TicketState::Waiting);
    assert_eq!((back.number, back.position), (Some(2), Some(1)));
    // Those behind are never shown a bigger number than before.
    assert_eq!(position(b, z).await, Some(1));
    assert_eq!(position(b, w).await, Some(2));
    assert_eq!(b.room(&rid("r")).await.unwrap().stats.returns, 1);
    assert_eq!(
        b.release(&rid("r"), y).await.unwrap(),
        Departure::GaveBack(Handoff::To(x.id as u32))
    );
    assert_eq!(position(b, z).await, Some(1));
    assert_eq!(
        b.release(&rid("r"), x).await.unwrap(),
        Departure::GaveBack(Handoff::To(z.id as u32))
    );
    assert_eq!(position(b, w).await, Some(1));
    balanced(b, "r").await;
}

async fn a_status_poll_counts_as_presence(kind: Kind) {
    let h = Harness::new(kind, vec![presence_room(1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let poller = join(b, "r").await;
    let gone = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    h.clock.advance(Duration::from_secs(30));
    // An app that polls (no stream) is present; a poll without a sign of
    // life (an operator's read) is not one.
    b.status(&rid("r"), poller, true).await.unwrap();
    b.status(&rid("r"), gone, false).await.unwrap();
    h.clock.advance(Duration::from_secs(5));
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::To(poller.id as u32))
    );
    assert_eq!(state(b, "r", gone).await, TicketState::Waiting);
    // The next turn is `gone`'s, 35 s after its last sign of life: skipped
    // by the tick, and the permit stays in the worker's hand.
    b.release(&rid("r"), poller).await.unwrap();
    assert_eq!(state(b, "r", gone).await, TicketState::Away);
    let report = b.tick(&rid("r")).await.unwrap();
    assert!(report.admitted.is_empty());
    // Back with a poll: admitted on the next tick.
    b.status(&rid("r"), gone, true).await.unwrap();
    let report = b.tick(&rid("r")).await.unwrap();
    assert_eq!(report.admitted, vec![gone.id as u32]);
    balanced(b, "r").await;
}

async fn a_killed_instances_streams_go_away_after_its_lease(kind: Kind) {
    let mut s = presence_room(2);
    s.paused = true;
    let h = Harness::instances(kind, vec![s], 2).await;
    let (one, two) = (&h.backends[0], &h.backends[1]);
    let p = join(one, "r").await;
    let q = join(one, "r").await;
    let r = join(two, "r").await;
    // Instance one holds p's and q's streams, instance two r's.
    streams(one, 1, &[p, q], &[]).await;
    streams(two, 2, &[r], &[]).await;
    h.clock.advance(Duration::from_secs(15));
    streams(two, 2, &[], &[]).await;
    // Instance one is killed: it reports nothing more, and 25 s after its
    // last report its streams' tickets are away.
    h.clock.advance(Duration::from_secs(10));
    let resume = RoomPatch {
        paused: Some(false),
        ..RoomPatch::default()
    };
    two.patch_room(&rid("r"), resume).await.unwrap();
    let report = two.tick(&rid("r")).await.unwrap();
    assert_eq!(report.admitted, vec![r.id as u32]);
    assert_eq!(state(two, "r", p).await, TicketState::Away);
    assert_eq!(state(two, "r", q).await, TicketState::Away);
    let snap = two.room(&rid("r")).await.unwrap();
    assert_eq!((snap.ledger.held, snap.stats.skips), (1, 2));
    // A later visitor joins; then p's browser reconnects to instance two.
    let late = join(two, "r").await;
    streams(two, 2, &[p, late], &[]).await;
    let report = two.tick(&rid("r")).await.unwrap();
    assert_eq!(
        report.admitted,
        vec![p.id as u32],
        "p comes before later joiners"
    );
    assert_eq!(state(two, "r", late).await, TicketState::Waiting);
    assert_eq!(position(two, late).await, Some(1));
    balanced(two, "r").await;
}

async fn an_away_ticket_quiet_past_queue_idle_is_abandoned(kind: Kind) {
    let h = Harness::new(kind, vec![presence_room(1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let x = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    h.clock.advance(Duration::from_secs(30));
    b.status(&rid("r"), a, true).await.unwrap();
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::Tray)
    );
    assert_eq!(state(b, "r", x).await, TicketState::Away);
    // Quiet past queue_idle: abandoned, and a late return does not revive it.
    h.clock.advance(Duration::from_secs(300));
    let report = b.tick(&rid("r")).await.unwrap();
    assert_eq!(report.abandoned, 1);
    assert_eq!(state(b, "r", x).await, TicketState::Abandoned);
    streams(b, 1, &[x], &[]).await;
    assert_eq!(state(b, "r", x).await, TicketState::Abandoned);
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!((snap.view.waiting, snap.stats.abandonments), (0, 1));
    balanced(b, "r").await;
}

/// Wait (on Redis the follower applies the log a moment later) until the
/// feed of `on` counts `want` ahead of each queue index.
async fn feed_shows(on: &std::sync::Arc<dyn Backend>, want: &[(u64, Option<u64>)]) {
    let feed = on.feed(&rid("r")).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let seen: Vec<_> = want
            .iter()
            .map(|&(qi, _)| (qi, feed.ahead(0, qi)))
            .collect();
        if seen == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the feed counts {seen:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Skips and returns travel through the room's feed: an instance that
/// made neither change counts the returner ahead of the line.
async fn another_instance_counts_skips_and_returns_from_the_feed(kind: Kind) {
    let h = Harness::instances(kind, vec![presence_room(1)], 2).await;
    let (b, other) = (&h.backends[0], &h.backends[1]);
    other.feed(&rid("r")).await.unwrap();
    let a = join(b, "r").await;
    let x = join(b, "r").await;
    let y = join(b, "r").await;
    let z = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    h.clock.advance(Duration::from_secs(30));
    streams(b, 1, &[y, z], &[]).await;
    b.leave(&rid("r"), a).await.unwrap();
    // x was passed by, y admitted: z is first.
    assert_eq!(state(b, "r", y).await, TicketState::Admitted);
    feed_shows(other, &[(x.id, None), (z.id, Some(0))]).await;
    // x comes back, through the other instance: ahead of z.
    streams(other, 2, &[x], &[]).await;
    feed_shows(other, &[(x.id, Some(0)), (z.id, Some(1))]).await;
    feed_shows(b, &[(x.id, Some(0)), (z.id, Some(1))]).await;
    b.release(&rid("r"), y).await.unwrap();
    feed_shows(other, &[(x.id, None), (z.id, Some(0))]).await;
    assert_eq!(state(other, "r", x).await, TicketState::Admitted);
}

async fn an_away_ticket_can_leave(kind: Kind) {
    let h = Harness::new(kind, vec![presence_room(1)]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    let x = join(b, "r").await;
    let y = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    h.clock.advance(Duration::from_secs(30));
    streams(b, 1, &[y], &[]).await;
    b.leave(&rid("r"), a).await.unwrap();
    assert_eq!(state(b, "r", x).await, TicketState::Away);
    assert_eq!(b.leave(&rid("r"), x).await.unwrap(), Departure::LeftQueue);
    assert_eq!(state(b, "r", x).await, TicketState::Left);
    // Its return after leaving changes nothing.
    streams(b, 1, &[x], &[]).await;
    assert_eq!(state(b, "r", x).await, TicketState::Left);
    assert_eq!(state(b, "r", y).await, TicketState::Admitted);
    b.tick(&rid("r")).await.unwrap();
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!((snap.stats.leaves, snap.view.waiting), (1, 0));
    balanced(b, "r").await;
}

/// An instance holding a big crowd's streams reports them once; from
/// then on its reports name nobody, and the ticket it reported last, first
/// in line, is as present as any.
async fn a_crowd_held_by_one_instance_stays_on_its_reports_alone(kind: Kind) {
    let mut settings = presence_room(1);
    settings.join_limit_per_minute = 0;
    let h = Harness::new(kind, vec![settings]).await;
    let b = &h.backend;
    let a = join(b, "r").await;
    b.tick(&rid("r")).await.unwrap();
    assert_eq!(state(b, "r", a).await, TicketState::Admitted);
    let x = join(b, "r").await;
    let mut crowd = Vec::new();
    for _ in 0..1_200 {
        crowd.push(join(b, "r").await);
    }
    crowd.push(x);
    streams(b, 1, &crowd, &[]).await;
    // A minute of reports naming nobody, and ticks between them.
    for _ in 0..6 {
        h.clock.advance(Duration::from_secs(10));
        streams(b, 1, &[], &[]).await;
        b.tick(&rid("r")).await.unwrap();
    }
    assert_eq!(
        b.leave(&rid("r"), a).await.unwrap(),
        Departure::GaveBack(Handoff::To(x.id as u32))
    );
    assert_eq!(state(b, "r", x).await, TicketState::Admitted);
    let snap = b.room(&rid("r")).await.unwrap();
    assert_eq!((snap.stats.skips, snap.stats.abandonments), (0, 0));
    balanced(b, "r").await;
}
