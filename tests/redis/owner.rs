//! One engine on one owner, Redis as its log: the engine's records reach
//! the room's log in batches under the owner's fence, a replica built
//! from the image and the log by the journal's replay code matches the
//! owner's room, and when the lease passes the new owner restores the
//! engine from its replica and goes on, while the old owner's late
//! changes are refused and never acknowledged. Every acknowledged ticket
//! keeps its number across the change; at no point in the log are more
//! visitors admitted than the room's capacity.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use narabu::backend::redis::store::RedisStore;
use narabu::backend::room_log::{LogWriter, NotDurable, Replica, encode_image};
use narabu::backend::store::{LogPos, RoomStore};
use narabu::engine::{
    Clock, EventSink, Identity, ManualClock, Room, RoomId, RoomImage, TicketState,
};
use redis::AsyncConnectionConfig;

use narabu_testkit::redis_server::RedisServer;
use narabu_testkit::room;

const CAPACITY: u32 = 5;
const WITHIN: Duration = Duration::from_secs(5);

async fn store(redis: &RedisServer) -> Arc<dyn RoomStore> {
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    let client = redis::Client::open(redis.url()).unwrap();
    let con = || client.get_multiplexed_async_connection_with_config(&config);
    Arc::new(RedisStore::new(con().await.unwrap(), con().await.unwrap()))
}

fn sale() -> RoomId {
    RoomId::new("sale").unwrap()
}

type Logged = (Option<TicketState>, u8, Option<u32>, Option<u128>);

/// Each ticket's (state, lane, queue index, identity): what the log must
/// carry. When a visitor was last seen is not logged (it is renewed by
/// presence, not by changes), so it is left out.
fn tickets(image: &RoomImage) -> Vec<Logged> {
    image
        .tickets
        .iter()
        .map(|t| (t.state, t.lane, t.index, t.identity))
        .collect()
}

