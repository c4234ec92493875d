//! Mid-stream continuation (issue 11 item 6, spec B §7.3, `stream_recovery.
//! continue_mid_stream`): a stream cut or stalled after its first client byte is continued
//! by the next candidate, asked with the delivered text as an assistant prefill; its answer
//! is spliced in without repeated text (an overlap of at least 8 characters is skipped). A
//! target that refuses the prefill gets the original request again and is used only if it
//! repeats the delivered text exactly. The usage block covers the whole answer. A part
//! served by a provider of the other format (translated) may be cut or go on like any
//! other (issue 15 item 3). The prefill refusal and its replay work for an Anthropic-format
//! target on `/v1/messages` and for a target of the other format (translated) too.
//!
//! Every test asserts the client's body byte for byte (de-chunked) and what the upstreams
//! saw.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const ASK: &str = r#"{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"count"}]}"#;

/// The mock's own chunks (`openai_stream_chunks`' id, model and time).
fn mock_chunks() -> ChatChunks {
    ChatChunks::stamped("chatcmpl-mock", "mock-model", 1_700_000_000)
}

/// An OpenAI chunk as `openai_stream_chunks` writes it.
fn a_delta(text: &str) -> String {
    sse_data(&mock_chunks().text(text))
}

fn a_role() -> String {
    sse_data(&mock_chunks().role())
}

/// A chunk with the id and object type only (b's, and what the client gets once b's
/// part is spliced in).
fn b_text(id: &str, text: &str) -> String {
    sse_data(&ChatChunks::new(id).text(text))
}

fn b_role(id: &str) -> String {
    sse_data(&ChatChunks::new(id).role())
}

fn b_stop(id: &str) -> String {
    sse_data(&ChatChunks::new(id).finish("stop"))
}

fn b_usage(id: &str, prompt: u64, completion: u64) -> String {
    sse_data(&ChatChunks::new(id).usage(prompt, completion))
}

/// Asks on `path` and reads the answer (chunked): `(status, de-chunked body, terminated,
/// all of it with its timing)`. A complete answer is read by its framing; a broken one
/// until the gateway closes.
fn ask(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, String, bool, Streamed) {
    let got = read_stream(addr, path, body.as_bytes(), Duration::from_secs(20));
    assert_eq!(got.header("transfer-encoding"), Some("chunked"));
    (got.status, got.body.clone(), got.terminated, got)
}

/// Starts the gateway in front of `a` and `b` (continuation on, a content-stall budget of
/// `stall_ms`), asks `body` on `path` and checks the answer is a 200 stream. Returns the
/// gateway, the de-chunked body, whether it ended cleanly and all of it with its timing.
fn continued(
    a: (&MockUpstream, &str),
    b: (&MockUpstream, &str),
    stall_ms: u64,
    path: &str,
    body: &str,
) -> (Gateway, String, bool, Streamed) {
    let gw = Gateway::start(&two_providers(a, b, &continuation_on(stall_ms)));
    let (status, body, terminated, got) = ask(gw.addr(), path, body);
    assert_eq!(status, 200);
    (gw, body, terminated, got)
}

/// The stall is cut at its budget and the next target's part follows within a second:
/// the whole answer took at least `stall_ms`, and the client waited less than `stall_ms` +
/// 1 s between the last byte of a's part and the first of b's (timed there, not over the
/// whole request, whose other steps take longer on a loaded machine).
fn assert_continued_in_time(got: &Streamed, a_part_len: usize, stall_ms: u64) {
    let took = got.took;
    assert!(took >= Duration::from_millis(stall_ms), "{took:?}");
    let pause = got.pause_before(a_part_len);
    assert!(
        pause < Duration::from_millis(stall_ms + 1_000),
        "{pause:?} between a's part and b's ({took:?} in all)"
    );
}

/// The content of every OpenAI delta in `body`, concatenated, and how many `[DONE]`s.
fn content(body: &str) -> (String, usize) {
    let mut text = String::new();
    let mut done = 0;
    for line in body.lines() {
        let Some(d) = line.strip_prefix("data: ") else {
            continue;
        };
        if d == "[DONE]" {
            done += 1;
        } else if let Ok(v) = serde_json::from_str::<Value>(d)
            && let Some(t) = v
                .pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        {
            text.push_str(t);
        }
    }
    (text, done)
}

/// `a`: a role chunk and 25 words, then the connection is cut.
fn cut_after_25(a: &MockUpstream) -> (String, String) {
    let mut chunks = vec![a_role()];
    chunks.extend(words(0..25).iter().map(|w| a_delta(w)));
    let sent = script(a, CHAT, &chunks, Some(Chunk::close()));
    (sent, words(0..25).concat())
}

