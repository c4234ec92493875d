//! Request bodies: Chat Completions → Messages and Messages → Chat Completions. Every
//! top-level field and every content part is either mapped, accepted because it holds the
//! default the target assumes anyway, dropped by a rule `docs/translation.md` states, or
//! refused with a [`Refused`] naming its JSON path.

#[cfg(test)]
use serde_json::{Map, Value};

use super::Refused;
use super::json::{J, Pairs, Unescaped, jo, set};

#[cfg(test)]
type Obj = Map<String, Value>;

/// `max_tokens` sent to an Anthropic provider when the OpenAI request names none
/// (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Thinking budgets for OpenAI's `reasoning_effort` levels. `xhigh` (OpenAI's level above
/// `high`, taken by its newer models) gets 32768: twice `high`'s, and the top of the range
/// Anthropic's extended-thinking guide recommends (past 32K the model seldom uses the
/// budget).
pub const EFFORT_BUDGETS: [(&str, u64); 4] = [
    ("low", 1024),
    ("medium", 4096),
    ("high", 16384),
    ("xhigh", 32768),
];

/// The `reasoning_effort` values an Anthropic provider is asked for, as a refusal says.
pub const EFFORTS: &str = "none, minimal, low, medium, high or xhigh";

/// Whether an Anthropic provider can be asked for `reasoning_effort` `e`: a thinking
/// budget's level, or no thinking (`none`, `minimal`).
pub fn effort_known(e: &str) -> bool {
    e == "none" || e == "minimal" || EFFORT_BUDGETS.iter().any(|(n, _)| *n == e)
}

/// The `reasoning_effort` for an Anthropic thinking budget: the level whose budget is the
/// nearest at or above it (`high` past 4096: `xhigh` is not sent, as only OpenAI's newer
/// models take it, while every reasoning model takes `high`).
pub fn effort_of_budget(budget: u64) -> &'static str {
    match budget {
        0..=1024 => "low",
        1025..=4096 => "medium",
        _ => "high",
    }
}

/// A translated request body and what the response side needs to know about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Translated {
    pub body: Vec<u8>,
    /// The client asked for the usage chunk (`stream_options.include_usage`); only
    /// meaningful for an OpenAI client.
    pub include_usage: bool,
}

#[cfg(test)]
pub(super) fn parse_object(body: &[u8]) -> Result<Obj, Refused> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Refused::new("body", "must be a JSON object")),
        Err(e) => Err(Refused::new("body", format!("is not valid JSON: {e}"))),
    }
}

#[cfg(test)]
pub(super) fn to_bytes(v: &Obj) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

fn no_counterpart(field: &str, target: &str) -> Refused {
    Refused::new(field, format!("has no counterpart in {target}"))
}

const ANTHROPIC: &str = "the Anthropic Messages API";
const OPENAI: &str = "the OpenAI Chat Completions API";

// ---------------------------------------------------------------------------------------
// Chat Completions → Messages
// ---------------------------------------------------------------------------------------

/// An OpenAI Chat Completions request as an Anthropic Messages request for `model`. The
/// body is read into a borrowing tree (`J`) and the answer written from one: no string
/// of the conversation is copied on the way.
pub fn chat_to_messages(body: &[u8], model: &str) -> Result<Translated, Refused> {
    let mut unescaped = Unescaped::of(body);
    let req = match J::parse_in(&mut unescaped).0 {
        Ok(j @ J::Obj(_)) => j,
        Ok(_) => return Err(Refused::new("body", "must be a JSON object")),
        Err(e) => return Err(Refused::new("body", format!("is not valid JSON: {e}"))),
    };
    let (out, include_usage) = chat_to_messages_j(&req, model)?;
    Ok(Translated {
        body: out.to_vec_sized(body.len() + 256),
        include_usage,
    })
}

/// The object form of [`chat_to_messages`] (for the tests).
#[cfg(test)]
pub fn chat_to_messages_obj(req: &Obj, model: &str) -> Result<(Obj, bool), Refused> {
    let t = chat_to_messages(&to_bytes(req), model)?;
    let out = parse_object(&t.body)?;
    Ok((out, t.include_usage))
}

/// A field's path, formatted only when a refusal names it (building every path up front
/// cost more than the translation itself).
trait FieldPath {
    fn path(self) -> String;
}

impl FieldPath for &str {
    fn path(self) -> String {
        self.to_owned()
    }
}

/// A path made on demand.
struct P<F>(F);

impl<F: FnOnce() -> String> FieldPath for P<F> {
    fn path(self) -> String {
        (self.0)()
    }
}

fn jwant_u64(v: &J<'_>, field: impl FieldPath) -> Result<u64, Refused> {
    v.as_u64()
        .ok_or_else(|| Refused::new(field.path(), "must be a non-negative integer"))
}

fn jwant_str<'v>(v: &'v J<'_>, field: impl FieldPath) -> Result<&'v str, Refused> {
    v.as_str()
        .ok_or_else(|| Refused::new(field.path(), "must be a string"))
}

fn jwant_array<'v, 'a>(v: &'v J<'a>, field: impl FieldPath) -> Result<&'v Vec<J<'a>>, Refused> {
    v.as_array()
        .ok_or_else(|| Refused::new(field.path(), "must be an array"))
}

fn jwant_object<'v, 'a>(v: &'v J<'a>, field: impl FieldPath) -> Result<&'v Pairs<'a>, Refused> {
    v.as_object()
        .ok_or_else(|| Refused::new(field.path(), "must be an object"))
}

/// The member `key` of `pairs`, or `null`.
fn member<'v, 'a>(pairs: &'v Pairs<'a>, key: &str) -> &'v J<'a> {
    static NULL: J<'static> = J::Null;
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map_or(&NULL, |(_, v)| v)
}

