//! The tool-limit protocol: one fact, sent to every shard. No calls.

use crate::config::ProviderId;

pub enum Fact {
    /// Requests with at least `tools` tools steer away from `provider/model` until
    /// `until_ms` (monotonic).
    Learned {
        provider: ProviderId,
        model: String,
        tools: u32,
        until_ms: u64,
    },
}

/// Nothing is asked of this mechanism.
pub enum Request {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {}
