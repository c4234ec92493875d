//! Property tests: requests and answers survive A → B → A on every field both formats
//! carry; the stream translator's output does not depend on how the upstream bytes are
//! split; fields with no counterpart are refused, naming them.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::Translation;
use super::request::{chat_to_messages_obj, messages_to_chat_obj};
use super::response::{completion_to_message_obj, message_to_completion_obj};
use super::stream::StreamTranslator;

type Obj = Map<String, Value>;

fn obj(v: Value) -> Obj {
    match v {
        Value::Object(m) => m,
        _ => Obj::new(),
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9 ]{1,12}",
        "[\\PC]{1,8}",
        Just("line\nbreak \"quoted\" \\ back".to_owned()),
    ]
}

fn ident() -> impl Strategy<Value = String> {
    "[a-z_]{1,10}"
}

fn image_url() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9+/]{4,16}".prop_map(|d| format!("data:image/png;base64,{d}")),
        "[a-z]{1,8}".prop_map(|h| format!("https://{h}.example/i.png")),
    ]
}

// --- OpenAI requests ---------------------------------------------------------------------

fn openai_user_part() -> impl Strategy<Value = Value> {
    prop_oneof![
        text().prop_map(|t| json!({"type": "text", "text": t})),
        image_url().prop_map(|u| json!({"type": "image_url", "image_url": {"url": u}})),
    ]
}

fn openai_text_parts() -> impl Strategy<Value = Value> {
    prop::collection::vec(text(), 1..3).prop_map(|ts| {
        Value::Array(
            ts.into_iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect(),
        )
    })
}

/// One exchange: a user turn, then an assistant turn that may call tools, whose results
/// come back (and then possibly more user content in an array).
fn openai_exchange(n: usize) -> impl Strategy<Value = Vec<Value>> {
    let user = prop_oneof![
        text().prop_map(Value::String),
        prop::collection::vec(openai_user_part(), 1..3).prop_map(Value::Array),
    ];
    let calls = prop::collection::vec((ident(), "[a-z]{0,6}"), 0..3);
    let assistant_text = prop_oneof![
        text().prop_map(Value::String),
        openai_text_parts(),
        Just(Value::Null)
    ];
    let results = prop::collection::vec(
        prop_oneof![text().prop_map(Value::String), openai_text_parts()],
        3,
    );
    let after = prop::option::of(prop::collection::vec(openai_user_part(), 1..3));
    (user, calls, assistant_text, results, after).prop_map(
        move |(user, calls, at, results, after)| {
            let mut out = vec![json!({"role": "user", "content": user})];
            if calls.is_empty() {
                let content = if at.is_null() { json!("ok") } else { at };
                out.push(json!({"role": "assistant", "content": content}));
                return out;
            }
            let content = match at {
                Value::String(_) => Value::Null,
                v => v,
            };
            let tool_calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, arg))| {
                    json!({"id": format!("call_{n}_{i}"), "type": "function",
                       "function": {"name": name, "arguments": json!({"v": arg}).to_string()}})
                })
                .collect();
            out.push(json!({"role": "assistant", "content": content, "tool_calls": tool_calls}));
            for (i, r) in results.into_iter().take(calls.len()).enumerate() {
                out.push(
                    json!({"role": "tool", "tool_call_id": format!("call_{n}_{i}"), "content": r}),
                );
            }
            if let Some(parts) = after {
                out.push(json!({"role": "user", "content": parts}));
            }
            out
        },
    )
}

