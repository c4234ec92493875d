//! A shard: one thread, one monoio runtime, and everything that thread owns — its upstream
//! pool, DNS cache, counters, drain state, its message pump and its outstanding owner calls.
//! Tasks on the shard share it through an `Rc`; no borrow of its cells is held across an
//! `.await`.
//!
//! The shard is generic over the application it runs ([`App`]): the owner-held mechanisms
//! and their messages live in `owners`, which instantiates `Shard<Tidegate>`. This module
//! knows the envelope every message travels in ([`Msg`]) and how it moves — views to every
//! shard, facts and calls to an owner, replies back to the asker — but no mechanism.
//!
//! Every message a shard handles goes through its pump, the ones it sends to itself
//! included: a self-send is queued, never handled inside the sender's call (no re-entrancy,
//! one order for every owner).

pub mod call;
pub mod metrics;
pub mod settings;
pub mod waiters;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};
use std::time::Duration;

use crate::auth::{Caller, KeyCache, KeyIndex};
use crate::clock::{Clock, MonoClock, Now};
use crate::config::{Config, ProviderId};
use crate::http1::RequestHead;
use crate::mesh::outbox::{Outbox, Sent};
use crate::mesh::placement::{OwnerKey, owner_of};
use crate::mesh::ring::{MeshReceiver, MeshSender, MeshStats};
use crate::mesh::safe::MeshSafe;
use crate::net::dns::DnsCache;
use crate::net::tls::TlsConfigs;
use crate::net::upstream::{Pool, PoolKey};
use crate::routing::resolve::RouteTable;
use metrics::ShardMetrics;
use waiters::{CallId, Calls};

/// An application a shard runs: its message types and its per-shard state, and how the
/// pump hands it what arrives.
pub trait App: Sized + 'static {
    /// Owner → every shard: replicas of owner state ("routable, or not until T").
    /// Every message type is [`MeshSafe`]: ids, numbers, names and bounded text only.
    type View: MeshSafe + Clone + Send + 'static;
    /// One-way messages to an owner.
    type Fact: MeshSafe + Send + 'static;
    type Request: MeshSafe + Send + 'static;
    type Reply: MeshSafe + Send + 'static;
    /// Names a protocol in a cancel (and in the warning of a call left unanswered).
    type Kind: Copy + Send + std::fmt::Debug + 'static;
    /// The shard's owner tables and view replicas.
    type State;
    /// What the application derives from one configuration generation, built with it (and
    /// so again at each reload or runtime-settings change): tables a request reads instead
    /// of resolving them from the configuration each time ([`Req::derived`]).
    type Derived;

    fn state(config: &Config) -> Self::State;
    /// The tables of `config`, for a new [`Generation`].
    fn derive(config: &Config) -> Self::Derived;
    /// A view from an owner (idempotent: newer epochs win).
    fn apply_view(shard: &Shard<Self>, view: &Self::View);
    /// A fact, call or cancel for the owner tables of this shard.
    fn serve(shard: &Shard<Self>, from: usize, msg: Msg<Self>);
    /// A reply whose asker gave up: hand back whatever it grants.
    fn late_reply(shard: &Shard<Self>, from: usize, id: CallId, reply: Self::Reply);
    /// Periodic upkeep (anti-entropy, sweeps), every [`HOUSEKEEPING_MS`].
    fn housekeeping(shard: &Shard<Self>);
    /// The shard's configuration changed (runtime settings or a reload; `shard.current()`
    /// already returns the new one): re-tune what was built from the old one.
    fn settings_changed(shard: &Shard<Self>);
}

/// The envelope every cross-shard (and self-) message travels in.
pub enum Msg<A: App> {
    View(A::View),
    Fact(A::Fact),
    Call {
        id: CallId,
        request: A::Request,
    },
    Reply {
        id: CallId,
        reply: A::Reply,
    },
    /// The asker of call `id` gave up.
    Cancel {
        id: CallId,
        kind: A::Kind,
    },
}

