//! A combo's ordering strategy applied to one request's candidates (spec B §3.2), before
//! the runner starts: the targets the local views let through now (B §3.1's pre-dispatch
//! filters, as `relay::order_available` reads them) are reordered by the strategy, each
//! target's connections kept together; the targets that are ruled out now follow in the
//! order written, where their attempts are skipped and named in the terminal answer. The
//! runner's retries, failover order, hedging, waits and mid-stream continuation then follow
//! the new order. The state is this shard's (`owners::State::strategies`), fed back by
//! [`attempted`] (`least-used`) and [`ended`] (`lkgp`, `p2c`).

use super::select::{self, Gate};
use crate::config::{Combo, ConnectionId};
use crate::owners::Req;
use crate::resilience::breaker::BreakerKey;
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
    // One gate reading per candidate: a group is eligible when one of its connections may
    // be tried now; its provider's breaker is half-open when an attempt would be its probe.
    let mut eligible: Vec<(usize, usize, usize)> = Vec::new();
    let mut ruled_out: Vec<(usize, usize, usize)> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    {
        let views = shard.state().views.borrow();
        for g @ (target, start, end) in groups {
            let (mut may, mut half_open) = (false, false);
            for (t, conn) in &candidates[start..end] {
                match select::gate(&views, config, t, *conn, now) {
                    Gate::Skip(..) => continue,
                    Gate::NeedProbe(keys) if keys.contains(&BreakerKey::Provider(t.provider)) => {
                        half_open = true;
                    }
                    Gate::Pass | Gate::NeedProbe(_) => {}
                }
                may |= views.tracker_cooling(t.provider, *conn, now).is_none();
            }
            if !may {
                ruled_out.push(g);
                continue;
            }
            let written = c.targets.get(target);
            eligible.push(g);
            steps.push(Step {
                target,
                weight: written.map_or(1, |t| t.weight),
                half_open,
                input_usd_per_mtok: written.and_then(|t| t.input_usd_per_mtok),
            });
        }
    }
    let (order, last_good) = with_state(shard, c, |state, rng| {
        let order = state.order(how, &steps, c.targets.len(), rng, now.mono_ms());
        let first = order.first().and_then(|&i| eligible.get(i));
        let last_good = match (how, first) {
            (Order::Lkgp, Some(&(target, _, _))) => state.last_good_connection(target),
            _ => None,
        };
        (order, last_good)
    });
    let old = std::mem::take(candidates);
    let mut slots: Vec<Option<(Target, ConnectionId)>> = old.into_iter().map(Some).collect();
    let groups = order
        .iter()
        .filter_map(|&i| eligible.get(i))
        .chain(ruled_out.iter());
    for &(_, start, end) in groups {
        candidates.extend(slots[start..end].iter_mut().filter_map(Option::take));
    }
    // `lkgp`: within the first target, the connection that served last goes first (a
    // session's pin, applied after this, still comes before it).
    if let Some(good) = last_good {
        let first = candidates.first().map(|(t, _)| t.clone());
        let run = candidates
            .iter()
            .take_while(|(t, _)| Some(t) == first.as_ref())
            .count();
        if let Some(at) = candidates[..run].iter().position(|(_, c)| *c == good) {
            candidates[..=at].rotate_right(1);
        }
    }
}

/// `least-used`: an attempt is about to be sent to `target` of combo `combo`.
pub(super) fn attempted(shard: &Req<'_>, combo: usize, target: &Target) {
    let c = &shard.config().combos[combo];
    if Order::of(c) != Some(Order::LeastUsed) {
        return;
    }
    let now = shard.now().mono_ms();
    with_state(shard, c, |state, _| {
        state.used(written_index(c, target), now)
    });
}

/// `lkgp`, `p2c`: an attempt on `connection` of `target` of combo `combo` ended: `ok` when
/// it served (a 2xx answer, its stream, if any, ended cleanly), else it failed;
/// `head_ms`: how long its response head took. An attempt the client abandoned is not
/// reported.
pub(super) fn ended(
    shard: &Req<'_>,
    combo: usize,
    target: &Target,
    connection: ConnectionId,
    ok: bool,
    head_ms: Option<u64>,
) {
    let Some(c) = shard.config().combos.get(combo) else {
        return;
    };
    let how = Order::of(c);
    if !matches!(how, Some(Order::Lkgp | Order::P2c)) {
        return;
    }
    let now = shard.now().mono_ms();
    let written = written_index(c, target);
    with_state(shard, c, |state, _| match how {
        Some(Order::Lkgp) if ok => state.served(written, connection),
        Some(Order::P2c) => state.ended(written, ok, head_ms, now),
        _ => {}
    });
}

/// Runs `f` over combo `c`'s strategy state on this shard (fresh when a reload changed its
/// strategy or targets) and the shard's PRNG. The borrow ends with `f`: no await inside.
fn with_state<R>(
    shard: &Req<'_>,
    c: &Combo,
    f: impl FnOnce(&mut strategy::ComboState, &mut strategy::Rng) -> R,
) -> R {
    let mut table = shard.state().strategies.borrow_mut();
    let (state, rng) = table.combo(
        &c.name,
        strategy::fingerprint(c),
        || seed(shard),
        live(shard),
    );
    f(state, rng)
}

/// The target's index in the combo's written (flattened) list; past the end when it is not
/// there (never: the plan's targets come from that list).
fn written_index(c: &Combo, t: &Target) -> usize {
    c.targets
        .iter()
        .position(|w| w.provider == t.provider && t.model == w.model.as_str())
        .unwrap_or(c.targets.len())
}

/// Whether a combo name is in the request's configuration (the strategy table forgets
/// those a reload removed).
fn live<'c>(shard: &'c Req<'_>) -> impl Fn(&str) -> bool + 'c {
    let config = shard.config();
    move |name| config.combos.iter().any(|c| c.name == name)
}

/// The shard's PRNG seed: its id and the time of its first combo request.
fn seed(shard: &Req<'_>) -> u64 {
    (shard.id() as u64).rotate_left(48) ^ shard.now().mono_ns
}
