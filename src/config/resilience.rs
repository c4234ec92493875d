//! Resilience settings: every knob of the spec's `resilienceSettings` (A §1.3, §2, §3.2,
//! §4.7, §5.3, §6.4; B §1, §2, §3.3, §7, §9) plus what Tidegate needs beside them (the
//! breaker and cooldown profiles of `local` providers, the tracker's window gate, the
//! half-open probe timeout, the stream stall/deadline budgets). This module owns the
//! defaults, the bounds and the cross-field rules; `build` layers them
//! (built-in default < environment < config file) and `check` validates a whole value (the
//! PATCH handler uses it). `Serialize` gives the spec's camelCase shape for
//! `GET /api/resilience`.
//!
//! Out-of-bounds values are reported as problems naming the key (or the environment
//! variable), never clamped silently: a gateway that quietly runs with other numbers than
//! the operator wrote is harder to operate than one that refuses to start.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use super::AuthKind;
use super::env::{parse_bool, parse_u64, read};
use super::problem::{Problem, out_of_range};
use super::raw::RawResilience;

pub use super::problem::{DAY_MS, HOUR_MS, MINUTE_MS, SECOND_MS};

/// Default of [`ResilienceSettings::half_open_probe_timeout_ms`]: a probe that has not
/// settled after this long returns its permit (ARCHITECTURE §6, upstream #13836).
pub const DEFAULT_HALF_OPEN_PROBE_TIMEOUT_MS: u64 = 30_000;

/// One value per provider category. OmniRoute knows `oauth` and `apikey`; Tidegate adds
/// `local` (in-process mock and self-hosted providers, `auth = "local"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PerAuth<T> {
    pub oauth: T,
    pub apikey: T,
    pub local: T,
}

impl<T> PerAuth<T> {
    pub fn get(&self, auth: AuthKind) -> &T {
        match auth {
            AuthKind::OAuth => &self.oauth,
            AuthKind::ApiKey => &self.apikey,
            AuthKind::Local => &self.local,
        }
    }

    pub fn get_mut(&mut self, auth: AuthKind) -> &mut T {
        match auth {
            AuthKind::OAuth => &mut self.oauth,
            AuthKind::ApiKey => &mut self.apikey,
            AuthKind::Local => &mut self.local,
        }
    }
}

/// `requestQueue` (B §1, §9). The per-connection limiter (rpm, spacing, concurrency) runs
/// only when `auto_enable_api_key_providers` is on or a connection overrides it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestQueueSettings {
    /// Tidegate default **false** (the spec's is true), ARCHITECTURE §6.
    pub auto_enable_api_key_providers: bool,
    pub requests_per_minute: u32,
    pub min_time_between_requests_ms: u64,
    pub concurrent_requests: u32,
    /// 0 = no global gate.
    pub global_concurrent_requests: u32,
    /// Queue wait budget; 0 = no queue deadline.
    pub max_wait_ms: u64,
    /// Execution backstop after dispatch.
    pub execution_max_wait_ms: u64,
    /// 0 = unbounded queue.
    pub max_queue_depth: u32,
}

impl Default for RequestQueueSettings {
    fn default() -> Self {
        Self {
            auto_enable_api_key_providers: false,
            requests_per_minute: 60,
            min_time_between_requests_ms: 350,
            concurrent_requests: 6,
            global_concurrent_requests: 0,
            max_wait_ms: 30_000,
            execution_max_wait_ms: 600_000,
            max_queue_depth: 0,
        }
    }
}

/// `connectionCooldown.<category>` (A §3.2, §1.7).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionCooldownProfile {
    pub base_cooldown_ms: u64,
    pub use_upstream_retry_hints: bool,
    pub max_backoff_steps: u32,
    /// Tri-state: `None` = the category default (see
    /// [`ResilienceSettings::use_upstream_429_breaker_hints`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_upstream_429_breaker_hints: Option<bool>,
}

/// `providerBreaker.<category>` (A §1.2, §1.3). `max_backoff_multiplier` and
/// `backoff_escalation_count` are profile constants in OmniRoute (env only); here they are
/// settable like the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BreakerProfile {
    /// Failures (a counter, not a window) that open the breaker.
    pub failure_threshold: u32,
    /// Failures that mark it DEGRADED; always below `failure_threshold` (or 1 when that is 1).
    pub degradation_threshold: u32,
    pub reset_timeout_ms: u64,
    pub max_backoff_multiplier: u32,
    pub backoff_escalation_count: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenRefreshScope {
    Provider,
    Connection,
}

/// `tokenRefreshBreaker` (A §5.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRefreshBreakerSettings {
    pub scope: TokenRefreshScope,
    pub failure_threshold: u32,
    pub cooldown_ms: u64,
}

impl Default for TokenRefreshBreakerSettings {
    fn default() -> Self {
        Self {
            scope: TokenRefreshScope::Provider,
            failure_threshold: 5,
            cooldown_ms: 1_800_000,
        }
    }
}

/// `waitForCooldown`: the single-model cooldown-aware retry (B §3.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitForCooldownSettings {
    pub enabled: bool,
    pub max_retries: u32,
    pub max_retry_wait_sec: u32,
    /// Total wait across retries of one request; at least `max_retry_wait_sec × 1000`.
    pub budget_ms: u64,
}

impl WaitForCooldownSettings {
    pub fn max_retry_wait_ms(&self) -> u64 {
        u64::from(self.max_retry_wait_sec) * SECOND_MS
    }
}

impl Default for WaitForCooldownSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_retries: 5,
            max_retry_wait_sec: 90,
            budget_ms: 300_000,
        }
    }
}

/// `comboCooldownWait` (B §3.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComboCooldownWaitSettings {
    pub enabled: bool,
    pub max_wait_ms: u64,
    pub max_attempts: u32,
    /// At least `max_wait_ms`, at most 300 000.
    pub budget_ms: u64,
}

impl Default for ComboCooldownWaitSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            max_wait_ms: 90_000,
            max_attempts: 5,
            budget_ms: 300_000,
        }
    }
}

/// A section that is only an on/off switch (`quotaShareConcurrencyLimit`,
/// `streamStallCooldown`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Toggle {
    pub enabled: bool,
}

/// The provider-level window gate of the cooldown tracker (A §2): at least
/// `failure_threshold` failures within `failure_window_ms` cool the provider for
/// `cooldown_ms` after the latest one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowGate {
    pub failure_threshold: u32,
    pub failure_window_ms: u64,
    pub cooldown_ms: u64,
}

/// `providerCooldown`: the optional cross-request tracker (A §2). The per-category window
/// gates are Tidegate's home for OmniRoute's `providerFailure*` profile constants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCooldownSettings {
    pub enabled: bool,
    pub min_retry_cooldown_ms: u64,
    /// Never below `min_retry_cooldown_ms`.
    pub max_retry_cooldown_ms: u64,
    pub oauth: WindowGate,
    pub apikey: WindowGate,
    pub local: WindowGate,
}

impl ProviderCooldownSettings {
    pub fn window_gate(&self, auth: AuthKind) -> &WindowGate {
        match auth {
            AuthKind::OAuth => &self.oauth,
            AuthKind::ApiKey => &self.apikey,
            AuthKind::Local => &self.local,
        }
    }
}

impl Default for ProviderCooldownSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            min_retry_cooldown_ms: 5_000,
            max_retry_cooldown_ms: 300_000,
            oauth: WindowGate {
                failure_threshold: 10,
                failure_window_ms: 900_000,
                cooldown_ms: 300_000,
            },
            apikey: WindowGate {
                failure_threshold: 15,
                failure_window_ms: 1_800_000,
                cooldown_ms: 600_000,
            },
            local: WindowGate {
                failure_threshold: 2,
                failure_window_ms: 300_000,
                cooldown_ms: 60_000,
            },
        }
    }
}

/// `quotaPreflight` (B §9): skip a connection whose remaining quota is at or below a cutoff.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaPreflightSettings {
    pub enabled: bool,
    /// Minimum remaining percent before a connection is skipped.
    pub default_threshold_percent: u32,
    /// Remaining percent that warns; above the cutoff.
    pub warn_threshold_percent: u32,
    /// provider id → quota window name → minimum remaining percent.
    pub provider_window_defaults: BTreeMap<String, BTreeMap<String, u32>>,
}

impl Default for QuotaPreflightSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            default_threshold_percent: 2,
            warn_threshold_percent: 20,
            provider_window_defaults: BTreeMap::new(),
        }
    }
}

/// `streamRecovery.throughputWatchdog` (B §7.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThroughputWatchdogSettings {
    pub enabled: bool,
    pub warmup_ms: u64,
    pub window_ms: u64,
    pub min_useful_bytes_per_second: u32,
    pub min_useful_bytes: u32,
}

impl Default for ThroughputWatchdogSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            warmup_ms: 30_000,
            window_ms: 30_000,
            min_useful_bytes_per_second: 4,
            min_useful_bytes: 1,
        }
    }
}

/// `streamRecovery` (B §7.3).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamRecoverySettings {
    pub enabled: bool,
    pub continue_mid_stream: bool,
    pub throughput_watchdog: ThroughputWatchdogSettings,
}

/// Tidegate's home for the stream budgets OmniRoute reads from env only (B §7.1, §7.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamWatchdogSettings {
    /// Content-stall budget: no model-generated frame for this long ends the attempt.
    /// 0 disables.
    pub stall_timeout_ms: u64,
    /// Hard per-attempt deadline, never reset by incoming bytes. 0 disables.
    pub active_timeout_ms: u64,
}

impl Default for StreamWatchdogSettings {
    fn default() -> Self {
        Self {
            stall_timeout_ms: 80_000,
            active_timeout_ms: 0,
        }
    }
}

/// `providerQuotaOverrides.<provider>` (B §1.2b, §2.1).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderQuotaOverride {
    /// Sliding-window requests per 60 s per connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    /// Per-connection concurrency cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Concurrency cap shared by every connection of the provider; 0 = none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_concurrency: Option<u32>,
}

/// `credentialHealthCheck`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialHealthCheckSettings {
    /// 0 disables the sweep.
    pub interval_minutes: u32,
}

impl Default for CredentialHealthCheckSettings {
    fn default() -> Self {
        Self {
            interval_minutes: 60,
        }
    }
}

/// `modelLockout` (A §4.7).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelLockoutSettings {
    pub enabled: bool,
    pub error_codes: Vec<u16>,
    pub base_cooldown_ms: u64,
    /// Never below `base_cooldown_ms`.
    pub max_cooldown_ms: u64,
    pub max_backoff_steps: u32,
    pub use_exponential_backoff: bool,
}

impl Default for ModelLockoutSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            error_codes: vec![403, 404, 429, 502, 503, 504],
            base_cooldown_ms: 120_000,
            max_cooldown_ms: 1_800_000,
            max_backoff_steps: 10,
            use_exponential_backoff: true,
        }
    }
}

/// Where an operator error rule's verdict applies (A §6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleScope {
    Model,
    Provider,
    Connection,
}

impl RuleScope {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "model" => Some(Self::Model),
            "provider" => Some(Self::Provider),
            "connection" => Some(Self::Connection),
            _ => None,
        }
    }
}

