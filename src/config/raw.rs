//! The TOML file as written: serde structs that mirror `config/tidegate.toml` key for key,
//! units in the key names. Unknown keys are rejected, but not with serde's
//! `deny_unknown_fields`, which stops at the first one: `validate` deserializes through
//! `serde_ignored` and reports every unknown key with its path, beside every other problem
//! (beside every value of the wrong type, when one stops serde: `validate` reads the file
//! again without it). Nothing here is checked beyond
//! TOML types; `validate` turns these into the typed [`super::Config`] and reports every
//! problem at once. Values that select among names (formats, scopes, strategies) stay
//! strings here so a bad one becomes a problem naming its key rather than a serde error.
//!
//! The `[resilience]` structs mirror the field names of [`super::resilience`] exactly (each
//! value wrapped in `Option`, unset = not written), which lets one table of accessors
//! serve both layers.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub client_keys: Vec<RawClientKey>,
    #[serde(default)]
    pub providers: Vec<RawProvider>,
    #[serde(default)]
    pub connections: Vec<RawConnection>,
    #[serde(default)]
    pub combos: Vec<RawCombo>,
    /// The combo config cascade's second layer (B §3.1).
    #[serde(default)]
    pub combo_defaults: RawComboConfig,
    /// The cascade's third layer, by provider id.
    #[serde(default)]
    pub combo_provider_overrides: BTreeMap<String, RawComboConfig>,
    #[serde(default)]
    pub resilience: RawResilience,
    #[serde(default)]
    pub emergency_fallback: RawEmergencyFallback,
}