#[test]
fn a_cut_after_25_tokens_is_continued_by_the_next_target_without_repeated_text() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, delivered) = cut_after_25(&a);
    // b: a role chunk, repeats the last two words (14 characters), goes on, ends with usage.
    let mut b_chunks = vec![b_role("b-1")];
    b_chunks.extend(
        ["word23 ", "word24 ", "word25 ", "word26 ", "and done."].map(|t| b_text("b-1", t)),
    );
    b_chunks.push(b_stop("b-1"));
    b_chunks.push(b_usage("b-1", 40, 5));
    b_chunks.push(SSE_DONE.to_owned());
    b.on_always(CHAT, Reply::sse(raw(&b_chunks)));
    let (gw, body, terminated, _) = continued((&a, "openai"), (&b, "openai"), 5_000, CHAT, ASK);
    // Byte for byte: a's stream as it came, then b's without its role chunk and the two
    // repeated words, chunk ids a's, usage for the whole answer (prompt 40 − the 25 prefill
    // tokens, completion 25 + 5).
    let mut want = a_sent.clone();
    for t in ["word25 ", "word26 ", "and done."] {
        want.push_str(&b_text("chatcmpl-mock", t));
    }
    want.push_str(&b_stop("chatcmpl-mock"));
    want.push_str(&b_usage("chatcmpl-mock", 15, 30));
    want.push_str(SSE_DONE);
    assert_eq!(body, want);
    assert!(terminated, "a continued stream ends cleanly");
    let (text, done) = content(&body);
    assert_eq!(text, format!("{delivered}word25 word26 and done."));
    assert_eq!(done, 1);
    // b was asked to continue: the original request with the delivered text as a trailing
    // assistant message.
    let seen = b.requests_to(CHAT);
    assert_eq!(seen.len(), 1);
    let mut expected: Value = serde_json::from_str(ASK).unwrap();
    expected["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": delivered}));
    assert_eq!(seen[0].json(), expected);
    assert_eq!(a.hits(CHAT), 1);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
    // The token counters take the client's usage block, once.
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 15);
    metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 30);
}

#[test]
fn with_continuation_off_the_same_cut_ends_with_the_in_band_error() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, _) = cut_after_25(&a);
    b.on_always(CHAT, Reply::openai_stream(&["never"]));
    let gw = Gateway::start(&two_providers(
        (&a, "openai"),
        (&b, "openai"),
        "[resilience.stream_watchdog]\nstall_timeout_ms = 5000\n",
    ));
    let (status, body, terminated, _) = ask(gw.addr(), CHAT, ASK);
    assert_eq!(status, 200);
    // a's 25 words, then one in-band error event; no [DONE], no chunked terminator.
    let rest = body
        .strip_prefix(&a_sent)
        .unwrap_or_else(|| panic!("{body}"));
    assert!(rest.starts_with("data: {\"error\":"), "{rest}");
    assert!(
        rest.ends_with("\n\n") && rest.matches("data: ").count() == 1,
        "{rest}"
    );
    assert!(!body.contains("[DONE]"));
    assert!(!terminated);
    assert_eq!(b.hits(CHAT), 0);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 1);
}

#[test]
fn a_target_refusing_the_prefill_is_asked_again_and_its_repeated_prefix_is_skipped() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, delivered) = cut_after_25(&a);
    // b refuses the prefill, then answers the original request from the start.
    let mut b_chunks = vec![b_role("b-2")];
    // Split differently from a's pieces: the repeated prefix is matched as text.
    let mut all = delivered.clone();
    all.push_str("the end.");
    let (p1, p2) = all.split_at(100);
    let (p2, p3) = p2.split_at(p2.len() - 10);
    b_chunks.extend([p1, p2, p3].map(|t| b_text("b-2", t)));
    b_chunks.push(b_stop("b-2"));
    b_chunks.push(b_usage("b-2", 12, 27));
    b_chunks.push(SSE_DONE.to_owned());
    b.on(
        CHAT,
        Reply::error(
            400,
            "This model does not support assistant message prefill.",
        ),
    )
    .on_always(CHAT, Reply::sse(raw(&b_chunks)));
    let (_gw, body, terminated, _) = continued((&a, "openai"), (&b, "openai"), 5_000, CHAT, ASK);
    // Only what follows the delivered text is new: the last piece's tail; the prompt is the
    // replay's (the original request), the completion the replay's (it covers the prefix).
    let tail = &p3[p3.len() - "the end.".len()..];
    let mut want = a_sent.clone();
    want.push_str(&b_text("chatcmpl-mock", tail));
    want.push_str(&b_stop("chatcmpl-mock"));
    want.push_str(&b_usage("chatcmpl-mock", 12, 27));
    want.push_str(SSE_DONE);
    assert_eq!(body, want);
    assert!(terminated);
    assert_eq!(content(&body), (all.clone(), 1));
    let seen = b.requests_to(CHAT);
    assert_eq!(seen.len(), 2);
    let last = last_of(&seen[0].json());
    assert_eq!(last, json!({"role": "assistant", "content": delivered}));
    assert_eq!(seen[1].text(), ASK, "the replay is the original request");
}

