//! Every scenario end to end, small and bounded, against the real Narabu
//! server started in this process on 127.0.0.1:0 (and, for the worker
//! processes and the loopback guard, the real `loadtest` binary).

use std::sync::Arc;
use std::time::Duration;

use loadtest::cli::{CadenceArgs, Common, HammerArgs, StreamsArgs, Target, parse_target};
use loadtest::scenario::hammered::{self, Kind};
use loadtest::scenario::{cadence, streams, surge};
use narabu::backend::Backend;
use narabu::backend::embedded::EmbeddedBackend;
use narabu::config::{Config, PushConfig, Secret};
use narabu::engine::{RoomId, RoomSettings, SystemClock};
use serde_json::Value;

const SECRET: &str = "loadtest-secret-loadtest-secret-0123456789";
const ADMIN_TOKEN: &str = "loadtest-admin-token-loadtest-admin-0123";

struct Server {
    target: Target,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("graceful shutdown")
            .unwrap()
            .unwrap();
    }
}

fn room(id: &str, capacity: u32) -> RoomSettings {
    let mut s = RoomSettings::new(RoomId::new(id).unwrap());
    s.capacity = capacity;
    s.tick = Duration::from_millis(100);
    s.join_limit_per_minute = 0;
    s
}

async fn serve(rooms: Vec<RoomSettings>) -> Server {
    let backend: Arc<dyn Backend> = EmbeddedBackend::new(rooms.clone(), Arc::new(SystemClock));
    serve_on(rooms, backend).await
}

/// A server over a given backend: two of them over one backend stand in
/// for two instances sharing a Redis.
async fn serve_on(rooms: Vec<RoomSettings>, backend: Arc<dyn Backend>) -> Server {
    serve_config(rooms, backend, PushConfig::default()).await
}

