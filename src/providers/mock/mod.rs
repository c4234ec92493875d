//! The `mock` provider format, served in-process so the shipped configuration works
//! with no keys. Behaviour is chosen by the model name, so a newcomer can watch the
//! gateway's failure handling without a real provider:
//!
//! | model          | behaviour                                                     |
//! |----------------|---------------------------------------------------------------|
//! | `echo`, other  | answers with the last user message                            |
//! | `slow-<ms>`    | waits `<ms>` before the response head                         |
//! | `drip-<ms>`    | streams one word every `<ms>`                                 |
//! | `fail-<status>`| answers `<status>` with an OpenAI-shaped error body           |
//! | `stall`        | non-stream: never answers; stream: one event, then silence    |
//!
//! `plan` decides the reply (pure, no I/O); `playback` plays it on the shard's timers.

use bytes::Bytes;
use serde_json::{Value, json};

pub mod playback;

use super::Endpoint;

/// What the mock upstream does for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    Echo,
    Slow(u64),
    Drip(u64),
    Fail(u16),
    Stall,
}

/// Longest delay the mock accepts in a model name.
pub const MAX_MOCK_DELAY_MS: u64 = 600_000;

pub fn behavior(model: &str) -> Behavior {
    let m = model.rsplit('/').next().unwrap_or(model);
    let num = |s: &str| s.parse::<u64>().ok().map(|v| v.min(MAX_MOCK_DELAY_MS));
    if let Some(ms) = m.strip_prefix("slow-").and_then(num) {
        return Behavior::Slow(ms);
    }
    if let Some(ms) = m.strip_prefix("drip-").and_then(num) {
        return Behavior::Drip(ms);
    }
    if let Some(code) = m.strip_prefix("fail-").and_then(|s| s.parse::<u16>().ok())
        && (400..=599).contains(&code)
    {
        return Behavior::Fail(code);
    }
    if m == "stall" {
        return Behavior::Stall;
    }
    Behavior::Echo
}

/// The planned reply: head, then its frames (`frames`, a streamed reply's `words`, then
/// `after`; each spaced by `frame_delay_ms`), then either the end of the body or, with
/// `stall_after_frames`, silence. [`Plan::take_frames`] plays them in order.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Never send a head (the client's response-header budget decides).
    pub stall_before_head: bool,
    pub head_delay_ms: u64,
    pub status: u16,
    pub content_type: &'static str,
    pub extra_headers: Vec<(&'static str, String)>,
    /// Streamed replies are sent chunked, one frame per chunk; others as one body.
    pub streamed: bool,
    /// The frames before the words (every frame of a reply that is not streamed).
    pub frames: Vec<Bytes>,
    /// A streamed reply's word frames, made as they are played.
    pub words: Option<Words>,
    /// The frames after the words.
    pub after: Vec<Bytes>,
    pub frame_delay_ms: u64,
    pub stall_after_frames: bool,
}

