//! The content-stall watchdog (spec B §7.1, issue 11 items 2 and 7): an event stream that
//! produces no model output within `stream_watchdog.stall_timeout_ms` fails over while
//! nothing reached the client, and after the first byte ends with an in-band error event in
//! the endpoint's shape and no chunked terminator. Only model-generated frames (text,
//! reasoning, tool) re-arm the budget; pings, comments and lifecycle events do not.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Elapsed wall time is what these tests measure (the budgets of a real binary).
#![allow(clippy::disallowed_methods)]

mod support;

use std::time::{Duration, Instant};

use support::*;

/// The stall budget of every test here.
const STALL_MS: u64 = 400;

/// Providers `a` then `b` (same model `m1`, file order), each with one connection.
fn config(format: &str, a_base: &str, b_base: Option<&str>) -> String {
    let b = match b_base {
        Some(base) => format!(
            "[[providers]]\nid = \"b\"\nformat = \"{format}\"\nbase_url = \"{base}\"\nmodels = [\"m1\"]\n\n\
             [[connections]]\nid = \"second\"\nprovider = \"b\"\n"
        ),
        None => String::new(),
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "a"
format = "{format}"
base_url = "{a_base}"
models = ["m1"]

[[connections]]
id = "first"
provider = "a"

{b}

[resilience.stream_watchdog]
stall_timeout_ms = {STALL_MS}
"#
    )
}

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";

fn start(c: &mut Client, path: &str) {
    let body = if path == MESSAGES {
        r#"{"model":"m1","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    } else {
        r#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#
    };
    c.start_request(
        "POST",
        path,
        &[("authorization", "Bearer test-key")],
        body.as_bytes(),
    );
}

/// Decodes a chunked body as received; `(content, terminated)` where `terminated` says
/// whether the zero-size last chunk arrived. Panics on a framing error.
fn dechunk(raw: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut rest = raw;
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            assert!(
                rest.is_empty(),
                "trailing bytes {:?}",
                String::from_utf8_lossy(rest)
            );
            return (out, false);
        };
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
        rest = &rest[eol + 2..];
        if size == 0 {
            assert_eq!(rest, b"\r\n");
            return (out, true);
        }
        out.extend_from_slice(&rest[..size]);
        assert_eq!(&rest[size..size + 2], b"\r\n");
        rest = &rest[size + 2..];
    }
}

/// The SSE bytes of a list of chunks (what the mock sends, frame by frame).
fn sse_text(chunks: &[&str]) -> String {
    chunks.concat()
}

fn openai_delta(text: &str) -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk",
            "created": 1700000000, "model": "mock-model",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    )
}

fn openai_role() -> String {
    format!(
        "data: {}\n\n",
        serde_json::json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk",
            "created": 1700000000, "model": "mock-model",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]})
    )
}

fn anthropic(name: &str, v: serde_json::Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

fn message_start() -> String {
    anthropic(
        "message_start",
        serde_json::json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "m1", "content": [], "usage": {"input_tokens": 3}}}),
    )
}

fn ping() -> String {
    anthropic("ping", serde_json::json!({"type": "ping"}))
}

fn block_delta(delta: serde_json::Value) -> String {
    anthropic(
        "content_block_delta",
        serde_json::json!({"type": "content_block_delta", "index": 0, "delta": delta}),
    )
}

fn raw(s: &str) -> Chunk {
    Chunk::raw(s.as_bytes())
}

