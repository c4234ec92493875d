//! A borrowed walk over an event's JSON for the shapes providers actually send, so that
//! classifying an event costs one pass over its bytes and no allocation. It checks every
//! byte it passes at least as strictly as `serde_json` would (string escapes, control
//! characters, UTF-8, number grammar, nesting), and it gives up — `None` — on anything it is
//! not sure `serde_json` reads the same way: an escape in a key, a number with an exponent
//! or more than 18 integer digits, a lone surrogate, nesting deeper than [`MAX_DEPTH`]. The
//! callers then ask `serde_json`, which decides. So where the walk answers, the document is
//! one `serde_json` accepts, and the callers' property tests check it reads the same.

/// Nesting (objects and arrays) the walk follows; deeper documents go to `serde_json`
/// (whose own limit is 128).
pub const MAX_DEPTH: usize = 64;

/// A string value as it lies in the input: its bytes between the quotes, escapes still in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Str<'a> {
    pub raw: &'a [u8],
    /// It has at least one escape (`raw` is not the text).
    pub escaped: bool,
    /// The UTF-8 length of the text it stands for.
    pub len: usize,
}

impl<'a> Str<'a> {
    /// The text, when it has no escape (then it is `raw`, already checked to be UTF-8).
    pub fn plain(&self) -> Option<&'a str> {
        if self.escaped {
            return None;
        }
        std::str::from_utf8(self.raw).ok()
    }
}

/// What a skipped value was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Val<'a> {
    Null,
    Bool,
    Num,
    Str(Str<'a>),
    /// An array; true when it has an element.
    Arr(bool),
    /// An object; true when it has a member.
    Obj(bool),
}

