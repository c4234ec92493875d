//! A shard: one thread, one monoio runtime, and everything that thread owns — its
//! upstream pool, DNS cache, counters and drain state. Tasks on the shard share it through
//! an `Rc`; no borrow of its cells is held across an `.await`.

pub mod flow;
pub mod metrics;
pub mod owned;
pub mod probe;
pub mod views;

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::clock::{Clock, MonoClock, Now};
use crate::config::{Config, ConnectionId};
use crate::net::dns::DnsCache;
use crate::net::tls::TlsConfigs;
use crate::net::upstream::{Pool, PoolKey};
use crate::proxy::auth::KeyIndex;
use crate::routing::resolve::RouteTable;
use metrics::ShardMetrics;
use owned::{Dest, Owned};
use probe::{Answer, ProbeWaiters};
use views::Views;

use crate::runtime::mesh::MeshSender;
use crate::runtime::msg::Msg;
use crate::runtime::outbox::{Outbox, Sent};

/// Read-only facts every shard shares, built once at start-up.
#[derive(Debug)]
pub struct Shared {
    pub config: Arc<Config>,
    pub routes: RouteTable,
    pub tls: TlsConfigs,
    pub keys: KeyIndex,
    /// Every shard's counters, for `/metrics`.
    pub metrics: Vec<Arc<ShardMetrics>>,
    pub shards: usize,
    pub driver: &'static str,
    /// The mesh's drop counters (`None` with one shard).
    pub mesh_stats: Option<Arc<crate::runtime::mesh::MeshStats>>,
}

pub struct Shard {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub clock: MonoClock,
    pub pool: Pool,
    pub dns: DnsCache,
    pub metrics: Arc<ShardMetrics>,
    /// Set once shutdown begins: finish in-flight work, take no new requests.
    pub draining: Cell<bool>,
    /// Requests between a complete head and the end of their response.
    pub in_flight: Cell<usize>,
    /// Reusable buffer for the JSON peek.
    pub scratch: RefCell<Vec<u8>>,
    /// Sequence for generated ids (mock replies).
    pub seq: Cell<u64>,
    /// Pool key of each provider's API root (`None` for in-process providers).
    pool_keys: Vec<Option<PoolKey>>,
    /// State this shard owns (breakers, connection state, lockouts of its keys).
    pub owned: RefCell<Owned>,
    /// Replicas of every owner's views: what selection reads.
    pub views: RefCell<Views>,
    /// Sends to other shards (`None` with one shard).
    pub mesh: Option<MeshSender<Msg>>,
    /// Point-to-point messages waiting for room in a full ring (`send_reliable`).
    outbox: RefCell<Outbox<Msg>>,
    /// Whether the outbox's retry task runs.
    outbox_retrying: Cell<bool>,
    /// Probe requests and failure acks waiting for their owner's answer.
    pub probes: ProbeWaiters,
    housekeeping_ticks: Cell<u64>,
    /// This shard's own `Rc`, for timers that outlive a call.
    pub me: RefCell<std::rc::Weak<Shard>>,
    /// Gate waiters of this shard by local id → connection (to return a late grant).
    pub gate_waiters: RefCell<std::collections::HashMap<u64, ConnectionId>>,
    /// Queue waiters of this shard by local id → connection (to return a late grant).
    pub queue_waiters: RefCell<std::collections::HashMap<u64, ConnectionId>>,
}

/// How often the outbox retries messages waiting for a full ring.
pub const OUTBOX_RETRY_MS: u64 = 1;

/// Period of [`Shard::housekeeping`] (the fleet's sweep task).
pub const HOUSEKEEPING_MS: u64 = 5_000;

