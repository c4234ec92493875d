//! Streams, event by event: a [`StreamTranslator`] is fed the upstream's body in whatever
//! pieces it arrives (the [`Scanner`] cuts events across any split) and appends the client's
//! events to an output buffer. Each event is read with borrowing serde probes (no tree) and
//! written by hand, so one event costs well under a microsecond.
//!
//! Anthropic → OpenAI: `message_start` → the role chunk; text / `input_json_delta` /
//! thinking deltas → `content` / tool-call argument / `reasoning_content` chunks (a tool-use
//! block start → the tool call's id and name); `message_delta` → the `finish_reason` chunk;
//! `message_stop` → the usage chunk (when the client asked for it) and `[DONE]`; `ping` → an
//! SSE comment; `error` → an in-band `{"error":…}` chunk.
//!
//! OpenAI → Anthropic: the first chunk → `message_start`; reasoning, text and each tool
//! call open their own content block (the open one is stopped first) and deltas follow as
//! `thinking_delta` / `text_delta` / `input_json_delta`; `finish_reason` stops the block;
//! `[DONE]` (or the body's end after a `finish_reason`) → `message_delta` with the stop
//! reason and usage, then `message_stop`; comments → `ping`; an `{"error":…}` chunk → an
//! `error` event of the Anthropic type its OpenAI code or type corresponds to
//! ([`error::anthropic_type_of_openai`]).

use std::borrow::Cow;
use std::io::Write;

use serde::Deserialize;

use super::chunk::{OChunk, OToolDelta};
use super::response::{finish_reason_of, stop_reason_of};
use super::responses::{Echo, ToResponses};
use super::{Translation, error};
use crate::sse::{Event, Scanner};

/// Appends `s` as a JSON string literal.
fn push_str(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Appends `n` in decimal.
fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// Translates one upstream event stream into the client's.
#[derive(Debug)]
pub struct StreamTranslator {
    scanner: Scanner,
    dir: Dir,
}

#[derive(Debug)]
enum Dir {
    ToChat(ToChat),
    ToMessages(ToMessages),
    /// Chat chunks → Responses events; from an Anthropic upstream the events go through
    /// [`ToChat`] first (its chunks re-scanned from `buf`).
    Responses {
        via: Option<Box<(ToChat, Scanner)>>,
        buf: Vec<u8>,
        t: Box<ToResponses>,
    },
}

impl StreamTranslator {
    /// `include_usage`: the OpenAI client asked for the usage chunk; `created`: the Unix
    /// time stamped on OpenAI chunks.
    pub fn new(translation: Translation, include_usage: bool, created: u64) -> Self {
        let dir = match translation {
            Translation::ChatToMessages => Dir::ToChat(ToChat {
                include_usage,
                created,
                ..ToChat::default()
            }),
            Translation::MessagesToChat => Dir::ToMessages(ToMessages::default()),
            Translation::ResponsesToChat | Translation::ResponsesToMessages => {
                let via = (translation == Translation::ResponsesToMessages).then(|| {
                    Box::new((
                        ToChat {
                            include_usage: true,
                            created,
                            ..ToChat::default()
                        },
                        Scanner::default(),
                    ))
                });
                Dir::Responses {
                    via,
                    buf: Vec::new(),
                    t: Box::new(ToResponses::new(Echo::default(), created)),
                }
            }
        };
        StreamTranslator {
            scanner: Scanner::default(),
            dir,
        }
    }

    /// The request settings a Responses stream's response objects repeat.
    pub fn with_echo(mut self, echo: Echo) -> Self {
        if let Dir::Responses { t, .. } = &mut self.dir {
            t.echo = echo;
        }
        self
    }

    /// Feeds a piece of the upstream body; the client's events for every upstream event
    /// that ended in it are appended to `out`.
    pub fn feed(&mut self, piece: &[u8], out: &mut Vec<u8>) {
        let StreamTranslator { scanner, dir } = self;
        scanner.feed(piece, &mut |r| {
            if let Ok(ev) = r {
                match dir {
                    Dir::ToChat(t) => t.event(&ev, out),
                    Dir::ToMessages(t) => t.event(&ev, out),
                    Dir::Responses { via: None, t, .. } => t.event_of(&ev, out),
                    Dir::Responses {
                        via: Some(via),
                        buf,
                        t,
                    } => {
                        let (chat, scanner) = &mut **via;
                        chat.event(&ev, buf);
                        rescan(scanner, buf, t, out);
                    }
                }
            }
        });
    }

    /// The upstream body ended: whatever the client still needs to see a complete (or a
    /// visibly broken) stream.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        match &mut self.dir {
            Dir::ToChat(t) => t.finish(out),
            Dir::ToMessages(t) => t.finish(out),
            Dir::Responses { via, buf, t } => {
                if let Some(via) = via {
                    let (chat, scanner) = &mut **via;
                    chat.finish(buf);
                    rescan(scanner, buf, t, out);
                }
                t.finish(out);
            }
        }
    }

    /// The client's stream has ended (cleanly or with an in-band error).
    pub fn ended(&self) -> bool {
        match &self.dir {
            Dir::ToChat(t) => t.done,
            Dir::ToMessages(t) => t.stopped,
            Dir::Responses { t, .. } => t.done,
        }
    }

    /// The upstream body ending now would break the client's stream: neither the client's
    /// stream has ended nor has the upstream sent its finish (Anthropic `message_delta`
    /// with a stop reason, an OpenAI `finish_reason`). Mid-stream continuation takes such
    /// an end as a cut instead of letting [`Self::finish`] write the in-band error.
    pub fn incomplete(&self) -> bool {
        match &self.dir {
            Dir::ToChat(t) => !t.done && t.finish.is_none(),
            Dir::ToMessages(t) => !t.stopped && t.stop.is_none(),
            Dir::Responses { t, .. } => !t.done && t.finish.is_none(),
        }
    }

    /// The client's stream ended with an in-band error (the upstream sent one, or ended
    /// before its last event).
    pub fn broken(&self) -> bool {
        match &self.dir {
            Dir::ToChat(t) => t.broken,
            Dir::ToMessages(t) => t.broken,
            Dir::Responses { t, .. } => t.broken,
        }
    }
}

