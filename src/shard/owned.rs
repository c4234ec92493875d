//! The state a shard owns: breakers, connection state and model lockouts for the keys
//! whose owner it is (`runtime::owner`). Only the owner mutates them; it applies facts
//! (outcomes of attempts, probe requests, egress cooling) and returns the messages to send:
//! view updates for every shard, commands for other owners, replies to askers. Pure and
//! synchronous: the pump calls it with `now`, so tests drive it with a manual clock.

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

use super::views::Views;
use super::waiter_shard;
use crate::flow::admission::{
    account_capacity, effective_max_wait_ms, gate_home, gate_requirements, gated, model_capacity,
    queue_of, window_of,
};
use crate::flow::gates::GateError;
use crate::flow::gates::{
    Acquire, AcquireRequest, GateKey, GateTable, Permit, QueueLimit, Wakeups,
};
use crate::flow::queue::{
    Grant, Limiter, LimiterTable, QueueError, Schedule, SlidingWindow, WindowDecision,
    check_queue_admission, observe_response,
};
use crate::flow::quota_share::{
    INFLIGHT_LEASE_MS, InflightTicket, NoBuckets, QS_QUEUE_DEPTH, QsTarget, QuotaShareSelector,
    SlotAcquire, SlotRequest, acquire_slot,
};
use crate::runtime::msg::{QsCandidate, QsPick};

/// Flow-control occupancy of one owner shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowGauges {
    /// Gate permits granted and not yet released.
    pub gate_permits: usize,
    /// Requests waiting for gate permits.
    pub gate_waiters: usize,
    /// Requests in request queues, waiting or holding a slot.
    pub queue_requests: usize,
}

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
    /// Concurrency gates of the connections this shard owns (account and model gates).
    pub gates: GateTable,
    /// Permits granted and not yet released, by serial.
    pub permits: std::collections::HashMap<u64, Permit>,
    /// Request queues (per-connection limiters) of the connections this shard owns.
    pub limiters: LimiterTable,
    /// Queue waiters (queued or holding a slot) → their limiter key.
    pub queue_waiters: std::collections::HashMap<u64, String>,
    /// Provider sliding windows (B §1.2b) by `<provider>:<connection>`.
    pub windows: std::collections::HashMap<String, SlidingWindow>,
    /// When the gate timer is armed for (monotonic ns).
    pub gate_timer: Option<u64>,
    /// Quota-share selection state (on the quota-share home only).
    pub quota_share: QuotaShareSelector,
    /// Outstanding in-flight tickets by serial, with when they were taken.
    pub qs_tickets: std::collections::HashMap<u64, (InflightTicket, u64)>,
}

/// Longest error text kept for classification and `lastError`.
pub const MAX_ERROR_TEXT_BYTES: usize = 64 * 1024;

