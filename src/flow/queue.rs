//! The per-connection request queue (spec B §1): queue-depth admission, the effective
//! limiter settings of one connection, limiter keys, the queue errors clients see and the
//! execution backstop. The limiter state machine itself lives in [`limiter`], what it
//! learns from upstream responses in [`learn`], the header-less providers' static sliding
//! window in [`window`].
//!
//! Everything is pure and synchronous: the owner shard of a limiter key holds the
//! [`LimiterTable`], passes `now` in, and turns the returned decisions into timers and
//! responses.
//!
//! # The two budgets (B §1.3, ARCHITECTURE §6)
//!
//! They are separate, as the guide intends (OmniRoute #13592 mixed them up):
//! * the **queue-wait budget** `max_wait_ms` bounds only the time spent *queued*; it is
//!   enforced by [`Limiter::expire`] and ends at the moment a waiter is granted a start;
//! * the **execution backstop** `execution_max_wait_ms` starts at dispatch
//!   (`execution_budget_ms` from dispatch) and is never shortened by time spent in the queue.
//!
//! # When the limiter applies (ARCHITECTURE §6)
//!
//! Tidegate's limiter is **off** unless `request_queue.auto_enable_api_key_providers`
//! (env `RATE_LIMIT_AUTO_ENABLE`) is on for an API-key provider's enabled connection, or
//! the connection itself sets a limiter override (`requests_per_minute` > 0, or
//! `min_time_between_requests_ms`, where 0 means "on, without spacing") — see
//! [`LimiterSettings::resolve`]. A connection's
//! `max_concurrent` alone does not turn the limiter on: it is a concurrency gate
//! (`flow::gates`), which applies whenever set.

pub mod learn;
pub mod limiter;
pub mod window;

pub use learn::{ResponseFacts, apply_response};
pub use limiter::{Grant, Limiter, LimiterTable, Schedule};
pub use window::{ProviderWindow, SlidingWindow, WindowDecision, provider_default_concurrency};

use crate::config::kinds::LimiterKey;
use crate::config::resilience::{DAY_MS, MINUTE_MS, ResilienceSettings};
use crate::config::{AuthKind, RateLimitOverrides};

// ---------------------------------------------------------------------------------------
// Errors (B §1.6)

/// A queue error: a *local limit failure* (B §1.6). It is request-scoped: it never trips a
/// breaker, never cools a connection down, never locks a model. Its status, code and type
/// are those of its `ErrorKind` (`RateLimitQueue*`, mapped in `owners::queue::client::error`);
/// `error.rs` is the one map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueError {
    /// `queued >= max_queue_depth` before scheduling.
    Full { max_queue_depth: u32 },
    /// Still queued when the queue-wait budget ran out.
    QueueTimeout { max_wait_ms: u64 },
    /// Dispatched, but the upstream call had not settled by the execution backstop.
    ExecutionTimeout { execution_max_wait_ms: u64 },
    /// Rejected by the wedge watchdog; nothing was started or retried.
    Wedged,
}

