//! The quota-share home: the selector's deficit counters and in-flight tickets.

use std::collections::HashMap;

use crate::config::{Config, ConnectionId};
use crate::flow::admission::account_capacity;
use crate::flow::quota_share::{
    INFLIGHT_LEASE_MS, InflightTicket, NoBuckets, QsTarget, QuotaShareSelector,
};
use crate::shard::call::CallId;

use super::protocol::{Candidate, Fact, Pick, Reply, Request};
use crate::owners::{Cx, Mechanism, Shard};

/// Quota-share selection state (on the quota-share home only).
#[derive(Debug, Default)]
pub struct QuotaShare {
    pub selector: QuotaShareSelector,
    /// Outstanding in-flight tickets by serial, with when they were taken (monotonic ns).
    pub tickets: HashMap<u64, (InflightTicket, u64)>,
}

impl Mechanism for QuotaShare {
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    const HOLDS: bool = false;

    fn new(_config: &Config) -> Self {
        Self::default()
    }

    fn call(&mut self, cx: &mut Cx<'_>, id: CallId, request: Request) {
        let Request::Select { combo, candidates } = request;
        let pick = self.select(cx, &combo, &candidates);
        cx.reply(id, Reply::Picked(Box::new(pick)));
    }

    fn fact(&mut self, _cx: &mut Cx<'_>, fact: Fact) {
        let Fact::Release { serial } = fact;
        if let Some((ticket, _)) = self.tickets.remove(&serial) {
            self.selector.release(ticket);
        }
    }

    fn late(shard: &Shard, from: usize, _id: CallId, reply: Reply) {
        let Reply::Picked(pick) = reply;
        if let Some(serial) = pick.ticket {
            // The asker gave up: the dispatch never happens, so it is not in flight.
            shard.send_fact(from, Fact::Release { serial }.into());
        }
    }

    fn housekeeping(&mut self, cx: &mut Cx<'_>) {
        // In-flight tickets whose release was lost stop counting after their lease.
        let now = cx.now;
        self.selector.sweep(now);
        let lease_ns = INFLIGHT_LEASE_MS.saturating_mul(1_000_000);
        self.tickets
            .retain(|_, (_, taken)| now.mono_ns.saturating_sub(*taken) < lease_ns);
    }
}

impl QuotaShare {
    /// Quota-share selection (B §2.4) over a combo's candidates: caps are the connections'
    /// account capacities; no quota buckets are tracked (nothing is ever saturated).
    fn select(&mut self, cx: &Cx<'_>, combo: &str, candidates: &[Candidate]) -> Pick {
        let now = cx.now;
        let targets: Vec<QsTarget> = candidates
            .iter()
            .map(|c| QsTarget {
                execution_key: c.execution_key.clone(),
                connection: Some(c.connection),
                weight: Some(f64::from(c.weight)),
            })
            .collect();
        let caps: HashMap<ConnectionId, u32> = candidates
            .iter()
            .filter_map(|c| account_capacity(cx.config, c.connection).map(|n| (c.connection, n)))
            .collect();
        let selection = self
            .selector
            .select(&targets, combo, combo, Some(&caps), &NoBuckets, now);
        let ticket = selection.ticket.map(|t| {
            let serial = t.serial();
            self.tickets.insert(serial, (t, now.mono_ns));
            serial
        });
        Pick {
            ordered: selection
                .ordered
                .iter()
                .map(|i| u32::try_from(*i).unwrap_or(u32::MAX))
                .collect(),
            ticket,
        }
    }
}
