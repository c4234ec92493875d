//! Mid-stream continuation (`stream_recovery.continue_mid_stream`, spec B §7.3, issue 11
//! item 6, issue 15 items 3 and 5): an event stream on chat completions or messages, or on
//! responses translated from a Chat Completions or Anthropic provider, that breaks after its
//! first client byte (an upstream cut, a content stall, a broken frame, the idle or active
//! budget) is not ended at once; the walk asks the next candidate to continue it, with the
//! text the client already holds as an assistant prefill, and splices that answer into the
//! open client stream. The splice works on the client's format: a part served by a provider
//! of the other format goes through it after its translation (`proxy::translate`), so any
//! part may be of either format. `openai.rs`, `anthropic.rs` and `responses.rs` hold the
//! three client shapes.
//!
//! A [`Splice`] follows one client stream across its parts:
//! - **the original part** goes out as it comes, but only in whole events (an event cut by
//!   the upstream's failure never reaches the client half-written); its text deltas are
//!   recorded. A tool call (OpenAI `tool_calls`, Anthropic `tool_use` / `input_json_delta`)
//!   or a finished answer makes the stream not continuable: it ends as before, with the
//!   in-band error.
//! - **a prefill part** (the body of [`Splice::prefill_body`]): its lifecycle frames the
//!   client already had are dropped (OpenAI role-only chunks, Anthropic `message_start`,
//!   `ping`, the `content_block_start` of the block the client has open), reasoning is
//!   dropped, chunk ids become the first part's, block indices are mapped onto the client's.
//!   Its first text is held until [`OVERLAP_WINDOW`] characters (or a non-text frame) are
//!   here; when it begins with at least [`MIN_OVERLAP`] characters that end the delivered
//!   text, those are skipped.
//! - **a replay part**: when the prefill was refused (a 400 saying so), the original request
//!   is sent again to the same candidate, and its answer is used only if it repeats the
//!   delivered text exactly: that much is skipped and the rest streamed; any difference
//!   ends the stream with the in-band error.
//!
//! The usage block the client gets covers the whole answer: the prompt counted once (the
//! first part's, else the replay's, else the prefill part's minus the prefill) and the
//! completion tokens of every part (a part cut before it reported usage counts one token
//! per text delta — an estimate, see docs/compat.md).

mod anthropic;
mod openai;
mod responses;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};

use super::After;
use super::respond::stream_error_event;
use crate::config::ConnectionId;
use crate::error::{ErrorKind, GatewayError};
use crate::http1::{Persist, write_chunk};
use crate::net::io::{ClientStream, write_all};
use crate::owners::Req;
use crate::providers::Endpoint;
use crate::routing::resolve::Target;
use crate::shard::metrics::bump;
use crate::sse::Scanner;

/// Shortest repeated text recognised as an overlap (spec B §7.3).
pub const MIN_OVERLAP: usize = 8;
/// How much of a prefill part's text is held to look for an overlap (bytes), and the
/// longest overlap looked for.
pub const OVERLAP_WINDOW: usize = 160;
/// The longest event the splice holds while waiting for its end; a longer one turns the
/// splice off for the stream (it is relayed as it comes, and a failure ends the stream).
const MAX_HELD_BYTES: usize = crate::sse::DEFAULT_MAX_EVENT_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The first upstream's answer, relayed as it comes (whole events).
    Original,
    /// A prefill part, its first text held to look for an overlap.
    Prefill,
    /// A replay of the original request, its text compared with the delivered text.
    Replay,
    /// A later part past its overlap or repeated prefix: streamed, still transformed.
    Pass,
}

/// What a Responses splice keeps besides the shared state.
#[derive(Debug, Default)]
struct Responses {
    /// The next `sequence_number` of the client's stream.
    seq: u64,
    /// The first part's response `id` and `created_at`.
    id: Option<Value>,
    created_at: Option<Value>,
    /// The client's open message item: its id, where its text starts in the delivered
    /// text, and the content index of its text part.
    msg_id: Option<String>,
    msg_start: usize,
    msg_content: u64,
    /// The client's output index the current part's message item goes on in (the open
    /// message item carried over from an earlier part).
    carried: Option<u64>,
    /// Finished output items, at the client's output indices (`response.completed`'s
    /// `output`).
    items: Vec<(u64, Value)>,
}

