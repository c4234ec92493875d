//! The small-body scanner: owns reading a request body's routing fields in one validating
//! pass over its bytes, without simd-json's copy, stage 1 index and stage 2 tape, for the
//! bodies where that machinery costs more than the reading itself (the usual chat request
//! is a few hundred bytes).
//!
//! # The contract: a subset of the tape path, never a second opinion
//!
//! [`scan`] answers `Some` only for a body it can vouch for, and then exactly what the tape
//! path ([`super::peek_tape`]) answers; everything else is `None` and the caller parses the
//! body with simd-json. So the two paths need not agree on what is an error, only on what
//! is accepted: every `Some` body is one simd-json accepts, with the same model (decoded),
//! `stream`, tool count, `background` span and model span. To make that easy to trust the
//! scanner accepts a strict part of JSON and gives up on anything rarer:
//!
//! - the grammar of RFC 8259 (whitespace is space, tab, LF, CR), nesting at most
//!   [`MAX_DEPTH`] containers below the top-level object (simd-json's limit is 1024);
//! - strings with no raw byte below 0x20 (simd-json rejects them too), valid UTF-8 (checked
//!   per string with `std::str::from_utf8`, only for strings with a byte >= 0x80), escapes
//!   `\" \\ \/ \b \f \n \r \t` and `\uXXXX` where a high surrogate is followed by a
//!   `\u` low surrogate and no low surrogate stands alone (what simd-json decodes);
//! - numbers of at most 18 digits (integer and fraction together) and an exponent of at most
//!   two digits: simd-json reads every such integer as an `i64`/`u64` and every such float
//!   as a finite `f64`, so none hits its range errors;
//! - a top-level key or a `model` value with an escape, a duplicated routing key, a missing
//!   or non-string `model`, a `stream` that is not `true`/`false`/`null`, a document that is
//!   not an object: all `None` (the tape path decodes, or words the error).
//!
//! The differential tests below (and the `peek_scan` fuzz target) check the contract on
//! generated, mutated and arbitrary bodies.
//!
//! # How
//!
//! One cursor over the bytes. Top-level members are read one by one (the key compared raw,
//! as it has no escape); every other value is skipped by an iterative walk that keeps the
//! open containers as a bit stack and counts the direct children of the outermost one (the
//! tool count). Strings, most of a body, are scanned eight bytes at a time (a `u64` per
//! step, SWAR): one test finds the first quote, backslash or control byte in the word.

use std::ops::Range;

use super::fields::Peek;
use crate::routing::model_name::ModelName;

/// Bodies up to this size are scanned; larger ones go straight to simd-json, whose
/// SIMD stage 1 is cheaper per byte on long bodies.
pub const SCAN_MAX_BYTES: usize = 16 * 1024;

/// Containers the scanner follows below the top-level object before it gives up.
pub const MAX_DEPTH: u32 = 64;

/// Digits (integer and fraction together) a number may have.
const MAX_DIGITS: usize = 18;

/// Digits an exponent may have.
const MAX_EXPONENT_DIGITS: usize = 2;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The routing fields of `body` when the scanner can vouch for them (see the module doc);
/// `None` means "ask simd-json", not "invalid".
pub fn scan(body: &[u8]) -> Option<Peek> {
    // Valid JSON is ASCII outside its strings, so this checks every string's UTF-8 (what
    // simd-json checks of the whole input), and leaves the model a `str` to slice.
    let text = std::str::from_utf8(body).ok()?;
    let mut s = Cursor { body, pos: 0 };
    s.ws();
    s.eat(b'{')?;
    let mut model: Option<Range<usize>> = None;
    let mut stream: Option<bool> = None;
    let mut tools: Option<usize> = None;
    let mut background: Option<Option<Range<usize>>> = None;
    loop {
        s.ws();
        let key_start = s.pos;
        if s.string()? {
            // An escaped key may decode to a routing key: the tape path compares decoded keys.
            return None;
        }
        let key = body.get(key_start + 1..s.pos - 1)?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        let start = s.pos;
        match key {
            b"model" => {
                if model.is_some() || s.string()? {
                    return None;
                }
                model = Some(start..s.pos);
            }
            b"stream" => {
                if stream.is_some() {
                    return None;
                }
                stream = Some(if s.word(b"true") {
                    true
                } else if s.word(b"false") || s.word(b"null") {
                    false
                } else {
                    return None;
                });
            }
            b"tools" => {
                if tools.is_some() {
                    return None;
                }
                tools = Some(s.value()?);
            }
            b"background" => {
                if background.is_some() {
                    return None;
                }
                s.value()?;
                let span = start..s.pos;
                background = Some((body.get(span.clone()) == Some(b"true")).then_some(span));
            }
            _ => {
                s.value()?;
            }
        }
        s.ws();
        match s.byte()? {
            b',' => s.pos += 1,
            b'}' => {
                s.pos += 1;
                break;
            }
            _ => return None,
        }
    }
    s.ws();
    if s.pos != body.len() {
        return None;
    }
    let model_span = model?;
    let model = text.get(model_span.start + 1..model_span.end.checked_sub(1)?)?;
    let tool_count = tools.unwrap_or(0);
    Some(Peek {
        model: ModelName::new(model),
        stream: stream.unwrap_or(false),
        has_tools: tool_count > 0,
        model_span,
        tool_count,
        background_span: background.flatten(),
    })
}

