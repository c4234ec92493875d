//! The replicated views every shard routes from: for each provider and connection breaker,
//! each connection, and each model lockout, "routable, or not until T, and why". Owners
//! broadcast updates; applying one is idempotent (newer epochs win, duplicates are no-ops),
//! so a dropped or repeated broadcast only delays convergence. Selection reads only these.

use super::protocol::View;
use crate::resilience::breaker::{BreakerKey, BreakerView};
use crate::resilience::connection::ConnectionViews;
use crate::resilience::lockout::LockoutViews;

#[derive(Debug, Default)]
pub struct Views {
    /// Provider breakers, indexed by `ProviderId` (ids are dense).
    provider_breakers: Vec<Option<BreakerView>>,
    /// Connection breakers, indexed by `ConnectionId`.
    connection_breakers: Vec<Option<BreakerView>>,
    pub connections: ConnectionViews,
    pub lockouts: LockoutViews,
}

impl Views {
    /// Applies a view; true when it changed anything.
    pub fn apply(&mut self, view: &View) -> bool {
        match view {
            View::Breaker { key, view } => self.apply_breaker(*key, view),
            View::Connection { connection, view } => self.connections.apply(*connection, view),
            View::Lockout(u) => self.lockouts.apply(u),
        }
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
