//! The throughput watchdog (issue 11 item 3, spec B §7.2): off by default; when on, a stream
//! whose useful answer bytes over the window stay below the minimum rate is ended (in-band
//! error `stream_throughput_too_low` after the first byte), except in a protected phase
//! (reasoning or tool frames). Every field has its file key and its env variable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Elapsed wall time is what these tests measure (the budgets of a real binary).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use support::*;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn config(mock: &MockUpstream, format: &str, tail: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\n\
         [[providers]]\nid = \"up\"\nformat = \"{format}\"\nbase_url = \"{}\"\nmodels = [\"m1\"]\n\n\
         [[connections]]\nid = \"c1\"\nprovider = \"up\"\n\n\
         [resilience.stream_watchdog]\nstall_timeout_ms = 1000\n\n{tail}\n",
        mock.base_url()
    )
}

fn delta(text: &str) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "m1", "choices": [{"index": 0, "delta": {"content": text},
            "finish_reason": null}]})
    )
}

/// One byte of answer every 150 ms for 4.5 s (about 6.7 B/s), then `[DONE]`.
fn trickle() -> (Vec<Chunk>, Vec<String>) {
    let mut frames = Vec::new();
    let mut chunks = Vec::new();
    for i in 0..30 {
        if i > 0 {
            chunks.push(Chunk::delay_ms(150));
        }
        let f = delta("a");
        chunks.push(Chunk::raw(&f));
        frames.push(f);
    }
    chunks.push(Chunk::done());
    frames.push("data: [DONE]\n\n".to_owned());
    (chunks, frames)
}

/// Streams from `path`: `(body, terminated, from the request to the end, from the first
/// body bytes to the end)`.
fn stream(addr: std::net::SocketAddr, path: &str) -> (String, bool, Duration, Duration) {
    let mut c = Client::connect(addr);
    let body = if path == MESSAGES {
        r#"{"model":"m1","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    } else {
        r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    };
    let t0 = Instant::now();
    c.start_request("POST", path, &[], body.as_bytes());
    assert_eq!(c.read_head().status, 200);
    let mut body = Vec::new();
    let mut first_bytes = None;
    let terminated = loop {
        match c.next_body_piece(Duration::from_secs(20)) {
            Piece::Data(d) => {
                first_bytes.get_or_insert_with(Instant::now);
                body.extend_from_slice(&d);
            }
            Piece::End => break true,
            Piece::Closed => break false,
            Piece::Timeout => panic!("no end: {}", String::from_utf8_lossy(&body)),
        }
    };
    let since_first = first_bytes.map_or(Duration::ZERO, |t| t.elapsed());
    (
        String::from_utf8(body).unwrap(),
        terminated,
        t0.elapsed(),
        since_first,
    )
}

#[test]
fn a_slow_stream_is_ended_once_the_window_is_measured_and_env_names_set_every_field() {
    let mock = MockUpstream::start();
    let (chunks, frames) = trickle();
    mock.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start_with_env(
        &config(&mock, "openai", ""),
        &[
            ("STREAM_THROUGHPUT_WATCHDOG_ENABLED", "true"),
            ("STREAM_THROUGHPUT_WATCHDOG_WARMUP_MS", "500"),
            ("STREAM_THROUGHPUT_WATCHDOG_WINDOW_MS", "1000"),
            ("STREAM_THROUGHPUT_WATCHDOG_MIN_BYTES_PER_SECOND", "20"),
            ("STREAM_THROUGHPUT_WATCHDOG_MIN_USEFUL_BYTES", "1"),
        ],
    );
    let (body, terminated, took, since_first) = stream(gw.addr(), CHAT);
    assert!(!terminated, "an aborted stream must not end cleanly");
    assert!(!body.contains("[DONE]"), "{body}");
    // What was relayed is a prefix of the upstream's frames, then one error event.
    let cut = body.find("data: {\"error\"").expect(&body);
    let relayed = &body[..cut];
    let n = relayed.matches("data: ").count();
    assert_eq!(relayed, frames[..n].concat());
    let event: serde_json::Value =
        serde_json::from_str(body[cut..].trim().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(event["error"]["code"], "stream_throughput_too_low");
    assert_eq!(event["error"]["type"], "stream_error");
    let message = event["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("min_useful_bytes_per_second = 20"),
        "{message}"
    );
    assert!(message.contains("over the last 1000 ms"), "{message}");
    // Ready after warm-up + window: 1.5 s after the first chunk reached the gateway, so at
    // least that after the request was sent, and (allowing 300 ms for the first chunk's
    // relay to this client on a loaded machine) 1.2 s after this client got it. Counted in
    // time, not frames: the mock's 150 ms gaps stretch under load, so fewer frames than
    // the nominal 10 may fit in the window.
    assert!(took >= Duration::from_millis(1_500), "{took:?}");
    assert!(
        since_first >= Duration::from_millis(1_200),
        "{since_first:?}"
    );
    // Ended once the window was measured, not at the upstream's end: at most 20 of its 30
    // frames (nominally about 11), whatever the machine's load (a slower mock only sends
    // fewer frames by then).
    assert!((1..=20).contains(&n), "{n} frames relayed");
    eventually(Duration::from_secs(5), "upstream connection closed", || {
        (mock.open_connections() == 0).then_some(())
    });
}

#[test]
fn it_is_off_by_default() {
    let mock = MockUpstream::start();
    let (chunks, frames) = trickle();
    mock.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start(&config(&mock, "openai", ""));
    let (body, terminated, _, _) = stream(gw.addr(), CHAT);
    assert!(terminated);
    assert_eq!(body, frames.concat());
}

#[test]
fn slow_reasoning_frames_are_a_protected_phase() {
    let mock = MockUpstream::start();
    let event = |name: &str, v: serde_json::Value| format!("event: {name}\ndata: {v}\n\n");
    let mut frames = vec![
        event(
            "message_start",
            serde_json::json!({"type": "message_start", "message": {"id": "m", "type": "message",
                "role": "assistant", "model": "m1", "content": [], "usage": {"input_tokens": 3}}}),
        ),
        event(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "thinking", "thinking": ""}}),
        ),
    ];
    // 3 s of slow thinking (one byte every 150 ms) against a 20 B/s minimum.
    for _ in 0..20 {
        frames.push(event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "h"}}),
        ));
    }
    frames.push(event(
        "content_block_delta",
        serde_json::json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "text_delta", "text": "The answer is forty-two, and here is why."}}),
    ));
    frames.push(event(
        "message_stop",
        serde_json::json!({"type": "message_stop"}),
    ));
    let mut chunks = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        if i >= 2 && i < frames.len() - 1 {
            chunks.push(Chunk::delay_ms(150));
        }
        chunks.push(Chunk::raw(f));
    }
    mock.on_always(MESSAGES, Reply::sse(chunks));
    let gw = Gateway::start(&config(
        &mock,
        "anthropic",
        "[resilience.stream_recovery.throughput_watchdog]\nenabled = true\nwarmup_ms = 0\n\
         window_ms = 1000\nmin_useful_bytes_per_second = 20\nmin_useful_bytes = 1\n",
    ));
    let (body, terminated, took, _) = stream(gw.addr(), MESSAGES);
    assert!(terminated, "{body}");
    assert_eq!(body, frames.concat());
    assert!(took >= Duration::from_millis(3_000), "{took:?}");
}
