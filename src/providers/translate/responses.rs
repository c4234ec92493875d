//! The OpenAI Responses API (`/v1/responses`) served by a provider that speaks only Chat
//! Completions or only Anthropic Messages, for the subset Codex-style clients use.
//!
//! A Responses request becomes a Chat Completions request ([`translate_request`], read into
//! the borrowing tree the chat converters use); for an Anthropic provider that request then
//! goes straight through the Chat Completions → Messages converter. The
//! answer comes back the same way: an Anthropic message or stream is first translated to
//! Chat Completions (the existing converters), and a chat completion or chunk stream becomes
//! a Responses object or event stream here ([`completion_to_response`], [`ToResponses`]).
//! Every refusal names the field of the Responses request.

use std::borrow::Cow;
use std::io::Write;

#[cfg(test)]
use serde_json::Map;
use serde_json::Value;

use super::chunk::OChunk;
use super::json::{J, Out, Pairs, Unescaped};
use super::{Refused, request, response};
use crate::sse::Event;

#[cfg(test)]
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
    #[cfg(test)]
    fn add(&mut self, key: &'static str, v: &J<'_>) {
        self.settings
            .push((key, String::from_utf8(v.to_vec()).unwrap_or_default()));
    }

    /// Records setting `key`, its value as JSON.
    fn set(&mut self, key: &'static str, json: String) {
        self.settings.push((key, json));
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
/// `anthropic`; and what the answer echoes of it. The body is read into the borrowing tree
/// the chat converters use (`J`) and the target's JSON is written straight from that tree
/// into one buffer ([`write_request`]): no tree of the target form is built, and the
/// conversation's strings are copied once, into the output.
pub fn translate_request(
    body: &[u8],
    model: &str,
    anthropic: bool,
) -> Result<(Vec<u8>, Echo), Refused> {
    let mut unescaped = Unescaped::of(body);
    let (req, unescaped) = J::parse_in(&mut unescaped);
    let req = match req {
        Ok(j @ J::Obj(_)) => j,
        Ok(_) => return Err(Refused::new("body", "must be a JSON object")),
        Err(e) => return Err(Refused::new("body", format!("is not valid JSON: {e}"))),
    };
    let mut out = Out::new(unescaped, body.len() + 256);
    let echo = write_request(&req, model, anthropic, &mut out)?;
    Ok((out.buf, echo))
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

/// A Responses request as a Chat Completions request (an object), and its [`Echo`]: the
/// object form of the translation (for the tests; the gateway uses [`translate_request`]).
#[cfg(test)]
pub fn to_chat(req: &Obj, model: &str, anthropic: bool) -> Result<(Obj, Echo), Refused> {
    let body = request::to_bytes(req);
    // Every request a test translates: the writer gives what the two steps give.
    assert_eq!(
        translate_request(&body, model, anthropic),
        two_step::translate_request(&body, model, anthropic),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let j = J::parse(&body).map_err(|e| Refused::new("body", format!("is not valid JSON: {e}")))?;
    let (chat, echo) = two_step::to_chat_j(&j, model, anthropic)?;
    Ok((request::parse_object(&chat.to_vec())?, echo))
}

fn include(v: &J<'_>) -> Result<(), Refused> {
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

/// The member `key` of an object's pairs.
fn member<'p, 'a>(pairs: &'p Pairs<'a>, key: &str) -> Option<&'p J<'a>> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// The path of field `f` of tool `i`, or of function tool `j` inside namespace tool `i`
/// (formatted only for a refusal).
fn tool_field(i: usize, j: Option<usize>, f: &str) -> String {
    match j {
        None => format!("tools[{i}].{f}"),
        Some(j) => format!("tools[{i}].tools[{j}].{f}"),
    }
}

// ---------------------------------------------------------------------------------------
// Requests: the target's JSON written straight from the Responses tree
// ---------------------------------------------------------------------------------------

/// Writes `,"key":` (keys are plain literals).
fn key(out: &mut Out<'_>, k: &str) {
    out.extend_from_slice(b",\"");
    out.extend_from_slice(k.as_bytes());
    out.extend_from_slice(b"\":");
}

/// A `tool_choice` of the request, checked.
#[derive(Clone, Copy)]
enum Choice<'r> {
    /// `auto`, `none` or `required`.
    Mode(&'r str),
    /// A function by name, and the namespace it was offered in, if any.
    Function(&'r str, Option<&'r str>),
}

fn choice_of<'r>(v: &'r J<'_>) -> Result<Choice<'r>, Refused> {
    match v {
        J::Str(s) if matches!(s.as_ref(), "auto" | "none" | "required") => Ok(Choice::Mode(s)),
        J::Obj(_) if v.at("type").as_str() == Some("function") => {
            let name = v
                .at("name")
                .as_str()
                .ok_or_else(|| Refused::new("tool_choice.name", "must be a string"))?;
            match v.at("namespace") {
                J::Null => Ok(Choice::Function(name, None)),
                J::Str(ns) => Ok(Choice::Function(name, Some(ns))),
                _ => Err(Refused::new("tool_choice.namespace", "must be a string")),
            }
        }
        _ => Err(Refused::new(
            "tool_choice",
            "must be auto, none, required or a function",
        )),
    }
}

/// A function name as the provider knows it: flattened when it has a namespace.
fn write_name(out: &mut Out<'_>, name: &str, namespace: Option<&str>) {
    match namespace {
        None => out.str(name),
        Some(ns) => out.str(&flat_name(ns, name)),
    }
}

/// What an Anthropic request states after its conversation, gathered from the Responses
/// request's settings (Chat Completions states each where the request gives it).
#[derive(Default)]
struct Later<'r> {
    max_tokens: Option<u64>,
    effort: Option<&'r str>,
    tool_choice: Option<Choice<'r>>,
    parallel: Option<bool>,
    user: Option<&'r str>,
}

/// A Responses request as the provider's request (Chat Completions, or Anthropic Messages
/// when `anthropic`), written to `out` straight from the request's tree — no tree of the
/// target form is built — and what the answer echoes. Every refusal is the one the two
/// steps (Responses → Chat Completions, then Chat Completions → Messages) give, and every
/// byte the one their trees write (the test oracle checks both).
fn write_request<'r>(
    req: &'r J<'_>,
    model: &str,
    anthropic: bool,
    out: &mut Out<'_>,
) -> Result<Echo, Refused> {
    let mut echo = Echo::default();
    let mut later = Later::default();
    let mut instructions: Option<&'r J<'_>> = None;
    let mut input: Option<&'r J<'_>> = None;
    out.extend_from_slice(b"{\"model\":");
    out.str(model);
    for (k, v) in req.as_object().into_iter().flatten() {
        let k: &str = k;
        if v.is_null() {
            continue;
        }
        match k {
            "model" => {}
            "input" => input = Some(v),
            "instructions" => {
                v.as_str()
                    .ok_or_else(|| Refused::new(k, "must be a string"))?;
                instructions = Some(v);
                echo.set("instructions", out.text_of(v));
            }
            "max_output_tokens" => {
                let n = v
                    .as_u64()
                    .ok_or_else(|| Refused::new(k, "must be a non-negative integer"))?;
                if anthropic {
                    later.max_tokens = Some(n);
                } else {
                    key(out, "max_tokens");
                    out.j(v);
                }
                echo.set("max_output_tokens", out.text_of(v));
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
                key(out, "temperature");
                out.j(v);
                echo.set("temperature", out.text_of(v));
            }
            "top_p" => {
                v.as_f64()
                    .ok_or_else(|| Refused::new(k, "must be a number"))?;
                key(out, "top_p");
                out.j(v);
                echo.set("top_p", out.text_of(v));
            }
            "stream" => {
                let b = v
                    .as_bool()
                    .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                key(out, "stream");
                out.j(&J::Bool(b));
                if b && !anthropic {
                    // The usage chunk feeds `response.completed`'s usage.
                    out.extend_from_slice(b",\"stream_options\":{\"include_usage\":true}");
                }
            }
            "tools" => {
                key(out, "tools");
                write_tools(v, anthropic, &mut echo.namespaced, out)?;
                echo.set("tools", out.text_of(v));
            }
            "tool_choice" => {
                let c = choice_of(v)?;
                if anthropic {
                    later.tool_choice = Some(c);
                } else {
                    key(out, "tool_choice");
                    match c {
                        Choice::Mode(_) => out.j(v),
                        Choice::Function(name, ns) => {
                            out.extend_from_slice(
                                b"{\"type\":\"function\",\"function\":{\"name\":",
                            );
                            write_name(out, name, ns);
                            out.extend_from_slice(b"}}");
                        }
                    }
                }
                echo.set("tool_choice", out.text_of(v));
            }
            "parallel_tool_calls" => {
                let b = v
                    .as_bool()
                    .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                if anthropic {
                    later.parallel = Some(b);
                } else {
                    key(out, "parallel_tool_calls");
                    out.j(v);
                }
                echo.set("parallel_tool_calls", out.text_of(v));
            }
            "reasoning" => {
                later.effort = write_reasoning(v, anthropic, out)?;
                echo.set("reasoning", out.text_of(v));
            }
            "text" => write_text(v, anthropic, out)?,
            "user" => {
                let s = v
                    .as_str()
                    .ok_or_else(|| Refused::new(k, "must be a string"))?;
                if anthropic {
                    later.user = Some(s);
                } else {
                    key(out, "user");
                    out.j(v);
                }
            }
            // Nothing is stored: the answer is not kept for `previous_response_id`.
            "store" if matches!(v, J::Bool(false)) => {}
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
                    key(out, "prompt_cache_key");
                    out.j(v);
                }
            }
            // The client's own labels for the request (Codex sends its turn metadata
            // here): nothing the model reads, so nothing to carry.
            "client_metadata" => {
                v.as_object()
                    .ok_or_else(|| Refused::new(k, "must be an object"))?;
            }
            "truncation" if v.as_str() == Some("disabled") => {}
            "metadata" if v.as_object().is_some_and(Vec::is_empty) => {}
            "background" if matches!(v, J::Bool(false)) => {}
            other => {
                return Err(Refused::new(
                    other,
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    let mut conv = Conversation::new(anthropic, out);
    if let Some(s) = instructions {
        conv.system(s, out);
    }
    match input {
        None => return Err(Refused::new("input", "is required")),
        Some(s @ J::Str(_)) => conv.user_text(s, out),
        Some(J::Arr(items)) => conv.items(items, out)?,
        Some(_) => {
            return Err(Refused::new(
                "input",
                "must be a string or an array of items",
            ));
        }
    }
    conv.finish(out);
    if let Some(r) = conv.late {
        return Err(r);
    }
    if anthropic {
        messages_tail(&later, out)?;
    }
    out.push(b'}');
    Ok(echo)
}

/// What an Anthropic request states after its conversation: thinking, `max_tokens`,
/// `tool_choice`, `metadata` (as the Chat Completions → Messages converter orders them).
fn messages_tail(later: &Later<'_>, out: &mut Out<'_>) -> Result<(), Refused> {
    let mut max_tokens = later.max_tokens.unwrap_or(request::DEFAULT_MAX_TOKENS);
    if let Some(e) = later.effort {
        match request::EFFORT_BUDGETS.iter().find(|(n, _)| *n == e) {
            Some(&(_, budget)) => {
                // Anthropic requires max_tokens above the thinking budget.
                if max_tokens <= budget {
                    max_tokens += budget;
                }
                let _ = write!(
                    out,
                    ",\"thinking\":{{\"type\":\"enabled\",\"budget_tokens\":{budget}}}"
                );
            }
            None if e == "none" || e == "minimal" => {}
            None => {
                return Err(Refused::new(
                    "reasoning_effort",
                    format!("must be {}", request::EFFORTS),
                ));
            }
        }
    }
    let _ = write!(out, ",\"max_tokens\":{max_tokens}");
    let no_parallel = later.parallel == Some(false);
    match later.tool_choice {
        None if no_parallel => {
            out.extend_from_slice(
                b",\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true}",
            );
        }
        None => {}
        Some(c) => {
            out.extend_from_slice(b",\"tool_choice\":{\"type\":");
            let none = matches!(c, Choice::Mode("none"));
            match c {
                Choice::Mode("none") => out.extend_from_slice(b"\"none\""),
                Choice::Mode("required") => out.extend_from_slice(b"\"any\""),
                Choice::Mode(_) => out.extend_from_slice(b"\"auto\""),
                Choice::Function(name, ns) => {
                    out.extend_from_slice(b"\"tool\",\"name\":");
                    write_name(out, name, ns);
                }
            }
            if no_parallel && !none {
                out.extend_from_slice(b",\"disable_parallel_tool_use\":true");
            }
            out.push(b'}');
        }
    }
    if let Some(u) = later.user {
        out.extend_from_slice(b",\"metadata\":{\"user_id\":");
        out.str(u);
        out.push(b'}');
    }
    Ok(())
}

/// `reasoning`: checked, and its effort (written as `reasoning_effort` for Chat
/// Completions, returned for an Anthropic request's thinking budget).
fn write_reasoning<'r>(
    v: &'r J<'_>,
    anthropic: bool,
    out: &mut Out<'_>,
) -> Result<Option<&'r str>, Refused> {
    let r = v
        .as_object()
        .ok_or_else(|| Refused::new("reasoning", "must be an object"))?;
    let mut effort = None;
    for (k, v) in r {
        if v.is_null() {
            continue;
        }
        match k.as_ref() {
            "effort" => {
                let e = v
                    .as_str()
                    .ok_or_else(|| Refused::new("reasoning.effort", "must be a string"))?;
                if anthropic && !request::effort_known(e) {
                    return Err(Refused::new(
                        "reasoning.effort",
                        format!("must be {} for an Anthropic provider", request::EFFORTS),
                    ));
                }
                if !anthropic {
                    key(out, "reasoning_effort");
                    out.j(v);
                }
                effort = Some(e);
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
    Ok(effort)
}

/// `text`: its format as `response_format` and its verbosity (Chat Completions), or
/// checked (Anthropic, which has neither).
fn write_text(v: &J<'_>, anthropic: bool, out: &mut Out<'_>) -> Result<(), Refused> {
    let t = v
        .as_object()
        .ok_or_else(|| Refused::new("text", "must be an object"))?;
    for (k, v) in t {
        if v.is_null() {
            continue;
        }
        match k.as_ref() {
            "format" => match v.get("type").and_then(J::as_str) {
                Some("text") => {}
                Some("json_object") if anthropic => return Err(json_object_refused()),
                Some("json_schema") if anthropic => {
                    out.extend_from_slice(
                        b",\"output_config\":{\"format\":{\"type\":\"json_schema\",\"schema\":",
                    );
                    out.j(anthropic_schema(v)?);
                    out.extend_from_slice(b"}}");
                }
                Some("json_object") => {
                    out.extend_from_slice(b",\"response_format\":{\"type\":\"json_object\"}");
                }
                Some("json_schema") => {
                    chat_schema_keys(v)?;
                    out.extend_from_slice(
                        b",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{",
                    );
                    let mut first = true;
                    for f in ["name", "description", "schema", "strict"] {
                        if let Some(x) = v.get(f) {
                            if !std::mem::take(&mut first) {
                                out.push(b',');
                            }
                            out.str(f);
                            out.push(b':');
                            out.j(x);
                        }
                    }
                    out.extend_from_slice(b"}}");
                }
                _ => {
                    return Err(Refused::new(
                        "text.format.type",
                        "must be text, json_object or json_schema",
                    ));
                }
            },
            "verbosity" if !anthropic => {
                key(out, "verbosity");
                out.j(v);
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

/// The members of OpenAI's `json_schema` `text.format` (flat, where Chat Completions nests
/// them under `response_format.json_schema`): `name`, `description`, `schema` and `strict`
/// are carried to a Chat Completions provider; any other member is refused, naming it, as
/// it would be in `response_format.json_schema` for an Anthropic provider.
fn chat_schema_keys(format: &J<'_>) -> Result<(), Refused> {
    for (k, v) in format.as_object().into_iter().flatten() {
        match k.as_ref() {
            _ if v.is_null() => {}
            "type" | "name" | "description" | "schema" | "strict" => {}
            other => {
                return Err(Refused::new(
                    format!("text.format.{other}"),
                    "is not a member of a json_schema format (OpenAI's are name, description, schema and strict)",
                ));
            }
        }
    }
    Ok(())
}

/// `text.format` `json_object` for an Anthropic provider, whose structured output takes a
/// schema.
fn json_object_refused() -> Refused {
    Refused::new(
        "text.format",
        "json_object cannot be honoured by an Anthropic provider (its structured output takes a schema: send json_schema)",
    )
}

/// The schema of a `json_schema` `text.format` going to an Anthropic provider, checked
/// member by member in the request's order: `name` is dropped (a label; Anthropic's format
/// has none), `strict` is accepted either way (Anthropic always follows the schema, which a
/// non-strict request permits too), and anything else — a `description` for the model
/// included — has no counterpart there.
fn anthropic_schema<'v, 'a>(format: &'v J<'a>) -> Result<&'v J<'a>, Refused> {
    let mut schema = None;
    for (k, v) in format.as_object().into_iter().flatten() {
        let at = || format!("text.format.{k}");
        match k.as_ref() {
            _ if v.is_null() => {}
            "type" => {}
            "name" => {
                v.as_str()
                    .ok_or_else(|| Refused::new(at(), "must be a string"))?;
            }
            "strict" => {
                v.as_bool()
                    .ok_or_else(|| Refused::new(at(), "must be a boolean"))?;
            }
            "schema" => {
                v.as_object()
                    .ok_or_else(|| Refused::new(at(), "must be an object"))?;
                schema = Some(v);
            }
            _ => {
                return Err(Refused::new(
                    at(),
                    "has no counterpart in the Anthropic Messages API",
                ));
            }
        }
    }
    schema.ok_or_else(|| {
        Refused::new(
            "text.format.schema",
            "is required for an Anthropic provider",
        )
    })
}

/// A function tool's members that reach the provider, in the request's order (`name`,
/// `description`, `parameters`, `strict`: each at most once).
struct Function<'r, 'a> {
    members: [(&'static str, &'r J<'a>); 4],
    len: usize,
    name: &'r str,
}

impl<'r, 'a> Function<'r, 'a> {
    /// Function tool `i` (or function tool `j` of namespace tool `i`), checked.
    fn of(
        t: &'r Pairs<'a>,
        (i, j): (usize, Option<usize>),
        anthropic: bool,
    ) -> Result<Function<'r, 'a>, Refused> {
        static NULL: J<'static> = J::Null;
        let at = |f: &str| tool_field(i, j, f);
        let mut f = Function {
            members: [("", &NULL); 4],
            len: 0,
            name: "",
        };
        let mut named = false;
        for (k, v) in t {
            let k: &'static str = match k.as_ref() {
                "type" => continue,
                "name" => {
                    f.name = v
                        .as_str()
                        .ok_or_else(|| Refused::new(at("name"), "must be a string"))?;
                    named = true;
                    "name"
                }
                "description" if !v.is_null() => "description",
                "parameters" if !v.is_null() => "parameters",
                "description" | "parameters" => continue,
                "strict" if anthropic && matches!(v, J::Bool(true)) => {
                    return Err(Refused::new(
                        at("strict"),
                        "strict schemas cannot be enforced by an Anthropic provider",
                    ));
                }
                "strict" if anthropic || v.is_null() => continue,
                "strict" => "strict",
                other => {
                    return Err(Refused::new(
                        at(other),
                        format!("is not supported in {RESPONSES}"),
                    ));
                }
            };
            // Keys are distinct (the reader keeps one value per key): at most four.
            if let Some(slot) = f.members.get_mut(f.len) {
                *slot = (k, v);
                f.len += 1;
            }
        }
        if !named {
            return Err(Refused::new(at("name"), "is required"));
        }
        Ok(f)
    }

    fn description(&self) -> Option<&'r J<'a>> {
        self.members[..self.len]
            .iter()
            .find(|(k, _)| *k == "description")
            .map(|(_, v)| *v)
    }

    /// Writes the tool: a Chat Completions function tool, or an Anthropic tool
    /// (`parameters` named `input_schema`, an empty object schema when there is none).
    /// `flat`: the name it is offered by instead of its own; `description`: the
    /// description it gets instead of its own (or in addition, after its members).
    fn write(
        &self,
        out: &mut Out<'_>,
        anthropic: bool,
        flat: Option<&str>,
        description: Option<&str>,
    ) {
        if anthropic {
            out.push(b'{');
        } else {
            out.extend_from_slice(b"{\"type\":\"function\",\"function\":{");
        }
        let mut described = false;
        let mut schema = false;
        for (n, &(k, v)) in self.members[..self.len].iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            let k = match k {
                "parameters" if anthropic => {
                    schema = true;
                    "input_schema"
                }
                k => k,
            };
            out.str(k);
            out.push(b':');
            match (k, flat, description) {
                ("name", Some(flat), _) => out.str(flat),
                ("description", _, Some(d)) => {
                    described = true;
                    out.str(d);
                }
                _ => out.j(v),
            }
        }
        if let (Some(d), false) = (description, described) {
            out.extend_from_slice(b",\"description\":");
            out.str(d);
        }
        if anthropic {
            if !schema {
                out.extend_from_slice(b",\"input_schema\":{\"type\":\"object\",\"properties\":{}}");
            }
            out.push(b'}');
        } else {
            out.extend_from_slice(b"}}");
        }
    }
}

/// An offered tool's name, and where it came from: (tools index, index inside its
/// namespace).
type Offered<'r> = (Cow<'r, str>, (usize, Option<usize>));

/// The tools, written as Chat Completions function tools or Anthropic tools. A `namespace`
/// tool's function tools are each offered on their own under [`flat_name`] (recorded in
/// `namespaced`, so the answer's calls get their namespace and name back).
fn write_tools<'r>(
    v: &'r J<'_>,
    anthropic: bool,
    namespaced: &mut Vec<Namespaced>,
    out: &mut Out<'_>,
) -> Result<(), Refused> {
    let list = v
        .as_array()
        .ok_or_else(|| Refused::new("tools", "must be an array"))?;
    // Each offered tool's name and where it came from: (tools index, index inside its
    // namespace).
    let mut offered: Vec<Offered<'r>> = Vec::with_capacity(list.len());
    out.push(b'[');
    for (i, t) in list.iter().enumerate() {
        let t = t
            .as_object()
            .ok_or_else(|| Refused::new(format!("tools[{i}]"), "must be an object"))?;
        match member(t, "type").and_then(J::as_str) {
            Some("function") => {
                let f = Function::of(t, (i, None), anthropic)?;
                if !offered.is_empty() {
                    out.push(b',');
                }
                f.write(out, anthropic, None, None);
                offered.push((Cow::Borrowed(f.name), (i, None)));
            }
            Some("namespace") => {
                write_namespace(t, i, anthropic, namespaced, &mut offered, out)?;
            }
            Some(kind @ ("web_search" | "web_search_preview" | "web_search_2025_08_26")) => {
                return Err(Refused::new(
                    tool_field(i, None, "type"),
                    format!(
                        "{kind:?} is a hosted tool that only OpenAI's own Responses API runs; a Chat Completions or Anthropic provider cannot run it, so leave it out (Codex CLI: web_search = \"disabled\")"
                    ),
                ));
            }
            _ => {
                return Err(Refused::new(
                    tool_field(i, None, "type"),
                    "only function and namespace tools can be offered to a provider that does not speak the Responses API",
                ));
            }
        }
    }
    out.push(b']');
    for (k, (name, _)) in offered.iter().enumerate() {
        if offered[..k].iter().any(|(u, _)| u == name) {
            let (i, j) = offered[k].1;
            return Err(Refused::new(
                tool_field(i, j, "name"),
                format!("gives a second tool the name {name:?} once namespaces are flattened"),
            ));
        }
    }
    Ok(())
}

/// Namespace tool `i`'s function tools, each written as a tool named [`flat_name`] (its
/// name and origin to `offered`); the namespace's description leads each tool's.
fn write_namespace<'r>(
    t: &'r Pairs<'_>,
    i: usize,
    anthropic: bool,
    namespaced: &mut Vec<Namespaced>,
    offered: &mut Vec<Offered<'r>>,
    out: &mut Out<'_>,
) -> Result<(), Refused> {
    let here = |f: &str| tool_field(i, None, f);
    let mut ns_name = None;
    let mut ns_description = None;
    let mut tools = None;
    for (k, v) in t {
        match k.as_ref() {
            "type" => {}
            "name" => {
                let n = v
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| Refused::new(here("name"), "must be a non-empty string"))?;
                ns_name = Some(n);
            }
            "description" if v.is_null() => {}
            "description" => {
                let d = v
                    .as_str()
                    .ok_or_else(|| Refused::new(here("description"), "must be a string"))?;
                ns_description = Some(d).filter(|d| !d.is_empty());
            }
            "tools" => {
                tools = Some(
                    v.as_array()
                        .ok_or_else(|| Refused::new(here("tools"), "must be an array"))?,
                );
            }
            other => {
                return Err(Refused::new(
                    here(other),
                    format!("is not supported in {RESPONSES}"),
                ));
            }
        }
    }
    let ns_name = ns_name.ok_or_else(|| Refused::new(here("name"), "is required"))?;
    let tools = tools.ok_or_else(|| Refused::new(here("tools"), "is required"))?;
    for (j, inner) in tools.iter().enumerate() {
        let inner = inner
            .as_object()
            .ok_or_else(|| Refused::new(format!("tools[{i}].tools[{j}]"), "must be an object"))?;
        if member(inner, "type").and_then(J::as_str) != Some("function") {
            return Err(Refused::new(
                tool_field(i, Some(j), "type"),
                "only function tools can be translated inside a namespace",
            ));
        }
        let f = Function::of(inner, (i, Some(j)), anthropic)?;
        let flat = flat_name(ns_name, f.name);
        if flat.len() > MAX_TOOL_NAME {
            return Err(Refused::new(
                tool_field(i, Some(j), "name"),
                format!(
                    "with its namespace makes {flat:?}, longer than the {MAX_TOOL_NAME} characters a provider takes as a tool name"
                ),
            ));
        }
        let description = ns_description.map(|lead| match f.description().and_then(J::as_str) {
            Some(d) if !d.is_empty() => format!("{lead}\n\n{d}"),
            _ => lead.to_owned(),
        });
        if !offered.is_empty() {
            out.push(b',');
        }
        f.write(out, anthropic, Some(&flat), description.as_deref());
        namespaced.push(Namespaced {
            flat: flat.clone(),
            namespace: ns_name.to_owned(),
            name: f.name.to_owned(),
        });
        offered.push((Cow::Owned(flat), (i, Some(j))));
    }
    Ok(())
}

/// A content part of the request, checked.
enum Part<'r, 'a> {
    /// A text part's text (input, output or refusal text).
    Text(&'r J<'a>),
    /// An image by URL, and its detail when it is not `auto`.
    Image(&'r J<'a>, Option<&'r J<'a>>),
}

/// Part `j` of input item `i`'s `field`.
fn part_of<'r, 'a>(
    p: &'r J<'a>,
    (i, field, j): (usize, &str, usize),
    assistant: bool,
) -> Result<Part<'r, 'a>, Refused> {
    let here = |f: &str| format!("input[{i}].{field}[{j}]{f}");
    match p.at("type").as_str() {
        Some("input_text") | Some("output_text") => {
            let text = p.at("text");
            text.as_str()
                .ok_or_else(|| Refused::new(here(".text"), "must be a string"))?;
            Ok(Part::Text(text))
        }
        Some("refusal") if assistant => {
            let text = p.at("refusal");
            text.as_str()
                .ok_or_else(|| Refused::new(here(".refusal"), "must be a string"))?;
            Ok(Part::Text(text))
        }
        Some("input_image") if !assistant => {
            let url = p.at("image_url");
            if url.as_str().is_none() {
                return Err(Refused::new(
                    here(".image_url"),
                    "is required (images by file_id cannot be translated)",
                ));
            }
            let detail = p.at("detail");
            let detail = (!detail.is_null() && detail.as_str() != Some("auto")).then_some(detail);
            Ok(Part::Image(url, detail))
        }
        _ => Err(Refused::new(
            here(".type"),
            format!("is not supported in {RESPONSES}"),
        )),
    }
}

/// The parts of a content array (a string content is not one).
fn parts_of<'r, 'a>(v: &'r J<'a>, i: usize, field: &str) -> Result<&'r [J<'a>], Refused> {
    match v {
        J::Arr(a) => Ok(a),
        _ => Err(Refused::new(
            format!("input[{i}].{field}"),
            "must be a string or an array of parts",
        )),
    }
}

fn text_block(out: &mut Out<'_>, text: &J<'_>) {
    out.extend_from_slice(b"{\"type\":\"text\",\"text\":");
    out.j(text);
    out.push(b'}');
}

/// What is open at the end of the output written so far.
enum Open<'r, 'a> {
    Nothing,
    /// Chat Completions: an assistant message, and how many `tool_calls` it has (its
    /// calls array open when any).
    ChatAssistant {
        calls: usize,
    },
    /// Anthropic: an assistant turn (chat message `index`): its string content not yet
    /// written (`text`, while no block is) or its content array open with `blocks`
    /// blocks, `calls` of them tool calls.
    Assistant {
        index: usize,
        text: Option<&'r J<'a>>,
        blocks: usize,
        calls: usize,
    },
    /// Anthropic: a user turn of tool results, its content array open.
    Results,
}

/// The conversation of a translated request, written item by item: Chat Completions
/// `messages`, or Anthropic `system` and `messages`. An assistant message followed by
/// function calls is one assistant message (turn) with its calls; to Anthropic, tool
/// results and a following user message are one user turn.
struct Conversation<'r, 'a> {
    anthropic: bool,
    /// Messages of the Chat Completions form so far (Anthropic refusals name them).
    chat: usize,
    /// Anthropic turns written so far, and whether `"messages":[` is.
    turns: usize,
    started: bool,
    open: Open<'r, 'a>,
    /// Anthropic: the system texts, how many system messages gave them, and whether the
    /// last of those was a string.
    system: Vec<&'r J<'a>>,
    system_messages: usize,
    system_string: bool,
    /// The first refusal of the Chat Completions → Messages step: reported only when the
    /// whole Responses request is otherwise accepted (the first step checks it all before
    /// the second runs).
    late: Option<Refused>,
}

impl<'r, 'a> Conversation<'r, 'a> {
    fn new(anthropic: bool, out: &mut Out<'_>) -> Self {
        if !anthropic {
            out.extend_from_slice(b",\"messages\":[");
        }
        Conversation {
            anthropic,
            chat: 0,
            turns: 0,
            started: !anthropic,
            open: Open::Nothing,
            system: Vec::new(),
            system_messages: 0,
            system_string: false,
            late: None,
        }
    }

    fn refuse_late(&mut self, r: impl FnOnce() -> Refused) {
        if self.late.is_none() {
            self.late = Some(r());
        }
    }

    /// Ends what is open.
    fn close(&mut self, out: &mut Out<'_>) {
        match std::mem::replace(&mut self.open, Open::Nothing) {
            Open::Nothing => {}
            Open::ChatAssistant { calls: 0 } => out.push(b'}'),
            Open::ChatAssistant { .. } | Open::Results => out.extend_from_slice(b"]}"),
            Open::Assistant { text: Some(t), .. } => {
                out.j(t);
                out.push(b'}');
            }
            Open::Assistant { .. } => out.extend_from_slice(b"]}"),
        }
    }

    /// Starts a new chat message (closing the open one); returns its index.
    fn chat_message(&mut self, out: &mut Out<'_>) -> usize {
        self.close(out);
        if self.chat > 0 {
            out.push(b',');
        }
        self.chat += 1;
        self.chat - 1
    }

    /// Starts a new Anthropic turn (closing the open one; the system and the messages
    /// array before the first).
    fn turn(&mut self, out: &mut Out<'_>) {
        self.close(out);
        self.start(out);
        if self.turns > 0 {
            out.push(b',');
        }
        self.turns += 1;
    }

    /// Anthropic: writes `system` (if any) and opens `messages`.
    fn start(&mut self, out: &mut Out<'_>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        match (self.system_messages, self.system_string) {
            (0, _) => {}
            (1, true) => {
                out.extend_from_slice(b",\"system\":");
                if let Some(s) = self.system.first() {
                    out.j(s);
                }
            }
            _ => {
                out.extend_from_slice(b",\"system\":[");
                for (n, s) in self.system.iter().enumerate() {
                    if n > 0 {
                        out.push(b',');
                    }
                    text_block(out, s);
                }
                out.push(b']');
            }
        }
        out.extend_from_slice(b",\"messages\":[");
    }

    fn finish(&mut self, out: &mut Out<'_>) {
        self.close(out);
        self.start(out);
        out.push(b']');
    }

    /// A system message of string content (the instructions).
    fn system(&mut self, s: &'r J<'a>, out: &mut Out<'_>) {
        if self.anthropic {
            self.chat += 1;
            self.system_messages += 1;
            self.system.push(s);
            self.system_string = true;
        } else {
            self.chat_message(out);
            out.extend_from_slice(b"{\"role\":\"system\",\"content\":");
            out.j(s);
            out.push(b'}');
        }
    }

    /// A user message of string content (a string `input`).
    fn user_text(&mut self, s: &'r J<'a>, out: &mut Out<'_>) {
        if self.anthropic {
            self.chat += 1;
            self.anthropic_user(self.chat - 1, Some(s), &[], out);
        } else {
            self.chat_message(out);
            out.extend_from_slice(b"{\"role\":\"user\",\"content\":");
            out.j(s);
            out.push(b'}');
        }
    }

    fn items(&mut self, items: &'r [J<'a>], out: &mut Out<'_>) -> Result<(), Refused> {
        let mut seen_turn = false;
        for (i, item) in items.iter().enumerate() {
            let at = |f: &str| format!("input[{i}].{f}");
            if item.as_object().is_none() {
                return Err(Refused::new(format!("input[{i}]"), "must be an object"));
            }
            match item.at("type").as_str().unwrap_or("message") {
                "message" => {
                    let role_j = item.at("role");
                    let role = role_j
                        .as_str()
                        .ok_or_else(|| Refused::new(at("role"), "must be a string"))?;
                    let system = matches!(role, "system" | "developer");
                    if !system && !matches!(role, "user" | "assistant") {
                        return Err(Refused::new(
                            at("role"),
                            "must be user, assistant, system or developer",
                        ));
                    }
                    if system && seen_turn && self.anthropic {
                        return Err(Refused::new(
                            at("role"),
                            "an Anthropic provider takes system prompts only before the first turn",
                        ));
                    }
                    seen_turn |= !system;
                    self.message(i, role_j, role, item.at("content"), out)?;
                }
                "function_call" => {
                    seen_turn = true;
                    let field = |f: &str| {
                        let v = item.at(f);
                        match v {
                            J::Str(_) => Ok(v),
                            _ => Err(Refused::new(at(f), "must be a string")),
                        }
                    };
                    // A call of a namespaced tool goes under the name the tool was offered by.
                    let namespace = match item.at("namespace") {
                        J::Null => None,
                        J::Str(ns) => Some(&**ns),
                        _ => return Err(Refused::new(at("namespace"), "must be a string")),
                    };
                    let name = field("name")?;
                    let id = field("call_id")?;
                    let args = field("arguments")?;
                    self.call(id, (name, namespace), args, out);
                }
                "function_call_output" => {
                    seen_turn = true;
                    let id = item.at("call_id");
                    id.as_str()
                        .ok_or_else(|| Refused::new(at("call_id"), "must be a string"))?;
                    self.output(i, id, item.at("output"), out)?;
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

    /// A message item (`i`), its role checked.
    fn message(
        &mut self,
        i: usize,
        role_j: &'r J<'a>,
        role: &str,
        content: &'r J<'a>,
        out: &mut Out<'_>,
    ) -> Result<(), Refused> {
        let assistant = role == "assistant";
        if !self.anthropic {
            self.chat_message(out);
            out.extend_from_slice(b"{\"role\":");
            out.j(role_j);
            out.extend_from_slice(b",\"content\":");
            match content {
                J::Str(_) => out.j(content),
                _ => {
                    write_chat_parts(
                        parts_of(content, i, "content")?,
                        i,
                        "content",
                        assistant,
                        out,
                    )?;
                }
            }
            if assistant {
                self.open = Open::ChatAssistant { calls: 0 };
            } else {
                out.push(b'}');
            }
            return Ok(());
        }
        let parts: &'r [J<'a>] = match content {
            J::Str(_) => &[],
            _ => parts_of(content, i, "content")?,
        };
        let index = self.chat;
        self.chat += 1;
        match role {
            "system" | "developer" => {
                self.system_messages += 1;
                if let J::Str(_) = content {
                    self.system.push(content);
                    self.system_string = true;
                    return Ok(());
                }
                self.system_string = false;
                let mut image = None;
                for (j, p) in parts.iter().enumerate() {
                    match part_of(p, (i, "content", j), false)? {
                        Part::Text(t) => self.system.push(t),
                        Part::Image(..) => {
                            image.get_or_insert(j);
                        }
                    }
                }
                if let Some(j) = image {
                    self.refuse_late(|| {
                        Refused::new(
                            format!("messages[{index}].content[{j}].type"),
                            "only text parts are accepted here",
                        )
                    });
                }
            }
            "user" => {
                // Checked first, as the first step checks the whole content.
                for (j, p) in parts.iter().enumerate() {
                    part_of(p, (i, "content", j), false)?;
                }
                let text = matches!(content, J::Str(_)).then_some(content);
                self.anthropic_user(index, text, parts, out);
            }
            _ => {
                for (j, p) in parts.iter().enumerate() {
                    part_of(p, (i, "content", j), true)?;
                }
                self.turn(out);
                out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":");
                let text = match content {
                    J::Str(_) => Some(content),
                    _ => {
                        out.push(b'[');
                        for (j, p) in parts.iter().enumerate() {
                            if j > 0 {
                                out.push(b',');
                            }
                            if let Ok(Part::Text(t)) = part_of(p, (i, "content", j), true) {
                                text_block(out, t);
                            }
                        }
                        None
                    }
                };
                self.open = Open::Assistant {
                    index,
                    text,
                    blocks: parts.len(),
                    calls: 0,
                };
            }
        }
        Ok(())
    }

    /// An Anthropic user message (chat message `index`): `text` (a string content) or
    /// `parts` (checked).
    fn anthropic_user(
        &mut self,
        index: usize,
        text: Option<&'r J<'a>>,
        parts: &'r [J<'a>],
        out: &mut Out<'_>,
    ) {
        // After tool results, the message joins their turn.
        let joins = matches!(self.open, Open::Results);
        if joins {
            if let Some(text) = text {
                out.push(b',');
                text_block(out, text);
            }
        } else {
            self.turn(out);
            out.extend_from_slice(b"{\"role\":\"user\",\"content\":");
            if let Some(text) = text {
                out.j(text);
                out.push(b'}');
                return;
            }
            out.push(b'[');
        }
        for (j, p) in parts.iter().enumerate() {
            if joins || j > 0 {
                out.push(b',');
            }
            match part_of(p, (0, "", j), false) {
                Ok(Part::Text(t)) => text_block(out, t),
                Ok(Part::Image(url, _)) => self.image_block(index, j, url, out),
                Err(_) => {}
            }
        }
        if joins {
            self.open = Open::Nothing;
        }
        out.extend_from_slice(b"]}");
    }

    /// An Anthropic image block of `url` (part `j` of chat message `index`).
    fn image_block(&mut self, index: usize, j: usize, url: &J<'_>, out: &mut Out<'_>) {
        let u = url.as_str().unwrap_or("");
        if !u.starts_with("data:") {
            out.extend_from_slice(b"{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":");
            out.j(url);
            out.extend_from_slice(b"}}");
            return;
        }
        match request::data_url(u) {
            Some((media, data)) => {
                out.extend_from_slice(
                    b"{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":",
                );
                out.str(media);
                out.extend_from_slice(b",\"data\":");
                out.str(data);
                out.extend_from_slice(b"}}");
            }
            None => self.refuse_late(|| {
                Refused::new(
                    format!("messages[{index}].content[{j}].image_url.url"),
                    "a data URL must be base64 (data:<type>;base64,…)",
                )
            }),
        }
    }

    /// A function call: joins the assistant message (turn) right before it, or starts one.
    fn call(
        &mut self,
        id: &J<'a>,
        (name, namespace): (&J<'a>, Option<&str>),
        args: &J<'a>,
        out: &mut Out<'_>,
    ) {
        let name_str = name.as_str().unwrap_or("");
        if !self.anthropic {
            match &mut self.open {
                Open::ChatAssistant { calls } => {
                    out.extend_from_slice(if *calls == 0 {
                        b",\"tool_calls\":["
                    } else {
                        b","
                    });
                    *calls += 1;
                }
                _ => {
                    self.chat_message(out);
                    out.extend_from_slice(
                        b"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[",
                    );
                    self.open = Open::ChatAssistant { calls: 1 };
                }
            }
            out.extend_from_slice(b"{\"id\":");
            out.j(id);
            out.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
            match namespace {
                None => out.j(name),
                Some(ns) => write_name(out, name_str, Some(ns)),
            }
            out.extend_from_slice(b",\"arguments\":");
            out.j(args);
            out.extend_from_slice(b"}}");
            return;
        }
        let (index, j) = match &mut self.open {
            Open::Assistant {
                index,
                text,
                blocks,
                calls,
            } => {
                if let Some(t) = text.take() {
                    out.push(b'[');
                    if t.as_str().is_some_and(|s| !s.is_empty()) {
                        text_block(out, t);
                        *blocks += 1;
                    }
                }
                if *blocks > 0 {
                    out.push(b',');
                }
                *blocks += 1;
                *calls += 1;
                (*index, *calls - 1)
            }
            _ => {
                let index = self.chat;
                self.chat += 1;
                self.turn(out);
                out.extend_from_slice(b"{\"role\":\"assistant\",\"content\":[");
                self.open = Open::Assistant {
                    index,
                    text: None,
                    blocks: 1,
                    calls: 1,
                };
                (index, 0)
            }
        };
        out.extend_from_slice(b"{\"type\":\"tool_use\",\"id\":");
        out.j(id);
        out.extend_from_slice(b",\"name\":");
        match namespace {
            None => out.j(name),
            Some(ns) => write_name(out, name_str, Some(ns)),
        }
        out.extend_from_slice(b",\"input\":");
        let a = args.as_str().unwrap_or("");
        if a.trim().is_empty() {
            out.extend_from_slice(b"{}");
        } else {
            // The arguments are a string holding JSON: an object for an Anthropic provider.
            match J::parse(a.as_bytes()) {
                Ok(input @ J::Obj(_)) => out.j(&input),
                _ => self.refuse_late(|| {
                    Refused::new(
                        format!("messages[{index}].tool_calls[{j}].function.arguments"),
                        "must be a JSON object for an Anthropic provider",
                    )
                }),
            }
        }
        out.push(b'}');
    }

    /// A function call's output (item `i`): a tool message, or to Anthropic a tool result
    /// in the user turn of results right before it (or a new one).
    fn output(
        &mut self,
        i: usize,
        id: &'r J<'a>,
        output: &'r J<'a>,
        out: &mut Out<'_>,
    ) -> Result<(), Refused> {
        let at = |f: &str| format!("input[{i}].{f}");
        let parts: &'r [J<'a>] = match output {
            J::Str(_) => &[],
            J::Arr(a) => a,
            _ => return Err(Refused::new(at("output"), "must be a string or parts")),
        };
        let mut image = false;
        for (j, p) in parts.iter().enumerate() {
            image |= matches!(part_of(p, (i, "output", j), false)?, Part::Image(..));
        }
        if image {
            return Err(Refused::new(
                at("output"),
                "tool outputs carry text only once translated",
            ));
        }
        if self.anthropic {
            self.chat += 1;
            if matches!(self.open, Open::Results) {
                out.push(b',');
            } else {
                self.turn(out);
                out.extend_from_slice(b"{\"role\":\"user\",\"content\":[");
                self.open = Open::Results;
            }
            out.extend_from_slice(b"{\"type\":\"tool_result\",\"tool_use_id\":");
            out.j(id);
            out.extend_from_slice(b",\"content\":");
        } else {
            self.chat_message(out);
            out.extend_from_slice(b"{\"role\":\"tool\",\"tool_call_id\":");
            out.j(id);
            out.extend_from_slice(b",\"content\":");
        }
        // Text parts are written the same way in both forms.
        match output {
            J::Str(_) => out.j(output),
            _ => {
                out.push(b'[');
                for (j, p) in parts.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    text_block(out, p.at("text"));
                }
                out.push(b']');
            }
        }
        out.push(b'}');
        Ok(())
    }
}

/// Chat Completions content parts (checked) of input item `i`'s `field`.
fn write_chat_parts(
    parts: &[J<'_>],
    i: usize,
    field: &str,
    assistant: bool,
    out: &mut Out<'_>,
) -> Result<(), Refused> {
    out.push(b'[');
    for (j, p) in parts.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        match part_of(p, (i, field, j), assistant)? {
            Part::Text(t) => text_block(out, t),
            Part::Image(url, detail) => {
                out.extend_from_slice(b"{\"type\":\"image_url\",\"image_url\":{\"url\":");
                out.j(url);
                if let Some(d) = detail {
                    out.extend_from_slice(b",\"detail\":");
                    out.j(d);
                }
                out.extend_from_slice(b"}}");
            }
        }
    }
    out.push(b']');
    Ok(())
}

/// The translation in two steps through a Chat Completions tree, as it was written before
/// the direct writer: the oracle its tests compare it with.
#[cfg(test)]
pub(super) mod two_step {
    use super::*;
    use crate::providers::translate::json::{Pairs, jo, set};

    /// [`super::translate_request`] in two steps, as it was written before: the Chat
    /// Completions form built as a tree, and for an Anthropic provider that tree handed to
    /// the Chat Completions → Messages converter. The writer's oracle.
    pub fn translate_request(
        body: &[u8],
        model: &str,
        anthropic: bool,
    ) -> Result<(Vec<u8>, Echo), Refused> {
        let mut unescaped = Unescaped::of(body);
        let req = match J::parse_in(&mut unescaped).0 {
            Ok(j @ J::Obj(_)) => j,
            Ok(_) => return Err(Refused::new("body", "must be a JSON object")),
            Err(e) => return Err(Refused::new("body", format!("is not valid JSON: {e}"))),
        };
        let (chat, echo) = to_chat_j(&req, model, anthropic)?;
        if !anthropic {
            return Ok((chat.to_vec_sized(body.len() + 256), echo));
        }
        let (messages, _) = request::chat_to_messages_j(&chat, model)?;
        Ok((messages.to_vec_sized(body.len() + 256), echo))
    }

    /// A Responses request as a Chat Completions request, and its [`Echo`]. `anthropic`: the
    /// request goes on to an Anthropic provider, so what it cannot express is refused here
    /// under the Responses field's own name. Field paths are formatted only for a refusal.
    pub(super) fn to_chat_j<'a>(
        req: &J<'a>,
        model: &'a str,
        anthropic: bool,
    ) -> Result<(J<'a>, Echo), Refused> {
        let mut out: Pairs<'a> = Vec::with_capacity(12);
        set(&mut out, "model", J::from(model));
        // The instructions and one message per input item at most.
        let items = req.at("input").as_array().map_or(0, Vec::len);
        let mut messages: Vec<J<'a>> = Vec::with_capacity(items + 1);
        let mut input: Option<&J<'a>> = None;
        let mut echo = Echo::default();
        for (k, v) in req.as_object().into_iter().flatten() {
            let k: &str = k;
            if v.is_null() {
                continue;
            }
            match k {
                "model" => {}
                "input" => input = Some(v),
                "instructions" => {
                    v.as_str()
                        .ok_or_else(|| Refused::new(k, "must be a string"))?;
                    messages.push(jo! {"role" => "system", "content" => v.clone()});
                    echo.add("instructions", v);
                }
                "max_output_tokens" => {
                    v.as_u64()
                        .ok_or_else(|| Refused::new(k, "must be a non-negative integer"))?;
                    set(&mut out, "max_tokens", v.clone());
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
                    set(&mut out, "temperature", v.clone());
                    echo.add("temperature", v);
                }
                "top_p" => {
                    v.as_f64()
                        .ok_or_else(|| Refused::new(k, "must be a number"))?;
                    set(&mut out, "top_p", v.clone());
                    echo.add("top_p", v);
                }
                "stream" => {
                    let b = v
                        .as_bool()
                        .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                    set(&mut out, "stream", J::Bool(b));
                    if b {
                        // The usage chunk feeds `response.completed`'s usage.
                        set(&mut out, "stream_options", jo! {"include_usage" => true});
                    }
                }
                "tools" => {
                    set(
                        &mut out,
                        "tools",
                        tools_to_chat(v, anthropic, &mut echo.namespaced)?,
                    );
                    echo.add("tools", v);
                }
                "tool_choice" => {
                    set(&mut out, "tool_choice", tool_choice_to_chat(v)?);
                    echo.add("tool_choice", v);
                }
                "parallel_tool_calls" => {
                    v.as_bool()
                        .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                    set(&mut out, "parallel_tool_calls", v.clone());
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
                    set(&mut out, "user", v.clone());
                }
                // Nothing is stored: the answer is not kept for `previous_response_id`.
                "store" if matches!(v, J::Bool(false)) => {}
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
                        set(&mut out, "prompt_cache_key", v.clone());
                    }
                }
                // The client's own labels for the request (Codex sends its turn metadata
                // here): nothing the model reads, so nothing to carry.
                "client_metadata" => {
                    v.as_object()
                        .ok_or_else(|| Refused::new(k, "must be an object"))?;
                }
                "truncation" if v.as_str() == Some("disabled") => {}
                "metadata" if v.as_object().is_some_and(Vec::is_empty) => {}
                "background" if matches!(v, J::Bool(false)) => {}
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
            Some(s @ J::Str(_)) => messages.push(jo! {"role" => "user", "content" => s.clone()}),
            Some(J::Arr(items)) => input_items(items, anthropic, &mut messages)?,
            Some(_) => {
                return Err(Refused::new(
                    "input",
                    "must be a string or an array of items",
                ));
            }
        }
        set(&mut out, "messages", J::Arr(messages));
        Ok((J::Obj(out), echo))
    }

    fn reasoning_to_chat<'a>(
        v: &J<'a>,
        anthropic: bool,
        out: &mut Pairs<'a>,
    ) -> Result<(), Refused> {
        let r = v
            .as_object()
            .ok_or_else(|| Refused::new("reasoning", "must be an object"))?;
        for (k, v) in r {
            if v.is_null() {
                continue;
            }
            match k.as_ref() {
                "effort" => {
                    let e = v
                        .as_str()
                        .ok_or_else(|| Refused::new("reasoning.effort", "must be a string"))?;
                    if anthropic && !request::effort_known(e) {
                        return Err(Refused::new(
                            "reasoning.effort",
                            format!("must be {} for an Anthropic provider", request::EFFORTS),
                        ));
                    }
                    set(out, "reasoning_effort", v.clone());
                }
                // Summaries are the reasoning text the target streams back, when it gives any.
                "summary" | "generate_summary" => {
                    v.as_str().ok_or_else(|| {
                        Refused::new(format!("reasoning.{k}"), "must be a string")
                    })?;
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

    fn text_to_chat<'a>(v: &J<'a>, anthropic: bool, out: &mut Pairs<'a>) -> Result<(), Refused> {
        let t = v
            .as_object()
            .ok_or_else(|| Refused::new("text", "must be an object"))?;
        for (k, v) in t {
            if v.is_null() {
                continue;
            }
            match k.as_ref() {
                "format" => {
                    let kind = v.get("type").and_then(J::as_str);
                    match kind {
                        Some("text") => {}
                        Some("json_object") if anthropic => {
                            return Err(Refused::new(
                                "text.format",
                                "json_object cannot be honoured by an Anthropic provider (its structured output takes a schema: send json_schema)",
                            ));
                        }
                        // Checked here under the Responses names; the Chat Completions →
                        // Messages converter makes it `output_config.format`.
                        Some("json_schema") if anthropic => {
                            let mut schema = None;
                            for (f, x) in v.as_object().into_iter().flatten() {
                                let at = || format!("text.format.{f}");
                                match f.as_ref() {
                                    _ if x.is_null() => {}
                                    "type" => {}
                                    "name" => {
                                        x.as_str().ok_or_else(|| {
                                            Refused::new(at(), "must be a string")
                                        })?;
                                    }
                                    "strict" => {
                                        x.as_bool().ok_or_else(|| {
                                            Refused::new(at(), "must be a boolean")
                                        })?;
                                    }
                                    "schema" if x.as_object().is_some() => schema = Some(x),
                                    "schema" => {
                                        return Err(Refused::new(at(), "must be an object"));
                                    }
                                    _ => {
                                        return Err(Refused::new(
                                            at(),
                                            "has no counterpart in the Anthropic Messages API",
                                        ));
                                    }
                                }
                            }
                            let Some(schema) = schema else {
                                return Err(Refused::new(
                                    "text.format.schema",
                                    "is required for an Anthropic provider",
                                ));
                            };
                            set(
                                out,
                                "response_format",
                                jo! {"type" => "json_schema", "json_schema" => jo!{"schema" => schema.clone()}},
                            );
                        }
                        Some("json_object") => {
                            set(out, "response_format", jo! {"type" => "json_object"});
                        }
                        Some("json_schema") => {
                            super::chat_schema_keys(v)?;
                            let mut schema: Pairs<'a> = Vec::new();
                            for f in ["name", "description", "schema", "strict"] {
                                if let Some(x) = v.get(f) {
                                    schema.push((f.into(), x.clone()));
                                }
                            }
                            set(
                                out,
                                "response_format",
                                jo! {"type" => "json_schema", "json_schema" => J::Obj(schema)},
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
                "verbosity" if !anthropic => set(out, "verbosity", v.clone()),
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
    fn tools_to_chat<'a>(
        v: &J<'a>,
        anthropic: bool,
        namespaced: &mut Vec<Namespaced>,
    ) -> Result<J<'a>, Refused> {
        let list = v
            .as_array()
            .ok_or_else(|| Refused::new("tools", "must be an array"))?;
        let mut out = Vec::with_capacity(list.len());
        // Where each offered tool came from: (tools index, index inside its namespace).
        let mut origins: Vec<(usize, Option<usize>)> = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let t = t
                .as_object()
                .ok_or_else(|| Refused::new(format!("tools[{i}]"), "must be an object"))?;
            match member(t, "type").and_then(J::as_str) {
                Some("function") => {
                    let f = function_to_chat(t, (i, None), anthropic, None)?;
                    out.push(jo! {"type" => "function", "function" => J::Obj(f)});
                    origins.push((i, None));
                }
                Some("namespace") => {
                    namespace_to_chat(t, i, anthropic, namespaced, &mut out, &mut origins)?;
                }
                Some(kind @ ("web_search" | "web_search_preview" | "web_search_2025_08_26")) => {
                    return Err(Refused::new(
                        tool_field(i, None, "type"),
                        format!(
                            "{kind:?} is a hosted tool that only OpenAI's own Responses API runs; a Chat Completions or Anthropic provider cannot run it, so leave it out (Codex CLI: web_search = \"disabled\")"
                        ),
                    ));
                }
                _ => {
                    return Err(Refused::new(
                        tool_field(i, None, "type"),
                        "only function and namespace tools can be offered to a provider that does not speak the Responses API",
                    ));
                }
            }
        }
        for (k, t) in out.iter().enumerate() {
            let name = offered_name(t);
            if out[..k].iter().any(|u| offered_name(u) == name) {
                let (i, j) = origins[k];
                return Err(Refused::new(
                    tool_field(i, j, "name"),
                    format!("gives a second tool the name {name:?} once namespaces are flattened"),
                ));
            }
        }
        Ok(J::Arr(out))
    }

    /// The name a chat tool is offered by.
    fn offered_name<'p>(t: &'p J<'_>) -> &'p str {
        t.at("function").at("name").as_str().unwrap_or("")
    }

    /// Namespace tool `i`'s function tools, each pushed to `out` as a chat function tool named
    /// [`flat_name`] (its origin to `origins`); the namespace's description leads each tool's.
    fn namespace_to_chat<'a>(
        t: &Pairs<'a>,
        i: usize,
        anthropic: bool,
        namespaced: &mut Vec<Namespaced>,
        out: &mut Vec<J<'a>>,
        origins: &mut Vec<(usize, Option<usize>)>,
    ) -> Result<(), Refused> {
        let here = |f: &str| tool_field(i, None, f);
        let mut ns_name = None;
        let mut ns_description = None;
        let mut tools = None;
        for (k, v) in t {
            match k.as_ref() {
                "type" => {}
                "name" => {
                    let n = v
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .ok_or_else(|| Refused::new(here("name"), "must be a non-empty string"))?;
                    ns_name = Some(n);
                }
                "description" if v.is_null() => {}
                "description" => {
                    let d = v
                        .as_str()
                        .ok_or_else(|| Refused::new(here("description"), "must be a string"))?;
                    ns_description = Some(d).filter(|d| !d.is_empty());
                }
                "tools" => {
                    tools = Some(
                        v.as_array()
                            .ok_or_else(|| Refused::new(here("tools"), "must be an array"))?,
                    );
                }
                other => {
                    return Err(Refused::new(
                        here(other),
                        format!("is not supported in {RESPONSES}"),
                    ));
                }
            }
        }
        let ns_name = ns_name.ok_or_else(|| Refused::new(here("name"), "is required"))?;
        let tools = tools.ok_or_else(|| Refused::new(here("tools"), "is required"))?;
        for (j, inner) in tools.iter().enumerate() {
            let inner = inner.as_object().ok_or_else(|| {
                Refused::new(format!("tools[{i}].tools[{j}]"), "must be an object")
            })?;
            if member(inner, "type").and_then(J::as_str) != Some("function") {
                return Err(Refused::new(
                    tool_field(i, Some(j), "type"),
                    "only function tools can be translated inside a namespace",
                ));
            }
            let mut f = function_to_chat(inner, (i, Some(j)), anthropic, ns_description)?;
            let name = member(&f, "name")
                .and_then(J::as_str)
                .unwrap_or("")
                .to_owned();
            let flat = flat_name(ns_name, &name);
            if flat.len() > MAX_TOOL_NAME {
                return Err(Refused::new(
                    tool_field(i, Some(j), "name"),
                    format!(
                        "with its namespace makes {flat:?}, longer than the {MAX_TOOL_NAME} characters a provider takes as a tool name"
                    ),
                ));
            }
            set(&mut f, "name", J::from(flat.clone()));
            namespaced.push(Namespaced {
                flat,
                namespace: ns_name.to_owned(),
                name,
            });
            out.push(jo! {"type" => "function", "function" => J::Obj(f)});
            origins.push((i, Some(j)));
        }
        Ok(())
    }

    /// A Responses function tool (tool `i`, or function tool `j` of namespace tool `i`) as the
    /// `function` object of a chat tool; `lead`: a text put before its description (its
    /// namespace's).
    fn function_to_chat<'a>(
        t: &Pairs<'a>,
        (i, j): (usize, Option<usize>),
        anthropic: bool,
        lead: Option<&str>,
    ) -> Result<Pairs<'a>, Refused> {
        let at = |f: &str| tool_field(i, j, f);
        let mut f: Pairs<'a> = Vec::with_capacity(4);
        for (k, v) in t {
            match k.as_ref() {
                "type" => {}
                "name" => {
                    v.as_str()
                        .ok_or_else(|| Refused::new(at("name"), "must be a string"))?;
                    f.push((k.clone(), v.clone()));
                }
                "description" | "parameters" if !v.is_null() => {
                    f.push((k.clone(), v.clone()));
                }
                "description" | "parameters" => {}
                "strict" if anthropic && matches!(v, J::Bool(true)) => {
                    return Err(Refused::new(
                        at("strict"),
                        "strict schemas cannot be enforced by an Anthropic provider",
                    ));
                }
                "strict" if anthropic || v.is_null() => {}
                "strict" => f.push((k.clone(), v.clone())),
                other => {
                    return Err(Refused::new(
                        at(other),
                        format!("is not supported in {RESPONSES}"),
                    ));
                }
            }
        }
        if member(&f, "name").is_none() {
            return Err(Refused::new(at("name"), "is required"));
        }
        if let Some(lead) = lead {
            let d = match member(&f, "description").and_then(J::as_str) {
                Some(d) if !d.is_empty() => format!("{lead}\n\n{d}"),
                _ => lead.to_owned(),
            };
            set(&mut f, "description", J::from(d));
        }
        Ok(f)
    }

    fn tool_choice_to_chat<'a>(v: &J<'a>) -> Result<J<'a>, Refused> {
        match v {
            J::Str(s) if matches!(s.as_ref(), "auto" | "none" | "required") => Ok(v.clone()),
            J::Obj(_) if v.at("type").as_str() == Some("function") => {
                let name = v.at("name");
                let plain = name
                    .as_str()
                    .ok_or_else(|| Refused::new("tool_choice.name", "must be a string"))?;
                // A namespaced tool is chosen by the name it was offered by.
                let name = match v.at("namespace") {
                    J::Null => name.clone(),
                    J::Str(ns) => J::from(flat_name(ns, plain)),
                    _ => {
                        return Err(Refused::new("tool_choice.namespace", "must be a string"));
                    }
                };
                Ok(jo! {"type" => "function", "function" => jo! {"name" => name}})
            }
            _ => Err(Refused::new(
                "tool_choice",
                "must be auto, none, required or a function",
            )),
        }
    }

    /// Content of input item `i`'s `field` (`content`, or a function call's `output`) as Chat
    /// Completions content: a string stays a string; parts become text and image parts.
    fn content_to_chat<'a>(
        v: &J<'a>,
        i: usize,
        field: &str,
        assistant: bool,
    ) -> Result<J<'a>, Refused> {
        let parts = match v {
            J::Str(_) => return Ok(v.clone()),
            J::Arr(a) => a,
            _ => {
                return Err(Refused::new(
                    format!("input[{i}].{field}"),
                    "must be a string or an array of parts",
                ));
            }
        };
        let here = |j: usize, f: &str| format!("input[{i}].{field}[{j}]{f}");
        let mut out = Vec::with_capacity(parts.len());
        for (j, p) in parts.iter().enumerate() {
            match p.at("type").as_str() {
                Some("input_text") | Some("output_text") => {
                    let text = p.at("text");
                    text.as_str()
                        .ok_or_else(|| Refused::new(here(j, ".text"), "must be a string"))?;
                    out.push(jo! {"type" => "text", "text" => text.clone()});
                }
                Some("refusal") if assistant => {
                    let text = p.at("refusal");
                    text.as_str()
                        .ok_or_else(|| Refused::new(here(j, ".refusal"), "must be a string"))?;
                    out.push(jo! {"type" => "text", "text" => text.clone()});
                }
                Some("input_image") if !assistant => {
                    let url = p.at("image_url");
                    if url.as_str().is_none() {
                        return Err(Refused::new(
                            here(j, ".image_url"),
                            "is required (images by file_id cannot be translated)",
                        ));
                    }
                    let mut image: Pairs<'a> = vec![("url".into(), url.clone())];
                    let detail = p.at("detail");
                    if !detail.is_null() && detail.as_str() != Some("auto") {
                        image.push(("detail".into(), detail.clone()));
                    }
                    out.push(jo! {"type" => "image_url", "image_url" => J::Obj(image)});
                }
                _ => {
                    return Err(Refused::new(
                        here(j, ".type"),
                        format!("is not supported in {RESPONSES}"),
                    ));
                }
            }
        }
        Ok(J::Arr(out))
    }

    /// The input items as chat messages, appended to `messages` (which holds the
    /// instructions, if any). An assistant message followed by function calls is one chat
    /// assistant message with `tool_calls`.
    fn input_items<'a>(
        items: &[J<'a>],
        anthropic: bool,
        messages: &mut Vec<J<'a>>,
    ) -> Result<(), Refused> {
        let mut seen_turn = false;
        for (i, item) in items.iter().enumerate() {
            let at = |f: &str| format!("input[{i}].{f}");
            if item.as_object().is_none() {
                return Err(Refused::new(format!("input[{i}]"), "must be an object"));
            }
            let kind = item.at("type").as_str().unwrap_or("message");
            match kind {
                "message" => {
                    let role_j = item.at("role");
                    let role = role_j
                        .as_str()
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
                    let content =
                        content_to_chat(item.at("content"), i, "content", role == "assistant")?;
                    messages.push(jo! {"role" => role_j.clone(), "content" => content});
                }
                "function_call" => {
                    seen_turn = true;
                    let field = |f: &str| {
                        let v = item.at(f);
                        match v {
                            J::Str(_) => Ok(v.clone()),
                            _ => Err(Refused::new(at(f), "must be a string")),
                        }
                    };
                    // A call of a namespaced tool goes under the name the tool was offered by.
                    let name = match item.at("namespace") {
                        J::Null => field("name")?,
                        J::Str(ns) => {
                            let name = field("name")?;
                            J::from(flat_name(ns, name.as_str().unwrap_or("")))
                        }
                        _ => return Err(Refused::new(at("namespace"), "must be a string")),
                    };
                    let call = jo! {"id" => field("call_id")?, "type" => "function",
                    "function" => jo! {"name" => name, "arguments" => field("arguments")?}};
                    // Joins the assistant message right before it (its text, or earlier calls).
                    match messages.last_mut() {
                        Some(m) if m.at("role").as_str() == Some("assistant") => {
                            match m.get_mut("tool_calls") {
                                Some(J::Arr(calls)) => calls.push(call),
                                _ => m.insert("tool_calls", J::Arr(vec![call])),
                            }
                        }
                        _ => messages.push(
                            jo! {"role" => "assistant", "content" => J::Null, "tool_calls" => J::Arr(vec![call])},
                        ),
                    }
                }
                "function_call_output" => {
                    seen_turn = true;
                    let id = item.at("call_id");
                    id.as_str()
                        .ok_or_else(|| Refused::new(at("call_id"), "must be a string"))?;
                    let output = match item.at("output") {
                        s @ J::Str(_) => s.clone(),
                        v @ J::Arr(_) => {
                            let parts = content_to_chat(v, i, "output", false)?;
                            if parts.as_array().is_some_and(|p| {
                                p.iter().any(|x| x.at("type").as_str() != Some("text"))
                            }) {
                                return Err(Refused::new(
                                    at("output"),
                                    "tool outputs carry text only once translated",
                                ));
                            }
                            parts
                        }
                        _ => return Err(Refused::new(at("output"), "must be a string or parts")),
                    };
                    messages.push(
                        jo! {"role" => "tool", "tool_call_id" => id.clone(), "content" => output},
                    );
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
    pub(super) finish: Option<String>,
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
