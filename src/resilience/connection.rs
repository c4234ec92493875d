//! Connection state (spec A §3.1, §3.5–§3.8): whether one provider connection (an account
//! or API key) may be routed to, and if not, until when and why. This module owns the
//! per-connection record — cooldown deadline, test status, last error, backoff level,
//! request-rejected streak, expired-retry strikes — and every rule that changes it:
//! `markAccountUnavailable` ([`mark_unavailable`]), terminal states, the anti-thundering-
//! herd rule, auto-decay on selection, `clearAccountError` on success, stream stalls,
//! `disableCooling`, plus the "every connection is cooling / terminal" summaries.
//!
//! It consumes classification's verdict ([`FallbackDecision`], A §3.4) and never
//! classifies text itself; what it needs beyond that verdict (the provider error type of
//! A §3.6, whether the text carries a credits signal) comes in [`Failure`].
//!
//! **Ownership.** A [`ConnectionTable`] lives on the owner shard of each connection
//! (ARCHITECTURE §3); only it mutates the record. Every change bumps the connection's
//! epoch and yields a [`Transition`] whose [`ConnectionView`] the shard broadcasts; other
//! shards keep a [`ConnectionViews`] replica that applies views idempotently (older epochs
//! ignored, equal epochs keep the later deadline) and route from it. The rules are also
//! exposed as pure functions over a [`ConnectionState`] ([`mark_unavailable`],
//! [`record_stream_stall`], [`clear_on_success`], [`auto_decay`]) returning an owned
//! [`Change`]; the table only applies it. Per-model lockout branches do not touch the
//! lockout table: the decision carries a [`LockoutCommand`] for the lockout owner (keep
//! lockouts of a connection on its owner shard so both happen in one step), and
//! `MarkDecision::settle_lockout` puts the lock's cooldown into the answer.
//!
//! **Time.** The cooldown deadline is persisted, so it is wall-clock milliseconds
//! (`now.wall_ms`, ARCHITECTURE §5): a connection is cooling while
//! `rate_limited_until_ms > now.wall_ms` and routable from the millisecond it equals it.
//! Streak and strike windows are wall-clock too, for the same reason. A wall-clock step
//! moves these deadlines with it; that is the price of surviving a restart.
//!
//! **Auto-decay** (A §3.1) happens "on selection": a selecting shard that sees
//! [`ConnectionView::needs_decay`] sends the owner a fact and the owner calls
//! [`ConnectionTable::auto_decay`]. Connections on the happy path (level 0) never need it,
//! so routing stays core-local.
//!
//! Deliberate deviations from the spec (to be listed in `docs/compat.md`):
//! * **Expired is reached after retries** (the guide's `EXPIRED_RETRY_MAX = 3` with
//!   exponential spacing; the spec found no base constant). An `expired` verdict first
//!   cools the connection for [`EXPIRED_RETRY_BASE_MS`] × 2^n (1, 2, 4 min) as strikes
//!   1–3; the 4th consecutive verdict within [`EXPIRED_STRIKE_WINDOW_MS`] — the third
//!   backed-off retry failing — makes it terminal. Tidegate has no background token
//!   checker, so the "retry" is the next routed request after the cooldown. Strikes survive
//!   auto-decay and are cleared by a success or a reset.
//! * **A success never clears a terminal state** (`clearAccountError` would rewrite any
//!   non-active status; selection hides terminal connections, but a request in flight when
//!   the state was written could still succeed). Terminal states clear only through
//!   `ConnectionTable::reset` (credential update, re-test, reconnect).
//! * **Ban and credits verdicts apply during a cooldown.** The spec returns before looking
//!   at a failure when the connection is cooling (step 5); a failure that proves the account
//!   banned or out of credits is a fact about the account, not a timing signal, so it is
//!   written. Transient failures, expired strikes and request refusals during a cooldown
//!   are still absorbed.
//! * **A cooldown is never shortened** (ARCHITECTURE §6): besides the thundering-herd rule,
//!   applying a [`Change`] never moves an active deadline earlier.
//! * **Terminal verdicts, expired strikes and request-rejected rungs are written even with
//!   `persist = false`** (combo callers pass it for transient failures only; these are not
//!   transient).
//! * **`disable_cooling` also suppresses the model lock of a non-persisted failure**: that
//!   lock is the transient cooldown moved from the connection to the model (step 22 locks
//!   regardless); a connection that must never cool for transient failures does not cool
//!   its models for them either. Per-model-quota locks and combo lockouts still apply.
//! * **A network failure on a per-model provider cools the connection** (step 13 would
//!   lock the model): DNS, connect and TLS failures are about the host, and every model
//!   behind it is as unreachable.
//! * **A local provider's 404 locks the model and leaves the connection active** (step 20
//!   names the lockout only); the request-rejected streak and the expired strikes are
//!   persisted with the record (the spec keeps the streak in memory and seeds one refusal
//!   after a restart).
//! * **Backoff levels are clamped** to the policy's `max_backoff_steps`, whatever the
//!   decision says.
//! * Not modelled here (callers or other modules own them): request-scoped 404 bypass
//!   (step 3), the egress branch (step 11, `egress.rs`), provider-specific branches
//!   (codex per-scope child cooldowns, Alibaba, grok-web, shared-wallet 402, Vertex),
//!   cached quota reset times (step 18), token expiry checks (step 17), `isActive`
//!   auto-disable (step 23).

use std::collections::HashMap;

use super::backoff::{BackoffProfile, exponential_ms, scaled_cooldown};
use super::egress::egress_cooldown_ms;
use super::lockout::{
    FailureRecord, LockProfile, LockReason, LockRecord, LockScope, LockoutCommand,
};
use super::{FallbackDecision, HintSource, Reason, RuleScope};
use crate::clock::Now;
use crate::config::kinds::{ProviderKind, Quirks};
use crate::config::resilience::{DAY_MS, HOUR_MS, MINUTE_MS, ResilienceSettings};
use crate::config::{AuthKind, ConnectionId};

/// Consecutive `expired` verdicts retried (with a cooldown) before the state is terminal.
pub const EXPIRED_RETRY_MAX: u32 = 3;
/// Spacing of the expired retries: this × 2^(strike − 1).
pub const EXPIRED_RETRY_BASE_MS: u64 = MINUTE_MS;
/// An expired strike older than this starts a new count.
pub const EXPIRED_STRIKE_WINDOW_MS: u64 = DAY_MS;
/// A refusal older than this cannot continue a request-rejected streak (A §3.6).
pub const REQUEST_REJECTED_WINDOW_MS: u64 = DAY_MS;
/// Refusals in a streak that ban the connection.
pub const REQUEST_REJECTED_THRESHOLD: u32 = 3;
/// Cooldown after the first refusal (`COOLDOWN_MS.requestRejected`).
pub const REQUEST_REJECTED_COOLDOWN_MS: u64 = 5 * MINUTE_MS;
/// Cooldown after the second (`COOLDOWN_MS.requestRejectedRepeat`).
pub const REQUEST_REJECTED_REPEAT_COOLDOWN_MS: u64 = 15 * MINUTE_MS;
/// Connection-scoped quota rule without its own cooldown (A §3.5 step 10).
pub const CONNECTION_QUOTA_COOLDOWN_MS: u64 = 120_000;
/// A model-scoped 400 rule without its own cooldown (A §3.5 step 12).
pub const RULE_MODEL_LOCK_COOLDOWN_MS: u64 = HOUR_MS;
/// Base of a per-model 404 lockout when the profile base is 0.
pub const NOT_FOUND_LOCK_BASE_MS: u64 = 5_000;
/// `last_error` is truncated to this many bytes.
pub const MAX_LAST_ERROR_BYTES: usize = 500;

// ---------------------------------------------------------------------------------------
// Vocabulary

/// `testStatus`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TestStatus {
    #[default]
    Active,
    Unavailable,
    Banned,
    Expired,
    CreditsExhausted,
}

impl TestStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TestStatus::Active => "active",
            TestStatus::Unavailable => "unavailable",
            TestStatus::Banned => "banned",
            TestStatus::Expired => "expired",
            TestStatus::CreditsExhausted => "credits_exhausted",
        }
    }

    /// Trimmed, case-insensitive.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        [
            TestStatus::Active,
            TestStatus::Unavailable,
            TestStatus::Banned,
            TestStatus::Expired,
            TestStatus::CreditsExhausted,
        ]
        .into_iter()
        .find(|t| t.as_str().eq_ignore_ascii_case(s))
    }

    pub fn terminal(self) -> Option<Terminal> {
        match self {
            TestStatus::Banned => Some(Terminal::Banned),
            TestStatus::Expired => Some(Terminal::Expired),
            TestStatus::CreditsExhausted => Some(Terminal::CreditsExhausted),
            TestStatus::Active | TestStatus::Unavailable => None,
        }
    }

    pub fn is_terminal(self) -> bool {
        self.terminal().is_some()
    }
}

/// A state that never recovers by itself (A §3.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Terminal {
    Expired,
    Banned,
    CreditsExhausted,
}

impl Terminal {
    pub fn status(self) -> TestStatus {
        match self {
            Terminal::Expired => TestStatus::Expired,
            Terminal::Banned => TestStatus::Banned,
            Terminal::CreditsExhausted => TestStatus::CreditsExhausted,
        }
    }

    #[cfg(test)]
    pub fn as_str(self) -> &'static str {
        self.status().as_str()
    }

    /// The phrase of the "All N connection(s) <…> — please reconnect" message (A §3.1).
    pub fn describe(self) -> &'static str {
        match self {
            Terminal::Expired => "authentication expired",
            Terminal::Banned => "banned by upstream",
            Terminal::CreditsExhausted => "credits exhausted",
        }
    }
}

/// The provider error type (`classifyProviderError`, A §3.6) that drives terminal states;
/// classification produces it, connection state records it as `lastErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderErrorType {
    QuotaExhausted,
    RateLimited,
    ModelNotFound,
    OauthInvalidToken,
    AccountDeactivated,
    Unauthorized,
    FingerprintRejection,
    ProjectRouteError,
    GeoBlocked,
    Forbidden,
    ServerError,
    ContextOverflow,
    /// Anthropic OAuth 403 "Request not allowed" (the streak of A §3.6).
    RequestRejected,
    /// Tidegate: the stream content-stall watchdog ended the attempt (A §3.8).
    StreamContentStall,
    /// Tidegate: a stream that had begun was cut (reset, closed early, broken framing)
    /// before it ended.
    StreamInterrupted,
    /// Tidegate: the upstream timed out.
    Timeout,
    /// Tidegate: the upstream could not be reached.
    ConnectFailed,
}

impl ProviderErrorType {
    /// Every type, in a fixed order (labelled counters).
    pub const ALL: [ProviderErrorType; 17] = [
        ProviderErrorType::QuotaExhausted,
        ProviderErrorType::RateLimited,
        ProviderErrorType::ModelNotFound,
        ProviderErrorType::OauthInvalidToken,
        ProviderErrorType::AccountDeactivated,
        ProviderErrorType::Unauthorized,
        ProviderErrorType::FingerprintRejection,
        ProviderErrorType::ProjectRouteError,
        ProviderErrorType::GeoBlocked,
        ProviderErrorType::Forbidden,
        ProviderErrorType::ServerError,
        ProviderErrorType::ContextOverflow,
        ProviderErrorType::RequestRejected,
        ProviderErrorType::StreamContentStall,
        ProviderErrorType::StreamInterrupted,
        ProviderErrorType::Timeout,
        ProviderErrorType::ConnectFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderErrorType::QuotaExhausted => "quota_exhausted",
            ProviderErrorType::RateLimited => "rate_limited",
            ProviderErrorType::ModelNotFound => "model_not_found",
            ProviderErrorType::OauthInvalidToken => "oauth_invalid_token",
            ProviderErrorType::AccountDeactivated => "account_deactivated",
            ProviderErrorType::Unauthorized => "unauthorized",
            ProviderErrorType::FingerprintRejection => "fingerprint_rejection",
            ProviderErrorType::ProjectRouteError => "project_route_error",
            ProviderErrorType::GeoBlocked => "geo_blocked",
            ProviderErrorType::Forbidden => "forbidden",
            ProviderErrorType::ServerError => "server_error",
            ProviderErrorType::ContextOverflow => "context_overflow",
            ProviderErrorType::RequestRejected => "request_rejected",
            ProviderErrorType::StreamContentStall => "stream_content_stall",
            ProviderErrorType::StreamInterrupted => "stream_interrupted",
            ProviderErrorType::Timeout => "timeout",
            ProviderErrorType::ConnectFailed => "connect_failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// The spec's reason strings back to [`Reason`] (for imports).
pub fn parse_reason(s: &str) -> Option<Reason> {
    [
        Reason::AuthError,
        Reason::QuotaExhausted,
        Reason::RateLimitExceeded,
        Reason::ModelCapacity,
        Reason::ServerError,
        Reason::Unknown,
        Reason::ServiceNotRunning,
        Reason::NotFound,
        Reason::ExecutorContractViolation,
        Reason::InvalidPreviousResponseBinding,
        Reason::ProviderModelUnsupported,
        Reason::NetworkError,
    ]
    .into_iter()
    .find(|r| r.as_str() == s)
}

/// A cooldown: not routable before `until_ms` (wall-clock ms), and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cooldown {
    pub until_ms: u64,
    pub reason: Reason,
}

/// The request-rejected streak (A §3.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejectStreak {
    pub count: u32,
    pub last_at_ms: u64,
    /// End of the current rung's cooldown (wall ms).
    pub until_ms: u64,
}

