//! Model lockout (spec A §4): "this model (or its quota family) on this connection is
//! unusable until T", so one failing model does not take a whole connection out of
//! rotation. This module owns the lock keys (connection + quota family / not-found model /
//! exact model), the scope rule, the escalating cooldown of repeated failures, success
//! decay, expiry, eviction and the listing of `GET /api/resilience/model-cooldowns`.
//!
//! [`LockoutTable`] is the owner's table (one per owner shard; every mutation of a key
//! happens there) and [`LockoutViews`] the read-only replica other shards route from.
//! Every change the table makes is queued as a [`LockUpdate`] carrying a table-wide,
//! strictly increasing `seq`; the shard drains them ([`LockoutTable::drain_updates`]) and
//! broadcasts them, and replicas apply them idempotently (older or equal `seq` ignored).
//!
//! **Time.** Lockouts are never persisted (A §4: in memory, lost on restart), so their
//! deadlines are *monotonic* milliseconds (`now.mono_ms()`), immune to wall-clock steps;
//! wall-clock time appears only where people read it (the listing's `until` and
//! `lockedAt`, converted with the same `now`) and in the daily-reset rule (next midnight).
//!
//! Deliberate deviations from the spec (to be listed in `docs/compat.md`):
//! * **Success decay that reaches zero removes the lock too**, not only the failure
//!   state — the guide's intent ("a model that recovered stops escalating and the lock is
//!   lifted before its timer"), where the code (A §8.4) left the lock to expire.
//! * **Combo lockouts escalate with `modelLockout.maxBackoffSteps`**
//!   ([`FailureRecord::combo`]); OmniRoute validates that setting but uses the provider's
//!   `connectionCooldown.maxBackoffSteps` (A §4.5 note). Per-model lockouts recorded by
//!   connection state keep the provider profile, as the spec says.
//! * **"Local midnight" is the table's configured zone** (`LockoutTable::set_utc_offset_ms`,
//!   default UTC): the gateway does not read the host's time zone.
//! * **Connections are typed**: a combo lock "for every connection" (OmniRoute's empty
//!   connection id) is `connection: None`.
//! * **Eviction** past [`MAX_LOCK_ENTRIES`] drops every expired lock at once (never an
//!   active one) rather than down to exactly the limit in insertion order.
//! * **A hard cap** ([`LockoutTable::with_max_entries`], `[server] max_model_lockouts`,
//!   default [`DEFAULT_MAX_ENTRIES`] per owner shard) on top of the spec's soft one: lock
//!   keys carry client-chosen model names, so a client failing requests for ever-new
//!   models could otherwise grow the table for as long as the locks last (until midnight
//!   for a quota lock). Past the cap the entries written longest ago go first, active
//!   locks included (a removal update tells the replicas); each is counted
//!   ([`LockoutTable::evictions`]).
//!
//! The invariant the property tests hold: a lock written by
//! [`LockoutTable::record_failure`] never ends later than its failure time plus the
//! record's `max_cooldown_ms`, unless the cooldown is an *exact* one that is allowed past
//! the cap — an upstream-verified reset (`exact_is_upstream_reset`: `Retry-After`,
//! `X-RateLimit-Reset` or Google `RetryInfo`, A §4.4) or a record without a cap
//! (`max_cooldown_ms = 0`). Such entries carry [`LockEntry::bypassed_max`].

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde::Serialize;

use super::Reason;
use super::backoff::{
    DEFAULT_MAX_COOLDOWN_MS, ZERO_BASE_FALLBACK_MS, exponential_ms, format_rfc3339_ms,
    ms_until_next_midnight,
};
use crate::clock::Now;
use crate::config::ConnectionId;
use crate::config::kinds::QuotaFamily;
use crate::config::resilience::ModelLockoutSettings;

/// Above this many locks, expired ones are evicted (never active ones).
pub const MAX_LOCK_ENTRIES: usize = 1_000;
/// Above this many failure states, the oldest without a lock are evicted.
pub const MAX_FAILURE_STATES: usize = 1_000;
/// How often the owner should call [`LockoutTable::sweep`].
pub const SWEEP_INTERVAL_MS: u64 = 15_000;
/// Default hard cap on the locks (and, separately, the failure states) of one owner table.
pub const DEFAULT_MAX_ENTRIES: usize = crate::config::validate::DEFAULT_MAX_MODEL_LOCKOUTS as usize;
/// Escalation reset window when the profile has no positive breaker reset timeout.
pub const DEFAULT_RESET_AFTER_MS: u64 = 1_800_000;
/// Exponent cap when the profile gives no `max_backoff_steps`.
pub const DEFAULT_MAX_BACKOFF_STEPS: u32 = 15;
/// Base when neither a fallback nor a profile base is given: 429.
pub const DEFAULT_BASE_429_MS: u64 = 1_000;
/// Base when neither a fallback nor a profile base is given: other statuses.
pub const DEFAULT_BASE_OTHER_MS: u64 = 5_000;

// ---------------------------------------------------------------------------------------
// Scope, reasons, keys

/// Which key a failure locks (A §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LockScope {
    /// The quota family of the model (codex scope, antigravity family), or the raw model
    /// for a not-found failure and for providers without families.
    QuotaFamily,
    /// Only this exact (trimmed, lower-cased) model.
    Exact,
}

impl LockScope {
    #[cfg(test)]
    pub fn as_str(self) -> &'static str {
        match self {
            LockScope::QuotaFamily => "quota_family",
            LockScope::Exact => "exact",
        }
    }
}

/// `resolveLockoutScope` (A §4.2): an explicit scope wins; 429, 403, 402 and 404 lock the
/// quota family (404 then lands on the raw model through [`LockKey::family`]); every other
/// status (400, 5xx including the synthesized 502 of quality validation, 520…) locks only
/// the exact model.
pub fn resolve_lockout_scope(status: u16, explicit: Option<LockScope>) -> LockScope {
    match explicit {
        Some(scope) => scope,
        None if matches!(status, 402 | 403 | 404 | 429) => LockScope::QuotaFamily,
        None => LockScope::Exact,
    }
}

/// Why a model is locked. The strings are OmniRoute's: some come from classification
/// (`rate_limit_exceeded`), some from the combo path (`rate_limit`), some from connection
/// state's per-model branches (`rate_limited`, `forbidden`, `credits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockReason {
    /// Combo path, status 429.
    RateLimit,
    /// Connection path, a 429 not classified as quota.
    RateLimited,
    RateLimitExceeded,
    QuotaExhausted,
    ModelCapacity,
    ServerError,
    NotFound,
    /// Per-model 403.
    Forbidden,
    /// Per-model 402.
    Credits,
    AuthError,
    ServiceNotRunning,
    Unknown,
}

impl LockReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LockReason::RateLimit => "rate_limit",
            LockReason::RateLimited => "rate_limited",
            LockReason::RateLimitExceeded => "rate_limit_exceeded",
            LockReason::QuotaExhausted => "quota_exhausted",
            LockReason::ModelCapacity => "model_capacity",
            LockReason::ServerError => "server_error",
            LockReason::NotFound => "not_found",
            LockReason::Forbidden => "forbidden",
            LockReason::Credits => "credits",
            LockReason::AuthError => "auth_error",
            LockReason::ServiceNotRunning => "service_not_running",
            LockReason::Unknown => "unknown",
        }
    }

    /// The reasons a combo may wait out (B §3.3 allow-list: `rate_limit`, `rate_limited`,
    /// `transient`, `overloaded`, `server_error`; Tidegate emits no `transient` or
    /// `overloaded` locks).
    pub fn is_waitable(self) -> bool {
        match self {
            LockReason::RateLimit | LockReason::RateLimited | LockReason::ServerError => true,
            LockReason::RateLimitExceeded
            | LockReason::QuotaExhausted
            | LockReason::ModelCapacity
            | LockReason::NotFound
            | LockReason::Forbidden
            | LockReason::Credits
            | LockReason::AuthError
            | LockReason::ServiceNotRunning
            | LockReason::Unknown => false,
        }
    }
}

impl From<Reason> for LockReason {
    /// The reason string a plain [`LockRecord`] from classification keeps.
    fn from(r: Reason) -> Self {
        match r {
            Reason::AuthError => LockReason::AuthError,
            Reason::QuotaExhausted => LockReason::QuotaExhausted,
            Reason::RateLimitExceeded => LockReason::RateLimitExceeded,
            Reason::ModelCapacity => LockReason::ModelCapacity,
            Reason::ServerError | Reason::NetworkError => LockReason::ServerError,
            Reason::ServiceNotRunning => LockReason::ServiceNotRunning,
            Reason::NotFound => LockReason::NotFound,
            Reason::Unknown
            | Reason::ExecutorContractViolation
            | Reason::InvalidPreviousResponseBinding
            | Reason::ProviderModelUnsupported => LockReason::Unknown,
        }
    }
}

/// The model part of a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyModel {
    /// `provider:conn:X` — a quota family, a codex scope or a raw model.
    Family(String),
    /// `provider:conn:exact:model` — trimmed and lower-cased.
    Exact(String),
}

