//! Dynamic tool-limit detection (the guide's "other resilience features"): an upstream
//! answer saying a request carries too many tools teaches that requests with at least that
//! many tools go elsewhere first for `provider/model`, for the lockout's duration (the
//! model lockout's base cooldown). This file recognises such answers and holds the learned
//! limits; every shard keeps a replica (`owners::tool_limits`).

use std::collections::HashMap;

use crate::config::ProviderId;

/// The least number of tools a limit steers away, learned from one answer: the failing
/// request's own count, or one more than the maximum the answer states when that is lower.
/// `None` when the answer is not about the number of tools.
pub fn learned_threshold(status: u16, body: &str, request_tools: usize) -> Option<u32> {
    if !(400..500).contains(&status) || request_tools == 0 {
        return None;
    }
    let text = body.to_ascii_lowercase();
    let about_tools = text.contains("too many tools")
        || (text.contains("tools")
            && (text.contains("array too long")
                || text.contains("maximum number of tools")
                || text.contains("tools exceeds")
                || text.contains("tool count")));
    if !about_tools {
        return None;
    }
    let count = u32::try_from(request_tools).unwrap_or(u32::MAX);
    let stated = [
        "maximum length",
        "maximum of",
        "at most",
        "maximum number of tools is",
    ]
    .iter()
    .filter_map(|marker| number_after(&text, marker))
    .min();
    Some(match stated {
        Some(max) if max.saturating_add(1) < count => max.saturating_add(1).max(1),
        _ => count,
    })
}

/// The first whole number after `marker` in `text` (skipping spaces and punctuation, at
/// most a few characters).
fn number_after(text: &str, marker: &str) -> Option<u32> {
    let at = text.find(marker)? + marker.len();
    let rest = text.get(at..)?;
    let start = rest.find(|c: char| c.is_ascii_digit())?;
    if start > 8 {
        return None;
    }
    let digits: String = rest[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// A learned limit: requests with at least `tools` tools steer away until `until_ms`
/// (monotonic).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub tools: u32,
    pub until_ms: u64,
}

/// The learned limits by provider and model.
#[derive(Debug, Default)]
pub struct ToolLimits {
    limits: HashMap<(ProviderId, String), Limit>,
}

/// At most this many learned limits are kept (the configured models bound it in practice).
pub const MAX_TOOL_LIMITS: usize = 10_000;

impl ToolLimits {
    /// Merges a learned limit: a live one keeps the lower threshold and the later end.
    pub fn learn(&mut self, provider: ProviderId, model: &str, limit: Limit, now_ms: u64) {
        let key = (provider, model.to_owned());
        match self.limits.get_mut(&key) {
            Some(old) if old.until_ms > now_ms => {
                old.tools = old.tools.min(limit.tools);
                old.until_ms = old.until_ms.max(limit.until_ms);
            }
            Some(old) => *old = limit,
            None => {
                if self.limits.len() >= MAX_TOOL_LIMITS {
                    self.limits.retain(|_, l| l.until_ms > now_ms);
                }
                if self.limits.len() < MAX_TOOL_LIMITS {
                    self.limits.insert(key, limit);
                }
            }
        }
    }

    /// Does a live limit steer a request with `tools` tools away from `provider/model`?
    pub fn steers_away(
        &self,
        provider: ProviderId,
        model: &str,
        tools: usize,
        now_ms: u64,
    ) -> bool {
        if tools == 0 || self.limits.is_empty() {
            return false;
        }
        self.limits
            .get(&(provider, model.to_owned()))
            .is_some_and(|l| l.until_ms > now_ms && tools >= l.tools as usize)
    }

    /// Forgets limits that have ended.
    pub fn sweep(&mut self, now_ms: u64) {
        self.limits.retain(|_, l| l.until_ms > now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_about_too_many_tools_are_recognised() {
        let openai = "Invalid 'tools': array too long. Expected an array with maximum length 128, \
                      but got an array with length 200 instead.";
        assert_eq!(learned_threshold(400, openai, 200), Some(129));
        assert_eq!(
            learned_threshold(400, "Too many tools provided", 12),
            Some(12)
        );
        assert_eq!(
            learned_threshold(400, "The maximum number of tools is 64", 70),
            Some(65)
        );
        // A stated maximum at or above the request's own count: the count itself.
        assert_eq!(
            learned_threshold(400, "too many tools (at most 100)", 50),
            Some(50)
        );
        assert_eq!(learned_threshold(400, "context length exceeded", 5), None);
        assert_eq!(learned_threshold(500, "too many tools", 5), None);
        assert_eq!(learned_threshold(400, "too many tools", 0), None);
    }

    #[test]
    fn a_limit_steers_requests_with_at_least_that_many_tools_until_it_ends() {
        let mut t = ToolLimits::default();
        let p = ProviderId(1);
        t.learn(
            p,
            "m",
            Limit {
                tools: 5,
                until_ms: 100,
            },
            0,
        );
        assert!(t.steers_away(p, "m", 5, 50));
        assert!(!t.steers_away(p, "m", 4, 50));
        assert!(!t.steers_away(p, "other", 9, 50));
        assert!(!t.steers_away(p, "m", 9, 100));
        // A live limit keeps the lower threshold and the later end.
        t.learn(
            p,
            "m",
            Limit {
                tools: 8,
                until_ms: 200,
            },
            60,
        );
        assert!(t.steers_away(p, "m", 5, 150));
        t.sweep(200);
        assert!(!t.steers_away(p, "m", 50, 150));
    }
}