impl Owned {
    pub fn new(config: &Config) -> Self {
        Self {
            breakers: BreakerTable::new(BreakerSettings::from_resilience(&config.resilience)),
            connections: ConnectionTable::new(),
            lockouts: LockoutTable::new(),
            gates: GateTable::new(),
            permits: std::collections::HashMap::new(),
            limiters: LimiterTable::default(),
            queue_waiters: std::collections::HashMap::new(),
            windows: std::collections::HashMap::new(),
            gate_timer: None,
            quota_share: QuotaShareSelector::new(),
            qs_tickets: std::collections::HashMap::new(),
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
            } => {
                self.tick_gates(now, &mut out);
                let request = AcquireRequest {
                    id,
                    gates: gate_requirements(config, connection, &model),
                    deadline: deadline_ns,
                    max_queue: QueueLimit::from_max_queue_depth(
                        config.resilience.request_queue.max_queue_depth,
                    ),
                };
                match self.gates.acquire(request, now) {
                    Acquire::Granted(permit) => {
                        let serial = permit.serial();
                        self.permits.insert(serial, permit);
                        out.push((Dest::Shard(waiter_shard(id)), Msg::GateGrant { id, serial }));
                    }
                    Acquire::Queued => self.arm_gates(&mut out),
                    Acquire::Rejected(error) => {
                        out.push((Dest::Shard(waiter_shard(id)), Msg::GateDenied { id, error }));
                    }
                }
            }
            Msg::QueueAcquire {
                id,
                connection,
                model,
                waiting_since_ns,
            } => {
                if self.window_admits(config, id, connection, waiting_since_ns, now, &mut out) {
                    self.queue_acquire(config, id, connection, &model, now, &mut out);
                }
            }
            Msg::QueueFinish { id, answered, .. } => {
                if let Some(key) = self.queue_waiters.remove(&id) {
                    // A success teaches the queue too (rate-limit headers; a 2xx clears a
                    // remembered 429 cooldown). Errors arrive as outcomes.
                    if let Some(a) = answered {
                        let h = OwnedHeaders(&a.headers);
                        observe_response(&mut self.limiters, &key, a.status, &h, "", now);
                    }
                    if let Some(l) = self.limiters.get_mut(&key) {
                        let grants = l.on_finish(id, now);
                        self.queue_grants(&key, grants, now, &mut out);
                    }
                }
            }
            Msg::QueueCancel { id, .. } => {
                if let Some(key) = self.queue_waiters.remove(&id)
                    && let Some(l) = self.limiters.get_mut(&key)
                {
                    let max_wait_ms = l.settings().max_wait_ms;
                    let (_, grants) = l.cancel(id, now);
                    self.queue_grants(&key, grants, now, &mut out);
                    // Answered so the asker can forget the waiter (see `GateCancel`).
                    out.push((
                        Dest::Shard(waiter_shard(id)),
                        Msg::QueueDenied {
                            id,
                            error: QueueError::QueueTimeout { max_wait_ms },
                        },
                    ));
                }
            }
            Msg::QsSelect {
                id,
                combo,
                candidates,
            } => {
                let pick = self.quota_share_select(config, &combo, &candidates, now);
                out.push((
                    Dest::Shard(waiter_shard(id)),
                    Msg::QsPicked {
                        id,
                        pick: Box::new(pick),
                    },
                ));
            }
            Msg::QsRelease { serial } => {
                if let Some((ticket, _)) = self.qs_tickets.remove(&serial) {
                    self.quota_share.release(ticket);
                }
            }
            Msg::QsSlotAcquire {
                id,
                connection,
                deadline_ns,
            } => {
                self.tick_gates(now, &mut out);
                let request = SlotRequest {
                    id,
                    connection: Some(connection),
                    max_concurrent: account_capacity(config, connection),
                    deadline: deadline_ns,
                    queue_depth: QS_QUEUE_DEPTH,
                };
                let enabled = config.resilience.quota_share_concurrency_limit.enabled;
                let to = Dest::Shard(waiter_shard(id));
                match acquire_slot(&mut self.gates, enabled, request, now) {
                    SlotAcquire::Slot(permit) => {
                        let serial = permit.serial();
                        self.permits.insert(serial, permit);
                        out.push((to, Msg::GateGrant { id, serial }));
                    }
                    SlotAcquire::Queued => self.arm_gates(&mut out),
                    SlotAcquire::NoSlot => out.push((
                        to,
                        Msg::GateDenied {
                            id,
                            error: GateError::QueueFull,
                        },
                    )),
                }
            }
            Msg::QueueTick { key } => {
                self.queue_tick(&key, now, &mut out);
            }
            Msg::GateRelease { serial, .. } => {
                if let Some(permit) = self.permits.remove(&serial) {
                    let wakeups = self.gates.release(permit, now);
                    self.wake(wakeups, &mut out);
                }
            }
            Msg::GateTick => {
                self.gate_timer = None;
                self.tick_gates(now, &mut out);
                self.arm_gates(&mut out);
            }
            Msg::GateBlock {
                connection,
                model,
                until_ns,
            } => {
                let key = if account_capacity(config, connection).is_some() {
                    Some(GateKey::Account(connection))
                } else {
                    model_capacity(config, connection, &model)
                        .map(|_| GateKey::Model(connection, model.into_boxed_str()))
                };
                if let Some(key) = key {
                    self.gates.mark_blocked(key, until_ns, now);
                    self.arm_gates(&mut out);
                }
            }
            Msg::GateCancel { id, .. } => {
                // Answered either way, so the asker can forget the waiter (a grant already
                // on its way arrives first and is handed back).
                self.gates.cancel(id);
                out.push((
                    Dest::Shard(waiter_shard(id)),
                    Msg::GateDenied {
                        id,
                        error: GateError::Timeout,
                    },
                ));
            }
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

    /// Quota-share selection (B §2.4) over a combo's candidates: caps are the connections'
    /// account capacities; no quota buckets are tracked (nothing is ever saturated).
    fn quota_share_select(
        &mut self,
        config: &Config,
        combo: &str,
        candidates: &[QsCandidate],
        now: Now,
    ) -> QsPick {
        let targets: Vec<QsTarget> = candidates
            .iter()
            .map(|c| QsTarget {
                execution_key: c.execution_key.clone(),
                connection: Some(c.connection),
                weight: Some(f64::from(c.weight)),
            })
            .collect();
        let caps: std::collections::HashMap<ConnectionId, u32> = candidates
            .iter()
            .filter_map(|c| account_capacity(config, c.connection).map(|n| (c.connection, n)))
            .collect();
        let selection =
            self.quota_share
                .select(&targets, combo, combo, Some(&caps), &NoBuckets, now);
        let ticket = selection.ticket.map(|t| {
            let serial = t.serial();
            self.qs_tickets.insert(serial, (t, now.mono_ns));
            serial
        });
        QsPick {
            ordered: selection
                .ordered
                .iter()
                .map(|i| u32::try_from(*i).unwrap_or(u32::MAX))
                .collect(),
            ticket,
        }
    }

    /// The provider's sliding window (B §1.2b), before the queue: a slot now, or — while
    /// the request's wait budget (`max(window, max_wait_ms)`) lasts — an answer telling the
    /// asker when to ask again. Past the budget the request goes through anyway (fail open).
    fn window_admits(
        &mut self,
        config: &Config,
        id: u64,
        connection: ConnectionId,
        waiting_since_ns: u64,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) -> bool {
        let Some((spec, key)) = window_of(config, connection) else {
            return true;
        };
        let max_wait_ms = effective_max_wait_ms(config, connection);
        let window = self.windows.entry(key).or_default();
        match window.admit(spec, waiting_since_ns, max_wait_ms, now) {
            WindowDecision::Go | WindowDecision::FailOpen => true,
            WindowDecision::WaitUntil(at_ns) => {
                out.push((Dest::Shard(waiter_shard(id)), Msg::QueueRetry { id, at_ns }));
                false
            }
        }
    }

    /// Admits a request into its connection's queue (spec B §1): depth admission first,
    /// then a slot now, at a later start, or a place in the FIFO queue.
    fn queue_acquire(
        &mut self,
        config: &Config,
        id: u64,
        connection: ConnectionId,
        model: &str,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        let to = Dest::Shard(waiter_shard(id));
        let Some((settings, key)) = queue_of(config, connection, model) else {
            out.push((
                to,
                Msg::QueueGrant {
                    id,
                    start_at_ns: now.mono_ns,
                },
            ));
            return;
        };
        let limiter = self.limiters.get_or_create(&key, settings, now);
        if let Err(error) = check_queue_admission(limiter.queued(), settings.max_queue_depth) {
            out.push((to, Msg::QueueDenied { id, error }));
            return;
        }
        match limiter.schedule(id, now) {
            Schedule::StartNow => out.push((
                to,
                Msg::QueueGrant {
                    id,
                    start_at_ns: now.mono_ns,
                },
            )),
            Schedule::StartAt(at) => out.push((
                to,
                Msg::QueueGrant {
                    id,
                    start_at_ns: at,
                },
            )),
            Schedule::Queued => {}
        }
        self.queue_waiters.insert(id, key.clone());
        self.arm(&key, out);
    }

    /// Expires overdue waiters of `key`'s limiter and grants the next ones.
    fn queue_tick(&mut self, key: &str, now: Now, out: &mut Vec<(Dest, Msg)>) {
        let Some(l) = self.limiters.get_mut(key) else {
            return;
        };
        let expired = l.expire(now);
        let grants = l.promote(now);
        for (id, error) in expired {
            self.queue_waiters.remove(&id);
            out.push((
                Dest::Shard(waiter_shard(id)),
                Msg::QueueDenied { id, error },
            ));
        }
        self.queue_grants(key, grants, now, out);
    }

    fn queue_grants(
        &mut self,
        key: &str,
        grants: Vec<Grant>,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        for g in grants {
            let start_at_ns = g.start_at_ns.max(now.mono_ns);
            out.push((
                Dest::Shard(waiter_shard(g.waiter)),
                Msg::QueueGrant {
                    id: g.waiter,
                    start_at_ns,
                },
            ));
        }
        self.arm(key, out);
    }

    /// Schedules a tick for the limiter's next wake-up (a queued waiter's deadline, or
    /// when the head may start).
    fn arm(&self, key: &str, out: &mut Vec<(Dest, Msg)>) {
        if let Some(at) = self.limiters.get(key).and_then(Limiter::next_wake_ns) {
            out.push((
                Dest::SelfAt(at),
                Msg::QueueTick {
                    key: key.to_owned(),
                },
            ));
        }
    }

    /// Periodic upkeep of the request queues: the wedge watchdog answers waiters of a queue
    /// that stopped making progress (503 `rate_limit_queue_wedged`), and idle limiters are
    /// dropped.
    pub fn queue_housekeeping(&mut self, now: Now) -> Vec<(Dest, Msg)> {
        let mut out = Vec::new();
        for (_key, id, error) in self.limiters.sweep_wedged(now) {
            self.queue_waiters.remove(&id);
            out.push((
                Dest::Shard(waiter_shard(id)),
                Msg::QueueDenied { id, error },
            ));
        }
        self.limiters.evict_idle(now);
        self.windows.retain(|_, w| !w.is_idle(now));
        // In-flight tickets whose release was lost stop counting after their lease.
        self.quota_share.sweep(now);
        let lease_ns = INFLIGHT_LEASE_MS.saturating_mul(1_000_000);
        self.qs_tickets
            .retain(|_, (_, taken)| now.mono_ns.saturating_sub(*taken) < lease_ns);
        out
    }

    /// Sends grants and timeouts produced by a release or an expiry.
    fn wake(&mut self, wakeups: Wakeups, out: &mut Vec<(Dest, Msg)>) {
        for (id, permit) in wakeups.granted {
            let serial = permit.serial();
            self.permits.insert(serial, permit);
            out.push((Dest::Shard(waiter_shard(id)), Msg::GateGrant { id, serial }));
        }
        for (id, error) in wakeups.timed_out {
            out.push((Dest::Shard(waiter_shard(id)), Msg::GateDenied { id, error }));
        }
    }

    /// What this shard's flow-control tables hold now (for `/metrics`).
    pub fn flow_gauges(&self) -> FlowGauges {
        FlowGauges {
            gate_permits: self.gates.outstanding(),
            gate_waiters: self.gates.queued(),
            queue_requests: self.queue_waiters.len(),
        }
    }

    /// Times out overdue gate waiters and lifts blocks that are over (granting who fits).
    fn tick_gates(&mut self, now: Now, out: &mut Vec<(Dest, Msg)>) {
        let wakeups = self.gates.tick(now);
        self.wake(wakeups, out);
    }

    /// Arms the gate timer for the table's next deadline (a waiter's or a block's end)
    /// unless an earlier one is armed already.
    fn arm_gates(&mut self, out: &mut Vec<(Dest, Msg)>) {
        if let Some(at) = self.gates.next_deadline()
            && self.gate_timer.is_none_or(|armed| at < armed)
        {
            self.gate_timer = Some(at);
            out.push((Dest::SelfAt(at), Msg::GateTick));
        }
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
                // The connection's request queue learns from the upstream's answer (429
                // cooldowns, rate-limit headers, caps and retry hints in the body).
                if let AttemptResult::Upstream {
                    status,
                    text,
                    headers,
                } = &o.result
                    && let Some((_, key)) = queue_of(config, o.connection, &o.model)
                {
                    let h = OwnedHeaders(headers);
                    observe_response(&mut self.limiters, &key, *status, &h, text, now);
                }
                // Egress: one 429 quota / rate limit cools the whole family behind the same egress.
                // An upstream 429 that says when to come back blocks the connection's
                // gate until then: its queued waiters wait (or time out) instead of
                // meeting the same refusal (B §2.1 rule 7).
                if status == 429
                    && decision.used_upstream_retry_hint
                    && decision.cooldown_ms > 0
                    && !conn.disable_cooling
                    && gated(config, o.connection, &o.model)
                {
                    let home = owner_of(&gate_home(config, o.connection), shards);
                    out.push((
                        Dest::Shard(home),
                        Msg::GateBlock {
                            connection: o.connection,
                            model: o.model.clone(),
                            until_ns: now
                                .mono_ns
                                .saturating_add(decision.cooldown_ms.saturating_mul(1_000_000)),
                        },
                    ));
                }
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

    /// The provider window on the owner (B §1.2b): two starts per minute pass, the third is
    /// told when to ask again (the window's first start + 60 s, or its wait budget's end),
    /// and once its budget is spent it goes through anyway; no queue is involved.
    #[test]
    fn provider_window_admits_retries_then_fails_open() {
        let toml = "[[providers]]\nid = \"nvidia\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [[connections]]\nid = \"n\"\nprovider = \"nvidia\"\n\
                    [resilience.provider_quota_overrides.nvidia]\nrpm = 2\n\
                    [resilience.request_queue]\nmax_wait_ms = 90000\n";
        let config = crate::config::load_str(toml, &|_| None).unwrap().config;
        let views = Views::default();
        let mut owned = Owned::new(&config);
        let at = |ms: u64| Now {
            mono_ns: ms * 1_000_000,
            wall_ms: 1_800_000_000_000 + ms,
        };
        let mut ask = |id: u64, since_ms: u64, now_ms: u64| {
            let msg = Msg::QueueAcquire {
                id: super::super::global_waiter_id(1, id),
                connection: ConnectionId(0),
                model: "m".to_owned(),
                waiting_since_ns: at(since_ms).mono_ns,
            };
            match owned
                .apply(&config, &views, 2, 1, msg, at(now_ms))
                .as_slice()
            {
                [(Dest::Shard(1), Msg::QueueGrant { start_at_ns, .. })] => {
                    assert_eq!(*start_at_ns, at(now_ms).mono_ns);
                    None
                }
                [(Dest::Shard(1), Msg::QueueRetry { at_ns, .. })] => Some(*at_ns / 1_000_000),
                other => panic!("unexpected answer {other:?}"),
            }
        };
        assert_eq!(ask(1, 1_000, 1_000), None);
        assert_eq!(ask(2, 2_000, 2_000), None);
        // Full: the first start leaves the window at 61 s.
        assert_eq!(ask(3, 3_000, 3_000), Some(61_000));
        // Asked again then: a slot is free.
        assert_eq!(ask(3, 3_000, 61_000), None);
        // Full again (starts at 2 s and 61 s): wait for 62 s.
        assert_eq!(ask(4, 61_500, 61_500), Some(62_000));
        // Requests waiting since 0 have a budget of max(60 s, 90 s) = 90 s.
        assert_eq!(ask(5, 0, 61_600), Some(62_000));
        assert_eq!(ask(6, 0, 89_000), None, "slot freed at 62 s");
        // The window frees at 121 s, after the budget: come back at the budget's end …
        assert_eq!(ask(7, 0, 89_500), Some(90_000));
        // … and be let through (fail open).
        assert_eq!(ask(7, 0, 90_000), None);
        assert!(owned.queue_waiters.is_empty(), "no queue was involved");
    }

    /// The `qsconn` slot on the gate home (B §2.3): cap = the account capacity, a second
    /// request waits until the first releases, and a disabled limit gives no slot at once.
    #[test]
    fn quota_share_slot_serialises_and_fails_open_when_disabled() {
        let toml = |enabled: bool| {
            format!(
                "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                 [[connections]]\nid = \"c\"\nprovider = \"p\"\nmax_concurrent = 1\n\
                 [resilience.quota_share_concurrency_limit]\nenabled = {enabled}\n"
            )
        };
        let now = Now {
            mono_ns: 1_000_000_000,
            wall_ms: 1_800_000_000_000,
        };
        let views = Views::default();
        let slot = |id: u64| Msg::QsSlotAcquire {
            id: super::super::global_waiter_id(1, id),
            connection: ConnectionId(0),
            deadline_ns: Some(now.mono_ns + 30_000_000_000),
        };
        let config = crate::config::load_str(&toml(true), &|_| None)
            .unwrap()
            .config;
        let mut owned = Owned::new(&config);
        let serial = match owned.apply(&config, &views, 2, 1, slot(1), now).as_slice() {
            [(Dest::Shard(1), Msg::GateGrant { serial, .. })] => *serial,
            other => panic!("first slot: {other:?}"),
        };
        // Queued: no answer, only the gate timer armed for its deadline.
        assert!(matches!(
            owned.apply(&config, &views, 2, 1, slot(2), now).as_slice(),
            [(Dest::SelfAt(_), Msg::GateTick)]
        ));
        let release = Msg::GateRelease {
            connection: ConnectionId(0),
            serial,
        };
        match owned.apply(&config, &views, 2, 1, release, now).as_slice() {
            [(Dest::Shard(1), Msg::GateGrant { id, .. })] => {
                assert_eq!(*id, super::super::global_waiter_id(1, 2));
            }
            other => panic!("the waiter was not granted on release: {other:?}"),
        }
        let config = crate::config::load_str(&toml(false), &|_| None)
            .unwrap()
            .config;
        let mut owned = Owned::new(&config);
        assert!(matches!(
            owned.apply(&config, &views, 2, 1, slot(1), now).as_slice(),
            [(Dest::Shard(1), Msg::GateDenied { .. })]
        ));
    }

    /// The gate home's timer on a manual clock: a queued waiter arms a tick at its deadline
    /// and is answered there; a block (an upstream 429's retry hint) arms a tick at its end,
    /// and the waiter queued behind it is granted then.
    #[test]
    fn gate_timer_answers_deadlines_and_lifts_blocks() {
        let toml = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                    [[connections]]\nid = \"c\"\nprovider = \"p\"\nmax_concurrent = 1\n";
        let config = crate::config::load_str(toml, &|_| None).unwrap().config;
        let views = Views::default();
        let mut owned = Owned::new(&config);
        let at = |ms: u64| Now {
            mono_ns: ms * 1_000_000,
            wall_ms: 1_800_000_000_000 + ms,
        };
        let id = |n: u64| super::super::global_waiter_id(1, n);
        let acquire = |n: u64, deadline_ms: u64| Msg::GateAcquire {
            id: id(n),
            connection: ConnectionId(0),
            model: "m".to_owned(),
            deadline_ns: Some(deadline_ms * 1_000_000),
        };
        let mut apply = |msg: Msg, now_ms: u64| owned.apply(&config, &views, 2, 1, msg, at(now_ms));
        let serial = match apply(acquire(1, 1_000), 0).as_slice() {
            [(Dest::Shard(1), Msg::GateGrant { serial, .. })] => *serial,
            other => panic!("{other:?}"),
        };
        // Queued with a 100 ms deadline: the timer is armed for it and answers it.
        assert!(matches!(
            apply(acquire(2, 100), 0).as_slice(),
            [(Dest::SelfAt(t), Msg::GateTick)] if *t == 100 * 1_000_000
        ));
        assert!(matches!(
            apply(Msg::GateTick, 100).as_slice(),
            [(
                Dest::Shard(1),
                Msg::GateDenied {
                    error: GateError::Timeout,
                    ..
                }
            )]
        ));
        // A block until 500 ms arms the timer; a waiter queued behind it is not granted by
        // the release, only by the tick that lifts the block.
        let block = Msg::GateBlock {
            connection: ConnectionId(0),
            model: "m".to_owned(),
            until_ns: 500 * 1_000_000,
        };
        assert!(matches!(
            apply(block, 200).as_slice(),
            [(Dest::SelfAt(t), Msg::GateTick)] if *t == 500 * 1_000_000
        ));
        assert!(
            apply(acquire(3, 10_000), 300).is_empty(),
            "earlier timer already armed"
        );
        let release = Msg::GateRelease {
            connection: ConnectionId(0),
            serial,
        };
        assert!(apply(release, 400).is_empty(), "blocked: nobody granted");
        let out = apply(Msg::GateTick, 500);
        assert!(
            out.iter().any(|(d, m)| *d == Dest::Shard(1)
                && matches!(m, Msg::GateGrant { id: g, .. } if *g == id(3))),
            "{out:?}"
        );
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