#[test]
fn a_replay_that_does_not_repeat_the_delivered_text_ends_with_the_in_band_error() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, _) = cut_after_25(&a);
    b.on(
        CHAT,
        Reply::error(
            400,
            "This model does not support assistant message prefill.",
        ),
    )
    .on_always(
        CHAT,
        Reply::openai_stream(&["word0 ", "word1 ", "different"]),
    );
    let (_gw, body, terminated, _) = continued((&a, "openai"), (&b, "openai"), 5_000, CHAT, ASK);
    let rest = body
        .strip_prefix(&a_sent)
        .unwrap_or_else(|| panic!("{body}"));
    assert!(rest.starts_with("data: {\"error\":"), "{rest}");
    assert!(rest.contains("continuation"), "{rest}");
    assert_eq!(rest.matches("data: ").count(), 1, "{rest}");
    assert!(!terminated);
    assert_eq!(b.hits(CHAT), 2);
}

#[test]
fn a_stall_after_10_tokens_is_continued_within_the_stall_budget_plus_one_second() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let mut chunks = vec![a_role()];
    chunks.extend(words(0..10).iter().map(|w| a_delta(w)));
    let a_sent = script(&a, CHAT, &chunks, Some(Chunk::stall()));
    // b goes on without repeating anything.
    let mut b_chunks: Vec<String> = ["word10 ", "end."].map(|t| b_text("b-3", t)).to_vec();
    b_chunks.push(b_stop("b-3"));
    b_chunks.push(SSE_DONE.to_owned());
    b.on_always(CHAT, Reply::sse(raw(&b_chunks)));
    let stall_ms = 1_000;
    let (_gw, body, terminated, got) =
        continued((&a, "openai"), (&b, "openai"), stall_ms, CHAT, ASK);
    let a_part_len = a_sent.len();
    let mut want = a_sent;
    want.push_str(&b_text("chatcmpl-mock", "word10 "));
    want.push_str(&b_text("chatcmpl-mock", "end."));
    want.push_str(&b_stop("chatcmpl-mock"));
    want.push_str(SSE_DONE);
    assert_eq!(body, want);
    assert!(terminated);
    assert_continued_in_time(&got, a_part_len, stall_ms);
    let (last, _) = last_message(&b, CHAT);
    assert_eq!(
        last,
        json!({"role": "assistant", "content": words(0..10).concat()})
    );
    // The stalled upstream sees the gateway go away.
    a.wait_until(Duration::from_secs(5), "a's connection closed", |m| {
        m.open_connections() == 0
    });
}

#[test]
fn an_anthropic_stream_cut_mid_answer_is_continued_in_the_same_text_block() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // a: message_start, one text block, 12 words with a trailing space, cut.
    let a_chunks = anthropic_start("msg_a", 21, &words(0..12));
    let a_sent = script(&a, MESSAGES, &a_chunks, Some(Chunk::close()));
    // b continues after the prefill (sent without the trailing space): its own start, a
    // ping, its block 0 starting with the space, stop, usage.
    let ev = |name: &str, body: &str| format!("event: {name}\ndata: {body}\n\n");
    let b_chunks = vec![
        ev(
            "message_start",
            r#"{"message":{"content":[],"id":"msg_b","model":"m1","role":"assistant","type":"message","usage":{"input_tokens":45,"output_tokens":1}},"type":"message_start"}"#,
        ),
        ev("ping", r#"{"type":"ping"}"#),
        ev(
            "content_block_start",
            r#"{"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}"#,
        ),
        ev(
            "content_block_delta",
            r#"{"delta":{"text":" word12","type":"text_delta"},"index":0,"type":"content_block_delta"}"#,
        ),
        ev(
            "content_block_delta",
            r#"{"delta":{"text":" fin.","type":"text_delta"},"index":0,"type":"content_block_delta"}"#,
        ),
        ev(
            "content_block_stop",
            r#"{"index":0,"type":"content_block_stop"}"#,
        ),
        ev(
            "message_delta",
            r#"{"delta":{"stop_reason":"end_turn","stop_sequence":null},"type":"message_delta","usage":{"output_tokens":4}}"#,
        ),
        ev("message_stop", r#"{"type":"message_stop"}"#),
    ];
    b.on_always(MESSAGES, Reply::sse(raw(&b_chunks)));
    let gw = Gateway::start(&two_providers(
        (&a, "anthropic"),
        (&b, "anthropic"),
        &continuation_on(5_000),
    ));
    let ask_body = r#"{"model":"m1","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"count"}]}"#;
    let (status, body, terminated, _) = ask(gw.addr(), MESSAGES, ask_body);
    assert_eq!(status, 200);
    // a's events as they came; b's block goes on in the client's open block 0 (its start,
    // message_start and ping dropped), the leading space it repeats skipped, output tokens
    // 12 + 4.
    let mut want = a_sent;
    want.push_str(&ev(
        "content_block_delta",
        r#"{"delta":{"text":"word12","type":"text_delta"},"index":0,"type":"content_block_delta"}"#,
    ));
    want.push_str(&b_chunks[4]);
    want.push_str(&b_chunks[5]);
    want.push_str(&ev(
        "message_delta",
        r#"{"delta":{"stop_reason":"end_turn","stop_sequence":null},"type":"message_delta","usage":{"output_tokens":16}}"#,
    ));
    want.push_str(&b_chunks[7]);
    assert_eq!(body, want);
    assert!(terminated);
    let (last, _) = last_message(&b, MESSAGES);
    let prefill = words(0..12).concat();
    assert_eq!(
        last,
        json!({"role": "assistant", "content": prefill.trim_end()})
    );
    // The token counters take the client's usage: a's prompt once, 12 + 4 output tokens.
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 21);
    metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 16);
}