/// Refuses a field unless it holds the value the target assumes (or is null).
fn jdefault_only(v: &J<'_>, field: &str, ok: &[J<'_>], target: &str) -> Result<(), Refused> {
    let same = |o: &J<'_>| match (v, o) {
        // 0 and 0.0 are the same number.
        (J::F(_) | J::U(_) | J::I(_), J::F(_) | J::U(_) | J::I(_)) => v.as_f64() == o.as_f64(),
        _ => v == o,
    };
    if v.is_null() || ok.iter().any(same) {
        Ok(())
    } else {
        Err(Refused::new(
            field,
            format!("has no counterpart in {target} (only its default is accepted)"),
        ))
    }
}

pub(super) fn chat_to_messages_j<'a>(
    req: &J<'a>,
    model: &'a str,
) -> Result<(J<'a>, bool), Refused> {
    let mut out: Pairs<'a> = Vec::with_capacity(12);
    set(&mut out, "model", J::from(model));
    let mut max_tokens: Option<u64> = None;
    let mut effort: Option<&str> = None;
    let mut parallel: Option<bool> = None;
    let mut tool_choice: Option<&J<'a>> = None;
    let mut include_usage = false;
    let mut messages: Option<&J<'a>> = None;
    let mut metadata: Pairs<'a> = Vec::new();
    for (k, v) in req.as_object().into_iter().flatten() {
        let k: &str = k;
        if v.is_null() {
            continue;
        }
        match k {
            "model" => {}
            "messages" => messages = Some(v),
            "max_tokens" | "max_completion_tokens" => max_tokens = Some(jwant_u64(v, k)?),
            "temperature" => {
                let t = v
                    .as_f64()
                    .ok_or_else(|| Refused::new(k, "must be a number"))?;
                if !(0.0..=1.0).contains(&t) {
                    return Err(Refused::new(
                        k,
                        "must be between 0 and 1 for an Anthropic provider",
                    ));
                }
                set(&mut out, "temperature", v.clone());
            }
            "top_p" => {
                v.as_f64()
                    .ok_or_else(|| Refused::new(k, "must be a number"))?;
                set(&mut out, "top_p", v.clone());
            }
            "stop" => {
                let list = match v {
                    J::Str(_) => vec![v.clone()],
                    J::Arr(a) => {
                        for (i, s) in a.iter().enumerate() {
                            jwant_str(s, P(|| format!("stop[{i}]")))?;
                        }
                        a.clone()
                    }
                    _ => return Err(Refused::new(k, "must be a string or an array of strings")),
                };
                set(&mut out, "stop_sequences", J::Arr(list));
            }
            "stream" => {
                let b = v
                    .as_bool()
                    .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                set(&mut out, "stream", J::Bool(b));
            }
            "stream_options" => {
                for (ok, ov) in jwant_object(v, k)? {
                    match &**ok {
                        "include_usage" => include_usage = ov.as_bool().unwrap_or(false),
                        other => {
                            return Err(no_counterpart(
                                &format!("stream_options.{other}"),
                                ANTHROPIC,
                            ));
                        }
                    }
                }
            }
            "user" => {
                set(
                    &mut metadata,
                    "user_id",
                    J::from(jwant_str(v, k)?.to_owned()),
                );
            }
            "tools" => {
                set(&mut out, "tools", tools_to_anthropic(v)?);
            }
            "tool_choice" => tool_choice = Some(v),
            "parallel_tool_calls" => {
                parallel = Some(
                    v.as_bool()
                        .ok_or_else(|| Refused::new(k, "must be a boolean"))?,
                )
            }
            "reasoning_effort" => effort = Some(jwant_str(v, k)?),
            "response_format" => {
                if let Some(c) = response_format_to_anthropic(v)? {
                    set(&mut out, "output_config", c);
                }
            }
            "n" => jdefault_only(v, k, &[J::U(1)], ANTHROPIC)?,
            "presence_penalty" | "frequency_penalty" => jdefault_only(v, k, &[J::U(0)], ANTHROPIC)?,
            "logprobs" | "store" => jdefault_only(v, k, &[J::Bool(false)], ANTHROPIC)?,
            other => return Err(no_counterpart(other, ANTHROPIC)),
        }
    }
    let Some(messages) = messages else {
        return Err(Refused::new("messages", "is required"));
    };
    let (system, turns) = chat_messages_to_anthropic(messages)?;
    if let Some(s) = system {
        set(&mut out, "system", s);
    }
    set(&mut out, "messages", J::Arr(turns));
    let mut max_tokens = max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if let Some(e) = effort {
        match EFFORT_BUDGETS.iter().find(|(n, _)| *n == e) {
            Some((_, budget)) => {
                // Anthropic requires max_tokens above the thinking budget: the budget is
                // added on top of what the client allowed for the answer.
                if max_tokens <= *budget {
                    max_tokens += budget;
                }
                set(
                    &mut out,
                    "thinking",
                    jo! {"type" => "enabled", "budget_tokens" => *budget},
                );
            }
            None if e == "none" || e == "minimal" => {}
            None => {
                return Err(Refused::new(
                    "reasoning_effort",
                    format!("must be {EFFORTS}"),
                ));
            }
        }
    }
    set(&mut out, "max_tokens", J::U(max_tokens));
    if let Some(tc) = tool_choice_to_anthropic(tool_choice, parallel)? {
        set(&mut out, "tool_choice", tc);
    }
    if !metadata.is_empty() {
        set(&mut out, "metadata", J::Obj(metadata));
    }
    Ok((J::Obj(out), include_usage))
}

