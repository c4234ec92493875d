//! Classify: an attempt's failure, once, on the shard that saw it — restatement, then
//! `checkFallbackError` with this shard's view of the connection's backoff level, then the
//! terminal-state type — into a [`Verdict`] the owners apply (no body, no header list).

use crate::clock::Now;
use crate::config::{AuthKind, Config, ConnectionId, DailyResetClock, ProviderId};
use crate::error::{ErrorKind, GatewayError, TimeoutPhase};
use crate::owners::health::protocol::{LastError, Verdict};
use crate::resilience::breaker::Failure;
use crate::resilience::classify::{
    ClassifyInput, CooldownProfile, DailyReset, check_fallback_error, is_ban_signal,
    is_cloud_code_provider, is_context_overflow, is_credits_signal, is_daily_quota,
    is_fingerprint_rejection, is_geo_block_provider, is_geo_blocked, is_model_named_unsupported,
    is_oauth_invalid_token, is_project_route_error, is_resource_not_found, is_sentinel_block,
    is_subscription_quota, searchable_text,
};
use crate::resilience::connection::ProviderErrorType;
use crate::resilience::{FallbackDecision, OwnedHeaders, Reason};

/// What a failure is, before classification.
pub struct Failed<'a> {
    pub provider: ProviderId,
    pub connection: ConnectionId,
    pub model: &'a str,
    /// The status after restatement.
    pub status: u16,
    pub text: &'a str,
    pub headers: &'a [(String, String)],
    pub breaker: Failure,
}

/// `checkFallbackError` for an attempt's failure, at `backoff_level`.
pub fn decide(config: &Config, backoff_level: u32, f: &Failed<'_>, now: Now) -> FallbackDecision {
    let provider = config.provider(f.provider);
    let auth = provider.auth;
    let headers = OwnedHeaders(f.headers);
    let mut input = ClassifyInput::new(f.status, f.text, &headers, now);
    input.backoff_level = backoff_level;
    input.model = Some(f.model);
    // Built-in rules and provider branches are keyed by the provider's kind, never its id.
    input.provider = Some(provider.quirks.kind.name());
    input.auth = auth;
    input.profile = Some(CooldownProfile::for_category(&config.resilience, auth));
    input.operator_rules = config.resilience.error_rules_for(&provider.name);
    input.daily_reset = provider.daily_reset.map(daily_reset);
    check_fallback_error(&input)
}

/// The verdict of a failure, classified at `backoff_level` (this shard's view).
pub fn verdict(config: &Config, backoff_level: u32, f: &Failed<'_>, now: Now) -> Verdict {
    let decision = decide(config, backoff_level, f, now);
    let provider = config.provider(f.provider);
    let lower = searchable_text(f.text, None);
    let answer = Answer {
        status: f.status,
        lower: &lower,
        // Typed by the provider's kind, never its id.
        provider: provider.quirks.kind.name(),
        auth: provider.auth,
    };
    Verdict {
        status: f.status,
        error_type: error_type_of(&answer, &decision),
        credits_signal: is_credits_signal(&lower),
        breaker: f.breaker,
        last_error: LastError::new(f.text),
        decision,
    }
}

