//! The event stream's contract with a reconnecting client, checked with a
//! real SSE parser (`eventsource-stream`): every event has an `id:`, the
//! stream says how long to wait before reconnecting (`retry:`), and a
//! client that comes back with `Last-Event-ID` is sent its state at once,
//! an admission it missed included, never showing more people ahead than
//! it last saw. And a leave moves the line for the streams behind it
//! without waiting for the worker's tick (no worker runs in these apps).

use std::time::Duration;

use narabu_testkit::app::{next_event, spawn_app};
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::Value;

fn data(e: &eventsource_stream::Event) -> Value {
    serde_json::from_str(&e.data).unwrap()
}

#[tokio::test]
async fn events_carry_ids_and_a_reconnect_gets_the_admission_it_missed() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let holder = app.join("sale").await;
    let ahead = app.join("sale").await;
    let me = app.join("sale").await;
    app.tick("sale").await;

    let mut stream = app.events("sale", &me).await;
    let first = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(first.event, "position");
    assert_eq!(data(&first)["ahead"], 1);
    // The id is the count ahead shown; the first event says when to retry.
    assert_eq!(first.id, "1");
    assert_eq!(first.retry, Some(Duration::from_secs(3)));
    drop(stream);

    // While the visitor is away, the two ahead go through: it is admitted.
    assert_eq!(app.leave("sale", &holder).await, StatusCode::NO_CONTENT);
    assert_eq!(app.leave("sale", &ahead).await, StatusCode::NO_CONTENT);
    assert_eq!(app.status("sale", &me).await["status"], "admitted");

    let mut back = app.events_after("sale", &me, Some(&first.id)).await;
    let missed = next_event(&mut back, Duration::from_secs(5)).await;
    assert_eq!(missed.event, "admitted", "{missed:?}");
    assert_eq!(data(&missed)["status"], "admitted");
    assert_eq!(missed.id, "end");
    app.stop().await;
}

#[tokio::test]
async fn a_reconnect_never_shows_more_ahead_than_the_client_last_saw() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let mut line = Vec::new();
    for _ in 0..5 {
        line.push(app.join("sale").await);
    }
    app.tick("sale").await;
    let me = line.last().unwrap();
    let mut stream = app.events("sale", me).await;
    let first = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(
        (first.id.as_str(), &data(&first)["ahead"]),
        ("3", &Value::from(3))
    );
    drop(stream);
    // A client that last saw 2 ahead (say, before the line briefly grew)
    // keeps seeing no more than that; a bad id is ignored.
    let mut back = app.events_after("sale", me, Some("2")).await;
    let resumed = next_event(&mut back, Duration::from_secs(5)).await;
    assert_eq!(
        (resumed.id.as_str(), &data(&resumed)["position"]),
        ("2", &Value::from(3))
    );
    let mut odd = app.events_after("sale", me, Some("not-a-count")).await;
    let fresh = next_event(&mut odd, Duration::from_secs(5)).await;
    assert_eq!(data(&fresh)["ahead"], 3);
    app.stop().await;
}

#[tokio::test]
async fn a_leave_moves_the_streams_behind_it_without_a_tick() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let mut line = Vec::new();
    for _ in 0..4 {
        line.push(app.join("sale").await);
    }
    app.tick("sale").await;
    let mut stream = app.events("sale", &line[3]).await;
    let first = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(data(&first)["position"], 3);
    // Someone ahead leaves the line; nobody ticks.
    assert_eq!(app.leave("sale", &line[1]).await, StatusCode::NO_CONTENT);
    let moved = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(moved.event, "position");
    assert_eq!(data(&moved)["position"], 2);
    assert_eq!(moved.id, "1");
    app.stop().await;
}