/// `response_format` → Anthropic's structured output, `output_config` `{format: {type:
/// json_schema, schema}}`; `text` (the default) sends nothing. The schema's `name` is
/// dropped (Anthropic's format has none; it is a label, not something the model is asked
/// to follow) and `strict` is accepted either way: Anthropic's structured output always
/// follows the schema, which a non-strict request permits too. `json_object` (JSON without
/// a schema) and a `description` (guidance for the model) have no counterpart.
fn response_format_to_anthropic<'a>(v: &J<'a>) -> Result<Option<J<'a>>, Refused> {
    let f = jwant_object(v, "response_format")?;
    match member(f, "type").as_str() {
        Some("text") => return Ok(None),
        Some("json_schema") => {}
        Some("json_object") => {
            return Err(Refused::new(
                "response_format",
                "json_object cannot be honoured by an Anthropic provider (its structured output takes a schema: send json_schema)",
            ));
        }
        _ => {
            return Err(Refused::new(
                "response_format.type",
                "must be text, json_object or json_schema",
            ));
        }
    }
    let mut schema = None;
    for (k, v) in f {
        match &**k {
            _ if v.is_null() => {}
            "type" => {}
            "json_schema" => {
                for (sk, sv) in jwant_object(v, "response_format.json_schema")? {
                    let at = || format!("response_format.json_schema.{sk}");
                    match &**sk {
                        _ if sv.is_null() => {}
                        "name" => {
                            jwant_str(sv, P(at))?;
                        }
                        "strict" => {
                            sv.as_bool()
                                .ok_or_else(|| Refused::new(at(), "must be a boolean"))?;
                        }
                        "schema" => {
                            jwant_object(sv, P(at))?;
                            schema = Some(sv.clone());
                        }
                        _ => return Err(no_counterpart(&at(), ANTHROPIC)),
                    }
                }
            }
            other => {
                return Err(no_counterpart(
                    &format!("response_format.{other}"),
                    ANTHROPIC,
                ));
            }
        }
    }
    let Some(schema) = schema else {
        return Err(Refused::new(
            "response_format.json_schema.schema",
            "is required for an Anthropic provider",
        ));
    };
    Ok(Some(
        jo! {"format" => jo!{"type" => "json_schema", "schema" => schema}},
    ))
}

fn tools_to_anthropic<'a>(v: &J<'a>) -> Result<J<'a>, Refused> {
    let list = jwant_array(v, "tools")?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = |f: &str| format!("tools[{i}].{f}");
        let t = jwant_object(t, P(|| format!("tools[{i}]")))?;
        match member(t, "type").as_str() {
            Some("function") => {}
            _ => {
                return Err(Refused::new(
                    at("type"),
                    "only function tools can be offered to an Anthropic provider",
                ));
            }
        }
        let f = jwant_object(member(t, "function"), P(|| at("function")))?;
        let mut tool: Pairs<'a> = Vec::with_capacity(4);
        for (k, v) in f {
            match &**k {
                "name" => {
                    jwant_str(v, P(|| at("function.name")))?;
                    set(&mut tool, "name", v.clone());
                }
                "description" if !v.is_null() => {
                    set(&mut tool, "description", v.clone());
                }
                "parameters" if !v.is_null() => {
                    set(&mut tool, "input_schema", v.clone());
                }
                "strict" => jdefault_only(v, &at("function.strict"), &[J::Bool(false)], ANTHROPIC)?,
                "description" | "parameters" => {}
                other => return Err(no_counterpart(&at(&format!("function.{other}")), ANTHROPIC)),
            }
        }
        if !tool.iter().any(|(k, _)| k == "name") {
            return Err(Refused::new(at("function.name"), "is required"));
        }
        if !tool.iter().any(|(k, _)| k == "input_schema") {
            set(
                &mut tool,
                "input_schema",
                jo! {"type" => "object", "properties" => J::Obj(Vec::new())},
            );
        }
        let cc = member(t, "cache_control");
        if !cc.is_null() {
            set(&mut tool, "cache_control", cc.clone());
        }
        out.push(J::Obj(tool));
    }
    Ok(J::Arr(out))
}

fn tool_choice_to_anthropic<'a>(
    choice: Option<&J<'a>>,
    parallel: Option<bool>,
) -> Result<Option<J<'a>>, Refused> {
    let refuse = || Refused::new("tool_choice", "must be auto, none, required or a function");
    let mut tc = match choice {
        None => None,
        Some(J::Str(s)) => match s.as_ref() {
            "auto" => Some(jo! {"type" => "auto"}),
            "none" => Some(jo! {"type" => "none"}),
            "required" => Some(jo! {"type" => "any"}),
            _ => return Err(refuse()),
        },
        Some(v) => {
            let name = v.get("function").and_then(|f| f.get("name"));
            match (v.get("type").and_then(J::as_str), name) {
                (Some("function"), Some(n @ J::Str(_))) => {
                    Some(jo! {"type" => "tool", "name" => n.clone()})
                }
                _ => return Err(refuse()),
            }
        }
    };
    if parallel == Some(false) {
        let t = tc.get_or_insert_with(|| jo! {"type" => "auto"});
        if t.at("type").as_str() != Some("none") {
            t.insert("disable_parallel_tool_use", J::Bool(true));
        }
    }
    Ok(tc)
}

/// `data:<media type>;base64,<data>` → (media type, data).
pub(super) fn data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.strip_suffix(";base64")?;
    Some((media, data))
}

/// A sub-slice of a borrowed string as a borrowed string (an owned one is copied).
fn sub<'a>(whole: &J<'a>, part: &str) -> J<'a> {
    match whole {
        J::Str(std::borrow::Cow::Borrowed(s)) => {
            let start = part.as_ptr() as usize - s.as_ptr() as usize;
            J::from(&s[start..start + part.len()])
        }
        _ => J::from(part.to_owned()),
    }
}

