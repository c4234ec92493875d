//! The state a shard owns: breakers, connection state and model lockouts for the keys
//! whose owner it is (`runtime::owner`). Only the owner mutates them; it applies facts
//! (outcomes of attempts, probe requests, egress cooling) and returns the messages to send:
//! view updates for every shard, commands for other owners, replies to askers. Pure and
//! synchronous: the pump calls it with `now`, so tests drive it with a manual clock. The
//! flow-control tables (gates, request queues, windows, quota-share) are in `shard::flow`;
//! their messages are routed there.

use crate::clock::Now;
use crate::config::{AuthKind, Config, ConnectionId, ProviderId};
use crate::resilience::breaker::{
    BreakerKey, BreakerSettings, BreakerTable, Failure, Transition as BreakerTransition,
};
use crate::resilience::classify::{
    ClassifyInput, CooldownProfile, check_fallback_error, is_credits_signal,
};
use crate::resilience::connection::{
    ConnectionPolicy, ConnectionTable, Failure as ConnFailure, MarkOptions, ProviderErrorType,
    Routability,
};
use crate::resilience::egress::{FailingConnection, SiblingView, egress_lock, lock_family};
use crate::resilience::lockout::LockoutTable;
use crate::resilience::{FallbackDecision, OwnedHeaders, Reason};
use crate::runtime::msg::{AttemptResult, Msg, Outcome};
use crate::runtime::owner::owner_of;

use super::flow::Flow;
use super::views::Views;

/// Where a message produced by the owner goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    /// Every shard, this one included (view updates).
    All,
    Shard(usize),
    /// This shard, at a monotonic instant (owner timers).
    SelfAt(u64),
}

/// The owner-side tables of one shard.
#[derive(Debug)]
pub struct Owned {
    pub breakers: BreakerTable,
    pub connections: ConnectionTable,
    pub lockouts: LockoutTable,
    /// Flow control: gates, request queues, windows, quota-share.
    pub flow: Flow,
}

/// Longest error text kept for classification and `lastError`.
pub const MAX_ERROR_TEXT_BYTES: usize = 64 * 1024;

impl Owned {
    pub fn new(config: &Config) -> Self {
        Self {
            breakers: BreakerTable::new(BreakerSettings::from_resilience(&config.resilience)),
            connections: ConnectionTable::new(),
            lockouts: LockoutTable::new(),
            flow: Flow::default(),
        }
    }