#[test]
fn a_first_token_later_than_the_stall_budget_fails_over_and_nothing_of_it_reaches_the_client() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // a: a role-only delta at once (lifecycle, held back), the first token after 3 s.
    a.on_always(
        CHAT,
        Reply::sse(vec![
            raw(&openai_role()),
            Chunk::delay_ms(3_000),
            raw(&openai_delta("slow")),
            Chunk::done(),
        ]),
    );
    let fast = [
        openai_role(),
        openai_delta("Hel"),
        openai_delta("lo"),
        "data: [DONE]\n\n".to_owned(),
    ];
    b.on_always(CHAT, Reply::sse(fast.iter().map(|s| raw(s)).collect()));
    let gw = Gateway::start(&config("openai", &a.base_url(), Some(&b.base_url())));
    let mut c = Client::connect(gw.addr());
    let t0 = Instant::now();
    start(&mut c, CHAT);
    let resp = c.read_response();
    let took = t0.elapsed();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-omniroute-selected-connection-id"),
        Some("second")
    );
    assert_eq!(resp.header("x-tidegate-attempts"), Some("2"));
    // Byte for byte the fallback's stream, with a clean end; nothing of `a`.
    let want = fast.concat();
    assert_eq!(String::from_utf8(resp.body.clone()).unwrap(), want);
    assert!(resp.raw_body.ends_with(b"0\r\n\r\n"));
    assert!(took >= Duration::from_millis(STALL_MS), "{took:?}");
    assert!(
        took < Duration::from_millis(2_500),
        "failed over only after {took:?}"
    );
    // Each upstream saw the request once; the stalled attempt's connection was dropped.
    assert_eq!(a.hits(CHAT), 1);
    assert_eq!(b.hits(CHAT), 1);
    assert_eq!(a.requests_to(CHAT)[0].json()["model"], "m1");
    eventually(Duration::from_secs(5), "a's connection closed", || {
        (a.open_connections() == 0).then_some(())
    });
}

#[test]
fn a_stall_after_some_tokens_ends_with_an_in_band_error_and_an_incomplete_body() {
    let a = MockUpstream::start();
    let sent = [openai_role(), openai_delta("Hel"), openai_delta("lo")];
    let mut chunks: Vec<Chunk> = sent.iter().map(|s| raw(s)).collect();
    chunks.push(Chunk::stall());
    a.on_always(CHAT, Reply::sse(chunks));
    let gw = Gateway::start(&config("openai", &a.base_url(), None));
    let mut c = Client::connect(gw.addr());
    start(&mut c, CHAT);
    let head = c.read_head();
    assert_eq!(head.status, 200);
    let t0 = Instant::now();
    let raw_body = c.read_until_close(Duration::from_secs(10));
    let took = t0.elapsed();
    let (body, terminated) = dechunk(&raw_body);
    assert!(!terminated, "a stalled stream must not end cleanly");
    let error = serde_json::json!({"error": {
        "message": format!("stream content stall: no model output for {STALL_MS}ms"),
        "type": "stream_error",
        "code": "stream_content_stall",
    }});
    let want = format!(
        "{}data: {error}\n\n",
        sse_text(&sent.each_ref().map(String::as_str))
    );
    assert_eq!(String::from_utf8(body).unwrap(), want);
    assert!(!want.contains("[DONE]"));
    // Within the budget (counted from the last token) plus slack, not the 300 s idle budget.
    assert!(took < Duration::from_millis(STALL_MS + 5_000), "{took:?}");
    // The upstream saw one request and the gateway hung up on it.
    assert_eq!(a.hits(CHAT), 1);
    eventually(Duration::from_secs(5), "a's connection closed", || {
        (a.open_connections() == 0).then_some(())
    });
}