/// `[emergency_fallback]`: where a request goes once when its provider says the budget is
/// spent (spec B §9.1).
#[derive(Debug, Default, Deserialize)]
pub struct RawEmergencyFallback {
    /// `"<provider>/<model>"`.
    pub target: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawServer {
    pub listen: Option<String>,
    pub workers: Option<u32>,
    pub state_dir: Option<String>,
    pub admin_token_env: Option<String>,
    pub max_request_body_bytes: Option<u64>,
    pub header_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub response_header_timeout_ms: Option<u64>,
    pub body_idle_timeout_ms: Option<u64>,
    pub request_timeout_ms: Option<u64>,
    pub pool_idle_timeout_ms: Option<u64>,
    pub pool_max_idle_per_host: Option<u32>,
    pub max_model_lockouts: Option<u64>,
    pub shutdown_grace_ms: Option<u64>,
    pub pin_threads: Option<bool>,
    pub snapshot_interval_ms: Option<u64>,
    pub mesh_ring_capacity: Option<u64>,
    pub allow_shared_listen: Option<bool>,
    pub allow_open_gateway: Option<bool>,
    pub log_format: Option<String>,
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    pub cors_allow_origins: Option<Vec<String>>,
    pub metrics_public: Option<bool>,
    pub lease_ttl_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawClientKey {
    pub id: Option<String>,
    pub key: Option<String>,
    pub key_env: Option<String>,
    pub key_sha256: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub allowed_connections: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawProvider {
    pub id: Option<String>,
    pub kind: Option<String>,
    pub format: Option<String>,
    pub auth: Option<String>,
    pub base_url: Option<String>,
    #[serde(default)]
    pub models: Vec<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub ca_file: Option<String>,
    pub daily_reset_hour: Option<i64>,
    pub daily_reset_utc_offset_minutes: Option<i64>,
    pub responses_api: Option<bool>,
    /// Model → USD per million input tokens. Values are read as TOML values and checked
    /// one by one, so one wrong price is one problem naming its key.
    #[serde(default)]
    pub input_usd_per_mtok: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawConnection {
    pub id: Option<String>,
    pub provider: Option<String>,
    pub api_key_env: Option<String>,
    pub priority: Option<u32>,
    pub weight: Option<u32>,
    pub max_concurrent: Option<u32>,
    pub disable_cooling: Option<bool>,
    pub egress: Option<String>,
    #[serde(default)]
    pub rate_limit_overrides: RawRateLimitOverrides,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawRateLimitOverrides {
    pub max_concurrent: Option<u32>,
    #[serde(default)]
    pub model_concurrency: BTreeMap<String, u32>,
    pub max_wait_ms: Option<u64>,
    pub execution_max_wait_ms: Option<u64>,
    pub requests_per_minute: Option<u32>,
    pub min_time_between_requests_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawCombo {
    pub name: Option<String>,
    pub strategy: Option<String>,
    pub targets: Option<Vec<RawComboTarget>>,
    /// The cascade's last layer: this combo's own settings.
    #[serde(default)]
    pub config: RawComboConfig,
}

/// One layer of the combo config cascade (`[combo_defaults]`,
/// `[combo_provider_overrides.<id>]`, `[combos.config]`); see `config::combo`.
#[derive(Debug, Default, Deserialize)]
pub struct RawComboConfig {
    pub max_retries: Option<u32>,
    pub retry_delay_ms: Option<u64>,
    pub fallback_delay_ms: Option<u64>,
    pub failover_before_retry: Option<bool>,
    pub max_set_retries: Option<u32>,
    pub set_retry_delay_ms: Option<u64>,
    pub hedging: Option<bool>,
    pub hedge_delay_ms: Option<u64>,
    pub combo_timeout_ms: Option<u64>,
    pub target_timeout_ms: Option<u64>,
    pub max_combo_depth: Option<u32>,
    pub concurrency_per_model: Option<u32>,
    pub queue_timeout_ms: Option<u64>,
    pub queue_depth: Option<u32>,
    pub sticky_round_robin_limit: Option<u32>,
    pub sticky_weighted_limit: Option<u32>,
}

/// `"provider/model"`, `{ model = "provider/model", weight = n }` or a nested combo
/// `{ combo = "<name>", weight = n }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RawComboTarget {
    Plain(String),
    Weighted(RawWeightedTarget),
}

#[derive(Debug, Deserialize)]
pub struct RawWeightedTarget {
    pub model: Option<String>,
    pub combo: Option<String>,
    pub weight: Option<u32>,
    /// Every other key of the table. `RawComboTarget` is untagged, so serde reads the table
    /// into a buffer first, where `serde_ignored` no longer sees its keys: they are kept
    /// here and reported by `validate` as unknown keys.
    #[serde(flatten)]
    pub other: BTreeMap<String, toml::Value>,
}

impl RawWeightedTarget {
    /// The keys a target table takes (for the "did you mean" of an unknown one).
    pub const FIELDS: &'static [&'static str] = &["model", "combo", "weight"];
}

// ---------------------------------------------------------------------------------------
// [resilience]

#[derive(Debug, Default, Deserialize)]
pub struct RawResilience {
    pub half_open_probe_timeout_ms: Option<u64>,
    pub session_affinity_ttl_ms: Option<u64>,
    #[serde(default)]
    pub request_queue: RawRequestQueue,
    #[serde(default)]
    pub connection_cooldown: RawPerAuth<RawConnectionCooldown>,
    #[serde(default)]
    pub provider_breaker: RawPerAuth<RawBreakerProfile>,
    #[serde(default)]
    pub token_refresh_breaker: RawTokenRefreshBreaker,
    #[serde(default)]
    pub wait_for_cooldown: RawWaitForCooldown,
    #[serde(default)]
    pub combo_cooldown_wait: RawComboCooldownWait,
    #[serde(default)]
    pub quota_share_concurrency_limit: RawToggle,
    #[serde(default)]
    pub stream_stall_cooldown: RawToggle,
    #[serde(default)]
    pub provider_cooldown: RawProviderCooldown,
    #[serde(default)]
    pub quota_preflight: RawQuotaPreflight,
    #[serde(default)]
    pub stream_recovery: RawStreamRecovery,
    #[serde(default)]
    pub stream_watchdog: RawStreamWatchdog,
    #[serde(default)]
    pub provider_quota_overrides: BTreeMap<String, RawProviderQuotaOverride>,
    #[serde(default)]
    pub credential_health_check: RawCredentialHealthCheck,
    #[serde(default)]
    pub model_lockout: RawModelLockout,
    #[serde(default)]
    pub provider_error_rules: BTreeMap<String, Vec<RawProviderErrorRule>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de> + Default"))]
pub struct RawPerAuth<T> {
    #[serde(default)]
    pub oauth: T,
    #[serde(default)]
    pub apikey: T,
    #[serde(default)]
    pub local: T,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawRequestQueue {
    pub auto_enable_api_key_providers: Option<bool>,
    pub requests_per_minute: Option<u32>,
    pub min_time_between_requests_ms: Option<u64>,
    pub concurrent_requests: Option<u32>,
    pub global_concurrent_requests: Option<u32>,
    pub max_wait_ms: Option<u64>,
    pub execution_max_wait_ms: Option<u64>,
    pub max_queue_depth: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawConnectionCooldown {
    pub base_cooldown_ms: Option<u64>,
    pub use_upstream_retry_hints: Option<bool>,
    pub max_backoff_steps: Option<u32>,
    pub use_upstream_429_breaker_hints: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawBreakerProfile {
    pub failure_threshold: Option<u32>,
    pub degradation_threshold: Option<u32>,
    pub reset_timeout_ms: Option<u64>,
    pub max_backoff_multiplier: Option<u32>,
    pub backoff_escalation_count: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawTokenRefreshBreaker {
    pub scope: Option<String>,
    pub failure_threshold: Option<u32>,
    pub cooldown_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawWaitForCooldown {
    pub enabled: Option<bool>,
    pub max_retries: Option<u32>,
    pub max_retry_wait_sec: Option<u32>,
    pub budget_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawComboCooldownWait {
    pub enabled: Option<bool>,
    pub max_wait_ms: Option<u64>,
    pub max_attempts: Option<u32>,
    pub budget_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawToggle {
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawProviderCooldown {
    pub enabled: Option<bool>,
    pub min_retry_cooldown_ms: Option<u64>,
    pub max_retry_cooldown_ms: Option<u64>,
    #[serde(default)]
    pub oauth: RawWindowGate,
    #[serde(default)]
    pub apikey: RawWindowGate,
    #[serde(default)]
    pub local: RawWindowGate,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawWindowGate {
    pub failure_threshold: Option<u32>,
    pub failure_window_ms: Option<u64>,
    pub cooldown_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawQuotaPreflight {
    pub enabled: Option<bool>,
    pub default_threshold_percent: Option<u32>,
    pub warn_threshold_percent: Option<u32>,
    pub provider_window_defaults: Option<BTreeMap<String, BTreeMap<String, u32>>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawStreamRecovery {
    pub enabled: Option<bool>,
    pub continue_mid_stream: Option<bool>,
    #[serde(default)]
    pub throughput_watchdog: RawThroughputWatchdog,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawThroughputWatchdog {
    pub enabled: Option<bool>,
    pub warmup_ms: Option<u64>,
    pub window_ms: Option<u64>,
    pub min_useful_bytes_per_second: Option<u32>,
    pub min_useful_bytes: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawStreamWatchdog {
    pub stall_timeout_ms: Option<u64>,
    pub active_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawProviderQuotaOverride {
    pub rpm: Option<u32>,
    pub concurrency: Option<u32>,
    pub provider_concurrency: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawCredentialHealthCheck {
    pub interval_minutes: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RawModelLockout {
    pub enabled: Option<bool>,
    pub error_codes: Option<Vec<u16>>,
    pub base_cooldown_ms: Option<u64>,
    pub max_cooldown_ms: Option<u64>,
    pub max_backoff_steps: Option<u32>,
    pub use_exponential_backoff: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct RawProviderErrorRule {
    pub status: u16,
    #[serde(rename = "match")]
    pub pattern: String,
    pub scope: String,
    pub reason: Option<String>,
    pub cooldown_ms: Option<u64>,
}