/// Feeds the chat chunks in `buf` (whole events) to the Responses translator.
fn rescan(scanner: &mut Scanner, buf: &mut Vec<u8>, t: &mut ToResponses, out: &mut Vec<u8>) {
    if buf.is_empty() {
        return;
    }
    scanner.feed(buf, &mut |r| {
        if let Ok(ev) = r {
            t.event_of(&ev, out);
        }
    });
    buf.clear();
}

// ---------------------------------------------------------------------------------------
// Anthropic events → OpenAI chunks
// ---------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct AEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    message: Option<AMessage<'a>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    content_block: Option<ABlock<'a>>,
    #[serde(default, borrow)]
    delta: Option<ADelta<'a>>,
    #[serde(default)]
    usage: Option<AUsage>,
    #[serde(default, borrow)]
    error: Option<AError<'a>>,
}

#[derive(Deserialize)]
struct AMessage<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<AUsage>,
}

#[derive(Deserialize)]
struct ABlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ADelta<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    thinking: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct AUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct AError<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

#[derive(Debug, Default)]
struct ToChat {
    include_usage: bool,
    created: u64,
    /// The message id and model, as JSON string literals.
    id: String,
    model: String,
    /// Anthropic content-block index → OpenAI tool-call index.
    tools: Vec<(u64, usize)>,
    input: u64,
    cache_read: u64,
    cache_creation: u64,
    output: u64,
    finish: Option<&'static str>,
    done: bool,
    broken: bool,
}

impl ToChat {
    fn head(&self, out: &mut Vec<u8>) {
        let id = if self.id.is_empty() { "\"\"" } else { &self.id };
        let model = if self.model.is_empty() {
            "\"\""
        } else {
            &self.model
        };
        let _ = write!(
            out,
            "data: {{\"id\":{id},\"object\":\"chat.completion.chunk\",\"created\":{},\"model\":{model},",
            self.created
        );
    }

