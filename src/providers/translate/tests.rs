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

/// A JSON schema for structured output: an object of a few typed properties.
fn json_schema() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        ident(),
        prop_oneof![Just("string"), Just("number"), Just("boolean")],
        1..4,
    )
    .prop_map(|props| {
        let names: Vec<&String> = props.keys().collect();
        let properties: Obj = props
            .iter()
            .map(|(k, t)| (k.clone(), json!({"type": t})))
            .collect();
        json!({"type": "object", "properties": properties, "required": names,
            "additionalProperties": false})
    })
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
    // Structured output: the schema with a name and strictness Anthropic does not carry.
    let format = prop::option::of((json_schema(), ident(), prop::option::of(any::<bool>())));
    (system, exchanges, tools, choice, (knobs, format)).prop_map(
        |(system, exchanges, tools, choice, (knobs, format))| {
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
            if let Some((schema, name, strict)) = format {
                let mut s = json!({"name": name, "schema": schema});
                if let Some(b) = strict {
                    s["strict"] = json!(b);
                }
                r.insert("response_format".into(), json!({"type": "json_schema", "json_schema": s}));
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
    let format = prop::option::of(json_schema());
    (system, exchanges, tools, choice, (knobs, format)).prop_map(|(system, exchanges, tools, choice, (knobs, format))| {
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
        if let Some(schema) = format {
            r.insert("output_config".into(), json!({"format": {"type": "json_schema", "schema": schema}}));
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
        // A json_schema format's name and strictness have no Anthropic counterpart: the
        // schema comes back under the name "output", strict (as Anthropic follows it).
        let mut req = req;
        if let Some(s) = req.get_mut("response_format").and_then(|f| f.get_mut("json_schema")) {
            s["name"] = json!("output");
            s["strict"] = json!(true);
        }
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
        reasoning in prop::option::of(text()),
        calls in prop::collection::vec((ident(), "[a-z]{0,5}"), 0..3),
        finish in prop_oneof![Just("stop"), Just("length"), Just("tool_calls")],
        usage in (0u64..10_000, 0u64..10_000, 0u64..10_000),
    ) {
        let tool_calls: Vec<Value> = calls.iter().enumerate().map(|(i, (name, v))| json!({
            "id": format!("call_{i}"), "type": "function",
            "function": {"name": name, "arguments": json!({"v": v}).to_string()}})).collect();
        let mut message = json!({"role": "assistant", "content": text});
        // Reasoning goes out as a thinking block (empty signature) and comes back.
        if let Some(r) = reasoning {
            message["reasoning_content"] = json!(r);
        }
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
            json!({"messages": m, "response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "description": "d", "schema": {}}}}),
            "response_format.json_schema.description",
        ),
        (
            json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}}),
            "response_format.json_schema.strict",
        ),
        (
            json!({"messages": m, "response_format": {"type": "json_schema", "json_schema": {"schema": true}}}),
            "response_format.json_schema.schema",
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
            json!({"messages": m, "thinking": {"type": "sometimes"}}),
            "thinking.type",
        ),
        (
            json!({"messages": m, "output_config": {"effort": "extreme"}}),
            "output_config.effort",
        ),
        (
            json!({"messages": m, "output_config": {"format": {"type": "json_schema", "schema": {}, "name": "x"}}}),
            "output_config.format.name",
        ),
        (
            json!({"messages": m, "output_config": {"format": {"type": "json_object"}}}),
            "output_config.format.type",
        ),
        (
            json!({"messages": m, "output_config": {"format": {"type": "json_schema"}}}),
            "output_config.format.schema",
        ),
        (
            json!({"messages": m, "output_config": {"task_budget": 5}}),
            "output_config.task_budget",
        ),
        (
            json!({"messages": m, "context_management": {"edits": [{"type": "clear_thinking_20251015"}, {"type": "clear_tool_uses_20250919"}]}}),
            "context_management.edits[1].type",
        ),
        (
            json!({"messages": [{"role": "system", "content": [{"type": "image", "source": {}}]}]}),
            "messages[0].content[0].type",
        ),
        (json!({"messages": m, "container": "c"}), "container"),
    ];
    for (req, field) in cases {
        assert_eq!(refused_field_messages(req.clone()), field, "{req}");
    }
}

/// What Anthropic's own API refuses is refused on the way to an OpenAI provider too: a
/// request without `max_tokens`, an assistant thinking block without its signature.
#[test]
fn what_anthropic_itself_refuses_is_refused_for_openai_too() {
    let with = |extra: Value| {
        let mut v = json!({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        for (k, x) in extra.as_object().into_iter().flatten() {
            v[k] = x.clone();
        }
        v
    };
    let mut no_max = with(json!({}));
    no_max.as_object_mut().map(|o| o.remove("max_tokens"));
    assert_eq!(refused_field_messages(no_max), "max_tokens");
    assert_eq!(
        refused_field_messages(with(json!({"max_tokens": null}))),
        "max_tokens"
    );
    let history = |block: Value| {
        with(json!({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "again"}
        ]}))
    };
    for (block, field) in [
        // Signed by Anthropic, or by the gateway's own translated answer (empty): dropped.
        (
            json!({"type": "thinking", "thinking": "t", "signature": "EqQB"}),
            "accepted",
        ),
        (
            json!({"type": "thinking", "thinking": "t", "signature": ""}),
            "accepted",
        ),
        (
            json!({"type": "redacted_thinking", "data": "x"}),
            "accepted",
        ),
        (
            json!({"type": "thinking", "thinking": "t"}),
            "messages[1].content[0].signature",
        ),
        (
            json!({"type": "thinking", "thinking": "t", "signature": null}),
            "messages[1].content[0].signature",
        ),
        (
            json!({"type": "thinking", "signature": "s"}),
            "messages[1].content[0].thinking",
        ),
        (
            json!({"type": "redacted_thinking"}),
            "messages[1].content[0].data",
        ),
    ] {
        assert_eq!(
            refused_field_messages(history(block.clone())),
            field,
            "{block}"
        );
    }
    let out = messages_to_chat_obj(
        &obj(history(
            json!({"type": "thinking", "thinking": "t", "signature": ""}),
        )),
        "m",
    )
    .unwrap_or_default();
    assert_eq!(
        out["messages"][1],
        json!({"role": "assistant", "content": [{"type": "text", "text": "Hello."}]})
    );
}

#[test]
fn anthropic_structured_output_becomes_a_strict_json_schema_response_format() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
        "required": ["a"], "additionalProperties": false});
    let out = messages_to_chat_obj(
        &obj(json!({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}],
            "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": schema}}})),
        "m",
    )
    .unwrap_or_default();
    assert_eq!(
        out.get("response_format"),
        Some(
            &json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": true}})
        )
    );
    assert_eq!(out["reasoning_effort"], "low");
}