/// A text event of a prefill part held back while the overlap is not decided.
struct Held {
    name: Option<String>,
    json: Value,
    text: String,
}

pub struct Splice {
    endpoint: Endpoint,
    /// What the client's response head said about keep-alive.
    keep_alive: Persist,
    phase: Phase,
    /// Tool calls or a finished answer seen, or an oversize event: no continuation.
    off: bool,
    /// Bytes of an event whose end has not arrived.
    held: BytesMut,
    /// The answer text the client holds.
    delivered: String,
    /// The failure that cut the stream, waiting for the next candidate.
    cut: Option<GatewayError>,
    /// The stream cannot go on (a replay that does not repeat the delivered text).
    failed: Option<GatewayError>,
    replayed: bool,
    // Usage: the prompt (counted once) and the completion tokens of finished parts.
    prompt: Option<u64>,
    completion_before: u64,
    /// Some part reported usage.
    reported: bool,
    /// Text deltas of the current part (the estimate when it reports no usage).
    part_deltas: u64,
    part_completion: Option<u64>,
    // Prefill part: its held text events; replay part: bytes of `delivered` matched.
    pending: Vec<Held>,
    pending_len: usize,
    matched: usize,
    /// Trailing whitespace of the delivered text left out of an Anthropic prefill.
    trimmed: usize,
    /// The candidate whose stream was cut last (a combo finds its place in the plan).
    cut_on: Option<(Target, ConnectionId)>,
    /// OpenAI: the first part's chunk id.
    id: Option<String>,
    /// Anthropic: the index of the text block the client has open, the next free index, and
    /// the current part's block indices mapped to the client's (`None`: dropped).
    open_block: Option<u64>,
    next_block: u64,
    blocks: Vec<(u64, Option<u64>)>,
    /// Responses (the output items play the part of Anthropic's blocks above: `open_block`
    /// is the client's open message item, `blocks` maps the part's output indices).
    resp: Responses,
}

impl Splice {
    /// A splice for a stream on `endpoint` whose first part is `translated` (from a
    /// provider of the other format) or not; `None` for streams continuation does not
    /// serve. A `/v1/responses` stream is continued only when it is translated: one relayed
    /// as it is from a provider serving the Responses API names a response that provider
    /// stores (`previous_response_id` would later find it without the continuation's
    /// text), and may carry items no continuation can restate (encrypted reasoning,
    /// built-in tool calls).
    pub fn new(endpoint: Endpoint, translated: bool) -> Option<Splice> {
        let served = match endpoint {
            Endpoint::ChatCompletions | Endpoint::Messages => true,
            Endpoint::Responses => translated,
            _ => false,
        };
        if !served {
            return None;
        }
        Some(Splice {
            endpoint,
            keep_alive: Persist::Close,
            phase: Phase::Original,
            off: false,
            held: BytesMut::new(),
            delivered: String::new(),
            cut: None,
            failed: None,
            replayed: false,
            prompt: None,
            completion_before: 0,
            reported: false,
            part_deltas: 0,
            part_completion: None,
            pending: Vec::new(),
            pending_len: 0,
            matched: 0,
            trimmed: 0,
            cut_on: None,
            id: None,
            open_block: None,
            next_block: 0,
            blocks: Vec::new(),
            resp: Responses::default(),
        })
    }

    /// A later part: the client has the head, the stream is chunked.
    pub fn continuing(&self) -> bool {
        self.phase != Phase::Original
    }

    pub fn keep_alive(&self) -> Persist {
        self.keep_alive
    }

    /// What the client's response head said about keep-alive (the original part's).
    pub fn set_keep_alive(&mut self, keep_alive: Persist) {
        self.keep_alive = keep_alive;
    }