impl Shard {
    pub fn new(id: usize, shared: Arc<Shared>, mesh: Option<MeshSender<Msg>>) -> Self {
        let cfg = &shared.config.server;
        let pool = Pool::new(cfg.pool_max_idle_per_host, cfg.pool_idle_timeout_ms);
        let metrics = shared.metrics.get(id).cloned().unwrap_or_default();
        let pool_keys = shared
            .config
            .providers
            .iter()
            .map(|p| {
                p.base_url.as_ref().map(|b| PoolKey {
                    scheme: b.scheme,
                    host: std::rc::Rc::from(b.host.as_str()),
                    port: b.port,
                    tls_id: p.id.0,
                })
            })
            .collect();
        let owned = RefCell::new(Owned::new(&shared.config));
        Self {
            owned,
            views: RefCell::new(Views::default()),
            mesh,
            outbox: RefCell::new(Outbox::default()),
            outbox_retrying: Cell::new(false),
            probes: ProbeWaiters::default(),
            housekeeping_ticks: Cell::new(0),
            me: RefCell::new(std::rc::Weak::new()),
            gate_waiters: RefCell::new(std::collections::HashMap::new()),
            queue_waiters: RefCell::new(std::collections::HashMap::new()),
            pool_keys,
            id,
            clock: MonoClock,
            pool,
            dns: DnsCache::default(),
            metrics,
            draining: Cell::new(false),
            in_flight: Cell::new(0),
            scratch: RefCell::new(Vec::with_capacity(16 * 1024)),
            seq: Cell::new(0),
            shared,
        }
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    pub fn now(&self) -> Now {
        self.clock.now()
    }

    pub fn pool_key(&self, provider: crate::config::ProviderId) -> Option<PoolKey> {
        self.pool_keys
            .get(usize::from(provider.0))
            .cloned()
            .flatten()
    }

    /// The shard that owns `key`.
    pub fn owner<K: crate::runtime::owner::OwnerKey + ?Sized>(&self, key: &K) -> usize {
        crate::runtime::owner::owner_of(key, self.shared.shards)
    }

    /// Sends `msg` to shard `to` (handled here when `to` is this shard). A full ring hands
    /// the message back: `Err(msg)` (the mesh counts the drop).
    pub fn send(&self, to: usize, msg: Msg) -> Result<(), Msg> {
        if to == self.id {
            self.handle(self.id, msg);
            return Ok(());
        }
        match &self.mesh {
            Some(m) => m.send(to, msg),
            None => Err(msg),
        }
    }

    /// Sends a point-to-point message (requests, grants, denials, replies, releases,
    /// cancels, facts): a full ring keeps it in the outbox, retried every millisecond in
    /// order until it goes. Only a closed peer (shutdown) drops it: `false`.
    pub fn send_reliable(&self, to: usize, msg: Msg) -> bool {
        if to == self.id {
            self.handle(self.id, msg);
            return true;
        }
        let Some(mesh) = &self.mesh else {
            return false;
        };
        let sent = self
            .outbox
            .borrow_mut()
            .send(to, msg, &mut |to, m| mesh.try_send(to, m));
        let taken = match sent {
            Sent::Delivered => true,
            Sent::Waiting => {
                self.retry_outbox();
                true
            }
            Sent::Dropped(reason) => {
                tracing::warn!(
                    shard = self.id,
                    to,
                    reason = reason.as_str(),
                    "message dropped"
                );
                false
            }
        };
        self.metrics
            .mesh_outbox
            .store(self.outbox.borrow().len() as u64, Ordering::Relaxed);
        taken
    }

    /// Starts the outbox's retry task unless it runs.
    fn retry_outbox(&self) {
        if self.outbox_retrying.get() {
            return;
        }
        let Some(me) = self.me.borrow().upgrade() else {
            return;
        };
        self.outbox_retrying.set(true);
        monoio::spawn(async move {
            loop {
                monoio::time::sleep(Duration::from_millis(OUTBOX_RETRY_MS)).await;
                let Some(mesh) = &me.mesh else {
                    break;
                };
                let mut outbox = me.outbox.borrow_mut();
                let dropped = outbox.flush(&mut |to, m| mesh.try_send(to, m));
                if dropped > 0 {
                    tracing::warn!(shard = me.id, dropped, "messages to closed shards dropped");
                }
                me.metrics
                    .mesh_outbox
                    .store(outbox.len() as u64, Ordering::Relaxed);
                if outbox.is_empty() {
                    break;
                }
            }
            me.outbox_retrying.set(false);
        });
    }

    /// Sends what an owner produced: views to every shard (applied here too), the rest to
    /// their destination (reliably). Dropped view broadcasts only delay convergence (counted
    /// by the mesh; re-sent by anti-entropy).
    pub fn dispatch(&self, out: Vec<(Dest, Msg)>) {
        for (dest, msg) in out {
            match dest {
                Dest::SelfAt(at_ns) => self.later(at_ns, msg),
                Dest::Shard(to) => {
                    self.send_reliable(to, msg);
                }
                Dest::All => {
                    for to in 0..self.shared.shards {
                        if to != self.id {
                            let _ = self.send(to, msg.clone());
                        }
                    }
                    self.views.borrow_mut().apply(&msg);
                }
            }
        }
    }

    /// Handles `msg` on this shard at monotonic instant `at_ns` (owner timers).
    fn later(&self, at_ns: u64, msg: Msg) {
        let Some(me) = self.me.borrow().upgrade() else {
            return;
        };
        let wait = std::time::Duration::from_nanos(at_ns.saturating_sub(self.now().mono_ns));
        monoio::spawn(async move {
            monoio::time::sleep(wait).await;
            me.handle(me.id, msg);
        });
    }

    /// Handles one message from shard `from`: views are applied, replies complete their
    /// waiter, everything else goes to the owner tables.
    pub fn handle(&self, from: usize, msg: Msg) {
        match msg {
            Msg::BreakerView { .. } | Msg::ConnectionView { .. } | Msg::Lockout(_) => {
                self.views.borrow_mut().apply(&msg);
            }
            Msg::ProbeReply {
                id,
                ticket,
                retry_after_ms,
            } => {
                self.probes
                    .complete(id, Answer::Probe(ticket, retry_after_ms));
            }
            Msg::Ack { id } => {
                self.probes.complete(id, Answer::Ack);
            }
            Msg::GateGrant { id, serial } => {
                if !self.probes.complete(local_id(id), Answer::Gate(Ok(serial))) {
                    // The waiter gave up before the grant arrived: hand the permit back.
                    // It goes back to the shard that granted it (the gate home).
                    if let Some(connection) = self.gate_waiter_connection(id) {
                        self.send_reliable(from, Msg::GateRelease { connection, serial });
                    }
                }
            }
            Msg::GateDenied { id, error } => {
                if !self.probes.complete(local_id(id), Answer::Gate(Err(error))) {
                    // The answer to a cancel: the waiter is over.
                    self.gate_waiters.borrow_mut().remove(&local_id(id));
                }
            }
            Msg::QueueGrant { id, start_at_ns } => {
                if !self
                    .probes
                    .complete(local_id(id), Answer::Queue(Ok(start_at_ns)))
                {
                    // The waiter gave up before the grant arrived: give the slot back.
                    if let Some(connection) = self.queue_waiters.borrow_mut().remove(&local_id(id))
                    {
                        let msg = Msg::QueueFinish {
                            connection,
                            id,
                            answered: None,
                        };
                        self.send_reliable(from, msg);
                    }
                }
            }
            Msg::QueueDenied { id, error } => {
                if !self
                    .probes
                    .complete(local_id(id), Answer::Queue(Err(error)))
                {
                    // The answer to a cancel: the waiter is over.
                    self.queue_waiters.borrow_mut().remove(&local_id(id));
                }
            }
            Msg::QueueRetry { id, at_ns } => {
                self.probes
                    .complete(local_id(id), Answer::QueueRetry(at_ns));
            }
            Msg::QsPicked { id, pick } => {
                let ticket = pick.ticket;
                if !self.probes.complete(local_id(id), Answer::QuotaShare(pick))
                    && let Some(serial) = ticket
                {
                    // The asker gave up: the dispatch never happens, so it is not in flight.
                    self.send_reliable(from, Msg::QsRelease { serial });
                }
            }
            Msg::Outcome(..)
            | Msg::ProviderResult { .. }
            | Msg::EgressCool { .. }
            | Msg::AutoDecay { .. }
            | Msg::ProbeRequest { .. }
            | Msg::ReleaseProbe { .. }
            | Msg::GateAcquire { .. }
            | Msg::GateRelease { .. }
            | Msg::GateCancel { .. }
            | Msg::GateTick
            | Msg::GateBlock { .. }
            | Msg::QueueAcquire { .. }
            | Msg::QsSelect { .. }
            | Msg::QsRelease { .. }
            | Msg::QsSlotAcquire { .. }
            | Msg::QueueFinish { .. }
            | Msg::QueueCancel { .. }
            | Msg::QueueTick { .. } => {
                let now = self.now();
                let out = {
                    let views = self.views.borrow();
                    let mut owned = self.owned.borrow_mut();
                    let out =
                        owned.apply(self.config(), &views, self.shared.shards, from, msg, now);
                    self.metrics.publish_flow(&owned.flow.gauges());
                    out
                };
                self.dispatch(out);
            }
        }
    }

    /// The connection a (forgotten) gate waiter asked for, if this shard still knows it.
    fn gate_waiter_connection(&self, id: u64) -> Option<ConnectionId> {
        self.gate_waiters.borrow_mut().remove(&local_id(id))
    }

    /// Periodic upkeep: owners re-send the views of keys that are not in their default
    /// state to every other shard (anti-entropy: a broadcast dropped by a full ring, or
    /// missed by a shard, converges here rather than at the key's next transition), and
    /// expired lockout replicas are dropped.
    pub fn housekeeping(&self) {
        let now = self.now();
        let mut out: Vec<Msg> = Vec::new();
        {
            let owned = self.owned.borrow();
            for (key, breaker) in owned.breakers.iter() {
                if !breaker.state(now).is_closed() || breaker.failure_count() > 0 {
                    out.push(Msg::BreakerView {
                        key,
                        view: breaker.view(now),
                    });
                }
            }
            for (connection, view) in owned.connections.views() {
                if view.epoch > 0 {
                    out.push(Msg::ConnectionView { connection, view });
                }
            }
        }
        for msg in out {
            for to in 0..self.shared.shards {
                if to != self.id {
                    let _ = self.send(to, msg.clone());
                }
            }
        }
        let queue_out = self.owned.borrow_mut().flow.housekeeping(now);
        self.dispatch(queue_out);
        let tick = self.housekeeping_ticks.get().wrapping_add(1);
        self.housekeeping_ticks.set(tick);
        // Lockout replicas keep removal markers at least one lockout sweep interval.
        let every = (crate::resilience::lockout::SWEEP_INTERVAL_MS / HOUSEKEEPING_MS).max(1);
        if tick.is_multiple_of(every) {
            self.views.borrow_mut().lockouts.sweep(now);
        }
    }

    pub fn next_seq(&self) -> u64 {
        let n = self.seq.get().wrapping_add(1);
        self.seq.set(n);
        (n << 8) | (self.id as u64 & 0xff)
    }
}

/// Gate waiter ids are unique across shards: the asking shard in the top 16 bits.
pub fn global_waiter_id(shard: usize, local: u64) -> u64 {
    ((shard as u64 & 0xffff) << 48) | (local & 0xffff_ffff_ffff)
}

/// The asking shard of a global waiter id.
pub fn waiter_shard(id: u64) -> usize {
    (id >> 48) as usize
}

fn local_id(id: u64) -> u64 {
    id & 0xffff_ffff_ffff
}

/// Counts a request as in flight until dropped (covers every exit path).
pub struct InFlight<'a> {
    shard: &'a Shard,
}

impl<'a> InFlight<'a> {
    pub fn enter(shard: &'a Shard) -> Self {
        shard.in_flight.set(shard.in_flight.get() + 1);
        metrics::bump(&shard.metrics.in_flight);
        Self { shard }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shard
            .in_flight
            .set(self.shard.in_flight.get().saturating_sub(1));
        metrics::drop_one(&self.shard.metrics.in_flight);
    }
}
