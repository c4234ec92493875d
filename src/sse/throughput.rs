//! The throughput watchdog's meter (spec B §7.2): how many *useful* bytes of model text a
//! stream delivered over a sliding window, whether it is in a protected phase (reasoning or
//! tool frames, which are slow by nature and never judged), and the abort decision taken on
//! every observed chunk. Pure: time comes in as monotonic milliseconds.

use std::collections::VecDeque;

use serde_json::Value;

use super::Event;
use super::scan::{Cursor, Val, once};

/// The settings of `stream_recovery.throughput_watchdog`, as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub warmup_ms: u64,
    pub window_ms: u64,
    pub min_useful_bytes_per_second: u32,
    pub min_useful_bytes: u32,
}

/// What one event contributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Useful {
    /// UTF-8 bytes of answer text (0 when protected).
    pub bytes: u64,
    /// A reasoning or tool frame.
    pub protected: bool,
}

const PROTECTED_WORDS: [&str; 4] = ["reasoning", "thinking", "tool", "function_call"];
/// The words that make a `content_block` protected.
const BLOCK_WORDS: [&str; 3] = ["reasoning", "thinking", "tool_use"];

/// `s` contains one of `words` (lowercase ASCII), ignoring ASCII case. Read on bytes, it
/// is what lowercasing the lossy UTF-8 text and searching it gives (the words are ASCII,
/// and a replaced invalid byte never joins two ASCII letters), without the allocation.
fn has_word(s: &[u8], words: &[&str]) -> bool {
    words.iter().any(|w| {
        s.windows(w.len())
            .any(|at| at.eq_ignore_ascii_case(w.as_bytes()))
    })
}

fn str_len(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_str).map_or(0, |s| s.len() as u64)
}

/// What an event contributes (B §7.2 "Event parsing"): empty data, `[DONE]` and non-JSON
/// contribute nothing; the type is the JSON `type`, else the SSE event name. The JSON is
/// read by a borrowed walk ([`super::scan`]) when it is sure of it, else by `serde_json`'s
/// tree; both read the same (`the_walk_reads_what_the_tree_reads`).
pub fn useful(ev: &Event<'_>) -> Useful {
    let Some(data) = ev.data.map(<[u8]>::trim_ascii) else {
        return Useful::default();
    };
    if data.is_empty() || data == b"[DONE]" {
        return Useful::default();
    }
    useful_by_walk(data, ev.name).unwrap_or_else(|| useful_by_tree(data, ev.name))
}

/// What the event's JSON contributes, given its `type` (the JSON's, else the event name),
/// its text bytes and whether a frame in it is protected.
fn contribution(ty: Option<&[u8]>, bytes: u64, protected: bool) -> Useful {
    if ty.is_some_and(|t| has_word(t, &PROTECTED_WORDS)) {
        return Useful {
            bytes: 0,
            protected: true,
        };
    }
    Useful {
        bytes: if protected { 0 } else { bytes },
        protected,
    }
}

/// [`useful`] by `serde_json`'s `Value` tree.
fn useful_by_tree(data: &[u8], name: Option<&[u8]>) -> Useful {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return Useful::default();
    };
    let ty = v.get("type").and_then(Value::as_str).map(str::as_bytes);
    let mut bytes = 0u64;
    let mut protected = false;
    if let Some(choices) = v.get("choices").and_then(Value::as_array) {
        for delta in choices.iter().filter_map(|c| c.get("delta")) {
            if delta.get("tool_calls").is_some_and(Value::is_array)
                || delta.get("function_call").is_some()
            {
                protected = true;
            }
            bytes += str_len(delta.get("content")) + str_len(delta.get("text"));
            if delta.get("reasoning_content").is_some_and(Value::is_string)
                || delta.get("reasoning").is_some_and(Value::is_string)
            {
                protected = true;
            }
        }
    }
    match v.get("delta") {
        Some(Value::String(s)) => bytes += s.len() as u64,
        Some(d @ Value::Object(_)) => {
            if d.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| has_word(t.as_bytes(), &PROTECTED_WORDS))
            {
                protected = true;
            }
            bytes += str_len(d.get("text"));
        }
        _ => {}
    }
    if v.get("content_block")
        .and_then(|b| b.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| has_word(t.as_bytes(), &BLOCK_WORDS))
    {
        protected = true;
    }
    contribution(ty.or(name), bytes, protected)
}