    /// The stream cannot be continued (not chunked, not an event stream): relayed as it
    /// comes.
    pub fn turn_off(&mut self) {
        self.off = true;
    }

    /// Takes in the failure that broke the stream; true when the walk should look for a
    /// continuation (the splice keeps it), false when the stream ends here.
    pub fn cut_by(&mut self, e: &GatewayError) -> bool {
        if self.off || self.failed.is_some() || e.kind == ErrorKind::ShuttingDown {
            return false;
        }
        self.cut = Some(e.clone());
        true
    }

    /// Notes the candidate whose stream was cut.
    pub fn cut_on(&mut self, target: &Target, connection: ConnectionId) {
        self.cut_on = Some((target.clone(), connection));
    }

    /// The candidate whose stream was cut last.
    pub fn cut_candidate(&self) -> Option<&(Target, ConnectionId)> {
        self.cut_on.as_ref()
    }

    /// The stream was cut or is being continued: its usage is the splice's to count.
    pub fn spliced(&self) -> bool {
        self.continuing() || self.cut_pending()
    }

    /// Adds the whole answer's usage (what the client's usage block says) to the token
    /// counters, once, when the spliced stream is over; nothing when no part reported usage.
    pub fn count_usage(&mut self, shard: &Req<'_>) {
        if !std::mem::take(&mut self.reported) {
            return;
        }
        let (prompt, completion) = self.totals(self.part_completion.unwrap_or(self.part_deltas));
        let m = shard.metrics();
        crate::shard::metrics::add_one_writer(&m.usage_prompt_tokens, prompt);
        crate::shard::metrics::add_one_writer(&m.usage_completion_tokens, completion);
    }

    /// The prompt tokens a cut part's upstream reported in its own format: a translated
    /// part's client events may not carry them (an Anthropic `message_start` becomes an
    /// OpenAI role chunk). Taken as the whole answer's prompt when the part asked with the
    /// original request (the first part or a replay) and nothing better is known.
    pub fn upstream_prompt(&mut self, prompt: u64) {
        if self.prompt.is_none()
            && prompt > 0
            && matches!(self.phase, Phase::Original | Phase::Replay)
        {
            self.prompt = Some(prompt);
            self.reported = true;
        }
    }

    /// The stream was cut and waits for a continuation.
    pub fn cut_pending(&self) -> bool {
        self.cut.is_some()
    }

    /// The failure that ended the stream for good, once (a replay that differs).
    pub fn failure(&mut self) -> Option<GatewayError> {
        self.failed.take()
    }

    pub fn has_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// An error answer from a prefill part's target: whether it refused the prefill, so the
    /// original request goes to it once more (once per stream).
    pub fn wants_replay(&self, status: u16, body: &[u8]) -> bool {
        self.phase == Phase::Prefill && !self.replayed && refuses_prefill(status, body)
    }

    /// Starts the next part: a prefill part, or (`replay`) the original request again.
    pub fn begin(&mut self, replay: bool) {
        self.completion_before += self.part_completion.unwrap_or(self.part_deltas);
        if replay {
            // The replay's own count covers the text it repeats.
            self.completion_before = 0;
            self.replayed = true;
            self.matched = 0;
            self.phase = Phase::Replay;
        } else {
            self.phase = Phase::Prefill;
        }
        self.cut = None;
        self.held.clear();
        self.part_deltas = 0;
        self.part_completion = None;
        self.pending.clear();
        self.pending_len = 0;
        self.blocks.clear();
        self.resp.carried = None;
    }

    /// The error that ends the stream when no continuation comes.
    pub fn take_cut(&mut self) -> Option<GatewayError> {
        self.cut.take()
    }

