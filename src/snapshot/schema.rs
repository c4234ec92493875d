//! What the snapshot file holds, section by section: the rkyv schema. Every type here is
//! archived with rkyv (read back through its validated access) and printed with serde by
//! `tidegate snapshot inspect`.
//!
//! Records name providers and connections by their configured ids (`[[providers]] id`,
//! `[[connections]] id`), never by the process's dense indexes: a config that adds or
//! reorders entries still finds each record. Deadlines and instants are wall-clock ms
//! (ARCHITECTURE §5); enums are stored as the strings OmniRoute shows, so an unknown value
//! from a future release is a record to skip, not a file to reject.
//!
//! Each section has a tag and its own version (see `file.rs`). A release that adds a kind
//! of state adds a tag — files written before it simply lack the section, and older
//! releases skip a tag they do not know — so the file's schema version only changes when
//! the header or the section framing does.

use serde::Serialize;

/// Section tags. A tag is never reused for another meaning.
pub mod tag {
    /// [`super::BreakerEntry`].
    pub const BREAKERS: u32 = 1;
    /// [`super::ConnectionEntry`].
    pub const CONNECTIONS: u32 = 2;
    /// [`super::TrackerEntry`].
    pub const PROVIDER_COOLDOWNS: u32 = 3;
    /// [`super::SettingsPatchEntry`]: the resilience settings PATCHed at run time.
    pub const RUNTIME_SETTINGS: u32 = 4;
    /// [`super::ConnectionOverrideEntry`]: `PATCH /api/providers/{id}`.
    pub const CONNECTION_OVERRIDES: u32 = 5;
    /// [`super::PinEntry`]: session affinity pins.
    pub const AFFINITY_PINS: u32 = 6;
    /// [`super::LeaseEntry`]: exclusive session leases.
    pub const LEASES: u32 = 7;

    /// The name `inspect` shows for a tag.
    pub fn name(tag: u32) -> &'static str {
        match tag {
            BREAKERS => "breakers",
            CONNECTIONS => "connections",
            PROVIDER_COOLDOWNS => "providerCooldowns",
            RUNTIME_SETTINGS => "runtimeSettings",
            CONNECTION_OVERRIDES => "connectionOverrides",
            AFFINITY_PINS => "affinityPins",
            LEASES => "leases",
            _ => "unknown",
        }
    }
}

/// The version of each known section this release writes and reads.
pub const BREAKERS_VERSION: u32 = 1;
pub const CONNECTIONS_VERSION: u32 = 1;
pub const PROVIDER_COOLDOWNS_VERSION: u32 = 1;
pub const RUNTIME_SETTINGS_VERSION: u32 = 1;
pub const CONNECTION_OVERRIDES_VERSION: u32 = 1;
pub const AFFINITY_PINS_VERSION: u32 = 1;
pub const LEASES_VERSION: u32 = 1;

/// The body of every section: its records in a list. One generic type (rather than a
/// struct per section) so every section is framed, archived and validated the same way;
/// the archive of `Section<T>` is the archive of a struct with one `Vec<T>` field, which is
/// what the first releases wrote for breakers, connections and provider cooldowns.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct Section<T> {
    pub entries: Vec<T>,
}

/// One circuit breaker: a provider's, or one connection's (`connection` set).
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct BreakerEntry {
    pub provider: String,
    /// Set for a connection-scoped breaker.
    pub connection: Option<String>,
    /// `CLOSED`, `DEGRADED`, `OPEN`, `HALF_OPEN`.
    pub state: String,
    pub failure_count: u32,
    pub last_failure_wall_ms: Option<u64>,
    /// `transient`, `rate_limit`, `quota_exhausted`.
    pub last_failure_kind: Option<String>,
    pub open_cycle_count: u32,
    pub transient_failures: u32,
    pub rate_limit_failures: u32,
    pub quota_exhausted_failures: u32,
    /// Set when `state` is `OPEN`.
    pub open_until_wall_ms: Option<u64>,
}

/// The request-rejected streak of a connection.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct StreakEntry {
    pub count: u32,
    pub last_at_wall_ms: u64,
    pub until_wall_ms: u64,
}

/// Consecutive `expired` verdicts of a connection.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct StrikesEntry {
    pub count: u32,
    pub last_at_wall_ms: u64,
}