/// One lock key (A §4.1). `provider` is the canonical (alias-resolved) provider id; the
/// caller resolves aliases. Hashed as its [`KeyParts`], so a borrowed [`Probe`] finds it
/// in a map without building one (no `String` per lookup).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockKey {
    pub provider: String,
    /// `None` = a combo-level lock not tied to a connection.
    pub connection: Option<ConnectionId>,
    pub model: KeyModel,
}

impl LockKey {
    /// The family key: the raw model when the reason is `not_found` or the status 404;
    /// else the codex scope for `codex`, the antigravity family for `antigravity`/`agy`;
    /// else the raw model.
    pub fn family(
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        reason: Option<LockReason>,
        status: Option<u16>,
    ) -> Self {
        let not_found = reason == Some(LockReason::NotFound) || status == Some(404);
        let x = if not_found {
            model.to_string()
        } else {
            match family {
                QuotaFamily::Codex => codex_scope(model).to_string(),
                QuotaFamily::Antigravity => antigravity_family(model),
                QuotaFamily::Model => model.to_string(),
            }
        };
        Self {
            provider: provider.to_string(),
            connection,
            model: KeyModel::Family(x),
        }
    }

    /// The key a not-found failure locks: the raw model.
    pub fn not_found(provider: &str, connection: Option<ConnectionId>, model: &str) -> Self {
        Self::family(
            provider,
            QuotaFamily::Model,
            connection,
            model,
            Some(LockReason::NotFound),
            None,
        )
    }

    /// The exact key: the model trimmed and lower-cased.
    pub fn exact(provider: &str, connection: Option<ConnectionId>, model: &str) -> Self {
        Self {
            provider: provider.to_string(),
            connection,
            model: KeyModel::Exact(model.trim().to_ascii_lowercase()),
        }
    }

    /// The key a record of `scope` writes.
    pub fn for_scope(
        scope: LockScope,
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        reason: LockReason,
        status: Option<u16>,
    ) -> Self {
        match scope {
            LockScope::QuotaFamily => {
                Self::family(provider, family, connection, model, Some(reason), status)
            }
            LockScope::Exact => Self::exact(provider, connection, model),
        }
    }

    /// The distinct keys a model is checked under: family (no reason), not-found, exact.
    pub fn shapes(
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
    ) -> Vec<LockKey> {
        let mut keys = vec![Self::family(
            provider, family, connection, model, None, None,
        )];
        let nf = Self::not_found(provider, connection, model);
        if nf != keys[0] {
            keys.push(nf);
        }
        keys.push(Self::exact(provider, connection, model));
        keys
    }

    /// The model part as the listing shows it (codex scope, `family:gemini`, raw model,
    /// bare exact model).
    pub fn model_part(&self) -> &str {
        match &self.model {
            KeyModel::Family(m) | KeyModel::Exact(m) => m,
        }
    }

    pub fn scope(&self) -> LockScope {
        match self.model {
            KeyModel::Family(_) => LockScope::QuotaFamily,
            KeyModel::Exact(_) => LockScope::Exact,
        }
    }
}

/// A lock key's parts as a map lookup sees them: an exact key's model compares and hashes
/// ASCII-lower-cased (a stored exact key is lower-case already; a [`Probe`]'s is the
/// model as the request names it, trimmed).
trait KeyParts {
    fn provider(&self) -> &str;
    fn connection(&self) -> Option<ConnectionId>;
    fn exact(&self) -> bool;
    fn model(&self) -> &str;
}

impl KeyParts for LockKey {
    fn provider(&self) -> &str {
        &self.provider
    }
    fn connection(&self) -> Option<ConnectionId> {
        self.connection
    }
    fn exact(&self) -> bool {
        matches!(self.model, KeyModel::Exact(_))
    }
    fn model(&self) -> &str {
        self.model_part()
    }
}

/// A lock key made of borrowed parts, to look a lock up with.
struct Probe<'a> {
    provider: &'a str,
    connection: Option<ConnectionId>,
    exact: bool,
    model: &'a str,
}

impl KeyParts for Probe<'_> {
    fn provider(&self) -> &str {
        self.provider
    }
    fn connection(&self) -> Option<ConnectionId> {
        self.connection
    }
    fn exact(&self) -> bool {
        self.exact
    }
    fn model(&self) -> &str {
        self.model
    }
}

fn hash_parts<H: Hasher>(k: &(impl KeyParts + ?Sized), state: &mut H) {
    k.provider().hash(state);
    k.connection().hash(state);
    k.exact().hash(state);
    if k.exact() {
        // Lower-cased in pieces on the stack: the same byte stream for a stored key (already
        // lower-case) and for a probe.
        let mut piece = [0u8; 32];
        for chunk in k.model().as_bytes().chunks(piece.len()) {
            let out = &mut piece[..chunk.len()];
            out.copy_from_slice(chunk);
            out.make_ascii_lowercase();
            state.write(out);
        }
        state.write_u8(0xff);
    } else {
        k.model().hash(state);
    }
}

fn eq_parts(a: &(impl KeyParts + ?Sized), b: &(impl KeyParts + ?Sized)) -> bool {
    a.connection() == b.connection()
        && a.exact() == b.exact()
        && a.provider() == b.provider()
        && if a.exact() {
            a.model().eq_ignore_ascii_case(b.model())
        } else {
            a.model() == b.model()
        }
}

impl Hash for LockKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_parts(self, state);
    }
}

impl Hash for dyn KeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_parts(self, state);
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        eq_parts(self, other)
    }
}

impl Eq for dyn KeyParts + '_ {}

impl<'a> Borrow<dyn KeyParts + 'a> for LockKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl fmt::Display for LockKey {
    /// OmniRoute's key string: `provider:conn:model` / `provider:conn:exact:model`
    /// (connection as its index, empty for combo locks).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.provider)?;
        if let Some(c) = self.connection {
            write!(f, "{}", c.0)?;
        }
        match &self.model {
            KeyModel::Family(m) => write!(f, ":{m}"),
            KeyModel::Exact(m) => write!(f, ":exact:{m}"),
        }
    }
}

/// The codex quota scope of a model: `spark` for `codex-spark`, `spark`, `bengalfox`;
/// `codex` for `codex`, `gpt-5` and anything else (A §4.1).
pub fn codex_scope(model: &str) -> &'static str {
    // The needles are lower-case ASCII: a case-insensitive search of the model finds them
    // where a search of its lower-cased copy would (and allocates nothing).
    let m = model.as_bytes();
    for (needle, scope) in [
        ("codex-spark", "spark"),
        ("spark", "spark"),
        ("bengalfox", "spark"),
        ("codex", "codex"),
        ("gpt-5", "codex"),
    ] {
        if m.windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
        {
            return scope;
        }
    }
    "codex"
}

/// The antigravity quota family: `family:gemini`, `family:claude`, or the model itself.
pub fn antigravity_family(model: &str) -> String {
    let lower = model.to_ascii_lowercase();
    let m = lower
        .strip_prefix("antigravity/")
        .or_else(|| lower.strip_prefix("agy/"))
        .unwrap_or(&lower);
    let tail = m.find('/').map_or(m, |i| &m[i + 1..]);
    if tail.contains("gemini") {
        "family:gemini".to_string()
    } else if tail.starts_with("claude-")
        || tail.starts_with("cloud-")
        || m.contains("/claude-")
        || m.contains("/cloud-")
        || tail.contains("anthropic")
    {
        "family:claude".to_string()
    } else {
        model.to_string()
    }
}

// ---------------------------------------------------------------------------------------
// Commands

/// The profile numbers `recordModelLockoutFailure` escalates with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockProfile {
    /// `None` = no profile base (then 1 s for 429, 5 s otherwise).
    pub base_cooldown_ms: Option<u64>,
    /// `None` = [`DEFAULT_MAX_BACKOFF_STEPS`].
    pub max_backoff_steps: Option<u32>,
    /// The provider *breaker* reset timeout: the escalation window (0 = 30 min).
    pub reset_timeout_ms: u64,
}

/// The arguments of `recordModelLockoutFailure` (A §4.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureRecord {
    pub provider: String,
    /// How the provider's kind keys a model's quota.
    pub family: QuotaFamily,
    pub connection: Option<ConnectionId>,
    pub model: String,
    pub reason: LockReason,
    pub status: u16,
    /// Used as the base when > 0.
    pub fallback_cooldown_ms: Option<u64>,
    pub profile: LockProfile,
    /// An exact cooldown; `None` means "not given", which for `quota_exhausted` means
    /// "until the next midnight". `Some(0)` suppresses that and escalates instead.
    pub exact_cooldown_ms: Option<u64>,
    /// 0 = no cap on exact cooldowns and [`DEFAULT_MAX_COOLDOWN_MS`] on escalated ones.
    pub max_cooldown_ms: u64,
    pub scope: Option<LockScope>,
    /// The exact cooldown came from `Retry-After` / `X-RateLimit-Reset` / Google
    /// `RetryInfo` and may exceed `max_cooldown_ms`.
    pub exact_is_upstream_reset: bool,
}

