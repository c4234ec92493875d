//! Peek: owns reading the few routing fields (`model`, `stream`, `tools`) out of a JSON
//! request body, and splicing a new `model` into the body without re-serializing it.
//!
//! # How
//!
//! 1. The body is copied into the caller's per-shard `scratch` buffer (simd-json unescapes
//!    strings in place) followed by [`simd_json::INPUT_PADDING`] bytes of padding, and
//!    [`simd_json::fill_tape_padded`] validates it and builds a tape. The parser's own
//!    buffers and the tape live in a thread-local [`ParserState`]: with one shard per thread
//!    that is per-shard state, so a warm call allocates nothing but the returned `model`.
//! 2. The top-level members are walked on the tape (O(number of top-level members), nested
//!    values are skipped by their node count) to read `model`, `stream` and `tools`, and to
//!    learn the *ordinal* of the `model` member. Keys are compared after JSON unescaping,
//!    so `"mod\u0065l"` is the key `model`, exactly as simd-json decodes it.
//! 3. [`member_value_span`], a small scanner of our own, walks the raw body's top-level
//!    members to that ordinal and returns the byte range of its value. It never compares
//!    keys (simd-json already did that), it only counts members, skipping strings (with
//!    escapes) and nested containers. It runs only on bodies simd-json accepted, and it is
//!    still written so that any disagreement is an error, never a panic or a wrong span.
//!
//! # Decisions
//!
//! - **Duplicate keys.** A top-level `model`, `stream` or `tools` key that appears more than
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

use bytes::Bytes;
use simd_json::prelude::{ValueAsScalar as _, ValueIntoString as _};
use simd_json::{Buffers, ErrorType, Tape};

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

/// The routing fields of one request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The decoded top-level `model` string.
    pub model: String,
    /// The top-level `stream` flag; `false` when absent or `null`.
    pub stream: bool,
    /// Whether the top-level `tools` is present and non-empty.
    pub has_tools: bool,
    /// byte range of the model VALUE including its quotes
    pub model_span: Range<usize>,
}

/// Reads `model`, `stream` and `tools` from `body`, which must be a JSON object.
///
/// `scratch` is a reusable per-shard buffer (simd-json parses in place and mutates its input,
/// so the body is copied into scratch first; the original body stays untouched). Its
/// capacity is kept across calls.
pub fn peek(body: &[u8], scratch: &mut Vec<u8>) -> Result<Peek, PeekError> {
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

/// Returns the body with bytes `span` replaced by the JSON string encoding of `new_model`
/// (escape as JSON requires). Every other byte is copied unchanged.
///
/// `span` is meant to be [`Peek::model_span`] from the same body. A span that does not fit
/// the body is clamped to it (never a panic).
pub fn rewrite_model(body: &[u8], span: Range<usize>, new_model: &str) -> Bytes {
    let end = span.end.min(body.len());
    let start = span.start.min(end);
    let (head, rest) = body.split_at(start);
    let tail = rest.get(end - start..).unwrap_or_default();
    let mut out = Vec::with_capacity(head.len() + new_model.len() + 2 + tail.len());
    out.extend_from_slice(head);
    write_json_string(&mut out, new_model);
    out.extend_from_slice(tail);
    Bytes::from(out)
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
    model: String,
    /// Ordinal of the `model` member among the top-level members.
    model_member: usize,
    stream: bool,
    has_tools: bool,
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

    let model_span = member_value_span(body, fields.model_member)
        .filter(|span| {
            body.get(span.clone())
                .is_some_and(|v| v.len() >= 2 && v.first() == Some(&b'"'))
        })
        .ok_or_else(|| PeekError::InvalidJson("model value not found in body".to_owned()))?;
    Ok(Peek {
        model: fields.model,
        stream: fields.stream,
        has_tools: fields.has_tools,
        model_span,
    })
}

fn read_fields(tape: &Tape<'_>) -> Result<Fields, PeekError> {
    let object = tape.as_value().as_object().ok_or(PeekError::NotAnObject)?;
    let mut model: Option<(usize, Option<&str>)> = None;
    let mut stream: Option<Option<bool>> = None;
    let mut tools: Option<bool> = None;
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
                let non_empty = match (value.as_array(), value.as_object()) {
                    (Some(array), _) => !array.is_empty(),
                    (None, Some(object)) => !object.is_empty(),
                    (None, None) => false,
                };
                tools = Some(non_empty);
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
        model: model.to_owned(),
        model_member,
        stream,
        has_tools: tools.unwrap_or(false),
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

/// Appends `value` as a JSON string literal: quotes, `\"`, `\\`, the short escapes for
/// control characters that have one, `\u00XX` for the others; everything else verbatim
/// (UTF-8 needs no escaping in JSON).
fn write_json_string(out: &mut Vec<u8>, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = value.as_bytes();
    let mut copied = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let short = match byte {
            b'"' => b'"',
            b'\\' => b'\\',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x08 => b'b',
            0x0c => b'f',
            0x00..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&bytes[copied..i]);
        if short == 0 {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0x0f)]);
        } else {
            out.push(b'\\');
            out.push(short);
        }
        copied = i + 1;
    }
    out.extend_from_slice(&bytes[copied..]);
    out.push(b'"');
}
