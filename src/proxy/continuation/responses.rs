//! The Responses shape of a splice (`/v1/responses` translated from a Chat Completions or
//! Anthropic provider): what the original part records, and how a later part's events are
//! rewritten — its `response.created` / `in_progress` dropped, reasoning items dropped, its
//! message item folded into the client's open one (same item id, output index and content
//! index), every event numbered on from the client's last `sequence_number`, the done events
//! and `response.completed` carrying the whole text, the first part's response id and
//! usage over the whole answer.

use bytes::BytesMut;
use serde_json::{Value, json};

use super::{Responses, Splice};

impl Responses {
    /// Gives an event of a later part the client's next sequence number.
    pub(super) fn number(&mut self, v: &mut Value) {
        if let Some(slot) = v.get_mut("sequence_number") {
            *slot = json!(self.seq);
            self.seq += 1;
        }
    }

    fn keep_item(&mut self, index: u64, item: Value) {
        self.items.retain(|(i, _)| *i != index);
        self.items.push((index, item));
        self.items.sort_by_key(|(i, _)| *i);
    }
}

fn kind_of(name: Option<&str>, v: &Value) -> String {
    v.get("type")
        .and_then(Value::as_str)
        .or(name)
        .unwrap_or("")
        .to_owned()
}

impl Splice {
    /// Adds the delivered text to a Responses request as an assistant prefill: a trailing
    /// assistant message input item (a trailing assistant message is extended; a string
    /// `input` becomes a user message first). `None` when the body has no `input`.
    pub(super) fn prefill_responses(body: &mut Value, text: String) -> Option<()> {
        let input = body.get_mut("input")?;
        if let Value::String(s) = input {
            *input = json!([{"role": "user", "content": std::mem::take(s)}]);
        }
        let items = input.as_array_mut()?;
        let last_assistant = items.last().is_some_and(|m| {
            m.get("role").and_then(Value::as_str) == Some("assistant")
                && m.get("type").and_then(Value::as_str).unwrap_or("message") == "message"
        });
        match items.last_mut().and_then(|m| m.get_mut("content")) {
            Some(Value::String(s)) if last_assistant => s.push_str(&text),
            Some(Value::Array(parts)) if last_assistant => {
                parts.push(json!({"type": "output_text", "text": text}));
            }
            _ => items.push(json!({"role": "assistant", "content": text})),
        }
        Some(())
    }

    pub(super) fn record_responses(&mut self, name: Option<&str>, v: &Value) {
        if let Some(n) = v.get("sequence_number").and_then(Value::as_u64) {
            self.resp.seq = self.resp.seq.max(n + 1);
        }
        let index = v.get("output_index").and_then(Value::as_u64);
        match kind_of(name, v).as_str() {
            "response.created" | "response.in_progress" => {
                if self.resp.id.is_none() {
                    self.resp.id = v.pointer("/response/id").cloned();
                    self.resp.created_at = v.pointer("/response/created_at").cloned();
                }
            }
            "response.output_item.added" => {
                if let Some(i) = index {
                    self.next_block = self.next_block.max(i + 1);
                }
                match v.pointer("/item/type").and_then(Value::as_str) {
                    Some("message") if index.is_some() => {
                        self.open_block = index;
                        self.resp.msg_id = v
                            .pointer("/item/id")
                            .and_then(Value::as_str)
                            .map(str::to_owned);
                        self.resp.msg_start = self.delivered.len();
                        self.resp.msg_content = 0;
                    }
                    Some("reasoning") => {}
                    // A function call (or any other item): not continued.
                    _ => self.off = true,
                }
            }
            "response.content_part.added" => {
                if v.pointer("/part/type").and_then(Value::as_str) == Some("output_text") {
                    let ci = v.get("content_index").and_then(Value::as_u64);
                    self.resp.msg_content = ci.unwrap_or(0);
                } else {
                    self.off = true;
                }
            }
            "response.output_text.delta" => {
                if let Some(t) = v.get("delta").and_then(Value::as_str)
                    && !t.is_empty()
                {
                    self.delivered.push_str(t);
                    self.part_deltas += 1;
                }
            }
            "response.output_item.done" => {
                if let (Some(i), Some(item)) = (index, v.get("item")) {
                    // A finished message: the answer's text is complete.
                    if item.get("type").and_then(Value::as_str) == Some("message") {
                        self.off = true;
                        self.open_block = None;
                    }
                    self.resp.keep_item(i, item.clone());
                }
            }
            "response.reasoning_summary_part.added"
            | "response.reasoning_summary_text.delta"
            | "response.reasoning_summary_text.done"
            | "response.reasoning_summary_part.done"
            | "response.output_text.done"
            | "response.content_part.done" => {}
            // A finished response, an error, a tool call's arguments, a refusal, anything
            // else: not continued.
            _ => self.off = true,
        }
    }

