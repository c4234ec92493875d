//! An upstream that sends an error event inside its stream (an OpenAI `data: {"error":…}`
//! chunk, an Anthropic `event: error`): after the first client byte the event is relayed
//! (translated into the client's shape when the provider speaks the other format) and the
//! stream ends as every broken stream does — no chunked terminator, no `[DONE]`, nothing the
//! upstream sent after the event — and the attempt is a failure classified by the event's
//! type (connection state, breaker, `tidegate_upstream_errors_total`), not a success. Before
//! the first client byte the event is an error answer with the status its type names: the
//! next candidate is tried, and the last one's event is the client's error answer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

/// One provider `up` of `format` on `mock` with the connections named in `connections`.
fn config(mock: &MockUpstream, format: &str, connections: &[&str]) -> String {
    let mut c = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n\
         [[providers]]\nid = \"up\"\nformat = \"{format}\"\nbase_url = \"{}\"\nmodels = [\"m1\"]\n\n",
        mock.base_url()
    );
    for (i, id) in connections.iter().enumerate() {
        c.push_str(&format!(
            "[[connections]]\nid = \"{id}\"\nprovider = \"up\"\npriority = {i}\n\n"
        ));
    }
    c
}

/// A streaming request on `path`: `(status, x-tidegate-attempts, body, ended)` — the body
/// de-chunked, read until it ends by its framing (`ended`) or the gateway closes.
fn stream(addr: std::net::SocketAddr, path: &str) -> (u16, Option<String>, String, bool) {
    let body = if path == MESSAGES {
        r#"{"model":"m1","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    } else {
        r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    };
    let got = read_stream(addr, path, body.as_bytes(), Duration::from_secs(10));
    let attempts = got.header("x-tidegate-attempts").map(str::to_owned);
    (got.status, attempts, got.body, got.terminated)
}

fn chat_chunk(delta: Value) -> String {
    sse_data(&ChatChunks::stamped("c", "m1", 1).chunk(delta, Value::Null))
}

/// An Anthropic stream's start (no output counted yet) and its first text, "Hel".
fn anthropic_head() -> Vec<String> {
    AnthropicEvents::default()
        .event(
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "m1", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 3, "output_tokens": 0}}}),
        )
        .open_text(0, &["Hel"])
        .sse()
}

const OVERLOADED: &str =
    r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;

#[test]
fn an_openai_error_chunk_mid_stream_ends_the_stream_broken_and_fails_the_attempt() {
    let mock = MockUpstream::start();
    let sent = [
        chat_chunk(json!({"role": "assistant", "content": ""})),
        chat_chunk(json!({"content": "Hel"})),
    ];
    let error = r#"data: {"error":{"message":"upstream failed mid-answer","type":"server_error"}}"#;
    let mut chunks: Vec<Chunk> = sent.iter().map(Chunk::raw).collect();
    // The error and a [DONE] after it, in one piece: nothing after the error is relayed.
    chunks.push(Chunk::raw(format!("{error}\n\ndata: [DONE]\n\n")));
    mock.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start(&config(&mock, "openai", &["c1"]));
    let addr = gw.addr();
    let (status, _, body, terminated) = stream(addr, CHAT);
    assert_eq!(status, 200);
    assert_eq!(body, format!("{}{error}\n\n", sent.concat()));
    assert!(
        !terminated,
        "a stream ended by an error must not end cleanly"
    );
    let c1 = connection_once(addr, "c1", "server_error");
    assert!(
        c1["errorCode"].as_u64() == Some(500) || c1["errorCode"] == "500",
        "{c1}"
    );
    assert_eq!(
        breaker_failures(addr),
        1,
        "a 5xx-class error counts on the breaker"
    );
    assert_eq!(metric(addr, "tidegate_streams_broken_total"), 1);
    assert_eq!(
        metric(
            addr,
            "tidegate_upstream_errors_total{type=\"server_error\"}"
        ),
        1
    );
}