#[test]
fn pings_and_comments_alone_are_a_stall_and_do_not_cool_the_connection() {
    let a = MockUpstream::start();
    // Lifecycle and heartbeats every 100 ms for 2 s, never a model frame.
    let mut chunks = vec![raw(&message_start())];
    for i in 0..20 {
        chunks.push(Chunk::delay_ms(100));
        chunks.push(raw(&if i % 2 == 0 {
            ping()
        } else {
            ": keep-alive\n\n".to_owned()
        }));
    }
    chunks.push(Chunk::stall());
    a.on_always(MESSAGES, Reply::sse(chunks));
    let gw = Gateway::start(&config("anthropic", &a.base_url(), None));
    for round in 1..=2 {
        let mut c = Client::connect(gw.addr());
        let t0 = Instant::now();
        start(&mut c, MESSAGES);
        let resp = c.read_response();
        let took = t0.elapsed();
        assert_eq!(resp.status, 502, "{}", resp.text());
        assert_eq!(
            resp.header("x-tidegate-error"),
            Some("stream_content_stall")
        );
        // `/v1/messages`: Anthropic's error shape and type name (the code is in the header).
        let want = serde_json::json!({"type": "error", "error": {
            "message": format!("stream content stall: no model output within {STALL_MS}ms (lifecycle/heartbeat events only)"),
            "type": "api_error",
        }});
        assert_eq!(resp.text(), want.to_string());
        assert!(took < Duration::from_millis(1_800), "{took:?}");
        // No cooldown: the next request goes to the same connection again.
        assert_eq!(a.hits(MESSAGES), round);
    }
}

#[test]
fn pings_after_the_first_tokens_do_not_keep_an_anthropic_stream_alive() {
    let a = MockUpstream::start();
    let start_block = anthropic(
        "content_block_start",
        serde_json::json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
    );
    let sent = [
        message_start(),
        start_block,
        block_delta(serde_json::json!({"type": "text_delta", "text": "Hi"})),
    ];
    let mut chunks: Vec<Chunk> = sent.iter().map(|s| raw(s)).collect();
    let mut pings = Vec::new();
    for _ in 0..30 {
        chunks.push(Chunk::delay_ms(100));
        chunks.push(raw(&ping()));
        pings.push(ping());
    }
    chunks.push(Chunk::stall());
    a.on_always(MESSAGES, Reply::sse(chunks));
    let gw = Gateway::start(&config("anthropic", &a.base_url(), None));
    let mut c = Client::connect(gw.addr());
    start(&mut c, MESSAGES);
    let head = c.read_head();
    assert_eq!(head.status, 200);
    let t0 = Instant::now();
    let (body, terminated) = dechunk(&c.read_until_close(Duration::from_secs(10)));
    let took = t0.elapsed();
    assert!(!terminated);
    let body = String::from_utf8(body).unwrap();
    let prefix = sent.concat();
    assert!(body.starts_with(&prefix), "{body}");
    // Some pings were relayed (as they came) before the budget ran out, then the
    // Anthropic-shaped error event ends it.
    let error = serde_json::json!({"type": "error", "error": {
        "type": "api_error",
        "message": format!("stream content stall: no model output for {STALL_MS}ms"),
        "code": "stream_content_stall",
    }});
    let tail = format!("event: error\ndata: {error}\n\n");
    assert!(body.ends_with(&tail), "{body}");
    let middle = &body[prefix.len()..body.len() - tail.len()];
    let relayed_pings = middle.matches("event: ping").count();
    assert_eq!(middle, pings[..relayed_pings].concat());
    assert!((1..10).contains(&relayed_pings), "{relayed_pings} pings");
    assert!(took < Duration::from_millis(STALL_MS + 5_000), "{took:?}");
}

#[test]
fn reasoning_frames_keep_a_stream_alive_past_the_stall_budget() {
    let a = MockUpstream::start();
    // 1.5 s of reasoning (thinking, empty and signature deltas every 150 ms) against a
    // 400 ms budget, then the answer.
    let mut frames = vec![
        message_start(),
        anthropic(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "thinking", "thinking": ""}}),
        ),
    ];
    for i in 0..10 {
        frames.push(block_delta(match i % 3 {
            0 => serde_json::json!({"type": "thinking_delta", "thinking": "hmm"}),
            1 => serde_json::json!({"type": "thinking_delta", "thinking": ""}),
            _ => serde_json::json!({"type": "signature_delta", "signature": "EqQB"}),
        }));
    }
    frames.push(block_delta(
        serde_json::json!({"type": "text_delta", "text": "Answer"}),
    ));
    frames.push(anthropic(
        "message_stop",
        serde_json::json!({"type": "message_stop"}),
    ));
    let mut chunks = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        if i >= 2 {
            chunks.push(Chunk::delay_ms(150));
        }
        chunks.push(raw(f));
    }
    a.on_always(MESSAGES, Reply::sse(chunks));
    let gw = Gateway::start(&config("anthropic", &a.base_url(), None));
    let mut c = Client::connect(gw.addr());
    let t0 = Instant::now();
    start(&mut c, MESSAGES);
    let resp = c.read_response();
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert!(t0.elapsed() >= Duration::from_millis(1_500));
    assert_eq!(
        String::from_utf8(resp.body.clone()).unwrap(),
        frames.concat()
    );
    assert!(resp.raw_body.ends_with(b"0\r\n\r\n"));
    assert_eq!(a.hits(MESSAGES), 1);
}

