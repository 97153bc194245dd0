//! What Narabu's integration tests share, in one dev-only crate: the real
//! server on a free loopback port over either backend (`app`), real
//! `redis-server` processes (`redis_server`) and replicated sets of them
//! with Sentinel or as a Cluster (`redis_ha`), the shipped nginx, Caddy,
//! HAProxy and Traefik configurations in front of a small origin
//! (`proxy`), headless Chromium through chromedriver (`browser`), a
//! TCP relay that cuts connections on demand (`relay`), Narabu as a
//! process of its own (`process`), and an origin that slows with its
//! crowd, with a crowd to send to it (`crowd`).
//!
//! Every process a helper starts is killed when its handle drops, however
//! the test ends. `scripts/test` installs the programs (redis-server,
//! nginx, caddy, haproxy, traefik, chromium, chromium-driver) when a machine
//! lacks them.

pub mod app;
pub mod browser;
pub mod crowd;
pub mod model;
pub mod process;
pub mod proxy;
pub mod redis_ha;
pub mod redis_server;
pub mod relay;

use narabu::engine::{LaneSpec, RoomId, RoomSettings};

/// A room's settings with every default but its id and capacity.
pub fn room(id: &str, capacity: u32) -> RoomSettings {
    let mut s = RoomSettings::new(RoomId::new(id).unwrap());
    s.capacity = capacity;
    s
}

/// `s` with priority lanes (name, weight) and the default lane.
pub fn with_lanes(mut s: RoomSettings, lanes: &[(&str, u32)], default_lane: &str) -> RoomSettings {
    s.lanes = lanes
        .iter()
        .map(|&(name, weight)| LaneSpec {
            name: name.to_owned(),
            weight,
        })
        .collect();
    s.default_lane = Some(default_lane.to_owned());
    s
}

/// Polls until `check` holds, failing with `what` past `within`.
pub async fn eventually<F, Fut>(what: &str, within: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