#[test]
fn an_anthropic_error_event_mid_stream_ends_the_stream_broken_and_fails_the_attempt() {
    let mock = MockUpstream::start();
    let sent = anthropic_head();
    let error = format!("event: error\ndata: {OVERLOADED}\n\n");
    let mut chunks: Vec<Chunk> = sent.iter().map(Chunk::raw).collect();
    chunks.push(Chunk::raw(&error));
    mock.on_always(MESSAGES, Reply::sse(chunks));
    let gw = Gateway::start(&config(&mock, "anthropic", &["c1"]));
    let addr = gw.addr();
    let (status, _, body, terminated) = stream(addr, MESSAGES);
    assert_eq!(status, 200);
    assert_eq!(body, format!("{}{error}", sent.concat()));
    assert!(!terminated);
    // overloaded_error stands for a 503.
    connection_once(addr, "c1", "server_error");
    assert_eq!(breaker_failures(addr), 1);
    assert_eq!(metric(addr, "tidegate_streams_broken_total"), 1);
}

#[test]
fn a_translated_stream_whose_upstream_sends_an_error_event_ends_broken() {
    // An OpenAI client, an Anthropic-format upstream that fails after its first text.
    let mock = MockUpstream::start();
    let mut chunks: Vec<Chunk> = anthropic_head().iter().map(Chunk::raw).collect();
    chunks.push(Chunk::event("error", OVERLOADED));
    mock.on_always(MESSAGES, Reply::sse(chunks));
    let gw = Gateway::start(&config(&mock, "anthropic", &["c1"]));
    let addr = gw.addr();
    let (status, _, body, terminated) = stream(addr, CHAT);
    assert_eq!(status, 200);
    assert!(!terminated, "{body}");
    assert!(!body.contains("[DONE]"), "{body}");
    let last = body.trim_end().lines().last().unwrap();
    let event: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(event["error"]["message"], "Overloaded", "{body}");
    assert!(body.contains("Hel"), "{body}");
    connection_once(addr, "c1", "server_error");
    assert_eq!(breaker_failures(addr), 1);
    assert_eq!(metric(addr, "tidegate_streams_broken_total"), 1);
}

#[test]
fn an_error_event_before_any_output_moves_on_to_the_next_connection() {
    let mock = MockUpstream::start();
    // c1's stream: a role chunk, then a rate-limit error (the stall watchdog holds the
    // role chunk back until model output, so the client has nothing yet).
    mock.on(
        CHAT,
        Reply::sse(vec![
            Chunk::raw(chat_chunk(json!({"role": "assistant", "content": ""}))),
            Chunk::raw(
                "data: {\"error\":{\"message\":\"Rate limit reached\",\"type\":\"rate_limit_error\"}}\n\n",
            ),
            Chunk::done(),
        ]),
    );
    mock.on_always(CHAT, Reply::openai_stream(&["Hel", "lo"]));
    let gw = Gateway::start(&config(&mock, "openai", &["c1", "c2"]));
    let addr = gw.addr();
    let (status, attempts, body, terminated) = stream(addr, CHAT);
    assert_eq!(status, 200);
    assert_eq!(attempts.as_deref(), Some("2"), "{body}");
    assert!(terminated);
    assert!(!body.contains("error"), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let c1 = connection_once(addr, "c1", "rate_limited");
    assert!(c1["cooldownRemainingMs"].as_u64().unwrap() > 0, "{c1}");
    assert_eq!(mock.hits(CHAT), 2);
}

#[test]
fn the_last_candidates_error_event_before_any_output_is_its_error_answer() {
    let mock = MockUpstream::start();
    let head = anthropic_head();
    mock.on_always(
        MESSAGES,
        Reply::sse(vec![
            Chunk::raw(&head[0]),
            Chunk::raw(&head[1]),
            Chunk::event("error", OVERLOADED),
        ]),
    );
    let gw = Gateway::start(&config(&mock, "anthropic", &["c1"]));
    let addr = gw.addr();
    let (status, _, body, _) = stream(addr, MESSAGES);
    assert_eq!(status, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v, serde_json::from_str::<Value>(OVERLOADED).unwrap());
    connection_once(addr, "c1", "server_error");
}