async fn serve_config(
    rooms: Vec<RoomSettings>,
    backend: Arc<dyn Backend>,
    push: PushConfig,
) -> Server {
    let config = Config {
        secret: Some(Secret::new(SECRET)),
        admin_token: Some(Secret::new(ADMIN_TOKEN)),
        max_streams_per_address: 0,
        rooms,
        push,
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = parse_target(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(narabu::server::serve(listener, config, backend, async {
        let _ = stopped.await;
    }));
    Server {
        target,
        stop: Some(stop),
        task,
    }
}

fn common(target: Target, room: &str) -> Common {
    Common {
        targets: vec![target],
        room: room.to_owned(),
        max_seconds: 60.0,
        json: None,
        admin_token: Some(ADMIN_TOKEN.to_owned()),
        sources: 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surge_of_200_through_5_permits_keeps_order_and_capacity() {
    let server = serve(vec![room("sale", 5)]).await;
    let mut plan = surge::Plan::surge(200, 0.3, (20, 60), &mut rand::rng());
    plan.gate_every = Duration::from_millis(20);
    plan.capacity = Some(5);
    let report = surge::run("surge", &common(server.target, "sale"), plan)
        .await
        .unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert_eq!(f["joined"], 200, "{}", report.table());
    assert_eq!(f["admitted"], 200, "{}", report.table());
    assert_eq!(f["left"], 200);
    assert_eq!(f["order_violations"], 0);
    assert_eq!(f["stayed"], 200);
    let most = f["most_admitted_own"].as_u64().unwrap();
    assert!((1..=5).contains(&most), "{}", report.table());
    // The server's own count, polled over the admin API while it ran.
    let most_admin = f["most_admitted_admin"].as_u64();
    assert!(
        most_admin.is_some_and(|m| (1..=5).contains(&m)),
        "{}",
        report.table()
    );
    assert_eq!(f["errors"], serde_json::json!({}));
    assert_eq!(f["gate_refused"], 0);
    // Permits came back by hand-off while the line was long.
    assert!(
        f["handoff"]["count"].as_u64().unwrap() > 100,
        "{}",
        report.table()
    );
    assert!(!report.series.is_empty());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn article_admits_all_twenty_two_at_a_time() {
    let server = serve(vec![room("article", 2)]).await;
    let plan = surge::Plan::article(&mut rand::rng());
    assert_eq!(plan.arrivals_s.len(), 20);
    let report = surge::run("article", &common(server.target, "article"), plan)
        .await
        .unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert_eq!(f["admitted"], 20, "{}", report.table());
    assert!(f["most_admitted_own"].as_u64().unwrap() <= 2);
    assert_eq!(f["capacity"], 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_called_back_come_back_first_and_every_push_is_real() {
    // A page closed for a second is away; a place is kept half a minute.
    let settings = RoomSettings {
        away_grace: Duration::from_secs(1),
        queue_idle: Duration::from_secs(30),
        ..room("sale", 2)
    };
    let backend: Arc<dyn Backend> =
        EmbeddedBackend::new(vec![settings.clone()], Arc::new(SystemClock));
    let push = PushConfig {
        enabled: true,
        vapid_key_file: None,
        contact: "mailto:loadtest@example.com".into(),
        // The tool plays the push service on 127.0.0.1.
        allow_insecure_endpoints: true,
    };
    let server = serve_config(vec![settings], backend, push).await;
    // Permits held long enough that the line still moves for a while
    // after the first subscribers are back.
    let mut plan = surge::Plan::surge(30, 0.3, (100, 200), &mut rand::rng());
    plan.gate_every = Duration::from_millis(20);
    plan.capacity = Some(2);
    plan.decrypt_every = 1;
    // Held while they arrive and until those who closed their page are
    // away, as `--away-wait-ms` does.
    plan.pause_for_s = Some(0.3 + 1.8);
    let report = surge::run_twice(
        &common(server.target, "sale"),
        plan,
        surge::Absence::Subscribe(0.3),
        &[std::process::id()],
    )
    .await
    .unwrap();
    let f = &report.figures;
    let table = report.table();
    assert!(report.invariants_held, "{table}");
    assert_eq!(f["subscribed"], 9, "{table}");
    assert_eq!(f["called"], 9, "{table}");
    assert_eq!(f["came_back"], 9, "{table}");
    assert_eq!(f["came_back_admitted"], 9, "{table}");
    assert_eq!(f["came_back_order_violations"], 0, "{table}");
    assert_eq!(f["admitted"], 30, "{table}");
    assert_eq!(f["errors"], serde_json::json!({}), "{table}");
    // Every push decrypted with its subscriber's key, its VAPID signature
    // verified, and the text naming that subscriber's ticket: one turn
    // message each, besides the "ahead" ones.
    let pushes = &f["pushes"];
    assert_eq!(pushes["turns"], 9, "{table}");
    assert_eq!(pushes["repeated_turns"], 0, "{table}");
    assert_eq!(pushes["bad"], serde_json::json!({}), "{table}");
    let received = pushes["received"].as_u64().unwrap();
    assert_eq!(pushes["decrypted"], received, "{table}");
    assert_eq!(pushes["vapid_verified"], received, "{table}");
    assert!(f["pushes_per_second"].as_f64().unwrap() > 0.0, "{table}");
    assert!(
        f["ratio_to_everyone_present"].as_f64().unwrap() > 0.0,
        "{table}"
    );
    // Read from /proc, this process being the server.
    assert!(
        f["server_cpu_ms_per_push_all"].as_f64().unwrap() > 0.0,
        "{table}"
    );
    assert!(f["server_cpu_ms_per_push_marginal"].is_number(), "{table}");
    server.stop().await;
}

fn hammer_args(target: Target, room: &str) -> HammerArgs {
    HammerArgs {
        common: common(target, room),
        connections: 4,
        seconds: 0.5,
        requests: 0,
        no_baseline: false,
        baseline_in_process: true,
        server_pids: Vec::new(),
        redis: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_and_joins_are_measured_against_the_baseline() {
    let server = serve(vec![room("gate", 8), room("joins", 8)]).await;
    let report = hammered::run(&hammer_args(server.target, "gate"), Kind::Gate)
        .await
        .unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert!(f["gate"]["ok"].as_u64().unwrap() > 0);
    assert_eq!(
        f["gate"]["errors"],
        serde_json::json!({}),
        "{}",
        report.table()
    );
    assert!(f["baseline"]["ok"].as_u64().unwrap() > 0);
    assert!(f["ratio_to_baseline"].as_f64().unwrap() > 0.0);

    let mut args = hammer_args(server.target, "joins");
    args.requests = 300;
    // the count ends this run; the time bound is only a backstop, generous
    // because a busy machine may take seconds to answer 300 joins
    args.seconds = 60.0;
    let report = hammered::run(&args, Kind::Joins).await.unwrap();
    let f = &report.figures;
    assert_eq!(f["joins"]["ok"], 300, "{}", report.table());
    assert_eq!(f["joins"]["errors"], serde_json::json!({}));
    server.stop().await;
}

/// On Redis, joins are also measured on Redis's side: its time and the
/// commands it ran per join, and the server's CPU per join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_on_redis_report_redis_cost_per_join() {
    let redis = narabu_testkit::redis_server::RedisServer::start().await;
    let rooms = vec![room("joins", 8)];
    let backend: Arc<dyn Backend> = narabu::backend::redis::connect(
        narabu::backend::redis::RedisOptions::new(redis.url()),
        rooms.clone(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let server = serve_on(rooms, backend).await;
    let mut args = hammer_args(server.target, "joins");
    // Enough work that the server's CPU shows even in `stat`'s 10 ms
    // ticks, which is what counts when threads end during the run.
    args.requests = 1_000;
    // the count ends this run; the time bound is only a backstop
    args.seconds = 60.0;
    args.redis = Some(redis.url());
    args.server_pids = vec![std::process::id()];
    let report = hammered::run(&args, Kind::Joins).await.unwrap();
    let f = &report.figures;
    assert_eq!(f["joins"]["ok"], 1_000, "{}", report.table());
    let per = &f["redis_per_request"];
    // The room's owner appends joins to the room's log in batches, each
    // one `XADD` (fenced by its id, no script): at most about one per join
    // (a few more for the ticks), and the appends are among the commands
    // counted.
    let appends = per["xadd"].as_f64().unwrap();
    assert!(appends > 0.0 && appends < 1.5, "{per}");
    assert!(per["calls"].as_f64().unwrap() >= appends, "{per}");
    assert!(per["time_us"].as_f64().unwrap() > 0.0, "{per}");
    assert!(f["server_cpu_us_per_request"].as_f64().unwrap() > 0.0);
    assert!(report.table().contains("Redis per request"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_in_process_time_fan_out_and_hand_offs() {
    let server = serve(vec![room("streams", 1)]).await;
    let args = StreamsArgs {
        common: common(server.target, "streams"),
        streams: 60,
        workers: Some(0),
        server_pids: vec![std::process::id()],
        capacity: 1,
        prefill: 100,
        handoffs: 10,
        handoff_gap_ms: 5,
        quiet_max_seconds: 2.0,
        redis: None,
    };
    let report = streams::run(&args).await.unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert_eq!(f["streams_open"], 60, "{}", report.table());
    // The wave is a pause (the tests have the admin token): every page
    // shows it, so every stream is sent it.
    assert_eq!(f["fanout_delivered"], 60, "{}", report.table());
    assert_eq!(f["handoff"]["count"], 10, "{}", report.table());
    assert_eq!(f["handoff_timeouts"], 0);
    assert!(f["memory_per_stream_kib"].is_number());
    // The wave cost this process some CPU, measured per stream it updated.
    assert!(
        f["cpu_us_per_update"].as_f64().unwrap() > 0.0,
        "{}",
        report.table()
    );
    server.stop().await;
}

/// On Redis, the wave is also measured on Redis's side: its CPU and the
/// commands run, among them the owner's append to the room's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_on_redis_report_redis_cost_per_change() {
    let redis = narabu_testkit::redis_server::RedisServer::start().await;
    let rooms = vec![room("streams", 1)];
    let backend: Arc<dyn Backend> = narabu::backend::redis::connect(
        narabu::backend::redis::RedisOptions::new(redis.url()),
        rooms.clone(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let server = serve_on(rooms, backend).await;
    let args = StreamsArgs {
        common: common(server.target, "streams"),
        streams: 30,
        workers: Some(0),
        server_pids: vec![std::process::id()],
        capacity: 1,
        prefill: 10,
        handoffs: 3,
        handoff_gap_ms: 5,
        quiet_max_seconds: 2.0,
        redis: Some(redis.url()),
    };
    let report = streams::run(&args).await.unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert_eq!(f["fanout_delivered"], 30, "{}", report.table());
    let wave = &f["redis_wave"];
    // The owner appends the pause to the room's log; its own copy takes
    // it from the writer, so no read of the log need follow.
    assert!(
        wave["xadd"].as_u64().unwrap() >= 1,
        "the pause's append: {wave}"
    );
    assert!(wave["cpu_ms"].as_f64().unwrap() >= 0.0, "{wave}");
    assert!(wave["time_us"].as_u64().unwrap() > 0, "{wave}");
    assert!(f["redis_idle_seconds"].as_f64().unwrap() > 0.0);
    // One change's share net of the background: the leave's script at least.
    let per = &f["redis_per_change"];
    assert!(per["time_us"].as_f64().unwrap() >= 0.0, "{per}");
    assert!(report.table().contains("Redis during the wave"));
    assert!(report.table().contains("Redis per view change (net)"));
    // Over the hand-offs too (two leaves after the first admission).
    assert!(
        f["redis_per_handoff_change"]["time_us"].is_number(),
        "{}",
        report.table()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_spread_over_two_instances_and_hand_off_across_them() {
    let rooms = vec![room("shared", 1)];
    let backend: Arc<dyn Backend> = EmbeddedBackend::new(rooms.clone(), Arc::new(SystemClock));
    let a = serve_on(rooms.clone(), backend.clone()).await;
    let b = serve_on(rooms, backend).await;
    let mut c = common(a.target, "shared");
    c.targets.push(b.target);
    let pid = std::process::id();
    let args = StreamsArgs {
        common: c,
        streams: 40,
        workers: Some(0),
        server_pids: vec![pid, pid],
        capacity: 1,
        prefill: 20,
        handoffs: 8,
        handoff_gap_ms: 5,
        quiet_max_seconds: 2.0,
        redis: None,
    };
    let report = streams::run(&args).await.unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert_eq!(f["streams_open"], 40, "{}", report.table());
    assert_eq!(f["fanout_delivered"], 40, "{}", report.table());
    assert_eq!(f["handoff"]["count"], 8, "{}", report.table());
    assert_eq!(f["handoff_timeouts"], 0, "{}", report.table());
    let instances = f["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 2);
    for (i, server) in instances.iter().zip([&a, &b]) {
        assert_eq!(i["target"], server.target.to_string());
        assert_eq!(i["streams_open"], 20, "{}", report.table());
        assert_eq!(i["server_pid"], pid);
        assert_eq!(i["handoff"]["count"], 4, "{}", report.table());
        assert!(i["fanout"]["count"].as_u64().unwrap() >= 19);
        assert!(i["memory_per_stream_kib"].is_number());
    }
    assert!(report.target.contains(','), "{}", report.target);
    assert!(report.table().contains("instance 1"));

    // Joins round-robin over both instances, into one line.
    let mut args = hammer_args(a.target, "shared");
    args.common.targets.push(b.target);
    args.no_baseline = true;
    args.requests = 200;
    // counted, not timed: the time bound is only a backstop on a busy machine
    args.seconds = 60.0;
    let report = hammered::run(&args, Kind::Joins).await.unwrap();
    let f = &report.figures;
    assert_eq!(f["joins"]["ok"], 200, "{}", report.table());
    assert_eq!(f["instances"], 2);
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_split_over_worker_processes() {
    let server = serve(vec![room("split", 2)]).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("streams.json");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args([
            "streams",
            "--target",
            &server.target.to_string(),
            "--room",
            "split",
        ])
        .args(["--streams", "40", "--workers", "2", "--capacity", "2"])
        .args([
            "--handoffs",
            "5",
            "--quiet-max-seconds",
            "2",
            "--max-seconds",
            "60",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("fan-out of one change"), "{stdout}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let f = &report["figures"];
    assert_eq!(f["streams_open"], 40, "{stdout}");
    assert_eq!(f["workers"], 2);
    assert_eq!(f["fanout_delivered"], 39, "{stdout}");
    assert_eq!(f["handoff"]["count"], 5, "{stdout}");
    server.stop().await;
}

#[tokio::test]
async fn a_non_loopback_target_is_refused_before_anything_is_sent() {
    for target in [
        "http://10.0.0.1:80",
        "http://example.com:80",
        "https://127.0.0.1:1",
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadtest"))
            .args(["surge", "--target", target, "--visitors", "1"])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{target}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(target), "{err}");
    }
}

// Twenty honest visitors, each told of its admission on its event stream:
// this is the test that found streams missing an admission that landed
// between their opening read and their first wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_without_work_gets_nothing_and_honest_visitors_get_in_in_order() {
    let mut sale = room("pow", 3);
    sale.access.challenge = narabu::access::ChallengeMode::Pow;
    sale.access.pow_difficulty = 8;
    sale.access.pow_difficulty_max = 8;
    let server = serve(vec![sale]).await;
    let args = loadtest::cli::BotsArgs {
        common: common(server.target, "pow"),
        honest: 20,
        over: 0.5,
        hold_ms: 10,
        flood_connections: 4,
        seconds: 1.5,
        bot_hashes_per_second: 20_000,
        cost_seconds: 0.3,
        cost_solutions: 30,
        connections: 4,
        server_pid: Some(std::process::id()),
        order_slack_ms: 50.0,
        baseline_in_process: true,
    };
    let report = loadtest::scenario::bots::run(&args).await.unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert_eq!(f["difficulty"], 8);
    assert_eq!(f["honest_admitted"], 20, "{}", report.table());
    assert_eq!(f["order_violations"], 0, "{}", report.table());
    assert_eq!(
        f["honest_errors"],
        serde_json::json!({}),
        "{}",
        report.table()
    );
    // The flood was answered, always with a challenge, never a ticket.
    assert!(f["flood_requests"].as_u64().unwrap() > 0);
    assert_eq!(
        f["flood_refused"],
        f["flood_requests"],
        "{}",
        report.table()
    );
    assert_eq!(f["unpaid_tickets"], 0);
    // The paying bot got exactly what it paid for, and no replay counted.
    let solutions = f["bot_solutions"].as_u64().unwrap();
    assert!(solutions > 0, "{}", report.table());
    assert_eq!(f["bot_paid_tickets"].as_u64().unwrap(), solutions);
    assert_eq!(f["bot_replays"].as_u64().unwrap(), solutions);
    assert_eq!(f["bot_replay_tickets"], 0);
    // The cost figures were taken against the baseline in the same run.
    assert_eq!(f["cost_verified"]["ok"], 30, "{}", report.table());
    assert!(f["refused_ratio_to_baseline"].as_f64().unwrap() > 0.0);
    assert!(f["verified_ratio_to_baseline"].as_f64().unwrap() > 0.0);
    server.stop().await;
}

/// A moving line with streams over its depths: the front is sent more
/// than the back, and every figure is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cadence_counts_the_updates_a_moving_line_sends_by_depth() {
    let server = serve(vec![room("line", 1)]).await;
    let args = CadenceArgs {
        common: common(server.target, "line"),
        line: 5_000,
        streams: 50,
        rate: 10,
        seconds: 4.0,
        workers: Some(0),
        server_pids: vec![std::process::id()],
    };
    let report = cadence::run(&args).await.unwrap();
    let f = &report.figures;
    assert!(report.invariants_held, "{}", report.table());
    assert_eq!(f["streams"], 50, "{}", report.table());
    let bands: Vec<f64> = f["bands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_f64().unwrap())
        .collect();
    // Near the head one percent of the place is a few admissions: about
    // one update a second; at the back (4,000 places and more) it is 40
    // admissions, four seconds of this line.
    assert!(bands[0] > bands[4], "{}", report.table());
    let per = f["updates_per_visitor_second"].as_f64().unwrap();
    assert!(per > 0.0 && per <= 1.0, "{}", report.table());
    assert!(f["server_cpu_us"].as_f64().unwrap() > 0.0);
    server.stop().await;
}
