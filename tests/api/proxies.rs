//! The quick start as a visitor lives it, behind each proxy Narabu ships a
//! configuration for: a real nginx (`config/nginx.conf`), Caddy
//! (`config/Caddyfile`), HAProxy (`config/haproxy.cfg`) and Traefik
//! (`config/traefik.yml`), only their addresses rewritten, in front of a small origin, with Narabu as their
//! gate. The same visit runs behind each: the visitor asks for a protected
//! page, is sent to the queue, waits, and reaches the origin page once a
//! permit frees up, with the admission pushed through the proxy as it
//! happens; after leaving, the queue again.

use std::time::Duration;

use eventsource_stream::Eventsource;
use reqwest::StatusCode;
use reqwest::header::{CACHE_CONTROL, COOKIE, LOCATION, SET_COOKIE};
use serde_json::Value;

use narabu_testkit::app::{next_event, spawn_app};
use narabu_testkit::proxy::{Kind, Proxy, spawn_origin};
use narabu_testkit::room;

/// A browser's view of one visitor: its room cookie, once it has one.
struct Browser<'a> {
    client: &'a reqwest::Client,
    base: &'a str,
    cookie: Option<String>,
}

impl Browser<'_> {
    async fn get(&mut self, path: &str) -> reqwest::Response {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(cookie) = &self.cookie {
            request = request.header(COOKIE, cookie);
        }
        let response = request.send().await.unwrap();
        if let Some(set) = response.headers().get(SET_COOKIE) {
            let pair = set.to_str().unwrap().split(';').next().unwrap();
            self.cookie = Some(pair.to_owned());
        }
        response
    }

    /// Ask for a protected page; a refusal answers with the queue page's
    /// path, which no cache may keep.
    async fn visit(&mut self, path: &str) -> (StatusCode, String) {
        let response = self.get(path).await;
        let status = response.status();
        if status == StatusCode::FOUND {
            assert_eq!(response.headers()[CACHE_CONTROL], "no-store");
            // nginx makes the queue URL absolute, on its own host.
            let location = response.headers()[LOCATION].to_str().unwrap();
            let path = location.strip_prefix(self.base).unwrap_or(location);
            return (status, path.to_owned());
        }
        (status, response.text().await.unwrap())
    }
}

#[tokio::test]
async fn nginx_auth_request_queues_visitors_and_lets_them_through_in_turn() {
    visit_through(Kind::Nginx).await;
}

#[tokio::test]
async fn caddy_forward_auth_queues_visitors_and_lets_them_through_in_turn() {
    visit_through(Kind::Caddy).await;
}

#[tokio::test]
async fn haproxy_lua_gate_queues_visitors_and_lets_them_through_in_turn() {
    visit_through(Kind::Haproxy).await;
}

#[tokio::test]
async fn traefik_forward_auth_queues_visitors_and_lets_them_through_in_turn() {
    visit_through(Kind::Traefik).await;
}

async fn visit_through(kind: Kind) {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let origin = spawn_origin().await;
    let proxy = Proxy::start(kind, app.base.trim_start_matches("http://"), &origin).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // Without a pass, the protected page sends the visitor to the queue,
    // remembering where they were going.
    let mut first = Browser {
        client: &client,
        base: &proxy.base,
        cookie: None,
    };
    let (status, queue) = first.visit("/tickets?seat=a1").await;
    assert_eq!(status, StatusCode::FOUND);
    assert_eq!(queue, "/queue/sale?return=%2Ftickets%3Fseat%3Da1");

    // The queue page, through the proxy, gives the visitor a ticket.
    let page = first.get(&queue).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert!(first.cookie.as_deref().unwrap().starts_with("narabu_sale="));
    assert!(page.text().await.unwrap().contains("/static/queue.js"));

    // A second visitor queues behind.
    let mut second = Browser {
        client: &client,
        base: &proxy.base,
        cookie: None,
    };
    let (_, queue2) = second.visit("/tickets").await;
    assert_eq!(second.get(&queue2).await.status(), StatusCode::OK);
    assert!(second.cookie.is_some());

    // One permit: the worker admits the first visitor only.
    app.tick("sale").await;
    assert_eq!(
        first.visit("/tickets?seat=a1").await,
        (StatusCode::OK, "origin page /tickets".to_owned())
    );
    assert_eq!(second.visit("/tickets").await.0, StatusCode::FOUND);

    // A forged cookie is sent to the queue, not to the origin.
    let mut forger = Browser {
        client: &client,
        base: &proxy.base,
        cookie: Some("narabu_sale=forged.token".to_owned()),
    };
    assert_eq!(forger.visit("/tickets").await.0, StatusCode::FOUND);

    // The second visitor follows the event stream through the proxy. When the
    // first leaves, the permit is handed over at once (no tick runs), and
    // the admission comes through the proxy unbuffered.
    let events = second.get("/api/rooms/sale/events").await;
    assert_eq!(events.status(), StatusCode::OK);
    let mut stream = events.bytes_stream().eventsource();
    let waiting = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(waiting.event, "position");
    let waiting: Value = serde_json::from_str(&waiting.data).unwrap();
    assert_eq!(waiting["position"], 1);

    let left = client
        .post(format!("{}/api/rooms/sale/leave", proxy.base))
        .header(COOKIE, first.cookie.clone().unwrap())
        .send()
        .await
        .unwrap();
    assert!(left.status().is_success(), "{}", left.status());

    let admitted = loop {
        let event = next_event(&mut stream, Duration::from_secs(5)).await;
        if event.event == "admitted" {
            break event;
        }
    };
    assert!(
        admitted.data.contains("pass_expires_at"),
        "{}",
        admitted.data
    );
    assert_eq!(
        second.visit("/tickets").await,
        (StatusCode::OK, "origin page /tickets".to_owned())
    );
    // The first visitor gave the permit back and is queued again.
    assert_eq!(first.visit("/tickets").await.0, StatusCode::FOUND);

    drop(stream);
    drop(proxy);
    app.stop().await;
}