impl FailureRecord {
    /// A combo target's failure (A §4.5): reason by status (429 `rate_limit`, 403
    /// `quota_exhausted`, else `unknown`; Tidegate runs no response-quality validation, so
    /// OmniRoute's `quality_failure` reason never arises), base and cap from `modelLockout`, the exact value
    /// from [`select_lockout_cooldown_ms`], upstream-verified when the hint exceeds the
    /// base. Escalation uses `modelLockout.maxBackoffSteps` (a deviation, see the module
    /// docs). The caller gates it with [`lockout_applies`].
    #[allow(clippy::too_many_arguments)] // the spec's argument list plus the kind's family
    pub fn combo(
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        status: u16,
        hint_ms: u64,
        settings: &ModelLockoutSettings,
        breaker_reset_timeout_ms: u64,
    ) -> Self {
        let reason = match status {
            429 => LockReason::RateLimit,
            403 => LockReason::QuotaExhausted,
            _ => LockReason::Unknown,
        };
        Self {
            provider: provider.to_string(),
            family,
            connection,
            model: model.to_string(),
            reason,
            status,
            fallback_cooldown_ms: Some(settings.base_cooldown_ms),
            profile: LockProfile {
                base_cooldown_ms: Some(settings.base_cooldown_ms),
                max_backoff_steps: Some(settings.max_backoff_steps),
                reset_timeout_ms: breaker_reset_timeout_ms,
            },
            exact_cooldown_ms: Some(select_lockout_cooldown_ms(hint_ms, settings)),
            max_cooldown_ms: settings.max_cooldown_ms,
            scope: None,
            exact_is_upstream_reset: hint_ms > settings.base_cooldown_ms,
        }
    }
}

/// A plain `lockModel` (A §4.3): lock for exactly `cooldown_ms`, no escalation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRecord {
    pub provider: String,
    /// How the provider's kind keys a model's quota.
    pub family: QuotaFamily,
    pub connection: Option<ConnectionId>,
    pub model: String,
    pub reason: LockReason,
    pub cooldown_ms: u64,
    /// `QuotaFamily` = the family key computed with the reason; `Exact` = the exact key.
    pub scope: LockScope,
}

/// What connection state asks the lockout owner to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockoutCommand {
    Record(FailureRecord),
    Lock(LockRecord),
}

/// Whether the combo path records a lockout for this status (A §4.5): `enabled` and the
/// status is one of `error_codes`.
pub fn lockout_applies(settings: &ModelLockoutSettings, status: u16) -> bool {
    settings.enabled && settings.error_codes.contains(&status)
}

/// `selectLockoutCooldownMs`: the hint when it exceeds the base; else 0 with exponential
/// backoff (escalate), else the base (fixed).
pub fn select_lockout_cooldown_ms(hint_ms: u64, settings: &ModelLockoutSettings) -> u64 {
    if hint_ms > settings.base_cooldown_ms {
        hint_ms
    } else if settings.use_exponential_backoff {
        0
    } else {
        settings.base_cooldown_ms
    }
}

// ---------------------------------------------------------------------------------------
// The owner's table

/// One active (or expired, not yet swept) lock. Times are monotonic milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockEntry {
    pub reason: LockReason,
    pub until_ms: u64,
    pub locked_at_ms: u64,
    pub failure_count: u32,
    pub last_failure_at_ms: u64,
    pub reset_after_ms: u64,
    /// `until_ms` is not bounded by a cap: an exact cooldown allowed past
    /// `max_cooldown_ms` (upstream-verified, or no cap given), or a plain [`LockRecord`]
    /// (an explicit duration).
    pub bypassed_max: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FailureState {
    failure_count: u32,
    last_failure_at_ms: u64,
    reset_after_ms: u64,
    last_cooldown_ms: u64,
}

impl FailureState {
    /// Within the escalation window: reset window plus the last cooldown.
    fn continues_at(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_failure_at_ms)
            <= self.reset_after_ms.saturating_add(self.last_cooldown_ms)
    }
}

/// The result of [`LockoutTable::record_failure`] / [`LockoutTable::lock`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub key: LockKey,
    /// The cooldown this failure asked for (the entry may keep a later `until`).
    pub cooldown_ms: u64,
    pub failure_count: u32,
    pub reset_after_ms: u64,
    /// The entry's deadline after the write (monotonic ms).
    pub until_ms: u64,
}

/// The result of [`LockoutTable::decay`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decay {
    /// Some failure state reached zero (its lock was removed with it).
    pub cleared: bool,
    /// The highest failure count left across the key shapes.
    pub new_failure_count: u32,
}

/// What a replica needs of a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockView {
    /// Monotonic ms.
    pub until_ms: u64,
    pub reason: LockReason,
}

/// One change to broadcast: the key's lock is now `lock` (`None` = removed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockUpdate {
    pub key: LockKey,
    pub lock: Option<LockView>,
    /// Strictly increasing per table.
    pub seq: u64,
}

/// `getModelLockoutInfo`: the entry with the latest `until` of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg(test)]
pub struct LockInfo {
    pub reason: LockReason,
    pub remaining_ms: u64,
    /// Wall-clock ms.
    pub locked_at_wall_ms: u64,
    pub failure_count: u32,
}

/// One item of `GET /api/resilience/model-cooldowns` (A §4.8), with the extra fields of
/// `getAllModelLockouts` (`lockedAt`, `until`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockListing {
    pub provider: String,
    pub model: String,
    /// The connection's configured id; empty for combo-level locks.
    pub connection_id: String,
    pub reason: &'static str,
    pub remaining_ms: u64,
    pub failure_count: u32,
    /// RFC 3339.
    pub locked_at: String,
    /// Wall-clock epoch ms.
    pub until: u64,
    #[serde(skip)]
    pub connection: Option<ConnectionId>,
    #[serde(skip)]
    pub scope: LockScope,
}

/// The owner's lockout table. See the module docs.
#[derive(Debug)]
pub struct LockoutTable {
    locks: HashMap<LockKey, LockEntry>,
    failures: HashMap<LockKey, FailureState>,
    seq: u64,
    updates: Vec<LockUpdate>,
    utc_offset_ms: i64,
    /// Hard cap on `locks` and on `failures` (each).
    max_entries: usize,
    /// Entries dropped by the hard cap, since start.
    evictions: u64,
}

impl Default for LockoutTable {
    fn default() -> Self {
        Self::with_max_entries(DEFAULT_MAX_ENTRIES)
    }
}

impl LockoutTable {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// A table that holds at most `max` locks and `max` failure states (at least 1).
    pub fn with_max_entries(max: usize) -> Self {
        Self {
            locks: HashMap::new(),
            failures: HashMap::new(),
            seq: 0,
            updates: Vec::new(),
            utc_offset_ms: 0,
            max_entries: max.max(1),
            evictions: 0,
        }
    }

    /// Changes the hard cap (a reload); the next write enforces it.
    pub fn set_max_entries(&mut self, max: usize) {
        self.max_entries = max.max(1);
    }

    /// How many locks and failure states the table holds (expired ones until swept).
    pub fn sizes(&self) -> (usize, usize) {
        (self.locks.len(), self.failures.len())
    }

    /// Entries the hard cap has dropped since start.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The zone "next midnight" is computed in (ms east of UTC; default 0).
    #[cfg(test)]
    pub fn set_utc_offset_ms(&mut self, offset_ms: i64) {
        self.utc_offset_ms = offset_ms;
    }

    /// Runs a command from connection state.
    pub fn apply(&mut self, cmd: &LockoutCommand, now: Now) -> Option<Recorded> {
        match cmd {
            LockoutCommand::Record(r) => self.record_failure(r, now),
            LockoutCommand::Lock(l) => self.lock(l, now),
        }
    }

    /// `recordModelLockoutFailure` (A §4.4). `None` without a model.
    pub fn record_failure(&mut self, r: &FailureRecord, now: Now) -> Option<Recorded> {
        if r.model.trim().is_empty() {
            return None;
        }
        let now_ms = now.mono_ms();
        let scope = resolve_lockout_scope(r.status, r.scope);
        let key = LockKey::for_scope(
            scope,
            &r.provider,
            r.family,
            r.connection,
            &r.model,
            r.reason,
            Some(r.status),
        );
        self.clean_key(&key, now_ms);

        let exact = r.exact_cooldown_ms.or_else(|| {
            (r.reason == LockReason::QuotaExhausted)
                .then(|| ms_until_next_midnight(now.wall_ms, self.utc_offset_ms))
        });
        let reset_after_ms = if r.profile.reset_timeout_ms > 0 {
            r.profile.reset_timeout_ms
        } else {
            DEFAULT_RESET_AFTER_MS
        };
        let failure_count = match self.failures.get(&key) {
            Some(prev) if prev.continues_at(now_ms) => prev.failure_count.saturating_add(1),
            _ => 1,
        };
        let max = (r.max_cooldown_ms > 0).then_some(r.max_cooldown_ms);
        let (cooldown_ms, bypassed_max) = match exact.filter(|&e| e > 0) {
            Some(e) => match max {
                Some(m) if !r.exact_is_upstream_reset => (e.min(m), false),
                _ => (e, max.is_none_or(|m| e > m)),
            },
            None => {
                let base = match r.fallback_cooldown_ms.filter(|&f| f > 0) {
                    Some(f) => f,
                    None => r.profile.base_cooldown_ms.unwrap_or(if r.status == 429 {
                        DEFAULT_BASE_429_MS
                    } else {
                        DEFAULT_BASE_OTHER_MS
                    }),
                };
                let base = if base == 0 {
                    ZERO_BASE_FALLBACK_MS
                } else {
                    base
                };
                let steps = r
                    .profile
                    .max_backoff_steps
                    .unwrap_or(DEFAULT_MAX_BACKOFF_STEPS);
                let exponent = (failure_count - 1).min(steps);
                let cap = max.unwrap_or(DEFAULT_MAX_COOLDOWN_MS);
                (exponential_ms(base, exponent).min(cap), false)
            }
        };
        self.failures.insert(
            key.clone(),
            FailureState {
                failure_count,
                last_failure_at_ms: now_ms,
                reset_after_ms,
                last_cooldown_ms: cooldown_ms,
            },
        );
        let until_ms = self.write_lock(
            &key,
            r.reason,
            cooldown_ms,
            Some((failure_count, now_ms, reset_after_ms)),
            bypassed_max,
            now_ms,
        );
        self.evict(now_ms);
        Some(Recorded {
            key,
            cooldown_ms,
            failure_count,
            reset_after_ms,
            until_ms,
        })
    }

