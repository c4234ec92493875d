//! The token counts a stream reports about itself: OpenAI chat's `usage` chunk
//! (`prompt_tokens`, `completion_tokens`), Responses' `response.usage` (`input_tokens`,
//! `output_tokens`), Anthropic's `message_start` (`message.usage.input_tokens`) and
//! `message_delta` (`usage.output_tokens`, cumulative). Only events that mention `"usage"`
//! are parsed (one substring search per event), and of those only events where `usage` is
//! not `null` everywhere (OpenAI sends `"usage":null` in every chunk before the last).

use bytes::Bytes;
use serde::Deserialize;

use super::Event;

/// What a stream said about its tokens so far: the last value reported for each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

#[derive(Deserialize, Default, Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct Holder {
    #[serde(default)]
    usage: Option<Counts>,
}

#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    usage: Option<Counts>,
    /// Anthropic `message_start`.
    #[serde(default)]
    message: Option<Holder>,
    /// Responses `response.completed` and kin.
    #[serde(default)]
    response: Option<Holder>,
}

/// The searcher for `"usage"` in an event, built once (building one per event cost about
/// as much as the search).
static USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));

/// Every `"usage"` in `data` is a member set to `null` (as in each chunk of an OpenAI stream
/// asked to include usage, before the last): nothing to read, no parse. Not said for data
/// with a backslash, where an escaped key or a string could hide another `usage`.
fn only_null_usage(data: &[u8]) -> bool {
    if memchr::memchr(b'\\', data).is_some() {
        return false;
    }
    let skip_ws = |b: &[u8]| b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    USAGE_KEY.find_iter(data).all(|at| {
        let rest = &data[at + 7..];
        match rest[skip_ws(rest)..].strip_prefix(b":") {
            Some(value) => value[skip_ws(value)..].starts_with(b"null"),
            None => false,
        }
    })
}

impl Usage {
    /// Takes in what `ev` reports, if anything (a later report replaces an earlier one
    /// field by field: Anthropic's output count is cumulative).
    /// The relay takes the event's [`super::Marks`] once for the watchdog and the usage
    /// together ([`Usage::observe_mentioned`]); this is the same pair of steps for one
    /// event alone (the benches and unit tests time and check what the relay runs).
    #[cfg_attr(tidegate_reach, allow(dead_code))]
    pub fn observe(&mut self, ev: &Event<'_>) {
        self.observe_mentioned(ev, super::Marks::of(ev).usage);
    }

    /// [`Usage::observe`] when whether the data mentions `"usage"` is known already
    /// ([`super::Marks`]).
    pub fn observe_mentioned(&mut self, ev: &Event<'_>, mentioned: bool) {
        let Some(data) = ev.data else { return };
        if !mentioned || only_null_usage(data) {
            return;
        }
        let Ok(p) = serde_json::from_slice::<Probe>(data) else {
            return;
        };
        for c in [
            p.usage,
            p.message.and_then(|m| m.usage),
            p.response.and_then(|r| r.usage),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(n) = c.prompt_tokens.or(c.input_tokens) {
                self.prompt_tokens = n;
            }
            if let Some(n) = c.completion_tokens.or(c.output_tokens) {
                self.completion_tokens = n;
            }
        }
    }
}

/// How much of a whole (non-stream) JSON answer [`AnswerTail`] keeps: the `usage` object
/// is among the last members of OpenAI's, Anthropic's and Responses' answers.
pub const ANSWER_TAIL_BYTES: usize = 4096;