#[test]
fn with_no_candidate_able_to_continue_the_stream_ends_with_the_in_band_error() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, delivered) = cut_after_25(&a);
    b.on_always(CHAT, Reply::error(500, "overloaded"));
    let (gw, body, terminated, _) = continued((&a, "openai"), (&b, "openai"), 5_000, CHAT, ASK);
    // a's words, then one in-band error naming the cut; b's 500 never reaches the stream.
    let rest = body
        .strip_prefix(&a_sent)
        .unwrap_or_else(|| panic!("{body}"));
    assert!(rest.starts_with("data: {\"error\":"), "{rest}");
    assert!(
        rest.contains("no candidate could continue the stream"),
        "{rest}"
    );
    assert!(!rest.contains("overloaded"), "{rest}");
    assert_eq!(rest.matches("data: ").count(), 1, "{rest}");
    assert!(!terminated);
    let (last, _) = last_message(&b, CHAT);
    assert_eq!(last, json!({"role": "assistant", "content": delivered}));
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 1);
}

#[test]
fn a_combo_stream_cut_mid_answer_is_continued_by_its_next_target() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, delivered) = cut_after_25(&a);
    let mut b_chunks: Vec<String> = ["word24 word25 ", "done."]
        .map(|t| b_text("b-4", t))
        .to_vec();
    b_chunks.push(b_stop("b-4"));
    b_chunks.push(SSE_DONE.to_owned());
    b.on_always(CHAT, Reply::sse(raw(&b_chunks)));
    let cfg = format!(
        "{}[[combos]]\nname = \"duo\"\ntargets = [\"a/m1\", \"b/m1\"]\n",
        two_providers((&a, "openai"), (&b, "openai"), &continuation_on(5_000))
    );
    let gw = Gateway::start(&cfg);
    let ask_duo = ASK.replace("\"m1\"", "\"duo\"");
    let (status, body, terminated, _) = ask(gw.addr(), CHAT, &ask_duo);
    assert_eq!(status, 200);
    // b repeats only "word24 " (7 characters, under the 8-character minimum): nothing is
    // skipped.
    let mut want = a_sent;
    want.push_str(&b_text("chatcmpl-mock", "word24 word25 "));
    want.push_str(&b_text("chatcmpl-mock", "done."));
    want.push_str(&b_stop("chatcmpl-mock"));
    want.push_str(SSE_DONE);
    assert_eq!(body, want);
    assert!(terminated);
    // b was asked for its own model, with the prefill.
    let (last, sent) = last_message(&b, CHAT);
    assert_eq!(sent["model"], "m1");
    assert_eq!(last, json!({"role": "assistant", "content": delivered}));
    assert_eq!(a.hits(CHAT), 1);
}

