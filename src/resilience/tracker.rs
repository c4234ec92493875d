//! The optional provider cooldown tracker (spec A §2): cross-request memory that lets
//! combo target resolution skip a provider, or one provider connection, that just failed.
//! Off by default (`provider_cooldown.enabled`, env `PROVIDER_COOLDOWN_ENABLED`). This
//! module owns the failure entries of the keys its shard owns, the two gates computed from
//! them, and their persisted form. It is separate from the breaker on purpose: the breaker
//! guards provider health for every request; the tracker is a routing hint for combos.
//!
//! Two kinds of entry, two gates:
//!
//! * **connection-level** (`provider:connection`): exponential cooldown after the latest
//!   failure, `min(min_retry_cooldown_ms × 2^min(failures − 1, 10), max_retry_cooldown_ms)`.
//! * **provider-level**: the window gate of the provider's category (oauth / apikey /
//!   local, [`WindowGate`]): once at least `failure_threshold` failures fall within
//!   `failure_window_ms`, the provider cools for `cooldown_ms` after its latest failure
//!   (every new failure restarts it). Below the threshold it never cools.
//!
//! A success clears the entry's count and window (the entry stays until swept).
//!
//! Time: monotonic ms inside, wall-clock ms in [`TrackerRecord`] (see `breaker` for the
//! reasoning); imported instants in the future are clamped to `now`.
//!
//! # Deviations from OmniRoute (copy to `docs/compat.md`)
//!
//! 1. The tracker checks `enabled` itself: disabled, it records nothing and every check
//!    passes, and disabling it drops its entries. OmniRoute's tracker functions ignore the
//!    flag and leave it to each caller.
//! 2. The provider-level window keeps the newest `max(200, failure_threshold)` timestamps,
//!    not 200, so a threshold above 200 can still be reached.
//! 3. An entry is retained for at least its window and cooldown as well as
//!    `max(30 min, max_retry_cooldown_ms)`, so the sweep never forgets failures the window
//!    gate still counts.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::breaker::{mono_ms, mono_of, ms_i64, wall_of};
use crate::clock::Now;
use crate::config::resilience::{MINUTE_MS, ProviderCooldownSettings, WindowGate};
use crate::config::{AuthKind, ConnectionId, ProviderId};

/// A provider-level entry keeps at least this many failure timestamps.
pub const MAX_WINDOW_TIMESTAMPS: usize = 200;
/// Entries live at least this long after their latest failure.
pub const MIN_RETENTION_MS: u64 = 30 * MINUTE_MS;
/// The connection-level cooldown doubles at most this many times.
pub const MAX_BACKOFF_EXPONENT: u32 = 10;
/// How often the owner should call [`CooldownTracker::sweep`].
#[cfg(test)]
pub const SWEEP_INTERVAL_MS: u64 = MINUTE_MS;

/// What the tracker remembers failures of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrackerKey {
    /// The provider as a whole: the window gate.
    Provider(ProviderId),
    /// One connection of a provider: the exponential cooldown.
    Connection(ProviderId, ConnectionId),
}

/// The tracker's answer for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    Pass,
    /// Skip the key for `remaining_ms` more.
    Cooling {
        remaining_ms: u64,
    },
}

impl Gate {
    #[cfg(test)]
    pub fn is_cooling(self) -> bool {
        matches!(self, Gate::Cooling { .. })
    }

    fn from_remaining(remaining_ms: i64) -> Gate {
        match u64::try_from(remaining_ms) {
            Ok(ms) if ms > 0 => Gate::Cooling { remaining_ms: ms },
            _ => Gate::Pass,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    /// Category of the provider: picks the window gate.
    auth: AuthKind,
    /// Monotonic ms of the latest failure.
    last_failure_ms: i64,
    failure_count: u32,
    retention_ms: u64,
    /// Provider-level only: failure instants (monotonic ms, ascending).
    window: VecDeque<i64>,
}

impl Entry {
    fn record(&self, now: Now) -> TrackerRecord {
        TrackerRecord {
            last_failure_wall_ms: wall_of(now, self.last_failure_ms),
            failure_count: self.failure_count,
            retention_ms: self.retention_ms,
            failure_timestamps_wall_ms: self.window.iter().map(|t| wall_of(now, *t)).collect(),
        }
    }
}

/// The persisted form of one entry (wall-clock ms).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrackerRecord {
    pub last_failure_wall_ms: u64,
    pub failure_count: u32,
    pub retention_ms: u64,
    /// Provider-level entries only; ascending.
    pub failure_timestamps_wall_ms: Vec<u64>,
}

/// The tracker entries of one owner shard.
#[derive(Clone, Debug)]
pub struct CooldownTracker {
    settings: ProviderCooldownSettings,
    entries: HashMap<TrackerKey, Entry>,
}

impl CooldownTracker {
    pub fn new(settings: ProviderCooldownSettings) -> Self {
        Self {
            settings,
            entries: HashMap::new(),
        }
    }

