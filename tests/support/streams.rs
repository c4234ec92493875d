//! Scripted provider streams and the client's read of a streamed answer, shared by the
//! stream tests (continuation, translation, error events, SDK compatibility): the chunks a
//! Chat Completions or Anthropic upstream sends, written as JSON values so a test can also
//! write down the bytes it expects; an upstream scripted to send them and then cut, stall
//! or just end; two providers in front of which a stream is continued; and one reader that
//! de-chunks what the client got.
//!
//! `serde_json` writes object keys in sorted order, so a chunk's bytes do not depend on the
//! order a test lists its fields in.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use serde_json::{Value, json};

use super::Stopwatch;
use super::client::{Client, Head, Piece, SseEvent, parse_sse};
use super::config::{connection, provider};
use super::mock_upstream::{Chunk, MockUpstream, Reply};

/// `word{i} ` for each `i`: the text pieces of a scripted answer.
pub fn words(range: Range<usize>) -> Vec<String> {
    range.map(|i| format!("word{i} ")).collect()
}

/// Each string as one raw chunk, as the mock sends it.
pub fn raw(chunks: &[String]) -> Vec<Chunk> {
    chunks.iter().map(Chunk::raw).collect()
}

/// `data: <value>\n\n`: one SSE data event.
pub fn sse_data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// `data: [DONE]\n\n`, the OpenAI end-of-stream marker.
pub const SSE_DONE: &str = "data: [DONE]\n\n";

/// The chunks of one Chat Completions stream: each carries the stream's `id` and, when the
/// stream is stamped, the `model` and `created` a provider's own chunks carry.
#[derive(Clone, Debug)]
pub struct ChatChunks {
    id: String,
    stamp: Option<(String, u64)>,
}

impl ChatChunks {
    /// Chunks with only the id and the object type (what a client is sent once a stream
    /// was continued, say).
    pub fn new(id: &str) -> ChatChunks {
        ChatChunks {
            id: id.to_owned(),
            stamp: None,
        }
    }

    /// Chunks with `model` and `created` too.
    pub fn stamped(id: &str, model: &str, created: u64) -> ChatChunks {
        ChatChunks {
            id: id.to_owned(),
            stamp: Some((model.to_owned(), created)),
        }
    }

    fn base(&self, choices: Value) -> Value {
        let mut v = json!({"id": self.id, "object": "chat.completion.chunk", "choices": choices});
        if let Some((model, created)) = &self.stamp {
            v["model"] = json!(model);
            v["created"] = json!(created);
        }
        v
    }

    /// A chunk of one choice with `delta` and `finish` (`Value::Null`, or the reason).
    pub fn chunk(&self, delta: Value, finish: Value) -> Value {
        self.base(json!([{"index": 0, "delta": delta, "finish_reason": finish}]))
    }

    /// The first chunk: the assistant role, empty content.
    pub fn role(&self) -> Value {
        self.chunk(json!({"role": "assistant", "content": ""}), Value::Null)
    }

    /// A text piece.
    pub fn text(&self, text: &str) -> Value {
        self.chunk(json!({"content": text}), Value::Null)
    }

    /// The finish: an empty delta with `reason`.
    pub fn finish(&self, reason: &str) -> Value {
        self.chunk(json!({}), json!(reason))
    }

