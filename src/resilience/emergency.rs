//! The emergency fallback (spec B §9.1): when an upstream says the budget is spent (HTTP
//! 402, or an error naming a budget, credit or billing limit) and the request carries no
//! tools, the gateway re-runs it once on the configured emergency target with its output
//! capped at [`EMERGENCY_MAX_TOKENS`]. This file decides whether an answer is such a
//! failure and rewrites the body; the relay runs the attempt.

use serde_json::Value;

/// The output cap of an emergency re-run.
pub const EMERGENCY_MAX_TOKENS: u64 = 4096;

/// Words (matched case-insensitively in the error body) that say the budget is spent.
const BUDGET_WORDS: [&str; 12] = [
    "insufficient funds",
    "budget exceeded",
    "quota exceeded",
    "billing",
    "payment required",
    "out of credits",
    "no credits",
    "credit limit",
    "spending limit",
    "saldo insuficiente",
    "limite de gastos",
    "cota excedida",
];

/// Is this error answer a spent budget: a 402, or a body naming one of the budget words
/// (with spaces or underscores)?
pub fn is_budget_failure(status: u16, body: &str) -> bool {
    if status == 402 {
        return true;
    }
    let text = body.to_ascii_lowercase().replace('_', " ");
    BUDGET_WORDS.iter().any(|w| text.contains(w))
}

/// The request body for the emergency target: `model` replaced and the output capped at
/// [`EMERGENCY_MAX_TOKENS`] (every output-limit field present is lowered to the cap; with
/// none present, the endpoint's own field is set). `None` if the body is not a JSON
/// object (it was peeked, so that does not happen).
pub fn emergency_body(body: &[u8], model: &str, limit_field: &str) -> Option<Vec<u8>> {
    let mut json: Value = serde_json::from_slice(body).ok()?;
    let object = json.as_object_mut()?;
    object.insert("model".to_owned(), Value::from(model));
    let mut capped = false;
    for field in ["max_tokens", "max_completion_tokens", "max_output_tokens"] {
        if let Some(v) = object.get_mut(field) {
            let lower = v
                .as_u64()
                .map_or(EMERGENCY_MAX_TOKENS, |n| n.min(EMERGENCY_MAX_TOKENS));
            *v = Value::from(lower);
            capped = true;
        }
    }
    if !capped {
        object.insert(limit_field.to_owned(), Value::from(EMERGENCY_MAX_TOKENS));
    }
    serde_json::to_vec(&json).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_failures() {
        assert!(is_budget_failure(402, ""));
        assert!(is_budget_failure(
            400,
            r#"{"error":{"code":"insufficient_funds"}}"#
        ));
        assert!(is_budget_failure(429, "Monthly SPENDING LIMIT reached"));
        assert!(is_budget_failure(403, "cota excedida"));
        assert!(!is_budget_failure(429, "rate limit exceeded"));
        assert!(!is_budget_failure(500, "internal error"));
    }

    #[test]
    fn the_body_gets_the_target_model_and_a_capped_output() {
        let out = |body: &str, field: &str| -> Value {
            serde_json::from_slice(
                &emergency_body(body.as_bytes(), "x/y", field).unwrap_or_default(),
            )
            .unwrap_or_default()
        };
        let v = out(r#"{"model":"m","max_tokens":10000}"#, "max_tokens");
        assert_eq!(
            (v["model"].as_str(), v["max_tokens"].as_u64()),
            (Some("x/y"), Some(4096))
        );
        let v = out(r#"{"model":"m","max_completion_tokens":100}"#, "max_tokens");
        assert_eq!(v["max_completion_tokens"], 100);
        assert!(v.get("max_tokens").is_none());
        let v = out(r#"{"model":"m"}"#, "max_output_tokens");
        assert_eq!(v["max_output_tokens"], 4096);
        assert_eq!(emergency_body(b"[1]", "x", "max_tokens"), None);
    }
}