/// Where a message an owner produced goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    /// Every shard, this one included (views).
    All,
    Shard(usize),
    /// This shard, at a monotonic instant (owner timers).
    SelfAt(u64),
}

/// What an owner handler produced, to send once it returns.
pub type Out<A> = Vec<(Dest, Msg<A>)>;

/// Read-only facts every shard shares, built once at start-up.
#[derive(Debug)]
pub struct Shared {
    pub config: Arc<Config>,
    pub routes: RouteTable,
    pub tls: TlsConfigs,
    pub keys: KeyIndex,
    /// Every shard's counters, for `/metrics`.
    pub metrics: Vec<Arc<ShardMetrics>>,
    /// Every shard's labelled families for this configuration (a reload builds new ones
    /// that continue the old values; see `metrics::Counters::carried`).
    pub families: Vec<Arc<metrics::Families>>,
    pub shards: usize,
    pub driver: &'static str,
    /// The mesh's drop counters (`None` with one shard).
    pub mesh_stats: Option<Arc<MeshStats>>,
    /// The runtime settings every shard adopts (`PATCH /api/resilience`,
    /// `PATCH /api/providers/{id}`). One cell for the process: a reload hands it on and
    /// restarts it from the reloaded file.
    pub runtime: Arc<settings::SettingsCell>,
    /// When the process started (wall-clock ms), for uptime.
    pub started_wall_ms: u64,
    /// The snapshot writer's counters.
    pub snapshot: Arc<metrics::SnapshotMetrics>,
}

/// One configuration a shard serves with: the file's (as last reloaded) with the runtime
/// settings of one [`Shared::runtime`] generation in place. The shard holds the current one;
/// a reload or new runtime settings replace it at once. Each request holds the one it
/// started with ([`Req`]) until it ends, so a request runs on one configuration from start
/// to end while requests that start later run on the new one; a generation is freed when
/// the last request holding it ends.
pub struct Generation<A: App> {
    shared: Arc<Shared>,
    /// `shared.config` with the runtime settings of generation `settings` in place.
    config: Config,
    /// The [`Shared::runtime`] generation `config` was built with.
    settings: u64,
    /// Pool key of each provider's API root, by provider id (`None` for in-process
    /// providers).
    pool_keys: Vec<Option<PoolKey>>,
    /// The client keys recently presented on this shard under this generation: a new
    /// generation (reload, runtime settings) starts with none.
    key_cache: KeyCache,
    /// The application's tables of `config` ([`App::derive`]).
    derived: A::Derived,
}

impl<A: App> Generation<A> {
    fn new(shared: Arc<Shared>) -> Self {
        let mut pool_keys = vec![None; shared.config.ids.provider_bound()];
        for p in &shared.config.providers {
            if let Some(slot) = pool_keys.get_mut(usize::from(p.id.0)) {
                *slot = p.base_url.as_ref().map(|b| PoolKey {
                    scheme: b.scheme,
                    host: Rc::from(b.host.as_str()),
                    port: b.port,
                    tls_id: p.id.0,
                });
            }
        }
        let (settings, runtime) = shared.runtime.current();
        let config = runtime.apply_to(&shared.config);
        Self {
            derived: A::derive(&config),
            shared,
            config,
            settings,
            pool_keys,
            key_cache: KeyCache::default(),
        }
    }

    /// The configuration: the file's with the runtime settings in place.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The read-only facts built with the file (routes, TLS, keys, metric families).
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// The upstream pool key of `provider`'s API root (`None`: in-process or unknown).
    pub fn pool_key(&self, provider: ProviderId) -> Option<PoolKey> {
        self.pool_keys
            .get(usize::from(provider.0))
            .cloned()
            .flatten()
    }

    /// Shard `shard`'s labelled metric families for this configuration.
    pub fn families(&self, shard: usize) -> &metrics::Families {
        static EMPTY: std::sync::LazyLock<metrics::Families> =
            std::sync::LazyLock::new(metrics::Families::default);
        self.shared.families.get(shard).map_or(&EMPTY, |f| &**f)
    }
}