fn openai_request() -> impl Strategy<Value = Obj> {
    let system = prop::option::of(prop_oneof![
        text().prop_map(Value::String),
        openai_text_parts()
    ]);
    let exchanges = prop::collection::vec(openai_exchange(0), 1..3);
    let tools = prop::option::of(prop::collection::vec(
        (ident(), prop::option::of(text())),
        1..3,
    ));
    let choice = prop::option::of(prop_oneof![
        Just(json!("auto")),
        Just(json!("none")),
        Just(json!("required")),
        ident().prop_map(|n| json!({"type": "function", "function": {"name": n}})),
    ]);
    let knobs = (
        1u64..100_000,
        prop::option::of(0u32..=100),
        prop::option::of(0u32..=100),
        prop::option::of(prop::collection::vec(text(), 1..3)),
        any::<bool>(),
        prop::option::of(ident()),
        prop::option::of(prop_oneof![Just("low"), Just("medium"), Just("high")]),
        any::<bool>(),
    );
    (system, exchanges, tools, choice, knobs).prop_map(
        |(system, exchanges, tools, choice, knobs)| {
            let (max, temp, top_p, stop, stream, user, effort, no_parallel) = knobs;
            let mut r = Obj::new();
            r.insert("model".into(), json!("m"));
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(json!({"role": "system", "content": s}));
            }
            // Tool-call ids unique per exchange.
            for (n, ex) in exchanges.into_iter().enumerate() {
                for mut m in ex {
                    if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        for c in calls {
                            let id = c["id"].as_str().unwrap_or("").replacen("call_0", &format!("call_{n}"), 1);
                            c["id"] = json!(id);
                        }
                    }
                    if let Some(id) = m.get("tool_call_id").and_then(Value::as_str) {
                        let id = id.replacen("call_0", &format!("call_{n}"), 1);
                        m["tool_call_id"] = json!(id);
                    }
                    // A user turn right after tool results joins their Anthropic turn and
                    // comes back as parts (docs/translation.md): the generator sends parts.
                    let after_tool = messages.last().is_some_and(|p: &Value| p["role"] == "tool");
                    if after_tool && m["role"] == "user"
                        && let Some(s) = m["content"].as_str()
                    {
                        m["content"] = json!([{"type": "text", "text": s}]);
                    }
                    messages.push(m);
                }
            }
            r.insert("messages".into(), Value::Array(messages));
            let max = if effort.is_some() { max + 16_385 } else { max };
            r.insert("max_tokens".into(), json!(max));
            if let Some(t) = temp {
                r.insert("temperature".into(), json!(f64::from(t) / 100.0));
            }
            if let Some(p) = top_p {
                r.insert("top_p".into(), json!(f64::from(p) / 100.0));
            }
            if let Some(s) = stop {
                r.insert("stop".into(), json!(s));
            }
            r.insert("stream".into(), json!(stream));
            if stream {
                r.insert("stream_options".into(), json!({"include_usage": true}));
            }
            if let Some(u) = user {
                r.insert("user".into(), json!(u));
            }
            if let Some(e) = effort {
                r.insert("reasoning_effort".into(), json!(e));
            }
            if let Some(ts) = tools {
                let ts: Vec<Value> = ts
                    .into_iter()
                    .map(|(name, desc)| {
                        let mut f = json!({"name": name, "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}});
                        if let Some(d) = desc {
                            f["description"] = json!(d);
                        }
                        json!({"type": "function", "function": f})
                    })
                    .collect();
                r.insert("tools".into(), Value::Array(ts));
            }
            if let Some(c) = choice {
                if no_parallel && c != json!("none") {
                    r.insert("parallel_tool_calls".into(), json!(false));
                }
                r.insert("tool_choice".into(), c);
            }
            r
        },
    )
}

// --- Anthropic requests ------------------------------------------------------------------

fn anthropic_text_blocks() -> impl Strategy<Value = Value> {
    prop::collection::vec(text(), 1..3).prop_map(|ts| {
        Value::Array(
            ts.into_iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect(),
        )
    })
}

fn anthropic_user_block() -> impl Strategy<Value = Value> {
    prop_oneof![
        text().prop_map(|t| json!({"type": "text", "text": t})),
        "[A-Za-z0-9+/]{4,16}".prop_map(|d| json!({"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": d}})),
        "[a-z]{1,8}".prop_map(|h| json!({"type": "image", "source": {"type": "url", "url": format!("https://{h}.example/a.jpg")}})),
    ]
}

