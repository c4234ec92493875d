//! Quota-share combos (B §2.3, §2.4): before the first attempt, the quota-share home orders
//! the combo's candidates (bucket gate, cap gate against live in-flight counts, deficit round
//! robin by weight, power of two choices) and counts the chosen connection in flight until
//! the request ends; each attempt then takes its connection's `qsconn` slot
//! (`owners::gates::client::quota_share_slot`). Both fail open: a home that cannot be asked leaves the
//! combo's own order, a slot that cannot be had lets the attempt run without it.

use std::time::Duration;

use crate::config::ConnectionId;
use crate::flow::admission::QuotaShareHome;
use crate::owners::{Req, Shard};
use crate::routing::resolve::Target;

use super::QuotaShare;
use super::protocol::{Candidate, Fact, Reply, Request};

/// How long an asker waits for the home's order before keeping its own (a lost reply; the
/// home answers at once).
const ORDER_REPLY_TIMEOUT_MS: u64 = 1_000;

/// Counts the chosen connection in flight on the home until dropped (the request's end).
pub struct QsTicket<'a> {
    shard: &'a Shard,
    home: usize,
    serial: u64,
}

impl Drop for QsTicket<'_> {
    fn drop(&mut self) {
        let fact = Fact::Release {
            serial: self.serial,
        };
        self.shard.send_fact(self.home, fact.into());
    }
}

/// Reorders `candidates` of combo `combo` by the home's quota-share selection.
pub async fn order<'a>(
    shard: &Req<'a>,
    combo: usize,
    candidates: &mut Vec<(Target, ConnectionId)>,
) -> Option<QsTicket<'a>> {
    let config = shard.config();
    let combo = config.combos.get(combo)?;
    let list: Vec<Candidate> = candidates
        .iter()
        .map(|(t, c)| {
            let provider = &config.provider(t.provider).name;
            let conn = config.connection(*c);
            let target_weight = combo
                .targets
                .iter()
                .find(|ct| ct.provider == t.provider && ct.model == t.model)
                .map_or(1, |ct| ct.weight.max(1));
            Candidate {
                connection: *c,
                execution_key: format!("{provider}/{}/{}", t.model, conn.name),
                weight: target_weight.saturating_mul(conn.weight.max(1)),
            }
        })
        .collect();
    let home = shard.owner(&QuotaShareHome);
    let request = Request::Select {
        combo: combo.name.clone(),
        candidates: list,
    };
    let bound = Duration::from_millis(ORDER_REPLY_TIMEOUT_MS);
    // A late answer's ticket is returned by the late hook.
    let Reply::Picked(pick) = shard.call::<QuotaShare>(home, request, bound).await.ok()?;
    let ticket = pick.ticket.map(|serial| QsTicket {
        shard: shard.shard(),
        home,
        serial,
    });
    let reordered: Vec<(Target, ConnectionId)> = pick
        .ordered
        .iter()
        .filter_map(|i| candidates.get(usize::try_from(*i).ok()?).cloned())
        .collect();
    if reordered.len() == candidates.len() {
        *candidates = reordered;
    }
    ticket
}