    /// One chunk whose choice carries `delta` (a JSON object, written by `delta`).
    fn chunk(&self, out: &mut Vec<u8>, finish: Option<&str>, delta: impl FnOnce(&mut Vec<u8>)) {
        self.head(out);
        out.extend_from_slice(b"\"choices\":[{\"index\":0,\"delta\":");
        delta(out);
        match finish {
            Some(f) => {
                let _ = write!(out, ",\"finish_reason\":\"{f}\"}}]}}\n\n");
            }
            None => out.extend_from_slice(b",\"finish_reason\":null}]}\n\n"),
        }
    }

    fn take_usage(&mut self, u: &AUsage) {
        if let Some(v) = u.input_tokens {
            self.input = v;
        }
        if let Some(v) = u.output_tokens {
            self.output = v;
        }
        if let Some(v) = u.cache_read_input_tokens {
            self.cache_read = v;
        }
        if let Some(v) = u.cache_creation_input_tokens {
            self.cache_creation = v;
        }
    }

    fn tool_index(&self, block: u64) -> Option<usize> {
        self.tools
            .iter()
            .find(|(b, _)| *b == block)
            .map(|(_, i)| *i)
    }

    fn event(&mut self, ev: &Event<'_>, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let Some(data) = ev.data else {
            if ev.comment {
                out.extend_from_slice(b": ping\n\n");
            }
            return;
        };
        let Ok(e) = serde_json::from_slice::<AEvent<'_>>(data) else {
            return;
        };
        match &*e.kind {
            "message_start" => {
                if let Some(m) = &e.message {
                    self.id = json_string(m.id.as_deref().unwrap_or(""));
                    self.model = json_string(m.model.as_deref().unwrap_or(""));
                    if let Some(u) = &m.usage {
                        self.take_usage(u);
                    }
                }
                self.chunk(out, None, |o| {
                    o.extend_from_slice(b"{\"role\":\"assistant\",\"content\":\"\"}")
                });
            }
            "content_block_start" => {
                let Some(b) = &e.content_block else { return };
                let index = e.index.unwrap_or(0);
                match &*b.kind {
                    // A server tool (`server_tool_use`, web search) runs at Anthropic: not
                    // the client's tool call; it and its result blocks are left out, as a
                    // complete answer's are (`response::message_to_completion_obj`).
                    "tool_use" => {
                        let k = self.tools.len();
                        self.tools.push((index, k));
                        self.chunk(out, None, |o| {
                            let _ = write!(o, "{{\"tool_calls\":[{{\"index\":{k},\"id\":");
                            push_str(o, b.id.as_deref().unwrap_or(""));
                            o.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
                            push_str(o, b.name.as_deref().unwrap_or(""));
                            o.extend_from_slice(b",\"arguments\":\"\"}}]}");
                        });
                    }
                    "text" => {
                        if let Some(t) = b.text.as_deref().filter(|t| !t.is_empty()) {
                            self.content(out, "content", t);
                        }
                    }
                    "thinking" => {
                        if let Some(t) = b.thinking.as_deref().filter(|t| !t.is_empty()) {
                            self.content(out, "reasoning_content", t);
                        }
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let Some(d) = &e.delta else { return };
                match d.kind.as_deref() {
                    Some("text_delta") => {
                        self.content(out, "content", d.text.as_deref().unwrap_or(""));
                    }
                    Some("thinking_delta") => {
                        self.content(
                            out,
                            "reasoning_content",
                            d.thinking.as_deref().unwrap_or(""),
                        );
                    }
                    Some("input_json_delta") => {
                        let Some(k) = self.tool_index(e.index.unwrap_or(0)) else {
                            return;
                        };
                        let pj = d.partial_json.as_deref().unwrap_or("");
                        self.chunk(out, None, |o| {
                            let _ = write!(
                                o,
                                "{{\"tool_calls\":[{{\"index\":{k},\"function\":{{\"arguments\":"
                            );
                            push_str(o, pj);
                            o.extend_from_slice(b"}}]}");
                        });
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(u) = &e.usage {
                    self.take_usage(u);
                }
                let stop = e.delta.as_ref().and_then(|d| d.stop_reason.as_deref());
                if let Some(s) = stop {
                    let f = finish_reason_of(s);
                    self.finish = Some(f);
                    self.chunk(out, Some(f), |o| o.extend_from_slice(b"{}"));
                }
            }
            "message_stop" => self.end(out),
            "ping" => out.extend_from_slice(b": ping\n\n"),
            "error" => {
                let (kind, message) = match &e.error {
                    Some(err) => (err.kind.as_deref(), err.message.as_deref()),
                    None => (None, None),
                };
                self.error(
                    out,
                    kind.unwrap_or("api_error"),
                    message.unwrap_or("upstream error"),
                );
            }
            _ => {}
        }
    }

    fn content(&self, out: &mut Vec<u8>, field: &str, text: &str) {
        self.chunk(out, None, |o| {
            let _ = write!(o, "{{\"{field}\":");
            push_str(o, text);
            o.push(b'}');
        });
    }

    fn error(&mut self, out: &mut Vec<u8>, kind: &str, message: &str) {
        let t = match kind {
            "overloaded_error" | "api_error" => "server_error",
            k => k,
        };
        out.extend_from_slice(b"data: {\"error\":{\"message\":");
        push_str(out, message);
        out.extend_from_slice(b",\"type\":");
        push_str(out, t);
        out.extend_from_slice(b",\"code\":");
        push_str(out, kind);
        out.extend_from_slice(b"}}\n\n");
        self.done = true;
        self.broken = true;
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        if self.include_usage {
            let prompt = self
                .input
                .saturating_add(self.cache_read)
                .saturating_add(self.cache_creation);
            self.head(out);
            let _ = write!(
                out,
                "\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{},\"total_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":{},\"cache_creation_tokens\":{}}}}}}}\n\n",
                self.output,
                prompt.saturating_add(self.output),
                self.cache_read,
                self.cache_creation
            );
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        self.done = true;
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if self.finish.is_some() {
            self.end(out);
        } else {
            self.error(
                out,
                "api_error",
                "the upstream stream ended before message_stop",
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// OpenAI chunks → Anthropic events
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
    /// A tool call (its OpenAI index).
    Tool(u64),
}

#[derive(Debug, Default)]
struct ToMessages {
    started: bool,
    stopped: bool,
    /// The open content block and its index.
    open: Option<(Open, u64)>,
    next_block: u64,
    /// OpenAI tool-call index → Anthropic block index.
    tools: Vec<(u64, u64)>,
    stop: Option<&'static str>,
    input: u64,
    output: u64,
    cache_read: u64,
    cache_creation: u64,
    broken: bool,
}

impl ToMessages {
    fn event(&mut self, ev: &Event<'_>, out: &mut Vec<u8>) {
        if self.stopped {
            return;
        }
        let Some(data) = ev.data else {
            if ev.comment && self.started {
                out.extend_from_slice(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
            }
            return;
        };
        if data.trim_ascii() == b"[DONE]" {
            self.close(out);
            return;
        }
        let Ok(c) = serde_json::from_slice::<OChunk<'_>>(data) else {
            return;
        };
        if let Some(err) = &c.error {
            // `{"error": "text"}` (some OpenAI-compatible servers) carries the message only.
            let message = err
                .get("message")
                .unwrap_or(err)
                .as_str()
                .unwrap_or("upstream error");
            self.error(out, error::anthropic_type_of_openai(err), message);
            return;
        }
        if !self.started {
            self.start(out, c.id.as_deref(), c.model.as_deref());
        }
        if let Some(u) = &c.usage {
            self.input = u.prompt_tokens.unwrap_or(0);
            self.output = u.completion_tokens.unwrap_or(0);
            if let Some(d) = &u.prompt_tokens_details {
                self.cache_read = d.cached_tokens.unwrap_or(0);
                self.cache_creation = d.cache_creation_tokens.unwrap_or(0);
            }
            self.input = self
                .input
                .saturating_sub(self.cache_read.saturating_add(self.cache_creation));
        }
        for choice in c.choices.iter().flatten() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(d) = &choice.delta {
                let reasoning = d.reasoning_content.as_deref().or(d.reasoning.as_deref());
                if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
                    let i = self.ensure(out, Open::Thinking);
                    self.delta(out, i, "thinking_delta", "thinking", r);
                }
                for text in [d.content.as_deref(), d.refusal.as_deref()]
                    .into_iter()
                    .flatten()
                {
                    if !text.is_empty() {
                        let i = self.ensure(out, Open::Text);
                        self.delta(out, i, "text_delta", "text", text);
                    }
                }
                for t in d.tool_calls.iter().flatten() {
                    self.tool(out, t);
                }
            }
            if let Some(f) = choice.finish_reason.as_deref() {
                self.stop = Some(stop_reason_of(f));
                self.close_block(out);
            }
        }
    }

    fn start(&mut self, out: &mut Vec<u8>, id: Option<&str>, model: Option<&str>) {
        self.started = true;
        out.extend_from_slice(
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":",
        );
        push_str(out, id.unwrap_or(""));
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        push_str(out, model.unwrap_or(""));
        out.extend_from_slice(
            b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n",
        );
    }

    fn tool(&mut self, out: &mut Vec<u8>, t: &OToolDelta<'_>) {
        let k = t.index.unwrap_or(0);
        let known = self.tools.iter().find(|(o, _)| *o == k).map(|(_, b)| *b);
        let block = match known {
            Some(b) => b,
            None => {
                self.close_block(out);
                let b = self.next_block;
                self.next_block += 1;
                self.tools.push((k, b));
                self.open = Some((Open::Tool(k), b));
                let name = t.function.as_ref().and_then(|f| f.name.as_deref());
                let _ = write!(
                    out,
                    "event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":{b},\"content_block\":{{\"type\":\"tool_use\",\"id\":"
                );
                push_str(out, t.id.as_deref().unwrap_or(""));
                out.extend_from_slice(b",\"name\":");
                push_str(out, name.unwrap_or(""));
                out.extend_from_slice(b",\"input\":{}}}\n\n");
                b
            }
        };
        if let Some(args) = t
            .function
            .as_ref()
            .and_then(|f| f.arguments.as_deref())
            .filter(|a| !a.is_empty())
        {
            self.delta(out, block, "input_json_delta", "partial_json", args);
        }
    }

    /// The block of `kind` is open (another one is stopped first); its index.
    fn ensure(&mut self, out: &mut Vec<u8>, kind: Open) -> u64 {
        if let Some((k, i)) = self.open
            && k == kind
        {
            return i;
        }
        self.close_block(out);
        let i = self.next_block;
        self.next_block += 1;
        self.open = Some((kind, i));
        let block = match kind {
            Open::Thinking => "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}",
            _ => "{\"type\":\"text\",\"text\":\"\"}",
        };
        let _ = write!(
            out,
            "event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":{i},\"content_block\":{block}}}\n\n"
        );
        i
    }

    /// One `content_block_delta`, written piece by piece (no formatting machinery: this
    /// runs once per streamed token).
    fn delta(&self, out: &mut Vec<u8>, index: u64, kind: &str, field: &str, value: &str) {
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        push_u64(out, index);
        out.extend_from_slice(b",\"delta\":{\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"");
        out.extend_from_slice(field.as_bytes());
        out.extend_from_slice(b"\":");
        push_str(out, value);
        out.extend_from_slice(b"}}\n\n");
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        if let Some((_, i)) = self.open.take() {
            let _ = write!(
                out,
                "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":{i}}}\n\n"
            );
        }
    }

    /// Ends the message: the open block, `message_delta` with the stop reason and usage,
    /// `message_stop`.
    fn close(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.start(out, None, None);
        }
        self.close_block(out);
        let stop = self.stop.unwrap_or("end_turn");
        let _ = write!(
            out,
            "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{stop}\",\"stop_sequence\":null}},\"usage\":{{\"input_tokens\":{},\"output_tokens\":{},\"cache_read_input_tokens\":{},\"cache_creation_input_tokens\":{}}}}}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n",
            self.input, self.output, self.cache_read, self.cache_creation
        );
        self.stopped = true;
    }

    fn error(&mut self, out: &mut Vec<u8>, kind: &str, message: &str) {
        out.extend_from_slice(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":");
        push_str(out, kind);
        out.extend_from_slice(b",\"message\":");
        push_str(out, message);
        out.extend_from_slice(b"}}\n\n");
        self.stopped = true;
        self.broken = true;
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        if self.stopped {
            return;
        }
        if self.stop.is_some() {
            self.close(out);
        } else {
            self.error(
                out,
                "api_error",
                "the upstream stream ended before its finish_reason",
            );
        }
    }
}
