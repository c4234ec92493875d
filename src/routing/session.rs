//! Session keys (spec B §4): which conversation a request belongs to, so session affinity
//! can keep it on one connection. Read from the request's headers and body, first match
//! wins; the key itself never leaves the request (never forwarded, never logged): only its
//! SHA-256 digest ([`SessionDigest`]) travels to the pin's owner shard.
//!
//! Order: the headers `x-codex-session-id`, `x-session-id`, `x-omniroute-session`, then
//! the ones coding clients send on their own — Claude Code's `x-claude-code-session-id`,
//! Codex CLI's `session_id` / `session-id` (`header:<v>`); body `metadata.session_id` / `metadata.sessionId` (`metadata:<v>`); body
//! `conversation_id`, then `session_id` (`body:<v>`); body `prompt_cache_key`
//! (`prompt-cache:<v>`); else the first user message's text (`input:sha256:<hex>` of its
//! first [`FIRST_MESSAGE_CHARS`] characters). A value is trimmed; an empty one or one
//! longer than [`MAX_VALUE_CHARS`] is ignored (the next source is tried); one of at most
//! [`MAX_PLAIN_CHARS`] characters of `[A-Za-z0-9._:-]` is kept as is, any other is replaced
//! by `sha256:<hex>` of itself.

use sha2::{Digest, Sha256};

/// The session headers, in the order they are read (matched case-insensitively): the
/// gateway's own (never forwarded upstream), then the clients' own (`CLIENT_SESSION_HEADERS`).
pub const SESSION_HEADERS: [&str; 6] = [
    "x-codex-session-id",
    "x-session-id",
    "x-omniroute-session",
    CLIENT_SESSION_HEADERS[0],
    CLIENT_SESSION_HEADERS[1],
    CLIENT_SESSION_HEADERS[2],
];
/// Session headers coding clients send for their own provider (Claude Code, Codex CLI):
/// they key a session here and still go upstream as the client sent them.
pub const CLIENT_SESSION_HEADERS: [&str; 3] =
    ["x-claude-code-session-id", "session_id", "session-id"];
/// A value longer than this (in characters) is ignored.
pub const MAX_VALUE_CHARS: usize = 4096;
/// A value of at most this many characters of `[A-Za-z0-9._:-]` is kept as written.
pub const MAX_PLAIN_CHARS: usize = 180;
/// The first user message counts up to this many characters.
pub const FIRST_MESSAGE_CHARS: usize = 4096;

/// A session key's SHA-256: what identifies a session outside the request.
pub type SessionDigest = [u8; 32];

/// The session key of a request, if it has one. `header` looks a request header up by its
/// lower-case name; `body` is the request's JSON body (anything unparseable has no body
/// key).
pub fn session_key<'h>(header: impl Fn(&str) -> Option<&'h [u8]>, body: &[u8]) -> Option<String> {
    for name in SESSION_HEADERS {
        let value = header(name).and_then(|v| std::str::from_utf8(v).ok());
        if let Some(v) = value.and_then(normalise) {
            return Some(format!("header:{v}"));
        }
    }
    let body: serde_json::Value = serde_json::from_slice(body).ok()?;
    let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).and_then(normalise);
    let metadata = body.get("metadata");
    let from_metadata = text(metadata.and_then(|m| m.get("session_id")))
        .or_else(|| text(metadata.and_then(|m| m.get("sessionId"))));
    if let Some(v) = from_metadata {
        return Some(format!("metadata:{v}"));
    }
    if let Some(v) = text(body.get("conversation_id")).or_else(|| text(body.get("session_id"))) {
        return Some(format!("body:{v}"));
    }
    if let Some(v) = text(body.get("prompt_cache_key")) {
        return Some(format!("prompt-cache:{v}"));
    }
    let first = first_user_text(&body)?;
    let head: String = first.chars().take(FIRST_MESSAGE_CHARS).collect();
    Some(format!(
        "input:sha256:{}",
        hex::encode(Sha256::digest(head.as_bytes()))
    ))
}

/// The digest that stands for `key` outside the request.
pub fn digest(key: &str) -> SessionDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// A trimmed value as it enters a key: `None` when empty or too long; hashed when long or
/// outside the plain character set.
fn normalise(value: &str) -> Option<String> {
    let v = value.trim();
    let chars = v.chars().count();
    if v.is_empty() || chars > MAX_VALUE_CHARS {
        return None;
    }
    let plain = chars <= MAX_PLAIN_CHARS
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if plain {
        Some(v.to_owned())
    } else {
        Some(format!(
            "sha256:{}",
            hex::encode(Sha256::digest(v.as_bytes()))
        ))
    }
}