#[test]
fn a_continuation_cut_in_turn_is_continued_by_the_candidate_after_it() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let c = MockUpstream::start();
    let (a_sent, _) = cut_after_25(&a);
    // b goes on for 25 words (175 bytes: past the 160-byte overlap window, so they reach
    // the client) and is cut too; c finishes.
    let b_words = words(25..50);
    let b_chunks: Vec<String> = b_words.iter().map(|w| b_text("b-5", w)).collect();
    script(&b, CHAT, &b_chunks, Some(Chunk::close()));
    let c_chunks = vec![
        b_text("c-1", "finally."),
        b_stop("c-1"),
        SSE_DONE.to_owned(),
    ];
    c.on_always(CHAT, Reply::sse(raw(&c_chunks)));
    let cfg = format!(
        "{}{}{}",
        two_providers((&a, "openai"), (&b, "openai"), ""),
        provider("c", &c.base_url(), &["m1"]),
        connection("third", "c"),
    ) + &continuation_on(5_000);
    let gw = Gateway::start(&cfg);
    let (status, body, terminated, _) = ask(gw.addr(), CHAT, ASK);
    assert_eq!(status, 200);
    // a's words, b's, c's; c is asked with all 50 words delivered.
    let mut want = a_sent;
    for w in &b_words {
        want.push_str(&b_text("chatcmpl-mock", w));
    }
    want.push_str(&b_text("chatcmpl-mock", "finally."));
    want.push_str(&b_stop("chatcmpl-mock"));
    want.push_str(SSE_DONE);
    assert_eq!(body, want);
    assert!(terminated);
    let last = |m: &MockUpstream| last_message(m, CHAT).0;
    assert_eq!(
        last(&b),
        json!({"role": "assistant", "content": words(0..25).concat()})
    );
    assert_eq!(
        last(&c),
        json!({"role": "assistant", "content": words(0..50).concat()})
    );
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
}

#[test]
fn a_client_that_hangs_up_while_the_continuation_is_awaited_cancels_it() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, _) = cut_after_25(&a);
    // b takes the continuation request and never answers it.
    b.on_always(CHAT, Reply::stall_before_head());
    let gw = Gateway::start(&two_providers(
        (&a, "openai"),
        (&b, "openai"),
        &continuation_on(5_000),
    ));
    let mut c = Client::connect(gw.addr());
    c.start_request("POST", CHAT, &[], ASK.as_bytes());
    assert_eq!(c.read_head().status, 200);
    let mut body = Vec::new();
    while body.len() < a_sent.len() {
        match c.next_body_piece(Duration::from_secs(10)) {
            Piece::Data(d) => body.extend_from_slice(&d),
            other => panic!("{other:?} after {:?}", String::from_utf8_lossy(&body)),
        }
    }
    assert_eq!(String::from_utf8(body).unwrap(), a_sent);
    b.wait_for_hits(CHAT, 1, Duration::from_secs(10));
    drop(c);
    // b sees the hang-up; nothing is left in flight but the scrape.
    b.wait_until(Duration::from_secs(10), "b's connection closed", |m| {
        m.open_connections() == 0
    });
    eventually(Duration::from_secs(10), "everything released", || {
        (flow_held(gw.addr()) == 0 && metric(gw.addr(), "tidegate_requests_in_flight") == 1)
            .then_some(())
    });
    assert_eq!(
        metric(
            gw.addr(),
            "tidegate_requests_abandoned_total{phase=\"response\"}"
        ),
        1
    );
}

// --- translated streams (issue 15 item 3) -------------------------------------------------
//
// The splice works on the client's format: a part served by a provider of the other format
// goes through it after its translation, so the part that was cut and the part that goes
// on may each be of either format. The client's events are compared whole (translated
// OpenAI chunks carry the gateway's clock in `created`, which is left out).

const ASK_MESSAGES: &str = r#"{"model":"m1","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"count"}]}"#;

/// Every event of a client's stream: `{"event": name}` (when named) and `"data"` (the JSON,
/// `created` left out, or the string `[DONE]`); comments left out.
fn client_events(body: &str) -> Vec<Value> {
    parse_sse(body.as_bytes())
        .into_iter()
        .map(|e| {
            let data = if e.data == "[DONE]" {
                json!("[DONE]")
            } else {
                let mut v = e.json();
                if let Some(o) = v.as_object_mut() {
                    o.remove("created");
                }
                v
            };
            match e.event {
                Some(name) => json!({"event": name, "data": data}),
                None => json!({"data": data}),
            }
        })
        .collect()
}

