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
use serde_json::{Value, json};

use narabu_testkit::app::{ADMIN_TOKEN, next_event, spawn_app};
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

/// A browser's cookies, kept as a browser keeps them: every `Set-Cookie`
/// of every answer, a removal (`Max-Age=0`) removing.
#[derive(Default)]
struct Jar(std::collections::BTreeMap<String, String>);

impl Jar {
    fn header(&self) -> String {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.join("; ")
    }

    fn absorb(&mut self, response: &reqwest::Response) {
        for set in response.headers().get_all(SET_COOKIE) {
            let set = set.to_str().unwrap();
            let (pair, attributes) = set.split_once(';').unwrap_or((set, ""));
            let (name, value) = pair.split_once('=').unwrap();
            if attributes.contains("Max-Age=0") || value.is_empty() {
                self.0.remove(name.trim());
            } else {
                self.0
                    .insert(name.trim().to_owned(), value.trim().to_owned());
            }
        }
    }

    /// The pass, under either of its names (`__Host-` with
    /// `cookie_secure`).
    fn pass(&self) -> Option<&str> {
        ["narabu_sale_jwt", "__Host-narabu_sale_jwt"]
            .iter()
            .find_map(|name| self.0.get(*name))
            .map(String::as_str)
    }

    fn ticket(&self) -> Option<&str> {
        ["narabu_sale", "__Host-narabu_sale"]
            .iter()
            .find_map(|name| self.0.get(*name))
            .map(String::as_str)
    }

    /// Ask for `path` through the proxy with these cookies; answer the
    /// status and the body or the redirect's target.
    async fn visit(
        &mut self,
        client: &reqwest::Client,
        base: &str,
        path: &str,
    ) -> (StatusCode, String) {
        let mut request = client.get(format!("{base}{path}"));
        if !self.0.is_empty() {
            request = request.header(COOKIE, self.header());
        }
        let response = request.send().await.unwrap();
        self.absorb(&response);
        let status = response.status();
        if status == StatusCode::FOUND {
            assert_eq!(response.headers()[CACHE_CONTROL], "no-store");
            let location = response.headers()[LOCATION].to_str().unwrap();
            return (
                status,
                location.strip_prefix(base).unwrap_or(location).to_owned(),
            );
        }
        (status, response.text().await.unwrap())
    }
}