/// The text of the first user message: Chat Completions and Messages `messages`, or the
/// Responses API's `input` (a string, or items with a role). Content is a string or a list
/// of parts whose `text` strings are joined with newlines.
fn first_user_text(body: &serde_json::Value) -> Option<String> {
    if let Some(s) = body.get("input").and_then(|v| v.as_str()) {
        return (!s.is_empty()).then(|| s.to_owned());
    }
    let list = body
        .get("messages")
        .or_else(|| body.get("input"))
        .and_then(|v| v.as_array())?;
    let user = list
        .iter()
        .find(|m| m.get("role").and_then(|r| r.as_str()) == Some("user"))?;
    let text = match user.get("content")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(headers: &[(&str, &str)], body: &str) -> Option<String> {
        session_key(
            |name| {
                headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.as_bytes())
            },
            body.as_bytes(),
        )
    }

    #[test]
    fn headers_come_first_in_their_order() {
        let body = r#"{"metadata":{"session_id":"m"},"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            key(&[("x-session-id", "b"), ("x-codex-session-id", "a")], body).as_deref(),
            Some("header:a")
        );
        assert_eq!(
            key(
                &[("x-omniroute-session", "c"), ("x-session-id", " b ")],
                body
            )
            .as_deref(),
            Some("header:b")
        );
        assert_eq!(key(&[], body).as_deref(), Some("metadata:m"));
        // The coding clients' own headers come after the gateway's, before the body.
        assert_eq!(
            key(
                &[("x-claude-code-session-id", "cc"), ("x-session-id", "b")],
                body
            )
            .as_deref(),
            Some("header:b")
        );
        for h in ["x-claude-code-session-id", "session_id", "Session-Id"] {
            assert_eq!(key(&[(h, "cc")], body).as_deref(), Some("header:cc"), "{h}");
        }
    }

    #[test]
    fn odd_or_long_values_are_hashed_and_huge_ones_ignored() {
        let odd = key(&[("x-session-id", "a b")], "{}").unwrap_or_default();
        assert!(odd.starts_with("header:sha256:"), "{odd}");
        assert_eq!(odd.len(), "header:sha256:".len() + 64);
        let long = "a".repeat(MAX_PLAIN_CHARS + 1);
        let long = key(&[("x-session-id", &long)], "{}").unwrap_or_default();
        assert!(long.starts_with("header:sha256:"), "{long}");
        let plain = "a".repeat(MAX_PLAIN_CHARS);
        assert_eq!(
            key(&[("x-session-id", &plain)], "{}"),
            Some(format!("header:{plain}"))
        );
        let huge = "a".repeat(MAX_VALUE_CHARS + 1);
        assert_eq!(
            key(&[("x-session-id", &huge)], r#"{"session_id":"s"}"#).as_deref(),
            Some("body:s")
        );
        assert_eq!(key(&[("x-session-id", "  ")], "{}"), None);
    }

    #[test]
    fn body_sources_in_order() {
        assert_eq!(
            key(&[], r#"{"metadata":{"sessionId":"x"}}"#).as_deref(),
            Some("metadata:x")
        );
        assert_eq!(
            key(&[], r#"{"session_id":"s","conversation_id":"c"}"#).as_deref(),
            Some("body:c")
        );
        assert_eq!(
            key(&[], r#"{"prompt_cache_key":"p","messages":[]}"#).as_deref(),
            Some("prompt-cache:p")
        );
        assert_eq!(key(&[], r#"{"model":"m"}"#), None);
        assert_eq!(key(&[], "not json"), None);
    }

    #[test]
    fn the_first_user_message_is_hashed() {
        let chat = r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"hello"},{"role":"user","content":"later"}]}"#;
        let parts = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}"#;
        let responses = r#"{"input":"hello"}"#;
        let items =
            r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}]}"#;
        let want = format!("input:sha256:{}", hex::encode(Sha256::digest(b"hello")));
        for body in [chat, parts, responses, items] {
            assert_eq!(key(&[], body), Some(want.clone()), "{body}");
        }
        // Only the first 4096 characters count.
        let a = format!(r#"{{"input":"{}x"}}"#, "é".repeat(FIRST_MESSAGE_CHARS));
        let b = format!(r#"{{"input":"{}y"}}"#, "é".repeat(FIRST_MESSAGE_CHARS));
        assert_eq!(key(&[], &a), key(&[], &b));
    }
}
