//! Provider error rules (spec A §6.2–6.4): the per-provider table that turns an upstream
//! failure into a reason, a lock scope (model, provider or connection) and sometimes a
//! fixed cooldown. This module owns the built-in catalogue, the two allowlists that keep
//! built-in rules from changing the default path of providers that did not opt in, the
//! helpers classification uses to consult them, and the lookup that puts the operator's
//! rules (`[resilience.provider_error_rules]`) in front of the catalogue.
//!
//! Two allowlists, two different opt-ins:
//! - [`FULL_TEXT_RULE_PROVIDERS`]: providers whose rules may read the whole error text.
//!   Everyone else's rules only see the structured `{code, type}` of the error
//!   ([`resolve_rule_match_body`]), so a body-marker rule is blind for them.
//! - [`HONORS_RULE_LOCK_SCOPE_PROVIDERS`]: providers whose matched rule scope is carried
//!   into the decision ([`honors_rule_lock_scope`]); for the others a matched rule only
//!   changes the reason and cooldown.
//!
//! A provider with at least one operator rule passes both gates: declaring a rule is the
//! operator's opt-in, so its rules see the raw text and its scopes are honoured.
//!
//! Operator rules are passed as the slice for one provider
//! ([`ResilienceSettings::error_rules_for`](crate::config::ResilienceSettings::error_rules_for)),
//! so "has an operator rule" is "the slice is not empty".
//!
//! Deliberate deviations from OmniRoute:
//! - **Rules for status 400 fire.** Upstream's 400 branch of classification returns from
//!   its own pattern lists before the rule lookup runs, so a built-in rule for 400 never
//!   fires (only operator rules and the opencode pre-check were wired in later). Here the
//!   400/422 branch of `classify` asks [`provider_error_rule_match`] first, so operator
//!   and built-in rules with status 400 (e.g. `opencode-endpoint-unavailable`,
//!   `agentrouter-user-quota-exhausted`) take effect, within the allowlists above.
//! - Built-in body rules match the lower-cased text itself, not its JSON string encoding.
//!   No marker contains a quote or backslash, so the result is the same.
//! - The opencode family is the latest upstream set (`opencode-zen`, `opencode-go`,
//!   `opencode-cli`); the older bare `opencode` key is not included.

use std::borrow::Cow;

use super::Headers;
use crate::config::resilience::{
    DAY_MS, ErrorReason, HOUR_MS, MINUTE_MS, ProviderErrorRule, RuleScope, SECOND_MS,
};

/// Providers whose built-in rules see the full error text.
pub const FULL_TEXT_RULE_PROVIDERS: &[&str] = &["agentrouter"];

/// Providers whose matched rule scope is carried into the classification decision.
pub const HONORS_RULE_LOCK_SCOPE_PROVIDERS: &[&str] =
    &["agentrouter", "opencode-zen", "opencode-go", "opencode-cli"];

/// The opencode family of providers (shared built-in rules).
pub const OPENCODE_FAMILY: &[&str] = &["opencode-zen", "opencode-go", "opencode-cli"];

const MINIMAX_FAMILY: &[&str] = &["minimax", "minimax-passthrough"];

/// Where a matched rule came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleSource {
    /// Index into the provider's operator rules.
    Operator(usize),
    /// Id of a built-in catalogue rule.
    Builtin(&'static str),
}

/// A matched provider error rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleMatch {
    pub reason: ErrorReason,
    pub scope: RuleScope,
    pub cooldown_ms: Option<u64>,
    pub source: RuleSource,
}

/// What a rule lookup is allowed to see of the error body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleBody<'a> {
    /// The whole error text (full-text providers and providers with operator rules).
    Text(&'a str),
    /// Only the structured error code and type.
    Structured {
        code: Option<&'a str>,
        kind: Option<&'a str>,
    },
    /// Nothing.
    Empty,
}

impl RuleBody<'_> {
    /// The lower-cased text rules search.
    fn haystack(&self) -> String {
        match self {
            RuleBody::Text(t) => t.to_lowercase(),
            RuleBody::Structured { code, kind } => {
                let mut m = serde_json::Map::new();
                if let Some(c) = code {
                    m.insert("code".into(), serde_json::Value::from(*c));
                }
                if let Some(k) = kind {
                    m.insert("type".into(), serde_json::Value::from(*k));
                }
                serde_json::Value::Object(m).to_string().to_lowercase()
            }
            RuleBody::Empty => String::new(),
        }
    }
}