pub struct Shard<A: App> {
    id: usize,
    /// The shard count (fixed for the process).
    shards: usize,
    /// The configuration new work starts on (see [`Generation`]).
    current: RefCell<Rc<Generation<A>>>,
    clock: MonoClock,
    pool: Pool,
    dns: DnsCache,
    metrics: Arc<ShardMetrics>,
    /// Set once shutdown begins: finish in-flight work, take no new requests.
    draining: Cell<bool>,
    /// Requests between a complete head and the end of their response.
    in_flight: Cell<usize>,
    /// Set when the shutdown grace period is over: what is still in flight is cut.
    cut: Cell<bool>,
    /// Wakers of the requests waiting on [`Shard::cut_signal`] (a slot per waiting request).
    cut_waiters: RefCell<Slots>,
    /// Reusable buffer for the JSON peek.
    scratch: RefCell<Vec<u8>>,
    /// Sequence for generated ids (mock replies).
    seq: Cell<u64>,
    /// The application's owner tables and view replicas.
    state: A::State,
    /// Sends to other shards (`None` with one shard).
    mesh: Option<MeshSender<Msg<A>>>,
    /// Point-to-point messages waiting for room in a full ring (`send_reliable`).
    outbox: RefCell<Outbox<Msg<A>>>,
    /// Whether the outbox's retry task runs.
    outbox_retrying: Cell<bool>,
    /// Messages this shard sent itself, for its pump.
    local: RefCell<VecDeque<(usize, Msg<A>)>>,
    pump_waker: RefCell<Option<Waker>>,
    /// Owner calls waiting for their reply.
    calls: Calls<A::Reply>,
    housekeeping_ticks: Cell<u64>,
    /// This shard's own `Rc`, for timers and retries that outlive a call.
    me: RefCell<Weak<Shard<A>>>,
}

/// How often the outbox retries messages waiting for a full ring.
pub const OUTBOX_RETRY_MS: u64 = 1;

/// Period of [`App::housekeeping`] and the pool sweep.
pub const HOUSEKEEPING_MS: u64 = 5_000;

impl<A: App> Shard<A> {
    /// Builds shard `id` and starts nothing: see [`Shard::start`].
    pub fn new(id: usize, shared: Arc<Shared>, mesh: Option<MeshSender<Msg<A>>>) -> Rc<Self> {
        let cfg = &shared.config.server;
        let pool = Pool::new(cfg.pool_max_idle_per_host, cfg.pool_idle_timeout_ms);
        let metrics = shared.metrics.get(id).cloned().unwrap_or_default();
        let runtime = shared.runtime.current().1;
        let shard = Rc::new(Self {
            state: A::state(&runtime.apply_to(&shared.config)),
            mesh,
            outbox: RefCell::new(Outbox::default()),
            outbox_retrying: Cell::new(false),
            local: RefCell::new(VecDeque::new()),
            pump_waker: RefCell::new(None),
            calls: Calls::default(),
            housekeeping_ticks: Cell::new(0),
            me: RefCell::new(Weak::new()),
            id,
            clock: MonoClock,
            pool,
            dns: DnsCache::default(),
            metrics,
            draining: Cell::new(false),
            in_flight: Cell::new(0),
            cut: Cell::new(false),
            cut_waiters: RefCell::new(Slots::default()),
            scratch: RefCell::new(Vec::with_capacity(16 * 1024)),
            seq: Cell::new(0),
            shards: shared.shards,
            current: RefCell::new(Rc::new(Generation::new(shared))),
        });
        *shard.me.borrow_mut() = Rc::downgrade(&shard);
        shard
    }

