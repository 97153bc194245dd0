//! The owner's store on a real Redis: the lease and its fencing token, the
//! fenced log, the image, and the command bus with its replies. The
//! invariant that matters most is checked with many tasks at once: however
//! the lease passes between them (lapsing under a paused holder, handed
//! over, raced for), the log never holds a batch of an older fence after
//! one of a newer fence, and nothing a holder was told it wrote is missing.

use std::sync::Arc;
use std::time::Duration;

use narabu::backend::redis::store::RedisStore;
use narabu::backend::store::{Command, Fence, Image, LogPos, Reply, RoomStore, StoreError};
use narabu::engine::RoomId;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use narabu_testkit::redis_server::RedisServer;

type Store = RedisStore<MultiplexedConnection>;

async fn connect(redis: &RedisServer) -> MultiplexedConnection {
    // A waiting read must come back before the connection gives up on it.
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

async fn store(redis: &RedisServer) -> Store {
    RedisStore::new(connect(redis).await, connect(redis).await)
}

fn sale() -> RoomId {
    RoomId::new("sale").unwrap()
}

#[tokio::test]
async fn a_lapsed_owner_is_fenced_out_and_cannot_touch_its_successors_lease() {
    let redis = RedisServer::start().await;
    let (a, b) = (store(&redis).await, store(&redis).await);
    // Long enough that the steps before the stall fit in it on a loaded
    // machine.
    let ttl = Duration::from_millis(1_500);

    let first = a.acquire(&sale(), "a", ttl).await.unwrap().unwrap();
    assert!(b.acquire(&sale(), "b", ttl).await.unwrap().is_none());
    assert_eq!(b.holder(&sale()).await.unwrap(), Some(first.lease_value()));
    let p1 = a.append(&sale(), &first, first.mark, b"one").await.unwrap();
    assert!(a.renew(&sale(), &first, ttl).await.unwrap());

    // `a` stalls past its lease; `b` takes it with a higher token.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let second = b.acquire(&sale(), "b", ttl).await.unwrap().unwrap();
    assert!(second.token > first.token);

    assert_eq!(
        a.append(&sale(), &first, p1, b"late").await,
        Err(StoreError::Fenced)
    );
    let image = Image {
        at: p1,
        bytes: b"stale".to_vec(),
    };
    assert_eq!(
        a.put_image(&sale(), &first, &image).await,
        Err(StoreError::Fenced)
    );
    assert!(!a.renew(&sale(), &first, ttl).await.unwrap());
    assert!(!a.release(&sale(), &first).await.unwrap());
    assert_eq!(
        b.holder(&sale()).await.unwrap(),
        Some(second.lease_value()),
        "the old owner's release left the successor's lease alone"
    );

    let p2 = b
        .append(&sale(), &second, second.mark, b"two")
        .await
        .unwrap();
    assert!(p2 > p1);
    let log = a
        .read(&sale(), LogPos::START, 10, Duration::ZERO)
        .await
        .unwrap();
    // Each lease taken left its mark (an entry without records) before
    // its owner's batches.
    let batches: Vec<&[u8]> = log.iter().map(|e| e.batch.as_slice()).collect();
    assert_eq!(batches, [&b""[..], &b"one"[..], &b""[..], &b"two"[..]]);

    // A graceful hand-over: released, the next taker need not wait.
    assert!(b.release(&sale(), &second).await.unwrap());
    let third = a.acquire(&sale(), "a", ttl).await.unwrap().unwrap();
    assert!(third.token > second.token);
}

#[tokio::test]
async fn many_would_be_owners_never_interleave_an_older_fence_after_a_newer_one() {
    const TASKS: usize = 12;
    const ROUNDS: usize = 40;
    let redis = RedisServer::start().await;
    let ttl = Duration::from_millis(40);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let store = Arc::new(store(&redis).await);
        tasks.push(tokio::spawn(async move {
            let name = format!("i{t}");
            // The lease held, and where its holder last appended.
            let mut held: Option<(Fence, LogPos)> = None;
            let mut written = Vec::new();
            for round in 0..ROUNDS {
                let (fence, after) = match held.clone() {
                    Some(f) => f,
                    None => match store.acquire(&sale(), &name, ttl).await.unwrap() {
                        Some(f) => {
                            let mark = f.mark;
                            (f, mark)
                        }
                        None => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                    },
                };
                match store
                    .append(&sale(), &fence, after, &fence.token.to_be_bytes())
                    .await
                {
                    Ok(pos) => {
                        written.push((pos, fence.token));
                        held = Some((fence, pos));
                    }
                    Err(StoreError::Fenced) => held = None,
                    Err(e) => panic!("{e}"),
                }
                // Now and then a holder stalls past its lease, or hands it
                // over, so the lease changes hands every way it can.
                match (t + round) % 7 {
                    0 => tokio::time::sleep(ttl * 2).await,
                    3 => {
                        if let Some((f, _)) = held.take() {
                            store.release(&sale(), &f).await.unwrap();
                        }
                    }
                    _ => tokio::time::sleep(Duration::from_millis(3)).await,
                }
            }
            written
        }));
    }
    let mut acknowledged = Vec::new();
    for t in tasks {
        acknowledged.extend(t.await.unwrap());
    }
    let reader = store(&redis).await;
    let log = reader
        .read(&sale(), LogPos::START, 100_000, Duration::ZERO)
        .await
        .unwrap();
    // Each lease taken left its mark, an entry without records; every
    // batch's id starts with its writer's token.
    let log: Vec<_> = log.into_iter().filter(|e| !e.batch.is_empty()).collect();
    let tokens: Vec<u64> = log
        .iter()
        .map(|e| u64::from_be_bytes(e.batch.as_slice().try_into().unwrap()))
        .collect();
    assert!(log.iter().zip(&tokens).all(|(e, &t)| e.pos.ms == t));
    assert!(
        tokens.windows(2).all(|w| w[0] <= w[1]),
        "an older owner wrote after a newer one: {tokens:?}"
    );
    let distinct = {
        let mut t = tokens.clone();
        t.dedup();
        t.len()
    };
    assert!(
        distinct > 3,
        "the lease changed hands only {distinct} times"
    );
    acknowledged.sort();
    let in_log: Vec<(LogPos, u64)> = log.iter().map(|e| e.pos).zip(tokens).collect();
    assert_eq!(
        acknowledged, in_log,
        "every acknowledged batch, and only those"
    );
}

