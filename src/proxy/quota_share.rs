//! Quota-share combos (B §2.3, §2.4): before the first attempt, the quota-share home orders
//! the combo's candidates (bucket gate, cap gate against live in-flight counts, deficit round
//! robin by weight, power of two choices) and counts the chosen connection in flight until
//! the request ends; each attempt then takes its connection's `qsconn` slot
//! (`proxy::gate::quota_share_slot`). Both fail open: a home that cannot be asked leaves the
//! combo's own order, a slot that cannot be had lets the attempt run without it.

use std::time::Duration;

use crate::config::ConnectionId;
use crate::flow::admission::QuotaShareHome;
use crate::routing::resolve::Target;
use crate::runtime::msg::{Msg, QsCandidate};
use crate::shard::probe::Answer;
use crate::shard::{Shard, global_waiter_id};

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
        let msg = Msg::QsRelease {
            serial: self.serial,
        };
        self.shard.send_reliable(self.home, msg);
    }
}

/// Reorders `candidates` of combo `combo` by the home's quota-share selection.
pub async fn order<'a>(
    shard: &'a Shard,
    combo: usize,
    candidates: &mut Vec<(Target, ConnectionId)>,
) -> Option<QsTicket<'a>> {
    let config = shard.config();
    let combo = config.combos.get(combo)?;
    let list: Vec<QsCandidate> = candidates
        .iter()
        .map(|(t, c)| {
            let provider = &config.provider(t.provider).name;
            let conn = config.connection(*c);
            let target_weight = combo
                .targets
                .iter()
                .find(|ct| ct.provider == t.provider && ct.model == t.model)
                .map_or(1, |ct| ct.weight.max(1));
            QsCandidate {
                connection: *c,
                execution_key: format!("{provider}/{}/{}", t.model, conn.name),
                weight: target_weight.saturating_mul(conn.weight.max(1)),
            }
        })
        .collect();
    let home = shard.owner(&QuotaShareHome);
    let (local, wait) = shard.probes.register();
    let msg = Msg::QsSelect {
        id: global_waiter_id(shard.id, local),
        combo: combo.name.clone(),
        candidates: list,
    };
    if !shard.send_reliable(home, msg) {
        shard.probes.forget(local);
        return None;
    }
    let pick =
        match monoio::time::timeout(Duration::from_millis(ORDER_REPLY_TIMEOUT_MS), wait).await {
            Ok(Answer::QuotaShare(pick)) => pick,
            Ok(_) => return None,
            Err(_) => {
                // A late answer's ticket is returned by the pump.
                shard.probes.forget(local);
                return None;
            }
        };
    let ticket = pick.ticket.map(|serial| QsTicket {
        shard,
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