/// An OpenAI user content part as an Anthropic content block.
fn part_to_block<'a>(part: &J<'a>, at: &dyn Fn() -> String) -> Result<J<'a>, Refused> {
    let p = jwant_object(part, P(at))?;
    let mut block = match member(p, "type").as_str() {
        Some("text") => {
            let t = member(p, "text");
            jwant_str(t, P(|| format!("{}.text", at())))?;
            jo! {"type" => "text", "text" => t.clone()}
        }
        Some("image_url") => {
            let iu = member(p, "image_url");
            let url_j = match iu {
                J::Str(_) => iu,
                _ => iu.at("url"),
            };
            let url = match iu {
                J::Str(s) => &**s,
                _ => jwant_str(url_j, P(|| format!("{}.image_url.url", at())))?,
            };
            if url.starts_with("data:") {
                let Some((media, data)) = data_url(url) else {
                    return Err(Refused::new(
                        format!("{}.image_url.url", at()),
                        "a data URL must be base64 (data:<type>;base64,…)",
                    ));
                };
                let source = jo! {"type" => "base64", "media_type" => sub(url_j, media), "data" => sub(url_j, data)};
                jo! {"type" => "image", "source" => source}
            } else {
                jo! {"type" => "image", "source" => jo!{"type" => "url", "url" => url_j.clone()}}
            }
        }
        _ => {
            return Err(Refused::new(
                format!("{}.type", at()),
                "only text and image_url parts can be sent to an Anthropic provider",
            ));
        }
    };
    let cc = member(p, "cache_control");
    if p.iter().any(|(k, _)| k == "cache_control") {
        block.insert("cache_control", cc.clone());
    }
    Ok(block)
}

/// Text-only content (system prompts, tool results) as Anthropic blocks, or a string.
fn text_content<'a>(v: &J<'a>, at: &dyn Fn() -> String) -> Result<J<'a>, Refused> {
    match v {
        J::Str(_) => Ok(v.clone()),
        J::Arr(parts) => {
            let mut blocks = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let at = || format!("{}[{j}]", at());
                if p.get("type").and_then(J::as_str) != Some("text") {
                    return Err(Refused::new(
                        format!("{}.type", at()),
                        "only text parts are accepted here",
                    ));
                }
                blocks.push(part_to_block(p, &at)?);
            }
            Ok(J::Arr(blocks))
        }
        _ => Err(Refused::new(at(), "must be a string or an array of parts")),
    }
}

/// OpenAI `messages` → Anthropic (`system`, `messages`).
fn chat_messages_to_anthropic<'a>(v: &J<'a>) -> Result<(Option<J<'a>>, Vec<J<'a>>), Refused> {
    let msgs = jwant_array(v, "messages")?;
    let mut system: Vec<J<'a>> = Vec::new();
    let mut system_string: Option<J<'a>> = None;
    let mut system_count = 0usize;
    let mut turns: Vec<J<'a>> = Vec::with_capacity(msgs.len());
    // Whether the last turn is a user turn built from tool results (more results, and a
    // following user message, join it: Anthropic wants them in one user turn).
    let mut last_is_results = false;
    for (i, m) in msgs.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}].{f}");
        let m = jwant_object(m, P(|| format!("messages[{i}]")))?;
        let role = jwant_str(member(m, "role"), P(|| at("role")))?;
        for (k, v) in m {
            let k: &str = k;
            let known = matches!(k, "role" | "content")
                || (role == "assistant"
                    && matches!(k, "tool_calls" | "reasoning_content" | "refusal"))
                || (role == "tool" && k == "tool_call_id");
            if !known && !v.is_null() {
                return Err(no_counterpart(&at(k), ANTHROPIC));
            }
        }
        let content = member(m, "content");
        match role {
            "system" | "developer" => {
                if !turns.is_empty() {
                    return Err(Refused::new(
                        at("role"),
                        "an Anthropic provider takes system prompts only before the first turn",
                    ));
                }
                system_count += 1;
                match text_content(content, &|| at("content"))? {
                    s @ J::Str(_) => {
                        system.push(jo! {"type" => "text", "text" => s.clone()});
                        system_string = Some(s);
                    }
                    J::Arr(blocks) => {
                        system_string = None;
                        system.extend(blocks);
                    }
                    _ => {}
                }
            }
            "user" => {
                let c = match content {
                    J::Str(_) => content.clone(),
                    J::Arr(parts) => {
                        let mut blocks = Vec::with_capacity(parts.len());
                        for (j, p) in parts.iter().enumerate() {
                            blocks
                                .push(part_to_block(p, &|| format!("messages[{i}].content[{j}]"))?);
                        }
                        J::Arr(blocks)
                    }
                    _ => return Err(Refused::new(at("content"), "must be a string or an array")),
                };
                if last_is_results
                    && let Some(J::Arr(blocks)) =
                        turns.last_mut().and_then(|t| t.get_mut("content"))
                {
                    match c {
                        s @ J::Str(_) => blocks.push(jo! {"type" => "text", "text" => s}),
                        J::Arr(more) => blocks.extend(more),
                        _ => {}
                    }
                } else {
                    turns.push(jo! {"role" => "user", "content" => c});
                }
                last_is_results = false;
            }
            "assistant" => {
                let mut blocks: Vec<J<'a>> = Vec::new();
                let mut as_string: Option<&J<'a>> = None;
                match content {
                    J::Null => {}
                    J::Str(_) => as_string = Some(content),
                    J::Arr(parts) => {
                        for (j, p) in parts.iter().enumerate() {
                            let pat = || format!("messages[{i}].content[{j}]");
                            if p.get("type").and_then(J::as_str) != Some("text") {
                                return Err(Refused::new(
                                    format!("{}.type", pat()),
                                    "an assistant turn carries only text parts",
                                ));
                            }
                            blocks.push(part_to_block(p, &pat)?);
                        }
                    }
                    _ => {
                        return Err(Refused::new(
                            at("content"),
                            "must be a string, an array or null",
                        ));
                    }
                }
                let r = member(m, "refusal");
                if !r.is_null() {
                    jwant_str(r, P(|| at("refusal")))?;
                    blocks.push(jo! {"type" => "text", "text" => r.clone()});
                }
                let calls = match member(m, "tool_calls") {
                    J::Null => &[][..],
                    v => jwant_array(v, P(|| at("tool_calls")))?.as_slice(),
                };
                for (j, c) in calls.iter().enumerate() {
                    blocks.push(tool_call_to_tool_use(c, &|| {
                        format!("messages[{i}].tool_calls[{j}]")
                    })?);
                }
                let c = match as_string {
                    Some(s) if blocks.is_empty() => s.clone(),
                    Some(s) => {
                        if s.as_str().is_some_and(|s| !s.is_empty()) {
                            blocks.insert(0, jo! {"type" => "text", "text" => s.clone()});
                        }
                        J::Arr(blocks)
                    }
                    None => J::Arr(blocks),
                };
                turns.push(jo! {"role" => "assistant", "content" => c});
                last_is_results = false;
            }
            "tool" => {
                let id = member(m, "tool_call_id");
                jwant_str(id, P(|| at("tool_call_id")))?;
                let c = match content {
                    J::Null => J::from(""),
                    _ => text_content(content, &|| at("content"))?,
                };
                let block =
                    jo! {"type" => "tool_result", "tool_use_id" => id.clone(), "content" => c};
                match turns.last_mut().and_then(|t| t.get_mut("content")) {
                    Some(J::Arr(blocks)) if last_is_results => blocks.push(block),
                    _ => turns.push(jo! {"role" => "user", "content" => vec![block]}),
                }
                last_is_results = true;
            }
            _ => {
                return Err(Refused::new(
                    at("role"),
                    "must be system, developer, user, assistant or tool",
                ));
            }
        }
    }
    let system = match (system_count, system_string) {
        (0, _) => None,
        (1, Some(s)) => Some(s),
        _ => Some(J::Arr(system)),
    };
    Ok((system, turns))
}