/// `ConfiguredErrorReason` (A §6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    AuthError,
    QuotaExhausted,
    RateLimitExceeded,
    ModelCapacity,
    ServerError,
    Unknown,
}

impl ErrorReason {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auth_error" => Some(Self::AuthError),
            "quota_exhausted" => Some(Self::QuotaExhausted),
            "rate_limit_exceeded" => Some(Self::RateLimitExceeded),
            "model_capacity" => Some(Self::ModelCapacity),
            "server_error" => Some(Self::ServerError),
            "unknown" => Some(Self::Unknown),
            _ => None,
        }
    }
}

/// One operator rule of `providerErrorRules` (A §6.4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderErrorRule {
    pub status: u16,
    /// Case-insensitive substring (stored lower-cased), never a regex.
    #[serde(rename = "match")]
    pub pattern: String,
    pub scope: RuleScope,
    /// Defaults to `quota_exhausted`.
    pub reason: ErrorReason,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooldown_ms: Option<u64>,
}

/// Settings that are parsed and validated but configure nothing in the binary yet, as
/// paths under `[resilience]` (a section, or one key of it). Setting one — in the file or
/// through its environment variable — gives one load warning
/// `resilience.<path>: accepted but not active yet`. Wiring a mechanism to its settings =
/// deleting its line here (and its "accepted, not active yet" mark in
/// `docs/configuration.md`).
pub const NOT_ACTIVE_YET: &[&str] = &[
    "quota_preflight",
    "token_refresh_breaker",
    "credential_health_check",
];

/// The warning of a [`NOT_ACTIVE_YET`] path.
pub fn not_active_warning(path: &str) -> String {
    format!("resilience.{path}: accepted but not active yet")
}

/// At most this many operator error rules across all providers (A §6.4).
pub const MAX_PROVIDER_ERROR_RULES: usize = 50;
/// At most this many entries in `model_lockout.error_codes` (A §4.7).
pub const MAX_LOCKOUT_ERROR_CODES: usize = 20;

/// Every resilience setting, with the spec's defaults (see [`Default`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResilienceSettings {
    pub request_queue: RequestQueueSettings,
    pub connection_cooldown: PerAuth<ConnectionCooldownProfile>,
    pub provider_breaker: PerAuth<BreakerProfile>,
    /// A half-open probe that never settles returns its permit after this long.
    pub half_open_probe_timeout_ms: u64,
    /// How long a session's pin to a connection lives after its last use (B §4,
    /// `sessionAffinityTtlMs`); 0 = no session affinity.
    pub session_affinity_ttl_ms: u64,
    pub token_refresh_breaker: TokenRefreshBreakerSettings,
    pub wait_for_cooldown: WaitForCooldownSettings,
    pub combo_cooldown_wait: ComboCooldownWaitSettings,
    pub quota_share_concurrency_limit: Toggle,
    pub stream_stall_cooldown: Toggle,
    pub provider_cooldown: ProviderCooldownSettings,
    pub quota_preflight: QuotaPreflightSettings,
    pub stream_recovery: StreamRecoverySettings,
    pub stream_watchdog: StreamWatchdogSettings,
    /// provider id → overrides.
    pub provider_quota_overrides: BTreeMap<String, ProviderQuotaOverride>,
    pub credential_health_check: CredentialHealthCheckSettings,
    pub model_lockout: ModelLockoutSettings,
    /// Lower-cased provider id → rules in file order.
    pub provider_error_rules: BTreeMap<String, Vec<ProviderErrorRule>>,
}

impl Default for ResilienceSettings {
    fn default() -> Self {
        Self {
            request_queue: RequestQueueSettings::default(),
            connection_cooldown: PerAuth {
                oauth: ConnectionCooldownProfile {
                    base_cooldown_ms: 5_000,
                    use_upstream_retry_hints: false,
                    max_backoff_steps: 8,
                    use_upstream_429_breaker_hints: None,
                },
                apikey: ConnectionCooldownProfile {
                    base_cooldown_ms: 3_000,
                    use_upstream_retry_hints: true,
                    max_backoff_steps: 5,
                    use_upstream_429_breaker_hints: None,
                },
                // The `local` profile of A §1.2: transientCooldown 2 000, maxBackoffLevel 3,
                // a non-zero rateLimitCooldown (= do not trust upstream hints).
                local: ConnectionCooldownProfile {
                    base_cooldown_ms: 2_000,
                    use_upstream_retry_hints: false,
                    max_backoff_steps: 3,
                    use_upstream_429_breaker_hints: None,
                },
            },
            provider_breaker: PerAuth {
                oauth: BreakerProfile {
                    failure_threshold: 8,
                    degradation_threshold: 5,
                    reset_timeout_ms: 60_000,
                    max_backoff_multiplier: 8,
                    backoff_escalation_count: 2,
                },
                apikey: BreakerProfile {
                    failure_threshold: 12,
                    degradation_threshold: 7,
                    reset_timeout_ms: 30_000,
                    max_backoff_multiplier: 4,
                    backoff_escalation_count: 3,
                },
                // A §1.2 `local`: threshold 2, reset 15 s. Degradation is "derived"
                // (ceil(2 × 0.6) = 2), lowered to failure − 1 = 1 by the normalisation rule;
                // escalation uses the breaker constructor defaults ×16 / 3.
                local: BreakerProfile {
                    failure_threshold: 2,
                    degradation_threshold: 1,
                    reset_timeout_ms: 15_000,
                    max_backoff_multiplier: 16,
                    backoff_escalation_count: 3,
                },
            },
            half_open_probe_timeout_ms: DEFAULT_HALF_OPEN_PROBE_TIMEOUT_MS,
            session_affinity_ttl_ms: 0,
            token_refresh_breaker: TokenRefreshBreakerSettings::default(),
            wait_for_cooldown: WaitForCooldownSettings::default(),
            combo_cooldown_wait: ComboCooldownWaitSettings::default(),
            quota_share_concurrency_limit: Toggle { enabled: true },
            stream_stall_cooldown: Toggle { enabled: false },
            provider_cooldown: ProviderCooldownSettings::default(),
            quota_preflight: QuotaPreflightSettings::default(),
            stream_recovery: StreamRecoverySettings::default(),
            stream_watchdog: StreamWatchdogSettings::default(),
            provider_quota_overrides: BTreeMap::new(),
            credential_health_check: CredentialHealthCheckSettings::default(),
            model_lockout: ModelLockoutSettings::default(),
            provider_error_rules: BTreeMap::new(),
        }
    }
}

impl ResilienceSettings {
    /// Whether upstream 429 bodies tune the breaker cooldown for this category (A §1.7):
    /// the explicit setting, else true for `oauth`/`apikey` and false for `local`.
    pub fn use_upstream_429_breaker_hints(&self, auth: AuthKind) -> bool {
        self.connection_cooldown
            .get(auth)
            .use_upstream_429_breaker_hints
            .unwrap_or(!matches!(auth, AuthKind::Local))
    }

    /// `provider_quota_overrides` of a provider id (compared case-insensitively).
    pub fn quota_override_for(&self, id: &str) -> Option<&ProviderQuotaOverride> {
        self.provider_quota_overrides
            .iter()
            .find(|(p, _)| p.eq_ignore_ascii_case(id))
            .map(|(_, o)| o)
    }

    /// Operator error rules for a provider id (compared lower-cased).
    pub fn error_rules_for(&self, provider: &str) -> &[ProviderErrorRule] {
        self.provider_error_rules
            .get(&provider.to_ascii_lowercase())
            .map_or(&[], Vec::as_slice)
    }

    /// Validates a complete value (the PATCH path): every bound and cross-field rule, with
    /// every value treated as explicitly set, so nothing is derived. Keys are TOML paths
    /// (`resilience.request_queue.max_wait_ms`).
    pub fn check(&self) -> Vec<Problem> {
        let prov = Provenance::all_explicit();
        let mut problems = Vec::new();
        for f in num_fields() {
            let v = (f.get)(self);
            if v < f.min || v > f.max {
                problems.push(Problem::new(
                    prov.key(f.path),
                    out_of_range(v, f.min, f.max),
                ));
            }
        }
        check_maps(self, &mut problems);
        check_rules(self, &mut problems);
        // `settle` only reports here (all explicit); it runs on a copy so `check` never
        // changes the value.
        let mut copy = self.clone();
        let mut notes = Vec::new();
        settle(&mut copy, &prov, &mut problems, &mut notes);
        problems
    }

    /// Forces `enabled` off where the counts make the mechanism a no-op (B §3.3: wait
    /// sections with zero retries/attempts or zero wait). Returns one note per change.
    pub fn normalize(&mut self) -> Vec<String> {
        let mut notes = Vec::new();
        force_flags(self, &mut notes);
        notes
    }

