//! What one event carries, for the content-stall watchdog (spec B §7.1) and anything else
//! that needs to tell model output from lifecycle noise. The few fields it reads are taken
//! by a borrowed walk over the JSON ([`super::scan`]) that allocates nothing; a document the
//! walk is not sure of goes to `serde_json` with borrowing probes that skip every value they
//! do not need (no tree is built). Both give the same [`Fields`]
//! (`the_walk_reads_what_serde_reads`).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Event;
use super::scan::{Cursor, Val, once};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// Answer text (a chat `content` delta, `response.output_text.delta`, `text_delta`).
    Text,
    /// Reasoning: thinking / signature deltas, reasoning items and events,
    /// `reasoning_content` / `reasoning_details`.
    Reasoning,
    /// A tool call or its arguments.
    Tool,
    /// A usage block with no model output.
    Usage,
    /// Stream bookkeeping: start/stop events, pings, role-only or empty deltas, `[DONE]`.
    Lifecycle,
    /// Comment lines only (heartbeats).
    Comment,
    /// An error event with no model output.
    Error,
    /// Anything else (unknown event types, data that is not JSON).
    Other,
}

/// A classified event: its kind, and whether it is model-generated output (what resets the
/// content-stall budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub output: bool,
    /// `data: [DONE]`.
    pub done: bool,
}

impl Frame {
    const fn of(kind: FrameKind, output: bool) -> Frame {
        Frame {
            kind,
            output,
            done: false,
        }
    }
}

/// Classifies one event (spec B §7.1 counting / not-counting lists).
pub fn classify(ev: &Event<'_>) -> Frame {
    classify_with(ev, |data| {
        fields_by_walk(data).or_else(|| fields_by_serde(data))
    })
}

/// [`classify`] with the JSON fields read by `read` (`None`: not JSON of a shape the
/// probes take).
fn classify_with<'a>(ev: &Event<'a>, read: impl FnOnce(&'a [u8]) -> Option<Fields<'a>>) -> Frame {
    let name = ev.name.and_then(|n| std::str::from_utf8(n).ok());
    let Some(data) = ev.data else {
        return match name {
            Some(_) => Frame::of(FrameKind::Lifecycle, false),
            None if ev.comment => Frame::of(FrameKind::Comment, false),
            None => Frame::of(FrameKind::Other, false),
        };
    };
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return Frame {
            kind: FrameKind::Lifecycle,
            output: false,
            done: true,
        };
    }
    if data.is_empty() {
        return Frame::of(
            if ev.comment {
                FrameKind::Comment
            } else {
                FrameKind::Lifecycle
            },
            false,
        );
    }
    let Some(p) = read(data) else {
        return Frame::of(FrameKind::Other, false);
    };
    let ty = p.ty.as_deref().or(name);
    match ty {
        None => chat(&p),
        Some(t) => typed(t, &p),
    }
}

/// What the classification reads of an event's JSON.
#[derive(Debug, Default, PartialEq, Eq)]
struct Fields<'a> {
    /// `type`, when it is a string.
    ty: Option<Cow<'a, str>>,
    /// `choices`, when present and not null.
    choices: Option<Choices>,
    /// The `type` strings of the `delta`, `content_block` and `item` objects.
    delta_ty: Option<Cow<'a, str>>,
    block_ty: Option<Cow<'a, str>>,
    item_ty: Option<Cow<'a, str>>,
    /// `usage`, `error`, `response.usage` present and not null.
    usage: bool,
    error: bool,
    response_usage: bool,
}

/// The fields by `serde_json` and the probes.
fn fields_by_serde(data: &[u8]) -> Option<Fields<'_>> {
    let p = serde_json::from_slice::<Probe<'_>>(data).ok()?;
    Some(Fields {
        ty: p.ty.0,
        choices: p.choices,
        delta_ty: p.delta.and_then(|d| d.ty),
        block_ty: p.content_block.and_then(|d| d.ty),
        item_ty: p.item.and_then(|d| d.ty),
        usage: p.usage.is_some(),
        error: p.error.is_some(),
        response_usage: p.response.is_some_and(|r| r.usage.is_some()),
    })
}