/// The verdict of an attempt that failed before any answer: timeouts and protocol errors
/// classify as the 504 / 502 a client would have seen. A failure to reach the upstream at
/// all (DNS, connect, TLS, connect timeout) is a network error: it cools the connection
/// like a 502 but says why (`Reason::NetworkError`, type `connect_failed`), so nothing
/// downstream mistakes it for a rate limit.
pub fn verdict_of_error(
    config: &Config,
    backoff_level: u32,
    provider: ProviderId,
    connection: ConnectionId,
    model: &str,
    err: &GatewayError,
    now: Now,
) -> Option<Verdict> {
    let (status, text, breaker) = match err.kind {
        ErrorKind::UpstreamTimeout(TimeoutPhase::Connect) => {
            (504, "upstream connect timed out", Failure::Timeout)
        }
        ErrorKind::UpstreamTimeout(_) => (504, "upstream timed out", Failure::Timeout),
        ErrorKind::UpstreamConnect => (502, "upstream connect failed", Failure::ConnectFailed),
        ErrorKind::UpstreamProtocol => (502, &*err.message, Failure::Status(502)),
        _ => return None,
    };
    let f = Failed {
        provider,
        connection,
        model,
        status,
        text,
        headers: &[],
        breaker,
    };
    let mut v = verdict(config, backoff_level, &f, now);
    match err.kind {
        ErrorKind::UpstreamConnect | ErrorKind::UpstreamTimeout(TimeoutPhase::Connect) => {
            v.decision.reason = Reason::NetworkError;
            v.error_type = Some(ProviderErrorType::ConnectFailed);
        }
        ErrorKind::UpstreamTimeout(_) => v.error_type = Some(ProviderErrorType::Timeout),
        _ => {}
    }
    Some(v)
}

/// An upstream error answer as the provider-error typing reads it.
pub struct Answer<'a> {
    /// The status after restatement.
    pub status: u16,
    /// [`searchable_text`] of the body.
    pub lower: &'a str,
    pub provider: &'a str,
    pub auth: AuthKind,
}

/// `classifyProviderError`'s type (A §3.6) for the terminal-state rules: credits or
/// subscription text on a 400–403 (a 429 only outside the api-key category) is a quota;
/// a 429 is a rate limit (or a quota when classification or daily text says so); a 404
/// names a missing model unless a request-scoped resource is missing; a 401 is an invalid
/// OAuth token (OAuth providers), a model the account may not use, a deactivated account,
/// or unauthorised;
/// a 402 is a quota; a 400/403 from a Google surface with a regional refusal is
/// geo-blocked; a 403 is a fingerprint rejection (Cloudflare 1010), a deactivated
/// account, a project route error (Cloud Code configuration), a refusal ("Request not
/// allowed", the request-rejected streak), a Sentinel/Turnstile block (forbidden), nothing
/// for api-key and local providers, and **forbidden** otherwise (an OAuth 403 with text
/// nobody recognises bans the account); a 5xx is a server error (a 504 a timeout); a 400
/// is a context overflow or a missing model.
///
/// Deviations: an OAuth-invalid text is `oauth_invalid_token` only for OAuth providers
/// (an api key has no token to refresh: its 401 stays `unauthorized` and expires after the
/// retries instead of costing an upstream call on every request); `local` providers count
/// as not api-key for the 429 quota signals (as in classification) and as credential-less
/// for the 403 default; markers are matched on lower-cased text with the decoded JSON
/// message.
pub fn error_type_of(a: &Answer<'_>, decision: &FallbackDecision) -> Option<ProviderErrorType> {
    let lower = a.lower;
    let quota_text = is_credits_signal(lower) || is_subscription_quota(lower, Some(a.provider));
    let preserve_quota_429 = a.auth != AuthKind::ApiKey;
    match a.status {
        400..=403 if quota_text => Some(ProviderErrorType::QuotaExhausted),
        429 if (quota_text || is_daily_quota(lower)) && preserve_quota_429 => {
            Some(ProviderErrorType::QuotaExhausted)
        }
        429 if decision.reason == Reason::QuotaExhausted => Some(ProviderErrorType::QuotaExhausted),
        429 => Some(ProviderErrorType::RateLimited),
        404 if is_resource_not_found(lower) => None,
        404 => Some(ProviderErrorType::ModelNotFound),
        401 if a.auth == AuthKind::OAuth && is_oauth_invalid_token(lower) => {
            Some(ProviderErrorType::OauthInvalidToken)
        }
        401 if is_model_named_unsupported(lower) => Some(ProviderErrorType::ModelNotFound),
        401 if is_ban_signal(lower, &[]) => Some(ProviderErrorType::AccountDeactivated),
        401 => Some(ProviderErrorType::Unauthorized),
        402 => Some(ProviderErrorType::QuotaExhausted),
        400 | 403 if is_geo_block_provider(a.provider) && is_geo_blocked(lower) => {
            Some(ProviderErrorType::GeoBlocked)
        }
        403 => forbidden_type(a),
        408 | 504 => Some(ProviderErrorType::Timeout),
        500..=599 => Some(ProviderErrorType::ServerError),
        400 if is_context_overflow(lower) => Some(ProviderErrorType::ContextOverflow),
        400 if is_model_named_unsupported(lower) => Some(ProviderErrorType::ModelNotFound),
        _ => None,
    }
}