    /// The original request (in the client's format) with the delivered text as an
    /// assistant prefill: a trailing assistant message (an existing trailing assistant
    /// message is extended). `for_anthropic`: the candidate speaks Anthropic (the body is
    /// then translated for it when the client does not), which refuses a prefill ending in
    /// whitespace, so that is left out (and skipped if the continuation starts with it).
    /// `None` when the body is not a JSON object with `messages`.
    pub fn prefill_body(&mut self, original: &[u8], for_anthropic: bool) -> Option<Bytes> {
        let mut body: Value = serde_json::from_slice(original).ok()?;
        let mut text = self.delivered.clone();
        self.trimmed = 0;
        if for_anthropic {
            let kept = text.trim_end().len();
            self.trimmed = text.len() - kept;
            text.truncate(kept);
        }
        if self.endpoint == Endpoint::Responses {
            Self::prefill_responses(&mut body, text)?;
            return serde_json::to_vec(&body).ok().map(Bytes::from);
        }
        let messages = body.get_mut("messages")?.as_array_mut()?;
        let last_assistant = messages
            .last()
            .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
        match messages.last_mut().and_then(|m| m.get_mut("content")) {
            Some(Value::String(s)) if last_assistant => s.push_str(&text),
            Some(Value::Array(parts)) if last_assistant => {
                parts.push(json!({"type": "text", "text": text}));
            }
            _ => messages.push(json!({"role": "assistant", "content": text})),
        }
        serde_json::to_vec(&body).ok().map(Bytes::from)
    }

    /// Passes a piece of the upstream stream: what the client may have now is appended to
    /// `out` (chunk-framed when `chunked`).
    pub fn pass(&mut self, piece: &[u8], out: &mut BytesMut, chunked: bool) {
        if self.off && self.phase == Phase::Original {
            if !self.held.is_empty() {
                let held = self.held.split();
                put_piece(out, &held, chunked);
            }
            put_piece(out, piece, chunked);
            return;
        }
        if self.failed.is_some() {
            return;
        }
        self.held.extend_from_slice(piece);
        let end = last_event_end(&self.held);
        if end == 0 {
            if self.held.len() > MAX_HELD_BYTES && self.phase == Phase::Original {
                self.off = true;
                let held = self.held.split();
                put_piece(out, &held, chunked);
            }
            return;
        }
        let complete = self.held.split_to(end);
        let mut events: Vec<(Option<String>, Option<Vec<u8>>)> = Vec::new();
        Scanner::default().feed(&complete, &mut |r| {
            if let Ok(ev) = r {
                events.push((
                    ev.name.map(|n| String::from_utf8_lossy(n).into_owned()),
                    ev.data.map(<[u8]>::to_vec),
                ));
            }
        });
        if self.phase == Phase::Original {
            for (name, data) in events {
                self.record(name.as_deref(), data.as_deref());
            }
            put_piece(out, &complete, chunked);
            return;
        }
        for (name, data) in events {
            self.transform(name, data, out);
            if self.failed.is_some() {
                return;
            }
        }
    }

    /// The upstream ended its part cleanly: anything still held goes out.
    pub fn finish(&mut self, out: &mut BytesMut, chunked: bool) {
        if self.phase == Phase::Prefill {
            self.decide(out);
        }
        if self.phase == Phase::Replay && self.failed.is_none() {
            self.fail("the re-sent request's answer ended before repeating the text already sent");
        }
        if !self.held.is_empty() && self.failed.is_none() {
            let held = self.held.split();
            put_piece(out, &held, chunked);
        }
    }

    fn fail(&mut self, why: &str) {
        self.failed = Some(GatewayError::new(
            ErrorKind::UpstreamProtocol,
            format!("mid-stream continuation failed: {why}"),
        ));
    }

    /// Records one event of the original part.
    fn record(&mut self, name: Option<&str>, data: Option<&[u8]>) {
        let Some(v) = data.and_then(|d| serde_json::from_slice::<Value>(d).ok()) else {
            return;
        };
        match self.endpoint {
            Endpoint::Messages => self.record_anthropic(name, &v),
            Endpoint::Responses => self.record_responses(name, &v),
            _ => self.record_openai(&v),
        }
    }