    /// The legacy view of `GET /api/resilience` (A §5.3).
    fn legacy(&self) -> Legacy {
        let profile = |c: &ConnectionCooldownProfile, b: &BreakerProfile| LegacyProfile {
            transient_cooldown: c.base_cooldown_ms,
            rate_limit_cooldown: if c.use_upstream_retry_hints {
                0
            } else {
                c.base_cooldown_ms
            },
            max_backoff_level: c.max_backoff_steps,
            circuit_breaker_threshold: b.failure_threshold,
            degradation_threshold: b.degradation_threshold,
            circuit_breaker_reset: b.reset_timeout_ms,
        };
        Legacy {
            profiles: LegacyProfiles {
                oauth: profile(
                    &self.connection_cooldown.oauth,
                    &self.provider_breaker.oauth,
                ),
                apikey: profile(
                    &self.connection_cooldown.apikey,
                    &self.provider_breaker.apikey,
                ),
            },
            defaults: LegacyDefaults {
                requests_per_minute: self.request_queue.requests_per_minute,
                min_time_between_requests: self.request_queue.min_time_between_requests_ms,
                concurrent_requests: self.request_queue.concurrent_requests,
            },
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LegacyProfile {
    transient_cooldown: u64,
    rate_limit_cooldown: u64,
    max_backoff_level: u32,
    circuit_breaker_threshold: u32,
    degradation_threshold: u32,
    circuit_breaker_reset: u64,
}

#[derive(Serialize)]
struct LegacyProfiles {
    oauth: LegacyProfile,
    apikey: LegacyProfile,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LegacyDefaults {
    requests_per_minute: u32,
    min_time_between_requests: u64,
    concurrent_requests: u32,
}

#[derive(Serialize)]
struct Legacy {
    profiles: LegacyProfiles,
    defaults: LegacyDefaults,
}

/// The camelCase shape of `GET /api/resilience`: the spec's sections, Tidegate's additions
/// (`halfOpenProbeTimeoutMs`, `streamRecovery`, `streamWatchdog`, `modelLockout`,
/// `providerErrorRules`, the `local` category) and the derived `legacy` view.
impl Serialize for ResilienceSettings {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut m = serializer.serialize_map(Some(19))?;
        m.serialize_entry("requestQueue", &self.request_queue)?;
        m.serialize_entry("connectionCooldown", &self.connection_cooldown)?;
        m.serialize_entry("providerBreaker", &self.provider_breaker)?;
        m.serialize_entry("halfOpenProbeTimeoutMs", &self.half_open_probe_timeout_ms)?;
        m.serialize_entry("sessionAffinityTtlMs", &self.session_affinity_ttl_ms)?;
        m.serialize_entry("tokenRefreshBreaker", &self.token_refresh_breaker)?;
        m.serialize_entry("waitForCooldown", &self.wait_for_cooldown)?;
        m.serialize_entry("comboCooldownWait", &self.combo_cooldown_wait)?;
        m.serialize_entry(
            "quotaShareConcurrencyLimit",
            &self.quota_share_concurrency_limit,
        )?;
        m.serialize_entry("streamStallCooldown", &self.stream_stall_cooldown)?;
        m.serialize_entry("providerCooldown", &self.provider_cooldown)?;
        m.serialize_entry("quotaPreflight", &self.quota_preflight)?;
        m.serialize_entry("streamRecovery", &self.stream_recovery)?;
        m.serialize_entry("streamWatchdog", &self.stream_watchdog)?;
        m.serialize_entry("providerQuotaOverrides", &self.provider_quota_overrides)?;
        m.serialize_entry("credentialHealthCheck", &self.credential_health_check)?;
        m.serialize_entry("modelLockout", &self.model_lockout)?;
        m.serialize_entry("providerErrorRules", &self.provider_error_rules)?;
        m.serialize_entry("legacy", &self.legacy())?;
        m.end()
    }
}

// ---------------------------------------------------------------------------------------
// Provenance: which layer set a value, so a problem names the key the operator wrote and
// cross-field rules can tell an explicit value from a default.

#[derive(Clone, Copy, Debug)]
enum Source {
    Env(&'static str),
    File,
}

#[derive(Debug, Default)]
struct Provenance {
    all_explicit: bool,
    sources: HashMap<&'static str, Source>,
}

impl Provenance {
    fn all_explicit() -> Self {
        Self {
            all_explicit: true,
            sources: HashMap::new(),
        }
    }

    fn set_env(&mut self, path: &'static str, var: &'static str) {
        self.sources.insert(path, Source::Env(var));
    }

    fn set_file(&mut self, path: &'static str) {
        self.sources.insert(path, Source::File);
    }

    /// Whether `path` or anything under it (`path.…`) was set by the env or the file.
    fn set_under(&self, path: &str) -> bool {
        self.sources.keys().any(|k| {
            k.strip_prefix(path)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    }

    fn explicit(&self, path: &str) -> bool {
        self.all_explicit || self.sources.contains_key(path)
    }

    /// The key a problem about `path` names: the env variable that set it, else the TOML path.
    fn key(&self, path: &str) -> String {
        match self.sources.get(path) {
            Some(Source::Env(var)) => (*var).to_string(),
            Some(Source::File) | None => format!("resilience.{path}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The field tables: one row per scalar setting, with its TOML path (relative to
// `[resilience]`), its env variables (first set one wins), bounds, and accessors on both the
// typed settings and the raw file section (which mirrors the typed field names).

/// Lossless for values within a field's bounds, which are checked before `set`.
trait Narrow {
    fn narrow(v: u64) -> Self;
}

impl Narrow for u64 {
    fn narrow(v: u64) -> Self {
        v
    }
}

impl Narrow for u32 {
    fn narrow(v: u64) -> Self {
        u32::try_from(v).unwrap_or(u32::MAX)
    }
}

pub(crate) struct NumField {
    pub path: &'static str,
    pub env: &'static [&'static str],
    pub min: u64,
    pub max: u64,
    /// Lowest value accepted from the environment (the spec ignores `RATE_LIMIT_MAX_WAIT_MS=0`).
    pub env_min: u64,
    pub get: fn(&ResilienceSettings) -> u64,
    pub set: fn(&mut ResilienceSettings, u64),
    raw: fn(&RawResilience) -> Option<u64>,
}

pub(crate) struct BoolField {
    pub path: &'static str,
    pub env: &'static [&'static str],
    /// The environment wins over the file (an incident kill switch, B §1.1
    /// `RATE_LIMIT_AUTO_ENABLE`); every other variable only replaces the built-in default.
    pub env_wins: bool,
    pub set: fn(&mut ResilienceSettings, bool),
    raw: fn(&RawResilience) -> Option<bool>,
}

macro_rules! num {
    ($path:literal, [$($env:literal),*], $min:expr, $max:expr, $($f:ident).+) => {
        num!($path, [$($env),*], $min, $max, env_min = $min, $($f).+)
    };
    ($path:literal, [$($env:literal),*], $min:expr, $max:expr, env_min = $emin:expr,
     $($f:ident).+) => {
        NumField {
            path: $path,
            env: &[$($env),*],
            min: $min,
            max: $max,
            env_min: $emin,
            get: |s| u64::from(s.$($f).+),
            set: |s, v| s.$($f).+ = Narrow::narrow(v),
            raw: |r| r.$($f).+.map(u64::from),
        }
    };
}

macro_rules! flag {
    ($path:literal, [$($env:literal),*], $($f:ident).+) => {
        flag!($path, [$($env),*], env_wins = false, $($f).+)
    };
    ($path:literal, [$($env:literal),*], env_wins = $wins:expr, $($f:ident).+) => {
        BoolField {
            path: $path,
            env: &[$($env),*],
            env_wins: $wins,
            set: |s, v| s.$($f).+ = v,
            raw: |r| r.$($f).+,
        }
    };
}

#[rustfmt::skip]
pub(crate) fn num_fields() -> Vec<NumField> {
    vec![
        // requestQueue (B §1.5, §9)
        num!("request_queue.requests_per_minute", [], 1, 1_000_000, request_queue.requests_per_minute),
        num!("request_queue.min_time_between_requests_ms", [], 0, HOUR_MS, request_queue.min_time_between_requests_ms),
        num!("request_queue.concurrent_requests", [], 1, 10_000, request_queue.concurrent_requests),
        num!("request_queue.global_concurrent_requests", [], 0, 100_000, request_queue.global_concurrent_requests),
        num!("request_queue.max_wait_ms", ["RATE_LIMIT_MAX_WAIT_MS"], 0, DAY_MS, env_min = 1, request_queue.max_wait_ms),
        num!("request_queue.execution_max_wait_ms", ["RATE_LIMIT_EXECUTION_MAX_WAIT_MS"], 1, DAY_MS, request_queue.execution_max_wait_ms),
        num!("request_queue.max_queue_depth", ["RATE_LIMIT_MAX_QUEUE_DEPTH"], 0, 100_000, request_queue.max_queue_depth),
        // connectionCooldown (A §3.2)
        num!("connection_cooldown.oauth.base_cooldown_ms", [], 0, DAY_MS, connection_cooldown.oauth.base_cooldown_ms),
        num!("connection_cooldown.oauth.max_backoff_steps", [], 0, 32, connection_cooldown.oauth.max_backoff_steps),
        num!("connection_cooldown.apikey.base_cooldown_ms", [], 0, DAY_MS, connection_cooldown.apikey.base_cooldown_ms),
        num!("connection_cooldown.apikey.max_backoff_steps", [], 0, 32, connection_cooldown.apikey.max_backoff_steps),
        num!("connection_cooldown.local.base_cooldown_ms", [], 0, DAY_MS, connection_cooldown.local.base_cooldown_ms),
        num!("connection_cooldown.local.max_backoff_steps", [], 0, 32, connection_cooldown.local.max_backoff_steps),
        // providerBreaker (A §1.2, §1.3)
        num!("provider_breaker.oauth.failure_threshold", ["OMNIROUTE_CIRCUIT_BREAKER_OAUTH_THRESHOLD"], 1, 1_000, provider_breaker.oauth.failure_threshold),
        num!("provider_breaker.oauth.degradation_threshold", ["OMNIROUTE_PROVIDER_BREAKER_OAUTH_DEGRADATION_THRESHOLD"], 1, 1_000, provider_breaker.oauth.degradation_threshold),
        num!("provider_breaker.oauth.reset_timeout_ms", ["OMNIROUTE_CIRCUIT_BREAKER_OAUTH_RESET_MS"], SECOND_MS, DAY_MS, provider_breaker.oauth.reset_timeout_ms),
        num!("provider_breaker.oauth.max_backoff_multiplier", ["OMNIROUTE_PROVIDER_BREAKER_OAUTH_MAX_BACKOFF_MULTIPLIER"], 1, 1_024, provider_breaker.oauth.max_backoff_multiplier),
        num!("provider_breaker.oauth.backoff_escalation_count", ["OMNIROUTE_PROVIDER_BREAKER_OAUTH_BACKOFF_ESCALATION_COUNT"], 0, 100, provider_breaker.oauth.backoff_escalation_count),
        num!("provider_breaker.apikey.failure_threshold", ["OMNIROUTE_CIRCUIT_BREAKER_API_KEY_THRESHOLD"], 1, 1_000, provider_breaker.apikey.failure_threshold),
        num!("provider_breaker.apikey.degradation_threshold", ["OMNIROUTE_PROVIDER_BREAKER_API_KEY_DEGRADATION_THRESHOLD"], 1, 1_000, provider_breaker.apikey.degradation_threshold),
        num!("provider_breaker.apikey.reset_timeout_ms", ["OMNIROUTE_CIRCUIT_BREAKER_API_KEY_RESET_MS"], SECOND_MS, DAY_MS, provider_breaker.apikey.reset_timeout_ms),
        num!("provider_breaker.apikey.max_backoff_multiplier", ["OMNIROUTE_PROVIDER_BREAKER_API_KEY_MAX_BACKOFF_MULTIPLIER"], 1, 1_024, provider_breaker.apikey.max_backoff_multiplier),
        num!("provider_breaker.apikey.backoff_escalation_count", ["OMNIROUTE_PROVIDER_BREAKER_API_KEY_BACKOFF_ESCALATION_COUNT"], 0, 100, provider_breaker.apikey.backoff_escalation_count),
        num!("provider_breaker.local.failure_threshold", ["OMNIROUTE_CIRCUIT_BREAKER_LOCAL_THRESHOLD"], 1, 1_000, provider_breaker.local.failure_threshold),
        num!("provider_breaker.local.degradation_threshold", [], 1, 1_000, provider_breaker.local.degradation_threshold),
        num!("provider_breaker.local.reset_timeout_ms", ["OMNIROUTE_CIRCUIT_BREAKER_LOCAL_RESET_MS"], SECOND_MS, DAY_MS, provider_breaker.local.reset_timeout_ms),
        num!("provider_breaker.local.max_backoff_multiplier", [], 1, 1_024, provider_breaker.local.max_backoff_multiplier),
        num!("provider_breaker.local.backoff_escalation_count", [], 0, 100, provider_breaker.local.backoff_escalation_count),
        num!("half_open_probe_timeout_ms", [], SECOND_MS, DAY_MS, half_open_probe_timeout_ms),
        // sessionAffinityTtlMs (B §4)
        num!("session_affinity_ttl_ms", [], 0, 7 * DAY_MS, session_affinity_ttl_ms),
        // tokenRefreshBreaker (A §5.3)
        num!("token_refresh_breaker.failure_threshold", [], 1, 100, token_refresh_breaker.failure_threshold),
        num!("token_refresh_breaker.cooldown_ms", [], MINUTE_MS, DAY_MS, token_refresh_breaker.cooldown_ms),
        // waitForCooldown, comboCooldownWait (B §3.3)
        num!("wait_for_cooldown.max_retries", [], 0, 10, wait_for_cooldown.max_retries),
        num!("wait_for_cooldown.max_retry_wait_sec", [], 0, 300, wait_for_cooldown.max_retry_wait_sec),
        num!("wait_for_cooldown.budget_ms", [], 0, 300_000, wait_for_cooldown.budget_ms),
        num!("combo_cooldown_wait.max_wait_ms", [], 0, 300_000, combo_cooldown_wait.max_wait_ms),
        num!("combo_cooldown_wait.max_attempts", [], 0, 10, combo_cooldown_wait.max_attempts),
        num!("combo_cooldown_wait.budget_ms", [], 0, 300_000, combo_cooldown_wait.budget_ms),
        // providerCooldown (A §2)
        num!("provider_cooldown.min_retry_cooldown_ms", ["PROVIDER_COOLDOWN_MIN_MS"], 0, HOUR_MS, provider_cooldown.min_retry_cooldown_ms),
        num!("provider_cooldown.max_retry_cooldown_ms", ["PROVIDER_COOLDOWN_MAX_MS"], 0, DAY_MS, provider_cooldown.max_retry_cooldown_ms),
        num!("provider_cooldown.oauth.failure_threshold", ["OMNIROUTE_PROVIDER_BREAKER_OAUTH_FAILURE_THRESHOLD"], 1, 1_000, provider_cooldown.oauth.failure_threshold),
        num!("provider_cooldown.oauth.failure_window_ms", ["OMNIROUTE_PROVIDER_BREAKER_OAUTH_FAILURE_WINDOW_MS"], SECOND_MS, DAY_MS, provider_cooldown.oauth.failure_window_ms),
        num!("provider_cooldown.oauth.cooldown_ms", ["OMNIROUTE_PROVIDER_BREAKER_OAUTH_COOLDOWN_MS"], 0, DAY_MS, provider_cooldown.oauth.cooldown_ms),
        num!("provider_cooldown.apikey.failure_threshold", ["OMNIROUTE_PROVIDER_BREAKER_API_KEY_FAILURE_THRESHOLD"], 1, 1_000, provider_cooldown.apikey.failure_threshold),
        num!("provider_cooldown.apikey.failure_window_ms", ["OMNIROUTE_PROVIDER_BREAKER_API_KEY_FAILURE_WINDOW_MS"], SECOND_MS, DAY_MS, provider_cooldown.apikey.failure_window_ms),
        num!("provider_cooldown.apikey.cooldown_ms", ["OMNIROUTE_PROVIDER_BREAKER_API_KEY_COOLDOWN_MS"], 0, DAY_MS, provider_cooldown.apikey.cooldown_ms),
        num!("provider_cooldown.local.failure_threshold", ["OMNIROUTE_PROVIDER_BREAKER_LOCAL_FAILURE_THRESHOLD"], 1, 1_000, provider_cooldown.local.failure_threshold),
        num!("provider_cooldown.local.failure_window_ms", ["OMNIROUTE_PROVIDER_BREAKER_LOCAL_FAILURE_WINDOW_MS"], SECOND_MS, DAY_MS, provider_cooldown.local.failure_window_ms),
        num!("provider_cooldown.local.cooldown_ms", ["OMNIROUTE_PROVIDER_BREAKER_LOCAL_COOLDOWN_MS"], 0, DAY_MS, provider_cooldown.local.cooldown_ms),
        // quotaPreflight (B §9)
        num!("quota_preflight.default_threshold_percent", [], 0, 99, quota_preflight.default_threshold_percent),
        num!("quota_preflight.warn_threshold_percent", [], 1, 100, quota_preflight.warn_threshold_percent),
        // streamRecovery.throughputWatchdog (B §7.2)
        num!("stream_recovery.throughput_watchdog.warmup_ms", ["STREAM_THROUGHPUT_WATCHDOG_WARMUP_MS"], 0, 600_000, stream_recovery.throughput_watchdog.warmup_ms),
        num!("stream_recovery.throughput_watchdog.window_ms", ["STREAM_THROUGHPUT_WATCHDOG_WINDOW_MS"], SECOND_MS, 600_000, stream_recovery.throughput_watchdog.window_ms),
        num!("stream_recovery.throughput_watchdog.min_useful_bytes_per_second", ["STREAM_THROUGHPUT_WATCHDOG_MIN_BYTES_PER_SECOND"], 1, 1_000_000, stream_recovery .throughput_watchdog .min_useful_bytes_per_second),
        num!("stream_recovery.throughput_watchdog.min_useful_bytes", ["STREAM_THROUGHPUT_WATCHDOG_MIN_USEFUL_BYTES"], 1, 1_000_000, stream_recovery.throughput_watchdog.min_useful_bytes),
        // stream budgets (B §7.1, §7.3)
        num!("stream_watchdog.stall_timeout_ms", ["STREAM_CONTENT_STALL_TIMEOUT_MS", "STREAM_READINESS_TIMEOUT_MS"], 0, HOUR_MS, stream_watchdog.stall_timeout_ms),
        num!("stream_watchdog.active_timeout_ms", ["STREAM_ACTIVE_TIMEOUT_MS"], 0, DAY_MS, stream_watchdog.active_timeout_ms),
        // credentialHealthCheck
        num!("credential_health_check.interval_minutes", [], 0, 1_440, credential_health_check.interval_minutes),
        // modelLockout (A §4.7)
        num!("model_lockout.base_cooldown_ms", [], 5_000, 600_000, model_lockout.base_cooldown_ms),
        num!("model_lockout.max_cooldown_ms", [], 5_000, HOUR_MS, model_lockout.max_cooldown_ms),
        num!("model_lockout.max_backoff_steps", [], 0, 20, model_lockout.max_backoff_steps),
    ]
}

#[rustfmt::skip]
pub(crate) fn bool_fields() -> Vec<BoolField> {
    vec![
        flag!("request_queue.auto_enable_api_key_providers", ["RATE_LIMIT_AUTO_ENABLE"], env_wins = true, request_queue.auto_enable_api_key_providers),
        flag!("connection_cooldown.oauth.use_upstream_retry_hints", [], connection_cooldown.oauth.use_upstream_retry_hints),
        flag!("connection_cooldown.apikey.use_upstream_retry_hints", [], connection_cooldown.apikey.use_upstream_retry_hints),
        flag!("connection_cooldown.local.use_upstream_retry_hints", [], connection_cooldown.local.use_upstream_retry_hints),
        flag!("wait_for_cooldown.enabled", [], wait_for_cooldown.enabled),
        flag!("combo_cooldown_wait.enabled", [], combo_cooldown_wait.enabled),
        flag!("quota_share_concurrency_limit.enabled", [], quota_share_concurrency_limit.enabled),
        flag!("stream_stall_cooldown.enabled", [], stream_stall_cooldown.enabled),
        flag!("provider_cooldown.enabled", ["PROVIDER_COOLDOWN_ENABLED"], provider_cooldown.enabled),
        flag!("quota_preflight.enabled", ["QUOTA_PREFLIGHT_CUTOFF_ENABLED"], quota_preflight.enabled),
        flag!("stream_recovery.enabled", ["STREAM_RECOVERY_ENABLED"], stream_recovery.enabled),
        flag!("stream_recovery.continue_mid_stream", [], stream_recovery.continue_mid_stream),
        flag!("stream_recovery.throughput_watchdog.enabled", ["STREAM_THROUGHPUT_WATCHDOG_ENABLED"], stream_recovery.throughput_watchdog.enabled),
        flag!("model_lockout.enabled", [], model_lockout.enabled),
        flag!("model_lockout.use_exponential_backoff", [], model_lockout.use_exponential_backoff),
    ]
}

/// Every environment variable the settings read, in table order.
pub fn env_variables() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for f in bool_fields() {
        out.extend(f.env);
    }
    for f in num_fields() {
        out.extend(f.env);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Building: default < env < file, then the cross-field rules.

/// Builds the settings from the built-in defaults, the environment and the file's
/// `[resilience]` section. Problems name the file key or the env variable; `warnings`
/// receives one line per flag forced off.
pub(crate) fn build(
    raw: &RawResilience,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<Problem>,
    warnings: &mut Vec<String>,
) -> ResilienceSettings {
    let mut s = ResilienceSettings::default();
    let mut prov = Provenance::default();
    apply_env(&mut s, &mut prov, env, problems);
    apply_file(&mut s, &mut prov, raw, problems, warnings);
    settle(&mut s, &prov, problems, warnings);
    for path in NOT_ACTIVE_YET {
        if prov.set_under(path) {
            warnings.push(not_active_warning(path));
        }
    }
    s
}

/// Applies every set environment variable onto `s` (the spec's names, e.g.
/// `RATE_LIMIT_MAX_WAIT_MS`), recording where each value came from. An override only
/// replaces the built-in default — the file is applied after it — except for a field marked
/// `env_wins` (`RATE_LIMIT_AUTO_ENABLE`, the spec's incident kill switch), which the file
/// does not change. Parsing is strict: a value
/// that is not a whole number / boolean, or lies outside the setting's bounds, is a problem
/// naming the variable (OmniRoute silently ignores it). When a setting has several
/// variables the first one set wins (`STREAM_CONTENT_STALL_TIMEOUT_MS` before
/// `STREAM_READINESS_TIMEOUT_MS`).
fn apply_env(
    s: &mut ResilienceSettings,
    prov: &mut Provenance,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<Problem>,
) {
    for f in bool_fields() {
        let Some((var, value)) = first_set(env, f.env) else {
            continue;
        };
        match parse_bool(&value) {
            Ok(v) => {
                (f.set)(s, v);
                prov.set_env(f.path, var);
            }
            Err(message) => problems.push(Problem::new(var, message)),
        }
    }
    for f in num_fields() {
        let Some((var, value)) = first_set(env, f.env) else {
            continue;
        };
        match parse_u64(&value) {
            Ok(v) if v < f.env_min || v > f.max => {
                problems.push(Problem::new(var, out_of_range(v, f.env_min, f.max)));
            }
            Ok(v) => {
                (f.set)(s, v);
                prov.set_env(f.path, var);
            }
            Err(message) => problems.push(Problem::new(var, message)),
        }
    }
}

fn first_set(
    env: &dyn Fn(&str) -> Option<String>,
    vars: &'static [&'static str],
) -> Option<(&'static str, String)> {
    vars.iter()
        .find_map(|var| read(env, var).map(|value| (*var, value)))
}

fn apply_file(
    s: &mut ResilienceSettings,
    prov: &mut Provenance,
    raw: &RawResilience,
    problems: &mut Vec<Problem>,
    warnings: &mut Vec<String>,
) {
    for f in num_fields() {
        if let Some(v) = (f.raw)(raw) {
            if v < f.min || v > f.max {
                problems.push(Problem::new(
                    format!("resilience.{}", f.path),
                    out_of_range(v, f.min, f.max),
                ));
            } else {
                (f.set)(s, v);
                prov.set_file(f.path);
            }
        }
    }
    for f in bool_fields() {
        if let Some(v) = (f.raw)(raw) {
            if f.env_wins
                && let Some(Source::Env(var)) = prov.sources.get(f.path)
            {
                // The kill switch: the file's value is overridden, and the operator told.
                warnings.push(format!(
                    "resilience.{} = {v} in the file is overridden by {var}",
                    f.path
                ));
                continue;
            }
            (f.set)(s, v);
            prov.set_file(f.path);
        }
    }

    let cc = &raw.connection_cooldown;
    for (auth, hint) in [
        (AuthKind::OAuth, cc.oauth.use_upstream_429_breaker_hints),
        (AuthKind::ApiKey, cc.apikey.use_upstream_429_breaker_hints),
        (AuthKind::Local, cc.local.use_upstream_429_breaker_hints),
    ] {
        if hint.is_some() {
            s.connection_cooldown
                .get_mut(auth)
                .use_upstream_429_breaker_hints = hint;
            prov.set_file(match auth {
                AuthKind::OAuth => "connection_cooldown.oauth.use_upstream_429_breaker_hints",
                AuthKind::ApiKey => "connection_cooldown.apikey.use_upstream_429_breaker_hints",
                AuthKind::Local => "connection_cooldown.local.use_upstream_429_breaker_hints",
            });
        }
    }

    if let Some(scope) = &raw.token_refresh_breaker.scope {
        let parsed = match scope.as_str() {
            "provider" => Some(TokenRefreshScope::Provider),
            "connection" => Some(TokenRefreshScope::Connection),
            other => {
                problems.push(Problem::new(
                    "resilience.token_refresh_breaker.scope",
                    format!("unknown scope {other:?} (expected \"provider\" or \"connection\")"),
                ));
                None
            }
        };
        if let Some(scope) = parsed {
            s.token_refresh_breaker.scope = scope;
            prov.set_file("token_refresh_breaker.scope");
        }
    }

    if let Some(windows) = &raw.quota_preflight.provider_window_defaults {
        s.quota_preflight.provider_window_defaults = windows.clone();
        prov.set_file("quota_preflight.provider_window_defaults");
    }

    for (provider, o) in &raw.provider_quota_overrides {
        s.provider_quota_overrides.insert(
            provider.clone(),
            ProviderQuotaOverride {
                rpm: o.rpm,
                concurrency: o.concurrency,
                provider_concurrency: o.provider_concurrency,
            },
        );
    }

    if let Some(codes) = &raw.model_lockout.error_codes {
        s.model_lockout.error_codes = codes.clone();
        prov.set_file("model_lockout.error_codes");
    }

    let mut total = 0;
    for (provider, rules) in &raw.provider_error_rules {
        total += rules.len();
        let lower = provider.trim().to_ascii_lowercase();
        let base = format!("resilience.provider_error_rules.{provider}");
        if lower.is_empty() || lower.len() > 100 {
            problems.push(Problem::new(
                base.clone(),
                "provider key must be 1..=100 characters",
            ));
        }
        if s.provider_error_rules.contains_key(&lower) {
            problems.push(Problem::new(
                base.clone(),
                format!("duplicate provider {lower:?} (keys are compared lower-cased)"),
            ));
            continue;
        }
        let mut out = Vec::with_capacity(rules.len());
        for (i, r) in rules.iter().enumerate() {
            let key = format!("{base}[{i}]");
            rule_problems(&key, r.status, &r.pattern, r.cooldown_ms, problems);
            let scope = RuleScope::parse(&r.scope);
            if scope.is_none() {
                problems.push(Problem::new(
                    format!("{key}.scope"),
                    format!(
                        "unknown scope {:?} (expected model, provider or connection)",
                        r.scope
                    ),
                ));
            }
            let reason = match &r.reason {
                None => Some(ErrorReason::QuotaExhausted),
                Some(text) => {
                    let parsed = ErrorReason::parse(text);
                    if parsed.is_none() {
                        problems.push(Problem::new(
                            format!("{key}.reason"),
                            format!(
                                "unknown reason {text:?} (expected auth_error, quota_exhausted, \
                                 rate_limit_exceeded, model_capacity, server_error or unknown)"
                            ),
                        ));
                    }
                    parsed
                }
            };
            if let (Some(scope), Some(reason)) = (scope, reason) {
                out.push(ProviderErrorRule {
                    status: r.status,
                    pattern: r.pattern.to_lowercase(),
                    scope,
                    reason,
                    cooldown_ms: r.cooldown_ms,
                });
            }
        }
        // An empty list clears the provider's rules (A §6.4).
        if !out.is_empty() {
            s.provider_error_rules.insert(lower, out);
        }
    }
    if total > MAX_PROVIDER_ERROR_RULES {
        problems.push(too_many_rules(total));
    }
    check_maps(s, problems);
}

/// Bounds of the map- and list-valued settings.
fn check_maps(s: &ResilienceSettings, problems: &mut Vec<Problem>) {
    for (provider, windows) in &s.quota_preflight.provider_window_defaults {
        for (window, pct) in windows {
            if *pct > 100 {
                problems.push(Problem::new(
                    format!(
                        "resilience.quota_preflight.provider_window_defaults.{provider}.{window}"
                    ),
                    out_of_range(u64::from(*pct), 0, 100),
                ));
            }
        }
    }
    for (provider, o) in &s.provider_quota_overrides {
        let key = format!("resilience.provider_quota_overrides.{provider}");
        let checks = [
            ("rpm", o.rpm, 1, 1_000_000),
            ("concurrency", o.concurrency, 1, 100_000),
            ("provider_concurrency", o.provider_concurrency, 0, 100_000),
        ];
        for (name, v, min, max) in checks {
            if let Some(v) = v {
                let v = u64::from(v);
                if v < min || v > max {
                    problems.push(Problem::new(
                        format!("{key}.{name}"),
                        out_of_range(v, min, max),
                    ));
                }
            }
        }
    }
    let codes = &s.model_lockout.error_codes;
    let key = "resilience.model_lockout.error_codes";
    if codes.is_empty() {
        problems.push(Problem::new(
            key,
            "must list at least one status (turn lockouts off with enabled = false)",
        ));
    }
    if codes.len() > MAX_LOCKOUT_ERROR_CODES {
        problems.push(Problem::new(
            key,
            format!("at most {MAX_LOCKOUT_ERROR_CODES} statuses"),
        ));
    }
    for (i, c) in codes.iter().enumerate() {
        if !(100..=599).contains(c) {
            problems.push(Problem::new(
                format!("{key}[{i}]"),
                out_of_range(u64::from(*c), 100, 599),
            ));
        }
    }
}

fn too_many_rules(total: usize) -> Problem {
    Problem::new(
        "resilience.provider_error_rules",
        format!("at most {MAX_PROVIDER_ERROR_RULES} rules total ({total} given)"),
    )
}

/// Bounds of one operator error rule (A §6.4).
fn rule_problems(
    key: &str,
    status: u16,
    pattern: &str,
    cooldown_ms: Option<u64>,
    problems: &mut Vec<Problem>,
) {
    if !(100..=599).contains(&status) {
        problems.push(Problem::new(
            format!("{key}.status"),
            out_of_range(u64::from(status), 100, 599),
        ));
    }
    let len = pattern.chars().count();
    if len == 0 || len > 200 {
        problems.push(Problem::new(
            format!("{key}.match"),
            "must be 1..=200 characters",
        ));
    }
    if let Some(ms) = cooldown_ms
        && ms > DAY_MS
    {
        problems.push(Problem::new(
            format!("{key}.cooldown_ms"),
            out_of_range(ms, 0, DAY_MS),
        ));
    }
}

/// Bounds of stored operator rules (for [`ResilienceSettings::check`]).
fn check_rules(s: &ResilienceSettings, problems: &mut Vec<Problem>) {
    let mut total = 0;
    for (provider, rules) in &s.provider_error_rules {
        total += rules.len();
        for (i, r) in rules.iter().enumerate() {
            let key = format!("resilience.provider_error_rules.{provider}[{i}]");
            rule_problems(&key, r.status, &r.pattern, r.cooldown_ms, problems);
        }
    }
    if total > MAX_PROVIDER_ERROR_RULES {
        problems.push(too_many_rules(total));
    }
}

/// Cross-field rules. A value the operator did not set is derived from the one they did
/// (as the spec's normaliser would); two explicit values that contradict each other are a
/// problem naming the dependent key.
fn settle(
    s: &mut ResilienceSettings,
    prov: &Provenance,
    problems: &mut Vec<Problem>,
    notes: &mut Vec<String>,
) {
    for (cat, auth) in [
        ("oauth", AuthKind::OAuth),
        ("apikey", AuthKind::ApiKey),
        ("local", AuthKind::Local),
    ] {
        let b = s.provider_breaker.get_mut(auth);
        let cap = b.failure_threshold.saturating_sub(1).max(1);
        if b.degradation_threshold > cap {
            let path = degradation_path(cat);
            if prov.explicit(path) {
                let message = if b.failure_threshold <= 1 {
                    "must be 1 when failure_threshold is 1".to_string()
                } else {
                    format!(
                        "must be lower than failure_threshold ({})",
                        b.failure_threshold
                    )
                };
                problems.push(Problem::new(prov.key(path), message));
            } else {
                b.degradation_threshold = cap;
            }
        }
    }

    let pc = &mut s.provider_cooldown;
    if pc.max_retry_cooldown_ms < pc.min_retry_cooldown_ms {
        let path = "provider_cooldown.max_retry_cooldown_ms";
        if prov.explicit(path) {
            problems.push(Problem::new(
                prov.key(path),
                format!(
                    "must be at least min_retry_cooldown_ms ({})",
                    pc.min_retry_cooldown_ms
                ),
            ));
        } else {
            pc.max_retry_cooldown_ms = pc.min_retry_cooldown_ms;
        }
    }

    let ml = &mut s.model_lockout;
    if ml.max_cooldown_ms < ml.base_cooldown_ms {
        let path = "model_lockout.max_cooldown_ms";
        if prov.explicit(path) {
            problems.push(Problem::new(
                prov.key(path),
                format!(
                    "must be at least base_cooldown_ms ({})",
                    ml.base_cooldown_ms
                ),
            ));
        } else {
            ml.max_cooldown_ms = ml.base_cooldown_ms;
        }
    }

    let cw = &mut s.combo_cooldown_wait;
    if cw.budget_ms < cw.max_wait_ms {
        let path = "combo_cooldown_wait.budget_ms";
        if prov.explicit(path) {
            problems.push(Problem::new(
                prov.key(path),
                format!("must be at least max_wait_ms ({})", cw.max_wait_ms),
            ));
        } else {
            cw.budget_ms = cw.max_wait_ms;
        }
    }

    let wc = &mut s.wait_for_cooldown;
    let max_wait_ms = wc.max_retry_wait_ms();
    if wc.budget_ms < max_wait_ms {
        let path = "wait_for_cooldown.budget_ms";
        if prov.explicit(path) {
            problems.push(Problem::new(
                prov.key(path),
                format!("must be at least max_retry_wait_sec × 1000 ({max_wait_ms})"),
            ));
        } else {
            wc.budget_ms = max_wait_ms;
        }
    }

    let qp = &mut s.quota_preflight;
    if qp.warn_threshold_percent <= qp.default_threshold_percent {
        let path = "quota_preflight.warn_threshold_percent";
        if prov.explicit(path) {
            problems.push(Problem::new(
                prov.key(path),
                format!(
                    "must be greater than default_threshold_percent ({})",
                    qp.default_threshold_percent
                ),
            ));
        } else {
            qp.warn_threshold_percent = qp.default_threshold_percent + 1;
        }
    }

    force_flags(s, notes);
}

fn degradation_path(cat: &str) -> &'static str {
    match cat {
        "oauth" => "provider_breaker.oauth.degradation_threshold",
        "apikey" => "provider_breaker.apikey.degradation_threshold",
        _ => "provider_breaker.local.degradation_threshold",
    }
}

fn force_flags(s: &mut ResilienceSettings, notes: &mut Vec<String>) {
    let wc = &mut s.wait_for_cooldown;
    if wc.enabled && (wc.max_retries == 0 || wc.max_retry_wait_sec == 0) {
        wc.enabled = false;
        notes.push(
            "resilience.wait_for_cooldown.enabled: forced false because max_retries or \
             max_retry_wait_sec is 0"
                .to_string(),
        );
    }
    let cw = &mut s.combo_cooldown_wait;
    if cw.enabled && (cw.max_wait_ms == 0 || cw.max_attempts == 0) {
        cw.enabled = false;
        notes.push(
            "resilience.combo_cooldown_wait.enabled: forced false because max_wait_ms or \
             max_attempts is 0"
                .to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn build_toml(text: &str) -> (ResilienceSettings, Vec<Problem>, Vec<String>) {
        build_with(text, &no_env)
    }

    fn build_with(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> (ResilienceSettings, Vec<Problem>, Vec<String>) {
        let raw: RawResilience = toml::from_str(text).unwrap();
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let s = build(&raw, env, &mut problems, &mut warnings);
        (s, problems, warnings)
    }

    #[test]
    fn defaults_match_the_spec() {
        let s = ResilienceSettings::default();
        let q = &s.request_queue;
        assert!(!q.auto_enable_api_key_providers, "Tidegate deviation");
        assert_eq!(
            (
                q.requests_per_minute,
                q.min_time_between_requests_ms,
                q.concurrent_requests
            ),
            (60, 350, 6)
        );
        assert_eq!(q.global_concurrent_requests, 0);
        assert_eq!(
            (q.max_wait_ms, q.execution_max_wait_ms, q.max_queue_depth),
            (30_000, 600_000, 0)
        );

        let c = &s.connection_cooldown;
        assert_eq!(
            (
                c.oauth.base_cooldown_ms,
                c.oauth.use_upstream_retry_hints,
                c.oauth.max_backoff_steps
            ),
            (5_000, false, 8)
        );
        assert_eq!(
            (
                c.apikey.base_cooldown_ms,
                c.apikey.use_upstream_retry_hints,
                c.apikey.max_backoff_steps
            ),
            (3_000, true, 5)
        );
        assert_eq!(
            (c.local.base_cooldown_ms, c.local.max_backoff_steps),
            (2_000, 3)
        );
        assert_eq!(c.oauth.use_upstream_429_breaker_hints, None);

        let b = &s.provider_breaker;
        assert_eq!(
            (
                b.oauth.failure_threshold,
                b.oauth.degradation_threshold,
                b.oauth.reset_timeout_ms
            ),
            (8, 5, 60_000)
        );
        assert_eq!(
            (
                b.oauth.max_backoff_multiplier,
                b.oauth.backoff_escalation_count
            ),
            (8, 2)
        );
        assert_eq!(
            (
                b.apikey.failure_threshold,
                b.apikey.degradation_threshold,
                b.apikey.reset_timeout_ms
            ),
            (12, 7, 30_000)
        );
        assert_eq!(
            (
                b.apikey.max_backoff_multiplier,
                b.apikey.backoff_escalation_count
            ),
            (4, 3)
        );
        assert_eq!(
            (b.local.failure_threshold, b.local.reset_timeout_ms),
            (2, 15_000)
        );
        assert_eq!(s.half_open_probe_timeout_ms, 30_000);

        let t = &s.token_refresh_breaker;
        assert_eq!(
            (t.scope, t.failure_threshold, t.cooldown_ms),
            (TokenRefreshScope::Provider, 5, 1_800_000)
        );
        let w = &s.wait_for_cooldown;
        assert_eq!(
            (w.enabled, w.max_retries, w.max_retry_wait_sec, w.budget_ms),
            (true, 5, 90, 300_000)
        );
        let cw = &s.combo_cooldown_wait;
        assert_eq!(
            (cw.enabled, cw.max_wait_ms, cw.max_attempts, cw.budget_ms),
            (true, 90_000, 5, 300_000)
        );
        assert!(s.quota_share_concurrency_limit.enabled);
        assert!(!s.stream_stall_cooldown.enabled);

        let pc = &s.provider_cooldown;
        assert_eq!(
            (
                pc.enabled,
                pc.min_retry_cooldown_ms,
                pc.max_retry_cooldown_ms
            ),
            (false, 5_000, 300_000)
        );
        let g = |w: &WindowGate| (w.failure_threshold, w.failure_window_ms, w.cooldown_ms);
        assert_eq!(g(&pc.oauth), (10, 900_000, 300_000));
        assert_eq!(g(&pc.apikey), (15, 1_800_000, 600_000));
        assert_eq!(g(&pc.local), (2, 300_000, 60_000));

        let qp = &s.quota_preflight;
        assert_eq!(
            (
                qp.enabled,
                qp.default_threshold_percent,
                qp.warn_threshold_percent
            ),
            (false, 2, 20)
        );
        assert!(qp.provider_window_defaults.is_empty());

        let sr = &s.stream_recovery;
        assert!(!sr.enabled && !sr.continue_mid_stream);
        let tw = &sr.throughput_watchdog;
        assert_eq!(
            (
                tw.enabled,
                tw.warmup_ms,
                tw.window_ms,
                tw.min_useful_bytes_per_second,
                tw.min_useful_bytes
            ),
            (false, 30_000, 30_000, 4, 1)
        );
        assert_eq!(s.stream_watchdog.stall_timeout_ms, 80_000);
        assert_eq!(s.credential_health_check.interval_minutes, 60);

        let ml = &s.model_lockout;
        assert!(!ml.enabled && ml.use_exponential_backoff);
        assert_eq!(ml.error_codes, vec![403, 404, 429, 502, 503, 504]);
        assert_eq!(
            (
                ml.base_cooldown_ms,
                ml.max_cooldown_ms,
                ml.max_backoff_steps
            ),
            (120_000, 1_800_000, 10)
        );
        assert!(s.provider_error_rules.is_empty() && s.provider_quota_overrides.is_empty());
    }

    #[test]
    fn defaults_pass_their_own_checks() {
        let s = ResilienceSettings::default();
        assert_eq!(s.check(), vec![]);
        let (built, problems, warnings) = build_toml("");
        assert!(problems.is_empty() && warnings.is_empty());
        assert_eq!(built, ResilienceSettings::default());
    }

    #[test]
    fn upstream_429_hints_default_per_category() {
        let mut s = ResilienceSettings::default();
        assert!(s.use_upstream_429_breaker_hints(AuthKind::OAuth));
        assert!(s.use_upstream_429_breaker_hints(AuthKind::ApiKey));
        assert!(!s.use_upstream_429_breaker_hints(AuthKind::Local));
        s.connection_cooldown.apikey.use_upstream_429_breaker_hints = Some(false);
        assert!(!s.use_upstream_429_breaker_hints(AuthKind::ApiKey));
    }

    #[test]
    fn file_sets_every_section() {
        let (s, problems, _) = build_toml(
            r#"
            half_open_probe_timeout_ms = 5000
            [request_queue]
            auto_enable_api_key_providers = true
            max_wait_ms = 0
            [connection_cooldown.oauth]
            base_cooldown_ms = 7000
            use_upstream_429_breaker_hints = false
            [provider_breaker.apikey]
            failure_threshold = 20
            degradation_threshold = 10
            [token_refresh_breaker]
            scope = "connection"
            [provider_cooldown.local]
            failure_threshold = 3
            [quota_preflight.provider_window_defaults.codex]
            session = 10
            [provider_quota_overrides.nvidia]
            rpm = 40
            [model_lockout]
            error_codes = [429]
            [[provider_error_rules.OpenRouter]]
            status = 400
            match = "Insufficient"
            scope = "provider"
            cooldown_ms = 21600000
            "#,
        );
        assert_eq!(problems, vec![]);
        assert_eq!(s.half_open_probe_timeout_ms, 5_000);
        assert!(s.request_queue.auto_enable_api_key_providers);
        assert_eq!(s.request_queue.max_wait_ms, 0);
        assert_eq!(s.connection_cooldown.oauth.base_cooldown_ms, 7_000);
        assert_eq!(
            s.connection_cooldown.oauth.use_upstream_429_breaker_hints,
            Some(false)
        );
        assert_eq!(s.provider_breaker.apikey.failure_threshold, 20);
        assert_eq!(s.provider_breaker.apikey.degradation_threshold, 10);
        assert_eq!(s.token_refresh_breaker.scope, TokenRefreshScope::Connection);
        assert_eq!(s.provider_cooldown.local.failure_threshold, 3);
        assert_eq!(
            s.quota_preflight.provider_window_defaults["codex"]["session"],
            10
        );
        assert_eq!(s.provider_quota_overrides["nvidia"].rpm, Some(40));
        assert_eq!(s.model_lockout.error_codes, vec![429]);
        let rules = s.error_rules_for("OPENROUTER");
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].pattern, "insufficient");
        assert_eq!(rules[0].reason, ErrorReason::QuotaExhausted);
        assert_eq!(rules[0].scope, RuleScope::Provider);
        assert_eq!(rules[0].cooldown_ms, Some(21_600_000));
    }

    #[test]
    fn every_scalar_is_reachable_from_the_file_and_bounded() {
        // Writes each field one past its upper bound at its TOML path and expects exactly
        // one problem naming that path: proves the table and the raw structs agree.
        for f in num_fields() {
            let (section, key) = match f.path.rsplit_once('.') {
                Some((section, key)) => (Some(section), key),
                None => (None, f.path),
            };
            let text = match section {
                Some(section) => format!("[{section}]\n{key} = {}\n", f.max + 1),
                None => format!("{key} = {}\n", f.max + 1),
            };
            let (_, problems, _) = build_toml(&text);
            assert_eq!(
                problems,
                vec![Problem::new(
                    format!("resilience.{}", f.path),
                    out_of_range(f.max + 1, f.min, f.max)
                )],
                "{}",
                f.path
            );
            if f.min > 0 {
                let text = match section {
                    Some(section) => format!("[{section}]\n{key} = {}\n", f.min - 1),
                    None => format!("{key} = {}\n", f.min - 1),
                };
                let (_, problems, _) = build_toml(&text);
                assert_eq!(problems.len(), 1, "{}", f.path);
            }
        }
        for f in bool_fields() {
            let (section, key) = f.path.rsplit_once('.').unwrap();
            let (_, problems, _) = build_toml(&format!("[{section}]\n{key} = true\n"));
            assert_eq!(problems, vec![], "{}", f.path);
        }
    }

    #[test]
    fn cross_field_rules_name_the_dependent_key() {
        let (_, problems, _) = build_toml(
            "[provider_breaker.oauth]\nfailure_threshold = 4\ndegradation_threshold = 4\n\
             [provider_cooldown]\nmin_retry_cooldown_ms = 9000\nmax_retry_cooldown_ms = 8000\n\
             [model_lockout]\nbase_cooldown_ms = 60000\nmax_cooldown_ms = 30000\n\
             [combo_cooldown_wait]\nmax_wait_ms = 20000\nbudget_ms = 10000\n\
             [wait_for_cooldown]\nmax_retry_wait_sec = 30\nbudget_ms = 1000\n\
             [quota_preflight]\ndefault_threshold_percent = 30\nwarn_threshold_percent = 30\n",
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "resilience.provider_breaker.oauth.degradation_threshold",
                "resilience.provider_cooldown.max_retry_cooldown_ms",
                "resilience.model_lockout.max_cooldown_ms",
                "resilience.combo_cooldown_wait.budget_ms",
                "resilience.wait_for_cooldown.budget_ms",
                "resilience.quota_preflight.warn_threshold_percent",
            ]
        );
        assert_eq!(
            problems[0].message,
            "must be lower than failure_threshold (4)"
        );
    }

    #[test]
    fn unset_dependents_are_derived_not_rejected() {
        let (s, problems, _) = build_toml(
            "[provider_breaker.apikey]\nfailure_threshold = 3\n\
             [provider_breaker.oauth]\nfailure_threshold = 1\n\
             [provider_cooldown]\nmin_retry_cooldown_ms = 600000\n\
             [model_lockout]\nbase_cooldown_ms = 600000\n\
             [quota_preflight]\ndefault_threshold_percent = 50\n",
        );
        assert_eq!(problems, vec![]);
        assert_eq!(s.provider_breaker.apikey.degradation_threshold, 2);
        assert_eq!(s.provider_breaker.oauth.degradation_threshold, 1);
        assert_eq!(s.provider_cooldown.max_retry_cooldown_ms, 600_000);
        assert_eq!(s.model_lockout.max_cooldown_ms, 1_800_000);
        assert_eq!(s.quota_preflight.warn_threshold_percent, 51);
    }

    #[test]
    fn zero_counts_force_enabled_off_with_a_warning() {
        let (s, problems, warnings) = build_toml(
            "[combo_cooldown_wait]\nmax_attempts = 0\n[wait_for_cooldown]\nmax_retries = 0\n",
        );
        assert_eq!(problems, vec![]);
        assert!(!s.combo_cooldown_wait.enabled);
        assert!(!s.wait_for_cooldown.enabled);
        // Two forced flags (both waits are active).
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("resilience.wait_for_cooldown.enabled:"));
        assert!(warnings[1].starts_with("resilience.combo_cooldown_wait.enabled:"));

        let mut s = ResilienceSettings::default();
        s.combo_cooldown_wait.max_wait_ms = 0;
        assert_eq!(s.normalize().len(), 1);
        assert!(!s.combo_cooldown_wait.enabled && s.wait_for_cooldown.enabled);
        assert!(s.normalize().is_empty());
    }

    #[test]
    fn bad_maps_and_rules_are_each_reported() {
        let (_, problems, _) = build_toml(
            r#"
            [token_refresh_breaker]
            scope = "global"
            [quota_preflight.provider_window_defaults.codex]
            weekly = 101
            [provider_quota_overrides.nvidia]
            rpm = 0
            [model_lockout]
            error_codes = [429, 99]
            [[provider_error_rules.acme]]
            status = 600
            match = ""
            scope = "everywhere"
            [[provider_error_rules.acme]]
            status = 400
            match = "x"
            scope = "model"
            reason = "bogus"
            cooldown_ms = 86400001
            "#,
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "resilience.token_refresh_breaker.scope",
                "resilience.provider_error_rules.acme[0].status",
                "resilience.provider_error_rules.acme[0].match",
                "resilience.provider_error_rules.acme[0].scope",
                "resilience.provider_error_rules.acme[1].cooldown_ms",
                "resilience.provider_error_rules.acme[1].reason",
                "resilience.quota_preflight.provider_window_defaults.codex.weekly",
                "resilience.provider_quota_overrides.nvidia.rpm",
                "resilience.model_lockout.error_codes[1]",
            ]
        );
    }

    #[test]
    fn stored_rules_are_bounded_too() {
        let mut s = ResilienceSettings::default();
        let rule = ProviderErrorRule {
            status: 600,
            pattern: String::new(),
            scope: RuleScope::Model,
            reason: ErrorReason::Unknown,
            cooldown_ms: Some(DAY_MS + 1),
        };
        s.provider_error_rules
            .insert("acme".into(), vec![rule.clone(); 51]);
        let problems = s.check();
        assert!(
            problems
                .iter()
                .any(|p| p.key == "resilience.provider_error_rules"
                    && p.message.contains("at most 50 rules total"))
        );
        assert!(
            problems
                .iter()
                .any(|p| p.key == "resilience.provider_error_rules.acme[0].status")
        );
        assert!(
            problems
                .iter()
                .any(|p| p.key == "resilience.provider_error_rules.acme[0].match")
        );
        assert!(
            problems
                .iter()
                .any(|p| p.key == "resilience.provider_error_rules.acme[0].cooldown_ms")
        );
    }

    #[test]
    fn too_many_rules_in_the_file() {
        let mut text = String::new();
        for i in 0..51 {
            text.push_str(&format!(
                "[[provider_error_rules.p{}]]\nstatus = 429\nmatch = \"x\"\nscope = \"model\"\n",
                i % 3
            ));
        }
        let (_, problems, _) = build_toml(&text);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "resilience.provider_error_rules");
    }

    #[test]
    fn check_treats_everything_as_explicit() {
        let mut s = ResilienceSettings::default();
        s.provider_breaker.apikey.degradation_threshold = 12;
        s.request_queue.concurrent_requests = 0;
        let problems = s.check();
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "resilience.request_queue.concurrent_requests",
                "resilience.provider_breaker.apikey.degradation_threshold",
            ]
        );
    }

    #[test]
    fn json_has_the_spec_names() {
        let v = serde_json::to_value(ResilienceSettings::default()).unwrap();
        assert_eq!(
            v["requestQueue"],
            json!({
                "autoEnableApiKeyProviders": false,
                "requestsPerMinute": 60,
                "minTimeBetweenRequestsMs": 350,
                "concurrentRequests": 6,
                "globalConcurrentRequests": 0,
                "maxWaitMs": 30000,
                "executionMaxWaitMs": 600000,
                "maxQueueDepth": 0
            })
        );
        assert_eq!(
            v["connectionCooldown"]["apikey"],
            json!({"baseCooldownMs": 3000, "useUpstreamRetryHints": true, "maxBackoffSteps": 5})
        );
        assert_eq!(v["providerBreaker"]["oauth"]["failureThreshold"], 8);
        assert_eq!(v["providerBreaker"]["oauth"]["degradationThreshold"], 5);
        assert_eq!(v["providerBreaker"]["oauth"]["resetTimeoutMs"], 60000);
        assert_eq!(v["halfOpenProbeTimeoutMs"], 30000);
        assert_eq!(
            v["tokenRefreshBreaker"],
            json!({"scope": "provider", "failureThreshold": 5, "cooldownMs": 1800000})
        );
        assert_eq!(
            v["waitForCooldown"],
            json!({"enabled": true, "maxRetries": 5, "maxRetryWaitSec": 90, "budgetMs": 300000})
        );
        assert_eq!(
            v["comboCooldownWait"],
            json!({"enabled": true, "maxWaitMs": 90000, "maxAttempts": 5, "budgetMs": 300000})
        );
        assert_eq!(v["quotaShareConcurrencyLimit"], json!({"enabled": true}));
        assert_eq!(v["streamStallCooldown"], json!({"enabled": false}));
        assert_eq!(v["providerCooldown"]["minRetryCooldownMs"], 5000);
        assert_eq!(v["providerCooldown"]["maxRetryCooldownMs"], 300000);
        assert_eq!(v["providerCooldown"]["enabled"], false);
        assert_eq!(
            v["quotaPreflight"],
            json!({"enabled": false, "defaultThresholdPercent": 2, "warnThresholdPercent": 20,
                   "providerWindowDefaults": {}})
        );
        assert_eq!(
            v["streamRecovery"]["throughputWatchdog"],
            json!({"enabled": false, "warmupMs": 30000, "windowMs": 30000,
                   "minUsefulBytesPerSecond": 4, "minUsefulBytes": 1})
        );
        assert_eq!(v["streamRecovery"]["continueMidStream"], false);
        assert_eq!(v["providerQuotaOverrides"], json!({}));
        assert_eq!(v["credentialHealthCheck"], json!({"intervalMinutes": 60}));
        assert_eq!(
            v["modelLockout"],
            json!({"enabled": false, "errorCodes": [403, 404, 429, 502, 503, 504],
                   "baseCooldownMs": 120000, "maxCooldownMs": 1800000, "maxBackoffSteps": 10,
                   "useExponentialBackoff": true})
        );
        assert_eq!(
            v["legacy"]["profiles"]["oauth"],
            json!({"transientCooldown": 5000, "rateLimitCooldown": 5000, "maxBackoffLevel": 8,
                   "circuitBreakerThreshold": 8, "degradationThreshold": 5,
                   "circuitBreakerReset": 60000})
        );
        assert_eq!(v["legacy"]["profiles"]["apikey"]["rateLimitCooldown"], 0);
        assert_eq!(
            v["legacy"]["defaults"],
            json!({"requestsPerMinute": 60, "minTimeBetweenRequests": 350,
                   "concurrentRequests": 6})
        );
    }

    #[test]
    fn json_of_optional_fields_and_rules() {
        let (s, problems, _) = build_toml(
            "[connection_cooldown.oauth]\nuse_upstream_429_breaker_hints = true\n\
             [provider_quota_overrides.nvidia]\nrpm = 40\nprovider_concurrency = 0\n\
             [[provider_error_rules.acme]]\nstatus = 403\nmatch = \"denied\"\nscope = \"connection\"\n\
             reason = \"auth_error\"\n",
        );
        assert_eq!(problems, vec![]);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v["connectionCooldown"]["oauth"]["useUpstream429BreakerHints"],
            true
        );
        assert_eq!(
            v["providerQuotaOverrides"],
            json!({"nvidia": {"rpm": 40, "providerConcurrency": 0}})
        );
        assert_eq!(
            v["providerErrorRules"],
            json!({"acme": [{"status": 403, "match": "denied", "scope": "connection",
                             "reason": "auth_error"}]})
        );
    }

    // -- environment overrides (default < env < file) ------------------------------------

    fn with_env(
        vars: &[(&str, &str)],
        file: &str,
    ) -> (ResilienceSettings, Vec<Problem>, Vec<String>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        build_with(file, &move |k: &str| map.get(k).cloned())
    }

    #[test]
    fn env_overrides_defaults() {
        let (s, problems, _) = with_env(
            &[
                ("RATE_LIMIT_MAX_WAIT_MS", "15000"),
                ("RATE_LIMIT_EXECUTION_MAX_WAIT_MS", " 900000 "),
                ("RATE_LIMIT_MAX_QUEUE_DEPTH", "50"),
                ("RATE_LIMIT_AUTO_ENABLE", "on"),
                ("OMNIROUTE_CIRCUIT_BREAKER_API_KEY_THRESHOLD", "20"),
                ("OMNIROUTE_CIRCUIT_BREAKER_OAUTH_RESET_MS", "90000"),
                ("OMNIROUTE_CIRCUIT_BREAKER_LOCAL_THRESHOLD", "4"),
                (
                    "OMNIROUTE_PROVIDER_BREAKER_OAUTH_MAX_BACKOFF_MULTIPLIER",
                    "2",
                ),
                (
                    "OMNIROUTE_PROVIDER_BREAKER_API_KEY_FAILURE_WINDOW_MS",
                    "60000",
                ),
                ("PROVIDER_COOLDOWN_ENABLED", "true"),
                ("PROVIDER_COOLDOWN_MIN_MS", "1000"),
                ("QUOTA_PREFLIGHT_CUTOFF_ENABLED", "1"),
                ("STREAM_RECOVERY_ENABLED", "true"),
                ("STREAM_THROUGHPUT_WATCHDOG_ENABLED", "true"),
                ("STREAM_THROUGHPUT_WATCHDOG_MIN_BYTES_PER_SECOND", "16"),
                ("STREAM_READINESS_TIMEOUT_MS", "120000"),
            ],
            "",
        );
        assert_eq!(problems, vec![]);
        let q = &s.request_queue;
        assert_eq!(
            (q.max_wait_ms, q.execution_max_wait_ms, q.max_queue_depth),
            (15_000, 900_000, 50)
        );
        assert!(q.auto_enable_api_key_providers);
        assert_eq!(s.provider_breaker.apikey.failure_threshold, 20);
        assert_eq!(s.provider_breaker.oauth.reset_timeout_ms, 90_000);
        assert_eq!(s.provider_breaker.local.failure_threshold, 4);
        assert_eq!(s.provider_breaker.oauth.max_backoff_multiplier, 2);
        assert_eq!(s.provider_cooldown.apikey.failure_window_ms, 60_000);
        assert!(s.provider_cooldown.enabled);
        assert_eq!(s.provider_cooldown.min_retry_cooldown_ms, 1_000);
        assert!(s.quota_preflight.enabled);
        assert!(s.stream_recovery.enabled);
        assert!(s.stream_recovery.throughput_watchdog.enabled);
        assert_eq!(
            s.stream_recovery
                .throughput_watchdog
                .min_useful_bytes_per_second,
            16
        );
        assert_eq!(s.stream_watchdog.stall_timeout_ms, 120_000);
    }

    #[test]
    fn the_first_listed_variable_wins() {
        let (s, _, _) = with_env(
            &[
                ("STREAM_READINESS_TIMEOUT_MS", "120000"),
                ("STREAM_CONTENT_STALL_TIMEOUT_MS", "0"),
            ],
            "",
        );
        assert_eq!(s.stream_watchdog.stall_timeout_ms, 0);
    }

    #[test]
    fn the_file_wins_over_env() {
        let (s, problems, _) = with_env(
            &[
                ("RATE_LIMIT_MAX_WAIT_MS", "15000"),
                ("PROVIDER_COOLDOWN_ENABLED", "true"),
            ],
            "[request_queue]\nmax_wait_ms = 45000\n[provider_cooldown]\nmax_retry_cooldown_ms = 60000\n",
        );
        assert_eq!(problems, vec![]);
        assert_eq!(s.request_queue.max_wait_ms, 45_000);
        // Not in the file: the env value stays.
        assert!(s.provider_cooldown.enabled);
    }

    #[test]
    fn rate_limit_auto_enable_wins_over_the_file_both_ways() {
        for (var, file, expect) in [("true", false, true), ("off", true, false)] {
            let (s, problems, warnings) = with_env(
                &[("RATE_LIMIT_AUTO_ENABLE", var)],
                &format!("[request_queue]\nauto_enable_api_key_providers = {file}\n"),
            );
            assert_eq!(problems, vec![]);
            assert_eq!(s.request_queue.auto_enable_api_key_providers, expect);
            assert!(
                warnings
                    .iter()
                    .any(|w| w.contains("overridden by RATE_LIMIT_AUTO_ENABLE")),
                "{warnings:?}"
            );
        }
        // Without the variable the file decides.
        let (s, _, warnings) = with_env(
            &[],
            "[request_queue]\nauto_enable_api_key_providers = true\n",
        );
        assert!(s.request_queue.auto_enable_api_key_providers);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn malformed_and_out_of_range_values_name_the_variable() {
        let (_, problems, _) = with_env(
            &[
                ("RATE_LIMIT_MAX_WAIT_MS", "0"),
                ("RATE_LIMIT_MAX_QUEUE_DEPTH", "lots"),
                ("PROVIDER_COOLDOWN_ENABLED", "maybe"),
                ("OMNIROUTE_CIRCUIT_BREAKER_OAUTH_RESET_MS", "10"),
                ("STREAM_RECOVERY_ENABLED", "   "),
            ],
            "",
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "PROVIDER_COOLDOWN_ENABLED",
                "RATE_LIMIT_MAX_WAIT_MS",
                "RATE_LIMIT_MAX_QUEUE_DEPTH",
                "OMNIROUTE_CIRCUIT_BREAKER_OAUTH_RESET_MS",
            ]
        );
        assert_eq!(
            problems[1].to_string(),
            "RATE_LIMIT_MAX_WAIT_MS: 0 is out of range (1..=86400000)"
        );
    }

    #[test]
    fn env_threshold_lowers_an_unset_degradation_threshold() {
        let (s, problems, _) =
            with_env(&[("OMNIROUTE_CIRCUIT_BREAKER_API_KEY_THRESHOLD", "5")], "");
        assert_eq!(problems, vec![]);
        assert_eq!(s.provider_breaker.apikey.degradation_threshold, 4);
    }

    #[test]
    fn contradicting_env_values_name_the_variable() {
        let (_, problems, _) = with_env(
            &[
                ("OMNIROUTE_CIRCUIT_BREAKER_API_KEY_THRESHOLD", "5"),
                (
                    "OMNIROUTE_PROVIDER_BREAKER_API_KEY_DEGRADATION_THRESHOLD",
                    "6",
                ),
                ("PROVIDER_COOLDOWN_MIN_MS", "9000"),
                ("PROVIDER_COOLDOWN_MAX_MS", "8000"),
            ],
            "",
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "OMNIROUTE_PROVIDER_BREAKER_API_KEY_DEGRADATION_THRESHOLD",
                "PROVIDER_COOLDOWN_MAX_MS",
            ]
        );
    }

