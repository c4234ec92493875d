//! Classification of one upstream failure (spec A §3.4, OmniRoute's `checkFallbackError`):
//! from the status, the error text, the headers and the connection's backoff level, decide
//! whether to move on to another target, for how long this connection cools, why, and
//! which side effects the failure carries (ban, credits, daily quota, rule scope, skip the
//! provider breaker). This module owns that decision and the text signals it reads (ban,
//! credits, long-quota); it runs once per failed attempt, after status restatement
//! (`restate`), and hands its [`FallbackDecision`] to the owners of the connection state,
//! the lockouts and the breaker. It is a pure function: `now` is an input, nothing is
//! stored.
//!
//! The steps run in the spec's order and the first that answers wins:
//! 0–1. structured codes (executor contract violation, previous-response binding);
//! 2. a 503 carrying `x-omni-fallback-hint: connection_cooldown`;
//! 4. text signals, only when there is error text: ban, retired model, endpoint moved,
//!    billing suspension, gemini quota metric, credits, daily quota, subscription quota,
//!    weekly, session, quota with a reset hint, the 403 branches (route, provider rule with
//!    honoured scope, opencode unavailable endpoint on 429, api-key 403);
//! 5. the configured rule table (text rules, then status rules), where a matching provider
//!    error rule (`rules`) may override reason, cooldown and scope; for a 429 from an
//!    api-key provider whose text is not a long quota only the status rule is consulted
//!    (`preserveQuota429`);
//! 6. 406/408/413/429/5xx; 7. 432; 8. 400 and 422; 9. anything else.
//!
//! Retry hints: a hint from the upstream (headers, JSON body, text) replaces the scaled
//! cooldown only when the category profile trusts upstream hints
//! (`use_upstream_retry_hints`); the quota-reset steps record the hint whatever the
//! profile says (`quota_reset_hint_ms`).
//!
//! Daily quota resets: OmniRoute resets at the provider node's configured time of day, or
//! at the server's local midnight. Tidegate takes the clock as an input
//! ([`ClassifyInput::daily_reset`]: a UTC offset and an hour); without one it uses **UTC
//! midnight**, so the answer never depends on the host's time zone.
//!
//! Skipped, each because it has no meaning without OmniRoute's own machinery:
//! - step 3, the rotation gate, and the rotation override of the scaled cooldown
//!   (`OMNIROUTE_ROTATION_*` environment; their defaults change nothing);
//! - the gemini per-model request counters of step 4e (the metric named in the error text
//!   is used; without one the step passes);
//! - the Mistral ambiguous-401 soft lockout of step 5 (behind the
//!   `MISTRAL_AMBIGUOUS_401_SOFT_LOCKOUT` feature flag);
//! - the rolling-24 h session variant of step 4j (not specified);
//! - the shared-wallet special case of the credit signals, and "passthrough provider"
//!   detection for the credits flag beyond the `*-compatible-*` naming (both need
//!   OmniRoute's provider registry).
//!
//! Deliberate deviations:
//! - Step 8 consults every provider error rule (operator and built-in) for 400/422, so
//!   rules for 400 fire (see `rules`).
//! - The `local` category counts as "not api-key" (like OmniRoute's non-apikey registry
//!   entries): its 429s keep their quota text and its 403s skip the api-key branch.
//! - At most [`MAX_CLASSIFIED_TEXT_BYTES`] of the error text are examined; a JSON error
//!   message is decoded and searched too, so escaped text (`\u989d…`) still matches.

use std::borrow::Cow;

use serde_json::Value;

use super::rules::{self, RuleMatch};
use super::{FallbackDecision, Headers, HintSource, Reason};
use crate::clock::Now;
use crate::config::AuthKind;
use crate::config::resilience::{
    ConnectionCooldownProfile, DAY_MS, ErrorReason, HOUR_MS, MINUTE_MS, ModelLockoutSettings,
    ProviderErrorRule, ResilienceSettings, SECOND_MS,
};
use crate::resilience::backoff;

/// Error text beyond this many bytes is not examined.
pub const MAX_CLASSIFIED_TEXT_BYTES: usize = 64 * 1024;
/// Cooldown of a ban signal (the connection also becomes `banned`).
pub const BAN_COOLDOWN_MS: u64 = 365 * DAY_MS;
/// Cooldown of a retired model or a moved endpoint.
pub const NOT_FOUND_COOLDOWN_MS: u64 = DAY_MS;
/// Cooldown of credit exhaustion and billing suspension (`paymentRequired`).
pub const PAYMENT_REQUIRED_COOLDOWN_MS: u64 = 2 * MINUTE_MS;
/// Cooldown of a subscription quota (and of a 432) without a trusted hint.
pub const SUBSCRIPTION_QUOTA_COOLDOWN_MS: u64 = HOUR_MS;
pub const WEEKLY_LIMIT_COOLDOWN_MS: u64 = DAY_MS;
pub const SESSION_LIMIT_COOLDOWN_MS: u64 = 5 * HOUR_MS;
/// Cooldown when the upstream says its service is not running (503 + fallback hint).
pub const SERVICE_NOT_RUNNING_COOLDOWN_MS: u64 = 5 * SECOND_MS;
/// Base cooldown without a profile.
pub const DEFAULT_BASE_COOLDOWN_MS: u64 = 5 * SECOND_MS;
/// Header an upstream (or an OmniRoute-compatible service supervisor) uses to say "cool
/// this connection briefly, the service is not running".
pub const FALLBACK_HINT_HEADER: &str = "x-omni-fallback-hint";

const MAX_DAILY_RESET_MS: u64 = 25 * HOUR_MS;
const BILLING_SUSPENSION_WINDOW_CHARS: usize = 120;

/// What classification needs of a category's cooldown settings: the category profile
/// plus the cap, which OmniRoute takes from the model-lockout settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CooldownProfile {
    pub base_cooldown_ms: u64,
    pub use_upstream_retry_hints: bool,
    pub max_backoff_steps: u32,
    /// 0 = the default cap (120 s).
    pub max_cooldown_ms: u64,
}

impl CooldownProfile {
    pub fn new(c: &ConnectionCooldownProfile, lockout: &ModelLockoutSettings) -> Self {
        Self {
            base_cooldown_ms: c.base_cooldown_ms,
            use_upstream_retry_hints: c.use_upstream_retry_hints,
            max_backoff_steps: c.max_backoff_steps,
            max_cooldown_ms: lockout.max_cooldown_ms,
        }
    }

    /// The profile of a provider category under the current settings.
    pub fn for_category(settings: &ResilienceSettings, auth: AuthKind) -> Self {
        Self::new(
            settings.connection_cooldown.get(auth),
            &settings.model_lockout,
        )
    }
}

/// When daily quotas reset: `hour` o'clock (0–23) at `utc_offset_minutes` east of UTC.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DailyReset {
    pub utc_offset_minutes: i16,
    pub hour: u8,
}

impl DailyReset {
    pub const UTC_MIDNIGHT: Self = Self {
        utc_offset_minutes: 0,
        hour: 0,
    };

    /// Milliseconds from `wall_ms` to the next reset, in (0, 24 h].
    pub fn ms_until_next(self, wall_ms: u64) -> u64 {
        let day = i128::from(DAY_MS);
        let local =
            i128::from(wall_ms) + i128::from(self.utc_offset_minutes) * i128::from(MINUTE_MS);
        let reset = i128::from(self.hour.min(23)) * i128::from(HOUR_MS);
        let until = (reset - local.rem_euclid(day)).rem_euclid(day);
        let until = if until == 0 { day } else { until };
        u64::try_from(until).unwrap_or(DAY_MS)
    }
}

/// The structured part of an upstream error body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StructuredError {
    pub code: Option<String>,
    /// The error `type` (or Google's `status`).
    pub kind: Option<String>,
    pub message: Option<String>,
}

impl StructuredError {
    /// Reads `error.{code,type,message}` (or the same at the top level, or Google's
    /// `error.status`); a string `error` is the message. A top-level array uses its first
    /// element.
    pub fn from_json(v: &Value) -> Self {
        let root = first_object(v);
        let scalar = |v: Option<&Value>| match v {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let mut out = Self::default();
        match root.get("error") {
            Some(Value::String(s)) => out.message = Some(s.clone()),
            Some(e @ Value::Object(_)) => {
                out.code = scalar(e.get("code"));
                out.kind = scalar(e.get("type")).or_else(|| scalar(e.get("status")));
                out.message = scalar(e.get("message"));
            }
            _ => {}
        }
        out.code = out.code.or_else(|| scalar(root.get("code")));
        out.kind = out.kind.or_else(|| scalar(root.get("type")));
        out.message = out.message.or_else(|| scalar(root.get("message")));
        out
    }
}

/// An error body parsed once: the JSON value (for hints) and its structured error.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParsedBody {
    pub json: Option<Value>,
    pub error: StructuredError,
}

/// Parses an error body when it looks like JSON and is at most
/// [`MAX_CLASSIFIED_TEXT_BYTES`] long; anything else gives an empty result.
pub fn parse_error_body(text: &str) -> ParsedBody {
    let t = text.trim_start();
    if text.len() > MAX_CLASSIFIED_TEXT_BYTES || !(t.starts_with('{') || t.starts_with('[')) {
        return ParsedBody::default();
    }
    match serde_json::from_str::<Value>(t) {
        Ok(v) => ParsedBody {
            error: StructuredError::from_json(&v),
            json: Some(v),
        },
        Err(_) => ParsedBody::default(),
    }
}

fn first_object(v: &Value) -> &Value {
    match v {
        Value::Array(items) => items.first().unwrap_or(v),
        _ => v,
    }
}

/// Everything classification reads about one failure.
#[derive(Clone, Copy)]
pub struct ClassifyInput<'a> {
    /// The status after restatement.
    pub status: u16,
    /// The error text: the raw error body, or the message when that is all there is.
    pub text: &'a str,
    pub headers: &'a dyn Headers,
    /// The connection's current backoff level.
    pub backoff_level: u32,
    pub model: Option<&'a str>,
    /// The provider's kind name (`config::kinds`; compared case-insensitively), never its id.
    pub provider: Option<&'a str>,
    pub auth: AuthKind,
    /// `None` = no provider profile: 5 s base, 15 steps, 120 s cap, no hints.
    pub profile: Option<CooldownProfile>,
    /// Structured error parsed elsewhere (e.g. from an SSE error event); when `None` the
    /// text is parsed as JSON.
    pub structured: Option<&'a StructuredError>,
    /// The operator's error rules for this provider
    /// ([`ResilienceSettings::error_rules_for`]).
    pub operator_rules: &'a [ProviderErrorRule],
    /// Ban signals added to the built-in list (never replacing it).
    pub extra_ban_signals: &'a [String],
    /// The provider's daily reset clock, if configured (else UTC midnight).
    pub daily_reset: Option<DailyReset>,
    pub now: Now,
}

