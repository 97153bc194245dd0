//! Three instances on one Redis, their rooms run by their owners, over HTTP:
//! one instance owns the room and runs its engine, the others send it
//! their visitors' changes and read their own replicas. Visitors spread
//! over the instances are admitted in ticket order, never more than
//! capacity at once; when the owner shuts down it hands the room over and
//! the line goes on from where it was on another instance, with every
//! acknowledged ticket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narabu::backend::owned::OwnedBackend;
use narabu::backend::owner::OwnerOptions;
use narabu::config::{Backend as BackendConfig, RedisWait};
use narabu::engine::{RoomId, RoomSettings, SystemClock};
use reqwest::StatusCode;
use serde_json::Value;

use narabu_testkit::app::{TestApp, Visitor, config, spawn_with};
use narabu_testkit::process::NarabuProcess;
use narabu_testkit::redis_server::{RedisServer, owners_on};
use narabu_testkit::room;

const LEASE: Duration = Duration::from_secs(1);

fn sale() -> RoomSettings {
    let mut r = room("sale", 3);
    r.tick = Duration::from_millis(50);
    r.join_limit_per_minute = 0;
    r
}

async fn instance(redis: &RedisServer) -> (TestApp, Arc<OwnedBackend>) {
    instance_with(redis, sale()).await
}

/// An instance on `redis` with the one room `r`, owners on a short lease.
pub(crate) async fn instance_with(
    redis: &RedisServer,
    r: RoomSettings,
) -> (TestApp, Arc<OwnedBackend>) {
    let owner = OwnerOptions {
        lease: LEASE,
        ..OwnerOptions::default()
    };
    let backend = owners_on(
        redis,
        vec![r.clone()],
        Arc::new(SystemClock),
        owner,
        RedisWait::OFF,
    )
    .await;
    let mut c = config();
    c.backend = BackendConfig::Redis(redis.url().into());
    c.rooms = vec![r];
    (spawn_with(c, backend.clone()).await, backend)
}

async fn state(app: &TestApp, v: &Visitor) -> String {
    let s: Value = app.status("sale", v).await;
    s["status"].as_str().unwrap().to_owned()
}

