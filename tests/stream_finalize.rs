//! Finalize once (issue 11 item 9): however a stream ends — normally, broken by a watchdog,
//! or by the client hanging up — the usage it reported reaches `/metrics` exactly once
//! (`tidegate_usage_prompt_tokens_total`, `tidegate_usage_completion_tokens_total`), its
//! access-log line is written exactly once, and every permit comes back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn config(mock: &MockUpstream, format: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n\
         [[providers]]\nid = \"up\"\nformat = \"{format}\"\nbase_url = \"{}\"\nmodels = [\"m1\"]\n\n\
         [[connections]]\nid = \"c1\"\nprovider = \"up\"\nmax_concurrent = 4\n\n\
         [resilience.stream_watchdog]\nstall_timeout_ms = 400\n",
        mock.base_url()
    )
}

fn tokens(addr: std::net::SocketAddr) -> (u64, u64) {
    (
        metric(addr, "tidegate_usage_prompt_tokens_total"),
        metric(addr, "tidegate_usage_completion_tokens_total"),
    )
}

fn start(c: &mut Client, path: &str) {
    start_as(c, path, None);
}

/// `start` with the client's `x-request-id`, to find the request's access-log line.
fn start_as(c: &mut Client, path: &str, request_id: Option<&str>) {
    let headers: &[(&str, &str)] = match request_id {
        Some(id) => &[("x-request-id", id)],
        None => &[],
    };
    let body = if path == MESSAGES {
        r#"{"model":"m1","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    } else {
        r#"{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#
    };
    c.start_request("POST", path, headers, body.as_bytes());
}

/// How many access-log lines the gateway wrote for `request_id`.
fn access_lines(gw: &Gateway, request_id: &str) -> usize {
    let needle = format!("request_id={request_id} ");
    gw.logs()
        .lines()
        .filter(|l| l.contains("access") && l.contains(&needle))
        .count()
}

/// Waits for the request's access-log line, then for a settled gateway (every permit
/// back, one more scrape), and says how many lines it wrote.
fn access_lines_once_settled(gw: &Gateway, request_id: &str) -> usize {
    eventually(Duration::from_secs(5), "the access-log line", || {
        (access_lines(gw, request_id) > 0).then_some(())
    });
    eventually(Duration::from_secs(5), "permits back", || {
        (flow_held(gw.addr()) == 0).then_some(())
    });
    access_lines(gw, request_id)
}

/// An Anthropic stream's start (message `m`, `input` tokens in, one out; no stop reason)
/// and a text delta "Hi".
fn started_hi(input: u64) -> AnthropicEvents {
    AnthropicEvents::default()
        .event(
            json!({"type": "message_start", "message": {"id": "m", "type": "message",
            "role": "assistant", "model": "m1", "content": [],
            "usage": {"input_tokens": input, "output_tokens": 1}}}),
        )
        .delta(0, json!({"type": "text_delta", "text": "Hi"}))
}

#[test]
fn a_completed_stream_counts_its_usage_once() {
    let mock = MockUpstream::start();
    let mut chunks = openai_stream_chunks(&["Hel", "lo"]);
    let done = chunks.pop().unwrap();
    chunks.push(Chunk::json(ChatChunks::stamped("c", "m1", 1).usage(11, 2)));
    chunks.push(done);
    mock.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start(&config(&mock, "openai"));
    let addr = gw.addr();
    assert_eq!(tokens(addr), (0, 0));
    for round in 1..=2u64 {
        let mut c = Client::connect(addr);
        let id = format!("done-{round}");
        start_as(&mut c, CHAT, Some(&id));
        let r = c.read_response();
        assert_eq!(r.status, 200);
        assert!(r.text().contains("\"total_tokens\":13"), "{}", r.text());
        eventually(Duration::from_secs(5), "usage counted", || {
            (tokens(addr) == (11 * round, 2 * round)).then_some(())
        });
        assert_eq!(access_lines_once_settled(&gw, &id), 1, "{}", gw.logs());
    }
    // Released through the owner shard (a mesh message): soon after the answer, not with it.
    all_flow_released(addr, Duration::from_secs(5));
}

#[test]
fn a_stream_broken_by_the_stall_watchdog_counts_what_it_reported_once() {
    let mock = MockUpstream::start();
    let mut steps = started_hi(7).chunks();
    steps.push(Chunk::stall());
    mock.on_always(MESSAGES, Reply::sse(steps));
    let gw = Gateway::start(&config(&mock, "anthropic"));
    let addr = gw.addr();
    let mut c = Client::connect(addr);
    start_as(&mut c, MESSAGES, Some("stalled"));
    assert_eq!(c.read_head().status, 200);
    let raw = String::from_utf8_lossy(&c.read_until_close(Duration::from_secs(10))).into_owned();
    assert!(raw.contains("event: error"), "{raw}");
    assert_eq!(
        access_lines_once_settled(&gw, "stalled"),
        1,
        "{}",
        gw.logs()
    );
    eventually(Duration::from_secs(5), "usage counted", || {
        (tokens(addr) == (7, 1)).then_some(())
    });
    eventually(Duration::from_secs(5), "permits back", || {
        (flow_held(addr) == 0).then_some(())
    });
    // Still once, later.
    assert_eq!(metric(addr, "tidegate_streams_broken_total"), 1);
    assert_eq!(tokens(addr), (7, 1));
    assert_eq!(access_lines(&gw, "stalled"), 1, "{}", gw.logs());
    // A stall is recorded as one (a cut is not: see below).
    eventually(Duration::from_secs(5), "the stall recorded", || {
        let r = Client::connect(addr).request("GET", "/api/resilience/cooldowns", &[], b"");
        (r.json()["connections"][0]["lastErrorType"] == "stream_content_stall").then_some(())
    });
    assert_eq!(
        metric(
            addr,
            "tidegate_upstream_errors_total{type=\"stream_content_stall\"}"
        ),
        1
    );
}