/// The fields by the borrowed walk; `None` when the walk is not sure (then `serde_json`
/// decides, and that covers anything that is not JSON).
fn fields_by_walk(data: &[u8]) -> Option<Fields<'_>> {
    let mut c = Cursor::new(data);
    if c.peek()? != b'{' {
        return None; // an array would be read as the probe's fields in order
    }
    let mut f = Fields::default();
    let mut seen = 0u16;
    c.object(0, |c, key, d| {
        match key {
            b"type" => {
                once(&mut seen, 1)?;
                f.ty = loose(c, d)?;
            }
            b"choices" => {
                once(&mut seen, 2)?;
                f.choices = choices(c, d)?;
            }
            b"delta" => {
                once(&mut seen, 4)?;
                f.delta_ty = type_of(c, d)?;
            }
            b"content_block" => {
                once(&mut seen, 8)?;
                f.block_ty = type_of(c, d)?;
            }
            b"item" => {
                once(&mut seen, 16)?;
                f.item_ty = type_of(c, d)?;
            }
            b"usage" => {
                once(&mut seen, 32)?;
                f.usage = c.value(d)? != Val::Null;
            }
            b"error" => {
                once(&mut seen, 64)?;
                f.error = c.value(d)? != Val::Null;
            }
            b"response" => {
                once(&mut seen, 128)?;
                f.response_usage = response_usage(c, d)?;
            }
            _ => {
                c.value(d)?;
            }
        }
        Some(())
    })?;
    c.end()?;
    Some(f)
}

/// A string value as [`Loose`] reads it: the text of a string without escapes, nothing
/// for any other value; `None` (give up) for a string with escapes.
fn loose<'a>(c: &mut Cursor<'a>, depth: usize) -> Option<Option<Cow<'a, str>>> {
    match c.value(depth)? {
        Val::Str(s) => s.plain().map(|t| Some(Cow::Borrowed(t))),
        _ => Some(None),
    }
}

/// The `type` of an object value as [`Typed`] reads it (the last one given); nothing for
/// null or any other value.
fn type_of<'a>(c: &mut Cursor<'a>, depth: usize) -> Option<Option<Cow<'a, str>>> {
    if c.peek()? != b'{' {
        c.value(depth)?;
        return Some(None);
    }
    let mut ty = None;
    c.object(depth, |c, key, d| {
        if key == b"type" {
            ty = loose(c, d)?;
        } else {
            c.value(d)?;
        }
        Some(())
    })?;
    Some(ty)
}

/// `response`: whether it is an object with a non-null `usage`.
fn response_usage(c: &mut Cursor<'_>, depth: usize) -> Option<bool> {
    match c.peek()? {
        b'n' => c.value(depth).map(|_| false),
        b'{' => {
            let (mut usage, mut seen) = (false, 0u16);
            c.object(depth, |c, key, d| {
                if key == b"usage" {
                    once(&mut seen, 1)?;
                    usage = c.value(d)? != Val::Null;
                } else {
                    c.value(d)?;
                }
                Some(())
            })?;
            Some(usage)
        }
        _ => None, // an array is read as a struct; anything else fails
    }
}

/// `choices` as [`Choices`] reads it: null is none; an object is present with no delta;
/// an array of choice objects is folded over their deltas.
fn choices(c: &mut Cursor<'_>, depth: usize) -> Option<Option<Choices>> {
    match c.peek()? {
        b'n' => c.value(depth).map(|_| None),
        b'{' => c.value(depth).map(|_| Some(Choices::default())),
        b'[' => {
            let mut all = Choices::default();
            c.array(depth, |c, d| {
                if c.peek()? != b'{' {
                    return None;
                }
                let mut seen = 0u16;
                c.object(d, |c, key, d| {
                    if key == b"delta" {
                        once(&mut seen, 1)?;
                        chat_delta(c, d, &mut all)?;
                    } else {
                        c.value(d)?;
                    }
                    Some(())
                })
            })?;
            Some(Some(all))
        }
        _ => None,
    }
}

