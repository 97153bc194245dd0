//! Presence from held streams across a change of owner: the instance
//! holding a visitor's stream reported it once, to the old owner; the new
//! owner's engine starts without holds, so the instance must find out (its
//! next report is answered by another engine) and send its whole list, or
//! the visitor would be taken for gone one grace after the change. Real
//! time, a real Redis, the registry the HTTP layer runs.

use std::sync::Arc;
use std::time::Duration;

use narabu::backend::owned::OwnedBackend;
use narabu::backend::owner::OwnerOptions;
use narabu::backend::{Backend, JoinRequest, RoomPatch};
use narabu::config::RedisWait;
use narabu::engine::{Clock, RoomId, SystemClock, TicketState};
use narabu::http::presence::Presence;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use narabu_testkit::redis_server::{RedisServer, owners_on};
use narabu_testkit::room;

const GRACE: Duration = Duration::from_secs(1);

fn rid() -> RoomId {
    RoomId::new("r").unwrap()
}

async fn instance(redis: &RedisServer) -> Arc<OwnedBackend> {
    let mut settings = room("r", 0);
    settings.away_grace = GRACE;
    settings.queue_idle = Duration::from_secs(300);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let options = OwnerOptions {
        lease: Duration::from_millis(400),
        ticks: false,
        ..OwnerOptions::default()
    };
    owners_on(redis, vec![settings], clock, options, RedisWait::OFF).await
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_stream_keeps_its_visitor_present_through_an_owner_change() {
    let redis = RedisServer::start().await;
    let first = instance(&redis).await;
    until("the first instance owns the room", async || {
        first.owns(&rid())
    })
    .await;
    let streams = instance(&redis).await;
    let backend: Arc<dyn Backend> = streams.clone();
    let held = backend
        .join(&rid(), JoinRequest::anonymous())
        .await
        .unwrap()
        .ticket;
    let quiet = backend
        .join(&rid(), JoinRequest::anonymous())
        .await
        .unwrap()
        .ticket;
    // The second instance holds `held`'s stream and reports it to the
    // first, the room's owner.
    let presence = Presence::new(0);
    let stop = CancellationToken::new();
    tokio::spawn(presence.clone().run(backend.clone(), stop.clone()));
    let _stream = presence.hold(&rid(), held).unwrap();
    sleep(GRACE * 3 / 2).await;

    // The owner stops; a third instance joins; one of the two others takes
    // the room over, without the holds.
    first.shutdown().await;
    let third = instance(&redis).await;
    until("another instance owns the room", async || {
        streams.owns(&rid()) || third.owns(&rid())
    })
    .await;
    // Well past a grace after the change: only a reported stream keeps a
    // visitor present now.
    sleep(GRACE * 5 / 2).await;
    let open = RoomPatch {
        capacity: Some(2),
        ..RoomPatch::default()
    };
    backend.patch_room(&rid(), open).await.unwrap();
    let admitted = backend.tick(&rid()).await.unwrap().admitted;
    assert_eq!(
        admitted,
        [held.id as u32],
        "only the held ticket is admitted"
    );
    let quiet = backend.status(&rid(), quiet, false).await.unwrap();
    assert_eq!(quiet.state, TicketState::Away);
    stop.cancel();
    streams.shutdown().await;
    third.shutdown().await;
}
