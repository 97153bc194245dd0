//! Narabu: a fair virtual waiting room.
pub mod access;
pub mod backend;
pub mod config;
pub mod engine;
pub mod http;
pub mod lean;
pub mod locks;
pub mod metrics;
pub mod monitor;
pub mod pass;
pub mod private_files;
pub mod push;
pub mod rules;
pub mod server;
pub mod token;
pub mod verify;
pub mod webhooks;
