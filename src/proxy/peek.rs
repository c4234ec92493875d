//! Peek: owns reading the few routing fields (`model`, `stream`, `tools`) out of a JSON
//! request body, and splicing a new `model` into the body without re-serializing it.
//!
//! # How
//!
//! 0. A body of at most [`scan::SCAN_MAX_BYTES`] (the usual chat request is a few hundred
//!    bytes) is first read by [`scan::scan`], one validating pass over its bytes with no
//!    copy and no tape (~1 900 instructions against ~3 100 for the steps below on the perf
//!    load's 200-byte body). It answers only for bodies it can vouch for, and then exactly
//!    what the steps below answer; any other body (an escape in a top-level key or in the
//!    model, a number near simd-json's limits, an error of any kind) goes on to step 1.
//! 1. The body is copied into the caller's per-shard `scratch` buffer (simd-json unescapes
//!    strings in place) followed by [`simd_json::INPUT_PADDING`] bytes of padding, and
//!    [`simd_json::fill_tape_padded`] validates it and builds a tape. The parser's own
//!    buffers and the tape live in a thread-local `ParserState`: with one shard per thread
//!    that is per-shard state, so a warm call allocates nothing (but a `model` longer than
//!    `model_name::INLINE_BYTES`).
//! 2. The top-level members are walked on the tape (O(number of top-level members), nested
//!    values are skipped by their node count) to read `model`, `stream` and `tools`, and to
//!    learn the *ordinal* of the `model` member. Keys are compared after JSON unescaping,
//!    so `"mod\u0065l"` is the key `model`, exactly as simd-json decodes it.
//! 3. The byte range of that member's value is found by walking the top-level members to
//!    that ordinal. Keys are never compared here (simd-json already did that), members are
//!    only counted. The fast path, `member_value_span_structural`, walks the structural
//!    indexes simd-json's stage 1 left in its buffers (`{}[]:,` and the first byte of every
//!    string and scalar), so string contents cost nothing: ~3 µs instead of ~35 µs for the
//!    byte walk on a 64 KiB chat body. `member_value_span`, a byte scanner of our own
//!    (strings with escapes, nested containers), is the fallback should the indexes ever not
//!    describe the member, and the reference the fast path is tested against. Both run only
//!    on bodies simd-json accepted, and both are written so that any disagreement is an
//!    error, never a panic or a wrong span: the span must start with a quote.
//!
//! # Decisions
//!
//! - **Duplicate keys.** A top-level `model`, `stream`, `tools` or `background` key that appears more than
//!   once is rejected as [`PeekError::InvalidJson`]. JSON parsers disagree on which duplicate
//!   wins (first wins on simd-json's tape, last wins in serde_json, JavaScript and Python),
//!   so routing on one copy while the upstream reads the other would let a client pick a
//!   model its key was not routed for. Duplicates of other keys are left alone: we never
//!   read them and forward the bytes unchanged.
//! - **`stream: null`** is read as `false`: the OpenAI schema declares `stream` nullable with
//!   default `false`. Any other non-boolean is [`PeekError::StreamNotBool`].
//! - **`has_tools`** is `true` when `tools` is a non-empty array, or (defensively, as the
//!   emergency fallback only runs on requests without tools) a non-empty object. Absent,
//!   `null`, `[]`, `{}` and scalars are `false`.
//! - **A valid non-object document** (array, string, number, ...) is
//!   [`PeekError::NotAnObject`]; anything that is not JSON is [`PeekError::InvalidJson`].
//! - **simd-json limits** apply: nesting deeper than [`simd_json::DEFAULT_MAX_DEPTH`] (1024)
//!   and integer literals outside the `i64`/`u64` range (e.g. `100000000000000000000`) are
//!   rejected as invalid JSON, where serde_json would accept the latter as a float.
//! - **Memory.** `scratch` keeps its capacity (the largest body seen). The thread-local
//!   parser state keeps its capacity too, except after a body larger than
//!   [`PARSER_RETAIN_MAX_BYTES`], when it is dropped so one huge request does not pin
//!   several times its size per shard for the life of the process.

use std::cell::RefCell;
use std::fmt;
use std::ops::Range;

use bytes::{BufMut, Bytes};
use simd_json::prelude::{ValueAsScalar as _, ValueIntoString as _};
use simd_json::{Buffers, ErrorType, Tape};

use crate::routing::model_name::ModelName;

mod fields;
pub mod scan;

pub use fields::Peek;

/// Bodies up to this size leave the thread-local parser buffers allocated for the next
/// call; after a larger body they are freed (the next call allocates afresh).
pub const PARSER_RETAIN_MAX_BYTES: usize = 1024 * 1024;

/// Why a body could not be peeked. Every variant maps to a 400 for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeekError {
    /// Not valid JSON (or a duplicated routing key, see the module doc). The reason is short
    /// and never quotes body content.
    InvalidJson(String),
    /// Valid JSON, but the top-level value is not an object.
    NotAnObject,
    /// The top-level object has no `model` key.
    MissingModel,
    /// The top-level `model` is not a string.
    ModelNotString,
    /// The top-level `stream` is neither a boolean nor `null`.
    StreamNotBool,
}

impl fmt::Display for PeekError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeekError::InvalidJson(reason) => write!(f, "request body is not valid JSON: {reason}"),
            PeekError::NotAnObject => f.write_str("request body must be a JSON object"),
            PeekError::MissingModel => f.write_str("request body has no `model`"),
            PeekError::ModelNotString => f.write_str("`model` must be a string"),
            PeekError::StreamNotBool => f.write_str("`stream` must be a boolean"),
        }
    }
}

impl std::error::Error for PeekError {}

/// Reads `model`, `stream` and `tools` from `body`, which must be a JSON object.
///
/// A body of at most [`scan::SCAN_MAX_BYTES`] is read by [`scan::scan`] first; whatever it
/// does not vouch for (and every larger body) is parsed by [`peek_tape`]. The answer is the
/// tape path's for every body (see `scan`'s contract).
///
/// `scratch` is a reusable per-shard buffer (simd-json parses in place and mutates its input,
/// so the body is copied into scratch first; the original body stays untouched). Its
/// capacity is kept across calls.
pub fn peek(body: &[u8], scratch: &mut Vec<u8>) -> Result<Peek, PeekError> {
    if body.len() <= scan::SCAN_MAX_BYTES
        && let Some(found) = scan::scan(body)
    {
        return Ok(found);
    }
    peek_tape(body, scratch)
}

/// [`peek`] by simd-json alone: the reference path, and the one for every body the scanner
/// leaves (large, unusual or invalid).
pub fn peek_tape(body: &[u8], scratch: &mut Vec<u8>) -> Result<Peek, PeekError> {
    let retain = body.len() <= PARSER_RETAIN_MAX_BYTES;
    let pooled = PARSER.try_with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            let state = slot.get_or_insert_with(ParserState::new);
            let result = peek_with(body, scratch, state);
            if !retain {
                *slot = None;
            }
            Some(result)
        }
        // Re-entered on this thread (not possible today): use a private state.
        Err(_) => None,
    });
    match pooled {
        Ok(Some(result)) => result,
        // Thread-local already destroyed (thread exit) or busy: parse with fresh buffers.
        Ok(None) | Err(_) => peek_with(body, scratch, &mut ParserState::new()),
    }
}

/// Returns the body with its `background: true` turned into `background: null` (same
/// length, so every other span stays valid): the upstream serves it synchronously.
pub fn degrade_background(body: &[u8], span: Range<usize>) -> Bytes {
    let mut out = body.to_vec();
    if let Some(value) = out.get_mut(span)
        && value == b"true"
    {
        value.copy_from_slice(b"null");
    }
    Bytes::from(out)
}