#[test]
fn an_openai_json_schema_becomes_anthropic_structured_output() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
        "required": ["a"], "additionalProperties": false});
    for strict in [json!(true), json!(false), json!(null)] {
        let (out, _) = chat_to_messages_obj(
            &obj(json!({"messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": strict}}})),
            "m",
        )
        .unwrap_or_default();
        assert_eq!(
            out.get("output_config"),
            Some(&json!({"format": {"type": "json_schema", "schema": schema}})),
            "strict {strict}"
        );
    }
    let (out, _) = chat_to_messages_obj(
        &obj(json!({"messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "text"}})),
        "m",
    )
    .unwrap_or_default();
    assert!(out.contains_key("messages") && !out.contains_key("output_config"));
}

#[test]
fn claude_code_effort_and_late_system_messages_reach_openai() {
    let req = |extra: Value| {
        let mut v = json!({"max_tokens": 100, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "late", "cache_control": {"type": "ephemeral"}}]}
        ], "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        messages_to_chat_obj(&obj(v), "m").unwrap()
    };
    let out = req(json!({"thinking": {"type": "adaptive"}}));
    assert_eq!(out.get("reasoning_effort"), None);
    assert_eq!(
        out["messages"][1],
        json!({"role": "system", "content": [{"type": "text", "text": "late"}]})
    );
    assert_eq!(out.get("context_management"), None);
    let out = req(json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}));
    assert_eq!(out["reasoning_effort"], "high");
    let out = req(json!({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}));
    assert_eq!(out["reasoning_effort"], "high");
    // An explicit effort wins over a thinking budget, whichever comes first.
    let out = req(json!({"output_config": {"effort": "low"},
        "thinking": {"type": "enabled", "budget_tokens": 30000}}));
    assert_eq!(out["reasoning_effort"], "low");
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
        &obj(json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "xhigh"})),
        "claude",
    )
    .unwrap_or_default();
    assert_eq!(a["thinking"]["budget_tokens"], 32768);
    assert_eq!(a["max_tokens"], 4096 + 32768, "the budget is added on top");
    // Back to OpenAI the largest budget is `high`, which every reasoning model takes.
    let back = messages_to_chat_obj(&a, "gpt").unwrap_or_default();
    assert_eq!(back["reasoning_effort"], "high");
    let (a, _) = chat_to_messages_obj(
        &obj(json!({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9, "stop": "X"})),
        "claude",
    )
    .unwrap_or_default();
    assert_eq!(a["max_tokens"], 9);
    assert_eq!(a["stop_sequences"], json!(["X"]));
    assert_eq!(a["model"], "claude");
}

#[test]
fn chat_parts_and_tools_follow_the_documented_cache_control_and_image_rules() {
    let cc = json!({"type": "ephemeral"});
    let (a, _) = chat_to_messages_obj(
        &obj(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a", "cache_control": cc},
            {"type": "image_url", "image_url": {"url": "https://x.example/i.png", "detail": "high"}},
            {"type": "image_url", "image_url": {"url": "data:image/webp;base64,AAAA"}}]}],
            "tools": [{"type": "function", "cache_control": cc,
                "function": {"name": "f", "strict": false}}]})),
        "m",
    )
    .unwrap_or_default();
    let blocks = &a["messages"][0]["content"];
    assert_eq!(
        blocks[0],
        json!({"type": "text", "text": "a", "cache_control": cc}),
        "passed through"
    );
    assert_eq!(
        blocks[1],
        json!({"type": "image", "source": {"type": "url", "url": "https://x.example/i.png"}}),
        "detail dropped"
    );
    assert_eq!(
        blocks[2]["source"],
        json!({"type": "base64", "media_type": "image/webp", "data": "AAAA"})
    );
    assert_eq!(
        a["tools"][0],
        json!({"name": "f", "input_schema": {"type": "object", "properties": {}}, "cache_control": cc})
    );
    let user = |part: Value| json!({"messages": [{"role": "user", "content": [part]}]});
    assert_eq!(
        refused_field_chat(user(
            json!({"type": "image_url", "image_url": {"url": "data:text/plain,hi"}})
        )),
        "messages[0].content[0].image_url.url"
    );
    assert_eq!(
        refused_field_chat(json!({"messages": [{"role": "user", "content": "a"}],
            "tools": [{"type": "function", "function": {"name": "f", "strict": true}}]})),
        "tools[0].function.strict"
    );
    assert_eq!(
        refused_field_chat(user(json!({"type": "file", "file": {}}))),
        "messages[0].content[0].type"
    );
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

/// Where the upstream body may end: `incomplete` (an end there breaks the client's stream,
/// which mid-stream continuation takes as a cut) holds until the upstream's finish (an
/// Anthropic stop reason, an OpenAI `finish_reason`), for each direction.
#[test]
fn a_stream_is_incomplete_until_the_upstream_finishes() {
    let cases = [
        (
            Translation::ChatToMessages,
            anthropic_recording(),
            "message_delta",
        ),
        (
            Translation::ResponsesToMessages,
            anthropic_recording(),
            "message_delta",
        ),
        (
            Translation::MessagesToChat,
            openai_recording(),
            "\"finish_reason\":\"tool_calls\"",
        ),
        (
            Translation::ResponsesToChat,
            openai_recording(),
            "\"finish_reason\":\"tool_calls\"",
        ),
    ];
    for (t, rec, finish) in cases {
        let text = String::from_utf8_lossy(&rec).into_owned();
        // The end of the event that carries the finish.
        let at = text.find(finish).unwrap_or_else(|| panic!("{t:?}"));
        let end = at + text[at..].find("\n\n").unwrap_or(0) + 2;
        let mut tr = StreamTranslator::new(t, true, 0);
        let mut out = Vec::new();
        assert!(tr.incomplete(), "{t:?} before anything");
        tr.feed(&rec[..end - 3], &mut out);
        assert!(tr.incomplete(), "{t:?} before the finish");
        tr.feed(&rec[end - 3..end], &mut out);
        assert!(!tr.incomplete(), "{t:?} after the finish");
        tr.feed(&rec[end..], &mut out);
        assert!(
            !tr.incomplete() && tr.ended() && !tr.broken(),
            "{t:?} at the end"
        );
    }
}

#[test]
fn an_upstream_error_event_mid_stream_reaches_the_client_in_its_shape_however_split() {
    // Anthropic `event: error` after some text → an OpenAI `{"error":…}` chunk, no [DONE].
    let mut rec = anthropic_recording();
    let cut = rec
        .windows(b"event: content_block_start".len())
        .rposition(|w| w == b"event: content_block_start")
        .unwrap_or(rec.len());
    rec.truncate(cut);
    rec.extend_from_slice(
        b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    let out = every_split_gives_the_same_output(Translation::ChatToMessages, &rec);
    let events = events_of(&out);
    let last: Value = events
        .last()
        .and_then(|(_, d)| serde_json::from_str(d).ok())
        .unwrap_or_default();
    assert_eq!(last["error"]["message"], "Overloaded", "{events:?}");
    assert_eq!(last["error"]["type"], "server_error");
    assert!(!String::from_utf8_lossy(&out).contains("[DONE]"));
    // An OpenAI `{"error":…}` chunk after some content → an Anthropic `event: error`, no
    // message_stop.
    let mut rec = openai_recording();
    let cut = rec
        .windows(b"tool_calls".len())
        .position(|w| w == b"tool_calls")
        .and_then(|p| rec[..p].windows(6).rposition(|w| w == b"data: "))
        .unwrap_or(rec.len());
    rec.truncate(cut);
    rec.extend_from_slice(
        b"data: {\"error\":{\"message\":\"quota gone\",\"type\":\"server_error\"}}\n\n",
    );
    let out = every_split_gives_the_same_output(Translation::MessagesToChat, &rec);
    let events = events_of(&out);
    let (name, data) = events.last().cloned().unwrap_or_default();
    assert_eq!(name.as_deref(), Some("error"), "{events:?}");
    let data: Value = serde_json::from_str(&data).unwrap_or_default();
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["message"], "quota gone");
    assert!(!String::from_utf8_lossy(&out).contains("message_stop"));
}