    /// Spawns the shard's message pump (fed by `receiver` and by self-sends) and its
    /// housekeeping task. Call once, inside the shard's runtime.
    pub fn start(self: &Rc<Self>, receiver: Option<MeshReceiver<Msg<A>>>) {
        let pump = self.clone();
        monoio::spawn(async move {
            let mut receiver = receiver;
            loop {
                let (from, msg) = poll_fn(|cx| {
                    if let Some(m) = pump.local.borrow_mut().pop_front() {
                        return Poll::Ready(m);
                    }
                    if let Some(r) = receiver.as_mut()
                        && let Poll::Ready(m) = r.poll_recv(cx)
                    {
                        return Poll::Ready(m);
                    }
                    *pump.pump_waker.borrow_mut() = Some(cx.waker().clone());
                    Poll::Pending
                })
                .await;
                pump.handle(from, msg);
            }
        });
        let sweeper = self.clone();
        monoio::spawn(async move {
            loop {
                monoio::time::sleep(Duration::from_millis(HOUSEKEEPING_MS)).await;
                if sweeper.draining.get() {
                    break;
                }
                sweeper.pool.sweep(sweeper.now().mono_ns);
                let tick = sweeper.housekeeping_ticks.get().wrapping_add(1);
                sweeper.housekeeping_ticks.set(tick);
                A::housekeeping(&sweeper);
            }
        });
    }

