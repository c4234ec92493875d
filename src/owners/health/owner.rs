//! The health owner: the breakers, connection state, model lockouts and provider cooldown
//! tracker entries of the keys this shard owns. It applies outcomes (already classified by
//! the asker into a [`Verdict`]), grants half-open probe permits and settles them, decays
//! and egress-cools connections, and broadcasts every transition as a view.

use std::collections::{HashMap, HashSet};

use crate::clock::Now;
use crate::config::{AuthKind, Config, ConnectionId, ProviderId};
use crate::mesh::placement::owner_of;
use crate::resilience::breaker::{
    Admission, BreakerKey, BreakerSettings, BreakerState, BreakerTable, Failure,
    SWEEP_INTERVAL_MS as BREAKER_SWEEP_INTERVAL_MS, Transition as BreakerTransition,
};
use crate::resilience::classify::{CooldownProfile, DailyReset};
use crate::resilience::connection::{
    Cause, ClearOutcome, ConnectionPolicy, ConnectionTable, Failure as ConnFailure, MarkEffect,
    MarkOptions, Routability,
};
use crate::resilience::egress::{FailingConnection, SiblingView, egress_siblings};
use crate::resilience::lockout::{FailureRecord, LockoutTable, SWEEP_INTERVAL_MS, lockout_applies};
use crate::resilience::tracker::{CooldownTracker, TrackerKey};
use crate::resilience::{FallbackDecision, Reason};
use crate::shard::HOUSEKEEPING_MS;
use crate::shard::call::CallId;
use crate::shard::metrics::FlowGauges;
use crate::snapshot::state::{Delta, Records};

use super::protocol::{
    AdminRequest, BreakerEntry, ConnectionEntry, EgressCooled, Ended, Fact, LockEntry, Outcome,
    OwnerStatus, ProviderEnded, ProviderReport, Reply, Request, TrackerView, Verdict, View,
};
use crate::owners::{Cx, Mechanism, Shard};

/// The health tables of one owner shard.
#[derive(Debug)]
pub struct Health {
    pub breakers: BreakerTable,
    pub connections: ConnectionTable,
    pub lockouts: LockoutTable,
    /// The optional provider cooldown tracker (spec A §2): provider-level entries on the
    /// provider's owner, connection-level ones on the connection's owner.
    pub tracker: CooldownTracker,
    /// The last tracker view broadcast per key (its epoch only grows).
    tracker_sent: HashMap<TrackerKey, TrackerView>,
    /// Keys whose persisted record may have changed since the last snapshot delta.
    dirty: Dirty,
    /// Housekeeping runs so far (the breaker sweep runs every few).
    ticks: u64,
    /// The egress siblings the outcome being handled cooled, for its answer.
    egress_told: Vec<EgressCooled>,
}

/// The keys a snapshot delta must re-read (see [`Health::take_delta`]).
#[derive(Debug, Default)]
struct Dirty {
    breakers: HashSet<BreakerKey>,
    connections: HashSet<ConnectionId>,
    trackers: HashSet<TrackerKey>,
}

impl Dirty {
    fn is_empty(&self) -> bool {
        self.breakers.is_empty() && self.connections.is_empty() && self.trackers.is_empty()
    }

    /// What an attempt's outcome can change on the connection's owner.
    fn outcome(&mut self, o: &Outcome) {
        self.breakers.insert(BreakerKey::Connection(o.connection));
        self.connections.insert(o.connection);
        self.trackers
            .insert(TrackerKey::Connection(o.provider, o.connection));
    }

    /// What a provider-level report can change on the provider's owner.
    fn provider(&mut self, r: &ProviderReport) {
        self.breakers.insert(BreakerKey::Provider(r.provider));
        self.trackers.insert(TrackerKey::Provider(r.provider));
    }

    /// Every key a view sent since `from` announces: whatever else changes state (a
    /// reset, an operator's clear) is persisted too.
    fn views(&mut self, cx: &Cx<'_>, from: usize) {
        for (_, m) in cx.sent().iter().skip(from) {
            match m {
                crate::shard::Msg::View(View::Breaker { key, .. }) => {
                    self.breakers.insert(*key);
                }
                crate::shard::Msg::View(View::Connection { connection, .. }) => {
                    self.connections.insert(*connection);
                }
                crate::shard::Msg::View(View::Tracker { key, .. }) => {
                    self.trackers.insert(*key);
                }
                _ => {}
            }
        }
    }
}

/// Takes at most `max` keys out of `set`.
fn take_some<K: Copy + Eq + std::hash::Hash>(set: &mut HashSet<K>, max: usize) -> Vec<K> {
    let keys: Vec<K> = set.iter().take(max).copied().collect();
    for k in &keys {
        set.remove(k);
    }
    keys
}

impl Mechanism for Health {
    type Fact = Fact;
    type Request = Request;
    type Reply = Reply;
    const HOLDS: bool = false;

    fn new(config: &Config) -> Self {
        Self {
            breakers: BreakerTable::new(BreakerSettings::from_resilience(&config.resilience)),
            connections: ConnectionTable::new(),
            lockouts: LockoutTable::with_max_entries(config.server.max_model_lockouts),
            tracker: CooldownTracker::new(config.resilience.provider_cooldown.clone()),
            tracker_sent: HashMap::new(),
            dirty: Dirty::default(),
            ticks: 0,
            egress_told: Vec::new(),
        }
    }

    fn fact(&mut self, cx: &mut Cx<'_>, fact: Fact) {
        let now = cx.now;
        let sent = cx.sent().len();
        match &fact {
            Fact::Outcome(o) => self.dirty.outcome(o),
            Fact::ProviderResult(r) => self.dirty.provider(r),
            Fact::ReleaseProbe { key, .. } => {
                self.dirty.breakers.insert(*key);
            }
            Fact::AutoDecay { connection } | Fact::EgressCool { connection, .. } => {
                self.dirty.connections.insert(*connection);
            }
        }
        self.fact_inner(cx, fact, now);
        self.egress_told.clear();
        self.dirty.views(cx, sent);
    }

    fn call(&mut self, cx: &mut Cx<'_>, id: CallId, request: Request) {
        let sent = cx.sent().len();
        match &request {
            Request::Probe(key) => {
                self.dirty.breakers.insert(*key);
            }
            Request::Outcome(o) => self.dirty.outcome(o),
            Request::ProviderResult(r) => self.dirty.provider(r),
            Request::EgressCool(e) => {
                self.dirty.connections.insert(e.connection);
            }
            // What a management request changes is announced as views, read below.
            Request::Admin(_) => {}
        }
        self.call_inner(cx, id, request);
        self.dirty.views(cx, sent);
    }

    fn late(shard: &Shard, from: usize, _id: CallId, reply: Reply) {
        // A probe permit granted to an asker that gave up goes straight back.
        if let Reply::Probe {
            key,
            ticket: Some(ticket),
            ..
        } = reply
        {
            shard.send_fact(from, Fact::ReleaseProbe { key, ticket }.into());
        }
    }

