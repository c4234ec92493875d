//! Mid-stream continuation of `/v1/responses` streams (`stream_recovery.continue_mid_stream`,
//! issue 15 items 3 and 5): a Responses stream translated from a Chat Completions or an
//! Anthropic provider and cut, stalled or ended before its finish after its first client
//! byte is continued by the next candidate of either format, asked with the delivered text
//! as a trailing assistant input item. Its events go on in the client's open message item
//! (same item id, output index and content index, sequence numbers counting on); the done
//! events and `response.completed` carry the whole text and the first part's response id,
//! and the usage covers the whole answer. A stream that carried a function call is not
//! continued, a candidate serving the Responses API as it is is never asked (it takes no
//! prefill), and a stream relayed as it is from such a provider is not continued.
//!
//! Every test reads the client's whole event stream and what the upstreams saw.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const CHAT: &str = "/v1/chat/completions";
const MESSAGES: &str = "/v1/messages";
const RESPONSES: &str = "/v1/responses";
const ASK: &str = r#"{"model":"m1","stream":true,"instructions":"Count.","input":"count","max_output_tokens":100}"#;

/// Starts the gateway in front of `a` and `b` (`(mock, format)`, formats as
/// `provider_of` reads them; continuation on, a content-stall budget of `stall_ms`), asks
/// `ASK` and checks the answer is a 200 stream: the gateway, the de-chunked body, whether it
/// ended cleanly.
fn continued(
    a: (&MockUpstream, &str),
    b: (&MockUpstream, &str),
    stall_ms: u64,
) -> (Gateway, String, bool) {
    let gw = Gateway::start(&two_providers(a, b, &continuation_on(stall_ms)));
    let (status, body, terminated) = ask(gw.addr());
    assert_eq!(status, 200);
    (gw, body, terminated)
}

/// A chunk as a chat upstream writes it (the mock's model and time).
fn chat_chunk(id: &str, delta: Value, finish: Value) -> String {
    sse_data(&ChatChunks::stamped(id, "mock-model", 1_700_000_000).chunk(delta, finish))
}

/// A chat upstream's first part: a role chunk and 12 words.
fn chat_start() -> Vec<String> {
    let mut chunks = vec![chat_chunk(
        "chatcmpl-a",
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    chunks.extend(
        words(0..12)
            .iter()
            .map(|w| chat_chunk("chatcmpl-a", json!({"content": w}), Value::Null)),
    );
    chunks
}

/// A chat upstream's continuation: a role chunk, the last two delivered words again (14
/// characters), two new pieces, the finish, usage (40 prompt, 4 completion), `[DONE]`.
fn chat_continuation() -> Vec<String> {
    let b = ChatChunks::stamped("chatcmpl-b", "mock-model", 1_700_000_000);
    let mut chunks = vec![b.role()];
    for t in ["word10 word11 ", "word12 ", "end."] {
        chunks.push(b.text(t));
    }
    chunks.push(b.finish("stop"));
    chunks.push(ChatChunks::new("chatcmpl-b").usage(40, 4));
    let mut chunks: Vec<String> = chunks.iter().map(sse_data).collect();
    chunks.push(SSE_DONE.to_owned());
    chunks
}

/// An Anthropic upstream's message start (`input` tokens) and one text block of `texts`,
/// left open.
fn anthropic_start(id: &str, input: u64, texts: &[String]) -> Vec<String> {
    AnthropicEvents::start(id, "m1", input)
        .open_text(0, texts)
        .sse()
}

/// An Anthropic upstream's continuation: its start (45 input tokens) and a ping, a block
/// starting with the space the prefill left out, its end, 4 output tokens.
fn anthropic_continuation() -> Vec<String> {
    AnthropicEvents::start("msg_b", "m1", 45)
        .ping()
        .text(0, &[" word12", " fin."])
        .finish(json!({"stop_reason": "end_turn", "stop_sequence": null}), 4)
        .sse()
}

/// Asks `ASK` and reads the stream: `(status, de-chunked body, cleanly terminated)`.
fn ask(addr: std::net::SocketAddr) -> (u16, String, bool) {
    let got = read_stream(addr, RESPONSES, ASK.as_bytes(), Duration::from_secs(20));
    assert_eq!(got.header("transfer-encoding"), Some("chunked"));
    (got.status, got.body, got.terminated)
}

/// The client's events: `(event name, data)`; the name must equal the data's `type`.
fn events(body: &str) -> Vec<(String, Value)> {
    parse_sse(body.as_bytes())
        .into_iter()
        .map(|e| {
            let v = e.json();
            let name = e.event.unwrap_or_default();
            assert_eq!(v["type"].as_str(), Some(name.as_str()), "{body}");
            (name, v)
        })
        .collect()
}

fn names(evs: &[(String, Value)]) -> Vec<&str> {
    evs.iter().map(|(n, _)| n.as_str()).collect()
}

fn the<'a>(evs: &'a [(String, Value)], name: &str) -> &'a Value {
    let found: Vec<&Value> = evs
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(found.len(), 1, "one {name}: {evs:?}");
    found[0]
}

