//! Record: the one entry point through which every attempt's outcome reaches the owners —
//! the connection's owner (its breaker, cooldown, lockouts, egress family) and, for
//! successes and network failures, the provider's owner. Facts are sent, never applied
//! here, so one owner sees every fact for its keys in one order.

use crate::config::ConnectionId;
use crate::resilience::breaker::BreakerKey;
use crate::routing::resolve::Target;
use crate::runtime::msg::{AttemptResult, Msg, Outcome};
use crate::shard::Shard;

use super::select::Permit;

/// How long a failure's report waits for its owner's acknowledgement.
pub const ACK_TIMEOUT_MS: u64 = 100;

/// Reports how an attempt on `(target, connection)` ended, settling its probe permits.
/// Failures wait (bounded) for the owner to apply them and send the views they changed,
/// so the next request — from this client or any other — routes on them; successes are
/// only sent.
pub async fn attempt(
    shard: &Shard,
    target: &Target,
    connection: ConnectionId,
    permit: &Permit,
    result: AttemptResult,
) {
    let provider = target.provider;
    let (success, network) = match &result {
        AttemptResult::Success => (true, false),
        AttemptResult::ConnectFailed => (false, true),
        AttemptResult::Upstream { .. }
        | AttemptResult::Timeout
        | AttemptResult::StreamStall
        | AttemptResult::ClientAbort => (false, false),
    };
    let outcome = Outcome {
        provider,
        connection,
        model: target.model.clone(),
        result,
        probe: permit.connection_probe,
    };
    if matches!(outcome.result, AttemptResult::Success)
        && permit.provider_probe.is_none()
        && !has_state(shard, provider, connection)
    {
        // Nothing anywhere to close, clear or decay: a success on a connection that never
        // failed is not news (and costs no cross-core message).
        return;
    }
    let wait_for_owner = !matches!(
        outcome.result,
        AttemptResult::Success | AttemptResult::ClientAbort
    );
    let ack = wait_for_owner.then(|| shard.probes.register());
    let msg = Msg::Outcome(Box::new(outcome), ack.as_ref().map(|(id, _)| *id));
    // Facts must arrive (a lost one could hold a probe permit or miss a failure): a full
    // ring keeps them in the shard's outbox.
    shard.send_reliable(shard.owner(&connection), msg);
    if let Some((id, wait)) = ack {
        let budget = std::time::Duration::from_millis(ACK_TIMEOUT_MS);
        if monoio::time::timeout(budget, wait).await.is_err() {
            shard.probes.forget(id);
        }
    }
    let provider_owner = shard.owner(&provider);
    if success || network {
        let msg = Msg::ProviderResult {
            provider,
            success,
            network,
            probe: permit.provider_probe,
        };
        shard.send_reliable(provider_owner, msg);
    } else if let Some(ticket) = permit.provider_probe {
        shard.send_reliable(
            provider_owner,
            Msg::ReleaseProbe {
                key: BreakerKey::Provider(provider),
                ticket,
            },
        );
    }
}

/// Whether an owner holds anything a success would change for `(provider, connection)`:
/// a breaker that has counted failures, a connection with a cooldown, error level or
/// terminal state, or a model lockout. Read from the local views.
fn has_state(shard: &Shard, provider: crate::config::ProviderId, connection: ConnectionId) -> bool {
    let views = shard.views.borrow();
    let c = views.connections.get(connection);
    c.epoch > 0
        || views.breaker(&BreakerKey::Connection(connection)).is_some()
        || views.breaker(&BreakerKey::Provider(provider)).is_some()
        || views.lockouts.ever_locked(connection)
}
