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

/// Anthropic's `error.type` for an OpenAI-format error object that came in-band, in a
/// stream (where no status tells it): by its `code`, the most precise of its names, then
/// by its `type`, then by an HTTP status in `code` (OpenAI-compatible servers such as vLLM
/// and LiteLLM put one there); `api_error` when none of them is known.
pub fn anthropic_type_of_openai(e: &Value) -> &'static str {
    let name = |k: &str| {
        e.get(k)
            .and_then(Value::as_str)
            .and_then(anthropic_type_named)
    };
    if let Some(t) = name("code").or_else(|| name("type")) {
        return t;
    }
    let status = match e.get("code") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    };
    match status.and_then(|s| u16::try_from(s).ok()) {
        Some(s @ 400..=599) => anthropic_type_of(s),
        _ => "api_error",
    }
}

/// Anthropic's `error.type` for an OpenAI error `code` or `type` (or an Anthropic type,
/// which some OpenAI-compatible servers pass on), when one corresponds.
fn anthropic_type_named(name: &str) -> Option<&'static str> {
    Some(match name {
        "invalid_request_error" | "context_length_exceeded" | "invalid_value" => {
            "invalid_request_error"
        }
        "authentication_error"
        | "invalid_api_key"
        | "incorrect_api_key"
        | "invalid_authentication" => "authentication_error",
        "permission_error"
        | "insufficient_permissions"
        | "unsupported_country_region_territory" => "permission_error",
        "not_found_error" | "model_not_found" => "not_found_error",
        // OpenAI's rate-limit `type` names the limit that was hit: `requests` or `tokens`.
        "rate_limit_error" | "rate_limit_exceeded" | "requests" | "tokens" => "rate_limit_error",
        // The quota is a billing matter: retrying, as after a rate limit, does not help.
        "insufficient_quota" | "billing_error" => "billing_error",
        "request_too_large" => "request_too_large",
        "overloaded_error" | "server_is_overloaded" | "engine_overloaded" => "overloaded_error",
        "api_error" | "server_error" | "internal_error" => "api_error",
        _ => return None,
    })
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