    #[cfg(test)]
    pub fn settings(&self) -> &ProviderCooldownSettings {
        &self.settings
    }

    #[cfg(test)]
    pub fn is_enabled(&self) -> bool {
        self.settings.enabled
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// How many entries the tracker holds (`tidegate_owner_entries`).
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// New settings (PATCH). Disabling drops every entry.
    pub fn apply_settings(&mut self, settings: ProviderCooldownSettings) {
        self.settings = settings;
        if !self.settings.enabled {
            self.entries.clear();
        }
    }

    /// Records a failure of `key` (a provider of category `auth`) and returns its gate.
    pub fn record_failure(&mut self, now: Now, key: TrackerKey, auth: AuthKind) -> Gate {
        if !self.settings.enabled {
            return Gate::Pass;
        }
        let now_ms = mono_ms(now);
        let retention = self.retention_floor(key, auth);
        let window = self.settings.window_gate(auth).clone();
        let e = self.entries.entry(key).or_insert_with(|| Entry {
            auth,
            last_failure_ms: now_ms,
            failure_count: 0,
            retention_ms: 0,
            window: VecDeque::new(),
        });
        e.auth = auth;
        e.last_failure_ms = now_ms;
        e.failure_count = e.failure_count.saturating_add(1);
        e.retention_ms = e.retention_ms.max(retention);
        if matches!(key, TrackerKey::Provider(_)) {
            e.window.push_back(now_ms);
            prune(&mut e.window, now_ms, &window);
        }
        self.check(now, key)
    }

    /// A success: the entry's count and window are cleared; the entry stays.
    pub fn record_success(&mut self, key: TrackerKey) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.failure_count = 0;
            e.window.clear();
        }
    }

    /// Whether `key` is cooling at `now`.
    pub fn check(&self, now: Now, key: TrackerKey) -> Gate {
        if !self.settings.enabled {
            return Gate::Pass;
        }
        let Some(e) = self.entries.get(&key) else {
            return Gate::Pass;
        };
        let now_ms = mono_ms(now);
        let elapsed = now_ms.saturating_sub(e.last_failure_ms);
        match key {
            TrackerKey::Connection(..) => {
                if e.failure_count == 0 {
                    return Gate::Pass;
                }
                let cooldown = ms_i64(self.connection_cooldown_ms(e.failure_count));
                Gate::from_remaining(cooldown.saturating_sub(elapsed))
            }
            TrackerKey::Provider(_) => {
                let gate = self.settings.window_gate(e.auth);
                let cutoff = now_ms.saturating_sub(ms_i64(gate.failure_window_ms));
                let start = e.window.partition_point(|t| *t < cutoff);
                let in_window = e.window.len() - start;
                if in_window < gate.failure_threshold as usize {
                    return Gate::Pass;
                }
                Gate::from_remaining(ms_i64(gate.cooldown_ms).saturating_sub(elapsed))
            }
        }
    }

