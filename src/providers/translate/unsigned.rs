//! Owns one repair on the same-format path: the `thinking` blocks this gateway's own
//! translation left unsigned, taken out of an Anthropic client's request before it goes,
//! untranslated, to an Anthropic-format provider.
//!
//! An OpenAI-format provider's reasoning reaches an Anthropic client as a `thinking` block
//! with an empty `signature` (`response`, `stream`): an OpenAI-format answer has no
//! signature to give. A client that replays that block in a later turn to an
//! Anthropic-format provider gets Anthropic's 400 (an invalid signature), where the block
//! was the gateway's doing. Anthropic lets the thinking of earlier turns be left out, so
//! such blocks are dropped from every assistant turn that keeps another block (a turn of
//! unsigned thinking alone is left as it is: an empty turn is refused too).
//!
//! Same-format bodies are otherwise never parsed: a body is read only when a byte search
//! finds a `signature` member whose value is the empty string (`"signature":""`, blanks
//! around the colon allowed), which the inside of a JSON string cannot hold (its quotes are
//! escaped); any other body is forwarded as it came, byte for byte.

use std::borrow::Cow;

use super::json::J;

const SIGNATURE_KEY: &[u8] = b"\"signature\"";

/// Whether `body` has a `"signature"` key whose value is `""`.
pub fn has_empty_signature(body: &[u8]) -> bool {
    memchr::memmem::find_iter(body, SIGNATURE_KEY).any(|at| {
        let rest = blanks_skipped(body.get(at + SIGNATURE_KEY.len()..).unwrap_or_default());
        match rest.split_first() {
            Some((b':', value)) => blanks_skipped(value).starts_with(b"\"\""),
            _ => false,
        }
    })
}

fn blanks_skipped(b: &[u8]) -> &[u8] {
    let n = b
        .iter()
        .take_while(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    b.get(n..).unwrap_or_default()
}

/// Whether a content block is a `thinking` block with an empty signature.
fn unsigned(block: &J<'_>) -> bool {
    block.at("type").as_str() == Some("thinking") && block.at("signature").as_str() == Some("")
}

/// The Messages request `body` for `model` without the unsigned thinking blocks of its
/// assistant turns; `None` when it has none to drop (send `body` as it is).
pub fn without_unsigned_thinking(body: &[u8], model: &str) -> Option<Vec<u8>> {
    if !has_empty_signature(body) {
        return None;
    }
    let mut tree = J::parse(body).ok()?;
    let mut dropped = false;
    if let Some(J::Arr(messages)) = tree.get_mut("messages") {
        for message in messages.iter_mut() {
            if message.at("role").as_str() != Some("assistant") {
                continue;
            }
            if let Some(J::Arr(content)) = message.get_mut("content") {
                let kept = content.iter().filter(|b| !unsigned(b)).count();
                if kept == content.len() || kept == 0 {
                    continue;
                }
                content.retain(|b| !unsigned(b));
                dropped = true;
            }
        }
    }
    if !dropped {
        return None;
    }
    tree.insert("model", J::Str(Cow::Owned(model.to_owned())));
    Some(tree.to_vec_sized(body.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn strip(v: &Value) -> Option<Value> {
        let body = serde_json::to_vec(v).unwrap();
        without_unsigned_thinking(&body, "claude-x").map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn only_an_empty_signature_key_is_found() {
        assert!(has_empty_signature(br#"{"signature":""}"#));
        assert!(has_empty_signature(b"{\"signature\" :\n \"\"}"));
        assert!(!has_empty_signature(br#"{"signature":"abc"}"#));
        // Inside a string the quotes are escaped: not a key.
        assert!(!has_empty_signature(br#"{"text":"\"signature\":\"\""}"#));
        assert!(!has_empty_signature(br#"{"signature"#));
        assert!(!has_empty_signature(b""));
    }

    #[test]
    fn unsigned_thinking_is_dropped_and_everything_else_kept() {
        let req = json!({
            "model": "an/claude-x",
            "max_tokens": 100,
            "messages": [
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "from openai", "signature": ""},
                    {"type": "text", "text": "a1"}]},
                {"role": "user", "content": "q2"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "from anthropic", "signature": "sig"},
                    {"type": "tool_use", "id": "t", "name": "f", "input": {"z": 1, "a": 2}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}
            ]
        });
        let out = strip(&req).unwrap();
        let mut want = req.clone();
        want["model"] = json!("claude-x");
        want["messages"][1]["content"] = json!([{"type": "text", "text": "a1"}]);
        assert_eq!(out, want);
        // Document order is kept (a tool input's keys included), the model set in place.
        let body = br#"{"model":"an/x","messages":[{"role":"assistant","content":[
            {"type":"thinking","thinking":"t","signature":""},
            {"type":"tool_use","id":"t","name":"f","input":{"z":1,"a":2}}]}],"max_tokens":9}"#;
        let out = without_unsigned_thinking(body, "m").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"z":1,"a":2}}]}],"max_tokens":9}"#
        );
    }

    #[test]
    fn nothing_to_drop_leaves_the_body_alone() {
        // Signed thinking only.
        assert_eq!(
            strip(&json!({"messages": [{"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": "sig"},
                {"type": "text", "text": "a"}]}]})),
            None
        );
        // An empty signature on something that is not a thinking block of an assistant turn.
        assert_eq!(
            strip(&json!({"messages": [{"role": "user", "content": [
                {"type": "thinking", "thinking": "t", "signature": ""},
                {"type": "text", "text": "a"}]}]})),
            None
        );
        assert_eq!(
            strip(&json!({"messages": [{"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": {"signature": ""}}]}]})),
            None
        );
        // A turn of unsigned thinking alone is left as it is.
        assert_eq!(
            strip(&json!({"messages": [{"role": "assistant", "content": [
                {"type": "thinking", "thinking": "t", "signature": ""}]}]})),
            None
        );
        // Not JSON: sent as it is (the provider judges it).
        assert_eq!(
            without_unsigned_thinking(br#"{"signature":"" oops"#, "m"),
            None
        );
    }
}
