//! `spawn_app`: the real server on 127.0.0.1:0 over a backend the test can
//! also reach directly (to tick a room on demand, so hand-off tests prove
//! that nothing waited for a tick), plus small HTTP and SSE helpers.
//!
//! The backend is the embedded one, or with `NARABU_TEST_BACKEND=redis`
//! rooms run by their owners on a redis-server of the test's own
//! (`scripts/test` runs the suite both ways), so the service's tests hold
//! for both.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use narabu::backend::Backend;
use narabu::backend::embedded::EmbeddedBackend;
use narabu::backend::redis::RedisOptions;
use narabu::config::{Backend as ConfigBackend, Config, OnBackendError, RedisTarget, Secret};
use narabu::engine::{RoomId, RoomSettings, SystemClock};

use crate::redis_server::RedisServer;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::oneshot;

pub const SECRET: &str = "test-secret-test-secret-test-secret-0123";
pub const ADMIN_TOKEN: &str = "admin-token-admin-token-admin-token-0123";

pub struct TestApp {
    pub base: String,
    pub backend: Arc<dyn Backend>,
    pub client: reqwest::Client,
    _redis: Option<RedisServer>,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn config() -> Config {
    Config {
        secret: Some(Secret::new(SECRET)),
        admin_token: Some(Secret::new(ADMIN_TOKEN)),
        ..Config::default()
    }
}

/// The server with rooms whose workers do not run: the test ticks.
pub async fn spawn_app(rooms: Vec<RoomSettings>) -> TestApp {
    spawn_app_with(config(), rooms).await
}

/// [`spawn_app`] with a configuration of the test's own (its rooms are
/// `rooms`), on whichever backend the suite runs on.
pub async fn spawn_app_with(config: Config, rooms: Vec<RoomSettings>) -> TestApp {
    if std::env::var("NARABU_TEST_BACKEND").as_deref() == Ok("redis") {
        let server = RedisServer::start().await;
        let backend = crate::redis_server::owners_on(
            &server,
            rooms,
            Arc::new(SystemClock),
            crate::redis_server::ticked_by_the_test(),
            narabu::config::RedisWait::OFF,
        )
        .await;
        let mut app = spawn_with(config, backend).await;
        app._redis = Some(server);
        return app;
    }
    let backend = EmbeddedBackend::without_workers(rooms, Arc::new(SystemClock));
    spawn_with(config, backend).await
}

/// An instance as several run in production: on Redis at `target`, its
/// rooms' workers running, elected with a `lease`.
pub async fn spawn_on_redis(
    target: RedisTarget,
    rooms: Vec<RoomSettings>,
    lease: Duration,
    on_backend_error: OnBackendError,
) -> TestApp {
    let options = RedisOptions {
        lease,
        ..RedisOptions::new(target.clone())
    };
    let backend = narabu::backend::redis::connect(options, rooms.clone(), Arc::new(SystemClock))
        .await
        .unwrap();
    let config = Config {
        backend: ConfigBackend::Redis(target),
        rooms,
        on_backend_error,
        ..config()
    };
    spawn_with(config, backend).await
}

pub async fn spawn_with(config: Config, backend: Arc<dyn Backend>) -> TestApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(narabu::server::serve(
        listener,
        config,
        backend.clone(),
        async {
            let _ = stopped.await;
        },
    ));
    TestApp {
        base: format!("http://{addr}"),
        backend,
        _redis: None,
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        stop: Some(stop),
        server: Some(server),
    }
}

pub type EventStream =
    Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// A visitor as an app sees it: the token it sends as Bearer.
#[derive(Clone, Debug)]
pub struct Visitor {
    pub token: String,
    pub number: u64,
    pub body: Value,
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The room as the admin API shows it (`GET /admin/rooms/{room}`).
    pub async fn admin_room(&self, room: &str) -> Value {
        let response = self
            .client
            .get(self.url(&format!("/admin/rooms/{room}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.json().await.unwrap()
    }

    /// The `/metrics` page (the test configuration sets no metrics token).
    pub async fn metrics(&self) -> String {
        let response = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    pub async fn tick(&self, room: &str) {
        self.backend
            .tick(&RoomId::new(room).unwrap())
            .await
            .unwrap();
    }

    pub async fn join(&self, room: &str) -> Visitor {
        let response = self
            .client
            .post(self.url(&format!("/api/rooms/{room}/join")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        let body: Value = response.json().await.unwrap();
        Visitor {
            token: body["ticket"].as_str().unwrap().to_owned(),
            number: body["number"].as_u64().unwrap(),
            body,
        }
    }

    pub async fn status(&self, room: &str, v: &Visitor) -> Value {
        let response = self
            .client
            .get(self.url(&format!("/api/rooms/{room}/status")))
            .bearer_auth(&v.token)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    pub async fn leave(&self, room: &str, v: &Visitor) -> StatusCode {
        self.client
            .post(self.url(&format!("/api/rooms/{room}/leave")))
            .bearer_auth(&v.token)
            .send()
            .await
            .unwrap()
            .status()
    }

    pub async fn gate(&self, room: &str, token: Option<&str>) -> reqwest::Response {
        let mut request = self.client.get(self.url(&format!("/gate/{room}")));
        if let Some(t) = token {
            request = request.header("cookie", format!("narabu_{room}={t}"));
        }
        request.send().await.unwrap()
    }

    /// Follow a visitor's event stream.
    pub async fn events(&self, room: &str, v: &Visitor) -> EventStream {
        self.events_after(room, v, None).await
    }

    /// Follow a visitor's event stream as a reconnecting browser does,
    /// sending the id of the last event it had as `Last-Event-ID`.
    pub async fn events_after(&self, room: &str, v: &Visitor, last: Option<&str>) -> EventStream {
        let mut request = self
            .client
            .get(self.url(&format!("/api/rooms/{room}/events")))
            .bearer_auth(&v.token);
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Box::pin(response.bytes_stream().eventsource())
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .expect("graceful shutdown finishes")
                .unwrap()
                .unwrap();
        }
    }
}

/// The next event that is not a keep-alive comment, within a bound.
pub async fn next_event<S, E>(stream: &mut S, within: Duration) -> Event
where
    S: Stream<Item = Result<Event, E>> + Unpin,
    E: std::fmt::Debug,
{
    tokio::time::timeout(within, stream.next())
        .await
        .expect("an event arrives in time")
        .expect("the stream is open")
        .expect("a well-formed event")
}
