//! Resilience mechanisms, each a pure state machine over an injected clock (no I/O, no
//! async, no clock reads): provider breakers and the optional cooldown tracker, connection
//! state with its backoff, model lockouts, classification of upstream failures, status
//! restatement, provider error rules and the egress-bucketed lock. The owner shard of a key
//! drives these tables; `proxy` only reports outcomes and reads views.
//!
//! This file holds the vocabulary the mechanisms share.

pub mod backoff;
pub mod breaker;
pub mod classify;
pub mod connection;
pub mod egress;
pub mod emergency;
pub mod lockout;
pub mod restate;
pub mod rules;
pub mod tool_limit;
pub mod tracker;

pub use crate::config::resilience::{ErrorReason, RuleScope};

/// Why an upstream attempt failed, as classification names it (spec A §3.4, §3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    AuthError,
    QuotaExhausted,
    RateLimitExceeded,
    ModelCapacity,
    ServerError,
    Unknown,
    ServiceNotRunning,
    NotFound,
    ExecutorContractViolation,
    InvalidPreviousResponseBinding,
    ProviderModelUnsupported,
    /// The upstream could not be reached (DNS, TCP connect or TLS failure, or the connect
    /// timed out): no answer, so nothing was rate limited.
    NetworkError,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::AuthError => "auth_error",
            Reason::QuotaExhausted => "quota_exhausted",
            Reason::RateLimitExceeded => "rate_limit_exceeded",
            Reason::ModelCapacity => "model_capacity",
            Reason::ServerError => "server_error",
            Reason::Unknown => "unknown",
            Reason::ServiceNotRunning => "service_not_running",
            Reason::NotFound => "not_found",
            Reason::ExecutorContractViolation => "executor_contract_violation",
            Reason::InvalidPreviousResponseBinding => "invalid_previous_response_binding",
            Reason::ProviderModelUnsupported => "provider_model_unsupported",
            Reason::NetworkError => "network_error",
        }
    }
}

impl From<ErrorReason> for Reason {
    fn from(r: ErrorReason) -> Self {
        match r {
            ErrorReason::AuthError => Reason::AuthError,
            ErrorReason::QuotaExhausted => Reason::QuotaExhausted,
            ErrorReason::RateLimitExceeded => Reason::RateLimitExceeded,
            ErrorReason::ModelCapacity => Reason::ModelCapacity,
            ErrorReason::ServerError => Reason::ServerError,
            ErrorReason::Unknown => Reason::Unknown,
        }
    }
}

/// Where an upstream retry hint came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintSource {
    /// `Retry-After` or `X-RateLimit-Reset`.
    Header,
    /// A Google `RetryInfo` entry in the JSON body.
    GoogleRpcRetryInfo,
    /// Other JSON fields or the error text.
    Body,
}

/// The result of classifying one upstream failure (`checkFallbackError`, spec A §3.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FallbackDecision {
    pub should_fallback: bool,
    pub cooldown_ms: u64,
    pub base_cooldown_ms: Option<u64>,
    pub new_backoff_level: Option<u32>,
    pub used_upstream_retry_hint: bool,
    pub retry_hint_source: Option<HintSource>,
    pub reason: Reason,
    /// A ban signal: the connection becomes `banned`.
    pub permanent: bool,
    pub credits_exhausted: bool,
    pub daily_quota_exhausted: bool,
    pub ambiguous_auth: bool,
    pub skip_provider_breaker: bool,
    pub quota_reset_hint_ms: Option<u64>,
    pub configured_cooldown_ms: Option<u64>,
    pub rule_scope: Option<RuleScope>,
    /// `cooldown_ms` and `new_backoff_level` were scaled from the connection's backoff
    /// level (no hint, no configured cooldown): the owner rescales them from its own level.
    pub level_scaled: bool,
}

impl FallbackDecision {
    /// A decision with every optional field empty.
    pub fn new(should_fallback: bool, cooldown_ms: u64, reason: Reason) -> Self {
        Self {
            should_fallback,
            cooldown_ms,
            base_cooldown_ms: None,
            new_backoff_level: None,
            used_upstream_retry_hint: false,
            retry_hint_source: None,
            reason,
            permanent: false,
            credits_exhausted: false,
            daily_quota_exhausted: false,
            ambiguous_auth: false,
            skip_provider_breaker: false,
            quota_reset_hint_ms: None,
            configured_cooldown_ms: None,
            rule_scope: None,
            level_scaled: false,
        }
    }
}

/// Case-insensitive access to an upstream response's headers, so classification works on
/// a parsed `http1::ResponseHead` and on plain test vectors alike.
pub trait Headers {
    fn get(&self, name: &str) -> Option<&str>;
}

impl Headers for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<&str> {
        self.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

impl Headers for crate::http1::ResponseHead {
    fn get(&self, name: &str) -> Option<&str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }
}

/// A fixed array of pairs as `&dyn Headers` (a slice is unsized and cannot be).
impl<const N: usize> Headers for [(&str, &str); N] {
    fn get(&self, name: &str) -> Option<&str> {
        <[(&str, &str)] as Headers>::get(self, name)
    }
}

/// Owned response headers (as carried in a cross-shard outcome message).
#[derive(Clone, Copy, Debug)]
pub struct OwnedHeaders<'a>(pub &'a [(String, String)]);

impl Headers for OwnedHeaders<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
