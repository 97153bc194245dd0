//! Placeholder: the load generator lands with issue 4.
fn main() {}