/// A position in the bytes of one JSON document.
pub struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    /// The next byte after any whitespace.
    #[inline(always)]
    pub fn peek(&mut self) -> Option<u8> {
        // Compact JSON, the usual event, has none: every byte that can start a token is
        // above the space.
        let b = *self.bytes.get(self.at)?;
        if b > b' ' {
            return Some(b);
        }
        self.peek_past_whitespace()
    }

    /// [`Cursor::peek`] at a byte that may be whitespace.
    #[inline(never)]
    fn peek_past_whitespace(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.at) {
            if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    #[inline(always)]
    fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| self.at += 1)
    }

    /// Nothing but whitespace is left.
    pub fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// `word` at the cursor (an array, so the comparison is a fixed-size one, not a call).
    #[inline(always)]
    fn literal<const N: usize>(&mut self, word: &[u8; N]) -> Option<()> {
        let here = self.bytes.get(self.at..self.at + N)?;
        (here == word).then(|| self.at += N)
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes.get(self.at..self.at + 4)?;
        let mut n = 0u32;
        for &d in digits {
            n = n * 16 + char::from(d).to_digit(16)?;
        }
        self.at += 4;
        Some(n)
    }

    /// A string (the cursor on its opening quote, whitespace allowed before it).
    #[inline(always)]
    pub fn string(&mut self) -> Option<Str<'a>> {
        self.eat(b'"')?;
        let start = self.at;
        // The usual string: plain bytes up to its closing quote.
        let (run, seen) = plain_run(self.bytes.get(start..)?);
        let end = start + run;
        if self.bytes.get(end) != Some(&b'"') {
            self.at = end;
            return self.string_rest(start, seen);
        }
        self.at = end + 1;
        let raw = self.bytes.get(start..end)?;
        if seen & HIGH != 0 {
            std::str::from_utf8(raw).ok()?;
        }
        Some(Str {
            raw,
            escaped: false,
            len: run,
        })
    }

    /// The rest of a string that started at `start` and has an escape or a control
    /// character at the cursor; `seen` as [`plain_run`] gives it for the bytes before.
    #[cold]
    fn string_rest(&mut self, start: usize, mut seen: u64) -> Option<Str<'a>> {
        // Bytes of escapes beyond the text they stand for.
        let mut saved = 0usize;
        loop {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let e = *self.bytes.get(self.at)?;
                    self.at += 1;
                    saved += match e {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 1,
                        b'u' => match self.hex4()? {
                            0xD800..=0xDBFF => {
                                // A high surrogate needs its low half right after it.
                                self.literal(b"\\u")?;
                                if !(0xDC00..=0xDFFF).contains(&self.hex4()?) {
                                    return None;
                                }
                                12 - 4
                            }
                            0xDC00..=0xDFFF => return None,
                            0..=0x7F => 6 - 1,
                            0x80..=0x7FF => 6 - 2,
                            _ => 6 - 3,
                        },
                        _ => return None,
                    };
                }
                _ => return None, // a control character
            }
            let (run, bits) = plain_run(self.bytes.get(self.at..)?);
            self.at += run;
            seen |= bits;
        }
        let raw = self.bytes.get(start..self.at - 1)?;
        if seen & HIGH != 0 {
            // Escapes are ASCII, so the whole stretch is UTF-8 exactly when the text is.
            std::str::from_utf8(raw).ok()?;
        }
        Some(Str {
            raw,
            escaped: saved > 0,
            len: raw.len() - saved,
        })
    }

    /// A number: `-? (0 | [1-9][0-9]*) (. [0-9]+)?` with at most 18 integer digits; an
    /// exponent gives up (so no number read here is out of range for `f64` or `u64`).
    #[inline(always)]
    fn number(&mut self) -> Option<()> {
        // A local position (the cursor's is stored once, at the end).
        let bytes = self.bytes;
        let mut at = self.at;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        let start = at;
        at = digits(bytes, at);
        let int = at - start;
        if int == 0 || int > 18 || (int > 1 && bytes.get(start) == Some(&b'0')) {
            return None;
        }
        if bytes.get(at) == Some(&b'.') {
            let frac = at + 1;
            at = digits(bytes, frac);
            if at == frac {
                return None;
            }
        }
        match bytes.get(at) {
            Some(b'e' | b'E') => None,
            _ => {
                self.at = at;
                Some(())
            }
        }
    }

    /// Skips one value of any kind at nesting `depth` (the enclosing containers), saying
    /// what it was.
    #[inline(always)]
    pub fn value(&mut self, depth: usize) -> Option<Val<'a>> {
        match self.peek()? {
            b'"' => self.string().map(Val::Str),
            b'{' => self.container(depth).map(Val::Obj),
            b'[' => self.container(depth).map(Val::Arr),
            b => self.scalar(b),
        }
    }

    /// A literal or a number starting with `b` (the byte at the cursor).
    #[inline(always)]
    fn scalar(&mut self, b: u8) -> Option<Val<'a>> {
        match b {
            b't' => self.literal(b"true").map(|_| Val::Bool),
            b'f' => self.literal(b"false").map(|_| Val::Bool),
            b'n' => self.literal(b"null").map(|_| Val::Null),
            b'-' | b'0'..=b'9' => self.number().map(|_| Val::Num),
            _ => None,
        }
    }

    /// Skips the object or array at the cursor, at nesting `depth`; true when it has a
    /// member or element. One loop, not a call per nested value: the containers open inside
    /// it are a bit stack (1: object), and each is held to the same grammar as
    /// [`Cursor::object`] and [`Cursor::array`] (any key, escaped or not; nesting below
    /// [`MAX_DEPTH`]).
    #[inline(never)]
    fn container(&mut self, depth: usize) -> Option<bool> {
        let mut objects: u64 = 0;
        let mut open = 0usize;
        let mut any = false;
        loop {
            // At a value (whitespace may come first).
            match self.peek()? {
                b @ (b'{' | b'[') => {
                    if depth + open >= MAX_DEPTH {
                        return None;
                    }
                    self.at += 1;
                    let is_object = b == b'{';
                    open += 1;
                    objects = objects << 1 | u64::from(is_object);
                    let close = if is_object { b'}' } else { b']' };
                    if self.peek()? != close {
                        any |= open == 1;
                        if is_object {
                            self.member_key()?;
                        }
                        continue;
                    }
                    self.at += 1;
                    open -= 1;
                    objects >>= 1;
                }
                b'"' => {
                    self.string()?;
                }
                b => {
                    self.scalar(b)?;
                }
            }
            // A value ended: close containers until one has a next element.
            loop {
                if open == 0 {
                    return Some(any);
                }
                let is_object = objects & 1 == 1;
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        if is_object {
                            self.member_key()?;
                        }
                        break;
                    }
                    b'}' if is_object => {}
                    b']' if !is_object => {}
                    _ => return None,
                }
                self.at += 1;
                open -= 1;
                objects >>= 1;
            }
        }
    }

    /// A key (escapes allowed) and its colon, in an object that is skipped.
    #[inline(always)]
    fn member_key(&mut self) -> Option<()> {
        self.string()?;
        self.eat(b':')
    }

    /// The next value when it is not an object (skipped, as [`Cursor::value`] does);
    /// `Some(None)` leaves an object where it is, for [`Cursor::object`].
    pub fn value_or_object(&mut self, depth: usize) -> Option<Option<Val<'a>>> {
        if self.peek()? == b'{' {
            return Some(None);
        }
        self.value(depth).map(Some)
    }

    /// An object whose member values `member` reads (it must consume each value): called
    /// with the key's text and the nesting of the value. A key with an escape gives up
    /// (its text would have to be unescaped to be compared).
    pub fn object(
        &mut self,
        depth: usize,
        member: impl FnMut(&mut Self, &'a [u8], usize) -> Option<()>,
    ) -> Option<()> {
        self.object_with(depth, true, member)
    }

    fn object_with(
        &mut self,
        depth: usize,
        plain_keys: bool,
        mut member: impl FnMut(&mut Self, &'a [u8], usize) -> Option<()>,
    ) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.string()?;
            if plain_keys && key.escaped {
                return None;
            }
            self.eat(b':')?;
            member(self, key.raw, depth + 1)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array whose elements `element` reads (it must consume each one), called with
    /// the nesting of the element.
    pub fn array(
        &mut self,
        depth: usize,
        mut element: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            element(self, depth + 1)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }
}

/// The end of the run of ASCII digits starting at `at`.
#[inline(always)]
fn digits(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at += 1;
    }
    at
}

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);

