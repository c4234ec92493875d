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

/// Reports how an attempt on `(target, connection)` ended, settling its probe permits.
pub fn attempt(
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
    if shard
        .send(shard.owner(&connection), Msg::Outcome(Box::new(outcome)))
        .is_err()
    {
        tracing::warn!(
            shard = shard.id,
            "mesh ring full: an attempt outcome was dropped"
        );
    }
    let provider_owner = shard.owner(&provider);
    if success || network {
        let msg = Msg::ProviderResult {
            provider,
            success,
            network,
            probe: permit.provider_probe,
        };
        if shard.send(provider_owner, msg).is_err() {
            tracing::warn!(
                shard = shard.id,
                "mesh ring full: a provider result was dropped"
            );
        }
    } else if let Some(ticket) = permit.provider_probe {
        let _ = shard.send(
            provider_owner,
            Msg::ReleaseProbe {
                key: BreakerKey::Provider(provider),
                ticket,
            },
        );
    }
}
