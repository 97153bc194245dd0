//! Tests of the Redis backend against a real `redis-server` each test
//! starts on a free loopback port: the conformance suite (both backends,
//! one set of bodies), several instances sharing one Redis, faults, and
//! failovers (Sentinel, Cluster replicas), and an instance's copy of a
//! room's line through late starts, lost connections and a trimmed log
//! (`follow`), and priority lanes as Redis stores them (`lanes`). Rooms
//! run by their owners: the store (`store`), owners and their log
//! (`owner`), three instances over HTTP (`owners`), presence from held
//! streams through an owner change (`presence`), and the model test on
//! both deployments (`model`).

mod acknowledged;
mod autotune;
mod cluster;
mod conformance;
mod double_owner;
mod failover;
mod fair;
mod follow;
mod instances;
mod lanes;
mod measure;
mod model;
mod owner;
mod owners;
mod presence;
mod reset;
mod store;
mod wait;
