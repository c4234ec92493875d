//! The asker's side of health: half-open probe permits ([`ProbePermits`], settled exactly
//! once) and the report of how each attempt ended ([`report`]). Facts are sent, never
//! applied here, so one owner sees every fact for its keys in one order.

use std::time::Duration;

use crate::config::{ConnectionId, ProviderId};
use crate::resilience::breaker::{BreakerKey, Failure, ProbeTicket};
use crate::shard::call::CallError;

use super::Health;
use super::protocol::{
    AdminRequest, ComboAttempt, Ended, Fact, Outcome, ProviderEnded, ProviderReport, Reply, Request,
};
use crate::owners::Shard;

/// How long a shard waits for an owner's probe answer.
pub const PROBE_REPLY_TIMEOUT_MS: u64 = 1_000;

/// How long a failure's report waits for its owner's acknowledgement. A healthy owner
/// answers within microseconds; the bound only matters when the owner's thread is not
/// running, and a request that stops waiting routes its retry on the views from before its
/// own failure. 100 ms was too short on a loaded 2-core machine (4 to 7 in 200 runs of
/// `resilience_lockout::one_429_cools_every_connection_behind_the_same_egress` retried on
/// the cooled egress sibling; 1 s: 3 in 200; 2 s: none).
pub const ACK_TIMEOUT_MS: u64 = 2000;

/// Asks the owner of `key` for the half-open probe permit: `Ok(Some(ticket))` — the probe
/// is ours; `Ok(None)` with a wait — not now (0: the breaker is closed after all).
pub async fn ask_probe(
    shard: &Shard,
    key: BreakerKey,
) -> Result<(Option<ProbeTicket>, u64), CallError> {
    let owner = match key {
        BreakerKey::Provider(p) => shard.owner(&p),
        BreakerKey::Connection(c) => shard.owner(&c),
    };
    let bound = Duration::from_millis(PROBE_REPLY_TIMEOUT_MS);
    match shard
        .call::<Health>(owner, Request::Probe(key), bound)
        .await?
    {
        Reply::Probe {
            ticket,
            retry_after_ms,
            ..
        } => Ok((ticket, retry_after_ms)),
        _ => Err(CallError::Mismatched),
    }
}

/// How long the management API waits for one owner's answer.
pub const ADMIN_REPLY_TIMEOUT_MS: u64 = 2_000;

/// Asks one shard's health owner a management request.
pub async fn admin(shard: &Shard, owner: usize, request: AdminRequest) -> Result<Reply, CallError> {
    let bound = Duration::from_millis(ADMIN_REPLY_TIMEOUT_MS);
    shard
        .call::<Health>(owner, Request::Admin(request), bound)
        .await
}

/// Asks every shard's health owner the same management request; the answers in shard
/// order. The first failed call fails the whole (no partial answer is shown as complete).
pub async fn admin_all(shard: &Shard, request: &AdminRequest) -> Result<Vec<Reply>, CallError> {
    let mut out = Vec::with_capacity(shard.shards());
    for owner in 0..shard.shards() {
        out.push(admin(shard, owner, request.clone()).await?);
    }
    Ok(out)
}

/// The half-open probe permits an attempt holds. Each is settled exactly once: by the
/// attempt's outcome ([`report`] consumes them), or returned unused when dropped.
#[derive(Default)]
pub struct ProbePermits<'a> {
    shard: Option<&'a Shard>,
    provider: Option<(ProviderId, ProbeTicket)>,
    connection: Option<(ConnectionId, ProbeTicket)>,
}

impl<'a> ProbePermits<'a> {
    pub fn new(shard: &'a Shard) -> Self {
        Self {
            shard: Some(shard),
            provider: None,
            connection: None,
        }
    }

    pub fn hold(&mut self, key: BreakerKey, ticket: ProbeTicket) {
        match key {
            BreakerKey::Provider(p) => self.provider = Some((p, ticket)),
            BreakerKey::Connection(c) => self.connection = Some((c, ticket)),
        }
    }

    fn take(&mut self) -> (Option<ProbeTicket>, Option<ProbeTicket>) {
        (
            self.provider.take().map(|(_, t)| t),
            self.connection.take().map(|(_, t)| t),
        )
    }
}

impl Drop for ProbePermits<'_> {
    fn drop(&mut self) {
        let Some(shard) = self.shard else {
            return;
        };
        if let Some((p, ticket)) = self.provider.take() {
            let key = BreakerKey::Provider(p);
            shard.send_fact(shard.owner(&p), Fact::ReleaseProbe { key, ticket }.into());
        }
        if let Some((c, ticket)) = self.connection.take() {
            let key = BreakerKey::Connection(c);
            shard.send_fact(shard.owner(&c), Fact::ReleaseProbe { key, ticket }.into());
        }
    }
}