/// The length of the run at the start of `bytes` that a string passes as it is (no quote,
/// backslash or control character), and bits whose [`HIGH`] bits are set when a byte of the
/// run is not ASCII (they may also be set by a few bytes after it: then the caller checks
/// UTF-8 when it need not). Eight bytes at a time: in each word, a byte below 0x20 or equal
/// to `"` or `\\` sets its high bit in `special` (a borrow only ever carries upward from
/// such a byte, so the lowest flag is exact).
#[inline(always)]
fn plain_run(bytes: &[u8]) -> (usize, u64) {
    let mut seen = 0u64;
    let mut at = 0;
    while let Some(word) = bytes.get(at..at + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let x = u64::from_le_bytes(w);
        seen |= x;
        let quote = x ^ (ONES * u64::from(b'"'));
        let slash = x ^ (ONES * u64::from(b'\\'));
        let special = (x.wrapping_sub(ONES * 0x20)
            | quote.wrapping_sub(ONES) & !quote
            | slash.wrapping_sub(ONES) & !slash)
            & !x
            & HIGH;
        if special != 0 {
            return (at + (special.trailing_zeros() / 8) as usize, seen);
        }
        at += 8;
    }
    for &b in bytes.get(at..).unwrap_or_default() {
        if b < 0x20 || b == b'"' || b == b'\\' {
            break;
        }
        seen |= u64::from(b);
        at += 1;
    }
    (at, seen)
}