/// How a built-in rule decides it matches (besides its status list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    /// The body contains any of these markers (lower-case).
    BodyContainsAny(&'static [&'static str]),
    /// "monthly usage limit reached" plus a parsable "reset(s) in N <unit>", which becomes
    /// the cooldown.
    MonthlyLimitResetsIn,
    /// `x-ratelimit-remaining-requests` or `x-ratelimit-remaining-tokens` is `0`.
    RemainingHeaderZero,
    /// `x-model-quota-remaining` lists some `name=0`.
    ModelQuotaHeaderZero,
    Always,
}

/// One rule of the built-in catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuiltinRule {
    pub id: &'static str,
    providers: &'static [&'static str],
    statuses: &'static [u16],
    condition: Condition,
    pub reason: ErrorReason,
    pub scope: RuleScope,
    cooldown_ms: Option<u64>,
}

const BUILTIN_RULES: &[BuiltinRule] = &[
    BuiltinRule {
        id: "opencode-endpoint-unavailable",
        providers: OPENCODE_FAMILY,
        statuses: &[400, 429],
        condition: Condition::BodyContainsAny(&["endpoint is unavailable"]),
        reason: ErrorReason::ModelCapacity,
        scope: RuleScope::Model,
        cooldown_ms: Some(300_000),
    },
    BuiltinRule {
        id: "opencode-monthly-quota-resets-in",
        providers: OPENCODE_FAMILY,
        statuses: &[429],
        condition: Condition::MonthlyLimitResetsIn,
        reason: ErrorReason::QuotaExhausted,
        scope: RuleScope::Connection,
        cooldown_ms: None,
    },
    BuiltinRule {
        id: "opencode-quota-exhausted-headers",
        providers: OPENCODE_FAMILY,
        statuses: &[429],
        condition: Condition::RemainingHeaderZero,
        reason: ErrorReason::QuotaExhausted,
        scope: RuleScope::Connection,
        cooldown_ms: None,
    },
    BuiltinRule {
        id: "opencode-quota-exhausted-body",
        providers: OPENCODE_FAMILY,
        statuses: &[429],
        condition: Condition::BodyContainsAny(&[
            "organization_quota_exceeded",
            "account_quota_exceeded",
            "plan_limit_reached",
        ]),
        reason: ErrorReason::QuotaExhausted,
        scope: RuleScope::Connection,
        cooldown_ms: None,
    },
    BuiltinRule {
        id: "opencode-400-model-unavailable",
        providers: OPENCODE_FAMILY,
        statuses: &[400],
        condition: Condition::BodyContainsAny(&["upstream request failed: model is unavailable."]),
        reason: ErrorReason::ModelCapacity,
        scope: RuleScope::Model,
        cooldown_ms: Some(3_600_000),
    },
    BuiltinRule {
        id: "minimax-per-model-quota",
        providers: MINIMAX_FAMILY,
        statuses: &[429],
        condition: Condition::ModelQuotaHeaderZero,
        reason: ErrorReason::QuotaExhausted,
        scope: RuleScope::Model,
        cooldown_ms: None,
    },
    BuiltinRule {
        id: "cloudflare-ai-daily-neuron-allocation",
        providers: &["cloudflare-ai"],
        statuses: &[429],
        condition: Condition::BodyContainsAny(&["daily free allocation"]),
        reason: ErrorReason::QuotaExhausted,
        scope: RuleScope::Connection,
        cooldown_ms: None,
    },
    BuiltinRule {
        id: "openrouter-credit-exhausted-402",
        providers: &["openrouter"],
        statuses: &[402],
        condition: Condition::Always,
        reason: ErrorReason::QuotaExhausted,
        scope: RuleScope::Connection,
        cooldown_ms: Some(120_000),
    },
    BuiltinRule {
        id: "agentrouter-user-quota-exhausted",
        providers: &["agentrouter"],
        statuses: &[400, 403, 429],
        condition: Condition::BodyContainsAny(&["额度不足"]),
        reason: ErrorReason::QuotaExhausted,
        scope: RuleScope::Connection,
        cooldown_ms: None,
    },
    BuiltinRule {
        id: "agentrouter-model-access-denied",
        providers: &["agentrouter"],
        statuses: &[403],
        condition: Condition::BodyContainsAny(&["无权访问模型"]),
        reason: ErrorReason::AuthError,
        scope: RuleScope::Model,
        cooldown_ms: Some(21_600_000),
    },
];