    fn settings_changed(&mut self, cx: &mut Cx<'_>) {
        let sent = cx.sent().len();
        self.retune(cx);
        self.forget_removed(cx);
        self.dirty.views(cx, sent);
    }

    fn gauges(&self, g: &mut FlowGauges) {
        let (locks, failures) = self.lockouts.sizes();
        let entries = [
            self.breakers.entry_count(),
            locks,
            failures,
            self.tracker.entry_count(),
        ];
        for (sum, n) in g.owner_entries.iter_mut().zip(entries) {
            *sum += n;
        }
        g.lockouts_evicted += self.lockouts.evictions();
    }

    fn housekeeping(&mut self, cx: &mut Cx<'_>) {
        self.forget_removed(cx);
        // Entries the tracker's sweep forgets leave the snapshot too.
        let before: Vec<TrackerKey> = self.tracker.keys().collect();
        self.housekeeping_inner(cx);
        for key in before {
            if self.tracker.export_key(cx.now, key).is_none() {
                self.dirty.trackers.insert(key);
            }
        }
    }
}

impl Health {
    fn fact_inner(&mut self, cx: &mut Cx<'_>, fact: Fact, now: Now) {
        match fact {
            Fact::Outcome(o) => self.outcome(cx, &o),
            Fact::ProviderResult(r) => self.provider_result(cx, &r),
            Fact::ReleaseProbe { key, ticket } => {
                let t = self.breakers.release_probe(now, key, ticket);
                breaker_view(cx, key, t);
            }
            Fact::AutoDecay { connection } => {
                if let Some(t) = self.connections.auto_decay(connection, now)
                    && t.view_changed
                {
                    cx.view(View::Connection {
                        connection,
                        view: t.view,
                    });
                }
            }
            Fact::EgressCool {
                connection,
                until_ms,
                reason,
            } => self.cool_for_egress(
                cx,
                EgressCooled {
                    connection,
                    until_ms,
                    reason,
                },
            ),
        }
        self.lockout_views(cx);
    }

    fn cool_for_egress(&mut self, cx: &mut Cx<'_>, e: EgressCooled) {
        let c = e.connection;
        if let Some(t) = self
            .connections
            .cool_for_egress(c, e.until_ms, e.reason, cx.now)
        {
            cx.view(View::Connection {
                connection: c,
                view: t.view,
            });
        }
    }

    fn call_inner(&mut self, cx: &mut Cx<'_>, id: CallId, request: Request) {
        let now = cx.now;
        match request {
            Request::Probe(key) => {
                let auth = breaker_auth(cx.config, key);
                self.breakers.get_or_create(key, auth);
                let (ticket, retry_after_ms) = match self.breakers.admit(now, key) {
                    Admission::Allow => (None, 0),
                    Admission::Probe { ticket, transition } => {
                        breaker_view(cx, key, Some(transition));
                        (Some(ticket), 0)
                    }
                    Admission::Reject { retry_after_ms, .. } => (None, retry_after_ms.max(1)),
                };
                cx.reply(
                    id,
                    Reply::Probe {
                        key,
                        ticket,
                        retry_after_ms,
                    },
                );
            }
            Request::Outcome(o) => {
                self.outcome(cx, &o);
                // Views first, then the answer: on the asker's ring they arrive in order.
                self.lockout_views(cx);
                let egress = std::mem::take(&mut self.egress_told);
                cx.reply(id, Reply::Applied { egress });
            }
            Request::ProviderResult(r) => {
                self.provider_result(cx, &r);
                self.egress_told.clear();
                cx.reply(id, Reply::Applied { egress: Vec::new() });
            }
            Request::EgressCool(e) => {
                self.cool_for_egress(cx, e);
                // The view first, then the answer (as for outcomes).
                cx.reply(id, Reply::Applied { egress: Vec::new() });
            }
            Request::Admin(a) => {
                let reply = self.admin(cx, a);
                // Views first, then the answer (as for outcomes).
                self.lockout_views(cx);
                cx.reply(id, reply);
            }
        }
    }

    fn housekeeping_inner(&mut self, cx: &mut Cx<'_>) {
        // Anti-entropy: keys not in their default state are re-sent to every shard, so a
        // dropped broadcast converges here rather than at the key's next transition.
        let now = cx.now;
        for (key, breaker) in self.breakers.iter() {
            if !breaker.state(now).is_closed() || breaker.failure_count() > 0 {
                let view = breaker.view(now);
                cx.view(View::Breaker { key, view });
            }
        }
        for (connection, view) in self.connections.views() {
            if view.epoch > 0 {
                cx.view(View::Connection { connection, view });
            }
        }
        self.sweep_tables(cx);
        // The tracker forgets entries past their retention; replicas hear of it here.
        self.tracker.sweep(now);
        let keys: Vec<TrackerKey> = self.tracker_sent.keys().copied().collect();
        for key in keys {
            if !self.sync_tracker(cx, key) {
                let view = self.tracker_sent.get(&key).copied().unwrap_or_default();
                if view.failures > 0 || view.until_mono_ms > now.mono_ms() {
                    cx.view(View::Tracker { key, view });
                }
            }
        }
    }
}

impl Health {
    /// The table sweeps, on every housekeeping run ([`HOUSEKEEPING_MS`]): expired model
    /// locks and idle failure states every run (linear in the table, which
    /// `server.max_model_lockouts` bounds), idle closed breakers every
    /// [`BREAKER_SWEEP_INTERVAL_MS`] (§1.5). Expired locks are logged here, once each.
    fn sweep_tables(&mut self, cx: &mut Cx<'_>) {
        let now = cx.now;
        self.ticks = self.ticks.wrapping_add(1);
        self.lockouts
            .set_max_entries(cx.config.server.max_model_lockouts);
        for key in self.lockouts.sweep(now) {
            log_lock(cx.config, &key, None, now);
        }
        let every = (BREAKER_SWEEP_INTERVAL_MS / HOUSEKEEPING_MS).max(1);
        if self.ticks.is_multiple_of(every) {
            self.breakers.sweep(now);
        }
        self.lockout_views(cx);
    }

    /// The management API's requests (A §1.11, §4.8, §5.2): applied here, every change
    /// broadcast as a view like any other transition.
    fn admin(&mut self, cx: &mut Cx<'_>, request: AdminRequest) -> Reply {
        let now = cx.now;
        match request {
            AdminRequest::Reset => {
                let reset = self.breakers.reset_all(now);
                let breakers = u32::try_from(reset.len()).unwrap_or(u32::MAX);
                for (key, t) in reset {
                    breaker_view(cx, key, Some(t));
                }
                let lockouts = u32::try_from(self.lockouts.clear_all()).unwrap_or(u32::MAX);
                Reply::Reset { breakers, lockouts }
            }
            AdminRequest::ClearConnection(connection) => {
                let (outcome, t) = self.connections.clear_transient(connection, now);
                if let Some(t) = t {
                    // An operator's clear is a transition like any other: one line.
                    if t.view_changed {
                        log_connection(cx.config, &t, now);
                    }
                    cx.view(View::Connection {
                        connection,
                        view: t.view,
                    });
                }
                let lockouts = if outcome == ClearOutcome::SkippedTerminal {
                    0
                } else {
                    self.lockouts.clear_connection(connection)
                };
                Reply::Cleared {
                    outcome,
                    lockouts: u32::try_from(lockouts).unwrap_or(u32::MAX),
                }
            }
            AdminRequest::ClearLocks { provider, model } => Reply::Removed {
                any: self.lockouts.clear_listed(&provider, &model),
            },
            AdminRequest::ClearAllLocks => Reply::Removed {
                any: self.lockouts.clear_all() > 0,
            },
            AdminRequest::Status => Reply::Status(Box::new(self.status(now))),
        }
    }

