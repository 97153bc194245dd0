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
use narabu::backend::room_log::{Applied, LogWriter, NotDurable, Replica, encode_image};
use narabu::backend::store::{LogPos, RoomStore, StoreError};
use narabu::engine::{
    AdmissionRecord, Clock, EventSink, Identity, ManualClock, Room, RoomId, RoomImage, TicketState,
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

/// The room's first owner: the lease for `ttl`, the writer, the engine
/// (on `clock`) and the room's first image.
struct FirstOwner {
    store: Arc<dyn RoomStore>,
    fence: narabu::backend::store::Fence,
    writer: Arc<LogWriter>,
    room: Arc<Room>,
}

async fn first_owner(redis: &RedisServer, clock: &Arc<ManualClock>, ttl: Duration) -> FirstOwner {
    let store = store(redis).await;
    let fence = store.acquire(&sale(), "a", ttl).await.unwrap().unwrap();
    let writer = LogWriter::start(store.clone(), sale(), fence.clone(), 0, LogPos::START);
    let sink: Arc<dyn EventSink> = writer.clone();
    let room = Room::create(room("sale", CAPACITY), clock.clone(), 42, Some(sink));
    store
        .put_image(
            &sale(),
            &fence,
            &encode_image(
                0,
                LogPos::START,
                &room.image(),
                &Applied::default(),
                None,
                &AdmissionRecord::new(room.id().as_str(), room.epoch()),
            ),
        )
        .await
        .unwrap();
    FirstOwner {
        store,
        fence,
        writer,
        room,
    }
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
    let FirstOwner {
        store: _,
        fence: fence_a,
        writer: writer_a,
        room: room_a,
    } = first_owner(&redis, &clock, ttl).await;

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
    b.put_image(
        &sale(),
        &fence_b,
        &encode_image(
            replica.last,
            replica.at,
            &replica.image,
            &replica.applied,
            None,
            &replica.record,
        ),
    )
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
                .map(|c| Some([b"ok ".as_slice(), &c.body].concat()))
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

/// Three instances contend for a room; its owner dies without a word (its
/// task aborted, its lease left to lapse) while acknowledged tickets wait.
/// Another instance takes the room over within the lease, from the image
/// and the log, with every acknowledged ticket at its number; the dead
/// owner's engine, still in memory, can no longer have a change
/// acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_that_dies_is_replaced_within_its_lease_and_loses_nothing_acknowledged() {
    use narabu::backend::owner::{Contender, Owned, OwnerOptions};
    use narabu::engine::SystemClock;
    use tokio_util::sync::CancellationToken;

    let redis = RedisServer::start().await;
    let options = OwnerOptions {
        lease: Duration::from_millis(1_000),
        image_every: Duration::from_millis(300),
        ticks: true,
    };
    let stop = CancellationToken::new();
    let mut contentions = Vec::new();
    for name in ["a", "b", "c"] {
        let contender = Contender {
            store: store(&redis).await,
            room: sale(),
            instance: name.into(),
            settings: Some(room("sale", CAPACITY)),
            clock: Arc::new(SystemClock),
            options: options.clone(),
            recorded: None,
            callouts: None,
        };
        contentions.push(contender.spawn(stop.clone()));
    }
    let owner_of =
        |contentions: &[narabu::backend::owner::Contention]| -> Vec<(usize, Arc<Owned>)> {
            contentions
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.owned.borrow().clone().map(|o| (i, o)))
                .collect()
        };
    let deadline = tokio::time::Instant::now() + WITHIN;
    let (first, owner) = loop {
        let owners = owner_of(&contentions);
        assert!(owners.len() <= 1, "two owners at once");
        if let Some(o) = owners.into_iter().next() {
            break o;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody took the room"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    let mut acknowledged = Vec::new();
    for i in 0..200u128 {
        let joined = owner.room().join(Some(Identity(1_000 + i))).unwrap();
        owner
            .writer
            .wait_durable(owner.writer.appended(), WITHIN)
            .await
            .unwrap();
        acknowledged.push((Identity(1_000 + i), joined.ticket, joined.number));
    }
    // Long enough for an image to be stored and the log trimmed behind it.
    tokio::time::sleep(options.image_every * 2).await;

    contentions[first].task.abort();
    let died = std::time::Instant::now();
    let (second, successor) = loop {
        let owners: Vec<_> = owner_of(&contentions)
            .into_iter()
            .filter(|(i, _)| *i != first)
            .collect();
        assert!(owners.len() <= 1, "two owners at once");
        if let Some(o) = owners.into_iter().next() {
            break o;
        }
        assert!(died.elapsed() < WITHIN, "nobody took the room over");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let resumed = died.elapsed();
    println!(
        "owner {first} died; owner {second} took over after {resumed:?} (lease {:?})",
        options.lease
    );
    assert!(successor.fence.token > owner.fence.token);

    for (identity, ticket, number) in &acknowledged {
        let now = successor.room().ticket_of(*identity);
        assert_eq!(
            now,
            Some(*ticket),
            "acknowledged ticket of {identity:?} kept"
        );
        let place = successor
            .room()
            .placement(*ticket)
            .map(|(_, index)| u64::from(index) + 1);
        assert_eq!(place, *number, "and its number");
    }
    // The dead owner's engine is still in memory; nothing it does now is
    // acknowledged.
    owner.room().join(Some(Identity(7))).unwrap();
    assert_eq!(
        owner
            .writer
            .wait_durable(owner.writer.appended(), WITHIN)
            .await,
        Err(NotDurable::Fenced)
    );
    // The successor goes on where the log ended.
    let next = successor.room().join(Some(Identity(8))).unwrap();
    successor
        .writer
        .wait_durable(successor.writer.appended(), WITHIN)
        .await
        .unwrap();
    assert!(next.ticket as usize >= acknowledged.len());
    assert_eq!(successor.room().ticket_of(Identity(7)), None);

    // The image was stored: a newcomer reads it and a short log.
    let reader = store(&redis).await;
    let image = reader.image(&sale()).await.unwrap().unwrap();
    assert!(image.at > LogPos::START, "an image after the first");
    let mut newcomer = Replica::load(reader.as_ref(), &sale())
        .await
        .unwrap()
        .unwrap();
    newcomer.catch_up(reader.as_ref(), &sale()).await.unwrap();
    assert_eq!(tickets(&newcomer.image), tickets(&successor.room().image()));
    stop.cancel();
}

/// Another instance's replica follows the owner's log by itself: a read
/// after the visitor's own write waits until the replica has that write,
/// and a replica that fell behind a trimmed log starts again from the
/// newer image.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_followers_replica_reaches_each_acknowledged_write_and_survives_a_trim() {
    use narabu::backend::room_log::Follower;
    use tokio_util::sync::CancellationToken;

    let redis = RedisServer::start().await;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let stop = CancellationToken::new();
    let FirstOwner {
        store: owner,
        fence,
        writer,
        room: room_a,
    } = first_owner(&redis, &clock, Duration::from_secs(30)).await;

    let follower = Follower::spawn(store(&redis).await, sale(), stop.clone());
    for i in 0..50u128 {
        let joined = room_a.join(Some(Identity(100 + i))).unwrap();
        let pos = writer
            .wait_durable(writer.appended(), WITHIN)
            .await
            .unwrap();
        assert!(
            follower.reached(pos, WITHIN).await,
            "the replica reached the join"
        );
        let seen = follower.read(|r| {
            r.and_then(|r| {
                r.image
                    .tickets
                    .get(joined.ticket as usize)
                    .map(|t| t.identity)
            })
        });
        assert_eq!(seen, Some(Some(100 + i)), "the visitor's own join is there");
    }

    // A replica left behind while the owner stores an image and trims the
    // log under it sees the gap, never a wrong room, and starts again from
    // the newer image; the follower, which kept up, is not disturbed.
    let mut behind = Replica::load(owner.as_ref(), &sale())
        .await
        .unwrap()
        .unwrap();
    behind.catch_up(owner.as_ref(), &sale()).await.unwrap();
    for i in 0..20u128 {
        room_a.join(Some(Identity(500 + i))).unwrap();
        writer
            .wait_durable(writer.appended(), WITHIN)
            .await
            .unwrap();
    }
    let (last, at) = writer.durable_point();
    assert!(last > behind.last);
    owner
        .put_image(
            &sale(),
            &fence,
            &encode_image(
                last,
                at,
                &room_a.image(),
                &Applied::default(),
                None,
                &AdmissionRecord::new(room_a.id().as_str(), room_a.epoch()),
            ),
        )
        .await
        .unwrap();
    owner.trim(&sale(), at).await.unwrap();
    room_a.join(Some(Identity(900))).unwrap();
    let end = writer
        .wait_durable(writer.appended(), WITHIN)
        .await
        .unwrap();
    match behind.catch_up(owner.as_ref(), &sale()).await {
        Err(StoreError::Damaged(why)) => assert!(why.contains("missing"), "{why}"),
        other => panic!("a replica behind a trim went on: {other:?}"),
    }
    let mut again = Replica::load(owner.as_ref(), &sale())
        .await
        .unwrap()
        .unwrap();
    again.catch_up(owner.as_ref(), &sale()).await.unwrap();
    assert_eq!(tickets(&again.image), tickets(&room_a.image()));
    assert!(follower.reached(end, WITHIN).await);
    let image = follower.read(|r| r.unwrap().image.clone());
    assert_eq!(tickets(&image), tickets(&room_a.image()));
    stop.cancel();
}

/// A command in flight when its owner dies is applied once: the dead owner
/// applied it and logged its answer but never replied; the asker, told to
/// try again, sends the same id; the new owner finds the id in its replica
/// and answers with the first answer instead of applying it again. The
/// window of answered ids survives the image too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_in_flight_at_a_change_of_owner_is_applied_once() {
    use narabu::backend::bus::{AskError, Asker, serve};
    use tokio_util::sync::CancellationToken;

    let redis = RedisServer::start().await;
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let stop = CancellationToken::new();
    let FirstOwner {
        store: a,
        fence: _,
        writer: writer_a,
        room: room_a,
    } = first_owner(&redis, &clock, Duration::from_millis(500)).await;

    // A command's body names the identity to join with; its answer is the
    // ticket.
    let join = |room: &Arc<Room>, writer: &Arc<LogWriter>, id: u128, body: &[u8]| -> Vec<u8> {
        if let Some(first) = writer.applied(id) {
            return first;
        }
        let identity = u128::from_be_bytes(body.try_into().unwrap());
        let ticket = room.join(Some(Identity(identity))).unwrap().ticket;
        let reply = ticket.to_be_bytes().to_vec();
        writer.append_applied(id, reply.clone());
        reply
    };

    // Owner A applies the command, makes it durable, and dies before it
    // answers (its loop never returns the batch's replies).
    let a_stop = CancellationToken::new();
    {
        let (room_a, writer_a) = (room_a.clone(), writer_a.clone());
        tokio::spawn(serve(a.clone(), sale(), a_stop.clone(), move |commands| {
            for c in &commands {
                join(&room_a, &writer_a, c.id, &c.body);
            }
            let writer_a = writer_a.clone();
            async move {
                writer_a
                    .wait_durable(writer_a.appended(), WITHIN)
                    .await
                    .unwrap();
                std::future::pending::<Vec<Option<Vec<u8>>>>().await
            }
        }));
    }
    let asker = Asker::start(store(&redis).await, "x".into(), stop.clone());
    let command = Asker::new_id();
    let body = 77u128.to_be_bytes().to_vec();
    assert_eq!(
        asker
            .ask(&sale(), command, body.clone(), Duration::from_millis(700))
            .await,
        Err(AskError::TimedOut)
    );
    a_stop.cancel();

    // B takes the room over from its replica, and serves.
    let b = store(&redis).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let fence_b = b
        .acquire(&sale(), "b", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let mut replica = Replica::load(b.as_ref(), &sale()).await.unwrap().unwrap();
    replica.catch_up(b.as_ref(), &sale()).await.unwrap();
    assert!(
        replica.applied.get(command).is_some(),
        "the replica knows the command was applied"
    );
    let writer_b = LogWriter::start_with(
        b.clone(),
        sale(),
        fence_b.clone(),
        replica.last,
        replica.at,
        replica.applied.clone(),
    );
    let sink: Arc<dyn EventSink> = writer_b.clone();
    let room_b = Room::restore(replica.image.clone(), clock.clone(), Some(sink));
    {
        let (room_b, writer_b) = (room_b.clone(), writer_b.clone());
        tokio::spawn(serve(b.clone(), sale(), stop.clone(), move |commands| {
            let replies: Vec<Option<Vec<u8>>> = commands
                .iter()
                .map(|c| Some(join(&room_b, &writer_b, c.id, &c.body)))
                .collect();
            let writer_b = writer_b.clone();
            async move {
                writer_b
                    .wait_durable(writer_b.appended(), WITHIN)
                    .await
                    .unwrap();
                replies
            }
        }));
    }

    // The asker tries again with the same id, and a new command besides.
    let again = asker
        .ask(&sale(), command, body.clone(), WITHIN)
        .await
        .unwrap();
    let ticket = room_b.ticket_of(Identity(77)).unwrap();
    assert_eq!(again, ticket.to_be_bytes().to_vec(), "the first answer");
    let other = asker
        .ask(
            &sale(),
            Asker::new_id(),
            78u128.to_be_bytes().to_vec(),
            WITHIN,
        )
        .await
        .unwrap();
    assert_eq!(
        other,
        room_b
            .ticket_of(Identity(78))
            .unwrap()
            .to_be_bytes()
            .to_vec()
    );
    let joins_of_77 = room_b
        .image()
        .tickets
        .iter()
        .filter(|t| t.identity == Some(77))
        .count();
    assert_eq!(joins_of_77, 1, "applied once");
    assert_eq!(room_b.image().tickets.len(), 2, "two commands, two tickets");

    // The window is in the image a new owner starts from.
    let (last, at) = writer_b.durable_point();
    b.put_image(
        &sale(),
        &fence_b,
        &encode_image(
            last,
            at,
            &room_b.image(),
            &writer_b.applied_window(),
            None,
            &AdmissionRecord::new(room_b.id().as_str(), room_b.epoch()),
        ),
    )
    .await
    .unwrap();
    b.trim(&sale(), at).await.unwrap();
    let later = Replica::load(b.as_ref(), &sale()).await.unwrap().unwrap();
    assert_eq!(later.applied.get(command), Some(&ticket.to_be_bytes()[..]));
    stop.cancel();
}