    /// `lockModel` / its exact variant (A §4.3). `None` without a model.
    pub fn lock(&mut self, l: &LockRecord, now: Now) -> Option<Recorded> {
        if l.model.trim().is_empty() {
            return None;
        }
        let now_ms = now.mono_ms();
        let key = LockKey::for_scope(
            l.scope,
            &l.provider,
            l.family,
            l.connection,
            &l.model,
            l.reason,
            None,
        );
        self.clean_key(&key, now_ms);
        let until_ms = self.write_lock(&key, l.reason, l.cooldown_ms, None, true, now_ms);
        self.evict(now_ms);
        let e = self.locks.get(&key);
        Some(Recorded {
            cooldown_ms: l.cooldown_ms,
            failure_count: e.map_or(1, |e| e.failure_count),
            reset_after_ms: e.map_or(0, |e| e.reset_after_ms),
            until_ms,
            key,
        })
    }

    /// Writes `now + cooldown` unless the key already holds a later deadline, in which
    /// case only a higher failure count (with its metadata) is taken. Returns the deadline.
    fn write_lock(
        &mut self,
        key: &LockKey,
        reason: LockReason,
        cooldown_ms: u64,
        meta: Option<(u32, u64, u64)>,
        bypassed_max: bool,
        now_ms: u64,
    ) -> u64 {
        let until_ms = now_ms.saturating_add(cooldown_ms);
        if let Some(e) = self.locks.get_mut(key)
            && e.until_ms > until_ms
        {
            if let Some((count, at, reset)) = meta
                && count > e.failure_count
            {
                e.failure_count = count;
                e.last_failure_at_ms = at;
                e.reset_after_ms = reset;
            }
            return e.until_ms;
        }
        let existing = self.locks.get(key);
        let entry = LockEntry {
            reason,
            until_ms,
            locked_at_ms: now_ms,
            failure_count: meta
                .map(|m| m.0)
                .or(existing.map(|e| e.failure_count))
                .unwrap_or(1),
            last_failure_at_ms: meta.map_or(now_ms, |m| m.1),
            reset_after_ms: meta
                .map(|m| m.2)
                .or(existing.map(|e| e.reset_after_ms))
                .unwrap_or(0),
            bypassed_max,
        };
        self.locks.insert(key.clone(), entry);
        self.push(key.clone(), Some(LockView { until_ms, reason }));
        until_ms
    }

    /// Drops an expired lock, and a failure state outside its window unless still locked.
    fn clean_key(&mut self, key: &LockKey, now_ms: u64) {
        let locked = match self.locks.get(key) {
            Some(e) if e.until_ms <= now_ms => {
                self.locks.remove(key);
                false
            }
            Some(_) => true,
            None => false,
        };
        if !locked
            && self
                .failures
                .get(key)
                .is_some_and(|f| !f.continues_at(now_ms))
        {
            self.failures.remove(key);
        }
    }

    /// `isModelLocked`: any of the three key shapes holds an unexpired lock.
    #[cfg(test)]
    pub fn is_locked(
        &self,
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        now: Now,
    ) -> bool {
        let now_ms = now.mono_ms();
        LockKey::shapes(provider, family, connection, model)
            .iter()
            .any(|k| self.locks.get(k).is_some_and(|e| e.until_ms > now_ms))
    }

    /// `getModelLockoutInfo`: the live entry with the latest `until`.
    #[cfg(test)]
    pub fn info(
        &self,
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        now: Now,
    ) -> Option<LockInfo> {
        let now_ms = now.mono_ms();
        LockKey::shapes(provider, family, connection, model)
            .iter()
            .filter_map(|k| self.locks.get(k))
            .filter(|e| e.until_ms > now_ms)
            .max_by_key(|e| e.until_ms)
            .map(|e| LockInfo {
                reason: e.reason,
                remaining_ms: e.until_ms - now_ms,
                locked_at_wall_ms: to_wall(e.locked_at_ms, now),
                failure_count: e.failure_count,
            })
    }

    /// The raw entry of one key (tests, diagnostics).
    #[cfg(test)]
    pub fn entry(&self, key: &LockKey) -> Option<&LockEntry> {
        self.locks.get(key)
    }

    /// The failure count stored for one key (0 = none).
    #[cfg(test)]
    pub fn failure_count(&self, key: &LockKey) -> u32 {
        self.failures.get(key).map_or(0, |f| f.failure_count)
    }

    /// `decayModelFailureCount` on a success (A §4.6), across the three key shapes: each
    /// failure count is halved (floor); one that reaches zero is deleted **with its lock**
    /// (guide intent; see the module docs).
    pub fn decay(
        &mut self,
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        _now: Now,
    ) -> Decay {
        let mut out = Decay {
            cleared: false,
            new_failure_count: 0,
        };
        if model.trim().is_empty() {
            return out;
        }
        for key in LockKey::shapes(provider, family, connection, model) {
            let Some(f) = self.failures.get_mut(&key) else {
                continue;
            };
            f.failure_count /= 2;
            if f.failure_count == 0 {
                self.failures.remove(&key);
                out.cleared = true;
                if self.locks.remove(&key).is_some() {
                    self.push(key, None);
                }
            } else {
                out.new_failure_count = out.new_failure_count.max(f.failure_count);
            }
        }
        out
    }

    /// `clearModelLock`: deletes lock and failure state under all three shapes (a direct
    /// success for that model on that connection). True if anything was deleted.
    pub fn clear(
        &mut self,
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
    ) -> bool {
        let mut any = false;
        for key in LockKey::shapes(provider, family, connection, model) {
            any |= self.remove_key(&key);
        }
        any
    }

    /// `DELETE /api/resilience/model-cooldowns {provider, model}`: every listed lock whose
    /// provider and model part equal the strings exactly, across all connections.
    pub fn clear_listed(&mut self, provider: &str, model: &str) -> bool {
        let keys: Vec<LockKey> = self
            .locks
            .keys()
            .filter(|k| k.provider == provider && k.model_part() == model)
            .cloned()
            .collect();
        let mut any = false;
        for k in keys {
            any |= self.remove_key(&k);
        }
        any
    }

    /// Every lock and failure count of the connections `keep` refuses (a reload removed
    /// them); each removed lock is announced like a cleared one. Returns how many locks.
    pub fn retain_connections(&mut self, mut keep: impl FnMut(ConnectionId) -> bool) -> usize {
        let mut gone: Vec<ConnectionId> = self
            .locks
            .keys()
            .chain(self.failures.keys())
            .filter_map(|k| k.connection)
            .filter(|c| !keep(*c))
            .collect();
        gone.sort_unstable();
        gone.dedup();
        gone.into_iter().map(|c| self.clear_connection(c)).sum()
    }

    /// Every lock of one connection (`POST /api/resilience/cooldowns`). Returns the number
    /// of lock entries removed.
    pub fn clear_connection(&mut self, connection: ConnectionId) -> usize {
        let keys: Vec<LockKey> = self
            .locks
            .keys()
            .chain(self.failures.keys())
            .filter(|k| k.connection == Some(connection))
            .cloned()
            .collect();
        let mut removed = 0;
        for k in keys {
            self.failures.remove(&k);
            if self.locks.remove(&k).is_some() {
                removed += 1;
                self.push(k, None);
            }
        }
        removed
    }

    /// `clearAllModelLockouts` (also `POST /api/resilience/reset`). Returns the number of
    /// lock entries removed.
    pub fn clear_all(&mut self) -> usize {
        let keys: Vec<LockKey> = self.locks.keys().cloned().collect();
        let n = keys.len();
        self.locks.clear();
        self.failures.clear();
        for k in keys {
            self.push(k, None);
        }
        n
    }

    fn remove_key(&mut self, key: &LockKey) -> bool {
        let had_failure = self.failures.remove(key).is_some();
        let had_lock = self.locks.remove(key).is_some();
        if had_lock {
            self.push(key.clone(), None);
        }
        had_failure || had_lock
    }