    /// What this owner holds: its breakers, its non-clean connection records and its
    /// live model lockouts.
    fn status(&self, now: Now) -> OwnerStatus {
        let breakers = self
            .breakers
            .iter()
            .map(|(key, b)| {
                let s = b.status(now);
                BreakerEntry {
                    key,
                    state: s.state,
                    failure_count: s.failure_count,
                    last_failure_wall_ms: s.last_failure_wall_ms,
                    retry_after_ms: s.retry_after_ms,
                }
            })
            .collect();
        let connections = self
            .connections
            .export()
            .into_iter()
            .map(|(connection, st)| ConnectionEntry {
                connection,
                test_status: st.test_status,
                backoff_level: st.backoff_level,
                rate_limited_until_ms: st.rate_limited_until_ms(),
                error_type: st.error.as_ref().and_then(|e| e.error_type),
                error_code: st.error.as_ref().and_then(|e| e.code),
                error_at_ms: st.error.as_ref().map(|e| e.at_ms),
            })
            .collect();
        let lockouts = self
            .lockouts
            .list(now, |_| String::new())
            .into_iter()
            .map(|l| LockEntry {
                provider: l.provider,
                model: l.model,
                connection: l.connection,
                reason: l.reason,
                remaining_ms: l.remaining_ms,
                failure_count: l.failure_count,
            })
            .collect();
        OwnerStatus {
            breakers,
            connections,
            lockouts,
        }
    }

    /// Drops the state of providers and connections the configuration no longer has (a
    /// reload removed them; a late report from a shard still on the old configuration
    /// may bring some back, which housekeeping drops again). Kept ones are untouched:
    /// their ids survived the reload with their names.
    fn forget_removed(&mut self, cx: &mut Cx<'_>) {
        let config = cx.config;
        let provider = |p: ProviderId| config.provider_by_id(p).is_some();
        let connection = |c: ConnectionId| config.connection_by_id(c).is_some();
        let breakers = self.breakers.retain(|k| match k {
            BreakerKey::Provider(p) => provider(p),
            BreakerKey::Connection(c) => connection(c),
        });
        let records = self.connections.retain(connection);
        let tracked = |k: TrackerKey| match k {
            TrackerKey::Provider(p) => provider(p),
            TrackerKey::Connection(p, c) => provider(p) && connection(c),
        };
        let trackers = self.tracker.retain(tracked);
        self.tracker_sent.retain(|k, _| tracked(*k));
        let locks = self.lockouts.retain_connections(connection);
        self.lockout_views(cx);
        if breakers + records + trackers + locks > 0 {
            tracing::debug!(
                breakers,
                records,
                trackers,
                locks,
                "state of removed providers and connections dropped"
            );
        }
    }

    /// New runtime settings: every breaker takes its category's new tuning (a changed
    /// 429-hint switch resets them all, and the resets are broadcast), the tracker its new
    /// windows.
    fn retune(&mut self, cx: &mut Cx<'_>) {
        let settings = BreakerSettings::from_resilience(&cx.config.resilience);
        for (key, t) in self.breakers.apply_settings(cx.now, settings) {
            breaker_view(cx, key, Some(t));
        }
        self.tracker
            .apply_settings(cx.config.resilience.provider_cooldown.clone());
    }

    /// What the provider's owner applies: the provider breaker (successes, network
    /// failures, and the end of its half-open probe, settled as the connection breaker's
    /// is: a counted failure reopens it, another upstream answer closes it, no verdict
    /// returns the permit) and the provider-level tracker entry.
    fn provider_result(&mut self, cx: &mut Cx<'_>, r: &ProviderReport) {
        let now = cx.now;
        let key = BreakerKey::Provider(r.provider);
        let auth = cx.config.provider(r.provider).auth;
        let track = TrackerKey::Provider(r.provider);
        match r.ended {
            ProviderEnded::Success => {
                self.breakers.get_or_create(key, auth);
                let t = self.breakers.on_success(now, key, r.probe);
                breaker_view(cx, key, t);
                self.tracker.record_success(track);
            }
            ProviderEnded::Failed(f) => {
                let is_probe = r
                    .probe
                    .is_some_and(|p| self.breakers.get(key).is_some_and(|b| b.is_probe(now, p)));
                let t = if f.is_network() || is_probe {
                    self.breakers.on_failure(now, key, auth, f, r.probe)
                } else {
                    // A stale permit (or none): nothing the provider breaker counts.
                    r.probe
                        .and_then(|p| self.breakers.release_probe(now, key, p))
                };
                breaker_view(cx, key, t);
                if r.combo && f.counts() {
                    self.tracker.record_failure(now, track, auth);
                }
            }
        }
        self.sync_tracker(cx, track);
    }

    /// Broadcasts the tracker view of `key` when it changed; true when it did.
    fn sync_tracker(&mut self, cx: &mut Cx<'_>, key: TrackerKey) -> bool {
        let until = self.tracker.cooldown_deadline_ms(key);
        let failures = self.tracker.failure_count(key);
        let last = self.tracker_sent.get(&key).copied();
        if last.is_none() && failures == 0 && until.is_none() {
            // Never shown, nothing to show (the tracker is off, or a clean success).
            return false;
        }
        let until_mono_ms = until.map_or(0, |u| u64::try_from(u).unwrap_or(0));
        let previous = last.unwrap_or_default();
        if previous.failures == failures && previous.until_mono_ms == until_mono_ms {
            return false;
        }
        let view = TrackerView {
            epoch: previous.epoch.saturating_add(1),
            until_mono_ms,
            failures,
        };
        self.tracker_sent.insert(key, view);
        cx.view(View::Tracker { key, view });
        true
    }

    /// Broadcasts (and logs) the lockout changes of the last message.
    fn lockout_views(&mut self, cx: &mut Cx<'_>) {
        for u in self.lockouts.drain_updates() {
            log_lock(cx.config, &u.key, Some(u.lock), cx.now);
            cx.view(View::Lockout(Box::new(u)));
        }
    }