/// A body with its `model` value replaced, described rather than built: its length is
/// known up front (the upstream head's `Content-Length`), and it is written once, straight
/// behind the upstream request's head in the buffer that is sent (`write_to`), instead of
/// into a body of its own that is then copied behind the head.
#[derive(Clone, Copy, Debug)]
pub struct Rewrite<'a> {
    /// The body before the model value.
    head: &'a [u8],
    /// The new model, written as a JSON string.
    model: &'a str,
    /// Its length as a JSON string (quotes and escapes included).
    model_len: usize,
    /// The body after the model value.
    tail: &'a [u8],
}

impl<'a> Rewrite<'a> {
    /// `body` with bytes `span` replaced by the JSON string encoding of `model` (escaped as
    /// JSON requires); every other byte unchanged. `span` is meant to be
    /// [`Peek::model_span`] from the same body. A span that does not fit is clamped, never a
    /// panic: `end` to the body length, then `start` to `end`.
    pub fn new(body: &'a [u8], span: Range<usize>, model: &'a str) -> Self {
        let end = span.end.min(body.len());
        let start = span.start.min(end);
        let (head, rest) = body.split_at(start);
        let tail = rest.get(end - start..).unwrap_or_default();
        Self {
            head,
            model,
            model_len: json_string_len(model),
            tail,
        }
    }

    /// Length of the rewritten body.
    pub fn body_len(&self) -> usize {
        self.head.len() + self.model_len + self.tail.len()
    }

    /// Appends the rewritten body to `out`.
    pub fn write_to(&self, out: &mut impl BufMut) {
        out.put_slice(self.head);
        if self.model_len == self.model.len() + 2 {
            // Nothing to escape (the usual model name): one copy, no second byte loop.
            out.put_u8(b'"');
            out.put_slice(self.model.as_bytes());
            out.put_u8(b'"');
        } else {
            write_json_string(out, self.model);
        }
        out.put_slice(self.tail);
    }

    /// The rewritten body, built (exactly sized).
    pub fn to_bytes(&self) -> Bytes {
        let mut out = Vec::with_capacity(self.body_len());
        self.write_to(&mut out);
        Bytes::from(out)
    }
}

/// The simd-json buffers and tape kept between calls on one thread (= one shard).
struct ParserState {
    buffers: Buffers,
    /// Always empty between calls; `'static` only because it borrows nothing then.
    tape: Tape<'static>,
}

impl ParserState {
    fn new() -> Self {
        Self {
            buffers: Buffers::default(),
            tape: Tape(Vec::new()),
        }
    }
}

thread_local! {
    static PARSER: RefCell<Option<ParserState>> = const { RefCell::new(None) };
}

/// The routing facts read from the tape, owned so the tape can be released.
struct Fields {
    model: ModelName,
    /// Ordinal of the `model` member among the top-level members.
    model_member: usize,
    stream: bool,
    has_tools: bool,
    tool_count: usize,
    /// Ordinal of a top-level `background: true` member.
    background_member: Option<usize>,
}

fn peek_with(
    body: &[u8],
    scratch: &mut Vec<u8>,
    state: &mut ParserState,
) -> Result<Peek, PeekError> {
    scratch.clear();
    scratch.reserve(body.len() + simd_json::INPUT_PADDING);
    scratch.extend_from_slice(body);
    scratch.resize(body.len() + simd_json::INPUT_PADDING, b' ');

    let mut tape = std::mem::replace(&mut state.tape, Tape(Vec::new())).reset();
    let fields =
        match simd_json::fill_tape_padded(scratch, body.len(), &mut state.buffers, &mut tape) {
            Ok(()) => read_fields(&tape),
            Err(err) => Err(invalid_json(&err)),
        };
    state.tape = tape.reset();
    let fields = fields?;

    let is_string_token = |span: &Range<usize>| {
        body.get(span.clone())
            .is_some_and(|v| v.len() >= 2 && v.first() == Some(&b'"'))
    };
    let structurals = state.buffers.structural_indexes();
    let model_span = member_value_span_structural(body, structurals, fields.model_member)
        .filter(is_string_token)
        .or_else(|| member_value_span(body, fields.model_member).filter(is_string_token))
        .ok_or_else(|| PeekError::InvalidJson("model value not found in body".to_owned()))?;
    let background_span = fields.background_member.and_then(|ordinal| {
        member_value_span_structural(body, structurals, ordinal)
            .or_else(|| member_value_span(body, ordinal))
            .filter(|span| body.get(span.clone()) == Some(b"true".as_slice()))
    });
    Ok(Peek {
        model: fields.model,
        stream: fields.stream,
        has_tools: fields.has_tools,
        model_span,
        tool_count: fields.tool_count,
        background_span,
    })
}

fn read_fields(tape: &Tape<'_>) -> Result<Fields, PeekError> {
    let object = tape.as_value().as_object().ok_or(PeekError::NotAnObject)?;
    let mut model: Option<(usize, Option<&str>)> = None;
    let mut stream: Option<Option<bool>> = None;
    let mut tools: Option<bool> = None;
    let mut tool_count = 0;
    let mut background: Option<Option<usize>> = None;
    for (ordinal, (key, value)) in object.iter().enumerate() {
        match key {
            "model" => {
                if model.is_some() {
                    return Err(duplicate("model"));
                }
                model = Some((ordinal, value.into_string()));
            }
            "stream" => {
                if stream.is_some() {
                    return Err(duplicate("stream"));
                }
                let flag = if value.as_null().is_some() {
                    Some(false)
                } else {
                    value.as_bool()
                };
                stream = Some(flag);
            }
            "tools" => {
                if tools.is_some() {
                    return Err(duplicate("tools"));
                }
                tool_count = match (value.as_array(), value.as_object()) {
                    (Some(array), _) => array.len(),
                    (None, Some(object)) => object.len(),
                    (None, None) => 0,
                };
                tools = Some(tool_count > 0);
            }
            "background" => {
                if background.is_some() {
                    return Err(duplicate("background"));
                }
                background = Some((value.as_bool() == Some(true)).then_some(ordinal));
            }
            _ => {}
        }
    }
    let (model_member, model) = model.ok_or(PeekError::MissingModel)?;
    let model = model.ok_or(PeekError::ModelNotString)?;
    let stream = match stream {
        None => false,
        Some(Some(flag)) => flag,
        Some(None) => return Err(PeekError::StreamNotBool),
    };
    Ok(Fields {
        model: ModelName::new(model),
        model_member,
        stream,
        has_tools: tools.unwrap_or(false),
        tool_count,
        background_member: background.flatten(),
    })
}

fn duplicate(key: &str) -> PeekError {
    PeekError::InvalidJson(format!("duplicate top-level key `{key}`"))
}

/// A short reason that never quotes the body (simd-json's own `Display` includes the
/// offending character).
fn invalid_json(err: &simd_json::Error) -> PeekError {
    let what = match err.error() {
        ErrorType::Eof => "unexpected end of input",
        ErrorType::InputTooLarge => "body too large for the JSON parser",
        ErrorType::InvalidNumber | ErrorType::InvalidExponent => "invalid or out-of-range number",
        ErrorType::InvalidEscape => "invalid escape in string",
        ErrorType::InvalidUnicodeEscape | ErrorType::InvalidUnicodeCodepoint => {
            "invalid unicode escape in string"
        }
        ErrorType::InvalidUtf8 => "invalid UTF-8",
        ErrorType::UnterminatedString => "unterminated string",
        ErrorType::DepthLimitExceeded => "nesting too deep",
        ErrorType::ExpectedObjectColon => "expected `:`",
        ErrorType::ExpectedObjectKey | ErrorType::KeyMustBeAString => "expected an object key",
        ErrorType::ExpectedMapComma | ErrorType::ExpectedArrayComma => "expected `,`",
        ErrorType::ExpectedMapEnd => "expected `}`",
        ErrorType::ExpectedTrue | ErrorType::ExpectedFalse | ErrorType::ExpectedNull => {
            "invalid literal"
        }
        ErrorType::TrailingData => "trailing data after the document",
        _ => "syntax error",
    };
    PeekError::InvalidJson(format!("{what} at byte {}", err.index()))
}

