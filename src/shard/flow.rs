//! The flow-control state an owner shard holds (spec B §1, §2): the composite gates of the
//! connections whose gate home it is, with their permits, timer and blocks; the request
//! queues and provider sliding windows of the connections it owns; quota-share selection
//! (on the quota-share home). One method per message; like the rest of the owner tables it
//! is pure and synchronous over `now`, and returns what to send through `out`.

use std::collections::HashMap;

use crate::clock::Now;
use crate::config::{Config, ConnectionId};
use crate::flow::admission::{
    account_capacity, effective_max_wait_ms, gate_requirements, model_capacity, queue_of, window_of,
};
use crate::flow::gates::{
    Acquire, AcquireRequest, GateError, GateKey, GateTable, Permit, QueueLimit, Wakeups,
};
use crate::flow::queue::{
    Grant, Limiter, LimiterTable, QueueError, Schedule, SlidingWindow, WindowDecision,
    check_queue_admission, observe_response,
};
use crate::flow::quota_share::{
    INFLIGHT_LEASE_MS, InflightTicket, NoBuckets, QS_QUEUE_DEPTH, QsTarget, QuotaShareSelector,
    SlotAcquire, SlotRequest, acquire_slot,
};
use crate::resilience::OwnedHeaders;
use crate::runtime::msg::{AttemptResult, Msg, Outcome, QsCandidate, QsPick, SuccessAnswer};

use super::owned::Dest;
use super::waiter_shard;

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

/// The flow-control tables of one owner shard.
#[derive(Debug, Default)]
pub struct Flow {
    /// Concurrency gates of the connections whose gate home this shard is.
    pub gates: GateTable,
    /// Permits granted and not yet released, by serial.
    pub permits: HashMap<u64, Permit>,
    /// When the gate timer is armed for (monotonic ns).
    pub gate_timer: Option<u64>,
    /// Request queues (per-connection limiters) of the connections this shard owns.
    pub limiters: LimiterTable,
    /// Queue waiters (queued or holding a slot) → their limiter key.
    pub queue_waiters: HashMap<u64, String>,
    /// Provider sliding windows (B §1.2b) by `<provider>:<connection>`.
    pub windows: HashMap<String, SlidingWindow>,
    /// Quota-share selection state (on the quota-share home only).
    pub quota_share: QuotaShareSelector,
    /// Outstanding in-flight tickets by serial, with when they were taken.
    pub qs_tickets: HashMap<u64, (InflightTicket, u64)>,
}