/// Plans the reply to `body` (the JSON request) for `model` (without the provider prefix).
pub fn plan(
    endpoint: Endpoint,
    model: &str,
    stream: bool,
    body: &[u8],
    seq: u64,
    now_s: u64,
) -> Plan {
    let behavior = behavior(model);
    let mut plan = Plan {
        stall_before_head: false,
        head_delay_ms: 0,
        status: 200,
        content_type: "application/json",
        extra_headers: Vec::new(),
        streamed: false,
        frames: Vec::new(),
        words: None,
        after: Vec::new(),
        frame_delay_ms: 0,
        stall_after_frames: false,
    };
    match behavior {
        Behavior::Fail(code) => {
            plan.status = code;
            if code == 429 {
                plan.extra_headers.push(("retry-after", "1".to_owned()));
            }
            let err = json!({"error": {"message": format!("mock upstream failure {code}"),
                "type": if code >= 500 { "server_error" } else { "invalid_request_error" },
                "code": format!("mock_{code}")}});
            plan.frames.push(Bytes::from(err.to_string()));
            return plan;
        }
        Behavior::Stall if !stream => {
            plan.stall_before_head = true;
            return plan;
        }
        Behavior::Slow(ms) => plan.head_delay_ms = ms,
        Behavior::Drip(ms) => plan.frame_delay_ms = ms,
        Behavior::Stall | Behavior::Echo => {}
    }
    let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let text = echo_text(endpoint, &req);
    let word_count = text.split_inclusive(' ').count();
    let prompt_tokens = count_tokens(&req.to_string());
    let completion_tokens = word_count.max(1) as u64;
    let id = format!("mock-{seq}");
    let stream = stream && endpoint.streams();
    if !stream {
        let v = match endpoint {
            Endpoint::ChatCompletions => {
                json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion",
                "created": now_s, "model": model, "choices": [{"index": 0,
                "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}})
            }
            Endpoint::Messages => {
                json!({"id": format!("msg_{id}"), "type": "message", "role": "assistant",
                "model": model, "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "stop_sequence": null, "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}})
            }
            Endpoint::Responses => response_object(
                &id,
                model,
                now_s,
                &text,
                "completed",
                prompt_tokens,
                completion_tokens,
            ),
            Endpoint::CountTokens => json!({"input_tokens": prompt_tokens}),
            Endpoint::Embeddings => {
                json!({"object": "list", "data": [{"object": "embedding", "index": 0,
                "embedding": embedding(&text)}], "model": model,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
            }
        };
        plan.frames.push(Bytes::from(v.to_string()));
        return plan;
    }
    plan.streamed = true;
    plan.content_type = "text/event-stream";
    plan.stall_after_frames = behavior == Behavior::Stall;
    match endpoint {
        // Streams only where `Endpoint::streams`: these two never get here.
        Endpoint::ChatCompletions | Endpoint::Embeddings | Endpoint::CountTokens => {
            let chat_id = format!("chatcmpl-{id}");
            plan.frames.push(sse(chat_chunk(
                &chat_id,
                model,
                now_s,
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            )));
            if plan.stall_after_frames {
                return plan;
            }
            plan.after.push(sse(chat_chunk(
                &chat_id,
                model,
                now_s,
                json!({}),
                json!("stop"),
            )));
            if include_usage(&req) {
                plan.after.push(sse(json!({"id": chat_id, "object": "chat.completion.chunk",
                    "created": now_s, "model": model, "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}})));
            }
            plan.after.push(Bytes::from_static(b"data: [DONE]\n\n"));
            plan.words = Some(Words::new(
                text,
                0,
                Shape::Chat {
                    id: chat_id,
                    model: model.to_owned(),
                    created: now_s,
                },
            ));
        }
        Endpoint::Messages => {
            plan.frames.push(named(
                "message_start",
                json!({"type": "message_start", "message": {
                "id": format!("msg_{id}"), "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": 1}}}),
            ));
            if plan.stall_after_frames {
                return plan;
            }
            plan.frames.push(named(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ));
            plan.frames.push(named("ping", json!({"type": "ping"})));
            plan.after.push(named(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ));
            plan.after.push(named(
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": completion_tokens}}),
            ));
            plan.after
                .push(named("message_stop", json!({"type": "message_stop"})));
            plan.words = Some(Words::new(text, 0, Shape::Messages));
        }
        Endpoint::Responses => {
            let created = response_object(&id, model, now_s, "", "in_progress", 0, 0);
            plan.frames.push(named(
                "response.created",
                json!({"type": "response.created", "sequence_number": 0, "response": created}),
            ));
            if plan.stall_after_frames {
                return plan;
            }
            // The item and its content part are announced before any text, as OpenAI does
            // (the SDK's `responses.stream()` helper needs them), and closed after it.
            let item_id = format!("msg_{id}");
            let item = |status: &str, text: Option<&str>| {
                let content = match text {
                    Some(t) => json!([{"type": "output_text", "text": t, "annotations": []}]),
                    None => json!([]),
                };
                json!({"type": "message", "id": item_id, "status": status,
                    "role": "assistant", "content": content})
            };
            // Sequence numbers: 1 and 2 here, one per word, then the closing frames'.
            let mut seq = 0usize;
            let mut next = |by: usize| {
                seq += by;
                seq
            };
            plan.frames.push(named(
                "response.output_item.added",
                json!({"type": "response.output_item.added", "sequence_number": next(1),
                "output_index": 0, "item": item("in_progress", None)}),
            ));
            plan.frames.push(named(
                "response.content_part.added",
                json!({"type": "response.content_part.added", "sequence_number": next(1),
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
            ));
            let first_word_seq = next(1);
            next(word_count.saturating_sub(1));
            plan.after.push(named(
                "response.output_text.done",
                json!({"type": "response.output_text.done", "sequence_number": next(1),
                "item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
            ));
            plan.after.push(named(
                "response.content_part.done",
                json!({"type": "response.content_part.done", "sequence_number": next(1),
                "item_id": item_id, "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": text, "annotations": []}}),
            ));
            plan.after.push(named(
                "response.output_item.done",
                json!({"type": "response.output_item.done", "sequence_number": next(1),
                "output_index": 0, "item": item("completed", Some(&text))}),
            ));
            let done = response_object(
                &id,
                model,
                now_s,
                &text,
                "completed",
                prompt_tokens,
                completion_tokens,
            );
            plan.after.push(named(
                "response.completed",
                json!({"type": "response.completed",
                "sequence_number": next(1), "response": done}),
            ));
            plan.words = Some(Words::new(
                text,
                first_word_seq,
                Shape::Responses { item_id },
            ));
        }
    }
    plan.frames.shrink_to_fit();
    plan.after.shrink_to_fit();
    plan
}

/// An event-stream frame in an allocation of its own size (a `format!` string's capacity
/// can be twice its length): a drip stream keeps its frames for minutes.
fn sse(v: Value) -> Bytes {
    Bytes::copy_from_slice(format!("data: {v}\n\n").as_bytes())
}

/// A named event-stream frame (Anthropic, Responses), sized as [`sse`].
fn named(event: &str, v: Value) -> Bytes {
    Bytes::copy_from_slice(format!("event: {event}\ndata: {v}\n\n").as_bytes())
}

fn chat_chunk(chat_id: &str, model: &str, created: u64, delta: Value, finish: Value) -> Value {
    json!({"id": chat_id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
}

/// A streamed reply's word frames, one per word of the echoed text (split after each
/// space), made as they are played: a `drip-<ms>` stream plays for minutes, and its
/// frames made up front held ~200 bytes a word for all that time.
#[derive(Clone, Debug)]
pub struct Words {
    text: String,
    /// Where the next word starts in `text`.
    at: usize,
    /// The next word frame's sequence number (Responses).
    seq: usize,
    shape: Shape,
}

/// What a word frame looks like, per endpoint.
#[derive(Clone, Debug)]
enum Shape {
    Chat {
        id: String,
        model: String,
        created: u64,
    },
    Messages,
    Responses {
        item_id: String,
    },
}

impl Words {
    fn new(text: String, seq: usize, shape: Shape) -> Self {
        Self {
            text,
            at: 0,
            seq,
            shape,
        }
    }
}

impl Iterator for Words {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let rest = self.text.get(self.at..).filter(|r| !r.is_empty())?;
        let len = rest.find(' ').map_or(rest.len(), |i| i + 1);
        let w = &rest[..len];
        let frame = match &self.shape {
            Shape::Chat { id, model, created } => sse(chat_chunk(
                id,
                model,
                *created,
                json!({"content": w}),
                Value::Null,
            )),
            Shape::Messages => named(
                "content_block_delta",
                json!({"type": "content_block_delta",
                "index": 0, "delta": {"type": "text_delta", "text": w}}),
            ),
            Shape::Responses { item_id } => named(
                "response.output_text.delta",
                json!({"type": "response.output_text.delta",
                "sequence_number": self.seq, "item_id": item_id, "output_index": 0,
                "content_index": 0, "delta": w}),
            ),
        };
        self.at += len;
        self.seq += 1;
        Some(frame)
    }
}

/// Every frame of a plan, in order.
#[derive(Debug)]
pub struct Frames {
    before: std::vec::IntoIter<Bytes>,
    words: Option<Words>,
    after: std::vec::IntoIter<Bytes>,
}

impl Iterator for Frames {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if let Some(f) = self.before.next() {
            return Some(f);
        }
        if let Some(words) = self.words.as_mut() {
            if let Some(f) = words.next() {
                return Some(f);
            }
            self.words = None;
        }
        self.after.next()
    }
}

impl Plan {
    /// The reply can be sent at once: no delay before the head or between frames, no stall.
    pub fn waits_for_nothing(&self) -> bool {
        !self.stall_before_head
            && self.head_delay_ms == 0
            && self.frame_delay_ms == 0
            && !self.stall_after_frames
    }

    /// Takes the plan's frames, to play in order (the plan keeps its other fields).
    pub fn take_frames(&mut self) -> Frames {
        Frames {
            before: std::mem::take(&mut self.frames).into_iter(),
            words: self.words.take(),
            after: std::mem::take(&mut self.after).into_iter(),
        }
    }
}

fn response_object(
    id: &str,
    model: &str,
    now_s: u64,
    text: &str,
    status: &str,
    input: u64,
    output: u64,
) -> Value {
    let output_items = if text.is_empty() {
        json!([])
    } else {
        json!([{"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}])
    };
    json!({"id": format!("resp_{id}"), "object": "response", "created_at": now_s, "status": status,
        "model": model, "output": output_items,
        "usage": {"input_tokens": input, "output_tokens": output, "total_tokens": input + output}})
}

fn include_usage(req: &Value) -> bool {
    req.pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// A rough token count (≈ 4 bytes a token), enough for plausible usage numbers.
fn count_tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4).max(1)
}

fn embedding(text: &str) -> Vec<f64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    (0..8)
        .map(|i| {
            for b in text.bytes().chain([i as u8]) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
            ((h % 2000) as f64 / 1000.0) - 1.0
        })
        .collect()
}

/// The text to echo: the last user message of a chat/messages body, the `input` of a
/// responses or embeddings body.
fn echo_text(endpoint: Endpoint, req: &Value) -> String {
    let text = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Messages | Endpoint::CountTokens => req
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|msgs| {
                msgs.iter()
                    .rev()
                    .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            })
            .and_then(|m| m.get("content"))
            .map(content_text),
        Endpoint::Responses | Endpoint::Embeddings => req.get("input").map(content_text),
    };
    match text {
        Some(t) if !t.is_empty() => t,
        _ => "Hello from the Tidegate mock provider.".to_owned(),
    }
}

/// Flattens a string, a list of content parts, or a list of input messages to text.
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => {
            let last_user = items
                .iter()
                .rev()
                .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
            if let Some(m) = last_user {
                return m.get("content").map(content_text).unwrap_or_default();
            }
            items
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
                .collect::<Vec<_>>()
                .join(" ")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviour_by_model_name() {
        assert_eq!(behavior("echo"), Behavior::Echo);
        assert_eq!(behavior("mock/slow-250"), Behavior::Slow(250));
        assert_eq!(behavior("drip-20"), Behavior::Drip(20));
        assert_eq!(behavior("fail-503"), Behavior::Fail(503));
        assert_eq!(behavior("fail-200"), Behavior::Echo);
        assert_eq!(behavior("stall"), Behavior::Stall);
        assert_eq!(
            behavior("slow-99999999999"),
            Behavior::Slow(MAX_MOCK_DELAY_MS)
        );
    }

    #[test]
    fn echo_chat_non_stream() {
        let body = br#"{"model":"echo","messages":[{"role":"system","content":"x"},{"role":"user","content":"hi there"}]}"#;
        let p = plan(Endpoint::ChatCompletions, "echo", false, body, 1, 0);
        assert_eq!(p.status, 200);
        let v: Value = serde_json::from_slice(&p.frames[0]).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "hi there");
        assert_eq!(v["object"], "chat.completion");
    }

    #[test]
    fn chat_stream_ends_with_done() {
        let body = br#"{"model":"echo","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"a b c"}]}]}"#;
        let mut p = plan(Endpoint::ChatCompletions, "echo", true, body, 1, 0);
        assert!(p.streamed);
        let frames: Vec<Bytes> = p.take_frames().collect();
        assert_eq!(frames.last().unwrap().as_ref(), b"data: [DONE]\n\n");
        let text: String = frames[1..4]
            .iter()
            .map(|f| {
                let v: Value = serde_json::from_slice(&f[6..f.len() - 2]).unwrap();
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(text, "a b c");
    }

    #[test]
    fn anthropic_stream_has_the_event_sequence() {
        let body = br#"{"model":"echo","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"yo"}]}"#;
        let mut p = plan(Endpoint::Messages, "echo", true, body, 1, 0);
        let events: Vec<String> = p
            .take_frames()
            .map(|f| {
                String::from_utf8_lossy(&f)
                    .lines()
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(events.first().unwrap(), "event: message_start");
        assert_eq!(events.last().unwrap(), "event: message_stop");
    }

    #[test]
    fn responses_stream_numbers_every_event_in_order_and_spells_the_text() {
        let body = br#"{"model":"echo","stream":true,"input":"one two three"}"#;
        let mut p = plan(Endpoint::Responses, "echo", true, body, 1, 0);
        let events: Vec<Value> = p
            .take_frames()
            .map(|f| {
                let s = String::from_utf8(f.to_vec()).unwrap();
                let data = s.lines().nth(1).unwrap().strip_prefix("data: ").unwrap();
                serde_json::from_str(data).unwrap()
            })
            .collect();
        let seqs: Vec<u64> = events
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(text, "one two three");
        assert_eq!(events.last().unwrap()["type"], "response.completed");
    }

    #[test]
    fn failures_and_stalls() {
        let p = plan(Endpoint::ChatCompletions, "fail-429", false, b"{}", 1, 0);
        assert_eq!(p.status, 429);
        assert_eq!(p.extra_headers, vec![("retry-after", "1".to_owned())]);
        assert!(plan(Endpoint::ChatCompletions, "stall", false, b"{}", 1, 0).stall_before_head);
        let s = plan(Endpoint::ChatCompletions, "stall", true, b"{}", 1, 0);
        assert!(s.stall_after_frames);
        assert_eq!(s.frames.len(), 1);
    }
}