/// Consecutive `expired` verdicts (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpiredStrikes {
    pub count: u32,
    pub last_at_ms: u64,
}

/// `lastError`, `lastErrorType`, `errorCode`, `lastErrorAt`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorFields {
    /// Sanitised: control characters replaced, at most [`MAX_LAST_ERROR_BYTES`].
    pub message: String,
    pub error_type: Option<ProviderErrorType>,
    pub code: Option<u16>,
    /// Wall ms.
    pub at_ms: u64,
}

impl ErrorFields {
    pub fn new(
        message: &str,
        error_type: Option<ProviderErrorType>,
        code: Option<u16>,
        now: Now,
    ) -> Self {
        Self {
            message: sanitize(message),
            error_type,
            code,
            at_ms: now.wall_ms,
        }
    }
}

/// Control characters become spaces; cut at a char boundary to [`MAX_LAST_ERROR_BYTES`].
pub fn sanitize(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_LAST_ERROR_BYTES));
    for c in message.trim().chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_LAST_ERROR_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

/// The record of one connection: everything that is persisted (ARCHITECTURE §3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectionState {
    /// `rateLimitedUntil` and the reason of the failure that set it.
    pub cooldown: Option<Cooldown>,
    pub test_status: TestStatus,
    pub error: Option<ErrorFields>,
    pub backoff_level: u32,
    pub reject_streak: Option<RejectStreak>,
    pub expired_strikes: Option<ExpiredStrikes>,
}

impl ConnectionState {
    /// `rateLimitedUntil` (wall ms), expired or not.
    pub fn rate_limited_until_ms(&self) -> Option<u64> {
        self.cooldown.map(|c| c.until_ms)
    }

    /// The deadline if it is still in the future.
    pub fn cooling_until(&self, now: Now) -> Option<u64> {
        self.cooldown
            .map(|c| c.until_ms)
            .filter(|&u| u > now.wall_ms)
    }

    /// `clearAccountError`'s condition: a non-active status or any error field.
    pub fn has_error(&self) -> bool {
        self.test_status != TestStatus::Active || self.cooldown.is_some() || self.error.is_some()
    }

    pub fn is_clean(&self) -> bool {
        *self == Self::default()
    }

    /// What routing needs of this state.
    pub fn view(&self, epoch: u64) -> ConnectionView {
        ConnectionView {
            epoch,
            cooldown: self.cooldown,
            terminal: self.test_status.terminal(),
            backoff_level: self.backoff_level,
        }
    }

    /// Applies a change. A new deadline never moves an active one earlier.
    pub fn apply(&mut self, c: &Change, now: Now) {
        match c.cooldown {
            Update::Keep => {}
            Update::Clear => self.cooldown = None,
            Update::Set(new) => {
                self.cooldown = match self.cooldown {
                    Some(old) if old.until_ms > now.wall_ms && old.until_ms > new.until_ms => {
                        Some(old)
                    }
                    _ => Some(new),
                }
            }
        }
        if let Some(s) = c.test_status {
            self.test_status = s;
        }
        c.error.apply_to(&mut self.error);
        if let Some(l) = c.backoff_level {
            self.backoff_level = l;
        }
        c.reject_streak.apply_to(&mut self.reject_streak);
        c.expired_strikes.apply_to(&mut self.expired_strikes);
    }
}

/// One field of a [`Change`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Update<T> {
    #[default]
    Keep,
    Set(T),
    Clear,
}

impl<T: Clone> Update<T> {
    fn apply_to(&self, slot: &mut Option<T>) {
        match self {
            Update::Keep => {}
            Update::Set(v) => *slot = Some(v.clone()),
            Update::Clear => *slot = None,
        }
    }
}

/// What a rule writes. `Default` changes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub cooldown: Update<Cooldown>,
    pub test_status: Option<TestStatus>,
    pub error: Update<ErrorFields>,
    pub backoff_level: Option<u32>,
    pub reject_streak: Update<RejectStreak>,
    pub expired_strikes: Update<ExpiredStrikes>,
}

impl Change {
    fn error_only(e: ErrorFields) -> Self {
        Self {
            error: Update::Set(e),
            ..Self::default()
        }
    }

    /// Back to a clean `active` record.
    fn clear_all() -> Self {
        Self {
            cooldown: Update::Clear,
            test_status: Some(TestStatus::Active),
            error: Update::Clear,
            backoff_level: Some(0),
            reject_streak: Update::Clear,
            expired_strikes: Update::Clear,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Inputs and policy

/// One failed attempt, as classification saw it.
#[derive(Clone, Copy, Debug)]
pub struct Failure<'a> {
    pub status: u16,
    /// The upstream error text (recorded, sanitised, as `lastError`).
    pub text: &'a str,
    pub decision: &'a FallbackDecision,
    /// `classifyProviderError`'s type (A §3.6), if any.
    pub error_type: Option<ProviderErrorType>,
    /// The text carries a credits-exhausted signal (A §3.6 list; classification matches).
    pub credits_signal: bool,
}

/// `markAccountUnavailable`'s options and the connection facts it reads.
#[derive(Clone, Copy, Debug)]
pub struct MarkOptions<'a> {
    /// Canonical provider id (alias-resolved).
    pub provider: &'a str,
    pub model: Option<&'a str>,
    /// `providerSpecificData.disableCooling` / `connections.disable_cooling`.
    pub disable_cooling: bool,
    /// `hasPerModelQuota(provider, model, passthroughModels)` (A §4.5).
    pub per_model: bool,
    /// `persistUnavailableState` (combo callers pass false for transient failures).
    pub persist: bool,
    /// A probe (model test) failure: record the error only.
    pub probe: bool,
    /// A local / self-hosted provider (`auth = "local"`).
    pub local_provider: bool,
    /// The provider's quirks (410 as not-found, codex scopes, exact model locks, quota
    /// family of lock keys).
    pub quirks: Quirks,
    /// The connection takes part in the egress-bucketed lock (an `egress` label, or its
    /// kind's default; A §7).
    pub egress_lock: bool,
    /// Milliseconds to the provider's configured daily reset, if it has one: a
    /// `quota_exhausted` model lock without a reset hint lasts until then (else until
    /// midnight UTC).
    pub daily_reset_ms: Option<u64>,
}

impl<'a> MarkOptions<'a> {
    /// The request path's defaults: persisting, not per-model, not a probe.
    pub fn new(provider: &'a str, model: Option<&'a str>) -> Self {
        Self {
            provider,
            model,
            disable_cooling: false,
            per_model: false,
            persist: true,
            probe: false,
            local_provider: false,
            quirks: ProviderKind::Generic.quirks(),
            egress_lock: false,
            daily_reset_ms: None,
        }
    }
}

/// The settings connection state reads, resolved for one provider category.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionPolicy {
    /// Scaled cooldown (stream stalls) and the level clamp.
    pub backoff: BackoffProfile,
    /// `modelLockout.maxCooldownMs`, the cap of per-model lockouts.
    pub lockout_max_cooldown_ms: u64,
    /// The provider breaker's reset timeout: the lockout escalation window.
    pub breaker_reset_timeout_ms: u64,
    /// `streamStallCooldown.enabled`.
    pub stream_stall_cooldown: bool,
    pub expired_retry_base_ms: u64,
}

impl ConnectionPolicy {
    pub fn from_settings(s: &ResilienceSettings, auth: AuthKind) -> Self {
        Self {
            backoff: BackoffProfile::from_settings(s, auth),
            lockout_max_cooldown_ms: s.model_lockout.max_cooldown_ms,
            breaker_reset_timeout_ms: s.provider_breaker.get(auth).reset_timeout_ms,
            stream_stall_cooldown: s.stream_stall_cooldown.enabled,
            expired_retry_base_ms: EXPIRED_RETRY_BASE_MS,
        }
    }

    fn lock_profile(&self) -> LockProfile {
        LockProfile {
            base_cooldown_ms: Some(self.backoff.base_cooldown_ms),
            max_backoff_steps: Some(self.backoff.max_backoff_steps),
            reset_timeout_ms: self.breaker_reset_timeout_ms,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Decisions

/// What a rule did, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkEffect {
    /// The connection is terminal; nothing written.
    AlreadyTerminal,
    /// A cooldown (or a request-rejected rung) is running: the same episode, nothing
    /// written, no level bump.
    AlreadyCooling,
    /// Not the connection's fault (`shouldFallback` false, provider-wide unsupported
    /// model); nothing written.
    Bypassed,
    /// Error fields written, no cooldown (probe, per-model lockout, `disableCooling`,
    /// non-persisted failure, stall without `streamStallCooldown`, zero cooldown).
    ErrorRecorded,
    /// Not routable until `until_ms` (wall ms).
    Cooling {
        until_ms: u64,
    },
    Terminal(Terminal),
}

/// `markAccountUnavailable`'s owned result: the `{shouldFallback, cooldownMs}` answer,
/// what to write, and what to ask of the lockout owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkDecision {
    pub should_fallback: bool,
    pub cooldown_ms: u64,
    pub effect: MarkEffect,
    pub change: Option<Change>,
    pub lockout: Option<LockoutCommand>,
    /// The answer's cooldown is the lock's: call `MarkDecision::settle_lockout` with
    /// what the lockout table returned.
    pub cooldown_from_lockout: bool,
    /// The egress-bucketed lock cooled the connection (step 11): its siblings behind the
    /// same egress cool to the same deadline.
    pub egress: bool,
}

impl MarkDecision {
    fn nothing(should_fallback: bool, cooldown_ms: u64, effect: MarkEffect) -> Self {
        Self {
            should_fallback,
            cooldown_ms,
            effect,
            change: None,
            lockout: None,
            cooldown_from_lockout: false,
            egress: false,
        }
    }

    fn write(cooldown_ms: u64, effect: MarkEffect, change: Change) -> Self {
        Self {
            should_fallback: true,
            cooldown_ms,
            effect,
            change: Some(change),
            lockout: None,
            cooldown_from_lockout: false,
            egress: false,
        }
    }

    fn with_lock(mut self, cmd: LockoutCommand, from_lockout: bool) -> Self {
        self.lockout = Some(cmd);
        self.cooldown_from_lockout = from_lockout;
        self
    }

