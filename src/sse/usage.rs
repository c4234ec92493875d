//! The token counts a stream reports about itself: OpenAI chat's `usage` chunk
//! (`prompt_tokens`, `completion_tokens`), Responses' `response.usage` (`input_tokens`,
//! `output_tokens`), Anthropic's `message_start` (`message.usage.input_tokens`) and
//! `message_delta` (`usage.output_tokens`, cumulative). Only events that mention `"usage"`
//! are parsed, so a stream costs one substring search per event.

use serde::Deserialize;

use super::Event;

/// What a stream said about its tokens so far: the last value reported for each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

#[derive(Deserialize, Default)]
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

impl Usage {
    /// Takes in what `ev` reports, if anything (a later report replaces an earlier one
    /// field by field: Anthropic's output count is cumulative).
    pub fn observe(&mut self, ev: &Event<'_>) {
        let Some(data) = ev.data else { return };
        if memchr::memmem::find(data, b"\"usage\"").is_none() {
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
        let at = memchr::memmem::rfind(body, b"\"usage\"")?;
        let rest = body.get(at + 7..)?;
        let open = rest
            .iter()
            .position(|b| !b.is_ascii_whitespace() && *b != b':')?;
        if rest.get(open) != Some(&b'{') {
            return None;
        }
        let obj = rest.get(open..)?;
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
        let c: Counts = serde_json::from_slice(obj.get(..=end?)?).ok()?;
        Some(Usage {
            prompt_tokens: c.prompt_tokens.or(c.input_tokens).unwrap_or(0),
            completion_tokens: c.completion_tokens.or(c.output_tokens).unwrap_or(0),
        })
    }
}

/// The last [`ANSWER_TAIL_BYTES`] of a whole JSON answer relayed piece by piece, for the
/// usage it reports ([`Usage::of_answer`]) without holding the answer.
#[derive(Debug, Default)]
pub struct AnswerTail {
    buf: Vec<u8>,
}

impl AnswerTail {
    pub fn feed(&mut self, piece: &[u8]) {
        if piece.len() >= ANSWER_TAIL_BYTES {
            self.buf.clear();
            self.buf
                .extend_from_slice(&piece[piece.len() - ANSWER_TAIL_BYTES..]);
            return;
        }
        self.buf.extend_from_slice(piece);
        if self.buf.len() > ANSWER_TAIL_BYTES {
            let cut = self.buf.len() - ANSWER_TAIL_BYTES;
            self.buf.drain(..cut);
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        Usage::of_answer(&self.buf)
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

    #[test]
    fn a_whole_answer_s_usage_is_read_from_its_tail() {
        let openai = br#"{"id":"x","choices":[{"message":{"content":"the "usage": {"}}],"usage":{"prompt_tokens":11,"completion_tokens":22,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        let anthropic = br#"{"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":6}}"#;
        for (body, want) in [(&openai[..], (11, 22)), (&anthropic[..], (5, 6))] {
            let u = Usage::of_answer(body).unwrap();
            assert_eq!((u.prompt_tokens, u.completion_tokens), want);
            // Fed in 7-byte pieces behind a long prefix: the tail still holds it.
            let mut t = AnswerTail::default();
            t.feed(&vec![b' '; 3 * ANSWER_TAIL_BYTES]);
            for piece in body.chunks(7) {
                t.feed(piece);
            }
            assert_eq!(t.usage(), Some(u));
        }
        assert_eq!(Usage::of_answer(br#"{"usage":{"prompt_tokens":1"#), None);
        assert_eq!(Usage::of_answer(br#"{"usage": null}"#), None);
        assert_eq!(Usage::of_answer(b"no usage here"), None);
    }
}
