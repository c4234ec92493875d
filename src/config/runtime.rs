//! Runtime settings: what the management API changes while the gateway runs
//! (`PATCH /api/resilience`), as one versioned value. Start-up builds it from the
//! configuration file; a PATCH replaces it whole. Every shard adopts the newest value
//! before its next request and before its next owner message (`shard::Shard::refresh`),
//! so a change is seen on the next request whichever shard serves it. The snapshot keeps
//! this value as it is (it is plain data: ids, numbers, the settings).

use std::collections::BTreeMap;

use super::RateLimitOverrides;
use super::resilience::ResilienceSettings;

/// The settings the management API may change at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeSettings {
    /// Every resilience setting (the `[resilience]` section after PATCHes).
    pub resilience: ResilienceSettings,
    /// Per-connection settings set by `PATCH /api/providers/{connectionId}`, by the
    /// connection's configured id (ids survive a reordered file; indexes do not). Each
    /// entry replaces the file's values for that connection whole.
    pub connections: BTreeMap<String, ConnectionSettings>,
    /// The `PATCH /api/resilience` bodies accepted since the file was read, merged into one
    /// camelCase object (a later value replaces an earlier one; see
    /// `admin::patch::merge`). The snapshot keeps this rather than `resilience`, so a
    /// restart re-applies what was PATCHed onto the file as it is then — a setting the
    /// file changed and no PATCH named takes the file's new value.
    pub resilience_patch: serde_json::Map<String, serde_json::Value>,
}

/// A connection's concurrency and rate-limit settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectionSettings {
    /// `max_concurrent`: the account gate's capacity (`None`: no account gate).
    pub max_concurrent: Option<u32>,
    pub rate_limit_overrides: RateLimitOverrides,
}

impl RuntimeSettings {
    /// The runtime settings the configuration file describes.
    pub fn from_config(config: &super::Config) -> Self {
        Self {
            resilience: config.resilience.clone(),
            connections: BTreeMap::new(),
            resilience_patch: serde_json::Map::new(),
        }
    }

    /// `base` with these settings in place of its own.
    pub fn apply_to(&self, base: &super::Config) -> super::Config {
        let mut c = base.clone();
        c.resilience = self.resilience.clone();
        for conn in &mut c.connections {
            if let Some(o) = self.connections.get(&conn.name) {
                conn.max_concurrent = o.max_concurrent;
                conn.rate_limit_overrides = o.rate_limit_overrides.clone();
            }
        }
        c
    }
}
