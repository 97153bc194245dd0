//! Failover: Narabu instances on a primary and replica watched by three
//! sentinels, and on a Redis Cluster with a replica per master. The primary
//! (or a master) is killed with SIGKILL, as a crash would; the replica is
//! promoted and the instances follow it without a restart: joins, status,
//! hand-off and the push of an admission to a stream that was open before
//! the crash all work again, and every ticket acknowledged and replicated
//! before the crash is still there with its number and state.
//!
//! Replication is asynchronous, so the tests make sure the replica caught
//! up (`WAIT`) before the kill: what a failover can lose when it has not is
//! counted in the load test below, not asserted.
//!
//! Each test prints how long the failover took, from the kill to the first
//! join answered again (`cargo test --test redis failover -- --nocapture`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use narabu::backend::redis::RedisOptions;
use narabu::config::{OnBackendError, RedisTarget, SentinelTarget};
use narabu::engine::{RoomSettings, SystemClock};
use reqwest::StatusCode;
use serde_json::Value;

use narabu_testkit::app::{TestApp, Visitor, next_event, spawn_on_redis};
use narabu_testkit::redis_ha::{RedisCluster, SentinelSet, replicated};
use narabu_testkit::room;

const LEASE: Duration = Duration::from_secs(1);

fn sale(id: &str, capacity: u32) -> RoomSettings {
    let mut r = room(id, capacity);
    r.tick = Duration::from_millis(100);
    r.join_limit_per_minute = 0;
    r
}

/// A join's answer: the visitor, or the refusal's status and Retry-After.
async fn try_join(
    client: &reqwest::Client,
    base: &str,
    room: &str,
) -> Result<Visitor, (StatusCode, Option<String>)> {
    let r = client
        .post(format!("{base}/api/rooms/{room}/join"))
        .send()
        .await
        .map_err(|_| (StatusCode::BAD_GATEWAY, None))?;
    if r.status() != StatusCode::CREATED {
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        return Err((r.status(), retry));
    }
    let body: Value = r.json().await.unwrap();
    Ok(Visitor {
        token: body["ticket"].as_str().unwrap().to_owned(),
        number: body["number"].as_u64().unwrap(),
        body,
    })
}