/// One choice's `delta` folded into `all` as [`ChatDelta`] reads it.
fn chat_delta(c: &mut Cursor<'_>, depth: usize, all: &mut Choices) -> Option<()> {
    match c.peek()? {
        b'n' => return c.value(depth).map(drop),
        b'{' => {}
        _ => return None,
    }
    let mut seen = 0u16;
    let mut one = Choices::default();
    c.object(depth, |c, key, d| {
        let (bit, slot) = match key {
            b"content" => (1, Slot::Text),
            b"text" => (2, Slot::Text),
            b"reasoning_content" => (4, Slot::Reasoning),
            b"reasoning_details" => (8, Slot::Reasoning),
            b"reasoning" => (16, Slot::Reasoning),
            b"thinking" => (32, Slot::Reasoning),
            b"tool_calls" => (64, Slot::ToolCalls),
            b"function_call" => (128, Slot::Tool),
            _ => return c.value(d).map(drop),
        };
        once(&mut seen, bit)?;
        let v = c.value(d)?;
        let non_empty = match v {
            Val::Str(s) => !s.raw.is_empty(),
            Val::Arr(any) | Val::Obj(any) => any,
            Val::Null | Val::Bool | Val::Num => false,
        };
        match slot {
            Slot::Text => one.text |= non_empty,
            Slot::ToolCalls => one.tool |= non_empty,
            Slot::Reasoning => one.reasoning |= v != Val::Null,
            Slot::Tool => one.tool |= v != Val::Null,
        }
        Some(())
    })?;
    all.text |= one.text;
    all.reasoning |= one.reasoning;
    all.tool |= one.tool;
    Some(())
}

/// Where a chat delta's member counts.
#[derive(Clone, Copy)]
enum Slot {
    /// Text when it carries something.
    Text,
    /// Tool calls when they carry something.
    ToolCalls,
    /// Reasoning whenever present.
    Reasoning,
    /// A tool call whenever present.
    Tool,
}

/// An OpenAI chat chunk (no `type`): what its choices' deltas carry.
fn chat(p: &Fields<'_>) -> Frame {
    let c = p.choices.unwrap_or_default();
    if c.tool {
        Frame::of(FrameKind::Tool, true)
    } else if c.reasoning {
        Frame::of(FrameKind::Reasoning, true)
    } else if c.text {
        Frame::of(FrameKind::Text, true)
    } else if p.error {
        Frame::of(FrameKind::Error, false)
    } else if p.usage {
        Frame::of(FrameKind::Usage, false)
    } else {
        Frame::of(FrameKind::Lifecycle, false)
    }
}

fn is_reasoning_block(t: &str) -> bool {
    t == "thinking" || t == "redacted_thinking"
}

fn is_tool_item(t: &str) -> bool {
    t.contains("tool") || t.contains("function_call")
}

/// An event with a type (Anthropic, Responses, or a typed chunk).
fn typed(t: &str, p: &Fields<'_>) -> Frame {
    use FrameKind::*;
    match t {
        "content_block_delta" => {
            let kind = match p.delta_ty.as_deref() {
                Some("thinking_delta" | "signature_delta") => Reasoning,
                Some("input_json_delta") => Tool,
                Some("text_delta") => Text,
                Some(d) if d.contains("citation") => Text,
                _ => Other,
            };
            // Any delta is model-generated, even an empty one.
            Frame::of(kind, true)
        }
        "content_block_start" => match p.block_ty.as_deref() {
            Some(b) if is_reasoning_block(b) => Frame::of(Reasoning, true),
            Some(b) if is_tool_item(b) => Frame::of(Tool, true),
            _ => Frame::of(Lifecycle, false),
        },
        "message_delta" if p.usage => Frame::of(Usage, false),
        "message_start" | "message_delta" | "message_stop" | "content_block_stop" | "ping" => {
            Frame::of(Lifecycle, false)
        }
        "error" | "response.failed" => Frame::of(Error, false),
        "response.output_item.added" | "response.output_item.done" => match p.item_ty.as_deref() {
            Some("reasoning") => Frame::of(Reasoning, true),
            Some(i) if is_tool_item(i) => Frame::of(Tool, true),
            _ => Frame::of(Lifecycle, false),
        },
        t if t.starts_with("response.reasoning") => Frame::of(Reasoning, true),
        t if t.ends_with(".delta") => {
            let kind = if is_tool_item(t) {
                Tool
            } else if t.contains("text") || t.contains("refusal") {
                Text
            } else {
                Other
            };
            Frame::of(kind, true)
        }
        "response.completed" | "response.done" | "response.incomplete" if p.response_usage => {
            Frame::of(Usage, false)
        }
        t if t.starts_with("response.") => Frame::of(Lifecycle, false),
        // A typed chunk that is still a chat chunk (some providers add `type`).
        _ if p.choices.is_some() => chat(p),
        _ if p.error => Frame::of(Error, false),
        _ => Frame::of(Other, false),
    }
}