/// Fast path of `member_value_span`: the same walk over the structural indexes simd-json's
/// stage 1 left in its buffers (the offsets of every `{}[]:,` and of the first byte of every
/// string and scalar; public for "aligning downstream indices" with its parse) instead of
/// over every byte. A 64 KiB chat body has a few thousand structurals, and long strings cost
/// nothing to skip. Only the value's own end is found in the bytes. `None` if the indexes do
/// not describe such a member; the caller then falls back to the byte scanner.
fn member_value_span_structural(
    body: &[u8],
    structurals: &[u32],
    ordinal: usize,
) -> Option<Range<usize>> {
    let mut depth = 0usize;
    let mut member = 0usize;
    let mut offsets = structurals.iter().map(|&offset| offset as usize);
    while let Some(at) = offsets.next() {
        match body.get(at)? {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return None;
                }
            }
            b',' if depth == 1 => member += 1,
            b':' if depth == 1 && member == ordinal => {
                let start = offsets.next()?;
                return Some(start..skip_value(body, start)?);
            }
            _ => {}
        }
    }
    None
}

/// Byte range of the value of the `ordinal`-th (0-based) member of the top-level object in
/// `body`. `None` if the body does not have that shape (never for a body simd-json accepted
/// with at least `ordinal + 1` members).
fn member_value_span(body: &[u8], ordinal: usize) -> Option<Range<usize>> {
    let mut pos = skip_ws(body, 0);
    if body.get(pos) != Some(&b'{') {
        return None;
    }
    pos += 1;
    let mut member = 0;
    loop {
        pos = skip_ws(body, pos);
        if body.get(pos) != Some(&b'"') {
            return None;
        }
        pos = skip_ws(body, skip_string(body, pos)?);
        if body.get(pos) != Some(&b':') {
            return None;
        }
        let start = skip_ws(body, pos + 1);
        let end = skip_value(body, start)?;
        if member == ordinal {
            return Some(start..end);
        }
        pos = skip_ws(body, end);
        if body.get(pos) != Some(&b',') {
            return None;
        }
        pos += 1;
        member += 1;
    }
}

fn skip_ws(body: &[u8], mut pos: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = body.get(pos) {
        pos += 1;
    }
    pos
}

/// `pos` is at an opening quote; returns the position just past the closing quote.
fn skip_string(body: &[u8], pos: usize) -> Option<usize> {
    let mut at = pos + 1;
    loop {
        let found = at + memchr::memchr2(b'"', b'\\', body.get(at..)?)?;
        if body.get(found) == Some(&b'"') {
            return Some(found + 1);
        }
        // A backslash escapes exactly the next byte (`\uXXXX` hex digits need no care).
        at = found + 2;
    }
}