#[tokio::test]
async fn an_image_covers_the_log_it_trims_and_a_newcomer_starts_from_both() {
    let redis = RedisServer::start().await;
    let owner = store(&redis).await;
    let fence = owner
        .acquire(&sale(), "a", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let mut positions = Vec::new();
    let mut after = fence.mark;
    for i in 0..10u8 {
        after = owner.append(&sale(), &fence, after, &[i]).await.unwrap();
        positions.push(after);
    }
    assert_eq!(owner.last(&sale()).await.unwrap(), Some(positions[9]));
    assert_eq!(owner.image(&sale()).await.unwrap(), None);
    let image = Image {
        at: positions[5],
        bytes: b"state after six".to_vec(),
    };
    owner.put_image(&sale(), &fence, &image).await.unwrap();
    owner.trim(&sale(), image.at).await.unwrap();

    let newcomer = store(&redis).await;
    let start = newcomer.image(&sale()).await.unwrap().unwrap();
    assert_eq!(start, image);
    let rest = newcomer
        .read(&sale(), start.at, 100, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        rest.iter().map(|e| e.batch[0]).collect::<Vec<_>>(),
        [6, 7, 8, 9]
    );
    // What the image covers is gone from the log itself.
    let all = newcomer
        .read(&sale(), LogPos::START, 100, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(all.len(), 4);
    // Reading many at a time, a batch at a time.
    let two = newcomer
        .read(&sale(), start.at, 2, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
}

#[tokio::test]
async fn commands_reach_the_owner_in_batches_and_replies_reach_their_sender() {
    let redis = RedisServer::start().await;
    let (owner, asker) = (Arc::new(store(&redis).await), store(&redis).await);

    // A waiting read returns as soon as a command arrives.
    let waiting = {
        let owner = owner.clone();
        tokio::spawn(async move {
            owner
                .receive(&sale(), LogPos::START, 100, Duration::from_secs(5))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let commands: Vec<Command> = (0..32u128)
        .map(|i| Command {
            id: (i << 64) | 0xabc,
            from: "b".into(),
            body: format!("join {i}").into_bytes(),
        })
        .collect();
    asker.send(&sale(), &commands).await.unwrap();
    let mut got = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiting read came back")
        .unwrap();
    if got.len() < commands.len() {
        let after = got.last().unwrap().0;
        got.extend(
            owner
                .receive(&sale(), after, 100, Duration::ZERO)
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        got.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>(),
        commands
    );

    let replies: Vec<Reply> = got
        .iter()
        .map(|(_, c)| Reply {
            to: c.from.clone(),
            id: c.id,
            body: [b"ok ".as_slice(), &c.body].concat(),
        })
        .collect();
    owner.reply(&replies).await.unwrap();
    owner
        .consumed(&sale(), got.last().unwrap().0)
        .await
        .unwrap();
    assert!(
        owner
            .receive(&sale(), LogPos::START, 100, Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "consumed commands are gone"
    );

    let answered = asker
        .replies("b", LogPos::START, 100, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        answered.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
        replies
    );
    assert!(
        asker
            .replies("c", LogPos::START, 100, Duration::ZERO)
            .await
            .unwrap()
            .is_empty(),
        "another instance hears none of them"
    );
}

#[tokio::test]
async fn a_redis_of_another_narabu_schema_is_refused_by_name() {
    let redis = RedisServer::start().await;
    let s = store(&redis).await;
    s.check_schema().await.unwrap();
    s.check_schema().await.unwrap();

    let mut con = redis.client().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("SADD")
        .arg("narabu:rooms")
        .arg("sale")
        .query_async(&mut con)
        .await
        .unwrap();
    match s.check_schema().await {
        Err(StoreError::Damaged(m)) => assert!(m.contains("earlier Narabu"), "{m}"),
        other => panic!("{other:?}"),
    }

    let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("narabu:schema")
        .arg(2)
        .query_async(&mut con)
        .await
        .unwrap();
    match s.check_schema().await {
        Err(StoreError::Damaged(m)) => assert!(m.contains("schema 2"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_store_says_unavailable_without_naming_where_redis_is() {
    let mut redis = RedisServer::start().await;
    let s = store(&redis).await;
    redis.kill();
    match s.last(&sale()).await {
        Err(StoreError::Unavailable(m)) => assert!(!m.contains("redis://"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// On a Redis Cluster each room's keys share its hash tag's slot, so the
/// fenced scripts run wherever the room lives; rooms spread over the
/// masters, and replies to several instances (each on its own slot) travel
/// in one pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_room_keeps_its_lease_log_and_bus_on_its_slot() {
    use narabu_testkit::redis_ha::RedisCluster;
    use redis::cluster::ClusterClient;
    use redis::cluster_async::ClusterConnection;

    let cluster = RedisCluster::start(3, 0).await;
    let nodes: Vec<String> = cluster.nodes.iter().map(|n| n.url()).collect();
    let connect = || async {
        ClusterClient::builder(nodes.clone())
            .response_timeout(Duration::from_secs(10))
            .build()
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    };
    let store: RedisStore<ClusterConnection> = RedisStore::new(connect().await, connect().await);
    store.check_schema().await.unwrap();

    let rooms: Vec<RoomId> = (0..12)
        .map(|i| RoomId::new(&format!("room-{i}")).unwrap())
        .collect();
    let mut holders = std::collections::HashSet::new();
    for room in &rooms {
        holders.insert(
            cluster
                .owner_of(&format!("narabu:v7:{{{room}}}:log"))
                .await
                .unwrap(),
        );
        let fence = store
            .acquire(room, "a", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        let p = store
            .append(room, &fence, fence.mark, room.as_str().as_bytes())
            .await
            .unwrap();
        store
            .put_image(
                room,
                &fence,
                &Image {
                    at: p,
                    bytes: b"image".to_vec(),
                },
            )
            .await
            .unwrap();
        let log = store
            .read(room, LogPos::START, 10, Duration::from_millis(100))
            .await
            .unwrap();
        // The lease's mark, then the batch.
        assert_eq!(log.len(), 2);
        assert!(log[0].batch.is_empty());
        assert_eq!(log[1].batch, room.as_str().as_bytes());
        assert_eq!(store.image(room).await.unwrap().unwrap().at, p);
        let stale = Fence {
            token: fence.token - 1,
            holder: "old".into(),
            mark: LogPos::START,
        };
        assert_eq!(
            store.append(room, &stale, stale.mark, b"late").await,
            Err(StoreError::Fenced)
        );
    }
    assert!(holders.len() > 1, "the rooms spread over the masters");

    let commands: Vec<Command> = ["b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, from)| Command {
            id: i as u128 + 1,
            from: (*from).into(),
            body: vec![i as u8],
        })
        .collect();
    store.send(&rooms[0], &commands).await.unwrap();
    let got = store
        .receive(&rooms[0], LogPos::START, 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(got.len(), 3);
    let replies: Vec<Reply> = commands
        .iter()
        .map(|c| Reply {
            to: c.from.clone(),
            id: c.id,
            body: c.body.clone(),
        })
        .collect();
    store.reply(&replies).await.unwrap();
    for reply in &replies {
        let heard = store
            .replies(&reply.to, LogPos::START, 10, Duration::from_millis(100))
            .await
            .unwrap();
        assert_eq!(
            heard.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
            std::slice::from_ref(reply)
        );
    }
}
