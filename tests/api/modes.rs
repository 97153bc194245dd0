//! Queueing modes over HTTP, switched live with `PATCH {"mode": …}`: what
//! the status JSON, the join, the gate and a waiting visitor's event
//! stream say in each. Runs on either backend (`NARABU_TEST_BACKEND`).

use std::time::Duration;

use narabu_testkit::app::{ADMIN_TOKEN, TestApp, next_event, spawn_app};
use narabu_testkit::room;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn patch(app: &TestApp, room: &str, body: Value) -> (StatusCode, Value) {
    let response = app
        .client
        .patch(app.url(&format!("/admin/rooms/{room}")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn modes_switch_live_and_each_says_what_it_does() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let first = app.join("sale").await;
    let second = app.join("sale").await;
    assert_eq!(first.body["mode"], "queue");
    app.tick("sale").await;

    // Maintenance: the line stays, nobody goes in, the status says why.
    let (code, body) = patch(&app, "sale", json!({"mode": "maintenance"})).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["mode"], &body["settings"]["mode"]),
        (&json!("maintenance"), &json!("maintenance"))
    );
    assert_eq!(app.leave("sale", &first).await, StatusCode::NO_CONTENT);
    app.tick("sale").await;
    let s = app.status("sale", &second).await;
    assert_eq!(
        (&s["status"], &s["mode"], &s["eta_seconds"]),
        (&json!("waiting"), &json!("maintenance"), &Value::Null)
    );
    assert_eq!(
        app.gate("sale", Some(&second.token)).await.status(),
        StatusCode::UNAUTHORIZED
    );

    // Passthrough: the one waiting goes in at the next turn, newcomers at once.
    let (code, _) = patch(&app, "sale", json!({"mode": "passthrough"})).await;
    assert_eq!(code, StatusCode::OK);
    app.tick("sale").await;
    assert_eq!(app.status("sale", &second).await["status"], "admitted");
    let newcomer = app.join("sale").await;
    assert_eq!(newcomer.body["status"], "admitted");
    assert_eq!(
        app.gate("sale", Some(&newcomer.token)).await.status(),
        StatusCode::NO_CONTENT
    );
    let (_, room) = patch(&app, "sale", json!({"mode": "queue"})).await;
    // Still counted: two in a room of one.
    assert_eq!((&room["admitted"], &room["debt"]), (&json!(2), &json!(1)));
    let late = app.join("sale").await;
    assert_eq!(late.body["status"], "waiting");

    // What is not a mode is refused, naming the field.
    let (code, body) = patch(&app, "sale", json!({"mode": "random"})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().starts_with("mode"),
        "{body}"
    );
    let (code, body) = patch(&app, "sale", json!({"mode": null})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn sold_out_tells_waiting_streams_at_once_and_turns_newcomers_away() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let admitted = app.join("sale").await;
    let waiting = app.join("sale").await;
    app.tick("sale").await;
    let mut stream = app.events("sale", &waiting).await;
    let hello = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(hello.event, "position");

    let (code, body) = patch(&app, "sale", json!({"mode": "sold_out"})).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    // No tick runs in this app: the change alone reaches the stream.
    let closed = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(closed.event, "closed", "{closed:?}");
    let data: Value = serde_json::from_str(&closed.data).unwrap();
    assert_eq!(data, json!({"status": "closed", "reason": "sold_out"}));

    let s = app.status("sale", &waiting).await;
    assert_eq!(
        (&s["status"], &s["mode"]),
        (&json!("closed"), &json!("sold_out"))
    );
    let refused = app
        .client
        .post(app.url("/api/rooms/sale/join"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::GONE);
    let refused: Value = refused.json().await.unwrap();
    assert_eq!(refused["error"], "sold_out");
    // The gate sends even the admitted to the queue page, which says why.
    let gate = app.gate("sale", Some(&admitted.token)).await;
    assert_eq!(gate.status(), StatusCode::UNAUTHORIZED);
    let page = app.client.get(app.url("/queue/sale")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::GONE);

    // Lifted again, the line is as it was.
    let (code, _) = patch(&app, "sale", json!({"mode": "queue"})).await;
    assert_eq!(code, StatusCode::OK);
    let s = app.status("sale", &waiting).await;
    assert_eq!(
        (&s["status"], &s["position"]),
        (&json!("waiting"), &json!(1))
    );
    app.stop().await;
}

async fn post(app: &TestApp, path: &str, bearer: &str, body: Value) -> (StatusCode, Value) {
    let response = app
        .client
        .post(app.url(path))
        .bearer_auth(bearer)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn purchases_reported_on_release_count_down_the_stock_to_sold_out() {
    let app = spawn_app(vec![room("sale", 2)]).await;
    let (code, body) = patch(&app, "sale", json!({"stock": 3})).await;
    assert_eq!(
        (code, &body["stock"]),
        (StatusCode::OK, &json!(3)),
        "{body}"
    );
    let buyer = app.join("sale").await;
    let other = app.join("sale").await;
    let waiting = app.join("sale").await;
    app.tick("sale").await;
    // The waiting page reads the stock left from the status.
    assert_eq!(app.status("sale", &waiting).await["stock"], 3);

    let release = "/api/rooms/sale/release";
    let (code, body) = post(
        &app,
        release,
        ADMIN_TOKEN,
        json!({"ticket": buyer.token, "purchased": 2}),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"released": true, "purchased": 2, "stock": 1, "mode": "queue", "sold_out": false})
    );
    // The permit went on to the one waiting.
    assert_eq!(app.status("sale", &waiting).await["status"], "admitted");
    // A purchase counts even when the ticket no longer holds a permit.
    let (code, body) = post(
        &app,
        release,
        ADMIN_TOKEN,
        json!({"ticket": buyer.token, "purchased": 1}),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["released"], &body["stock"], &body["sold_out"]),
        (&json!(false), &json!(0), &json!(true))
    );
    assert_eq!(app.status("sale", &other).await["status"], "closed");
    // Later reports find nothing left and end nothing more.
    let (_, body) = post(
        &app,
        "/admin/rooms/sale/purchases",
        ADMIN_TOKEN,
        json!({"purchased": 1}),
    )
    .await;
    assert_eq!(
        body,
        json!({"purchased": 1, "stock": 0, "mode": "sold_out", "sold_out": false})
    );

    // Reopening while out of stock is refused; with new stock it is not.
    let (code, body) = patch(&app, "sale", json!({"mode": "queue"})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("stock is 0"),
        "{body}"
    );
    let (code, body) = patch(&app, "sale", json!({"mode": "queue", "stock": 5})).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(app.status("sale", &other).await["status"], "admitted");
    app.stop().await;
}