/// Joins every 50 ms until one is answered 201: the visitor, and how many
/// were refused first (each with 503 and Retry-After, never anything else).
async fn join_when_back(app: &TestApp, room: &str, within: Duration) -> (Visitor, usize) {
    let deadline = Instant::now() + within;
    let mut refused = 0;
    loop {
        match try_join(&app.client, &app.base, room).await {
            Ok(v) => return (v, refused),
            Err((status, retry)) => {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
                assert!(retry.is_some(), "a 503 says when to retry");
                refused += 1;
            }
        }
        assert!(Instant::now() < deadline, "joins did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_admitted(app: &TestApp, room: &str, v: &Visitor) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.status(room, v).await["status"] != "admitted" {
        assert!(
            Instant::now() < deadline,
            "ticket {} not admitted",
            v.number
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads events until `admitted`, within a bound.
async fn until_admitted(stream: &mut narabu_testkit::app::EventStream, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = next_event(stream, left).await;
        if event.event == "admitted" {
            return;
        }
    }
}

/// Each ticket's number and status, as `(number, status)`.
async fn line(app: &TestApp, room: &str, tickets: &[Visitor]) -> Vec<(u64, String)> {
    let mut seen = Vec::new();
    for t in tickets {
        let s = app.status(room, t).await;
        seen.push((
            s["number"].as_u64().unwrap(),
            s["status"].as_str().unwrap().to_owned(),
        ));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_every_replicated_ticket_and_the_line_moving() {
    let mut ha = SentinelSet::start(1).await;
    let a = spawn_on_redis(
        ha.target(),
        vec![sale("sale", 2)],
        LEASE,
        OnBackendError::Closed,
    )
    .await;
    let b = spawn_on_redis(
        ha.target(),
        vec![sale("sale", 2)],
        LEASE,
        OnBackendError::Closed,
    )
    .await;
    let mut tickets = Vec::new();
    for i in 0..10 {
        let app = if i % 2 == 0 { &a } else { &b };
        tickets.push(app.join("sale").await);
    }
    wait_admitted(&a, "sale", &tickets[0]).await;
    wait_admitted(&b, "sale", &tickets[1]).await;
    // A visitor waiting on instance b, stream open through the crash.
    let mut stream = b.events("sale", &tickets[2]).await;
    let before = line(&a, "sale", &tickets).await;
    replicated(&ha.primary, "probe", 1).await;

    let old = ha.primary.port;
    let killed = Instant::now();
    ha.primary.kill();
    let (joined, refused) = join_when_back(&a, "sale", Duration::from_secs(30)).await;
    let took = killed.elapsed();
    let promoted = ha.wait_for_new_primary(old, Duration::from_secs(10)).await;
    assert_eq!(promoted, ha.replicas[0].port, "the replica was promoted");
    println!(
        "sentinel failover: first join answered {} ms after SIGKILL of the primary \
         ({refused} joins refused with 503 meanwhile; down-after 1000 ms)",
        took.as_millis()
    );
    assert_eq!(joined.number, 11, "numbering goes on where it was");

    // Every ticket is where it was, seen from both instances.
    assert_eq!(line(&a, "sale", &tickets).await, before);
    assert_eq!(line(&b, "sale", &tickets).await, before);

    // The line moves: a leave on instance a hands the permit to the next
    // visitor, whose stream on instance b hears it from b's copy of the
    // room, which follows the log on the new primary.
    let left = Instant::now();
    assert_eq!(a.leave("sale", &tickets[0]).await, StatusCode::NO_CONTENT);
    until_admitted(&mut stream, Duration::from_secs(10)).await;
    println!(
        "after the failover: leave on one instance to `admitted` on another's stream: {} ms",
        left.elapsed().as_millis()
    );
    let now = line(&b, "sale", &tickets).await;
    let admitted = now.iter().filter(|(_, s)| s == "admitted").count();
    assert_eq!(admitted, 2, "capacity held: {now:?}");
    assert_eq!(now[2].1, "admitted");
    assert!(now[3..].iter().all(|(_, s)| s == "waiting"), "{now:?}");
    // Instance b takes joins too (the store's scripts loaded again on the
    // new primary).
    assert_eq!(b.join("sale").await.number, 12);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_primary_requests_fail_fast_the_gate_follows_its_setting_and_all_recovers() {
    // No replica: nothing to promote, so there is no primary until the old
    // one comes back (with its append-only file).
    let mut ha = SentinelSet::start(0).await;
    let rooms = vec![sale("sale", 1)];
    // A wrong name, or addresses that are not sentinels, stop the start
    // with what is wrong.
    let RedisTarget::Sentinel(good) = ha.target() else {
        unreachable!()
    };
    let wrong_name = SentinelTarget {
        master_name: "nope".into(),
        ..good.clone()
    };
    let not_sentinels = SentinelTarget {
        sentinels: vec![("127.0.0.1".into(), ha.primary.port)],
        ..good
    };
    for (target, want) in [
        (wrong_name, "no sentinel knows a primary named \"nope\""),
        (not_sentinels, "no sentinel answered as a sentinel"),
    ] {
        let options = RedisOptions::new(RedisTarget::Sentinel(target));
        let e = narabu::backend::redis::connect(options, rooms.clone(), Arc::new(SystemClock))
            .await
            .expect_err("a start that cannot find the primary fails");
        assert!(e.to_string().contains(want), "{e}");
    }

    let closed = spawn_on_redis(ha.target(), rooms.clone(), LEASE, OnBackendError::Closed).await;
    let open = spawn_on_redis(ha.target(), rooms, LEASE, OnBackendError::Open).await;
    let pass = closed.join("sale").await;
    let waiting = closed.join("sale").await;
    wait_admitted(&closed, "sale", &pass).await;
    // While the backend answers, the open instance's gate hands out its
    // signed pass cookie.
    let r = open.gate("sale", Some(&pass.token)).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let pass_cookie = r.headers()["set-cookie"].to_str().unwrap();
    let pass_cookie = pass_cookie.split(';').next().unwrap().to_owned();

    ha.primary.kill();
    for _ in 0..3 {
        let asked = Instant::now();
        let refused = try_join(&closed.client, &closed.base, "sale").await;
        let (status, retry) = refused.expect_err("no primary, no ticket");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(retry.is_some());
        // Failing fast, not hanging on a dead primary: well under the
        // request timeouts a proxy would apply.
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(
            closed.gate("sale", Some(&pass.token)).await.status(),
            StatusCode::UNAUTHORIZED
        );
        let with_pass = open
            .client
            .get(open.url("/gate/sale"))
            .header(
                "cookie",
                format!("narabu_sale={}; {pass_cookie}", pass.token),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(with_pass.status(), StatusCode::NO_CONTENT);
        assert_eq!(
            open.gate("sale", Some(&waiting.token)).await.status(),
            StatusCode::UNAUTHORIZED
        );
        let ready = closed
            .client
            .get(closed.url("/readyz"))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Both instances find the primary again by themselves (a request that
    // meets an attempt begun while it was still down fails with it).
    ha.primary.launch(&[]).await;
    for app in [&closed, &open] {
        let (_, refused) = join_when_back(app, "sale", Duration::from_secs(30)).await;
        println!("primary back: joins answered again after {refused} refusals");
    }
    assert_eq!(closed.status("sale", &pass).await["status"], "admitted");
    assert_eq!(open.status("sale", &waiting).await["status"], "waiting");
    assert_eq!(
        closed.gate("sale", Some(&pass.token)).await.status(),
        StatusCode::NO_CONTENT
    );
    closed.stop().await;
    open.stop().await;
}

/// The ids of rooms whose keys live on master `node` of `cluster`, and of
/// one that does not.
async fn rooms_on(cluster: &RedisCluster, node: usize) -> (String, String) {
    let (mut on, mut off) = (None, None);
    for i in 0..64 {
        let id = format!("room-{i}");
        let owner = cluster.owner_of(&format!("narabu:{{{id}}}:room")).await;
        match owner {
            Some(n) if n == node => on = on.or(Some(id)),
            Some(_) => off = off.or(Some(id)),
            None => {}
        }
        if let (Some(on), Some(off)) = (&on, &off) {
            return (on.clone(), off.clone());
        }
    }
    panic!("64 rooms and none on node {node}, or all on it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_killed_under_load_fails_over_and_its_rooms_keep_their_line() {
    let mut cluster = RedisCluster::start(3, 1).await;
    // The victim's room lives on the first seed: its log, lease and
    // commands move to the promoted replica.
    let (victim, other) = rooms_on(&cluster, 0).await;
    let rooms = vec![sale(&victim, 1), sale(&other, 1)];
    let app = spawn_on_redis(cluster.target(), rooms, LEASE, OnBackendError::Closed).await;
    let mut tickets = Vec::new();
    for _ in 0..6 {
        tickets.push(app.join(&victim).await);
    }
    let elsewhere = app.join(&other).await;
    wait_admitted(&app, &victim, &tickets[0]).await;
    wait_admitted(&app, &other, &elsewhere).await;
    let mut stream = app.events(&victim, &tickets[1]).await;
    let before = line(&app, &victim, &tickets).await;
    replicated(&cluster.nodes[0], &format!("narabu:{{{victim}}}:probe"), 1).await;

    // Visitors keep joining the room while its master dies.
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicUsize::new(0));
    let load = {
        let (client, base, room) = (app.client.clone(), app.base.clone(), victim.clone());
        let (stop, refused) = (stop.clone(), refused.clone());
        tokio::spawn(async move {
            let (mut acknowledged, mut slowest) = (Vec::new(), Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                match try_join(&client, &base, &room).await {
                    Ok(v) => acknowledged.push(v),
                    Err((status, _)) => {
                        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
                        slowest = slowest.max(asked.elapsed());
                        refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (acknowledged, slowest)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    cluster.nodes[0].kill();
    while refused.load(Ordering::Relaxed) == 0 {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the kill went unnoticed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, _) = join_when_back(&app, &victim, Duration::from_secs(30)).await;
    let took = killed.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (acknowledged, slowest) = load.await.unwrap();
    println!(
        "cluster failover: joins on the dead master's room answered again {} ms after \
         SIGKILL ({} refused with 503 meanwhile, the slowest refusal in {} ms; \
         cluster-node-timeout 1000 ms)",
        took.as_millis(),
        refused.load(Ordering::Relaxed),
        slowest.as_millis()
    );
    // The node asked first may not have heard of the promotion yet (the
    // client found the new master on its own): ask until the views agree.
    let asked = Instant::now();
    let owner = loop {
        let owner = cluster.owner_of(&format!("narabu:{{{victim}}}:room")).await;
        if owner.is_some_and(|o| o >= cluster.masters) || asked.elapsed() > Duration::from_secs(20)
        {
            break owner;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        owner.is_some_and(|o| o >= cluster.masters),
        "a replica took over, not {owner:?}"
    );
    cluster.wait_ok(|i| i != 0, Duration::from_secs(20)).await;

    // The room kept its line: every ticket replicated before the kill.
    assert_eq!(line(&app, &victim, &tickets).await, before);
    // Tickets acknowledged under load, after the last WAIT: replication is
    // asynchronous, so some may be gone; counted, not asserted.
    let mut lost = 0;
    for v in &acknowledged {
        let r = app
            .client
            .get(app.url(&format!("/api/rooms/{victim}/status")))
            .bearer_auth(&v.token)
            .send()
            .await
            .unwrap();
        lost += usize::from(r.status() != StatusCode::OK);
    }
    println!(
        "cluster failover: {lost} of {} tickets acknowledged under load were lost",
        acknowledged.len()
    );
    // The line moves, and the admission reaches the stream through the
    // room's log on the promoted replica.
    assert_eq!(
        app.leave(&victim, &tickets[0]).await,
        StatusCode::NO_CONTENT
    );
    until_admitted(&mut stream, Duration::from_secs(10)).await;
    assert_eq!(app.status(&victim, &tickets[1]).await["status"], "admitted");
    // The room on the other master never noticed.
    assert_eq!(app.status(&other, &elsewhere).await["status"], "admitted");
    app.stop().await;
}
