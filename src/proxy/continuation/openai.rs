//! The OpenAI chat shape of a splice: what the original part records, and how a later
//! part's chunks are rewritten (role-only and reasoning deltas dropped, ids the first part's,
//! usage over the whole answer).

use bytes::BytesMut;
use serde_json::{Value, json};

use super::{Splice, emit};

impl Splice {
    pub(super) fn record_openai(&mut self, v: &Value) {
        if self.id.is_none() {
            self.id = v.get("id").and_then(Value::as_str).map(str::to_owned);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.note_usage(
                u.get("prompt_tokens").and_then(Value::as_u64),
                u.get("completion_tokens").and_then(Value::as_u64),
            );
        }
        let Some(choice) = v.pointer("/choices/0") else {
            return;
        };
        if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
            self.off = true;
        }
        let Some(delta) = choice.get("delta") else {
            return;
        };
        if delta.get("tool_calls").is_some() || delta.get("function_call").is_some() {
            self.off = true;
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str)
            && !t.is_empty()
        {
            self.delivered.push_str(t);
            self.part_deltas += 1;
        }
    }

    pub(super) fn transform_openai(&mut self, mut v: Value, out: &mut BytesMut) {
        if let (Some(id), Some(slot)) = (&self.id, v.get_mut("id")) {
            *slot = Value::String(id.clone());
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let p = u.get("prompt_tokens").and_then(Value::as_u64);
            let c = u.get("completion_tokens").and_then(Value::as_u64);
            self.note_usage(p, c);
            let (prompt, completion) = self.totals(c.unwrap_or(0));
            if let Some(u) = v.get_mut("usage").and_then(Value::as_object_mut) {
                u.insert("prompt_tokens".into(), json!(prompt));
                u.insert("completion_tokens".into(), json!(completion));
                u.insert("total_tokens".into(), json!(prompt + completion));
            }
        }
        let has_usage = v.get("usage").is_some_and(Value::is_object);
        let finish = v
            .pointer("/choices/0/finish_reason")
            .is_some_and(|f| !f.is_null());
        let text = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if let Some(delta) = v
            .pointer_mut("/choices/0/delta")
            .and_then(Value::as_object_mut)
        {
            delta.remove("role");
            delta.remove("reasoning_content");
            delta.remove("reasoning");
        }
        let other = v
            .pointer("/choices/0/delta")
            .and_then(Value::as_object)
            .is_some_and(|d| d.keys().any(|k| k != "content"));
        if finish || other {
            // A finished answer or a tool call: a later cut is not continued.
            self.off = true;
        }
        if text.is_empty() && !finish && !has_usage && !other {
            return; // role-only, reasoning or empty: the client has what it needs
        }
        if text.is_empty() || finish || has_usage || other {
            self.flush_before(out);
            if !text.is_empty() {
                self.text_event(None, v, text, out);
                return;
            }
            if self.failed.is_none() {
                emit(out, None, &v);
            }
            return;
        }
        self.text_event(None, v, text, out);
    }
}