/// Checks a continued stream's shape and returns its text deltas, concatenated: the events
/// of one response with one message item (`item_id` at output index 0, content index 0),
/// sequence numbers 0, 1, 2… without a gap, the done events and `response.completed`
/// carrying the whole text, `response.completed` the id and creation time of
/// `response.created`, and `usage` (input, output tokens).
fn check_continued(body: &str, item_id: &str, usage: (u64, u64)) -> String {
    let evs = events(body);
    let seq: Vec<u64> = evs
        .iter()
        .map(|(_, v)| v["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seq, (0..evs.len() as u64).collect::<Vec<_>>(), "{body}");
    let n = names(&evs);
    let deltas = n
        .iter()
        .filter(|x| **x == "response.output_text.delta")
        .count();
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    want.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    want.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(n, want, "{body}");
    let mut text = String::new();
    for (name, v) in &evs {
        if name == "response.output_text.delta" {
            assert_eq!(v["item_id"], item_id, "{v}");
            assert_eq!(v["output_index"], 0, "{v}");
            assert_eq!(v["content_index"], 0, "{v}");
            text.push_str(v["delta"].as_str().unwrap());
        }
    }
    let added = the(&evs, "response.output_item.added");
    assert_eq!(added["item"]["id"], item_id);
    let done = the(&evs, "response.output_text.done");
    assert_eq!(
        (&done["item_id"], &done["text"]),
        (&json!(item_id), &json!(text))
    );
    let part = the(&evs, "response.content_part.done");
    assert_eq!(part["item_id"], item_id);
    assert_eq!(part["part"]["text"], text.as_str());
    let item = the(&evs, "response.output_item.done");
    assert_eq!(item["output_index"], 0);
    assert_eq!(item["item"]["id"], item_id);
    assert_eq!(item["item"]["content"][0]["text"], text.as_str());
    let created = &the(&evs, "response.created")["response"];
    let completed = &the(&evs, "response.completed")["response"];
    assert_eq!(completed["id"], created["id"], "{body}");
    assert_eq!(completed["created_at"], created["created_at"], "{body}");
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["instructions"], "Count.");
    assert_eq!(completed["output"], json!([item["item"]]), "{body}");
    let (input, output) = usage;
    assert_eq!(completed["usage"]["input_tokens"], input, "{body}");
    assert_eq!(completed["usage"]["output_tokens"], output, "{body}");
    assert_eq!(completed["usage"]["total_tokens"], input + output, "{body}");
    text
}

#[test]
fn a_responses_stream_from_a_chat_provider_cut_mid_answer_is_continued_by_a_chat_provider() {
    chat_continued_by_chat(Some(Chunk::close()));
}

#[test]
fn a_responses_stream_ending_before_its_finish_is_continued_like_a_cut() {
    // a's body ends cleanly, but without a finish_reason or [DONE].
    chat_continued_by_chat(None);
}

#[test]
fn a_responses_stream_stalled_mid_answer_is_continued() {
    chat_continued_by_chat(Some(Chunk::stall()));
}

/// a (Chat Completions only): 12 words, then `end`; b (the same) continues.
fn chat_continued_by_chat(end: Option<Chunk>) {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    script(&a, CHAT, &chat_start(), end);
    b.on_always(CHAT, Reply::sse(raw(&chat_continuation())));
    let (gw, body, terminated) = continued((&a, "chat"), (&b, "chat"), 1_000);
    // b's text goes on in a's message item, its 14 repeated characters skipped; usage: b's
    // prompt less the 12 delivered deltas, 12 + 4 output tokens.
    let text = check_continued(&body, "msg_chatcmpl-a_0", (28, 16));
    let delivered = words(0..12).concat();
    assert_eq!(text, format!("{delivered}word12 end."));
    assert!(terminated, "a continued stream ends cleanly: {body}");
    assert!(!body.contains("event: error"), "{body}");
    // b got the Responses request translated, with the delivered text as a trailing
    // assistant message (its trailing space kept).
    let (last, to_b) = last_message(&b, CHAT);
    assert_eq!(last, json!({"role": "assistant", "content": delivered}));
    assert_eq!(
        to_b["messages"].as_array().unwrap()[..2],
        [
            json!({"role": "system", "content": "Count."}),
            json!({"role": "user", "content": "count"})
        ]
    );
    assert_eq!(to_b["max_tokens"], 100);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 28);
    metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 16);
}

