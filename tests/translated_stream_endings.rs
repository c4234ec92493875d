//! The stream watchdogs and honest endings on translated streams (issue 15 item 3): an
//! answer from a provider of the other format that stalls before its first model output
//! fails over (or answers 502 in the client's error shape); one that stalls, is cut, or
//! sends an error event after the first byte ends with one in-band error event in the
//! client's shape — OpenAI chat `data: {"error":…}`, Anthropic `event: error`, Responses
//! `event: error` — and never a fake end (`[DONE]`, `message_stop`,
//! `response.completed`); a stall or cut also leaves out the chunked terminator.
//!
//! Each test asserts what the client received and what the upstream saw.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const RESPONSES: &str = "/v1/responses";

/// `oa` (OpenAI format), `an` (Anthropic), `oc` (OpenAI, Chat Completions only), each
/// serving `m1` on its own mock; the stall budget `stall_ms`.
fn config(oa: &MockUpstream, an: &MockUpstream, oc: &MockUpstream, stall_ms: u64) -> String {
    let p = |id: &str, m: &MockUpstream, format: &str| {
        provider(id, &m.base_url(), &["m1"])
            .replace("format = \"openai\"", &format!("format = \"{format}\""))
    };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{}{}{}\nresponses_api = false\n\n{}\
         [resilience.stream_watchdog]\nstall_timeout_ms = {stall_ms}\n",
        p("oa", oa, "openai"),
        connection("oa-1", "oa"),
        p("an", an, "anthropic"),
        connection("an-1", "an"),
        p("oc", oc, "openai").trim_end(),
        connection("oc-1", "oc"),
    )
}

struct Started {
    oa: MockUpstream,
    an: MockUpstream,
    oc: MockUpstream,
}

impl Started {
    fn new() -> Started {
        Started {
            oa: MockUpstream::start(),
            an: MockUpstream::start(),
            oc: MockUpstream::start(),
        }
    }

    fn gateway(&self, stall_ms: u64) -> Gateway {
        Gateway::start(&config(&self.oa, &self.an, &self.oc, stall_ms))
    }
}

/// Asks on `path` and reads the answer: a chunked stream, or a whole (error) answer by its
/// length.
fn ask(gw: &Gateway, path: &str, body: Value) -> Streamed {
    read_stream(
        gw.addr(),
        path,
        body.to_string().as_bytes(),
        Duration::from_secs(20),
    )
}