/// `pos` is at the first byte of a value; returns the position just past it.
fn skip_value(body: &[u8], pos: usize) -> Option<usize> {
    match body.get(pos)? {
        b'"' => skip_string(body, pos),
        b'{' | b'[' => skip_container(body, pos),
        _ => {
            let mut at = pos;
            while let Some(&byte) = body.get(at) {
                if matches!(byte, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                at += 1;
            }
            (at > pos).then_some(at)
        }
    }
}

/// `pos` is at `{` or `[`; returns the position just past the matching close. Brackets are
/// only counted, not matched by kind: the body was validated, so they nest properly.
fn skip_container(body: &[u8], pos: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = pos;
    loop {
        match body.get(at)? {
            b'"' => {
                at = skip_string(body, at)?;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
}

/// The escape [`write_json_string`] writes for `byte`: `Some(0)` for `\u00XX`, `Some(c)`
/// for the short `\c`, `None` when the byte is written as it is.
fn escape_of(byte: u8) -> Option<u8> {
    match byte {
        b'"' => Some(b'"'),
        b'\\' => Some(b'\\'),
        b'\n' => Some(b'n'),
        b'\r' => Some(b'r'),
        b'\t' => Some(b't'),
        0x08 => Some(b'b'),
        0x0c => Some(b'f'),
        0x00..=0x1f => Some(0),
        _ => None,
    }
}

/// Length of `value` as [`write_json_string`] writes it.
fn json_string_len(value: &str) -> usize {
    2 + value
        .bytes()
        .map(|b| match escape_of(b) {
            None => 1,
            Some(0) => 6,
            Some(_) => 2,
        })
        .sum::<usize>()
}

/// Appends `value` as a JSON string literal: quotes, `\"`, `\\`, the short escapes for
/// control characters that have one, `\u00XX` for the others; everything else verbatim
/// (UTF-8 needs no escaping in JSON).
fn write_json_string(out: &mut impl BufMut, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put_u8(b'"');
    let bytes = value.as_bytes();
    let mut copied = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let Some(short) = escape_of(byte) else {
            continue;
        };
        out.put_slice(&bytes[copied..i]);
        if short == 0 {
            out.put_slice(b"\\u00");
            out.put_u8(HEX[usize::from(byte >> 4)]);
            out.put_u8(HEX[usize::from(byte & 0x0f)]);
        } else {
            out.put_u8(b'\\');
            out.put_u8(short);
        }
        copied = i + 1;
    }
    out.put_slice(&bytes[copied..]);
    out.put_u8(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    const OPENAI_BODY: &str = r#"{
  "model": "openai/gpt-4o-2024-08-06",
  "messages": [
    {"role": "system", "content": "You are a helpful assistant. Reply in JSON like {\"model\": \"x\"}."},
    {"role": "user", "content": "What's the weather in Paris? Use the tool."},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"model\":\"evil\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 21}"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "model": {"type": "string"}},
    "required": ["city"]}}}],
  "tool_choice": "auto",
  "temperature": 0.2,
  "max_tokens": 512,
  "stream": true,
  "stream_options": {"include_usage": true},
  "user": "u-123"
}"#;

    const ANTHROPIC_BODY: &str = r#"{"max_tokens":1024,"messages":[{"role":"user","content":[{"type":"text","text":"Summarise: {\"model\": \"claude\"} ]]} and [[{"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}]},{"role":"assistant","content":[{"type":"text","text":"Sure \\ here \"it\" is"}]}],"model":"claude-sonnet-4-5","system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"metadata":{"user_id":"abc","model":"nested-not-me"},"stream":false,"temperature":1}"#;

    #[test]
    fn tools_are_counted_and_a_true_background_is_found_and_degraded() {
        let body = r#"{"background":true,"tools":[{"a":1},{"b":2},{"c":3}],"model":"m"}"#;
        let found = ok(body);
        assert_eq!(found.tool_count, 3);
        let span = found.background_span.clone().unwrap_or_default();
        assert_eq!(&body[span.clone()], "true");
        let out = degrade_background(body.as_bytes(), span);
        assert_eq!(
            std::str::from_utf8(&out).unwrap_or_default(),
            r#"{"background":null,"tools":[{"a":1},{"b":2},{"c":3}],"model":"m"}"#
        );
        assert_eq!(&body[found.model_span.clone()], r#""m""#);
        assert_eq!(
            ok(r#"{"background":false,"model":"m"}"#).background_span,
            None
        );
        assert_eq!(ok(r#"{"model":"m"}"#).tool_count, 0);
        assert!(peek_str(r#"{"background":true,"background":true,"model":"m"}"#).is_err());
    }

    fn peek_str(body: &str) -> Result<Peek, PeekError> {
        peek(body.as_bytes(), &mut Vec::new())
    }

    fn ok(body: &str) -> Peek {
        match peek_str(body) {
            Ok(found) => found,
            Err(err) => panic!("peek failed on {body:?}: {err:?}"),
        }
    }

    fn raw_model(body: &str) -> &str {
        let found = ok(body);
        &body[found.model_span]
    }

    fn is_invalid(result: Result<Peek, PeekError>) -> bool {
        matches!(result, Err(PeekError::InvalidJson(_)))
    }

    #[test]
    fn openai_chat_body() {
        let found = ok(OPENAI_BODY);
        assert_eq!(found.model, "openai/gpt-4o-2024-08-06");
        assert!(found.stream);
        assert!(found.has_tools);
        assert_eq!(
            &OPENAI_BODY[found.model_span],
            r#""openai/gpt-4o-2024-08-06""#
        );
    }

    #[test]
    fn anthropic_messages_body_with_model_after_messages() {
        let found = ok(ANTHROPIC_BODY);
        assert_eq!(found.model, "claude-sonnet-4-5");
        assert!(!found.stream);
        assert!(!found.has_tools);
        assert_eq!(&ANTHROPIC_BODY[found.model_span], r#""claude-sonnet-4-5""#);
    }

    #[test]
    fn model_escapes_decode_and_span_covers_raw_token() {
        let body = r#"{"model":"gpt\u002d4"}"#;
        assert_eq!(ok(body).model, "gpt-4");
        assert_eq!(raw_model(body), r#""gpt\u002d4""#);

        let body = r#"{"model":"a\"b\\c\/d\n\t"}"#;
        assert_eq!(ok(body).model, "a\"b\\c/d\n\t");
        assert_eq!(raw_model(body), r#""a\"b\\c\/d\n\t""#);

        let body = r#"{"model":"mod\u00e8le-日本-\ud83d\ude00"}"#;
        assert_eq!(ok(body).model, "modèle-日本-😀");

        let body = "{\"model\":\"modèle-日本-😀\"}";
        assert_eq!(ok(body).model, "modèle-日本-😀");
        assert_eq!(raw_model(body), "\"modèle-日本-😀\"");

        // A string ending in an escaped backslash, then more members.
        let body = r#"{"model":"x\\","stream":true}"#;
        assert_eq!(ok(body).model, "x\\");
        assert_eq!(raw_model(body), r#""x\\""#);
        assert!(ok(body).stream);

        assert_eq!(ok(r#"{"model":""}"#).model, "");
    }

    #[test]
    fn escaped_keys_are_matched_after_decoding() {
        let body = r#"{"a":1,"mod\u0065l":"x","str\u0065am":true,"\u0074ools":[1]}"#;
        let found = ok(body);
        assert_eq!(found.model, "x");
        assert!(found.stream);
        assert!(found.has_tools);
        assert_eq!(&body[found.model_span], r#""x""#);
    }

    #[test]
    fn whitespace_everywhere() {
        let body = " \n\t{ \r\n \"a\" :\t[ 1 , { } , [ ] ] ,\n\"model\" \t:\n \"m\" , \"stream\" : true ,\"tools\": [ {} ] }\n ";
        let found = ok(body);
        assert_eq!(found.model, "m");
        assert!(found.stream);
        assert!(found.has_tools);
        assert_eq!(&body[found.model_span], "\"m\"");
        assert_eq!(ok("{\"model\":\"m\"}\n\n").model, "m");
    }

    #[test]
    fn nested_model_keys_do_not_match() {
        let body = r#"{"metadata":{"model":"evil"},"messages":[{"model":"evil2"},["model"]],"model":"good"}"#;
        assert_eq!(ok(body).model, "good");
        assert_eq!(raw_model(body), r#""good""#);
        let nested_only = r#"{"metadata":{"model":"evil"},"messages":[{"model":"evil2"}]}"#;
        assert_eq!(peek_str(nested_only), Err(PeekError::MissingModel));
        let nested_stream = r#"{"model":"m","o":{"stream":"yes","tools":[1]}}"#;
        let found = ok(nested_stream);
        assert!(!found.stream);
        assert!(!found.has_tools);
    }

    #[test]
    fn strings_containing_model_and_braces() {
        let body = r#"{"prompt":"\"model\": \"evil\" } { [ ] ,","x":"\\\"","y":"\\","model":"good","z":"}"}"#;
        assert_eq!(ok(body).model, "good");
        assert_eq!(raw_model(body), r#""good""#);
        let body = r#"{"\"model\"":"evil","model\u0000":"evil","model":"good"}"#;
        assert_eq!(ok(body).model, "good");
        assert_eq!(raw_model(body), r#""good""#);
    }

    #[test]
    fn scalar_members_before_model() {
        let body = r#"{"a":-1.5e+3,"b":true,"c":null,"d":0,"e":false,"model":"m"}"#;
        assert_eq!(raw_model(body), "\"m\"");
    }

    #[test]
    fn stream_variants() {
        assert!(ok(r#"{"model":"m","stream":true}"#).stream);
        assert!(!ok(r#"{"model":"m","stream":false}"#).stream);
        assert!(!ok(r#"{"model":"m"}"#).stream);
        assert!(!ok(r#"{"model":"m","stream":null}"#).stream);
        for bad in [r#""true""#, "1", "0", "[]", "{}", r#""""#] {
            let body = format!(r#"{{"model":"m","stream":{bad}}}"#);
            assert_eq!(peek_str(&body), Err(PeekError::StreamNotBool), "{body}");
        }
    }

    #[test]
    fn tools_variants() {
        let has_tools = |tools: &str| ok(&format!(r#"{{"model":"m","tools":{tools}}}"#)).has_tools;
        assert!(!ok(r#"{"model":"m"}"#).has_tools);
        assert!(!has_tools("[]"));
        assert!(!has_tools("null"));
        assert!(!has_tools("{}"));
        assert!(!has_tools("\"x\""));
        assert!(!has_tools("3"));
        assert!(has_tools(
            r#"[{"type":"function","function":{"name":"f"}}]"#
        ));
        assert!(has_tools("[[]]"));
        assert!(has_tools(r#"{"a":1}"#));
    }

    #[test]
    fn model_missing_or_not_a_string() {
        assert_eq!(peek_str("{}"), Err(PeekError::MissingModel));
        assert_eq!(peek_str(r#"{"Model":"m"}"#), Err(PeekError::MissingModel));
        for bad in ["5", "null", "true", r#"["a"]"#, r#"{"id":"a"}"#] {
            let body = format!(r#"{{"model":{bad}}}"#);
            assert_eq!(peek_str(&body), Err(PeekError::ModelNotString), "{body}");
        }
    }

    #[test]
    fn invalid_json_variants() {
        for bad in [
            "",
            "   \n",
            "{",
            r#"{"model":"m""#,
            r#"{"model":"m}"#,
            r#"{"model":"m",}"#,
            r#"{"model" "m"}"#,
            r#"{model:"m"}"#,
            r#"{'model':'m'}"#,
            r#"{"model":"m"} x"#,
            r#"{"model":"m"}}"#,
            r#"{"model":"m"}{}"#,
            r#"{"model":"m","n":01}"#,
            r#"{"model":"m","n":tru}"#,
            r#"{"model":"m\x"}"#,
            r#"{"model":"\ud800"}"#,
            "{\"model\":\"a\u{1}b\"}",
            "\u{feff}{\"model\":\"m\"}",
        ] {
            assert!(is_invalid(peek_str(bad)), "{bad:?} -> {:?}", peek_str(bad));
        }
        assert!(is_invalid(peek(b"{\"model\":\"\xff\"}", &mut Vec::new())));
    }

    #[test]
    fn valid_non_objects_are_not_objects() {
        for doc in [
            "[]",
            r#"[{"model":"m"}]"#,
            r#""model""#,
            "1",
            "null",
            " true ",
        ] {
            assert_eq!(peek_str(doc), Err(PeekError::NotAnObject), "{doc}");
        }
    }

    #[test]
    fn every_truncation_of_real_bodies_is_invalid() {
        for body in [OPENAI_BODY, ANTHROPIC_BODY] {
            let trimmed = body.trim_end();
            let mut scratch = Vec::new();
            for cut in 0..trimmed.len() {
                let result = peek(&trimmed.as_bytes()[..cut], &mut scratch);
                assert!(is_invalid(result.clone()), "cut at {cut}: {result:?}");
            }
        }
    }

    #[test]
    fn duplicate_routing_keys_are_rejected() {
        for body in [
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"a","mod\u0065l":"b"}"#,
            r#"{"model":"a","stream":false,"stream":true}"#,
            r#"{"model":"a","tools":[],"tools":[1]}"#,
        ] {
            assert!(is_invalid(peek_str(body)), "{body}");
        }
        // Other duplicated keys are forwarded untouched.
        assert_eq!(ok(r#"{"x":1,"x":2,"model":"m"}"#).model, "m");
    }

    #[test]
    fn error_reasons_never_quote_the_body() {
        for bad in [
            r#"{"model":"sk-SECRET","x":SECRET}"#,
            r#"{"model":"sk-SECRET"} SECRET"#,
            r#"{"SECRET""#,
            "{\"model\":\"SECRET\u{1}\"}",
        ] {
            match peek_str(bad) {
                Err(PeekError::InvalidJson(reason)) => {
                    assert!(
                        !reason.contains("SECRET") && !reason.contains('S'),
                        "{reason}"
                    );
                    assert!(reason.len() < 80, "{reason}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn deep_nesting_is_bounded_not_a_crash() {
        let deep = |depth: usize| {
            format!(
                r#"{{"x":{}1{},"model":"m"}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        let body = deep(1000);
        assert_eq!(raw_model(&body), "\"m\"");
        assert!(is_invalid(peek_str(&deep(100_000))));
    }

    #[test]
    fn scratch_keeps_capacity_and_state_does_not_leak_between_calls() {
        let mut scratch = Vec::new();
        let big = big_body(64 * 1024, "big-model");
        let found = peek(big.as_bytes(), &mut scratch).unwrap();
        assert_eq!(found.model, "big-model");
        let capacity = scratch.capacity();
        assert!(capacity >= big.len());

        assert!(is_invalid(peek(b"{\"model\":", &mut scratch)));
        let found = peek(br#"{"model":"small","stream":true}"#, &mut scratch).unwrap();
        assert_eq!(found.model, "small");
        assert!(found.stream);
        assert_eq!(scratch.capacity(), capacity);
        assert_eq!(peek(b"[]", &mut scratch), Err(PeekError::NotAnObject));
        assert_eq!(
            peek(big.as_bytes(), &mut scratch).unwrap().model,
            "big-model"
        );
        assert_eq!(scratch.capacity(), capacity);
    }

    #[test]
    fn bodies_above_the_retain_limit_work_and_later_calls_still_work() {
        let mut scratch = Vec::new();
        let huge = big_body(PARSER_RETAIN_MAX_BYTES + 4096, "huge");
        let found = peek(huge.as_bytes(), &mut scratch).unwrap();
        assert_eq!(found.model, "huge");
        assert_eq!(&huge[found.model_span], "\"huge\"");
        assert_eq!(
            peek(br#"{"model":"next"}"#, &mut scratch).unwrap().model,
            "next"
        );
    }

    #[test]
    fn rewrite_round_trip_on_real_bodies() {
        for body in [OPENAI_BODY, ANTHROPIC_BODY] {
            let before = ok(body);
            for new_model in ["gpt-4o", "", "we\"ird\\ \n\t\u{1}\u{1f} /é日😀", "x"] {
                let rewritten =
                    rewrite_model(body.as_bytes(), before.model_span.clone(), new_model);
                let after = peek(&rewritten, &mut Vec::new()).unwrap();
                assert_eq!(after.model, new_model);
                assert_eq!(after.stream, before.stream);
                assert_eq!(after.has_tools, before.has_tools);
                assert_eq!(after.model_span.start, before.model_span.start);
                let raw = body.as_bytes();
                assert_eq!(
                    &rewritten[..after.model_span.start],
                    &raw[..before.model_span.start]
                );
                assert_eq!(
                    &rewritten[after.model_span.end..],
                    &raw[before.model_span.end..]
                );
                let parsed: Value = serde_json::from_slice(&rewritten).unwrap();
                let mut expected: Value = serde_json::from_str(body).unwrap();
                expected["model"] = Value::String(new_model.to_owned());
                assert_eq!(parsed, expected);
            }
        }
    }

    #[test]
    fn rewrite_model_escapes_like_serde_json() {
        for s in [
            "plain",
            "\"",
            "\\",
            "\u{0}\u{7}\u{8}\u{c}\u{1b}\u{7f}",
            "é\u{2028}😀",
            "a/b",
        ] {
            let mut out = Vec::new();
            write_json_string(&mut out, s);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(s).unwrap()
            );
        }
    }

    #[test]
    fn rewrite_model_clamps_out_of_range_spans() {
        let body = b"{\"model\":\"m\"}";
        assert_eq!(&rewrite_model(body, 9..12, "x")[..], b"{\"model\":\"x\"}");
        assert_eq!(
            &rewrite_model(body, 100..200, "x")[..],
            b"{\"model\":\"m\"}\"x\""
        );
        assert_eq!(
            &rewrite_model(body, Range { start: 12, end: 9 }, "x")[..],
            b"{\"model\":\"x\"\"m\"}"
        );
        assert_eq!(&rewrite_model(b"", 0..5, "")[..], b"\"\"");
    }

    /// The rewritten body, built.
    fn rewrite_model(body: &[u8], span: Range<usize>, new_model: &str) -> Bytes {
        Rewrite::new(body, span, new_model).to_bytes()
    }

    /// The splice as it was built before [`Rewrite`]: the reference it is checked against.
    fn rewrite_model_reference(body: &[u8], span: Range<usize>, new_model: &str) -> Vec<u8> {
        let end = span.end.min(body.len());
        let start = span.start.min(end);
        let (head, rest) = body.split_at(start);
        let tail = rest.get(end - start..).unwrap_or_default();
        let mut out = head.to_vec();
        out.extend_from_slice(serde_json::to_string(new_model).unwrap().as_bytes());
        out.extend_from_slice(tail);
        out
    }

    /// Written behind whatever the buffer already holds (the upstream head), the rewrite is
    /// the reference splice, exactly `body_len()` bytes, for any span (clamped ones included).
    fn check_rewrite(body: &[u8], span: Range<usize>, new_model: &str) {
        let expected = rewrite_model_reference(body, span.clone(), new_model);
        let rewrite = Rewrite::new(body, span.clone(), new_model);
        assert_eq!(rewrite.body_len(), expected.len(), "{span:?} {new_model:?}");
        let mut wire = bytes::BytesMut::from(&b"POST / HTTP/1.1\r\n\r\n"[..]);
        rewrite.write_to(&mut wire);
        assert_eq!(&wire[..19], b"POST / HTTP/1.1\r\n\r\n");
        assert_eq!(&wire[19..], &expected[..]);
        assert_eq!(&rewrite.to_bytes()[..], &expected[..]);
    }

    #[test]
    fn a_rewrite_written_behind_a_head_is_the_reference_splice() {
        let body = OPENAI_BODY.as_bytes();
        let found = ok(OPENAI_BODY);
        let odd = [
            "",
            "gpt-4o",
            "\"",
            "\\",
            "\u{0}\u{1f}\u{7f}\n\r\t\u{8}\u{c}",
            "é日😀",
        ];
        for model in odd {
            for span in [
                found.model_span.clone(),
                0..0,
                Range { start: 3, end: 1 },
                5..10_000,
                10_000..20_000,
            ] {
                check_rewrite(body, span, model);
            }
        }
        // Every byte value alone, and a byte with every escape next to it.
        for b in 0u8..0x80 {
            let c = char::from(b).to_string();
            check_rewrite(body, found.model_span.clone(), &c);
            check_rewrite(body, found.model_span.clone(), &format!("a{c}\"{c}b"));
        }
    }

    /// A chat body of roughly `target` bytes with the model last (worst case for the scanner).
    fn big_body(target: usize, model: &str) -> String {
        let mut body = String::from(r#"{"messages":["#);
        let mut turn = 0usize;
        while body.len() < target {
            if turn > 0 {
                body.push(',');
            }
            body.push_str(&format!(
                r#"{{"role":"{}","content":"Turn {turn}: \"quoted\" {{braces}} [brackets] \\ back\nslash, model: gpt. {}"}}"#,
                if turn.is_multiple_of(2) { "user" } else { "assistant" },
                "lorem ipsum dolor sit amet ".repeat(8),
            ));
            turn += 1;
        }
        body.push_str(&format!(r#"],"stream":false,"model":"{model}"}}"#));
        body
    }

    // ---- property tests -------------------------------------------------------------

    /// Writes JSON with random whitespace and random (valid) escapes, driven by `seeds`, so
    /// the scanner sees far more shapes than serde_json's compact output.
    struct Writer<'a> {
        seeds: &'a [u8],
        at: usize,
        out: Vec<u8>,
    }

    impl Writer<'_> {
        fn next(&mut self) -> u8 {
            let seed = self
                .seeds
                .get(self.at % self.seeds.len().max(1))
                .copied()
                .unwrap_or(0);
            self.at += 1;
            seed
        }

        fn ws(&mut self) {
            match self.next() % 8 {
                0 => self.out.push(b' '),
                1 => self.out.extend_from_slice(b"\n  "),
                2 => self.out.extend_from_slice(b"\t\r\n "),
                _ => {}
            }
        }

        fn string(&mut self, s: &str) {
            self.out.push(b'"');
            for ch in s.chars() {
                let roll = self.next();
                let mut utf8 = [0u8; 4];
                match ch {
                    '"' => self.out.extend_from_slice(b"\\\""),
                    '\\' => self.out.extend_from_slice(b"\\\\"),
                    '/' if roll.is_multiple_of(2) => self.out.extend_from_slice(b"\\/"),
                    '\n' if roll.is_multiple_of(2) => self.out.extend_from_slice(b"\\n"),
                    c if (c as u32) < 0x20 || roll.is_multiple_of(5) => {
                        let mut units = [0u16; 2];
                        for unit in c.encode_utf16(&mut units) {
                            self.out
                                .extend_from_slice(format!("\\u{unit:04X}").as_bytes());
                        }
                    }
                    c => self
                        .out
                        .extend_from_slice(c.encode_utf8(&mut utf8).as_bytes()),
                }
            }
            self.out.push(b'"');
        }

        fn value(&mut self, v: &Value) {
            match v {
                Value::Null | Value::Bool(_) | Value::Number(_) => {
                    self.out.extend_from_slice(v.to_string().as_bytes());
                }
                Value::String(s) => self.string(s),
                Value::Array(items) => {
                    self.out.push(b'[');
                    for (i, item) in items.iter().enumerate() {
                        self.ws();
                        if i > 0 {
                            self.out.push(b',');
                            self.ws();
                        }
                        self.value(item);
                    }
                    self.ws();
                    self.out.push(b']');
                }
                Value::Object(map) => {
                    let members: Vec<(String, Value)> =
                        map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                    self.object(&members);
                }
            }
        }

        fn object(&mut self, members: &[(String, Value)]) {
            self.out.push(b'{');
            for (i, (key, value)) in members.iter().enumerate() {
                self.ws();
                if i > 0 {
                    self.out.push(b',');
                    self.ws();
                }
                self.string(key);
                self.ws();
                self.out.push(b':');
                self.ws();
                self.value(value);
            }
            self.ws();
            self.out.push(b'}');
        }
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter_map("finite", serde_json::Number::from_f64)
                .prop_map(Value::Number),
            any::<String>().prop_map(Value::String),
            prop_oneof![
                Just("model"),
                Just("stream"),
                Just("tools"),
                Just("{\"model\":[")
            ]
            .prop_map(|s| Value::String(s.to_owned())),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((arb_key(), inner), 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    fn arb_key() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => prop_oneof![Just("model"), Just("stream"), Just("tools"), Just("messages")]
                .prop_map(str::to_owned),
            1 => any::<String>(),
        ]
    }

    /// A top-level object as an ordered member list with unique keys; `model`, `stream` and
    /// `tools` are likely, and likely of the right type.
    fn arb_members() -> impl Strategy<Value = Vec<(String, Value)>> {
        let model = prop_oneof![
            4 => any::<String>().prop_map(Value::String),
            1 => arb_value(),
        ];
        let stream = prop_oneof![4 => any::<bool>().prop_map(Value::Bool), 1 => arb_value()];
        let tools = prop_oneof![
            2 => prop::collection::vec(arb_value(), 0..3).prop_map(Value::Array),
            1 => arb_value(),
        ];
        (
            prop::option::weighted(0.9, model),
            prop::option::weighted(0.5, stream),
            prop::option::weighted(0.5, tools),
            prop::collection::vec((arb_key(), arb_value()), 0..6),
            any::<u64>(),
        )
            .prop_map(|(model, stream, tools, rest, shuffle)| {
                let mut members: Vec<(String, Value)> = Vec::new();
                let routing = [("model", model), ("stream", stream), ("tools", tools)];
                for (key, value) in routing.into_iter().filter_map(|(k, v)| Some((k, v?))) {
                    members.push((key.to_owned(), value));
                }
                for (key, value) in rest {
                    if !members.iter().any(|(k, _)| *k == key) {
                        members.push((key, value));
                    }
                }
                let len = members.len().max(1) as u64;
                members.rotate_left((shuffle % len) as usize);
                if shuffle & (1 << 40) != 0 {
                    members.reverse();
                }
                members
            })
    }

    /// What serde_json says `peek` must return for `doc`.
    fn expected(doc: &Value) -> Result<(String, bool, bool), PeekError> {
        let object = doc.as_object().ok_or(PeekError::NotAnObject)?;
        let model = object.get("model").ok_or(PeekError::MissingModel)?;
        let model = model.as_str().ok_or(PeekError::ModelNotString)?.to_owned();
        let stream = match object.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(flag)) => *flag,
            Some(_) => return Err(PeekError::StreamNotBool),
        };
        let has_tools = match object.get("tools") {
            Some(Value::Array(items)) => !items.is_empty(),
            Some(Value::Object(map)) => !map.is_empty(),
            _ => false,
        };
        Ok((model, stream, has_tools))
    }

    fn check_agrees_with_serde(body: &[u8], found: &Result<Peek, PeekError>, doc: &Value) {
        match (found, expected(doc)) {
            (Ok(found), Ok((model, stream, has_tools))) => {
                assert_eq!(found.model, model);
                assert_eq!(found.stream, stream);
                assert_eq!(found.has_tools, has_tools);
                let raw: String = serde_json::from_slice(&body[found.model_span.clone()]).unwrap();
                assert_eq!(raw, model);
            }
            (Err(got), Err(want)) => assert_eq!(got, &want),
            (got, want) => panic!("peek {got:?} but serde_json says {want:?}"),
        }
    }

    /// The small-body scanner vouches only for what the tape path answers (the contract in
    /// `scan`'s module doc), and `peek` answers what the tape path answers.
    fn check_scan_agrees(body: &[u8]) -> bool {
        let tape = peek_tape(body, &mut Vec::new());
        let scanned = scan::scan(body);
        if let Some(found) = &scanned {
            assert_eq!(Ok(found), tape.as_ref(), "scan vouched for {body:?}");
        }
        assert_eq!(peek(body, &mut Vec::new()), tape);
        scanned.is_some()
    }

    /// The structural fast path and the byte scanner agree on every top-level member of a
    /// body simd-json accepts.
    fn check_scanners_agree(body: &[u8]) {
        check_scan_agrees(body);
        let mut input = body.to_vec();
        let mut buffers = Buffers::default();
        let Ok(tape) = simd_json::to_tape_with_buffers(&mut input, &mut buffers) else {
            return;
        };
        let Some(object) = tape.as_value().as_object() else {
            return;
        };
        let members = object.len();
        for ordinal in 0..members {
            let by_bytes = member_value_span(body, ordinal);
            assert!(by_bytes.is_some(), "byte scanner lost member {ordinal}");
            let fast = member_value_span_structural(body, buffers.structural_indexes(), ordinal);
            assert_eq!(fast, by_bytes, "member {ordinal}");
        }
        assert_eq!(member_value_span(body, members), None);
        assert_eq!(
            member_value_span_structural(body, buffers.structural_indexes(), members),
            None
        );
    }

    #[test]
    fn scanners_agree_on_real_bodies() {
        for body in [OPENAI_BODY, ANTHROPIC_BODY] {
            check_scanners_agree(body.as_bytes());
        }
        check_scanners_agree(big_body(64 * 1024, "m").as_bytes());
        check_scanners_agree(br#"{"a":[{"b":"}]"},[]],"c":-1e5,"d":{},"e":"\\","f":true}"#);
    }

    #[test]
    fn byte_scanner_fallback_finds_the_model() {
        // No structural indexes (as if a future simd-json stopped providing them).
        let body = ANTHROPIC_BODY.as_bytes();
        let found = ok(ANTHROPIC_BODY);
        assert_eq!(member_value_span_structural(body, &[], 2), None);
        assert_eq!(member_value_span(body, 2), Some(found.model_span));
    }

    #[test]
    fn the_scanner_reads_the_usual_bodies() {
        let perf = r#"{"model":"perf/gpt-4o-mini","stream":false,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the load test in a few words please."}]}"#;
        for body in [
            perf,
            OPENAI_BODY,
            ANTHROPIC_BODY,
            r#"{"model":"m","x":[-0,0.5,1e5,-1.25E+07,123456789012345678,{"a":"\ud83d\ude00 \u00e9 \n"}]}"#,
            "{\"model\":\"mod\u{e8}le-\u{65e5}\",\"content\":\"caf\u{e9} \u{1f600}\"}",
            r#"{"background":true,"tools":{"a":1,"b":[]},"model":"","stream":null}"#,
            r#"{"model":"m","n":99999999999999999999e5}"#, // 20 digits: left to simd-json
        ] {
            let scanned = check_scan_agrees(body.as_bytes());
            assert_eq!(scanned, !body.contains("99999999999999999999"), "{body}");
        }
        assert!(check_scan_agrees(big_body(8 * 1024, "m").as_bytes()));
    }

    #[test]
    fn the_scanner_leaves_what_it_cannot_vouch_for() {
        for body in [
            r#"{"model":"m\u0041"}"#,
            r#"{"mod\u0065l":"m"}"#,
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"m","stream":1}"#,
            r#"{"model":1}"#,
            r#"{}"#,
            r#"[]"#,
            r#"{"model":"m","x":1e100}"#,
            r#"{"model":"m","x":1234567890123456789}"#,
            r#"{"model":"m","x":"\ud800"}"#,
            r#"{"model":"m","x":"\udc00"}"#,
            r#"{"model":"m","x":"\ud800\u0041"}"#,
            r#"{"model":"m","x":"\x"}"#,
            "{\"model\":\"m\",\"x\":\"\u{1}\"}",
            r#"{"model":"m",}"#,
            r#"{"model":"m"} x"#,
            r#"{"model":"m","x":01}"#,
            r#"{"model":"m","x":tru}"#,
            r#"{"model":"m","x":truex}"#,
        ] {
            assert!(!check_scan_agrees(body.as_bytes()), "{body}");
        }
        let deep = |depth: usize| {
            format!(
                r#"{{"x":{}1{},"model":"m"}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        assert!(check_scan_agrees(deep(scan::MAX_DEPTH as usize).as_bytes()));
        assert!(!check_scan_agrees(
            deep(scan::MAX_DEPTH as usize + 1).as_bytes()
        ));
        assert!(!check_scan_agrees(b"{\"model\":\"m\",\"x\":\"\xff\"}"));
        assert!(!check_scan_agrees(b"{\"model\":\"m\",\"x\":\"\xc3\"}"));
    }

    /// Raw JSON-ish leaves: mostly valid, with the cases at the scanner's limits and a few
    /// that are not JSON at all.
    fn arb_raw_leaf() -> impl Strategy<Value = Vec<u8>> {
        let tricky = prop::sample::select(vec![
            "true",
            "false",
            "null",
            "tru",
            "nul",
            "0",
            "-0",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "1e+",
            "0.5e99",
            "1e100",
            "1.5E+05",
            "-1.25e-07",
            "123456789012345678",
            "1234567890123456789",
            "-123456789012345678",
            "12345678901234567.8",
            "1234567890123456789.5",
            "0.000000000000000001",
            "18446744073709551616",
            "\"\"",
            "\"x\"",
            "\"model\"",
            "\"\\ud83d\\ude00\"",
            "\"\\uD83D\\uDE00\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"\\ud800\\\\u\"",
            "\"\\u00e9\"",
            "\"\\u0000\"",
            "\"\\u12G4\"",
            "\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"",
            "\"\\x\"",
            "\"\\",
            "\"\u{e9}\u{1f600}\"",
            "\"\x01\"",
            "\"\x7f\"",
            "{}",
            "[]",
            "[",
            "}",
        ]);
        prop_oneof![
            4 => tricky.prop_map(|s| s.as_bytes().to_vec()),
            1 => any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            1 => any::<f64>().prop_map(|f| format!("{f:e}").into_bytes()),
            1 => prop::collection::vec(any::<u8>(), 0..6).prop_map(|bytes| {
                let mut out = vec![b'"'];
                out.extend(bytes);
                out.push(b'"');
                out
            }),
        ]
    }

    fn arb_raw_value() -> impl Strategy<Value = Vec<u8>> {
        arb_raw_leaf().prop_recursive(5, 64, 5, |inner| {
            let key = prop::sample::select(vec![
                "\"a\"",
                "\"model\"",
                "\"tools\"",
                "\"k\\u0065y\"",
                "\"\"",
            ]);
            let ws = prop::sample::select(vec!["", "", " ", "\n\t", "\r"]);
            prop_oneof![
                (prop::collection::vec(inner.clone(), 0..5), ws.clone()).prop_map(|(items, ws)| {
                    let mut out = b"[".to_vec();
                    out.extend(items.join(format!(",{ws}").as_bytes()));
                    out.push(b']');
                    out
                }),
                (prop::collection::vec((key, inner), 0..5), ws).prop_map(|(members, ws)| {
                    let mut out = b"{".to_vec();
                    for (i, (key, value)) in members.into_iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        out.extend(ws.as_bytes());
                        out.extend(key.as_bytes());
                        out.push(b':');
                        out.extend(value);
                    }
                    out.push(b'}');
                    out
                }),
            ]
        })
    }

    /// A top-level object from raw members, routing keys likely (duplicates and escaped
    /// spellings possible).
    fn arb_raw_body() -> impl Strategy<Value = Vec<u8>> {
        let key = prop::sample::select(vec![
            "\"model\"",
            "\"model\"",
            "\"stream\"",
            "\"tools\"",
            "\"background\"",
            "\"messages\"",
            "\"mod\\u0065l\"",
            "\"x\"",
        ]);
        let model = prop::sample::select(vec![
            "\"m\"",
            "\"perf/gpt-4o-mini\"",
            "\"\"",
            "\"a\\\"b\"",
            "\"caf\u{e9}\"",
            "1",
            "null",
        ]);
        (
            model,
            prop::collection::vec((key, arb_raw_value()), 0..6),
            any::<prop::sample::Index>(),
            prop::sample::select(vec!["", " ", "\n", "  \r\n\t"]),
        )
            .prop_map(|(model, rest, at, ws)| {
                let mut members: Vec<Vec<u8>> = rest
                    .into_iter()
                    .map(|(key, value)| [key.as_bytes(), b":", &value].concat())
                    .collect();
                let model = [b"\"model\":".as_slice(), model.as_bytes()].concat();
                members.insert(at.index(members.len() + 1), model);
                let mut out = ws.as_bytes().to_vec();
                out.push(b'{');
                out.extend(members.join(format!(",{ws}").as_bytes()));
                out.push(b'}');
                out.extend(ws.as_bytes());
                out
            })
    }

    /// Damages `body` with up to a few edits drawn from `edits`: overwrite, insert or delete
    /// one byte (JSON punctuation likely), or cut the body.
    fn mutate(body: &mut Vec<u8>, edits: &[(u8, prop::sample::Index, u8)]) {
        const BYTES: &[u8] = b"{}[]\":,\\ \n0123456789-+.eEtrufalsn\x01\x7f\xc3\xa9\xff";
        for &(kind, at, byte) in edits {
            let len = body.len();
            let byte = if byte & 0x80 == 0 {
                BYTES[usize::from(byte) % BYTES.len()]
            } else {
                byte
            };
            match kind % 4 {
                0 if len > 0 => body[at.index(len)] = byte,
                1 => body.insert(at.index(len + 1), byte),
                2 if len > 0 => {
                    body.remove(at.index(len));
                }
                3 => body.truncate(at.index(len + 1)),
                _ => {}
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        #[test]
        fn the_scanner_agrees_with_the_tape_on_raw_bodies(body in arb_raw_body()) {
            check_scan_agrees(&body);
        }

        #[test]
        fn the_scanner_agrees_with_the_tape_on_damaged_bodies(
            mut body in arb_raw_body(),
            edits in prop::collection::vec((any::<u8>(), any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            mutate(&mut body, &edits);
            check_scan_agrees(&body);
        }

        #[test]
        fn the_scanner_agrees_with_the_tape_on_written_bodies(
            members in arb_members(),
            seeds in prop::collection::vec(any::<u8>(), 1..64),
            edits in prop::collection::vec((any::<u8>(), any::<prop::sample::Index>(), any::<u8>()), 0..3),
        ) {
            let mut writer = Writer { seeds: &seeds, at: 0, out: Vec::new() };
            writer.ws();
            writer.object(&members);
            writer.ws();
            let mut body = writer.out;
            mutate(&mut body, &edits);
            check_scan_agrees(&body);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn agrees_with_serde_json(members in arb_members(), seeds in prop::collection::vec(any::<u8>(), 1..64)) {
            let mut writer = Writer { seeds: &seeds, at: 0, out: Vec::new() };
            writer.ws();
            writer.object(&members);
            writer.ws();
            let body = writer.out;
            let doc: Value = serde_json::from_slice(&body).unwrap();
            let mut scratch = Vec::new();
            let found = peek(&body, &mut scratch);
            check_agrees_with_serde(&body, &found, &doc);
            check_scanners_agree(&body);
        }

        #[test]
        fn agrees_with_serde_json_on_compact_output(members in arb_members()) {
            let doc = Value::Object(members.into_iter().collect());
            let body = serde_json::to_vec(&doc).unwrap();
            let found = peek(&body, &mut Vec::new());
            check_agrees_with_serde(&body, &found, &doc);
        }

        #[test]
        fn a_rewrite_is_the_reference_splice(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            start in 0usize..220,
            end in 0usize..220,
            new_model in any::<String>(),
        ) {
            check_rewrite(&body, start..end, &new_model);
        }

        #[test]
        fn rewrite_round_trips(members in arb_members(), new_model in any::<String>()) {
            let doc = Value::Object(members.into_iter().collect());
            let body = serde_json::to_vec_pretty(&doc).unwrap();
            if let Ok(before) = peek(&body, &mut Vec::new()) {
                let rewritten = rewrite_model(&body, before.model_span.clone(), &new_model);
                let after = peek(&rewritten, &mut Vec::new()).unwrap();
                prop_assert_eq!(&after.model, &new_model);
                prop_assert_eq!(after.stream, before.stream);
                prop_assert_eq!(after.has_tools, before.has_tools);
                prop_assert_eq!(&rewritten[..after.model_span.start], &body[..before.model_span.start]);
                prop_assert_eq!(&rewritten[after.model_span.end..], &body[before.model_span.end..]);
                // Parse the original too: serde_json's float parsing is not exact, so
                // compare two parses rather than a parse with the generated value.
                let mut expected: Value = serde_json::from_slice(&body).unwrap();
                expected["model"] = Value::String(new_model.clone());
                prop_assert_eq!(serde_json::from_slice::<Value>(&rewritten).unwrap(), expected);
            }
        }

        #[test]
        fn never_panics_on_random_bytes(body in prop::collection::vec(any::<u8>(), 0..512)) {
            check_scan_agrees(&body);
        }

        #[test]
        fn json_like_noise_never_panics_and_ok_means_serde_agrees(
            body in prop::collection::vec(
                prop::sample::select(b"{}[]\":,\\ \nmodelstrue01-.eunfals".to_vec()), 0..96)
        ) {
            let found = peek(&body, &mut Vec::new());
            if found.is_ok() {
                let doc: Value = serde_json::from_slice(&body).unwrap();
                check_agrees_with_serde(&body, &found, &doc);
            }
            check_scanners_agree(&body);
        }

        #[test]
        fn damaged_valid_bodies_never_panic(
            members in arb_members(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let doc = Value::Object(members.into_iter().collect());
            let mut body = serde_json::to_vec(&doc).unwrap();
            let truncated = &body[..cut.index(body.len())];
            prop_assert!(peek(truncated, &mut Vec::new()).is_err());
            let at = flip.index(body.len());
            body[at] = byte;
            let found = peek(&body, &mut Vec::new());
            if found.is_ok() {
                let doc: Value = serde_json::from_slice(&body).unwrap();
                check_agrees_with_serde(&body, &found, &doc);
            }
            check_scanners_agree(&body);
        }

        #[test]
        fn json_string_encoding_matches_serde_json(s in any::<String>()) {
            let mut out = Vec::new();
            write_json_string(&mut out, &s);
            prop_assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&s).unwrap());
        }
    }
}
