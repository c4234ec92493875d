//! Per-shard counters. Each shard writes only its own (relaxed atomics, no contention);
//! `/metrics` sums all shards on read. Label values come from closed sets.
//!
//! One writer per counter (its shard; the snapshot writer for [`SnapshotMetrics`]), so a
//! count goes up by a relaxed load and store ([`add_one_writer`]), not a read-modify-write:
//! no locked instruction on the request path (~20 of them per request before). Readers on
//! other threads see each value whole, at most a moment late.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ErrorKind;
use crate::resilience::connection::ProviderErrorType;

/// Slots of `tidegate_upstream_errors_total`: one per provider error type, then "untyped".
const UPSTREAM_ERROR_SLOTS: usize = ProviderErrorType::ALL.len() + 1;

/// Every gateway error code, in a fixed order, for labelled counters.
pub const ERROR_KINDS: [ErrorKind; 67] = [
    ErrorKind::MalformedRequest,
    ErrorKind::HeadTimeout,
    ErrorKind::HeadTooLarge,
    ErrorKind::BodyTooLarge,
    ErrorKind::InvalidJson,
    ErrorKind::MissingModel,
    ErrorKind::UnsupportedTransferEncoding,
    ErrorKind::Unauthorized,
    ErrorKind::Forbidden,
    ErrorKind::RouteNotFound,
    ErrorKind::MethodNotAllowed,
    ErrorKind::ModelNotFound,
    ErrorKind::EndpointNotSupported,
    ErrorKind::UntranslatableRequest,
    ErrorKind::NoConnection,
    ErrorKind::UnknownConnection,
    ErrorKind::ConnectionNotUsable,
    ErrorKind::UpstreamConnect,
    ErrorKind::UpstreamTimeout(crate::error::TimeoutPhase::Connect),
    ErrorKind::UpstreamTimeout(crate::error::TimeoutPhase::ResponseHeader),
    ErrorKind::UpstreamTimeout(crate::error::TimeoutPhase::BodyIdle),
    ErrorKind::UpstreamTimeout(crate::error::TimeoutPhase::Active),
    ErrorKind::RequestTimeout,
    ErrorKind::UpstreamProtocol,
    ErrorKind::StreamContentStall,
    ErrorKind::StreamThroughputTooLow,
    ErrorKind::ProviderCircuitOpen,
    ErrorKind::ModelCooldown,
    ErrorKind::AllTargetsCoolingDown,
    ErrorKind::AllConnectionsTerminal,
    ErrorKind::NoExecutableTargets,
    ErrorKind::AllTargetsSkipped,
    ErrorKind::AllTargetsSkippedRateLimited,
    ErrorKind::AllAccountsInactive,
    ErrorKind::AllAccountsInactiveRateLimited,
    ErrorKind::ComboTimeout,
    ErrorKind::MaxAttemptsExceeded,
    ErrorKind::AllTargetsFailed,
    ErrorKind::UpstreamUnreachable,
    ErrorKind::MeshUnavailable,
    ErrorKind::SemaphoreTimeout,
    ErrorKind::SemaphoreQueueFull,
    ErrorKind::RateLimitQueueFull,
    ErrorKind::RateLimitQueueTimeout,
    ErrorKind::RateLimitExecutionTimeout,
    ErrorKind::RateLimitQueueWedged,
    ErrorKind::ShuttingDown,
    ErrorKind::Lease(crate::error::LeaseCode::AuthenticationRequired),
    ErrorKind::Lease(crate::error::LeaseCode::ApiKeyInvalid),
    ErrorKind::Lease(crate::error::LeaseCode::ContentTypeRequired),
    ErrorKind::Lease(crate::error::LeaseCode::ActionInvalid),
    ErrorKind::Lease(crate::error::LeaseCode::ScopeRequired),
    ErrorKind::Lease(crate::error::LeaseCode::KeyConfigurationInvalid),
    ErrorKind::Lease(crate::error::LeaseCode::ContextRequired),
    ErrorKind::Lease(crate::error::LeaseCode::ContextInvalid),
    ErrorKind::Lease(crate::error::LeaseCode::ModelInvalid),
    ErrorKind::Lease(crate::error::LeaseCode::FenceStale),
    ErrorKind::Lease(crate::error::LeaseCode::NoEligibleConnection),
    ErrorKind::Lease(crate::error::LeaseCode::OwnerActive),
    ErrorKind::Lease(crate::error::LeaseCode::CapacityUnavailable),
    ErrorKind::Lease(crate::error::LeaseCode::EligibilityUnavailable),
    ErrorKind::Lease(crate::error::LeaseCode::ServiceUnavailable),
    ErrorKind::Lease(crate::error::LeaseCode::Required),
    ErrorKind::Lease(crate::error::LeaseCode::ConnectionMismatch),
    ErrorKind::Lease(crate::error::LeaseCode::AuthorizationMismatch),
    ErrorKind::Lease(crate::error::LeaseCode::UnsupportedRoute),
    ErrorKind::Internal,
];