    #[test]
    fn every_variable_is_read() {
        // Setting each variable to an impossible value must produce a problem naming it.
        for var in env_variables() {
            let (_, problems, _) = with_env(&[(var, "not-a-value")], "");
            assert_eq!(problems.len(), 1, "{var}");
            assert_eq!(problems[0].key, var);
        }
    }

    // -- accepted but not active yet -----------------------------------------------------

    fn not_active(warnings: &[String]) -> Vec<&str> {
        warnings
            .iter()
            .filter(|w| w.ends_with(": accepted but not active yet"))
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn unset_inactive_settings_warn_nothing() {
        let (_, problems, warnings) = build_toml("");
        assert_eq!(problems, vec![]);
        assert_eq!(warnings, Vec::<String>::new());
        // Active settings beside them warn nothing either.
        let (_, problems, warnings) = build_toml(
            "[model_lockout]\nmax_cooldown_ms = 600000\n\
             [stream_stall_cooldown]\nenabled = true\n",
        );
        assert_eq!(problems, vec![]);
        assert_eq!(warnings, Vec::<String>::new());
    }

    #[test]
    fn each_inactive_setting_warns_once_when_written_in_the_file() {
        let file = "\
            [stream_watchdog]\nstall_timeout_ms = 1000\nactive_timeout_ms = 2000\n\
            [quota_preflight]\nenabled = true\n\
            [wait_for_cooldown]\nmax_retries = 2\n\
            [combo_cooldown_wait]\nenabled = false\n\
            [provider_cooldown]\nenabled = true\n\
            [provider_cooldown.oauth]\nfailure_threshold = 3\n\
            [token_refresh_breaker]\nfailure_threshold = 3\n\
            [credential_health_check]\ninterval_minutes = 0\n\
            [stream_recovery]\ncontinue_mid_stream = true\n\
            [model_lockout]\nenabled = true\nerror_codes = [429]\nbase_cooldown_ms = 60000\n\
            max_backoff_steps = 2\nuse_exponential_backoff = false\nmax_cooldown_ms = 90000\n";
        let (_, problems, warnings) = build_toml(file);
        assert_eq!(problems, vec![]);
        let want: Vec<String> = NOT_ACTIVE_YET
            .iter()
            .map(|p| not_active_warning(p))
            .collect();
        assert_eq!(not_active(&warnings), want);
        assert_eq!(
            want[0],
            "resilience.quota_preflight: accepted but not active yet"
        );
    }

    #[test]
    fn inactive_settings_set_by_env_or_by_non_scalar_keys_warn_too() {
        let (_, problems, warnings) = with_env(
            &[
                ("PROVIDER_COOLDOWN_ENABLED", "true"),
                ("STREAM_ACTIVE_TIMEOUT_MS", "5000"),
                ("STREAM_RECOVERY_ENABLED", "true"),
                ("QUOTA_PREFLIGHT_CUTOFF_ENABLED", "true"),
            ],
            "",
        );
        assert_eq!(problems, vec![]);
        assert_eq!(
            not_active(&warnings),
            vec!["resilience.quota_preflight: accepted but not active yet"]
        );
        let (_, problems, warnings) = build_toml(
            "[token_refresh_breaker]\nscope = \"connection\"\n\
             [quota_preflight.provider_window_defaults.codex]\nsession = 10\n",
        );
        assert_eq!(problems, vec![]);
        assert_eq!(
            not_active(&warnings),
            vec![
                "resilience.quota_preflight: accepted but not active yet",
                "resilience.token_refresh_breaker: accepted but not active yet",
            ]
        );
    }
}
