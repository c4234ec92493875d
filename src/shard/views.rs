//! The replicated views every shard routes from: for each provider and connection breaker,
//! each connection, and each model lockout, "routable, or not until T, and why". Owners
//! broadcast updates; applying one is idempotent (newer epochs win, duplicates are no-ops),
//! so a dropped or repeated broadcast only delays convergence. Selection reads only these.

use std::collections::HashMap;

use crate::resilience::breaker::{BreakerKey, BreakerView};
use crate::resilience::connection::ConnectionViews;
use crate::resilience::lockout::LockoutViews;
use crate::runtime::msg::Msg;

#[derive(Debug, Default)]
pub struct Views {
    pub breakers: HashMap<BreakerKey, BreakerView>,
    pub connections: ConnectionViews,
    pub lockouts: LockoutViews,
}

impl Views {
    /// Applies a view message; true when it changed anything. Other messages are ignored.
    pub fn apply(&mut self, msg: &Msg) -> bool {
        match msg {
            Msg::BreakerView { key, view } => match self.breakers.get_mut(key) {
                Some(v) => v.apply(view),
                None => {
                    self.breakers.insert(*key, *view);
                    true
                }
            },
            Msg::ConnectionView { connection, view } => self.connections.apply(*connection, view),
            Msg::Lockout(u) => self.lockouts.apply(u),
            Msg::Outcome(..)
            | Msg::Ack { .. }
            | Msg::ProviderResult { .. }
            | Msg::EgressCool { .. }
            | Msg::ProbeRequest { .. }
            | Msg::ProbeReply { .. }
            | Msg::ReleaseProbe { .. } => false,
        }
    }

    pub fn breaker(&self, key: &BreakerKey) -> Option<&BreakerView> {
        self.breakers.get(key)
    }
}