/// One counter per [`ERROR_KINDS`] entry (an array longer than 32 has no derived `Default`).
#[derive(Debug)]
struct PerKind([AtomicU64; ERROR_KINDS.len()]);

impl Default for PerKind {
    fn default() -> Self {
        PerKind(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl std::ops::Deref for PerKind {
    type Target = [AtomicU64; ERROR_KINDS.len()];
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// The position of `kind` in [`ERROR_KINDS`] (`Internal`'s when absent).
pub fn kind_position(kind: ErrorKind) -> usize {
    kind_index(kind)
}

fn kind_index(kind: ErrorKind) -> usize {
    ERROR_KINDS
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(ERROR_KINDS.len() - 1)
}

/// The `phase` label that tells apart the [`ERROR_KINDS`] entries sharing one code (`""`: the
/// code alone is unique), so no two series of a family carry the same labels.
pub fn kind_phase(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::UpstreamTimeout(p) => p.as_str(),
        // The 429 variants share their code with the 503 ones.
        ErrorKind::AllTargetsSkippedRateLimited | ErrorKind::AllAccountsInactiveRateLimited => {
            "rate_limited"
        }
        // Shares its code with the 408 of a slow request head; the label tells them apart.
        ErrorKind::RequestTimeout => "request",
        _ => "",
    }
}

/// Where a request stood when its client hung up (`tidegate_requests_abandoned_total{phase}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandoned {
    /// Waiting for admission (quota-share slot, request queue, gate permits): never sent.
    Admission,
    /// Sent upstream, waiting for the answer's head or its first bytes (held back).
    Response,
    /// Part of the answer had reached the client.
    Streaming,
}

impl Abandoned {
    pub const ALL: [Abandoned; 3] = [
        Abandoned::Admission,
        Abandoned::Response,
        Abandoned::Streaming,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Abandoned::Admission => "admission",
            Abandoned::Response => "response",
            Abandoned::Streaming => "streaming",
        }
    }
}

/// Flow-control occupancy of one owner shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowGauges {
    /// Gate permits granted and not yet released.
    pub gate_permits: usize,
    /// Requests waiting for gate permits.
    pub gate_waiters: usize,
    /// Requests in request queues, waiting or holding a slot.
    pub queue_requests: usize,
    /// Entries of the owner tables, in [`OWNER_TABLES`] order.
    pub owner_entries: [usize; OWNER_TABLES.len()],
    /// Model lockout entries dropped by the table's hard cap (cumulative).
    pub lockouts_evicted: u64,
}

/// The `table` labels of `tidegate_owner_entries`.
pub const OWNER_TABLES: [&str; 5] = [
    "breakers",
    "model_lockouts",
    "model_failures",
    "cooldown_tracker",
    "request_queues",
];

/// Upper bounds (seconds) of every latency histogram's buckets; `+Inf` is implied.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// [`LATENCY_BUCKETS`] in nanoseconds (what a request compares, without a float): a
/// reading of `ns` falls in the first bucket with `ns <= bound`, exactly the one where
/// `ns as f64 / 1e9 <= LATENCY_BUCKETS[i]` (each bound is a whole number of ns, and the
/// next nanosecond is far more than a float step above it).
const LATENCY_BUCKETS_NS: [u64; LATENCY_BUCKETS.len()] = [
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
    120_000_000_000,
    300_000_000_000,
    600_000_000_000,
];

/// One labelled counter family of one shard: a value per label set, the label sets
/// rendered once at start-up (`{provider="up",class="2xx"}`) from closed sets and
/// configured ids. Adding at an index outside the family is ignored.
///
/// A reload builds the families again for the reloaded file ([`Counters::carried`]): a
/// label set both have keeps its value cell (shards still on the old configuration count
/// into the same cell), a removed one is no longer rendered, a new one starts at zero.
#[derive(Debug, Default)]
pub struct Counters {
    labels: Vec<String>,
    values: Vec<std::sync::Arc<AtomicU64>>,
}

/// `labels`' cells: `old`'s cell for a label set it has, a new one for the rest.
fn carry<T: Default>(
    labels: &[String],
    old: Option<(&[String], &[std::sync::Arc<T>])>,
) -> Vec<std::sync::Arc<T>> {
    let old: std::collections::HashMap<&str, &std::sync::Arc<T>> = old
        .map(|(l, v)| l.iter().map(String::as_str).zip(v).collect())
        .unwrap_or_default();
    labels
        .iter()
        .map(|l| {
            old.get(l.as_str())
                .map_or_else(Default::default, |c| (*c).clone())
        })
        .collect()
}

