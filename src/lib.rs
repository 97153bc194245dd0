//! Narabu: a fair virtual waiting room.
pub mod engine;
pub mod http;