    /// The monotonic ms until which `key` cools, as far as the entries recorded so far
    /// decide it (in the past once it has ended; [`CooldownTracker::check`] agrees):
    /// `None` when nothing cools it — disabled, no failures, or, for a provider, fewer
    /// than its threshold of failures in its window. A provider cools until its
    /// cooldown after the latest failure ends or its threshold-th newest failure leaves
    /// the window, whichever comes first. Owners broadcast it as the key's view.
    pub fn cooldown_deadline_ms(&self, key: TrackerKey) -> Option<i64> {
        if !self.settings.enabled {
            return None;
        }
        let e = self.entries.get(&key)?;
        match key {
            TrackerKey::Connection(..) => {
                if e.failure_count == 0 {
                    return None;
                }
                let cooldown = ms_i64(self.connection_cooldown_ms(e.failure_count));
                Some(e.last_failure_ms.saturating_add(cooldown))
            }
            TrackerKey::Provider(_) => {
                let gate = self.settings.window_gate(e.auth);
                let threshold = (gate.failure_threshold as usize).max(1);
                let n = e.window.len();
                if n < threshold {
                    return None;
                }
                let leaves_window = e.window[n - threshold]
                    .saturating_add(ms_i64(gate.failure_window_ms))
                    .saturating_add(1);
                let cooled = e.last_failure_ms.saturating_add(ms_i64(gate.cooldown_ms));
                Some(cooled.min(leaves_window))
            }
        }
    }

    /// The connection-level cooldown after `failures` failures.
    pub fn connection_cooldown_ms(&self, failures: u32) -> u64 {
        let exponent = failures.saturating_sub(1).min(MAX_BACKOFF_EXPONENT);
        self.settings
            .min_retry_cooldown_ms
            .saturating_mul(1u64 << exponent)
            .min(self.settings.max_retry_cooldown_ms)
    }

    /// Failures recorded for `key` since its last success.
    pub fn failure_count(&self, key: TrackerKey) -> u32 {
        self.entries.get(&key).map_or(0, |e| e.failure_count)
    }

    /// Forgets everything (`clearCooldownState`).
    #[cfg(test)]
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Removes entries whose latest failure is older than their retention. Call every
    /// `SWEEP_INTERVAL_MS`. Returns the number removed.
    pub fn sweep(&mut self, now: Now) -> usize {
        let now_ms = mono_ms(now);
        let before = self.entries.len();
        self.entries
            .retain(|_, e| now_ms.saturating_sub(e.last_failure_ms) <= ms_i64(e.retention_ms));
        before - self.entries.len()
    }

    /// Drops the entries `keep` refuses (a reload removed their provider or connection).
    pub fn retain(&mut self, mut keep: impl FnMut(TrackerKey) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|k, _| keep(*k));
        before - self.entries.len()
    }

    /// Every entry's persisted form, in key order.
    #[cfg(test)]
    pub fn export(&self, now: Now) -> Vec<(TrackerKey, TrackerRecord)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .map(|(k, e)| (*k, e.record(now)))
            .collect();
        out.sort_by_key(|(k, _)| *k);
        out
    }

    /// One entry's persisted form (`None`: no entry for `key`).
    pub fn export_key(&self, now: Now, key: TrackerKey) -> Option<TrackerRecord> {
        self.entries.get(&key).map(|e| e.record(now))
    }

    /// The keys with an entry.
    pub fn keys(&self) -> impl Iterator<Item = TrackerKey> + '_ {
        self.entries.keys().copied()
    }

    /// Loads persisted entries (ignored while disabled), replacing entries of the same key.
    /// Instants in the future (a clock that was ahead) are clamped to `now`.
    pub fn import(
        &mut self,
        now: Now,
        records: impl IntoIterator<Item = (TrackerKey, AuthKind, TrackerRecord)>,
    ) {
        if !self.settings.enabled {
            return;
        }
        let now_ms = mono_ms(now);
        let at = |wall: u64| mono_of(now, wall).min(now_ms);
        for (key, auth, r) in records {
            let mut window: Vec<i64> = match key {
                TrackerKey::Provider(_) => r
                    .failure_timestamps_wall_ms
                    .iter()
                    .map(|w| at(*w))
                    .collect(),
                TrackerKey::Connection(..) => Vec::new(),
            };
            window.sort_unstable();
            let mut window = VecDeque::from(window);
            prune(&mut window, now_ms, self.settings.window_gate(auth));
            let retention = self.retention_floor(key, auth).max(r.retention_ms);
            self.entries.insert(
                key,
                Entry {
                    auth,
                    last_failure_ms: at(r.last_failure_wall_ms),
                    failure_count: r.failure_count,
                    retention_ms: retention,
                    window,
                },
            );
        }
    }

    // -- internals ----------------------------------------------------------------------

    fn retention_floor(&self, key: TrackerKey, auth: AuthKind) -> u64 {
        let base = MIN_RETENTION_MS.max(self.settings.max_retry_cooldown_ms);
        match key {
            TrackerKey::Provider(_) => {
                let gate = self.settings.window_gate(auth);
                base.max(gate.failure_window_ms).max(gate.cooldown_ms)
            }
            TrackerKey::Connection(..) => base,
        }
    }
}