impl<'a> ClassifyInput<'a> {
    /// An input with no provider, model, profile, rules or structured error, level 0 and
    /// the api-key category.
    pub fn new(status: u16, text: &'a str, headers: &'a dyn Headers, now: Now) -> Self {
        Self {
            status,
            text,
            headers,
            backoff_level: 0,
            model: None,
            provider: None,
            auth: AuthKind::ApiKey,
            profile: None,
            structured: None,
            operator_rules: &[],
            extra_ban_signals: &[],
            daily_reset: None,
            now,
        }
    }
}

/// Classifies one upstream failure (spec A §3.4).
pub fn check_fallback_error(input: &ClassifyInput<'_>) -> FallbackDecision {
    let cx = Ctx::new(input);
    cx.structured_codes()
        .or_else(|| cx.fallback_hint_header())
        .or_else(|| cx.text_signals())
        .or_else(|| cx.configured_rule())
        .or_else(|| cx.transient_status())
        .or_else(|| cx.status_432())
        .or_else(|| cx.bad_request())
        .unwrap_or_else(|| cx.unknown())
}

// ---------------------------------------------------------------------------------------
// Text signals (public: the terminal-state resolution reads the same lists).

const BAN_SIGNALS: &[&str] = &[
    "account_deactivated",
    "account has been deactivated",
    "account has been disabled",
    "your account has been suspended",
    "this account is deactivated",
    "this service has been disabled in this account for violation",
    "this service has been disabled in this account",
];

const CREDITS_SIGNALS: &[&str] = &[
    "insufficient_quota",
    "billing_hard_limit_reached",
    "exceeded your current quota",
    "exceeded your current usage quota",
    "credit_balance_too_low",
    "your credit balance is too low",
    "credits exhausted",
    "out of credits",
    "payment required",
    "free tier of the model has been exhausted",
    "tier has been exhausted",
    "insufficient balance",
    "insufficient_balance",
    "insufficient account balance",
    "insufficient credit balance",
    "insufficient credits",
    "insufficient credit",
    "exhausted all your credits",
];

/// Phrases that name a long quota window or an exhausted quota, not a short rate limit
/// (spec A §1.7: long-quota patterns and terminal credit/billing signals).
const LONG_QUOTA_MARKERS: &[&str] = &[
    "hard limit",
    "hard-limit",
    "hard_limit",
    "hardlimit",
    "out of credits",
    "individual quota reached",
    "enable overages",
    "insufficient_g1_credits_balance",
    "daily free allocation",
    "have exhausted their quota",
    "insufficient balance",
    "使用上限",
    "调用上限",
    "额度已用尽",
    "额度已用完",
];

/// Word pairs that name a long quota when the second follows the first on one line, any
/// words between ("monthly usage limit", "exceeded the daily token quota").
const LONG_QUOTA_PAIRS: &[(&str, &str)] = &[
    ("daily", "limit"),
    ("daily", "quota"),
    ("per-day", "limit"),
    ("per day", "limit"),
    ("perday", "limit"),
    ("per_day", "limit"),
    ("monthly", "limit"),
    ("monthly", "quota"),
    ("per-month", "limit"),
    ("per month", "limit"),
    ("permonth", "limit"),
    ("per_month", "limit"),
    ("quota", "exceed"),
    ("exceed", "quota"),
    ("insufficient", "quota"),
    ("billing", "cap"),
    ("credit", "exhaust"),
    ("plan", "limit"),
    ("resource has been exhausted", "reset after"),
    ("限额将在", "重置"),
];

/// Whether lower-cased text carries a ban signal (built-in list plus `extra`, compared
/// case-insensitively; blank extras are ignored).
pub fn is_ban_signal(lower: &str, extra: &[String]) -> bool {
    contains_any(lower, BAN_SIGNALS)
        || extra.iter().any(|s| {
            let s = s.trim();
            !s.is_empty() && lower.contains(s.to_lowercase().as_str())
        })
}

/// Whether lower-cased text says the account's credits or paid quota are exhausted.
pub fn is_credits_signal(lower: &str) -> bool {
    contains_any(lower, CREDITS_SIGNALS)
}

/// Whether lower-cased text names a long quota window or an exhausted quota (daily,
/// monthly, plan or hard limits, "individual quota reached", "enable overages", "daily
/// free allocation", "insufficient balance", a tokens-per-day limit, …): such a 429 is a
/// quota, not a short rate limit.
pub fn is_long_quota(lower: &str) -> bool {
    contains_any(lower, LONG_QUOTA_MARKERS)
        || LONG_QUOTA_PAIRS
            .iter()
            .any(|(first, then)| in_order(lower, first, then))
        || is_usage_limit_error_value(lower)
        || is_tpd_rate_limit(lower)
}

/// A JSON body whose `error` is the string "usage limit reached" (trailing dots and
/// spaces allowed): `{"error":"usage limit reached"}`.
fn is_usage_limit_error_value(lower: &str) -> bool {
    lower.match_indices("\"error\"").any(|(i, m)| {
        let rest = lower[i + m.len()..].trim_start();
        let Some(rest) = rest.strip_prefix(':') else {
            return false;
        };
        let Some(rest) = rest.trim_start().strip_prefix("\"usage limit reached") else {
            return false;
        };
        rest.trim_start_matches(['.', ' ', '\t', '\n', '\r'])
            .starts_with('"')
    })
}

/// "TPD rate limit" as words (tokens per day), e.g. Moonshot's "organization TPD rate
/// limit".
fn is_tpd_rate_limit(lower: &str) -> bool {
    lower.match_indices("tpd rate limit").any(|(i, m)| {
        let before = lower[..i].chars().next_back();
        let after = lower[i + m.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

fn contains_any(lower: &str, markers: &[&str]) -> bool {
    markers.iter().any(|m| lower.contains(m))
}

/// `first` occurs on a line and `then` occurs after it on the same line.
fn in_order(lower: &str, first: &str, then: &str) -> bool {
    lower.lines().any(|line| {
        line.find(first)
            .is_some_and(|i| line[i + first.len()..].contains(then))
    })
}

fn is_retired_model(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "no longer available",
            "no longer supported",
            "reached end of life",
            "reached its end of life",
            "end-of-life",
        ],
    ) || ["deprecated", "retired", "discontinued", "decommissioned"]
        .iter()
        .any(|w| in_order(lower, "model", w))
}

fn is_endpoint_moved(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "endpoint has moved",
            "no longer works",
            "update your base url",
        ],
    )
}

/// "suspended" within 120 characters of a billing word, either order.
fn is_billing_suspension(lower: &str) -> bool {
    const BILLING: &[&str] = &["spending limit", "billing", "invoice", "payment"];
    let near = |a: (usize, usize), b: (usize, usize)| {
        let (first, second) = if a.0 <= b.0 { (a, b) } else { (b, a) };
        let gap_end = second.0.max(first.1);
        lower[first.1.min(gap_end)..gap_end].chars().count() <= BILLING_SUSPENSION_WINDOW_CHARS
    };
    lower.match_indices("suspended").any(|(s, m)| {
        let sus = (s, s + m.len());
        BILLING.iter().any(|w| {
            lower
                .match_indices(w)
                .any(|(b, m)| near(sus, (b, b + m.len())))
        })
    })
}

/// Daily-quota text ("today's quota", "daily quota", "try again tomorrow").
pub fn is_daily_quota(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "today's quota",
            "today\u{2019}s quota",
            "daily quota",
            "try again tomorrow",
        ],
    )
}

/// Subscription-quota text ("usage limit reached", "you've reached your usage limit", …;
/// for provider `claude` also its account rate-limit sentence).
pub fn is_subscription_quota(lower: &str, provider: Option<&str>) -> bool {
    contains_any(
        lower,
        &[
            "usage limit reached",
            "usage limit has been",
            "claude pro usage limit",
            "you've reached your usage limit",
            "you\u{2019}ve reached your usage limit",
            "you have reached your usage limit",
        ],
    ) || (provider.is_some_and(|p| p.eq_ignore_ascii_case("claude"))
        && (lower.contains("this request would exceed your account's rate limit")
            || lower.contains("this request would exceed your account\u{2019}s rate limit")))
}

fn is_weekly_limit(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "weekly usage limit",
            "weekly limit reached",
            "reached your weekly",
        ],
    )
}

fn is_session_limit(lower: &str) -> bool {
    contains_any(lower, &["session usage limit", "session limit reached"])
        || (lower.contains("reached your session") && lower.contains("usage limit"))
}

/// Text that says an OAuth token is invalid or expired (A §3.6): a refresh may fix it, so
/// it is not terminal.
pub fn is_oauth_invalid_token(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "invalid authentication credentials",
            "oauth 2",
            "login cookie",
            "valid authentication credential",
            "invalid credentials",
            "re-authenticate your cline account",
        ],
    )
}

/// A Cloudflare browser-signature block (error 1010, `browser_signature_banned`) or a
/// Cloudflare challenge page: the client's signature was refused, not the account.
pub fn is_fingerprint_rejection(lower: &str) -> bool {
    const CHALLENGE: &[&str] = &[
        "_cf_chl_opt",
        "cdn-cgi/challenge-platform",
        "id=\"challenge-error-text\"",
        "id=\\\"challenge-error-text\\\"",
    ];
    let code_1010 = ["error code", "error_code", "error-code", "errorcode"]
        .iter()
        .any(|key| {
            lower.match_indices(key).any(|(i, m)| {
                let rest = &lower[i + m.len()..];
                let value = rest.trim_start_matches(['\\', '"', '\'', ':', '=', ' ']);
                rest.len() - value.len() <= 12
                    && value.strip_prefix("1010").is_some_and(|after| {
                        !after
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    })
            })
        });
    code_1010
        || lower.contains("error-1010")
        || lower.contains("error_1010")
        || lower.contains("browser_signature_banned")
        || lower.contains("fingerprint_rejection")
        || contains_any(lower, CHALLENGE)
}

/// A regional-availability refusal ("user location is not supported", "not available in
/// your region"): no other account behind the same egress can do better.
pub fn is_geo_blocked(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "user location is not supported",
            "location is not supported",
            "not supported for the api use",
            "region is not supported",
            "unsupported location",
            "not available in your location",
            "not available in your region",
        ],
    )
}

/// Providers whose upstream answers with Google's regional refusal (Gemini, Vertex, Cloud
/// Code / Antigravity).
pub fn is_geo_block_provider(provider: &str) -> bool {
    let p = provider.trim().to_ascii_lowercase();
    matches!(
        p.as_str(),
        "antigravity" | "agy" | "gemini" | "gemini-cli" | "vertex"
    ) || is_cloud_code_provider(&p)
}

/// Cloud Code (Gemini Code Assist) providers, whose 403s are project configuration.
pub fn is_cloud_code_provider(provider: &str) -> bool {
    let p = provider.trim().to_ascii_lowercase();
    p == "antigravity" || p == "gemini-cli" || p.contains("cloudcode") || p.contains("cloud-code")
}

