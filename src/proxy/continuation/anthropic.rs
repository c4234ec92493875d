//! The Anthropic Messages shape of a splice: what the original part records, and how a
//! later part's events are rewritten (`message_start` and `ping` dropped, thinking blocks
//! dropped, block indices mapped onto the client's, output tokens over the whole answer).

use bytes::BytesMut;
use serde_json::{Value, json};

use super::{Splice, emit};

impl Splice {
    pub(super) fn record_anthropic(&mut self, name: Option<&str>, v: &Value) {
        let kind = v.get("type").and_then(Value::as_str).or(name).unwrap_or("");
        let index = v.get("index").and_then(Value::as_u64);
        match kind {
            "message_start" => {
                let input = start_input_tokens(v);
                if self.prompt.is_none() {
                    self.prompt = input;
                }
            }
            "content_block_start" => {
                let block = v.pointer("/content_block/type").and_then(Value::as_str);
                if let Some(i) = index {
                    self.next_block = self.next_block.max(i + 1);
                    if block == Some("text") {
                        self.open_block = Some(i);
                    }
                }
                if !matches!(block, Some("text" | "thinking" | "redacted_thinking")) {
                    self.off = true;
                }
            }
            "content_block_delta" => match v.pointer("/delta/type").and_then(Value::as_str) {
                Some("text_delta") => {
                    if let Some(t) = v.pointer("/delta/text").and_then(Value::as_str)
                        && !t.is_empty()
                    {
                        self.delivered.push_str(t);
                        self.part_deltas += 1;
                    }
                }
                Some("thinking_delta" | "signature_delta") => {}
                _ => self.off = true,
            },
            "content_block_stop" if index.is_some() && index == self.open_block => {
                self.open_block = None;
            }
            "message_delta" | "message_stop" => self.off = true,
            _ => {}
        }
    }

    pub(super) fn transform_anthropic(
        &mut self,
        name: Option<String>,
        mut v: Value,
        out: &mut BytesMut,
    ) {
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(name.as_deref())
            .unwrap_or("")
            .to_owned();
        let index = v.get("index").and_then(Value::as_u64);
        match kind.as_str() {
            "ping" => {}
            "message_start" => {
                let input = start_input_tokens(&v);
                self.note_usage(input, None);
            }
            "content_block_start" => {
                let Some(i) = index else { return };
                let block = v
                    .pointer("/content_block/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if matches!(block, "thinking" | "redacted_thinking") {
                    self.blocks.push((i, None));
                    return;
                }
                if block == "text"
                    && let Some(open) = self.open_block
                    && !self.blocks.iter().any(|(_, o)| *o == Some(open))
                {
                    // The client's open text block goes on.
                    self.blocks.push((i, Some(open)));
                    return;
                }
                if block != "text" {
                    self.off = true;
                }
                let to = self.next_block;
                self.next_block += 1;
                self.blocks.push((i, Some(to)));
                self.flush_before(out);
                v["index"] = json!(to);
                if self.failed.is_none() {
                    emit(out, Some(&kind), &v);
                }
            }
            "content_block_delta" => {
                let Some(to) = index.and_then(|i| self.map_block(i)) else {
                    return;
                };
                v["index"] = json!(to);
                let text_delta =
                    v.pointer("/delta/type").and_then(Value::as_str) == Some("text_delta");
                let text = v
                    .pointer("/delta/text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                if text_delta && !text.is_empty() {
                    self.text_event(Some(kind), v, text, out);
                } else if !text_delta {
                    self.flush_before(out);
                    if self.failed.is_none() {
                        emit(out, Some(&kind), &v);
                    }
                }
            }
            "content_block_stop" => {
                let Some(to) = index.and_then(|i| self.map_block(i)) else {
                    return;
                };
                self.flush_before(out);
                if self.open_block == Some(to) {
                    self.open_block = None;
                }
                v["index"] = json!(to);
                if self.failed.is_none() {
                    emit(out, Some(&kind), &v);
                }
            }
            "message_delta" => {
                self.off = true;
                let c = v.pointer("/usage/output_tokens").and_then(Value::as_u64);
                // A stream translated from OpenAI reports its input tokens here.
                let input = v
                    .pointer("/usage/input_tokens")
                    .and_then(Value::as_u64)
                    .filter(|n| *n > 0);
                self.note_usage(input, c);
                self.flush_before(out);
                let (prompt, completion) = self.totals(c.unwrap_or(0));
                if let Some(u) = v.get_mut("usage").and_then(Value::as_object_mut) {
                    u.insert("output_tokens".into(), json!(completion));
                    if u.contains_key("input_tokens") {
                        u.insert("input_tokens".into(), json!(prompt));
                    }
                }
                if self.failed.is_none() {
                    emit(out, Some(&kind), &v);
                }
            }
            _ => {
                self.flush_before(out);
                if self.failed.is_none() {
                    emit(out, Some(&kind), &v);
                }
            }
        }
    }

    pub(super) fn map_block(&self, i: u64) -> Option<u64> {
        self.blocks
            .iter()
            .find(|(from, _)| *from == i)
            .and_then(|(_, to)| *to)
    }
}

/// The input tokens a `message_start` reports; 0 counts as not reported (a stream
/// translated from OpenAI starts with zeros: OpenAI reports usage at the end).
fn start_input_tokens(v: &Value) -> Option<u64> {
    v.pointer("/message/usage/input_tokens")
        .and_then(Value::as_u64)
        .filter(|n| *n > 0)
}