    /// A usage report of the current part.
    fn note_usage(&mut self, prompt: Option<u64>, completion: Option<u64>) {
        self.reported |= prompt.is_some() || completion.is_some();
        if let Some(c) = completion {
            self.part_completion = Some(c);
        }
        if self.prompt.is_none()
            && let Some(p) = prompt
        {
            self.prompt = Some(match self.phase {
                // The prefill part's prompt includes the delivered text.
                Phase::Prefill | Phase::Pass if !self.replayed => {
                    p.saturating_sub(self.completion_before)
                }
                _ => p,
            });
        }
    }

    /// The whole answer's usage: (prompt, completion).
    fn totals(&self, reported_completion: u64) -> (u64, u64) {
        (
            self.prompt.unwrap_or(0),
            self.completion_before.saturating_add(reported_completion),
        )
    }

    /// One event of a later part.
    fn transform(&mut self, name: Option<String>, data: Option<Vec<u8>>, out: &mut BytesMut) {
        let Some(data) = data else {
            return; // comments and bare names: nothing the client needs
        };
        if data.as_slice() == b"[DONE]" {
            self.flush_before(out);
            if self.failed.is_none() {
                put_piece(out, b"data: [DONE]\n\n", true);
            }
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(&data) else {
            return;
        };
        match self.endpoint {
            Endpoint::Messages => self.transform_anthropic(name, v, out),
            Endpoint::Responses => self.transform_responses(name, v, out),
            _ => self.transform_openai(v, out),
        }
    }

    /// A text-bearing event of a later part (its text already read out).
    fn text_event(&mut self, name: Option<String>, v: Value, text: String, out: &mut BytesMut) {
        self.part_deltas += 1;
        match self.phase {
            Phase::Prefill => {
                self.pending_len += text.len();
                self.pending.push(Held {
                    name,
                    json: v,
                    text,
                });
                if self.pending_len >= OVERLAP_WINDOW {
                    self.decide(out);
                }
            }
            Phase::Replay => {
                let rest = &self.delivered[self.matched..];
                if rest.len() >= text.len() {
                    if rest.as_bytes().starts_with(text.as_bytes()) {
                        self.matched += text.len();
                        if self.matched == self.delivered.len() {
                            self.phase = Phase::Pass;
                        }
                    } else {
                        self.fail(
                            "the re-sent request's answer differs from the text already sent",
                        );
                    }
                } else if text.as_bytes().starts_with(rest.as_bytes()) {
                    let skip = rest.len();
                    self.matched = self.delivered.len();
                    self.phase = Phase::Pass;
                    self.delivered.push_str(&text[skip..]);
                    let v = with_text(self.endpoint, v, &text[skip..]);
                    self.send(out, name.as_deref(), v);
                } else {
                    self.fail("the re-sent request's answer differs from the text already sent");
                }
            }
            Phase::Pass | Phase::Original => {
                self.delivered.push_str(&text);
                self.send(out, name.as_deref(), v);
            }
        }
    }

    /// Before a frame that is not a text delta: a prefill part decides its overlap; a replay
    /// that has not repeated the whole delivered text yet has failed.
    fn flush_before(&mut self, out: &mut BytesMut) {
        match self.phase {
            Phase::Prefill => self.decide(out),
            Phase::Replay if self.matched < self.delivered.len() => {
                self.fail(
                    "the re-sent request's answer ended before repeating the text already sent",
                );
            }
            _ => {}
        }
    }

    /// Decides a prefill part's overlap and sends its held text without it.
    fn decide(&mut self, out: &mut BytesMut) {
        let text: String = self.pending.iter().map(|h| h.text.as_str()).collect();
        let mut skip = overlap(
            &self.delivered[..self.delivered.len() - self.trimmed],
            &text,
        );
        if self.trimmed > 0 {
            let ws = &self.delivered[self.delivered.len() - self.trimmed..];
            if text[skip..].starts_with(ws) {
                skip += ws.len();
            }
        }
        self.phase = Phase::Pass;
        for h in std::mem::take(&mut self.pending) {
            let cut = skip.min(h.text.len());
            skip -= cut;
            if cut == h.text.len() {
                continue;
            }
            self.delivered.push_str(&h.text[cut..]);
            let v = with_text(self.endpoint, h.json, &h.text[cut..]);
            self.send(out, h.name.as_deref(), v);
        }
        self.pending_len = 0;
    }

    /// Appends one event of a later part; a Responses event gets the next sequence number
    /// of the client's stream (held events are numbered when they go out).
    fn send(&mut self, out: &mut BytesMut, name: Option<&str>, mut v: Value) {
        if self.endpoint == Endpoint::Responses {
            self.resp.number(&mut v);
        }
        emit(out, name, &v);
    }
}

/// No candidate went on with a cut stream: it ends with the in-band error event in the
/// endpoint's shape and a close without the chunked terminator (as any broken stream).
pub async fn give_up(
    shard: &Req<'_>,
    splice: Option<&mut Splice>,
    cut: &GatewayError,
    endpoint: Endpoint,
    client: &mut ClientStream,
) -> After {
    bump(&shard.metrics().streams_broken);
    if let Some(s) = splice {
        s.count_usage(shard);
    }
    let err = GatewayError::new(
        cut.kind,
        format!("{}; no candidate could continue the stream", cut.message),
    );
    tracing::warn!("stream broken after the first byte: {}", err.message);
    let mut out = BytesMut::with_capacity(256);
    put_piece(
        &mut out,
        stream_error_event(&err, endpoint).as_bytes(),
        true,
    );
    let _ = write_all(client, out).await;
    After::Close
}

/// The longest start of `next` (at least [`MIN_OVERLAP`] bytes, at most
/// [`OVERLAP_WINDOW`], on character boundaries) that ends `delivered`; 0 when none.
fn overlap(delivered: &str, next: &str) -> usize {
    let longest = next.len().min(delivered.len()).min(OVERLAP_WINDOW);
    (MIN_OVERLAP..=longest)
        .rev()
        .find(|&k| next.is_char_boundary(k) && delivered.ends_with(&next[..k]))
        .unwrap_or(0)
}

/// `v` with its text delta replaced by `text`.
fn with_text(endpoint: Endpoint, mut v: Value, text: &str) -> Value {
    let path = match endpoint {
        Endpoint::Messages => "/delta/text",
        Endpoint::Responses => "/delta",
        _ => "/choices/0/delta/content",
    };
    if let Some(slot) = v.pointer_mut(path) {
        *slot = Value::String(text.to_owned());
    }
    v
}

/// Appends one event (chunk-framed: a later part always writes into a chunked stream).
fn emit(out: &mut BytesMut, name: Option<&str>, v: &Value) {
    let mut ev = Vec::with_capacity(256);
    if let Some(n) = name {
        ev.extend_from_slice(b"event: ");
        ev.extend_from_slice(n.as_bytes());
        ev.push(b'\n');
    }
    ev.extend_from_slice(b"data: ");
    ev.extend_from_slice(v.to_string().as_bytes());
    ev.extend_from_slice(b"\n\n");
    put_piece(out, &ev, true);
}

/// Appends a piece for the client, as one chunk when `chunked`.
fn put_piece(out: &mut BytesMut, piece: &[u8], chunked: bool) {
    if chunked {
        write_chunk(out, piece);
    } else {
        out.extend_from_slice(piece);
    }
}

/// The end of the last complete event in `buf` (just past its blank line), 0 when none.
fn last_event_end(buf: &[u8]) -> usize {
    (1..buf.len())
        .rev()
        .find(|&i| {
            buf[i] == b'\n'
                && (buf[i - 1] == b'\n' || (i >= 2 && buf[i - 1] == b'\r' && buf[i - 2] == b'\n'))
        })
        .map_or(0, |i| i + 1)
}

/// A 400 that says the model does not take an assistant prefill.
pub fn refuses_prefill(status: u16, body: &[u8]) -> bool {
    if status != 400 {
        return false;
    }
    let text = String::from_utf8_lossy(body).to_lowercase();
    text.contains("prefill")
        || text.contains("end with a user message")
        || text.contains("final message must be")
}

#[cfg(test)]
mod tests;