impl Counters {
    /// A family with `labels`, continuing `old`'s values for the label sets it has.
    pub fn carried(labels: Vec<String>, old: Option<&Counters>) -> Self {
        let values = carry(
            &labels,
            old.map(|o| (o.labels.as_slice(), o.values.as_slice())),
        );
        Self { labels, values }
    }

    pub fn add(&self, i: usize, n: u64) {
        if let Some(v) = self.values.get(i) {
            add_one_writer(v, n);
        }
    }

    /// The value at `i` (0 outside the family).
    #[cfg(test)]
    pub fn value(&self, i: usize) -> u64 {
        self.values.get(i).map_or(0, |v| v.load(Ordering::Relaxed))
    }
}

/// One latency histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe_ns(&self, ns: u64) {
        if let Some(i) = bucket_of(ns)
            && let Some(b) = self.buckets.get(i)
        {
            add_one_writer(b, 1);
        }
        add_one_writer(&self.count, 1);
        add_one_writer(&self.sum_us, ns / 1_000);
    }
}

/// The bucket a reading of `ns` is counted in (`None`: only `+Inf`).
fn bucket_of(ns: u64) -> Option<usize> {
    LATENCY_BUCKETS_NS.iter().position(|b| ns <= *b)
}

/// A labelled histogram family of one shard (see [`Counters`]).
#[derive(Debug, Default)]
pub struct Histograms {
    labels: Vec<String>,
    values: Vec<std::sync::Arc<Histogram>>,
}

impl Histograms {
    /// A family with `labels`, continuing `old`'s histograms for the label sets it has.
    pub fn carried(labels: Vec<String>, old: Option<&Histograms>) -> Self {
        let values = carry(
            &labels,
            old.map(|o| (o.labels.as_slice(), o.values.as_slice())),
        );
        Self { labels, values }
    }

    pub fn observe_ns(&self, i: usize, ns: u64) {
        if let Some(h) = self.values.get(i) {
            h.observe_ns(ns);
        }
    }
}

/// The labelled families of one shard (their label sets are the same on every shard). They
/// belong to a configuration (`shard::Shared::families`), so their label sets follow a
/// reload.
#[derive(Debug, Default)]
pub struct Families {
    /// `tidegate_http_requests_total{route,class}`.
    pub requests: Counters,
    /// `tidegate_request_duration_seconds{route}`: head read → response written.
    pub request_duration: Histograms,
    /// `tidegate_upstream_attempts_by_connection_total{provider,connection,class}`.
    pub attempts: Counters,
    /// `tidegate_upstream_attempts_by_model_total{provider,model}`.
    pub attempts_by_model: Counters,
    /// `tidegate_upstream_head_seconds{provider}`: request sent → response head.
    pub upstream_head: Histograms,
    /// `tidegate_upstream_ttfb_seconds{provider}`: request sent → first body byte.
    pub upstream_ttfb: Histograms,
    /// `tidegate_fallbacks_total{cause,reason[,phase]}`: attempts that ended in a failure the
    /// gateway moves on from (the last candidate's included).
    pub fallbacks: Counters,
    /// `tidegate_breaker_transitions_total{to}`: counted on the breaker's owner.
    pub breaker_transitions: Counters,
    /// `tidegate_admission_wait_seconds{provider}`: time an attempt spent being admitted
    /// (quota-share slot, request-queue slot, gate permits) before its request was sent.
    pub admission_wait: Histograms,
    /// By provider slot: where the provider's label sets start in `attempts_by_model`
    /// (one per model of the provider, then `other`).
    pub model_base: Vec<usize>,
}

/// What each family is called and says, in render order.
const FAMILIES: [(&str, &str); 9] = [
    (
        "tidegate_http_requests_total",
        "Responses sent, by route and status class.",
    ),
    (
        "tidegate_request_duration_seconds",
        "Time from a complete request head to the end of its response.",
    ),
    (
        "tidegate_upstream_attempts_by_connection_total",
        "Upstream attempts by connection and the class of the upstream's answer (error: no answer).",
    ),
    (
        "tidegate_upstream_attempts_by_model_total",
        "Upstream attempts by provider and upstream model (models not in the provider's list count as other).",
    ),
    (
        "tidegate_upstream_head_seconds",
        "Upstream: request sent to response head.",
    ),
    (
        "tidegate_upstream_ttfb_seconds",
        "Upstream: request sent to the first body byte.",
    ),
    (
        "tidegate_fallbacks_total",
        "Attempts that ended in a failure the gateway moves on from (to the next candidate when there is one; the last candidate's counted too), by cause (an upstream answer or a gateway-made error) and reason.",
    ),
    (
        "tidegate_breaker_transitions_total",
        "Circuit breaker transitions, by the state entered (counted on the breaker's owner).",
    ),
    (
        "tidegate_admission_wait_seconds",
        "Time an admitted attempt waited for its quota-share slot, request-queue slot and gate permits.",
    ),
];

