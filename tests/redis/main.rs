//! Tests of the Redis backend against a real `redis-server` each test
//! starts on a free loopback port: the conformance suite (both backends,
//! one set of bodies), several instances sharing one Redis, faults, and
//! failovers (Sentinel, Cluster replicas).

mod cluster;
mod conformance;
mod failover;
mod fair;
mod instances;
mod measure;