fn tool_call_to_tool_use<'a>(c: &J<'a>, at: &dyn Fn() -> String) -> Result<J<'a>, Refused> {
    let c = jwant_object(c, P(at))?;
    let id = member(c, "id");
    jwant_str(id, P(|| format!("{}.id", at())))?;
    let f = jwant_object(member(c, "function"), P(|| format!("{}.function", at())))?;
    let name = member(f, "name");
    jwant_str(name, P(|| format!("{}.function.name", at())))?;
    let args = match member(f, "arguments") {
        J::Null => "",
        a => jwant_str(a, P(|| format!("{}.function.arguments", at())))?,
    };
    let input: J<'a> = if args.trim().is_empty() {
        J::Obj(Vec::new())
    } else {
        // The arguments are a string holding JSON: parsed (owned: they were escaped).
        match J::parse(args.as_bytes()) {
            Ok(J::Obj(p)) => owned(J::Obj(p)),
            _ => {
                return Err(Refused::new(
                    format!("{}.function.arguments", at()),
                    "must be a JSON object for an Anthropic provider",
                ));
            }
        }
    };
    Ok(jo! {"type" => "tool_use", "id" => id.clone(), "name" => name.clone(), "input" => input})
}

/// The tree with every string owned (free of the buffer it was read from).
fn owned(j: J<'_>) -> J<'static> {
    use std::borrow::Cow;
    let own = |c: Cow<'_, str>| -> Cow<'static, str> { Cow::Owned(c.into_owned()) };
    match j {
        J::Null => J::Null,
        J::Bool(b) => J::Bool(b),
        J::U(n) => J::U(n),
        J::I(n) => J::I(n),
        J::F(n) => J::F(n),
        J::Str(s) => J::Str(own(s)),
        J::Arr(a) => J::Arr(a.into_iter().map(owned).collect()),
        J::Obj(p) => J::Obj(p.into_iter().map(|(k, v)| (own(k), owned(v))).collect()),
    }
}

// ---------------------------------------------------------------------------------------
// Messages → Chat Completions
// ---------------------------------------------------------------------------------------

/// An Anthropic Messages request as an OpenAI Chat Completions request for `model`, read
/// into and written from a borrowing tree (`J`) as [`chat_to_messages`].
pub fn messages_to_chat(body: &[u8], model: &str) -> Result<Translated, Refused> {
    let mut unescaped = Unescaped::of(body);
    let req = match J::parse_in(&mut unescaped).0 {
        Ok(j @ J::Obj(_)) => j,
        Ok(_) => return Err(Refused::new("body", "must be a JSON object")),
        Err(e) => return Err(Refused::new("body", format!("is not valid JSON: {e}"))),
    };
    let out = messages_to_chat_j(&req, model)?;
    Ok(Translated {
        body: out.to_vec_sized(body.len() + 256),
        include_usage: false,
    })
}

/// The object form of [`messages_to_chat`] (for the round-trip tests).
#[cfg(test)]
pub fn messages_to_chat_obj(req: &Obj, model: &str) -> Result<Obj, Refused> {
    let t = messages_to_chat(&to_bytes(req), model)?;
    parse_object(&t.body)
}

fn messages_to_chat_j<'a>(req: &J<'a>, model: &'a str) -> Result<J<'a>, Refused> {
    let mut out: Pairs<'a> = Vec::with_capacity(12);
    set(&mut out, "model", J::from(model));
    let mut system: Option<&J<'a>> = None;
    let mut messages: Option<&J<'a>> = None;
    let mut tool_choice: Option<&J<'a>> = None;
    let mut effort: Option<&'static str> = None;
    let mut max_tokens = false;
    for (k, v) in req.as_object().into_iter().flatten() {
        let k: &str = k;
        if v.is_null() {
            continue;
        }
        match k {
            "model" => {}
            "system" => system = Some(v),
            "output_config" => {
                let (e, format) = output_config(v)?;
                effort = e;
                if let Some(f) = format {
                    set(&mut out, "response_format", f);
                }
            }
            "context_management" => context_management(v)?,
            "messages" => messages = Some(v),
            "max_tokens" => {
                set(&mut out, "max_tokens", J::U(jwant_u64(v, k)?));
                max_tokens = true;
            }
            "temperature" => {
                v.as_f64()
                    .ok_or_else(|| Refused::new(k, "must be a number"))?;
                set(&mut out, "temperature", v.clone());
            }
            "top_p" => {
                v.as_f64()
                    .ok_or_else(|| Refused::new(k, "must be a number"))?;
                set(&mut out, "top_p", v.clone());
            }
            "stop_sequences" => {
                for (i, s) in jwant_array(v, k)?.iter().enumerate() {
                    jwant_str(s, P(|| format!("stop_sequences[{i}]")))?;
                }
                set(&mut out, "stop", v.clone());
            }
            "stream" => {
                let b = v
                    .as_bool()
                    .ok_or_else(|| Refused::new(k, "must be a boolean"))?;
                set(&mut out, "stream", J::Bool(b));
                if b {
                    // The usage chunk feeds the translated message_delta's usage.
                    set(&mut out, "stream_options", jo! {"include_usage" => true});
                }
            }
            "metadata" => {
                for (mk, mv) in jwant_object(v, k)? {
                    match &**mk {
                        "user_id" if !mv.is_null() => {
                            jwant_str(mv, "metadata.user_id")?;
                            set(&mut out, "user", mv.clone());
                        }
                        "user_id" => {}
                        other => return Err(no_counterpart(&format!("metadata.{other}"), OPENAI)),
                    }
                }
            }
            "tools" => {
                set(&mut out, "tools", tools_to_openai(v)?);
            }
            "tool_choice" => tool_choice = Some(v),
            "thinking" => {
                let t = jwant_object(v, k)?;
                match member(t, "type").as_str() {
                    Some("enabled") => {
                        let budget =
                            jwant_u64(member(t, "budget_tokens"), "thinking.budget_tokens")?;
                        set(
                            &mut out,
                            "reasoning_effort",
                            J::from(effort_of_budget(budget)),
                        );
                    }
                    // The model decides how long to think; `output_config.effort`, when
                    // given, sets the level.
                    Some("disabled" | "adaptive") => {}
                    _ => {
                        return Err(Refused::new(
                            "thinking.type",
                            "must be enabled, adaptive or disabled",
                        ));
                    }
                }
            }
            other => return Err(no_counterpart(other, OPENAI)),
        }
    }
    if let Some(e) = effort {
        set(&mut out, "reasoning_effort", J::from(e));
    }
    let mut turns: Vec<J<'a>> = Vec::new();
    if let Some(s) = system {
        turns.push(
            jo! {"role" => "system", "content" => system_to_openai(s, &|| "system".to_owned())?},
        );
    }
    let Some(messages) = messages else {
        return Err(Refused::new("messages", "is required"));
    };
    let messages = jwant_array(messages, "messages")?;
    turns.reserve(messages.len());
    for (i, m) in messages.iter().enumerate() {
        anthropic_turn_to_openai(m, i, &mut turns)?;
    }
    set(&mut out, "messages", J::Arr(turns));
    if let Some(tc) = tool_choice {
        let tc = jwant_object(tc, "tool_choice")?;
        let choice = match member(tc, "type").as_str() {
            Some("auto") => J::from("auto"),
            Some("any") => J::from("required"),
            Some("none") => J::from("none"),
            Some("tool") => {
                let n = member(tc, "name");
                jwant_str(n, "tool_choice.name")?;
                jo! {"type" => "function", "function" => jo!{"name" => n.clone()}}
            }
            _ => {
                return Err(Refused::new(
                    "tool_choice.type",
                    "must be auto, any, tool or none",
                ));
            }
        };
        set(&mut out, "tool_choice", choice);
        if member(tc, "disable_parallel_tool_use") == &J::Bool(true) {
            set(&mut out, "parallel_tool_calls", J::Bool(false));
        }
    }
    // Anthropic's API answers a request without `max_tokens` 400 invalid_request_error:
    // a client is held to the contract of the API it speaks, whichever provider serves it,
    // so that what works through the gateway works against Anthropic too.
    if !max_tokens {
        return Err(Refused::new(
            "max_tokens",
            "is required by the Anthropic Messages API",
        ));
    }
    Ok(J::Obj(out))
}

/// `output_config` → the `reasoning_effort` its `effort` asks for, and the
/// `response_format` its `format` asks for. Anthropic's levels are low, medium, high and
/// max; OpenAI's are low, medium, high and xhigh, but only its models from
/// gpt-5.1-codex-max on take xhigh (the others answer it with a 400), so max asks for high,
/// which every OpenAI reasoning model takes: a client's max keeps working whatever model
/// the route reaches. A `json_schema` format (the
/// Messages API's structured output) becomes OpenAI's strict `json_schema` response format.
fn output_config<'a>(v: &J<'a>) -> Result<(Option<&'static str>, Option<J<'a>>), Refused> {
    let mut effort = None;
    let mut format = None;
    for (k, v) in jwant_object(v, "output_config")? {
        match &**k {
            _ if v.is_null() => {}
            "effort" => {
                effort = Some(match jwant_str(v, "output_config.effort")? {
                    "low" => "low",
                    "medium" => "medium",
                    "high" | "max" => "high",
                    _ => {
                        return Err(Refused::new(
                            "output_config.effort",
                            "must be low, medium, high or max",
                        ));
                    }
                });
            }
            "format" => format = Some(json_schema_format(v)?),
            other => return Err(no_counterpart(&format!("output_config.{other}"), OPENAI)),
        }
    }
    Ok((effort, format))
}