impl QueueError {
    /// Public `error.message`; `target` is `<provider>[/<model>]` or the limiter identity.
    pub fn message(self, target: &str) -> String {
        match self {
            QueueError::Full { max_queue_depth } => format!(
                "Request queue for {target} is full (maxQueueDepth {max_queue_depth}); \
                 the request was rejected before it was scheduled"
            ),
            QueueError::QueueTimeout { max_wait_ms } => format!(
                "Request dropped after exceeding the local queue budget maxWaitMs \
                 ({max_wait_ms}ms) for {target}; this is the gateway's queue, not an \
                 upstream execution timeout"
            ),
            QueueError::ExecutionTimeout {
                execution_max_wait_ms,
            } => format!(
                "Upstream call for {target} did not settle within executionMaxWaitMs \
                 ({execution_max_wait_ms}ms)"
            ),
            QueueError::Wedged => format!(
                "Request queue for {target} was detected as wedged and force-reset; no \
                 upstream operation was started or retried"
            ),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Admission (B §1.4)

/// `checkQueueAdmission`: `depth` is the number of waiters queued (not running) on the
/// limiter. `max_queue_depth` 0 = unbounded. Run before scheduling; a rejected request
/// never occupies a slot.
pub fn check_queue_admission(depth: usize, max_queue_depth: u32) -> Result<(), QueueError> {
    if max_queue_depth == 0 || depth < max_queue_depth as usize {
        Ok(())
    } else {
        Err(QueueError::Full { max_queue_depth })
    }
}

// ---------------------------------------------------------------------------------------
// Effective settings (B §1.1, §1.5)

/// `concurrentRequests ≤ 0` means this many (effectively unlimited).
pub const UNLIMITED_CONCURRENCY: u32 = 1_000;
/// Reservoir refill period of `requestsPerMinute`.
pub const RESERVOIR_REFILL_MS: u64 = MINUTE_MS;
/// Upper bound of `requestsPerMinute`.
pub const MAX_RPM: u32 = 1_000_000;
/// Upper bound of `minTimeBetweenRequestsMs`.
pub const MAX_MIN_TIME_MS: u64 = 3_600_000;
/// Upper bound of the global `maxWaitMs` / `executionMaxWaitMs`.
pub const MAX_BUDGET_MS: u64 = DAY_MS;
/// Per-connection `maxWaitMs` override range is `1..=` this.
pub const OVERRIDE_MAX_WAIT_MS: u64 = 120_000;
/// Per-connection `executionMaxWaitMs` override range is `1..=` this.
pub const OVERRIDE_EXECUTION_MAX_WAIT_MS: u64 = 600_000;

/// The limiter numbers of one connection after precedence and clamping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimiterSettings {
    /// False: the call runs at once, no queue, no queue error can occur.
    pub enabled: bool,
    pub max_concurrent: u32,
    /// Minimum spacing between two starts.
    pub min_time_ms: u64,
    /// Reservoir size refilled every [`RESERVOIR_REFILL_MS`]; `None` = unbounded.
    pub rpm: Option<u32>,
    /// Queue-wait budget; 0 = no queue deadline.
    pub max_wait_ms: u64,
    /// Execution backstop (≥ 1).
    pub execution_max_wait_ms: u64,
    /// 0 = unbounded queue.
    pub max_queue_depth: u32,
    /// The connection sets its own `rpm`: it wins over a learned cap (B §1.2).
    pub rpm_overridden: bool,
}

impl LimiterSettings {
    /// Effective settings: built-in default < env (already folded into `settings` at
    /// load) < config / PATCH (`settings`) < the connection's `overrides`. A missing or
    /// zero override falls through — except `min_time_between_requests_ms`, whose explicit
    /// 0 means no spacing; every value is clamped into the spec's range.
    ///
    /// `max_wait_floor_ms` is the provider kind's queue-budget floor
    /// ([`Quirks::max_wait_floor_ms`](crate::config::kinds::Quirks)), `auth` its category,
    /// `connection_active` whether the connection is enabled.
    pub fn resolve(
        settings: &ResilienceSettings,
        overrides: &RateLimitOverrides,
        max_wait_floor_ms: u64,
        auth: AuthKind,
        connection_active: bool,
    ) -> Self {
        let q = &settings.request_queue;
        let rpm_override = overrides.requests_per_minute.filter(|v| *v > 0);
        // Unlike every other override, an explicit 0 spacing is kept: "no spacing on this
        // connection" (OmniRoute lets 0 fall through to the global spacing).
        let min_time_override = overrides.min_time_between_requests_ms;
        let explicit = rpm_override.is_some() || min_time_override.is_some();
        let auto = q.auto_enable_api_key_providers && auth == AuthKind::ApiKey;
        let enabled = connection_active && (explicit || auto);

        let rpm = match rpm_override {
            Some(v) => Some(v.min(MAX_RPM)),
            None if q.requests_per_minute == 0 => None,
            None => Some(q.requests_per_minute.min(MAX_RPM)),
        };
        let min_time_ms = min_time_override
            .unwrap_or(q.min_time_between_requests_ms)
            .min(MAX_MIN_TIME_MS);
        let max_concurrent = match overrides.max_concurrent.filter(|v| *v > 0) {
            Some(v) => v,
            None if q.concurrent_requests == 0 => UNLIMITED_CONCURRENCY,
            None => q.concurrent_requests,
        };

        let mut max_wait_ms = q.max_wait_ms.min(MAX_BUDGET_MS);
        if max_wait_ms > 0 {
            max_wait_ms = max_wait_ms.max(max_wait_floor_ms);
        }
        if let Some(v) = overrides.max_wait_ms.filter(|v| *v > 0) {
            max_wait_ms = v.min(OVERRIDE_MAX_WAIT_MS);
        }
        let execution_max_wait_ms = match overrides.execution_max_wait_ms.filter(|v| *v > 0) {
            Some(v) => v.min(OVERRIDE_EXECUTION_MAX_WAIT_MS),
            None => q.execution_max_wait_ms.clamp(1, MAX_BUDGET_MS),
        };

        Self {
            enabled,
            max_concurrent,
            min_time_ms,
            rpm,
            max_wait_ms,
            execution_max_wait_ms,
            max_queue_depth: q.max_queue_depth.min(100_000),
            rpm_overridden: rpm_override.is_some(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Limiter keys (B §1.1)

/// What a limiter key is built from.
#[derive(Clone, Copy, Debug)]
pub struct KeyParts<'a> {
    pub provider: &'a str,
    /// How the provider's kind keys its limiter.
    pub scheme: LimiterKey,
    pub connection: &'a str,
    pub model: Option<&'a str>,
    /// Codex executor's per-account/model-family key.
    pub codex_key: Option<&'a str>,
    /// Antigravity quota family of the model.
    pub quota_family: Option<&'a str>,
}

/// The limiter key, by the kind's scheme: `<provider>:<connection>` normally;
/// `codex:<codexKey>` for Codex; `<provider>:<connection>:<quota family or model>` for
/// Antigravity; `<provider>:<connection>:<model>` for Gemini and GitHub Copilot, so that
/// separate upstream quota buckets do not block each other.
pub fn limiter_key(p: KeyParts<'_>) -> String {
    let provider = p.provider.to_ascii_lowercase();
    match p.scheme {
        LimiterKey::Codex => match p.codex_key {
            Some(k) => format!("codex:{k}"),
            None => format!("codex:{}", p.connection),
        },
        LimiterKey::QuotaFamily => match p.quota_family.or(p.model) {
            Some(f) => format!("{provider}:{}:{f}", p.connection),
            None => format!("{provider}:{}", p.connection),
        },
        LimiterKey::Model => match p.model {
            Some(m) => format!("{provider}:{}:{m}", p.connection),
            None => format!("{provider}:{}", p.connection),
        },
        LimiterKey::Connection => format!("{provider}:{}", p.connection),
    }
}

// ---------------------------------------------------------------------------------------
// Execution backstop (B §1.3)

/// The execution budget in ms: `execution_max_wait_ms`, raised to the upstream's own
/// fetch-start timeout when that is longer (the backstop never fires first).
pub fn execution_budget_ms(settings: &LimiterSettings, upstream_start_timeout_ms: u64) -> u64 {
    settings
        .execution_max_wait_ms
        .max(upstream_start_timeout_ms)
        .max(1)
}

/// Monotonic deadline (ns) of a call dispatched at `start`; past it the request fails with
/// [`QueueError::ExecutionTimeout`]. Independent of any time spent queued.
#[cfg(test)]
pub fn execution_deadline_ns(
    start: crate::clock::Now,
    settings: &LimiterSettings,
    upstream_start_timeout_ms: u64,
) -> u64 {
    let ms = execution_budget_ms(settings, upstream_start_timeout_ms);
    start.mono_ns.saturating_add(ms.saturating_mul(1_000_000))
}

/// The error of an execution deadline that passed.
#[cfg(test)]
pub fn execution_timeout(settings: &LimiterSettings, upstream_start_timeout_ms: u64) -> QueueError {
    QueueError::ExecutionTimeout {
        execution_max_wait_ms: execution_budget_ms(settings, upstream_start_timeout_ms),
    }
}

#[cfg(test)]
mod tests;
