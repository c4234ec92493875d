//! Messages between shards. Facts go to owners ("this attempt on connection c ended so"),
//! views go from owners to every shard ("c is routable, or not until T"), and the one
//! request/reply pair asks an owner for a half-open probe permit. Views are applied
//! idempotently (epochs), so a dropped or duplicated broadcast only delays convergence; a
//! probe request that cannot be sent or answered maps to a typed error on the asker.

use crate::config::{ConnectionId, ProviderId};
use crate::flow::gates::GateError;
use crate::flow::queue::QueueError;
use crate::resilience::Reason;
use crate::resilience::breaker::{BreakerKey, BreakerView, ProbeTicket};
use crate::resilience::connection::ConnectionView;
use crate::resilience::lockout::LockUpdate;

/// How one upstream attempt ended, as the requesting shard saw it.
#[derive(Clone, Debug)]
pub enum AttemptResult {
    /// The upstream answered 2xx (the body may still be streaming; recorded at its end).
    Success,
    /// The upstream answered with an error status; `text` is the (bounded) error body and
    /// `headers` the response headers classification reads.
    Upstream {
        status: u16,
        text: String,
        headers: Vec<(String, String)>,
    },
    /// No response head within the budget, or the body went idle.
    Timeout,
    /// TCP/TLS connect failed.
    ConnectFailed,
    /// The stream stalled after its first byte.
    StreamStall,
    /// The client went away (never counted against the upstream).
    ClientAbort,
}

/// The fact an owner applies: an attempt on `connection`.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub provider: ProviderId,
    pub connection: ConnectionId,
    /// The upstream model id.
    pub model: String,
    pub result: AttemptResult,
    /// The connection breaker's probe permit this attempt carried, if any.
    pub probe: Option<ProbeTicket>,
}

/// One candidate of a quota-share dispatch (a combo target on one connection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QsCandidate {
    pub connection: ConnectionId,
    /// `provider/model/connection`: the deficit round robin's key.
    pub execution_key: String,
    /// Target weight × connection weight.
    pub weight: u32,
}

/// The quota-share home's answer: the candidates' order (indices into the request's list)
/// and the chosen connection's in-flight ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QsPick {
    pub ordered: Vec<u32>,
    pub ticket: Option<u64>,
}

/// What a successful upstream answer tells its connection's request queue: the status and
/// the rate-limit fields (`x-ratelimit-*`) of its head — nothing else is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuccessAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

#[derive(Clone, Debug)]
pub enum Msg {
    /// To the owner of the connection. With `ack`, the owner answers `Ack { id }` after
    /// broadcasting the views the outcome changed, so the asker answers its client only
    /// once its own view (and, through ring order, every view sent before) is current.
    Outcome(Box<Outcome>, Option<u64>),
    /// Owner → asker: the outcome `id` has been applied and its views sent.
    Ack { id: u64 },
    /// To the owner of a provider: a success (closes/decays) or a network failure (counted
    /// provider-wide), with the provider breaker's probe permit if the attempt carried one.
    ProviderResult {
        provider: ProviderId,
        success: bool,
        network: bool,
        probe: Option<ProbeTicket>,
    },
    /// Owner → every shard.
    BreakerView { key: BreakerKey, view: BreakerView },
    /// Owner → every shard.
    ConnectionView {
        connection: ConnectionId,
        view: ConnectionView,
    },
    /// Owner → every shard.
    Lockout(Box<LockUpdate>),
    /// To the owner of a connection that a shard is about to select: its cooldown has
    /// passed but its backoff level has not decayed yet (spec A §3.1 auto-decay).
    AutoDecay { connection: ConnectionId },
    /// To the owner of a sibling connection: cool it until `until_ms` (egress lock).
    EgressCool {
        connection: ConnectionId,
        until_ms: u64,
        reason: Reason,
    },
    /// Asker → owner: may I send the half-open probe for `key`? `id` names the waiter.
    ProbeRequest { key: BreakerKey, id: u64 },
    /// Owner → asker.
    ProbeReply {
        id: u64,
        ticket: Option<ProbeTicket>,
        retry_after_ms: u64,
    },
    /// Asker → owner of `connection`: permits for the connection's concurrency gates
    /// (`max_concurrent`, and `model_concurrency` for `model`). `id` is unique across shards.
    GateAcquire {
        id: u64,
        connection: ConnectionId,
        model: String,
        deadline_ns: Option<u64>,
    },
    /// Owner → asker: granted (now or when a permit came free); `serial` names the permit.
    GateGrant { id: u64, serial: u64 },
    /// Owner → asker: refused (queue full) or timed out.
    GateDenied { id: u64, error: GateError },
    /// Asker → owner: the attempt holding permit `serial` is over (exactly once).
    GateRelease {
        connection: ConnectionId,
        serial: u64,
    },
    /// Asker → owner: the waiter `id` gave up.
    GateCancel { connection: ConnectionId, id: u64 },
    /// Gate home → itself: its next waiter deadline or block end is due.
    GateTick,
    /// Connection owner → gate home: the upstream refused with a retry hint; block the
    /// connection's account gate (else its `model` gate) until `until_ns` (monotonic).
    GateBlock {
        connection: ConnectionId,
        model: String,
        until_ns: u64,
    },
    /// Asker → quota-share home: order these candidates of combo `combo` (its name) and
    /// count the chosen one in flight (B §2.4).
    QsSelect {
        id: u64,
        combo: String,
        candidates: Vec<QsCandidate>,
    },
    /// Quota-share home → asker.
    QsPicked { id: u64, pick: Box<QsPick> },
    /// Asker → quota-share home: the dispatch holding in-flight ticket `serial` is over.
    QsRelease { serial: u64 },
    /// Asker → gate home of `connection`: its `qsconn` slot (B §2.3; answered with
    /// `GateGrant` / `GateDenied`, returned with `GateRelease`).
    QsSlotAcquire {
        id: u64,
        connection: ConnectionId,
        deadline_ns: Option<u64>,
    },
    /// Asker → owner of `connection`: a slot in the connection's request queue (the
    /// per-connection limiter; granted at once when the limiter is off).
    QueueAcquire {
        id: u64,
        connection: ConnectionId,
        model: String,
        /// When this request first asked (monotonic ns): bounds its wait for the
        /// provider's sliding window before it fails open (B §1.2b).
        waiting_since_ns: u64,
    },
    /// Owner → asker: the slot is held; dispatch at `start_at_ns` (monotonic).
    QueueGrant { id: u64, start_at_ns: u64 },
    /// Owner → asker: the provider's sliding window is full; ask again at `at_ns`.
    QueueRetry { id: u64, at_ns: u64 },
    /// Owner → asker: queue full, queue-wait timeout or wedged.
    QueueDenied { id: u64, error: QueueError },
    /// Asker → owner: the attempt holding slot `id` is over (exactly once). `answered`:
    /// the upstream's successful answer, for the queue to learn from (B §1.2).
    QueueFinish {
        connection: ConnectionId,
        id: u64,
        answered: Option<Box<SuccessAnswer>>,
    },
    /// Asker → owner: the waiter `id` gave up.
    QueueCancel { connection: ConnectionId, id: u64 },
    /// Owner → itself, at a limiter's next wake-up: expire overdue waiters, grant the next.
    QueueTick { key: String },
    /// Return a probe permit that never produced a verdict.
    ReleaseProbe {
        key: BreakerKey,
        ticket: ProbeTicket,
    },
}
