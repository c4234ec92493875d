//! A combo's ordering strategy applied to one request's candidates (spec B §3.2), before
//! the runner starts: the targets the local views let through now (B §3.1's pre-dispatch
//! filters, as `relay::order_available` reads them) are reordered by the strategy, each
//! target's connections kept together; the targets that are ruled out now follow in the
//! order written, where their attempts are skipped and named in the terminal answer. The
//! runner's retries, failover order, hedging, waits and mid-stream continuation then follow
//! the new order. The state is this shard's (`owners::State::strategies`).

use super::select::{self, Gate};
use crate::config::{Combo, ConnectionId};
use crate::owners::Req;
use crate::routing::resolve::Target;
use crate::routing::strategy::{self, Order, Step};

/// Reorders `candidates` (grouped by target, as the plan builds them) by combo `combo`'s
/// strategy. Nothing happens for a strategy without an ordering of its own here.
pub(super) fn order(shard: &Req<'_>, combo: usize, candidates: &mut Vec<(Target, ConnectionId)>) {
    let config = shard.config();
    let c = &config.combos[combo];
    let Some(how) = Order::of(c) else {
        return;
    };
    // The target groups: (written index, first candidate, end), in the plan's order.
    let mut groups: Vec<(usize, usize, usize)> = Vec::new();
    for (i, (t, _)) in candidates.iter().enumerate() {
        match groups.last_mut() {
            Some((_, start, end)) if candidates[*start].0 == *t => *end = i + 1,
            _ => groups.push((written_index(c, t), i, i + 1)),
        }
    }
    let now = shard.now();
    let (eligible, ruled_out): (Vec<_>, Vec<_>) = {
        let views = shard.state().views.borrow();
        groups.into_iter().partition(|&(_, start, end)| {
            candidates[start..end].iter().any(|(t, conn)| {
                !matches!(select::gate(&views, config, t, *conn, now), Gate::Skip(..))
                    && views.tracker_cooling(t.provider, *conn, now).is_none()
            })
        })
    };
    let steps: Vec<Step> = eligible
        .iter()
        .map(|&(target, _, _)| Step {
            target,
            weight: c.targets.get(target).map_or(1, |t| t.weight),
        })
        .collect();
    let order = {
        let mut table = shard.state().strategies.borrow_mut();
        let (state, rng) = table.combo(&c.name, strategy::fingerprint(c), || seed(shard));
        state.order(how, &steps, c.targets.len(), rng, now.mono_ms())
    };
    let old = std::mem::take(candidates);
    let mut slots: Vec<Option<(Target, ConnectionId)>> = old.into_iter().map(Some).collect();
    let groups = order
        .iter()
        .filter_map(|&i| eligible.get(i))
        .chain(ruled_out.iter());
    for &(_, start, end) in groups {
        candidates.extend(slots[start..end].iter_mut().filter_map(Option::take));
    }
}

/// `least-used`: an attempt is about to be sent to `target` of combo `combo`.
pub(super) fn attempted(shard: &Req<'_>, combo: usize, target: &Target) {
    let c = &shard.config().combos[combo];
    if Order::of(c) != Some(Order::LeastUsed) {
        return;
    }
    let now = shard.now().mono_ms();
    let mut table = shard.state().strategies.borrow_mut();
    let (state, _) = table.combo(&c.name, strategy::fingerprint(c), || seed(shard));
    state.used(written_index(c, target), now);
}

/// The target's index in the combo's written (flattened) list; past the end when it is not
/// there (never: the plan's targets come from that list).
fn written_index(c: &Combo, t: &Target) -> usize {
    c.targets
        .iter()
        .position(|w| w.provider == t.provider && t.model == w.model.as_str())
        .unwrap_or(c.targets.len())
}

/// The shard's PRNG seed: its id and the time of its first combo request.
fn seed(shard: &Req<'_>) -> u64 {
    (shard.id() as u64).rotate_left(48) ^ shard.now().mono_ns
}