/// The fields of an event's JSON the classification reads; everything else is skipped.
#[derive(Deserialize, Default)]
struct Probe<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Loose<'a>,
    #[serde(default)]
    choices: Option<Choices>,
    #[serde(borrow, default)]
    delta: Option<Typed<'a>>,
    #[serde(borrow, default)]
    content_block: Option<Typed<'a>>,
    #[serde(borrow, default)]
    item: Option<Typed<'a>>,
    #[serde(default)]
    usage: Option<IgnoredAny>,
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default)]
    response: Option<ResponseProbe>,
}

#[derive(Deserialize, Default)]
struct ResponseProbe {
    #[serde(default)]
    usage: Option<IgnoredAny>,
}

/// An object's `type` (anything else, or a non-object value, reads as no type).
#[derive(Default)]
struct Typed<'a> {
    ty: Option<Cow<'a, str>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Typed<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Typed<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Typed<'a>, A::Error> {
                let mut ty = None;
                while let Some(is_type) = m.next_key::<KeyIsType>()? {
                    if is_type.0 {
                        ty = m.next_value::<Loose<'de>>()?.0;
                    } else {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Typed { ty })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<Typed<'a>, A::Error> {
                drain_seq(s).map(|_| Typed::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Typed<'a>, E> {
                Ok(Typed::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Typed<'a>, E> {
                Ok(Typed::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Typed<'a>, E> {
                Ok(Typed::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Typed<'a>, E> {
                Ok(Typed::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Typed<'a>, E> {
                Ok(Typed::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Typed<'a>, E> {
                Ok(Typed::default())
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

fn drain_seq<'de, A: SeqAccess<'de>>(mut s: A) -> Result<bool, A::Error> {
    let mut any = false;
    while s.next_element::<IgnoredAny>()?.is_some() {
        any = true;
    }
    Ok(any)
}

fn drain_map<'de, A: MapAccess<'de>>(mut m: A) -> Result<bool, A::Error> {
    let mut any = false;
    while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
        any = true;
    }
    Ok(any)
}

/// A map key, read only to tell whether it is `type` (never allocated).
struct KeyIsType(bool);

impl<'de> Deserialize<'de> for KeyIsType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = KeyIsType;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyIsType, E> {
                Ok(KeyIsType(v == "type"))
            }
        }
        d.deserialize_str(V)
    }
}

/// A string when the value is one (borrowed when it has no escapes), else nothing.
#[derive(Default)]
struct Loose<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Loose<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Loose<'a>, E> {
                Ok(Loose(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Loose<'a>, E> {
                Ok(Loose(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<Loose<'a>, A::Error> {
                drain_seq(s).map(|_| Loose(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Loose<'a>, A::Error> {
                drain_map(m).map(|_| Loose(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Loose<'a>, E> {
                Ok(Loose(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Loose<'a>, E> {
                Ok(Loose(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Loose<'a>, E> {
                Ok(Loose(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Loose<'a>, E> {
                Ok(Loose(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Loose<'a>, E> {
                Ok(Loose(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// What the deltas of a chat chunk's `choices` carry, folded over every choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Choices {
    text: bool,
    reasoning: bool,
    tool: bool,
}

impl<'de> Deserialize<'de> for Choices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Choices;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Choices, A::Error> {
                let mut c = Choices::default();
                while let Some(choice) = s.next_element::<Choice>()? {
                    if let Some(d) = choice.delta {
                        c.text |= d.content.is_some_and(|v| v.0) || d.text.is_some_and(|v| v.0);
                        c.reasoning |= d.reasoning_content.is_some()
                            || d.reasoning_details.is_some()
                            || d.reasoning.is_some()
                            || d.thinking.is_some();
                        c.tool |= d.tool_calls.is_some_and(|v| v.0) || d.function_call.is_some();
                    }
                }
                Ok(c)
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Choices, A::Error> {
                drain_map(m).map(|_| Choices::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Choices, E> {
                Ok(Choices::default())
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize, Default)]
struct Choice {
    #[serde(default)]
    delta: Option<ChatDelta>,
}

#[derive(Deserialize, Default)]
struct ChatDelta {
    #[serde(default)]
    content: Option<NonEmpty>,
    #[serde(default)]
    text: Option<NonEmpty>,
    /// Present at all (even an empty string) is reasoning (OpenRouter).
    #[serde(default)]
    reasoning_content: Option<IgnoredAny>,
    #[serde(default)]
    reasoning_details: Option<IgnoredAny>,
    #[serde(default)]
    reasoning: Option<IgnoredAny>,
    #[serde(default)]
    thinking: Option<IgnoredAny>,
    #[serde(default)]
    tool_calls: Option<NonEmpty>,
    #[serde(default)]
    function_call: Option<IgnoredAny>,
}

/// Whether a value carries something: a non-empty string, array or object.
#[derive(Clone, Copy)]
struct NonEmpty(bool);

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NonEmpty;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<NonEmpty, E> {
                Ok(NonEmpty(!v.is_empty()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<NonEmpty, A::Error> {
                drain_seq(s).map(NonEmpty)
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<NonEmpty, A::Error> {
                drain_map(m).map(NonEmpty)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
            fn visit_unit<E: de::Error>(self) -> Result<NonEmpty, E> {
                Ok(NonEmpty(false))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::Marks;
    use super::super::scan::arb::{self, event};
    use super::*;

    /// The shapes providers send are read by the walk, not handed to `serde_json`.
    #[test]
    fn the_walk_answers_the_usual_shapes() {
        for json in [
            r#"{"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":0,"id":"chatcmpl-mock-1","model":"gpt-4o-mini","object":"chat.completion.chunk"}"#,
            r#"{"id":"c","object":"chat.completion.chunk","created":1694268190,"model":"m","choices":[{"index":0,"delta":{"content":"h\u00e9 \"x\"\n"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}"#,
            r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"usage":{"input_tokens":7,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":42}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi","sequence_number":4}"#,
            r#"{"type":"response.output_item.added","output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}"#,
            r#"{"type":"response.completed","response":{"id":"r","status":"completed","usage":{"input_tokens":3,"output_tokens":4}}}"#,
        ] {
            assert!(fields_by_walk(json.as_bytes()).is_some(), "{json}");
            assert_eq!(
                fields_by_walk(json.as_bytes()),
                fields_by_serde(json.as_bytes()),
                "{json}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Wherever the walk answers, `serde_json` with the probes reads the same fields,
        /// and an event is classified as by `serde_json` alone.
        #[test]
        fn the_walk_reads_what_serde_reads(
            data in arb::event_json(),
            name in arb::event_name(),
        ) {
            if let Some(walk) = fields_by_walk(&data) {
                prop_assert_eq!(Some(walk), fields_by_serde(&data), "{}", String::from_utf8_lossy(&data));
            }
            let ev = event(name.as_deref(), &data);
            prop_assert_eq!(classify(&ev), classify_with(&ev, fields_by_serde));
        }

        /// Every event classified as an error passes the error filter.
        #[test]
        fn nothing_classified_as_an_error_is_filtered_out(
            data in arb::event_json(),
            name in arb::event_name(),
        ) {
            let ev = event(name.as_deref(), &data);
            if classify(&ev).kind == FrameKind::Error {
                prop_assert!(Marks::of(&ev).may_be_error, "{}", String::from_utf8_lossy(&data));
            }
        }
    }
}