/// A translated OpenAI chunk (from an Anthropic upstream), without `created`.
fn t_chunk(id: &str, delta: Value, finish: Value) -> Value {
    json!({"data": {"id": id, "object": "chat.completion.chunk", "model": "m1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}})
}

/// a's 12 words as the chat client sees them, translated: a role chunk, then a chunk a
/// word.
fn translated_start() -> Vec<Value> {
    let mut chunks = vec![t_chunk(
        "msg_a",
        json!({"role": "assistant", "content": ""}),
        json!(null),
    )];
    chunks.extend(
        words(0..12)
            .iter()
            .map(|w| t_chunk("msg_a", json!({"content": w}), json!(null))),
    );
    chunks
}

/// An Anthropic event as the client sees it.
fn a_ev(name: &str, data: Value) -> Value {
    json!({"event": name, "data": data})
}

fn text_delta(index: u64, text: &str) -> Value {
    a_ev(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": text}}),
    )
}

/// An Anthropic upstream's message: `message_start` (`input` tokens), one text block with
/// `words`, left open.
fn anthropic_start(id: &str, input: u64, words: &[String]) -> Vec<String> {
    AnthropicEvents::start(id, "m1", input)
        .open_text(0, words)
        .sse()
}

/// A `message_delta` delta: `end_turn`, no stop sequence.
fn end_turn() -> Value {
    json!({"stop_reason": "end_turn", "stop_sequence": null})
}

/// An Anthropic upstream's continuation: its own start (45 input tokens) and a ping, a
/// block starting with the space the prefill left out, its end and 4 output tokens.
fn anthropic_continuation() -> Vec<String> {
    AnthropicEvents::start("msg_b", "m1", 45)
        .ping()
        .text(0, &[" word12", " fin."])
        .finish(end_turn(), 4)
        .sse()
}

/// An OpenAI upstream's continuation: a role chunk, the last two delivered words again
/// (14 characters), two new pieces, the finish, usage (40 prompt, 4 completion), `[DONE]`.
fn openai_continuation() -> Vec<String> {
    let mut chunks = vec![b_role("b-9")];
    chunks.extend(["word10 word11 ", "word12 ", "end."].map(|t| b_text("b-9", t)));
    chunks.push(b_stop("b-9"));
    chunks.push(b_usage("b-9", 40, 5 - 1));
    chunks.push(SSE_DONE.to_owned());
    chunks
}

#[test]
fn a_translated_chat_stream_cut_mid_answer_is_continued_by_an_openai_target() {
    translated_chat_continued_by_openai(Some(Chunk::close()));
}

#[test]
fn a_translated_chat_stream_ending_before_its_last_event_is_continued_like_a_cut() {
    // The upstream's body ends cleanly, but without message_delta / message_stop.
    translated_chat_continued_by_openai(None);
}

fn translated_chat_continued_by_openai(end: Option<Chunk>) {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // a speaks Anthropic (translated for the chat client): 12 words, then `end`.
    script(
        &a,
        MESSAGES,
        &anthropic_start("msg_a", 21, &words(0..12)),
        end,
    );
    b.on_always(CHAT, Reply::sse(raw(&openai_continuation())));
    let (gw, body, terminated, _) = continued((&a, "anthropic"), (&b, "openai"), 5_000, CHAT, ASK);
    // a's events translated; b's chunks without its role chunk and the 14 repeated
    // characters, with a's id; usage over the whole answer: a's prompt (its
    // message_start), 12 + 4 completion tokens.
    let mut want = translated_start();
    // b's part keeps b's own chunk shape (no model, no time), with a's id.
    let spliced = ChatChunks::new("msg_a");
    for t in ["word12 ", "end."] {
        want.push(json!({"data": spliced.text(t)}));
    }
    want.push(json!({"data": spliced.finish("stop")}));
    want.push(json!({"data": spliced.usage(21, 16)}));
    want.push(json!({"data": "[DONE]"}));
    assert_eq!(client_events(&body), want, "{body}");
    assert!(terminated, "a continued stream ends cleanly");
    let (text, done) = content(&body);
    assert_eq!(text, format!("{}word12 end.", words(0..12).concat()));
    assert_eq!(done, 1);
    // a got the request translated; b (the client's format) the client's request with the
    // delivered text as a trailing assistant message, trailing space kept.
    let (_, to_a) = last_message(&a, MESSAGES);
    assert_eq!(to_a["max_tokens"], 4096, "{to_a}");
    let (last, _) = last_message(&b, CHAT);
    assert_eq!(
        last,
        json!({"role": "assistant", "content": words(0..12).concat()})
    );
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 21);
    metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 16);
}

#[test]
fn a_translated_chat_stream_cut_mid_answer_is_continued_by_an_anthropic_target() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    script(
        &a,
        MESSAGES,
        &anthropic_start("msg_a", 21, &words(0..12)),
        Some(Chunk::close()),
    );
    // b speaks Anthropic too: the continuation is translated as well.
    b.on_always(MESSAGES, Reply::sse(raw(&anthropic_continuation())));
    let (gw, body, terminated, _) =
        continued((&a, "anthropic"), (&b, "anthropic"), 5_000, CHAT, ASK);
    // b's block translated into chunks with a's id; its role chunk and ping dropped, the
    // leading space that repeats the one left out of the prefill skipped.
    let mut want = translated_start();
    want.push(t_chunk("msg_a", json!({"content": "word12"}), json!(null)));
    want.push(t_chunk("msg_a", json!({"content": " fin."}), json!(null)));
    want.push(t_chunk("msg_a", json!({}), json!("stop")));
    want.push(
        json!({"data": {"id": "msg_a", "object": "chat.completion.chunk", "model": "m1",
        "choices": [], "usage": {"prompt_tokens": 21, "completion_tokens": 16,
        "total_tokens": 37, "prompt_tokens_details": {"cached_tokens": 0,
        "cache_creation_tokens": 0}}}}),
    );
    want.push(json!({"data": "[DONE]"}));
    assert_eq!(client_events(&body), want, "{body}");
    assert!(terminated);
    let (text, done) = content(&body);
    assert_eq!(text, format!("{}word12 fin.", words(0..12).concat()));
    assert_eq!(done, 1);
    // b got an Anthropic request: the chat request with the prefill, translated (the
    // prefill without its trailing space, which Anthropic refuses).
    let (last, to_b) = last_message(&b, MESSAGES);
    assert_eq!(
        last,
        json!({"role": "assistant", "content": words(0..12).concat().trim_end()})
    );
    assert_eq!(
        to_b["messages"][0],
        json!({"role": "user", "content": "count"})
    );
    assert_eq!(to_b["max_tokens"], 4096);
    assert_eq!(to_b["stream"], true);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 21);
    metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 16);
}

