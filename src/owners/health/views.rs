//! The replicated views every shard routes from: for each provider and connection breaker,
//! each connection, and each model lockout, "routable, or not until T, and why". Owners
//! broadcast updates; applying one is idempotent (newer epochs win, duplicates are no-ops),
//! so a dropped or repeated broadcast only delays convergence. Selection reads only these.

use std::collections::HashMap;

use super::protocol::{TrackerView, View};
use crate::clock::Now;
use crate::config::{ConnectionId, ProviderId};
use crate::resilience::breaker::{BreakerKey, BreakerView};
use crate::resilience::connection::ConnectionViews;
use crate::resilience::lockout::LockoutViews;
use crate::resilience::tracker::TrackerKey;

#[derive(Debug, Default)]
pub struct Views {
    /// Provider breakers, indexed by `ProviderId` (ids are dense).
    provider_breakers: Vec<Option<BreakerView>>,
    /// Connection breakers, indexed by `ConnectionId`.
    connection_breakers: Vec<Option<BreakerView>>,
    pub connections: ConnectionViews,
    pub lockouts: LockoutViews,
    /// Provider cooldown tracker entries (empty unless `provider_cooldown.enabled`).
    tracker: HashMap<TrackerKey, TrackerView>,
}

impl Views {
    /// Applies a view; true when it changed anything.
    pub fn apply(&mut self, view: &View) -> bool {
        match view {
            View::Breaker { key, view } => self.apply_breaker(*key, view),
            View::Connection { connection, view } => self.connections.apply(*connection, view),
            View::Lockout(u) => self.lockouts.apply(u),
            View::Tracker { key, view } => self.apply_tracker(*key, view),
        }
    }

    /// Applies a tracker view (newer epochs win).
    fn apply_tracker(&mut self, key: TrackerKey, view: &TrackerView) -> bool {
        match self.tracker.get_mut(&key) {
            Some(v) if v.epoch >= view.epoch => false,
            Some(v) => {
                *v = *view;
                true
            }
            None => {
                self.tracker.insert(key, *view);
                true
            }
        }
    }

    /// How long the provider cooldown tracker still skips `connection` of `provider`
    /// (the longer of the provider-level and connection-level cooldowns), if it does.
    pub fn tracker_cooling(
        &self,
        provider: ProviderId,
        connection: ConnectionId,
        now: Now,
    ) -> Option<u64> {
        if self.tracker.is_empty() {
            return None;
        }
        let now_ms = now.mono_ms();
        [
            TrackerKey::Provider(provider),
            TrackerKey::Connection(provider, connection),
        ]
        .iter()
        .filter_map(|k| self.tracker.get(k))
        .map(|v| v.until_mono_ms.saturating_sub(now_ms))
        .filter(|ms| *ms > 0)
        .max()
    }

    /// Whether the tracker counts failures of `provider` or `connection` (a success on
    /// them is news for its owner).
    pub fn tracker_failures(&self, provider: ProviderId, connection: ConnectionId) -> bool {
        !self.tracker.is_empty()
            && [
                TrackerKey::Provider(provider),
                TrackerKey::Connection(provider, connection),
            ]
            .iter()
            .any(|k| self.tracker.get(k).is_some_and(|v| v.failures > 0))
    }

    fn slot(&mut self, key: BreakerKey) -> &mut Option<BreakerView> {
        let (list, i) = match key {
            BreakerKey::Provider(p) => (&mut self.provider_breakers, usize::from(p.0)),
            BreakerKey::Connection(c) => (&mut self.connection_breakers, c.0 as usize),
        };
        if list.len() <= i {
            list.resize(i + 1, None);
        }
        &mut list[i]
    }

    /// Applies a breaker view (newer epochs win; see `BreakerView::apply`).
    pub fn apply_breaker(&mut self, key: BreakerKey, view: &BreakerView) -> bool {
        match self.slot(key) {
            Some(v) => v.apply(view),
            slot @ None => {
                *slot = Some(*view);
                true
            }
        }
    }

    pub fn breaker(&self, key: &BreakerKey) -> Option<&BreakerView> {
        let (list, i) = match key {
            BreakerKey::Provider(p) => (&self.provider_breakers, usize::from(p.0)),
            BreakerKey::Connection(c) => (&self.connection_breakers, c.0 as usize),
        };
        list.get(i).and_then(Option::as_ref)
    }
}