/// `output_config.format` `{type: json_schema, schema}` → `response_format` `{type:
/// json_schema, json_schema: {name: "output", schema, strict: true}}` (Anthropic's
/// structured output always follows the schema: strict is its counterpart).
fn json_schema_format<'a>(v: &J<'a>) -> Result<J<'a>, Refused> {
    let f = jwant_object(v, "output_config.format")?;
    let mut schema = None;
    for (k, v) in f {
        match &**k {
            _ if v.is_null() => {}
            "type" => {
                if v.as_str() != Some("json_schema") {
                    return Err(Refused::new(
                        "output_config.format.type",
                        "only json_schema can be honoured by an OpenAI provider",
                    ));
                }
            }
            "schema" => {
                jwant_object(v, "output_config.format.schema")?;
                schema = Some(v.clone());
            }
            other => {
                return Err(no_counterpart(
                    &format!("output_config.format.{other}"),
                    OPENAI,
                ));
            }
        }
    }
    if member(f, "type").as_str() != Some("json_schema") {
        return Err(Refused::new("output_config.format.type", "is required"));
    }
    let Some(schema) = schema else {
        return Err(Refused::new("output_config.format.schema", "is required"));
    };
    Ok(
        jo! {"type" => "json_schema", "json_schema" => jo!{"name" => "output", "schema" => schema, "strict" => true}},
    )
}