    pub fn id(&self) -> usize {
        self.id
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    /// Makes `shared` (a reloaded configuration) current, at once: requests that start
    /// from here run on it, requests in flight finish on the generation they hold, and the
    /// application re-tunes its owner tables.
    pub fn adopt(&self, shared: Arc<Shared>) {
        let next = Rc::new(Generation::new(shared));
        drop(self.current.replace(next));
        A::settings_changed(self);
    }

    /// Adopts the newest runtime settings if they changed since this shard's current
    /// generation was built (one atomic load otherwise): replaces the current generation
    /// with one that has them in place and lets the application re-tune its owner tables.
    /// Called before each request and each owner message; never inside an owner handler.
    pub fn refresh(&self) {
        let shared = {
            let current = self.current.borrow();
            if current.shared.runtime.generation() == current.settings {
                return;
            }
            current.shared.clone()
        };
        self.adopt(shared);
    }

    /// The configuration in force now, for work that is not a request (owner handlers,
    /// housekeeping, the management API): hold it for the duration of the work. A request
    /// uses the generation it started with ([`Req::config`]).
    pub fn current(&self) -> Rc<Generation<A>> {
        self.current.borrow().clone()
    }

    pub fn now(&self) -> Now {
        self.clock.now()
    }

    /// Monotonic nanoseconds read at this moment, not the reading of the poll under way:
    /// for a span that may begin and end within one poll ([`MonoClock::exact_mono_ns`]).
    pub fn exact_mono_ns(&self) -> u64 {
        MonoClock::exact_mono_ns()
    }

    /// Monotonic nanoseconds only: one clock read, for per-piece stream timing.
    pub fn mono_ns(&self) -> u64 {
        self.clock.mono_ns()
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn dns(&self) -> &DnsCache {
        &self.dns
    }

    pub fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    pub fn state(&self) -> &A::State {
        &self.state
    }

    /// The JSON peek's reusable buffer.
    pub fn scratch(&self) -> &RefCell<Vec<u8>> {
        &self.scratch
    }

    /// Housekeeping rounds run so far.
    pub fn housekeeping_ticks(&self) -> u64 {
        self.housekeeping_ticks.get()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.get()
    }

    /// Begins shutdown: requests in flight finish, no new ones are read.
    pub fn start_draining(&self) {
        self.draining.set(true);
    }

    /// The grace period is over: every request still in flight is told to end now (a
    /// pending one with `shutting_down`, a stream with its in-band error event).
    pub fn cut_in_flight(&self) {
        self.cut.set(true);
        self.cut_waiters.borrow_mut().wake_all();
    }

    /// Resolves once [`Shard::cut_in_flight`] is called (at once if it was).
    pub fn cut_signal(&self) -> CutSignal<'_, A> {
        CutSignal {
            shard: self,
            slot: None,
        }
    }

    /// Requests between a complete head and the end of their response.
    pub fn in_flight(&self) -> usize {
        self.in_flight.get()
    }

    /// Owner calls of this shard still waiting for a reply.
    #[cfg(test)]
    pub fn outstanding_calls(&self) -> usize {
        self.calls.outstanding()
    }

    /// The shard that owns `key`.
    pub fn owner<K: OwnerKey + ?Sized>(&self, key: &K) -> usize {
        owner_of(key, self.shards)
    }

    pub fn next_seq(&self) -> u64 {
        let n = self.seq.get().wrapping_add(1);
        self.seq.set(n);
        (n << 8) | (self.id as u64 & 0xff)
    }

    fn enqueue_local(&self, msg: Msg<A>) {
        self.local.borrow_mut().push_back((self.id, msg));
        if let Some(w) = self.pump_waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Sends a view to shard `to` (queued for the pump when `to` is this shard). A full
    /// ring drops it (counted by the mesh; anti-entropy re-sends it): `false`.
    fn send_view(&self, to: usize, view: A::View) -> bool {
        if to == self.id {
            self.enqueue_local(Msg::View(view));
            return true;
        }
        match &self.mesh {
            Some(m) => m.send(to, Msg::View(view)).is_ok(),
            None => false,
        }
    }

    /// Sends a view to every other shard (the caller applies it here).
    pub fn broadcast(&self, view: &A::View) {
        for to in 0..self.shards {
            if to != self.id {
                self.send_view(to, view.clone());
            }
        }
    }

    /// Sends a point-to-point message (facts, calls, replies, cancels): a full ring keeps
    /// it in the outbox, retried every millisecond in order until it goes. Only a closed
    /// peer (shutdown) drops it: `false`. To this shard it is queued for the pump.
    pub fn send_reliable(&self, to: usize, msg: Msg<A>) -> bool {
        if to == self.id {
            self.enqueue_local(msg);
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

    /// Sends a fact to shard `to` (reliably).
    pub fn send_fact(&self, to: usize, fact: A::Fact) -> bool {
        self.send_reliable(to, Msg::Fact(fact))
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

    /// Sends what an owner handler produced: views to every shard (applied here at once,
    /// so this shard's own routing sees them before anything it sends next), the rest to
    /// their destination, timers to this shard's pump at their instant.
    pub fn dispatch(&self, out: Out<A>) {
        for (dest, msg) in out {
            match (dest, msg) {
                (Dest::All, Msg::View(view)) => {
                    self.broadcast(&view);
                    A::apply_view(self, &view);
                }
                (Dest::All, other) => {
                    // Only views are broadcast; anything else goes to this shard.
                    self.enqueue_local(other);
                }
                (Dest::Shard(to), msg) => {
                    self.send_reliable(to, msg);
                }
                (Dest::SelfAt(at_ns), msg) => self.later(at_ns, msg),
            }
        }
    }

    /// Queues `msg` for this shard's pump at monotonic instant `at_ns` (owner timers).
    fn later(&self, at_ns: u64, msg: Msg<A>) {
        let Some(me) = self.me.borrow().upgrade() else {
            return;
        };
        let wait = Duration::from_nanos(at_ns.saturating_sub(self.now().mono_ns));
        monoio::spawn(async move {
            monoio::time::sleep(wait).await;
            me.enqueue_local(msg);
        });
    }

    /// Handles one message from shard `from`: a view is applied, a reply completes its
    /// waiter (or goes to the late hook), everything else goes to the owner tables.
    fn handle(&self, from: usize, msg: Msg<A>) {
        self.refresh();
        match msg {
            Msg::View(view) => A::apply_view(self, &view),
            Msg::Reply { id, reply } => {
                if let Some(late) = self.calls.complete(id, reply) {
                    A::late_reply(self, from, id, late);
                }
            }
            other @ (Msg::Fact(_) | Msg::Call { .. } | Msg::Cancel { .. }) => {
                A::serve(self, from, other);
            }
        }
    }
}

/// Wakers in reusable slots: a waiting future keeps one slot for its whole wait, however
/// often it is polled.
#[derive(Default)]
struct Slots {
    wakers: Vec<Option<Waker>>,
    free: Vec<usize>,
}

impl Slots {
    fn set(&mut self, slot: Option<usize>, waker: &Waker) -> usize {
        if let Some(i) = slot
            && let Some(w) = self.wakers.get_mut(i)
        {
            match w {
                Some(old) if old.will_wake(waker) => {}
                _ => *w = Some(waker.clone()),
            }
            return i;
        }
        match self.free.pop() {
            Some(i) => {
                if let Some(w) = self.wakers.get_mut(i) {
                    *w = Some(waker.clone());
                }
                i
            }
            None => {
                self.wakers.push(Some(waker.clone()));
                self.wakers.len() - 1
            }
        }
    }

    fn release(&mut self, slot: usize) {
        if let Some(w) = self.wakers.get_mut(slot) {
            *w = None;
            self.free.push(slot);
        }
    }

    fn wake_all(&mut self) {
        for w in self.wakers.iter_mut() {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
    }
}

/// A request's wait for the end of the shutdown grace period ([`Shard::cut_signal`]).
pub struct CutSignal<'a, A: App> {
    shard: &'a Shard<A>,
    slot: Option<usize>,
}

impl<A: App> std::future::Future for CutSignal<'_, A> {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.shard.cut.get() {
            return Poll::Ready(());
        }
        let slot = self
            .shard
            .cut_waiters
            .borrow_mut()
            .set(self.slot, cx.waker());
        self.slot = Some(slot);
        Poll::Pending
    }
}

impl<A: App> Drop for CutSignal<'_, A> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.shard.cut_waiters.borrow_mut().release(slot);
        }
    }
}