/// Drops timestamps older than the window, and all but the newest
/// `max(MAX_WINDOW_TIMESTAMPS, failure_threshold)`.
fn prune(window: &mut VecDeque<i64>, now_ms: i64, gate: &WindowGate) {
    let cutoff = now_ms.saturating_sub(ms_i64(gate.failure_window_ms));
    while window.front().is_some_and(|t| *t < cutoff) {
        window.pop_front();
    }
    let cap = MAX_WINDOW_TIMESTAMPS.max(gate.failure_threshold as usize);
    while window.len() > cap {
        window.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    const WALL0: u64 = 1_700_000_000_000;
    const P: TrackerKey = TrackerKey::Provider(ProviderId(1));
    const C: TrackerKey = TrackerKey::Connection(ProviderId(1), ConnectionId(4));

    fn at(ms: u64) -> Now {
        Now {
            mono_ns: ms * 1_000_000,
            wall_ms: WALL0 + ms,
        }
    }

    fn enabled() -> CooldownTracker {
        CooldownTracker::new(ProviderCooldownSettings {
            enabled: true,
            ..ProviderCooldownSettings::default()
        })
    }

    #[test]
    fn off_by_default_it_records_nothing_and_always_passes() {
        let mut t = CooldownTracker::new(ProviderCooldownSettings::default());
        assert!(!t.is_enabled());
        for _ in 0..50 {
            assert_eq!(t.record_failure(at(0), P, AuthKind::Local), Gate::Pass);
            assert_eq!(t.record_failure(at(0), C, AuthKind::Local), Gate::Pass);
        }
        assert!(t.is_empty());
        assert_eq!(t.check(at(0), C), Gate::Pass);
    }

    #[test]
    fn the_deadline_agrees_with_check() {
        let mut t = CooldownTracker::new(ProviderCooldownSettings {
            enabled: true,
            apikey: WindowGate {
                failure_threshold: 3,
                failure_window_ms: 10_000,
                cooldown_ms: 20_000,
            },
            ..ProviderCooldownSettings::default()
        });
        assert_eq!(t.cooldown_deadline_ms(C), None);
        t.record_failure(at(0), C, AuthKind::ApiKey);
        t.record_failure(at(1_000), C, AuthKind::ApiKey);
        assert_eq!(t.cooldown_deadline_ms(C), Some(11_000));
        // Provider: below the threshold nothing cools; at it, the window decides.
        t.record_failure(at(0), P, AuthKind::ApiKey);
        t.record_failure(at(4_000), P, AuthKind::ApiKey);
        assert_eq!(t.cooldown_deadline_ms(P), None);
        t.record_failure(at(6_000), P, AuthKind::ApiKey);
        // The first failure leaves the 10 s window after 10 s: before the 20 s cooldown.
        let until = t.cooldown_deadline_ms(P).unwrap();
        assert_eq!(until, 10_001);
        for ms in [6_000, 9_000, 10_000] {
            assert!(t.check(at(ms), P).is_cooling(), "{ms}");
        }
        assert_eq!(t.check(at(until as u64), P), Gate::Pass);
        t.record_success(P);
        assert_eq!(t.cooldown_deadline_ms(P), None);
    }

    #[test]
    fn disabling_drops_every_entry() {
        let mut t = enabled();
        t.record_failure(at(0), C, AuthKind::ApiKey);
        assert!(t.check(at(0), C).is_cooling());
        t.apply_settings(ProviderCooldownSettings::default());
        assert!(t.is_empty());
        assert_eq!(t.check(at(0), C), Gate::Pass);
    }

    #[test]
    fn connection_cooldown_doubles_from_min_to_max() {
        let t = enabled();
        let got: Vec<_> = (1..=8).map(|n| t.connection_cooldown_ms(n)).collect();
        assert_eq!(
            got,
            vec![
                5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000
            ]
        );
        // The exponent stops at 10.
        let t = CooldownTracker::new(ProviderCooldownSettings {
            enabled: true,
            min_retry_cooldown_ms: 1_000,
            max_retry_cooldown_ms: 86_400_000,
            ..ProviderCooldownSettings::default()
        });
        assert_eq!(t.connection_cooldown_ms(11), 1_024_000);
        assert_eq!(t.connection_cooldown_ms(40), 1_024_000);
        assert_eq!(t.connection_cooldown_ms(0), 1_000);
    }

    #[test]
    fn a_connection_cools_after_its_latest_failure() {
        let clock = ManualClock::new(WALL0);
        let mut t = enabled();
        assert_eq!(
            t.record_failure(clock.now(), C, AuthKind::OAuth),
            Gate::Cooling {
                remaining_ms: 5_000
            }
        );
        clock.advance_ms(4_000);
        assert_eq!(
            t.check(clock.now(), C),
            Gate::Cooling {
                remaining_ms: 1_000
            }
        );
        clock.advance_ms(1_000);
        assert_eq!(t.check(clock.now(), C), Gate::Pass);
        assert_eq!(
            t.record_failure(clock.now(), C, AuthKind::OAuth),
            Gate::Cooling {
                remaining_ms: 10_000
            }
        );
        t.record_success(C);
        assert_eq!(t.check(clock.now(), C), Gate::Pass);
        assert_eq!(t.failure_count(C), 0);
        assert_eq!(t.len(), 1, "a success keeps the entry");
        assert_eq!(
            t.record_failure(clock.now(), C, AuthKind::OAuth),
            Gate::Cooling {
                remaining_ms: 5_000
            }
        );
    }

    #[test]
    fn the_apikey_window_gate_needs_15_failures_in_30_min_and_cools_10_min() {
        let mut t = enabled();
        for i in 0..14 {
            assert_eq!(
                t.record_failure(at(i * 60_000), P, AuthKind::ApiKey),
                Gate::Pass
            );
        }
        let last = 14 * 60_000;
        assert_eq!(
            t.record_failure(at(last), P, AuthKind::ApiKey),
            Gate::Cooling {
                remaining_ms: 600_000
            }
        );
        assert_eq!(
            t.check(at(last + 599_999), P),
            Gate::Cooling { remaining_ms: 1 }
        );
        assert_eq!(t.check(at(last + 600_000), P), Gate::Pass);
        // Every new failure (still 15+ in the window) restarts the cooldown.
        assert_eq!(
            t.record_failure(at(last + 600_000), P, AuthKind::ApiKey),
            Gate::Cooling {
                remaining_ms: 600_000
            }
        );
    }

    #[test]
    fn failures_outside_the_window_do_not_count() {
        let mut t = enabled();
        // oauth: 10 in 15 min → 5 min. Nine failures, then the tenth after the first aged out.
        for i in 0..9 {
            t.record_failure(at(i * 1_000), P, AuthKind::OAuth);
        }
        // The window is inclusive: at 900 000 the failure at 0 would still count.
        assert_eq!(
            t.record_failure(at(900_001), P, AuthKind::OAuth),
            Gate::Pass
        );
        assert_eq!(
            t.record_failure(at(900_002), P, AuthKind::OAuth),
            Gate::Cooling {
                remaining_ms: 300_000
            }
        );
        // As failures age out, a check may drop below the threshold before the cooldown ends.
        assert_eq!(t.check(at(902_000), P), Gate::Pass);
    }

    #[test]
    fn the_local_gate_is_2_in_5_min_for_1_min_and_a_success_clears_the_window() {
        let mut t = enabled();
        assert_eq!(t.record_failure(at(0), P, AuthKind::Local), Gate::Pass);
        assert_eq!(
            t.record_failure(at(299_000), P, AuthKind::Local),
            Gate::Cooling {
                remaining_ms: 60_000
            }
        );
        t.record_success(P);
        assert_eq!(t.check(at(299_001), P), Gate::Pass);
        assert_eq!(
            t.record_failure(at(299_002), P, AuthKind::Local),
            Gate::Pass
        );
    }

    #[test]
    fn the_window_keeps_enough_timestamps_for_large_thresholds() {
        let mut s = ProviderCooldownSettings {
            enabled: true,
            ..ProviderCooldownSettings::default()
        };
        s.apikey.failure_threshold = 300;
        let mut t = CooldownTracker::new(s);
        for _ in 0..299 {
            t.record_failure(at(0), P, AuthKind::ApiKey);
        }
        assert_eq!(t.check(at(0), P), Gate::Pass);
        assert!(t.record_failure(at(0), P, AuthKind::ApiKey).is_cooling());
        for _ in 0..1_000 {
            t.record_failure(at(1), P, AuthKind::ApiKey);
        }
        assert_eq!(t.export(at(1))[0].1.failure_timestamps_wall_ms.len(), 300);
    }

    #[test]
    fn sweep_honours_retention() {
        let mut t = enabled();
        t.record_failure(at(0), C, AuthKind::ApiKey);
        t.record_failure(at(0), P, AuthKind::ApiKey);
        assert_eq!(t.sweep(at(MIN_RETENTION_MS)), 0);
        // Both retain 30 min (apikey window 30 min, cooldown 10 min, max retry 5 min).
        assert_eq!(t.sweep(at(MIN_RETENTION_MS + 1)), 2);
        assert!(t.is_empty());
        // A long window keeps provider entries longer.
        let mut s = ProviderCooldownSettings {
            enabled: true,
            ..ProviderCooldownSettings::default()
        };
        s.oauth.failure_window_ms = 3_600_000;
        let mut t = CooldownTracker::new(s);
        t.record_failure(at(0), P, AuthKind::OAuth);
        assert_eq!(t.sweep(at(3_600_000)), 0);
        assert_eq!(t.sweep(at(3_600_001)), 1);
    }

    #[test]
    fn export_import_survives_a_restart() {
        let mut t = enabled();
        for i in 0..15 {
            t.record_failure(at(i * 1_000), P, AuthKind::ApiKey);
        }
        t.record_failure(at(14_000), C, AuthKind::ApiKey);
        t.record_failure(at(14_000), C, AuthKind::ApiKey);
        let records = t.export(at(20_000));
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].0, P);
        assert_eq!(records[0].1.failure_count, 15);
        assert_eq!(records[0].1.last_failure_wall_ms, WALL0 + 14_000);
        assert_eq!(records[0].1.failure_timestamps_wall_ms[0], WALL0);
        assert!(records[1].1.failure_timestamps_wall_ms.is_empty());
        let v = serde_json::to_value(&records[0].1).unwrap();
        assert_eq!(v["lastFailureWallMs"], WALL0 + 14_000);
        assert_eq!(v["failureTimestampsWallMs"].as_array().unwrap().len(), 15);

        // The new process starts 6 s later (wall) with its monotonic clock near 0.
        let later = Now {
            mono_ns: 2_000_000,
            wall_ms: WALL0 + 26_000,
        };
        let mut t2 = enabled();
        t2.import(
            later,
            records.into_iter().map(|(k, r)| (k, AuthKind::ApiKey, r)),
        );
        assert_eq!(
            t2.check(later, P),
            Gate::Cooling {
                remaining_ms: 600_000 - 12_000
            }
        );
        assert_eq!(t2.check(later, C), Gate::Pass, "10 s cooldown, 12 s ago");
        assert_eq!(t2.failure_count(C), 2);
        assert_eq!(t2.export(later), t.export(at(26_000)));
    }

    #[test]
    fn import_clamps_future_instants_and_ignores_records_while_disabled() {
        let record = TrackerRecord {
            last_failure_wall_ms: WALL0 + 86_400_000,
            failure_count: 1,
            retention_ms: 0,
            failure_timestamps_wall_ms: vec![],
        };
        let mut t = enabled();
        t.import(at(0), [(C, AuthKind::OAuth, record.clone())]);
        assert_eq!(
            t.check(at(0), C),
            Gate::Cooling {
                remaining_ms: 5_000
            }
        );
        assert_eq!(t.export(at(0))[0].1.retention_ms, MIN_RETENTION_MS);
        let mut off = CooldownTracker::new(ProviderCooldownSettings::default());
        off.import(at(0), [(C, AuthKind::OAuth, record)]);
        assert!(off.is_empty());
    }

    #[test]
    fn clear_forgets_everything() {
        let mut t = enabled();
        t.record_failure(at(0), C, AuthKind::ApiKey);
        t.record_failure(at(0), P, AuthKind::ApiKey);
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.check(at(0), C), Gate::Pass);
    }
}
