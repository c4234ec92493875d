//! Honest endings after the first byte (issue 11 item 7): an upstream that stops sending
//! without ending its stream but keeps the connection open is ended by the idle budget with
//! an in-band error naming that budget; broken chunked framing from the upstream is an
//! error at once, not silence; the Responses endpoint's in-band error is a Responses
//! `event: error`. Never a `[DONE]`, never the chunked terminator.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Elapsed wall time is what these tests measure (the budgets of a real binary).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use support::*;

const CHAT: &str = "/v1/chat/completions";
const RESPONSES: &str = "/v1/responses";

fn config(mock: &MockUpstream, server: &str, tail: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n{server}\n\n{}{}{tail}\n",
        provider("up", &mock.base_url(), &["m1"]),
        connection("c1", "up"),
    )
}

/// Decodes a chunked body as received: `(content, terminated)`.
fn dechunk(raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut rest = raw;
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(rest));
            return (out, false);
        };
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
        rest = &rest[eol + 2..];
        if size == 0 {
            return (out, true);
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn delta(text: &str) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "m1", "choices": [{"index": 0, "delta": {"content": text},
            "finish_reason": null}]})
    )
}

/// Sends a streaming request on `path` and reads until the gateway closes:
/// `(status, de-chunked body, terminated, elapsed after the head)`.
fn stream(addr: std::net::SocketAddr, path: &str) -> (u16, String, bool, Duration) {
    let mut c = Client::connect(addr);
    let body = if path == RESPONSES {
        r#"{"model":"up/m1","stream":true,"input":"hi"}"#
    } else {
        r#"{"model":"up/m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    };
    c.start_request("POST", path, &[], body.as_bytes());
    let head = c.read_head();
    let t0 = Instant::now();
    let raw = c.read_until_close(Duration::from_secs(20));
    let took = t0.elapsed();
    let (body, terminated) = dechunk(&raw);
    (
        head.status,
        String::from_utf8(body).unwrap(),
        terminated,
        took,
    )
}

#[test]
fn a_stream_without_done_on_an_open_connection_ends_within_the_idle_budget() {
    let mock = MockUpstream::start();
    let sent = [delta("Hel"), delta("lo")];
    let mut chunks: Vec<Chunk> = sent.iter().map(Chunk::raw).collect();
    chunks.push(Chunk::stall());
    mock.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start(&config(
        &mock,
        "body_idle_timeout_ms = 800",
        "[resilience.stream_watchdog]\nstall_timeout_ms = 0\n",
    ));
    let (status, body, terminated, took) = stream(gw.addr(), CHAT);
    assert_eq!(status, 200);
    assert!(!terminated, "an unfinished stream must not end cleanly");
    let error = serde_json::json!({"error": {
        "message": "upstream body idle for 800 ms (server.body_idle_timeout_ms)",
        "type": "gateway_timeout",
        "code": "upstream_timeout",
    }});
    assert_eq!(body, format!("{}data: {error}\n\n", sent.concat()));
    assert!(took < Duration::from_millis(800 + 5_000), "{took:?}");
    eventually(Duration::from_secs(5), "upstream connection closed", || {
        (mock.open_connections() == 0).then_some(())
    });
}

#[test]
fn broken_upstream_chunk_framing_ends_the_stream_at_once() {
    let mock = MockUpstream::start();
    let first = delta("Hel");
    // One good chunk, then bytes that are no chunk size line; the connection stays open.
    let wire = format!("{:x}\r\n{first}\r\nnot-a-size\r\n", first.len());
    mock.on_always(
        CHAT,
        Reply::status(200)
            .header("content-type", "text/event-stream")
            .header("transfer-encoding", "chunked")
            .body(wire),
    );
    let gw = Gateway::start(&config(
        &mock,
        "body_idle_timeout_ms = 30000",
        "[resilience.stream_watchdog]\nstall_timeout_ms = 0\n",
    ));
    let (status, body, terminated, took) = stream(gw.addr(), CHAT);
    assert_eq!(status, 200);
    assert!(!terminated);
    assert!(body.starts_with(&first), "{body}");
    let tail = &body[first.len()..];
    assert!(tail.starts_with("data: {\"error\":"), "{tail}");
    let event: serde_json::Value =
        serde_json::from_str(tail.trim().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(event["error"]["code"], "bad_upstream_response");
    assert!(!body.contains("[DONE]"));
    // At once: not after the 30 s idle budget.
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_broken_responses_stream_ends_with_a_responses_error_event() {
    let mock = MockUpstream::start();
    let created = format!(
        "event: response.created\ndata: {}\n\n",
        serde_json::json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}})
    );
    let text = format!(
        "event: response.output_text.delta\ndata: {}\n\n",
        serde_json::json!({"type": "response.output_text.delta", "item_id": "msg_1",
            "output_index": 0, "content_index": 0, "delta": "Hi"})
    );
    mock.on_always(
        RESPONSES,
        Reply::sse(vec![
            Chunk::raw(&created),
            Chunk::raw(&text),
            Chunk::stall(),
        ]),
    );
    let gw = Gateway::start(&config(
        &mock,
        "",
        "[resilience.stream_watchdog]\nstall_timeout_ms = 400\n",
    ));
    let (status, body, terminated, took) = stream(gw.addr(), RESPONSES);
    assert_eq!(status, 200);
    assert!(!terminated);
    let error = serde_json::json!({
        "type": "error",
        "code": "stream_content_stall",
        "message": "stream content stall: no model output for 400ms",
        "param": null,
    });
    assert_eq!(
        body,
        format!("{created}{text}event: error\ndata: {error}\n\n")
    );
    assert!(took < Duration::from_millis(400 + 5_000), "{took:?}");
}