fn chat_ask(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

fn messages_ask(model: &str) -> Value {
    json!({"model": model, "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]})
}

fn responses_ask(model: &str) -> Value {
    json!({"model": model, "stream": true, "input": "hi"})
}

fn a_event(v: Value) -> Chunk {
    Chunk::event(v["type"].as_str().unwrap(), &v.to_string())
}

/// An Anthropic upstream's opening: `message_start` and a ping (no model output yet).
fn anthropic_opening() -> Vec<Chunk> {
    vec![
        a_event(
            json!({"type": "message_start", "message": {"id": "msg_s", "type": "message",
            "role": "assistant", "model": "m1", "content": [], "usage": {"input_tokens": 3}}}),
        ),
        a_event(json!({"type": "ping"})),
    ]
}

/// An Anthropic upstream's opening and the text `Hel`.
fn anthropic_hel() -> Vec<Chunk> {
    let mut c = anthropic_opening();
    c.push(a_event(json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": ""}})));
    c.push(a_event(json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": "Hel"}})));
    c
}

fn o_chunk(delta: Value) -> Chunk {
    Chunk::json(
        json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
        "model": "m1", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]}),
    )
}

/// An OpenAI upstream's role chunk (no model output yet).
fn openai_opening() -> Vec<Chunk> {
    vec![o_chunk(json!({"role": "assistant", "content": ""}))]
}

/// An OpenAI upstream's role chunk and the text `Hel`.
fn openai_hel() -> Vec<Chunk> {
    let mut c = openai_opening();
    c.push(o_chunk(json!({"content": "Hel"})));
    c
}

fn with(mut steps: Vec<Chunk>, last: Chunk) -> Reply {
    steps.push(last);
    Reply::sse(steps)
}

/// No fake end of the client's format anywhere in `body`.
fn no_fake_end(body: &str) {
    for end in [
        "[DONE]",
        "message_stop",
        "response.completed",
        "finish_reason\":\"stop",
    ] {
        assert!(!body.contains(end), "{end} in {body}");
    }
}

/// The last event is the chat in-band error with `code`; returns its `error`.
fn chat_error_last(got: &Streamed, code: Option<&str>) -> Value {
    let events = got.events();
    let last = events.last().unwrap();
    assert_eq!(last.event, None, "{}", got.body);
    let v = last.json();
    let e = v["error"].clone();
    assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
    if let Some(code) = code {
        assert_eq!(e["code"], code, "{v}");
    }
    e
}

/// The last event is Anthropic's `event: error` with `code` (a gateway error) or `type`.
fn messages_error_last(got: &Streamed, code: Option<&str>) -> Value {
    let events = got.events();
    let last = events.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"), "{}", got.body);
    let v = last.json();
    assert_eq!(v["type"], "error", "{v}");
    assert!(
        v["error"]["type"].is_string() && v["error"]["message"].is_string(),
        "{v}"
    );
    if let Some(code) = code {
        assert_eq!(v["error"]["code"], code, "{v}");
    }
    v["error"].clone()
}

/// The last event is the Responses `event: error` with `code`.
fn responses_error_last(got: &Streamed, code: &str) {
    let events = got.events();
    let last = events.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"), "{}", got.body);
    let v = last.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["message"].is_string(), "{v}");
}

// --- the content-stall watchdog before the first byte -------------------------------------

#[test]
fn a_translated_stream_stalling_before_its_first_output_fails_over_to_the_next_provider() {
    let s = Started::new();
    // m1 bare: oa (translated for the Messages client) first; it sends its role chunk and
    // stalls; an (the client's format) answers.
    s.oa.on_always(CHAT, with(openai_opening(), Chunk::stall()));
    let an_chunks = anthropic_stream_chunks(&["Hello", " there"]);
    s.an.on_always(MESSAGES, Reply::sse(an_chunks));
    let gw = s.gateway(400);
    let got = ask(&gw, MESSAGES, messages_ask("m1"));
    assert_eq!(got.status, 200);
    assert_eq!(got.head.header("x-tidegate-provider"), Some("an"));
    assert_eq!(got.head.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(got.head.header("x-tidegate-translated"), None);
    // Nothing of oa's reached the client: its held-back opening was dropped.
    let names: Vec<_> = got.events().into_iter().map(|e| e.event.unwrap()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert!(!got.body.contains("chatcmpl-s"), "{}", got.body);
    assert!(got.terminated);
    // oa was asked in its own format, and saw the gateway go away.
    let to_oa = s.oa.requests_to(CHAT);
    assert_eq!(to_oa.len(), 1);
    assert_eq!(to_oa[0].json()["stream_options"]["include_usage"], true);
    assert_eq!(s.an.hits(MESSAGES), 1);
    s.oa.wait_until(Duration::from_secs(5), "oa's connection closed", |m| {
        m.open_connections() == 0
    });
}

#[test]
fn a_translated_stream_stalling_before_its_first_output_answers_502_in_the_clients_shape() {
    let s = Started::new();
    s.an.on_always(MESSAGES, with(anthropic_opening(), Chunk::stall()));
    s.oa.on_always(CHAT, with(openai_opening(), Chunk::stall()));
    s.oc.on_always(CHAT, with(openai_opening(), Chunk::stall()));
    let gw = s.gateway(300);
    // A chat client, an Anthropic upstream: OpenAI's error body.
    let got = ask(&gw, CHAT, chat_ask("an/m1"));
    assert_eq!(got.status, 502, "{}", got.body);
    assert_eq!(
        got.head.header("x-tidegate-error"),
        Some("stream_content_stall")
    );
    let v: Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(v["error"]["code"], "stream_content_stall", "{v}");
    assert_eq!(v["error"]["type"], "stream_error", "{v}");
    assert_eq!(s.an.requests_to(MESSAGES)[0].json()["max_tokens"], 4096);
    // A Messages client, an OpenAI upstream: Anthropic's error body.
    let got = ask(&gw, MESSAGES, messages_ask("oa/m1"));
    assert_eq!(got.status, 502, "{}", got.body);
    let v: Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream content stall"),
        "{v}"
    );
    assert_eq!(s.oa.hits(CHAT), 1);
    // A Responses client, a Chat-Completions-only upstream: OpenAI's error body.
    let got = ask(&gw, RESPONSES, responses_ask("oc/m1"));
    assert_eq!(got.status, 502, "{}", got.body);
    let v: Value = serde_json::from_str(&got.body).unwrap();
    assert_eq!(v["error"]["code"], "stream_content_stall", "{v}");
    assert_eq!(
        s.oc.requests_to(CHAT)[0].json()["messages"][0]["content"],
        "hi"
    );
}

// --- after the first byte: a stall ---------------------------------------------------------

#[test]
fn a_translated_stream_stalling_after_its_first_byte_ends_with_the_clients_in_band_error() {
    let s = Started::new();
    s.oa.on_always(CHAT, with(openai_hel(), Chunk::stall()));
    s.an.on_always(MESSAGES, with(anthropic_hel(), Chunk::stall()));
    s.oc.on_always(CHAT, with(openai_hel(), Chunk::stall()));
    let gw = s.gateway(300);

    // Anthropic client ← OpenAI upstream.
    let got = ask(&gw, MESSAGES, messages_ask("oa/m1"));
    assert_eq!(got.status, 200);
    assert_eq!(
        got.head.header("x-tidegate-translated"),
        Some("anthropic-messages->openai-chat")
    );
    let events = got.events();
    assert_eq!(events[0].event.as_deref(), Some("message_start"));
    assert_eq!(events[2].json()["delta"]["text"], "Hel");
    messages_error_last(&got, Some("stream_content_stall"));
    no_fake_end(&got.body);
    assert!(!got.terminated, "a stalled stream must not end cleanly");

    // Responses client ← Anthropic upstream.
    let got = ask(&gw, RESPONSES, responses_ask("an/m1"));
    assert_eq!(got.status, 200);
    assert!(got.body.contains("\"delta\":\"Hel\""), "{}", got.body);
    responses_error_last(&got, "stream_content_stall");
    no_fake_end(&got.body);
    assert!(!got.terminated);

    // Responses client ← Chat-Completions-only upstream.
    let got = ask(&gw, RESPONSES, responses_ask("oc/m1"));
    assert_eq!(got.status, 200);
    assert!(got.body.contains("\"delta\":\"Hel\""), "{}", got.body);
    responses_error_last(&got, "stream_content_stall");
    no_fake_end(&got.body);
    assert!(!got.terminated);

    // Each upstream was asked once, in its own format, and saw the gateway go away.
    assert_eq!(s.oa.requests_to(CHAT)[0].json()["max_tokens"], 50);
    assert_eq!(
        s.an.requests_to(MESSAGES)[0].json()["messages"][0]["content"],
        "hi"
    );
    assert_eq!(s.oc.hits(CHAT), 1);
    for m in [&s.oa, &s.an, &s.oc] {
        m.wait_until(Duration::from_secs(5), "connection closed", |m| {
            m.open_connections() == 0
        });
    }
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 3);
}

// --- after the first byte: a cut -----------------------------------------------------------

#[test]
fn a_translated_stream_cut_after_its_first_byte_ends_with_the_clients_in_band_error() {
    let s = Started::new();
    s.an.on_always(MESSAGES, with(anthropic_hel(), Chunk::close()));
    s.oa.on_always(CHAT, with(openai_hel(), Chunk::reset()));
    // A clean end of the body before the finish: broken all the same.
    s.oc.on_always(CHAT, Reply::sse(openai_hel()));
    let gw = s.gateway(5_000);

    // OpenAI chat client ← Anthropic upstream, connection closed mid-body.
    let got = ask(&gw, CHAT, chat_ask("an/m1"));
    assert_eq!(got.status, 200);
    let events = got.events();
    assert_eq!(events[0].json()["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[1].json()["choices"][0]["delta"]["content"], "Hel");
    assert_eq!(events.len(), 3, "{}", got.body);
    chat_error_last(&got, None);
    no_fake_end(&got.body);
    assert!(!got.terminated);

    // Anthropic client ← OpenAI upstream, connection reset mid-body.
    let got = ask(&gw, MESSAGES, messages_ask("oa/m1"));
    assert_eq!(got.status, 200);
    assert_eq!(got.events()[2].json()["delta"]["text"], "Hel");
    messages_error_last(&got, None);
    no_fake_end(&got.body);
    assert!(!got.terminated);

    // Anthropic client ← OpenAI upstream whose body ends before its finish_reason.
    let got = ask(&gw, MESSAGES, messages_ask("oc/m1"));
    assert_eq!(got.status, 200);
    let e = messages_error_last(&got, None);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("before its finish_reason"),
        "{e}"
    );
    no_fake_end(&got.body);
    assert!(!got.terminated);

    assert_eq!(s.an.hits(MESSAGES), 1);
    assert_eq!(s.oa.hits(CHAT), 1);
    assert_eq!(s.oc.hits(CHAT), 1);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 3);
}

// --- an error event from the upstream ------------------------------------------------------

#[test]
fn an_upstream_error_event_reaches_the_client_in_its_own_shape_without_a_fake_end() {
    let s = Started::new();
    s.an.on_always(
        MESSAGES,
        with(
            anthropic_hel(),
            a_event(
                json!({"type": "error", "error": {"type": "overloaded_error",
                "message": "Overloaded"}}),
            ),
        ),
    );
    s.oa.on_always(
        CHAT,
        with(
            openai_hel(),
            Chunk::json(json!({"error": {"message": "boom", "type": "server_error"}})),
        ),
    );
    let gw = s.gateway(5_000);

    // Anthropic `event: error` → the chat client's `data: {"error":…}`.
    let got = ask(&gw, CHAT, chat_ask("an/m1"));
    assert_eq!(got.status, 200);
    let e = chat_error_last(&got, Some("overloaded_error"));
    assert_eq!(
        e,
        json!({"message": "Overloaded", "type": "server_error", "code": "overloaded_error"})
    );
    assert_eq!(got.events().len(), 3, "{}", got.body);
    no_fake_end(&got.body);

    // OpenAI `{"error":…}` chunk → the Messages client's `event: error`.
    let got = ask(&gw, MESSAGES, messages_ask("oa/m1"));
    assert_eq!(got.status, 200);
    let e = messages_error_last(&got, None);
    assert_eq!(e, json!({"type": "api_error", "message": "boom"}));
    no_fake_end(&got.body);

    // The first request's error event failed its attempt (an overloaded 503 cools the
    // connection): cleared, so the next one reaches the upstream.
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/api/resilience/cooldowns",
        &[],
        br#"{"all":true}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The same Anthropic error event → the Responses client's `event: error`.
    let got = ask(&gw, RESPONSES, responses_ask("an/m1"));
    assert_eq!(got.status, 200);
    let last = got.events().pop().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"), "{}", got.body);
    assert_eq!(last.json()["type"], "error");
    assert!(got.body.contains("Overloaded"), "{}", got.body);
    no_fake_end(&got.body);

    assert_eq!(s.an.hits(MESSAGES), 2);
    assert_eq!(s.oa.hits(CHAT), 1);
}

// --- after the first byte: the throughput watchdog and the active budget -------------------

/// An upstream's opening, then `n` one-letter text deltas `gap_ms` apart, then its end —
/// in the upstream's own format.
fn trickle(anthropic: bool, n: usize, gap_ms: u64) -> Reply {
    let mut steps = if anthropic {
        anthropic_hel()
    } else {
        openai_hel()
    };
    for _ in 0..n {
        steps.push(Chunk::delay_ms(gap_ms));
        steps.push(if anthropic {
            a_event(json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "a"}}))
        } else {
            o_chunk(json!({"content": "a"}))
        });
    }
    if anthropic {
        steps.push(a_event(json!({"type": "content_block_stop", "index": 0})));
        steps.push(a_event(json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}})));
        steps.push(a_event(json!({"type": "message_stop"})));
    } else {
        steps.push(Chunk::json(
            json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
            "model": "m1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ));
        steps.push(Chunk::done());
    }
    Reply::sse(steps)
}

/// The throughput watchdog judges a translated stream by the upstream's own answer bytes:
/// one that trickles after its first byte ends with the in-band error in the client's
/// shape, code `stream_throughput_too_low`, and no fake end.
#[test]
fn a_translated_stream_too_slow_after_its_first_byte_ends_with_the_clients_in_band_error() {
    let s = Started::new();
    s.an.on_always(MESSAGES, trickle(true, 30, 150));
    s.oa.on_always(CHAT, trickle(false, 30, 150));
    let gw = Gateway::start_with_env(
        &config(&s.oa, &s.an, &s.oc, 2_000),
        &[
            ("STREAM_THROUGHPUT_WATCHDOG_ENABLED", "true"),
            ("STREAM_THROUGHPUT_WATCHDOG_WARMUP_MS", "300"),
            ("STREAM_THROUGHPUT_WATCHDOG_WINDOW_MS", "1000"),
            ("STREAM_THROUGHPUT_WATCHDOG_MIN_BYTES_PER_SECOND", "50"),
        ],
    );

    // OpenAI client ← Anthropic upstream.
    let got = ask(&gw, CHAT, chat_ask("an/m1"));
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(
        got.head.header("x-tidegate-translated"),
        Some("openai-chat->anthropic-messages")
    );
    assert_eq!(
        got.events()[1].json()["choices"][0]["delta"]["content"],
        "Hel"
    );
    chat_error_last(&got, Some("stream_throughput_too_low"));
    no_fake_end(&got.body);
    assert!(!got.terminated);

    // Anthropic client ← OpenAI upstream.
    let got = ask(&gw, MESSAGES, messages_ask("oa/m1"));
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.body.contains("\"text\":\"Hel\""), "{}", got.body);
    messages_error_last(&got, Some("stream_throughput_too_low"));
    no_fake_end(&got.body);
    assert!(!got.terminated);
}