struct Cursor<'a> {
    body: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn byte(&self) -> Option<u8> {
        self.body.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.body.get(self.pos) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.byte()? == byte).then(|| self.pos += 1)
    }

    /// Consumes `literal` if the body has it here.
    fn word(&mut self, literal: &[u8]) -> bool {
        let found = self.body.get(self.pos..self.pos + literal.len()) == Some(literal);
        if found {
            self.pos += literal.len();
        }
        found
    }

    /// Skips one value; for a container, returns how many values it holds directly (array
    /// items, object members), for a scalar 0.
    fn value(&mut self) -> Option<usize> {
        // Bit i: the container i + 1 levels down is an object (1) or an array (0).
        let mut objects: u64 = 0;
        let mut depth: u32 = 0;
        let mut children = 0usize;
        loop {
            // At the first byte of a value.
            if depth == 1 {
                children += 1;
            }
            let opened = match self.byte()? {
                b'{' => Some(true),
                b'[' => Some(false),
                b'"' => {
                    self.string()?;
                    None
                }
                b't' | b'f' | b'n' => {
                    if !(self.word(b"true") || self.word(b"false") || self.word(b"null")) {
                        return None;
                    }
                    None
                }
                _ => {
                    self.number()?;
                    None
                }
            };
            if let Some(is_object) = opened {
                if depth == MAX_DEPTH {
                    return None;
                }
                depth += 1;
                objects = objects << 1 | u64::from(is_object);
                self.pos += 1;
                self.ws();
                let close = if is_object { b'}' } else { b']' };
                if self.byte()? != close {
                    if is_object {
                        self.member_key()?;
                    }
                    continue;
                }
                self.pos += 1;
                depth -= 1;
                objects >>= 1;
            }
            // A value ended: close containers until one has a next element.
            loop {
                if depth == 0 {
                    return Some(children);
                }
                self.ws();
                let is_object = objects & 1 == 1;
                match self.byte()? {
                    b',' => {
                        self.pos += 1;
                        self.ws();
                        if is_object {
                            self.member_key()?;
                        }
                        break;
                    }
                    b'}' if is_object => {}
                    b']' if !is_object => {}
                    _ => return None,
                }
                self.pos += 1;
                depth -= 1;
                objects >>= 1;
            }
        }
    }

    /// A key and its colon, leaving the cursor at the value.
    fn member_key(&mut self) -> Option<()> {
        self.string()?;
        self.ws();
        self.eat(b':')?;
        self.ws();
        Some(())
    }

    /// A number within the module doc's limits; the byte after it is checked by the caller
    /// (it must be whitespace, `,`, `}` or `]`).
    fn number(&mut self) -> Option<()> {
        let body = self.body;
        let digits_from = |mut at: usize| {
            while body.get(at).is_some_and(u8::is_ascii_digit) {
                at += 1;
            }
            at
        };
        let mut at = self.pos;
        if body.get(at) == Some(&b'-') {
            at += 1;
        }
        let int_start = at;
        at = match body.get(at)? {
            b'0' => at + 1,
            b'1'..=b'9' => digits_from(at + 1),
            _ => return None,
        };
        let mut digits = at - int_start;
        if body.get(at) == Some(&b'.') {
            let frac_start = at + 1;
            at = digits_from(frac_start);
            if at == frac_start {
                return None;
            }
            digits += at - frac_start;
        }
        if let Some(b'e' | b'E') = body.get(at) {
            at += 1;
            if let Some(b'+' | b'-') = body.get(at) {
                at += 1;
            }
            let exp_start = at;
            at = digits_from(exp_start);
            if !(1..=MAX_EXPONENT_DIGITS).contains(&(at - exp_start)) {
                return None;
            }
        }
        if digits > MAX_DIGITS {
            return None;
        }
        self.pos = at;
        Some(())
    }

    /// The cursor is at an opening quote: moves past the closing one. Returns whether the
    /// string has an escape. (UTF-8 is checked once for the whole body, in [`scan`].)
    #[inline(always)]
    fn string(&mut self) -> Option<bool> {
        let body = self.body;
        if body.get(self.pos) != Some(&b'"') {
            return None;
        }
        let mut at = self.pos + 1;
        let mut escaped = false;
        loop {
            if let Some(chunk) = body.get(at..at + 8) {
                let word = u64::from_le_bytes(chunk.try_into().ok()?);
                let stop = below(word, 0x20)
                    | zero(word ^ (ONES * u64::from(b'"')))
                    | zero(word ^ (ONES * u64::from(b'\\')));
                if stop == 0 {
                    at += 8;
                    continue;
                }
                // Bytes before the first flagged one are plain.
                at += (stop.trailing_zeros() / 8) as usize;
            }
            match *body.get(at)? {
                b'"' => {
                    self.pos = at + 1;
                    return Some(escaped);
                }
                b'\\' => {
                    escaped = true;
                    at = escape_end(body, at)?;
                }
                0..0x20 => return None,
                _ => at += 1,
            }
        }
    }
}

/// Flags (high bit of the byte) the first byte of `word` that is zero; bytes above the
/// first flagged one may be flagged falsely.
fn zero(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGH_BITS
}

/// Flags the first byte of `word` below `n` (n <= 0x80), as [`zero`].
fn below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH_BITS
}

/// `at` is at a backslash: the position after its escape, `None` for one simd-json would
/// not decode.
fn escape_end(body: &[u8], at: usize) -> Option<usize> {
    match body.get(at + 1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(at + 2),
        b'u' => match hex4(body, at + 2)? {
            0xd800..0xdc00 => {
                if body.get(at + 6..at + 8) != Some(b"\\u") {
                    return None;
                }
                (0xdc00..0xe000)
                    .contains(&hex4(body, at + 8)?)
                    .then_some(at + 12)
            }
            0xdc00..0xe000 => None,
            _ => Some(at + 6),
        },
        _ => None,
    }
}

/// The four hex digits at `at`.
fn hex4(body: &[u8], at: usize) -> Option<u32> {
    body.get(at..at + 4)?.iter().try_fold(0u32, |acc, &digit| {
        Some(acc << 4 | char::from(digit).to_digit(16)?)
    })
}
