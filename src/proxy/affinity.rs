//! Session affinity at selection time (B §4): before the first attempt, the connection
//! each provider's session pin names is moved to the front of that provider's targets'
//! candidates. What may be pinned is decided here from the local views; the pin itself is
//! kept by the session's owner (`owners::affinity`).

use crate::config::{ConnectionId, ProviderId};
use crate::owners::Req;
use crate::owners::affinity::client::{Session, choose};
use crate::routing::affinity::Eligible;
use crate::routing::resolve::Target;

use super::select::{Gate, gate};

/// Puts each provider's pinned connection first. `combo`: the candidates are a combo's
/// targets (the provider cooldown tracker counts for eligibility).
pub async fn prefer(
    shard: &Req<'_>,
    session: Session,
    combo: bool,
    candidates: &mut [(Target, ConnectionId)],
) {
    let mut providers: Vec<ProviderId> = Vec::new();
    for (t, _) in candidates.iter() {
        if !providers.contains(&t.provider) {
            providers.push(t.provider);
        }
    }
    for provider in providers {
        // One connection: nothing to choose, the owner is not asked.
        let mut connections = candidates
            .iter()
            .filter(|(t, _)| t.provider == provider)
            .map(|(_, c)| *c);
        let first = connections.next();
        if connections.all(|c| Some(c) == first) {
            continue;
        }
        let eligible = eligible(shard, provider, combo, candidates);
        if let Some(pinned) = choose(shard, session, provider, eligible).await {
            to_front(candidates, provider, pinned);
        }
    }
}

/// The distinct connections of `provider` among the candidates (in their order) that the
/// local views let through now without a probe: not cooling, not terminal, not locked for
/// the target's model, breakers closed (and for a combo, not tracker-cooled).
fn eligible(
    shard: &Req<'_>,
    provider: ProviderId,
    combo: bool,
    candidates: &[(Target, ConnectionId)],
) -> Vec<Eligible> {
    let views = shard.state().views.borrow();
    let (config, now) = (shard.config(), shard.now());
    let mut out: Vec<Eligible> = Vec::new();
    for (t, c) in candidates.iter().filter(|(t, _)| t.provider == provider) {
        if out.iter().any(|e| e.connection == *c) {
            continue;
        }
        let open = gate(&views, config, t, *c, now) == Gate::Pass
            && !(combo && views.tracker_cooling(t.provider, *c, now).is_some());
        if open {
            out.push(Eligible {
                connection: *c,
                priority: config.connection(*c).priority,
            });
        }
    }
    out
}

/// Within each run of candidates that share a target of `provider`, moves `pinned` to the
/// front (the rest keep their order).
fn to_front(candidates: &mut [(Target, ConnectionId)], provider: ProviderId, pinned: ConnectionId) {
    let mut start = 0;
    while start < candidates.len() {
        let mut end = start + 1;
        while end < candidates.len() && candidates[end].0 == candidates[start].0 {
            end += 1;
        }
        if candidates[start].0.provider == provider
            && let Some(at) = candidates[start..end]
                .iter()
                .position(|(_, c)| *c == pinned)
        {
            candidates[start..=start + at].rotate_right(1);
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(p: u16, m: &str) -> Target {
        Target {
            provider: ProviderId(p),
            model: crate::routing::model_name::ModelName::new(m),
        }
    }

    #[test]
    fn the_pinned_connection_leads_each_run_of_its_provider() {
        let c = ConnectionId;
        let mut list = vec![
            (t(0, "a"), c(0)),
            (t(0, "a"), c(1)),
            (t(0, "a"), c(2)),
            (t(1, "x"), c(1)),
            (t(0, "b"), c(0)),
            (t(0, "b"), c(2)),
        ];
        to_front(&mut list, ProviderId(0), c(2));
        let got: Vec<(u16, u32)> = list.iter().map(|(t, c)| (t.provider.0, c.0)).collect();
        assert_eq!(got, vec![(0, 2), (0, 0), (0, 1), (1, 1), (0, 2), (0, 0)]);
    }
}
