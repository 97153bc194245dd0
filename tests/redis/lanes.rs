//! Priority lanes on Redis: a lane whose head holds nobody admissible
//! passes its turn to the next lane in the rule's order, on the owner that
//! ticks and in what another instance reads.

use std::time::Duration;

use narabu::backend::{JoinRequest, StreamsReport};
use narabu::engine::TicketState;

use crate::conformance::lanes::laned;
use crate::conformance::rid;
use narabu_testkit::redis_server::{Harness, Kind};

#[tokio::test]
async fn a_lane_whose_head_is_away_passes_its_turn_on() {
    let mut s = laned("r", 4);
    s.away_grace = Duration::from_secs(10);
    let h = Harness::new(Kind::Redis, vec![s]).await;
    let b = &h.backend;
    let mut general = Vec::new();
    for _ in 0..3 {
        general.push(
            b.join(&rid("r"), JoinRequest::in_lane(1))
                .await
                .unwrap()
                .ticket,
        );
    }
    assert_eq!(b.tick(&rid("r")).await.unwrap().admitted.len(), 3);
    // Members hold nothing against general's three: their head comes
    // first, but its visitor went quiet.
    let member = b
        .join(&rid("r"), JoinRequest::in_lane(0))
        .await
        .unwrap()
        .ticket;
    let next = b
        .join(&rid("r"), JoinRequest::in_lane(1))
        .await
        .unwrap()
        .ticket;
    h.clock.advance(Duration::from_secs(20));
    let streams = StreamsReport {
        holder: 1,
        opened: vec![general[0], general[1], general[2], next],
        ..StreamsReport::default()
    };
    b.hold_streams(&rid("r"), &streams).await.unwrap();
    let admitted = b.tick(&rid("r")).await.unwrap().admitted;
    assert_eq!(admitted, vec![next.id as u32]);
    let s = b.status(&rid("r"), member, false).await.unwrap();
    assert_eq!((s.state, s.lane), (TicketState::Away, 0));
    let view = b.room(&rid("r")).await.unwrap().view;
    let counts: Vec<(u64, u64)> = view.lanes.iter().map(|l| (l.waiting, l.admitted)).collect();
    assert_eq!(counts, vec![(0, 0), (0, 4)]);
}
