//! Per-shard counters. Each shard writes only its own (relaxed atomics, no contention);
//! `/metrics` sums all shards on read. Label values come from closed sets.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::ErrorKind;
use crate::resilience::connection::ProviderErrorType;

/// Slots of `tidegate_upstream_errors_total`: one per provider error type, then "untyped".
const UPSTREAM_ERROR_SLOTS: usize = ProviderErrorType::ALL.len() + 1;

/// Every gateway error code, in a fixed order, for labelled counters.
pub const ERROR_KINDS: [ErrorKind; 45] = [
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
    ErrorKind::UpstreamProtocol,
    ErrorKind::StreamContentStall,
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

fn kind_index(kind: ErrorKind) -> usize {
    ERROR_KINDS
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(ERROR_KINDS.len() - 1)
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
    pub abandoned_while_waiting: AtomicU64,
    pub mesh_outbox: AtomicU64,
    pub gate_permits: AtomicU64,
    pub gate_waiters: AtomicU64,
    pub queue_requests: AtomicU64,
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
    }
}

pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub fn drop_one(c: &AtomicU64) {
    c.fetch_sub(1, Ordering::Relaxed);
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
    mesh: Option<&crate::mesh::ring::MeshStats>,
    _config: &crate::config::Config,
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
        "tidegate_requests_abandoned_total",
        "Requests whose client hung up while they waited for admission (queue, gates); never sent upstream.",
        "counter",
        sum(&|s| &s.abandoned_while_waiting),
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
        let phase = match kind {
            ErrorKind::UpstreamTimeout(p) => p.as_str(),
            // The 429 variants share their code with the 503 ones.
            ErrorKind::AllTargetsSkippedRateLimited | ErrorKind::AllAccountsInactiveRateLimited => {
                "rate_limited"
            }
            _ => "",
        };
        let _ = writeln!(
            out,
            "tidegate_gateway_errors_total{{code=\"{}\",phase=\"{phase}\"}} {v}",
            kind.code()
        );
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
    out
}
