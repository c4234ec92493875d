//! A shard: one thread, one monoio runtime, and everything that thread owns — its
//! upstream pool, DNS cache, counters and drain state. Tasks on the shard share it through
//! an `Rc`; no borrow of its cells is held across an `.await`.

pub mod metrics;

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use crate::clock::{Clock, MonoClock, Now};
use crate::config::Config;
use crate::net::dns::DnsCache;
use crate::net::tls::TlsConfigs;
use crate::net::upstream::{Pool, PoolKey};
use crate::proxy::auth::KeyIndex;
use crate::routing::resolve::RouteTable;
use metrics::ShardMetrics;

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
}

impl Shard {
    pub fn new(id: usize, shared: Arc<Shared>) -> Self {
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
        Self {
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

    pub fn next_seq(&self) -> u64 {
        let n = self.seq.get().wrapping_add(1);
        self.seq.set(n);
        (n << 8) | (self.id as u64 & 0xff)
    }
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
