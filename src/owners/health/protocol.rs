//! The health protocol: what an attempt's end tells the owners of its connection and
//! provider, the half-open probe call, and the views owners broadcast.
//!
//! A failure is classified once, on the shard that saw the answer, into a [`Verdict`]:
//! numbers, enums and one bounded, sanitised `lastError` line — never the upstream's body
//! or its header list. The owner applies only the stateful part (the cooldown from its own
//! backoff level, breaker counts, terminal states, lockouts, egress cooling).

use crate::config::{ConnectionId, ProviderId};
use crate::resilience::breaker::{BreakerKey, BreakerState, BreakerView, Failure, ProbeTicket};
use crate::resilience::connection::{
    ClearOutcome, ConnectionView, ProviderErrorType, TestStatus, sanitize,
};
use crate::resilience::lockout::LockUpdate;
use crate::resilience::tracker::TrackerKey;
use crate::resilience::{FallbackDecision, Reason, RuleScope};

/// The `lastError` an owner records: sanitised, at most
/// [`MAX_LAST_ERROR_BYTES`](crate::resilience::connection::MAX_LAST_ERROR_BYTES) bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastError(String);

impl LastError {
    pub fn new(message: &str) -> Self {
        Self(sanitize(message))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A failed attempt, classified on the shard that saw it.
#[derive(Clone, Debug)]
pub struct Verdict {
    /// The status after restatement (504 for a timeout, 502 for a connect failure).
    pub status: u16,
    /// `checkFallbackError`'s decision, at the asker's view of the backoff level.
    pub decision: FallbackDecision,
    /// What the breaker counts.
    pub breaker: Failure,
    /// `classifyProviderError`'s type (A §3.6) for the terminal-state rules.
    pub error_type: Option<ProviderErrorType>,
    /// The text carried a credits-exhausted signal.
    pub credits_signal: bool,
    pub last_error: LastError,
}

impl Verdict {
    /// A network failure (counted on the provider's breaker, not the connection's).
    pub fn is_network(&self) -> bool {
        matches!(self.breaker, Failure::ConnectFailed)
    }

    /// A transient failure: a rate limit, a capacity or server error (408, 5xx) or a
    /// timeout. Never a quota, auth, ban or credits verdict, a rule scoped to the connection
    /// or the provider, nor a connect failure (the host is down for every model). A combo
    /// does not persist these as a connection cooldown (`persistUnavailableState = false`,
    /// A §3.5): the model is locked on that connection instead, and the combo's other
    /// targets keep using it.
    pub fn is_transient(&self) -> bool {
        let d = &self.decision;
        if d.permanent || d.credits_exhausted || d.daily_quota_exhausted || self.credits_signal {
            return false;
        }
        if matches!(
            d.rule_scope,
            Some(RuleScope::Connection | RuleScope::Provider)
        ) {
            return false;
        }
        match self.breaker {
            Failure::ConnectFailed => return false,
            Failure::Timeout => return true,
            Failure::Status(_) | Failure::RequestScoped => {}
        }
        match d.reason {
            Reason::RateLimitExceeded | Reason::ServerError | Reason::ModelCapacity => true,
            Reason::Unknown => self.status == 408 || self.status >= 500,
            Reason::AuthError
            | Reason::NetworkError
            | Reason::QuotaExhausted
            | Reason::ServiceNotRunning
            | Reason::NotFound
            | Reason::ExecutorContractViolation
            | Reason::InvalidPreviousResponseBinding
            | Reason::ProviderModelUnsupported => false,
        }
    }
}

/// An attempt made for a combo target: what the owner needs to apply the combo path's rules
/// (A §1.6 path 4, §3.5 `persistUnavailableState`, §4.5 combo lockouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ComboAttempt {
    /// The combo's next target (after this one's connections) is on the same provider: a
    /// failure is then not a breaker failure (unless it is a network error).
    pub next_same_provider: bool,
}

/// How an attempt ended.
#[derive(Clone, Debug)]
pub enum Ended {
    /// The upstream answered 2xx (and a stream, if any, ended cleanly).
    Success,
    /// An error answer, a timeout or a connect failure.
    Failed(Box<Verdict>),
    /// The stream stalled (the content-stall or throughput watchdog; before or after its
    /// first byte) or broke after its first byte: what the connection records as its last
    /// error (`stream_content_stall`, `stream_interrupted`, `timeout`) and the message.
    /// Never counted on a breaker.
    StreamBroken {
        error_type: ProviderErrorType,
        last_error: LastError,
    },
    /// The client went away (never counted against the upstream).
    ClientAbort,
}

/// The fact an owner applies: an attempt on `connection` ended so.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub provider: ProviderId,
    pub connection: ConnectionId,
    /// The upstream model id.
    pub model: String,
    pub ended: Ended,
    /// The connection breaker's probe permit this attempt carried, if any.
    pub probe: Option<ProbeTicket>,
    /// The attempt was for a combo's target (`None`: a direct request); its failures feed
    /// the provider cooldown tracker.
    pub combo: Option<ComboAttempt>,
}

/// How an attempt ended, as the provider's owner needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderEnded {
    Success,
    Failed(Failure),
}

/// To the owner of a provider: an attempt's end that concerns the provider breaker (a
/// success, a network failure, or the end of the provider breaker's half-open probe) or
/// the provider cooldown tracker (a combo target's failure).
#[derive(Clone, Copy, Debug)]
pub struct ProviderReport {
    pub provider: ProviderId,
    pub ended: ProviderEnded,
    /// The provider breaker's probe permit this attempt carried, if any.
    pub probe: Option<ProbeTicket>,
    /// The attempt was a combo target.
    pub combo: bool,
}