/// A request on its shard, from its complete head to the end of its response: counts it
/// as in flight until dropped (covers every exit path) and holds the configuration
/// generation current when it started, which everything done for the request reads
/// (routing, selection, relay, watchdogs, owner calls, the access log). It derefs to the
/// shard for everything else.
pub struct Req<'a, A: App> {
    shard: &'a Shard<A>,
    generation: Rc<Generation<A>>,
}

impl<'a, A: App> Req<'a, A> {
    /// A request starts on `shard`'s current generation.
    pub fn enter(shard: &'a Shard<A>) -> Self {
        shard.in_flight.set(shard.in_flight.get() + 1);
        metrics::bump(&shard.metrics.in_flight);
        Self {
            generation: shard.current(),
            shard,
        }
    }

    /// The shard the request runs on.
    pub fn shard(&self) -> &'a Shard<A> {
        self.shard
    }

    /// The request's configuration (the one in force when it started).
    pub fn config(&self) -> &Config {
        &self.generation.config
    }

    pub fn shared(&self) -> &Shared {
        &self.generation.shared
    }

    pub fn pool_key(&self, provider: ProviderId) -> Option<PoolKey> {
        self.generation.pool_key(provider)
    }

    /// The shard's labelled metric families of the request's configuration.
    pub fn families(&self) -> &metrics::Families {
        self.generation.families(self.shard.id)
    }

    /// Who sent `head`, by the client keys of the request's configuration (remembered per
    /// generation, see [`KeyCache`]).
    pub fn caller(&self, head: &RequestHead) -> Caller {
        let g = &self.generation;
        g.key_cache.identify(&g.shared.keys, head)
    }

    /// The application's tables of the request's configuration ([`App::derive`]).
    pub fn derived(&self) -> &A::Derived {
        &self.generation.derived
    }
}

impl<A: App> std::ops::Deref for Req<'_, A> {
    type Target = Shard<A>;

    fn deref(&self) -> &Shard<A> {
        self.shard
    }
}

impl<A: App> Drop for Req<'_, A> {
    fn drop(&mut self) {
        self.shard
            .in_flight
            .set(self.shard.in_flight.get().saturating_sub(1));
        metrics::drop_one(&self.shard.metrics.in_flight);
    }
}