/// The type of a 403 (see [`error_type_of`]).
fn forbidden_type(a: &Answer<'_>) -> Option<ProviderErrorType> {
    let lower = a.lower;
    if is_fingerprint_rejection(lower) {
        Some(ProviderErrorType::FingerprintRejection)
    } else if is_ban_signal(lower, &[]) {
        Some(ProviderErrorType::AccountDeactivated)
    } else if is_project_route_error(lower) || is_cloud_code_provider(a.provider) {
        Some(ProviderErrorType::ProjectRouteError)
    } else if lower.contains("request not allowed") {
        Some(ProviderErrorType::RequestRejected)
    } else if is_sentinel_block(lower) {
        Some(ProviderErrorType::Forbidden)
    } else {
        match a.auth {
            AuthKind::ApiKey | AuthKind::Local => None,
            AuthKind::OAuth => Some(ProviderErrorType::Forbidden),
        }
    }
}

/// The status an error event sent inside a stream stands for, so it can be classified as
/// an error answer: a status the error object carries (`status`, `status_code`, a numeric
/// `code`), else its `code` or `type` read by the status table error bodies use (the
/// OpenAI and Anthropic names: `rate_limit_error` 429, `overloaded_error` 503, `api_error`
/// 500, …), else 500. The error object is the event's `error` (an OpenAI chunk, an
/// Anthropic `error` event), a Responses `response.failed`'s `response.error`, or the event
/// itself (a Responses `error` event).
pub fn status_of_error_event(data: &str) -> u16 {
    use serde_json::Value;
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return 500;
    };
    let error = v
        .get("error")
        .filter(|e| e.is_object())
        .or_else(|| v.pointer("/response/error").filter(|e| e.is_object()))
        .unwrap_or(&v);
    let numeric = |f: &str| match error.get(f) {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    };
    if let Some(status) = ["status", "status_code", "code"]
        .into_iter()
        .filter_map(numeric)
        .find(|s| (400..600).contains(s))
    {
        return u16::try_from(status).unwrap_or(500);
    }
    ["code", "type"]
        .into_iter()
        .filter_map(|f| error.get(f).and_then(Value::as_str))
        .find_map(status_of_error_name)
        .unwrap_or(500)
}

/// The status an error's type or code name stands for (`None`: a name not listed).
fn status_of_error_name(name: &str) -> Option<u16> {
    Some(match name.to_ascii_lowercase().as_str() {
        "invalid_request_error" | "bad_request" | "context_length_exceeded" => 400,
        "authentication_error" | "invalid_api_key" => 401,
        "billing_error" | "payment_required" => 402,
        "permission_error" | "permission_denied" => 403,
        "not_found_error" | "not_found" | "model_not_found" => 404,
        "request_too_large" => 413,
        "rate_limit_error" | "rate_limit_exceeded" | "rate_limited" | "insufficient_quota" => 429,
        "api_error" | "server_error" | "internal_server_error" => 500,
        "overloaded_error" | "overloaded" | "service_unavailable" => 503,
        "gateway_timeout" | "timeout" => 504,
        _ => return None,
    })
}