fn listed(list: &[&str], provider: &str) -> bool {
    list.iter().any(|p| p.eq_ignore_ascii_case(provider))
}

/// A provider id that is present and not blank.
fn named(provider: Option<&str>) -> Option<&str> {
    provider.map(str::trim).filter(|p| !p.is_empty())
}

/// The whole built-in catalogue, in lookup order.
#[cfg(test)]
pub fn builtin_rules() -> &'static [BuiltinRule] {
    BUILTIN_RULES
}

/// The built-in rules of one provider (compared case-insensitively), in lookup order.
pub fn builtin_rules_for(provider: &str) -> impl Iterator<Item = &'static BuiltinRule> + '_ {
    let provider = provider.trim();
    BUILTIN_RULES
        .iter()
        .filter(move |r| listed(r.providers, provider))
}

impl BuiltinRule {
    /// Evaluates the rule against a failure; `body_lower` is the lower-cased text the rule
    /// may see.
    pub fn evaluate(
        &self,
        status: u16,
        headers: &dyn Headers,
        body_lower: &str,
    ) -> Option<RuleMatch> {
        if !self.statuses.contains(&status) {
            return None;
        }
        let cooldown_ms = match self.condition {
            Condition::BodyContainsAny(markers) => {
                if !markers.iter().any(|m| body_lower.contains(m)) {
                    return None;
                }
                self.cooldown_ms
            }
            Condition::MonthlyLimitResetsIn => {
                if !body_lower.contains("monthly usage limit reached") {
                    return None;
                }
                Some(parse_reset_countdown_ms(body_lower)?)
            }
            Condition::RemainingHeaderZero => {
                let zero = |name| headers.get(name).is_some_and(|v: &str| v.trim() == "0");
                if !(zero("x-ratelimit-remaining-requests") || zero("x-ratelimit-remaining-tokens"))
                {
                    return None;
                }
                self.cooldown_ms
            }
            Condition::ModelQuotaHeaderZero => {
                let v = headers.get("x-model-quota-remaining")?;
                let exhausted = v
                    .split([',', ';'])
                    .filter_map(|pair| pair.split_once('='))
                    .any(|(_, remaining)| remaining.trim() == "0");
                if !exhausted {
                    return None;
                }
                self.cooldown_ms
            }
            Condition::Always => self.cooldown_ms,
        };
        Some(RuleMatch {
            reason: self.reason,
            scope: self.scope,
            cooldown_ms,
            source: RuleSource::Builtin(self.id),
        })
    }
}

/// Whether a matched rule's scope is carried into the decision for this provider: it is on
/// the allowlist or has an operator rule.
pub fn honors_rule_lock_scope(
    provider: Option<&str>,
    operator_rules: &[ProviderErrorRule],
) -> bool {
    named(provider)
        .is_some_and(|p| listed(HONORS_RULE_LOCK_SCOPE_PROVIDERS, p) || !operator_rules.is_empty())
}

/// What the rule lookup may read of an error: the whole `text` for full-text providers and
/// providers with operator rules (when there is text), else only the structured code and
/// type.
pub fn resolve_rule_match_body<'a>(
    provider: Option<&str>,
    code: Option<&'a str>,
    kind: Option<&'a str>,
    text: &'a str,
    operator_rules: &[ProviderErrorRule],
) -> RuleBody<'a> {
    let full_text = named(provider)
        .is_some_and(|p| listed(FULL_TEXT_RULE_PROVIDERS, p) || !operator_rules.is_empty());
    if full_text && !text.is_empty() {
        RuleBody::Text(text)
    } else if code.is_some() || kind.is_some() {
        RuleBody::Structured { code, kind }
    } else {
        RuleBody::Empty
    }
}

/// The first matching rule for a provider: its operator rules first (same status, the
/// pattern a case-insensitive substring of the body), then its built-in rules in order.
pub fn provider_error_rule_match(
    provider: Option<&str>,
    status: u16,
    headers: &dyn Headers,
    body: RuleBody<'_>,
    operator_rules: &[ProviderErrorRule],
) -> Option<RuleMatch> {
    let provider = named(provider)?;
    let text = body.haystack();
    let operator = operator_rules.iter().enumerate().find(|(_, r)| {
        let pattern = if r.pattern.chars().any(char::is_uppercase) {
            Cow::Owned(r.pattern.to_lowercase())
        } else {
            Cow::Borrowed(r.pattern.as_str())
        };
        r.status == status && !pattern.is_empty() && text.contains(pattern.as_ref())
    });
    if let Some((i, r)) = operator {
        return Some(RuleMatch {
            reason: r.reason,
            scope: r.scope,
            cooldown_ms: r.cooldown_ms,
            source: RuleSource::Operator(i),
        });
    }
    builtin_rules_for(provider).find_map(|r| r.evaluate(status, headers, &text))
}