/// The cadence rule end to end: a visitor 251st in line is not sent a
/// move of one or two places (under one percent of their place), and is
/// sent the third at once, without waiting for the 20-second refresh.
#[tokio::test]
async fn a_stream_deep_in_line_is_sent_the_moves_it_would_notice() {
    let mut settings = room("sale", 1);
    settings.join_limit_per_minute = 0;
    let app = spawn_app(vec![settings]).await;
    let mut line = Vec::new();
    for _ in 0..251 {
        line.push(app.join("sale").await);
    }
    let mut stream = app.events("sale", &line[250]).await;
    let first = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(data(&first)["position"], 251);
    for gone in &line[..2] {
        assert_eq!(app.leave("sale", gone).await, StatusCode::NO_CONTENT);
    }
    let quiet = tokio::time::timeout(
        Duration::from_millis(1500),
        futures_util::StreamExt::next(&mut stream),
    )
    .await;
    assert!(quiet.is_err(), "two places of 251 were sent: {quiet:?}");
    assert_eq!(app.leave("sale", &line[2]).await, StatusCode::NO_CONTENT);
    let moved = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(
        (moved.event.as_str(), &data(&moved)["position"]),
        ("position", &Value::from(248))
    );
    app.stop().await;
}

/// A stream on a connection of its own, read as raw bytes: what the
/// server has written to it so far is what its socket holds.
struct RawStream {
    socket: tokio::net::TcpStream,
    read: Vec<u8>,
}

impl RawStream {
    async fn open(base: &str, room: &str, token: &str) -> Self {
        let addr = base.trim_start_matches("http://");
        let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET /api/rooms/{room}/events HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {token}\r\n\r\n"
        );
        socket.writable().await.unwrap();
        socket.try_write(head.as_bytes()).unwrap();
        Self {
            socket,
            read: Vec::new(),
        }
    }

    /// Everything the socket holds now, without waiting.
    fn drain(&mut self) -> &str {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.socket.try_read(&mut buf) {
            if n == 0 {
                break;
            }
            self.read.extend_from_slice(&buf[..n]);
        }
        std::str::from_utf8(&self.read).unwrap_or("")
    }

    fn count(&mut self, event: &str) -> usize {
        self.drain().matches(&format!("event: {event}\n")).count()
    }

    async fn wait_for(&mut self, event: &str, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.count(event) < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {event}: {}",
                self.drain()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A visitor's own admission is written before the position updates of
/// the change that came with it: by the time any stream behind sees the
/// line move, the admitted visitor's socket already holds `admitted`. On
/// one thread (one writer) the test looks between the wave's groups of
/// streams, so an admission written with the wave, not before it, fails.
#[tokio::test]
async fn an_admission_is_written_before_the_moves_it_comes_with() {
    let mut settings = room("sale", 1);
    settings.join_limit_per_minute = 0;
    let app = spawn_app(vec![settings]).await;
    let holder = app.join("sale").await;
    app.tick("sale").await;
    assert_eq!(app.status("sale", &holder).await["status"], "admitted");
    let next = app.join("sale").await;
    let mut behind = Vec::new();
    for _ in 0..300 {
        behind.push(app.join("sale").await);
    }
    let mut mine = RawStream::open(&app.base, "sale", &next.token).await;
    let mut theirs = Vec::new();
    for v in &behind {
        theirs.push(RawStream::open(&app.base, "sale", &v.token).await);
    }
    mine.wait_for("position", 1).await;
    for s in &mut theirs {
        s.wait_for("position", 1).await;
    }
    // Past the one-second gap after the first events: the next move is
    // sent to everyone behind as soon as it comes.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    assert_eq!(app.leave("sale", &holder).await, StatusCode::NO_CONTENT);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(s) = theirs
            .iter_mut()
            .find_map(|s| (s.count("position") > 1).then_some(s))
        {
            let moved = s.drain().to_owned();
            assert_eq!(
                mine.count("admitted"),
                1,
                "a stream behind heard of the move before the admitted visitor heard of the \
                 admission:\n{moved}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody behind was told of the move"
        );
        tokio::task::yield_now().await;
    }
    app.stop().await;
}
