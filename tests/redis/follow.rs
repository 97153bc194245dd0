//! An instance's replica of a room's line survives what instances live
//! through: it starts late (the log it missed is read from a snapshot), it
//! loses its Redis connection while the line moves, and the log is trimmed
//! past what it had read meanwhile (a gap in the entries' seq, so it
//! reloads the snapshot). Each time, its counts equal Redis' own.

use std::sync::Arc;
use std::time::Duration;

use narabu::backend::Backend;

use crate::conformance::feed::{Life, counts_agree, rooms, seed};
use narabu_testkit::redis_server::{Harness, Kind};

/// Cut every client's connection to Redis (but this one): the follower's
/// blocking read and the instances' shared connections alike. Returns once
/// every instance has reconnected.
async fn cut_connections(h: &Harness) {
    let mut redis = h.redis().client().await;
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut redis)
        .await
        .unwrap();
    for b in &h.backends {
        let mut tries = 0;
        while b.ready().await.is_err() {
            tries += 1;
            assert!(tries < 100, "an instance did not reconnect");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn live(life: &mut Life, b: &Arc<dyn Backend>, h: &Harness, steps: usize) {
    for _ in 0..steps {
        life.step(b, h).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_instance_reads_the_line_it_missed() {
    let h = Harness::instances(Kind::Redis, rooms(), 2).await;
    let (driver, late) = (h.backends[0].clone(), h.backends[1].clone());
    for (i, (name, lanes)) in [("lottery", 1), ("open", 1), ("lanes", 2)]
        .into_iter()
        .enumerate()
    {
        let mut life = Life::new(name, lanes, seed() ^ 0x1a7e ^ i as u64);
        // Nobody on the second instance follows the room yet.
        live(&mut life, &driver, &h, 40).await;
        counts_agree(&h, &late, &life).await;
        // From then on it follows the log.
        live(&mut life, &driver, &h, 30).await;
        counts_agree(&h, &late, &life).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_lost_its_connection_catches_up() {
    let h = Harness::instances(Kind::Redis, rooms(), 2).await;
    let (driver, follower) = (h.backends[0].clone(), h.backends[1].clone());
    let mut life = Life::new("lanes", 2, seed() ^ 0xc0ff);
    live(&mut life, &driver, &h, 20).await;
    counts_agree(&h, &follower, &life).await;

    // Every client's connection is cut (the follower's blocking read too):
    // the line moves while it reconnects, and it resumes from its place.
    cut_connections(&h).await;
    live(&mut life, &driver, &h, 15).await;
    counts_agree(&h, &follower, &life).await;

    // Again, and this time the log is trimmed to nothing while it is away,
    // then moves on: it finds a gap and reads the line anew.
    cut_connections(&h).await;
    live(&mut life, &driver, &h, 5).await;
    let mut redis = h.redis().client().await;
    let _: u64 = redis::cmd("XTRIM")
        .arg("narabu:v7:{open}:log")
        .arg("MAXLEN")
        .arg(0)
        .query_async(&mut redis)
        .await
        .unwrap();
    live(&mut life, &driver, &h, 15).await;
    counts_agree(&h, &follower, &life).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    live(&mut life, &driver, &h, 10).await;
    counts_agree(&h, &follower, &life).await;
}