    /// The usage chunk: no choices, `prompt` and `completion` tokens.
    pub fn usage(&self, prompt: u64, completion: u64) -> Value {
        let mut v = self.base(json!([]));
        v["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion});
        v
    }
}

/// A whole Chat Completions answer `id` from `model`: one choice of `message` ending with
/// `finish`, and its usage (`prompt`, `completion` tokens).
pub fn chat_completion(
    id: &str,
    model: &str,
    message: Value,
    finish: &str,
    (prompt, completion): (u64, u64),
) -> Reply {
    Reply::json(
        200,
        json!({"id": id, "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}}),
    )
}

/// A Chat Completions stream reply: each chunk a data event, then `[DONE]`.
pub fn chat_stream(chunks: impl IntoIterator<Item = Value>) -> Reply {
    let mut steps: Vec<Chunk> = chunks.into_iter().map(Chunk::json).collect();
    steps.push(Chunk::done());
    Reply::sse(steps)
}

/// An event named after its data's `type`, as Anthropic and Responses streams send them:
/// `event: <type>\ndata: <value>\n\n`.
pub fn typed_sse(value: &Value) -> String {
    format!("event: {}\ndata: {value}\n\n", event_type(value))
}

/// [`typed_sse`] as a mock chunk.
pub fn typed_chunk(value: &Value) -> Chunk {
    Chunk::event(event_type(value), &value.to_string())
}

fn event_type(value: &Value) -> &str {
    value["type"]
        .as_str()
        .unwrap_or_else(|| panic!("a typed event names its type: {value}"))
}

/// The events of one Anthropic Messages stream, written block by block.
#[derive(Clone, Debug, Default)]
pub struct AnthropicEvents(Vec<Value>);

impl AnthropicEvents {
    /// `message_start` of message `id` from `model`, `input` tokens in and one out, with
    /// the usual `stop_reason: null`.
    pub fn start(id: &str, model: &str, input: u64) -> AnthropicEvents {
        AnthropicEvents(vec![json!({"type": "message_start", "message": {"id": id,
            "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "usage": {"input_tokens": input, "output_tokens": 1}}})])
    }

    /// Any event.
    pub fn event(mut self, value: Value) -> AnthropicEvents {
        self.0.push(value);
        self
    }

    pub fn ping(self) -> AnthropicEvents {
        self.event(json!({"type": "ping"}))
    }

    /// `content_block_start` of block `index`.
    pub fn open(self, index: u64, block: Value) -> AnthropicEvents {
        self.event(json!({"type": "content_block_start", "index": index, "content_block": block}))
    }

    /// One `content_block_delta` of block `index`.
    pub fn delta(self, index: u64, delta: Value) -> AnthropicEvents {
        self.event(json!({"type": "content_block_delta", "index": index, "delta": delta}))
    }

    /// `content_block_stop` of block `index`.
    pub fn close(self, index: u64) -> AnthropicEvents {
        self.event(json!({"type": "content_block_stop", "index": index}))
    }

    /// Text block `index` opened and its `pieces` sent, left open.
    pub fn open_text(self, index: u64, pieces: &[impl AsRef<str>]) -> AnthropicEvents {
        pieces.iter().fold(
            self.open(index, json!({"type": "text", "text": ""})),
            |events, piece| {
                events.delta(index, json!({"type": "text_delta", "text": piece.as_ref()}))
            },
        )
    }

    /// A whole text block `index` of `pieces`.
    pub fn text(self, index: u64, pieces: &[impl AsRef<str>]) -> AnthropicEvents {
        self.open_text(index, pieces).close(index)
    }

    /// A whole thinking block `index` of `pieces`.
    pub fn thinking(self, index: u64, pieces: &[&str]) -> AnthropicEvents {
        pieces
            .iter()
            .fold(
                self.open(index, json!({"type": "thinking", "thinking": ""})),
                |events, piece| {
                    events.delta(index, json!({"type": "thinking_delta", "thinking": piece}))
                },
            )
            .close(index)
    }

    /// A whole `tool_use` block `index` (call `id` of tool `name`), its input in `json`
    /// pieces.
    pub fn tool_use(self, index: u64, id: &str, name: &str, json: &[&str]) -> AnthropicEvents {
        json.iter()
            .fold(
                self.open(
                    index,
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                ),
                |events, piece| {
                    events.delta(
                        index,
                        json!({"type": "input_json_delta", "partial_json": piece}),
                    )
                },
            )
            .close(index)
    }

    /// The end: `message_delta` (`stop_reason`, `output` tokens) and `message_stop`.
    pub fn stop(self, stop_reason: &str, output: u64) -> AnthropicEvents {
        self.finish(json!({"stop_reason": stop_reason}), output)
    }

    /// The end with the whole `message_delta` delta given (say with `stop_sequence: null`).
    pub fn finish(self, delta: Value, output: u64) -> AnthropicEvents {
        self.event(json!({"type": "message_delta", "delta": delta,
            "usage": {"output_tokens": output}}))
            .event(json!({"type": "message_stop"}))
    }

    pub fn values(&self) -> &[Value] {
        &self.0
    }

    /// The events as they travel, one string each.
    pub fn sse(&self) -> Vec<String> {
        self.0.iter().map(typed_sse).collect()
    }

    /// The events as mock chunks.
    pub fn chunks(&self) -> Vec<Chunk> {
        self.0.iter().map(typed_chunk).collect()
    }

    /// A stream reply of the events.
    pub fn reply(&self) -> Reply {
        Reply::sse(self.chunks())
    }
}

/// Scripts `m` to answer every request on `path` with `chunks`, then `end` (a cut, a stall;
/// `None`: the body just ends). Returns the bytes the chunks make.
pub fn script(m: &MockUpstream, path: &str, chunks: &[String], end: Option<Chunk>) -> String {
    let mut steps = raw(chunks);
    steps.extend(end);
    m.on_always(path, Reply::sse(steps));
    chunks.concat()
}

/// A provider table `id` serving `m1` on `m`, of `format`: `openai` (or `responses`: the
/// OpenAI format, serving the Responses API as it is), `chat` (the OpenAI format, Chat
/// Completions only) or `anthropic`.
pub fn provider_of(id: &str, m: &MockUpstream, format: &str) -> String {
    let p = provider(id, &m.base_url(), &["m1"]);
    match format {
        "openai" | "responses" => p,
        "chat" => p.replace(
            "format = \"openai\"",
            "format = \"openai\"\nresponses_api = false",
        ),
        other => p.replace("format = \"openai\"", &format!("format = \"{other}\"")),
    }
}

/// Two shards; providers `a` then `b` (each `(mock, format)` as [`provider_of`] reads it),
/// one connection each (`first`, `second`); then `tail`.
pub fn two_providers(a: (&MockUpstream, &str), b: (&MockUpstream, &str), tail: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{}{}{tail}\n",
        provider_of("a", a.0, a.1),
        connection("first", "a"),
        provider_of("b", b.0, b.1),
        connection("second", "b"),
    )
}

/// Mid-stream continuation on, with a content-stall budget of `stall_ms`.
pub fn continuation_on(stall_ms: u64) -> String {
    format!(
        "[resilience.stream_watchdog]\nstall_timeout_ms = {stall_ms}\n\n\
         [resilience.stream_recovery]\ncontinue_mid_stream = true\n"
    )
}

/// The last message of the one request `m` got on `path`, and that request.
pub fn last_message(m: &MockUpstream, path: &str) -> (Value, Value) {
    let seen = m.requests_to(path);
    assert_eq!(seen.len(), 1, "{path}");
    let body = seen[0].json();
    (last_of(&body), body)
}

/// The last of a chat or Messages request's `messages`.
pub fn last_of(request: &Value) -> Value {
    request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_else(|| panic!("no messages in {request}"))
}

/// What the client got on a streamed request.
#[derive(Debug)]
pub struct Streamed {
    pub head: Head,
    pub status: u16,
    /// De-chunked.
    pub body: String,
    /// Ended by its framing (the chunked terminator, or its length); else the gateway
    /// closed.
    pub terminated: bool,
    /// From sending the request to the end of the body.
    pub took: Duration,
    /// For each body piece as it was read: the body's length with it, and the time since
    /// the request was sent.
    pub arrivals: Vec<(usize, Duration)>,
}

impl Streamed {
    /// The head's `name` header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    /// The body's SSE events.
    pub fn events(&self) -> Vec<SseEvent> {
        parse_sse(self.body.as_bytes())
    }

    /// How long the client waited between the byte before `offset` and the byte at it (the
    /// times the pieces holding them were read; zero when one piece held both): e.g. the
    /// pause a stall leaves between one upstream's part and the next one's, without the
    /// time the rest of the request took.
    pub fn pause_before(&self, offset: usize) -> Duration {
        let read_at = |byte: usize| {
            self.arrivals
                .iter()
                .find(|(len, _)| *len > byte)
                .unwrap_or_else(|| panic!("no byte {byte} in a body of {}", self.body.len()))
                .1
        };
        read_at(offset) - read_at(offset - 1)
    }
}

/// Sends `body` on `path` and reads the answer to its end: a complete one by its framing, a
/// broken one until the gateway closes. Each piece may take at most `piece_timeout`.
pub fn read_stream(addr: SocketAddr, path: &str, body: &[u8], piece_timeout: Duration) -> Streamed {
    let mut c = Client::connect(addr);
    let clock = Stopwatch::start();
    c.start_request("POST", path, &[], body);
    let head = c.read_head();
    let mut bytes = Vec::new();
    let mut arrivals = Vec::new();
    let terminated = loop {
        match c.next_body_piece(piece_timeout) {
            Piece::Data(d) => {
                bytes.extend_from_slice(&d);
                arrivals.push((bytes.len(), clock.elapsed()));
            }
            Piece::End => break true,
            Piece::Closed => break false,
            Piece::Timeout => panic!("no end after {:?}", String::from_utf8_lossy(&bytes)),
        }
    };
    let took = clock.elapsed();
    Streamed {
        status: head.status,
        head,
        body: String::from_utf8(bytes).unwrap(),
        terminated,
        took,
        arrivals,
    }
}
