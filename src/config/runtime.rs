//! Runtime settings: what the management API changes while the gateway runs
//! (`PATCH /api/resilience`), as one versioned value. Start-up builds it from the
//! configuration file; a PATCH replaces it whole. Every shard adopts the newest value
//! before its next request and before its next owner message (`shard::Shard::refresh`),
//! so a change is seen on the next request whichever shard serves it. The snapshot keeps
//! this value as it is (it is plain data: ids, numbers, the settings).

use super::resilience::ResilienceSettings;

/// The settings the management API may change at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeSettings {
    /// Every resilience setting (the `[resilience]` section after PATCHes).
    pub resilience: ResilienceSettings,
}

impl RuntimeSettings {
    /// The runtime settings the configuration file describes.
    pub fn from_config(config: &super::Config) -> Self {
        Self {
            resilience: config.resilience.clone(),
        }
    }

    /// `base` with these settings in place of its own.
    pub fn apply_to(&self, base: &super::Config) -> super::Config {
        let mut c = base.clone();
        c.resilience = self.resilience.clone();
        c
    }
}
