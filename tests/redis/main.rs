//! Tests of the Redis backend against a real `redis-server` each test
//! starts on a free loopback port: the conformance suite (both backends,
//! one set of bodies), several instances sharing one Redis, and faults.

mod cluster;
mod conformance;
mod instances;
mod measure;