fn render_counters(out: &mut String, name: &str, help: &str, shards: &[&Counters]) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}
# TYPE {name} counter"
    );
    let Some(first) = shards.first() else {
        return;
    };
    for (i, labels) in first.labels.iter().enumerate() {
        let v: u64 = shards
            .iter()
            .filter_map(|c| c.values.get(i))
            .map(|v| v.load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

fn render_histograms(out: &mut String, name: &str, help: &str, shards: &[&Histograms]) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}
# TYPE {name} histogram"
    );
    let Some(first) = shards.first() else {
        return;
    };
    for (i, labels) in first.labels.iter().enumerate() {
        let hs: Vec<&Histogram> = shards
            .iter()
            .filter_map(|h| h.values.get(i).map(|v| &**v))
            .collect();
        let inner = labels.trim_start_matches('{').trim_end_matches('}');
        let sep = if inner.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (b, le) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += hs
                .iter()
                .map(|h| h.buckets[b].load(Ordering::Relaxed))
                .sum::<u64>();
            let _ = writeln!(out, "{name}_bucket{{{inner}{sep}le=\"{le}\"}} {cumulative}");
        }
        let count: u64 = hs.iter().map(|h| h.count.load(Ordering::Relaxed)).sum();
        let sum_us: u64 = hs.iter().map(|h| h.sum_us.load(Ordering::Relaxed)).sum();
        let _ = writeln!(out, "{name}_bucket{{{inner}{sep}le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{labels} {}", sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{labels} {count}");
    }
}

/// Renders the labelled families of every shard, summed (counters) and merged
/// (histograms).
fn render_families(out: &mut String, shards: &[std::sync::Arc<Families>]) {
    let f: Vec<&Families> = shards.iter().map(|s| &**s).collect();
    let c = |pick: fn(&Families) -> &Counters| -> Vec<&Counters> {
        f.iter().map(|x| pick(x)).collect()
    };
    let h = |pick: fn(&Families) -> &Histograms| -> Vec<&Histograms> {
        f.iter().map(|x| pick(x)).collect()
    };
    let [
        requests,
        duration,
        attempts,
        by_model,
        head,
        ttfb,
        fallbacks,
        transitions,
        admission,
    ] = FAMILIES;
    render_counters(out, requests.0, requests.1, &c(|x| &x.requests));
    render_histograms(out, duration.0, duration.1, &h(|x| &x.request_duration));
    render_counters(out, attempts.0, attempts.1, &c(|x| &x.attempts));
    render_counters(out, by_model.0, by_model.1, &c(|x| &x.attempts_by_model));
    render_histograms(out, head.0, head.1, &h(|x| &x.upstream_head));
    render_histograms(out, ttfb.0, ttfb.1, &h(|x| &x.upstream_ttfb));
    render_counters(out, fallbacks.0, fallbacks.1, &c(|x| &x.fallbacks));
    render_counters(
        out,
        transitions.0,
        transitions.1,
        &c(|x| &x.breaker_transitions),
    );
    render_histograms(out, admission.0, admission.1, &h(|x| &x.admission_wait));
}