#[test]
fn a_stream_the_client_hangs_up_on_counts_what_it_reported_once() {
    let mock = MockUpstream::start();
    let mut steps = started_hi(5)
        .event(json!({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 9}}))
        .chunks();
    // Silence with the connection open, until the client leaves.
    steps.push(Chunk::stall());
    mock.on_always(MESSAGES, Reply::sse(steps));
    let gw = Gateway::start(
        &config(&mock, "anthropic").replace("stall_timeout_ms = 400", "stall_timeout_ms = 0"),
    );
    let addr = gw.addr();
    let mut c = Client::connect(addr);
    start_as(&mut c, MESSAGES, Some("gone"));
    assert_eq!(c.read_head().status, 200);
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("message_delta") {
        match c.next_body_piece(Duration::from_secs(10)) {
            Piece::Data(d) => got.extend_from_slice(&d),
            other => panic!("{other:?}"),
        }
    }
    drop(c);
    eventually(Duration::from_secs(5), "usage counted", || {
        (tokens(addr) == (5, 9)).then_some(())
    });
    eventually(Duration::from_secs(5), "upstream cancelled", || {
        (mock.open_connections() == 0).then_some(())
    });
    assert_eq!(
        metric(
            addr,
            "tidegate_requests_abandoned_total{phase=\"streaming\"}"
        ),
        1
    );
    assert_eq!(access_lines_once_settled(&gw, "gone"), 1, "{}", gw.logs());
    assert_eq!(tokens(addr), (5, 9));
    // Released through the owner shard (a mesh message): soon after the answer, not with it.
    all_flow_released(addr, Duration::from_secs(5));
}

/// Usage is counted for every kind of answer, not only same-format streams: a whole JSON
/// answer (read from its last bytes as it is relayed), a whole answer translated from the
/// other format, and a translated stream (the upstream's own usage events) — each once.
#[test]
fn whole_answers_and_translated_streams_count_their_usage_once() {
    // Same format, not streamed: the mock's chat completion reports 3 + 2.
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = Gateway::start(&config(&mock, "openai"));
    let addr = gw.addr();
    for round in 1..=2u64 {
        let r = Client::connect(addr).request(
            "POST",
            CHAT,
            &[],
            br#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        eventually(Duration::from_secs(5), "usage counted", || {
            (tokens(addr) == (3 * round, 2 * round)).then_some(())
        });
    }
    drop(gw);

    // An OpenAI client, an Anthropic upstream: whole (3 + 2), then streamed (3 + 2 pieces).
    let mock = MockUpstream::start();
    mock.on(MESSAGES, Reply::anthropic_message("ok"));
    mock.on(MESSAGES, Reply::anthropic_stream(&["Hel", "lo"]));
    let gw = Gateway::start(&config(&mock, "anthropic"));
    let addr = gw.addr();
    let r = Client::connect(addr).request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("x-tidegate-translated").is_some(), "translated");
    eventually(Duration::from_secs(5), "whole translated usage", || {
        (tokens(addr) == (3, 2)).then_some(())
    });
    let mut c = Client::connect(addr);
    start(&mut c, CHAT);
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("lo"), "{}", r.text());
    eventually(Duration::from_secs(5), "translated stream usage", || {
        (tokens(addr) == (6, 4)).then_some(())
    });
    // Released through the owner shard (a mesh message): soon after the answer, not with it.
    all_flow_released(addr, Duration::from_secs(5));
}

/// docs/resilience.md: a stream cut after its first byte records the cut on its connection
/// (`lastErrorType` `stream_interrupted`, not a stall: nothing stalled) — an error only: no
/// breaker failure, no cooldown, no backoff step; `/metrics` counts it under the same type.
#[test]
fn a_stream_cut_after_its_first_byte_records_an_interruption_only() {
    let mock = MockUpstream::start();
    let mut chunks = openai_stream_chunks(&["Hel", "lo"]);
    chunks.truncate(3);
    chunks.push(Chunk::close());
    mock.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start(&config(&mock, "openai"));
    let addr = gw.addr();
    let mut c = Client::connect(addr);
    start_as(&mut c, CHAT, Some("cut"));
    assert_eq!(c.read_head().status, 200);
    let raw = String::from_utf8_lossy(&c.read_until_close(Duration::from_secs(10))).into_owned();
    assert!(raw.contains("\"error\""), "{raw}");
    assert_eq!(access_lines_once_settled(&gw, "cut"), 1, "{}", gw.logs());
    let state = eventually(Duration::from_secs(5), "the stall recorded", || {
        let r = Client::connect(addr).request("GET", "/api/resilience/cooldowns", &[], b"");
        let c1 = r.json()["connections"][0].clone();
        (c1["lastErrorType"] == "stream_interrupted").then_some(c1)
    });
    assert_eq!(state["id"], "c1", "{state}");
    assert_eq!(state["cooldownRemainingMs"], 0, "{state}");
    assert_eq!(state["backoffLevel"], 0, "{state}");
    assert_eq!(breaker_failures(addr), 0);
    assert_eq!(metric(addr, "tidegate_streams_broken_total"), 1);
    assert_eq!(
        metric(
            addr,
            "tidegate_upstream_errors_total{type=\"stream_interrupted\"}"
        ),
        1
    );
    // The next request is served by the same connection at once.
    let mut c = Client::connect(addr);
    start_as(&mut c, CHAT, Some("again"));
    assert_eq!(c.read_head().status, 200);
    assert_eq!(mock.hits(CHAT), 2);
}
