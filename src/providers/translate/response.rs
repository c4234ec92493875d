//! Complete (non-stream) answers: an Anthropic message as a `chat.completion`, and a
//! `chat.completion` as an Anthropic message. Ids, the model that served, the stop reason
//! and usage (cache read / creation included) are carried.

use serde_json::{Map, Value, json};

use super::Refused;

type Obj = Map<String, Value>;

/// Anthropic `stop_reason` → OpenAI `finish_reason`.
pub fn finish_reason_of(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        // end_turn, stop_sequence, pause_turn and anything newer.
        _ => "stop",
    }
}

/// OpenAI `finish_reason` → Anthropic `stop_reason`.
pub fn stop_reason_of(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// Only the members that tell an answer's format, each read only if it is an array.
#[derive(serde::Deserialize)]
struct Shape {
    #[serde(default)]
    content: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(default)]
    choices: Option<Vec<serde::de::IgnoredAny>>,
}

/// `body` is a complete answer of the provider's format: an Anthropic message (`content` an
/// array) when `anthropic`, else a `chat.completion` (`choices` an array). Anything else —
/// not JSON, or the other format's answer from a provider whose `format` is set wrong — would
/// translate into an empty answer, so it is not translated at all.
pub fn is_answer(body: &[u8], anthropic: bool) -> bool {
    match serde_json::from_slice::<Shape>(body) {
        Ok(s) if anthropic => s.content.is_some(),
        Ok(s) => s.choices.is_some(),
        Err(_) => false,
    }
}

fn parse(body: &[u8]) -> Result<Obj, Refused> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(Refused::new(
            "body",
            "the upstream answer is not a JSON object",
        )),
    }
}

fn u(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

/// Anthropic usage → OpenAI usage. OpenAI's `prompt_tokens` counts cached input too;
/// Anthropic's `input_tokens` does not.
pub fn usage_to_openai(usage: &Value) -> Value {
    let input = u(usage.get("input_tokens"));
    let read = u(usage.get("cache_read_input_tokens"));
    let created = u(usage.get("cache_creation_input_tokens"));
    let output = u(usage.get("output_tokens"));
    let prompt = input.saturating_add(read).saturating_add(created);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt.saturating_add(output),
        "prompt_tokens_details": {"cached_tokens": read, "cache_creation_tokens": created},
    })
}

/// OpenAI usage → Anthropic usage (the inverse of [`usage_to_openai`]).
pub fn usage_to_anthropic(usage: &Value) -> Value {
    let details = usage.get("prompt_tokens_details");
    let read = u(details.and_then(|d| d.get("cached_tokens")));
    let created = u(details.and_then(|d| d.get("cache_creation_tokens")));
    let prompt = u(usage.get("prompt_tokens"));
    json!({
        "input_tokens": prompt.saturating_sub(read.saturating_add(created)),
        "output_tokens": u(usage.get("completion_tokens")),
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": created,
    })
}

/// An Anthropic message (`type: message`) as an OpenAI `chat.completion`; `created` is the
/// Unix time to stamp it with.
pub fn message_to_completion(body: &[u8], created: u64) -> Result<Vec<u8>, Refused> {
    let m = parse(body)?;
    Ok(serde_json::to_vec(&message_to_completion_obj(&m, created)).unwrap_or_default())
}

pub fn message_to_completion_obj(m: &Obj, created: u64) -> Value {
    let mut text = String::new();
    let mut has_text = false;
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for b in m
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                has_text = true;
                text.push_str(b.get("text").and_then(Value::as_str).unwrap_or(""));
            }
            Some("thinking") => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            Some("tool_use") => {
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": b.get("name").cloned().unwrap_or(Value::Null),
                                 "arguments": input.to_string()},
                }));
            }
            _ => {}
        }
    }
    let mut message = Obj::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        if has_text { json!(text) } else { Value::Null },
    );
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), json!(reasoning));
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    let finish = m
        .get("stop_reason")
        .and_then(Value::as_str)
        .map_or("stop", finish_reason_of);
    let mut out = json!({
        "id": m.get("id").cloned().unwrap_or_else(|| json!("")),
        "object": "chat.completion",
        "created": created,
        "model": m.get("model").cloned().unwrap_or_else(|| json!("")),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
    });
    if let (Some(usage), Some(o)) = (m.get("usage"), out.as_object_mut()) {
        o.insert("usage".into(), usage_to_openai(usage));
    }
    out
}

/// An OpenAI `chat.completion` as an Anthropic message (the first choice).
pub fn completion_to_message(body: &[u8]) -> Result<Vec<u8>, Refused> {
    let c = parse(body)?;
    Ok(serde_json::to_vec(&completion_to_message_obj(&c)).unwrap_or_default())
}

/// A tool call's `arguments` string as the `input` object Anthropic carries (`{}` when it
/// is empty or not a JSON object).
pub fn arguments_to_input(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

pub fn completion_to_message_obj(c: &Obj) -> Value {
    let choice = c
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|a| a.first());
    let msg = choice.and_then(|ch| ch.get("message"));
    let mut content = Vec::new();
    let reasoning = msg
        .and_then(|m| m.get("reasoning_content").or_else(|| m.get("reasoning")))
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty());
    if let Some(r) = reasoning {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    match msg.and_then(|m| m.get("content")) {
        Some(Value::String(s)) if !s.is_empty() => {
            content.push(json!({"type": "text", "text": s}));
        }
        Some(Value::Array(parts)) => {
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    content.push(json!({"type": "text", "text": t}));
                }
            }
        }
        _ => {}
    }
    if let Some(r) = msg.and_then(|m| m.get("refusal")).and_then(Value::as_str) {
        content.push(json!({"type": "text", "text": r}));
    }
    for call in msg
        .and_then(|m| m.get("tool_calls"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = call.get("function");
        let args = f
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        content.push(json!({
            "type": "tool_use",
            "id": call.get("id").cloned().unwrap_or(Value::Null),
            "name": f.and_then(|f| f.get("name")).cloned().unwrap_or(Value::Null),
            "input": arguments_to_input(args),
        }));
    }
    let stop = choice
        .and_then(|ch| ch.get("finish_reason"))
        .and_then(Value::as_str)
        .map_or("end_turn", stop_reason_of);
    let usage = c
        .get("usage")
        .map_or_else(|| usage_to_anthropic(&Value::Null), usage_to_anthropic);
    json!({
        "id": c.get("id").cloned().unwrap_or_else(|| json!("")),
        "type": "message",
        "role": "assistant",
        "model": c.get("model").cloned().unwrap_or_else(|| json!("")),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage,
    })
}