/// [`useful`] by the borrowed walk: an object whose read members are not repeated and
/// whose `type` strings have no escape; `None` otherwise (the tree decides).
fn useful_by_walk(data: &[u8], name: Option<&[u8]>) -> Option<Useful> {
    let mut c = Cursor::new(data);
    if c.peek()? != b'{' {
        return None;
    }
    let mut ty = None;
    let mut bytes = 0u64;
    let mut protected = false;
    let mut seen = 0u16;
    c.object(0, |c, key, d| {
        match key {
            b"type" => {
                once(&mut seen, 1)?;
                ty = type_string(c, d)?;
            }
            b"choices" if c.peek()? == b'[' => {
                once(&mut seen, 2)?;
                c.array(d, |c, d| {
                    if c.peek()? != b'{' {
                        return c.value(d).map(drop);
                    }
                    let mut seen = 0u16;
                    c.object(d, |c, key, d| {
                        if key != b"delta" {
                            return c.value(d).map(drop);
                        }
                        once(&mut seen, 1)?;
                        chat_delta(c, d, &mut bytes, &mut protected)
                    })
                })?;
            }
            b"choices" => {
                once(&mut seen, 2)?;
                c.value(d)?;
            }
            b"delta" => {
                once(&mut seen, 4)?;
                match c.value_or_object(d)? {
                    Some(Val::Str(s)) => bytes += s.len as u64,
                    Some(_) => {}
                    None => {
                        let mut seen = 0u16;
                        c.object(d, |c, key, d| {
                            match key {
                                b"type" => {
                                    once(&mut seen, 1)?;
                                    protected |= type_string(c, d)?
                                        .is_some_and(|t| has_word(t, &PROTECTED_WORDS));
                                }
                                b"text" => {
                                    once(&mut seen, 2)?;
                                    bytes += text_len(c, d)?;
                                }
                                _ => {
                                    c.value(d)?;
                                }
                            }
                            Some(())
                        })?;
                    }
                }
            }
            b"content_block" => {
                once(&mut seen, 8)?;
                if c.value_or_object(d)?.is_none() {
                    let mut seen = 0u16;
                    c.object(d, |c, key, d| {
                        if key != b"type" {
                            return c.value(d).map(drop);
                        }
                        once(&mut seen, 1)?;
                        protected |= type_string(c, d)?.is_some_and(|t| has_word(t, &BLOCK_WORDS));
                        Some(())
                    })?;
                }
            }
            _ => {
                c.value(d)?;
            }
        }
        Some(())
    })?;
    c.end()?;
    Some(contribution(ty.or(name), bytes, protected))
}

/// A `type` member: its bytes when it is a string without escapes, nothing when it is
/// not a string; `None` (give up) for a string with escapes.
fn type_string<'a>(c: &mut Cursor<'a>, depth: usize) -> Option<Option<&'a [u8]>> {
    match c.value(depth)? {
        Val::Str(s) if s.escaped => None,
        Val::Str(s) => Some(Some(s.raw)),
        _ => Some(None),
    }
}

/// The UTF-8 length of a string member's text (0 for any other value).
fn text_len(c: &mut Cursor<'_>, depth: usize) -> Option<u64> {
    match c.value(depth)? {
        Val::Str(s) => Some(s.len as u64),
        _ => Some(0),
    }
}

/// One choice's `delta` (any value; only an object's members count).
fn chat_delta(
    c: &mut Cursor<'_>,
    depth: usize,
    bytes: &mut u64,
    protected: &mut bool,
) -> Option<()> {
    if c.value_or_object(depth)?.is_some() {
        return Some(());
    }
    let mut seen = 0u16;
    c.object(depth, |c, key, d| {
        let bit = match key {
            b"tool_calls" => 1,
            b"function_call" => 2,
            b"content" => 4,
            b"text" => 8,
            b"reasoning_content" => 16,
            b"reasoning" => 32,
            _ => return c.value(d).map(drop),
        };
        once(&mut seen, bit)?;
        let v = c.value(d)?;
        match (bit, v) {
            (1, Val::Arr(_)) | (2, _) | (16 | 32, Val::Str(_)) => *protected = true,
            (4 | 8, Val::Str(s)) => *bytes += s.len as u64,
            _ => {}
        }
        Some(())
    })
}

/// The decision on one observed chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub abort: bool,
    /// Useful bytes inside the window.
    pub useful_bytes: u64,
    pub rate_bytes_per_second: f64,
    pub protected_phase: bool,
}

/// One stream's meter.
#[derive(Debug)]
pub struct Meter {
    policy: Policy,
    /// Arrival time of the first observed chunk.
    first_ms: Option<u64>,
    /// `(arrival ms, useful bytes)` of the chunks inside the window.
    samples: VecDeque<(u64, u64)>,
    protected: bool,
}