/// A user turn answering the previous assistant's tool uses (ids), then an assistant turn.
fn anthropic_exchange() -> impl Strategy<Value = (Value, Value, usize)> {
    let user_extra = prop::collection::vec(anthropic_user_block(), 0..3);
    let user_string = prop::option::of(text());
    let results = prop::collection::vec(
        prop_oneof![text().prop_map(Value::String), anthropic_text_blocks()],
        3,
    );
    let assistant_texts = prop::collection::vec(text(), 0..2);
    let uses = prop::collection::vec((ident(), "[a-z]{0,5}"), 0..3);
    let assistant_string = prop::option::of(text());
    (user_extra, user_string, results, assistant_texts, uses, assistant_string).prop_map(
        |(extra, ustr, results, atexts, uses, astr)| {
            // Stitched by the caller: results are placeholders filled with the ids of the
            // previous turn's tool uses.
            let user = json!({"extra": extra, "string": ustr, "results": results});
            let mut blocks: Vec<Value> = atexts
                .into_iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect();
            let n = uses.len();
            for (i, (name, v)) in uses.into_iter().enumerate() {
                blocks.push(json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": name, "input": {"v": v}}));
            }
            let assistant = match astr {
                Some(s) if blocks.is_empty() => json!(s),
                _ if blocks.is_empty() => json!("ok"),
                _ => Value::Array(blocks),
            };
            (user, assistant, n)
        },
    )
}

fn anthropic_request() -> impl Strategy<Value = Obj> {
    let system = prop::option::of(prop_oneof![
        text().prop_map(Value::String),
        anthropic_text_blocks()
    ]);
    let exchanges = prop::collection::vec(anthropic_exchange(), 1..4);
    let tools = prop::option::of(prop::collection::vec(
        (ident(), prop::option::of(text())),
        1..3,
    ));
    let choice = prop::option::of((
        prop_oneof![
            Just(json!({"type": "auto"})),
            Just(json!({"type": "any"})),
            Just(json!({"type": "none"})),
            ident().prop_map(|n| json!({"type": "tool", "name": n})),
        ],
        any::<bool>(),
    ));
    let knobs = (
        1u64..100_000,
        prop::option::of(0u32..=100),
        prop::option::of(prop::collection::vec(text(), 1..3)),
        any::<bool>(),
        prop::option::of(ident()),
        prop::option::of(prop_oneof![Just(1024u64), Just(4096), Just(16384)]),
        prop::option::of(0u32..=100),
    );
    (system, exchanges, tools, choice, knobs).prop_map(|(system, exchanges, tools, choice, knobs)| {
        let (max, temp, stop, stream, user, budget, top_p) = knobs;
        let mut r = Obj::new();
        r.insert("model".into(), json!("m"));
        if let Some(s) = system {
            r.insert("system".into(), s);
        }
        let mut messages = Vec::new();
        let mut pending_uses = 0usize;
        for (turn, (user, assistant, uses)) in exchanges.into_iter().enumerate() {
            let mut blocks = Vec::new();
            let results = user["results"].as_array().cloned().unwrap_or_default();
            for (i, c) in results.into_iter().take(pending_uses).enumerate() {
                blocks.push(json!({"type": "tool_result", "tool_use_id": format!("toolu_{}_{i}", turn.saturating_sub(1)), "content": c}));
            }
            blocks.extend(user["extra"].as_array().cloned().unwrap_or_default());
            let content = match (&user["string"], blocks.is_empty()) {
                (Value::String(s), true) => json!(s),
                (_, true) => json!("hello"),
                _ => Value::Array(blocks),
            };
            messages.push(json!({"role": "user", "content": content}));
            let mut assistant = assistant;
            if let Some(bs) = assistant.as_array_mut() {
                for b in bs {
                    if let Some(id) = b.get("id").and_then(Value::as_str) {
                        let id = id.replacen("toolu_", &format!("toolu_{turn}_"), 1);
                        b["id"] = json!(id);
                    }
                }
            }
            messages.push(json!({"role": "assistant", "content": assistant}));
            pending_uses = uses;
        }
        r.insert("messages".into(), Value::Array(messages));
        let max = if budget.is_some() { max + 16_385 } else { max };
        r.insert("max_tokens".into(), json!(max));
        if let Some(t) = temp {
            r.insert("temperature".into(), json!(f64::from(t) / 100.0));
        }
        if let Some(p) = top_p {
            r.insert("top_p".into(), json!(f64::from(p) / 100.0));
        }
        if let Some(s) = stop {
            r.insert("stop_sequences".into(), json!(s));
        }
        r.insert("stream".into(), json!(stream));
        if let Some(u) = user {
            r.insert("metadata".into(), json!({"user_id": u}));
        }
        if let Some(b) = budget {
            r.insert("thinking".into(), json!({"type": "enabled", "budget_tokens": b}));
        }
        if let Some(ts) = tools {
            let ts: Vec<Value> = ts
                .into_iter()
                .map(|(name, desc)| {
                    let mut t = json!({"name": name, "input_schema": {"type": "object", "properties": {}}});
                    if let Some(d) = desc {
                        t["description"] = json!(d);
                    }
                    t
                })
                .collect();
            r.insert("tools".into(), Value::Array(ts));
        }
        if let Some((mut c, no_parallel)) = choice {
            if no_parallel && c["type"] != "none" {
                c["disable_parallel_tool_use"] = json!(true);
            }
            r.insert("tool_choice".into(), c);
        }
        r
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn an_openai_request_survives_the_round_trip(req in openai_request()) {
        let (anthropic, include_usage) = chat_to_messages_obj(&req, "m").map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(include_usage, req.get("stream_options").is_some());
        let back = messages_to_chat_obj(&anthropic, "m").map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Value::Object(back), Value::Object(req));
    }

    #[test]
    fn an_anthropic_request_survives_the_round_trip(req in anthropic_request()) {
        let openai = messages_to_chat_obj(&req, "m").map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (back, _) = chat_to_messages_obj(&openai, "m").map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Value::Object(back), Value::Object(req));
    }

    #[test]
    fn an_anthropic_message_survives_the_round_trip(
        text in prop::option::of(text()),
        uses in prop::collection::vec((ident(), "[a-z]{0,5}"), 0..3),
        stop in prop_oneof![Just("end_turn"), Just("max_tokens"), Just("tool_use")],
        usage in (0u64..10_000, 0u64..10_000, 0u64..10_000, 0u64..10_000),
    ) {
        let mut content = Vec::new();
        if let Some(t) = text {
            content.push(json!({"type": "text", "text": t}));
        }
        for (i, (name, v)) in uses.into_iter().enumerate() {
            content.push(json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": name, "input": {"v": v}}));
        }
        let m = obj(json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": content, "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": usage.0, "output_tokens": usage.1,
                      "cache_read_input_tokens": usage.2, "cache_creation_input_tokens": usage.3}}));
        let c = message_to_completion_obj(&m, 7);
        let back = completion_to_message_obj(&obj(c));
        prop_assert_eq!(back, Value::Object(m));
    }

    #[test]
    fn an_openai_completion_survives_the_round_trip(
        text in prop::option::of(text()),
        calls in prop::collection::vec((ident(), "[a-z]{0,5}"), 0..3),
        finish in prop_oneof![Just("stop"), Just("length"), Just("tool_calls")],
        usage in (0u64..10_000, 0u64..10_000, 0u64..10_000),
    ) {
        let tool_calls: Vec<Value> = calls.iter().enumerate().map(|(i, (name, v))| json!({
            "id": format!("call_{i}"), "type": "function",
            "function": {"name": name, "arguments": json!({"v": v}).to_string()}})).collect();
        let mut message = json!({"role": "assistant", "content": text});
        if !tool_calls.is_empty() {
            message["tool_calls"] = Value::Array(tool_calls);
        }
        let (cached, prompt) = (usage.2.min(usage.0), usage.0);
        let c = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "gpt",
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": usage.1, "total_tokens": prompt + usage.1,
                      "prompt_tokens_details": {"cached_tokens": cached, "cache_creation_tokens": 0}}});
        let m = completion_to_message_obj(&obj(c.clone()));
        let back = message_to_completion_obj(&obj(m), 7);
        // An empty text has no Anthropic block: it comes back as null content.
        let mut want = c;
        if want["choices"][0]["message"]["content"] == json!("") {
            want["choices"][0]["message"]["content"] = Value::Null;
        }
        prop_assert_eq!(back, want);
    }
}