/// How many times Narabu's gate has answered, from its own metrics.
async fn gate_calls(app: &narabu_testkit::app::TestApp) -> u64 {
    let text = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("narabu_http_requests_total{") && l.contains("route=\"/gate/:room\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Seconds until a pass has expired for certain (its `exp` is whole seconds).
fn until_expired(pass: &str) -> Duration {
    use base64::Engine as _;
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(pass.split('.').nth(1).unwrap())
        .unwrap();
    let claims: Value = serde_json::from_slice(&payload).unwrap();
    let exp_ms = claims["exp"].as_u64().unwrap() * 1000;
    let now_ms = narabu::engine::Clock::now_ms(&narabu::engine::SystemClock);
    Duration::from_millis(exp_ms.saturating_sub(now_ms) + 1100)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_verifying_passes_asks_the_gate_once_per_pass_lifetime() {
    verify_through(Kind::NginxVerify, false).await;
}

/// Over HTTPS (`cookie_secure`) the cookies carry the `__Host-` prefix;
/// the shipped configurations read either name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_verifying_passes_reads_secure_cookies_too() {
    verify_through(Kind::NginxVerify, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_verifying_passes_reads_secure_cookies_too() {
    verify_through(Kind::HaproxyVerify, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_verifying_passes_asks_the_gate_once_per_pass_lifetime() {
    verify_through(Kind::HaproxyVerify, false).await;
}

/// A visitor behind a proxy that checks passes itself: sent to the queue
/// without a gate call while they hold no ticket; through the gate once
/// when admitted, then straight to the origin while the pass lives; renewed
/// by the gate after it expires while the permit lives; and back to the
/// queue once the permit is released and the pass has run out.
async fn verify_through(kind: Kind, cookie_secure: bool) {
    let lifetime = Duration::from_secs(3);
    let config = narabu::config::Config {
        cookie_secure,
        ..narabu_testkit::app::config()
    };
    let rooms = vec![super::passes::room_with_pass("sale", 1, lifetime)];
    let app = narabu_testkit::app::spawn_app_with(config, rooms).await;
    let origin = spawn_origin().await;
    let proxy = Proxy::start(kind, app.base.trim_start_matches("http://"), &origin).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = proxy.base.as_str();
    let mut jar = Jar::default();
    let before = gate_calls(&app).await;

    // No ticket: the queue, and Narabu is not asked.
    let (status, queue) = jar.visit(&client, base, "/tickets?seat=a1").await;
    assert_eq!(status, StatusCode::FOUND, "{}", proxy.log());
    assert_eq!(queue, "/queue/sale?return=%2Ftickets%3Fseat%3Da1");
    assert_eq!(gate_calls(&app).await, before, "{}", proxy.log());

    // The queue page gives a ticket; waiting, the gate is asked and says
    // "not yet".
    let page = client.get(format!("{base}{queue}")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    jar.absorb(&page);
    let prefix = if cookie_secure { "__Host-" } else { "" };
    assert!(
        jar.0.contains_key(&format!("{prefix}narabu_sale")),
        "{:?}",
        jar.0
    );
    assert_eq!(
        jar.visit(&client, base, "/tickets").await.0,
        StatusCode::FOUND
    );
    assert_eq!(gate_calls(&app).await, before + 1);

    // Admitted: one gate call mints the pass, and the next page views go
    // to the origin without asking Narabu.
    app.tick("sale").await;
    let expect_origin = (StatusCode::OK, "origin page /tickets".to_owned());
    assert_eq!(
        jar.visit(&client, base, "/tickets").await,
        expect_origin,
        "{}",
        proxy.log()
    );
    let first_pass = jar
        .pass()
        .expect("the gate's pass reached the browser")
        .to_owned();
    assert!(
        jar.0.contains_key(&format!("{prefix}narabu_sale_jwt")),
        "{:?}",
        jar.0
    );
    assert_eq!(gate_calls(&app).await, before + 2);
    for _ in 0..5 {
        assert_eq!(jar.visit(&client, base, "/tickets").await, expect_origin);
    }
    assert_eq!(
        gate_calls(&app).await,
        before + 2,
        "page views with a pass ask nobody"
    );

    // Expired: the gate renews it while the permit lives.
    tokio::time::sleep(until_expired(&first_pass)).await;
    assert_eq!(jar.visit(&client, base, "/tickets").await, expect_origin);
    assert_eq!(gate_calls(&app).await, before + 3);
    let renewed = jar.pass().unwrap().to_owned();
    assert_ne!(renewed, first_pass);
    assert_eq!(jar.visit(&client, base, "/tickets").await, expect_origin);
    assert_eq!(gate_calls(&app).await, before + 3);

    // The origin's backend releases the permit. The pass in the browser
    // stays good until it expires (the trade-off docs/proxies.md describes); then
    // the gate sends the visitor to the queue.
    let ticket = jar.ticket().unwrap().to_owned();
    let released = app
        .client
        .post(app.url("/api/rooms/sale/release"))
        .bearer_auth(narabu_testkit::app::ADMIN_TOKEN)
        .json(&serde_json::json!({ "ticket": ticket }))
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    tokio::time::sleep(until_expired(&renewed)).await;
    let (status, queue) = jar.visit(&client, base, "/tickets").await;
    assert_eq!(status, StatusCode::FOUND);
    assert_eq!(queue, "/queue/sale?return=%2Ftickets");
    assert_eq!(gate_calls(&app).await, before + 4);

    drop(proxy);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifying_proxies_refuse_forged_expired_other_room_and_retired_passes() {
    let app = spawn_app(vec![room("sale", 1)]).await;
    let origin = spawn_origin().await;
    let live = super::passes::live_pass(&app, "sale").await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for kind in [Kind::HaproxyVerify, Kind::NginxVerify] {
        let proxy = Proxy::start(kind, app.base.trim_start_matches("http://"), &origin).await;
        let base = proxy.base.as_str();
        let before = gate_calls(&app).await;
        // The live pass alone (no ticket cookie) opens the site: the proxy
        // alone decided.
        let mut jar = Jar::default();
        jar.0.insert("narabu_sale_jwt".into(), live.clone());
        assert_eq!(
            jar.visit(&client, base, "/a").await,
            (StatusCode::OK, "origin page /a".to_owned()),
            "{kind:?}: {}",
            proxy.log()
        );
        for (name, bad) in super::passes::bad_passes(&live) {
            let mut jar = Jar::default();
            jar.0.insert("narabu_sale_jwt".into(), bad);
            let (status, _) = jar.visit(&client, base, "/a").await;
            assert_eq!(
                status,
                StatusCode::FOUND,
                "{kind:?} let a {name} pass through"
            );
        }
        assert_eq!(
            gate_calls(&app).await,
            before,
            "{kind:?}: no ticket, no gate call"
        );
        drop(proxy);
    }
    app.stop().await;
}

#[tokio::test]
async fn nginx_applies_the_rooms_traffic_rules() {
    rules_through(Kind::Nginx).await;
}

#[tokio::test]
async fn caddy_applies_the_rooms_traffic_rules() {
    rules_through(Kind::Caddy).await;
}

#[tokio::test]
async fn haproxy_applies_the_rooms_traffic_rules() {
    rules_through(Kind::Haproxy).await;
}

#[tokio::test]
async fn traefik_applies_the_rooms_traffic_rules() {
    rules_through(Kind::Traefik).await;
}

/// A room's rules behind a real proxy: a bypassed path reaches the origin
/// without a ticket; a page no rule matches queues; and once the block
/// rule names the visitor's network (loopback here), that page is
/// refused while the bypass still holds.
async fn rules_through(kind: Kind) {
    let rules = |blocked: &str| {
        json!([
            {"name": "health", "action": "bypass", "path_prefix": ["/healthz"], "method": ["GET"]},
            {"name": "bad-net", "action": "block", "network": [blocked]},
        ])
    };
    let mut sale = room("sale", 1);
    sale.rules = serde_json::from_value(rules("198.51.100.0/24")).unwrap();
    let app = spawn_app(vec![sale]).await;
    let origin = spawn_origin().await;
    let proxy = Proxy::start(kind, app.base.trim_start_matches("http://"), &origin).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut visitor = Browser {
        client: &client,
        base: &proxy.base,
        cookie: None,
    };

    let bypassed = (StatusCode::OK, "origin page /healthz/deep".to_owned());
    assert_eq!(visitor.visit("/healthz/deep?x=1").await, bypassed);
    assert!(visitor.cookie.is_none(), "a bypass takes no ticket");
    let (status, queue) = visitor.visit("/tickets").await;
    assert_eq!(
        (status, queue.as_str()),
        (StatusCode::FOUND, "/queue/sale?return=%2Ftickets")
    );

    let changed = app
        .client
        .patch(app.url("/admin/rooms/sale"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "rules": rules("127.0.0.0/8") }))
        .send()
        .await
        .unwrap();
    assert_eq!(changed.status(), StatusCode::OK);
    assert_eq!(visitor.visit("/tickets").await.0, StatusCode::FORBIDDEN);
    // A POST to the bypassed path is not a GET: the network rule decides.
    let post = client
        .post(format!("{}/healthz", proxy.base))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), StatusCode::FORBIDDEN);
    assert_eq!(visitor.visit("/healthz/deep?x=1").await, bypassed);
    assert!(visitor.cookie.is_none());

    let view = app.admin_room("sale").await;
    assert_eq!(view["waiting"], 0);
    // A rule's count outlives a change of the room's rules.
    assert_eq!(view["rule_matches"][0]["matches"], 2);
    assert_eq!(view["rule_matches"][1]["matches"], 2);

    drop(proxy);
    app.stop().await;
}

#[tokio::test]
async fn one_nginx_gate_sends_each_request_to_its_rooms_line() {
    site_gate_through(Kind::NginxSite).await;
}

#[tokio::test]
async fn one_caddy_gate_sends_each_request_to_its_rooms_line() {
    site_gate_through(Kind::CaddySite).await;
}

#[tokio::test]
async fn one_haproxy_gate_sends_each_request_to_its_rooms_line() {
    site_gate_through(Kind::HaproxySite).await;
}

#[tokio::test]
async fn one_traefik_gate_sends_each_request_to_its_rooms_line() {
    site_gate_through(Kind::TraefikSite).await;
}

/// One gate for a site (`config/nginx-site.conf`, `Caddyfile-site`,
/// `haproxy-site.cfg`, `traefik-site.yml`) in front of three rooms: the
/// rest of the site, a presale section and a partner host. Each request
/// is sent to its own room's queue, and a ticket for one room does not
/// open another's pages.
async fn site_gate_through(kind: Kind) {
    let with_routes = |id: &str, capacity: u32, routes: Value| {
        let mut s = room(id, capacity);
        s.routes = serde_json::from_value(routes).unwrap();
        s
    };
    let app = spawn_app(vec![
        with_routes("shop", 1, json!([{"path_prefix": "/"}])),
        with_routes("presale", 1, json!([{"path_prefix": "/presale/"}])),
        with_routes(
            "partner",
            1,
            json!([{"host": "partner.localhost", "path_prefix": "/"}]),
        ),
    ])
    .await;
    let origin = spawn_origin().await;
    let proxy = Proxy::start(kind, app.base.trim_start_matches("http://"), &origin).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let queue_of = |response: &reqwest::Response| {
        assert_eq!(response.status(), StatusCode::FOUND);
        let location = response.headers()[LOCATION].to_str().unwrap();
        location
            .strip_prefix(proxy.base.as_str())
            .unwrap_or(location)
            .to_owned()
    };
    let get = |path: &str, host: Option<&str>| {
        let mut request = client.get(format!("{}{path}", proxy.base));
        if let Some(host) = host {
            request = request.header(reqwest::header::HOST, host);
        }
        request.send()
    };
    assert_eq!(
        queue_of(&get("/tickets", None).await.unwrap()),
        "/queue/shop?return=%2Ftickets"
    );
    assert_eq!(
        queue_of(&get("/presale/day-1", None).await.unwrap()),
        "/queue/presale?return=%2Fpresale%2Fday-1"
    );
    // nginx makes the queue URL absolute, on the host asked for.
    let partner = get("/presale/day-1", Some("partner.localhost"))
        .await
        .unwrap();
    assert!(
        queue_of(&partner).ends_with("/queue/partner?return=%2Fpresale%2Fday-1"),
        "{partner:?}"
    );

    // Admitted in the presale room: its pages open, the shop's do not.
    let mut visitor = Browser {
        client: &client,
        base: &proxy.base,
        cookie: None,
    };
    assert_eq!(visitor.get("/queue/presale").await.status(), StatusCode::OK);
    app.tick("presale").await;
    assert_eq!(
        visitor.visit("/presale/day-1").await,
        (StatusCode::OK, "origin page /presale/day-1".to_owned())
    );
    assert_eq!(visitor.visit("/tickets").await.0, StatusCode::FOUND);
    let waiting = |room: &str| {
        let app = &app;
        let room = room.to_owned();
        async move { app.admin_room(&room).await["admitted"].clone() }
    };
    assert_eq!(waiting("presale").await, 1);
    assert_eq!(waiting("shop").await, 0);

    drop(proxy);
    app.stop().await;
}

#[tokio::test]
async fn nginx_sends_a_shadow_network_to_a_line_that_never_admits() {
    shadow_through(Kind::Nginx).await;
}

#[tokio::test]
async fn caddy_sends_a_shadow_network_to_a_line_that_never_admits() {
    shadow_through(Kind::Caddy).await;
}

#[tokio::test]
async fn haproxy_sends_a_shadow_network_to_a_line_that_never_admits() {
    shadow_through(Kind::Haproxy).await;
}

#[tokio::test]
async fn traefik_sends_a_shadow_network_to_a_line_that_never_admits() {
    shadow_through(Kind::Traefik).await;
}

/// A `shadow` rule whose networks come from a file, behind a real proxy.
/// The file first names a network nobody here is in; rewritten to name
/// loopback (every visitor through the proxy), it applies without a
/// restart. From then on the proxy's visitors get tickets and figures
/// behind the real line and never reach the origin, the real line (three
/// visitors who joined from elsewhere) keeps its numbers and places, and
/// the bypass before the shadow rule still holds.
async fn shadow_through(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scrapers.txt");
    std::fs::write(&file, "# scrapers\n198.51.100.0/24\n").unwrap();
    let mut sale = room("sale", 1);
    sale.rules = serde_json::from_value(json!([
        {"name": "health", "action": "bypass", "path_prefix": ["/healthz"]},
        {"name": "scrapers", "action": "shadow", "network_file": file.to_str().unwrap()},
    ]))
    .unwrap();
    let app = super::rules::behind_local_proxy(vec![sale]).await;
    let origin = spawn_origin().await;
    let proxy = Proxy::start(kind, app.base.trim_start_matches("http://"), &origin).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // The real line: three visitors from elsewhere, the first let in.
    let mut real = Vec::new();
    for i in 1..=3 {
        let joined: Value = app
            .client
            .post(app.url("/api/rooms/sale/join"))
            .header("x-forwarded-for", format!("192.0.2.{i}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        real.push(joined["ticket"].as_str().unwrap().to_owned());
    }
    app.tick("sale").await;
    let statuses = || async {
        let mut all = Vec::new();
        for token in &real {
            let s: Value = app
                .client
                .get(app.url("/api/rooms/sale/status"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            all.push((
                s["status"].clone(),
                s["number"].clone(),
                s["position"].clone(),
            ));
        }
        all
    };
    let before = statuses().await;

    // Loopback into the file: the rule takes it up without a restart.
    super::rules::replace_file(&file, "# every visitor through the proxy\n127.0.0.0/8\n");
    let mut shadowed = Browser {
        client: &client,
        base: &proxy.base,
        cookie: None,
    };
    let matched = || async { app.admin_room("sale").await["rule_matches"][1]["matches"].clone() };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        assert_eq!(shadowed.visit("/tickets").await.0, StatusCode::FOUND);
        if matched().await != 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rewritten file was not taken up: {}",
            proxy.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A ticket from the queue page, through the proxy, as anyone gets.
    let (status, queue) = shadowed.visit("/tickets?seat=b2").await;
    assert_eq!(
        (status, queue.as_str()),
        (
            StatusCode::FOUND,
            "/queue/sale?return=%2Ftickets%3Fseat%3Db2"
        )
    );
    let page = shadowed.get(&queue).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("/static/queue.js"));
    assert!(
        shadowed
            .cookie
            .as_deref()
            .unwrap()
            .starts_with("narabu_sale=")
    );
    let status: Value = shadowed
        .get("/api/rooms/sale/status")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], "waiting", "{status}");
    assert!(status["position"].as_u64().unwrap() >= 3, "{status}");
    let events = shadowed.get("/api/rooms/sale/events").await;
    assert_eq!(events.status(), StatusCode::OK);
    let mut stream = events.bytes_stream().eventsource();
    let first = next_event(&mut stream, Duration::from_secs(5)).await;
    assert_eq!(first.event, "position");
    drop(stream);

    // However the real line moves, the origin never sees them; the
    // bypass ahead of the shadow rule still lets them reach its path.
    for token in &real {
        let left = app
            .client
            .post(app.url("/api/rooms/sale/leave"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(left.status(), StatusCode::NO_CONTENT);
        app.tick("sale").await;
        assert_eq!(shadowed.visit("/tickets").await.0, StatusCode::FOUND);
    }
    let status: Value = shadowed
        .get("/api/rooms/sale/status")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], "waiting", "{status}");
    assert_eq!(
        shadowed.visit("/healthz").await,
        (StatusCode::OK, "origin page /healthz".to_owned())
    );

    // The real line saw none of it: it moved only as its own visitors
    // did, and its counts know no one else.
    assert_eq!(before[0].0, "admitted");
    assert_eq!((&before[2].1, &before[2].2), (&json!(3), &json!(2)));
    let view = app.admin_room("sale").await;
    assert_eq!(
        (&view["joins"], &view["waiting"]),
        (&json!(3), &json!(0)),
        "{view}"
    );

    drop(proxy);
    app.stop().await;
}
