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
    /// [`super::BreakersSection`].
    pub const BREAKERS: u32 = 1;
    /// [`super::ConnectionsSection`].
    pub const CONNECTIONS: u32 = 2;
    /// [`super::ProviderCooldownsSection`].
    pub const PROVIDER_COOLDOWNS: u32 = 3;
    // Reserved for the state ARCHITECTURE §3 also persists, added as they land:
    // 4 runtime resilience settings (PATCH /api/resilience), 5 per-connection overrides
    // (PATCH /api/providers/{id}), 6 session affinity pins, 7 exclusive leases.

    /// The name `inspect` shows for a tag.
    pub fn name(tag: u32) -> &'static str {
        match tag {
            BREAKERS => "breakers",
            CONNECTIONS => "connections",
            PROVIDER_COOLDOWNS => "providerCooldowns",
            4 => "runtimeSettings",
            5 => "connectionOverrides",
            6 => "affinityPins",
            7 => "leases",
            _ => "unknown",
        }
    }
}

/// The version of each known section this release writes and reads.
pub const BREAKERS_VERSION: u32 = 1;
pub const CONNECTIONS_VERSION: u32 = 1;
pub const PROVIDER_COOLDOWNS_VERSION: u32 = 1;

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
pub struct BreakersSection {
    pub breakers: Vec<BreakerEntry>,
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
pub struct ConnectionsSection {
    pub connections: Vec<ConnectionEntry>,
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
pub struct ProviderCooldownsSection {
    pub entries: Vec<TrackerEntry>,
}

/// Everything one snapshot holds, owned (decoded from a file or about to be encoded).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Contents {
    pub breakers: Vec<BreakerEntry>,
    pub connections: Vec<ConnectionEntry>,
    pub provider_cooldowns: Vec<TrackerEntry>,
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
