//! The scenarios. Each takes its parsed options and returns a
//! [`crate::report::Report`]; none prints anything but progress.

pub mod bots;
pub mod cadence;
pub mod hammered;
pub mod pages;
pub mod streams;
pub mod surge;
