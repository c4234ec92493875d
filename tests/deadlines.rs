//! Deadlines (issue 11 item 4, spec B §7.3): one overall request deadline across every
//! attempt and wait (`[server] request_timeout_ms`, 504 `request_timeout`); the response-head
//! budget per attempt, saying so; the hard per-attempt deadline
//! (`stream_watchdog.active_timeout_ms`), never reset by incoming bytes. Every message names
//! the budget that fired and its value.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Elapsed wall time is what these tests measure (the budgets of a real binary).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use support::*;

const CHAT: &str = "/v1/chat/completions";

/// Provider `up` with connections `c1` then `c2` (both at `mock`), `server` lines added to
/// `[server]`, and `tail` after everything.
fn config(mock: &MockUpstream, server: &str, tail: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n{server}\n\n{}{}{}{tail}\n",
        provider("up", &mock.base_url(), &["m1"]),
        connection("c1", "up"),
        connection("c2", "up"),
    )
}

fn ask_stream(addr: std::net::SocketAddr) -> (Response, Duration) {
    let mut c = Client::connect(addr);
    c.set_timeout(Duration::from_secs(30));
    let t0 = Instant::now();
    let r = c.request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"up/m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    (r, t0.elapsed())
}

#[test]
fn one_overall_deadline_bounds_every_attempt_together() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::stall_before_head());
    let gw = Gateway::start(&config(
        &mock,
        // Two 3 s head budgets would end at 6 s; the 4 s overall deadline ends the second
        // attempt 1 s in (a margin a loaded machine keeps, unlike 3 s against 2 × 2 s).
        "response_header_timeout_ms = 3000\nrequest_timeout_ms = 4000",
        "",
    ));
    let (r, took) = ask_stream(gw.addr());
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("request_timeout"));
    let e = &r.json()["error"];
    assert_eq!(e["code"], "request_timeout");
    assert_eq!(e["type"], "gateway_timeout");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("4000 ms"), "{message}");
    assert!(message.contains("server.request_timeout_ms"), "{message}");
    // Two attempts (3 s + what was left), not 2 × 3 s.
    assert!(took >= Duration::from_millis(4_000), "{took:?}");
    assert!(took < Duration::from_millis(5_500), "{took:?}");
    assert_eq!(mock.hits(CHAT), 2);
    // The second attempt's upstream request was cancelled with the deadline.
    eventually(
        Duration::from_secs(5),
        "upstream connections closed",
        || (mock.open_connections() == 0).then_some(()),
    );
    assert_eq!(
        metric(
            gw.addr(),
            "tidegate_gateway_errors_total{code=\"request_timeout\",phase=\"request\"}"
        ),
        1
    );
}

#[test]
fn the_response_head_budget_is_per_attempt_and_its_message_says_so() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::stall_before_head());
    let gw = Gateway::start(&config(
        &mock,
        "response_header_timeout_ms = 500\nrequest_timeout_ms = 0",
        "",
    ));
    let (r, took) = ask_stream(gw.addr());
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "upstream_timeout");
    assert_eq!(
        r.json()["error"]["message"],
        "no response head within 500 ms (server.response_header_timeout_ms, per attempt)"
    );
    assert_eq!(mock.hits(CHAT), 2);
    assert!(took >= Duration::from_millis(1_000), "{took:?}");
}