impl Flow {
    /// `GateAcquire`: every gate of the composite gate the attempt needs, all or nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn gate_acquire(
        &mut self,
        config: &Config,
        id: u64,
        connection: ConnectionId,
        model: &str,
        deadline_ns: Option<u64>,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        self.tick_gates(now, out);
        let request = AcquireRequest {
            id,
            gates: gate_requirements(config, connection, model),
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
            Acquire::Queued => self.arm_gates(out),
            Acquire::Rejected(error) => {
                out.push((Dest::Shard(waiter_shard(id)), Msg::GateDenied { id, error }));
            }
        }
    }

    /// `GateRelease`: the permit's capacity back; waiters that now fit are granted.
    pub fn gate_release(&mut self, serial: u64, now: Now, out: &mut Vec<(Dest, Msg)>) {
        if let Some(permit) = self.permits.remove(&serial) {
            let wakeups = self.gates.release(permit, now);
            self.wake(wakeups, out);
        }
    }

    /// `GateCancel`: the asker gave up.
    pub fn gate_cancel(&mut self, id: u64, out: &mut Vec<(Dest, Msg)>) {
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

    /// `GateTick`: the gate timer fired.
    pub fn gate_tick(&mut self, now: Now, out: &mut Vec<(Dest, Msg)>) {
        self.gate_timer = None;
        self.tick_gates(now, out);
        self.arm_gates(out);
    }

    /// `GateBlock`: the upstream refused with a retry hint; block the connection's gate.
    pub fn gate_block(
        &mut self,
        config: &Config,
        connection: ConnectionId,
        model: String,
        until_ns: u64,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        let key = if account_capacity(config, connection).is_some() {
            Some(GateKey::Account(connection))
        } else {
            model_capacity(config, connection, &model)
                .map(|_| GateKey::Model(connection, model.into_boxed_str()))
        };
        if let Some(key) = key {
            self.gates.mark_blocked(key, until_ns, now);
            self.arm_gates(out);
        }
    }

    /// `QsSlotAcquire`: the connection's `qsconn` slot (fail open: any refusal is "no slot").
    pub fn qs_slot_acquire(
        &mut self,
        config: &Config,
        id: u64,
        connection: ConnectionId,
        deadline_ns: Option<u64>,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        self.tick_gates(now, out);
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
            SlotAcquire::Queued => self.arm_gates(out),
            SlotAcquire::NoSlot => out.push((
                to,
                Msg::GateDenied {
                    id,
                    error: GateError::QueueFull,
                },
            )),
        }
    }

    /// `QsSelect`: order a quota-share combo's candidates and count the pick in flight.
    pub fn qs_select(
        &mut self,
        config: &Config,
        id: u64,
        combo: &str,
        candidates: &[QsCandidate],
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        let pick = self.quota_share_select(config, combo, candidates, now);
        out.push((
            Dest::Shard(waiter_shard(id)),
            Msg::QsPicked {
                id,
                pick: Box::new(pick),
            },
        ));
    }

    /// `QsRelease`: the dispatch holding the ticket is over.
    pub fn qs_release(&mut self, serial: u64) {
        if let Some((ticket, _)) = self.qs_tickets.remove(&serial) {
            self.quota_share.release(ticket);
        }
    }

    /// `QueueAcquire`: the provider's window first, then the connection's queue.
    #[allow(clippy::too_many_arguments)]
    pub fn queue_acquire(
        &mut self,
        config: &Config,
        id: u64,
        connection: ConnectionId,
        model: &str,
        waiting_since_ns: u64,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        if self.window_admits(config, id, connection, waiting_since_ns, now, out) {
            self.enqueue(config, id, connection, model, now, out);
        }
    }

    /// `QueueFinish`: the slot is back (with what a successful answer taught).
    pub fn queue_finish(
        &mut self,
        id: u64,
        answered: Option<Box<SuccessAnswer>>,
        now: Now,
        out: &mut Vec<(Dest, Msg)>,
    ) {
        if let Some(key) = self.queue_waiters.remove(&id) {
            // A success teaches the queue too (rate-limit headers; a 2xx clears a
            // remembered 429 cooldown). Errors arrive as outcomes.
            if let Some(a) = answered {
                let h = OwnedHeaders(&a.headers);
                observe_response(&mut self.limiters, &key, a.status, &h, "", now);
            }
            if let Some(l) = self.limiters.get_mut(&key) {
                let grants = l.on_finish(id, now);
                self.queue_grants(&key, grants, now, out);
            }
        }
    }

    /// `QueueCancel`: the asker gave up (queued or holding a slot).
    pub fn queue_cancel(&mut self, id: u64, now: Now, out: &mut Vec<(Dest, Msg)>) {
        if let Some(key) = self.queue_waiters.remove(&id)
            && let Some(l) = self.limiters.get_mut(&key)
        {
            let max_wait_ms = l.settings().max_wait_ms;
            let (_, grants) = l.cancel(id, now);
            self.queue_grants(&key, grants, now, out);
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

    /// An upstream answer on an owned connection teaches its queue (429 cooldowns,
    /// rate-limit headers, caps and retry hints in bodies).
    pub fn learn_from_outcome(&mut self, config: &Config, o: &Outcome, now: Now) {
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
    fn enqueue(
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
    pub fn queue_tick(&mut self, key: &str, now: Now, out: &mut Vec<(Dest, Msg)>) {
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
    pub fn housekeeping(&mut self, now: Now) -> Vec<(Dest, Msg)> {
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
    pub fn gauges(&self) -> FlowGauges {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::owned::Owned;
    use crate::shard::views::Views;

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
                id: crate::shard::global_waiter_id(1, id),
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
        assert!(owned.flow.queue_waiters.is_empty(), "no queue was involved");
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
            id: crate::shard::global_waiter_id(1, id),
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
                assert_eq!(*id, crate::shard::global_waiter_id(1, 2));
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
        let id = |n: u64| crate::shard::global_waiter_id(1, n);
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
}
