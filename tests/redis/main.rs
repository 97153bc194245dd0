//! Tests of the Redis backend against a real `redis-server` each test
//! starts on a free loopback port: the conformance suite (both backends,
//! one set of bodies), several instances sharing one Redis, faults, and
//! failovers (Sentinel, Cluster replicas), and an instance's copy of a
//! room's line through late starts, lost connections and a trimmed log
//! (`follow`), and priority lanes as Redis stores them (`lanes`). The
//! owners' design: its store (`store`), owners and their log (`owner`),
//! and three instances over HTTP (`owners`); the conformance suite runs it
//! as a third backend.

mod acknowledged;
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
mod reset;
mod store;
mod wait;