/// `context_management`: only edits that clear earlier thinking are accepted. They are
/// already in effect once translated (earlier thinking is never sent to an OpenAI
/// provider); any other edit would change the conversation and has no OpenAI counterpart.
fn context_management(v: &J<'_>) -> Result<(), Refused> {
    for (k, v) in jwant_object(v, "context_management")? {
        match &**k {
            _ if v.is_null() => {}
            "edits" => {
                for (i, e) in jwant_array(v, "context_management.edits")?
                    .iter()
                    .enumerate()
                {
                    let at = || format!("context_management.edits[{i}].type");
                    if !jwant_str(e.at("type"), P(at))?.starts_with("clear_thinking_") {
                        return Err(Refused::new(
                            at(),
                            "only clear_thinking edits can be honoured for an OpenAI provider",
                        ));
                    }
                }
            }
            other => {
                return Err(no_counterpart(
                    &format!("context_management.{other}"),
                    OPENAI,
                ));
            }
        }
    }
    Ok(())
}

/// Anthropic `system` (a string or text blocks) → the OpenAI system message content;
/// `at` names the field in refusals (formatted only for one, as every path below).
fn system_to_openai<'a>(v: &J<'a>, at: &dyn Fn() -> String) -> Result<J<'a>, Refused> {
    match v {
        J::Str(_) => Ok(v.clone()),
        J::Arr(blocks) => text_blocks_to_parts(blocks, at),
        _ => Err(Refused::new(
            at(),
            "must be a string or an array of text blocks",
        )),
    }
}

fn text_blocks_to_parts<'a>(blocks: &[J<'a>], at: &dyn Fn() -> String) -> Result<J<'a>, Refused> {
    let mut parts = Vec::with_capacity(blocks.len());
    for (j, b) in blocks.iter().enumerate() {
        let bat = || format!("{}[{j}]", at());
        if b.get("type").and_then(J::as_str) != Some("text") {
            return Err(Refused::new(
                format!("{}.type", bat()),
                "only text blocks can be carried here to an OpenAI provider",
            ));
        }
        let text = b.at("text");
        jwant_str(text, P(|| format!("{}.text", bat())))?;
        parts.push(jo! {"type" => "text", "text" => text.clone()});
    }
    Ok(J::Arr(parts))
}

fn block_to_part<'a>(b: &J<'a>, at: &dyn Fn() -> String) -> Result<J<'a>, Refused> {
    match b.get("type").and_then(J::as_str) {
        Some("text") => {
            let text = b.at("text");
            jwant_str(text, P(|| format!("{}.text", at())))?;
            Ok(jo! {"type" => "text", "text" => text.clone()})
        }
        Some("image") => {
            let src = jwant_object(b.at("source"), P(|| format!("{}.source", at())))?;
            let url = match member(src, "type").as_str() {
                Some("base64") => {
                    let media = jwant_str(
                        member(src, "media_type"),
                        P(|| format!("{}.source.media_type", at())),
                    )?;
                    let data =
                        jwant_str(member(src, "data"), P(|| format!("{}.source.data", at())))?;
                    J::from(format!("data:{media};base64,{data}"))
                }
                Some("url") => {
                    let u = member(src, "url");
                    jwant_str(u, P(|| format!("{}.source.url", at())))?;
                    u.clone()
                }
                _ => {
                    return Err(Refused::new(
                        format!("{}.source.type", at()),
                        "only base64 and url images can be sent to an OpenAI provider",
                    ));
                }
            };
            Ok(jo! {"type" => "image_url", "image_url" => jo!{"url" => url}})
        }
        _ => Err(Refused::new(
            format!("{}.type", at()),
            "only text, image, tool_use, tool_result and thinking blocks can be sent to an OpenAI provider",
        )),
    }
}

