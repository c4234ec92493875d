//! Select: may this candidate (target × connection) be tried now? Reads only the local
//! views — breaker gates, connection cooldown and terminal state, model lockouts — so the
//! happy path crosses no core. A half-open breaker needs its owner's one probe permit,
//! asked for over the mesh (a direct call when this shard is the owner).

use std::time::Duration;

use crate::clock::Now;
use crate::config::{Config, ConnectionId, ProviderId};
use crate::error::{ErrorKind, GatewayError};
use crate::resilience::breaker::{BreakerKey, ProbeTicket, ViewGate};
use crate::resilience::connection::{Routability, Terminal};
use crate::routing::resolve::Target;
use crate::runtime::msg::Msg;
use crate::shard::Shard;
use crate::shard::probe::Answer;
use crate::shard::views::Views;

/// How long a shard waits for an owner's probe answer.
pub const PROBE_REPLY_TIMEOUT_MS: u64 = 1_000;

/// Why a candidate was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exclusion {
    CircuitOpen,
    ConnectionCooldown,
    ModelLockout,
    Terminal(Terminal),
}

impl Exclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Exclusion::CircuitOpen => "circuit_open",
            Exclusion::ConnectionCooldown => "connection_cooldown",
            Exclusion::ModelLockout => "model_lockout",
            Exclusion::Terminal(t) => t.status().as_str(),
        }
    }
}

/// A skipped candidate, for the terminal response.
#[derive(Clone, Debug)]
pub struct Excluded {
    pub provider: ProviderId,
    pub connection: ConnectionId,
    pub model: String,
    pub reason: Exclusion,
    /// When it may be routable again, if known.
    pub retry_after_ms: Option<u64>,
}

/// The probe permits an admitted attempt holds; each must be settled by `record`.
#[derive(Clone, Debug, Default)]
pub struct Permit {
    pub provider_probe: Option<ProbeTicket>,
    pub connection_probe: Option<ProbeTicket>,
}

pub enum Admit {
    Yes(Permit),
    No(Excluded),
    Failed(GatewayError),
}

/// What the local views say about one candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Route freely.
    Pass,
    /// Routable once the owners grant these half-open probes (one or both breakers).
    NeedProbe(Vec<BreakerKey>),
    /// Skip, for this reason, until about `retry_after_ms` from now (if known).
    Skip(Exclusion, Option<u64>),
}

/// The pure part of selection: reads the views only, allocates nothing on the pass path.
pub fn gate(
    views: &Views,
    config: &Config,
    target: &Target,
    connection: ConnectionId,
    now: Now,
) -> Gate {
    match views.connections.routability(connection, now) {
        Routability::Routable => {}
        Routability::NotUntil { until_ms, .. } => {
            return Gate::Skip(
                Exclusion::ConnectionCooldown,
                Some(until_ms.saturating_sub(now.wall_ms)),
            );
        }
        Routability::Terminal(t) => return Gate::Skip(Exclusion::Terminal(t), None),
    }
    let provider = &config.provider(target.provider).name;
    if let Some(lock) = views
        .lockouts
        .lock_of(provider, Some(connection), &target.model, now)
    {
        return Gate::Skip(
            Exclusion::ModelLockout,
            Some(lock.until_ms.saturating_sub(now.mono_ms())),
        );
    }
    let mut need: Option<Vec<BreakerKey>> = None;
    for key in BreakerKey::gating(target.provider, connection) {
        match views.breaker(&key).map(|v| v.gate(now)) {
            None | Some(ViewGate::Pass) => {}
            Some(ViewGate::Blocked { retry_after_ms }) => {
                return Gate::Skip(Exclusion::CircuitOpen, Some(retry_after_ms));
            }
            Some(ViewGate::Probe) => need.get_or_insert_with(Vec::new).push(key),
        }
    }
    match need {
        Some(keys) => Gate::NeedProbe(keys),
        None => Gate::Pass,
    }
}

/// Decides whether `(target, connection)` may be attempted now.
pub async fn admit(shard: &Shard, target: &Target, connection: ConnectionId) -> Admit {
    let now = shard.now();
    let excluded = |reason, retry_after_ms| {
        Admit::No(Excluded {
            provider: target.provider,
            connection,
            model: target.model.clone(),
            reason,
            retry_after_ms,
        })
    };
    let verdict = gate(
        &shard.views.borrow(),
        shard.config(),
        target,
        connection,
        now,
    );
    let need_probe = match verdict {
        Gate::Pass => return Admit::Yes(Permit::default()),
        Gate::Skip(reason, retry_after_ms) => return excluded(reason, retry_after_ms),
        Gate::NeedProbe(keys) => keys,
    };
    let mut permit = Permit::default();
    for key in need_probe {
        match ask_probe(shard, key).await {
            Ok((Some(ticket), _)) => match key {
                BreakerKey::Provider(_) => permit.provider_probe = Some(ticket),
                BreakerKey::Connection(_) => permit.connection_probe = Some(ticket),
            },
            Ok((None, retry_after_ms)) => {
                release(shard, target.provider, connection, &permit);
                // `None` with no wait means the owner's breaker is closed after all.
                if retry_after_ms == 0 {
                    continue;
                }
                return excluded(Exclusion::CircuitOpen, Some(retry_after_ms));
            }
            Err(e) => {
                release(shard, target.provider, connection, &permit);
                return Admit::Failed(e);
            }
        }
    }
    Admit::Yes(permit)
}

/// Asks the owner of `key` for the half-open probe permit.
async fn ask_probe(
    shard: &Shard,
    key: BreakerKey,
) -> Result<(Option<ProbeTicket>, u64), GatewayError> {
    let owner = match key {
        BreakerKey::Provider(p) => shard.owner(&p),
        BreakerKey::Connection(c) => shard.owner(&c),
    };
    let (id, wait) = shard.probes.register();
    if !shard.send_reliable(owner, Msg::ProbeRequest { key, id }) {
        shard.probes.forget(id);
        return Err(GatewayError::new(
            ErrorKind::MeshUnavailable,
            "the breaker's owner shard could not be asked for a probe permit",
        ));
    }
    match monoio::time::timeout(Duration::from_millis(PROBE_REPLY_TIMEOUT_MS), wait).await {
        Ok(Answer::Probe(ticket, retry_after_ms)) => Ok((ticket, retry_after_ms)),
        Ok(
            Answer::Ack
            | Answer::Gate(_)
            | Answer::Queue(_)
            | Answer::QueueRetry(_)
            | Answer::QuotaShare(_),
        )
        | Err(_) => {
            shard.probes.forget(id);
            Err(GatewayError::new(
                ErrorKind::MeshUnavailable,
                "the breaker's owner shard did not answer the probe request",
            ))
        }
    }
}

/// Returns permits an attempt will not use.
pub fn release(shard: &Shard, provider: ProviderId, connection: ConnectionId, permit: &Permit) {
    if let Some(ticket) = permit.provider_probe {
        shard.send_reliable(
            shard.owner(&provider),
            Msg::ReleaseProbe {
                key: BreakerKey::Provider(provider),
                ticket,
            },
        );
    }
    if let Some(ticket) = permit.connection_probe {
        shard.send_reliable(
            shard.owner(&connection),
            Msg::ReleaseProbe {
                key: BreakerKey::Connection(connection),
                ticket,
            },
        );
    }
}