/// The response-head budget starts when the request has been written upstream: an upstream
/// that takes its time reading a large body spends none of it (it would have spent all of it,
/// and failed over twice, had the budget counted from the start of the write).
#[test]
fn the_response_head_budget_starts_after_the_request_is_written() {
    let mock = MockUpstream::start();
    mock.read_bodies_late(Duration::from_millis(2_500))
        .on_always(CHAT, Reply::openai_chat("read it all"));
    let gw = Gateway::start(&config(
        &mock,
        "response_header_timeout_ms = 1000\nrequest_timeout_ms = 0\n\
         max_request_body_bytes = 16777216",
        "",
    ));
    // 12 MiB: more than the gateway's send buffer and the mock's small receive buffer hold.
    let filler = "x".repeat(12 << 20);
    let body =
        format!(r#"{{"model":"up/m1","messages":[{{"role":"user","content":"{filler}"}}]}}"#);
    let mut c = Client::connect(gw.addr());
    c.set_timeout(Duration::from_secs(30));
    let t0 = Instant::now();
    let r = c.request("POST", CHAT, &[], body.as_bytes());
    let took = t0.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "read it all");
    assert_eq!(r.header("x-tidegate-attempts"), Some("1"));
    assert_eq!(mock.hits(CHAT), 1);
    let forwarded = mock.requests()[0].json();
    assert_eq!(forwarded["model"], "m1");
    assert_eq!(
        forwarded["messages"][0]["content"].as_str().map(str::len),
        Some(12 << 20)
    );
    // The write did wait for the mock's reads: longer than the head budget.
    assert!(took >= Duration::from_millis(2_500), "{took:?}");
}

#[test]
fn the_hard_attempt_deadline_fails_over_while_nothing_reached_the_client() {
    let mock = MockUpstream::start();
    // c1: a head, then a body that never comes; c2 answers at once.
    mock.on(CHAT, Reply::stall())
        .on_always(CHAT, Reply::openai_stream(&["Hi"]));
    let gw = Gateway::start(&config(
        &mock,
        "",
        "[resilience.stream_watchdog]\nstall_timeout_ms = 0\nactive_timeout_ms = 800\n",
    ));
    let (r, took) = ask_stream(gw.addr());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c2"));
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    let events = r.sse_events();
    assert_eq!(events[1].json()["choices"][0]["delta"]["content"], "Hi");
    assert_eq!(events.last().unwrap().data, "[DONE]");
    assert!(took >= Duration::from_millis(800), "{took:?}");
    assert!(took < Duration::from_millis(3_000), "{took:?}");
    assert_eq!(mock.hits(CHAT), 2);
}

#[test]
fn the_hard_attempt_deadline_ends_a_stream_that_keeps_trickling() {
    let mock = MockUpstream::start();
    // A token every 100 ms for 5 s: the stall and idle budgets never fire.
    let mut chunks = vec![Chunk::openai_delta("a")];
    for _ in 0..50 {
        chunks.push(Chunk::delay_ms(100));
        chunks.push(Chunk::openai_delta("a"));
    }
    chunks.push(Chunk::done());
    mock.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start(&config(
        &mock,
        "",
        "[resilience.stream_watchdog]\nstall_timeout_ms = 400\nactive_timeout_ms = 1000\n",
    ));
    let mut c = Client::connect(gw.addr());
    let t0 = Instant::now();
    c.start_request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"up/m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    let raw = c.read_until_close(Duration::from_secs(10));
    let took = t0.elapsed();
    assert!(!raw.ends_with(b"0\r\n\r\n"), "no clean end");
    let text = String::from_utf8_lossy(&raw).into_owned();
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(text.contains("stream_watchdog.active_timeout_ms"), "{text}");
    assert!(text.contains("1000 ms"), "{text}");
    assert!(text.contains(r#""code":"upstream_timeout""#), "{text}");
    assert!(took >= Duration::from_millis(1_000), "{took:?}");
    assert!(took < Duration::from_millis(3_000), "{took:?}");
    eventually(Duration::from_secs(5), "upstream connection closed", || {
        (mock.open_connections() == 0).then_some(())
    });
}

#[test]
fn request_timeout_is_validated() {
    let (code, _, err) = run_check(
        "[server]\nlisten = \"127.0.0.1:0\"\nrequest_timeout_ms = 99999999999\n\n\
         [[providers]]\nid = \"m\"\nformat = \"mock\"\nmodels = [\"m1\"]\n\n\
         [[connections]]\nid = \"c\"\nprovider = \"m\"\n",
    );
    assert_eq!(code, 2);
    assert!(err.contains("server.request_timeout_ms"), "{err}");
}