#[test]
fn a_responses_stream_from_a_chat_provider_cut_mid_answer_is_continued_by_an_anthropic_provider() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    script(&a, CHAT, &chat_start(), Some(Chunk::close()));
    b.on_always(MESSAGES, Reply::sse(raw(&anthropic_continuation())));
    let (gw, body, terminated) = continued((&a, "chat"), (&b, "anthropic"), 5_000);
    // b's ping, message start and thinking-free block start dropped, its leading space
    // (left out of the prefill) skipped; usage: b's 45 input tokens less the 12 delivered
    // deltas, 12 + 4 output tokens.
    let text = check_continued(&body, "msg_chatcmpl-a_0", (33, 16));
    let delivered = words(0..12).concat();
    assert_eq!(text, format!("{delivered}word12 fin."));
    assert!(terminated, "{body}");
    // b got an Anthropic request: the prefill without its trailing space.
    let (last, to_b) = last_message(&b, MESSAGES);
    assert_eq!(
        last,
        json!({"role": "assistant", "content": delivered.trim_end()})
    );
    assert_eq!(to_b["system"], "Count.");
    assert_eq!(to_b["max_tokens"], 100);
    assert_eq!(to_b["stream"], true);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
    metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 33);
}

#[test]
fn a_responses_stream_from_an_anthropic_provider_cut_mid_answer_is_continued() {
    for b_format in ["chat", "anthropic"] {
        let a = MockUpstream::start();
        let b = MockUpstream::start();
        script(
            &a,
            MESSAGES,
            &anthropic_start("msg_a", 21, &words(0..12)),
            Some(Chunk::close()),
        );
        b.on_always(CHAT, Reply::sse(raw(&chat_continuation())));
        b.on_always(MESSAGES, Reply::sse(raw(&anthropic_continuation())));
        let (gw, body, terminated) = continued((&a, "anthropic"), (&b, b_format), 5_000);
        // Usage: a's 21 input tokens (its message_start), 12 + 4 output tokens.
        let text = check_continued(&body, "msg_msg_a_0", (21, 16));
        let delivered = words(0..12).concat();
        let (tail, path) = match b_format {
            "chat" => ("word12 end.", CHAT),
            _ => ("word12 fin.", MESSAGES),
        };
        assert_eq!(text, format!("{delivered}{tail}"), "{b_format}");
        assert!(terminated, "{b_format}: {body}");
        let (last, _) = last_message(&b, path);
        let prefill = if path == CHAT {
            delivered.as_str()
        } else {
            delivered.trim_end()
        };
        assert_eq!(last, json!({"role": "assistant", "content": prefill}));
        assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
        metric_becomes(gw.addr(), "tidegate_usage_prompt_tokens_total", 21);
        metric_becomes(gw.addr(), "tidegate_usage_completion_tokens_total", 16);
    }
}

