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
