//! Select: may this candidate (target × connection) be tried now? Reads only the local
//! views — breaker gates, connection cooldown and terminal state, model lockouts, and for
//! combo targets the provider cooldown tracker — so the happy path crosses no core. A
//! half-open breaker needs its owner's one probe permit, asked for over the mesh (a
//! direct call when this shard is the owner). A connection whose cooldown has passed
//! with its backoff level still raised has its owner reset the level first (auto-decay,
//! spec A §3.1), so a connection failing on and off restarts at the base cooldown.

use crate::clock::Now;
use crate::config::{Config, ConnectionId, ProviderId};
use crate::error::{ErrorKind, GatewayError};
use crate::owners::Req;
use crate::owners::health::client::{ProbePermits, ask_probe};
use crate::owners::health::protocol::Fact;
use crate::owners::health::views::Views;
use crate::resilience::Reason;
use crate::resilience::breaker::{BreakerKey, ViewGate};
use crate::resilience::connection::{Routability, Terminal};
use crate::resilience::lockout::LockReason;
use crate::routing::model_name::ModelName;
use crate::routing::resolve::Target;

/// Why a candidate was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exclusion {
    /// The breaker that is open: the provider's or the connection's.
    CircuitOpen(BreakerKey),
    ConnectionCooldown,
    /// Cooling after network errors: the upstream could not be reached.
    Unreachable,
    ModelLockout,
    /// The provider cooldown tracker skips it (combo targets only).
    ProviderCooldown,
    Terminal(Terminal),
    /// A round-robin combo's per-model semaphore was busy past its queue (B §2.2).
    ConcurrencyCap,
}

impl Exclusion {
    pub fn as_str(self) -> &'static str {
        match self {
            Exclusion::CircuitOpen(_) => "circuit_open",
            Exclusion::ConnectionCooldown => "connection_cooldown",
            Exclusion::Unreachable => "connection_unreachable",
            Exclusion::ModelLockout => "model_lockout",
            Exclusion::ProviderCooldown => "provider_cooldown",
            Exclusion::Terminal(t) => t.status().as_str(),
            Exclusion::ConcurrencyCap => "concurrency_cap",
        }
    }
}

/// A skipped candidate, for the terminal response.
#[derive(Clone, Debug)]
pub struct Excluded {
    pub provider: ProviderId,
    pub connection: ConnectionId,
    pub model: ModelName,
    pub reason: Exclusion,
    /// When it may be routable again, if known.
    pub retry_after_ms: Option<u64>,
}