/// Release every admitted visitor (through `release_on`), until all are
/// through, checking capacity on every instance's admin view as it goes;
/// the numbers in the order they were seen admitted.
async fn admit_all(apps: &[&TestApp], visitors: &[Visitor], within: Duration) -> Vec<u64> {
    let deadline = Instant::now() + within;
    let mut order = Vec::new();
    while order.len() < visitors.len() {
        assert!(
            Instant::now() < deadline,
            "only {} of {} admitted: {order:?}",
            order.len(),
            visitors.len()
        );
        for app in apps {
            let room = app.admin_room("sale").await;
            let admitted = room["admitted"].as_u64().unwrap();
            assert!(admitted <= 3, "over capacity on {}: {room}", app.base);
        }
        for (i, v) in visitors.iter().enumerate() {
            if order.contains(&v.number) {
                continue;
            }
            let app = apps[i % apps.len()];
            if state(app, v).await == "admitted" {
                order.push(v.number);
                let r = apps[(i + 1) % apps.len()]
                    .client
                    .post(apps[(i + 1) % apps.len()].url("/api/rooms/sale/leave"))
                    .bearer_auth(&v.token)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::NO_CONTENT, "leave of {}", v.number);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    order
}

/// Numbers seen admitted are in ticket order, give or take the capacity
/// (three admitted together are seen in whatever order the polls came).
fn in_order(order: &[u64]) {
    for (i, n) in order.iter().enumerate() {
        let seen_before = order[..i].iter().filter(|&&m| m > *n).count();
        assert!(
            seen_before < 3,
            "{n} was admitted after {seen_before} later tickets: {order:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_one_line_and_an_owner_hands_it_over() {
    let redis = RedisServer::start().await;
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(instance(&redis).await);
    }
    let sale_id = RoomId::new("sale").unwrap();
    // One of them owns the room.
    let deadline = Instant::now() + Duration::from_secs(5);
    let owner = loop {
        if let Some(i) = instances.iter().position(|(_, b)| b.owns(&sale_id)) {
            break i;
        }
        assert!(Instant::now() < deadline, "nobody owns the room");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        instances.iter().filter(|(_, b)| b.owns(&sale_id)).count(),
        1,
        "one owner"
    );
    // Visitors join on every instance in turn: one line, numbered in the
    // order their joins were acknowledged.
    let mut visitors = Vec::new();
    for i in 0..12 {
        visitors.push(instances[i % 3].0.join("sale").await);
    }
    let mut numbers: Vec<u64> = visitors.iter().map(|v| v.number).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (1..=12).collect::<Vec<_>>());
    // Eight of those joins were sent to the owner by another instance, and
    // each was answered from the room's log as that instance's copy read
    // it: no reply travelled back on the bus.
    let replies: Vec<String> = redis::cmd("KEYS")
        .arg("narabu:*reply-*")
        .query_async(&mut redis.client().await)
        .await
        .unwrap();
    assert_eq!(replies, Vec::<String>::new(), "replies were sent");
    // Each instance answers a ticket joined on another at once.
    for (i, v) in visitors.iter().enumerate() {
        let s = instances[(i + 2) % 3].0.status("sale", v).await;
        assert_eq!(s["number"].as_u64(), Some(v.number), "{s}");
    }
    let apps: Vec<&TestApp> = instances.iter().map(|(a, _)| a).collect();
    let first = admit_all(&apps, &visitors[..6], Duration::from_secs(20)).await;
    in_order(&first);

    // The owner shuts down: it hands the lease over, another instance
    // takes the room from the log and the line goes on.
    let (stopped, _) = instances.remove(owner);
    let handed = Instant::now();
    stopped.stop().await;
    let deadline = Instant::now() + LEASE * 5;
    while !instances.iter().any(|(_, b)| b.owns(&sale_id)) {
        assert!(Instant::now() < deadline, "nobody took the room over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "room taken over {:?} after the owner stopped",
        handed.elapsed()
    );
    let apps: Vec<&TestApp> = instances.iter().map(|(a, _)| a).collect();
    // Every acknowledged ticket is still there, with its number.
    for v in &visitors[6..] {
        let s = apps[0].status("sale", v).await;
        assert_eq!(s["number"].as_u64(), Some(v.number), "{s}");
    }
    let late = apps[1].join("sale").await;
    assert_eq!(late.number, 13, "numbering goes on after the hand-over");
    let mut rest = visitors[6..].to_vec();
    rest.push(late);
    let second = admit_all(&apps, &rest, Duration::from_secs(20)).await;
    in_order(&second);
    for (app, _) in instances {
        app.stop().await;
    }
}

const SECRET: &str = "test-secret-test-secret-test-secret-0123";
const ADMIN: &str = "admin-token-admin-token-admin-token-0123";

/// A narabu process on Redis.
fn process(redis: &RedisServer, capacity: u32) -> NarabuProcess {
    NarabuProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_narabu")),
        &format!(
            r#"backend = "redis"
redis_url = "{url}"
secret = "{SECRET}"
admin_token = "{ADMIN}"

[[rooms]]
id = "sale"
capacity = {capacity}
tick = "50ms"
join_limit_per_minute = 0
"#,
            url = redis.url()
        ),
    )
}

/// Whether a process's log says it owns the room now.
fn owns(p: &NarabuProcess) -> bool {
    let log = p.log();
    log.matches("owns the room now").count() > log.matches("no longer owns the room").count()
}

/// What the load saw: every acknowledged join, the first time each number
/// was seen admitted, and the most admitted any instance showed at once.
#[derive(Default)]
struct Seen {
    joined: Vec<(String, u64)>,
    admitted: Vec<u64>,
    most_admitted: u64,
    /// When the owner was killed, and the highest number admitted by then.
    killed_at: Option<(Instant, u64)>,
    /// From the kill until a join sent after it was answered, and until a
    /// ticket numbered past all admitted before it was admitted.
    join_back: Option<Duration>,
    admission_back: Option<Duration>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_owner_loses_no_acknowledged_ticket_and_the_line_resumes() {
    let redis = RedisServer::start().await;
    let capacity = 3;
    let mut processes: Vec<NarabuProcess> = (0..3).map(|_| process(&redis, capacity)).collect();
    let client = reqwest::Client::new();
    for p in &processes {
        let up = async {
            loop {
                if client
                    .get(format!("{}/healthz", p.base))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), up)
            .await
            .expect("the instance starts");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let owner = loop {
        if let Some(i) = processes.iter().position(owns) {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "no instance owns the room: {:?}",
            processes.iter().map(NarabuProcess::log).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let bases: Vec<String> = processes.iter().map(|p| p.base.clone()).collect();
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Visitors join on every instance in turn, and each admitted one
    // leaves through another instance after a moment.
    let load = {
        let (seen, killed, stop, client) =
            (seen.clone(), killed.clone(), stop.clone(), client.clone());
        let (bases, owner) = (bases.clone(), owner);
        tokio::spawn(async move {
            let mut i = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                i += 1;
                let live: Vec<&String> = bases
                    .iter()
                    .enumerate()
                    .filter(|&(k, _)| {
                        !(killed.load(std::sync::atomic::Ordering::Acquire) && k == owner)
                    })
                    .map(|(_, b)| b)
                    .collect();
                let base = live[i % live.len()];
                let sent = Instant::now();
                if let Ok(r) = client
                    .post(format!("{base}/api/rooms/sale/join"))
                    .send()
                    .await
                    && r.status() == StatusCode::CREATED
                {
                    let body: Value = r.json().await.unwrap();
                    let mut s = seen.lock().unwrap();
                    s.joined.push((
                        body["ticket"].as_str().unwrap().to_owned(),
                        body["number"].as_u64().unwrap(),
                    ));
                    if let Some((at, _)) = s.killed_at
                        && sent > at
                        && s.join_back.is_none()
                    {
                        s.join_back = Some(at.elapsed());
                    }
                }
                let tickets: Vec<(String, u64)> = {
                    let s = seen.lock().unwrap();
                    s.joined
                        .iter()
                        .filter(|(_, n)| !s.admitted.contains(n))
                        .take(capacity as usize + 2)
                        .cloned()
                        .collect()
                };
                for (k, (token, number)) in tickets.into_iter().enumerate() {
                    let base = live[(i + k) % live.len()];
                    let Ok(r) = client
                        .get(format!("{base}/api/rooms/sale/status"))
                        .bearer_auth(&token)
                        .send()
                        .await
                    else {
                        continue;
                    };
                    if r.status() != StatusCode::OK {
                        continue;
                    }
                    let body: Value = r.json().await.unwrap();
                    if body["status"] == "admitted" {
                        {
                            let mut s = seen.lock().unwrap();
                            s.admitted.push(number);
                            if let Some((at, highest)) = s.killed_at
                                && number > highest
                                && s.admission_back.is_none()
                            {
                                s.admission_back = Some(at.elapsed());
                            }
                        }
                        let other = live[(i + k + 1) % live.len()];
                        let _ = client
                            .post(format!("{other}/api/rooms/sale/leave"))
                            .bearer_auth(&token)
                            .send()
                            .await;
                    }
                }
                for base in &live {
                    if let Ok(r) = client
                        .get(format!("{base}/admin/rooms/sale"))
                        .bearer_auth(ADMIN)
                        .send()
                        .await
                        && r.status() == StatusCode::OK
                    {
                        let room: Value = r.json().await.unwrap();
                        let admitted = room["admitted"].as_u64().unwrap_or(0);
                        let mut s = seen.lock().unwrap();
                        s.most_admitted = s.most_admitted.max(admitted);
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = seen.lock().unwrap().joined.len();
    assert!(before > 10, "the load runs before the kill: {before} joins");
    killed.store(true, std::sync::atomic::Ordering::Release);
    {
        let mut s = seen.lock().unwrap();
        let highest = s.admitted.iter().copied().max().unwrap_or(0);
        s.killed_at = Some((Instant::now(), highest));
    }
    processes[owner].kill();
    // Joins and admissions resume on the others.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (join_back, admission_back) = loop {
        let back = {
            let s = seen.lock().unwrap();
            (s.join_back, s.admission_back)
        };
        if let (Some(j), Some(a)) = back {
            break (j, a);
        }
        assert!(
            Instant::now() < deadline,
            "the line did not resume after the owner was killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "owner killed: joins answered again after {join_back:?}, the first admission after {admission_back:?} (lease 3 s)"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    load.await.unwrap();
    let survivors: Vec<&String> = bases
        .iter()
        .enumerate()
        .filter(|&(k, _)| k != owner)
        .map(|(_, b)| b)
        .collect();
    let s = std::mem::take(&mut *seen.lock().unwrap());
    // No moment over capacity on any instance's copy.
    assert!(
        s.most_admitted <= u64::from(capacity),
        "{} admitted at once",
        s.most_admitted
    );
    // Every acknowledged ticket is still there, with its number.
    let (mut first_waiting, mut last_served) = (u64::MAX, 0);
    for (k, (token, number)) in s.joined.iter().enumerate() {
        let base = survivors[k % survivors.len()];
        let r = client
            .get(format!("{base}/api/rooms/sale/status"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "ticket {number} lost");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["number"].as_u64(), Some(*number), "{body}");
        if body["status"] == "waiting" {
            first_waiting = first_waiting.min(*number);
        } else {
            last_served = last_served.max(*number);
        }
    }
    // Admitted in ticket order: at rest nobody still waits behind a ticket
    // that was admitted or has gone; and in the order the load first saw
    // each admission, give or take the tickets admitted together and as
    // many again: it polls through every instance, and a copy a few
    // milliseconds behind shows an admission a poll later, while those
    // after it are seen (and leave, admitting more) through the others.
    assert!(
        first_waiting > last_served,
        "ticket {first_waiting} still waits behind {last_served}: seen admitted in the order {:?}",
        s.admitted
    );
    for (i, n) in s.admitted.iter().enumerate() {
        let later_first = s.admitted[..i].iter().filter(|&&m| m > *n).count();
        assert!(
            later_first <= 2 * capacity as usize,
            "{n} admitted after {later_first} later tickets: {:?}",
            s.admitted
        );
    }
    println!(
        "{} tickets acknowledged ({before} before the kill), {} admitted, none lost",
        s.joined.len(),
        s.admitted.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_an_operator_makes_on_one_instance_is_served_by_every_instance() {
    use narabu::backend::{Backend, JoinRequest};
    let redis = RedisServer::start().await;
    let (a, a_backend) = instance(&redis).await;
    let (b, b_backend) = instance(&redis).await;
    let mut extra = room("extra", 2);
    extra.join_limit_per_minute = 0;
    let made = a_backend.put_room(extra.clone()).await.unwrap();
    let id = RoomId::new("extra").unwrap();
    // The other instance serves it within a few of its looks at the list.
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        if let Ok(snapshot) = b_backend.room(&id).await {
            break snapshot;
        }
        assert!(
            Instant::now() < deadline,
            "the other instance never served the room"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(seen.epoch, made.epoch, "the same incarnation");
    assert_eq!(seen.settings.capacity, 2);
    // A join there is answered by the room's one owner and shown on both.
    let joined = b_backend.join(&id, JoinRequest::anonymous()).await.unwrap();
    assert_eq!(joined.status.number, Some(1));
    let on_a = a_backend.status(&id, joined.ticket, false).await.unwrap();
    assert_eq!(on_a.number, Some(1));
    assert_eq!(
        [&a_backend, &b_backend]
            .iter()
            .filter(|backend| backend.owns(&id))
            .count(),
        1,
        "one owner"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_lost_its_data_gets_a_new_line_on_every_instance() {
    use narabu::backend::{Backend, BackendError, JoinRequest};
    let redis = RedisServer::start().await;
    let (a, a_backend) = instance(&redis).await;
    let (b, b_backend) = instance(&redis).await;
    let id = RoomId::new("sale").unwrap();
    let old = a_backend
        .join(&id, JoinRequest::anonymous())
        .await
        .unwrap()
        .ticket;
    // Both copies know the ticket.
    b_backend.status(&id, old, false).await.unwrap();
    let mut resets = [
        a_backend.line_resets().unwrap(),
        b_backend.line_resets().unwrap(),
    ];
    // Redis loses everything (a restart without persistence).
    let mut con = redis.client().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.unwrap();
    // The room's owner finds its fence gone and steps down; an instance
    // takes the room again and makes a new line, which both serve.
    let deadline = Instant::now() + Duration::from_secs(20);
    let fresh = loop {
        match b_backend.join(&id, JoinRequest::anonymous()).await {
            Ok(j) if j.ticket.epoch != old.epoch => break j,
            _ => {}
        }
        assert!(Instant::now() < deadline, "no new line after the data loss");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The joins the old owner took after the loss (it kept going until its
    // lease renewal failed) were answered in the old line: the new one
    // does not take them again as tickets nobody holds.
    assert_eq!(fresh.status.number, Some(1), "the new line numbers from 1");
    // The instance that made the new line tells the operators, once.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let told: Vec<_> = resets
        .iter_mut()
        .flat_map(|r| std::iter::from_fn(|| r.try_recv().ok()))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        (told[0].room.clone(), told[0].epoch),
        (id.clone(), fresh.ticket.epoch)
    );
    for backend in [&a_backend, &b_backend] {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let known = backend.status(&id, fresh.ticket, false).await;
            let lost = backend.status(&id, old, false).await;
            if known.as_ref().is_ok_and(|s| s.number == Some(1))
                && lost == Err(BackendError::LineReset)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a copy did not follow the new line: {known:?}, the old ticket {lost:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    a.stop().await;
    b.stop().await;
}

/// How many times Redis ran `command` since its statistics were reset.
async fn calls(redis: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut redis.client().await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_takes_its_own_appends_into_its_copy_without_reading_them_back() {
    let redis = RedisServer::start().await;
    let (app, backend) = instance(&redis).await;
    let sale_id = RoomId::new("sale").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !backend.owns(&sale_id) {
        assert!(Instant::now() < deadline, "nobody owns the room");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis.client().await)
        .await
        .unwrap();
    // One join at a time: each is a batch of its own, appended and then
    // shown by this instance's copy before it is answered.
    let mut visitors = Vec::new();
    for _ in 0..100 {
        visitors.push(app.join("sale").await);
    }
    for (v, n) in visitors.iter().zip(1..) {
        assert_eq!(v.number, n);
        let s = app.status("sale", v).await;
        assert_eq!(s["number"].as_u64(), Some(n), "{s}");
    }
    let (appends, reads) = (calls(&redis, "xadd").await, calls(&redis, "xread").await);
    println!("{appends} appends, {reads} reads");
    assert!(appends >= 100, "{appends} appends");
    // Reading each batch back would take a read per append; what is left
    // is the owner's wait on its command stream and its copy's wait after
    // the log's end (which shows a lost Redis at once).
    assert!(reads * 4 < appends, "{reads} reads for {appends} appends");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_read_a_batch_the_store_then_lost_still_sees_the_owners_next_ones() {
    let redis = RedisServer::start().await;
    let (a, a_backend) = instance(&redis).await;
    let (b, _) = instance(&redis).await;
    let sale_id = RoomId::new("sale").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !a_backend.owns(&sale_id) {
        // Only the first instance can have taken the room: it started first.
        assert!(
            Instant::now() < deadline,
            "the first instance does not own the room"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first: Vec<Visitor> = [a.join("sale").await, a.join("sale").await].into();
    let shown = |app: &TestApp, v: &Visitor| {
        let request = app
            .client
            .get(app.url("/api/rooms/sale/status"))
            .bearer_auth(&v.token);
        let number = v.number;
        async move {
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(r) = request.try_clone().unwrap().send().await
                    && r.status() == StatusCode::OK
                    && r.json::<Value>().await.unwrap()["number"].as_u64() == Some(number)
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        }
    };
    for v in &first {
        assert!(shown(&b, v).await, "the copy follows the log");
    }
    // A primary that took over from one that failed may lack the log's
    // last entries, which the other instance's copy already read: here the
    // last two are taken out and the stream's last id set back to match.
    let mut con = redis.client().await;
    let log = "narabu:v7:{sale}:log";
    let tail: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(log)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(3)
        .query_async(&mut con)
        .await
        .unwrap();
    let tail: Vec<String> = tail.ids.into_iter().map(|e| e.id).collect();
    assert_eq!(tail.len(), 3, "the log holds the joins");
    let _: () = redis::cmd("XDEL")
        .arg(log)
        .arg(&tail[0])
        .arg(&tail[1])
        .query_async(&mut con)
        .await
        .unwrap();
    let _: () = redis::cmd("XSETID")
        .arg(log)
        .arg(&tail[2])
        .query_async(&mut con)
        .await
        .unwrap();
    // The owner's next batches land above everything the copy read, so
    // the copy shows them (numbered after the lost ones, which the owner
    // still holds and the copy already has).
    for _ in 0..2 {
        let v = a.join("sale").await;
        assert!(
            shown(&b, &v).await,
            "the other instance's copy passed over ticket {} (its batch landed below where it had read)",
            v.number
        );
    }
    b.stop().await;
    a.stop().await;
}