    /// Puts the lockout table's cooldown into the answer when the answer comes from it.
    #[cfg(test)]
    pub fn settle_lockout(&mut self, lock_cooldown_ms: u64) {
        if self.cooldown_from_lockout {
            self.cooldown_ms = lock_cooldown_ms;
        }
    }
}

/// `resolveTerminalConnectionStatus` (A §3.6), first match: credits exhausted; none for
/// the recoverable types; banned; expired (not for an ambiguous-auth soft strike); none.
pub fn resolve_terminal_status(
    status: u16,
    d: &FallbackDecision,
    error_type: Option<ProviderErrorType>,
    per_model: bool,
    credits_signal: bool,
) -> Option<Terminal> {
    if d.credits_exhausted || (!per_model && (status == 402 || credits_signal)) {
        return Some(Terminal::CreditsExhausted);
    }
    if matches!(
        error_type,
        Some(
            ProviderErrorType::ProjectRouteError
                | ProviderErrorType::GeoBlocked
                | ProviderErrorType::OauthInvalidToken
                | ProviderErrorType::FingerprintRejection
                | ProviderErrorType::RequestRejected
                | ProviderErrorType::ModelNotFound
        )
    ) {
        return None;
    }
    if d.permanent || error_type == Some(ProviderErrorType::Forbidden) {
        return Some(Terminal::Banned);
    }
    let expired = matches!(
        error_type,
        Some(ProviderErrorType::AccountDeactivated | ProviderErrorType::Unauthorized)
    ) || status == 401;
    if expired && !d.ambiguous_auth {
        return Some(Terminal::Expired);
    }
    None
}

fn clamp_level(level: Option<u32>, current: u32, p: &ConnectionPolicy) -> u32 {
    level.unwrap_or(current).min(p.backoff.max_backoff_steps)
}

/// `markAccountUnavailable` (A §3.5) as a pure function of the current record. See the
/// module docs for the steps left to callers and the deliberate deviations.
pub fn mark_unavailable(
    id: ConnectionId,
    state: &ConnectionState,
    f: &Failure<'_>,
    o: &MarkOptions<'_>,
    p: &ConnectionPolicy,
    now: Now,
) -> MarkDecision {
    let d = f.decision;
    let now_ms = now.wall_ms;
    // Step 4: terminal connections are never touched by a failure.
    if state.test_status.is_terminal() {
        return MarkDecision::nothing(true, 0, MarkEffect::AlreadyTerminal);
    }
    let verdict = if d.should_fallback {
        resolve_terminal_status(f.status, d, f.error_type, o.per_model, f.credits_signal)
    } else {
        None
    };
    // Step 5: anti-thundering-herd. Hard terminal verdicts still apply (deviation).
    if let Some(until) = state.cooling_until(now)
        && !matches!(verdict, Some(Terminal::Banned | Terminal::CreditsExhausted))
    {
        return MarkDecision::nothing(true, until - now_ms, MarkEffect::AlreadyCooling);
    }
    // Step 6: provider-wide unsupported model.
    if d.reason == Reason::ProviderModelUnsupported {
        return MarkDecision::nothing(false, 0, MarkEffect::Bypassed);
    }
    let errors = ErrorFields::new(f.text, f.error_type, Some(f.status), now);
    // Step 8: probes record the error only.
    if o.probe {
        return MarkDecision::write(0, MarkEffect::ErrorRecorded, Change::error_only(errors));
    }
    // Step 10: connection-scoped quota rule.
    if d.rule_scope == Some(RuleScope::Connection)
        && d.reason == Reason::QuotaExhausted
        && !d.permanent
        && !d.credits_exhausted
        && !o.disable_cooling
    {
        let cooldown_ms = if d.cooldown_ms > 0 {
            d.cooldown_ms
        } else {
            CONNECTION_QUOTA_COOLDOWN_MS
        };
        let until_ms = now_ms.saturating_add(cooldown_ms);
        let change = Change {
            cooldown: Update::Set(Cooldown {
                until_ms,
                reason: d.reason,
            }),
            test_status: Some(TestStatus::Unavailable),
            error: Update::Set(ErrorFields {
                message: sanitize(&format!("Account quota exhausted ({})", o.provider)),
                error_type: Some(ProviderErrorType::QuotaExhausted),
                ..errors
            }),
            backoff_level: Some(clamp_level(d.new_backoff_level, state.backoff_level, p)),
            ..Change::default()
        };
        return MarkDecision::write(cooldown_ms, MarkEffect::Cooling { until_ms }, change);
    }
    // Step 11: the egress-bucketed lock (an account-wide 429), before the per-model
    // branches. The siblings are the owner's to cool.
    if let Some(cooldown_ms) = egress_cooldown_ms(o.egress_lock, o.disable_cooling, f.status, d) {
        let until_ms = now_ms.saturating_add(cooldown_ms);
        let change = Change {
            cooldown: Update::Set(Cooldown {
                until_ms,
                reason: d.reason,
            }),
            test_status: Some(TestStatus::Unavailable),
            error: Update::Set(ErrorFields {
                message: sanitize(&format!(
                    "Shared egress IP quota exhausted ({})",
                    o.provider
                )),
                ..errors
            }),
            backoff_level: Some(clamp_level(d.new_backoff_level, state.backoff_level, p)),
            ..Change::default()
        };
        let mut out = MarkDecision::write(cooldown_ms, MarkEffect::Cooling { until_ms }, change);
        out.egress = true;
        return out;
    }
    let model = o.model.map(str::trim).filter(|m| !m.is_empty());
    let record = |reason: LockReason,
                  status: u16,
                  fallback: Option<u64>,
                  exact: Option<u64>,
                  upstream: bool,
                  scope: Option<LockScope>,
                  model: &str| {
        LockoutCommand::Record(FailureRecord {
            provider: o.provider.to_string(),
            family: o.quirks.quota_family,
            connection: Some(id),
            model: model.to_string(),
            reason,
            status,
            fallback_cooldown_ms: fallback,
            profile: p.lock_profile(),
            exact_cooldown_ms: exact,
            max_cooldown_ms: p.lockout_max_cooldown_ms,
            scope,
            exact_is_upstream_reset: upstream,
        })
    };
    // Step 12: a model-scoped 400 rule locks the exact model.
    if f.status == 400
        && d.rule_scope == Some(RuleScope::Model)
        && let Some(m) = model
    {
        let exact = d
            .configured_cooldown_ms
            .filter(|&c| c > 0)
            .unwrap_or(RULE_MODEL_LOCK_COOLDOWN_MS);
        let cmd = record(
            LockReason::ModelCapacity,
            400,
            None,
            Some(exact),
            false,
            Some(LockScope::Exact),
            m,
        );
        return MarkDecision::write(exact, MarkEffect::ErrorRecorded, Change::error_only(errors))
            .with_lock(cmd, true);
    }
    // Step 13: per-model quota providers lock the model, not the connection. A network
    // failure is about the host, not the model (every model behind it is as unreachable):
    // it cools the connection (deviation).
    let not_found_status = f.status == 404 || (f.status == 410 && o.quirks.gone_is_not_found);
    if o.per_model
        && d.reason != Reason::NetworkError
        && !o.quirks.scoped_quota_cooldowns
        && (not_found_status || f.status == 429 || f.status >= 500)
        && let Some(m) = model
    {
        if f.status == 500 {
            return MarkDecision::write(0, MarkEffect::ErrorRecorded, Change::error_only(errors));
        }
        let reason = if not_found_status {
            LockReason::NotFound
        } else if f.status == 429 && d.reason == Reason::QuotaExhausted {
            LockReason::QuotaExhausted
        } else if f.status == 429 {
            LockReason::RateLimited
        } else {
            LockReason::ServerError
        };
        let fallback = if not_found_status {
            Some(p.backoff.base_cooldown_ms)
                .filter(|&b| b > 0)
                .or(Some(NOT_FOUND_LOCK_BASE_MS))
        } else {
            Some(d.base_cooldown_ms.unwrap_or(d.cooldown_ms))
        };
        let exact = if d.used_upstream_retry_hint {
            Some(d.cooldown_ms)
        } else {
            d.quota_reset_hint_ms.or_else(|| {
                (reason == LockReason::QuotaExhausted)
                    .then_some(o.daily_reset_ms)
                    .flatten()
            })
        };
        let upstream = d.used_upstream_retry_hint
            && matches!(
                d.retry_hint_source,
                Some(HintSource::Header | HintSource::GoogleRpcRetryInfo)
            );
        let scope = o.quirks.exact_model_locks.then_some(LockScope::Exact);
        let status = if not_found_status { 404 } else { f.status };
        let cmd = record(reason, status, fallback, exact, upstream, scope, m);
        let provisional = exact.unwrap_or(d.cooldown_ms);
        return MarkDecision::write(
            provisional,
            MarkEffect::ErrorRecorded,
            Change::error_only(errors),
        )
        .with_lock(cmd, true);
    }
    // Step 15.
    if !d.should_fallback {
        return MarkDecision::nothing(false, 0, MarkEffect::Bypassed);
    }
    // The request-rejected streak (A §3.6).
    if f.error_type == Some(ProviderErrorType::RequestRejected) {
        return request_rejected(state, d, errors, o, now);
    }
    let level = clamp_level(d.new_backoff_level, state.backoff_level, p);
    // Step 17: terminal verdicts, with the expired retries in front of `expired`.
    if verdict == Some(Terminal::Expired) {
        let prev = state
            .expired_strikes
            .filter(|s| now_ms.saturating_sub(s.last_at_ms) <= EXPIRED_STRIKE_WINDOW_MS);
        let strike = prev.map_or(0, |s| s.count) + 1;
        if strike <= EXPIRED_RETRY_MAX {
            let spacing = exponential_ms(p.expired_retry_base_ms, strike - 1);
            let mut change = Change {
                error: Update::Set(errors),
                expired_strikes: Update::Set(ExpiredStrikes {
                    count: strike,
                    last_at_ms: now_ms,
                }),
                ..Change::default()
            };
            if o.disable_cooling {
                return MarkDecision::write(spacing, MarkEffect::ErrorRecorded, change);
            }
            let until_ms = now_ms.saturating_add(spacing);
            change.cooldown = Update::Set(Cooldown {
                until_ms,
                reason: d.reason,
            });
            change.test_status = Some(TestStatus::Unavailable);
            return MarkDecision::write(spacing, MarkEffect::Cooling { until_ms }, change);
        }
    }
    if let Some(t) = verdict {
        let change = Change {
            cooldown: Update::Clear,
            test_status: Some(t.status()),
            error: Update::Set(errors),
            backoff_level: Some(level),
            reject_streak: Update::Clear,
            expired_strikes: Update::Clear,
        };
        return MarkDecision::write(0, MarkEffect::Terminal(t), change);
    }
    // Step 18 (no cached quota resets here).
    let cooldown_ms = d.cooldown_ms;
    // Steps 19–20: per-model 403/402 and a local provider's 404 lock the model.
    let lock_reason = match f.status {
        403 if o.per_model => Some(LockReason::Forbidden),
        402 if o.per_model => Some(LockReason::Credits),
        404 if o.local_provider => Some(LockReason::NotFound),
        _ => None,
    };
    if let (Some(reason), Some(m)) = (lock_reason, model) {
        let cmd = record(reason, f.status, Some(cooldown_ms), None, false, None, m);
        return MarkDecision::write(
            cooldown_ms,
            MarkEffect::ErrorRecorded,
            Change::error_only(errors),
        )
        .with_lock(cmd, true);
    }
    // Step 22.
    let mut change = Change {
        error: Update::Set(errors),
        backoff_level: Some(level),
        ..Change::default()
    };
    if !o.persist {
        // The non-persisted cooldown is the same transient cooldown in another unit (the
        // model on this connection), so `disable_cooling` suppresses it too.
        let mut out = MarkDecision::write(cooldown_ms, MarkEffect::ErrorRecorded, change);
        if let Some(m) = model
            && cooldown_ms > 0
            && !o.disable_cooling
        {
            out = out.with_lock(
                LockoutCommand::Lock(LockRecord {
                    provider: o.provider.to_string(),
                    family: o.quirks.quota_family,
                    connection: Some(id),
                    model: m.to_string(),
                    reason: d.reason.into(),
                    cooldown_ms,
                    scope: LockScope::QuotaFamily,
                }),
                false,
            );
        }
        return out;
    }
    if cooldown_ms > 0 && !o.disable_cooling {
        let until_ms = now_ms.saturating_add(cooldown_ms);
        change.cooldown = Update::Set(Cooldown {
            until_ms,
            reason: d.reason,
        });
        change.test_status = Some(TestStatus::Unavailable);
        return MarkDecision::write(cooldown_ms, MarkEffect::Cooling { until_ms }, change);
    }
    change.cooldown = Update::Clear;
    MarkDecision::write(cooldown_ms, MarkEffect::ErrorRecorded, change)
}

/// A refusal: 5 min, then 15 min, then banned; a refusal during a rung is the same
/// episode. The ladder replaces the decision's cooldown.
fn request_rejected(
    state: &ConnectionState,
    d: &FallbackDecision,
    errors: ErrorFields,
    o: &MarkOptions<'_>,
    now: Now,
) -> MarkDecision {
    let now_ms = now.wall_ms;
    let prev = state
        .reject_streak
        .filter(|s| now_ms.saturating_sub(s.last_at_ms) <= REQUEST_REJECTED_WINDOW_MS);
    if let Some(s) = prev
        && s.until_ms > now_ms
    {
        return MarkDecision::nothing(true, s.until_ms - now_ms, MarkEffect::AlreadyCooling);
    }
    let count = prev.map_or(0, |s| s.count) + 1;
    if count >= REQUEST_REJECTED_THRESHOLD {
        let message = format!(
            "Banned after {count} consecutive refusals (request_rejected): {}",
            errors.message
        );
        let change = Change {
            cooldown: Update::Clear,
            test_status: Some(TestStatus::Banned),
            error: Update::Set(ErrorFields {
                message: sanitize(&message),
                ..errors
            }),
            reject_streak: Update::Clear,
            expired_strikes: Update::Clear,
            ..Change::default()
        };
        return MarkDecision::write(0, MarkEffect::Terminal(Terminal::Banned), change);
    }
    let rung = if count == 1 {
        REQUEST_REJECTED_COOLDOWN_MS
    } else {
        REQUEST_REJECTED_REPEAT_COOLDOWN_MS
    };
    let until_ms = now_ms.saturating_add(rung);
    let mut change = Change {
        error: Update::Set(errors),
        reject_streak: Update::Set(RejectStreak {
            count,
            last_at_ms: now_ms,
            until_ms,
        }),
        ..Change::default()
    };
    if o.disable_cooling {
        return MarkDecision::write(rung, MarkEffect::ErrorRecorded, change);
    }
    change.cooldown = Update::Set(Cooldown {
        until_ms,
        reason: d.reason,
    });
    change.test_status = Some(TestStatus::Unavailable);
    MarkDecision::write(rung, MarkEffect::Cooling { until_ms }, change)
}

/// A stream abandoned by the content-stall watchdog (A §3.8), or one that broke after its
/// first byte (`error_type` says which): the error is recorded; a scaled cooldown follows
/// only with `streamStallCooldown.enabled` (and not with `disableCooling`). Terminal and
/// cooling connections are left alone.
pub fn record_stream_stall(
    state: &ConnectionState,
    message: &str,
    error_type: ProviderErrorType,
    disable_cooling: bool,
    p: &ConnectionPolicy,
    now: Now,
) -> MarkDecision {
    if state.test_status.is_terminal() {
        return MarkDecision::nothing(true, 0, MarkEffect::AlreadyTerminal);
    }
    if let Some(until) = state.cooling_until(now) {
        return MarkDecision::nothing(true, until - now.wall_ms, MarkEffect::AlreadyCooling);
    }
    let errors = ErrorFields::new(message, Some(error_type), None, now);
    if !p.stream_stall_cooldown || disable_cooling {
        return MarkDecision::write(0, MarkEffect::ErrorRecorded, Change::error_only(errors));
    }
    let s = scaled_cooldown(&p.backoff, state.backoff_level);
    let until_ms = now.wall_ms.saturating_add(s.cooldown_ms);
    let change = Change {
        cooldown: Update::Set(Cooldown {
            until_ms,
            reason: Reason::ServerError,
        }),
        test_status: Some(TestStatus::Unavailable),
        error: Update::Set(errors),
        backoff_level: Some(s.new_backoff_level),
        ..Change::default()
    };
    MarkDecision::write(s.cooldown_ms, MarkEffect::Cooling { until_ms }, change)
}

/// `clearAccountError` after a success (A §3.7): everything back to `active`, the streak
/// and strikes included. Never clears a terminal state (deviation); `None` when clean.
pub fn clear_on_success(state: &ConnectionState) -> Option<Change> {
    if state.test_status.is_terminal() || state.is_clean() {
        return None;
    }
    Some(Change::clear_all())
}

/// Auto-decay on selection (A §3.1): a non-terminal connection with `backoffLevel > 0`
/// whose cooldown has passed goes back to level 0, `active`, error fields cleared. The
/// streak and strikes keep their own windows.
pub fn auto_decay(state: &ConnectionState, now: Now) -> Option<Change> {
    if state.test_status.is_terminal()
        || state.backoff_level == 0
        || state.cooling_until(now).is_some()
    {
        return None;
    }
    Some(Change {
        cooldown: Update::Clear,
        test_status: Some(TestStatus::Active),
        error: Update::Clear,
        backoff_level: Some(0),
        ..Change::default()
    })
}

// ---------------------------------------------------------------------------------------
// Views

/// What routing needs of a connection; broadcast by the owner on every transition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionView {
    /// Per-connection, strictly increasing on the owner; 0 = never changed.
    pub epoch: u64,
    pub cooldown: Option<Cooldown>,
    pub terminal: Option<Terminal>,
    pub backoff_level: u32,
}