pub enum Fact {
    /// An outcome nobody waits for (successes, client aborts).
    Outcome(Box<Outcome>),
    /// To the owner of a provider: a success (closes/decays the breaker, clears the
    /// tracker) nobody waits for.
    ProviderResult(ProviderReport),
    /// A probe permit that never produced a verdict.
    ReleaseProbe {
        key: BreakerKey,
        ticket: ProbeTicket,
    },
    /// A shard is about to select a connection whose cooldown has passed but whose backoff
    /// level has not decayed yet (A §3.1 auto-decay).
    AutoDecay { connection: ConnectionId },
    /// Cool a sibling connection until `until_ms` (egress lock).
    EgressCool {
        connection: ConnectionId,
        until_ms: u64,
        reason: Reason,
    },
}

/// An egress sibling a failure's owner cooled (told the sibling's owner to cool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EgressCooled {
    pub connection: ConnectionId,
    pub until_ms: u64,
    pub reason: Reason,
}

pub enum Request {
    /// May I send the half-open probe for this breaker?
    Probe(BreakerKey),
    /// A failure outcome: answered once applied and its views sent, so the asker (and,
    /// through ring order, every view sent before) is current before it answers its client.
    Outcome(Box<Outcome>),
    /// A failure the provider's owner applies (a network failure, a settled half-open
    /// probe, a combo failure for the tracker): answered once applied, as `Outcome`.
    ProviderResult(ProviderReport),
    /// To a sibling's owner, from the shard whose failure egress-cooled it: the same
    /// cooling as `Fact::EgressCool` (whichever arrives second changes nothing), answered
    /// once its view is sent, so the asker routes its retry on it.
    EgressCool(EgressCooled),
    /// The management API (asked of every shard, or of one connection's owner).
    Admin(AdminRequest),
}

/// What the management API asks of a health owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminRequest {
    /// `POST /api/resilience/reset` (A §1.11): every breaker this shard owns back to
    /// closed (they stay registered), every model lockout and failure state cleared.
    /// Connection cooldowns, terminal states and the tracker are left alone.
    Reset,
    /// `POST /api/resilience/cooldowns` (A §5.2) for one connection this shard owns.
    ClearConnection(ConnectionId),
    /// `DELETE /api/resilience/model-cooldowns {provider, model}` (A §4.8).
    ClearLocks { provider: String, model: String },
    /// `DELETE /api/resilience/model-cooldowns {all: true}`.
    ClearAllLocks,
    /// What this owner holds, for the health and listing endpoints.
    Status,
}

/// One breaker as the health endpoint shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerEntry {
    pub key: BreakerKey,
    pub state: BreakerState,
    pub failure_count: u32,
    pub last_failure_wall_ms: Option<u64>,
    pub retry_after_ms: u64,
}

/// One connection record as the cooldown listing shows it (never its `lastError` text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionEntry {
    pub connection: ConnectionId,
    pub test_status: TestStatus,
    pub backoff_level: u32,
    /// `rateLimitedUntil` (wall ms), expired or not.
    pub rate_limited_until_ms: Option<u64>,
    pub error_type: Option<ProviderErrorType>,
    pub error_code: Option<u16>,
    pub error_at_ms: Option<u64>,
}

/// One live model lockout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockEntry {
    pub provider: String,
    /// The lock key's model part.
    pub model: String,
    pub connection: Option<ConnectionId>,
    pub reason: &'static str,
    pub remaining_ms: u64,
    pub failure_count: u32,
}

/// What one health owner holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnerStatus {
    pub breakers: Vec<BreakerEntry>,
    pub connections: Vec<ConnectionEntry>,
    pub lockouts: Vec<LockEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The probe is ours (`ticket`), or not for `retry_after_ms` (0: the breaker is closed).
    Probe {
        key: BreakerKey,
        ticket: Option<ProbeTicket>,
        retry_after_ms: u64,
    },
    /// The outcome was applied; `egress`: the siblings its failure egress-cooled (their
    /// owners were told; the asker makes sure of their views before it routes again).
    Applied {
        egress: Vec<EgressCooled>,
    },
    /// `AdminRequest::Reset`: breakers reset and lock entries removed here.
    Reset {
        breakers: u32,
        lockouts: u32,
    },
    /// `AdminRequest::ClearConnection`.
    Cleared {
        outcome: ClearOutcome,
        lockouts: u32,
    },
    /// `AdminRequest::ClearLocks` / `ClearAllLocks`: whether anything was removed.
    Removed {
        any: bool,
    },
    Status(Box<OwnerStatus>),
}

/// Owner → every shard: "routable, or not until T, and why".
#[derive(Clone, Debug)]
pub enum View {
    Breaker {
        key: BreakerKey,
        view: BreakerView,
    },
    Connection {
        connection: ConnectionId,
        view: ConnectionView,
    },
    Lockout(Box<LockUpdate>),
    /// A provider cooldown tracker entry (only while `provider_cooldown.enabled`).
    Tracker {
        key: TrackerKey,
        view: TrackerView,
    },
}

/// What routing needs of a provider cooldown tracker entry (spec A §2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackerView {
    /// Per key, strictly increasing on the owner.
    pub epoch: u64,
    /// Skip the key until this monotonic ms (0: no cooldown).
    pub until_mono_ms: u64,
    /// Failures since the key's last success (a success is news while this is > 0).
    pub failures: u32,
}

/// The longest `lastError` a verdict carries.
#[cfg(test)]
pub const MAX_VERDICT_TEXT_BYTES: usize = crate::resilience::connection::MAX_LAST_ERROR_BYTES;