#[derive(Debug, Default)]
pub struct ShardMetrics {
    pub connections_accepted: AtomicU64,
    pub connections_open: AtomicU64,
    pub requests: AtomicU64,
    pub responses_2xx: AtomicU64,
    pub responses_4xx: AtomicU64,
    pub responses_5xx: AtomicU64,
    pub responses_other: AtomicU64,
    pub in_flight: AtomicU64,
    pub upstream_attempts: AtomicU64,
    pub upstream_failovers: AtomicU64,
    pub upstream_connects: AtomicU64,
    pub upstream_reuses: AtomicU64,
    pub streams_broken: AtomicU64,
    /// Tokens the relayed streams reported in their usage blocks.
    pub usage_prompt_tokens: AtomicU64,
    pub usage_completion_tokens: AtomicU64,
    /// Requests whose client hung up, by [`Abandoned`] phase.
    pub abandoned: [AtomicU64; Abandoned::ALL.len()],
    pub mesh_outbox: AtomicU64,
    pub gate_permits: AtomicU64,
    pub gate_waiters: AtomicU64,
    pub queue_requests: AtomicU64,
    pub owner_entries: [AtomicU64; OWNER_TABLES.len()],
    pub lockouts_evicted: AtomicU64,
    /// Batches this shard collected for the snapshot writer, and the longest one (ns).
    pub snapshot_collects: AtomicU64,
    pub snapshot_collect_max_ns: AtomicU64,
    /// Batches that took longer than [`SNAPSHOT_COLLECT_BUDGET_NS`].
    pub snapshot_collects_over_budget: AtomicU64,
    /// Steps during which the OS switched the shard's thread out (involuntarily).
    pub snapshot_collects_preempted: AtomicU64,
    /// The longest step the OS did not interrupt: the step's own work.
    pub snapshot_collect_unpreempted_max_ns: AtomicU64,
    /// Steps not interrupted that still took longer than [`SNAPSHOT_COLLECT_BUDGET_NS`].
    pub snapshot_collects_unpreempted_over_budget: AtomicU64,
    gateway_errors: PerKind,
    upstream_errors: [AtomicU64; UPSTREAM_ERROR_SLOTS],
}

impl ShardMetrics {
    /// Publishes the owner tables' flow-control occupancy (after each owner message).
    pub fn publish_flow(&self, g: &FlowGauges) {
        let set = |c: &AtomicU64, v: usize| c.store(v as u64, Ordering::Relaxed);
        set(&self.gate_permits, g.gate_permits);
        set(&self.gate_waiters, g.gate_waiters);
        set(&self.queue_requests, g.queue_requests);
        for (c, v) in self.owner_entries.iter().zip(g.owner_entries) {
            set(c, v);
        }
        self.lockouts_evicted
            .store(g.lockouts_evicted, Ordering::Relaxed);
    }
}

impl ShardMetrics {
    /// One snapshot batch collected on this shard in `took_ns`.
    /// One collection step took `took_ns` of wall-clock time; `preempted`: whether the OS
    /// switched the thread out in the middle (`None`: not known here).
    pub fn snapshot_collected(&self, took_ns: u64, preempted: Option<bool>) {
        bump(&self.snapshot_collects);
        if took_ns > SNAPSHOT_COLLECT_BUDGET_NS {
            bump(&self.snapshot_collects_over_budget);
        }
        self.snapshot_collect_max_ns
            .fetch_max(took_ns, Ordering::Relaxed);
        match preempted {
            Some(true) => bump(&self.snapshot_collects_preempted),
            Some(false) => {
                if took_ns > SNAPSHOT_COLLECT_BUDGET_NS {
                    bump(&self.snapshot_collects_unpreempted_over_budget);
                }
                self.snapshot_collect_unpreempted_max_ns
                    .fetch_max(took_ns, Ordering::Relaxed);
            }
            None => {}
        }
    }
}

/// How long one snapshot collection step may hold a shard's loop (1 ms).
pub const SNAPSHOT_COLLECT_BUDGET_NS: u64 = 1_000_000;

/// The snapshot writer's counters (one writer per process, off the shards).
#[derive(Debug, Default)]
pub struct SnapshotMetrics {
    pub writes: AtomicU64,
    pub write_failures: AtomicU64,
    pub write_ns_total: AtomicU64,
    pub last_write_ns: AtomicU64,
    pub last_bytes: AtomicU64,
    pub generation: AtomicU64,
    /// Slot files found untrustworthy (and moved aside) at start-up.
    pub rejected_files: AtomicU64,
}

impl SnapshotMetrics {
    pub fn record_write(&self, ok: bool, duration_ns: u64, bytes: usize, generation: u64) {
        if ok {
            bump(&self.writes);
            self.last_bytes.store(bytes as u64, Ordering::Relaxed);
            self.generation.store(generation, Ordering::Relaxed);
        } else {
            bump(&self.write_failures);
        }
        add_one_writer(&self.write_ns_total, duration_ns);
        self.last_write_ns.store(duration_ns, Ordering::Relaxed);
    }