/// The opencode "model/endpoint unavailable" check, run on the raw text whatever the
/// allowlists say: only for 400/429 and the opencode family, and only a model-scoped
/// `model_capacity` match counts.
pub fn opencode_model_unavailable_match(
    provider: Option<&str>,
    status: u16,
    headers: &dyn Headers,
    text: &str,
) -> Option<RuleMatch> {
    let provider = named(provider)?;
    if !matches!(status, 400 | 429) || !listed(OPENCODE_FAMILY, provider) {
        return None;
    }
    let lower = text.to_lowercase();
    builtin_rules_for(provider)
        .filter_map(|r| r.evaluate(status, headers, &lower))
        .find(|m| m.scope == RuleScope::Model && m.reason == ErrorReason::ModelCapacity)
}

/// The first "reset in N `<unit>`" / "resets in N `<unit>`" of a lower-cased text, N > 0 and the
/// unit one of day(s), hour(s), minute(s), second(s), as milliseconds (not capped).
pub fn parse_reset_countdown_ms(lower: &str) -> Option<u64> {
    lower.match_indices("reset").find_map(|(i, m)| {
        let rest = &lower[i + m.len()..];
        let rest = rest.strip_prefix('s').unwrap_or(rest);
        let rest = rest.strip_prefix(" in ")?.trim_start();
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: u64 = rest[..digits].parse().ok().filter(|n| *n > 0)?;
        let unit = rest[digits..].trim_start();
        let word_len = unit.bytes().take_while(u8::is_ascii_alphabetic).count();
        let per = match &unit[..word_len] {
            "day" | "days" => DAY_MS,
            "hour" | "hours" => HOUR_MS,
            "minute" | "minutes" => MINUTE_MS,
            "second" | "seconds" => SECOND_MS,
            _ => return None,
        };
        Some(n.saturating_mul(per))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_HEADERS: [(&str, &str); 0] = [];

    fn op(
        status: u16,
        pattern: &str,
        scope: RuleScope,
        cooldown_ms: Option<u64>,
    ) -> ProviderErrorRule {
        ProviderErrorRule {
            status,
            pattern: pattern.into(),
            scope,
            reason: ErrorReason::QuotaExhausted,
            cooldown_ms,
        }
    }

    fn lookup(provider: &str, status: u16, headers: &dyn Headers, text: &str) -> Option<RuleMatch> {
        provider_error_rule_match(Some(provider), status, headers, RuleBody::Text(text), &[])
    }

    #[test]
    fn catalogue_ids_are_unique_and_every_rule_has_a_provider() {
        let mut ids: Vec<_> = builtin_rules().iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), builtin_rules().len());
        assert!(
            builtin_rules()
                .iter()
                .all(|r| !r.providers.is_empty() && !r.statuses.is_empty())
        );
    }

    #[test]
    fn builtin_catalogue_lookups() {
        let m = lookup(
            "opencode-go",
            429,
            &NO_HEADERS,
            "the endpoint is unavailable",
        )
        .unwrap();
        assert_eq!(
            m.source,
            RuleSource::Builtin("opencode-endpoint-unavailable")
        );
        assert_eq!(
            (m.reason, m.scope, m.cooldown_ms),
            (ErrorReason::ModelCapacity, RuleScope::Model, Some(300_000))
        );

        let m = lookup(
            "opencode-zen",
            429,
            &NO_HEADERS,
            "Monthly usage limit reached. Resets in 3 days.",
        )
        .unwrap();
        assert_eq!(
            m.source,
            RuleSource::Builtin("opencode-monthly-quota-resets-in")
        );
        assert_eq!(m.cooldown_ms, Some(3 * DAY_MS));
        assert_eq!(m.scope, RuleScope::Connection);
        // No countdown: the monthly rule does not match (and nothing else does).
        assert_eq!(
            lookup(
                "opencode-zen",
                429,
                &NO_HEADERS,
                "monthly usage limit reached"
            ),
            None
        );

        let m = lookup(
            "opencode-cli",
            429,
            &[("X-RateLimit-Remaining-Tokens", " 0 ")],
            "",
        )
        .unwrap();
        assert_eq!(
            m.source,
            RuleSource::Builtin("opencode-quota-exhausted-headers")
        );
        assert_eq!(
            lookup(
                "opencode-cli",
                429,
                &[("x-ratelimit-remaining-requests", "10")],
                ""
            ),
            None
        );

        let m = lookup(
            "OpenCode-Go",
            429,
            &NO_HEADERS,
            "{\"code\":\"plan_limit_reached\"}",
        )
        .unwrap();
        assert_eq!(
            m.source,
            RuleSource::Builtin("opencode-quota-exhausted-body")
        );

        let m = lookup(
            "opencode-go",
            400,
            &NO_HEADERS,
            "Upstream request failed: model is unavailable.",
        )
        .unwrap();
        assert_eq!(
            m.source,
            RuleSource::Builtin("opencode-400-model-unavailable")
        );
        assert_eq!(m.cooldown_ms, Some(3_600_000));

        let m = lookup(
            "minimax",
            429,
            &[("x-model-quota-remaining", "abab=3, m1 = 0")],
            "",
        )
        .unwrap();
        assert_eq!(
            (m.source, m.scope),
            (
                RuleSource::Builtin("minimax-per-model-quota"),
                RuleScope::Model
            )
        );
        assert_eq!(
            lookup("minimax", 429, &[("x-model-quota-remaining", "abab=3")], ""),
            None
        );

        let m = lookup(
            "cloudflare-ai",
            429,
            &NO_HEADERS,
            "Daily free allocation used",
        )
        .unwrap();
        assert_eq!(m.reason, ErrorReason::QuotaExhausted);

        let m = lookup("openrouter", 402, &NO_HEADERS, "").unwrap();
        assert_eq!(
            (m.scope, m.cooldown_ms),
            (RuleScope::Connection, Some(120_000))
        );
        assert_eq!(lookup("openrouter", 429, &NO_HEADERS, ""), None);

        for status in [400, 403, 429] {
            let m = lookup("agentrouter", status, &NO_HEADERS, "用户额度不足").unwrap();
            assert_eq!(
                m.source,
                RuleSource::Builtin("agentrouter-user-quota-exhausted")
            );
        }
        let m = lookup("agentrouter", 403, &NO_HEADERS, "无权访问模型 gpt-5").unwrap();
        assert_eq!(
            (m.reason, m.scope, m.cooldown_ms),
            (ErrorReason::AuthError, RuleScope::Model, Some(21_600_000))
        );

        // Another provider's rules never apply.
        assert_eq!(
            lookup("openai", 429, &NO_HEADERS, "the endpoint is unavailable"),
            None
        );
        assert_eq!(
            provider_error_rule_match(None, 402, &NO_HEADERS, RuleBody::Empty, &[]),
            None
        );
    }

    #[test]
    fn allowlists_gate_text_and_scope() {
        let text = "{\"error\":{\"message\":\"用户额度不足\",\"code\":\"quota\"}}";
        assert_eq!(
            resolve_rule_match_body(Some("AgentRouter"), Some("quota"), None, text, &[]),
            RuleBody::Text(text)
        );
        assert_eq!(
            resolve_rule_match_body(Some("opencode-go"), Some("quota"), None, text, &[]),
            RuleBody::Structured {
                code: Some("quota"),
                kind: None
            }
        );
        assert_eq!(
            resolve_rule_match_body(Some("opencode-go"), None, None, text, &[]),
            RuleBody::Empty
        );
        assert_eq!(
            resolve_rule_match_body(Some("agentrouter"), None, None, "", &[]),
            RuleBody::Empty
        );
        assert_eq!(
            resolve_rule_match_body(None, None, None, text, &[]),
            RuleBody::Empty
        );

        // An opencode body rule is blind to the text when only the structure is passed ...
        let body = resolve_rule_match_body(
            Some("opencode-go"),
            None,
            Some("error"),
            "account_quota_exceeded",
            &[],
        );
        assert_eq!(
            provider_error_rule_match(Some("opencode-go"), 429, &NO_HEADERS, body, &[]),
            None
        );
        // ... but sees a structured code that carries the marker.
        let body = resolve_rule_match_body(
            Some("opencode-go"),
            Some("account_quota_exceeded"),
            None,
            "x",
            &[],
        );
        assert!(
            provider_error_rule_match(Some("opencode-go"), 429, &NO_HEADERS, body, &[]).is_some()
        );

        assert!(honors_rule_lock_scope(Some("agentrouter"), &[]));
        assert!(honors_rule_lock_scope(Some("OPENCODE-ZEN"), &[]));
        assert!(!honors_rule_lock_scope(Some("openrouter"), &[]));
        assert!(!honors_rule_lock_scope(None, &[]));
        assert!(!honors_rule_lock_scope(
            Some("  "),
            &[op(400, "x", RuleScope::Model, None)]
        ));
    }

    #[test]
    fn operator_rules_bypass_both_allowlists_and_come_first() {
        let rules = [op(
            400,
            "insufficient",
            RuleScope::Provider,
            Some(21_600_000),
        )];
        assert!(honors_rule_lock_scope(Some("openrouter"), &rules));
        let text = "Insufficient funds on this key";
        let body = resolve_rule_match_body(Some("openrouter"), None, None, text, &rules);
        assert_eq!(body, RuleBody::Text(text));
        let m =
            provider_error_rule_match(Some("openrouter"), 400, &NO_HEADERS, body, &rules).unwrap();
        assert_eq!(m.source, RuleSource::Operator(0));
        assert_eq!(
            (m.reason, m.scope, m.cooldown_ms),
            (
                ErrorReason::QuotaExhausted,
                RuleScope::Provider,
                Some(21_600_000)
            )
        );
        // Status must be equal.
        assert_eq!(
            provider_error_rule_match(Some("openrouter"), 429, &NO_HEADERS, body, &rules),
            None
        );

        // An operator rule wins over a built-in one for the same failure.
        let mut first = op(402, "PAYMENT", RuleScope::Model, None);
        first.reason = ErrorReason::AuthError;
        let rules = [first];
        let m = provider_error_rule_match(
            Some("openrouter"),
            402,
            &NO_HEADERS,
            RuleBody::Text("payment required"),
            &rules,
        )
        .unwrap();
        assert_eq!(
            (m.source, m.reason),
            (RuleSource::Operator(0), ErrorReason::AuthError)
        );
        // Without a text hit the built-in still answers.
        let m = provider_error_rule_match(
            Some("openrouter"),
            402,
            &NO_HEADERS,
            RuleBody::Text("nope"),
            &rules,
        )
        .unwrap();
        assert_eq!(
            m.source,
            RuleSource::Builtin("openrouter-credit-exhausted-402")
        );
    }

    #[test]
    fn opencode_precheck_reads_raw_text_and_only_model_capacity() {
        let m = opencode_model_unavailable_match(
            Some("opencode-go"),
            400,
            &NO_HEADERS,
            "Upstream request failed: Model is unavailable.",
        )
        .unwrap();
        assert_eq!(m.cooldown_ms, Some(3_600_000));
        let m = opencode_model_unavailable_match(
            Some("opencode-cli"),
            429,
            &NO_HEADERS,
            "Endpoint is unavailable",
        )
        .unwrap();
        assert_eq!(m.cooldown_ms, Some(300_000));
        assert_eq!(
            opencode_model_unavailable_match(
                Some("opencode-cli"),
                429,
                &NO_HEADERS,
                "plan_limit_reached"
            ),
            None
        );
        assert_eq!(
            opencode_model_unavailable_match(
                Some("opencode-cli"),
                503,
                &NO_HEADERS,
                "endpoint is unavailable"
            ),
            None
        );
        assert_eq!(
            opencode_model_unavailable_match(
                Some("agentrouter"),
                400,
                &NO_HEADERS,
                "endpoint is unavailable"
            ),
            None
        );
    }

    #[test]
    fn reset_countdown() {
        assert_eq!(
            parse_reset_countdown_ms("limit reached, resets in 2 hours"),
            Some(2 * HOUR_MS)
        );
        assert_eq!(
            parse_reset_countdown_ms("will reset in 1 day"),
            Some(DAY_MS)
        );
        assert_eq!(
            parse_reset_countdown_ms("reset in 45 seconds"),
            Some(45_000)
        );
        assert_eq!(
            parse_reset_countdown_ms("reset in 10minutes"),
            Some(10 * MINUTE_MS)
        );
        assert_eq!(parse_reset_countdown_ms("reset in 0 days"), None);
        assert_eq!(
            parse_reset_countdown_ms("reset in soon, resets in 3 minutes"),
            Some(3 * MINUTE_MS)
        );
        assert_eq!(parse_reset_countdown_ms("reset in 3 fortnights"), None);
        assert_eq!(
            parse_reset_countdown_ms("resets in 99999999999999999999999 days"),
            None
        );
        assert_eq!(parse_reset_countdown_ms("reset"), None);
    }
}