#[test]
fn a_translated_messages_stream_stalled_mid_answer_is_continued_by_an_anthropic_target() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // a speaks OpenAI (translated for the Messages client): 12 words, then silence.
    let mut chunks = vec![a_role()];
    chunks.extend(words(0..12).iter().map(|w| a_delta(w)));
    script(&a, CHAT, &chunks, Some(Chunk::stall()));
    b.on_always(MESSAGES, Reply::sse(raw(&anthropic_continuation())));
    let stall_ms = 1_000;
    let (gw, body, terminated, got) = continued(
        (&a, "openai"),
        (&b, "anthropic"),
        stall_ms,
        MESSAGES,
        ASK_MESSAGES,
    );
    // a's chunks as Anthropic events; after the stall b's block goes on in the client's
    // open block 0 (its message_start, ping and block start dropped, the repeated space
    // skipped), output tokens 12 + 4.
    let mut want = vec![
        a_ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "chatcmpl-mock", "type": "message",
                "role": "assistant", "model": "mock-model", "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        ),
        a_ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    want.extend(words(0..12).iter().map(|w| text_delta(0, w)));
    want.push(text_delta(0, "word12"));
    want.push(text_delta(0, " fin."));
    want.push(a_ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    want.push(a_ev(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn",
            "stop_sequence": null}, "usage": {"output_tokens": 16}}),
    ));
    want.push(a_ev("message_stop", json!({"type": "message_stop"})));
    assert_eq!(client_events(&body), want, "{body}");
    assert!(terminated);
    // b's part starts with the event that carries "word12".
    let b_text = body.find("word12").unwrap();
    let b_part = body[..b_text].rfind("event:").unwrap();
    assert_continued_in_time(&got, b_part, stall_ms);
    // a got the Messages request translated; b the client's request with the prefill.
    let (_, to_a) = last_message(&a, CHAT);
    assert_eq!(to_a["stream_options"]["include_usage"], true, "{to_a}");
    let (last, to_b) = last_message(&b, MESSAGES);
    assert_eq!(
        last,
        json!({"role": "assistant", "content": words(0..12).concat().trim_end()})
    );
    assert_eq!(to_b["max_tokens"], 100);
    a.wait_until(Duration::from_secs(5), "a's connection closed", |m| {
        m.open_connections() == 0
    });
    // a reported no usage before it stalled: the prompt is b's minus the 12 prefill tokens.
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 33);
    metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 16);
}

