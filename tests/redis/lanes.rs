//! Priority lanes as the Redis backend stores them: lane 0 keeps the keys
//! and the ticket record a room without lanes has (so rooms made before
//! lanes read the same), the other lanes live in suffixed keys under the
//! room's one hash tag, and a lane whose head holds nobody admissible
//! passes its turn to the next lane in the rule's order.

use std::time::Duration;

use narabu::backend::JoinRequest;
use narabu::engine::TicketState;
use redis::AsyncCommands;

use crate::conformance::lanes::laned;
use crate::conformance::rid;
use narabu_testkit::redis_server::{Harness, Kind};
use narabu_testkit::room;

/// The packed record of a ticket without a lane byte (`lib.lua`'s RECORD).
const RECORD_LEN: usize = 1 + 4 + 8 + 8 + 8 + 1 + 4 + 4;

#[tokio::test]
async fn lane_zero_keeps_the_keys_and_records_of_a_room_without_lanes() {
    let h = Harness::new(Kind::Redis, vec![room("plain", 10), laned("r", 10)]).await;
    let b = &h.backend;
    let mut con = h.redis().client().await;
    for _ in 0..2 {
        b.join(&rid("plain"), JoinRequest::anonymous())
            .await
            .unwrap();
    }
    let epoch = b.epoch(&rid("plain")).await.unwrap();
    let p = format!("narabu:{{plain}}:{epoch}:");
    let lanes: Option<String> = con.hget("narabu:{plain}:room", "lanes").await.unwrap();
    assert_eq!(lanes, None, "a room without lanes stores none");
    let ln: bool = con.exists(format!("{p}ln")).await.unwrap();
    assert!(!ln);
    let queued: u64 = con.zcard(format!("{p}q")).await.unwrap();
    assert_eq!(queued, 2);
    let record: Vec<u8> = con.hget(format!("{p}tk"), "1").await.unwrap();
    assert_eq!(record.len(), RECORD_LEN);

    // Lane 0 in the old keys and records, lane 1 beside them.
    for lane in [0u8, 1, 0, 1, 1] {
        b.join(&rid("r"), JoinRequest::in_lane(lane)).await.unwrap();
    }
    let epoch = b.epoch(&rid("r")).await.unwrap();
    let p = format!("narabu:{{r}}:{epoch}:");
    let members: Vec<(String, u64)> = con.zrange_withscores(format!("{p}q"), 0, -1).await.unwrap();
    let general: Vec<(String, u64)> = con
        .zrange_withscores(format!("{p}q:1"), 0, -1)
        .await
        .unwrap();
    let pairs = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
        v.iter().map(|(id, qi)| ((*id).to_owned(), *qi)).collect()
    };
    assert_eq!(members, pairs(&[("0", 0), ("2", 1)]));
    assert_eq!(general, pairs(&[("1", 0), ("3", 1), ("4", 2)]));
    let zero: Vec<u8> = con.hget(format!("{p}tk"), "2").await.unwrap();
    let one: Vec<u8> = con.hget(format!("{p}tk"), "3").await.unwrap();
    assert_eq!(zero.len(), RECORD_LEN);
    assert_eq!((one.len(), one.last()), (RECORD_LEN + 1, Some(&1)));
    // Only a pre-queue ticket's lane is kept apart (for the opening's
    // placement on other instances): an open room keeps none.
    let ln: bool = con.exists(format!("{p}ln")).await.unwrap();
    assert!(!ln);
    let counters: Vec<Option<String>> = redis::cmd("HMGET")
        .arg("narabu:{r}:room")
        .arg(&[
            "lanes", "lane_def", "lane_n1", "lane_w1", "lq1", "lw1", "lq0", "lw0",
        ])
        .query_async(&mut con)
        .await
        .unwrap();
    let counters: Vec<&str> = counters
        .iter()
        .map(|c| c.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(counters, ["2", "1", "general", "70", "3", "3", "2", "2"]);

    // One hash tag for every key of the room, so a cluster keeps it on one
    // slot and its scripts may touch them all.
    let keys: Vec<String> = con.keys("*").await.unwrap();
    for key in keys {
        assert!(
            key == "narabu:rooms"
                || key.starts_with("narabu:{r}:")
                || key.starts_with("narabu:{plain}:"),
            "{key}"
        );
    }
}

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
    b.renew(&rid("r"), &[general[0], general[1], general[2], next])
        .await
        .unwrap();
    let admitted = b.tick(&rid("r")).await.unwrap().admitted;
    assert_eq!(admitted, vec![next.id as u32]);
    let s = b.status(&rid("r"), member, false).await.unwrap();
    assert_eq!((s.state, s.lane), (TicketState::Away, 0));
    let view = b.room(&rid("r")).await.unwrap().view;
    let counts: Vec<(u64, u64)> = view.lanes.iter().map(|l| (l.waiting, l.admitted)).collect();
    assert_eq!(counts, vec![(0, 0), (0, 4)]);
}
