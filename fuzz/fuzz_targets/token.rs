//! cargo-fuzz target; the body lives in `fuzz/targets.rs`, shared with the
//! bounded run in `tests/fuzz_smoke.rs`.
#![no_main]

#[path = "../targets.rs"]
#[allow(dead_code)]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::token(data));