#[test]
fn the_budget_comes_from_the_environment_and_zero_disables_it() {
    let a = MockUpstream::start();
    let frames = [
        openai_role(),
        openai_delta("late"),
        "data: [DONE]\n\n".to_owned(),
    ];
    a.on_always(
        CHAT,
        Reply::sse(vec![
            raw(&frames[0]),
            Chunk::delay_ms(900),
            raw(&frames[1]),
            raw(&frames[2]),
        ]),
    );
    let file = config("openai", &a.base_url(), None)
        .replace(&format!("stall_timeout_ms = {STALL_MS}"), "");
    let ask = |env: &str| {
        let gw = Gateway::start_with_env(&file, &[("STREAM_CONTENT_STALL_TIMEOUT_MS", env)]);
        let mut c = Client::connect(gw.addr());
        start(&mut c, CHAT);
        c.read_response()
    };
    let resp = ask("300");
    assert_eq!(resp.status, 502, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "stream_content_stall");
    assert!(resp.text().contains("within 300ms"), "{}", resp.text());
    let resp = ask("0");
    assert_eq!(resp.status, 200);
    assert_eq!(
        String::from_utf8(resp.body.clone()).unwrap(),
        frames.concat()
    );
}

#[test]
fn a_stall_cools_the_account_only_with_stream_stall_cooldown_enabled() {
    // a: a role-only delta and then nothing; b answers at once.
    let fast = [
        openai_role(),
        openai_delta("Hi"),
        "data: [DONE]\n\n".to_owned(),
    ];
    for (enabled, a_hits_after_two) in [(false, 2), (true, 1)] {
        let a = MockUpstream::start();
        let b = MockUpstream::start();
        a.on_always(CHAT, Reply::sse(vec![raw(&openai_role()), Chunk::stall()]));
        b.on_always(CHAT, Reply::sse(fast.iter().map(|s| raw(s)).collect()));
        let cfg = format!(
            "{}\n[resilience.stream_stall_cooldown]\nenabled = {enabled}\n",
            config("openai", &a.base_url(), Some(&b.base_url()))
        );
        let gw = Gateway::start(&cfg);
        for round in 1..=2 {
            let mut c = Client::connect(gw.addr());
            start(&mut c, CHAT);
            let resp = c.read_response();
            assert_eq!(resp.status, 200, "{}", resp.text());
            assert_eq!(
                resp.header("x-omniroute-selected-connection-id"),
                Some("second")
            );
            assert_eq!(String::from_utf8(resp.body.clone()).unwrap(), fast.concat());
            // The first request always tries `a` first and fails over on its stall.
            if round == 1 {
                assert_eq!(resp.header("x-tidegate-attempts"), Some("2"));
            }
        }
        // Off (the default): the stall recorded an error only, so the second request tried
        // `a` again. On: the stall cooled `a`, so the second request went straight to `b`.
        assert_eq!(a.hits(CHAT), a_hits_after_two, "enabled = {enabled}");
        assert_eq!(b.hits(CHAT), 2, "enabled = {enabled}");
    }
}