    /// `getAllModelLockouts` / the listing (A §4.8): live locks, sorted by remaining time,
    /// longest first. `connection_name` maps a connection to its configured id.
    pub fn list(
        &self,
        now: Now,
        connection_name: impl Fn(ConnectionId) -> String,
    ) -> Vec<LockListing> {
        let now_ms = now.mono_ms();
        let mut items: Vec<LockListing> = self
            .locks
            .iter()
            .filter(|(_, e)| e.until_ms > now_ms)
            .map(|(k, e)| LockListing {
                provider: k.provider.clone(),
                model: k.model_part().to_string(),
                connection_id: k.connection.map(&connection_name).unwrap_or_default(),
                reason: e.reason.as_str(),
                remaining_ms: e.until_ms - now_ms,
                failure_count: e.failure_count,
                locked_at: format_rfc3339_ms(to_wall(e.locked_at_ms, now)),
                until: to_wall(e.until_ms, now),
                connection: k.connection,
                scope: k.scope(),
            })
            .collect();
        items.sort_by(|a, b| {
            b.remaining_ms
                .cmp(&a.remaining_ms)
                .then_with(|| a.provider.cmp(&b.provider))
                .then_with(|| a.model.cmp(&b.model))
                .then_with(|| a.connection_id.cmp(&b.connection_id))
        });
        items
    }

    /// The periodic cleanup (every [`SWEEP_INTERVAL_MS`] or more often): expired locks and
    /// failure states outside their window without a lock. Expiry needs no broadcast:
    /// replicas compare deadlines themselves. Returns the keys whose lock expired (for the
    /// transition log). Linear in the table, which the hard cap bounds.
    pub fn sweep(&mut self, now: Now) -> Vec<LockKey> {
        let now_ms = now.mono_ms();
        let mut expired = Vec::new();
        self.locks.retain(|k, e| {
            let live = e.until_ms > now_ms;
            if !live {
                expired.push(k.clone());
            }
            live
        });
        let locks = &self.locks;
        self.failures
            .retain(|k, f| f.continues_at(now_ms) || locks.contains_key(k));
        expired
    }

    fn evict(&mut self, now_ms: u64) {
        if self.locks.len() > MAX_LOCK_ENTRIES {
            self.locks.retain(|_, e| e.until_ms > now_ms);
        }
        if self.failures.len() > MAX_FAILURE_STATES {
            let mut unlocked: Vec<(u64, LockKey)> = self
                .failures
                .iter()
                .filter(|(k, _)| !self.locks.contains_key(*k))
                .map(|(k, f)| (f.last_failure_at_ms, k.clone()))
                .collect();
            unlocked.sort_by_key(|(at, _)| *at);
            let excess = self.failures.len() - MAX_FAILURE_STATES;
            for (_, k) in unlocked.into_iter().take(excess) {
                self.failures.remove(&k);
            }
        }
        self.enforce_cap(now_ms);
    }

    /// The hard cap: past `max_entries` locks (or failure states), drops the entries
    /// written longest ago — expired locks first, then live ones — down to 7/8 of the cap,
    /// so a flood pays the sort once per `max/8` inserts. A dropped key loses its lock and
    /// its failure state together; replicas hear of a dropped lock.
    fn enforce_cap(&mut self, now_ms: u64) {
        let max = self.max_entries;
        if self.locks.len() <= max && self.failures.len() <= max {
            return;
        }
        let target = (max - max / 8).max(1);
        let mut victims: Vec<(bool, u64, LockKey)> = Vec::new();
        if self.locks.len() > max {
            let mut by_age: Vec<(bool, u64, LockKey)> = self
                .locks
                .iter()
                .map(|(k, e)| (e.until_ms > now_ms, e.locked_at_ms, k.clone()))
                .collect();
            by_age.sort_unstable_by_key(|a| (a.0, a.1));
            let excess = self.locks.len() - target;
            victims.extend(by_age.into_iter().take(excess));
        }
        for (_, _, k) in victims.drain(..) {
            self.evictions += 1;
            self.failures.remove(&k);
            if self.locks.remove(&k).is_some() {
                self.push(k, None);
            }
        }
        if self.failures.len() > max {
            let mut by_age: Vec<(u64, LockKey)> = self
                .failures
                .iter()
                .map(|(k, f)| (f.last_failure_at_ms, k.clone()))
                .collect();
            by_age.sort_unstable_by_key(|(at, _)| *at);
            let excess = self.failures.len() - target;
            for (_, k) in by_age.into_iter().take(excess) {
                self.evictions += 1;
                self.failures.remove(&k);
                if self.locks.remove(&k).is_some() {
                    self.push(k, None);
                }
            }
        }
    }

    /// Number of lock entries held (expired ones included until swept).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.locks.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    fn push(&mut self, key: LockKey, lock: Option<LockView>) {
        self.seq += 1;
        self.updates.push(LockUpdate {
            key,
            lock,
            seq: self.seq,
        });
    }

    /// The updates queued since the last drain, oldest first.
    pub fn drain_updates(&mut self) -> Vec<LockUpdate> {
        std::mem::take(&mut self.updates)
    }
}

/// A monotonic ms instant as wall-clock ms, relative to `now`.
fn to_wall(mono_ms: u64, now: Now) -> u64 {
    let now_mono = now.mono_ms();
    if mono_ms >= now_mono {
        now.wall_ms.saturating_add(mono_ms - now_mono)
    } else {
        now.wall_ms.saturating_sub(now_mono - mono_ms)
    }
}

// ---------------------------------------------------------------------------------------
// The replica

/// A shard's read-only copy of the lockouts of every owner, fed by [`LockUpdate`]s.
#[derive(Debug, Default)]
pub struct LockoutViews {
    entries: HashMap<LockKey, (u64, Option<LockView>)>,
    /// Per connection, the latest `until` any lock of it was given: a lookup whose
    /// connection has nothing here (or only past deadlines) is answered without building
    /// keys. Conservative: clearing a lock early does not lower it (the full lookup then
    /// answers); `sweep` recomputes it.
    horizon: Horizon,
    /// Connections that ever had a lock (never reset): successes on them are reported so
    /// the owner can decay failure counts that outlive the locks.
    ever: Vec<bool>,
}

/// Latest lock deadline per connection (dense ids) and for connection-less locks.
#[derive(Clone, Debug, Default)]
struct Horizon {
    by_connection: Vec<u64>,
    unbound: u64,
}

impl Horizon {
    fn get(&self, c: Option<ConnectionId>) -> u64 {
        match c {
            Some(c) => self.by_connection.get(c.0 as usize).copied().unwrap_or(0),
            None => self.unbound,
        }
    }

    fn extend(&mut self, c: Option<ConnectionId>, until_ms: u64) {
        let slot = match c {
            Some(c) => {
                let i = c.0 as usize;
                if self.by_connection.len() <= i {
                    self.by_connection.resize(i + 1, 0);
                }
                &mut self.by_connection[i]
            }
            None => &mut self.unbound,
        };
        *slot = (*slot).max(until_ms);
    }
}

impl LockoutViews {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one update; older or equal `seq` for the key is ignored (duplicates and
    /// reordering are harmless). Returns whether it changed anything.
    pub fn apply(&mut self, u: &LockUpdate) -> bool {
        match self.entries.get_mut(&u.key) {
            Some((seq, _)) if *seq >= u.seq => false,
            Some(slot) => {
                *slot = (u.seq, u.lock);
                self.extend_horizon(u);
                true
            }
            None => {
                self.entries.insert(u.key.clone(), (u.seq, u.lock));
                self.extend_horizon(u);
                true
            }
        }
    }

    fn extend_horizon(&mut self, u: &LockUpdate) {
        if let Some(l) = u.lock {
            self.horizon.extend(u.key.connection, l.until_ms);
            if let Some(c) = u.key.connection {
                let i = c.0 as usize;
                if self.ever.len() <= i {
                    self.ever.resize(i + 1, false);
                }
                self.ever[i] = true;
            }
        }
    }

    /// The live lock of a model with the latest deadline, if any.
    pub fn lock_of(
        &self,
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        now: Now,
    ) -> Option<LockView> {
        let now_ms = now.mono_ms();
        if self.horizon.get(connection) <= now_ms {
            return None;
        }
        // The keys of `LockKey::shapes`, probed with borrowed parts. The family model as
        // `LockKey::family` makes it for a lookup (no reason, no status).
        let family_model: Cow<'_, str> = match family {
            QuotaFamily::Codex => Cow::Borrowed(codex_scope(model)),
            QuotaFamily::Antigravity => Cow::Owned(antigravity_family(model)),
            QuotaFamily::Model => Cow::Borrowed(model),
        };
        let probe = |exact, model| Probe {
            provider,
            connection,
            exact,
            model,
        };
        // Family, not-found (the raw model: the family key again for most providers, which
        // finds the same lock), exact; the latest deadline wins, the later key on a tie.
        let mut best: Option<LockView> = None;
        for p in [
            probe(false, &family_model),
            probe(false, model),
            probe(true, model.trim()),
        ] {
            if let Some((_, Some(l))) = self.entries.get(&p as &dyn KeyParts)
                && l.until_ms > now_ms
                && best.is_none_or(|b| l.until_ms >= b.until_ms)
            {
                best = Some(*l);
            }
        }
        best
    }

    #[cfg(test)]
    pub fn is_locked(
        &self,
        provider: &str,
        family: QuotaFamily,
        connection: Option<ConnectionId>,
        model: &str,
        now: Now,
    ) -> bool {
        self.lock_of(provider, family, connection, model, now)
            .is_some()
    }

