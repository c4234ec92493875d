//! What one event carries, for the content-stall watchdog (spec B §7.1) and anything else
//! that needs to tell model output from lifecycle noise. The JSON is read with borrowing
//! probes that skip every value they do not need (no tree is built).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Event;

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
    let Ok(p) = serde_json::from_slice::<Probe<'_>>(data) else {
        return Frame::of(FrameKind::Other, false);
    };
    let ty = p.ty.0.as_deref().or(name);
    match ty {
        None => chat(&p),
        Some(t) => typed(t, &p),
    }
}

/// An OpenAI chat chunk (no `type`): what its choices' deltas carry.
fn chat(p: &Probe<'_>) -> Frame {
    let c = p.choices.unwrap_or_default();
    if c.tool {
        Frame::of(FrameKind::Tool, true)
    } else if c.reasoning {
        Frame::of(FrameKind::Reasoning, true)
    } else if c.text {
        Frame::of(FrameKind::Text, true)
    } else if p.error.is_some() {
        Frame::of(FrameKind::Error, false)
    } else if p.usage.is_some() {
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
fn typed(t: &str, p: &Probe<'_>) -> Frame {
    use FrameKind::*;
    match t {
        "content_block_delta" => {
            let kind = match p.delta.as_ref().and_then(|d| d.ty.as_deref()) {
                Some("thinking_delta" | "signature_delta") => Reasoning,
                Some("input_json_delta") => Tool,
                Some("text_delta") => Text,
                Some(d) if d.contains("citation") => Text,
                _ => Other,
            };
            // Any delta is model-generated, even an empty one.
            Frame::of(kind, true)
        }
        "content_block_start" => match p.content_block.as_ref().and_then(|b| b.ty.as_deref()) {
            Some(b) if is_reasoning_block(b) => Frame::of(Reasoning, true),
            Some(b) if is_tool_item(b) => Frame::of(Tool, true),
            _ => Frame::of(Lifecycle, false),
        },
        "message_delta" if p.usage.is_some() => Frame::of(Usage, false),
        "message_start" | "message_delta" | "message_stop" | "content_block_stop" | "ping" => {
            Frame::of(Lifecycle, false)
        }
        "error" | "response.failed" => Frame::of(Error, false),
        "response.output_item.added" | "response.output_item.done" => {
            match p.item.as_ref().and_then(|i| i.ty.as_deref()) {
                Some("reasoning") => Frame::of(Reasoning, true),
                Some(i) if is_tool_item(i) => Frame::of(Tool, true),
                _ => Frame::of(Lifecycle, false),
            }
        }
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
        "response.completed" | "response.done" | "response.incomplete"
            if p.response.as_ref().is_some_and(|r| r.usage.is_some()) =>
        {
            Frame::of(Usage, false)
        }
        t if t.starts_with("response.") => Frame::of(Lifecycle, false),
        // A typed chunk that is still a chat chunk (some providers add `type`).
        _ if p.choices.is_some() => chat(p),
        _ if p.error.is_some() => Frame::of(Error, false),
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
#[derive(Clone, Copy, Default)]
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
