//! Client hang-ups after the request was sent upstream (issue 11 items 8 and 9): a client
//! that goes away while the upstream has not answered yet, or in the middle of a stream,
//! cancels the upstream request (the upstream sees its connection closed), gives back every
//! permit and slot, records no failure against the upstream, and is counted in
//! `tidegate_requests_abandoned_total{phase}`. Two shards, so the connection's gate home
//! may be another shard than the client's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::*;

const CHAT: &str = "/v1/chat/completions";

/// One connection `c1` of provider `up` with `max_concurrent = 1` (a gate permit to hand
/// back); the content-stall watchdog off, so only the 300 s body-idle budget would end a
/// silent stream.
fn config(mock: &MockUpstream) -> String {
    one_upstream(
        &mock.base_url(),
        2,
        "max_concurrent = 1",
        "[resilience.stream_watchdog]\nstall_timeout_ms = 0\n",
    )
}

fn start_stream(c: &mut Client) {
    c.start_request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"up/m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
}

fn abandoned(addr: std::net::SocketAddr, phase: &str) -> u64 {
    metric(
        addr,
        &format!("tidegate_requests_abandoned_total{{phase=\"{phase}\"}}"),
    )
}

/// Failed upstream attempts of every type.
fn upstream_errors(addr: std::net::SocketAddr) -> u64 {
    let r = Client::connect(addr).request("GET", "/metrics", &[], b"");
    r.text()
        .lines()
        .filter(|l| l.starts_with("tidegate_upstream_errors_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Nothing left held: gate permits, waiters and queue entries at 0, and no request in
/// flight but the `/metrics` scrape itself.
fn everything_released(addr: std::net::SocketAddr) -> Option<()> {
    (flow_held(addr) == 0 && metric(addr, "tidegate_requests_in_flight") == 1).then_some(())
}

/// After a hang-up the connection still serves: no cooldown, no breaker failure.
fn next_request_is_served(addr: std::net::SocketAddr, mock: &MockUpstream) {
    let mut c = Client::connect(addr);
    c.set_timeout(Duration::from_secs(30));
    let r = c.request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"again"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "fine");
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c1"));
    assert_eq!(mock.hits(CHAT), 2);
}

#[test]
fn a_client_that_hangs_up_before_the_response_head_cancels_the_upstream_request() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::stall_before_head())
        .on_always(CHAT, Reply::openai_chat("fine"));
    let gw = Gateway::start(&config(&mock));
    let addr = gw.addr();
    let mut c = Client::connect(addr);
    start_stream(&mut c);
    mock.wait_for_hits(CHAT, 1, Duration::from_secs(10));
    assert_eq!(mock.open_connections(), 1);
    assert_eq!(flow_held(addr), 1, "the request holds its gate permit");
    drop(c);
    // The upstream sees the hang-up (not after the 600 s head budget).
    eventually(
        Duration::from_secs(5),
        "the upstream connection closed",
        || (mock.open_connections() == 0).then_some(()),
    );
    eventually(Duration::from_secs(5), "the hang-up counted", || {
        (abandoned(addr, "response") == 1).then_some(())
    });
    eventually(Duration::from_secs(5), "every permit back", || {
        everything_released(addr)
    });
    assert_eq!(abandoned(addr, "streaming"), 0);
    assert_eq!(abandoned(addr, "admission"), 0);
    assert_eq!(upstream_errors(addr), 0);
    assert_eq!(mock.hits(CHAT), 1, "the request was not retried elsewhere");
    next_request_is_served(addr, &mock);
}

#[test]
fn a_client_that_hangs_up_mid_stream_cancels_the_upstream_request() {
    let mock = MockUpstream::start();
    let mut chunks = openai_stream_chunks(&["Hel"]);
    // The role chunk and one token, then silence with the connection open.
    chunks.truncate(2);
    chunks.push(Chunk::stall());
    mock.on(CHAT, Reply::sse(chunks))
        .on_always(CHAT, Reply::openai_chat("fine"));
    let gw = Gateway::start(&config(&mock));
    let addr = gw.addr();
    let mut c = Client::connect(addr);
    start_stream(&mut c);
    let head = c.read_head();
    assert_eq!(head.status, 200);
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("Hel") {
        match c.next_body_piece(Duration::from_secs(10)) {
            Piece::Data(d) => got.extend_from_slice(&d),
            other => panic!("expected the first token, got {other:?}"),
        }
    }
    assert_eq!(mock.open_connections(), 1);
    drop(c);
    eventually(
        Duration::from_secs(5),
        "the upstream connection closed",
        || (mock.open_connections() == 0).then_some(()),
    );
    eventually(Duration::from_secs(5), "the hang-up counted", || {
        (abandoned(addr, "streaming") == 1).then_some(())
    });
    eventually(Duration::from_secs(5), "every permit back", || {
        everything_released(addr)
    });
    assert_eq!(abandoned(addr, "response"), 0);
    assert_eq!(upstream_errors(addr), 0);
    assert_eq!(metric(addr, "tidegate_streams_broken_total"), 0);
    next_request_is_served(addr, &mock);
}

#[test]
fn a_client_that_hangs_up_mid_way_through_a_translated_stream_cancels_the_upstream_request() {
    // An OpenAI client served by an Anthropic-format provider: the translated relay races
    // the client going away like the plain one.
    let mock = MockUpstream::start();
    let event = |v: serde_json::Value| {
        let kind = v["type"].as_str().unwrap().to_owned();
        Chunk::event(&kind, &v.to_string())
    };
    mock.on_always(
        "/v1/messages",
        Reply::sse(vec![
            event(
                serde_json::json!({"type": "message_start", "message": {"id": "msg_h",
                "type": "message", "role": "assistant", "model": "claude-x", "content": [],
                "usage": {"input_tokens": 1}}}),
            ),
            event(
                serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ),
            event(
                serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "Hel"}}),
            ),
            Chunk::stall(),
        ]),
    );
    let gw = Gateway::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[providers]]
id = "an"
format = "anthropic"
base_url = "{}"
models = ["claude-x"]

[[connections]]
id = "an-1"
provider = "an"

[resilience.stream_watchdog]
stall_timeout_ms = 0
"#,
        mock.base_url()
    ));
    let addr = gw.addr();
    let mut c = Client::connect(addr);
    c.start_request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"an/claude-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("Hel") {
        match c.next_body_piece(Duration::from_secs(10)) {
            Piece::Data(d) => got.extend_from_slice(&d),
            other => panic!("expected the first token, got {other:?}"),
        }
    }
    assert_eq!(mock.open_connections(), 1);
    drop(c);
    // The upstream sees the hang-up (not after the 300 s body-idle budget).
    eventually(
        Duration::from_secs(5),
        "the upstream connection closed",
        || (mock.open_connections() == 0).then_some(()),
    );
    eventually(Duration::from_secs(5), "the hang-up counted", || {
        (abandoned(addr, "streaming") == 1).then_some(())
    });
    eventually(Duration::from_secs(5), "every permit back", || {
        everything_released(addr)
    });
    assert_eq!(upstream_errors(addr), 0);
    assert_eq!(metric(addr, "tidegate_streams_broken_total"), 0);
}