/// Whether a connection can be selected now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routability {
    Routable,
    /// Cooling until `until_ms` (wall ms).
    NotUntil {
        until_ms: u64,
        reason: Reason,
    },
    Terminal(Terminal),
}

impl ConnectionView {
    pub fn routability(&self, now: Now) -> Routability {
        if let Some(t) = self.terminal {
            return Routability::Terminal(t);
        }
        match self.cooldown {
            Some(c) if c.until_ms > now.wall_ms => Routability::NotUntil {
                until_ms: c.until_ms,
                reason: c.reason,
            },
            _ => Routability::Routable,
        }
    }

    pub fn is_routable(&self, now: Now) -> bool {
        self.routability(now) == Routability::Routable
    }

    /// The selector should tell the owner to run [`ConnectionTable::auto_decay`].
    pub fn needs_decay(&self, now: Now) -> bool {
        self.backoff_level > 0 && self.is_routable(now)
    }
}

/// Why a transition happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Failure,
    StreamStall,
    Success,
    AutoDecay,
    /// The cooldown manager (`POST /api/resilience/cooldowns`).
    OperatorClear,
    /// Credential update, re-test, reconnect.
    Reset,
    Imported,
}

/// One change on the owner, with the view to broadcast.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub connection: ConnectionId,
    pub view: ConnectionView,
    pub cause: Cause,
    /// False when only error fields changed (routing sees nothing new).
    pub view_changed: bool,
}

/// The result of a failure on the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marked {
    pub decision: MarkDecision,
    pub transition: Option<Transition>,
}

/// Answer of the cooldown manager for one connection (A §5.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClearOutcome {
    Cleared,
    Unchanged,
    SkippedTerminal,
}

/// "Every connection is unavailable" summaries (A §3.1), as data.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg(test)]
pub enum PoolSummary {
    /// No connections given.
    Empty,
    /// At least this many can be selected now.
    Routable { count: usize },
    /// None routable and at least one cooling (`allRateLimited`).
    AllCooling {
        /// Earliest future `rateLimitedUntil` (wall ms).
        retry_at_ms: u64,
        retry_after_ms: u64,
        /// "reset after 1h 2m 3s".
        retry_after_human: String,
        cooling: usize,
        terminal: usize,
    },
    /// Every connection terminal (`allExpired`); `status` is the most common one.
    AllTerminal { count: usize, status: Terminal },
}

/// Summarises the views of a pool of connections.
#[cfg(test)]
pub fn summarize<'a>(views: impl IntoIterator<Item = &'a ConnectionView>, now: Now) -> PoolSummary {
    let mut routable = 0;
    let mut cooling = 0;
    let mut earliest = u64::MAX;
    let mut terminal = [0usize; 3];
    let mut any = false;
    for v in views {
        any = true;
        match v.routability(now) {
            Routability::Routable => routable += 1,
            Routability::NotUntil { until_ms, .. } => {
                cooling += 1;
                earliest = earliest.min(until_ms);
            }
            Routability::Terminal(t) => {
                terminal[t as usize] += 1;
            }
        }
    }
    let terminal_count: usize = terminal.iter().sum();
    if !any {
        PoolSummary::Empty
    } else if routable > 0 {
        PoolSummary::Routable { count: routable }
    } else if cooling > 0 {
        let retry_after_ms = earliest - now.wall_ms;
        PoolSummary::AllCooling {
            retry_at_ms: earliest,
            retry_after_ms,
            retry_after_human: format!(
                "reset after {}",
                super::backoff::human_duration(retry_after_ms)
            ),
            cooling,
            terminal: terminal_count,
        }
    } else {
        // Ties go to the first in Expired, Banned, CreditsExhausted order.
        let mut status = Terminal::Expired;
        for t in [Terminal::Banned, Terminal::CreditsExhausted] {
            if terminal[t as usize] > terminal[status as usize] {
                status = t;
            }
        }
        PoolSummary::AllTerminal {
            count: terminal_count,
            status,
        }
    }
}

/// A shard's replica of the views of every connection, fed by [`Transition`]s.
#[derive(Debug, Default)]
pub struct ConnectionViews {
    views: Vec<ConnectionView>,
}

impl ConnectionViews {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a broadcast view: an older epoch is ignored, a newer one replaces, an equal
    /// one (a duplicate) keeps the later deadline. Returns whether anything changed.
    pub fn apply(&mut self, connection: ConnectionId, view: &ConnectionView) -> bool {
        let i = connection.0 as usize;
        if self.views.len() <= i {
            self.views.resize(i + 1, ConnectionView::default());
        }
        let cur = &mut self.views[i];
        if view.epoch < cur.epoch {
            return false;
        }
        let mut next = *view;
        if view.epoch == cur.epoch
            && let (Some(a), Some(b)) = (cur.cooldown, view.cooldown)
            && a.until_ms > b.until_ms
        {
            next.cooldown = Some(a);
        }
        let changed = next != *cur;
        *cur = next;
        changed
    }

    #[cfg(test)]
    pub fn apply_transition(&mut self, t: &Transition) -> bool {
        self.apply(t.connection, &t.view)
    }

    /// The view of a connection (the default, routable view if never heard of).
    pub fn get(&self, connection: ConnectionId) -> ConnectionView {
        self.views
            .get(connection.0 as usize)
            .copied()
            .unwrap_or_default()
    }

    pub fn routability(&self, connection: ConnectionId, now: Now) -> Routability {
        self.get(connection).routability(now)
    }

    /// [`summarize`] over a pool of connection ids.
    #[cfg(test)]
    pub fn summarize(&self, pool: impl IntoIterator<Item = ConnectionId>, now: Now) -> PoolSummary {
        let views: Vec<ConnectionView> = pool.into_iter().map(|c| self.get(c)).collect();
        summarize(&views, now)
    }
}

// ---------------------------------------------------------------------------------------
// The owner's table

#[derive(Debug, Default)]
struct Entry {
    state: ConnectionState,
    epoch: u64,
}

/// The connection records an owner shard holds. A connection never seen is clean and
/// `active` at epoch 0.
#[derive(Debug, Default)]
pub struct ConnectionTable {
    entries: HashMap<ConnectionId, Entry>,
}