    pub(super) fn transform_responses(
        &mut self,
        name: Option<String>,
        mut v: Value,
        out: &mut BytesMut,
    ) {
        let kind = kind_of(name.as_deref(), &v);
        let index = v.get("output_index").and_then(Value::as_u64);
        match kind.as_str() {
            // The client has its response's lifecycle start.
            "response.created" | "response.in_progress" => {}
            "response.output_item.added" => {
                let Some(i) = index else { return };
                let item = v
                    .pointer("/item/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if item == "reasoning" {
                    self.blocks.push((i, None));
                    return;
                }
                if item == "message"
                    && let Some(open) = self.open_block
                    && self.resp.carried.is_none()
                {
                    // The client's open message item goes on.
                    self.resp.carried = Some(open);
                    self.blocks.push((i, Some(open)));
                    return;
                }
                if item != "message" {
                    self.off = true;
                }
                self.flush_before(out);
                let to = self.next_block;
                self.next_block += 1;
                self.blocks.push((i, Some(to)));
                if item == "message" {
                    self.open_block = Some(to);
                    self.resp.msg_id = v
                        .pointer("/item/id")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    self.resp.msg_start = self.delivered.len();
                    self.resp.msg_content = 0;
                }
                v["output_index"] = json!(to);
                self.send_unless_failed(out, name, v);
            }
            "response.output_text.delta" => {
                let Some(to) = self.place(&mut v) else { return };
                let text = v
                    .get("delta")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                if !text.is_empty() && Some(to) == self.open_block {
                    self.text_event(name, v, text, out);
                } else {
                    self.flush_before(out);
                    self.send_unless_failed(out, name, v);
                }
            }
            // The client has the text part of the message item it had open.
            "response.content_part.added" if self.is_carried(index) => {}
            "response.output_text.done" | "response.content_part.done" => {
                let Some(to) = self.place(&mut v) else { return };
                self.flush_before(out);
                if Some(to) == self.open_block {
                    let whole = self.message_text();
                    let slot = if kind == "response.output_text.done" {
                        v.get_mut("text")
                    } else {
                        v.pointer_mut("/part/text")
                    };
                    if let Some(slot) = slot {
                        *slot = Value::String(whole);
                    }
                }
                self.send_unless_failed(out, name, v);
            }
            "response.output_item.done" => {
                let Some(to) = self.place(&mut v) else { return };
                self.flush_before(out);
                if Some(to) == self.open_block {
                    let whole = self.message_text();
                    let ci = self.resp.msg_content as usize;
                    if let Some(item) = v.get_mut("item") {
                        if let (Some(id), Some(slot)) = (&self.resp.msg_id, item.get_mut("id")) {
                            *slot = Value::String(id.clone());
                        }
                        if let Some(slot) = item.pointer_mut(&format!("/content/{ci}/text")) {
                            *slot = Value::String(whole);
                        }
                    }
                    self.open_block = None;
                    self.off = true;
                }
                if let Some(item) = v.get("item") {
                    self.resp.keep_item(to, item.clone());
                }
                self.send_unless_failed(out, name, v);
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.off = true;
                self.flush_before(out);
                self.finish_response(&mut v);
                self.send_unless_failed(out, name, v);
            }
            _ => {
                if index.is_some() && self.place(&mut v).is_none() {
                    return; // an event of a dropped (reasoning) item
                }
                self.flush_before(out);
                self.send_unless_failed(out, name, v);
            }
        }
    }

    fn send_unless_failed(&mut self, out: &mut BytesMut, name: Option<String>, v: Value) {
        if self.failed.is_none() {
            self.send(out, name.as_deref(), v);
        }
    }

    /// Whether the part's output index `index` goes on in the client's carried message.
    fn is_carried(&self, index: Option<u64>) -> bool {
        index
            .and_then(|i| self.map_block(i))
            .is_some_and(|to| Some(to) == self.resp.carried)
    }

    /// Moves an event of the part onto the client's output index (and, for the carried
    /// message item, onto its item id and content index); `None`: a dropped item's event.
    fn place(&mut self, v: &mut Value) -> Option<u64> {
        let to = v
            .get("output_index")
            .and_then(Value::as_u64)
            .and_then(|i| self.map_block(i))?;
        v["output_index"] = json!(to);
        if Some(to) == self.resp.carried {
            if let (Some(id), Some(slot)) = (&self.resp.msg_id, v.get_mut("item_id")) {
                *slot = Value::String(id.clone());
            }
            if let Some(slot) = v.get_mut("content_index") {
                *slot = json!(self.resp.msg_content);
            }
        }
        Some(to)
    }

    /// The whole text of the client's open message item (every part's).
    fn message_text(&self) -> String {
        self.delivered
            .get(self.resp.msg_start..)
            .unwrap_or_default()
            .to_owned()
    }

    /// A later part's final response object: the first part's id and creation time, every
    /// finished output item of the client's stream, usage over the whole answer.
    fn finish_response(&mut self, v: &mut Value) {
        let usage = v.pointer("/response/usage").filter(|u| u.is_object());
        let input = usage
            .and_then(|u| u.get("input_tokens"))
            .and_then(Value::as_u64)
            .filter(|n| *n > 0);
        let output = usage
            .and_then(|u| u.get("output_tokens"))
            .and_then(Value::as_u64)
            .filter(|n| *n > 0 || input.is_some());
        self.note_usage(input, output);
        let (prompt, completion) = self.totals(self.part_completion.unwrap_or(self.part_deltas));
        let Some(r) = v.get_mut("response").and_then(Value::as_object_mut) else {
            return;
        };
        if let Some(id) = &self.resp.id {
            r.insert("id".into(), id.clone());
        }
        if let Some(at) = &self.resp.created_at {
            r.insert("created_at".into(), at.clone());
        }
        let items: Vec<Value> = self.resp.items.iter().map(|(_, it)| it.clone()).collect();
        r.insert("output".into(), Value::Array(items));
        if let Some(u) = r.get_mut("usage").and_then(Value::as_object_mut) {
            u.insert("input_tokens".into(), json!(prompt));
            u.insert("output_tokens".into(), json!(completion));
            u.insert("total_tokens".into(), json!(prompt + completion));
        }
    }
}