    /// How many locks are live at `now` (the `/metrics` gauge).
    pub fn live(&self, now: Now) -> usize {
        let now_ms = now.mono_ms();
        self.entries
            .values()
            .filter(|(_, l)| l.is_some_and(|l| l.until_ms > now_ms))
            .count()
    }

    /// Whether any lock was ever seen for `connection` (so a success on it may have
    /// failure counts to decay).
    pub fn ever_locked(&self, connection: ConnectionId) -> bool {
        self.ever
            .get(connection.0 as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Drops expired locks and removal markers. Call it no more often than updates can be
    /// delayed in the mesh (e.g. every [`SWEEP_INTERVAL_MS`]): after a marker is gone a
    /// late duplicate of an older update could be applied again until it expires.
    pub fn sweep(&mut self, now: Now) {
        let now_ms = now.mono_ms();
        self.entries
            .retain(|_, (_, l)| l.is_some_and(|l| l.until_ms > now_ms));
        self.horizon = Horizon::default();
        for (k, (_, l)) in &self.entries {
            if let Some(l) = l {
                self.horizon.extend(k.connection, l.until_ms);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::config::resilience::MINUTE_MS;
    use proptest::prelude::*;

    const C1: Option<ConnectionId> = Some(ConnectionId(1));
    const C2: Option<ConnectionId> = Some(ConnectionId(2));

    proptest! {
        /// A lookup with borrowed probes finds what a lookup with the built keys of
        /// `LockKey::shapes` found (the latest live lock, the later shape on a tie).
        #[test]
        fn borrowed_lookups_find_what_built_keys_found(
            locks in proptest::collection::vec((
                0usize..3, 0usize..3, 0usize..6, any::<bool>(), 1u64..4, any::<bool>(),
            ), 0..12),
            looks in proptest::collection::vec((0usize..3, 0usize..3, 0usize..6), 1..8),
        ) {
            const PROVIDERS: [&str; 3] = ["openai", "codex", "antigravity"];
            const MODELS: [&str; 6] =
                ["gpt-4o", "GPT-4o ", "gpt-5-codex-spark", "gemini-2.5-pro", "Claude-Sonnet", "agy/claude-x"];
            let conn = |i: usize| [None, C1, C2][i];
            let mut views = LockoutViews::default();
            for (seq, (p, c, m, exact, until, reason)) in locks.into_iter().enumerate() {
                let provider = PROVIDERS[p];
                let key = if exact {
                    LockKey::exact(provider, conn(c), MODELS[m])
                } else {
                    LockKey::family(provider, fam(provider), conn(c), MODELS[m], None, None)
                };
                let reason = if reason { LockReason::RateLimited } else { LockReason::ServerError };
                views.apply(&LockUpdate {
                    key,
                    lock: Some(LockView { until_ms: until * 1_000, reason }),
                    seq: seq as u64 + 1,
                });
            }
            for at_ms in [0u64, 1_500, 2_500, 9_000] {
                let now = Now { mono_ns: at_ms * 1_000_000, wall_ms: 0 };
                for &(p, c, m) in &looks {
                    let provider = PROVIDERS[p];
                    let want = LockKey::shapes(provider, fam(provider), conn(c), MODELS[m])
                        .iter()
                        .filter_map(|k| views.entries.get(k).and_then(|(_, l)| *l))
                        .filter(|l| l.until_ms > now.mono_ms())
                        .max_by_key(|l| l.until_ms);
                    prop_assert_eq!(
                        views.lock_of(provider, fam(provider), conn(c), MODELS[m], now),
                        want
                    );
                }
            }
        }
    }

    fn clock() -> ManualClock {
        // 2026-01-15T12:00:00Z
        ManualClock::new(1_768_478_400_000)
    }

    fn profile() -> LockProfile {
        LockProfile {
            base_cooldown_ms: Some(3_000),
            max_backoff_steps: Some(5),
            reset_timeout_ms: 30_000,
        }
    }

    /// The quota family a provider of that kind name has.
    fn fam(provider: &str) -> QuotaFamily {
        crate::config::kinds::ProviderKind::default_for_id(provider)
            .quirks()
            .quota_family
    }

    fn rec(provider: &str, model: &str, status: u16, reason: LockReason) -> FailureRecord {
        FailureRecord {
            provider: provider.into(),
            family: fam(provider),
            connection: C1,
            model: model.into(),
            reason,
            status,
            fallback_cooldown_ms: None,
            profile: profile(),
            exact_cooldown_ms: None,
            max_cooldown_ms: 1_800_000,
            scope: None,
            exact_is_upstream_reset: false,
        }
    }

    #[test]
    fn the_hard_cap_drops_the_oldest_entries_live_locks_included_and_counts_them() {
        let c = clock();
        let mut t = LockoutTable::with_max_entries(16);
        for i in 0..40 {
            let model = format!("m-{i}");
            t.record_failure(&rec("local", &model, 404, LockReason::NotFound), c.now())
                .expect("recorded");
            c.advance_ms(1);
            let (locks, failures) = t.sizes();
            assert!(
                locks <= 16 && failures <= 16,
                "{locks} {failures} after {i}"
            );
        }
        assert!(t.evictions() >= 24, "{}", t.evictions());
        // The newest survive; the oldest went, each with a removal update for replicas.
        assert!(t.is_locked("local", fam("local"), C1, "m-39", c.now()));
        assert!(!t.is_locked("local", fam("local"), C1, "m-0", c.now()));
        let removed = t
            .drain_updates()
            .iter()
            .filter(|u| u.lock.is_none())
            .count();
        assert_eq!(removed as u64, t.evictions());
    }

    #[test]
    fn sweep_reports_the_locks_that_expired() {
        let c = clock();
        let mut t = LockoutTable::new();
        t.record_failure(&rec("local", "a", 404, LockReason::NotFound), c.now())
            .expect("recorded");
        assert!(t.sweep(c.now()).is_empty());
        c.advance_ms(10 * MINUTE_MS);
        assert_eq!(t.sweep(c.now()).len(), 1);
        assert_eq!(t.sizes().0, 0);
    }

    #[test]
    fn scope_by_status() {
        for s in [402, 403, 404, 429] {
            assert_eq!(
                resolve_lockout_scope(s, None),
                LockScope::QuotaFamily,
                "{s}"
            );
        }
        for s in [400, 500, 502, 503, 504, 520] {
            assert_eq!(resolve_lockout_scope(s, None), LockScope::Exact, "{s}");
        }
        assert_eq!(
            resolve_lockout_scope(429, Some(LockScope::Exact)),
            LockScope::Exact
        );
        assert_eq!(
            resolve_lockout_scope(502, Some(LockScope::QuotaFamily)),
            LockScope::QuotaFamily
        );
    }

    #[test]
    fn keys_codex_antigravity_and_not_found() {
        assert_eq!(codex_scope("gpt-5.3-codex-spark"), "spark");
        assert_eq!(codex_scope("Bengalfox-1"), "spark");
        assert_eq!(codex_scope("gpt-5.6-luna"), "codex");
        assert_eq!(codex_scope("o3"), "codex");
        assert_eq!(
            antigravity_family("antigravity/gemini-3-pro"),
            "family:gemini"
        );
        assert_eq!(antigravity_family("claude-sonnet-4-5"), "family:claude");
        assert_eq!(
            antigravity_family("agy/models/claude-opus"),
            "family:claude"
        );
        assert_eq!(antigravity_family("gpt-oss-120b"), "gpt-oss-120b");

        let k = LockKey::family(
            "codex",
            QuotaFamily::Codex,
            C1,
            "gpt-5.6-luna",
            Some(LockReason::RateLimit),
            Some(429),
        );
        assert_eq!(k.to_string(), "codex:1:codex");
        let k = LockKey::family(
            "codex",
            QuotaFamily::Codex,
            C1,
            "gpt-5.6-luna",
            None,
            Some(404),
        );
        assert_eq!(k.to_string(), "codex:1:gpt-5.6-luna");
        let k = LockKey::exact("openai", None, "  GPT-4o ");
        assert_eq!(k.to_string(), "openai::exact:gpt-4o");
        // Plain providers: family and not-found keys coincide, so two shapes.
        assert_eq!(
            LockKey::shapes("openai", QuotaFamily::Model, C1, "gpt-4o").len(),
            2
        );
        assert_eq!(
            LockKey::shapes("codex", QuotaFamily::Codex, C1, "gpt-5").len(),
            3
        );
    }

    #[test]
    fn escalation_doubles_within_the_window_and_restarts_after_it() {
        let c = clock();
        let mut t = LockoutTable::new();
        let r = rec("openai", "gpt-4o", 503, LockReason::ServerError);
        let mut got = Vec::new();
        for _ in 0..7 {
            let out = t.record_failure(&r, c.now()).unwrap();
            got.push((out.cooldown_ms, out.failure_count));
            c.advance_ms(out.cooldown_ms); // fail again right at expiry
        }
        assert_eq!(
            got,
            vec![
                (3_000, 1),
                (6_000, 2),
                (12_000, 3),
                (24_000, 4),
                (48_000, 5),
                (96_000, 6),
                (96_000, 7) // 5 steps
            ]
        );
        // Window = reset 30 s + last cooldown 96 s; beyond it the count restarts.
        c.advance_ms(30_000 + 96_000 + 1);
        let out = t.record_failure(&r, c.now()).unwrap();
        assert_eq!((out.cooldown_ms, out.failure_count), (3_000, 1));
        assert_eq!(out.key.scope(), LockScope::Exact);
    }

    #[test]
    fn cap_and_base_rules() {
        let c = clock();
        let mut t = LockoutTable::new();
        let mut r = rec("openai", "m", 503, LockReason::ServerError);
        r.max_cooldown_ms = 10_000;
        r.fallback_cooldown_ms = Some(7_000);
        let a = t.record_failure(&r, c.now()).unwrap();
        let b = t.record_failure(&r, c.now()).unwrap();
        assert_eq!((a.cooldown_ms, b.cooldown_ms), (7_000, 10_000));

        // No fallback, no profile base: 1 s for 429, 5 s otherwise; no max → 120 s cap.
        let mut t = LockoutTable::new();
        let mut r = rec("openai", "m", 429, LockReason::RateLimit);
        r.profile.base_cooldown_ms = None;
        r.profile.max_backoff_steps = None;
        r.max_cooldown_ms = 0;
        assert_eq!(t.record_failure(&r, c.now()).unwrap().cooldown_ms, 1_000);
        let mut r5 = r.clone();
        r5.status = 500;
        r5.model = "other".into();
        assert_eq!(t.record_failure(&r5, c.now()).unwrap().cooldown_ms, 5_000);
        for _ in 0..10 {
            t.record_failure(&r, c.now());
        }
        assert_eq!(t.record_failure(&r, c.now()).unwrap().cooldown_ms, 120_000);
        // A zero base escalates from 1 s.
        let mut t = LockoutTable::new();
        let mut r0 = rec("openai", "m", 503, LockReason::ServerError);
        r0.profile.base_cooldown_ms = Some(0);
        assert_eq!(t.record_failure(&r0, c.now()).unwrap().cooldown_ms, 1_000);
        // No reset timeout: 30 min window.
        r0.profile.reset_timeout_ms = 0;
        assert_eq!(
            t.record_failure(&r0, c.now()).unwrap().reset_after_ms,
            DEFAULT_RESET_AFTER_MS
        );
    }

    #[test]
    fn exact_cooldowns_cap_unless_upstream_verified() {
        let c = clock();
        let mut t = LockoutTable::new();
        let mut r = rec("openai", "m", 429, LockReason::RateLimited);
        r.exact_cooldown_ms = Some(2 * 3_600_000);
        let a = t.record_failure(&r, c.now()).unwrap();
        assert_eq!(a.cooldown_ms, 1_800_000);
        assert!(!t.entry(&a.key).unwrap().bypassed_max);

        let mut t = LockoutTable::new();
        r.exact_is_upstream_reset = true;
        let b = t.record_failure(&r, c.now()).unwrap();
        assert_eq!(b.cooldown_ms, 2 * 3_600_000);
        assert!(t.entry(&b.key).unwrap().bypassed_max);

        // No max at all: exact unchanged.
        let mut t = LockoutTable::new();
        r.exact_is_upstream_reset = false;
        r.max_cooldown_ms = 0;
        assert_eq!(
            t.record_failure(&r, c.now()).unwrap().cooldown_ms,
            2 * 3_600_000
        );
    }

    #[test]
    fn quota_exhausted_without_exact_locks_until_midnight() {
        let c = clock(); // 12:00Z
        let mut t = LockoutTable::new();
        let mut r = rec("gemini", "gemini-2.5-pro", 429, LockReason::QuotaExhausted);
        r.max_cooldown_ms = 0;
        assert_eq!(
            t.record_failure(&r, c.now()).unwrap().cooldown_ms,
            12 * 3_600_000
        );
        // With the default cap it is capped to 30 min (not upstream-verified).
        let mut t = LockoutTable::new();
        r.max_cooldown_ms = 1_800_000;
        assert_eq!(
            t.record_failure(&r, c.now()).unwrap().cooldown_ms,
            1_800_000
        );
        // The zone moves midnight.
        let mut t = LockoutTable::new();
        t.set_utc_offset_ms(2 * 3_600_000);
        r.max_cooldown_ms = 0;
        assert_eq!(
            t.record_failure(&r, c.now()).unwrap().cooldown_ms,
            10 * 3_600_000
        );
        // exact 0 suppresses midnight and escalates instead (combo path).
        let mut t = LockoutTable::new();
        r.exact_cooldown_ms = Some(0);
        assert_eq!(t.record_failure(&r, c.now()).unwrap().cooldown_ms, 3_000);
    }

    #[test]
    fn lock_keeps_a_later_deadline_and_raises_the_count() {
        let c = clock();
        let mut t = LockoutTable::new();
        let long = LockRecord {
            family: QuotaFamily::Model,
            provider: "openai".into(),
            connection: C1,
            model: "m".into(),
            reason: LockReason::QuotaExhausted,
            cooldown_ms: 600_000,
            scope: LockScope::QuotaFamily,
        };
        let a = t.lock(&long, c.now()).unwrap();
        let r = rec("openai", "m", 429, LockReason::RateLimited);
        let b = t.record_failure(&r, c.now()).unwrap();
        assert_eq!(b.cooldown_ms, 3_000);
        assert_eq!(b.until_ms, a.until_ms, "later deadline kept");
        let e = t.entry(&b.key).unwrap();
        assert_eq!((e.reason, e.failure_count), (LockReason::QuotaExhausted, 1));
        t.record_failure(&r, c.now());
        assert_eq!(t.entry(&b.key).unwrap().failure_count, 2);
        // A plain lock of 0 ms is already expired.
        let mut t = LockoutTable::new();
        let zero = LockRecord {
            cooldown_ms: 0,
            ..long.clone()
        };
        t.lock(&zero, c.now());
        assert!(!t.is_locked("openai", QuotaFamily::Model, C1, "m", c.now()));
        // No model: no-op.
        let none = LockRecord {
            model: " ".into(),
            ..long
        };
        assert_eq!(t.lock(&none, c.now()), None);
    }

    #[test]
    fn family_lock_covers_sibling_models_exact_does_not() {
        let c = clock();
        let mut t = LockoutTable::new();
        t.record_failure(
            &rec("codex", "gpt-5.6-luna", 429, LockReason::RateLimited),
            c.now(),
        );
        assert!(t.is_locked("codex", QuotaFamily::Codex, C1, "gpt-5.3-codex", c.now()));
        assert!(!t.is_locked(
            "codex",
            QuotaFamily::Codex,
            C1,
            "gpt-5.3-codex-spark",
            c.now()
        ));
        assert!(!t.is_locked("codex", QuotaFamily::Codex, C2, "gpt-5.3-codex", c.now()));

        let mut t = LockoutTable::new();
        t.record_failure(
            &rec("codex", "gpt-5.6-luna", 502, LockReason::ServerError),
            c.now(),
        );
        assert!(t.is_locked("codex", QuotaFamily::Codex, C1, "GPT-5.6-Luna", c.now()));
        assert!(!t.is_locked("codex", QuotaFamily::Codex, C1, "gpt-5.3-codex", c.now()));

        let mut t = LockoutTable::new();
        let out = t
            .record_failure(
                &rec("codex", "gpt-5.6-luna", 404, LockReason::NotFound),
                c.now(),
            )
            .unwrap();
        assert_eq!(out.key.model_part(), "gpt-5.6-luna");
        assert!(!t.is_locked("codex", QuotaFamily::Codex, C1, "gpt-5.3-codex", c.now()));
    }

    #[test]
    fn expiry_info_and_listing() {
        let c = clock();
        let mut t = LockoutTable::new();
        t.record_failure(&rec("openai", "a", 503, LockReason::ServerError), c.now());
        let mut r = rec("antigravity", "gemini-3-pro", 429, LockReason::RateLimited);
        r.exact_cooldown_ms = Some(60_000);
        t.record_failure(&r, c.now());
        c.advance_ms(1_000);
        let info = t
            .info("openai", QuotaFamily::Model, C1, "a", c.now())
            .unwrap();
        assert_eq!(info.remaining_ms, 2_000);
        assert_eq!(info.locked_at_wall_ms, 1_768_478_400_000);

        let items = t.list(c.now(), |id| format!("conn-{}", id.0));
        let json = serde_json::to_value(&items).unwrap();
        assert_eq!(
            json[0],
            serde_json::json!({
                "provider": "antigravity", "model": "family:gemini", "connectionId": "conn-1",
                "reason": "rate_limited", "remainingMs": 59000, "failureCount": 1,
                "lockedAt": "2026-01-15T12:00:00.000Z", "until": 1_768_478_460_000u64
            })
        );
        assert_eq!(json[1]["model"], "a");
        assert_eq!(json[1]["reason"], "server_error");

        c.advance_ms(2_000);
        assert!(!t.is_locked("openai", QuotaFamily::Model, C1, "a", c.now()));
        assert_eq!(t.list(c.now(), |_| String::new()).len(), 1);
        t.sweep(c.now());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn success_decay_halves_and_drops_the_lock_at_zero() {
        let c = clock();
        let mut t = LockoutTable::new();
        let r = rec("openai", "m", 503, LockReason::ServerError);
        for _ in 0..5 {
            t.record_failure(&r, c.now());
        }
        let key = LockKey::exact("openai", C1, "m");
        assert_eq!(t.failure_count(&key), 5);
        let d = t.decay("openai", QuotaFamily::Model, C1, "m", c.now());
        assert_eq!(
            d,
            Decay {
                cleared: false,
                new_failure_count: 2
            }
        );
        assert!(
            t.is_locked("openai", QuotaFamily::Model, C1, "m", c.now()),
            "lock stays while count > 0"
        );
        assert_eq!(
            t.decay("openai", QuotaFamily::Model, C1, "m", c.now())
                .new_failure_count,
            1
        );
        let d = t.decay("openai", QuotaFamily::Model, C1, "m", c.now());
        assert_eq!(
            d,
            Decay {
                cleared: true,
                new_failure_count: 0
            }
        );
        assert!(!t.is_locked("openai", QuotaFamily::Model, C1, "m", c.now()));
        assert_eq!(
            t.decay("openai", QuotaFamily::Model, C1, "m", c.now()),
            Decay {
                cleared: false,
                new_failure_count: 0
            }
        );
        // After decay the ladder restarts lower.
        let out = t.record_failure(&r, c.now()).unwrap();
        assert_eq!(out.failure_count, 1);
    }

    #[test]
    fn clear_one_listed_connection_and_all() {
        let c = clock();
        let mut t = LockoutTable::new();
        let mut r = rec("openai", "m", 429, LockReason::RateLimited);
        t.record_failure(&r, c.now());
        r.connection = C2;
        t.record_failure(&r, c.now());
        r.model = "n".into();
        t.record_failure(&r, c.now());
        assert!(t.clear("openai", QuotaFamily::Model, C1, "m"));
        assert!(!t.clear("openai", QuotaFamily::Model, C1, "m"));
        assert!(t.is_locked("openai", QuotaFamily::Model, C2, "m", c.now()));

        r.connection = C1;
        t.record_failure(&r, c.now()); // openai/1/n
        assert!(t.clear_listed("openai", "n"));
        assert!(!t.is_locked("openai", QuotaFamily::Model, C1, "n", c.now()));
        assert!(!t.is_locked("openai", QuotaFamily::Model, C2, "n", c.now()));
        assert!(!t.clear_listed("openai", "n"));

        t.record_failure(&r, c.now());
        assert_eq!(t.clear_connection(ConnectionId(2)), 1);
        assert_eq!(t.clear_all(), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn combo_records_follow_settings() {
        let c = clock();
        let s = ModelLockoutSettings::default();
        assert!(!lockout_applies(&s, 429), "off by default");
        let on = ModelLockoutSettings {
            enabled: true,
            ..s.clone()
        };
        assert!(lockout_applies(&on, 429) && !lockout_applies(&on, 500));
        assert_eq!(select_lockout_cooldown_ms(300_000, &s), 300_000);
        assert_eq!(select_lockout_cooldown_ms(60_000, &s), 0);
        let fixed = ModelLockoutSettings {
            use_exponential_backoff: false,
            ..s.clone()
        };
        assert_eq!(select_lockout_cooldown_ms(60_000, &fixed), 120_000);

        let mut t = LockoutTable::new();
        let r = FailureRecord::combo("openai", QuotaFamily::Model, None, "m", 403, 0, &s, 30_000);
        assert_eq!(r.reason, LockReason::QuotaExhausted);
        // exact = 0 → exponential from 120 s, not midnight.
        let got: Vec<u64> = (0..6)
            .map(|_| t.record_failure(&r, c.now()).unwrap().cooldown_ms / 1_000)
            .collect();
        assert_eq!(got, vec![120, 240, 480, 960, 1_800, 1_800]);
        // A long hint is upstream-verified and exceeds the cap.
        let mut t = LockoutTable::new();
        let r = FailureRecord::combo(
            "openai",
            QuotaFamily::Model,
            None,
            "m",
            429,
            2 * 3_600_000,
            &s,
            30_000,
        );
        assert_eq!(r.reason, LockReason::RateLimit);
        assert_eq!(
            t.record_failure(&r, c.now()).unwrap().cooldown_ms,
            2 * 3_600_000
        );
        // Fixed backoff: always the base.
        let mut t = LockoutTable::new();
        let r = FailureRecord::combo(
            "openai",
            QuotaFamily::Model,
            None,
            "m",
            502,
            0,
            &fixed,
            30_000,
        );
        for _ in 0..3 {
            assert_eq!(t.record_failure(&r, c.now()).unwrap().cooldown_ms, 120_000);
        }
        // modelLockout.maxBackoffSteps bounds the exponent.
        let steps1 = ModelLockoutSettings {
            max_backoff_steps: 1,
            max_cooldown_ms: 3_600_000,
            ..s
        };
        let mut t = LockoutTable::new();
        let r = FailureRecord::combo(
            "openai",
            QuotaFamily::Model,
            None,
            "m",
            503,
            0,
            &steps1,
            30_000,
        );
        let got: Vec<u64> = (0..3)
            .map(|_| t.record_failure(&r, c.now()).unwrap().cooldown_ms / MINUTE_MS)
            .collect();
        assert_eq!(got, vec![2, 4, 4]);
    }

    #[test]
    fn updates_feed_replicas_idempotently() {
        let c = clock();
        let mut t = LockoutTable::new();
        let mut v = LockoutViews::new();
        let r = rec("openai", "m", 503, LockReason::ServerError);
        t.record_failure(&r, c.now());
        t.record_failure(&r, c.now());
        let ups = t.drain_updates();
        assert_eq!(ups.len(), 2);
        assert!(ups[0].seq < ups[1].seq);
        for u in &ups {
            v.apply(u);
        }
        // Duplicates and stale updates change nothing.
        assert!(!v.apply(&ups[1]));
        assert!(!v.apply(&ups[0]));
        let l = v
            .lock_of("openai", QuotaFamily::Model, C1, "m", c.now())
            .unwrap();
        assert_eq!(l.until_ms, 6_000);
        assert_eq!(l.reason, LockReason::ServerError);

        t.clear("openai", QuotaFamily::Model, C1, "m");
        for u in t.drain_updates() {
            v.apply(&u);
        }
        assert!(!v.is_locked("openai", QuotaFamily::Model, C1, "m", c.now()));
        assert!(
            !v.apply(&ups[1]),
            "a late duplicate does not resurrect the lock"
        );
        v.sweep(c.now());
        assert!(t.drain_updates().is_empty());
    }

    #[test]
    fn eviction_never_drops_active_locks() {
        let c = clock();
        let mut t = LockoutTable::new();
        for i in 0..MAX_LOCK_ENTRIES + 10 {
            let mut r = rec("openai", &format!("m{i}"), 503, LockReason::ServerError);
            r.exact_cooldown_ms = Some(if i < 20 { 1 } else { 600_000 });
            t.record_failure(&r, c.now());
            if i == 19 {
                c.advance_ms(5);
            }
        }
        assert_eq!(t.len(), MAX_LOCK_ENTRIES - 10);
        assert!(t.is_locked("openai", QuotaFamily::Model, C1, "m20", c.now()));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Fail {
            model: u8,
            status: u16,
            exact: Option<u64>,
            upstream: bool,
        },
        Success {
            model: u8,
        },
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..3, prop::sample::select(vec![402u16, 403, 404, 429, 500, 502, 503]),
                  prop::option::of(0u64..8_000_000), any::<bool>())
                .prop_map(|(model, status, exact, upstream)| Op::Fail { model, status, exact, upstream }),
            1 => (0u8..3).prop_map(|model| Op::Success { model }),
            3 => (0u64..4_000_000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// A lock never outlives max_cooldown_ms from the failure that set it unless the
        /// exact upstream bypass applied.
        #[test]
        fn lock_never_outlives_the_cap(ops in prop::collection::vec(op(), 1..80)) {
            let c = clock();
            let mut t = LockoutTable::new();
            let max = 1_800_000;
            let mut last_failure: HashMap<LockKey, u64> = HashMap::new();
            for o in ops {
                match o {
                    Op::Fail { model, status, exact, upstream } => {
                        let mut r = rec("codex", &format!("gpt-5.{model}"), status, LockReason::RateLimited);
                        r.exact_cooldown_ms = exact;
                        r.exact_is_upstream_reset = upstream;
                        r.max_cooldown_ms = max;
                        let out = t.record_failure(&r, c.now()).unwrap();
                        last_failure.insert(out.key.clone(), c.now().mono_ms());
                        prop_assert!(out.failure_count >= 1);
                    }
                    Op::Success { model } => {
                        t.decay("codex", QuotaFamily::Codex, C1, &format!("gpt-5.{model}"), c.now());
                    }
                    Op::Advance(ms) => c.advance_ms(ms),
                }
                for (k, e) in &t.locks {
                    if !e.bypassed_max {
                        let at = last_failure[k];
                        prop_assert!(e.until_ms <= at + max, "{k}: {} > {} + {max}", e.until_ms, at);
                    }
                }
            }
        }
    }
}