    /// Its lines of the Prometheus exposition, with the shards' collection times.
    fn render(&self, shards: &[std::sync::Arc<ShardMetrics>], out: &mut String) {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let secs = |ns: u64| ns as f64 / 1e9;
        let max_collect = shards
            .iter()
            .map(|s| load(&s.snapshot_collect_max_ns))
            .max()
            .unwrap_or(0);
        let max_own = shards
            .iter()
            .map(|s| load(&s.snapshot_collect_unpreempted_max_ns))
            .max()
            .unwrap_or(0);
        let sum =
            |f: fn(&ShardMetrics) -> &AtomicU64| -> u64 { shards.iter().map(|s| load(f(s))).sum() };
        let preempted = sum(|s| &s.snapshot_collects_preempted);
        let over_own = sum(|s| &s.snapshot_collects_unpreempted_over_budget);
        let collects: u64 = shards.iter().map(|s| load(&s.snapshot_collects)).sum();
        let over: u64 = shards
            .iter()
            .map(|s| load(&s.snapshot_collects_over_budget))
            .sum();
        let mut line = |name: &str, help: &str, kind: &str, samples: &[(&str, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        line(
            "tidegate_snapshot_writes_total",
            "Snapshot writes, by result.",
            "counter",
            &[
                ("{result=\"ok\"}", load(&self.writes).to_string()),
                ("{result=\"error\"}", load(&self.write_failures).to_string()),
            ],
        );
        line(
            "tidegate_snapshot_write_seconds",
            "Time spent encoding and writing snapshots (writer thread, off the shards).",
            "summary",
            &[],
        );
        let _ = writeln!(
            out,
            "tidegate_snapshot_write_seconds_sum {}\ntidegate_snapshot_write_seconds_count {}",
            secs(load(&self.write_ns_total)),
            load(&self.writes) + load(&self.write_failures)
        );
        let mut line = |name: &str, help: &str, kind: &str, v: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        line(
            "tidegate_snapshot_last_write_seconds",
            "Duration of the last snapshot write.",
            "gauge",
            secs(load(&self.last_write_ns)).to_string(),
        );
        line(
            "tidegate_snapshot_bytes",
            "Size of the last snapshot written.",
            "gauge",
            load(&self.last_bytes).to_string(),
        );
        line(
            "tidegate_snapshot_generation",
            "Generation of the last snapshot written.",
            "gauge",
            load(&self.generation).to_string(),
        );
        line(
            "tidegate_snapshot_rejected_files",
            "Snapshot slot files found corrupt or unreadable at start-up (moved aside).",
            "gauge",
            load(&self.rejected_files).to_string(),
        );
        line(
            "tidegate_snapshot_collects_total",
            "Batches of changed records the shards collected for the snapshot writer.",
            "counter",
            collects.to_string(),
        );
        line(
            "tidegate_snapshot_collects_over_1ms_total",
            "Snapshot collection steps that held a shard's loop longer than 1 ms (OS preemption included).",
            "counter",
            over.to_string(),
        );
        line(
            "tidegate_snapshot_collect_max_seconds",
            "Longest time one snapshot collection held a shard's loop.",
            "gauge",
            secs(max_collect).to_string(),
        );
        line(
            "tidegate_snapshot_collects_preempted_total",
            "Snapshot collection steps during which the OS switched the shard's thread out (their time includes other processes' turns).",
            "counter",
            preempted.to_string(),
        );
        line(
            "tidegate_snapshot_collect_unpreempted_max_seconds",
            "Longest snapshot collection step the OS did not interrupt: the step's own work.",
            "gauge",
            secs(max_own).to_string(),
        );
        line(
            "tidegate_snapshot_collects_unpreempted_over_1ms_total",
            "Snapshot collection steps not interrupted by the OS that still held the shard's loop longer than 1 ms.",
            "counter",
            over_own.to_string(),
        );
    }
}

pub fn bump(c: &AtomicU64) {
    add_one_writer(c, 1);
}

pub fn drop_one(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed).wrapping_sub(1), Ordering::Relaxed);
}