    fn outcome(&mut self, cx: &mut Cx<'_>, o: &Outcome) {
        let now = cx.now;
        let config = cx.config;
        let provider = config.provider(o.provider);
        let auth = provider.auth;
        let conn_key = BreakerKey::Connection(o.connection);
        match &o.ended {
            Ended::Success => {
                self.breakers.get_or_create(conn_key, auth);
                let t = self.breakers.on_success(now, conn_key, o.probe);
                breaker_view(cx, conn_key, t);
                if let Some(t) = self.connections.clear_on_success(o.connection, now)
                    && t.view_changed
                {
                    log_connection(config, &t, now);
                    cx.view(View::Connection {
                        connection: o.connection,
                        view: t.view,
                    });
                }
                // A direct success lifts the model's lock and forgets its failures
                // (`clearModelLock`, A §4.6), so the next failure starts from the base
                // again; a combo success halves them (`decayModelFailureCount`).
                let family = provider.quirks.quota_family;
                if o.combo.is_some() {
                    self.lockouts
                        .decay(&provider.name, family, Some(o.connection), &o.model, now);
                } else {
                    self.lockouts
                        .clear(&provider.name, family, Some(o.connection), &o.model);
                }
                let track = TrackerKey::Connection(o.provider, o.connection);
                self.tracker.record_success(track);
                self.sync_tracker(cx, track);
            }
            Ended::ClientAbort => self.release_probe(cx, conn_key, o),
            Ended::StreamBroken {
                error_type,
                last_error,
            } => {
                let policy = ConnectionPolicy::from_settings(&config.resilience, auth);
                let disable_cooling = config.connection(o.connection).disable_cooling;
                let t = self.connections.record_stream_stall(
                    o.connection,
                    last_error.as_str(),
                    *error_type,
                    disable_cooling,
                    &policy,
                    now,
                );
                if let Some(t) = t.transition.filter(|t| t.view_changed) {
                    log_connection(config, &t, now);
                    cx.view(View::Connection {
                        connection: o.connection,
                        view: t.view,
                    });
                }
                self.release_probe(cx, conn_key, o);
            }
            Ended::Failed(v) => self.failure(cx, o, v),
        }
    }

    fn release_probe(&mut self, cx: &mut Cx<'_>, key: BreakerKey, o: &Outcome) {
        if let Some(p) = o.probe {
            let t = self.breakers.release_probe(cx.now, key, p);
            breaker_view(cx, key, t);
        }
    }

    /// A classified failure: connection state (with the cooldown rescaled from this owner's
    /// backoff level), lockouts, the breaker, and the egress family.
    fn failure(&mut self, cx: &mut Cx<'_>, o: &Outcome, v: &Verdict) {
        let now = cx.now;
        let config = cx.config;
        let provider = config.provider(o.provider);
        let conn = config.connection(o.connection);
        let auth = provider.auth;
        let conn_key = BreakerKey::Connection(o.connection);
        let profile = CooldownProfile::for_category(&config.resilience, auth);
        let decision = v
            .decision
            .clone()
            .rescaled(Some(&profile), self.connections.backoff_level(o.connection));
        let failure = ConnFailure {
            status: v.status,
            text: v.last_error.as_str(),
            decision: &decision,
            error_type: v.error_type,
            credits_signal: v.credits_signal,
        };
        let mut options = MarkOptions::new(&provider.name, Some(&o.model));
        options.disable_cooling = conn.disable_cooling;
        options.local_provider = auth == AuthKind::Local;
        options.per_model = per_model_quota(config, o.provider);
        options.quirks = provider.quirks;
        options.egress_lock = takes_part_in_egress_lock(config, o.connection);
        options.daily_reset_ms = provider.daily_reset.map(|c| {
            DailyReset {
                utc_offset_minutes: c.utc_offset_minutes,
                hour: c.hour,
            }
            .ms_until_next(now.wall_ms)
        });
        // A combo does not persist a transient failure as the connection's cooldown
        // (`persistUnavailableState = false`, A §3.5): the model is locked on the connection
        // instead, so the combo's other targets on it are still tried.
        options.persist = !(o.combo.is_some() && v.is_transient());
        let policy = ConnectionPolicy::from_settings(&config.resilience, auth);
        let marked =
            self.connections
                .mark_unavailable(o.connection, &failure, &options, &policy, now);
        // markAccountUnavailable's per-model branches lock regardless of
        // `modelLockout.enabled` (A §4.5); only combo lockouts are gated by it.
        if let Some(cmd) = &marked.decision.lockout {
            self.lockouts.apply(cmd, now);
        }
        if o.combo.is_some() {
            self.combo_lockout(config, o, v, &decision, now);
        }
        if let Some(t) = marked.transition.filter(|t| t.view_changed) {
            log_connection(config, &t, now);
            cx.view(View::Connection {
                connection: o.connection,
                view: t.view,
            });
        }
        let egress_until = match marked.decision.effect {
            MarkEffect::Cooling { until_ms } if marked.decision.egress => Some(until_ms),
            _ => None,
        };
        // The breaker: connection-scoped unless it is a network error, which the asking
        // shard reports to the provider's owner.
        let key = BreakerKey::for_failure(o.provider, Some(o.connection), v.breaker);
        // A combo target whose next target is the same provider is not a breaker failure
        // (A §1.6); a half-open probe's outcome still settles its breaker.
        let same_provider_next = o.combo.is_some_and(|c| c.next_same_provider) && o.probe.is_none();
        if decision.skip_provider_breaker || same_provider_next {
            self.release_probe(cx, conn_key, o);
        } else if key == conn_key {
            let t = match o.combo {
                // The combo path: at most one failure per connection per 5 s (the table's
                // dedupe, A §1.6 path 4).
                Some(_) => self.breakers.on_failure(now, key, auth, v.breaker, o.probe),
                // The direct (single-model) path counts every failure.
                None => self
                    .breakers
                    .get_or_create(key, auth)
                    .on_failure(now, v.breaker, o.probe),
            };
            match t {
                Some(t) => breaker_view(cx, key, Some(t)),
                // No transition, but shards learn this breaker has counts to decay: from
                // now on they report successes on it.
                None => {
                    let view = self.breakers.view(now, key);
                    cx.view(View::Breaker { key, view });
                }
            }
        } else {
            self.release_probe(cx, conn_key, o);
        }
        if let Some(until_ms) = egress_until {
            self.egress(cx, o, until_ms, decision.reason, now);
        }
        if o.combo.is_some() && v.breaker.counts() && !decision.skip_provider_breaker {
            let track = TrackerKey::Connection(o.provider, o.connection);
            self.tracker.record_failure(now, track, auth);
            self.sync_tracker(cx, track);
        }
    }

