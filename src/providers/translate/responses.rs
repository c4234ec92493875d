//! The OpenAI Responses API (`/v1/responses`) served by a provider that speaks only Chat
//! Completions or only Anthropic Messages, for the subset Codex-style clients use.
//!
//! A Responses request becomes a Chat Completions request ([`to_chat`]); for an Anthropic
//! provider that request then goes through the Chat Completions → Messages converter. The
//! answer comes back the same way: an Anthropic message or stream is first translated to
//! Chat Completions (the existing converters), and a chat completion or chunk stream becomes
//! a Responses object or event stream here ([`completion_to_response`], [`ToResponses`]).
//! Every refusal names the field of the Responses request.

use std::io::Write;

use serde_json::{Map, Value, json};

use super::chunk::OChunk;
use super::{Refused, request, response};
use crate::sse::Event;

type Obj = Map<String, Value>;

const RESPONSES: &str = "a translated Responses request";

/// What the answer echoes of the request (the Responses object repeats its settings): each
/// setting the request gave, with its value as JSON; and the function tools of `namespace`
/// tools, whose flattened names the answer's calls are mapped back from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Echo {
    settings: Vec<(&'static str, String)>,
    namespaced: Vec<Namespaced>,
}

/// A function tool offered inside a `namespace` tool: the name it has for the provider
/// (`flat`), and the namespace and name the client knows it by.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Namespaced {
    flat: String,
    namespace: String,
    name: String,
}

/// Joins a namespace and a function name into one function name for a provider that has no
/// namespaces (`multi_agent_v1` + `spawn_agent` → `multi_agent_v1__spawn_agent`).
fn flat_name(namespace: &str, name: &str) -> String {
    format!("{namespace}__{name}")
}

/// Longest function name a Chat Completions or Anthropic provider takes.
const MAX_TOOL_NAME: usize = 64;

impl Echo {
    fn add(&mut self, key: &'static str, v: &Value) {
        self.settings.push((key, v.to_string()));
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.settings
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The name and namespace a provider's tool call stands for: a flattened name of a
    /// namespaced tool of the request maps back to both; any other name is itself.
    fn unflatten<'a>(&'a self, name: &'a str) -> (&'a str, Option<&'a str>) {
        match self.namespaced.iter().find(|n| n.flat == name) {
            Some(n) => (&n.name, Some(&n.namespace)),
            None => (name, None),
        }
    }
}

/// The settings a Responses object always states, with the value when the request did
/// not give one.
const ECHOED: [(&str, &str); 8] = [
    ("instructions", "null"),
    ("max_output_tokens", "null"),
    ("parallel_tool_calls", "true"),
    ("reasoning", "null"),
    ("temperature", "null"),
    ("tool_choice", "\"auto\""),
    ("tools", "[]"),
    ("top_p", "null"),
];

/// A Responses request body for the provider: Chat Completions, or Anthropic Messages when
/// `anthropic` (through the Chat Completions form); and what the answer echoes of it.
pub fn translate_request(
    body: &[u8],
    model: &str,
    anthropic: bool,
) -> Result<(Vec<u8>, Echo), Refused> {
    let req = request::parse_object(body)?;
    let (chat, echo) = to_chat(&req, model, anthropic)?;
    if !anthropic {
        return Ok((request::to_bytes(&chat), echo));
    }
    let (messages, _) = request::chat_to_messages_obj(&chat, model)?;
    Ok((request::to_bytes(&messages), echo))
}

/// A complete answer (a `chat.completion`, or an Anthropic message when `anthropic`) as a
/// Responses object.
pub fn translate_answer(
    body: &[u8],
    anthropic: bool,
    echo: &Echo,
    created: u64,
) -> Result<Vec<u8>, Refused> {
    let v = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) if anthropic => response::message_to_completion_obj(&m, created),
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return Err(Refused::new(
                "body",
                "the upstream answer is not a JSON object",
            ));
        }
    };
    Ok(completion_to_response(&v, echo, created))
}

