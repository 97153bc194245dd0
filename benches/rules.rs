//! What a room's traffic rules cost a gate check: the matcher over a
//! typical proxied request with no rules, and with ten rules of every kind
//! of condition, when none matches (every rule tried: the worst case for a
//! visitor who queues) and when the last one does. The gate itself adds,
//! for a room with rules, one map lookup; while no room has rules, one
//! atomic load and nothing else.
//!
//! `cargo bench --bench rules`; figures go into README ("Traffic rules").

use std::hint::black_box;

use axum::http::{HeaderMap, HeaderValue};
use criterion::{Criterion, criterion_group, criterion_main};
use narabu::rules::{RequestView, Rule, RuleSet};
use serde_json::json;

fn ten_rules() -> Vec<Rule> {
    serde_json::from_value(json!([
        {"action": "bypass", "path_prefix": ["/healthz", "/static/", "/favicon.ico"]},
        {"action": "bypass", "path": ["/assets/**", "/img/*.png"]},
        {"action": "block", "network": ["198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"]},
        {"action": "bypass", "network": ["10.0.0.0/8"], "path_prefix": ["/admin/"]},
        {"action": "bypass", "header": [{"name": "x-partner-key", "value": "k-123456"}]},
        {"action": "block", "cookie": [{"name": "banned"}]},
        {"action": "bypass", "user_agent": ["Googlebot", "bingbot", "DuckDuckBot"], "path": ["/events/*"], "method": ["GET", "HEAD"]},
        {"action": "bypass", "host": ["api.example.com", "*.partners.example.com"]},
        {"action": "block", "method": ["TRACE", "CONNECT"]},
        {"action": "bypass", "path_prefix": ["/tickets/last"], "method": ["GET"]},
    ]))
    .unwrap()
}

fn headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("host", "narabu:8080"),
        ("x-original-uri", "/tickets/last?seat=a1"),
        ("x-forwarded-method", "GET"),
        ("x-forwarded-host", "shop.example.com"),
        ("x-forwarded-for", "192.0.2.44"),
        (
            "user-agent",
            "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
        ),
        (
            "cookie",
            "narabu_sale=v1.abcdefghijklmnopqrstuvwxyz0123456789; theme=dark; lang=ja",
        ),
        ("accept", "text/html,application/xhtml+xml"),
        ("accept-language", "ja,en;q=0.8"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    h
}

fn rules(c: &mut Criterion) {
    let h = headers();
    let client = Some("192.0.2.44".parse().unwrap());
    let none = RuleSet::compile(&[]).unwrap();
    let ten = RuleSet::compile(&ten_rules()).unwrap();
    let mut nine = ten_rules();
    nine.pop();
    let nine = RuleSet::compile(&nine).unwrap();
    c.bench_function("rules: none", |b| {
        b.iter(|| {
            let view = RequestView::from_proxy(black_box(&h), client);
            black_box(none.first_match(&view))
        })
    });
    c.bench_function("rules: ten, the last matches", |b| {
        b.iter(|| {
            let view = RequestView::from_proxy(black_box(&h), client);
            black_box(ten.first_match(&view))
        })
    });
    c.bench_function("rules: nine, none matches", |b| {
        b.iter(|| {
            let view = RequestView::from_proxy(black_box(&h), client);
            black_box(nine.first_match(&view))
        })
    });
}

criterion_group!(benches, rules);
criterion_main!(benches);