#[test]
fn error_bodies_are_reshaped_by_the_documented_maps() {
    use super::error::reshape;
    let anthropic = |t: &str| {
        format!(r#"{{"type":"error","error":{{"type":"{t}","message":"m"}}}}"#).into_bytes()
    };
    let to_openai = |body: &[u8], status: u16| -> Value {
        serde_json::from_slice(&reshape(body, status, Translation::ChatToMessages))
            .unwrap_or_default()
    };
    let v = to_openai(&anthropic("overloaded_error"), 529);
    assert_eq!(
        v,
        json!({"error": {"message": "m", "type": "server_error", "param": null, "code": "overloaded_error"}})
    );
    assert_eq!(
        to_openai(&anthropic("api_error"), 500)["error"]["type"],
        "server_error"
    );
    assert_eq!(
        to_openai(&anthropic("rate_limit_error"), 429)["error"]["type"],
        "rate_limit_error"
    );
    assert_eq!(
        to_openai(b"gateway timeout", 504)["error"]["message"],
        "gateway timeout"
    );
    let openai = br#"{"error":{"message":"m","type":"x","code":null}}"#;
    for (status, t) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (529, "overloaded_error"),
        (500, "api_error"),
        (503, "api_error"),
    ] {
        let v: Value =
            serde_json::from_slice(&reshape(openai, status, Translation::MessagesToChat))
                .unwrap_or_default();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": t, "message": "m"}}),
            "{status}"
        );
    }
    let v: Value = serde_json::from_slice(&reshape(
        b"<html>bad gateway</html>",
        502,
        Translation::MessagesToChat,
    ))
    .unwrap_or_default();
    assert_eq!(v["error"]["message"], "<html>bad gateway</html>");
}

/// An OpenAI-format provider's in-band stream error reaches an Anthropic client as the
/// `error` event of the Anthropic type its code or type corresponds to.
#[test]
fn an_in_band_openai_stream_error_gets_the_corresponding_anthropic_type() {
    let cases = [
        (
            json!({"message": "m", "type": "tokens", "code": "rate_limit_exceeded"}),
            "rate_limit_error",
        ),
        (
            json!({"message": "m", "type": "requests", "code": null}),
            "rate_limit_error",
        ),
        (
            json!({"message": "m", "type": "insufficient_quota", "code": "insufficient_quota"}),
            "billing_error",
        ),
        (
            json!({"message": "m", "type": "invalid_request_error", "code": "invalid_api_key"}),
            "authentication_error",
        ),
        (
            json!({"message": "m", "type": "invalid_request_error", "code": "model_not_found"}),
            "not_found_error",
        ),
        (
            json!({"message": "m", "type": "invalid_request_error", "code": "context_length_exceeded"}),
            "invalid_request_error",
        ),
        (
            json!({"message": "m", "type": "invalid_request_error", "param": "x", "code": null}),
            "invalid_request_error",
        ),
        (
            json!({"message": "m", "type": "server_error", "code": "server_is_overloaded"}),
            "overloaded_error",
        ),
        (
            json!({"message": "m", "type": "server_error", "code": null}),
            "api_error",
        ),
        (
            json!({"message": "m", "type": "permission_error", "code": "unsupported_country_region_territory"}),
            "permission_error",
        ),
        // OpenAI-compatible servers: vLLM's status code, LiteLLM's as a string, an
        // Anthropic type passed on.
        (
            json!({"message": "m", "type": "BadRequestError", "code": 400}),
            "invalid_request_error",
        ),
        (
            json!({"message": "m", "type": "None", "code": "429"}),
            "rate_limit_error",
        ),
        (
            json!({"message": "m", "type": "overloaded_error"}),
            "overloaded_error",
        ),
        (
            json!({"message": "m", "type": "mystery", "code": "odd"}),
            "api_error",
        ),
        (json!({"message": "m"}), "api_error"),
    ];
    for (err, want) in cases {
        let hi = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]});
        let rec = format!("data: {hi}\n\ndata: {}\n\n", json!({ "error": err }));
        let out = translate(Translation::MessagesToChat, &[rec.as_bytes()]);
        let text = String::from_utf8_lossy(&out);
        let last = text
            .rsplit("event: error\ndata: ")
            .next()
            .unwrap_or_default();
        let v: Value = serde_json::from_str(last.trim()).unwrap_or_default();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": want, "message": "m"}}),
            "{err}: {text}"
        );
        assert!(!text.contains("message_stop"), "{text}");
    }
    // A bare string error is the message.
    let out = translate(
        Translation::MessagesToChat,
        &[b"data: {\"error\":\"no capacity\"}\n\n"],
    );
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.ends_with("{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"no capacity\"}}\n\n"),
        "{text}"
    );
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

// --- the Responses API ---------------------------------------------------------------------

mod responses {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::Translation;
    use super::super::responses::{Echo, to_chat, translate_answer, translate_request, two_step};
    use super::super::stream::StreamTranslator;
    use super::{anthropic_recording, events_of, image_url, obj, openai_recording, text};