    /// A combo target's model lockout (A §4.5), when `model_lockout.enabled` and the status
    /// is one of its `error_codes`: escalating from `base_cooldown_ms`, or the upstream's
    /// hint when it is longer, capped by `max_cooldown_ms`. Every (target, connection) pair
    /// is tried at most once per request, so each failure is its target's first attempt.
    fn combo_lockout(
        &mut self,
        config: &Config,
        o: &Outcome,
        v: &Verdict,
        d: &FallbackDecision,
        now: Now,
    ) {
        let settings = &config.resilience.model_lockout;
        if !lockout_applies(settings, v.status) || v.breaker == Failure::RequestScoped {
            return;
        }
        let provider = config.provider(o.provider);
        let hint_ms = if d.used_upstream_retry_hint {
            d.cooldown_ms
        } else {
            d.quota_reset_hint_ms.unwrap_or(0)
        };
        let reset_timeout_ms = config
            .resilience
            .provider_breaker
            .get(provider.auth)
            .reset_timeout_ms;
        let record = FailureRecord::combo(
            &provider.name,
            provider.quirks.quota_family,
            Some(o.connection),
            &o.model,
            v.status,
            hint_ms,
            settings,
            reset_timeout_ms,
        );
        self.lockouts.record_failure(&record, now);
    }

    /// The egress lock cooled the failing connection until `until_ms`: every sibling
    /// behind the same egress cools to the same deadline.
    /// The siblings are told here (delivered even if the asker gives up) and listed in
    /// `egress_told` for the asker, which waits for their views before it routes again.
    fn egress(&mut self, cx: &mut Cx<'_>, o: &Outcome, until_ms: u64, reason: Reason, now: Now) {
        let config = cx.config;
        let conn = config.connection(o.connection);
        // The kind's egress family (the opencode kinds share one), else the provider alone.
        let family = |p: ProviderId| {
            let p = config.provider(p);
            p.quirks.egress_family.unwrap_or(&p.name).to_owned()
        };
        let failing_family = family(o.provider);
        let failing = FailingConnection {
            id: o.connection,
            family: &failing_family,
            egress: conn.egress.as_deref(),
        };
        // By position in `config.connections`.
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
                let (terminal, cooling_until_ms) = match cx.views.connections.routability(c.id, now)
                {
                    Routability::Routable => (false, None),
                    Routability::NotUntil { until_ms, .. } => (false, Some(until_ms)),
                    Routability::Terminal(_) => (true, None),
                };
                SiblingView {
                    id: c.id,
                    family: config
                        .connection_slot(c.id)
                        .and_then(|i| families.get(i))
                        .map_or("", String::as_str),
                    egress: c.egress.as_deref(),
                    takes_part: takes_part_in_egress_lock(config, c.id),
                    disable_cooling: c.disable_cooling,
                    terminal,
                    cooling_until_ms,
                }
            })
            .collect();
        for sibling in egress_siblings(&failing, until_ms, siblings.iter()) {
            let to = owner_of(&sibling, cx.shards);
            self.egress_told.push(EgressCooled {
                connection: sibling,
                until_ms,
                reason,
            });
            cx.tell(
                to,
                Fact::EgressCool {
                    connection: sibling,
                    until_ms,
                    reason,
                },
            );
        }
    }
}

// -- the snapshot ------------------------------------------------------------------------

/// The owner shard of a breaker's key.
fn breaker_owner(key: BreakerKey, shards: usize) -> usize {
    match key {
        BreakerKey::Provider(p) => owner_of(&p, shards),
        BreakerKey::Connection(c) => owner_of(&c, shards),
    }
}

/// The owner shard of a tracker entry: the provider's for the window, the connection's
/// for a connection's cooldown.
fn tracker_owner(key: TrackerKey, shards: usize) -> usize {
    match key {
        TrackerKey::Provider(p) => owner_of(&p, shards),
        TrackerKey::Connection(_, c) => owner_of(&c, shards),
    }
}