fn anthropic_turn_to_openai<'a>(
    m: &J<'a>,
    i: usize,
    turns: &mut Vec<J<'a>>,
) -> Result<(), Refused> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let m = jwant_object(m, P(|| format!("messages[{i}]")))?;
    for (k, _) in m {
        if !matches!(&**k, "role" | "content") {
            return Err(no_counterpart(&at(k), OPENAI));
        }
    }
    let role = jwant_str(member(m, "role"), P(|| at("role")))?;
    let content = member(m, "content");
    match (role, content) {
        // A system message between turns (Claude Code sends them): OpenAI takes system
        // messages anywhere in the list.
        ("system", _) => {
            let content = system_to_openai(content, &|| at("content"))?;
            turns.push(jo! {"role" => "system", "content" => content});
        }
        ("user" | "assistant", J::Str(_)) => {
            let role = member(m, "role").clone();
            turns.push(jo! {"role" => role, "content" => content.clone()});
        }
        ("user", J::Arr(blocks)) => {
            let mut parts = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                let bat = || format!("messages[{i}].content[{j}]");
                if b.get("type").and_then(J::as_str) == Some("tool_result") {
                    turns.push(tool_result_to_openai(b, &bat)?);
                } else {
                    parts.push(block_to_part(b, &bat)?);
                }
            }
            if !parts.is_empty() {
                turns.push(jo! {"role" => "user", "content" => parts});
            }
        }
        ("assistant", J::Arr(blocks)) => {
            let mut parts = Vec::new();
            let mut calls = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                let bat = || format!("messages[{i}].content[{j}]");
                match b.get("type").and_then(J::as_str) {
                    Some("text") => parts.push(block_to_part(b, &bat)?),
                    Some("tool_use") => {
                        let id = b.at("id");
                        jwant_str(id, P(|| format!("{}.id", bat())))?;
                        let name = b.at("name");
                        jwant_str(name, P(|| format!("{}.name", bat())))?;
                        let arguments = match b.get("input") {
                            Some(input) => String::from_utf8(input.to_vec()).unwrap_or_default(),
                            None => "{}".to_owned(),
                        };
                        calls.push(jo! {"id" => id.clone(), "type" => "function",
                        "function" => jo!{"name" => name.clone(), "arguments" => arguments}});
                    }
                    // Earlier turns' reasoning is not sent back (see docs/translation.md),
                    // but a block Anthropic's API would refuse is refused here too.
                    Some("thinking") => {
                        jwant_str(b.at("thinking"), P(|| format!("{}.thinking", bat())))?;
                        if b.at("signature").as_str().is_none() {
                            return Err(Refused::new(format!("{}.signature", bat()), UNSIGNED));
                        }
                    }
                    Some("redacted_thinking") => {
                        jwant_str(b.at("data"), P(|| format!("{}.data", bat())))?;
                    }
                    _ => {
                        return Err(Refused::new(
                            format!("{}.type", bat()),
                            "an assistant turn to an OpenAI provider carries text, tool_use and thinking blocks only",
                        ));
                    }
                }
            }
            let content = if parts.is_empty() {
                J::Null
            } else {
                J::Arr(parts)
            };
            let mut turn = jo! {"role" => "assistant", "content" => content};
            if !calls.is_empty() {
                turn.insert("tool_calls", J::Arr(calls));
            }
            turns.push(turn);
        }
        ("user" | "assistant", _) => {
            return Err(Refused::new(
                at("content"),
                "must be a string or an array of blocks",
            ));
        }
        _ => {
            return Err(Refused::new(
                at("role"),
                "must be user, assistant or system",
            ));
        }
    }
    Ok(())
}

/// Why an assistant `thinking` block without a `signature` is refused.
const UNSIGNED: &str = "is required: Anthropic's API takes a thinking block only with the signature it was given with (400 otherwise); leave an earlier turn's thinking out instead, as Anthropic allows";

fn tool_result_to_openai<'a>(b: &J<'a>, at: &dyn Fn() -> String) -> Result<J<'a>, Refused> {
    let b = jwant_object(b, P(at))?;
    let id = member(b, "tool_use_id");
    jwant_str(id, P(|| format!("{}.tool_use_id", at())))?;
    let content = match member(b, "content") {
        J::Null => J::from(""),
        v @ J::Str(_) => v.clone(),
        J::Arr(blocks) => text_blocks_to_parts(blocks, &|| format!("{}.content", at()))?,
        _ => {
            return Err(Refused::new(
                format!("{}.content", at()),
                "must be a string or an array of blocks",
            ));
        }
    };
    Ok(jo! {"role" => "tool", "tool_call_id" => id.clone(), "content" => content})
}

fn tools_to_openai<'a>(v: &J<'a>) -> Result<J<'a>, Refused> {
    let list = jwant_array(v, "tools")?;
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let t = jwant_object(t, P(|| format!("tools[{i}]")))?;
        let mut f: Pairs<'a> = Vec::with_capacity(3);
        for (k, v) in t {
            match &**k {
                "type" if v.is_null() || v.as_str() == Some("custom") => {}
                "type" => {
                    return Err(Refused::new(
                        format!("tools[{i}].type"),
                        "Anthropic server tools cannot run on an OpenAI provider",
                    ));
                }
                "name" => {
                    jwant_str(v, P(|| format!("tools[{i}].name")))?;
                    set(&mut f, "name", v.clone());
                }
                "description" if !v.is_null() => {
                    set(&mut f, "description", v.clone());
                }
                "input_schema" => {
                    set(&mut f, "parameters", v.clone());
                }
                "description" | "cache_control" => {}
                other => return Err(no_counterpart(&format!("tools[{i}].{other}"), OPENAI)),
            }
        }
        if !f.iter().any(|(k, _)| k == "name") {
            return Err(Refused::new(format!("tools[{i}].name"), "is required"));
        }
        out.push(jo! {"type" => "function", "function" => J::Obj(f)});
    }
    Ok(J::Arr(out))
}