/// Visitors join, are admitted, leave and release on several threads of
/// one owner at once.
fn churn(room: &Arc<Room>, clock: &ManualClock, threads: u128, per_thread: u128, tag: u128) {
    std::thread::scope(|s| {
        for t in 0..threads {
            let room = room.clone();
            s.spawn(move || {
                for i in 0..per_thread {
                    let joined = room.join(Some(Identity(tag + t * 1_000 + i))).unwrap();
                    match i % 4 {
                        0 => {
                            room.leave(joined.ticket);
                        }
                        1 => {
                            room.tick();
                        }
                        2 => {
                            room.tick();
                            room.release(joined.ticket);
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    clock.advance(Duration::from_secs(1));
    room.tick();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_owner_logs_its_engine_and_a_new_owner_goes_on_from_the_log() {
    let redis = RedisServer::start().await;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let ttl = Duration::from_millis(500);

    // Instance A owns the room: its engine's records go to the log.
    let a = store(&redis).await;
    let fence_a = a.acquire(&sale(), "a", ttl).await.unwrap().unwrap();
    let writer_a = LogWriter::start(a.clone(), sale(), fence_a.clone(), 0, LogPos::START);
    let sink: Arc<dyn EventSink> = writer_a.clone();
    let room_a = Room::create(room("sale", CAPACITY), clock.clone(), 42, Some(sink));
    a.put_image(
        &sale(),
        &fence_a,
        &encode_image(&Replica::new(room_a.image())),
    )
    .await
    .unwrap();

    {
        let (room_a, clock) = (room_a.clone(), clock.clone());
        tokio::task::spawn_blocking(move || churn(&room_a, &clock, 8, 40, 1 << 64))
            .await
            .unwrap();
    }
    writer_a
        .wait_durable(writer_a.appended(), WITHIN)
        .await
        .unwrap();

    // Any instance's replica, from the image and the log, is the owner's room.
    let b = store(&redis).await;
    let mut replica = Replica::load(b.as_ref(), &sale()).await.unwrap().unwrap();
    replica.catch_up(b.as_ref(), &sale()).await.unwrap();
    assert_eq!(replica.last, writer_a.appended());
    assert_eq!(tickets(&replica.image), tickets(&room_a.image()));
    assert_eq!(replica.image.queues, room_a.image().queues);
    let acknowledged: HashMap<u128, (usize, Option<u32>)> = replica
        .image
        .tickets
        .iter()
        .enumerate()
        .filter_map(|(id, t)| Some((t.identity?, (id, t.index))))
        .collect();
    assert_eq!(acknowledged.len(), 8 * 40);

    // A stalls past its lease; B takes the room over from its replica.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let fence_b = b.acquire(&sale(), "b", ttl * 20).await.unwrap().unwrap();
    assert!(fence_b.token > fence_a.token);
    replica.catch_up(b.as_ref(), &sale()).await.unwrap();
    let writer_b = LogWriter::start(b.clone(), sale(), fence_b.clone(), replica.last, replica.at);
    let sink: Arc<dyn EventSink> = writer_b.clone();
    let room_b = Room::restore(replica.image.clone(), clock.clone(), Some(sink));

    // A does not know yet: its next change is refused by the log and never
    // acknowledged.
    let late = room_a.join(Some(Identity(7))).unwrap();
    assert_eq!(
        writer_a.wait_durable(writer_a.appended(), WITHIN).await,
        Err(NotDurable::Fenced)
    );
    assert!(writer_a.is_fenced());

    {
        let (room_b, clock) = (room_b.clone(), clock.clone());
        tokio::task::spawn_blocking(move || churn(&room_b, &clock, 8, 40, 2 << 64))
            .await
            .unwrap();
    }
    writer_b
        .wait_durable(writer_b.appended(), WITHIN)
        .await
        .unwrap();
    b.put_image(&sale(), &fence_b, &encode_image(&replica))
        .await
        .unwrap();
    b.trim(&sale(), replica.at).await.unwrap();

    // A newcomer, from the newer image and the trimmed log, sees B's room.
    let c = store(&redis).await;
    let mut newcomer = Replica::load(c.as_ref(), &sale()).await.unwrap().unwrap();
    newcomer.catch_up(c.as_ref(), &sale()).await.unwrap();
    assert_eq!(tickets(&newcomer.image), tickets(&room_b.image()));
    for (identity, (id, index)) in &acknowledged {
        let t = &newcomer.image.tickets[*id];
        assert_eq!(
            (t.identity, t.index),
            (Some(*identity), *index),
            "an acknowledged ticket kept its place"
        );
    }
    assert!(
        newcomer.image.tickets.iter().all(|t| t.identity != Some(7)),
        "the old owner's refused join {late:?} is nowhere"
    );
    let admitted = newcomer.image.count(TicketState::Admitted);
    assert!(admitted <= CAPACITY as usize, "{admitted} admitted");
    assert!(newcomer.image.tickets.len() > 8 * 40 * 2 - 1);
    assert!(clock.now_ms() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_reach_the_owner_in_batches_and_each_answer_reaches_its_asker() {
    use narabu::backend::bus::{AskError, Asker, serve};
    use tokio_util::sync::CancellationToken;

    const ASKS: usize = 300;
    let redis = RedisServer::start().await;
    let stop = CancellationToken::new();
    let owner = store(&redis).await;
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let batches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let (served, batches) = (served.clone(), batches.clone());
        tokio::spawn(serve(owner, sale(), stop.clone(), move |commands| {
            served.fetch_add(commands.len(), std::sync::atomic::Ordering::Relaxed);
            batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let bodies = commands
                .iter()
                .map(|c| [b"ok ".as_slice(), &c.body].concat())
                .collect();
            async move { bodies }
        }));
    }

    let mut askers = Vec::new();
    for name in ["a", "b", "c"] {
        let asker = Asker::start(store(&redis).await, name.into(), stop.clone());
        askers.push(asker);
    }
    let mut tasks = Vec::new();
    for (i, asker) in askers.iter().enumerate() {
        for n in 0..ASKS {
            let asker = asker.clone();
            tasks.push(tokio::spawn(async move {
                let body = format!("{i}:{n}").into_bytes();
                let answer = asker
                    .ask(&sale(), Asker::new_id(), body.clone(), WITHIN)
                    .await
                    .unwrap();
                assert_eq!(answer, [b"ok ".as_slice(), &body].concat());
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let served = served.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(served, 3 * ASKS, "each command applied once");
    let sends: u64 = askers.iter().map(|a| a.sends()).sum();
    let batches = batches.load(std::sync::atomic::Ordering::Relaxed);
    println!("{served} commands in {sends} sends and {batches} owner batches");
    assert!(
        sends < served as u64,
        "concurrent commands shared round trips"
    );

    // Nobody serves another room: its asker is told to try again, in time.
    let lonely = RoomId::new("nobody-owns").unwrap();
    assert_eq!(
        askers[0]
            .ask(
                &lonely,
                Asker::new_id(),
                b"x".to_vec(),
                Duration::from_millis(300)
            )
            .await,
        Err(AskError::TimedOut)
    );
    stop.cancel();
}
