//! The provider default sliding window (B §1.2b): a static cap for providers that send no
//! rate-limit headers (only `nvidia` today, 40 per 60 s per connection), replaceable and
//! extendable by `providerQuotaOverrides[<provider>].rpm`. It runs before the limiter and
//! fails open: after `max(window, max_wait_ms)` of waiting the request goes through.

use std::collections::VecDeque;

use crate::clock::Now;
use crate::config::kinds::Quirks;
use crate::config::resilience::ResilienceSettings;

/// Window length of every provider window.
pub const PROVIDER_WINDOW_MS: u64 = 60_000;

const NS_PER_MS: u64 = 1_000_000;

/// A provider's window: `limit` starts per `window_ms`, counted per
/// `<provider>:<connection>` (connection `_` when absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderWindow {
    pub limit: u32,
    pub window_ms: u64,
}

impl ProviderWindow {
    /// The window of the provider named `provider` with `quirks`: the operator override
    /// (`rpm > 0`), else its kind's built-in one.
    pub fn for_provider(
        settings: &ResilienceSettings,
        provider: &str,
        quirks: &Quirks,
    ) -> Option<Self> {
        let over = settings
            .quota_override_for(provider)
            .and_then(|o| o.rpm)
            .filter(|rpm| *rpm > 0);
        let limit = over.or(quirks.default_rpm)?;
        Some(Self {
            limit,
            window_ms: PROVIDER_WINDOW_MS,
        })
    }

    /// Key of the window's counter.
    pub fn key(provider: &str, connection: Option<&str>) -> String {
        format!(
            "{}:{}",
            provider.to_ascii_lowercase(),
            connection.unwrap_or("_")
        )
    }

    /// Total time a request waits for a slot before failing open.
    pub fn wait_budget_ms(&self, max_wait_ms: u64) -> u64 {
        self.window_ms.max(max_wait_ms)
    }
}

/// The companion per-connection concurrency cap: the override's `concurrency`, else the
/// kind's built-in one (6 for `nvidia`).
pub fn provider_default_concurrency(
    settings: &ResilienceSettings,
    provider: &str,
    quirks: &Quirks,
) -> Option<u32> {
    settings
        .quota_override_for(provider)
        .and_then(|o| o.concurrency)
        .filter(|c| *c > 0)
        .or(quirks.default_concurrency)
}

/// Decision of [`SlidingWindow::admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowDecision {
    /// A slot was taken.
    Go,
    /// Full: try again at this monotonic instant (ns).
    WaitUntil(u64),
    /// Waited the whole budget: let through anyway (the regular limiter still applies).
    FailOpen,
}

/// Start instants within the last window of one `<provider>:<connection>`.
#[derive(Clone, Debug, Default)]
pub struct SlidingWindow {
    starts: VecDeque<u64>,
}

impl SlidingWindow {
    #[cfg(test)]
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts counted in the window ending at `now`.
    #[cfg(test)]
    pub fn count(&mut self, spec: ProviderWindow, now: Now) -> usize {
        self.prune(spec, now.mono_ns);
        self.starts.len()
    }

    fn prune(&mut self, spec: ProviderWindow, now_ns: u64) {
        let Some(horizon) = now_ns.checked_sub(spec.window_ms.saturating_mul(NS_PER_MS)) else {
            return;
        };
        while self.starts.front().is_some_and(|t| *t <= horizon) {
            self.starts.pop_front();
        }
    }

    /// Takes a slot if one is free; a request that has waited since `waiting_since` for
    /// the whole budget fails open (and is counted).
    pub fn admit(
        &mut self,
        spec: ProviderWindow,
        waiting_since_ns: u64,
        max_wait_ms: u64,
        now: Now,
    ) -> WindowDecision {
        self.prune(spec, now.mono_ns);
        if self.starts.len() < spec.limit as usize {
            self.starts.push_back(now.mono_ns);
            return WindowDecision::Go;
        }
        let budget_end = waiting_since_ns
            .saturating_add(spec.wait_budget_ms(max_wait_ms).saturating_mul(NS_PER_MS));
        if now.mono_ns >= budget_end {
            self.starts.push_back(now.mono_ns);
            return WindowDecision::FailOpen;
        }
        let free_at = self.starts.front().map_or(now.mono_ns, |t| {
            t.saturating_add(spec.window_ms.saturating_mul(NS_PER_MS))
        });
        WindowDecision::WaitUntil(free_at.min(budget_end))
    }

    /// True when nothing in the window is left (the owner may drop it).
    #[cfg(test)]
    pub fn is_empty(&mut self, spec: ProviderWindow, now: Now) -> bool {
        self.count(spec, now) == 0
    }

    /// True when the last start is older than every provider window ([`PROVIDER_WINDOW_MS`]):
    /// the counter can be dropped without knowing its spec.
    pub fn is_idle(&self, now: Now) -> bool {
        self.starts.back().is_none_or(|t| {
            now.mono_ns.saturating_sub(*t) >= PROVIDER_WINDOW_MS.saturating_mul(NS_PER_MS)
        })
    }
}