// --- refusals ------------------------------------------------------------------------------

fn refused_field_chat(req: Value) -> String {
    match chat_to_messages_obj(&obj(req), "m") {
        Err(r) => r.field,
        Ok(_) => "accepted".to_owned(),
    }
}

fn refused_field_messages(req: Value) -> String {
    match messages_to_chat_obj(&obj(req), "m") {
        Err(r) => r.field,
        Ok(_) => "accepted".to_owned(),
    }
}

#[test]
fn what_anthropic_cannot_express_is_refused_by_name() {
    let m = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": m, "seed": 1}), "seed"),
        (json!({"messages": m, "n": 2}), "n"),
        (json!({"messages": m, "logprobs": true}), "logprobs"),
        (json!({"messages": m, "temperature": 1.5}), "temperature"),
        (
            json!({"messages": m, "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"messages": m, "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]}),
            "messages[1].role",
        ),
        (
            json!({"messages": [{"role": "user", "name": "bob", "content": "a"}]}),
            "messages[0].name",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            json!({"messages": m, "reasoning_effort": "extreme"}),
            "reasoning_effort",
        ),
        (json!({}), "messages"),
    ];
    for (req, field) in cases {
        assert_eq!(refused_field_chat(req.clone()), field, "{req}");
    }
    // Defaults are accepted.
    assert_eq!(
        refused_field_chat(
            json!({"messages": m, "n": 1, "presence_penalty": 0, "store": false, "logprobs": false})
        ),
        "accepted"
    );
}