#[tokio::test]
async fn bad_purchase_reports_are_refused_clearly() {
    let app = spawn_app(vec![room("sale", 1), room("plain", 1)]).await;
    patch(&app, "sale", json!({"stock": 3})).await;
    let v = app.join("sale").await;
    for (body, words) in [
        (
            json!({"ticket": v.token, "purchased": 0}),
            "purchased: must be between 1",
        ),
        (json!({"ticket": v.token, "purchased": -1}), "purchased"),
        (json!({"ticket": v.token, "purchased": "two"}), "purchased"),
    ] {
        let (code, answer) = post(&app, "/api/rooms/sale/release", ADMIN_TOKEN, body).await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(words),
            "{answer}"
        );
    }
    let admin = "/admin/rooms/sale/purchases";
    let (code, answer) = post(&app, admin, ADMIN_TOKEN, json!({"purchased": 0})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let (code, answer) = post(&app, admin, ADMIN_TOKEN, json!({"units": 1})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let (code, _) = post(&app, admin, "not-the-token", json!({"purchased": 1})).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, answer) = post(
        &app,
        "/admin/rooms/plain/purchases",
        ADMIN_TOKEN,
        json!({"purchased": 1}),
    )
    .await;
    assert_eq!(
        (code, &answer["error"]),
        (StatusCode::CONFLICT, &json!("no_stock"))
    );
    let (code, answer) = patch(&app, "sale", json!({"stock": -4})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let (code, answer) = patch(&app, "sale", json!({"stock": 2_000_000_000_000u64})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    // Nothing was counted by any of them.
    let room = app.admin_room("sale").await;
    assert_eq!(room["stock"], 3);
    app.stop().await;
}