impl Usage {
    /// The last `"usage": {…}` object of a whole JSON answer (or of its last bytes): its
    /// `prompt_tokens`/`input_tokens` and `completion_tokens`/`output_tokens`. `None` when
    /// there is none, or it is cut or not JSON.
    pub fn of_answer(body: &[u8]) -> Option<Usage> {
        let at = last_usage_key(body)?;
        let rest = body.get(at + USAGE_NAME.len()..)?;
        let open = rest
            .iter()
            .position(|b| !b.is_ascii_whitespace() && *b != b':')?;
        if rest.get(open) != Some(&b'{') {
            return None;
        }
        let obj = rest.get(open..)?;
        // A plain object is read where it starts (it ends where the brace count below would
        // end it); anything else is cut out by counting braces and given to serde_json.
        let c = match plain_prefix(obj) {
            Some((c, _)) => c,
            None => Self::counts_by_serde(obj)?,
        };
        Some(Usage {
            prompt_tokens: c.prompt_tokens.or(c.input_tokens).unwrap_or(0),
            completion_tokens: c.completion_tokens.or(c.output_tokens).unwrap_or(0),
        })
    }

    /// The object at the start of `obj`, cut at its closing brace, read by `serde_json`.
    fn counts_by_serde(obj: &[u8]) -> Option<Counts> {
        let (mut depth, mut in_str, mut esc) = (0usize, false, false);
        let mut end = None;
        for (i, &b) in obj.iter().enumerate() {
            if in_str {
                match (esc, b) {
                    (true, _) => esc = false,
                    (false, b'\\') => esc = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        serde_json::from_slice::<Counts>(obj.get(..=end?)?).ok()
    }
}

/// The member name a whole answer's usage is found by.
const USAGE_NAME: &[u8; 7] = b"\"usage\"";

/// How far the backward search for [`USAGE_NAME`] may move its window when the window's
/// first byte is `b` and the window is not a match: to the leftmost place (past the first)
/// where the key has `b`, or past `b` altogether (Horspool's rule, mirrored).
const USAGE_SHIFTS: [u8; 256] = {
    let mut t = [USAGE_NAME.len() as u8; 256];
    let mut j = USAGE_NAME.len() - 1;
    while j >= 1 {
        t[USAGE_NAME[j] as usize] = j as u8;
        j -= 1;
    }
    t
};

/// Where the last [`USAGE_NAME`] of `body` starts. Searched from the end, skipping up to
/// the key's length at a time: the usage object is among an answer's last members, and
/// this reads a few bytes of every key-length of the tail before it (a general reverse
/// substring search cost about four times as much per answer).
fn last_usage_key(body: &[u8]) -> Option<usize> {
    let mut i = body.len().checked_sub(USAGE_NAME.len())?;
    loop {
        let b = body[i];
        if b == b'"' && body[i + 1..i + USAGE_NAME.len()] == USAGE_NAME[1..] {
            return Some(i);
        }
        i = i.checked_sub(usize::from(USAGE_SHIFTS[usize::from(b)]))?;
    }
}

/// The whole of `obj` as a plain usage object (see [`plain_prefix`]), for the tests.
#[cfg(test)]
fn plain_counts(obj: &[u8]) -> Option<Counts> {
    plain_prefix(obj).and_then(|(counts, len)| (len == obj.len()).then_some(counts))
}

/// Reads the `usage` object at the start of `bytes` when it has the plain shape providers
/// send — string keys without escapes; unsigned integers; other members' values also
/// strings without escapes, `null`, `true` or `false`; and one level of nested objects of
/// the same kind (OpenAI's `prompt_tokens_details`, Anthropic's `cache_creation`) —
/// without serde: its counts and its length. `None` when it is not exactly that (any other
/// value, an escape, a repeated count, a count that is not an integer), and then
/// `serde_json` decides. Where this answers, `serde_json` reads the same counts
/// (`plain_counts_agree_with_serde_json`).
fn plain_prefix(bytes: &[u8]) -> Option<(Counts, usize)> {
    let mut counts = Counts::default();
    let mut at = Plain { bytes, at: 0 };
    at.object(Some(&mut counts))?;
    Some((counts, at.at))
}

/// Printable ASCII but `"` and `\`: the bytes of a plain string.
const PLAIN_STRING_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = b' ';
    while b <= b'~' {
        t[b as usize] = b != b'"' && b != b'\\';
        b += 1;
    }
    t
};

/// Where the first byte of `bytes` that is not a [`PLAIN_STRING_BYTE`] is (`None`: there is
/// none). Eight bytes at a time (a quote, a backslash, a control byte, DEL or a non-ASCII
/// byte flagged in one word: [`not_plain`]), the last few by the table; a table load per
/// byte cost about 11 instructions a byte, and `memchr2` for the quote and backslash plus
/// a check of the bytes before it costs a call and a second pass on strings this short.
fn plain_run(bytes: &[u8]) -> Option<usize> {
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in &mut words {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let flags = not_plain(u64::from_le_bytes(word));
        if flags != 0 {
            return Some(at + (flags.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = words.remainder();
    tail.iter()
        .position(|&b| !PLAIN_STRING_BYTE[usize::from(b)])
        .map(|i| at + i)
}

/// The high bit of each byte of `word` (little-endian: bit 7 is its first byte) that is
/// not a [`PLAIN_STRING_BYTE`], and no other bit. Each byte is tested on its own: no
/// carry or borrow crosses into the next one (every sum below stays under 0x100 per byte),
/// so every flag is exact, not only the first.
fn not_plain(word: u64) -> u64 {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const LOW7: u64 = 0x7F * ONES;
    const HIGH: u64 = 0x80 * ONES;
    let low = word & LOW7;
    // High bit set: the byte is 0x7F (DEL) or above.
    let del_or_above = (low + ONES) | word;
    // High bit clear: the low seven bits are below 0x20 (a control byte, or above 0x7F).
    let space_or_above = low + (0x80 - 0x20) * ONES;
    // High bit clear: the byte is exactly `b`.
    let differs = |b: u8| {
        let x = word ^ (u64::from(b) * ONES);
        ((x & LOW7) + LOW7) | x
    };
    (del_or_above | !space_or_above | !differs(b'"') | !differs(b'\\')) & HIGH
}

struct Plain<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Plain<'a> {
    /// The byte at the cursor; `0` past the end (a byte no rule below accepts).
    fn peek(&self) -> u8 {
        self.bytes.get(self.at).copied().unwrap_or(0)
    }

    fn space(&mut self) {
        while matches!(self.peek(), b' ' | b'\t' | b'\n' | b'\r') {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek() == b).then(|| self.at += 1)
    }

    /// A printable-ASCII string without escapes (the cursor on its opening quote): its
    /// bytes between the quotes.
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.at + 1;
        let rest = self.bytes.get(start..)?;
        let len = plain_run(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        Some(&rest[..len])
    }

    /// An unsigned integer as JSON writes it (no leading zero, no fraction or exponent)
    /// of at most 19 digits, so it fits a `u64`.
    fn count(&mut self) -> Option<u64> {
        let start = self.at;
        let mut n = 0u64;
        loop {
            let d = self.peek().wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            n = n.wrapping_mul(10).wrapping_add(u64::from(d));
            self.at += 1;
        }
        let len = self.at - start;
        if len == 0 || len > 19 || (len > 1 && self.bytes[start] == b'0') {
            return None;
        }
        if matches!(self.peek(), b'.' | b'e' | b'E') {
            return None;
        }
        Some(n)
    }

    /// `{ "key": value, ... }`; the four counts are kept when `counts` is given (the
    /// top level), a nested object's members are only checked.
    fn object(&mut self, mut counts: Option<&mut Counts>) -> Option<()> {
        let top = counts.is_some();
        self.eat(b'{')?;
        self.space();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            self.space();
            if self.peek() != b'"' {
                return None;
            }
            let key = self.string()?;
            self.space();
            self.eat(b':')?;
            self.space();
            let slot = match counts.as_deref_mut() {
                Some(c) => match key {
                    b"prompt_tokens" => Some(&mut c.prompt_tokens),
                    b"completion_tokens" => Some(&mut c.completion_tokens),
                    b"input_tokens" => Some(&mut c.input_tokens),
                    b"output_tokens" => Some(&mut c.output_tokens),
                    _ => None,
                },
                None => None,
            };
            match (self.peek(), slot) {
                (b'0'..=b'9', Some(slot)) => {
                    let n = self.count()?;
                    if slot.replace(n).is_some() {
                        return None; // serde_json refuses a repeated field
                    }
                }
                (_, Some(_)) => return None,
                (b'0'..=b'9', None) => {
                    self.count()?;
                }
                (b'{', None) if top => self.object(None)?,
                (b'"', None) => {
                    self.string()?;
                }
                (b'n', None) => self.literal(b"null")?,
                (b't', None) => self.literal(b"true")?,
                (b'f', None) => self.literal(b"false")?,
                _ => return None,
            }
            self.space();
            if self.eat(b',').is_none() {
                return self.eat(b'}');
            }
        }
    }

    /// `null`, `true` or `false` at the cursor.
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        if !self.bytes.get(self.at..)?.starts_with(word) {
            return None;
        }
        self.at += word.len();
        Some(())
    }
}

/// The last [`ANSWER_TAIL_BYTES`] of a whole JSON answer relayed piece by piece, for the
/// usage it reports ([`Usage::of_answer`]) without holding the answer. The last piece is
/// held as it came (a reference, not a copy: most answers are one piece, read in place);
/// the tail of the pieces before it is copied when the next one comes.
#[derive(Debug, Default)]
pub struct AnswerTail {
    last: Option<Bytes>,
    /// The last bytes of the pieces before `last`, at most [`ANSWER_TAIL_BYTES`].
    before: Vec<u8>,
}

impl AnswerTail {
    pub fn feed(&mut self, piece: &Bytes) {
        if let Some(prev) = self.last.replace(piece.clone()) {
            keep_tail(&mut self.before, &prev);
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        match &self.last {
            None => Usage::of_answer(&self.before),
            Some(last) if self.before.is_empty() || last.len() >= ANSWER_TAIL_BYTES => {
                Usage::of_answer(&last[last.len().saturating_sub(ANSWER_TAIL_BYTES)..])
            }
            Some(last) => {
                let mut tail = self.before.clone();
                keep_tail(&mut tail, last);
                Usage::of_answer(&tail)
            }
        }
    }
}

/// Appends `piece` to `tail`, keeping its last [`ANSWER_TAIL_BYTES`].
fn keep_tail(tail: &mut Vec<u8>, piece: &[u8]) {
    if piece.len() >= ANSWER_TAIL_BYTES {
        tail.clear();
        tail.extend_from_slice(&piece[piece.len() - ANSWER_TAIL_BYTES..]);
        return;
    }
    tail.extend_from_slice(piece);
    if tail.len() > ANSWER_TAIL_BYTES {
        let cut = tail.len() - ANSWER_TAIL_BYTES;
        tail.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(d: &str) -> Event<'_> {
        Event {
            name: None,
            data: Some(d.as_bytes()),
            comment: false,
        }
    }

    #[test]
    fn reads_each_shape_and_keeps_the_last_report() {
        let mut u = Usage::default();
        u.observe(&data(r#"{"choices":[{"delta":{"content":"usage"}}]}"#));
        assert_eq!(u, Usage::default());
        u.observe(&data(
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20}}"#,
        ));
        assert_eq!((u.prompt_tokens, u.completion_tokens), (10, 20));

        let mut a = Usage::default();
        a.observe(&data(
            r#"{"type":"message_start","message":{"usage":{"input_tokens":7,"output_tokens":1}}}"#,
        ));
        a.observe(&data(
            r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":42}}"#,
        ));
        assert_eq!((a.prompt_tokens, a.completion_tokens), (7, 42));

        let mut r = Usage::default();
        r.observe(&data(
            r#"{"type":"response.completed","response":{"usage":{"input_tokens":3,"output_tokens":4}}}"#,
        ));
        assert_eq!((r.prompt_tokens, r.completion_tokens), (3, 4));
        r.observe(&data("not json \"usage\""));
        assert_eq!((r.prompt_tokens, r.completion_tokens), (3, 4));
    }

    /// A chunk whose every `usage` is null is not parsed and reports nothing; one with a
    /// non-null `usage` anywhere, or an escape, is still read.
    #[test]
    fn null_usage_members_are_skipped_and_nothing_else() {
        for (d, only_null) in [
            (
                r#"{"choices":[{"delta":{"content":"hi"}}],"usage":null}"#,
                true,
            ),
            (r#"{"usage" :  null,"x":{"usage":null}}"#, true),
            (
                r#"{"usage":null,"message":{"usage":{"input_tokens":5}}}"#,
                false,
            ),
            (
                r#"{"choices":[{"delta":{"content":"usage"}}],"usage":null}"#,
                false,
            ),
            (
                r#"{"usage":null,"message":{"us\u0061ge":{"input_tokens":5}}}"#,
                false,
            ),
            (r#"{"usage":{"prompt_tokens":1}}"#, false),
        ] {
            assert_eq!(only_null_usage(d.as_bytes()), only_null, "{d}");
            // Whatever the shortcut says, the report is what the full read gives.
            let mut u = Usage::default();
            u.observe(&data(d));
            let full = serde_json::from_str::<Probe>(d)
                .ok()
                .map_or(Usage::default(), |p| {
                    let mut v = Usage::default();
                    for c in [
                        p.usage,
                        p.message.and_then(|m| m.usage),
                        p.response.and_then(|r| r.usage),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        v.prompt_tokens = c
                            .prompt_tokens
                            .or(c.input_tokens)
                            .unwrap_or(v.prompt_tokens);
                        v.completion_tokens = c
                            .completion_tokens
                            .or(c.output_tokens)
                            .unwrap_or(v.completion_tokens);
                    }
                    v
                });
            assert_eq!(u, full, "{d}");
        }
    }

    #[test]
    fn a_whole_answer_s_usage_is_read_from_its_tail() {
        let openai = br#"{"id":"x","choices":[{"message":{"content":"the "usage": {"}}],"usage":{"prompt_tokens":11,"completion_tokens":22,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        let anthropic = br#"{"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":6}}"#;
        for (body, want) in [(&openai[..], (11, 22)), (&anthropic[..], (5, 6))] {
            let u = Usage::of_answer(body).unwrap();
            assert_eq!((u.prompt_tokens, u.completion_tokens), want);
            // Fed in 7-byte pieces behind a long prefix: the tail still holds it.
            let mut t = AnswerTail::default();
            t.feed(&Bytes::from(vec![b' '; 3 * ANSWER_TAIL_BYTES]));
            for piece in body.chunks(7) {
                t.feed(&Bytes::copy_from_slice(piece));
            }
            assert_eq!(t.usage(), Some(u));
            // In one piece, and after a long one.
            let mut t = AnswerTail::default();
            t.feed(&Bytes::copy_from_slice(body));
            assert_eq!(t.usage(), Some(u));
            t.feed(&Bytes::from(vec![b' '; ANSWER_TAIL_BYTES]));
            t.feed(&Bytes::copy_from_slice(body));
            assert_eq!(t.usage(), Some(u));
        }
        assert_eq!(Usage::of_answer(br#"{"usage":{"prompt_tokens":1"#), None);
        assert_eq!(Usage::of_answer(br#"{"usage": null}"#), None);
        assert_eq!(Usage::of_answer(b"no usage here"), None);
    }

    #[test]
    fn plain_counts_read_real_usage_objects() {
        let openai = br#"{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#;
        let c = plain_counts(openai).unwrap();
        assert_eq!((c.prompt_tokens, c.completion_tokens), (Some(19), Some(10)));
        let spaced = b"{ \"input_tokens\" : 5 ,\n\t\"output_tokens\":6 }";
        let c = plain_counts(spaced).unwrap();
        assert_eq!((c.input_tokens, c.output_tokens), (Some(5), Some(6)));
        assert_eq!(plain_counts(b"{}"), Some(Counts::default()));
        // Anthropic's, with a string member and a nested object.
        let anthropic = br#"{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":6,"service_tier":"standard"}"#;
        let c = plain_counts(anthropic).unwrap();
        assert_eq!((c.input_tokens, c.output_tokens), (Some(12), Some(6)));
        let literals =
            br#"{"a":null,"b":true,"c":false,"d":"x y","e":{"f":null,"g":"h"},"prompt_tokens":3}"#;
        assert_eq!(plain_counts(literals).unwrap().prompt_tokens, Some(3));
        // Not the plain shape: serde_json decides.
        for other in [
            &br#"{"prompt_tokens":null}"#[..],
            br#"{"prompt_tokens":1,"prompt_tokens":1}"#,
            br#"{"prompt_tokens":01}"#,
            br#"{"prompt_tokens":1.0}"#,
            br#"{"prompt_tokens":1e2}"#,
            br#"{"prompt_tokens":-1}"#,
            br#"{"prompt_tokens":18446744073709551615}"#,
            br#"{"prompt\u005ftokens":1}"#,
            br#"{"prompt_tokens":1,}"#,
            br#"{"a":{"b":{"c":1}}}"#,
            br#"{"a":1} "#,
            br#"{"prompt_tokens":"1"}"#,
            br#"{"a":"t\u0065xt"}"#,
            "{\"a\":\"café\"}".as_bytes(),
            br#"{"a":nul}"#,
            br#"{"a":truth}"#,
            br#"{"a":[1]}"#,
        ] {
            assert_eq!(
                plain_counts(other),
                None,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    proptest::proptest! {
        /// However an answer is cut into pieces, the tail reads the usage of its last
        /// `ANSWER_TAIL_BYTES` bytes.
        #[test]
        fn the_tail_reads_the_last_bytes_of_the_answer_however_it_is_cut(
            pad in 0usize..(2 * ANSWER_TAIL_BYTES),
            cuts in proptest::collection::vec(0usize..(3 * ANSWER_TAIL_BYTES), 0..6),
            usage_at_end in proptest::bool::ANY,
        ) {
            let usage = r#""usage":{"prompt_tokens":3,"completion_tokens":4}"#;
            let body = if usage_at_end {
                format!(r#"{{"x":"{}",{usage}}}"#, "y".repeat(pad))
            } else {
                format!(r#"{{{usage},"x":"{}"}}"#, "y".repeat(pad))
            };
            let body = body.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort_unstable();
            let mut t = AnswerTail::default();
            let mut from = 0;
            for at in cuts.into_iter().chain([body.len()]) {
                t.feed(&Bytes::copy_from_slice(&body[from..at]));
                from = at;
            }
            let tail = &body[body.len().saturating_sub(ANSWER_TAIL_BYTES)..];
            proptest::prop_assert_eq!(t.usage(), Usage::of_answer(tail));
        }

        /// The backward search finds the last `"usage"`, as a general reverse search does.
        #[test]
        fn the_last_usage_key_is_found_where_rfind_finds_it(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "\"usage\"", "usage", "\"", "u", "s", "a", "g", "e", "x", "\"usag", "sage\"",
                ":", "{", "}", "\"us", "age\"",
            ]), 0..40)
        ) {
            let text = parts.concat();
            let rfind = memchr::memmem::rfind(text.as_bytes(), USAGE_NAME);
            proptest::prop_assert_eq!(last_usage_key(text.as_bytes()), rfind, "{}", text);
        }

        /// The word-at-a-time scan stops where the table, byte by byte, stops: on bytes
        /// drawn mostly from printable ASCII with every kind of stop byte mixed in.
        #[test]
        fn plain_run_stops_where_the_table_does(
            bytes in proptest::collection::vec(proptest::prop_oneof![
                6 => 0x20u8..=0x7E,
                1 => proptest::sample::select(vec![
                    b'"', b'\\', 0x00, 0x09, 0x0A, 0x1F, 0x7F, 0x80, 0x9F, 0xA0, 0xDF, 0xE2,
                    0xFF, b' ', b'~', b'!', b'#', b'[', b']',
                ]),
                1 => proptest::num::u8::ANY,
            ], 0..48)
        ) {
            let by_table = bytes.iter().position(|&b| !PLAIN_STRING_BYTE[usize::from(b)]);
            proptest::prop_assert_eq!(plain_run(&bytes), by_table, "{:?}", bytes);
        }

        /// Strings with quotes, escapes, control bytes and non-ASCII, read as a member
        /// value: the plain reader takes the whole string exactly when it is printable
        /// ASCII without a quote or backslash, and then serde_json reads the same text.
        #[test]
        fn plain_strings_agree_with_serde_json(
            text in "[ -~\\\\\"\\x00-\\x1f\\x7f\\u{80}-\\u{10ffff}]{0,40}",
        ) {
            let json = format!("{{\"s\":\"{text}\",\"prompt_tokens\":1}}");
            let bytes = json.as_bytes();
            let mut plain = Plain { bytes: &bytes[5..], at: 0 };
            let read = plain.string();
            let whole = read == Some(text.as_bytes());
            proptest::prop_assert_eq!(
                whole,
                text.bytes().all(|b| PLAIN_STRING_BYTE[usize::from(b)]),
                "{}", json
            );
            if whole {
                let serde: Option<std::collections::HashMap<String, serde_json::Value>> =
                    serde_json::from_slice(bytes).ok();
                let s = serde.as_ref().and_then(|m| m.get("s")).and_then(|v| v.as_str());
                proptest::prop_assert_eq!(s, Some(text.as_str()), "{}", json);
            }
        }

        /// Wherever the plain reader answers, serde_json answers the same.
        #[test]
        fn plain_counts_agree_with_serde_json(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "{", "}", "{", "}", ",", ":", " ", "\n", "\"prompt_tokens\"", "\"completion_tokens\"",
                "\"input_tokens\"", "\"output_tokens\"", "\"total_tokens\"", "\"x\"", "\"\\u0078\"",
                "0", "7", "12", "012", "1.5", "1e3", "-3", "null", "true", "false", "\"s\"",
                "99999999999999999999", "1844674407370955161", "[", "]",
            ]), 0..24)
        ) {
            let text = parts.concat();
            if let Some(c) = plain_counts(text.as_bytes()) {
                let serde: Result<Counts, _> = serde_json::from_slice(text.as_bytes());
                proptest::prop_assert_eq!(serde.ok(), Some(c), "{}", text);
            }
        }

        /// The same over objects built member by member (mostly well-formed, so the plain
        /// reader answers often): keys repeat, values are counts or not.
        #[test]
        fn plain_counts_agree_with_serde_json_on_objects(
            members in proptest::collection::vec((
                proptest::sample::select(vec![
                    "prompt_tokens", "completion_tokens", "input_tokens", "output_tokens",
                    "total_tokens", "cached_tokens", "x",
                ]),
                proptest::sample::select(vec![
                    "0", "7", "12", "012", "1.5", "-3", "null", "{}", "{\"a\":1}",
                    "{ \"a\" : 1 , \"b\":2}", "{\"a\":{}}", "99999999999999999999",
                    "9999999999999999999", "\"s\"", "\"a b\"", "\"\\u0061\"", "null",
                    "true", "false", "{\"a\":\"s\",\"b\":null}",
                ]),
                proptest::sample::select(vec!["", " ", "\n", "\t "]),
            ), 0..6)
        ) {
            let body: Vec<String> = members
                .iter()
                .map(|(k, v, w)| format!("{w}\"{k}\"{w}:{w}{v}{w}"))
                .collect();
            let text = format!("{{{}}}", body.join(","));
            let plain = plain_counts(text.as_bytes());
            let serde: Option<Counts> = serde_json::from_slice(text.as_bytes()).ok();
            if let Some(c) = plain {
                proptest::prop_assert_eq!(serde, Some(c), "{}", text);
            }
        }
    }
}