impl Meter {
    pub fn new(policy: Policy) -> Meter {
        Meter {
            policy,
            first_ms: None,
            samples: VecDeque::new(),
            protected: false,
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Applies one event's contribution to the phase and returns its useful bytes: a
    /// protected event sets the protected phase, a later event with useful bytes clears it;
    /// events with neither leave it alone.
    pub fn event(&mut self, u: Useful) -> u64 {
        if u.protected {
            self.protected = true;
        } else if u.bytes > 0 {
            self.protected = false;
        }
        u.bytes
    }

    /// Records a chunk's useful bytes (the sum of its events') at `t_ms` and decides.
    pub fn chunk(&mut self, t_ms: u64, useful_bytes: u64) -> Decision {
        let first = *self.first_ms.get_or_insert(t_ms);
        self.samples.push_back((t_ms, useful_bytes));
        let p = self.policy;
        let since = t_ms.saturating_sub(p.window_ms);
        while self.samples.front().is_some_and(|(at, _)| *at < since) {
            self.samples.pop_front();
        }
        let window_bytes: u64 = self.samples.iter().map(|(_, b)| b).sum();
        let window_s = (p.window_ms as f64 / 1000.0).max(1.0);
        let rate = window_bytes as f64 / window_s;
        let ready = t_ms.saturating_sub(first) >= p.warmup_ms.saturating_add(p.window_ms);
        let measurable = window_bytes == 0 || window_bytes >= u64::from(p.min_useful_bytes);
        let abort = ready
            && !self.protected
            && measurable
            && rate < f64::from(p.min_useful_bytes_per_second);
        Decision {
            abort,
            useful_bytes: window_bytes,
            rate_bytes_per_second: rate,
            protected_phase: self.protected,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::scan::arb::{self, event};
    use super::*;

    /// `useful` as it was before the walk, word for word: the reference the walk and the
    /// tree fallback are held to.
    fn useful_before(ev: &Event<'_>) -> Useful {
        fn has_word(s: &str, words: &[&str]) -> bool {
            let lower = s.to_ascii_lowercase();
            words.iter().any(|w| lower.contains(w))
        }
        let Some(data) = ev.data.map(<[u8]>::trim_ascii) else {
            return Useful::default();
        };
        if data.is_empty() || data == b"[DONE]" {
            return Useful::default();
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return Useful::default();
        };
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| ev.name.map(|n| String::from_utf8_lossy(n).into_owned()));
        if ty.as_deref().is_some_and(|t| has_word(t, &PROTECTED_WORDS)) {
            return Useful {
                bytes: 0,
                protected: true,
            };
        }
        let mut bytes = 0u64;
        let mut protected = false;
        if let Some(choices) = v.get("choices").and_then(Value::as_array) {
            for delta in choices.iter().filter_map(|c| c.get("delta")) {
                if delta.get("tool_calls").is_some_and(Value::is_array)
                    || delta.get("function_call").is_some()
                {
                    protected = true;
                }
                bytes += str_len(delta.get("content")) + str_len(delta.get("text"));
                if delta.get("reasoning_content").is_some_and(Value::is_string)
                    || delta.get("reasoning").is_some_and(Value::is_string)
                {
                    protected = true;
                }
            }
        }
        match v.get("delta") {
            Some(Value::String(s)) => bytes += s.len() as u64,
            Some(d @ Value::Object(_)) => {
                if d.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| has_word(t, &PROTECTED_WORDS))
                {
                    protected = true;
                }
                bytes += str_len(d.get("text"));
            }
            _ => {}
        }
        if v.get("content_block")
            .and_then(|b| b.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|t| has_word(t, &["reasoning", "thinking", "tool_use"]))
        {
            protected = true;
        }
        if protected {
            bytes = 0;
        }
        Useful { bytes, protected }
    }

    /// The shapes providers send are read by the walk, not by building a tree.
    #[test]
    fn the_walk_answers_the_usual_shapes() {
        for json in [
            r#"{"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":0,"id":"chatcmpl-mock-1","model":"gpt-4o-mini","object":"chat.completion.chunk"}"#,
            r#"{"id":"c","object":"chat.completion.chunk","created":1694268190,"model":"m","choices":[{"index":0,"delta":{"content":"h\u00e9 \"x\"\n\ud83d\ude00"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
            r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi","sequence_number":4}"#,
        ] {
            let got = useful_by_walk(json.as_bytes(), None);
            assert!(got.is_some(), "{json}");
            assert_eq!(
                got,
                Some(useful_before(&event(None, json.as_bytes()))),
                "{json}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// The walk, and the tree it falls back to, read what `useful` read before.
        #[test]
        fn the_walk_reads_what_the_tree_reads(
            data in arb::event_json(),
            name in arb::event_name(),
        ) {
            let ev = event(name.as_deref(), &data);
            let want = useful_before(&ev);
            prop_assert_eq!(useful(&ev), want, "{}", String::from_utf8_lossy(&data));
            prop_assert_eq!(useful_by_tree(data.trim_ascii(), ev.name), want);
            if let Some(walk) = useful_by_walk(data.trim_ascii(), ev.name) {
                prop_assert_eq!(walk, want);
            }
        }
    }

    fn ev<'a>(name: Option<&'a str>, data: &'a str) -> Event<'a> {
        Event {
            name: name.map(str::as_bytes),
            data: Some(data.as_bytes()),
            comment: false,
        }
    }

    #[test]
    fn useful_text_and_protected_frames_per_shape() {
        let u = |n, d| useful(&ev(n, d));
        let text = |bytes| Useful {
            bytes,
            protected: false,
        };
        let prot = Useful {
            bytes: 0,
            protected: true,
        };
        assert_eq!(
            u(None, r#"{"choices":[{"delta":{"content":"héllo"}}]}"#),
            text(6)
        );
        assert_eq!(
            u(None, r#"{"choices":[{"delta":{"role":"assistant"}}]}"#),
            text(0)
        );
        assert_eq!(
            u(
                None,
                r#"{"choices":[{"delta":{"content":"x","tool_calls":[]}}]}"#
            ),
            prot
        );
        assert_eq!(
            u(None, r#"{"choices":[{"delta":{"reasoning_content":""}}]}"#),
            prot
        );
        assert_eq!(
            u(
                None,
                r#"{"type":"response.output_text.delta","delta":"abc"}"#
            ),
            text(3)
        );
        assert_eq!(
            u(
                None,
                r#"{"type":"response.reasoning_summary_text.delta","delta":"abc"}"#
            ),
            prot
        );
        assert_eq!(
            u(
                Some("response.function_call_arguments.delta"),
                r#"{"delta":"{}"}"#
            ),
            prot
        );
        assert_eq!(
            u(
                None,
                r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"hi"}}"#
            ),
            text(2)
        );
        assert_eq!(
            u(
                None,
                r#"{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"hm"}}"#
            ),
            prot
        );
        assert_eq!(
            u(
                None,
                r#"{"type":"content_block_start","content_block":{"type":"tool_use"}}"#
            ),
            prot
        );
        assert_eq!(u(None, "[DONE]"), text(0));
        assert_eq!(u(None, "not json"), text(0));
        assert_eq!(u(Some("ping"), r#"{"type":"ping"}"#), text(0));
        assert_eq!(u(None, r#"{"usage":{"prompt_tokens":1}}"#), text(0));
    }

    const P: Policy = Policy {
        warmup_ms: 1000,
        window_ms: 2000,
        min_useful_bytes_per_second: 4,
        min_useful_bytes: 1,
    };

    #[test]
    fn aborts_only_when_ready_unprotected_measurable_and_slow() {
        let mut m = Meter::new(P);
        // Clock starts at the first chunk (t = 500); ready from 500 + 1000 + 2000.
        assert!(!m.chunk(500, 1).abort);
        assert!(!m.chunk(3_499, 1).abort, "not ready yet");
        let d = m.chunk(3_500, 1);
        // Window [1500, 3500]: 2 bytes over max(1, 2 s) = 1 B/s < 4.
        assert_eq!(d.useful_bytes, 2);
        assert!((d.rate_bytes_per_second - 1.0).abs() < 1e-9);
        assert!(d.abort);
    }

    #[test]
    fn an_empty_window_is_measurable_and_a_protected_phase_never_aborts() {
        let mut m = Meter::new(P);
        m.chunk(0, 0);
        assert!(
            m.chunk(3_000, 0).abort,
            "nothing useful for the whole window"
        );
        let mut m = Meter::new(P);
        m.event(Useful {
            bytes: 0,
            protected: true,
        });
        m.chunk(0, 0);
        let d = m.chunk(10_000, 0);
        assert!(d.protected_phase && !d.abort);
        // Useful text ends the protected phase.
        let b = m.event(Useful {
            bytes: 1,
            protected: false,
        });
        assert!(m.chunk(10_001, b).abort);
    }

    #[test]
    fn a_window_below_min_useful_bytes_is_not_measurable() {
        let mut m = Meter::new(Policy {
            min_useful_bytes: 10,
            ..P
        });
        m.chunk(0, 0);
        assert!(!m.chunk(3_000, 5).abort);
        assert!(
            !m.chunk(3_001, 5).abort,
            "10 B in 2 s = 5 B/s is fast enough"
        );
    }

    #[test]
    fn a_fast_stream_is_never_aborted() {
        let mut m = Meter::new(P);
        for t in (0..20_000).step_by(100) {
            assert!(!m.chunk(t, 1).abort, "at {t}");
        }
    }
}