impl Health {
    /// Whether a snapshot delta is pending.
    pub fn snapshot_dirty(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The persisted records of up to `max` changed keys (each `None` when the key is
    /// back to clean), taken out of the dirty set. The work is bounded by `max`, so a
    /// shard can collect a large backlog in small steps between requests.
    pub fn take_delta(&mut self, now: Now, max: usize) -> Delta {
        let mut d = Delta::default();
        let breakers = take_some(&mut self.dirty.breakers, max);
        for key in breakers {
            let record = self
                .breakers
                .get(key)
                .filter(|b| !b.is_idle())
                .map(|b| b.export(now));
            d.breakers.push((key, record));
        }
        let room = max.saturating_sub(d.len());
        for id in take_some(&mut self.dirty.connections, room) {
            let state = self.connections.state(id);
            d.connections
                .push((id, (!state.is_clean()).then_some(state)));
        }
        let room = max.saturating_sub(d.len());
        for key in take_some(&mut self.dirty.trackers, room) {
            d.trackers.push((key, self.tracker.export_key(now, key)));
        }
        d
    }

    /// Adopts the loaded records whose owner `keep` accepts, broadcasting nothing: the
    /// views they make are left in `cx` for the caller. Adopted keys are marked dirty, so
    /// the next delta carries them as this release normalised them (an OPEN deadline
    /// bounded, a backoff level clamped).
    pub fn restore(&mut self, cx: &mut Cx<'_>, records: &Records, keep: &dyn Fn(usize) -> bool) {
        let now = cx.now;
        let config = cx.config;
        let shards = cx.shards;
        let breakers: Vec<_> = records
            .breakers
            .iter()
            .filter(|(k, _)| keep(breaker_owner(**k, shards)))
            .map(|(k, r)| (*k, breaker_auth(config, *k), r.clone()))
            .collect();
        for (key, view) in self.breakers.import(now, breakers) {
            self.dirty.breakers.insert(key);
            cx.view(View::Breaker { key, view });
        }
        for (id, state) in &records.connections {
            if !keep(owner_of(id, shards)) {
                continue;
            }
            let auth = config.provider(config.connection(*id).provider).auth;
            let max_steps = ConnectionPolicy::from_settings(&config.resilience, auth)
                .backoff
                .max_backoff_steps;
            let t = self.connections.import(*id, state.clone(), max_steps, now);
            self.dirty.connections.insert(*id);
            cx.view(View::Connection {
                connection: *id,
                view: t.view,
            });
        }
        let trackers: Vec<_> = records
            .trackers
            .iter()
            .filter(|(k, _)| keep(tracker_owner(**k, shards)))
            .map(|(k, r)| {
                let p = match *k {
                    TrackerKey::Provider(p) | TrackerKey::Connection(p, _) => p,
                };
                (*k, config.provider(p).auth, r.clone())
            })
            .collect();
        let keys: Vec<TrackerKey> = trackers.iter().map(|(k, _, _)| *k).collect();
        self.tracker.import(now, trackers);
        for key in keys {
            self.dirty.trackers.insert(key);
            self.sync_tracker(cx, key);
        }
    }
}

/// Collects up to `max` changed records of this shard's health table for the snapshot
/// writer (`None`: nothing changed).
pub fn snapshot_delta(shard: &Shard, max: usize) -> Option<Delta> {
    let now = shard.now();
    let mut health = shard.state().owners.health.borrow_mut();
    if !health.snapshot_dirty() {
        return None;
    }
    Some(health.take_delta(now, max))
}

/// Start-up: this shard adopts the loaded records of the keys it owns under the current
/// shard count, and builds its replicas of every other key from the same records (every
/// shard derives the same views, so nothing needs to cross the mesh before the first
/// request).
pub fn restore(shard: &Shard, records: &Records) {
    if records.is_empty() {
        return;
    }
    let me = shard.id();
    let current = shard.current();
    let out = {
        let views = shard.state().views.borrow();
        let mut cx = Cx::detached(current.config(), &views, shard.now(), shard.shards());
        shard
            .state()
            .owners
            .health
            .borrow_mut()
            .restore(&mut cx, records, &|owner| owner == me);
        Health::new(current.config()).restore(&mut cx, records, &|owner| owner != me);
        cx.take()
    };
    let mut views = shard.state().views.borrow_mut();
    for (_, m) in out {
        if let crate::shard::Msg::View(v) = m {
            views.apply(&v);
        }
    }
}

/// Whether a connection takes part in the egress-bucketed lock: it has an `egress` label,
/// or its provider's kind is on the default allowlist (A §7).
pub fn takes_part_in_egress_lock(config: &Config, connection: ConnectionId) -> bool {
    let c = config.connection(connection);
    c.egress.is_some() || config.provider(c.provider).quirks.egress_lock_by_default
}

/// Breaker states a transition enters, in the index order of
/// `tidegate_breaker_transitions_total{to}`.
pub const BREAKER_STATES: [BreakerState; 4] = [
    BreakerState::Closed,
    BreakerState::Degraded,
    BreakerState::HalfOpen,
    BreakerState::Open,
];

fn breaker_view(cx: &mut Cx<'_>, key: BreakerKey, t: Option<BreakerTransition>) {
    if let Some(t) = t {
        log_breaker(cx.config, key, &t);
        if t.from != t.to
            && let Some(i) = BREAKER_STATES.iter().position(|s| *s == t.to)
        {
            cx.count_breaker_transition(i);
        }
        cx.view(View::Breaker { key, view: t.view });
    }
}

/// One line per breaker transition, on its owner (never per rejected request): WARN when
/// it opens, INFO otherwise.
fn log_breaker(config: &Config, key: BreakerKey, t: &BreakerTransition) {
    let name = match key {
        BreakerKey::Provider(p) => format!("provider {}", config.provider(p).name),
        BreakerKey::Connection(c) => format!("connection {}", config.connection(c).name),
    };
    let (from, to) = (format!("{:?}", t.from), format!("{:?}", t.to));
    if t.to == crate::resilience::breaker::BreakerState::Open {
        tracing::warn!(breaker = %name, from = %from, to = %to, reason = %t.reason, "circuit breaker opened");
    } else {
        tracing::info!(breaker = %name, from = %from, to = %to, reason = %t.reason, "circuit breaker {}", to.to_lowercase());
    }
}

/// One line per connection state change the routing sees: a cooldown starting or ending,
/// a terminal state.
fn log_connection(config: &Config, t: &crate::resilience::connection::Transition, now: Now) {
    let name = &config.connection(t.connection).name;
    let cause = format!("{:?}", t.cause);
    if let Some(term) = &t.view.terminal {
        tracing::warn!(connection = %name, cause = %cause, "connection terminal: {term:?}");
    } else if let Some(c) = &t.view.cooldown {
        let secs = c.until_ms.saturating_sub(now.wall_ms).div_ceil(1000);
        tracing::warn!(connection = %name, cause = %cause, reason = ?c.reason, "connection cooling down for {secs} s");
    } else if matches!(t.cause, Cause::Failure | Cause::StreamStall) {
        // A failure that changed only the backoff level (a connection with
        // `disable_cooling`, or a stall without `stream_stall_cooldown`): it was available
        // and stays so.
        tracing::debug!(connection = %name, cause = %cause, backoff_level = t.view.backoff_level, "connection backoff level changed");
    } else {
        tracing::info!(connection = %name, cause = %cause, "connection available again");
    }
}

/// One line per model lockout transition, on its owner: INFO when a model is locked (or
/// its lock extended), when a lock is lifted early (`change = Some(None)`: a success, a
/// clear, the table's cap) and when the sweep finds it over (`change = None`).
fn log_lock(
    config: &Config,
    key: &crate::resilience::lockout::LockKey,
    change: Option<Option<crate::resilience::lockout::LockView>>,
    now: Now,
) {
    let connection = key
        .connection
        .and_then(|c| config.connection_by_id(c))
        .map_or("", |c| c.name.as_str());
    let (provider, model) = (&key.provider, key.model_part());
    match change {
        Some(Some(lock)) => {
            let secs = lock.until_ms.saturating_sub(now.mono_ms()).div_ceil(1000);
            tracing::info!(provider = %provider, model = %model, connection = %connection, reason = lock.reason.as_str(), "model locked for {secs} s");
        }
        Some(None) => {
            tracing::info!(provider = %provider, model = %model, connection = %connection, "model lock lifted");
        }
        None => {
            tracing::info!(provider = %provider, model = %model, connection = %connection, "model lock expired");
        }
    }
}

/// The auth category whose profile a breaker uses.
pub fn breaker_auth(config: &Config, key: BreakerKey) -> AuthKind {
    match key {
        BreakerKey::Provider(p) => config.provider(p).auth,
        BreakerKey::Connection(c) => config.provider(config.connection(c).provider).auth,
    }
}

/// `hasPerModelQuota` (A §4.5): whether a provider's limits are per model, so a model's
/// failure locks that model rather than cooling the whole connection. Resolved at load
/// from the provider's kind (plus local/self-hosted providers and the mock).
pub fn per_model_quota(config: &Config, provider: ProviderId) -> bool {
    config.provider(provider).quirks.per_model_quota
}

/// Drops expired lockout replicas (removal markers are kept at least one lockout sweep).
pub fn sweep_replicas(shard: &Shard) {
    let every = (SWEEP_INTERVAL_MS / HOUSEKEEPING_MS).max(1);
    if shard.housekeeping_ticks().is_multiple_of(every) {
        shard.state().views.borrow_mut().lockouts.sweep(shard.now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::owners::health::views::Views;
    use crate::resilience::breaker::{BreakerState, Failure, ProbeTicket};
    use crate::shard::Msg;

    fn at(ms: u64) -> Now {
        Now {
            mono_ns: ms * 1_000_000,
            wall_ms: 1_700_000_000_000 + ms,
        }
    }

    fn config(extra: &str) -> Config {
        let toml = format!(
            "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             [[connections]]\nid = \"c\"\nprovider = \"p\"\n\
             [resilience.provider_breaker.apikey]\nfailure_threshold = 1\nreset_timeout_ms = 1000\n{extra}"
        );
        crate::config::load_str(&toml, &|_| None).unwrap().config
    }

    fn report(ended: ProviderEnded, probe: Option<ProbeTicket>, combo: bool) -> ProviderReport {
        ProviderReport {
            provider: ProviderId(0),
            ended,
            probe,
            combo,
        }
    }

    #[test]
    fn a_provider_probe_is_settled_by_how_its_attempt_ended() {
        let config = config("");
        let views = Views::default();
        let key = BreakerKey::Provider(ProviderId(0));
        for (failure, after) in [
            (Failure::Status(503), BreakerState::Open),
            (Failure::Timeout, BreakerState::Open),
            (Failure::Status(400), BreakerState::Closed),
        ] {
            let mut h = Health::new(&config);
            let mut cx = Cx::detached(&config, &views, at(0), 1);
            let network = ProviderEnded::Failed(Failure::ConnectFailed);
            h.provider_result(&mut cx, &report(network, None, false));
            assert_eq!(
                h.breakers.get(key).unwrap().state(at(0)),
                BreakerState::Open
            );
            let Admission::Probe { ticket, .. } = h.breakers.admit(at(1_000), key) else {
                panic!("a probe after the reset timeout");
            };
            let mut cx = Cx::detached(&config, &views, at(1_100), 1);
            let failed = ProviderEnded::Failed(failure);
            h.provider_result(&mut cx, &report(failed, Some(ticket), false));
            let b = h.breakers.get(key).unwrap();
            assert_eq!(b.state(at(1_100)), after, "{failure:?}");
            // A non-probe failure that is not a network error never counts here.
            if after == BreakerState::Closed {
                let failed = ProviderEnded::Failed(Failure::Status(503));
                h.provider_result(&mut cx, &report(failed, None, false));
                assert_eq!(h.breakers.get(key).unwrap().failure_count(), 0);
            }
        }
    }

    #[test]
    fn combo_failures_feed_the_tracker_and_a_success_clears_it() {
        let config = config(
            "[resilience.provider_cooldown]\nenabled = true\n\
             [resilience.provider_cooldown.apikey]\nfailure_threshold = 2\n",
        );
        let views = Views::default();
        let mut h = Health::new(&config);
        let track = TrackerKey::Provider(ProviderId(0));
        let failed = ProviderEnded::Failed(Failure::Status(503));
        let mut cx = Cx::detached(&config, &views, at(0), 1);
        // A direct request's failure is not recorded; a 400 of a combo neither.
        h.provider_result(&mut cx, &report(failed, None, false));
        let bad = ProviderEnded::Failed(Failure::Status(400));
        h.provider_result(&mut cx, &report(bad, None, true));
        assert_eq!(h.tracker.failure_count(track), 0);
        assert!(cx.take().is_empty());
        h.provider_result(&mut cx, &report(failed, None, true));
        h.provider_result(&mut cx, &report(failed, None, true));
        assert!(h.tracker.check(at(0), track).is_cooling());
        let views_sent: Vec<TrackerView> = cx
            .take()
            .into_iter()
            .filter_map(|(_, m)| match m {
                Msg::View(View::Tracker { view, .. }) => Some(view),
                _ => None,
            })
            .collect();
        assert_eq!(views_sent.len(), 2);
        assert_eq!(
            views_sent[0].until_mono_ms, 0,
            "one failure: below the threshold"
        );
        assert!(views_sent[1].until_mono_ms > 0);
        assert!(views_sent[0].epoch < views_sent[1].epoch);
        h.provider_result(&mut cx, &report(ProviderEnded::Success, None, false));
        assert_eq!(h.tracker.failure_count(track), 0);
        assert!(!h.tracker.check(at(0), track).is_cooling());
    }

    #[test]
    fn restore_adopts_only_owned_keys_and_deltas_are_bounded() {
        use crate::resilience::connection::{ConnectionState, TestStatus};
        use crate::snapshot::state::Records;
        let mut toml = String::from(
            "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n",
        );
        for i in 0..40 {
            toml.push_str(&format!(
                "[[connections]]\nid = \"c{i}\"\nprovider = \"p\"\n"
            ));
        }
        let config = crate::config::load_str(&toml, &|_| None).unwrap().config;
        let mut records = Records::default();
        for i in 0..40 {
            records.connections.insert(
                ConnectionId(i),
                ConnectionState {
                    test_status: TestStatus::Banned,
                    ..ConnectionState::default()
                },
            );
        }
        let views = Views::default();
        let shards = 3;
        let mut adopted = 0;
        for me in 0..shards {
            let mut h = Health::new(&config);
            let mut cx = Cx::detached(&config, &views, at(0), shards);
            h.restore(&mut cx, &records, &|owner| owner == me);
            let owned: Vec<ConnectionId> = (0..40)
                .map(ConnectionId)
                .filter(|c| owner_of(c, shards) == me)
                .collect();
            // Only the owned records are in this shard's table, and each one is a view.
            for i in 0..40 {
                let banned = h.connections.state(ConnectionId(i)).test_status == TestStatus::Banned;
                assert_eq!(banned, owned.contains(&ConnectionId(i)));
            }
            assert_eq!(cx.take().len(), owned.len());
            // The adopted keys are re-reported, in bounded steps.
            let mut reported = 0;
            while h.snapshot_dirty() {
                let d = h.take_delta(at(0), 5);
                assert!(d.len() <= 5);
                reported += d.connections.len();
            }
            assert_eq!(reported, owned.len());
            adopted += owned.len();
        }
        assert_eq!(adopted, 40, "every key has exactly one owner");
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

    mod egress {
        use super::*;
        use crate::config::ConnectionId;
        use crate::owners::health::protocol::LastError;
        use crate::owners::{Fact as AnyFact, Reply as AnyReply};
        use crate::resilience::Reason;
        use crate::shard::call::global_id;
        use crate::shard::{Dest, Msg};

        const TOML: &str = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
            [[connections]]\nid = \"a1\"\nprovider = \"p\"\negress = \"x\"\n\
            [[connections]]\nid = \"a2\"\nprovider = \"p\"\negress = \"x\"\n\
            [[connections]]\nid = \"b1\"\nprovider = \"p\"\negress = \"y\"\n";

        fn rate_limited() -> Outcome {
            let mut decision = FallbackDecision::new(true, 20_000, Reason::RateLimitExceeded);
            decision.used_upstream_retry_hint = true;
            Outcome {
                provider: ProviderId(0),
                connection: ConnectionId(0),
                model: "m".to_owned(),
                ended: Ended::Failed(Box::new(Verdict {
                    status: 429,
                    decision,
                    breaker: Failure::Status(429),
                    error_type: None,
                    credits_signal: false,
                    last_error: LastError::new("rate limited"),
                })),
                probe: None,
                combo: None,
            }
        }

        /// The flake of `resilience_lockout::one_429_cools_every_connection_behind_the_same_egress`:
        /// the failing connection's owner only told the sibling's owner, so the asker could
        /// route its retry to the sibling before that owner's view reached it. The answer now
        /// lists the siblings, and the sibling's owner answers the asker's call only after
        /// its view is out (in ring order ahead of the answer).
        #[test]
        fn a_failure_names_the_siblings_it_cooled_and_their_owner_answers_after_the_view() {
            let config = crate::config::load_str(TOML, &|_| None).unwrap().config;
            let views = Views::default();
            let now = at(1_000);
            let mut owner = Health::new(&config);
            let mut cx = Cx::detached(&config, &views, now, 2);
            owner.call(
                &mut cx,
                global_id(1, 7),
                Request::Outcome(Box::new(rate_limited())),
            );
            let out = cx.take();
            let told: Vec<EgressCooled> = out
                .iter()
                .filter_map(|(_, m)| match m {
                    Msg::Fact(AnyFact::Health(Fact::EgressCool {
                        connection,
                        until_ms,
                        reason,
                    })) => Some(EgressCooled {
                        connection: *connection,
                        until_ms: *until_ms,
                        reason: *reason,
                    }),
                    _ => None,
                })
                .collect();
            assert_eq!(told.len(), 1, "a2 only");
            assert_eq!(told[0].connection, ConnectionId(1));
            let answered: Vec<&Vec<EgressCooled>> = out
                .iter()
                .filter_map(|(d, m)| match (d, m) {
                    (
                        Dest::Shard(1),
                        Msg::Reply {
                            reply: AnyReply::Health(Reply::Applied { egress }),
                            ..
                        },
                    ) => Some(egress),
                    _ => None,
                })
                .collect();
            assert_eq!(answered, vec![&told], "the answer lists what was told");

            // The sibling's owner, asked by the asker: the view, then the answer.
            let mut sibling_owner = Health::new(&config);
            let mut cx = Cx::detached(&config, &views, now, 2);
            sibling_owner.call(&mut cx, global_id(1, 8), Request::EgressCool(told[0]));
            let out = cx.take();
            let view_at = out.iter().position(|(d, m)| {
                matches!(
                    (d, m),
                    (Dest::All, Msg::View(View::Connection { connection, view }))
                        if *connection == ConnectionId(1)
                            && view.cooldown.is_some_and(|c| c.until_ms == told[0].until_ms)
                )
            });
            let reply_at = out.iter().position(|(d, m)| {
                matches!(
                    (d, m),
                    (
                        Dest::Shard(1),
                        Msg::Reply {
                            reply: AnyReply::Health(Reply::Applied { .. }),
                            ..
                        }
                    )
                )
            });
            assert!(
                view_at.is_some() && reply_at.is_some(),
                "{} messages",
                out.len()
            );
            assert!(view_at < reply_at, "the view goes ahead of the answer");
            // The told fact arriving after the call changes nothing more.
            let mut cx = Cx::detached(&config, &views, now, 2);
            sibling_owner.fact(
                &mut cx,
                Fact::EgressCool {
                    connection: told[0].connection,
                    until_ms: told[0].until_ms,
                    reason: told[0].reason,
                },
            );
            assert!(
                !cx.take().iter().any(|(_, m)| matches!(m, Msg::View(_))),
                "no second view"
            );
        }
    }

    mod combo {
        use super::*;
        use crate::clock::{Clock, ManualClock};
        use crate::config::ConnectionId;
        use crate::owners::health::protocol::{ComboAttempt, LastError};
        use crate::owners::health::views::Views;
        use crate::resilience::Reason;
        use crate::resilience::connection::ProviderErrorType;

        const TOML: &str = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                            [[connections]]\nid = \"c\"\nprovider = \"p\"\n\
                            [resilience.model_lockout]\nenabled = true\nbase_cooldown_ms = 60000\n";

        fn failed(status: u16, reason: Reason) -> Verdict {
            Verdict {
                status,
                decision: FallbackDecision::new(true, 3_000, reason),
                breaker: Failure::Status(status),
                error_type: None,
                credits_signal: false,
                last_error: LastError::new("failed"),
            }
        }

        fn outcome(v: Verdict, combo: Option<ComboAttempt>) -> Outcome {
            Outcome {
                provider: ProviderId(0),
                connection: ConnectionId(0),
                model: "a".to_owned(),
                ended: Ended::Failed(Box::new(v)),
                probe: None,
                combo,
            }
        }

        /// Applies one outcome; returns (connection cooling?, model locked?, breaker count).
        fn apply(o: &Outcome) -> (bool, bool, u32) {
            let config = crate::config::load_str(TOML, &|_| None).unwrap().config;
            let views = Views::default();
            let now = ManualClock::new(1_000_000).now();
            let mut health = Health::new(&config);
            let mut cx = Cx::detached(&config, &views, now, 2);
            health.fact(&mut cx, Fact::Outcome(Box::new(o.clone())));
            let cooling = !matches!(
                health.connections.view(ConnectionId(0)).routability(now),
                Routability::Routable
            );
            let locked = health.lockouts.is_locked(
                "p",
                crate::config::kinds::QuotaFamily::Model,
                Some(ConnectionId(0)),
                "a",
                now,
            );
            let count = health
                .breakers
                .get(BreakerKey::Connection(ConnectionId(0)))
                .map_or(0, |b| b.failure_count());
            (cooling, locked, count)
        }

        #[test]
        fn a_direct_transient_failure_cools_the_connection() {
            let v = failed(503, Reason::ServerError);
            assert!(v.is_transient());
            assert_eq!(apply(&outcome(v, None)), (true, false, 1));
        }

        #[test]
        fn a_combo_transient_failure_locks_the_model_and_keeps_the_connection() {
            let next_other = Some(ComboAttempt {
                next_same_provider: false,
            });
            assert_eq!(
                apply(&outcome(failed(503, Reason::ServerError), next_other)),
                (false, true, 1)
            );
            let next_same = Some(ComboAttempt {
                next_same_provider: true,
            });
            assert_eq!(
                apply(&outcome(failed(503, Reason::ServerError), next_same)),
                (false, true, 0),
                "not a breaker failure when the next target is the same provider"
            );
        }

        #[test]
        fn a_combo_failure_that_is_not_transient_still_cools_the_connection() {
            let mut v = failed(401, Reason::AuthError);
            v.error_type = Some(ProviderErrorType::Unauthorized);
            assert!(!v.is_transient());
            let combo = Some(ComboAttempt {
                next_same_provider: false,
            });
            let (cooling_or_terminal, _, _) = apply(&outcome(v, combo));
            assert!(cooling_or_terminal);
        }

        #[test]
        fn quota_and_credit_verdicts_are_not_transient() {
            let v = failed(429, Reason::RateLimitExceeded);
            assert!(v.is_transient());
            assert!(!failed(429, Reason::QuotaExhausted).is_transient());
            assert!(!failed(400, Reason::Unknown).is_transient());
            let mut v = failed(503, Reason::ServerError);
            v.credits_signal = true;
            assert!(!v.is_transient());
            let mut v = failed(503, Reason::ServerError);
            v.decision.rule_scope = Some(crate::resilience::RuleScope::Provider);
            assert!(!v.is_transient());
            v.decision.rule_scope = Some(crate::resilience::RuleScope::Model);
            assert!(v.is_transient());
            let mut v = failed(502, Reason::NetworkError);
            v.breaker = Failure::ConnectFailed;
            assert!(!v.is_transient(), "a down host is down for every model");
            let mut v = failed(504, Reason::ServerError);
            v.breaker = Failure::Timeout;
            assert!(v.is_transient());
        }
    }
}