impl ConnectionTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The record (a clean default when never touched).
    pub fn state(&self, id: ConnectionId) -> ConnectionState {
        self.entries
            .get(&id)
            .map(|e| e.state.clone())
            .unwrap_or_default()
    }

    /// Drops the records `keep` refuses (a reload removed their connection).
    pub fn retain(&mut self, mut keep: impl FnMut(ConnectionId) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|k, _| keep(*k));
        before - self.entries.len()
    }

    pub fn backoff_level(&self, id: ConnectionId) -> u32 {
        self.entries.get(&id).map_or(0, |e| e.state.backoff_level)
    }

    #[cfg(test)]
    pub fn view(&self, id: ConnectionId) -> ConnectionView {
        self.entries
            .get(&id)
            .map(|e| e.state.view(e.epoch))
            .unwrap_or_default()
    }

    /// Every touched connection's view (to seed a new replica).
    pub fn views(&self) -> Vec<(ConnectionId, ConnectionView)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .map(|(id, e)| (*id, e.state.view(e.epoch)))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    fn commit(&mut self, id: ConnectionId, change: &Change, cause: Cause, now: Now) -> Transition {
        let e = self.entries.entry(id).or_default();
        let before = e.state.view(0);
        e.state.apply(change, now);
        e.epoch += 1;
        let after = e.state.view(0);
        Transition {
            connection: id,
            view: e.state.view(e.epoch),
            cause,
            view_changed: before != after,
        }
    }

    fn run(&mut self, id: ConnectionId, decision: MarkDecision, cause: Cause, now: Now) -> Marked {
        let transition = decision
            .change
            .as_ref()
            .map(|c| self.commit(id, c, cause, now));
        Marked {
            decision,
            transition,
        }
    }

    /// [`mark_unavailable`] applied to the record.
    pub fn mark_unavailable(
        &mut self,
        id: ConnectionId,
        f: &Failure<'_>,
        o: &MarkOptions<'_>,
        p: &ConnectionPolicy,
        now: Now,
    ) -> Marked {
        let d = mark_unavailable(id, &self.state(id), f, o, p, now);
        self.run(id, d, Cause::Failure, now)
    }

    /// Cools a connection because a sibling of its egress family hit a quota or rate
    /// limit (A §7). Never makes it terminal, never touches a terminal connection, never
    /// shortens a running cooldown, and leaves the backoff level alone.
    pub fn cool_for_egress(
        &mut self,
        id: ConnectionId,
        until_ms: u64,
        reason: Reason,
        now: Now,
    ) -> Option<Transition> {
        let state = self.state(id);
        if state.test_status.is_terminal() {
            return None;
        }
        if state.cooling_until(now).is_some_and(|u| u >= until_ms) || until_ms <= now.wall_ms {
            return None;
        }
        let change = Change {
            cooldown: Update::Set(Cooldown { until_ms, reason }),
            test_status: Some(TestStatus::Unavailable),
            ..Change::default()
        };
        Some(self.commit(id, &change, Cause::Failure, now))
    }

    /// [`record_stream_stall`] applied to the record.
    pub fn record_stream_stall(
        &mut self,
        id: ConnectionId,
        message: &str,
        error_type: ProviderErrorType,
        disable_cooling: bool,
        p: &ConnectionPolicy,
        now: Now,
    ) -> Marked {
        let d = record_stream_stall(
            &self.state(id),
            message,
            error_type,
            disable_cooling,
            p,
            now,
        );
        self.run(id, d, Cause::StreamStall, now)
    }

    /// [`clear_on_success`] applied to the record.
    pub fn clear_on_success(&mut self, id: ConnectionId, now: Now) -> Option<Transition> {
        let change = clear_on_success(self.entries.get(&id).map(|e| &e.state)?)?;
        Some(self.commit(id, &change, Cause::Success, now))
    }

    /// [`auto_decay`] applied to the record.
    pub fn auto_decay(&mut self, id: ConnectionId, now: Now) -> Option<Transition> {
        let change = auto_decay(self.entries.get(&id).map(|e| &e.state)?, now)?;
        Some(self.commit(id, &change, Cause::AutoDecay, now))
    }

    /// The cooldown manager (A §5.2): terminal connections are skipped; one with any
    /// transient error (or a refusal streak) is cleared.
    pub fn clear_transient(
        &mut self,
        id: ConnectionId,
        now: Now,
    ) -> (ClearOutcome, Option<Transition>) {
        let Some(e) = self.entries.get(&id) else {
            return (ClearOutcome::Unchanged, None);
        };
        if e.state.test_status.is_terminal() {
            return (ClearOutcome::SkippedTerminal, None);
        }
        if !e.state.has_error() && e.state.reject_streak.is_none() {
            return (ClearOutcome::Unchanged, None);
        }
        let t = self.commit(id, &Change::clear_all(), Cause::OperatorClear, now);
        (ClearOutcome::Cleared, Some(t))
    }

    /// Back to clean and `active`, terminal states included: credentials were updated,
    /// the connection re-tested or reconnected.
    #[cfg(test)]
    pub fn reset(&mut self, id: ConnectionId, now: Now) -> Option<Transition> {
        if self.entries.get(&id).is_none_or(|e| e.state.is_clean()) {
            return None;
        }
        Some(self.commit(id, &Change::clear_all(), Cause::Reset, now))
    }

    /// Every non-clean record, by id, for the snapshot. The snapshot maps ids to the
    /// connections' configured names (ids are config indexes and may change).
    pub fn export(&self) -> Vec<(ConnectionId, ConnectionState)> {
        let mut v: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.state.is_clean())
            .map(|(id, e)| (*id, e.state.clone()))
            .collect();
        v.sort_by_key(|(id, _)| *id);
        v
    }

    /// Restores a persisted record (start-up). The message is re-sanitised and the level
    /// clamped to `max_backoff_steps`; expired deadlines are kept (they are harmless and
    /// auto-decay reads them).
    pub fn import(
        &mut self,
        id: ConnectionId,
        mut state: ConnectionState,
        max_backoff_steps: u32,
        _now: Now,
    ) -> Transition {
        if let Some(e) = &mut state.error {
            e.message = sanitize(&e.message);
        }
        state.backoff_level = state.backoff_level.min(max_backoff_steps);
        let e = self.entries.entry(id).or_default();
        e.state = state;
        e.epoch += 1;
        Transition {
            connection: id,
            view: e.state.view(e.epoch),
            cause: Cause::Imported,
            view_changed: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::config::kinds::QuotaFamily;
    use crate::resilience::lockout::{LockKey, LockoutTable};
    use proptest::prelude::*;

    const ID: ConnectionId = ConnectionId(7);
    const T0: u64 = 1_768_478_400_000;

    fn clock() -> ManualClock {
        ManualClock::new(T0)
    }

    fn policy(auth: AuthKind) -> ConnectionPolicy {
        ConnectionPolicy::from_settings(&ResilienceSettings::default(), auth)
    }

    /// What classification would say for a scaled (no hint) failure at `level`.
    fn scaled(p: &ConnectionPolicy, level: u32, _status: u16, reason: Reason) -> FallbackDecision {
        let s = scaled_cooldown(&p.backoff, level);
        let mut d = FallbackDecision::new(true, s.cooldown_ms, reason);
        d.base_cooldown_ms = Some(s.base_cooldown_ms);
        d.new_backoff_level = Some(s.new_backoff_level);
        d
    }

    fn hinted(ms: u64, source: HintSource) -> FallbackDecision {
        let mut d = FallbackDecision::new(true, ms, Reason::RateLimitExceeded);
        d.new_backoff_level = Some(0);
        d.used_upstream_retry_hint = true;
        d.retry_hint_source = Some(source);
        d
    }

    fn fail<'a>(status: u16, d: &'a FallbackDecision) -> Failure<'a> {
        Failure {
            status,
            text: "upstream said no",
            decision: d,
            error_type: None,
            credits_signal: false,
        }
    }

    fn opts() -> MarkOptions<'static> {
        MarkOptions::new("openai", Some("gpt-4o"))
    }

    fn mark(
        t: &mut ConnectionTable,
        p: &ConnectionPolicy,
        status: u16,
        d: &FallbackDecision,
        now: Now,
    ) -> Marked {
        t.mark_unavailable(ID, &fail(status, d), &opts(), p, now)
    }

    fn ladder(auth: AuthKind, n: usize) -> Vec<u64> {
        let c = clock();
        let p = policy(auth);
        let mut t = ConnectionTable::new();
        let mut got = Vec::new();
        for _ in 0..n {
            let d = scaled(&p, t.backoff_level(ID), 429, Reason::RateLimitExceeded);
            let m = mark(&mut t, &p, 429, &d, c.now());
            assert!(matches!(m.decision.effect, MarkEffect::Cooling { .. }));
            got.push(m.decision.cooldown_ms / 1_000);
            c.advance_ms(m.decision.cooldown_ms); // fail again right at expiry, no selection
        }
        got
    }

    #[test]
    fn apikey_ladder_then_stays() {
        assert_eq!(
            ladder(AuthKind::ApiKey, 8),
            vec![3, 6, 12, 24, 48, 96, 96, 96]
        );
    }

    #[test]
    fn oauth_ladder_to_1280_seconds() {
        assert_eq!(
            ladder(AuthKind::OAuth, 10),
            vec![5, 10, 20, 40, 80, 160, 320, 640, 1280, 1280]
        );
    }

    #[test]
    fn hint_wins_and_resets_the_level() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        for _ in 0..3 {
            let d = scaled(&p, t.backoff_level(ID), 429, Reason::RateLimitExceeded);
            let m = mark(&mut t, &p, 429, &d, c.now());
            c.advance_ms(m.decision.cooldown_ms);
        }
        assert_eq!(t.backoff_level(ID), 3);
        let m = mark(
            &mut t,
            &p,
            429,
            &hinted(30_000, HintSource::Header),
            c.now(),
        );
        assert_eq!(m.decision.cooldown_ms, 30_000);
        let s = t.state(ID);
        assert_eq!(s.backoff_level, 0);
        assert_eq!(s.rate_limited_until_ms(), Some(c.now().wall_ms + 30_000));
        assert_eq!(s.test_status, TestStatus::Unavailable);
        let e = s.error.unwrap();
        assert_eq!(
            (e.code, e.message.as_str()),
            (Some(429), "upstream said no")
        );
    }

    #[test]
    fn thundering_herd_one_bump_and_no_extension() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        // Two in-flight requests classified at the same level, failing at the same time.
        let d = scaled(&p, 0, 503, Reason::ServerError);
        let a = mark(&mut t, &p, 503, &d, c.now());
        let b = mark(&mut t, &p, 503, &d, c.now());
        assert_eq!(
            a.decision.effect,
            MarkEffect::Cooling {
                until_ms: T0 + 3_000
            }
        );
        assert_eq!(b.decision.effect, MarkEffect::AlreadyCooling);
        assert_eq!(b.decision.cooldown_ms, 3_000);
        assert!(b.transition.is_none());
        assert_eq!(t.backoff_level(ID), 1);
        // A later failure inside the cooldown with a long hint neither extends it …
        c.advance_ms(1_000);
        let long = mark(
            &mut t,
            &p,
            429,
            &hinted(3_600_000, HintSource::Header),
            c.now(),
        );
        assert_eq!(long.decision.effect, MarkEffect::AlreadyCooling);
        assert_eq!(long.decision.cooldown_ms, 2_000);
        assert_eq!(t.state(ID).rate_limited_until_ms(), Some(T0 + 3_000));
        assert_eq!(t.backoff_level(ID), 1);
    }

    #[test]
    fn cooldown_is_never_shortened() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        mark(
            &mut t,
            &p,
            429,
            &hinted(3_600_000, HintSource::Header),
            c.now(),
        );
        c.advance_ms(10_000);
        let short = mark(&mut t, &p, 429, &hinted(1_000, HintSource::Header), c.now());
        assert_eq!(short.decision.effect, MarkEffect::AlreadyCooling);
        assert_eq!(t.state(ID).rate_limited_until_ms(), Some(T0 + 3_600_000));
        // Even a change computed from a stale record cannot move the deadline earlier.
        let mut s = t.state(ID);
        let stale = Change {
            cooldown: Update::Set(Cooldown {
                until_ms: c.now().wall_ms + 5_000,
                reason: Reason::RateLimitExceeded,
            }),
            ..Change::default()
        };
        s.apply(&stale, c.now());
        assert_eq!(s.rate_limited_until_ms(), Some(T0 + 3_600_000));
    }

    #[test]
    fn egress_cooling_extends_but_never_shortens_and_never_touches_terminal() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        // A clean connection is cooled until the family's deadline, level untouched.
        let until = T0 + 20_000;
        let tr = t
            .cool_for_egress(ID, until, Reason::RateLimitExceeded, c.now())
            .unwrap();
        assert_eq!(
            tr.view.routability(c.now()),
            Routability::NotUntil {
                until_ms: until,
                reason: Reason::RateLimitExceeded
            }
        );
        assert_eq!(t.backoff_level(ID), 0);
        // An earlier deadline changes nothing; a later one extends.
        assert!(
            t.cool_for_egress(ID, T0 + 5_000, Reason::RateLimitExceeded, c.now())
                .is_none()
        );
        assert_eq!(t.state(ID).rate_limited_until_ms(), Some(until));
        assert!(
            t.cool_for_egress(ID, T0 + 30_000, Reason::QuotaExhausted, c.now())
                .is_some()
        );
        assert_eq!(t.state(ID).rate_limited_until_ms(), Some(T0 + 30_000));
        // A deadline already past is no cooldown.
        c.advance_ms(40_000);
        assert!(
            t.cool_for_egress(ID, T0 + 35_000, Reason::RateLimitExceeded, c.now())
                .is_none()
        );
        // A banned connection is never cooled (and stays banned).
        let mut ban = FallbackDecision::new(true, 31_536_000_000, Reason::AuthError);
        ban.permanent = true;
        mark(&mut t, &p, 403, &ban, c.now());
        assert!(
            t.cool_for_egress(ID, T0 + 3_600_000, Reason::RateLimitExceeded, c.now())
                .is_none()
        );
        assert_eq!(
            t.view(ID).routability(c.now()),
            Routability::Terminal(Terminal::Banned)
        );
    }

    #[test]
    fn terminal_states_survive_failures_and_successes_until_reset() {
        let c = clock();
        let p = policy(AuthKind::OAuth);
        let mut t = ConnectionTable::new();
        let mut ban = FallbackDecision::new(true, 31_536_000_000, Reason::AuthError);
        ban.permanent = true;
        let m = mark(&mut t, &p, 403, &ban, c.now());
        assert_eq!(m.decision.effect, MarkEffect::Terminal(Terminal::Banned));
        assert_eq!(m.decision.cooldown_ms, 0);
        assert_eq!(t.state(ID).rate_limited_until_ms(), None);
        let view = m.transition.unwrap().view;
        assert_eq!(
            view.routability(c.now()),
            Routability::Terminal(Terminal::Banned)
        );

        let d = hinted(10_000, HintSource::Header);
        let later = mark(&mut t, &p, 429, &d, c.now());
        assert_eq!(later.decision.effect, MarkEffect::AlreadyTerminal);
        assert!(later.transition.is_none());
        assert!(t.clear_on_success(ID, c.now()).is_none());
        assert!(t.auto_decay(ID, c.now()).is_none());
        assert_eq!(
            t.clear_transient(ID, c.now()),
            (ClearOutcome::SkippedTerminal, None)
        );
        assert_eq!(t.state(ID).test_status, TestStatus::Banned);

        let r = t.reset(ID, c.now()).unwrap();
        assert_eq!(r.cause, Cause::Reset);
        assert!(t.state(ID).is_clean());
        assert!(t.reset(ID, c.now()).is_none());
    }

    #[test]
    fn credits_exhausted_terminal_rules() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        let d = FallbackDecision::new(true, 0, Reason::QuotaExhausted);
        let m = mark(&mut t, &p, 402, &d, c.now());
        assert_eq!(
            m.decision.effect,
            MarkEffect::Terminal(Terminal::CreditsExhausted)
        );
        // Per-model providers: a 402 locks the model instead.
        let mut t = ConnectionTable::new();
        let mut o = opts();
        o.per_model = true;
        let m = t.mark_unavailable(ID, &fail(402, &d), &o, &p, c.now());
        assert_eq!(m.decision.effect, MarkEffect::ErrorRecorded);
        let Some(LockoutCommand::Record(r)) = m.decision.lockout else {
            panic!("expected a lockout record");
        };
        assert_eq!((r.reason, r.status), (LockReason::Credits, 402));
        // A credits signal in the text, not per-model.
        let mut t = ConnectionTable::new();
        let mut f = fail(429, &d);
        f.credits_signal = true;
        let m = t.mark_unavailable(ID, &f, &opts(), &p, c.now());
        assert_eq!(
            m.decision.effect,
            MarkEffect::Terminal(Terminal::CreditsExhausted)
        );
    }

    #[test]
    fn recoverable_types_and_forbidden() {
        let d = FallbackDecision::new(true, 0, Reason::AuthError);
        for ty in [
            ProviderErrorType::OauthInvalidToken,
            ProviderErrorType::ProjectRouteError,
            ProviderErrorType::GeoBlocked,
            ProviderErrorType::FingerprintRejection,
            ProviderErrorType::ModelNotFound,
        ] {
            assert_eq!(
                resolve_terminal_status(401, &d, Some(ty), false, false),
                None,
                "{ty:?}"
            );
        }
        assert_eq!(
            resolve_terminal_status(403, &d, Some(ProviderErrorType::Forbidden), false, false),
            Some(Terminal::Banned)
        );
        assert_eq!(
            resolve_terminal_status(
                400,
                &d,
                Some(ProviderErrorType::AccountDeactivated),
                false,
                false
            ),
            Some(Terminal::Expired)
        );
        let mut soft = d.clone();
        soft.ambiguous_auth = true;
        assert_eq!(
            resolve_terminal_status(401, &soft, None, false, false),
            None
        );
        assert_eq!(resolve_terminal_status(503, &d, None, false, false), None);
    }

    #[test]
    fn ban_during_a_cooldown_still_applies() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        mark(
            &mut t,
            &p,
            429,
            &hinted(60_000, HintSource::Header),
            c.now(),
        );
        let mut ban = FallbackDecision::new(true, 0, Reason::AuthError);
        ban.permanent = true;
        let m = mark(&mut t, &p, 403, &ban, c.now());
        assert_eq!(m.decision.effect, MarkEffect::Terminal(Terminal::Banned));
        assert_eq!(t.state(ID).rate_limited_until_ms(), None);
        // But an expired verdict during a cooldown is the same episode.
        let mut t = ConnectionTable::new();
        mark(
            &mut t,
            &p,
            429,
            &hinted(60_000, HintSource::Header),
            c.now(),
        );
        let d = FallbackDecision::new(true, 0, Reason::AuthError);
        let m = mark(&mut t, &p, 401, &d, c.now());
        assert_eq!(m.decision.effect, MarkEffect::AlreadyCooling);
    }

    #[test]
    fn three_refusals_ban() {
        let c = clock();
        let p = policy(AuthKind::OAuth);
        let mut t = ConnectionTable::new();
        let d = FallbackDecision::new(true, 5_000, Reason::RateLimitExceeded);
        let refuse = |t: &mut ConnectionTable, now| {
            let mut f = fail(403, &d);
            f.error_type = Some(ProviderErrorType::RequestRejected);
            t.mark_unavailable(ID, &f, &opts(), &p, now)
        };
        let a = refuse(&mut t, c.now());
        assert_eq!(a.decision.cooldown_ms, REQUEST_REJECTED_COOLDOWN_MS);
        assert_eq!(t.state(ID).reject_streak.unwrap().count, 1);
        // A refusal during the rung is not counted.
        c.advance_ms(60_000);
        let same = refuse(&mut t, c.now());
        assert_eq!(same.decision.effect, MarkEffect::AlreadyCooling);
        assert_eq!(same.decision.cooldown_ms, 4 * 60_000);
        assert_eq!(t.state(ID).reject_streak.unwrap().count, 1);
        // Auto-decay after the rung keeps the streak.
        c.advance_ms(4 * 60_000);
        assert!(
            t.auto_decay(ID, c.now()).is_none(),
            "level 0: nothing to decay"
        );
        let b = refuse(&mut t, c.now());
        assert_eq!(b.decision.cooldown_ms, REQUEST_REJECTED_REPEAT_COOLDOWN_MS);
        c.advance_ms(REQUEST_REJECTED_REPEAT_COOLDOWN_MS);
        let third = refuse(&mut t, c.now());
        assert_eq!(
            third.decision.effect,
            MarkEffect::Terminal(Terminal::Banned)
        );
        let s = t.state(ID);
        assert_eq!(s.test_status, TestStatus::Banned);
        assert!(s.reject_streak.is_none());
        assert!(s.error.unwrap().message.contains("3 consecutive refusals"));
    }

    #[test]
    fn refusal_streak_window_and_success() {
        let c = clock();
        let p = policy(AuthKind::OAuth);
        let d = FallbackDecision::new(true, 5_000, Reason::RateLimitExceeded);
        let mut o = opts();
        o.disable_cooling = true;
        let refuse = |t: &mut ConnectionTable, o: &MarkOptions<'_>, now| {
            let mut f = fail(403, &d);
            f.error_type = Some(ProviderErrorType::RequestRejected);
            t.mark_unavailable(ID, &f, o, &p, now)
        };
        let mut t = ConnectionTable::new();
        refuse(&mut t, &o, c.now());
        assert_eq!(t.state(ID).rate_limited_until_ms(), None, "disable_cooling");
        // The streak's own rung still absorbs a refusal.
        assert_eq!(
            refuse(&mut t, &o, c.now()).decision.effect,
            MarkEffect::AlreadyCooling
        );
        c.advance_ms(REQUEST_REJECTED_WINDOW_MS + 1);
        refuse(&mut t, &o, c.now());
        assert_eq!(
            t.state(ID).reject_streak.unwrap().count,
            1,
            "window restarted"
        );
        c.advance_ms(REQUEST_REJECTED_COOLDOWN_MS);
        refuse(&mut t, &o, c.now());
        assert_eq!(t.state(ID).reject_streak.unwrap().count, 2);
        t.clear_on_success(ID, c.now()).unwrap();
        assert!(t.state(ID).reject_streak.is_none());
    }

    #[test]
    fn expired_after_three_backed_off_retries() {
        let c = clock();
        let p = policy(AuthKind::OAuth);
        let mut t = ConnectionTable::new();
        let d = FallbackDecision::new(true, 0, Reason::AuthError);
        let mut spacing = Vec::new();
        for _ in 0..EXPIRED_RETRY_MAX {
            let m = mark(&mut t, &p, 401, &d, c.now());
            assert!(matches!(m.decision.effect, MarkEffect::Cooling { .. }));
            spacing.push(m.decision.cooldown_ms / 60_000);
            c.advance_ms(m.decision.cooldown_ms);
        }
        assert_eq!(spacing, vec![1, 2, 4]);
        let m = mark(&mut t, &p, 401, &d, c.now());
        assert_eq!(m.decision.effect, MarkEffect::Terminal(Terminal::Expired));
        assert!(t.state(ID).expired_strikes.is_none());

        // A success between verdicts starts the count again.
        let mut t = ConnectionTable::new();
        let m = mark(&mut t, &p, 401, &d, c.now());
        c.advance_ms(m.decision.cooldown_ms);
        mark(&mut t, &p, 401, &d, c.now());
        t.clear_on_success(ID, c.now()).unwrap();
        let m = mark(&mut t, &p, 401, &d, c.now());
        assert_eq!(m.decision.cooldown_ms, 60_000);
    }

    #[test]
    fn stream_stall_with_and_without_the_setting() {
        const STALL: ProviderErrorType = ProviderErrorType::StreamContentStall;
        let c = clock();
        let mut p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        let m = t.record_stream_stall(ID, "no output within 80000ms", STALL, false, &p, c.now());
        assert_eq!(m.decision.effect, MarkEffect::ErrorRecorded);
        let s = t.state(ID);
        assert_eq!(s.rate_limited_until_ms(), None);
        assert_eq!(
            s.error.unwrap().error_type,
            Some(ProviderErrorType::StreamContentStall)
        );
        assert!(!m.transition.unwrap().view_changed);

        p.stream_stall_cooldown = true;
        let m = t.record_stream_stall(ID, "stall", STALL, false, &p, c.now());
        assert_eq!(
            m.decision.effect,
            MarkEffect::Cooling {
                until_ms: T0 + 3_000
            }
        );
        assert_eq!(t.backoff_level(ID), 1);
        assert!(m.transition.unwrap().view_changed);
        // With disable_cooling, even the setting does not cool.
        let mut t = ConnectionTable::new();
        let m = t.record_stream_stall(ID, "stall", STALL, true, &p, c.now());
        assert_eq!(m.decision.effect, MarkEffect::ErrorRecorded);
    }

    #[test]
    fn disable_cooling_suppresses_only_transient_cooldowns() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        let mut o = opts();
        o.disable_cooling = true;
        let d = scaled(&p, 0, 429, Reason::RateLimitExceeded);
        let m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        assert_eq!(m.decision.effect, MarkEffect::ErrorRecorded);
        assert_eq!(m.decision.cooldown_ms, 3_000);
        let s = t.state(ID);
        assert_eq!((s.rate_limited_until_ms(), s.backoff_level), (None, 1));
        assert_eq!(s.test_status, TestStatus::Active);
        // Terminal still applies.
        let d = FallbackDecision::new(true, 0, Reason::QuotaExhausted);
        let m = t.mark_unavailable(ID, &fail(402, &d), &o, &p, c.now());
        assert_eq!(
            m.decision.effect,
            MarkEffect::Terminal(Terminal::CreditsExhausted)
        );
        // Lockout branches still run.
        let mut t = ConnectionTable::new();
        o.per_model = true;
        let d = scaled(&p, 0, 429, Reason::RateLimitExceeded);
        let m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        assert!(m.decision.lockout.is_some());
    }

    #[test]
    fn auto_decay_on_selection() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        let d = scaled(&p, 0, 503, Reason::ServerError);
        let m = mark(&mut t, &p, 503, &d, c.now());
        let view = m.transition.unwrap().view;
        assert!(!view.needs_decay(c.now()));
        assert!(t.auto_decay(ID, c.now()).is_none(), "still cooling");
        c.advance_ms(3_000);
        assert!(t.view(ID).needs_decay(c.now()));
        let tr = t.auto_decay(ID, c.now()).unwrap();
        assert_eq!(tr.cause, Cause::AutoDecay);
        let s = t.state(ID);
        assert_eq!((s.backoff_level, s.test_status), (0, TestStatus::Active));
        assert!(s.error.is_none() && s.cooldown.is_none());
        assert!(t.auto_decay(ID, c.now()).is_none());
        // After decay the next failure starts at the base again.
        let d = scaled(&p, t.backoff_level(ID), 503, Reason::ServerError);
        assert_eq!(
            mark(&mut t, &p, 503, &d, c.now()).decision.cooldown_ms,
            3_000
        );
    }

    #[test]
    fn success_clears_non_terminal_errors() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        assert!(t.clear_on_success(ID, c.now()).is_none(), "never touched");
        let d = scaled(&p, 0, 503, Reason::ServerError);
        mark(&mut t, &p, 503, &d, c.now());
        let tr = t.clear_on_success(ID, c.now()).unwrap();
        assert_eq!(tr.view.routability(c.now()), Routability::Routable);
        assert!(t.state(ID).is_clean());
        assert!(t.clear_on_success(ID, c.now()).is_none());
    }

    #[test]
    fn per_model_branches_lock_the_model_and_keep_the_connection() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut lt = LockoutTable::new();
        let mut o = MarkOptions::new("gemini", Some("gemini-2.5-pro"));
        o.per_model = true;

        let mut t = ConnectionTable::new();
        let d = hinted(33_000, HintSource::GoogleRpcRetryInfo);
        let mut m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        assert_eq!(m.decision.effect, MarkEffect::ErrorRecorded);
        assert_eq!(t.state(ID).test_status, TestStatus::Active);
        assert_eq!(t.state(ID).rate_limited_until_ms(), None);
        let cmd = m.decision.lockout.clone().unwrap();
        let LockoutCommand::Record(r) = &cmd else {
            panic!("record expected");
        };
        assert_eq!(r.reason, LockReason::RateLimited);
        assert_eq!(r.exact_cooldown_ms, Some(33_000));
        assert!(r.exact_is_upstream_reset);
        let rec = lt.apply(&cmd, c.now()).unwrap();
        m.decision.settle_lockout(rec.cooldown_ms);
        assert_eq!(m.decision.cooldown_ms, 33_000);
        assert!(lt.is_locked(
            "gemini",
            QuotaFamily::Model,
            Some(ID),
            "gemini-2.5-pro",
            c.now()
        ));

        // 500 exactly: error fields only, no lockout.
        let d = scaled(&p, 0, 500, Reason::ServerError);
        let m = t.mark_unavailable(ID, &fail(500, &d), &o, &p, c.now());
        assert_eq!((m.decision.cooldown_ms, m.decision.lockout), (0, None));
        // 429 classified as quota without a reset hint → midnight (capped).
        let mut q = FallbackDecision::new(true, 3_600_000, Reason::QuotaExhausted);
        q.base_cooldown_ms = Some(3_600_000);
        let m = t.mark_unavailable(ID, &fail(429, &q), &o, &p, c.now());
        let Some(LockoutCommand::Record(r)) = &m.decision.lockout else {
            panic!("record expected");
        };
        assert_eq!(
            (r.reason, r.exact_cooldown_ms),
            (LockReason::QuotaExhausted, None)
        );
        let mut lt2 = LockoutTable::new();
        let rec = lt2.record_failure(r, c.now()).unwrap();
        assert_eq!(rec.cooldown_ms, 1_800_000);
        // 404 → not_found on the raw model, base from the profile.
        let nf = FallbackDecision::new(true, 120_000, Reason::Unknown);
        let m = t.mark_unavailable(ID, &fail(404, &nf), &o, &p, c.now());
        let Some(LockoutCommand::Record(r)) = &m.decision.lockout else {
            panic!("record expected");
        };
        assert_eq!(
            (r.reason, r.fallback_cooldown_ms),
            (LockReason::NotFound, Some(3_000))
        );
        // 403 per-model → forbidden lock, quota family.
        let fb = FallbackDecision::new(true, 0, Reason::QuotaExhausted);
        let m = t.mark_unavailable(ID, &fail(403, &fb), &o, &p, c.now());
        let Some(LockoutCommand::Record(r)) = &m.decision.lockout else {
            panic!("record expected");
        };
        assert_eq!(r.reason, LockReason::Forbidden);
        assert_eq!(t.state(ID).test_status, TestStatus::Active);
        // Codex is excluded from the per-model 429 branch.
        let mut t = ConnectionTable::new();
        let co = MarkOptions {
            provider: "my-codex",
            model: Some("gpt-5"),
            quirks: ProviderKind::Codex.quirks(),
            ..o
        };
        let d = scaled(&p, 0, 429, Reason::RateLimitExceeded);
        let m = t.mark_unavailable(ID, &fail(429, &d), &co, &p, c.now());
        assert!(matches!(m.decision.effect, MarkEffect::Cooling { .. }));
    }

    #[test]
    fn egress_branch_cools_an_account_wide_429_only() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut o = MarkOptions::new("opencode-go", Some("m"));
        o.egress_lock = true;
        o.per_model = true;
        let d = scaled(&p, 0, 429, Reason::RateLimitExceeded);
        // Before the per-model branch: the connection cools and the owner cools siblings.
        let mut t = ConnectionTable::new();
        let m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        assert!(m.decision.egress);
        assert!(m.decision.lockout.is_none());
        assert!(matches!(m.decision.effect, MarkEffect::Cooling { .. }));
        assert_eq!(
            t.state(ID).error.unwrap().message,
            "Shared egress IP quota exhausted (opencode-go)"
        );
        // A second 429 while it cools is the same episode: no sibling is extended.
        let m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        assert_eq!(m.decision.effect, MarkEffect::AlreadyCooling);
        assert!(!m.decision.egress);
        // A connection-scoped quota rule cools this account alone.
        let mut q = FallbackDecision::new(true, 0, Reason::QuotaExhausted);
        q.rule_scope = Some(RuleScope::Connection);
        let mut t = ConnectionTable::new();
        let m = t.mark_unavailable(ID, &fail(429, &q), &o, &p, c.now());
        assert!(!m.decision.egress);
        assert!(matches!(m.decision.effect, MarkEffect::Cooling { .. }));
        // Not taking part: the per-model branch locks the model instead.
        o.egress_lock = false;
        let mut t = ConnectionTable::new();
        let m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        assert!(!m.decision.egress);
        assert!(m.decision.lockout.is_some());
    }

    #[test]
    fn a_quota_model_lock_lasts_until_the_configured_daily_reset() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut o = MarkOptions::new("gemini", Some("gemini-2.5-pro"));
        o.per_model = true;
        o.daily_reset_ms = Some(5 * HOUR_MS);
        let d = scaled(&p, 0, 429, Reason::QuotaExhausted);
        let mut t = ConnectionTable::new();
        let m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        let Some(LockoutCommand::Record(r)) = &m.decision.lockout else {
            panic!("record expected");
        };
        assert_eq!(r.exact_cooldown_ms, Some(5 * HOUR_MS));
        // A reset hint from upstream still wins.
        let mut h = d.clone();
        h.quota_reset_hint_ms = Some(HOUR_MS);
        let mut t = ConnectionTable::new();
        let m = t.mark_unavailable(ID, &fail(429, &h), &o, &p, c.now());
        let Some(LockoutCommand::Record(r)) = &m.decision.lockout else {
            panic!("record expected");
        };
        assert_eq!(r.exact_cooldown_ms, Some(HOUR_MS));
    }

    #[test]
    fn rule_scopes_and_persist_false() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        // 400 with a model-scoped rule: exact lock, 1 h by default, capped by max.
        let mut d = FallbackDecision::new(true, 0, Reason::ModelCapacity);
        d.rule_scope = Some(RuleScope::Model);
        let m = mark(&mut t, &p, 400, &d, c.now());
        let cmd = m.decision.lockout.clone().unwrap();
        let mut lt = LockoutTable::new();
        let rec = lt.apply(&cmd, c.now()).unwrap();
        assert_eq!(rec.key, LockKey::exact("openai", Some(ID), "gpt-4o"));
        assert_eq!(rec.cooldown_ms, 1_800_000);
        // A connection-scoped quota rule cools the connection (120 s without a cooldown).
        let mut d = FallbackDecision::new(true, 0, Reason::QuotaExhausted);
        d.rule_scope = Some(RuleScope::Connection);
        let m = mark(&mut t, &p, 403, &d, c.now());
        assert_eq!(
            m.decision.effect,
            MarkEffect::Cooling {
                until_ms: T0 + 120_000
            }
        );
        assert_eq!(
            t.state(ID).error.unwrap().message,
            "Account quota exhausted (openai)"
        );
        // persist = false: base update and an in-memory lock, no cooldown.
        let mut t = ConnectionTable::new();
        let mut o = opts();
        o.persist = false;
        let d = scaled(&p, 0, 503, Reason::ServerError);
        let m = t.mark_unavailable(ID, &fail(503, &d), &o, &p, c.now());
        assert_eq!(m.decision.effect, MarkEffect::ErrorRecorded);
        assert_eq!(t.state(ID).backoff_level, 1);
        assert_eq!(
            m.decision.lockout,
            Some(LockoutCommand::Lock(LockRecord {
                family: QuotaFamily::Model,
                provider: "openai".into(),
                connection: Some(ID),
                model: "gpt-4o".into(),
                reason: LockReason::ServerError,
                cooldown_ms: 3_000,
                scope: LockScope::QuotaFamily,
            }))
        );
        assert!(!m.decision.cooldown_from_lockout);
    }

    #[test]
    fn bypasses_and_probes_write_nothing_or_little() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        let d = FallbackDecision::new(false, 0, Reason::ProviderModelUnsupported);
        let m = mark(&mut t, &p, 400, &d, c.now());
        assert_eq!(
            (m.decision.should_fallback, m.decision.effect),
            (false, MarkEffect::Bypassed)
        );
        assert!(m.transition.is_none());
        let d = FallbackDecision::new(false, 0, Reason::Unknown);
        assert_eq!(
            mark(&mut t, &p, 400, &d, c.now()).decision.effect,
            MarkEffect::Bypassed
        );
        let mut o = opts();
        o.probe = true;
        let d = scaled(&p, 0, 429, Reason::RateLimitExceeded);
        let m = t.mark_unavailable(ID, &fail(429, &d), &o, &p, c.now());
        assert_eq!(
            (m.decision.cooldown_ms, m.decision.effect),
            (0, MarkEffect::ErrorRecorded)
        );
        assert_eq!(t.state(ID).backoff_level, 0);
        assert!(t.state(ID).error.is_some());
        // Zero cooldown: error recorded, nothing to wait for.
        let d = FallbackDecision::new(true, 0, Reason::ModelCapacity);
        let m = mark(&mut t, &p, 400, &d, c.now());
        assert_eq!(m.decision.effect, MarkEffect::ErrorRecorded);
        assert!(t.view(ID).is_routable(c.now()));
    }

    #[test]
    fn replicas_apply_views_idempotently_and_summarize() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        let mut v = ConnectionViews::new();
        let d = hinted(3_723_000, HintSource::Header);
        let a = t.mark_unavailable(ConnectionId(1), &fail(429, &d), &opts(), &p, c.now());
        let d2 = hinted(7_200_000, HintSource::Header);
        let b = t.mark_unavailable(ConnectionId(2), &fail(429, &d2), &opts(), &p, c.now());
        let ta = a.transition.unwrap();
        assert!(v.apply_transition(&ta));
        assert!(!v.apply_transition(&ta), "duplicate");
        v.apply_transition(&b.transition.unwrap());
        let pool = [ConnectionId(1), ConnectionId(2)];
        assert_eq!(
            v.summarize(pool, c.now()),
            PoolSummary::AllCooling {
                retry_at_ms: T0 + 3_723_000,
                retry_after_ms: 3_723_000,
                retry_after_human: "reset after 1h 2m 3s".into(),
                cooling: 2,
                terminal: 0,
            }
        );
        // A newer epoch (success) replaces; the older one arriving late is ignored.
        let cleared = t.clear_on_success(ConnectionId(1), c.now()).unwrap();
        assert!(cleared.view.epoch > ta.view.epoch);
        v.apply_transition(&cleared);
        assert!(!v.apply_transition(&ta));
        assert_eq!(
            v.summarize(pool, c.now()),
            PoolSummary::Routable { count: 1 }
        );
        // Same epoch, different deadline (a re-sent view): the later deadline stays.
        let mut dup = cleared.view;
        dup.cooldown = Some(Cooldown {
            until_ms: T0 + 1,
            reason: Reason::Unknown,
        });
        v.apply(ConnectionId(3), &dup);
        let mut earlier = dup;
        earlier.cooldown = Some(Cooldown {
            until_ms: T0,
            reason: Reason::Unknown,
        });
        assert!(!v.apply(ConnectionId(3), &earlier));
        assert_eq!(v.get(ConnectionId(3)).cooldown.unwrap().until_ms, T0 + 1);
        // Unknown connections are routable.
        assert_eq!(
            v.routability(ConnectionId(99), c.now()),
            Routability::Routable
        );
        assert_eq!(v.summarize([], c.now()), PoolSummary::Empty);
    }

    #[test]
    fn all_terminal_summary_picks_the_most_common_status() {
        let now = clock().now();
        let view = |t| ConnectionView {
            terminal: Some(t),
            ..ConnectionView::default()
        };
        let views = [
            view(Terminal::Banned),
            view(Terminal::Expired),
            view(Terminal::Banned),
        ];
        assert_eq!(
            summarize(&views, now),
            PoolSummary::AllTerminal {
                count: 3,
                status: Terminal::Banned
            }
        );
        let tie = [view(Terminal::CreditsExhausted), view(Terminal::Expired)];
        assert_eq!(
            summarize(&tie, now),
            PoolSummary::AllTerminal {
                count: 2,
                status: Terminal::Expired
            }
        );
        assert_eq!(Terminal::Banned.describe(), "banned by upstream");
        // Terminal plus cooling is "all cooling".
        let mixed = [
            view(Terminal::Banned),
            ConnectionView {
                cooldown: Some(Cooldown {
                    until_ms: now.wall_ms + 1_000,
                    reason: Reason::RateLimitExceeded,
                }),
                ..ConnectionView::default()
            },
        ];
        assert!(matches!(
            summarize(&mixed, now),
            PoolSummary::AllCooling {
                cooling: 1,
                terminal: 1,
                ..
            }
        ));
    }

    #[test]
    fn export_import_round_trip() {
        let c = clock();
        let p = policy(AuthKind::ApiKey);
        let mut t = ConnectionTable::new();
        let d = scaled(&p, 0, 503, Reason::ServerError);
        mark(&mut t, &p, 503, &d, c.now());
        t.mark_unavailable(ConnectionId(3), &fail(429, &d), &opts(), &p, c.now());
        t.clear_on_success(ConnectionId(3), c.now());
        let out = t.export();
        assert_eq!(out.len(), 1, "clean records are not exported");
        let mut fresh = ConnectionTable::new();
        for (id, s) in out.clone() {
            let tr = fresh.import(id, s, p.backoff.max_backoff_steps, c.now());
            assert_eq!(tr.cause, Cause::Imported);
        }
        assert_eq!(fresh.export(), out);
        assert_eq!(
            fresh.view(ID).routability(c.now()),
            t.view(ID).routability(c.now())
        );
        // Imports are sanitised.
        let mut s = t.state(ID);
        s.backoff_level = 99;
        s.error.as_mut().unwrap().message = format!("a\nb{}", "x".repeat(900));
        fresh.import(ID, s, 5, c.now());
        let s = fresh.state(ID);
        assert_eq!(s.backoff_level, 5);
        let msg = s.error.unwrap().message;
        assert!(msg.starts_with("a b") && msg.len() == MAX_LAST_ERROR_BYTES);
    }

    #[test]
    fn vocabulary_round_trips() {
        for s in [
            "active",
            "unavailable",
            "banned",
            "expired",
            "credits_exhausted",
        ] {
            assert_eq!(TestStatus::parse(s).unwrap().as_str(), s);
        }
        assert_eq!(TestStatus::parse(" BANNED "), Some(TestStatus::Banned));
        for t in ProviderErrorType::ALL {
            assert_eq!(ProviderErrorType::parse(t.as_str()), Some(t));
        }
        assert_eq!(
            parse_reason("rate_limit_exceeded"),
            Some(Reason::RateLimitExceeded)
        );
        assert_eq!(parse_reason("nope"), None);
        assert_eq!(sanitize("é".repeat(400).as_str()).len(), 500);
    }

    // ---- properties -------------------------------------------------------------------

    #[derive(Clone, Debug)]
    enum Op {
        Fail {
            conn: u32,
            status: u16,
            cooldown_ms: u64,
            level: Option<u32>,
            should_fallback: bool,
            permanent: bool,
            credits: bool,
            error_type: Option<ProviderErrorType>,
            disable_cooling: bool,
            per_model: bool,
            persist: bool,
        },
        Stall {
            conn: u32,
            enabled: bool,
        },
        Success {
            conn: u32,
        },
        Decay {
            conn: u32,
        },
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let fail = (
            (
                0u32..3,
                prop::sample::select(vec![400u16, 401, 402, 403, 404, 429, 500, 502, 503]),
            ),
            (0u64..4_000_000, prop::option::of(0u32..40)),
            (
                any::<bool>(),
                prop::bool::weighted(0.05),
                prop::bool::weighted(0.05),
            ),
            prop::option::of(prop::sample::select(ProviderErrorType::ALL.to_vec())),
            (
                prop::bool::weighted(0.2),
                any::<bool>(),
                prop::bool::weighted(0.8),
            ),
        )
            .prop_map(
                |(
                    (conn, status),
                    (cooldown_ms, level),
                    (sf, permanent, credits),
                    error_type,
                    (dc, pm, persist),
                )| {
                    Op::Fail {
                        conn,
                        status,
                        cooldown_ms,
                        level,
                        should_fallback: sf || status != 400,
                        permanent,
                        credits,
                        error_type,
                        disable_cooling: dc,
                        per_model: pm,
                        persist,
                    }
                },
            );
        prop_oneof![
            6 => fail,
            1 => (0u32..3, any::<bool>()).prop_map(|(conn, enabled)| Op::Stall { conn, enabled }),
            1 => (0u32..3).prop_map(|conn| Op::Success { conn }),
            1 => (0u32..3).prop_map(|conn| Op::Decay { conn }),
            3 => (0u64..3_000_000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Terminal states are never overwritten by transient failures or successes; a
        /// failure never moves a running cooldown earlier; the level stays within the
        /// steps; epochs strictly increase; replicas converge on the owner's view.
        #[test]
        fn connection_invariants(ops in prop::collection::vec(op(), 1..120)) {
            let c = clock();
            let mut p = policy(AuthKind::ApiKey);
            let mut t = ConnectionTable::new();
            let mut replica = ConnectionViews::new();
            let mut last_epoch: HashMap<u32, u64> = HashMap::new();
            for o in ops {
                let now = c.now();
                let conn = match &o {
                    Op::Fail { conn, .. } | Op::Stall { conn, .. } | Op::Success { conn } | Op::Decay { conn } => Some(*conn),
                    Op::Advance(_) => None,
                };
                let before = conn.map(|k| t.state(ConnectionId(k)));
                let transition = match o {
                    Op::Fail { conn, status, cooldown_ms, level, should_fallback, permanent, credits, error_type, disable_cooling, per_model, persist } => {
                        let mut d = FallbackDecision::new(should_fallback, cooldown_ms, Reason::RateLimitExceeded);
                        d.new_backoff_level = level;
                        d.permanent = permanent;
                        d.credits_exhausted = credits;
                        let f = Failure { status, text: "x", decision: &d, error_type, credits_signal: false };
                        let mut mo = MarkOptions::new("openai", Some("m"));
                        mo.disable_cooling = disable_cooling;
                        mo.per_model = per_model;
                        mo.persist = persist;
                        let m = t.mark_unavailable(ConnectionId(conn), &f, &mo, &p, now);
                        let after = t.state(ConnectionId(conn));
                        let before = before.clone().unwrap_or_default();
                        if before.test_status.is_terminal() {
                            prop_assert_eq!(&after, &before, "terminal record touched");
                        }
                        if let Some(u) = before.cooling_until(now) && !after.test_status.is_terminal() {
                            prop_assert!(after.rate_limited_until_ms().is_some_and(|a| a >= u), "cooldown moved earlier");
                        }
                        m.transition
                    }
                    Op::Stall { conn, enabled } => {
                        p.stream_stall_cooldown = enabled;
                        let m = t.record_stream_stall(ConnectionId(conn), "stall", ProviderErrorType::StreamContentStall, false, &p, now);
                        let after = t.state(ConnectionId(conn));
                        let before = before.clone().unwrap_or_default();
                        if before.test_status.is_terminal() {
                            prop_assert_eq!(&after, &before);
                        }
                        if let Some(u) = before.cooling_until(now) {
                            prop_assert_eq!(after.rate_limited_until_ms(), Some(u));
                        }
                        m.transition
                    }
                    Op::Success { conn } => t.clear_on_success(ConnectionId(conn), now),
                    Op::Decay { conn } => t.auto_decay(ConnectionId(conn), now),
                    Op::Advance(ms) => { c.advance_ms(ms); None }
                };
                if let (Some(k), Some(before)) = (conn, before) {
                    let after = t.state(ConnectionId(k));
                    if before.test_status.is_terminal() {
                        prop_assert_eq!(after.test_status, before.test_status, "terminal overwritten");
                    }
                    prop_assert!(after.backoff_level <= p.backoff.max_backoff_steps);
                }
                if let Some(tr) = transition {
                    let prev = last_epoch.insert(tr.connection.0, tr.view.epoch).unwrap_or(0);
                    prop_assert!(tr.view.epoch > prev, "epoch {} after {}", tr.view.epoch, prev);
                    replica.apply_transition(&tr);
                }
            }
            for (id, view) in t.views() {
                prop_assert_eq!(replica.get(id), view);
            }
        }
    }
}