/// Adds `n` to a counter that only this thread writes (see the module's note).
pub fn add_one_writer(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl ShardMetrics {
    pub fn response(&self, status: u16) {
        let c = match status {
            200..=299 => &self.responses_2xx,
            400..=499 => &self.responses_4xx,
            500..=599 => &self.responses_5xx,
            _ => &self.responses_other,
        };
        bump(c);
    }

    /// A request whose client hung up in `phase`.
    pub fn abandoned(&self, phase: Abandoned) {
        let i = phase as usize;
        if let Some(c) = self.abandoned.get(i) {
            bump(c);
        }
    }

    pub fn gateway_error(&self, kind: ErrorKind) {
        if let Some(c) = self.gateway_errors.get(kind_index(kind)) {
            bump(c);
        }
    }

    /// A failed upstream attempt, by the provider error type it was classified as.
    pub fn upstream_error(&self, t: Option<ProviderErrorType>) {
        let i = t
            .and_then(|t| ProviderErrorType::ALL.iter().position(|a| *a == t))
            .unwrap_or(ProviderErrorType::ALL.len());
        if let Some(c) = self.upstream_errors.get(i) {
            bump(c);
        }
    }
}

/// Renders the Prometheus text exposition of all shards' counters, summed.
pub fn render(
    shards: &[std::sync::Arc<ShardMetrics>],
    families: &[std::sync::Arc<Families>],
    mesh: Option<&crate::mesh::ring::MeshStats>,
    snapshot: &SnapshotMetrics,
) -> String {
    let sum = |f: &dyn Fn(&ShardMetrics) -> &AtomicU64| -> u64 {
        shards.iter().map(|s| f(s).load(Ordering::Relaxed)).sum()
    };
    let mut out = String::with_capacity(4096);
    let mut counter = |name: &str, help: &str, kind: &str, v: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    };
    counter(
        "tidegate_shards",
        "Number of shards.",
        "gauge",
        shards.len() as u64,
    );
    counter(
        "tidegate_connections_accepted_total",
        "Client connections accepted.",
        "counter",
        sum(&|s| &s.connections_accepted),
    );
    counter(
        "tidegate_connections_open",
        "Client connections open.",
        "gauge",
        sum(&|s| &s.connections_open),
    );
    counter(
        "tidegate_requests_total",
        "Requests whose head was read.",
        "counter",
        sum(&|s| &s.requests),
    );
    counter(
        "tidegate_requests_in_flight",
        "Requests being served.",
        "gauge",
        sum(&|s| &s.in_flight),
    );
    counter(
        "tidegate_upstream_attempts_total",
        "Upstream attempts (all targets).",
        "counter",
        sum(&|s| &s.upstream_attempts),
    );
    counter(
        "tidegate_upstream_failovers_total",
        "Moves to the next connection before the first byte.",
        "counter",
        sum(&|s| &s.upstream_failovers),
    );
    counter(
        "tidegate_mesh_outbox",
        "Cross-shard messages waiting for room in a full ring (retried until delivered).",
        "gauge",
        sum(&|s| &s.mesh_outbox),
    );
    counter(
        "tidegate_gate_permits",
        "Concurrency-gate permits held (all gate homes).",
        "gauge",
        sum(&|s| &s.gate_permits),
    );
    counter(
        "tidegate_gate_waiters",
        "Requests waiting for concurrency-gate permits.",
        "gauge",
        sum(&|s| &s.gate_waiters),
    );
    counter(
        "tidegate_queue_requests",
        "Requests in per-connection request queues (waiting or holding a slot).",
        "gauge",
        sum(&|s| &s.queue_requests),
    );
    counter(
        "tidegate_model_lockouts_evicted_total",
        "Model lockout entries dropped by the per-shard cap (server.max_model_lockouts).",
        "counter",
        sum(&|s| &s.lockouts_evicted),
    );
    counter(
        "tidegate_usage_prompt_tokens_total",
        "Prompt (input) tokens the relayed streams reported in their usage blocks, counted once per request.",
        "counter",
        sum(&|s| &s.usage_prompt_tokens),
    );
    counter(
        "tidegate_usage_completion_tokens_total",
        "Completion (output) tokens the relayed streams reported in their usage blocks, counted once per request.",
        "counter",
        sum(&|s| &s.usage_completion_tokens),
    );
    counter(
        "tidegate_upstream_connects_total",
        "New upstream connections opened.",
        "counter",
        sum(&|s| &s.upstream_connects),
    );
    counter(
        "tidegate_upstream_reuses_total",
        "Requests sent on a pooled upstream connection.",
        "counter",
        sum(&|s| &s.upstream_reuses),
    );
    counter(
        "tidegate_streams_broken_total",
        "Responses cut after the first byte by an upstream failure.",
        "counter",
        sum(&|s| &s.streams_broken),
    );
    let _ = writeln!(
        out,
        "# HELP tidegate_owner_entries Entries held by the owner tables (all shards), by table.\n# TYPE tidegate_owner_entries gauge"
    );
    for (i, table) in OWNER_TABLES.iter().enumerate() {
        let v: u64 = shards
            .iter()
            .map(|s| s.owner_entries[i].load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(out, "tidegate_owner_entries{{table=\"{table}\"}} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP tidegate_responses_total Responses sent, by status class.\n# TYPE tidegate_responses_total counter"
    );
    for (class, f) in [
        (
            "2xx",
            &(|s: &ShardMetrics| s.responses_2xx.load(Ordering::Relaxed))
                as &dyn Fn(&ShardMetrics) -> u64,
        ),
        ("4xx", &|s: &ShardMetrics| {
            s.responses_4xx.load(Ordering::Relaxed)
        }),
        ("5xx", &|s: &ShardMetrics| {
            s.responses_5xx.load(Ordering::Relaxed)
        }),
        ("other", &|s: &ShardMetrics| {
            s.responses_other.load(Ordering::Relaxed)
        }),
    ] {
        let v: u64 = shards.iter().map(|s| f(s)).sum();
        let _ = writeln!(out, "tidegate_responses_total{{class=\"{class}\"}} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP tidegate_gateway_errors_total Gateway-made error responses, by code.\n# TYPE tidegate_gateway_errors_total counter"
    );
    for (i, kind) in ERROR_KINDS.iter().enumerate() {
        let v: u64 = shards
            .iter()
            .map(|s| s.gateway_errors[i].load(Ordering::Relaxed))
            .sum();
        let phase = kind_phase(*kind);
        // No empty label: `phase` only where there is one.
        let _ = if phase.is_empty() {
            writeln!(
                out,
                "tidegate_gateway_errors_total{{code=\"{}\"}} {v}",
                kind.code()
            )
        } else {
            writeln!(
                out,
                "tidegate_gateway_errors_total{{code=\"{}\",phase=\"{phase}\"}} {v}",
                kind.code()
            )
        };
    }
    let _ = writeln!(
        out,
        "# HELP tidegate_upstream_errors_total Failed upstream attempts, by the provider error type they were classified as.\n# TYPE tidegate_upstream_errors_total counter"
    );
    let types = ProviderErrorType::ALL.iter().map(|t| t.as_str());
    for (i, name) in types.chain(std::iter::once("untyped")).enumerate() {
        let v: u64 = shards
            .iter()
            .map(|s| s.upstream_errors[i].load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(out, "tidegate_upstream_errors_total{{type=\"{name}\"}} {v}");
    }
    let _ = writeln!(
        out,
        "# HELP tidegate_requests_abandoned_total Requests whose client hung up, by phase: admission (never sent upstream), response (upstream request cancelled before the answer's first byte reached the client), streaming (cut mid-answer).\n# TYPE tidegate_requests_abandoned_total counter"
    );
    for phase in Abandoned::ALL {
        let v: u64 = shards
            .iter()
            .map(|s| s.abandoned[phase as usize].load(Ordering::Relaxed))
            .sum();
        let _ = writeln!(
            out,
            "tidegate_requests_abandoned_total{{phase=\"{}\"}} {v}",
            phase.as_str()
        );
    }
    let _ = writeln!(
        out,
        "# HELP tidegate_mesh_drops_total Cross-shard messages not delivered, by reason.\n# TYPE tidegate_mesh_drops_total counter"
    );
    for reason in crate::mesh::ring::DropReason::ALL {
        let v = mesh.map_or(0, |m| m.total(reason));
        let _ = writeln!(
            out,
            "tidegate_mesh_drops_total{{reason=\"{}\"}} {v}",
            reason.as_str()
        );
    }
    render_families(&mut out, families);
    snapshot.render(shards, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `Histogram::observe_ns` compared before: the reading in seconds as a float.
    fn bucket_by_float(ns: u64) -> Option<usize> {
        let secs = ns as f64 / 1e9;
        LATENCY_BUCKETS.iter().position(|b| secs <= *b)
    }

    /// Every lease refusal has its own counter (none falls back to `Internal`'s), and
    /// `Internal` stays last.
    #[test]
    fn every_lease_code_is_counted_apart() {
        for code in crate::error::LeaseCode::ALL {
            let i = kind_index(ErrorKind::Lease(code));
            assert_eq!(ERROR_KINDS[i], ErrorKind::Lease(code));
        }
        assert_eq!(ERROR_KINDS.last(), Some(&ErrorKind::Internal));
    }

    #[test]
    fn the_bounds_in_ns_are_the_bounds_in_seconds() {
        for (ns, secs) in LATENCY_BUCKETS_NS.iter().zip(LATENCY_BUCKETS) {
            assert_eq!(*ns as f64 / 1e9, secs);
        }
    }

    /// Every reading at and around each bound, and the extremes, lands in the bucket the
    /// float comparison put it in.
    #[test]
    fn readings_fall_in_the_bucket_they_fell_in_before() {
        let mut readings = vec![0, 1, u64::MAX, u64::MAX - 1, 1 << 53, (1 << 53) + 1];
        for b in LATENCY_BUCKETS_NS {
            for d in 0..=1_000 {
                readings.extend([b.saturating_sub(d), b.saturating_add(d)]);
            }
        }
        for ns in readings {
            assert_eq!(bucket_of(ns), bucket_by_float(ns), "{ns}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_reading_falls_in_the_bucket_it_fell_in_before(ns in 0u64..1_000_000_000_000) {
            proptest::prop_assert_eq!(bucket_of(ns), bucket_by_float(ns));
        }
    }
}