    /// Applies one message addressed to this owner; returns what to send.
    pub fn apply(
        &mut self,
        config: &Config,
        views: &Views,
        shards: usize,
        from: usize,
        msg: Msg,
        now: Now,
    ) -> Vec<(Dest, Msg)> {
        let mut out = Vec::new();
        match msg {
            Msg::Outcome(o, ack) => {
                self.outcome(config, views, shards, &o, now, &mut out);
                for u in self.lockouts.drain_updates() {
                    out.push((Dest::All, Msg::Lockout(Box::new(u))));
                }
                if let Some(id) = ack {
                    out.push((Dest::Shard(from), Msg::Ack { id }));
                }
            }
            Msg::ProviderResult {
                provider,
                success,
                network,
                probe,
            } => {
                let key = BreakerKey::Provider(provider);
                let auth = config.provider(provider).auth;
                let t = if success {
                    self.breakers.get_or_create(key, auth);
                    self.breakers.on_success(now, key, probe)
                } else if network {
                    self.breakers
                        .on_failure(now, key, auth, Failure::ConnectFailed, probe)
                } else {
                    probe.and_then(|p| self.breakers.release_probe(now, key, p))
                };
                push_breaker(&mut out, key, t);
            }
            Msg::ProbeRequest { key, id } => {
                let auth = breaker_auth(config, key);
                self.breakers.get_or_create(key, auth);
                let (ticket, retry_after_ms) = match self.breakers.admit(now, key) {
                    crate::resilience::breaker::Admission::Allow => (None, 0),
                    crate::resilience::breaker::Admission::Probe { ticket, transition } => {
                        push_breaker(&mut out, key, Some(transition));
                        (Some(ticket), 0)
                    }
                    crate::resilience::breaker::Admission::Reject { retry_after_ms, .. } => {
                        (None, retry_after_ms.max(1))
                    }
                };
                out.push((
                    Dest::Shard(from),
                    Msg::ProbeReply {
                        id,
                        ticket,
                        retry_after_ms,
                    },
                ));
            }
            Msg::ReleaseProbe { key, ticket } => {
                let t = self.breakers.release_probe(now, key, ticket);
                push_breaker(&mut out, key, t);
            }
            Msg::GateAcquire {
                id,
                connection,
                model,
                deadline_ns,
            } => self
                .flow
                .gate_acquire(config, id, connection, &model, deadline_ns, now, &mut out),
            Msg::GateRelease { serial, .. } => self.flow.gate_release(serial, now, &mut out),
            Msg::GateCancel { id, .. } => self.flow.gate_cancel(id, &mut out),
            Msg::GateTick => self.flow.gate_tick(now, &mut out),
            Msg::GateBlock {
                connection,
                model,
                until_ns,
            } => self
                .flow
                .gate_block(config, connection, model, until_ns, now, &mut out),
            Msg::QsSlotAcquire {
                id,
                connection,
                deadline_ns,
            } => self
                .flow
                .qs_slot_acquire(config, id, connection, deadline_ns, now, &mut out),
            Msg::QsSelect {
                id,
                combo,
                candidates,
            } => self
                .flow
                .qs_select(config, id, &combo, &candidates, now, &mut out),
            Msg::QsRelease { serial } => self.flow.qs_release(serial),
            Msg::QueueAcquire {
                id,
                connection,
                model,
                waiting_since_ns,
            } => self.flow.queue_acquire(
                config,
                id,
                connection,
                &model,
                waiting_since_ns,
                now,
                &mut out,
            ),
            Msg::QueueFinish { id, answered, .. } => {
                self.flow.queue_finish(id, answered, now, &mut out);
            }
            Msg::QueueCancel { id, .. } => self.flow.queue_cancel(id, now, &mut out),
            Msg::QueueTick { key } => self.flow.queue_tick(&key, now, &mut out),
            Msg::AutoDecay { connection } => {
                if let Some(t) = self.connections.auto_decay(connection, now)
                    && t.view_changed
                {
                    out.push((
                        Dest::All,
                        Msg::ConnectionView {
                            connection,
                            view: t.view,
                        },
                    ));
                }
            }
            Msg::EgressCool {
                connection,
                until_ms,
                reason,
            } => {
                if let Some(t) = self
                    .connections
                    .cool_for_egress(connection, until_ms, reason, now)
                {
                    out.push((
                        Dest::All,
                        Msg::ConnectionView {
                            connection,
                            view: t.view,
                        },
                    ));
                }
            }
            // Views and replies are not owner business; the pump handles them.
            Msg::BreakerView { .. }
            | Msg::ConnectionView { .. }
            | Msg::Lockout(_)
            | Msg::ProbeReply { .. }
            | Msg::Ack { .. }
            | Msg::GateGrant { .. }
            | Msg::GateDenied { .. }
            | Msg::QueueGrant { .. }
            | Msg::QueueDenied { .. }
            | Msg::QueueRetry { .. }
            | Msg::QsPicked { .. } => {}
        }
        for u in self.lockouts.drain_updates() {
            out.push((Dest::All, Msg::Lockout(Box::new(u))));
        }
        out
    }

