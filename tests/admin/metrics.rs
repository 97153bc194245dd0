//! `/metrics` parses as Prometheus text, every name starts `narabu_`, and
//! its room counters are the admin API's figures.

use std::collections::HashMap;

use prometheus_parse::{Sample, Scrape, Value as PValue};
use reqwest::StatusCode;
use serde_json::json;

use super::{admin, get_room};
use narabu_testkit::app::{ADMIN_TOKEN, spawn_app};
use narabu_testkit::room;

fn scrape(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text")
}

fn value(s: &Sample) -> f64 {
    match &s.value {
        PValue::Counter(v) | PValue::Gauge(v) | PValue::Untyped(v) => *v,
        other => panic!("{} is not a plain value: {other:?}", s.metric),
    }
}

fn find<'a>(scrape: &'a Scrape, name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
}

#[tokio::test]
async fn metrics_parse_and_match_the_admin_figures() {
    let app = spawn_app(vec![room("sale", 2), room("empty", 3)]).await;
    let visitors = [
        app.join("sale").await,
        app.join("sale").await,
        app.join("sale").await,
        app.join("sale").await,
    ];
    app.tick("sale").await;
    assert_eq!(
        app.leave("sale", &visitors[0]).await,
        StatusCode::NO_CONTENT
    );
    let (status, _) = admin(
        &app,
        reqwest::Method::POST,
        "/admin/rooms/sale/revoke",
        Some(json!({"ticket": visitors[1].token})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let _ = app.gate("sale", Some(&visitors[2].token)).await;
    let _ = app
        .client
        .get(app.url("/no/such/route"))
        .send()
        .await
        .unwrap();

    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    let parsed = scrape(&text);

    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert!(line.starts_with("narabu_"), "{line}");
    }
    assert!(!text.contains(ADMIN_TOKEN));

    let r = get_room(&app, "sale").await;
    let room = [("room", "sale")];
    for (metric, field) in [
        ("narabu_room_waiting", "waiting"),
        ("narabu_room_admitted", "admitted"),
        ("narabu_room_capacity", "capacity"),
        ("narabu_room_joins_total", "joins"),
        ("narabu_room_admissions_total", "admissions"),
        ("narabu_room_releases_total", "releases"),
        ("narabu_room_revocations_total", "revocations"),
        ("narabu_room_abandonments_total", "abandonments"),
        ("narabu_room_away_skips_total", "away_skips"),
        ("narabu_room_away_returns_total", "away_returns"),
        ("narabu_room_leaves_total", "leaves"),
        ("narabu_room_push_subscriptions", "push_subscriptions"),
    ] {
        let sample =
            find(&parsed, metric, &room).unwrap_or_else(|| panic!("{metric} missing:\n{text}"));
        assert_eq!(
            value(sample),
            r[field].as_f64().unwrap(),
            "{metric} vs {field}"
        );
    }
    assert_eq!(r["joins"], 4);
    assert_eq!(r["revocations"], 1);
    assert_eq!(
        value(find(&parsed, "narabu_room_capacity", &[("room", "empty")]).unwrap()),
        3.0
    );

    // The wait histogram counts every admission, in cumulative buckets.
    let hist = parsed
        .samples
        .iter()
        .find(|s| s.metric == "narabu_room_wait_seconds" && s.labels.get("room") == Some("sale"));
    let count = match hist.map(|s| &s.value) {
        Some(PValue::Histogram(buckets)) => {
            let counts: Vec<f64> = buckets.iter().map(|b| b.count).collect();
            assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
            *counts.last().unwrap()
        }
        other => panic!("no wait histogram: {other:?}\n{text}"),
    };
    assert_eq!(count, r["admissions"].as_f64().unwrap());

    // HTTP requests by matched route and status, never by raw path.
    let counted: HashMap<(String, String), f64> = parsed
        .samples
        .iter()
        .filter(|s| s.metric == "narabu_http_requests_total")
        .map(|s| {
            (
                (
                    s.labels.get("route").unwrap().to_owned(),
                    s.labels.get("status").unwrap().to_owned(),
                ),
                value(s),
            )
        })
        .collect();
    assert_eq!(
        counted.get(&("/api/rooms/:room/join".into(), "201".into())),
        Some(&4.0),
        "{counted:?}"
    );
    assert_eq!(
        counted.get(&("/gate/:room".into(), "204".into())),
        Some(&1.0),
        "{counted:?}"
    );
    assert_eq!(counted.get(&("unmatched".into(), "404".into())), Some(&1.0));
    assert!(counted.keys().all(|(route, _)| !route.contains("sale")));
    assert!(text.contains("narabu_http_request_duration_seconds_bucket{"));
    app.stop().await;
}