/// The active budget (a hard per-attempt deadline) ends a translated stream that keeps
/// flowing past it with the in-band error in the client's shape, naming the budget.
#[test]
fn a_translated_stream_past_its_active_budget_ends_with_the_clients_in_band_error() {
    let s = Started::new();
    s.an.on_always(MESSAGES, trickle(true, 40, 100));
    s.oc.on_always(CHAT, trickle(false, 40, 100));
    let cfg = config(&s.oa, &s.an, &s.oc, 1_000).replace(
        "stall_timeout_ms = 1000",
        "stall_timeout_ms = 1000\nactive_timeout_ms = 1000",
    );
    let gw = Gateway::start(&cfg);

    // OpenAI client ← Anthropic upstream.
    let got = ask(&gw, CHAT, chat_ask("an/m1"));
    assert_eq!(got.status, 200, "{}", got.body);
    let e = chat_error_last(&got, Some("upstream_timeout"));
    assert!(
        e["message"].as_str().unwrap().contains("active_timeout_ms"),
        "{e}"
    );
    no_fake_end(&got.body);
    assert!(!got.terminated);

    // Responses client ← Chat-Completions-only upstream.
    let got = ask(&gw, RESPONSES, responses_ask("oc/m1"));
    assert_eq!(got.status, 200, "{}", got.body);
    assert!(got.body.contains("\"delta\":\"Hel\""), "{}", got.body);
    responses_error_last(&got, "upstream_timeout");
    no_fake_end(&got.body);
    assert!(!got.terminated);
}