/// Marks `bit` in `seen`; `None` when it was already there (a field given twice, which
/// `serde_json` refuses for a struct and a walk here does not try to settle).
pub fn once(seen: &mut u16, bit: u16) -> Option<()> {
    if *seen & bit != 0 {
        return None;
    }
    *seen |= bit;
    Some(())
}

/// Event JSON for the property tests of the readers built on the walk: OpenAI chat,
/// Responses and Anthropic shapes with members in any order, repeated or missing, strings
/// with escapes and non-ASCII text, odd values where objects are expected, whitespace, and
/// now and then a document cut short or not an object at all.
#[cfg(test)]
pub mod arb {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;

    use crate::sse::Event;

    /// An event named `name` (or unnamed) carrying `data`.
    pub fn event<'a>(name: Option<&'a [u8]>, data: &'a [u8]) -> Event<'a> {
        Event {
            name,
            data: Some(data),
            comment: false,
        }
    }

    fn one_of(v: &[&'static str]) -> BoxedStrategy<String> {
        select(v.to_vec()).prop_map(str::to_owned).boxed()
    }

    fn text() -> BoxedStrategy<String> {
        one_of(&[
            r#""""#,
            r#""Hi""#,
            "\"h\u{e9}llo \u{1F600}\"",
            "\"\u{65e5}\u{672c}\"",
            r#""a\nb""#,
            r#""\u00e9""#,
            r#""\ud83d\ude00""#,
            r#""\"q\" \\ \/""#,
            r#""tool""#,
            r#""\ud800""#,
        ])
    }

    fn kind() -> BoxedStrategy<String> {
        one_of(&[
            r#""content_block_delta""#,
            r#""content_block_start""#,
            r#""content_block_stop""#,
            r#""message_start""#,
            r#""message_delta""#,
            r#""ping""#,
            r#""error""#,
            r#""text_delta""#,
            r#""thinking_delta""#,
            r#""signature_delta""#,
            r#""input_json_delta""#,
            r#""citations_delta""#,
            r#""text""#,
            r#""thinking""#,
            r#""redacted_thinking""#,
            r#""tool_use""#,
            r#""reasoning""#,
            r#""function_call""#,
            r#""message""#,
            r#""response.output_text.delta""#,
            r#""response.reasoning_summary_text.delta""#,
            r#""response.function_call_arguments.delta""#,
            r#""response.refusal.delta""#,
            r#""response.output_item.added""#,
            r#""response.completed""#,
            r#""response.created""#,
            r#""Response.Reasoning.Delta""#,
            r#""TOOL_result""#,
            r#""te\u0078t_delta""#,
            r#""response.failed""#,
            r#""e\u0072ror""#,
            r#""""#,
        ])
    }

    fn scalar() -> BoxedStrategy<String> {
        one_of(&[
            "null",
            "null",
            "true",
            "false",
            "0",
            "-1",
            "12.5",
            "1e3",
            "01",
            "[]",
            "{}",
            "[1,{\"a\":[null]}]",
            "{\"type\":\"x\"}",
            "\"s\"",
        ])
    }

    fn any_value() -> BoxedStrategy<String> {
        prop_oneof![text(), kind(), scalar()].boxed()
    }

    fn member(
        keys: &[&'static str],
        value: BoxedStrategy<String>,
    ) -> BoxedStrategy<(String, String)> {
        (select(keys.to_vec()).prop_map(str::to_owned), value).boxed()
    }

    fn object_of(member: BoxedStrategy<(String, String)>, most: usize) -> BoxedStrategy<String> {
        (
            vec(member, 0..most).prop_shuffle(),
            select(vec!["", "", " ", "\n", "\t "]),
        )
            .prop_map(|(members, w)| {
                let body: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{w}\"{k}\"{w}:{w}{v}"))
                    .collect();
                format!("{{{}{w}}}", body.join(","))
            })
            .boxed()
    }