/// One connection's state (cooldown, backoff level, terminal state, last error).
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionEntry {
    pub connection: String,
    pub provider: String,
    /// `testStatus`: `active`, `unavailable`, `banned`, `expired`, `credits_exhausted`.
    pub test_status: String,
    /// `rateLimitedUntil`.
    pub rate_limited_until_wall_ms: Option<u64>,
    /// The reason of the failure that set the cooldown.
    pub cooldown_reason: Option<String>,
    pub backoff_level: u32,
    pub last_error: Option<String>,
    pub last_error_type: Option<String>,
    pub error_code: Option<u16>,
    pub last_error_at_wall_ms: Option<u64>,
    pub reject_streak: Option<StreakEntry>,
    pub expired_strikes: Option<StrikesEntry>,
}

/// One entry of the provider cooldown tracker: the provider's window (`connection` unset)
/// or one connection's exponential cooldown.
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct TrackerEntry {
    pub provider: String,
    pub connection: Option<String>,
    pub last_failure_wall_ms: u64,
    pub failure_count: u32,
    pub retention_ms: u64,
    /// Provider-level entries only; ascending.
    pub failure_timestamps_wall_ms: Vec<u64>,
}

/// The resilience settings changed through `PATCH /api/resilience` since the process
/// started from the file (or was last reloaded): the accepted bodies merged into one
/// camelCase object, as JSON text. At start-up it is applied onto the file's settings like
/// a PATCH (same bounds, same cross-field rules), so a setting the file changed since and
/// the PATCH did not name keeps the file's value. A section holds at most one.
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct SettingsPatchEntry {
    pub patch_json: String,
}

/// A model's concurrency cap of a connection override.
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct ModelCapEntry {
    pub model: String,
    pub cap: u32,
}

/// One connection's settings set by `PATCH /api/providers/{id}` (they replace the file's
/// values for that connection whole).
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionOverrideEntry {
    pub connection: String,
    pub provider: String,
    pub max_concurrent: Option<u32>,
    /// `rateLimitOverrides`.
    pub rl_max_concurrent: Option<u32>,
    pub rl_model_concurrency: Vec<ModelCapEntry>,
    pub rl_max_wait_ms: Option<u64>,
    pub rl_execution_max_wait_ms: Option<u64>,
    pub rl_requests_per_minute: Option<u32>,
    pub rl_min_time_between_requests_ms: Option<u64>,
}

/// One session's pin to a connection of a provider. The session is the SHA-256 digest of
/// its key (hex), never the key; instants are wall-clock ms.
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct PinEntry {
    pub provider: String,
    pub session: String,
    pub connection: String,
    pub created_wall_ms: u64,
    pub last_used_wall_ms: u64,
    pub expires_wall_ms: u64,
}

/// One owner's latest exclusive session lease, active or ended (an ended one keeps the
/// owner's generation count). The owner is the SHA-256 digest of its token (hex), never the
/// token; `key` is the client key's configured id; instants are wall-clock ms
/// (`endedWallMs` 0 while active).
#[derive(
    Clone, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEntry {
    pub owner: String,
    pub key: String,
    pub provider: String,
    pub connection: String,
    pub generation: u64,
    /// `ACTIVE`, `RELEASED`, `EXPIRED` or `INVALIDATED`.
    pub state: String,
    pub acquired_wall_ms: u64,
    pub renewed_wall_ms: u64,
    pub expires_wall_ms: u64,
    pub ended_wall_ms: u64,
}

/// Everything one snapshot holds, owned (decoded from a file or about to be encoded).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Contents {
    pub breakers: Vec<BreakerEntry>,
    pub connections: Vec<ConnectionEntry>,
    pub provider_cooldowns: Vec<TrackerEntry>,
    pub runtime_settings: Vec<SettingsPatchEntry>,
    pub connection_overrides: Vec<ConnectionOverrideEntry>,
    pub affinity_pins: Vec<PinEntry>,
    pub leases: Vec<LeaseEntry>,
    /// Sections this release does not read (a later release wrote them): tag and version.
    pub skipped_sections: Vec<SkippedSection>,
}

/// A section left unread, as `inspect` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedSection {
    pub tag: u32,
    pub name: &'static str,
    pub version: u32,
    pub bytes: u64,
}
