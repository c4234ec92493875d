//! A fast standalone mock upstream for load tests (being written).
fn main() {}