/// Reports how an attempt on `(provider, connection, model)` ended, settling its probe
/// permits. Failures wait (bounded) for the owners to apply them and send the views they
/// changed, so the next request — from this client or any other — routes on them;
/// successes and aborts are only sent, and a success on a connection with no state
/// anywhere is not news (it costs no cross-core message). `combo`: the attempt was a
/// combo target (the owners apply the combo path's rules; its failures feed the provider
/// cooldown tracker).
pub async fn report(
    shard: &Shard,
    provider: ProviderId,
    connection: ConnectionId,
    model: &str,
    combo: Option<ComboAttempt>,
    mut permits: ProbePermits<'_>,
    ended: Ended,
) {
    if is_quiet(shard, provider, connection, &permits, &ended) {
        return;
    }
    let (provider_probe, connection_probe) = permits.take();
    // What the provider's owner hears: successes; network failures (counted
    // provider-wide); any failure that ends its breaker's half-open probe (settled as the
    // connection breaker settles its own); a combo target's failure (the tracker).
    let provider_ended = match &ended {
        Ended::Success => Some(ProviderEnded::Success),
        Ended::Failed(v) => {
            let f = if v.decision.skip_provider_breaker && !v.is_network() {
                Failure::RequestScoped
            } else {
                v.breaker
            };
            (f.is_network() || provider_probe.is_some() || (combo.is_some() && f.counts()))
                .then_some(ProviderEnded::Failed(f))
        }
        Ended::StreamBroken { .. } | Ended::ClientAbort => None,
    };
    let wait_for_owner = matches!(ended, Ended::Failed(_) | Ended::StreamBroken { .. });
    let outcome = Box::new(Outcome {
        provider,
        connection,
        model: model.to_owned(),
        ended,
        probe: connection_probe,
        combo,
    });
    let owner = shard.owner(&connection);
    let bound = Duration::from_millis(ACK_TIMEOUT_MS);
    if wait_for_owner {
        // A lost or late acknowledgement only means the next request may route on an older
        // view; the outcome itself is delivered (the outbox keeps it).
        let reply = shard
            .call::<Health>(owner, Request::Outcome(outcome), bound)
            .await;
        // Egress siblings the failure cooled live on their own owners, which were only
        // told: asking each of them too means their views are here (ring order, as above)
        // before this shard routes the request's retry, or its next request.
        if let Ok(Reply::Applied { egress }) = reply {
            for e in egress {
                let _ = shard
                    .call::<Health>(shard.owner(&e.connection), Request::EgressCool(e), bound)
                    .await;
            }
        }
    } else {
        shard.send_fact(owner, Fact::Outcome(outcome).into());
    }
    let provider_owner = shard.owner(&provider);
    match provider_ended {
        Some(ended) => {
            let r = ProviderReport {
                provider,
                ended,
                probe: provider_probe,
                combo: combo.is_some(),
            };
            if wait_for_owner {
                let _ = shard
                    .call::<Health>(provider_owner, Request::ProviderResult(r), bound)
                    .await;
            } else {
                shard.send_fact(provider_owner, Fact::ProviderResult(r).into());
            }
        }
        None => {
            if let Some(ticket) = provider_probe {
                let key = BreakerKey::Provider(provider);
                shard.send_fact(provider_owner, Fact::ReleaseProbe { key, ticket }.into());
            }
        }
    }
}

/// Whether [`report`] of `ended` would tell no one anything: no probe is held, and the
/// attempt was abandoned by its client (nothing to settle, nothing to count) or succeeded
/// on a connection with no state anywhere (not news). The caller may then skip `report`
/// (and the building of its future) and drop the permits as they are.
pub fn is_quiet(
    shard: &Shard,
    provider: ProviderId,
    connection: ConnectionId,
    permits: &ProbePermits<'_>,
    ended: &Ended,
) -> bool {
    let no_probe = permits.provider.is_none() && permits.connection.is_none();
    no_probe
        && match ended {
            Ended::ClientAbort => true,
            Ended::Success => !has_state(shard, provider, connection),
            Ended::Failed(_) | Ended::StreamBroken { .. } => false,
        }
}

/// Whether an owner holds anything a success would change for `(provider, connection)`:
/// a breaker that has counted failures, a connection with a cooldown, error level or
/// terminal state, or a model lockout. Read from the local views.
fn has_state(shard: &Shard, provider: ProviderId, connection: ConnectionId) -> bool {
    let views = shard.state().views.borrow();
    let c = views.connections.get(connection);
    c.epoch > 0
        || views.breaker(&BreakerKey::Connection(connection)).is_some()
        || views.breaker(&BreakerKey::Provider(provider)).is_some()
        || views.lockouts.ever_locked(connection)
        || views.tracker_failures(provider, connection)
}
