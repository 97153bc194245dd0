//! Two workers for one room at once, on purpose: the invariants do not
//! depend on the worker lease. Two instances each run a fenced worker
//! (the tick with its own lease token) while the test hands the lease back
//! and forth under them, so each in turn believes it holds it; and each
//! also ticks unfenced, as if there were no lease at all. Visitors join on
//! both instances and admitted ones release at once. Every admission step
//! is one atomic script, so the room's change log, read from outside,
//! shows admissions in ticket order, each ticket admitted once, never more
//! admitted than capacity at any step, and at rest every permit accounted
//! for; a fenced tick by the instance that does not hold the lease changes
//! nothing (work wasted, never a permit).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use narabu::backend::redis::{RedisBackend, RedisOptions};
use narabu::backend::{Backend, JoinRequest, TicketRef};
use narabu::engine::{RoomId, SystemClock, TicketState};
use serde_json::Value;

use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;

const CAPACITY: u32 = 3;
const TICKETS: usize = 60;

fn rid() -> RoomId {
    RoomId::new("r").unwrap()
}

/// Follows the room's change log from its start as it is written (the
/// instances trim it behind themselves), until `stop`: each admission and
/// end of an admitted ticket, in the order Redis made them. Entries carry
/// consecutive sequence numbers, so a gap would show.
fn follow_log(
    redis: &RedisServer,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(char, u64)>> {
    let client = redis::Client::open(redis.url()).unwrap();
    tokio::spawn(async move {
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let (mut last, mut seq, mut out) = ("0-0".to_owned(), 0u64, Vec::new());
        loop {
            let done = stop.load(Ordering::Relaxed);
            let reply: Option<redis::streams::StreamReadReply> = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1000)
                .arg("BLOCK")
                .arg(50)
                .arg("STREAMS")
                .arg("narabu:{r}:log")
                .arg(&last)
                .query_async(&mut con)
                .await
                .unwrap();
            let entries = reply.map(|r| r.keys).unwrap_or_default();
            let read = entries.iter().map(|k| k.ids.len()).sum::<usize>();
            for entry in entries.into_iter().flat_map(|k| k.ids) {
                last = entry.id.clone();
                let s: u64 = entry.get("s").unwrap();
                assert_eq!(s, seq + 1, "the log has a gap");
                seq = s;
                let Some(raw) = entry.get::<String>("e") else {
                    continue;
                };
                let events: Vec<Value> = serde_json::from_str(&raw).unwrap();
                for e in events {
                    let id = e[3].as_u64().unwrap_or(u64::MAX);
                    match e[0].as_str() {
                        Some("p") if e[4] == "adm" => out.push(('a', id)),
                        Some("e") => out.push(('e', id)),
                        _ => {}
                    }
                }
            }
            if done && read == 0 {
                return out;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_for_one_room_waste_work_and_never_a_permit() {
    let redis = RedisServer::start().await;
    let mut settings = room("r", CAPACITY);
    settings.join_limit_per_minute = 0;
    let mut instances = Vec::new();
    for _ in 0..2 {
        let options = RedisOptions {
            run_workers: false,
            ..RedisOptions::new(redis.url())
        };
        instances.push(
            RedisBackend::connect(options, vec![settings.clone()], Arc::new(SystemClock))
                .await
                .unwrap(),
        );
    }
    let tokens = ["worker-a", "worker-b"];
    let stop = Arc::new(AtomicBool::new(false));
    let log_done = Arc::new(AtomicBool::new(false));
    let log = follow_log(&redis, log_done.clone());
    let (effective, wasted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));

    // The lease, handed back and forth: each worker in turn holds it, and
    // neither is told when it loses it.
    let flipper = {
        let (redis, stop) = (redis.client().await, stop.clone());
        tokio::spawn(async move {
            let mut con = redis;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let _: () = redis::cmd("SET")
                    .arg("narabu:{r}:lease")
                    .arg(tokens[i % 2])
                    .query_async(&mut con)
                    .await
                    .unwrap();
                i += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    let mut workers = Vec::new();
    for (i, b) in instances.iter().enumerate() {
        let (b, stop) = (b.clone(), stop.clone());
        let (effective, wasted) = (effective.clone(), wasted.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                // Fenced by its own token: a no-op while the other holds it.
                match b.tick_as_worker(&rid(), tokens[i]).await.unwrap() {
                    Some(_) => effective.fetch_add(1, Ordering::Relaxed),
                    None => wasted.fetch_add(1, Ordering::Relaxed),
                };
                // And unfenced, as if there were no lease at all.
                b.tick(&rid()).await.unwrap();
                tokio::task::yield_now().await;
            }
        }));
    }

    // Visitors join on both instances; whoever is admitted releases at once
    // (on the other instance), so permits keep moving and hand-offs happen
    // beside the ticks.
    let mut tickets: Vec<TicketRef> = Vec::new();
    let mut released = HashSet::new();
    for k in 0..TICKETS {
        let b = &instances[k % 2];
        tickets.push(
            b.join(&rid(), JoinRequest::anonymous())
                .await
                .unwrap()
                .ticket,
        );
        release_admitted(&instances[(k + 1) % 2], &tickets, &mut released).await;
        let l = instances[0].room(&rid()).await.unwrap().ledger;
        assert!(l.admitted <= u64::from(CAPACITY), "over capacity: {l:?}");
    }
    // Until everyone has been admitted and has released.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while release_admitted(&instances[0], &tickets, &mut released).await < TICKETS {
        assert!(std::time::Instant::now() < deadline, "the line stopped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    flipper.await.unwrap();

    // At rest: every permit accounted for, nobody admitted, all released.
    let snap = instances[1].room(&rid()).await.unwrap();
    assert!(snap.ledger.balances(), "{:?}", snap.ledger);
    assert_eq!(snap.ledger.admitted, 0);
    assert_eq!(snap.stats.admissions, TICKETS as u64);

    // From outside, in Redis' own order: admissions in ticket order, each
    // ticket once, never more than capacity admitted at any step.
    log_done.store(true, Ordering::Relaxed);
    let steps = log.await.unwrap();
    let admitted: Vec<u64> = steps.iter().filter(|s| s.0 == 'a').map(|s| s.1).collect();
    assert_eq!(admitted, (0..TICKETS as u64).collect::<Vec<_>>());
    let mut holding = HashSet::new();
    for (kind, id) in steps {
        if kind == 'a' {
            assert!(holding.insert(id), "ticket {id} admitted twice");
        } else {
            assert!(holding.remove(&id), "ticket {id} ended unadmitted");
        }
        assert!(holding.len() <= CAPACITY as usize, "over capacity");
    }
    let (effective, wasted) = (
        effective.load(Ordering::Relaxed),
        wasted.load(Ordering::Relaxed),
    );
    println!("double worker: {effective} fenced ticks ran, {wasted} refused by the fence");
    assert!(
        effective > 0 && wasted > 0,
        "both workers ran and were fenced"
    );
}

/// Releases every admitted ticket (a no-op for the rest); how many have
/// been released so far.
async fn release_admitted(
    b: &Arc<RedisBackend>,
    tickets: &[TicketRef],
    released: &mut HashSet<u64>,
) -> usize {
    for t in tickets {
        if released.contains(&t.id) {
            continue;
        }
        match b.status(&rid(), *t, false).await.unwrap().state {
            TicketState::Admitted => {
                b.release(&rid(), *t).await.unwrap();
                released.insert(t.id);
            }
            TicketState::Waiting => break,
            other => panic!("ticket {} is {other:?}", t.id),
        }
    }
    released.len()
}
