//! Classify: an attempt's failure, once, on the shard that saw it — restatement, then
//! `checkFallbackError` with this shard's view of the connection's backoff level, then the
//! terminal-state type — into a [`Verdict`] the owners apply (no body, no header list).

use crate::clock::Now;
use crate::config::{Config, ConnectionId, ProviderId};
use crate::error::{ErrorKind, GatewayError};
use crate::owners::health::protocol::{LastError, Verdict};
use crate::resilience::breaker::Failure;
use crate::resilience::classify::{
    ClassifyInput, CooldownProfile, check_fallback_error, is_credits_signal,
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
    input.provider = Some(&provider.name);
    input.auth = auth;
    input.profile = Some(CooldownProfile::for_category(&config.resilience, auth));
    input.operator_rules = config.resilience.error_rules_for(&provider.name);
    check_fallback_error(&input)
}

/// The verdict of a failure, classified at `backoff_level` (this shard's view).
pub fn verdict(config: &Config, backoff_level: u32, f: &Failed<'_>, now: Now) -> Verdict {
    let decision = decide(config, backoff_level, f, now);
    let lower = f.text.to_ascii_lowercase();
    Verdict {
        status: f.status,
        error_type: error_type_of(f.status, &decision, &lower),
        credits_signal: is_credits_signal(&lower),
        breaker: f.breaker,
        last_error: LastError::new(f.text),
        decision,
    }
}

/// The verdict of an attempt that failed before any answer: timeouts and protocol errors
/// classify as the 504 / 502 a client would have seen, connect failures as network errors.
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
    Some(verdict(config, backoff_level, &f, now))
}

/// `classifyProviderError`'s type (A §3.6) for the terminal-state rules, from the status,
/// the classification and the (lower-cased) text.
pub fn error_type_of(
    status: u16,
    decision: &FallbackDecision,
    lower: &str,
) -> Option<ProviderErrorType> {
    match status {
        401 => Some(ProviderErrorType::Unauthorized),
        // A plain 403 is not a ban: bans come from ban signals (`decision.permanent`).
        403 if lower.contains("request not allowed") => Some(ProviderErrorType::RequestRejected),
        404 => Some(ProviderErrorType::ModelNotFound),
        429 if decision.reason == Reason::QuotaExhausted => Some(ProviderErrorType::QuotaExhausted),
        429 => Some(ProviderErrorType::RateLimited),
        408 | 504 => Some(ProviderErrorType::Timeout),
        500..=599 => Some(ProviderErrorType::ServerError),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_types_for_terminal_rules() {
        let d = |r| FallbackDecision::new(true, 0, r);
        assert_eq!(
            error_type_of(401, &d(Reason::AuthError), ""),
            Some(ProviderErrorType::Unauthorized)
        );
        // A plain 403 is not a ban (bans come from ban signals, `decision.permanent`).
        assert_eq!(error_type_of(403, &d(Reason::AuthError), "forbidden"), None);
        assert_eq!(
            error_type_of(403, &d(Reason::RateLimitExceeded), "request not allowed"),
            Some(ProviderErrorType::RequestRejected)
        );
        assert_eq!(
            error_type_of(429, &d(Reason::QuotaExhausted), ""),
            Some(ProviderErrorType::QuotaExhausted)
        );
        assert_eq!(
            error_type_of(429, &d(Reason::RateLimitExceeded), ""),
            Some(ProviderErrorType::RateLimited)
        );
        assert_eq!(
            error_type_of(504, &d(Reason::ServerError), ""),
            Some(ProviderErrorType::Timeout)
        );
        assert_eq!(
            error_type_of(503, &d(Reason::ServerError), ""),
            Some(ProviderErrorType::ServerError)
        );
        assert_eq!(error_type_of(400, &d(Reason::Unknown), ""), None);
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
