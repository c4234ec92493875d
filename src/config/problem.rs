//! The leaf every config file builds on: [`Problem`] (one thing wrong, naming its key), the
//! range message every bound check prints, and the time units bounds are written in. It
//! imports nothing from the rest of `config/`, so `env`, `resilience` and `validate` import
//! downward only (problem ← env ← resilience ← validate).

use std::fmt;

pub const SECOND_MS: u64 = 1_000;
pub const MINUTE_MS: u64 = 60_000;
pub const HOUR_MS: u64 = 3_600_000;
pub const DAY_MS: u64 = 86_400_000;

/// One thing wrong with the configuration: the key path (`connections[2].provider`), or
/// the environment variable, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    pub message: String,
}

impl Problem {
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The message of a value outside `min..=max`.
pub(crate) fn out_of_range(v: u64, min: u64, max: u64) -> String {
    format!("{v} is out of range ({min}..={max})")
}
