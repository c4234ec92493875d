//! Upstream error bodies re-shaped into the client's error format; the status is kept by
//! the caller. A body that is not the other format's JSON error is carried as the message.

use serde_json::{Value, json};

use super::Translation;

/// Anthropic's `error.type` for an HTTP status.
pub fn anthropic_type_of(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// OpenAI's `error.type` for an HTTP status.
pub fn openai_type_of(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

fn message_of(v: Option<&Value>, raw: &[u8]) -> String {
    match v
        .and_then(|v| v.get("error"))
        .and_then(|e| e.get("message").or(Some(e)))
    {
        Some(Value::String(s)) => s.clone(),
        _ => String::from_utf8_lossy(raw).trim().to_owned(),
    }
}

/// The upstream's error body `body` (answered with `status`) in the client's shape for
/// `translation`.
pub fn reshape(body: &[u8], status: u16, translation: Translation) -> Vec<u8> {
    // Chat Completions and Responses share OpenAI's error shape.
    if translation == Translation::ResponsesToChat {
        return body.to_vec();
    }
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = message_of(parsed.as_ref(), body);
    let upstream_type = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str);
    let out = match translation {
        // The client speaks OpenAI; the upstream answered in Anthropic's shape.
        Translation::ChatToMessages | Translation::ResponsesToMessages => {
            let t = match upstream_type {
                Some("overloaded_error" | "api_error") => "server_error",
                Some(t) => t,
                None => openai_type_of(status),
            };
            json!({"error": {"message": message, "type": t, "param": null, "code": upstream_type}})
        }
        // The client speaks Anthropic; the upstream answered in OpenAI's shape.
        Translation::MessagesToChat | Translation::ResponsesToChat => {
            json!({"type": "error", "error": {"type": anthropic_type_of(status), "message": message}})
        }
    };
    serde_json::to_vec(&out).unwrap_or_default()
}