    fn chat_delta() -> BoxedStrategy<String> {
        object_of(
            prop_oneof![
                3 => member(&["content", "text"], prop_oneof![3 => text(), 1 => scalar()].boxed()),
                1 => member(&["role"], one_of(&[r#""assistant""#])),
                1 => member(
                    &["reasoning_content", "reasoning", "reasoning_details", "thinking"],
                    prop_oneof![text(), scalar()].boxed()
                ),
                1 => member(
                    &["tool_calls"],
                    prop_oneof![
                        one_of(&[
                            "[]",
                            r#"[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"a\":1}"}}]"#,
                        ]),
                        scalar()
                    ]
                    .boxed()
                ),
                1 => member(&["function_call"], prop_oneof![one_of(&[r#"{"name":"f"}"#]), scalar()].boxed()),
            ]
            .boxed(),
            4,
        )
    }

    fn choices() -> BoxedStrategy<String> {
        let choice = object_of(
            prop_oneof![
                4 => member(&["delta"], prop_oneof![4 => chat_delta(), 1 => any_value()].boxed()),
                1 => member(&["index"], one_of(&["0", "1"])),
                1 => member(&["finish_reason"], one_of(&["null", r#""stop""#])),
                1 => member(
                    &["logprobs"],
                    one_of(&["null", r#"{"content":[{"token":"a","logprob":-0.25}]}"#])
                ),
            ]
            .boxed(),
            4,
        );
        prop_oneof![
            4 => vec(prop_oneof![6 => choice, 1 => scalar()], 0..3)
                .prop_map(|c| format!("[{}]", c.join(","))),
            1 => scalar(),
        ]
        .boxed()
    }

    fn typed_object() -> BoxedStrategy<String> {
        object_of(
            prop_oneof![
                3 => member(&["type"], prop_oneof![4 => kind(), 1 => scalar()].boxed()),
                1 => member(&["text", "thinking", "partial_json", "name"], text()),
                1 => member(&["index", "id"], any_value()),
            ]
            .boxed(),
            4,
        )
    }

    fn usage() -> BoxedStrategy<String> {
        prop_oneof![
            one_of(&[
                r#"{"prompt_tokens":3,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}"#,
                r#"{"input_tokens":7,"output_tokens":1}"#,
            ]),
            scalar()
        ]
        .boxed()
    }

    /// One event's JSON (as bytes, as the scanner hands it on).
    pub fn event_json() -> BoxedStrategy<Vec<u8>> {
        let object = object_of(
            prop_oneof![
                3 => member(&["type"], prop_oneof![6 => kind(), 1 => scalar()].boxed()),
                3 => member(&["choices"], choices()),
                2 => member(&["delta"], prop_oneof![typed_object(), text(), scalar()].boxed()),
                2 => member(&["content_block", "item"], prop_oneof![3 => typed_object(), 1 => scalar()].boxed()),
                1 => member(&["usage", "error"], usage()),
                1 => member(
                    &["response"],
                    prop_oneof![
                        object_of(member(&["usage", "id", "status"], usage()), 3),
                        scalar()
                    ]
                    .boxed()
                ),
                2 => member(&["id", "model", "object", "created", "index", "t\\u0079pe"], any_value()),
            ]
            .boxed(),
            6,
        );
        prop_oneof![
            12 => object.clone().prop_map(String::into_bytes),
            1 => (object, any::<proptest::sample::Index>()).prop_map(|(o, at)| {
                let bytes = o.into_bytes();
                bytes[..at.index(bytes.len() + 1)].to_vec()
            }),
            1 => prop_oneof![any_value(), one_of(&["not json", "[{\"type\":\"ping\"}]", "{\"a\":1} x"])]
                .prop_map(String::into_bytes),
        ]
        .boxed()
    }

    /// An SSE event name, now and then.
    pub fn event_name() -> BoxedStrategy<Option<Vec<u8>>> {
        select(vec![
            None,
            None,
            Some(&b"message_start"[..]),
            Some(b"content_block_delta"),
            Some(b"ping"),
            Some(b"response.function_call_arguments.delta"),
            Some(b"response.output_text.delta"),
            Some(b"Thinking"),
            Some(b"\xffTOOL"),
            Some(b"reas\xffoning"),
            Some(b"error"),
            Some(b"response.failed"),
            Some(b""),
        ])
        .prop_map(|n| n.map(<[u8]>::to_vec))
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(text: &str) -> Option<Val<'_>> {
        let mut c = Cursor::new(text.as_bytes());
        let v = c.value(0)?;
        c.end()?;
        Some(v)
    }

    #[test]
    fn reads_what_json_allows_and_gives_up_on_the_rest() {
        for ok in [
            "null",
            " true ",
            "false",
            "0",
            "-0",
            "12.50",
            "-3.25",
            "999999999999999999",
            r#""""#,
            r#""a\"\\\/\b\f\n\r\t\u0000\u00e9\ud83d\ude00""#,
            "\"h\u{e9}llo \u{1F600}\"",
            "[]",
            "{}",
            r#"{"a":[1,{"b":null}],"\u0063":"d"}"#,
            " [ 1 , 2 ] ",
        ] {
            assert!(whole(ok).is_some(), "{ok}");
            assert!(
                serde_json::from_str::<serde_json::Value>(ok).is_ok(),
                "{ok}"
            );
        }
        for out in [
            "",
            "nul",
            "01",
            "1.",
            "-",
            "1e5",
            "1E5",
            "1.5e-3",
            "1234567890123456789",
            "+1",
            ".5",
            r#""\x""#,
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            "\"tab\there\"",
            "\"open",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{1:2}",
            "[1 2]",
            "1 2",
            "{\"a\":1}}",
        ] {
            assert!(whole(out).is_none(), "{out}");
        }
        assert!(whole(&"[".repeat(MAX_DEPTH + 1)).is_none());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(whole(&deep), Some(Val::Arr(true)));
        // Invalid UTF-8 inside a string.
        let mut c = Cursor::new(b"\"\xff\"");
        assert_eq!(c.value(0), None);
    }

    #[test]
    fn string_lengths_are_of_the_unescaped_text() {
        for text in [
            r#""""#,
            r#""abc""#,
            r#""a\nb""#,
            r#""\u00e9\u20ac\ud83d\ude00""#,
            "\"h\u{e9}\"",
            r#""\"quoted\"""#,
        ] {
            let Some(Val::Str(s)) = whole(text) else {
                unreachable!("{text}")
            };
            let want: String = serde_json::from_str(text).unwrap_or_default();
            assert_eq!(s.len, want.len(), "{text}");
            assert_eq!(s.escaped, text.contains('\\'), "{text}");
        }
    }

    /// The recursive skip the iterative [`Cursor::container`] replaced (one call per
    /// nested value, each container read as [`Cursor::object_with`] / [`Cursor::array`]
    /// read it), kept as the reference it is checked against.
    fn reference_value<'a>(c: &mut Cursor<'a>, depth: usize) -> Option<Val<'a>> {
        Some(match c.peek()? {
            b'"' => Val::Str(c.string()?),
            b'{' => {
                let mut any = false;
                c.object_with(depth, false, |c, _, d| {
                    any = true;
                    reference_value(c, d).map(drop)
                })?;
                Val::Obj(any)
            }
            b'[' => {
                let mut any = false;
                c.array(depth, |c, d| {
                    any = true;
                    reference_value(c, d).map(drop)
                })?;
                Val::Arr(any)
            }
            b't' => c.literal(b"true").map(|_| Val::Bool)?,
            b'f' => c.literal(b"false").map(|_| Val::Bool)?,
            b'n' => c.literal(b"null").map(|_| Val::Null)?,
            b'-' | b'0'..=b'9' => c.number().map(|_| Val::Num)?,
            _ => return None,
        })
    }

    /// What a skip read and where it stopped.
    type Skipped<'a> = Option<(Val<'a>, usize)>;

    /// Both skips over `text` from nesting `depth`.
    fn both(text: &[u8], depth: usize) -> (Skipped<'_>, Skipped<'_>) {
        let mut fast = Cursor::new(text);
        let mut slow = Cursor::new(text);
        (
            fast.value(depth).map(|v| (v, fast.at)),
            reference_value(&mut slow, depth).map(|v| (v, slow.at)),
        )
    }

    #[test]
    fn the_loop_skips_as_the_recursion_did_at_the_depth_limit() {
        for depth in [0, 1, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH] {
            for n in [1, 2, 3, MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1] {
                for (open, close) in [("[", "]"), ("{\"k\":", "}")] {
                    let deep = format!("{}1{}", open.repeat(n), close.repeat(n));
                    let (fast, slow) = both(deep.as_bytes(), depth);
                    assert_eq!(fast, slow, "{deep} at {depth}");
                }
            }
        }
    }

    proptest::proptest! {
        /// The word-at-a-time run is the byte-at-a-time one.
        #[test]
        fn plain_run_is_the_byte_by_byte_run(
            bytes in proptest::collection::vec(proptest::prop_oneof![
                proptest::prelude::any::<u8>(),
                proptest::sample::select(vec![b'"', b'\\', 0x1F, 0x20, 0x7F, 0x80, 0xFF, b'a']),
            ], 0..40)
        ) {
            let run = bytes
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
                .unwrap_or(bytes.len());
            let (got, seen) = plain_run(&bytes);
            proptest::prop_assert_eq!(got, run);
            // Every non-ASCII byte of the run is seen.
            if bytes[..run].iter().any(|b| !b.is_ascii()) {
                proptest::prop_assert!(seen & HIGH != 0);
            }
        }

        /// The iterative skip reads every value as the recursive one did: the same kind,
        /// ending at the same byte, and giving up on the same documents.
        #[test]
        fn the_loop_skips_as_the_recursion_did(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "{", "}", "[", "]", ",", ":", " ", "\n", "\"k\"", "\"\"", "\"a\\nb\"",
                "\"\\u00e9\"", "\"\\ud83d\"", "\"\u{e9}\"", "\"\\q\"", "\"k\\\"\"", "0", "-1",
                "12.5", "1e3", "01", "1.", "true", "false", "null", "nul", "tru", "\"\t\"", "x",
                "1234567890123456789",
            ]), 0..24),
            depth in 0..3usize,
        ) {
            let text = parts.concat();
            let (fast, slow) = both(text.as_bytes(), depth);
            proptest::prop_assert_eq!(fast, slow, "{}", text);
        }

        /// The same on event JSON (members in any order, nested choices, cut short).
        #[test]
        fn the_loop_skips_event_json_as_the_recursion_did(data in arb::event_json()) {
            let (fast, slow) = both(&data, 0);
            proptest::prop_assert_eq!(fast, slow, "{}", String::from_utf8_lossy(&data));
        }

        /// Whatever the walk accepts, serde_json accepts too (it is the stricter reader),
        /// and the strings it measured have the length serde_json reads.
        #[test]
        fn accepted_documents_are_json(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "{", "}", "[", "]", ",", ":", " ", "\n", "\"k\"", "\"type\"", "\"\"",
                "\"a\\nb\"", "\"\\u00e9\"", "\"\\ud83d\\ude00\"", "\"\\ud83d\"", "\"\u{e9}\"",
                "\"\\q\"", "0", "-1", "12.5", "1e3", "01", "true", "false", "null", "nul",
                "\"\t\"", "1234567890123456789",
            ]), 0..20)
        ) {
            let text = parts.concat();
            if let Some(v) = whole(&text) {
                let serde = serde_json::from_str::<serde_json::Value>(&text);
                proptest::prop_assert!(serde.is_ok(), "{}", text);
                if let (Val::Str(s), Ok(serde_json::Value::String(t))) = (v, serde) {
                    proptest::prop_assert_eq!(s.len, t.len());
                }
            }
        }
    }
}