    /// A request as Codex sends one: instructions, a conversation with a function call and
    /// its output, function tools, reasoning, no storage.
    fn codex_request() -> Value {
        json!({
            "model": "whatever",
            "instructions": "You are a coding agent.",
            "input": [
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "List the files."},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
                ]},
                {"type": "reasoning", "id": "rs_0", "summary": [], "encrypted_content": "opaque"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a.rs\nb.rs"},
                {"role": "user", "content": "Thanks"}
            ],
            "tools": [{"type": "function", "name": "shell", "description": "Run a command",
                       "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
                       "strict": false}],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "max_output_tokens": 1000,
            "temperature": 0.2,
            "top_p": 0.9,
            "store": false,
            "stream": true,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "session-1"
        })
    }

    #[test]
    fn a_codex_request_becomes_a_chat_completions_request() {
        let (chat, _) = to_chat(&obj(codex_request()), "gpt-x", false).expect("translates");
        let chat = Value::Object(chat);
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": [
                    {"type": "text", "text": "List the files."},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
                ]},
                {"role": "assistant", "content": [{"type": "text", "text": "Looking."}], "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"ls\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a.rs\nb.rs"},
                {"role": "user", "content": "Thanks"}
            ])
        );
        assert_eq!(chat["model"], "gpt-x");
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "shell", "description": "Run a command",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "strict": false}}])
        );
        assert_eq!(chat["tool_choice"], "auto");
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(chat["reasoning_effort"], "medium");
        assert_eq!(chat["max_tokens"], 1000);
        assert_eq!(chat["temperature"], 0.2);
        assert_eq!(chat["top_p"], 0.9);
        assert_eq!(chat["stream"], true);
        assert_eq!(chat["stream_options"], json!({"include_usage": true}));
        assert_eq!(chat["prompt_cache_key"], "session-1");
    }

    #[test]
    fn a_codex_request_reaches_an_anthropic_provider() {
        let body = serde_json::to_vec(&codex_request()).unwrap_or_default();
        let (out, _) = translate_request(&body, "claude-x", true).expect("translates");
        let m: Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(m["model"], "claude-x");
        assert_eq!(m["system"], "You are a coding agent.");
        assert_eq!(m["messages"][0]["content"][1]["type"], "image");
        assert_eq!(m["messages"][1]["content"][1]["type"], "tool_use");
        assert_eq!(m["messages"][1]["content"][1]["id"], "call_1");
        assert_eq!(
            m["messages"][1]["content"][1]["input"],
            json!({"cmd": "ls"})
        );
        assert_eq!(m["messages"][2]["content"][0]["type"], "tool_result");
        assert_eq!(m["messages"][2]["content"][0]["tool_use_id"], "call_1");
        assert_eq!(
            m["messages"][2]["content"][1],
            json!({"type": "text", "text": "Thanks"})
        );
        assert_eq!(
            m["thinking"],
            json!({"type": "enabled", "budget_tokens": 4096})
        );
        assert_eq!(m["max_tokens"], 5096);
        assert_eq!(
            m["tool_choice"],
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
        assert!(m.get("prompt_cache_key").is_none());
        assert_eq!(m["stream"], true);
    }

    #[test]
    fn a_json_schema_text_format_reaches_anthropic_as_structured_output() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let mut req = codex_request();
        req["text"] = json!({"format": {"type": "json_schema", "name": "s", "schema": schema, "strict": true}});
        let body = serde_json::to_vec(&req).unwrap_or_default();
        let (out, _) = translate_request(&body, "claude-x", true).expect("translates");
        let m: Value = serde_json::from_slice(&out).unwrap_or_default();
        assert_eq!(
            m["output_config"],
            json!({"format": {"type": "json_schema", "schema": schema}})
        );
        assert!(m.get("response_format").is_none());
        // The oracle agrees.
        let (two, _) = two_step::translate_request(&body, "claude-x", true).expect("translates");
        assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&two));
    }

    fn refused(req: Value, anthropic: bool) -> String {
        match to_chat(&obj(req), "m", anthropic) {
            Ok(_) => "accepted".to_owned(),
            Err(r) => r.field,
        }
    }

    #[test]
    fn what_cannot_be_translated_is_refused_by_name() {
        let base = || json!({"model": "m", "input": "hi"});
        let with = |k: &str, v: Value| {
            let mut r = base();
            r[k] = v;
            r
        };
        for anthropic in [false, true] {
            assert_eq!(refused(base(), anthropic), "accepted");
            assert_eq!(
                refused(with("previous_response_id", json!("resp_1")), anthropic),
                "previous_response_id"
            );
            assert_eq!(refused(with("store", json!(true)), anthropic), "store");
            assert_eq!(
                refused(with("tools", json!([{"type": "web_search"}])), anthropic),
                "tools[0].type"
            );
            assert_eq!(
                refused(
                    with("include", json!(["file_search_call.results"])),
                    anthropic
                ),
                "include[0]"
            );
            assert_eq!(
                refused(
                    with("input", json!([{"type": "item_reference", "id": "x"}])),
                    anthropic
                ),
                "input[0].type"
            );
            assert_eq!(
                refused(
                    with(
                        "input",
                        json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])
                    ),
                    anthropic
                ),
                "input[0].content[0].type"
            );
            assert_eq!(
                refused(
                    with("input", json!([{"type": "function_call", "name": "f"}])),
                    anthropic
                ),
                "input[0].call_id"
            );
            assert_eq!(
                refused(
                    with("reasoning", json!({"effort": "low", "mode": "x"})),
                    anthropic
                ),
                "reasoning.mode"
            );
            assert_eq!(
                refused(with("top_logprobs", json!(2)), anthropic),
                "top_logprobs"
            );
        }
        // What only an Anthropic provider cannot honour.
        let strict = json!([{"type": "function", "name": "f", "strict": true}]);
        assert_eq!(refused(with("tools", strict.clone()), false), "accepted");
        assert_eq!(refused(with("tools", strict), true), "tools[0].strict");
        let json_mode = json!({"format": {"type": "json_object"}});
        assert_eq!(refused(with("text", json_mode.clone()), false), "accepted");
        assert_eq!(refused(with("text", json_mode), true), "text.format");
        let schema = |extra: Value| {
            let mut f = json!({"type": "json_schema", "name": "s", "schema": {"type": "object"}});
            for (k, v) in extra.as_object().into_iter().flatten() {
                f[k] = v.clone();
            }
            json!({"format": f})
        };
        // To a Chat Completions provider OpenAI's members go on; another is refused, named.
        for (extra, field) in [
            (json!({"strict": true, "description": "d"}), "accepted"),
            (json!({"x": 1}), "text.format.x"),
            (json!({"x": null}), "accepted"),
        ] {
            assert_eq!(
                refused(with("text", schema(extra.clone())), false),
                field,
                "{extra}"
            );
        }
        for (extra, field) in [
            (json!({"x": 1}), "text.format.x"),
            (json!({"strict": false}), "accepted"),
            (json!({"description": "d"}), "text.format.description"),
            (json!({"strict": 1}), "text.format.strict"),
            (json!({"schema": null}), "text.format.schema"),
            (json!({"schema": "s"}), "text.format.schema"),
            (json!({"name": 2}), "text.format.name"),
        ] {
            assert_eq!(
                refused(with("text", schema(extra.clone())), true),
                field,
                "{extra}"
            );
        }
        assert_eq!(
            refused(with("temperature", json!(1.5)), true),
            "temperature"
        );
        assert_eq!(
            refused(with("reasoning", json!({"effort": "xhigh"})), true),
            "accepted"
        );
        assert_eq!(
            refused(with("reasoning", json!({"effort": "max"})), true),
            "reasoning.effort"
        );
        let late_system =
            json!([{"role": "user", "content": "a"}, {"role": "developer", "content": "b"}]);
        assert_eq!(
            refused(with("input", late_system.clone()), false),
            "accepted"
        );
        assert_eq!(refused(with("input", late_system), true), "input[1].role");
    }

    #[test]
    fn a_complete_answer_becomes_a_responses_object() {
        let (_, echo) = to_chat(&obj(codex_request()), "m", false).expect("translates");
        let completion = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x-1",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
                "content": "Running it.", "reasoning_content": "They want ls.",
                "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "shell", "arguments": "{\"cmd\":\"ls\"}"}}]}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
                      "prompt_tokens_details": {"cached_tokens": 5}}});
        let body = serde_json::to_vec(&completion).unwrap_or_default();
        let r: Value =
            serde_json::from_slice(&translate_answer(&body, false, &echo, 77).expect("json"))
                .unwrap_or_default();
        assert_eq!(r["object"], "response");
        assert_eq!(r["id"], "resp_chatcmpl-1");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["model"], "gpt-x-1");
        assert_eq!(r["created_at"], 77);
        assert_eq!(r["output"][0]["type"], "reasoning");
        assert_eq!(r["output"][0]["summary"][0]["text"], "They want ls.");
        assert_eq!(r["output"][1]["type"], "message");
        assert_eq!(r["output"][1]["content"][0]["text"], "Running it.");
        assert_eq!(r["output"][2]["type"], "function_call");
        assert_eq!(r["output"][2]["call_id"], "call_9");
        assert_eq!(r["output"][2]["arguments"], "{\"cmd\":\"ls\"}");
        assert_eq!(r["usage"]["input_tokens"], 20);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 5);
        assert_eq!(r["usage"]["output_tokens"], 7);
        assert_eq!(r["usage"]["total_tokens"], 27);
        // The request's settings are repeated.
        assert_eq!(r["instructions"], "You are a coding agent.");
        assert_eq!(r["tools"][0]["name"], "shell");
        assert_eq!(r["parallel_tool_calls"], false);
        assert_eq!(r["max_output_tokens"], 1000);
        // An Anthropic message, cut at max_tokens.
        let message = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "thinking", "thinking": "Hm.", "signature": "s"}, {"type": "text", "text": "Part"}],
            "stop_reason": "max_tokens", "usage": {"input_tokens": 3, "output_tokens": 9, "cache_read_input_tokens": 2}});
        let body = serde_json::to_vec(&message).unwrap_or_default();
        let r: Value = serde_json::from_slice(
            &translate_answer(&body, true, &Echo::default(), 1).expect("json"),
        )
        .unwrap_or_default();
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["output"][0]["summary"][0]["text"], "Hm.");
        assert_eq!(r["output"][1]["content"][0]["text"], "Part");
        assert_eq!(r["usage"]["input_tokens"], 5);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 2);
        assert_eq!(r["tools"], json!([]));
        assert!(translate_answer(b"[1]", false, &Echo::default(), 1).is_err());
    }

    fn run(t: Translation, pieces: &[&[u8]]) -> Vec<u8> {
        let mut tr = StreamTranslator::new(t, false, 42);
        let mut out = Vec::new();
        for p in pieces {
            tr.feed(p, &mut out);
        }
        tr.finish(&mut out);
        assert!(tr.ended());
        out
    }

    fn every_split(t: Translation, rec: &[u8]) -> Vec<(String, Value)> {
        let whole = run(t, &[rec]);
        for i in 0..=rec.len() {
            let (a, b) = rec.split_at(i);
            assert_eq!(run(t, &[a, b]), whole, "split at {i}");
        }
        let bytes: Vec<&[u8]> = rec.chunks(1).collect();
        assert_eq!(run(t, &bytes), whole, "byte by byte");
        events_of(&whole)
            .into_iter()
            .map(|(n, d)| {
                let v: Value = serde_json::from_str(&d).unwrap_or_default();
                assert_eq!(n.as_deref(), v["type"].as_str(), "{d}");
                (n.unwrap_or_default(), v)
            })
            .collect()
    }

    /// What the OpenAI SDK's stream state checks: sequence numbers count up, every content
    /// event names an item added before it, `response.completed` carries every finished item.
    fn check_sdk_invariants(events: &[(String, Value)]) -> Value {
        assert_eq!(events[0].0, "response.created");
        let id = events[0].1["response"]["id"].clone();
        let mut added: Vec<Value> = Vec::new();
        for (n, (name, e)) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], n, "{name}");
            if name.starts_with("response.") && e.get("response").is_some() {
                assert_eq!(e["response"]["id"], id);
            }
            if name == "response.output_item.added" {
                assert_eq!(e["output_index"], added.len());
                added.push(e["item"].clone());
            } else if let Some(i) = e["output_index"].as_u64() {
                let item = &added[i as usize];
                if let Some(item_id) = e.get("item_id") {
                    assert_eq!(item_id, &item["id"], "{name}");
                }
                if name == "response.output_item.done" {
                    assert_eq!(e["item"]["id"], item["id"]);
                }
            }
        }
        let (last, done) = events.last().cloned().unwrap_or_default();
        assert_eq!(last, "response.completed");
        let output = done["response"]["output"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(output.len(), added.len());
        for (a, o) in added.iter().zip(&output) {
            assert_eq!(a["id"], o["id"]);
        }
        done["response"].clone()
    }

    #[test]
    fn a_chat_stream_becomes_responses_events_however_it_is_split() {
        let events = every_split(Translation::ResponsesToChat, &openai_recording());
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let r = check_sdk_invariants(&events);
        assert_eq!(r["status"], "completed");
        assert_eq!(r["model"], "gpt");
        assert_eq!(r["created_at"], 42);
        assert_eq!(r["output"][0]["summary"][0]["text"], "think \"hard\"");
        assert_eq!(r["output"][1]["content"][0]["text"], "Héllo\n");
        assert_eq!(r["output"][2]["call_id"], "call_1");
        assert_eq!(r["output"][2]["arguments"], "{\"a\":1}");
        assert_eq!(r["output"][3]["name"], "g");
        assert_eq!(r["usage"]["input_tokens"], 10);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
        assert_eq!(r["usage"]["output_tokens"], 5);
    }

    #[test]
    fn an_anthropic_stream_becomes_responses_events_however_it_is_split() {
        let events = every_split(Translation::ResponsesToMessages, &anthropic_recording());
        let r = check_sdk_invariants(&events);
        assert_eq!(r["id"], "resp_msg_1");
        assert_eq!(r["model"], "claude");
        assert_eq!(r["output"][0]["type"], "reasoning");
        assert_eq!(r["output"][0]["summary"][0]["text"], "Hmm, \"quoted\"\n");
        assert_eq!(r["output"][1]["content"][0]["text"], "Héllo ✓");
        assert_eq!(r["output"][2]["call_id"], "toolu_1");
        assert_eq!(r["output"][2]["arguments"], "{\"a\": [1]}");
        // Anthropic's input excludes cache reads; Responses' includes them.
        assert_eq!(r["usage"]["input_tokens"], 10);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 3);
        assert_eq!(r["usage"]["output_tokens"], 20);
    }

    /// Codex's default tools: function tools, the multi-agent `namespace` of function tools
    /// (as Codex CLI 0.171.0 sends it), and the hosted web search.
    fn codex_tools(web_search: bool) -> Value {
        let f = |name: &str| {
            json!({"type": "function", "name": name, "description": format!("{name} it"), "strict": false,
                   "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}})
        };
        let mut tools = vec![
            f("exec_command"),
            json!({"type": "namespace", "name": "multi_agent_v1",
                   "description": "Tools for spawning and managing sub-agents.",
                   "tools": [f("spawn_agent"), f("close_agent")]}),
            f("get_goal"),
        ];
        if web_search {
            tools.push(json!({"type": "web_search", "external_web_access": true}));
        }
        Value::Array(tools)
    }

    fn with_tools(tools: Value) -> serde_json::Map<String, Value> {
        let mut r = codex_request();
        r["tools"] = tools;
        obj(r)
    }

    #[test]
    fn a_namespace_tool_is_offered_as_flat_function_tools() {
        for anthropic in [false, true] {
            let (chat, _) =
                to_chat(&with_tools(codex_tools(false)), "m", anthropic).expect("translates");
            let names: Vec<&str> = chat["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap())
                .collect();
            assert_eq!(
                names,
                [
                    "exec_command",
                    "multi_agent_v1__spawn_agent",
                    "multi_agent_v1__close_agent",
                    "get_goal"
                ]
            );
            let spawn = &chat["tools"][1]["function"];
            assert_eq!(
                spawn["description"],
                "Tools for spawning and managing sub-agents.\n\nspawn_agent it"
            );
            assert_eq!(
                spawn["parameters"]["properties"]["target"]["type"],
                "string"
            );
        }
        // Through to an Anthropic request: the flat names are valid tool names there too.
        let mut req = codex_request();
        req["tools"] = codex_tools(false);
        let body = serde_json::to_vec(&req).unwrap();
        let (sent, _) = translate_request(&body, "claude-x", true).expect("translates");
        let sent: Value = serde_json::from_slice(&sent).unwrap();
        assert_eq!(sent["tools"][2]["name"], "multi_agent_v1__close_agent");
    }

    #[test]
    fn a_namespaced_call_in_the_input_goes_back_under_its_flat_name() {
        let mut req = codex_request();
        req["tools"] = codex_tools(false);
        req["input"] = json!([
            {"role": "user", "content": "spawn one"},
            {"type": "function_call", "call_id": "call_9", "name": "spawn_agent",
             "namespace": "multi_agent_v1", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_9", "output": "agent 1"}
        ]);
        req["tool_choice"] =
            json!({"type": "function", "name": "close_agent", "namespace": "multi_agent_v1"});
        let (chat, _) = to_chat(&obj(req), "m", false).expect("translates");
        let call = &chat["messages"][2]["tool_calls"][0];
        assert_eq!(call["id"], "call_9");
        assert_eq!(call["function"]["name"], "multi_agent_v1__spawn_agent");
        assert_eq!(
            chat["tool_choice"]["function"]["name"],
            "multi_agent_v1__close_agent"
        );
    }

    #[test]
    fn a_call_of_a_flat_name_comes_back_with_its_namespace() {
        let (_, echo) = to_chat(&with_tools(codex_tools(false)), "m", false).expect("translates");
        let completion = json!({"id": "c1", "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "multi_agent_v1__close_agent", "arguments": "{\"target\":\"1\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}}]}}]});
        let body = serde_json::to_vec(&completion).unwrap();
        let r: Value =
            serde_json::from_slice(&translate_answer(&body, false, &echo, 1).unwrap()).unwrap();
        assert_eq!(r["output"][0]["type"], "function_call");
        assert_eq!(r["output"][0]["name"], "close_agent");
        assert_eq!(r["output"][0]["namespace"], "multi_agent_v1");
        assert_eq!(r["output"][0]["arguments"], "{\"target\":\"1\"}");
        assert_eq!(r["output"][1]["name"], "exec_command");
        assert!(r["output"][1].get("namespace").is_none());
        // The response repeats the tools as the client gave them.
        assert_eq!(r["tools"], codex_tools(false));
        // Without the namespace in the request, a name with `__` is just a name.
        let r: Value =
            serde_json::from_slice(&translate_answer(&body, false, &Echo::default(), 1).unwrap())
                .unwrap();
        assert_eq!(r["output"][0]["name"], "multi_agent_v1__close_agent");
        assert!(r["output"][0].get("namespace").is_none());
    }

    #[test]
    fn a_namespaced_call_streams_back_with_its_namespace_however_it_is_split() {
        let (_, echo) = to_chat(&with_tools(codex_tools(false)), "m", false).expect("translates");
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": "chatcmpl-n", "object": "chat.completion.chunk", "created": 1, "model": "gpt",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            )
        };
        let rec = [
            chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_n", "type": "function",
                        "function": {"name": "multi_agent_v1__spawn_agent", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"target\":\"x\"}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
            "data: [DONE]\n\n".to_owned(),
        ]
        .concat();
        let rec = rec.as_bytes();
        let go = |pieces: &[&[u8]]| {
            let mut tr = StreamTranslator::new(Translation::ResponsesToChat, false, 42)
                .with_echo(echo.clone());
            let mut out = Vec::new();
            for p in pieces {
                tr.feed(p, &mut out);
            }
            tr.finish(&mut out);
            out
        };
        let whole = go(&[rec]);
        for i in 0..=rec.len() {
            let (a, b) = rec.split_at(i);
            assert_eq!(go(&[a, b]), whole, "split at {i}");
        }
        let events: Vec<Value> = events_of(&whole)
            .into_iter()
            .map(|(_, d)| serde_json::from_str(&d).unwrap())
            .collect();
        let item = |kind: &str| {
            events
                .iter()
                .find(|e| e["type"] == kind)
                .map(|e| e["item"].clone())
                .unwrap()
        };
        for it in [
            item("response.output_item.added"),
            item("response.output_item.done"),
        ] {
            assert_eq!(it["type"], "function_call");
            assert_eq!(it["name"], "spawn_agent");
            assert_eq!(it["namespace"], "multi_agent_v1");
        }
        let args_done = events
            .iter()
            .find(|e| e["type"] == "response.function_call_arguments.done")
            .unwrap();
        assert_eq!(args_done["name"], "spawn_agent");
        assert_eq!(args_done["arguments"], "{\"target\":\"x\"}");
        let done = &events.last().unwrap()["response"];
        assert_eq!(done["output"][0]["namespace"], "multi_agent_v1");
        assert_eq!(done["output"][0]["call_id"], "call_n");
    }

    #[test]
    fn tools_that_cannot_be_flattened_or_run_are_refused_naming_the_field() {
        let refused = |tools: Value| {
            to_chat(&with_tools(tools), "m", false)
                .map(|_| ())
                .expect_err("refused")
        };
        // Codex's default set: the namespace translates; the hosted web search does not.
        let r = refused(codex_tools(true));
        assert_eq!(r.field, "tools[3].type");
        assert!(r.why.contains("web_search"), "{}", r.why);
        assert!(r.why.contains("web_search = \"disabled\""), "{}", r.why);
        // A plain tool already named like a flattened one.
        let mut tools = codex_tools(false);
        tools[2]["name"] = json!("multi_agent_v1__close_agent");
        assert_eq!(refused(tools).field, "tools[2].name");
        // Something other than a function inside a namespace.
        let mut tools = codex_tools(false);
        tools[1]["tools"][1] = json!({"type": "web_search"});
        assert_eq!(refused(tools).field, "tools[1].tools[1].type");
        // A flat name longer than providers take.
        let mut tools = codex_tools(false);
        tools[1]["name"] = json!("n".repeat(60));
        assert_eq!(refused(tools).field, "tools[1].tools[0].name");
        let mut tools = codex_tools(false);
        tools[1]["defer_loading"] = json!(true);
        assert_eq!(refused(tools).field, "tools[1].defer_loading");
    }

    #[test]
    fn a_responses_stream_cut_short_ends_with_a_responses_error_event() {
        for (t, rec) in [
            (Translation::ResponsesToChat, openai_recording()),
            (Translation::ResponsesToMessages, anthropic_recording()),
        ] {
            let cut = &rec[..rec.len() / 2];
            let mut tr = StreamTranslator::new(t, false, 0);
            let mut out = Vec::new();
            tr.feed(cut, &mut out);
            tr.finish(&mut out);
            assert!(tr.broken() && tr.ended());
            let events = events_of(&out);
            let (name, data) = events.last().cloned().unwrap_or_default();
            assert_eq!(name.as_deref(), Some("error"));
            let v: Value = serde_json::from_str(&data).unwrap_or_default();
            assert_eq!(v["type"], "error");
            assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
            assert!(!String::from_utf8_lossy(&out).contains("response.completed"));
        }
    }

    fn item() -> impl Strategy<Value = Value> {
        prop_oneof![
            text().prop_map(|t| json!({"role": "user", "content": t})),
            text().prop_map(|t| json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": t}]})),
            text().prop_map(|t| json!({"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": t}]})),
            ("[a-z0-9]{1,8}", text()).prop_map(|(id, t)| json!([
                {"type": "function_call", "call_id": format!("call_{id}"), "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": format!("call_{id}"), "output": t}
            ])),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Every text, every call id and every output of a Responses conversation reaches
        /// the Chat Completions request, in order, and the same through to Anthropic.
        #[test]
        fn a_responses_conversation_keeps_its_texts_and_call_ids(
            items in prop::collection::vec(item(), 1..8),
        ) {
            let mut input = Vec::new();
            for i in items {
                match i {
                    Value::Array(a) => input.extend(a),
                    v => input.push(v),
                }
            }
            let req = json!({"model": "m", "input": input});
            let strings = |v: &Value, keys: &[&str]| -> Vec<String> {
                let mut out = Vec::new();
                fn walk(v: &Value, keys: &[&str], out: &mut Vec<String>) {
                    match v {
                        Value::Object(o) => {
                            for (k, x) in o {
                                match x {
                                    Value::String(s) if keys.contains(&k.as_str()) => out.push(s.clone()),
                                    _ => walk(x, keys, out),
                                }
                            }
                        }
                        Value::Array(a) => a.iter().for_each(|x| walk(x, keys, out)),
                        _ => {}
                    }
                }
                walk(v, keys, &mut out);
                out
            };
            let texts_in = strings(&req["input"], &["text", "content", "output"]);
            let ids_in: Vec<String> = strings(&req["input"], &["call_id"]);
            let (chat, _) = to_chat(&obj(req.clone()), "m", false).map_err(|r| TestCaseError::fail(r.to_string()))?;
            let chat = Value::Object(chat);
            prop_assert_eq!(strings(&chat["messages"], &["text", "content"]), texts_in.clone());
            prop_assert_eq!(strings(&chat["messages"], &["id", "tool_call_id"]), ids_in.clone());
            let body = serde_json::to_vec(&req).unwrap_or_default();
            let (out, _) = translate_request(&body, "m", true).map_err(|r| TestCaseError::fail(r.to_string()))?;
            let m: Value = serde_json::from_slice(&out).unwrap_or_default();
            prop_assert_eq!(strings(&m["messages"], &["text", "content"]), texts_in);
            prop_assert_eq!(strings(&m["messages"], &["id", "tool_use_id"]), ids_in);
        }

        #[test]
        fn any_chunking_of_a_stream_gives_the_same_responses_events(
            cuts in prop::collection::vec(0usize..4000, 0..12),
            which in any::<bool>(),
        ) {
            let (t, rec) = if which {
                (Translation::ResponsesToMessages, anthropic_recording())
            } else {
                (Translation::ResponsesToChat, openai_recording())
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
            prop_assert_eq!(run(t, &pieces), run(t, &[&rec]));
        }
    }

    // --- the direct writer against the two-step oracle ---------------------------------------

    /// A content part of any kind an input item may carry, good or bad.
    fn any_part() -> impl Strategy<Value = Value> {
        prop_oneof![
            20 => text().prop_map(|t| json!({"type": "input_text", "text": t})),
            20 => text().prop_map(|t| json!({"type": "output_text", "text": t})),
            3 => text().prop_map(|t| json!({"type": "refusal", "refusal": t})),
            5 => (image_url(), prop_oneof![Just(json!(null)), Just(json!("auto")), Just(json!("high")), Just(json!(3))])
                .prop_map(|(u, d)| json!({"type": "input_image", "image_url": u, "detail": d})),
            3 => Just(json!({"type": "input_image", "image_url": "data:image/png,notbase64"})),
            1 => Just(json!({"type": "input_image", "file_id": "file_1"})),
            1 => Just(json!({"type": "input_text", "text": 5})),
            1 => Just(json!({"type": "input_file"})),
        ]
    }

    fn any_content() -> impl Strategy<Value = Value> {
        prop_oneof![
            30 => text().prop_map(Value::from),
            40 => prop::collection::vec(any_part(), 0..3).prop_map(Value::Array),
            1 => Just(json!(null)),
            1 => Just(json!(7)),
        ]
    }

    fn any_item() -> impl Strategy<Value = Value> {
        let role = prop_oneof![
            20 => Just("user"), 20 => Just("assistant"), 3 => Just("system"), 2 => Just("developer"), 1 => Just("robot"),
        ];
        let args = prop_oneof![
            10 => Just("{\"cmd\":\"ls\",\"n\":[1,2.5,{\"x\":null}]}".to_owned()),
            3 => Just(String::new()),
            2 => Just("  ".to_owned()),
            1 => Just("[1]".to_owned()),
            1 => Just("{bad".to_owned()),
            10 => text().prop_map(|t| serde_json::to_string(&json!({"t": t})).unwrap_or_default()),
        ];
        prop_oneof![
            40 => (role, any_content(), any::<bool>()).prop_map(|(r, c, typed)| if typed {
                json!({"type": "message", "role": r, "content": c})
            } else {
                json!({"role": r, "content": c})
            }),
            30 => ("[a-z0-9]{1,6}", args, prop_oneof![10 => Just(json!(null)), 5 => Just(json!("ns")), 1 => Just(json!(1))])
                .prop_map(|(id, a, ns)| json!({"type": "function_call", "call_id": format!("call_{id}"),
                    "name": "f", "arguments": a, "namespace": ns})),
            30 => ("[a-z0-9]{1,6}", prop_oneof![
                    10 => text().prop_map(Value::from),
                    10 => prop::collection::vec(any_part(), 0..3).prop_map(Value::Array),
                    1 => Just(json!(null)),
                ]).prop_map(|(id, o)| json!({"type": "function_call_output", "call_id": format!("call_{id}"), "output": o})),
            5 => Just(json!({"type": "reasoning", "summary": []})),
            1 => Just(json!({"type": "function_call", "call_id": 5, "name": "f", "arguments": "{}"})),
            1 => Just(json!({"type": "item_reference", "id": "x"})),
            1 => Just(json!("not an object")),
            3 => Just(json!({"type": "function_call", "call_id": "call_n", "name": "a", "namespace": "grp", "arguments": "{\"x\":1}"})),
            2 => Just(json!({"role": "developer", "content": [{"type": "input_text", "text": "t"},
                {"type": "input_image", "image_url": "https://h.example/i.png"}]})),
        ]
    }

    fn any_tool() -> impl Strategy<Value = Value> {
        let f = |name: &'static str| {
            prop_oneof![
                10 => Just(json!({"type": "function", "name": name, "description": "d", "parameters": {"type": "object"}, "strict": false})),
                2 => Just(json!({"type": "function", "name": name, "strict": true})),
                5 => Just(json!({"type": "function", "name": name, "description": null, "parameters": null, "strict": null})),
                5 => Just(json!({"type": "function", "parameters": {"a": "b"}, "name": name, "description": ""})),
                1 => Just(json!({"type": "function", "name": name, "extra": 1})),
                1 => Just(json!({"type": "function", "description": "no name"})),
            ]
        };
        prop_oneof![
            40 => f("a"),
            20 => f("b"),
            20 => (f("a"), f("c"), prop_oneof![Just(json!("grp")), Just(json!("n".repeat(62))), Just(json!(""))],
                  prop_oneof![Just(json!("Group.")), Just(json!("")), Just(json!(null))])
                .prop_map(|(x, y, n, d)| json!({"type": "namespace", "name": n, "description": d, "tools": [x, y]})),
            1 => Just(json!({"type": "namespace", "name": "grp", "tools": [{"type": "web_search"}]})),
            1 => Just(json!({"type": "web_search"})),
            1 => Just(json!({"type": "custom", "name": "x"})),
            10 => Just(json!({"type": "function", "name": "c", "parameters": {"type": "object",
                "properties": {"q": {"type": "string", "description": "what / \"where\"\n"}}}})),
        ]
    }

    /// A Responses request of any shape: most settings, each often absent, sometimes
    /// wrong; an input of any items.
    fn any_request() -> impl Strategy<Value = Value> {
        // Each setting is absent half the time; given, it is one of the first `good`
        // values (each 20 times as likely) or one of the rest (the wrong ones). A setting
        // with no good value is given rarely.
        let setting = |k: &'static str, vs: Vec<Value>| {
            let good = match k {
                "instructions" | "top_p" | "metadata" | "max_output_tokens" | "temperature" => 2,
                "user" | "prompt_cache_key" | "store" | "include" => 1,
                "stream" | "parallel_tool_calls" => 2,
                "tool_choice" => 6,
                "reasoning" => 3,
                "text" => 1,
                _ => 0,
            };
            let mut weighted = Vec::new();
            for (n, v) in vs.into_iter().enumerate() {
                let times = if n < good { 20 } else { 1 };
                weighted.extend(std::iter::repeat_n(v, times));
            }
            let given = if good == 0 { 0.03 } else { 0.5 };
            prop::option::weighted(given, prop::sample::select(weighted)).prop_map(move |v| (k, v))
        };
        let settings = (
            (
                setting(
                    "instructions",
                    vec![json!("Be brief."), json!("line\nbreak \"q\" / x"), json!(3)],
                ),
                setting(
                    "max_output_tokens",
                    vec![json!(100), json!(0), json!(-1), json!(1.5)],
                ),
                setting(
                    "temperature",
                    vec![json!(0.5), json!(1), json!(1.7), json!("hot")],
                ),
                setting("top_p", vec![json!(0.9), json!(null), json!("x")]),
                setting("stream", vec![json!(true), json!(false), json!("yes")]),
                setting(
                    "tool_choice",
                    vec![
                        json!("auto"),
                        json!("none"),
                        json!("required"),
                        json!({"type": "function", "name": "a"}),
                        json!({"type": "function", "name": "a", "namespace": "grp"}),
                        json!({"type": "function", "name": "b", "extra": 1}),
                        json!("any"),
                        json!({"type": "function", "name": 1}),
                        json!({"type": "function", "name": "a", "namespace": 2}),
                    ],
                ),
                setting(
                    "parallel_tool_calls",
                    vec![json!(false), json!(true), json!(0)],
                ),
            ),
            (
                setting(
                    "reasoning",
                    vec![
                        json!({"effort": "low", "summary": "auto"}),
                        json!({"effort": "high"}),
                        json!({"effort": "minimal", "generate_summary": null}),
                        json!({"effort": "xhigh"}),
                        json!({"effort": 1}),
                        json!({"summary": 2}),
                        json!({"other": true}),
                        json!("low"),
                    ],
                ),
                setting(
                    "text",
                    vec![
                        json!({"format": {"type": "text"}}),
                        json!({"format": {"type": "json_object"}, "verbosity": "low"}),
                        json!({"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}, "strict": true, "x": 1}}),
                        json!({"format": {"type": "json_schema", "name": "s", "schema": {"type": "object", "properties": {"a/x": {"type": "string"}}}, "strict": true}}),
                        json!({"format": {"schema": {"type": "object"}, "type": "json_schema", "strict": false, "name": null}}),
                        json!({"format": {"type": "json_schema", "name": "s", "description": "d", "schema": {}}}),
                        json!({"format": {"type": "json_schema", "name": "s"}}),
                        json!({"format": {"type": "json_schema", "schema": [1], "strict": "no"}}),
                        json!({"verbosity": "low"}),
                        json!({"format": {"type": "xml"}}),
                        json!({"other": 1}),
                        json!(5),
                    ],
                ),
                setting("user", vec![json!("u-1"), json!(1)]),
                setting("store", vec![json!(false), json!(true)]),
                setting(
                    "include",
                    vec![
                        json!(["reasoning.encrypted_content"]),
                        json!(["x"]),
                        json!("x"),
                    ],
                ),
                setting("prompt_cache_key", vec![json!("k"), json!(1)]),
                setting("metadata", vec![json!({}), json!(null), json!({"a": "b"})]),
                setting("previous_response_id", vec![json!("resp_1")]),
            ),
        );
        let input = prop_oneof![
            10 => text().prop_map(Value::from),
            80 => prop::collection::vec(any_item(), 0..8).prop_map(Value::Array),
            1 => Just(json!(null)),
            1 => Just(json!({"not": "items"})),
        ];
        let tools = prop::option::weighted(0.5, prop::collection::vec(any_tool(), 0..3));
        (settings, input, tools, any::<u64>()).prop_map(
            |(((a, b, c, d, e, f, g), (h, i, j, k, l, m, n, o)), input, tools, seed)| {
                let mut pairs: Vec<(&str, Value)> = Vec::new();
                for (k, v) in [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o] {
                    if let Some(v) = v {
                        pairs.push((k, v));
                    }
                }
                if !input.is_null() {
                    pairs.push(("input", input));
                }
                if let Some(t) = tools {
                    pairs.push(("tools", Value::Array(t)));
                }
                pairs.push(("model", json!("whatever")));
                // The request's own order of keys decides the order of the output's.
                let n = pairs.len();
                for i in 0..n {
                    let j = (seed.rotate_left(i as u32 * 7) as usize) % n;
                    pairs.swap(i, j);
                }
                let mut text = String::from("{");
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        text.push(',');
                    }
                    text.push_str(&format!("{}:{}", json!(k), v));
                }
                text.push('}');
                Value::String(text)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]

        /// The direct writer gives, for any Responses request, the bytes (or the refusal)
        /// of the two steps it replaced: the Chat Completions tree, then for an Anthropic
        /// provider the Chat Completions → Messages converter. The body is also spelled
        /// with escapes the writer would not write (`\/`, `\u0078`), whose strings it must
        /// not copy as they stand.
        #[test]
        fn the_responses_writer_gives_what_the_two_steps_give(
            req in any_request(),
            respell in any::<bool>(),
            anthropic in any::<bool>(),
        ) {
            let mut body = req.as_str().unwrap_or_default().to_owned();
            if respell {
                body = body.replace('/', "\\/").replace('x', "\\u0078");
            }
            let new = translate_request(body.as_bytes(), "m", anthropic);
            let old = two_step::translate_request(body.as_bytes(), "m", anthropic);
            let show = |r: &Result<(Vec<u8>, Echo), super::super::Refused>| match r {
                Ok((b, e)) => format!("{}\n{e:?}", String::from_utf8_lossy(b)),
                Err(r) => format!("refused {r}"),
            };
            prop_assert_eq!(show(&new), show(&old), "{}", body);
        }
    }
}