/// A 403 about the project's configuration (the API not enabled on it, permission on the
/// project), which fixing the project clears: not a ban.
pub fn is_project_route_error(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "has not been used in project",
            "service_disabled",
            "accessnotconfigured",
            "permission_denied",
        ],
    ) || lower.match_indices("it is disabled").any(|(i, m)| {
        let before = lower[..i].chars().next_back();
        let after = lower[i + m.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// A Cloudflare Sentinel or Turnstile block of a browser-session account: terminal.
pub fn is_sentinel_block(lower: &str) -> bool {
    lower.contains("sentinel_blocked")
        || lower.contains("turnstile required")
        || lower.lines().any(|line| {
            line.find("sentinel").is_some_and(|i| {
                let rest = &line[i..];
                rest.char_indices()
                    .take_while(|(n, _)| *n <= 96)
                    .any(|(n, _)| rest[n..].starts_with("blocked"))
            })
        })
}

/// "model … is not supported" (the model named in the sentence): the model, not the
/// account.
pub fn is_model_named_unsupported(lower: &str) -> bool {
    lower.lines().any(|line| {
        line.match_indices("model").any(|(i, m)| {
            let rest = &line[i + m.len()..];
            rest.char_indices()
                .take_while(|(n, _)| *n <= 80)
                .any(|(n, _)| rest[n..].starts_with(" is not supported"))
        })
    })
}

/// A 404 about a request-scoped resource (a file, item, response or upload id), not the
/// model or the provider.
pub fn is_resource_not_found(lower: &str) -> bool {
    const THINGS: &[&str] = &[
        "file",
        "input_file",
        "input file",
        "file_id",
        "item",
        "response",
        "vector_store",
        "vector store",
        "upload",
    ];
    const MISSING: &[&str] = &["not found", "does not exist"];
    lower.lines().any(|line| {
        contains_any(line, MISSING)
            && THINGS.iter().any(|t| {
                line.match_indices(t).any(|(i, m)| {
                    let before = line[..i].chars().next_back();
                    let after = line[i + m.len()..].chars().next();
                    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                    !word(before) && (!word(after) || after == Some('s'))
                })
            })
    }) || lower.contains("file-") && contains_any(lower, MISSING)
}

/// The error text as classification searches it: lower-cased (at most
/// [`MAX_CLASSIFIED_TEXT_BYTES`]), plus the decoded JSON error message when the text
/// does not already contain it (so `\u989d…` escapes still match).
pub fn searchable_text(text: &str, structured: Option<&StructuredError>) -> String {
    let parsed;
    let error = match structured {
        Some(s) => s,
        None => {
            parsed = parse_error_body(text);
            &parsed.error
        }
    };
    let mut lower = cap_text(text).to_lowercase();
    if let Some(msg) = error.message.as_deref() {
        let msg = cap_text(msg).to_lowercase();
        if !msg.is_empty() && !lower.contains(&msg) {
            if !lower.is_empty() {
                lower.push('\n');
            }
            lower.push_str(&msg);
        }
    }
    lower
}

/// A 403 that no retry will fix: a Cloudflare browser-signature block, or an explicit
/// `retryable: false` that points at Cloudflare or at an action of the account owner.
fn is_hard_forbidden(lower: &str) -> bool {
    const OWNER_ACTION: &[&str] = &[
        "account owner",
        "organization owner",
        "owner must",
        "administrator",
        "contact your admin",
    ];
    let not_retryable =
        lower.contains("\"retryable\":false") || lower.contains("\"retryable\": false");
    lower.contains("error code: 1010")
        || (lower.contains("cloudflare") && lower.contains("1010"))
        || lower.contains("browser_signature_banned")
        || (not_retryable && (lower.contains("cloudflare") || contains_any(lower, OWNER_ACTION)))
}

fn is_credential_error(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "api key",
            "api_key",
            "apikey",
            "credential",
            "unauthorized",
            "unauthenticated",
            "authentication",
        ],
    )
}

fn is_model_access_text(lower: &str) -> bool {
    const ACCESS: &[&str] = &[
        "not found",
        "does not exist",
        "not available",
        "not supported",
        "unsupported",
        "no access",
        "not have access",
        "not allowed",
        "not enabled",
        "access denied",
        "permission",
    ];
    contains_any(
        lower,
        &["invalid model", "unknown model", "model_not_found"],
    ) || (lower.contains("model") && contains_any(lower, ACCESS))
}

/// Context-overflow text (the prompt exceeds the model's context window).
pub fn is_context_overflow(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "context length",
            "context_length",
            "context window",
            "maximum context",
            "too many tokens",
            "prompt is too long",
            "input is too long",
            "reduce the length",
            "token limit",
        ],
    )
}

fn is_malformed_request(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "malformed",
            "invalid json",
            "could not parse",
            "failed to parse",
            "unexpected token",
        ],
    )
}

fn is_parameter_validation(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "unsupported parameter",
            "unknown parameter",
            "invalid parameter",
            "unrecognized request argument",
            "extra inputs are not permitted",
            "is not supported",
            "validation error",
        ],
    )
}

fn is_bad_request_rate_limit(lower: &str) -> bool {
    contains_any(
        lower,
        &[
            "high frequency",
            "high-frequency",
            "non-compliant",
            "too many requests",
            "rate limit",
            "rate-limit",
            "频繁",
            "频率",
        ],
    )
}

// ---------------------------------------------------------------------------------------
// The configured rule table of step 5.

#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// Lower-case substring of the text, any status.
    Text(&'static str),
    Status(u16),
}

#[derive(Clone, Copy, Debug)]
enum Action {
    /// retryable(reason): trusted hint, else the scaled cooldown.
    Backoff,
    /// A fixed cooldown.
    Fixed(u64),
}

#[derive(Clone, Copy, Debug)]
struct ConfiguredRule {
    trigger: Trigger,
    action: Action,
    reason: ErrorReason,
}

const fn text_rule(m: &'static str, action: Action, reason: ErrorReason) -> ConfiguredRule {
    ConfiguredRule {
        trigger: Trigger::Text(m),
        action,
        reason,
    }
}

const fn status_rule(s: u16, action: Action, reason: ErrorReason) -> ConfiguredRule {
    ConfiguredRule {
        trigger: Trigger::Status(s),
        action,
        reason,
    }
}

const CONFIGURED_RULES: &[ConfiguredRule] = {
    use Action::{Backoff, Fixed};
    use ErrorReason::{
        AuthError, ModelCapacity, QuotaExhausted, RateLimitExceeded, ServerError, Unknown,
    };
    &[
        text_rule("no credentials", Fixed(120_000), AuthError),
        text_rule("request not allowed", Fixed(5_000), RateLimitExceeded),
        text_rule("improperly formed request", Fixed(0), ModelCapacity),
        text_rule("rate limit", Backoff, RateLimitExceeded),
        text_rule("too many requests", Backoff, RateLimitExceeded),
        text_rule("hour quota", Backoff, QuotaExhausted),
        text_rule("quota has been exceeded", Backoff, QuotaExhausted),
        text_rule("quota exceeded", Backoff, QuotaExhausted),
        text_rule("quota will reset", Backoff, QuotaExhausted),
        text_rule("exhausted your capacity", Backoff, QuotaExhausted),
        text_rule("quota exhausted", Backoff, QuotaExhausted),
        text_rule(
            "free tier of the model has been exhausted",
            Backoff,
            QuotaExhausted,
        ),
        text_rule("out of extra usage", Backoff, QuotaExhausted),
        text_rule("extra usage required", Backoff, QuotaExhausted),
        text_rule("capacity", Backoff, ModelCapacity),
        text_rule("overloaded", Backoff, ModelCapacity),
        text_rule("high demand", Backoff, ModelCapacity),
        status_rule(401, Fixed(0), AuthError),
        status_rule(402, Fixed(0), QuotaExhausted),
        status_rule(403, Fixed(0), QuotaExhausted),
        status_rule(404, Fixed(120_000), Unknown),
        status_rule(406, Backoff, ServerError),
        status_rule(408, Backoff, ServerError),
        status_rule(429, Backoff, RateLimitExceeded),
        status_rule(500, Backoff, ServerError),
        status_rule(502, Backoff, ServerError),
        status_rule(503, Backoff, ServerError),
        status_rule(504, Backoff, ServerError),
    ]
};

fn first_text_rule(lower: &str) -> Option<&'static ConfiguredRule> {
    CONFIGURED_RULES
        .iter()
        .find(|r| matches!(r.trigger, Trigger::Text(m) if lower.contains(m)))
}

fn status_rule_for(status: u16) -> Option<&'static ConfiguredRule> {
    CONFIGURED_RULES
        .iter()
        .find(|r| matches!(r.trigger, Trigger::Status(s) if s == status))
}

// ---------------------------------------------------------------------------------------
// Cooldown arithmetic and upstream hints: the backoff module's formulas and parsers.

struct Scaled {
    cooldown_ms: u64,
    base_ms: u64,
    new_level: u32,
}

impl FallbackDecision {
    /// The decision with its level-scaled cooldown recomputed from `level` (the owner's
    /// backoff level of the connection, which may be newer than the asker's view).
    pub fn rescaled(mut self, profile: Option<&CooldownProfile>, level: u32) -> Self {
        if self.level_scaled {
            let s = scaled_cooldown(profile, level);
            self.cooldown_ms = s.cooldown_ms;
            self.base_cooldown_ms = Some(s.base_ms);
            self.new_backoff_level = Some(s.new_level);
        }
        self
    }
}