/// A Responses request as a Chat Completions request (an object), and its [`Echo`].
/// `anthropic`: the request goes on to an Anthropic provider, so what it cannot express is
/// refused here under the Responses field's own name.
pub fn to_chat(req: &Obj, model: &str, anthropic: bool) -> Result<(Obj, Echo), Refused> {
    let mut out = Obj::new();
    out.insert("model".into(), json!(model));
    let mut messages: Vec<Value> = Vec::new();
    let mut input: Option<&Value> = None;
    let mut echo = Echo::default();
    for (k, v) in req {
        let k = k.as_str();
        if v.is_null() {
            continue;
        }
        match k {
            "model" => {}
            "input" => input = Some(v),
            "instructions" => {
                let s = v
                    .as_str()
                    .ok_or_else(|| Refused::new(k, "must be a string"))?;
                messages.push(json!({"role": "system", "content": s}));
                echo.add("instructions", v);
            }
            "max_output_tokens" => {
                v.as_u64()
                    .ok_or_else(|| Refused::new(k, "must be a non-negative integer"))?;
                out.insert("max_tokens".into(), v.clone());
                echo.add("max_output_tokens", v);
            }
            "temperature" => {
                let t = v
                    .as_f64()
                    .ok_or_else(|| Refused::new(k, "must be a number"))?;
                if anthropic && !(0.0..=1.0).contains(&t) {
                    return Err(Refused::new(
                        k,
                        "must be between 0 and 1 for an Anthropic provider",
                    ));
                }
                out.insert(k.into(), v.clone());
                echo.add("temperature", v);
            }
            "top_p" => {
                v.as_f64()
                    .ok_or_else(|| Refused::new(k, "must be a number"))?;
                out.insert(k.into(), v.clone());
                echo.add("top_p", v);
            }
            "stream" => {
                let b = v
                    .as_bool()
                    .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                out.insert("stream".into(), json!(b));
                if b {
                    // The usage chunk feeds `response.completed`'s usage.
                    out.insert("stream_options".into(), json!({"include_usage": true}));
                }
            }
            "tools" => {
                out.insert(
                    "tools".into(),
                    tools_to_chat(v, anthropic, &mut echo.namespaced)?,
                );
                echo.add("tools", v);
            }
            "tool_choice" => {
                out.insert(k.into(), tool_choice_to_chat(v)?);
                echo.add("tool_choice", v);
            }
            "parallel_tool_calls" => {
                v.as_bool()
                    .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                out.insert(k.into(), v.clone());
                echo.add("parallel_tool_calls", v);
            }
            "reasoning" => {
                reasoning_to_chat(v, anthropic, &mut out)?;
                echo.add("reasoning", v);
            }
            "text" => text_to_chat(v, anthropic, &mut out)?,
            "user" => {
                v.as_str()
                    .ok_or_else(|| Refused::new(k, "must be a string"))?;
                out.insert(k.into(), v.clone());
            }
            // Nothing is stored: the answer is not kept for `previous_response_id`.
            "store" if v == &json!(false) => {}
            "store" => {
                return Err(Refused::new(
                    k,
                    "the gateway keeps no responses (store must be false) when a request is translated",
                ));
            }
            "include" => include(v)?,
            // A caching hint: passed on where the target has the field, dropped otherwise
            // (Anthropic caches at `cache_control` breakpoints, which this request has none of).
            "prompt_cache_key" => {
                v.as_str()
                    .ok_or_else(|| Refused::new(k, "must be a string"))?;
                if !anthropic {
                    out.insert(k.into(), v.clone());
                }
            }
            // The client's own labels for the request (Codex sends its turn metadata
            // here): nothing the model reads, so nothing to carry.
            "client_metadata" => {
                v.as_object()
                    .ok_or_else(|| Refused::new(k, "must be an object"))?;
            }
            "truncation" if v == &json!("disabled") => {}
            "metadata" if v.as_object().is_some_and(Map::is_empty) => {}
            "background" if v == &json!(false) => {}
            other => {
                return Err(Refused::new(
                    other,
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    match input {
        None => return Err(Refused::new("input", "is required")),
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => input_items(items, anthropic, &mut messages)?,
        Some(_) => {
            return Err(Refused::new(
                "input",
                "must be a string or an array of items",
            ));
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    Ok((out, echo))
}

fn include(v: &Value) -> Result<(), Refused> {
    let list = v
        .as_array()
        .ok_or_else(|| Refused::new("include", "must be an array"))?;
    for (i, x) in list.iter().enumerate() {
        // Reasoning items of a translated answer carry no encrypted content (the target
        // has none to give); asking for it is harmless and Codex always does.
        if x.as_str() != Some("reasoning.encrypted_content") {
            return Err(Refused::new(
                format!("include[{i}]"),
                format!("is not supported in {RESPONSES}"),
            ));
        }
    }
    Ok(())
}

fn reasoning_to_chat(v: &Value, anthropic: bool, out: &mut Obj) -> Result<(), Refused> {
    let r = v
        .as_object()
        .ok_or_else(|| Refused::new("reasoning", "must be an object"))?;
    for (k, v) in r {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "effort" => {
                let e = v
                    .as_str()
                    .ok_or_else(|| Refused::new("reasoning.effort", "must be a string"))?;
                let known = ["none", "minimal", "low", "medium", "high"];
                if anthropic && !known.contains(&e) {
                    return Err(Refused::new(
                        "reasoning.effort",
                        "must be none, minimal, low, medium or high for an Anthropic provider",
                    ));
                }
                out.insert("reasoning_effort".into(), json!(e));
            }
            // Summaries are the reasoning text the target streams back, when it gives any.
            "summary" | "generate_summary" => {
                v.as_str()
                    .ok_or_else(|| Refused::new(format!("reasoning.{k}"), "must be a string"))?;
            }
            other => {
                return Err(Refused::new(
                    format!("reasoning.{other}"),
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    Ok(())
}

fn text_to_chat(v: &Value, anthropic: bool, out: &mut Obj) -> Result<(), Refused> {
    let t = v
        .as_object()
        .ok_or_else(|| Refused::new("text", "must be an object"))?;
    for (k, v) in t {
        if v.is_null() {
            continue;
        }
        match k.as_str() {
            "format" => {
                let kind = v.get("type").and_then(Value::as_str);
                match kind {
                    Some("text") => {}
                    Some("json_object") | Some("json_schema") if anthropic => {
                        return Err(Refused::new(
                            "text.format",
                            "JSON output modes cannot be honoured by an Anthropic provider",
                        ));
                    }
                    Some("json_object") => {
                        out.insert("response_format".into(), json!({"type": "json_object"}));
                    }
                    Some("json_schema") => {
                        let mut schema = Obj::new();
                        for f in ["name", "description", "schema", "strict"] {
                            if let Some(x) = v.get(f) {
                                schema.insert(f.into(), x.clone());
                            }
                        }
                        out.insert(
                            "response_format".into(),
                            json!({"type": "json_schema", "json_schema": schema}),
                        );
                    }
                    _ => {
                        return Err(Refused::new(
                            "text.format.type",
                            "must be text, json_object or json_schema",
                        ));
                    }
                }
            }
            "verbosity" if !anthropic => {
                out.insert("verbosity".into(), v.clone());
            }
            other => {
                return Err(Refused::new(
                    format!("text.{other}"),
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    Ok(())
}

/// The tools as Chat Completions function tools. A `namespace` tool (a named group of
/// function tools, as Codex offers its multi-agent tools) has no counterpart there: each of
/// its function tools is offered on its own under [`flat_name`], recorded in `namespaced`
/// so the answer's calls get their namespace and name back.
fn tools_to_chat(
    v: &Value,
    anthropic: bool,
    namespaced: &mut Vec<Namespaced>,
) -> Result<Value, Refused> {
    let list = v
        .as_array()
        .ok_or_else(|| Refused::new("tools", "must be an array"))?;
    let mut out = Vec::with_capacity(list.len());
    // (name for the provider, the field it came from)
    let mut names: Vec<(String, String)> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let here = format!("tools[{i}]");
        let t = t
            .as_object()
            .ok_or_else(|| Refused::new(here.clone(), "must be an object"))?;
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let f = function_to_chat(t, &here, anthropic, None)?;
                names.push((tool_name(&f), format!("{here}.name")));
                out.push(json!({"type": "function", "function": f}));
            }
            Some("namespace") => {
                for f in namespace_to_chat(t, &here, anthropic, namespaced)? {
                    out.push(json!({"type": "function", "function": f.0}));
                    names.push((f.1, f.2));
                }
            }
            Some(kind @ ("web_search" | "web_search_preview" | "web_search_2025_08_26")) => {
                return Err(Refused::new(
                    format!("{here}.type"),
                    format!(
                        "{kind:?} is a hosted tool that only OpenAI's own Responses API runs; a Chat Completions or Anthropic provider cannot run it, so leave it out (Codex CLI: web_search = \"disabled\")"
                    ),
                ));
            }
            _ => {
                return Err(Refused::new(
                    format!("{here}.type"),
                    "only function and namespace tools can be offered to a provider that does not speak the Responses API",
                ));
            }
        }
    }
    for (k, (name, at)) in names.iter().enumerate() {
        if names[..k].iter().any(|(n, _)| n == name) {
            return Err(Refused::new(
                at.clone(),
                format!("gives a second tool the name {name:?} once namespaces are flattened"),
            ));
        }
    }
    Ok(Value::Array(out))
}

fn tool_name(f: &Obj) -> String {
    f.get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// A `namespace` tool's function tools, each as a chat function named [`flat_name`], with
/// its name and the field it came from; the namespace's description leads each tool's.
fn namespace_to_chat(
    t: &Obj,
    here: &str,
    anthropic: bool,
    namespaced: &mut Vec<Namespaced>,
) -> Result<Vec<(Obj, String, String)>, Refused> {
    let mut ns_name = None;
    let mut ns_description = None;
    let mut tools = None;
    for (k, v) in t {
        match k.as_str() {
            "type" => {}
            "name" => {
                let n = v.as_str().filter(|n| !n.is_empty()).ok_or_else(|| {
                    Refused::new(format!("{here}.name"), "must be a non-empty string")
                })?;
                ns_name = Some(n);
            }
            "description" if v.is_null() => {}
            "description" => {
                let d = v.as_str().ok_or_else(|| {
                    Refused::new(format!("{here}.description"), "must be a string")
                })?;
                ns_description = Some(d).filter(|d| !d.is_empty());
            }
            "tools" => {
                tools =
                    Some(v.as_array().ok_or_else(|| {
                        Refused::new(format!("{here}.tools"), "must be an array")
                    })?);
            }
            other => {
                return Err(Refused::new(
                    format!("{here}.{other}"),
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    let ns_name = ns_name.ok_or_else(|| Refused::new(format!("{here}.name"), "is required"))?;
    let tools = tools.ok_or_else(|| Refused::new(format!("{here}.tools"), "is required"))?;
    let mut out = Vec::with_capacity(tools.len());
    for (j, inner) in tools.iter().enumerate() {
        let at = format!("{here}.tools[{j}]");
        let inner = inner
            .as_object()
            .ok_or_else(|| Refused::new(at.clone(), "must be an object"))?;
        if inner.get("type").and_then(Value::as_str) != Some("function") {
            return Err(Refused::new(
                format!("{at}.type"),
                "only function tools can be translated inside a namespace",
            ));
        }
        let mut f = function_to_chat(inner, &at, anthropic, ns_description)?;
        let name = tool_name(&f);
        let flat = flat_name(ns_name, &name);
        if flat.len() > MAX_TOOL_NAME {
            return Err(Refused::new(
                format!("{at}.name"),
                format!(
                    "with its namespace makes {flat:?}, longer than the {MAX_TOOL_NAME} characters a provider takes as a tool name"
                ),
            ));
        }
        f.insert("name".into(), json!(flat));
        namespaced.push(Namespaced {
            flat: flat.clone(),
            namespace: ns_name.to_owned(),
            name,
        });
        out.push((f, flat, format!("{at}.name")));
    }
    Ok(out)
}

/// A Responses function tool (`tools[i]` at `here`) as the `function` object of a chat
/// tool; `lead`: a text put before its description (its namespace's).
fn function_to_chat(
    t: &Obj,
    here: &str,
    anthropic: bool,
    lead: Option<&str>,
) -> Result<Obj, Refused> {
    let at = |f: &str| format!("{here}.{f}");
    let mut f = Obj::new();
    for (k, v) in t {
        match k.as_str() {
            "type" => {}
            "name" => {
                v.as_str()
                    .ok_or_else(|| Refused::new(at("name"), "must be a string"))?;
                f.insert("name".into(), v.clone());
            }
            "description" | "parameters" if !v.is_null() => {
                f.insert(k.clone(), v.clone());
            }
            "description" | "parameters" => {}
            "strict" if anthropic && v == &json!(true) => {
                return Err(Refused::new(
                    at("strict"),
                    "strict schemas cannot be enforced by an Anthropic provider",
                ));
            }
            "strict" if anthropic || v.is_null() => {}
            "strict" => {
                f.insert("strict".into(), v.clone());
            }
            other => {
                return Err(Refused::new(
                    at(other),
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    if !f.contains_key("name") {
        return Err(Refused::new(at("name"), "is required"));
    }
    if let Some(lead) = lead {
        let d = match f.get("description").and_then(Value::as_str) {
            Some(d) if !d.is_empty() => format!("{lead}\n\n{d}"),
            _ => lead.to_owned(),
        };
        f.insert("description".into(), json!(d));
    }
    Ok(f)
}

fn tool_choice_to_chat(v: &Value) -> Result<Value, Refused> {
    match v {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(v.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| Refused::new("tool_choice.name", "must be a string"))?;
            let name = match o.get("namespace").filter(|n| !n.is_null()) {
                None => name.to_owned(),
                Some(ns) => {
                    let ns = ns
                        .as_str()
                        .ok_or_else(|| Refused::new("tool_choice.namespace", "must be a string"))?;
                    flat_name(ns, name)
                }
            };
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(Refused::new(
            "tool_choice",
            "must be auto, none, required or a function",
        )),
    }
}

/// Content of a message item as Chat Completions content: a string stays a string; parts
/// become text and image parts.
fn content_to_chat(v: &Value, at: &str, assistant: bool) -> Result<Value, Refused> {
    let parts = match v {
        Value::String(_) => return Ok(v.clone()),
        Value::Array(a) => a,
        _ => return Err(Refused::new(at, "must be a string or an array of parts")),
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let kind = p.get("type").and_then(Value::as_str);
        match kind {
            Some("input_text") | Some("output_text") => {
                let text = p
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| Refused::new(format!("{here}.text"), "must be a string"))?;
                out.push(json!({"type": "text", "text": text}));
            }
            Some("refusal") if assistant => {
                let text = p
                    .get("refusal")
                    .and_then(Value::as_str)
                    .ok_or_else(|| Refused::new(format!("{here}.refusal"), "must be a string"))?;
                out.push(json!({"type": "text", "text": text}));
            }
            Some("input_image") if !assistant => {
                let Some(url) = p.get("image_url").and_then(Value::as_str) else {
                    return Err(Refused::new(
                        format!("{here}.image_url"),
                        "is required (images by file_id cannot be translated)",
                    ));
                };
                let mut image = Obj::new();
                image.insert("url".into(), json!(url));
                if let Some(d) = p.get("detail").filter(|d| !d.is_null() && *d != "auto") {
                    image.insert("detail".into(), d.clone());
                }
                out.push(json!({"type": "image_url", "image_url": image}));
            }
            _ => {
                return Err(Refused::new(
                    format!("{here}.type"),
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    Ok(Value::Array(out))
}

/// The input items as chat messages, appended to `messages` (which holds the
/// instructions, if any). An assistant message followed by function calls is one chat
/// assistant message with `tool_calls`.
fn input_items(items: &[Value], anthropic: bool, messages: &mut Vec<Value>) -> Result<(), Refused> {
    let mut seen_turn = false;
    for (i, item) in items.iter().enumerate() {
        let at = |f: &str| format!("input[{i}].{f}");
        let o = item
            .as_object()
            .ok_or_else(|| Refused::new(format!("input[{i}]"), "must be an object"))?;
        let kind = o.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = o
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| Refused::new(at("role"), "must be a string"))?;
                let system = matches!(role, "system" | "developer");
                if !system && !matches!(role, "user" | "assistant") {
                    return Err(Refused::new(
                        at("role"),
                        "must be user, assistant, system or developer",
                    ));
                }
                if system && seen_turn && anthropic {
                    return Err(Refused::new(
                        at("role"),
                        "an Anthropic provider takes system prompts only before the first turn",
                    ));
                }
                seen_turn |= !system;
                let content = o.get("content").unwrap_or(&Value::Null);
                let content = content_to_chat(content, &at("content"), role == "assistant")?;
                messages.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                seen_turn = true;
                let field = |f: &str| {
                    o.get(f)
                        .and_then(Value::as_str)
                        .ok_or_else(|| Refused::new(at(f), "must be a string"))
                };
                // A call of a namespaced tool goes under the name the tool was offered by.
                let name = match o.get("namespace").filter(|n| !n.is_null()) {
                    None => field("name")?.to_owned(),
                    Some(Value::String(ns)) => flat_name(ns, field("name")?),
                    Some(_) => return Err(Refused::new(at("namespace"), "must be a string")),
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": name, "arguments": field("arguments")?}});
                // Joins the assistant message right before it (its text, or earlier calls).
                let joined = match messages.last_mut() {
                    Some(Value::Object(m)) if m.get("role") == Some(&json!("assistant")) => {
                        let calls = m.entry("tool_calls").or_insert_with(|| json!([]));
                        if let Value::Array(c) = calls {
                            c.push(call.clone());
                        }
                        true
                    }
                    _ => false,
                };
                if !joined {
                    messages
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
                }
            }
            "function_call_output" => {
                seen_turn = true;
                let id = o
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| Refused::new(at("call_id"), "must be a string"))?;
                let output = match o.get("output") {
                    Some(Value::String(s)) => json!(s),
                    Some(v @ Value::Array(_)) => {
                        let parts = content_to_chat(v, &at("output"), false)?;
                        if parts
                            .as_array()
                            .is_some_and(|p| p.iter().any(|x| x["type"] != "text"))
                        {
                            return Err(Refused::new(
                                at("output"),
                                "tool outputs carry text only once translated",
                            ));
                        }
                        parts
                    }
                    _ => return Err(Refused::new(at("output"), "must be a string or parts")),
                };
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            // Earlier reasoning is not input the target takes (Anthropic wants its own
            // signed thinking, chat servers none): dropped, as reasoning_content is.
            "reasoning" => {}
            other => {
                return Err(Refused::new(
                    at("type"),
                    format!("{other:?} items are not supported in {RESPONSES}"),
                ));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------------------

fn u(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

/// Responses usage from Chat Completions usage.
fn usage_of(usage: Option<&Value>) -> Usage {
    let Some(usage) = usage else {
        return Usage::default();
    };
    Usage {
        input: u(usage.get("prompt_tokens")),
        output: u(usage.get("completion_tokens")),
        cached: u(usage.pointer("/prompt_tokens_details/cached_tokens")),
        reasoning: u(usage.pointer("/completion_tokens_details/reasoning_tokens")),
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    input: u64,
    output: u64,
    cached: u64,
    reasoning: u64,
}

impl Usage {
    fn write(&self, out: &mut Vec<u8>) {
        let _ = write!(
            out,
            "{{\"input_tokens\":{},\"input_tokens_details\":{{\"cached_tokens\":{}}},\"output_tokens\":{},\"output_tokens_details\":{{\"reasoning_tokens\":{}}},\"total_tokens\":{}}}",
            self.input,
            self.cached,
            self.output,
            self.reasoning,
            self.input.saturating_add(self.output)
        );
    }
}

/// `status` and `incomplete_details` for a chat `finish_reason`.
fn status_of(finish: Option<&str>) -> (&'static str, Option<&'static str>) {
    match finish {
        Some("length") => ("incomplete", Some("max_output_tokens")),
        Some("content_filter") => ("incomplete", Some("content_filter")),
        _ => ("completed", None),
    }
}

/// Writes a Responses object; `output` writes the items of its `output` array.
#[allow(clippy::too_many_arguments)]
fn write_response(
    out: &mut Vec<u8>,
    id: &str,
    created: u64,
    model: &str,
    status: &str,
    incomplete: Option<&str>,
    echo: &Echo,
    usage: Option<&Usage>,
    output: impl FnOnce(&mut Vec<u8>),
) {
    out.extend_from_slice(b"{\"id\":");
    push_str(out, id);
    let _ = write!(
        out,
        ",\"object\":\"response\",\"created_at\":{created},\"status\":\"{status}\",\"error\":null,\"incomplete_details\":"
    );
    match incomplete {
        Some(r) => {
            let _ = write!(out, "{{\"reason\":\"{r}\"}}");
        }
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"model\":");
    push_str(out, model);
    out.extend_from_slice(b",\"output\":[");
    output(out);
    out.extend_from_slice(b"],\"store\":false,\"metadata\":{}");
    for (k, default) in ECHOED {
        let v = echo.get(k).unwrap_or(default);
        let _ = write!(out, ",\"{k}\":{v}");
    }
    out.extend_from_slice(b",\"usage\":");
    match usage {
        Some(u) => u.write(out),
        None => out.extend_from_slice(b"null"),
    }
    out.push(b'}');
}

fn push_str(out: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *out, s);
}

fn reasoning_item(out: &mut Vec<u8>, id: &str, text: Option<&str>) {
    out.extend_from_slice(b"{\"id\":");
    push_str(out, id);
    out.extend_from_slice(b",\"type\":\"reasoning\",\"summary\":[");
    if let Some(t) = text {
        out.extend_from_slice(b"{\"type\":\"summary_text\",\"text\":");
        push_str(out, t);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
}

fn message_item(out: &mut Vec<u8>, id: &str, text: Option<&str>) {
    out.extend_from_slice(b"{\"id\":");
    push_str(out, id);
    let status = if text.is_some() {
        "completed"
    } else {
        "in_progress"
    };
    let _ = write!(
        out,
        ",\"type\":\"message\",\"status\":\"{status}\",\"role\":\"assistant\",\"content\":["
    );
    if let Some(t) = text {
        output_text(out, t);
    }
    out.extend_from_slice(b"]}");
}

fn output_text(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b"{\"type\":\"output_text\",\"text\":");
    push_str(out, text);
    out.extend_from_slice(b",\"annotations\":[]}");
}

/// A `function_call` item; `namespace`: the namespace of the tool it calls, if any.
fn call_item(
    out: &mut Vec<u8>,
    call_id: &str,
    (name, namespace): (&str, Option<&str>),
    args: &str,
    done: bool,
) {
    out.extend_from_slice(b"{\"id\":");
    push_str(out, &format!("fc_{call_id}"));
    let status = if done { "completed" } else { "in_progress" };
    let _ = write!(
        out,
        ",\"type\":\"function_call\",\"status\":\"{status}\",\"call_id\":"
    );
    push_str(out, call_id);
    out.extend_from_slice(b",\"name\":");
    push_str(out, name);
    if let Some(ns) = namespace {
        out.extend_from_slice(b",\"namespace\":");
        push_str(out, ns);
    }
    out.extend_from_slice(b",\"arguments\":");
    push_str(out, args);
    out.push(b'}');
}

/// A `chat.completion` (its first choice) as a Responses object.
pub fn completion_to_response(c: &Value, echo: &Echo, created: u64) -> Vec<u8> {
    let chat_id = c.get("id").and_then(Value::as_str).unwrap_or("");
    let model = c.get("model").and_then(Value::as_str).unwrap_or("");
    let choice = c.pointer("/choices/0");
    let message = choice.and_then(|ch| ch.get("message"));
    let text = |f: &str| {
        message
            .and_then(|m| m.get(f))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let finish = choice
        .and_then(|ch| ch.get("finish_reason"))
        .and_then(Value::as_str);
    let (status, incomplete) = status_of(finish);
    let usage = usage_of(c.get("usage"));
    let mut out = Vec::with_capacity(512);
    let id = format!("resp_{chat_id}");
    write_response(
        &mut out,
        &id,
        created,
        model,
        status,
        incomplete,
        echo,
        Some(&usage),
        |o| {
            let mut first = true;
            let mut sep = |o: &mut Vec<u8>| {
                if !std::mem::take(&mut first) {
                    o.push(b',');
                }
            };
            if let Some(r) = text("reasoning_content").or_else(|| text("reasoning")) {
                sep(o);
                reasoning_item(o, &format!("rs_{chat_id}"), Some(r));
            }
            let content = text("content").or_else(|| text("refusal"));
            if let Some(t) = content {
                sep(o);
                message_item(o, &format!("msg_{chat_id}"), Some(t));
            }
            let calls = message.and_then(|m| m.get("tool_calls"));
            for call in calls.and_then(Value::as_array).into_iter().flatten() {
                let s = |p: &str| call.pointer(p).and_then(Value::as_str).unwrap_or("");
                sep(o);
                call_item(
                    o,
                    s("/id"),
                    echo.unflatten(s("/function/name")),
                    s("/function/arguments"),
                    true,
                );
            }
        },
    );
    out
}

// ---------------------------------------------------------------------------------------
// Streams: Chat Completions chunks → Responses events
// ---------------------------------------------------------------------------------------

#[derive(Debug)]
enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        /// The chat tool-call index.
        index: u64,
        call_id: String,
        /// The name the client knows the tool by, and its namespace if it has one.
        name: String,
        namespace: Option<String>,
        args: String,
        done: bool,
    },
}

impl Item {
    fn write_done(&self, out: &mut Vec<u8>) {
        match self {
            Item::Reasoning { id, text } => {
                reasoning_item(out, id, Some(text));
            }
            Item::Message { id, text } => message_item(out, id, Some(text)),
            Item::Call {
                call_id,
                name,
                namespace,
                args,
                ..
            } => call_item(out, call_id, (name, namespace.as_deref()), args, true),
        }
    }
}

/// Chat Completions chunks (first choice) → the Responses event stream the OpenAI SDK's
/// `responses.stream()` accumulates: `response.created` / `in_progress`, each output item
/// added, its deltas, its done events, then `response.completed` (or `incomplete`) with
/// the whole output and usage.
#[derive(Debug, Default)]
pub struct ToResponses {
    pub(super) echo: Echo,
    pub(super) created: u64,
    started: bool,
    id: String,
    model: String,
    seq: u64,
    items: Vec<Item>,
    /// The output index of the open reasoning or message item.
    open: Option<usize>,
    finish: Option<String>,
    usage: Option<Usage>,
    pub(super) done: bool,
    pub(super) broken: bool,
}

impl ToResponses {
    pub fn new(echo: Echo, created: u64) -> Self {
        ToResponses {
            echo,
            created,
            ..ToResponses::default()
        }
    }

    /// Starts an event `name`; the caller writes the fields after `sequence_number` and
    /// closes it with [`Self::end_event`].
    fn event(&mut self, out: &mut Vec<u8>, name: &str) {
        let _ = write!(
            out,
            "event: {name}\ndata: {{\"type\":\"{name}\",\"sequence_number\":{}",
            self.seq
        );
        self.seq += 1;
    }

    fn end_event(out: &mut Vec<u8>) {
        out.extend_from_slice(b"}\n\n");
    }

    fn lifecycle(&mut self, out: &mut Vec<u8>, name: &str, status: &str, final_: bool) {
        self.event(out, name);
        out.extend_from_slice(b",\"response\":");
        let id = format!("resp_{}", self.id);
        let (st, incomplete) = if final_ {
            status_of(self.finish.as_deref())
        } else {
            (status, None)
        };
        let usage = if final_ {
            Some(self.usage.unwrap_or_default())
        } else {
            None
        };
        let items = &self.items;
        write_response(
            out,
            &id,
            self.created,
            &self.model,
            st,
            incomplete,
            &self.echo,
            usage.as_ref(),
            |o| {
                if final_ {
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            o.push(b',');
                        }
                        item.write_done(o);
                    }
                }
            },
        );
        Self::end_event(out);
    }

    fn start(&mut self, out: &mut Vec<u8>, id: Option<&str>, model: Option<&str>) {
        self.started = true;
        self.id = id.unwrap_or("").to_owned();
        self.model = model.unwrap_or("").to_owned();
        self.lifecycle(out, "response.created", "in_progress", false);
        self.lifecycle(out, "response.in_progress", "in_progress", false);
    }

    pub fn event_of(&mut self, ev: &Event<'_>, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let Some(data) = ev.data else { return };
        if data.trim_ascii() == b"[DONE]" {
            self.complete(out);
            return;
        }
        let Ok(c) = serde_json::from_slice::<OChunk<'_>>(data) else {
            return;
        };
        if let Some(err) = &c.error {
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("upstream error");
            let code = err
                .get("code")
                .and_then(Value::as_str)
                .or_else(|| err.get("type").and_then(Value::as_str))
                .unwrap_or("upstream_error");
            self.error(out, code, message);
            return;
        }
        if !self.started {
            self.start(out, c.id.as_deref(), c.model.as_deref());
        }
        if let Some(u) = &c.usage {
            self.usage = Some(Usage {
                input: u.prompt_tokens.unwrap_or(0),
                output: u.completion_tokens.unwrap_or(0),
                cached: u
                    .prompt_tokens_details
                    .as_ref()
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
                reasoning: 0,
            });
        }
        for choice in c.choices.iter().flatten() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(d) = &choice.delta {
                let reasoning = d.reasoning_content.as_deref().or(d.reasoning.as_deref());
                if let Some(r) = reasoning.filter(|r| !r.is_empty()) {
                    self.reasoning_delta(out, r);
                }
                for text in [d.content.as_deref(), d.refusal.as_deref()]
                    .into_iter()
                    .flatten()
                {
                    if !text.is_empty() {
                        self.text_delta(out, text);
                    }
                }
                for t in d.tool_calls.iter().flatten() {
                    let name = t.function.as_ref().and_then(|f| f.name.as_deref());
                    let args = t.function.as_ref().and_then(|f| f.arguments.as_deref());
                    self.call_delta(out, t.index.unwrap_or(0), t.id.as_deref(), name, args);
                }
            }
            if let Some(f) = choice.finish_reason.as_deref() {
                self.finish = Some(f.to_owned());
                self.close_all(out);
            }
        }
    }

    fn open_of(&mut self, reasoning: bool) -> Option<usize> {
        let i = self.open?;
        match self.items.get(i) {
            Some(Item::Reasoning { .. }) if reasoning => Some(i),
            Some(Item::Message { .. }) if !reasoning => Some(i),
            _ => None,
        }
    }

    fn reasoning_delta(&mut self, out: &mut Vec<u8>, r: &str) {
        let i = match self.open_of(true) {
            Some(i) => i,
            None => {
                self.close_open(out);
                let i = self.items.len();
                let id = format!("rs_{}_{i}", self.id);
                self.event(out, "response.output_item.added");
                let _ = write!(out, ",\"output_index\":{i},\"item\":");
                reasoning_item(out, &id, None);
                Self::end_event(out);
                self.event(out, "response.reasoning_summary_part.added");
                self.item_ref(out, &id, i);
                out.extend_from_slice(
                    b",\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":\"\"}",
                );
                Self::end_event(out);
                self.items.push(Item::Reasoning {
                    id,
                    text: String::new(),
                });
                self.open = Some(i);
                i
            }
        };
        let id = match &mut self.items[i] {
            Item::Reasoning { id, text } => {
                text.push_str(r);
                id.clone()
            }
            _ => return,
        };
        self.event(out, "response.reasoning_summary_text.delta");
        self.item_ref(out, &id, i);
        out.extend_from_slice(b",\"summary_index\":0,\"delta\":");
        push_str(out, r);
        Self::end_event(out);
    }

    fn text_delta(&mut self, out: &mut Vec<u8>, t: &str) {
        let i = match self.open_of(false) {
            Some(i) => i,
            None => {
                self.close_open(out);
                let i = self.items.len();
                let id = format!("msg_{}_{i}", self.id);
                self.event(out, "response.output_item.added");
                let _ = write!(out, ",\"output_index\":{i},\"item\":");
                message_item(out, &id, None);
                Self::end_event(out);
                self.event(out, "response.content_part.added");
                self.item_ref(out, &id, i);
                out.extend_from_slice(b",\"content_index\":0,\"part\":");
                output_text(out, "");
                Self::end_event(out);
                self.items.push(Item::Message {
                    id,
                    text: String::new(),
                });
                self.open = Some(i);
                i
            }
        };
        let id = match &mut self.items[i] {
            Item::Message { id, text } => {
                text.push_str(t);
                id.clone()
            }
            _ => return,
        };
        self.event(out, "response.output_text.delta");
        self.item_ref(out, &id, i);
        out.extend_from_slice(b",\"content_index\":0,\"delta\":");
        push_str(out, t);
        out.extend_from_slice(b",\"logprobs\":[]");
        Self::end_event(out);
    }

    fn call_delta(
        &mut self,
        out: &mut Vec<u8>,
        index: u64,
        id: Option<&str>,
        name: Option<&str>,
        args: Option<&str>,
    ) {
        let known = self
            .items
            .iter()
            .position(|it| matches!(it, Item::Call { index: k, done: false, .. } if *k == index));
        let i = match known {
            Some(i) => i,
            None => {
                self.close_open(out);
                let i = self.items.len();
                let call_id = id.unwrap_or("").to_owned();
                let (name, namespace) = self.echo.unflatten(name.unwrap_or(""));
                let (name, namespace) = (name.to_owned(), namespace.map(str::to_owned));
                self.event(out, "response.output_item.added");
                let _ = write!(out, ",\"output_index\":{i},\"item\":");
                call_item(out, &call_id, (&name, namespace.as_deref()), "", false);
                Self::end_event(out);
                self.items.push(Item::Call {
                    index,
                    call_id,
                    name,
                    namespace,
                    args: String::new(),
                    done: false,
                });
                i
            }
        };
        let Some(a) = args.filter(|a| !a.is_empty()) else {
            return;
        };
        let item_id = match &mut self.items[i] {
            Item::Call { call_id, args, .. } => {
                args.push_str(a);
                format!("fc_{call_id}")
            }
            _ => return,
        };
        self.event(out, "response.function_call_arguments.delta");
        self.item_ref(out, &item_id, i);
        out.extend_from_slice(b",\"delta\":");
        push_str(out, a);
        Self::end_event(out);
    }

    fn item_ref(&self, out: &mut Vec<u8>, id: &str, i: usize) {
        out.extend_from_slice(b",\"item_id\":");
        push_str(out, id);
        let _ = write!(out, ",\"output_index\":{i}");
    }

    /// Ends the open reasoning or message item.
    fn close_open(&mut self, out: &mut Vec<u8>) {
        if let Some(i) = self.open.take() {
            self.close_item(out, i);
        }
    }

    fn close_item(&mut self, out: &mut Vec<u8>, i: usize) {
        let Some(item) = self.items.get(i) else {
            return;
        };
        let mut body = Vec::with_capacity(128);
        match item {
            Item::Reasoning { id, text } => {
                let (id, text) = (id.clone(), text.clone());
                self.event(&mut body, "response.reasoning_summary_text.done");
                self.item_ref(&mut body, &id, i);
                body.extend_from_slice(b",\"summary_index\":0,\"text\":");
                push_str(&mut body, &text);
                Self::end_event(&mut body);
                self.event(&mut body, "response.reasoning_summary_part.done");
                self.item_ref(&mut body, &id, i);
                body.extend_from_slice(
                    b",\"summary_index\":0,\"part\":{\"type\":\"summary_text\",\"text\":",
                );
                push_str(&mut body, &text);
                body.push(b'}');
                Self::end_event(&mut body);
            }
            Item::Message { id, text } => {
                let (id, text) = (id.clone(), text.clone());
                self.event(&mut body, "response.output_text.done");
                self.item_ref(&mut body, &id, i);
                body.extend_from_slice(b",\"content_index\":0,\"text\":");
                push_str(&mut body, &text);
                body.extend_from_slice(b",\"logprobs\":[]");
                Self::end_event(&mut body);
                self.event(&mut body, "response.content_part.done");
                self.item_ref(&mut body, &id, i);
                body.extend_from_slice(b",\"content_index\":0,\"part\":");
                output_text(&mut body, &text);
                Self::end_event(&mut body);
            }
            Item::Call {
                call_id,
                name,
                args,
                done,
                ..
            } => {
                if *done {
                    return;
                }
                let (call_id, name, args) = (call_id.clone(), name.clone(), args.clone());
                self.event(&mut body, "response.function_call_arguments.done");
                self.item_ref(&mut body, &format!("fc_{call_id}"), i);
                body.extend_from_slice(b",\"name\":");
                push_str(&mut body, &name);
                body.extend_from_slice(b",\"arguments\":");
                push_str(&mut body, &args);
                Self::end_event(&mut body);
                if let Some(Item::Call { done, .. }) = self.items.get_mut(i) {
                    *done = true;
                }
            }
        }
        self.event(&mut body, "response.output_item.done");
        let _ = write!(body, ",\"output_index\":{i},\"item\":");
        if let Some(item) = self.items.get(i) {
            item.write_done(&mut body);
        }
        Self::end_event(&mut body);
        out.extend_from_slice(&body);
    }

    fn close_all(&mut self, out: &mut Vec<u8>) {
        self.close_open(out);
        for i in 0..self.items.len() {
            if matches!(self.items[i], Item::Call { done: false, .. }) {
                self.close_item(out, i);
            }
        }
    }

    fn complete(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.start(out, None, None);
        }
        self.close_all(out);
        let name = match status_of(self.finish.as_deref()).0 {
            "incomplete" => "response.incomplete",
            _ => "response.completed",
        };
        self.lifecycle(out, name, "completed", true);
        self.done = true;
    }

    fn error(&mut self, out: &mut Vec<u8>, code: &str, message: &str) {
        self.event(out, "error");
        out.extend_from_slice(b",\"code\":");
        push_str(out, code);
        out.extend_from_slice(b",\"message\":");
        push_str(out, message);
        out.extend_from_slice(b",\"param\":null");
        Self::end_event(out);
        self.done = true;
        self.broken = true;
    }

    /// The upstream body ended.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if self.finish.is_some() {
            self.complete(out);
        } else {
            self.error(
                out,
                "upstream_stream_broken",
                "the upstream stream ended before its finish_reason",
            );
        }
    }
}
