//! Helpers of the flow-control tests: reading gauges from `/metrics` and a mock whose first
//! chat answer is held until a gate opens.

use std::net::SocketAddr;
use std::time::Duration;

use super::Deadline;
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

/// Waits (up to 5 s) for the metric `name` to read `want`: a stream's usage is counted once
/// it is over — just after its last bytes leave — so a client that has read the end can
/// ask `/metrics` a moment before the count lands.
pub fn metric_becomes(addr: SocketAddr, name: &str, want: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let got = metric(addr, name);
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} is {got}, not {want}, after 5 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The gauges of what flow control holds: gate permits, gate waiters, request-queue
/// entries and outbox messages, each over every shard.
const FLOW_GAUGES: [&str; 4] = [
    "tidegate_gate_permits",
    "tidegate_gate_waiters",
    "tidegate_queue_requests",
    "tidegate_mesh_outbox",
];

/// Gate permits, gate waiters, request-queue entries and outbox messages, over every shard:
/// 0 when nothing is held or waiting anywhere.
pub fn flow_held(addr: SocketAddr) -> u64 {
    FLOW_GAUGES.iter().map(|m| metric(addr, m)).sum()
}

/// Waits until [`flow_held`] reads 0, at most `within`; panics naming each gauge's value
/// (which of permits, waiters, queue entries or outbox messages stayed).
pub fn all_flow_released(addr: SocketAddr, within: Duration) {
    let deadline = Deadline::after(within);
    while flow_held(addr) != 0 {
        if deadline.passed() {
            let gauges: Vec<String> = FLOW_GAUGES
                .iter()
                .map(|m| format!("{m} {}", metric(addr, m)))
                .collect();
            panic!(
                "not within {within:?}: every permit and slot back ({})",
                gauges.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
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