/// The scaled cooldown of spec A §3.3 for this profile (or the no-profile defaults).
fn scaled_cooldown(profile: Option<&CooldownProfile>, level: u32) -> Scaled {
    let p = profile.map_or(backoff::BackoffProfile::NO_PROFILE, |p| {
        backoff::BackoffProfile {
            base_cooldown_ms: p.base_cooldown_ms,
            max_backoff_steps: p.max_backoff_steps,
            max_cooldown_ms: p.max_cooldown_ms,
        }
    });
    let s = backoff::scaled_cooldown(&p, level);
    Scaled {
        cooldown_ms: s.cooldown_ms,
        base_ms: s.base_cooldown_ms,
        new_level: s.new_backoff_level,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hint {
    ms: u64,
    source: HintSource,
}

/// The upstream retry hint (spec A §3.3): headers, then the JSON body, then the prose —
/// the backoff module's parsers.
fn upstream_hint(headers: Option<&dyn Headers>, raw_text: &str, now_ms: u64) -> Option<Hint> {
    let none: [(&str, &str); 0] = [];
    let h: &dyn Headers = headers.unwrap_or(&none);
    backoff::upstream_retry_hint(h, raw_text, now_ms).map(|(ms, source)| Hint { ms, source })
}

// ---------------------------------------------------------------------------------------
// The algorithm.

struct Ctx<'a> {
    input: &'a ClassifyInput<'a>,
    status: u16,
    /// The error text (capped), lower-cased, plus a decoded JSON message it did not
    /// already contain.
    lower: String,
    has_text: bool,
    error: Cow<'a, StructuredError>,
    provider: Option<&'a str>,
    /// Keep quota semantics on a 429: no provider, a non-api-key category, or long-quota
    /// text.
    preserve_quota_429: bool,
    /// Quota text may be trusted: not a 429, or a 429 whose quota semantics are kept.
    use_quota_signal: bool,
    /// The upstream hint from any source, trusted or not.
    hint: Option<Hint>,
}

fn cap_text(text: &str) -> &str {
    let mut end = text.len().min(MAX_CLASSIFIED_TEXT_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl<'a> Ctx<'a> {
    fn new(input: &'a ClassifyInput<'a>) -> Self {
        let parsed = parse_error_body(input.text);
        let error = match input.structured {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(parsed.error),
        };
        let lower = searchable_text(input.text, Some(&error));
        let provider = input.provider.map(str::trim).filter(|p| !p.is_empty());
        let preserve_quota_429 =
            provider.is_none() || input.auth != AuthKind::ApiKey || is_long_quota(&lower);
        let hint = upstream_hint(Some(input.headers), input.text, input.now.wall_ms);
        Self {
            input,
            status: input.status,
            has_text: !lower.trim().is_empty(),
            lower,
            error,
            provider,
            preserve_quota_429,
            use_quota_signal: input.status != 429 || preserve_quota_429,
            hint,
        }
    }

    fn provider_is(&self, name: &str) -> bool {
        self.provider.is_some_and(|p| p.eq_ignore_ascii_case(name))
    }

    fn profile(&self) -> Option<&CooldownProfile> {
        self.input.profile.as_ref()
    }

    /// The hint, when the profile trusts upstream hints.
    fn trusted_hint(&self) -> Option<Hint> {
        self.hint
            .filter(|_| self.profile().is_some_and(|p| p.use_upstream_retry_hints))
    }

    fn scaled(&self) -> Scaled {
        scaled_cooldown(self.profile(), self.input.backoff_level)
    }

    /// A trusted hint, else the scaled cooldown.
    fn retryable(&self, reason: Reason) -> FallbackDecision {
        match self.trusted_hint() {
            Some(h) => {
                let mut d = FallbackDecision::new(true, h.ms, reason);
                d.new_backoff_level = Some(0);
                d.used_upstream_retry_hint = true;
                d.retry_hint_source = Some(h.source);
                d
            }
            None => {
                let s = self.scaled();
                let mut d = FallbackDecision::new(true, s.cooldown_ms, reason);
                d.base_cooldown_ms = Some(s.base_ms);
                d.new_backoff_level = Some(s.new_level);
                d.level_scaled = true;
                d
            }
        }
    }

    fn honors_scope(&self) -> bool {
        rules::honors_rule_lock_scope(self.provider, self.input.operator_rules)
    }

    /// The provider error rule for this failure, reading what the allowlists allow.
    fn provider_rule(&self) -> Option<RuleMatch> {
        let body = rules::resolve_rule_match_body(
            self.provider,
            self.error.code.as_deref(),
            self.error.kind.as_deref(),
            &self.lower,
            self.input.operator_rules,
        );
        rules::provider_error_rule_match(
            self.provider,
            self.status,
            self.input.headers,
            body,
            self.input.operator_rules,
        )
    }

    /// A matched rule applied as is: its cooldown (level 0) or the scaled one.
    fn rule_scoped(&self, m: &RuleMatch) -> FallbackDecision {
        let s = self.scaled();
        let mut d = FallbackDecision::new(
            true,
            m.cooldown_ms.unwrap_or(s.cooldown_ms),
            m.reason.into(),
        );
        d.base_cooldown_ms = Some(m.cooldown_ms.unwrap_or(s.base_ms));
        d.configured_cooldown_ms = m.cooldown_ms;
        d.new_backoff_level = Some(if m.cooldown_ms.is_some() {
            0
        } else {
            s.new_level
        });
        d.rule_scope = self.honors_scope().then_some(m.scope);
        d.level_scaled = m.cooldown_ms.is_none();
        d
    }

    fn code_is(&self, code: &str) -> bool {
        self.error
            .code
            .as_deref()
            .is_some_and(|c| c.eq_ignore_ascii_case(code))
    }

    fn kind_is(&self, kind: &str) -> bool {
        self.error
            .kind
            .as_deref()
            .is_some_and(|k| k.eq_ignore_ascii_case(kind))
    }

    // Steps 0–1.
    fn structured_codes(&self) -> Option<FallbackDecision> {
        let reason = if self.code_is("executor_contract_violation") {
            Reason::ExecutorContractViolation
        } else if self.code_is("invalid_previous_response_binding")
            || (self.status == 409 && self.lower.contains("previous_response_id does not belong"))
        {
            Reason::InvalidPreviousResponseBinding
        } else {
            return None;
        };
        let mut d = FallbackDecision::new(false, 0, reason);
        d.skip_provider_breaker = true;
        Some(d)
    }

    // Step 2.
    fn fallback_hint_header(&self) -> Option<FallbackDecision> {
        let hinted = self.status == 503
            && self
                .input
                .headers
                .get(FALLBACK_HINT_HEADER)
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("connection_cooldown"));
        hinted.then(|| {
            let mut d = FallbackDecision::new(
                true,
                SERVICE_NOT_RUNNING_COOLDOWN_MS,
                Reason::ServiceNotRunning,
            );
            d.base_cooldown_ms = Some(SERVICE_NOT_RUNNING_COOLDOWN_MS);
            d.new_backoff_level = Some(0);
            d.skip_provider_breaker = true;
            d
        })
    }

    // Step 4: only when there is error text.
    fn text_signals(&self) -> Option<FallbackDecision> {
        if !self.has_text {
            return None;
        }
        self.ban()
            .or_else(|| self.retired_model())
            .or_else(|| self.endpoint_moved())
            .or_else(|| self.billing_suspension())
            .or_else(|| self.gemini_metric())
            .or_else(|| self.credits())
            .or_else(|| self.daily_quota())
            .or_else(|| self.subscription_quota_text())
            .or_else(|| self.weekly_limit())
            .or_else(|| self.session_limit())
            .or_else(|| self.quota_with_reset_hint())
            .or_else(|| self.forbidden_route())
            .or_else(|| self.forbidden_provider_rule())
            .or_else(|| self.opencode_endpoint_unavailable())
            .or_else(|| self.apikey_forbidden())
    }

    // 4a.
    fn ban(&self) -> Option<FallbackDecision> {
        is_ban_signal(&self.lower, self.input.extra_ban_signals).then(|| {
            let mut d = FallbackDecision::new(true, BAN_COOLDOWN_MS, Reason::AuthError);
            d.permanent = true;
            d
        })
    }

    fn not_found_24h() -> FallbackDecision {
        let mut d = FallbackDecision::new(true, NOT_FOUND_COOLDOWN_MS, Reason::NotFound);
        d.quota_reset_hint_ms = Some(NOT_FOUND_COOLDOWN_MS);
        d
    }

    // 4b.
    fn retired_model(&self) -> Option<FallbackDecision> {
        (matches!(self.status, 404 | 410) && is_retired_model(&self.lower))
            .then(Self::not_found_24h)
    }

    // 4c.
    fn endpoint_moved(&self) -> Option<FallbackDecision> {
        is_endpoint_moved(&self.lower).then(Self::not_found_24h)
    }

    fn payment_required(credits_exhausted: bool) -> FallbackDecision {
        let mut d =
            FallbackDecision::new(true, PAYMENT_REQUIRED_COOLDOWN_MS, Reason::QuotaExhausted);
        d.credits_exhausted = credits_exhausted;
        d
    }

    // 4d.
    fn billing_suspension(&self) -> Option<FallbackDecision> {
        is_billing_suspension(&self.lower).then(|| Self::payment_required(true))
    }

    // 4e, without the per-model request counters: the quota metric named in the text.
    fn gemini_metric(&self) -> Option<FallbackDecision> {
        let applies = self.status == 429
            && self.provider_is("gemini")
            && self.input.model.is_some_and(|m| !m.trim().is_empty());
        if !applies {
            return None;
        }
        if contains_any(&self.lower, &["perday", "per day", "per_day"]) {
            Some(self.retryable(Reason::QuotaExhausted))
        } else if contains_any(&self.lower, &["perminute", "per minute", "per_minute"]) {
            Some(self.retryable(Reason::RateLimitExceeded))
        } else {
            None
        }
    }

    // 4f.
    fn credits(&self) -> Option<FallbackDecision> {
        if !self.use_quota_signal || !is_credits_signal(&self.lower) {
            return None;
        }
        // A `*-compatible-*` provider is a passthrough: its "credits" message is about one
        // upstream model, not the account — unless it is Moonshot's empty-balance error.
        let model_scoped = self.provider.is_some_and(|p| p.contains("-compatible"))
            && !self.lower.contains("exceeded_current_quota_error");
        Some(Self::payment_required(!model_scoped))
    }

    // 4g.
    fn daily_quota(&self) -> Option<FallbackDecision> {
        if !self.use_quota_signal {
            return None;
        }
        let daily = is_daily_quota(&self.lower);
        let tpd = is_tpd_rate_limit(&self.lower);
        let now = self.input.now.wall_ms;
        let ms = if daily {
            self.input
                .daily_reset
                .unwrap_or(DailyReset::UTC_MIDNIGHT)
                .ms_until_next(now)
        } else if tpd {
            // Tokens-per-day text alone says nothing about when; without a configured
            // clock or a reset header it is an ordinary 429.
            match self.input.daily_reset {
                Some(c) => c.ms_until_next(now),
                None => backoff::header_hint(self.input.headers, now)?,
            }
        } else {
            return None;
        };
        let ms = if ms == 0 || ms > MAX_DAILY_RESET_MS {
            DAY_MS
        } else {
            ms.min(DAY_MS)
        };
        let mut d = FallbackDecision::new(true, ms, Reason::QuotaExhausted);
        d.daily_quota_exhausted = true;
        Some(d)
    }

    /// The subscription-quota result: a trusted hint, else one hour; the reset the body
    /// names is recorded whatever the profile says.
    fn subscription_quota(&self) -> FallbackDecision {
        let hint = self.trusted_hint();
        let mut d = FallbackDecision::new(
            true,
            hint.map_or(SUBSCRIPTION_QUOTA_COOLDOWN_MS, |h| h.ms),
            Reason::QuotaExhausted,
        );
        d.used_upstream_retry_hint = hint.is_some();
        d.retry_hint_source = hint.map(|h| h.source);
        d.quota_reset_hint_ms =
            upstream_hint(None, self.input.text, self.input.now.wall_ms).map(|h| h.ms);
        d
    }

    // 4h.
    fn subscription_quota_text(&self) -> Option<FallbackDecision> {
        (self.use_quota_signal && is_subscription_quota(&self.lower, self.provider))
            .then(|| self.subscription_quota())
    }

    // 4i.
    fn weekly_limit(&self) -> Option<FallbackDecision> {
        is_weekly_limit(&self.lower)
            .then(|| FallbackDecision::new(true, WEEKLY_LIMIT_COOLDOWN_MS, Reason::QuotaExhausted))
    }

    // 4j.
    fn session_limit(&self) -> Option<FallbackDecision> {
        is_session_limit(&self.lower)
            .then(|| FallbackDecision::new(true, SESSION_LIMIT_COOLDOWN_MS, Reason::QuotaExhausted))
    }

    // 4k. "Classifies as quota": the first text rule of the table is a quota rule, or the
    // text names a long quota window.
    fn quota_with_reset_hint(&self) -> Option<FallbackDecision> {
        let hint = self.hint?;
        let quota_text = first_text_rule(&self.lower)
            .is_some_and(|r| r.reason == ErrorReason::QuotaExhausted)
            || is_long_quota(&self.lower);
        (self.use_quota_signal && quota_text).then(|| {
            let mut d = self.retryable(Reason::QuotaExhausted);
            d.quota_reset_hint_ms = Some(hint.ms);
            d
        })
    }

    // 4l.
    fn forbidden_route(&self) -> Option<FallbackDecision> {
        (self.status == 403 && self.lower.contains("not authorized for this route"))
            .then(|| FallbackDecision::new(false, 0, Reason::Unknown))
    }

    // 4m.
    fn forbidden_provider_rule(&self) -> Option<FallbackDecision> {
        if self.status != 403 || !self.honors_scope() {
            return None;
        }
        self.provider_rule().map(|m| self.rule_scoped(&m))
    }

    // 4n.
    fn opencode_endpoint_unavailable(&self) -> Option<FallbackDecision> {
        if self.status != 429 {
            return None;
        }
        rules::opencode_model_unavailable_match(self.provider, 429, self.input.headers, &self.lower)
            .map(|m| self.rule_scoped(&m))
    }

    // 4o.
    fn apikey_forbidden(&self) -> Option<FallbackDecision> {
        let applies = self.status == 403
            && self.input.auth == AuthKind::ApiKey
            && !contains_any(
                &self.lower,
                &[
                    "has not been used in project",
                    "hour quota",
                    "quota has been exceeded",
                ],
            );
        if !applies {
            return None;
        }
        Some(if is_hard_forbidden(&self.lower) {
            FallbackDecision::new(true, 0, Reason::AuthError)
        } else {
            self.retryable(Reason::AuthError)
        })
    }

    // Step 5.
    fn configured_rule(&self) -> Option<FallbackDecision> {
        let rule = if self.status == 429 && !self.preserve_quota_429 {
            status_rule_for(429)
        } else {
            first_text_rule(&self.lower).or_else(|| status_rule_for(self.status))
        }?;
        let provider_rule = self.provider_rule();
        let scope = provider_rule
            .filter(|_| self.honors_scope())
            .map(|m| m.scope);
        let reason: Reason = provider_rule.map_or(rule.reason, |m| m.reason).into();
        let mut d = match rule.action {
            Action::Backoff => {
                let mut d = self.retryable(reason);
                if let Some(ms) = provider_rule
                    .and_then(|m| m.cooldown_ms)
                    .filter(|ms| *ms > 0)
                {
                    d.cooldown_ms = ms;
                    d.base_cooldown_ms = Some(ms);
                    d.configured_cooldown_ms = Some(ms);
                    // A configured cooldown is not scaled by the backoff level.
                    d.level_scaled = false;
                }
                d
            }
            Action::Fixed(configured) => {
                let ms = provider_rule
                    .and_then(|m| m.cooldown_ms)
                    .unwrap_or(configured);
                let mut d = FallbackDecision::new(true, ms, reason);
                d.base_cooldown_ms = Some(ms);
                d.configured_cooldown_ms = Some(ms);
                d
            }
        };
        d.rule_scope = scope;
        Some(d)
    }

    // Step 6 (in practice only 413 gets here; the others have status rules).
    fn transient_status(&self) -> Option<FallbackDecision> {
        match self.status {
            413 => Some(self.retryable(Reason::ModelCapacity)),
            406 | 408 | 429 | 500 | 502 | 503 | 504 => Some(self.retryable(Reason::ServerError)),
            _ => None,
        }
    }

    // Step 7.
    fn status_432(&self) -> Option<FallbackDecision> {
        if self.status != 432 {
            return None;
        }
        if is_subscription_quota(&self.lower, self.provider) {
            return Some(self.subscription_quota());
        }
        let hint = self.trusted_hint();
        let mut d = FallbackDecision::new(
            true,
            hint.map_or(SUBSCRIPTION_QUOTA_COOLDOWN_MS, |h| h.ms),
            Reason::QuotaExhausted,
        );
        d.used_upstream_retry_hint = hint.is_some();
        d.retry_hint_source = hint.map(|h| h.source);
        Some(d)
    }

    // Step 8.
    fn bad_request(&self) -> Option<FallbackDecision> {
        if !matches!(self.status, 400 | 422) {
            return None;
        }
        // Deviation: every provider rule for the status is consulted, built-in ones too.
        if let Some(m) = self.provider_rule().or_else(|| {
            rules::opencode_model_unavailable_match(
                self.provider,
                self.status,
                self.input.headers,
                &self.lower,
            )
        }) {
            return Some(self.rule_scoped(&m));
        }
        let lower = &self.lower;
        let model_access = self.code_is("model_not_found")
            || self.code_is("deployment_not_found")
            || self.kind_is("not_found_error")
            || (self.kind_is("permission_error") && is_model_access_text(lower))
            || (is_model_access_text(lower) && !is_credential_error(lower));
        let nvidia_degraded = lower.contains("function") && lower.contains("degraded");
        if model_access
            || is_context_overflow(lower)
            || is_malformed_request(lower)
            || is_parameter_validation(lower)
            || nvidia_degraded
        {
            return Some(FallbackDecision::new(true, 0, Reason::ModelCapacity));
        }
        if is_bad_request_rate_limit(lower) {
            return Some(self.retryable(Reason::RateLimitExceeded));
        }
        Some(FallbackDecision::new(false, 0, Reason::Unknown))
    }

    // Step 9.
    fn unknown(&self) -> FallbackDecision {
        let base = self
            .profile()
            .map_or(DEFAULT_BASE_COOLDOWN_MS, |p| p.base_cooldown_ms);
        let mut d = FallbackDecision::new(true, base, Reason::Unknown);
        d.base_cooldown_ms = Some(base);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::resilience::RuleScope;
    use proptest::prelude::*;

    /// 2026-01-10T00:00:00Z and 21:00 the same day.
    const MIDNIGHT: u64 = 20_463 * DAY_MS;
    const WALL: u64 = MIDNIGHT + 21 * HOUR_MS;
    const NOW: Now = Now {
        mono_ns: 0,
        wall_ms: WALL,
    };

    const APIKEY: CooldownProfile = CooldownProfile {
        base_cooldown_ms: 3_000,
        use_upstream_retry_hints: true,
        max_backoff_steps: 5,
        max_cooldown_ms: 1_800_000,
    };
    const OAUTH: CooldownProfile = CooldownProfile {
        base_cooldown_ms: 5_000,
        use_upstream_retry_hints: false,
        max_backoff_steps: 8,
        max_cooldown_ms: 1_800_000,
    };

    struct Pairs<'a>(&'a [(&'a str, &'a str)]);

    impl Headers for Pairs<'_> {
        fn get(&self, name: &str) -> Option<&str> {
            <[(&str, &str)] as Headers>::get(self.0, name)
        }
    }

    #[derive(Clone)]
    struct Case {
        status: u16,
        text: &'static str,
        headers: &'static [(&'static str, &'static str)],
        provider: Option<&'static str>,
        auth: AuthKind,
        profile: Option<CooldownProfile>,
        level: u32,
        model: Option<&'static str>,
        ops: Vec<ProviderErrorRule>,
        bans: Vec<String>,
        daily: Option<DailyReset>,
        structured: Option<StructuredError>,
    }

    fn c(status: u16, text: &'static str) -> Case {
        Case {
            status,
            text,
            headers: &[],
            provider: Some("openai"),
            auth: AuthKind::ApiKey,
            profile: Some(APIKEY),
            level: 0,
            model: None,
            ops: Vec::new(),
            bans: Vec::new(),
            daily: None,
            structured: None,
        }
    }

    impl Case {
        fn oauth(mut self) -> Self {
            self.auth = AuthKind::OAuth;
            self.profile = Some(OAUTH);
            self
        }
        fn provider(mut self, p: &'static str) -> Self {
            self.provider = Some(p);
            self
        }
        fn no_provider(mut self) -> Self {
            self.provider = None;
            self.profile = None;
            self
        }
        fn no_profile(mut self) -> Self {
            self.profile = None;
            self
        }
        fn headers(mut self, h: &'static [(&'static str, &'static str)]) -> Self {
            self.headers = h;
            self
        }
        fn level(mut self, l: u32) -> Self {
            self.level = l;
            self
        }
        fn model(mut self, m: &'static str) -> Self {
            self.model = Some(m);
            self
        }
        fn op(
            mut self,
            status: u16,
            pattern: &str,
            scope: RuleScope,
            cooldown_ms: Option<u64>,
        ) -> Self {
            self.ops.push(ProviderErrorRule {
                status,
                pattern: pattern.into(),
                scope,
                reason: ErrorReason::QuotaExhausted,
                cooldown_ms,
            });
            self
        }
        fn ban(mut self, s: &str) -> Self {
            self.bans.push(s.into());
            self
        }
        fn daily(mut self, d: DailyReset) -> Self {
            self.daily = Some(d);
            self
        }
        fn structured(mut self, code: &str) -> Self {
            self.structured = Some(StructuredError {
                code: Some(code.into()),
                ..StructuredError::default()
            });
            self
        }
        fn run(&self) -> FallbackDecision {
            let headers = Pairs(self.headers);
            let mut input = ClassifyInput::new(self.status, self.text, &headers, NOW);
            input.provider = self.provider;
            input.auth = self.auth;
            input.profile = self.profile;
            input.backoff_level = self.level;
            input.model = self.model;
            input.operator_rules = &self.ops;
            input.extra_ban_signals = &self.bans;
            input.daily_reset = self.daily;
            input.structured = self.structured.as_ref();
            let mut d = check_fallback_error(&input);
            // A level-scaled decision rescaled at the level it was made at is itself (the
            // owner's rescale changes only what a newer level changes).
            if d.level_scaled {
                assert_eq!(d.clone().rescaled(self.profile.as_ref(), self.level), d);
            }
            d.level_scaled = false;
            d
        }
    }

    fn want(should_fallback: bool, cooldown_ms: u64, reason: Reason) -> FallbackDecision {
        FallbackDecision::new(should_fallback, cooldown_ms, reason)
    }

    /// The api-key profile's scaled result at level 0.
    fn scaled(reason: Reason) -> FallbackDecision {
        want(true, 3_000, reason).base(3_000).lvl(1)
    }

    /// The oauth profile's scaled result at level 0.
    fn scaled_oauth(reason: Reason) -> FallbackDecision {
        want(true, 5_000, reason).base(5_000).lvl(1)
    }

    trait Expect {
        fn base(self, ms: u64) -> Self;
        fn lvl(self, l: u32) -> Self;
        fn used(self, s: HintSource) -> Self;
        fn scope(self, s: RuleScope) -> Self;
        fn configured(self, ms: u64) -> Self;
        fn reset(self, ms: u64) -> Self;
        fn permanent(self) -> Self;
        fn credits(self) -> Self;
        fn daily(self) -> Self;
        fn skip(self) -> Self;
    }

    impl Expect for FallbackDecision {
        fn base(mut self, ms: u64) -> Self {
            self.base_cooldown_ms = Some(ms);
            self
        }
        fn lvl(mut self, l: u32) -> Self {
            self.new_backoff_level = Some(l);
            self
        }
        fn used(mut self, s: HintSource) -> Self {
            self.used_upstream_retry_hint = true;
            self.retry_hint_source = Some(s);
            self
        }
        fn scope(mut self, s: RuleScope) -> Self {
            self.rule_scope = Some(s);
            self
        }
        fn configured(mut self, ms: u64) -> Self {
            self.configured_cooldown_ms = Some(ms);
            self
        }
        fn reset(mut self, ms: u64) -> Self {
            self.quota_reset_hint_ms = Some(ms);
            self
        }
        fn permanent(mut self) -> Self {
            self.permanent = true;
            self
        }
        fn credits(mut self) -> Self {
            self.credits_exhausted = true;
            self
        }
        fn daily(mut self) -> Self {
            self.daily_quota_exhausted = true;
            self
        }
        fn skip(mut self) -> Self {
            self.skip_provider_breaker = true;
            self
        }
    }

    const GOOGLE_429: &str = r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"33s"}]}}"#;

    #[rustfmt::skip]
    fn vectors() -> Vec<(&'static str, Case, FallbackDecision)> {
        use HintSource::{Body, GoogleRpcRetryInfo, Header};
        use Reason::*;
        use RuleScope::{Connection, Model, Provider};
        let rule_fixed = |ms: u64, r: Reason| want(true, ms, r).base(ms).configured(ms);
        vec![
            // 0–1: structured codes.
            ("0 executor contract violation", c(502, r#"{"error":{"code":"executor_contract_violation","message":"bad"}}"#), want(false, 0, ExecutorContractViolation).skip()),
            ("0 structured code from the caller", c(500, "boom").structured("executor_contract_violation"), want(false, 0, ExecutorContractViolation).skip()),
            ("1 binding code", c(400, r#"{"error":{"code":"invalid_previous_response_binding"}}"#), want(false, 0, InvalidPreviousResponseBinding).skip()),
            ("1 409 binding text", c(409, "previous_response_id does not belong to this account"), want(false, 0, InvalidPreviousResponseBinding).skip()),
            // 2: the service supervisor's hint.
            ("2 503 fallback hint", c(503, "").headers(&[("X-Omni-Fallback-Hint", " Connection_Cooldown ")]), want(true, 5_000, ServiceNotRunning).base(5_000).lvl(0).skip()),
            ("2 other hint value", c(503, "").headers(&[("x-omni-fallback-hint", "other")]), scaled(ServerError)),
            ("2 hint on a 502 is ignored", c(502, "").headers(&[("x-omni-fallback-hint", "connection_cooldown")]), scaled(ServerError)),
            // 4a: ban signals.
            ("4a ban wins over the 429 rule", c(429, "Your account has been suspended"), want(true, BAN_COOLDOWN_MS, AuthError).permanent()),
            ("4a ban code in json", c(401, r#"{"error":{"type":"account_deactivated"}}"#), want(true, BAN_COOLDOWN_MS, AuthError).permanent()),
            ("4a custom ban signal", c(403, "naughty word detected").ban("NAUGHTY"), want(true, BAN_COOLDOWN_MS, AuthError).permanent()),
            ("4a blank custom ban ignored", c(500, "anything").ban("  "), scaled(ServerError)),
            // 4b–c: gone for good.
            ("4b retired model 404", c(404, "The model gpt-3 has been deprecated"), want(true, DAY_MS, NotFound).reset(DAY_MS)),
            ("4b 410 no longer available", c(410, "This model is no longer available"), want(true, DAY_MS, NotFound).reset(DAY_MS)),
            ("4b only 404/410", c(400, "model was retired"), want(false, 0, Unknown)),
            ("4c endpoint moved, any status", c(400, "This endpoint has moved. Please update your base URL."), want(true, DAY_MS, NotFound).reset(DAY_MS)),
            // 4d: billing suspension.
            ("4d suspended near spending limit", c(403, "Access suspended: your monthly spending limit was reached"), want(true, 120_000, QuotaExhausted).credits()),
            ("4d either order", c(400, "Billing problem: this organization was suspended"), want(true, 120_000, QuotaExhausted).credits()),
            // 4e: gemini quota metric.
            ("4e gemini per day", c(429, "Quota exceeded for metric GenerateRequestsPerDayPerProjectPerModel-FreeTier").provider("gemini").model("gemini-2.5-pro"), scaled(QuotaExhausted)),
            ("4e gemini per minute", c(429, "Quota exceeded for metric GenerateRequestsPerMinutePerProjectPerModel").provider("gemini").model("gemini-2.5-pro"), scaled(RateLimitExceeded)),
            ("4e needs a model", c(429, "Quota exceeded for metric GenerateRequestsPerMinutePerProjectPerModel").provider("gemini"), scaled(QuotaExhausted)),
            // 4f: credits.
            ("4f credits on a 402", c(402, r#"{"error":{"code":"insufficient_quota","message":"You exceeded your current quota"}}"#), want(true, 120_000, QuotaExhausted).credits()),
            ("4f credits text on an api-key 429 is a rate limit", c(429, "payment required"), scaled(RateLimitExceeded)),
            ("4f credits text that is a quota pattern on an api-key 429", c(429, "insufficient_quota"), want(true, 120_000, QuotaExhausted).credits()),
            ("4f insufficient balance on an api-key 429", c(429, "Insufficient balance"), want(true, 120_000, QuotaExhausted).credits()),
            ("4f credits on an oauth 429", c(429, "Your credit balance is too low").oauth(), want(true, 120_000, QuotaExhausted).credits()),
            ("4f compatible provider: no credits flag", c(402, "insufficient balance").provider("openai-compatible-acme"), want(true, 120_000, QuotaExhausted)),
            ("4f compatible moonshot empty balance", c(402, r#"{"error":{"type":"exceeded_current_quota_error","message":"insufficient balance"}}"#).provider("openai-compatible-moonshot"), want(true, 120_000, QuotaExhausted).credits()),
            // 4g: daily quota.
            ("4g daily at UTC midnight", c(429, "You have exceeded today's quota").oauth(), want(true, 3 * HOUR_MS, QuotaExhausted).daily()),
            ("4g daily with a configured offset", c(429, "daily quota reached").daily(DailyReset { utc_offset_minutes: 120, hour: 0 }), want(true, HOUR_MS, QuotaExhausted).daily()),
            ("4g daily with a configured hour", c(400, "please try again tomorrow").daily(DailyReset { utc_offset_minutes: 0, hour: 22 }), want(true, HOUR_MS, QuotaExhausted).daily()),
            ("4g daily text not trusted on an api-key 429", c(429, "try again tomorrow"), scaled(RateLimitExceeded)),
            ("4g TPD without clock or header falls through", c(429, "TPD rate limit reached").oauth(), scaled_oauth(RateLimitExceeded)),
            ("4g TPD with a reset header", c(429, "TPD rate limit reached").oauth().headers(&[("x-ratelimit-reset", "1768079400")]), want(true, 600_000, QuotaExhausted).daily()),
            ("4g TPD with a configured clock", c(429, "tpd rate limit").oauth().daily(DailyReset::UTC_MIDNIGHT), want(true, 3 * HOUR_MS, QuotaExhausted).daily()),
            // 4h: subscription quota.
            ("4h subscription, body reset recorded", c(429, "You've reached your usage limit. Resets in 2 hours").oauth().provider("claude"), want(true, HOUR_MS, QuotaExhausted).reset(2 * HOUR_MS)),
            ("4h trusted header hint", c(402, "usage limit reached").headers(&[("retry-after", "120")]), want(true, 120_000, QuotaExhausted).used(Header)),
            ("4h untrusted header hint", c(402, "usage limit reached").oauth().headers(&[("retry-after", "120")]), want(true, HOUR_MS, QuotaExhausted)),
            ("4h claude account rate limit", c(429, "This request would exceed your account's rate limit").oauth().provider("claude"), want(true, HOUR_MS, QuotaExhausted)),
            ("4h same text elsewhere is a rate limit", c(429, "This request would exceed your account's rate limit").oauth().provider("anthropic"), scaled_oauth(RateLimitExceeded)),
            // 4i–j: weekly and session windows (ungated).
            ("4i weekly on an api-key 429", c(429, "Weekly limit reached"), want(true, DAY_MS, QuotaExhausted)),
            ("4j session", c(429, "You have reached your session usage limit"), want(true, 5 * HOUR_MS, QuotaExhausted)),
            ("4j session phrased apart", c(403, "You reached your session cap; usage limit applies").oauth(), want(true, 5 * HOUR_MS, QuotaExhausted)),
            // 4k: quota with a reset hint.
            ("4k trusted text hint", c(429, "Quota exceeded for this project, please retry in 30s"), want(true, 30_000, QuotaExhausted).lvl(0).used(Body).reset(30_000)),
            ("4k untrusted hint still recorded", c(429, "Quota exceeded for this project, please retry in 30s").oauth(), scaled_oauth(QuotaExhausted).reset(30_000)),
            ("4k monthly words between, api-key 429", c(429, "Monthly usage quota reached, resets in 2h"), want(true, 7_200_000, QuotaExhausted).lvl(0).used(Body).reset(7_200_000)),
            ("4k individual quota, untrusted hint", c(429, "Individual quota reached. Contact your administrator to enable overages. Resets in 2h").oauth(), scaled_oauth(QuotaExhausted).reset(7_200_000)),
            ("4k enable overages, api-key 429", c(429, "enable overages to continue; resets in 2h"), want(true, 7_200_000, QuotaExhausted).lvl(0).used(Body).reset(7_200_000)),
            ("4k exceed words between quota", c(429, "You exceeded the token quota, please retry in 60s").oauth(), scaled_oauth(QuotaExhausted).reset(60_000)),
            ("4k daily free allocation", c(429, "you have used up your daily free allocation of 10,000 neurons, resets in 2h").oauth(), scaled_oauth(QuotaExhausted).reset(7_200_000)),
            ("4k TPD rate limit with a text hint", c(429, "request reached organization TPD rate limit, resets in 2h").oauth(), scaled_oauth(QuotaExhausted).reset(7_200_000)),
            ("4k header hint on a long quota", c(429, "monthly quota exceeded").headers(&[("Retry-After", "3600")]), want(true, 3_600_000, QuotaExhausted).lvl(0).used(Header).reset(3_600_000)),
            // 4l–o: 403s.
            ("4l route not authorized", c(403, "User is not authorized for this route"), want(false, 0, Unknown)),
            ("4m agentrouter model access rule", c(403, "无权访问模型 claude-opus").provider("agentrouter"), rule_fixed(21_600_000, AuthError).lvl(0).scope(Model)),
            ("4m operator 403 rule", c(403, "Org policy blocks this").provider("acme").op(403, "policy", Connection, None), scaled(QuotaExhausted).scope(Connection)),
            ("4n opencode endpoint unavailable", c(429, "The endpoint is unavailable").provider("opencode-go"), rule_fixed(300_000, ModelCapacity).lvl(0).scope(Model)),
            ("4o cloudflare 1010", c(403, "error code: 1010"), want(true, 0, AuthError)),
            ("4o not retryable, owner action", c(403, r#"{"error":{"message":"Contact your administrator","retryable":false}}"#), want(true, 0, AuthError)),
            ("4o plain api-key 403", c(403, "Forbidden"), scaled(AuthError)),
            ("4o excluded marker goes to the table", c(403, "API has not been used in project 123"), rule_fixed(0, QuotaExhausted)),
            ("4o only api-key: oauth 403", c(403, "Forbidden").oauth(), rule_fixed(0, QuotaExhausted)),
            // 5: the configured rule table, text rules.
            ("5 no credentials", c(500, "No credentials for this account"), rule_fixed(120_000, AuthError)),
            ("5 request not allowed", c(403, "Request not allowed").oauth(), rule_fixed(5_000, RateLimitExceeded)),
            ("5 improperly formed request", c(400, "Improperly formed request"), rule_fixed(0, ModelCapacity)),
            ("5 rate limit", c(500, "rate limit hit"), scaled(RateLimitExceeded)),
            ("5 too many requests", c(503, "Too Many Requests"), scaled(RateLimitExceeded)),
            ("5 hour quota", c(403, "hour quota exceeded"), scaled(QuotaExhausted)),
            ("5 quota has been exceeded", c(500, "quota has been exceeded"), scaled(QuotaExhausted)),
            ("5 quota will reset", c(500, "quota will reset soon"), scaled(QuotaExhausted)),
            ("5 exhausted your capacity", c(503, "You have exhausted your capacity"), scaled(QuotaExhausted)),
            ("5 quota exhausted", c(500, "quota exhausted"), scaled(QuotaExhausted)),
            ("5 out of extra usage", c(500, "You're out of extra usage"), scaled(QuotaExhausted)),
            ("5 extra usage required", c(500, "extra usage required"), scaled(QuotaExhausted)),
            ("5 capacity", c(503, "no capacity available"), scaled(ModelCapacity)),
            ("5 overloaded on a status without a rule", c(529, "Overloaded"), scaled(ModelCapacity)),
            ("5 high demand", c(500, "high demand"), scaled(ModelCapacity)),
            // 5: status rules.
            ("5 401", c(401, ""), rule_fixed(0, AuthError)),
            ("5 402", c(402, ""), rule_fixed(0, QuotaExhausted)),
            ("5 403 without text skips step 4", c(403, ""), rule_fixed(0, QuotaExhausted)),
            ("5 404", c(404, "Not Found"), rule_fixed(120_000, Unknown)),
            ("5 406", c(406, ""), scaled(ServerError)),
            ("5 408", c(408, ""), scaled(ServerError)),
            ("5 500", c(500, ""), scaled(ServerError)),
            ("5 502", c(502, "Bad gateway"), scaled(ServerError)),
            ("5 503", c(503, ""), scaled(ServerError)),
            ("5 504", c(504, ""), scaled(ServerError)),
            ("5 429", c(429, ""), scaled(RateLimitExceeded)),
            // 5: upstream hints on the 429 rule, gated by the profile.
            ("5 429 retry-after trusted", c(429, "").headers(&[("Retry-After", "7")]), want(true, 7_000, RateLimitExceeded).lvl(0).used(Header)),
            ("5 429 retry-after untrusted (oauth)", c(429, "").oauth().headers(&[("Retry-After", "7")]), scaled_oauth(RateLimitExceeded)),
            ("5 429 retry-after http date", c(429, "").headers(&[("retry-after", "Sat, 10 Jan 2026 21:00:30 GMT")]), want(true, 30_000, RateLimitExceeded).lvl(0).used(Header)),
            ("5 429 x-ratelimit-reset seconds", c(429, "").headers(&[("X-RateLimit-Reset", "1768078845")]), want(true, 45_000, RateLimitExceeded).lvl(0).used(Header)),
            ("5 429 x-ratelimit-reset millis", c(429, "").headers(&[("x-ratelimit-reset", "1768078845000")]), want(true, 45_000, RateLimitExceeded).lvl(0).used(Header)),
            ("5 429 small reset delta is no hint", c(429, "").headers(&[("x-ratelimit-reset", "30")]), scaled(RateLimitExceeded)),
            ("5 429 google RetryInfo", c(429, GOOGLE_429), want(true, 33_000, RateLimitExceeded).lvl(0).used(GoogleRpcRetryInfo)),
            ("5 429 retry_after_ms", c(429, r#"{"error":{"message":"slow down","retry_after_ms":1500}}"#), want(true, 1_500, RateLimitExceeded).lvl(0).used(Body)),
            ("5 429 no profile, no hint", c(429, "").no_provider().headers(&[("retry-after", "7")]), want(true, 5_000, RateLimitExceeded).base(5_000).lvl(1)),
            // 5: preserveQuota429.
            ("5 api-key 429 keeps only the status rule", c(429, "Overloaded"), scaled(RateLimitExceeded)),
            ("5 oauth 429 reads text rules", c(429, "Overloaded").oauth(), scaled_oauth(ModelCapacity)),
            ("5 429 without provider reads text rules", c(429, "Overloaded").no_provider(), want(true, 5_000, ModelCapacity).base(5_000).lvl(1)),
            ("5 api-key 429 short quota text", c(429, "hour quota reached"), scaled(RateLimitExceeded)),
            ("5 api-key 429 long quota text", c(429, "hard limit: hour quota reached"), scaled(QuotaExhausted)),
            ("5 local category counts as non-api-key", Case { auth: AuthKind::Local,..c(429, "Overloaded") }, scaled(ModelCapacity)),
            // 5: provider rules inside the table.
            ("5 opencode header rule, scope honoured", c(429, "").provider("opencode-go").headers(&[("x-ratelimit-remaining-requests", "0")]), scaled(QuotaExhausted).scope(Connection)),
            ("5 openrouter 402 rule, scope not honoured", c(402, "").provider("openrouter"), rule_fixed(120_000, QuotaExhausted)),
            ("5 operator 429 rule: reason, cooldown, scope", c(429, "please slow down").provider("acme").op(429, "slow down", Provider, Some(60_000)), want(true, 60_000, QuotaExhausted).base(60_000).lvl(1).configured(60_000).scope(Provider)),
            ("5 operator 401 rule", c(401, "key revoked").provider("acme").op(401, "revoked", Connection, Some(600_000)), rule_fixed(600_000, QuotaExhausted).scope(Connection)),
            // 6: the transient statuses without a rule.
            ("6 413", c(413, ""), scaled(ModelCapacity)),
            // 7: 432.
            ("7 432", c(432, ""), want(true, HOUR_MS, QuotaExhausted)),
            ("7 432 trusted hint", c(432, "").headers(&[("retry-after", "90")]), want(true, 90_000, QuotaExhausted).used(Header)),
            ("7 432 untrusted hint", c(432, "").oauth().headers(&[("retry-after", "90")]), want(true, HOUR_MS, QuotaExhausted)),
            ("7 432 subscription text", c(432, "usage limit reached").oauth(), want(true, HOUR_MS, QuotaExhausted)),
            // 8: 400 and 422.
            ("8 operator 400 rule fires", c(400, "Insufficient funds on this key").provider("openrouter").op(400, "insufficient funds", Provider, Some(21_600_000)), rule_fixed(21_600_000, QuotaExhausted).lvl(0).scope(Provider)),
            ("8 built-in 400 rule fires", c(400, "用户额度不足").provider("agentrouter"), scaled(QuotaExhausted).scope(Connection)),
            ("8 opencode 400 model unavailable", c(400, "Upstream request failed: model is unavailable.").provider("opencode-go"), rule_fixed(3_600_000, ModelCapacity).lvl(0).scope(Model)),
            ("8 model_not_found code", c(400, r#"{"error":{"code":"model_not_found","message":"x"}}"#), want(true, 0, ModelCapacity)),
            ("8 not_found_error type", c(400, r#"{"error":{"type":"not_found_error","message":"x"}}"#), want(true, 0, ModelCapacity)),
            ("8 permission_error about a model", c(400, r#"{"error":{"type":"permission_error","message":"Your API key does not have access to model claude-x"}}"#), want(true, 0, ModelCapacity)),
            ("8 model text that is a credential error", c(400, "Invalid API key for model gpt-4: not allowed"), want(false, 0, Unknown)),
            ("8 context overflow", c(400, "This model's maximum context length is 8192 tokens"), want(true, 0, ModelCapacity)),
            ("8 malformed", c(400, "Malformed JSON in request body"), want(true, 0, ModelCapacity)),
            ("8 parameter validation", c(422, "Unsupported parameter: 'temperature'"), want(true, 0, ModelCapacity)),
            ("8 nvidia degraded function", c(400, "Function 'a1b2': DEGRADED"), want(true, 0, ModelCapacity)),
            ("8 rate-limit text", c(400, "请求过于频繁"), scaled(RateLimitExceeded)),
            ("8 plain 400", c(400, "messages: field required"), want(false, 0, Unknown)),
            ("8 plain 422", c(422, ""), want(false, 0, Unknown)),
            // 9: anything else.
            ("9 default", c(418, "I'm a teapot"), want(true, 3_000, Unknown).base(3_000)),
            ("9 default 409", c(409, "conflict"), want(true, 3_000, Unknown).base(3_000)),
            ("9 default without profile", c(418, "").no_profile(), want(true, 5_000, Unknown).base(5_000)),
        ]
    }

    #[test]
    fn every_branch_in_order() {
        let vectors = vectors();
        let mut failures = Vec::new();
        for (name, case, expected) in &vectors {
            let got = case.run();
            if &got != expected {
                failures.push(format!("{name}:\n  got  {got:?}\n  want {expected:?}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} vectors failed:\n{}",
            failures.len(),
            vectors.len(),
            failures.join("\n")
        );
    }

    /// The owner rescales an asker's decision from its own backoff level: the result is the
    /// decision the asker would have made at that level.
    #[test]
    fn a_level_scaled_decision_rescales_to_the_owners_level() {
        let headers = Pairs(&[]);
        let decide = |level| {
            let mut input = ClassifyInput::new(500, "", &headers, NOW);
            input.backoff_level = level;
            check_fallback_error(&input)
        };
        let at_zero = decide(0);
        assert!(at_zero.level_scaled);
        assert_eq!(at_zero.rescaled(None, 3), decide(3));
        // A hint is not level-scaled and is kept as is.
        let hinted = c(429, "").headers(&[("retry-after", "7")]).run();
        assert!(!hinted.level_scaled);
        assert_eq!(hinted.clone().rescaled(None, 9), hinted);
    }

    #[test]
    fn scaled_cooldown_escalates_and_caps() {
        let at = |level| c(500, "").level(level).run();
        assert_eq!(
            at(3),
            want(true, 24_000, Reason::ServerError).base(3_000).lvl(4)
        );
        assert_eq!(
            at(5),
            want(true, 96_000, Reason::ServerError).base(3_000).lvl(5)
        );
        assert_eq!(
            at(9),
            want(true, 96_000, Reason::ServerError).base(3_000).lvl(5)
        );
        let d = c(500, "").oauth().level(8).run();
        assert_eq!((d.cooldown_ms, d.new_backoff_level), (1_280_000, Some(8)));
        // No profile: 5 s × 2^L capped at 120 s, 15 steps.
        let d = c(500, "").no_profile().level(10).run();
        assert_eq!((d.cooldown_ms, d.new_backoff_level), (120_000, Some(11)));
        let d = c(500, "").no_profile().level(u32::MAX).run();
        assert_eq!((d.cooldown_ms, d.new_backoff_level), (120_000, Some(15)));
        // Base 0 scales from 1 s; cap 0 means 120 s.
        let mut case = c(500, "").level(2);
        case.profile = Some(CooldownProfile {
            base_cooldown_ms: 0,
            max_cooldown_ms: 0,
            ..APIKEY
        });
        assert_eq!(case.run().cooldown_ms, 4_000);
        case.level = 20;
        assert_eq!(case.run().cooldown_ms, 32_000);
        let mut case = c(500, "").level(32);
        case.profile = Some(CooldownProfile {
            base_cooldown_ms: 86_400_000,
            max_backoff_steps: 32,
            max_cooldown_ms: 86_400_000,
            ..APIKEY
        });
        assert_eq!(case.run().cooldown_ms, 86_400_000);
    }

    #[test]
    fn profile_from_settings() {
        let s = ResilienceSettings::default();
        assert_eq!(CooldownProfile::for_category(&s, AuthKind::ApiKey), APIKEY);
        assert_eq!(CooldownProfile::for_category(&s, AuthKind::OAuth), OAUTH);
    }

    #[test]
    fn quota_wordings() {
        for quota in [
            "monthly usage limit reached",
            "your per-month request limit",
            "daily token quota used",
            "you exceeded the monthly quota",
            "requests exceed your quota",
            "insufficient_quota",
            "individual quota reached",
            "contact your administrator to enable overages",
            "daily free allocation of 10,000 neurons",
            "insufficient balance",
            "request reached organization tpd rate limit, current: 10",
            "tpd rate limit",
            "{\"error\": \"usage limit reached.\"}",
            "hard-limit hit",
            "已达到 5 小时的使用上限",
            "您的限额将在 19:01 重置",
        ] {
            assert!(is_long_quota(quota), "{quota}");
        }
        for not_quota in [
            "rate limit exceeded, retry in 2s",
            "too many requests",
            "{\"error\":\"per-minute usage limit reached\"}",
            "stpd rate limits",
            "limit reached\nmonthly",
            "请求过于频繁，请稍后重试。",
        ] {
            assert!(!is_long_quota(not_quota), "{not_quota}");
        }
    }

    #[test]
    fn type_signals() {
        assert!(is_fingerprint_rejection("error code: 1010"));
        assert!(is_fingerprint_rejection(r#"{"error_code":1010}"#));
        assert!(!is_fingerprint_rejection("error code: 10100"));
        assert!(!is_fingerprint_rejection("model foo-1010 is not supported"));
        assert!(is_sentinel_block("sentinel check: request blocked"));
        assert!(!is_sentinel_block("blocked by sentinel"));
        assert!(is_project_route_error("it is disabled."));
        assert!(!is_project_route_error("submit is disabledx"));
        assert!(is_model_named_unsupported(
            "the model \"gpt-9\" is not supported"
        ));
        assert!(is_resource_not_found("file file-abc not found"));
        assert!(!is_resource_not_found("the model profile was not found"));
        assert_eq!(
            searchable_text(r#"{"error":{"message":"\u989d\u5ea6"}}"#, None),
            "{\"error\":{\"message\":\"\\u989d\\u5ea6\"}}\n额度"
        );
    }

    #[test]
    fn billing_suspension_needs_proximity() {
        let far = format!("suspended{}billing", " ".repeat(121));
        let near = format!("suspended{}billing", " ".repeat(120));
        assert!(!is_billing_suspension(&far));
        assert!(is_billing_suspension(&near));
        assert!(is_billing_suspension("invoice overdue, account suspended"));
        assert!(!is_billing_suspension("suspended"));
        let leaked: &'static str = Box::leak(far.into_boxed_str());
        assert_eq!(c(400, leaked).run(), want(false, 0, Reason::Unknown));
    }

    #[test]
    fn escaped_json_message_is_searched() {
        let body = r#"{"error":{"message":"\u7528\u6237\u989d\u5ea6\u4e0d\u8db3"}}"#;
        let d = c(400, body).provider("agentrouter").run();
        assert_eq!(d.reason, Reason::QuotaExhausted);
        assert_eq!(d.rule_scope, Some(RuleScope::Connection));
        let d = c(402, r#"{"error":"Payment Required"}"#).run();
        assert!(d.credits_exhausted);
    }

    #[test]
    fn structured_error_shapes() {
        let p = parse_error_body(
            r#"[{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","message":"m"}}]"#,
        );
        assert_eq!(
            p.error,
            StructuredError {
                code: Some("429".into()),
                kind: Some("RESOURCE_EXHAUSTED".into()),
                message: Some("m".into())
            }
        );
        let p = parse_error_body(r#"{"code":"c","type":"t","message":"top"}"#);
        assert_eq!(p.error.code.as_deref(), Some("c"));
        assert_eq!(p.error.kind.as_deref(), Some("t"));
        assert_eq!(p.error.message.as_deref(), Some("top"));
        assert_eq!(parse_error_body("not json"), ParsedBody::default());
        assert_eq!(parse_error_body("{broken"), ParsedBody::default());
        assert_eq!(
            parse_error_body(&format!(
                "{{\"a\":\"{}\"}}",
                "x".repeat(MAX_CLASSIFIED_TEXT_BYTES)
            )),
            ParsedBody::default()
        );
    }

    #[test]
    fn daily_reset_clock() {
        assert_eq!(WALL, 1_768_078_800_000);
        assert_eq!(DailyReset::UTC_MIDNIGHT.ms_until_next(WALL), 3 * HOUR_MS);
        assert_eq!(DailyReset::UTC_MIDNIGHT.ms_until_next(MIDNIGHT), DAY_MS);
        assert_eq!(
            DailyReset {
                utc_offset_minutes: -300,
                hour: 0
            }
            .ms_until_next(WALL),
            8 * HOUR_MS
        );
        assert_eq!(
            DailyReset {
                utc_offset_minutes: 0,
                hour: 99
            }
            .ms_until_next(WALL),
            2 * HOUR_MS
        );
        assert!(
            DailyReset {
                utc_offset_minutes: i16::MIN,
                hour: 0
            }
            .ms_until_next(0)
                <= DAY_MS
        );
    }

    fn fragment() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "rate limit",
                "quota exceeded",
                "please retry in 3.5s",
                "resets in 2 days",
                "daily quota",
                "额度不足",
                "无权访问模型",
                "account_deactivated",
                "suspended",
                "billing",
                "usage limit reached",
                "weekly limit reached",
                "session limit reached",
                "tpd rate limit",
                "endpoint is unavailable",
                "{\"error\":{\"code\":\"model_not_found\"}}",
                "\"retryable\":false",
                "retry in 99999999999999999999h",
                "reset after 1h 2m 3s",
                "error code: 1010",
                "previous_response_id does not belong",
                GOOGLE_429,
                "{\"retry_after_ms\":1e308}",
                "{\"error\":{\"details\":[{\"@type\":\"RetryInfo\",\"retryDelay\":-5}]}}",
                "[]",
                "{",
                "\u{2019}",
                "model deprecated",
                "function degraded",
                "频繁",
            ])
            .prop_map(str::to_owned),
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn never_panics_and_no_fallback_means_no_cooldown(
            status in prop_oneof![100u16..600, Just(400u16), Just(403), Just(429), Just(432), Just(503)],
            parts in prop::collection::vec(fragment(), 0..6),
            headers in prop::collection::vec(
                (prop::sample::select(vec!["retry-after", "x-ratelimit-reset", "x-omni-fallback-hint",
                    "x-ratelimit-remaining-requests", "x-model-quota-remaining"]), ".{0,30}"), 0..4),
            level in prop_oneof![0u32..40, Just(u32::MAX)],
            auth in prop::sample::select(vec![AuthKind::ApiKey, AuthKind::OAuth, AuthKind::Local]),
            profile in prop::option::of((0u64..=86_400_000, any::<bool>(), 0u32..=32, 0u64..=86_400_000)),
            provider in prop::sample::select(vec![None, Some("openai"), Some("agentrouter"), Some("opencode-go"),
                Some("gemini"), Some("claude"), Some("openai-compatible-x"), Some("minimax"), Some("")]),
            op in prop::option::of((100u16..600, ".{0,5}")),
            wall in any::<u64>(),
            daily in prop::option::of((any::<i16>(), any::<u8>())),
        ) {
            let text = parts.join(" ");
            let pairs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let headers = Pairs(&pairs);
            let ops: Vec<ProviderErrorRule> = op
                .map(|(status, pattern)| ProviderErrorRule {
                    status,
                    pattern,
                    scope: RuleScope::Connection,
                    reason: ErrorReason::QuotaExhausted,
                    cooldown_ms: None,
                })
                .into_iter()
                .collect();
            let mut input = ClassifyInput::new(status, &text, &headers, Now { mono_ns: 0, wall_ms: wall });
            input.backoff_level = level;
            input.auth = auth;
            input.profile = profile.map(|(base, hints, steps, max)| CooldownProfile {
                base_cooldown_ms: base,
                use_upstream_retry_hints: hints,
                max_backoff_steps: steps,
                max_cooldown_ms: max,
            });
            input.provider = provider;
            input.model = Some("m");
            input.operator_rules = &ops;
            input.daily_reset = daily.map(|(utc_offset_minutes, hour)| DailyReset { utc_offset_minutes, hour });
            let d = check_fallback_error(&input);
            if !d.should_fallback {
                prop_assert_eq!(d.cooldown_ms, 0);
            }
            if d.permanent {
                prop_assert!(d.should_fallback);
            }
        }
    }
}
