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
}
