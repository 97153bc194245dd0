//! Autotune on Redis: of two instances sharing a room, only the room's
//! owner tunes it (its admin view has readings, the other's has none), its
//! change reaches both, and when the owner steps down the new owner takes
//! the tuning over.

use std::time::Duration;

use narabu::autotune::Autotune;
use narabu::engine::{RoomId, RoomSettings};
use serde_json::Value;

use narabu_testkit::app::TestApp;
use narabu_testkit::crowd::{Origin, SHAPE, room_body};
use narabu_testkit::redis_server::RedisServer;

use super::owners::instance_with;
use narabu_testkit::{eventually, room};

/// The room, admitting 5000 a minute, tuned between 30 and 600: the
/// owner's first judgement brings the rate into its bounds.
fn tuned(origin: &Origin) -> RoomSettings {
    let mut r = room("tuned", 100);
    let body = room_body(origin, 5000, 400, Some((30, 600)));
    let section: Autotune = serde_json::from_value(body["autotune"].clone()).unwrap();
    r.autotune = Some(Box::new(section));
    r.admit_per_minute = Some(5000);
    r
}

async fn reading(app: &TestApp) -> (u64, Value) {
    let room = app.admin_room("tuned").await;
    (
        room["settings"]["admit_per_minute"].as_u64().unwrap(),
        room["autotune"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_rooms_owner_tunes_it() {
    let redis = RedisServer::start().await;
    let origin = Origin::start(SHAPE).await;
    let room = tuned(&origin);
    let (a, a_backend) = instance_with(&redis, room.clone()).await;
    let (b, b_backend) = instance_with(&redis, room).await;
    let id = RoomId::new("tuned").unwrap();
    // The owner brings the rate into bounds; both instances see it.
    eventually(
        "both instances at the bound",
        Duration::from_secs(20),
        || async { reading(&a).await.0 == 600 && reading(&b).await.0 == 600 },
    )
    .await;
    // A few more seconds of judgements: still only the owner's.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (owner, other) = if a_backend.owns(&id) {
        assert!(!b_backend.owns(&id));
        (a, b)
    } else {
        assert!(b_backend.owns(&id));
        (b, a)
    };
    let (_, mine) = reading(&owner).await;
    let (_, theirs) = reading(&other).await;
    assert_eq!(mine["tuned_here"], true, "{mine}");
    assert_eq!(mine["changes"], 1, "{mine}");
    assert!(
        theirs.is_null(),
        "a second instance tunes the room: {theirs}"
    );
    // The owner steps down: the other takes the room and its tuning.
    owner.stop().await;
    eventually("the new owner tunes", Duration::from_secs(20), || async {
        reading(&other).await.1["tuned_here"] == true
    })
    .await;
    other.stop().await;
}
