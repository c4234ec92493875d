//! The throughput watchdog's meter (spec B §7.2): how many *useful* bytes of model text a
//! stream delivered over a sliding window, whether it is in a protected phase (reasoning or
//! tool frames, which are slow by nature and never judged), and the abort decision taken on
//! every observed chunk. Pure: time comes in as monotonic milliseconds.

use std::collections::VecDeque;

use serde_json::Value;

use super::Event;

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

fn has_word(s: &str, words: &[&str]) -> bool {
    let lower = s.to_ascii_lowercase();
    words.iter().any(|w| lower.contains(w))
}

fn str_len(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_str).map_or(0, |s| s.len() as u64)
}

/// What an event contributes (B §7.2 "Event parsing"): empty data, `[DONE]` and non-JSON
/// contribute nothing; the type is the JSON `type`, else the SSE event name.
pub fn useful(ev: &Event<'_>) -> Useful {
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
    use super::*;

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