/// A provider's configured daily reset as classification's clock.
fn daily_reset(c: DailyResetClock) -> DailyReset {
    DailyReset {
        utc_offset_minutes: c.utc_offset_minutes,
        hour: c.hour,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn type_of(
        status: u16,
        text: &str,
        provider: &str,
        auth: AuthKind,
    ) -> Option<ProviderErrorType> {
        type_with(status, text, provider, auth, Reason::Unknown)
    }

    fn type_with(
        status: u16,
        text: &str,
        provider: &str,
        auth: AuthKind,
        reason: Reason,
    ) -> Option<ProviderErrorType> {
        let lower = searchable_text(text, None);
        let a = Answer {
            status,
            lower: &lower,
            provider,
            auth,
        };
        error_type_of(&a, &FallbackDecision::new(true, 0, reason))
    }

    #[test]
    fn error_events_stand_for_the_status_their_type_names() {
        let cases: &[(&str, u16)] = &[
            (r#"{"error":{"message":"x","type":"server_error"}}"#, 500),
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                503,
            ),
            (
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}"#,
                429,
            ),
            (
                r#"{"error":{"type":"invalid_request_error","code":"insufficient_quota"}}"#,
                429,
            ),
            (r#"{"error":{"message":"x","code":502}}"#, 502),
            (r#"{"error":{"message":"x","status":"429"}}"#, 429),
            (
                r#"{"type":"error","code":"rate_limit_exceeded","message":"x","param":null}"#,
                429,
            ),
            (
                r#"{"type":"response.failed","response":{"error":{"code":"server_error"}}}"#,
                500,
            ),
            (r#"{"error":{"message":"x","type":"something_new"}}"#, 500),
            ("not json", 500),
        ];
        for (data, want) in cases {
            assert_eq!(status_of_error_event(data), *want, "{data}");
        }
    }

    #[test]
    fn error_types_for_terminal_rules() {
        use AuthKind::{ApiKey, Local, OAuth};
        use ProviderErrorType::*;
        let cases: &[(u16, &str, &str, AuthKind, Option<ProviderErrorType>)] = &[
            (401, "bad key", "p", ApiKey, Some(Unauthorized)),
            (
                401,
                "Invalid authentication credentials",
                "p",
                OAuth,
                Some(OauthInvalidToken),
            ),
            (
                401,
                r#"{"error":{"message":"OAuth 2 token expired"}}"#,
                "p",
                OAuth,
                Some(OauthInvalidToken),
            ),
            // An api key has no token to refresh.
            (401, "Invalid credentials", "p", ApiKey, Some(Unauthorized)),
            (
                401,
                "Model foo-1 is not supported",
                "p",
                ApiKey,
                Some(ModelNotFound),
            ),
            (
                401,
                "account_deactivated",
                "p",
                OAuth,
                Some(AccountDeactivated),
            ),
            (402, "", "p", ApiKey, Some(QuotaExhausted)),
            (
                403,
                "insufficient credits",
                "p",
                ApiKey,
                Some(QuotaExhausted),
            ),
            (403, "usage limit reached", "p", OAuth, Some(QuotaExhausted)),
            // An api-key or local 403 with unknown text is not typed; an OAuth one bans.
            (403, "forbidden", "p", ApiKey, None),
            (403, "forbidden", "p", Local, None),
            (403, "forbidden", "p", OAuth, Some(Forbidden)),
            (
                403,
                "Request not allowed",
                "p",
                OAuth,
                Some(RequestRejected),
            ),
            (
                403,
                "error code: 1010",
                "p",
                OAuth,
                Some(FingerprintRejection),
            ),
            (
                403,
                r#"{"error_code":1010,"error_name":"x"}"#,
                "p",
                OAuth,
                Some(FingerprintRejection),
            ),
            (403, "model foo-1010 is gone", "p", OAuth, Some(Forbidden)),
            (
                403,
                "<script>window._cf_chl_opt={}</script>",
                "p",
                OAuth,
                Some(FingerprintRejection),
            ),
            (
                403,
                "Your account has been suspended",
                "p",
                OAuth,
                Some(AccountDeactivated),
            ),
            (
                403,
                "Cloud AI Companion API has not been used in project 123",
                "p",
                OAuth,
                Some(ProjectRouteError),
            ),
            (403, "SERVICE_DISABLED", "p", OAuth, Some(ProjectRouteError)),
            (
                403,
                "anything",
                "antigravity",
                OAuth,
                Some(ProjectRouteError),
            ),
            (403, "SENTINEL_BLOCKED", "p", ApiKey, Some(Forbidden)),
            (403, "Turnstile required", "p", Local, Some(Forbidden)),
            (
                403,
                "User location is not supported for the API use.",
                "gemini",
                OAuth,
                Some(GeoBlocked),
            ),
            (
                400,
                "User location is not supported for the API use.",
                "gemini",
                ApiKey,
                Some(GeoBlocked),
            ),
            // Only Google surfaces are geo-blocked; elsewhere the lookalike is a plain 403.
            (
                403,
                "not available in your region",
                "p",
                OAuth,
                Some(Forbidden),
            ),
            (
                404,
                "The model x does not exist",
                "p",
                ApiKey,
                Some(ModelNotFound),
            ),
            (404, "File file-abc not found", "p", ApiKey, None),
            (429, "slow down", "p", ApiKey, Some(RateLimited)),
            (
                429,
                "insufficient credits",
                "p",
                OAuth,
                Some(QuotaExhausted),
            ),
            (429, "daily quota used", "p", OAuth, Some(QuotaExhausted)),
            (429, "insufficient credits", "p", ApiKey, Some(RateLimited)),
            (504, "", "p", ApiKey, Some(Timeout)),
            (503, "", "p", ApiKey, Some(ServerError)),
            (
                400,
                "This model's maximum context length is 8192 tokens",
                "p",
                ApiKey,
                Some(ContextOverflow),
            ),
            (
                400,
                "model \"gpt-9\" is not supported",
                "p",
                ApiKey,
                Some(ModelNotFound),
            ),
            (400, "messages: field required", "p", ApiKey, None),
        ];
        for (status, text, provider, auth, want) in cases {
            assert_eq!(
                type_of(*status, text, provider, *auth),
                *want,
                "{status} {text:?} {provider} {auth:?}"
            );
        }
        // A 429 classified as a quota is a quota.
        assert_eq!(
            type_with(429, "", "p", ApiKey, Reason::QuotaExhausted),
            Some(QuotaExhausted)
        );
        // Escaped JSON is read decoded.
        assert_eq!(
            type_of(
                401,
                r#"{"error":{"message":"\u0049nvalid authentication credentials"}}"#,
                "p",
                OAuth
            ),
            Some(OauthInvalidToken)
        );
    }

    proptest::proptest! {
        #[test]
        fn typing_never_panics(
            status in 100u16..600,
            text in ".{0,200}",
            provider in proptest::sample::select(vec!["p", "gemini", "antigravity", ""]),
            auth in proptest::sample::select(vec![AuthKind::ApiKey, AuthKind::OAuth, AuthKind::Local]),
        ) {
            let _ = type_of(status, &text, provider, auth);
        }
    }

    /// The verdict carries no more than the sanitised, bounded `lastError` of the text.
    #[test]
    fn a_verdict_keeps_no_upstream_body() {
        let config = crate::config::load_str(
            "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             [[connections]]\nid = \"c\"\nprovider = \"p\"\n",
            &|_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .config;
        let body = "x".repeat(64 * 1024);
        let f = Failed {
            provider: ProviderId(0),
            connection: ConnectionId(0),
            model: "m",
            status: 503,
            text: &body,
            headers: &[("retry-after".to_owned(), "5".to_owned())],
            breaker: Failure::Status(503),
        };
        let now = crate::clock::Clock::now(&crate::clock::ManualClock::new(0));
        let v = verdict(&config, 0, &f, now);
        assert!(
            v.last_error.as_str().len() <= crate::owners::health::protocol::MAX_VERDICT_TEXT_BYTES
        );
        assert_eq!(v.status, 503);
    }
}
