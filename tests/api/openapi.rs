//! The OpenAPI document against the code it describes: every route of the
//! router is in it with exactly the methods the route answers, and
//! schemathesis, run against the live service, finds no answer the
//! document does not promise.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use narabu_testkit::app::{ADMIN_TOKEN, TestApp, spawn_app, spawn_app_with};
use narabu_testkit::room;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// The methods a route could answer besides the HEAD and OPTIONS that come
/// with them.
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// The path templates of the router, as it lists the routes it is built
/// from.
fn router_paths() -> BTreeSet<String> {
    let paths: BTreeSet<String> = narabu::http::router::paths()
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert!(paths.len() > 10, "found only {paths:?}");
    paths
}

/// A concrete address for a path template.
fn concrete(template: &str) -> String {
    let samples = BTreeMap::from([("room", "sale"), ("file", "queue.js")]);
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}').expect("a parameter closes") + open;
        let name = rest[open + 1..close].trim_start_matches('*');
        let value = samples
            .get(name)
            .unwrap_or_else(|| panic!("give the path parameter {{{name}}} a sample value here"));
        out.push_str(value);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

async fn document(app: &narabu_testkit::app::TestApp) -> Value {
    let response = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/json");
    response.json().await.unwrap()
}

#[tokio::test]
async fn every_route_is_in_the_document_with_the_methods_it_answers() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let doc = document(&app).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let documented: BTreeSet<String> = paths.keys().cloned().collect();
    assert_eq!(
        router_paths(),
        documented,
        "the router's paths (left) and the document's (right) differ"
    );

    // Each path answers exactly the documented methods: the others are 405.
    // No credentials are sent, so nothing is changed beyond a join.
    for (template, item) in paths {
        let url = app.url(&concrete(template));
        for method in METHODS {
            let response = app
                .client
                .request(
                    Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                    &url,
                )
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .unwrap();
            let status = response.status();
            if item.get(method).is_some() {
                assert_ne!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {template} is documented but not routed"
                );
                assert!(
                    !status.is_server_error(),
                    "{method} {template} answered {status}"
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {template} is routed but not documented"
                );
            }
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn every_operation_says_what_it_answers_and_who_may_call_it() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let doc = document(&app).await;
    let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
    for (template, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let name = format!("{method} {template}");
            assert!(op["summary"].is_string(), "{name} has no summary");
            let responses = op["responses"].as_object().unwrap();
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{name} documents no success"
            );
            // Every JSON error answer points at the one error shape.
            for (status, response) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    let schema = &response["content"]["application/json"]["schema"];
                    assert!(
                        schema.is_null() || schema["$ref"] == "#/components/schemas/Error",
                        "{name} {status}: {schema}"
                    );
                }
            }
            for requirement in op["security"].as_array().into_iter().flatten() {
                for scheme in requirement.as_object().unwrap().keys() {
                    assert!(schemes.contains_key(scheme), "{name}: unknown {scheme}");
                }
            }
            if template.starts_with("/admin/") {
                assert_eq!(op["security"], serde_json::json!([{"admin": []}]), "{name}");
            }
        }
    }
    app.stop().await;
}

/// Schemathesis (PyPI; `tests/requirements.txt`, which `scripts/test`
/// installs) against the live service: generated valid and invalid
/// requests for every operation, the event streams too (each event is
/// checked against the document's schema for its name), at most 30 per
/// operation and phase, with the admin token and an admitted visitor's
/// ticket for the schemes that ask for them (`tests/api/schemathesis.toml`).
/// It must find no 5xx, no status, content type, header or body the
/// document does not promise, and no invalid request accepted; and it must
/// warn of nothing (a warning means most valid requests were refused: the
/// document promises more than the API accepts). The visitors' operations
/// run first, the operators' after them: those close and replace rooms,
/// which would leave the visitors nothing to reach.
#[tokio::test]
async fn schemathesis_finds_nothing_the_document_does_not_promise() {
    // `fair` asks for proof of work and opens in an hour with a draw, so
    // that the challenge and the draw have something to answer.
    let mut fair = room("fair", 5);
    fair.access.challenge = narabu::access::ChallengeMode::Pow;
    fair.opens_at = Some(narabu::engine::Clock::now_ms(&narabu::engine::SystemClock) + 3_600_000);
    // `sale` counts stock, so that reported purchases have some to take.
    let mut sale = room("sale", 5);
    sale.stock = Some(1_000_000_000_000);
    // The whole site is `sale`'s, so that a gate without a room finds it.
    sale.routes = vec![narabu::routes::Route {
        host: None,
        path_prefix: "/".to_owned(),
    }];
    // Push on, so that the call-back operations answer.
    let config = narabu::config::Config {
        push: narabu::config::PushConfig {
            enabled: true,
            contact: "mailto:ops@example.com".to_owned(),
            ..Default::default()
        },
        ..narabu_testkit::app::config()
    };
    let app = spawn_app_with(config, vec![sale, room("scratch", 5), fair]).await;
    // An admitted visitor, so that the gate and the status have a live
    // pass to answer about.
    let visitor = app.join("sale").await;
    app.tick("sale").await;
    // Another, for the operation that ends the ticket it is given.
    let leaver = app.join("sale").await;
    for selection in [["--exclude-tag", "admin"], ["--include-tag", "admin"]] {
        schemathesis(&app, &visitor.token, &leaver.token, &selection).await;
    }
    app.stop().await;
}

async fn schemathesis(app: &TestApp, ticket: &str, leaver: &str, selection: &[&str]) {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/api/schemathesis.toml");
    let work = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new("python3")
        .args(["-m", "schemathesis.cli", "--config-file"])
        .arg(config)
        .arg("run")
        .arg(app.url("/openapi.json"))
        .args(selection)
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance,negative_data_rejection",
            "--max-examples",
            "30",
            "--seed",
            "20261124",
            // One worker: Hypothesis's description of its strategies is
            // not thread-safe, and two workers now and then fail on it.
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--generation-database",
            "none",
            "--no-color",
        ])
        .env("NARABU_ST_ADMIN", ADMIN_TOKEN)
        .env("NARABU_ST_TICKET", ticket)
        .env("NARABU_ST_LEAVER", leaver)
        // Anything it writes goes to the temporary directory.
        .current_dir(work.path())
        .kill_on_drop(true)
        .output()
        .await
        .expect(
            "python3 runs; is schemathesis installed (pip install -r tests/requirements.txt; \
             scripts/test does)?",
        );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "schemathesis found problems ({selection:?}):\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("WARNINGS"),
        "schemathesis warned ({selection:?}):\n{stdout}"
    );
    // It really ran: every selected operation was tested.
    let summary = summary_line(&stdout, "Tested:");
    let selected = summary_line(&stdout, "Selected:");
    assert!(
        selected.starts_with(&summary),
        "tested {summary} of {selected}:\n{stdout}"
    );
    println!("{stdout}");
}

fn summary_line(stdout: &str, label: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` in schemathesis's output:\n{stdout}"))
        .trim()
        .to_owned()
}

/// The join's body is optional and nullable in the document (generated
/// clients send `null` for a body left out): `null` joins like no body,
/// while a body that is neither an object nor `null` is still refused.
#[tokio::test]
async fn a_null_join_body_is_no_proof() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let join = |body: &'static str| {
        app.client
            .post(app.url("/api/rooms/sale/join"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_eq!(join("null").await.unwrap().status(), StatusCode::CREATED);
    let refused = join("[]").await.unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"], "bad_body");
    app.stop().await;
}
