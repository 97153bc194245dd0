//! Two owners of one room at once, on purpose: the invariants do not
//! depend on the lease's timing. Two instances serve the room while the
//! test deletes its lease under them over and over, so the one that does
//! not hold it takes it (with a higher fencing token) while the other
//! still runs the engine and believes it owns the room until its next
//! renewal or append is refused. Visitors join on both instances and
//! admitted ones release at once (on the other instance), while both
//! instances ask for ticks. Read from outside, in the log's order, the
//! room admits in ticket order, each ticket once, never more than its
//! capacity at any step; at rest every permit is accounted for. What an
//! old owner did after its successor's fence is never in the log, and
//! never acknowledged to anyone.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narabu::backend::owned::OwnedBackend;
use narabu::backend::redis::RedisOptions;
use narabu::backend::redis::store::RedisStore;
use narabu::backend::room_log::{Follower, LogRecord, Moved};
use narabu::backend::{Backend, JoinRequest, TicketRef};
use narabu::engine::{EventRecord, RoomId, SystemClock, TicketState};

use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;

const CAPACITY: u32 = 3;
const TICKETS: usize = 60;

fn rid() -> RoomId {
    RoomId::new("r").unwrap()
}

/// Follows the room's log from its first image, as it is written: each
/// admission and end of an admitted ticket, and each new owner, in the
/// log's order.
async fn follow_log(
    redis: &RedisServer,
    stop: tokio_util::sync::CancellationToken,
) -> (Arc<Follower>, Arc<Mutex<Vec<(char, u64)>>>) {
    let store = RedisStore::connect(&redis.url().into(), narabu::config::RedisWait::OFF)
        .await
        .unwrap();
    let steps = Arc::new(Mutex::new(Vec::new()));
    let seen = steps.clone();
    let follower = Follower::observed(
        Arc::new(store),
        rid(),
        stop,
        || None,
        move |_, moved| {
            let Moved::Applied(records) = moved else {
                return;
            };
            let mut steps = seen.lock().unwrap();
            for r in records {
                match r {
                    LogRecord::Event(EventRecord::Admitted { ticket, .. }) => {
                        steps.push(('a', u64::from(*ticket)))
                    }
                    LogRecord::Event(EventRecord::Ended { ticket, .. }) => {
                        steps.push(('e', u64::from(*ticket)))
                    }
                    LogRecord::Owner { token } => steps.push(('o', *token)),
                    _ => {}
                }
            }
        },
    );
    (follower, steps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_for_one_room_never_make_a_permit() {
    let redis = RedisServer::start().await;
    let mut settings = room("r", CAPACITY);
    settings.join_limit_per_minute = 0;
    let mut instances = Vec::new();
    for _ in 0..2 {
        let options = RedisOptions {
            run_workers: false,
            lease: Duration::from_millis(900),
            ..RedisOptions::new(redis.url())
        };
        instances.push(
            narabu::backend::redis::connect(options, vec![settings.clone()], Arc::new(SystemClock))
                .await
                .unwrap(),
        );
    }
    // The room exists once its first owner made it.
    instances[0].room(&rid()).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let log_stop = tokio_util::sync::CancellationToken::new();
    let (follower, steps) = follow_log(&redis, log_stop.clone()).await;
    let owner_changes = Arc::new(AtomicU64::new(0));

    // The lease, taken from under its holder again and again: the other
    // instance acquires it at its next try, and the holder is not told.
    let thief = {
        let (mut con, stop) = (redis.client().await, stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _: () = redis::cmd("DEL")
                    .arg("narabu:v7:{r}:lease")
                    .query_async(&mut con)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(120)).await;
            }
        })
    };
    // Both instances ask for ticks all along (each sent to whichever owner
    // the instance knows; refused and retried while owners change).
    let mut tickers = Vec::new();
    for b in &instances {
        let (b, stop) = (b.clone(), stop.clone());
        tickers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = b.tick(&rid()).await;
                tokio::time::sleep(Duration::from_millis(2)).await;
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
        tickets.push(join(b).await);
        release_admitted(&instances[(k + 1) % 2], &tickets, &mut released).await;
        let l = instances[0].room(&rid()).await.unwrap().ledger;
        assert!(l.admitted <= u64::from(CAPACITY), "over capacity: {l:?}");
    }
    // Until everyone has been admitted and has released.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while release_admitted(&instances[0], &tickets, &mut released).await < TICKETS {
        assert!(std::time::Instant::now() < deadline, "the line stopped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tickers {
        t.await.unwrap();
    }
    thief.await.unwrap();

    // At rest: every permit accounted for, nobody admitted, all released.
    let snap = instances[1].room(&rid()).await.unwrap();
    assert!(snap.ledger.balances(), "{:?}", snap.ledger);
    assert_eq!(snap.ledger.admitted, 0);
    assert_eq!(snap.stats.admissions, TICKETS as u64);

    // From outside, in the log's order: admissions in ticket order, each
    // ticket once, never more than capacity admitted at any step.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let ended = steps.lock().unwrap().iter().filter(|s| s.0 == 'e').count();
        if ended == TICKETS {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the log ends short");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    log_stop.cancel();
    drop(follower);
    let steps = steps.lock().unwrap().clone();
    let admitted: Vec<u64> = steps.iter().filter(|s| s.0 == 'a').map(|s| s.1).collect();
    assert_eq!(admitted, tickets.iter().map(|t| t.id).collect::<Vec<_>>());
    let mut holding = HashSet::new();
    for (kind, id) in steps {
        match kind {
            'a' => assert!(holding.insert(id), "ticket {id} admitted twice"),
            'e' => assert!(holding.remove(&id), "ticket {id} ended unadmitted"),
            _ => {
                owner_changes.fetch_add(1, Ordering::Relaxed);
            }
        }
        assert!(holding.len() <= CAPACITY as usize, "over capacity");
    }
    let changes = owner_changes.load(Ordering::Relaxed);
    println!("double owner: the room changed owner {changes} times");
    assert!(changes >= 2, "the lease was taken from under its holder");
}

/// A join, sent again while an owner change refuses it for the moment.
async fn join(b: &Arc<OwnedBackend>) -> TicketRef {
    for _ in 0..50 {
        match b.join(&rid(), JoinRequest::anonymous()).await {
            Ok(joined) => return joined.ticket,
            Err(e) => {
                println!("join refused for now: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    panic!("no owner took the join");
}

/// Releases every admitted ticket (a no-op for the rest); how many have
/// been released so far.
async fn release_admitted(
    b: &Arc<OwnedBackend>,
    tickets: &[TicketRef],
    released: &mut HashSet<u64>,
) -> usize {
    for t in tickets {
        if released.contains(&t.id) {
            continue;
        }
        match b.status(&rid(), *t, false).await.unwrap().state {
            // Refused for the moment while the owner changes: next time.
            TicketState::Admitted => {
                if b.release(&rid(), *t).await.is_ok() {
                    released.insert(t.id);
                }
            }
            TicketState::Waiting => break,
            other => panic!("ticket {} is {other:?}", t.id),
        }
    }
    released.len()
}