    fn outcome(
        &mut self,
        config: &Config,
        views: &Views,
        shards: usize,
        o: &Outcome,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        let provider = config.provider(o.provider);
        let conn = config.connection(o.connection);
        let auth = provider.auth;
        let conn_key = BreakerKey::Connection(o.connection);
        let settings = &config.resilience;
        match &o.result {
            AttemptResult::Success => {
                self.breakers.get_or_create(conn_key, auth);
                let t = self.breakers.on_success(now, conn_key, o.probe);
                push_breaker(out, conn_key, t);
                if let Some(t) = self.connections.clear_on_success(o.connection, now)
                    && t.view_changed
                {
                    out.push((
                        Dest::All,
                        Msg::ConnectionView {
                            connection: o.connection,
                            view: t.view,
                        },
                    ));
                }
                self.lockouts
                    .decay(&provider.name, Some(o.connection), &o.model, now);
            }
            AttemptResult::ClientAbort => {
                if let Some(p) = o.probe {
                    let t = self.breakers.release_probe(now, conn_key, p);
                    push_breaker(out, conn_key, t);
                }
            }
            AttemptResult::StreamStall => {
                let policy = ConnectionPolicy::from_settings(settings, auth);
                let t = self.connections.record_stream_stall(
                    o.connection,
                    "stream stalled after the first byte",
                    conn.disable_cooling,
                    &policy,
                    now,
                );
                if let Some(t) = t.transition.filter(|t| t.view_changed) {
                    out.push((
                        Dest::All,
                        Msg::ConnectionView {
                            connection: o.connection,
                            view: t.view,
                        },
                    ));
                }
                if let Some(p) = o.probe {
                    let t = self.breakers.release_probe(now, conn_key, p);
                    push_breaker(out, conn_key, t);
                }
            }
            AttemptResult::Timeout
            | AttemptResult::ConnectFailed
            | AttemptResult::Upstream { .. } => {
                // Timeouts and connect failures are classified as the statuses a client
                // would have seen (504 / 502) with a plain message.
                let empty: Vec<(String, String)> = Vec::new();
                let (status, text, headers, breaker_failure) = match &o.result {
                    AttemptResult::Upstream {
                        status,
                        text,
                        headers,
                    } => (*status, text.as_str(), headers, Failure::Status(*status)),
                    AttemptResult::Timeout => (504, "upstream timed out", &empty, Failure::Timeout),
                    _ => (
                        502,
                        "upstream connect failed",
                        &empty,
                        Failure::ConnectFailed,
                    ),
                };
                let decision = classify(
                    config,
                    self.connections.backoff_level(o.connection),
                    o,
                    status,
                    text,
                    headers,
                    auth,
                    now,
                );
                let lower = text.to_ascii_lowercase();
                let failure = ConnFailure {
                    status,
                    text,
                    decision: &decision,
                    error_type: error_type_of(status, &decision, &lower),
                    credits_signal: is_credits_signal(&lower),
                };
                let mut options = MarkOptions::new(&provider.name, Some(&o.model));
                options.disable_cooling = conn.disable_cooling;
                options.local_provider = auth == AuthKind::Local;
                options.per_model = per_model_quota(config, o.provider);
                let policy = ConnectionPolicy::from_settings(settings, auth);
                let marked = self.connections.mark_unavailable(
                    o.connection,
                    &failure,
                    &options,
                    &policy,
                    now,
                );
                // markAccountUnavailable's per-model branches lock regardless of
                // `modelLockout.enabled` (A §4.5); only combo lockouts are gated by it.
                if let Some(cmd) = &marked.decision.lockout {
                    self.lockouts.apply(cmd, now);
                }
                if let Some(t) = marked.transition.filter(|t| t.view_changed) {
                    out.push((
                        Dest::All,
                        Msg::ConnectionView {
                            connection: o.connection,
                            view: t.view,
                        },
                    ));
                }
                // The breaker: connection-scoped unless it is a network error, which goes
                // to the provider's owner.
                let key = BreakerKey::for_failure(o.provider, Some(o.connection), breaker_failure);
                if decision.skip_provider_breaker {
                    if let Some(p) = o.probe {
                        let t = self.breakers.release_probe(now, conn_key, p);
                        push_breaker(out, conn_key, t);
                    }
                } else if key == conn_key {
                    // The direct (single-model) path counts every failure; the table's
                    // 5 s per-connection dedupe belongs to the combo path (A §1.6 path 4).
                    let t = self.breakers.get_or_create(key, auth).on_failure(
                        now,
                        breaker_failure,
                        o.probe,
                    );
                    match t {
                        Some(t) => push_breaker(out, key, Some(t)),
                        // No transition, but shards learn this breaker has counts to
                        // decay: from now on they report successes on it.
                        None => {
                            let view = self.breakers.view(now, key);
                            out.push((Dest::All, Msg::BreakerView { key, view }));
                        }
                    }
                } else if let Some(p) = o.probe {
                    // A network failure counts on the provider's breaker; the asking shard
                    // reports it to the provider's owner (`ProviderResult`).
                    let t = self.breakers.release_probe(now, conn_key, p);
                    push_breaker(out, conn_key, t);
                }
                // The connection's request queue learns from the upstream's answer.
                self.flow.learn_from_outcome(config, o, now);
                // Egress: one 429 quota / rate limit cools the whole family behind the same egress.
                self.egress(config, views, shards, o, status, &decision, now, out);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn egress(
        &self,
        config: &Config,
        views: &Views,
        shards: usize,
        o: &Outcome,
        status: u16,
        decision: &FallbackDecision,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        let conn = config.connection(o.connection);
        if conn.egress.is_none() || status != 429 {
            return;
        }
        let family = |p: ProviderId| lock_family(&config.provider(p).name).to_owned();
        let failing_family = family(o.provider);
        let failing = FailingConnection {
            id: o.connection,
            family: &failing_family,
            egress: conn.egress.as_deref(),
            disable_cooling: conn.disable_cooling,
        };
        let families: Vec<String> = config
            .connections
            .iter()
            .map(|c| family(c.provider))
            .collect();
        let siblings: Vec<SiblingView<'_>> = config
            .connections
            .iter()
            .filter(|c| c.id != o.connection && c.enabled)
            .map(|c| {
                let (terminal, cooling_until_ms) = match views.connections.routability(c.id, now) {
                    Routability::Routable => (false, None),
                    Routability::NotUntil { until_ms, .. } => (false, Some(until_ms)),
                    Routability::Terminal(_) => (true, None),
                };
                SiblingView {
                    id: c.id,
                    family: families.get(c.id.0 as usize).map_or("", String::as_str),
                    egress: c.egress.as_deref(),
                    disable_cooling: c.disable_cooling,
                    terminal,
                    cooling_until_ms,
                }
            })
            .collect();
        if let Some(lock) = egress_lock(&failing, status, decision, siblings.iter(), now.wall_ms) {
            for sibling in lock.siblings {
                let to = owner_of(&sibling, shards);
                out.push((
                    Dest::Shard(to),
                    Msg::EgressCool {
                        connection: sibling,
                        until_ms: lock.until_ms,
                        reason: lock.reason,
                    },
                ));
            }
        }
    }
}

fn push_breaker(out: &mut Vec<(Dest, Msg)>, key: BreakerKey, t: Option<BreakerTransition>) {
    if let Some(t) = t {
        out.push((Dest::All, Msg::BreakerView { key, view: t.view }));
    }
}

/// The auth category whose profile a breaker uses.
pub fn breaker_auth(config: &Config, key: BreakerKey) -> AuthKind {
    match key {
        BreakerKey::Provider(p) => config.provider(p).auth,
        BreakerKey::Connection(c) => config.provider(config.connection(c).provider).auth,
    }
}

/// `checkFallbackError` for an attempt's failure, with the connection's backoff level.
#[allow(clippy::too_many_arguments)]
pub fn classify(
    config: &Config,
    backoff_level: u32,
    o: &Outcome,
    status: u16,
    text: &str,
    headers: &[(String, String)],
    auth: AuthKind,
    now: Now,
) -> FallbackDecision {
    let provider = config.provider(o.provider);
    let headers = OwnedHeaders(headers);
    let mut input = ClassifyInput::new(status, text, &headers, now);
    input.backoff_level = backoff_level;
    input.model = Some(&o.model);
    input.provider = Some(&provider.name);
    input.auth = auth;
    input.profile = Some(CooldownProfile::for_category(&config.resilience, auth));
    input.operator_rules = config.resilience.error_rules_for(&provider.name);
    check_fallback_error(&input)
}

/// `classifyProviderError`'s type (A §3.6) for the terminal-state rules, from the status,
/// the classification and the (lower-cased) text.
pub fn error_type_of(
    status: u16,
    decision: &FallbackDecision,
    lower: &str,
) -> Option<ProviderErrorType> {
    match status {
        401 => Some(ProviderErrorType::Unauthorized),
        // A plain 403 is not a ban: bans come from ban signals (`decision.permanent`).
        403 if lower.contains("request not allowed") => Some(ProviderErrorType::RequestRejected),
        404 => Some(ProviderErrorType::ModelNotFound),
        429 if decision.reason == Reason::QuotaExhausted => Some(ProviderErrorType::QuotaExhausted),
        429 => Some(ProviderErrorType::RateLimited),
        408 | 504 => Some(ProviderErrorType::Timeout),
        500..=599 => Some(ProviderErrorType::ServerError),
        _ => None,
    }
}

/// `hasPerModelQuota` (A §4.5): whether a provider's limits are per model, so a model's
/// failure locks that model rather than cooling the whole connection. Tidegate has no
/// provider registry: local/self-hosted providers, the mock, and providers whose id marks
/// them as OpenAI/Anthropic-compatible passthroughs count as per-model.
pub fn per_model_quota(config: &Config, provider: ProviderId) -> bool {
    let p = config.provider(provider);
    p.auth == AuthKind::Local
        || p.format == crate::config::ProviderFormat::Mock
        || p.name.starts_with("openai-compatible")
        || p.name.starts_with("anthropic-compatible")
}

/// The owner of the state of `connection` (its breaker, cooldown and lockouts).
pub fn connection_owner(connection: ConnectionId, shards: usize) -> usize {
    owner_of(&connection, shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_types_for_terminal_rules() {
        let d = |r| FallbackDecision::new(true, 0, r);
        assert_eq!(
            error_type_of(401, &d(Reason::AuthError), ""),
            Some(ProviderErrorType::Unauthorized)
        );
        // A plain 403 is not a ban (bans come from ban signals, `decision.permanent`).
        assert_eq!(error_type_of(403, &d(Reason::AuthError), "forbidden"), None);
        assert_eq!(
            error_type_of(403, &d(Reason::RateLimitExceeded), "request not allowed"),
            Some(ProviderErrorType::RequestRejected)
        );
        assert_eq!(
            error_type_of(429, &d(Reason::QuotaExhausted), ""),
            Some(ProviderErrorType::QuotaExhausted)
        );
        assert_eq!(
            error_type_of(429, &d(Reason::RateLimitExceeded), ""),
            Some(ProviderErrorType::RateLimited)
        );
        assert_eq!(
            error_type_of(504, &d(Reason::ServerError), ""),
            Some(ProviderErrorType::Timeout)
        );
        assert_eq!(
            error_type_of(503, &d(Reason::ServerError), ""),
            Some(ProviderErrorType::ServerError)
        );
        assert_eq!(error_type_of(400, &d(Reason::Unknown), ""), None);
    }

    #[test]
    fn per_model_quota_providers() {
        let toml = "[[providers]]\nid = \"openai-compatible-x\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [[providers]]\nid = \"plain\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [[providers]]\nid = \"self\"\nformat = \"openai\"\nauth = \"local\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [[providers]]\nid = \"mock\"\nformat = \"mock\"\n";
        let config = crate::config::load_str(toml, &|_| None).unwrap().config;
        let per_model: Vec<bool> = (0..4)
            .map(|i| per_model_quota(&config, ProviderId(i)))
            .collect();
        assert_eq!(per_model, vec![true, false, true, true]);
    }
}