#[test]
fn what_openai_cannot_express_is_refused_by_name() {
    let m = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": m, "top_k": 3}), "top_k"),
        (
            json!({"messages": m, "metadata": {"tenant": "x"}}),
            "metadata.tenant",
        ),
        (
            json!({"messages": m, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]}),
            "messages[0].content[0].content[0].type",
        ),
        (
            json!({"messages": m, "thinking": {"type": "adaptive"}}),
            "thinking.type",
        ),
        (json!({"messages": m, "container": "c"}), "container"),
    ];
    for (req, field) in cases {
        assert_eq!(refused_field_messages(req.clone()), field, "{req}");
    }
}

#[test]
fn openai_defaults_and_documented_rules() {
    let (a, _) = chat_to_messages_obj(
        &obj(json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high", "max_tokens": 100})),
        "claude",
    )
    .unwrap_or_default();
    assert_eq!(a["max_tokens"], 16484, "the budget is added on top");
    assert_eq!(a["thinking"]["budget_tokens"], 16384);
    let (a, _) = chat_to_messages_obj(
        &obj(json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9, "stop": "X"})),
        "claude",
    )
    .unwrap_or_default();
    assert_eq!(a["max_tokens"], 9);
    assert_eq!(a["stop_sequences"], json!(["X"]));
    assert_eq!(a["model"], "claude");
}

// --- streams -------------------------------------------------------------------------------

fn anthropic_recording() -> Vec<u8> {
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [], "usage": {"input_tokens": 7, "output_tokens": 1, "cache_read_input_tokens": 3}}}),
        json!({"type": "ping"}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm, \"quoted\"\n"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Héllo ✓"}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"a\": "}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "[1]}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 20}}),
        json!({"type": "message_stop"}),
    ];
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        // Mixed line ends, as real upstreams and proxies produce them.
        let nl = if i % 3 == 0 { "\r\n" } else { "\n" };
        out.extend_from_slice(
            format!(
                "event: {}{nl}data: {e}{nl}{nl}",
                e["type"].as_str().unwrap_or("")
            )
            .as_bytes(),
        );
    }
    out
}