pub enum Admit<'s> {
    Yes(ProbePermits<'s>),
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

/// How long until a skipped candidate may be tried again, when its cooldown is one a
/// request may wait out (`wait_for_cooldown`, B §3.3): a connection cooling for a rate
/// limit or a server error, or a model lock whose reason is on the combo wait's allow-list
/// (`rate_limit`, `rate_limited`, `server_error`) or is a plain rate limit. Never a quota
/// (it lasts until the reset), an auth, not-found or terminal state, an open breaker or an
/// unreachable host.
pub fn waitable_ms(views: &Views, config: &Config, e: &Excluded, now: Now) -> Option<u64> {
    match e.reason {
        Exclusion::ConnectionCooldown => match views.connections.routability(e.connection, now) {
            Routability::NotUntil {
                until_ms,
                reason: Reason::RateLimitExceeded | Reason::ServerError,
            } => Some(until_ms.saturating_sub(now.wall_ms)),
            _ => None,
        },
        Exclusion::ModelLockout => {
            let p = config.provider(e.provider);
            let lock = views.lockouts.lock_of(
                &p.name,
                p.quirks.quota_family,
                Some(e.connection),
                &e.model,
                now,
            )?;
            (lock.reason.is_waitable() || lock.reason == LockReason::RateLimitExceeded)
                .then(|| lock.until_ms.saturating_sub(now.mono_ms()))
        }
        _ => None,
    }
}

/// The pure part of selection: reads the views only, allocates nothing on the pass path.
/// A connection held back by several things at once (a cooldown, a model lockout, an open
/// breaker) is skipped for the one that lasts longest, with its wait: the earliest it can be
/// tried is when all of them have ended, so a shorter one's wait would promise too much.
pub fn gate(
    views: &Views,
    config: &Config,
    target: &Target,
    connection: ConnectionId,
    now: Now,
) -> Gate {
    // The longest blocker so far (on a tie the first found keeps its name).
    let mut skip: Option<(Exclusion, u64)> = None;
    let mut held = |why: Exclusion, ms: u64| {
        if skip.is_none_or(|(_, longest)| ms > longest) {
            skip = Some((why, ms));
        }
    };
    match views.connections.routability(connection, now) {
        Routability::Routable => {}
        Routability::NotUntil { until_ms, reason } => {
            let why = if reason == Reason::NetworkError {
                Exclusion::Unreachable
            } else {
                Exclusion::ConnectionCooldown
            };
            held(why, until_ms.saturating_sub(now.wall_ms));
        }
        Routability::Terminal(t) => return Gate::Skip(Exclusion::Terminal(t), None),
    }
    let provider = config.provider(target.provider);
    if let Some(lock) = views.lockouts.lock_of(
        &provider.name,
        provider.quirks.quota_family,
        Some(connection),
        &target.model,
        now,
    ) {
        held(
            Exclusion::ModelLockout,
            lock.until_ms.saturating_sub(now.mono_ms()),
        );
    }
    let mut need: Option<Vec<BreakerKey>> = None;
    for key in BreakerKey::gating(target.provider, connection) {
        match views.breaker(&key).map(|v| v.gate(now)) {
            None | Some(ViewGate::Pass) => {}
            Some(ViewGate::Blocked { retry_after_ms }) => {
                held(Exclusion::CircuitOpen(key), retry_after_ms);
            }
            Some(ViewGate::Probe) => need.get_or_insert_with(Vec::new).push(key),
        }
    }
    if let Some((why, ms)) = skip {
        return Gate::Skip(why, Some(ms));
    }
    match need {
        Some(keys) => Gate::NeedProbe(keys),
        None => Gate::Pass,
    }
}

/// Decides whether `(target, connection)` may be attempted now; `combo`: it is a combo
/// target (the provider cooldown tracker applies).
pub async fn admit<'s>(
    shard: &'s Req<'s>,
    target: &Target,
    connection: ConnectionId,
    combo: bool,
) -> Admit<'s> {
    let now = shard.now();
    // Auto-decay (A §3.1): sent before the attempt, so the owner applies it before this
    // attempt's outcome (same ring, in order) and rescales that failure from the base.
    let decay = shard
        .state()
        .views
        .borrow()
        .connections
        .get(connection)
        .needs_decay(now);
    if decay {
        shard.send_fact(
            shard.owner(&connection),
            Fact::AutoDecay { connection }.into(),
        );
    }
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
        &shard.state().views.borrow(),
        shard.config(),
        target,
        connection,
        now,
    );
    let need_probe = match verdict {
        Gate::Pass => Vec::new(),
        Gate::Skip(reason, retry_after_ms) => return excluded(reason, retry_after_ms),
        Gate::NeedProbe(keys) => keys,
    };
    if combo
        && let Some(ms) =
            shard
                .state()
                .views
                .borrow()
                .tracker_cooling(target.provider, connection, now)
    {
        return excluded(Exclusion::ProviderCooldown, Some(ms));
    }
    if need_probe.is_empty() {
        return Admit::Yes(ProbePermits::new(shard));
    }
    // Permits already granted go back if a later one is refused (the guard's drop).
    let mut permits = ProbePermits::new(shard);
    for key in need_probe {
        match ask_probe(shard, key).await {
            Ok((Some(ticket), _)) => permits.hold(key, ticket),
            // No ticket and no wait: the owner's breaker is closed after all.
            Ok((None, 0)) => {}
            Ok((None, retry_after_ms)) => {
                return excluded(Exclusion::CircuitOpen(key), Some(retry_after_ms));
            }
            Err(_) => {
                return Admit::Failed(GatewayError::new(
                    ErrorKind::MeshUnavailable,
                    "the breaker's owner shard did not answer the probe request",
                ));
            }
        }
    }
    Admit::Yes(permits)
}
