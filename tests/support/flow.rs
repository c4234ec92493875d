//! Helpers of the flow-control tests: reading gauges from `/metrics` and a mock whose first
//! chat answer is held until a gate opens.

use std::net::SocketAddr;

use super::client::Client;
use super::mock_upstream::{Gate, MockUpstream, Reply};

/// The value of the unlabelled (or fully labelled) metric `name` on an open gateway.
pub fn metric(addr: SocketAddr, name: &str) -> u64 {
    let r = Client::connect(addr).request("GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Gate permits, gate waiters, request-queue entries and outbox messages, over every shard:
/// 0 when nothing is held or waiting anywhere.
pub fn flow_held(addr: SocketAddr) -> u64 {
    [
        "tidegate_gate_permits",
        "tidegate_gate_waiters",
        "tidegate_queue_requests",
        "tidegate_mesh_outbox",
    ]
    .iter()
    .map(|m| metric(addr, m))
    .sum()
}

/// A mock whose first chat completion ("first") waits for the returned gate; every later
/// one answers "later" at once.
pub fn held_then_later() -> (MockUpstream, Gate) {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("first").wait_for(&gate),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("later"));
    (mock, gate)
}