fn openai_recording() -> Vec<u8> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let events = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"reasoning_content": "think \"hard\""}), Value::Null),
        chunk(json!({"content": "Hé"}), Value::Null),
        chunk(json!({"content": "llo\n"}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt", "choices": [],
               "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 4}}}),
    ];
    let mut out = Vec::new();
    out.extend_from_slice(b": keep-alive\n\n");
    for e in events {
        out.extend_from_slice(format!("data: {e}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

fn translate(t: Translation, pieces: &[&[u8]]) -> Vec<u8> {
    let mut tr = StreamTranslator::new(t, true, 42);
    let mut out = Vec::new();
    for p in pieces {
        tr.feed(p, &mut out);
    }
    tr.finish(&mut out);
    out
}

fn every_split_gives_the_same_output(t: Translation, rec: &[u8]) -> Vec<u8> {
    let whole = translate(t, &[rec]);
    for i in 0..=rec.len() {
        let (a, b) = rec.split_at(i);
        assert_eq!(translate(t, &[a, b]), whole, "split at {i}");
    }
    let bytes: Vec<&[u8]> = rec.chunks(1).collect();
    assert_eq!(translate(t, &bytes), whole, "byte by byte");
    whole
}

fn events_of(out: &[u8]) -> Vec<(Option<String>, String)> {
    let text = String::from_utf8_lossy(out);
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut name = None;
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_owned();
                } else if line.starts_with(':') {
                    data = line.to_owned();
                }
            }
            (name, data)
        })
        .collect()
}

#[test]
fn an_anthropic_stream_translates_the_same_however_it_is_split() {
    let out =
        every_split_gives_the_same_output(Translation::ChatToMessages, &anthropic_recording());
    let events = events_of(&out);
    let chunks: Vec<Value> = events
        .iter()
        .filter(|(_, d)| d.starts_with('{'))
        .filter_map(|(_, d)| serde_json::from_str(d).ok())
        .collect();
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    let field = |f: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][f].as_str())
            .collect()
    };
    assert_eq!(field("content"), "Héllo ✓");
    assert_eq!(field("reasoning_content"), "Hmm, \"quoted\"\n");
    let args: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, "{\"a\": [1]}");
    let usage = chunks
        .last()
        .map(|c| c["usage"].clone())
        .unwrap_or_default();
    assert_eq!(usage["prompt_tokens"], 10);
    assert_eq!(usage["completion_tokens"], 20);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 3);
    assert!(
        chunks
            .iter()
            .all(|c| c["id"] == "msg_1" && c["created"] == 42)
    );
}

#[test]
fn an_openai_stream_translates_the_same_however_it_is_split() {
    let out = every_split_gives_the_same_output(Translation::MessagesToChat, &openai_recording());
    let events = events_of(&out);
    let names: Vec<&str> = events.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    let data: Vec<Value> = events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str(d).ok())
        .collect();
    let md = data
        .iter()
        .find(|d| d["type"] == "message_delta")
        .cloned()
        .unwrap_or_default();
    assert_eq!(md["delta"]["stop_reason"], "tool_use");
    assert_eq!(md["usage"]["input_tokens"], 6);
    assert_eq!(md["usage"]["cache_read_input_tokens"], 4);
    assert_eq!(md["usage"]["output_tokens"], 5);
}

#[test]
fn a_stream_cut_short_ends_with_an_error_in_the_clients_shape() {
    let rec = anthropic_recording();
    let cut = &rec[..rec.len() / 2];
    let out = translate(Translation::ChatToMessages, &[cut]);
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.ends_with("}}\n\n") && text.contains("data: {\"error\":"),
        "{text}"
    );
    assert!(!text.contains("[DONE]"));
    let rec = openai_recording();
    let cut = &rec[..rec.len() / 2];
    let mut tr = StreamTranslator::new(Translation::MessagesToChat, false, 0);
    let mut out = Vec::new();
    tr.feed(cut, &mut out);
    tr.finish(&mut out);
    assert!(tr.broken());
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("event: error\n"), "{text}");
    assert!(!text.contains("message_stop"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn any_chunking_of_a_recorded_stream_gives_the_same_output(
        cuts in prop::collection::vec(0usize..4000, 0..12),
        which in any::<bool>(),
    ) {
        let (t, rec) = if which {
            (Translation::ChatToMessages, anthropic_recording())
        } else {
            (Translation::MessagesToChat, openai_recording())
        };
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (rec.len() + 1)).collect();
        cuts.sort_unstable();
        let mut pieces: Vec<&[u8]> = Vec::new();
        let mut at = 0;
        for c in cuts {
            pieces.push(&rec[at..c]);
            at = c;
        }
        pieces.push(&rec[at..]);
        prop_assert_eq!(translate(t, &pieces), translate(t, &[&rec]));
    }
}