#[test]
fn a_messages_stream_cut_mid_answer_is_continued_by_an_openai_target_translated() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let a_chunks = anthropic_start("msg_a", 21, &words(0..12));
    let a_sent = script(&a, MESSAGES, &a_chunks, Some(Chunk::close()));
    // b speaks OpenAI: the continuation request is translated, its answer too.
    b.on_always(CHAT, Reply::sse(raw(&openai_continuation())));
    let (gw, body, terminated, _) = continued(
        (&a, "anthropic"),
        (&b, "openai"),
        5_000,
        MESSAGES,
        ASK_MESSAGES,
    );
    // a's events as they came (byte for byte), then b's translated: the 14 repeated
    // characters skipped, in block 0; usage: a's 21 input tokens, 12 + 4 output tokens.
    let rest = body
        .strip_prefix(&a_sent)
        .unwrap_or_else(|| panic!("{body}"));
    let want = vec![
        text_delta(0, "word12 "),
        text_delta(0, "end."),
        a_ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        a_ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn",
                "stop_sequence": null}, "usage": {"input_tokens": 21, "output_tokens": 16,
                "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}),
        ),
        a_ev("message_stop", json!({"type": "message_stop"})),
    ];
    assert_eq!(client_events(rest), want, "{body}");
    assert!(terminated);
    // b got a chat request: the Messages request with the prefill (its trailing space
    // kept: OpenAI-format targets take it), translated.
    let (last, to_b) = last_message(&b, CHAT);
    assert_eq!(
        last,
        json!({"role": "assistant", "content": words(0..12).concat()})
    );
    assert_eq!(to_b["max_tokens"], 100);
    assert_eq!(to_b["stream_options"]["include_usage"], true);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 21);
    metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 16);
}

/// The text of every Anthropic `text_delta` in a Messages client's stream, concatenated.
fn anthropic_text(body: &str) -> String {
    parse_sse(body.as_bytes())
        .into_iter()
        .filter(|e| e.event.as_deref() == Some("content_block_delta"))
        .filter_map(|e| e.json()["delta"]["text"].as_str().map(str::to_owned))
        .collect()
}

/// Anthropic's refusal of an assistant prefill, in its own error shape.
fn anthropic_refusal() -> Reply {
    Reply::json(
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "This model does not support assistant message prefill. The conversation must end with a user message."}}),
    )
}

/// An Anthropic upstream's whole answer to the original request: `pieces` in block 0, its
/// end and `output` tokens.
fn anthropic_replay(pieces: &[&str], output: u64) -> Vec<String> {
    AnthropicEvents::start("msg_r", "m1", 21)
        .text(0, pieces)
        .finish(end_turn(), output)
        .sse()
}

#[test]
fn an_anthropic_target_refusing_the_prefill_is_asked_again_on_the_messages_endpoint() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let a_chunks = anthropic_start("msg_a", 21, &words(0..12));
    let a_sent = script(&a, MESSAGES, &a_chunks, Some(Chunk::close()));
    // b refuses the prefill, then answers the original request from the start (split
    // differently from a's pieces).
    let delivered = words(0..12).concat();
    let mut all = delivered.clone();
    all.push_str("fin.");
    let (p1, p2) = all.split_at(30);
    b.on(MESSAGES, anthropic_refusal())
        .on_always(MESSAGES, Reply::sse(raw(&anthropic_replay(&[p1, p2], 14))));
    let (_gw, body, terminated, _) = continued(
        (&a, "anthropic"),
        (&b, "anthropic"),
        5_000,
        MESSAGES,
        ASK_MESSAGES,
    );
    let rest = body
        .strip_prefix(&a_sent)
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(anthropic_text(&body), all, "{body}");
    assert_eq!(anthropic_text(rest), "fin.", "{body}");
    assert!(!rest.contains("event: error"), "{body}");
    assert!(terminated, "{body}");
    let seen = b.requests_to(MESSAGES);
    assert_eq!(seen.len(), 2);
    let prefill = last_of(&seen[0].json());
    assert_eq!(
        prefill,
        json!({"role": "assistant", "content": delivered.trim_end()})
    );
    assert_eq!(
        seen[1].text(),
        ASK_MESSAGES,
        "the replay is the original request"
    );
}

#[test]
fn a_translated_target_refusing_the_prefill_is_asked_again_with_the_original_request() {
    // An OpenAI client; a (OpenAI) is cut, b (Anthropic) refuses the translated prefill,
    // then answers the original request, translated.
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (a_sent, delivered) = cut_after_25(&a);
    let mut all = delivered.clone();
    all.push_str("the end.");
    let (p1, p2) = all.split_at(100);
    b.on(MESSAGES, anthropic_refusal())
        .on_always(MESSAGES, Reply::sse(raw(&anthropic_replay(&[p1, p2], 27))));
    let (_gw, body, terminated, _) = continued((&a, "openai"), (&b, "anthropic"), 5_000, CHAT, ASK);
    let rest = body
        .strip_prefix(&a_sent)
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(content(&body), (all.clone(), 1), "{body}");
    assert_eq!(content(rest).0, "the end.", "{body}");
    assert!(terminated, "{body}");
    let seen = b.requests_to(MESSAGES);
    assert_eq!(seen.len(), 2);
    // The replay is the original chat request, translated: its last message is the user's.
    let replay = seen[1].json();
    let last = last_of(&replay);
    assert_eq!(last["role"], "user", "{replay}");
}