#[test]
fn a_responses_stream_that_carried_a_function_call_is_not_continued() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let mut chunks = vec![chat_chunk(
        "chatcmpl-a",
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    chunks.push(chat_chunk(
        "chatcmpl-a",
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":"}}]}),
        Value::Null,
    ));
    script(&a, CHAT, &chunks, Some(Chunk::close()));
    b.on_always(CHAT, Reply::sse(raw(&chat_continuation())));
    let (gw, body, terminated) = continued((&a, "chat"), (&b, "chat"), 5_000);
    let evs = events(&body);
    let n = names(&evs);
    assert!(
        n.contains(&"response.function_call_arguments.delta"),
        "{body}"
    );
    assert_eq!(n.last(), Some(&"error"), "{body}");
    assert!(!n.contains(&"response.completed"), "{body}");
    assert!(!terminated);
    assert_eq!(b.total_hits(), 0, "b is never asked");
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 1);
}

#[test]
fn a_candidate_serving_the_responses_api_as_it_is_is_not_asked_to_continue() {
    // a (chat) is cut; b serves /v1/responses as it is, which takes no prefill: no
    // candidate is left, the stream ends with the in-band error.
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    script(&a, CHAT, &chat_start(), Some(Chunk::close()));
    b.on_always(RESPONSES, Reply::error(500, "not to be asked"));
    let (gw, body, terminated) = continued((&a, "chat"), (&b, "responses"), 5_000);
    let evs = events(&body);
    let (name, err) = evs.last().unwrap();
    assert_eq!(name, "error", "{body}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("no candidate could continue the stream"),
        "{body}"
    );
    let text: String = evs
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, words(0..12).concat());
    assert!(!terminated);
    assert_eq!(b.total_hits(), 0);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 1);
}

#[test]
fn a_responses_stream_relayed_as_it_is_is_not_continued() {
    // a serves the Responses API as it is: its stream goes to the client byte for byte
    // and a cut ends it with the in-band error, though b could take a prefill.
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let created = json!({"type": "response.created", "sequence_number": 0,
        "response": {"id": "resp_a", "object": "response", "status": "in_progress",
        "output": []}});
    let added = json!({"type": "response.output_item.added", "sequence_number": 1,
        "output_index": 0, "item": {"id": "msg_a", "type": "message", "role": "assistant",
        "status": "in_progress", "content": []}});
    let delta = json!({"type": "response.output_text.delta", "sequence_number": 2,
        "item_id": "msg_a", "output_index": 0, "content_index": 0, "delta": "Hello there "});
    let sent: Vec<String> = [created, added, delta].iter().map(typed_sse).collect();
    script(&a, RESPONSES, &sent, Some(Chunk::close()));
    b.on_always(CHAT, Reply::sse(raw(&chat_continuation())));
    let (gw, body, terminated) = continued((&a, "responses"), (&b, "chat"), 5_000);
    let rest = body
        .strip_prefix(&sent.concat())
        .unwrap_or_else(|| panic!("{body}"));
    assert!(rest.starts_with("event: error\n"), "{rest}");
    assert_eq!(events(rest).len(), 1, "{rest}");
    assert!(!terminated);
    assert_eq!(b.total_hits(), 0);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 1);
}
