//! Redis Cluster: three masters started here, joined with `redis-cli
//! --cluster create`; several rooms (spread over the shards by their hash
//! tags) take joins, admit through their owners' workers and hand off, with
//! the admission reaching the visitor's watch from the room's log on
//! whichever node the room lives on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::backend::redis::RedisOptions;
use narabu::backend::{Backend, JoinRequest};
use narabu::engine::{Departure, Handoff, RoomId, SystemClock, TicketState};

use narabu_testkit::redis_ha::RedisCluster;
use narabu_testkit::room;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_spread_over_a_three_master_cluster_admit_and_hand_off() {
    let cluster = RedisCluster::start(3, 0).await;
    let nodes = &cluster.nodes;

    let ids: Vec<String> = (0..6).map(|i| format!("room-{i}")).collect();
    let rooms: Vec<_> = ids
        .iter()
        .map(|id| {
            let mut r = room(id, 1);
            r.tick = Duration::from_millis(100);
            r
        })
        .collect();
    let options = RedisOptions {
        lease: Duration::from_secs(2),
        ..RedisOptions::new(cluster.target())
    };
    let backend = narabu::backend::redis::connect(options, rooms, Arc::new(SystemClock))
        .await
        .unwrap();

    // The rooms' keys land on more than one master (each room's first
    // owner makes it in the background, just after the start).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut used = 0;
        for n in nodes {
            let mut c = n.client().await;
            let size: i64 = redis::cmd("DBSIZE").query_async(&mut c).await.unwrap();
            used += usize::from(size > 0);
        }
        if used >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "all rooms on one shard");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    for id in &ids {
        let room = RoomId::new(id).unwrap();
        let first = backend
            .join(&room, JoinRequest::anonymous())
            .await
            .unwrap()
            .ticket;
        let second = backend
            .join(&room, JoinRequest::anonymous())
            .await
            .unwrap()
            .ticket;
        let signal = backend.watch_ticket(&room, second).await.unwrap();
        let woken = signal.notify().notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        // The room's worker (this instance, by lease) admits the first.
        let deadline = Instant::now() + Duration::from_secs(20);
        while backend.status(&room, first, true).await.unwrap().state != TicketState::Admitted {
            assert!(Instant::now() < deadline, "{id}: nobody admitted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            backend.leave(&room, first).await.unwrap(),
            Departure::GaveBack(Handoff::To(second.id as u32))
        );
        // The admission arrives through the room's log on its node.
        tokio::time::timeout(Duration::from_secs(10), woken)
            .await
            .unwrap_or_else(|_| panic!("{id}: the hand-off was not pushed"));
        assert_eq!(
            backend.status(&room, second, false).await.unwrap().state,
            TicketState::Admitted
        );
        let ledger = backend.room(&room).await.unwrap().ledger;
        assert!(ledger.balances() && ledger.admitted == 1, "{ledger:?}");
    }
    assert_eq!(backend.list_rooms().await.unwrap().len(), 6);
    backend.shutdown().await;
}
