//! The provider circuit breaker (spec A §1): one per key — a provider, or a connection for
//! connection-scoped breakers (§1.9) — owned and mutated only by the key's owner shard
//! (ARCHITECTURE §3). This module owns the breaker's state machine, the rule of which
//! failures trip it, the registry of breakers on one shard ([`BreakerTable`]), the facts
//! other shards route on ([`BreakerView`]), the persisted form ([`BreakerRecord`]) and the
//! client- and operator-visible facts (§1.8 response, §1.10 health JSON).
//!
//! # Mechanism and policy
//!
//! Two layers, kept apart as in linkerd's breakers:
//!
//! * the **mechanism** is the private `Gate`: CLOSED (traffic flows), OPEN until a deadline,
//!   or HALF_OPEN with exactly one probe permit. It knows nothing about failures; every trip
//!   carries a [`TripReason`] for observability.
//! * the **policy** decides what moves the gate: [`Failure`] is the closed set of ways an
//!   attempt can fail, [`Failure::counts`] is the trip predicate (statuses 408, 500, 502,
//!   503, 504, upstream timeouts and connect failures; never client aborts, the gateway's
//!   own queue/gate errors or request-scoped failures), and the failure counter with its
//!   degradation threshold, open-cycle escalation and per-kind cooldowns (§1.4) decides when
//!   to trip and for how long.
//!
//! # States (§1.4)
//!
//! `CLOSED` → (`degradation_threshold` failures) → `DEGRADED` → (`failure_threshold`
//! failures) → `OPEN` → (cooldown elapsed, computed lazily on every read; no timer) →
//! `HALF_OPEN` → one probe → success: `CLOSED`; failure: `OPEN` again with
//! `open_cycle_count + 1` and the escalated cooldown
//! `min(reset × 2^(cycles − escalation_count), reset × max_backoff_multiplier)` once
//! `cycles > escalation_count`. A success in `CLOSED`/`DEGRADED` lowers the count by one and
//! leaves `DEGRADED` once the count is `≤ degradation_threshold`.
//!
//! # Probes
//!
//! [`Breaker::admit`] hands out at most one [`ProbeTicket`] per half-open period. The ticket
//! is plain data (it crosses the shard mesh); the attempt reports its outcome with it. Only
//! the outstanding probe's outcome decides a half-open period: a ticket that is stale (its
//! permit timed out, or the period ended) is treated like an outcome without a ticket.
//!
//! # Time
//!
//! Every method takes [`Now`]. Internally all instants are **monotonic milliseconds**
//! (`now.mono_ns / 10⁶`, signed so that restored instants may predate the process): a
//! wall-clock step (NTP, VM resume) can then neither keep a breaker open for hours nor
//! close it early. Wall-clock milliseconds appear only at the edges, computed from the
//! monotonic instant and `now`: in [`Transition`]s and [`BreakerView`]s (`until_wall_ms`,
//! for display), in [`BreakerStatus`]/health JSON, and in [`BreakerRecord`], the persisted
//! form, whose deadlines are wall-clock ms as ARCHITECTURE §5 requires. Import converts back
//! relative to the importing `now` and never trusts a deadline blindly (see
//! [`BreakerTable::import`]). The trade-off: a deadline persisted by a machine whose clock
//! was wrong is bounded by the profile's cooldown rather than honoured.
//!
//! # Views and epochs
//!
//! Every change another shard must see (trip, degrade, recover, probe admitted/settled/
//! released, reset) returns a [`Transition`] (an import returns the views to broadcast);
//! its [`BreakerView`] carries an
//! `epoch` that strictly increases per key (also across eviction and re-creation, see
//! [`BreakerTable`]). Owners broadcast `transition.view`; replicas keep the newest epoch
//! ([`BreakerView::apply`]). Lazy changes (an OPEN deadline passing, a stuck probe's permit
//! returning) need no broadcast: a view evaluates them itself ([`BreakerView::gate`]) exactly
//! as the owner does, so routing on a replica agrees with the owner.
//!
//! # Deviations from OmniRoute (copy to `docs/compat.md`)
//!
//! 1. A failed half-open probe reopens the breaker with `open_cycle_count + 1` (OmniRoute's
//!    direct path counted every returned dispatch as a success first, closing the breaker
//!    and leaving the count at 1; ARCHITECTURE §6).
//! 2. A probe that never settles returns its permit after `half_open_probe_timeout_ms`
//!    (upstream #13836: stuck for 6 days). A timed-out probe is not a failure.
//! 3. A success lowers the failure count once, not twice (OmniRoute's single-model path
//!    decremented in `execute()` and again directly).
//! 4. Only the outstanding probe decides a half-open period. Outcomes reported without the
//!    current ticket (requests admitted before the trip, bypassing requests, stale tickets)
//!    are ignored while `OPEN` or `HALF_OPEN`. OmniRoute: a success on a bypassed request
//!    closes even an `OPEN` breaker, any success closes `HALF_OPEN`, and a failure while
//!    `HALF_OPEN` with its permit unused reopens it.
//! 5. Failures while `OPEN` never restart or extend the cooldown (OmniRoute's direct
//!    "record failure" restarted it; its `recordProviderFailure` path ignored them, as here).
//! 6. A probe whose attempt got an upstream answer that is not a trip status (400, 404, 429,
//!    …) closes the breaker — the provider answered. A probe that ended without an upstream
//!    verdict (client abort, status 499, the gateway's own limits, request-scoped failure)
//!    returns its permit instead of deciding anything.
//! 7. The full profile (thresholds, reset timeout, escalation) always applies; OmniRoute's
//!    call sites each set part of it, and breakers restored from its DB ran with defaults
//!    (5 failures / 30 s) until a request path reconfigured them (spec A §8.8).
//! 8. The OPEN deadline is persisted explicitly (`open_until_wall_ms`) and bounded on import
//!    by the effective cooldown; OmniRoute derived it from `lastFailureTime`.
//! 9. `kindThresholds` (per-kind immediate open) and the 20-entry transition history are not
//!    kept: no production caller configured the former; transitions are returned to the
//!    owner, which logs and broadcasts them, and the last [`TripReason`] is kept.
//! 10. The registry cap of 500 breakers applies per owner shard's table.
//! 11. `reset_all` keeps breakers registered (as `POST /api/resilience/reset`, §1.11, does);
//!     the sweep removes idle ones later.
//!
//! # Decisions on ambiguities
//!
//! * Upstream timeouts (response head, body idle) count like a 408/504; connect failures
//!   (DNS, TCP, TLS, egress proxy unreachable) count as network errors: provider-wide (never
//!   connection-scoped, §1.9) with the 10 s per-provider dedupe of §1.6.
//! * The per-connection 5 s dedupe of §1.6 applies to connection-scoped breakers; probe
//!   outcomes are never deduplicated.
//! * §1.7's 429 hints are implemented (`cooldown_by_kind`: rate limit 60 s, quota 1 h,
//!   replacing the escalated base) but **inert through [`Failure`]**: the §1.7 classifier
//!   yields a non-transient kind only for status 429, and 429 never counts (§1.6, the
//!   guide: 429 belongs to connection cooldown and model lockout). This matches OmniRoute,
//!   whose classifier only runs on thrown errors. [`Breaker::on_counted_failure`] accepts a
//!   kind for callers that classify a counted failure themselves.
//! * A half-open breaker whose probe is in flight rejects with `retry_after_ms =
//!   min(1000, time until the probe's permit returns)`; the client sees `Retry-After: 1`,
//!   as in OmniRoute. `retryAfterMs` in status/health is 0 for `HALF_OPEN`, as in OmniRoute.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use super::backoff::format_rfc3339_ms;
use crate::clock::Now;
use crate::config::resilience::{BreakerProfile, PerAuth, ResilienceSettings};
use crate::config::{AuthKind, Config, ConnectionId, ProviderId};

/// Statuses that count as provider-level failures (`PROVIDER_BREAKER_FAILURE_STATUSES`).
pub const TRIP_STATUSES: [u16; 5] = [408, 500, 502, 503, 504];
/// Breaker cooldown for a `rate_limit` failure when 429 hints are on (§1.7).
pub const RATE_LIMIT_COOLDOWN_MS: u64 = 60_000;
/// Breaker cooldown for a `quota_exhausted` failure when 429 hints are on (§1.7).
pub const QUOTA_EXHAUSTED_COOLDOWN_MS: u64 = 3_600_000;
/// A connection-scoped breaker counts at most one failure per this window (§1.6).
pub const CONNECTION_FAILURE_DEDUPE_MS: u64 = 5_000;
/// A provider breaker counts at most one network failure per this window (§1.6).
pub const NETWORK_FAILURE_DEDUPE_MS: u64 = 10_000;
/// Soft cap on breakers per table: only idle closed breakers are evicted to stay under it.
pub const MAX_BREAKERS: usize = 500;
/// The sweep removes idle closed breakers whose last failure is older than this (§1.5).
pub const IDLE_EVICT_AFTER_MS: u64 = 30 * crate::config::resilience::MINUTE_MS;
/// How often the owner should call [`BreakerTable::sweep`] (§1.5).
pub const SWEEP_INTERVAL_MS: u64 = 5 * crate::config::resilience::MINUTE_MS;
/// Longest `retry_after_ms` of a rejection while a half-open probe is in flight.
pub const PROBE_BUSY_RETRY_AFTER_MS: u64 = 1_000;

/// The breaker trip predicate on an upstream status (§1.6).
pub fn counts_as_failure(status: u16) -> bool {
    TRIP_STATUSES.contains(&status)
}

// ---------------------------------------------------------------------------------------
// Vocabulary
// ---------------------------------------------------------------------------------------

/// A breaker's state as OmniRoute names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum BreakerState {
    Closed,
    /// Traffic still flows; failures are elevated.
    Degraded,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "CLOSED",
            BreakerState::Degraded => "DEGRADED",
            BreakerState::Open => "OPEN",
            BreakerState::HalfOpen => "HALF_OPEN",
        }
    }

    /// Whether requests flow without asking the owner.
    pub fn is_closed(self) -> bool {
        matches!(self, BreakerState::Closed | BreakerState::Degraded)
    }
}

/// What kind of failure opened the breaker, for per-kind cooldowns (§1.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    Transient,
    RateLimit,
    QuotaExhausted,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Transient => "transient",
            FailureKind::RateLimit => "rate_limit",
            FailureKind::QuotaExhausted => "quota_exhausted",
        }
    }

    /// `cooldownByKind` when 429 hints are on: replaces the escalated base cooldown.
    pub fn cooldown_ms(self) -> Option<u64> {
        match self {
            FailureKind::Transient => None,
            FailureKind::RateLimit => Some(RATE_LIMIT_COOLDOWN_MS),
            FailureKind::QuotaExhausted => Some(QUOTA_EXHAUSTED_COOLDOWN_MS),
        }
    }
}

/// Failures per kind since the breaker last closed (`kindFailureCounts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KindCounts {
    pub transient: u32,
    pub rate_limit: u32,
    pub quota_exhausted: u32,
}

impl KindCounts {
    fn bump(&mut self, kind: FailureKind) {
        let c = match kind {
            FailureKind::Transient => &mut self.transient,
            FailureKind::RateLimit => &mut self.rate_limit,
            FailureKind::QuotaExhausted => &mut self.quota_exhausted,
        };
        *c = c.saturating_add(1);
    }
}

/// How an attempt failed, as the breaker needs to know it. Callers map their outcome onto
/// this closed set; [`Failure::counts`] is the only trip predicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The upstream answered with this status (after restatement, A §6.1). Counts only
    /// for 408, 500, 502, 503, 504; 499 is a client abort.
    Status(u16),
    /// The upstream accepted the request but did not answer in time (response head, body
    /// idle, stream deadline). Counts.
    Timeout,
    /// The upstream, or the egress proxy in front of it, could not be reached (DNS, TCP,
    /// TLS, connect timeout). Counts, provider-wide, deduplicated (§1.6, §1.9).
    ConnectFailed,
    /// Classification decided the failure belongs to the request, not the provider
    /// (`skipProviderBreaker`, request-scoped upstream errors, §1.6). Never counts.
    RequestScoped,
}

/// What a failure means to the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// A provider-level failure of this kind.
    Counts(FailureKind),
    /// The upstream answered with something that is not a provider failure.
    Answered,
    /// No verdict on the upstream at all.
    Neutral,
}

impl Failure {
    /// Whether this failure counts toward opening the breaker.
    pub fn counts(self) -> bool {
        matches!(self.verdict(), Verdict::Counts(_))
    }

    /// A network error: provider-wide, never connection-scoped (§1.9).
    pub fn is_network(self) -> bool {
        matches!(self, Failure::ConnectFailed)
    }

    fn verdict(self) -> Verdict {
        match self {
            // The §1.7 classifier maps every status other than 429 to `transient`.
            Failure::Status(s) if counts_as_failure(s) => Verdict::Counts(FailureKind::Transient),
            Failure::Status(499) => Verdict::Neutral,
            Failure::Status(_) => Verdict::Answered,
            Failure::Timeout | Failure::ConnectFailed => Verdict::Counts(FailureKind::Transient),
            Failure::RequestScoped => Verdict::Neutral,
        }
    }
}

/// Why the gate opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TripReason {
    /// The failure count reached the threshold.
    FailureThreshold { failures: u32, threshold: u32 },
    /// The half-open probe failed; `cycle` is the new open-cycle count.
    ProbeFailed { cycle: u32 },
}

impl fmt::Display for TripReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TripReason::FailureThreshold {
                failures,
                threshold,
            } => write!(f, "failure-threshold ({failures}/{threshold})"),
            TripReason::ProbeFailed { cycle } => write!(f, "probe-failed (cycle {cycle})"),
        }
    }
}

/// Why a [`Transition`] happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransitionReason {
    /// → `OPEN`.
    Tripped(TripReason),
    /// `CLOSED` → `DEGRADED`.
    ElevatedFailures { failures: u32, threshold: u32 },
    /// `DEGRADED` → `CLOSED` after successes.
    Recovered,
    /// A half-open probe was admitted (from `OPEN` when its deadline had passed).
    ProbeAdmitted,
    /// `HALF_OPEN` → `CLOSED`.
    ProbeSucceeded,
    /// The probe ended without a verdict; its permit is back (`HALF_OPEN` → `HALF_OPEN`).
    ProbeReleased,
    /// `POST /api/resilience/reset` and friends.
    ManualReset,
    /// Loaded from a snapshot.
    Restored,
}

impl fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransitionReason::Tripped(r) => fmt::Display::fmt(r, f),
            TransitionReason::ElevatedFailures {
                failures,
                threshold,
            } => write!(f, "elevated-failures ({failures}/{threshold})"),
            TransitionReason::Recovered => f.write_str("recovery"),
            TransitionReason::ProbeAdmitted => f.write_str("probe-admitted"),
            TransitionReason::ProbeSucceeded => f.write_str("probe-success"),
            TransitionReason::ProbeReleased => f.write_str("probe-released"),
            TransitionReason::ManualReset => f.write_str("manual-reset"),
            TransitionReason::Restored => f.write_str("restored"),
        }
    }
}

/// The permit of the one half-open probe. Plain data so it can cross the shard mesh;
/// report the attempt's outcome with it, or [`Breaker::release_probe`] it if the attempt
/// never ran. A ticket nobody reports returns its permit after
/// `half_open_probe_timeout_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeTicket {
    id: u64,
}

impl ProbeTicket {
    /// The breaker epoch at which the probe was admitted (unique per key).
    #[cfg(test)]
    pub fn id(self) -> u64 {
        self.id
    }
}

/// The owner's answer to "may this attempt go?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// `CLOSED` or `DEGRADED`.
    Allow,
    /// The one half-open probe; broadcast `transition.view`.
    Probe {
        ticket: ProbeTicket,
        transition: Transition,
    },
    /// `OPEN`, or `HALF_OPEN` with the probe in flight. `retry_after_ms ≥ 1` and never
    /// past the moment the gate could admit again.
    Reject {
        retry_after_ms: u64,
        state: BreakerState,
    },
}

/// A change other shards must see. Owners broadcast `view`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: BreakerState,
    pub to: BreakerState,
    pub reason: TransitionReason,
    /// The new view; `view.state == to`, `view.epoch` is the transition's epoch.
    pub view: BreakerView,
}

impl Transition {
    #[cfg(test)]
    pub fn epoch(&self) -> u64 {
        self.view.epoch
    }
}

/// What a replica needs to route: the state and until when it holds, versioned by epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerView {
    pub state: BreakerState,
    /// Monotonic ms (process-wide clock) until which no attempt may go: the OPEN deadline,
    /// or the in-flight probe's permit deadline. `None` when nothing blocks.
    pub until_mono_ms: Option<i64>,
    /// `until_mono_ms` as wall-clock ms, as seen when the view was made (for display).
    pub until_wall_ms: Option<u64>,
    pub epoch: u64,
}

/// A view evaluated at some `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewGate {
    /// Route freely.
    Pass,
    /// Ask the owner for the probe ticket.
    Probe,
    /// Skip this target for now.
    Blocked { retry_after_ms: u64 },
}

impl BreakerView {
    /// The view of a breaker that does not exist (or was never tripped): closed.
    pub fn closed(epoch: u64) -> Self {
        Self {
            state: BreakerState::Closed,
            until_mono_ms: None,
            until_wall_ms: None,
            epoch,
        }
    }

    /// Evaluates the view at `now`, exactly as the owner's [`Breaker::admit`] does
    /// (an elapsed deadline means "a probe may go").
    pub fn gate(&self, now: Now) -> ViewGate {
        if self.state.is_closed() {
            return ViewGate::Pass;
        }
        let now_ms = mono_ms(now);
        match self.until_mono_ms {
            Some(until) if now_ms < until => {
                let left = u64::try_from(until - now_ms).unwrap_or(u64::MAX);
                let retry_after_ms = match self.state {
                    BreakerState::HalfOpen => left.min(PROBE_BUSY_RETRY_AFTER_MS),
                    _ => left,
                };
                ViewGate::Blocked { retry_after_ms }
            }
            _ => ViewGate::Probe,
        }
    }

    /// Applies a broadcast view idempotently: a newer epoch replaces this one; an equal
    /// epoch keeps the later `until`; older epochs are ignored. Returns whether it changed.
    pub fn apply(&mut self, other: &BreakerView) -> bool {
        let newer = other.epoch > self.epoch
            || (other.epoch == self.epoch && other.until_mono_ms > self.until_mono_ms);
        if newer {
            *self = *other;
        }
        newer
    }
}

/// A breaker's tuning: the category's profile, whether 429 hints apply, and the half-open
/// probe timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    pub profile: BreakerProfile,
    pub use_429_hints: bool,
    pub half_open_probe_timeout_ms: u64,
}

/// Breaker tuning for every category, from the resilience settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerSettings {
    pub profiles: PerAuth<BreakerProfile>,
    pub use_429_hints: PerAuth<bool>,
    pub half_open_probe_timeout_ms: u64,
}

impl BreakerSettings {
    pub fn from_resilience(s: &ResilienceSettings) -> Self {
        Self {
            profiles: s.provider_breaker.clone(),
            use_429_hints: PerAuth {
                oauth: s.use_upstream_429_breaker_hints(AuthKind::OAuth),
                apikey: s.use_upstream_429_breaker_hints(AuthKind::ApiKey),
                local: s.use_upstream_429_breaker_hints(AuthKind::Local),
            },
            half_open_probe_timeout_ms: s.half_open_probe_timeout_ms,
        }
    }

    pub fn config(&self, auth: AuthKind) -> BreakerConfig {
        BreakerConfig {
            profile: self.profiles.get(auth).clone(),
            use_429_hints: *self.use_429_hints.get(auth),
            half_open_probe_timeout_ms: self.half_open_probe_timeout_ms,
        }
    }
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self::from_resilience(&ResilienceSettings::default())
    }
}

// ---------------------------------------------------------------------------------------
// Mechanism: the gate
// ---------------------------------------------------------------------------------------

/// The one outstanding half-open probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Probe {
    id: u64,
    /// Monotonic ms at which the permit returns if the probe never settles.
    deadline_ms: i64,
}

/// Open, shut, or one probe. Knows nothing about failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    Closed,
    Open { until_ms: i64 },
    HalfOpen { probe: Option<Probe> },
}

impl Gate {
    /// The gate as it stands at `now_ms`: an elapsed OPEN is HALF_OPEN with its permit, and
    /// a probe past its deadline has returned its permit.
    fn at(self, now_ms: i64) -> Gate {
        match self {
            Gate::Open { until_ms } if now_ms >= until_ms => Gate::HalfOpen { probe: None },
            Gate::HalfOpen { probe: Some(p) } if now_ms >= p.deadline_ms => {
                Gate::HalfOpen { probe: None }
            }
            g => g,
        }
    }

    fn holds(self, ticket: ProbeTicket) -> bool {
        matches!(self, Gate::HalfOpen { probe: Some(p) } if p.id == ticket.id)
    }
}

// ---------------------------------------------------------------------------------------
// The breaker: gate + failure policy
// ---------------------------------------------------------------------------------------

/// Failure bookkeeping since the breaker last closed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Counts {
    failure_count: u32,
    /// Half-open probe successes (diagnostic).
    success_count: u32,
    open_cycle_count: u32,
    /// Monotonic ms of the last counted failure.
    last_failure_ms: Option<i64>,
    last_failure_kind: Option<FailureKind>,
    kind_counts: KindCounts,
}

/// One provider (or connection) circuit breaker. See the module docs.
#[derive(Clone, Debug)]
pub struct Breaker {
    config: BreakerConfig,
    gate: Gate,
    /// `CLOSED` with elevated failures; only meaningful while the gate is closed.
    degraded: bool,
    counts: Counts,
    epoch: u64,
    last_trip: Option<TripReason>,
}

impl Breaker {
    #[cfg(test)]
    pub fn new(config: BreakerConfig) -> Self {
        Self::with_epoch(config, 0)
    }

    /// A closed breaker whose epochs continue after `epoch` (see [`BreakerTable`]).
    pub fn with_epoch(config: BreakerConfig, epoch: u64) -> Self {
        Self {
            config,
            gate: Gate::Closed,
            degraded: false,
            counts: Counts::default(),
            epoch,
            last_trip: None,
        }
    }

    #[cfg(test)]
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// New tuning takes effect from the next event; a running cooldown keeps its deadline.
    pub fn set_config(&mut self, config: BreakerConfig) {
        self.config = config;
    }

    #[cfg(test)]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn failure_count(&self) -> u32 {
        self.counts.failure_count
    }

    #[cfg(test)]
    pub fn last_trip(&self) -> Option<TripReason> {
        self.last_trip
    }

    /// The state at `now` (an elapsed OPEN reads as HALF_OPEN).
    pub fn state(&self, now: Now) -> BreakerState {
        self.state_of(self.gate.at(mono_ms(now)))
    }

    /// What replicas route on, at `now`.
    pub fn view(&self, now: Now) -> BreakerView {
        let gate = self.gate.at(mono_ms(now));
        let until = match gate {
            Gate::Closed => None,
            Gate::Open { until_ms } => Some(until_ms),
            Gate::HalfOpen { probe } => probe.map(|p| p.deadline_ms),
        };
        BreakerView {
            state: self.state_of(gate),
            until_mono_ms: until,
            until_wall_ms: until.map(|u| wall_of(now, u)),
            epoch: self.epoch,
        }
    }

    /// Whether `ticket` is the outstanding probe at `now`.
    pub fn is_probe(&self, now: Now, ticket: ProbeTicket) -> bool {
        self.gate.at(mono_ms(now)).holds(ticket)
    }

    /// May an attempt go now? Hands out the one probe when half-open.
    pub fn admit(&mut self, now: Now) -> Admission {
        let before = self.state_of(self.gate);
        self.refresh(now);
        let view = self.view(now);
        match view.gate(now) {
            ViewGate::Pass => Admission::Allow,
            ViewGate::Blocked { retry_after_ms } => Admission::Reject {
                retry_after_ms: retry_after_ms.max(1),
                state: view.state,
            },
            ViewGate::Probe => {
                let id = self.epoch.saturating_add(1);
                let timeout = ms_i64(self.config.half_open_probe_timeout_ms.max(1));
                self.gate = Gate::HalfOpen {
                    probe: Some(Probe {
                        id,
                        deadline_ms: mono_ms(now).saturating_add(timeout),
                    }),
                };
                let transition = self.emit(now, before, TransitionReason::ProbeAdmitted);
                Admission::Probe {
                    ticket: ProbeTicket { id },
                    transition,
                }
            }
        }
    }

    /// A successful attempt. In `CLOSED`/`DEGRADED` it lowers the count by one; with the
    /// current probe ticket it closes a `HALF_OPEN` breaker; otherwise it is ignored.
    pub fn on_success(&mut self, now: Now, probe: Option<ProbeTicket>) -> Option<Transition> {
        self.refresh(now);
        let from = self.state_of(self.gate);
        match self.gate {
            Gate::Closed => {
                if self.counts.failure_count == 0 {
                    return None;
                }
                self.counts.failure_count -= 1;
                let degr = self.config.profile.degradation_threshold.max(1);
                if self.degraded && self.counts.failure_count <= degr {
                    self.degraded = false;
                    return Some(self.emit(now, from, TransitionReason::Recovered));
                }
                None
            }
            Gate::HalfOpen { .. } if probe.is_some_and(|t| self.gate.holds(t)) => {
                let success_count = self.counts.success_count.saturating_add(1);
                let last_failure_ms = self.counts.last_failure_ms;
                self.counts = Counts {
                    success_count,
                    last_failure_ms,
                    ..Counts::default()
                };
                self.gate = Gate::Closed;
                self.degraded = false;
                Some(self.emit(now, from, TransitionReason::ProbeSucceeded))
            }
            Gate::Open { .. } | Gate::HalfOpen { .. } => None,
        }
    }

    /// A failed attempt. Counted failures go to [`Breaker::on_counted_failure`]; with the
    /// current probe ticket, an upstream answer that does not count closes the breaker and
    /// a failure without an upstream verdict returns the permit; otherwise non-counting
    /// failures are ignored.
    pub fn on_failure(
        &mut self,
        now: Now,
        failure: Failure,
        probe: Option<ProbeTicket>,
    ) -> Option<Transition> {
        match failure.verdict() {
            Verdict::Counts(kind) => self.on_counted_failure(now, kind, probe),
            Verdict::Answered => match probe {
                Some(t) if self.is_probe(now, t) => self.on_success(now, probe),
                _ => None,
            },
            Verdict::Neutral => match probe {
                Some(t) => self.release_probe(now, t),
                None => None,
            },
        }
    }

    /// A provider-level failure of a known kind (the mechanism behind [`Breaker::on_failure`]).
    /// Ignored while `OPEN`, and while `HALF_OPEN` unless it is the current probe's.
    pub fn on_counted_failure(
        &mut self,
        now: Now,
        kind: FailureKind,
        probe: Option<ProbeTicket>,
    ) -> Option<Transition> {
        self.refresh(now);
        let from = self.state_of(self.gate);
        let is_probe = probe.is_some_and(|t| self.gate.holds(t));
        match self.gate {
            Gate::Open { .. } => return None,
            Gate::HalfOpen { .. } if !is_probe => return None,
            Gate::Closed | Gate::HalfOpen { .. } => {}
        }
        let now_ms = mono_ms(now);
        let c = &mut self.counts;
        c.failure_count = c.failure_count.saturating_add(1);
        c.last_failure_ms = Some(now_ms);
        if self.config.use_429_hints {
            c.last_failure_kind = Some(kind);
            c.kind_counts.bump(kind);
        } else {
            c.last_failure_kind = None;
        }
        if is_probe {
            self.counts.open_cycle_count = self.counts.open_cycle_count.saturating_add(1);
            let cycle = self.counts.open_cycle_count;
            return Some(self.trip(now, from, TripReason::ProbeFailed { cycle }));
        }
        let failures = self.counts.failure_count;
        let threshold = self.config.profile.failure_threshold.max(1);
        let degr = self.config.profile.degradation_threshold.max(1);
        if failures >= threshold {
            Some(self.trip(
                now,
                from,
                TripReason::FailureThreshold {
                    failures,
                    threshold,
                },
            ))
        } else if !self.degraded && failures >= degr {
            self.degraded = true;
            Some(self.emit(
                now,
                from,
                TransitionReason::ElevatedFailures {
                    failures,
                    threshold: degr,
                },
            ))
        } else {
            None
        }
    }

    /// Returns the probe permit without a verdict (the attempt never reached the upstream,
    /// or another gate refused it). Ignored unless `ticket` is the current probe.
    pub fn release_probe(&mut self, now: Now, ticket: ProbeTicket) -> Option<Transition> {
        self.refresh(now);
        if !self.gate.holds(ticket) {
            return None;
        }
        self.gate = Gate::HalfOpen { probe: None };
        Some(self.emit(now, BreakerState::HalfOpen, TransitionReason::ProbeReleased))
    }

    /// Back to `CLOSED` with every counter cleared. Always returns a transition (a reset is
    /// broadcast even when nothing changed, so replicas converge).
    pub fn reset(&mut self, now: Now) -> Transition {
        let from = self.state(now);
        self.gate = Gate::Closed;
        self.degraded = false;
        self.counts = Counts::default();
        self.last_trip = None;
        self.emit(now, from, TransitionReason::ManualReset)
    }

    /// The cooldown an OPEN period started now would last: the escalated reset timeout,
    /// replaced by the last failure kind's cooldown when 429 hints are on (§1.4).
    pub fn effective_cooldown_ms(&self) -> u64 {
        let by_kind = if self.config.use_429_hints {
            self.counts
                .last_failure_kind
                .and_then(FailureKind::cooldown_ms)
        } else {
            None
        };
        by_kind.unwrap_or_else(|| self.effective_reset_timeout_ms())
    }

    /// The reset timeout after open-cycle escalation (ignores per-kind cooldowns).
    pub fn effective_reset_timeout_ms(&self) -> u64 {
        let p = &self.config.profile;
        let reset = p.reset_timeout_ms.max(1);
        let cycles = self.counts.open_cycle_count;
        if cycles <= p.backoff_escalation_count {
            return reset;
        }
        let factor = 1u64
            .checked_shl(cycles - p.backoff_escalation_count)
            .unwrap_or(u64::MAX);
        reset
            .saturating_mul(factor)
            .min(reset.saturating_mul(u64::from(p.max_backoff_multiplier.max(1))))
    }

    /// Closed with no failures: may be evicted.
    pub fn is_idle(&self) -> bool {
        self.gate == Gate::Closed && self.counts.failure_count == 0
    }

    /// `getStatus()` (§1.4) at `now`.
    pub fn status(&self, now: Now) -> BreakerStatus {
        let now_ms = mono_ms(now);
        let gate = self.gate.at(now_ms);
        let retry_after_ms = match gate {
            Gate::Open { until_ms } => u64::try_from(until_ms - now_ms).unwrap_or(0),
            Gate::Closed | Gate::HalfOpen { .. } => 0,
        };
        BreakerStatus {
            state: self.state_of(gate),
            failure_count: self.counts.failure_count,
            success_count: self.counts.success_count,
            last_failure_wall_ms: self.counts.last_failure_ms.map(|t| wall_of(now, t)),
            retry_after_ms,
            last_failure_kind: self.counts.last_failure_kind,
            open_cycle_count: self.counts.open_cycle_count,
            kind_failure_counts: self.counts.kind_counts,
            degradation_threshold: self.config.profile.degradation_threshold,
            effective_reset_timeout_ms: self.effective_reset_timeout_ms(),
            probe_in_flight: matches!(gate, Gate::HalfOpen { probe: Some(_) }),
            last_trip: self.last_trip,
            epoch: self.epoch,
        }
    }

    /// The persisted form at `now` (an in-flight probe does not survive a restart).
    pub fn export(&self, now: Now) -> BreakerRecord {
        let gate = self.gate.at(mono_ms(now));
        BreakerRecord {
            state: self.state_of(gate),
            failure_count: self.counts.failure_count,
            last_failure_wall_ms: self.counts.last_failure_ms.map(|t| wall_of(now, t)),
            last_failure_kind: self.counts.last_failure_kind,
            open_cycle_count: self.counts.open_cycle_count,
            kind_failure_counts: self.counts.kind_counts,
            open_until_wall_ms: match gate {
                Gate::Open { until_ms } => Some(wall_of(now, until_ms)),
                Gate::Closed | Gate::HalfOpen { .. } => None,
            },
        }
    }

    /// Rebuilds a breaker from its persisted form, with the current tuning. An OPEN
    /// deadline is honoured only up to the effective cooldown from `now` (a snapshot
    /// written under a wrong clock cannot keep a provider out for longer than a real trip
    /// would); an expired or missing one leaves the breaker OPEN-elapsed, i.e. HALF_OPEN
    /// on the next read — one probe decides, never a silent close. A restored HALF_OPEN
    /// has its permit back. Epochs continue after `epoch`, and the restore itself is one.
    pub fn restore(config: BreakerConfig, record: &BreakerRecord, now: Now, epoch: u64) -> Self {
        let now_ms = mono_ms(now);
        let mut b = Self::with_epoch(config, epoch);
        b.counts = Counts {
            failure_count: record.failure_count,
            success_count: 0,
            open_cycle_count: record.open_cycle_count,
            last_failure_ms: record.last_failure_wall_ms.map(|w| mono_of(now, w)),
            last_failure_kind: record.last_failure_kind,
            kind_counts: record.kind_failure_counts,
        };
        b.gate = match record.state {
            BreakerState::Closed | BreakerState::Degraded => Gate::Closed,
            BreakerState::HalfOpen => Gate::HalfOpen { probe: None },
            BreakerState::Open => {
                let cap = b.effective_cooldown_ms();
                let until_wall = record
                    .open_until_wall_ms
                    .or_else(|| record.last_failure_wall_ms.map(|lf| lf.saturating_add(cap)));
                let remaining = until_wall
                    .map_or(0, |u| u.saturating_sub(now.wall_ms))
                    .min(cap);
                Gate::Open {
                    until_ms: now_ms.saturating_add(ms_i64(remaining)),
                }
            }
        };
        b.degraded = record.state == BreakerState::Degraded && record.failure_count > 0;
        b.epoch = b.epoch.saturating_add(1);
        b
    }

    // -- internals ----------------------------------------------------------------------

    fn state_of(&self, gate: Gate) -> BreakerState {
        match gate {
            Gate::Closed if self.degraded => BreakerState::Degraded,
            Gate::Closed => BreakerState::Closed,
            Gate::Open { .. } => BreakerState::Open,
            Gate::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Makes the lazy changes real (OPEN → HALF_OPEN, a stuck probe's permit returning).
    /// No epoch change: replicas compute the same from the view they hold.
    fn refresh(&mut self, now: Now) {
        self.gate = self.gate.at(mono_ms(now));
    }

    fn trip(&mut self, now: Now, from: BreakerState, reason: TripReason) -> Transition {
        let cooldown = ms_i64(self.effective_cooldown_ms().max(1));
        self.gate = Gate::Open {
            until_ms: mono_ms(now).saturating_add(cooldown),
        };
        self.degraded = false;
        self.last_trip = Some(reason);
        self.emit(now, from, TransitionReason::Tripped(reason))
    }

    fn emit(&mut self, now: Now, from: BreakerState, reason: TransitionReason) -> Transition {
        self.epoch = self.epoch.saturating_add(1);
        let view = self.view(now);
        Transition {
            from,
            to: view.state,
            reason,
            view,
        }
    }
}

/// `getStatus()` of one breaker (§1.4), wall-clock times as ms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerStatus {
    pub state: BreakerState,
    pub failure_count: u32,
    pub success_count: u32,
    pub last_failure_wall_ms: Option<u64>,
    /// Time left of an OPEN period; 0 otherwise.
    pub retry_after_ms: u64,
    pub last_failure_kind: Option<FailureKind>,
    pub open_cycle_count: u32,
    pub kind_failure_counts: KindCounts,
    pub degradation_threshold: u32,
    pub effective_reset_timeout_ms: u64,
    pub probe_in_flight: bool,
    pub last_trip: Option<TripReason>,
    pub epoch: u64,
}

/// The persisted form of one breaker (§1.5 plus the explicit OPEN deadline). Wall-clock
/// ms throughout. The key is kept beside it by the caller: ids are config indexes, so the
/// snapshot layer stores names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BreakerRecord {
    pub state: BreakerState,
    pub failure_count: u32,
    pub last_failure_wall_ms: Option<u64>,
    pub last_failure_kind: Option<FailureKind>,
    pub open_cycle_count: u32,
    pub kind_failure_counts: KindCounts,
    /// Set when `state` is OPEN.
    pub open_until_wall_ms: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// Client-visible and operator-visible facts
// ---------------------------------------------------------------------------------------

/// `Retry-After` seconds for a rejection: `max(ceil(ms / 1000), 1)` (§1.8).
pub fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1_000).max(1)
}

/// What the 503 of a breaker rejection says beyond its kind (§1.8). Its status, type, code
/// and `X-OmniRoute-Provider-Breaker` header are those of `ErrorKind::ProviderCircuitOpen`
/// (`error.rs` is the one map); `proxy::respond` writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CircuitOpenResponse {
    /// For the `Retry-After` header and `error.retry_after`.
    pub retry_after_s: u64,
    /// `error.message`.
    pub message: String,
    /// `error.provider`.
    pub provider: String,
}

/// The facts of the 503 for a rejection of `provider`'s breaker.
pub fn circuit_open_response(provider: &str, retry_after_ms: u64) -> CircuitOpenResponse {
    CircuitOpenResponse {
        retry_after_s: retry_after_secs(retry_after_ms),
        message: format!("Provider {provider} circuit breaker is open"),
        provider: provider.to_owned(),
    }
}

/// The 503's message when it is connections' breakers that are open, not the provider's:
/// it names them (`connections`, deduplicated, in order).
pub fn connections_open_message(provider: &str, connections: &[&str]) -> String {
    match connections {
        [one] => format!("Connection {one} circuit breaker is open (provider {provider})"),
        many => format!(
            "Connection circuit breakers are open for {} (provider {provider})",
            many.join(", ")
        ),
    }
}

/// One entry of `providerBreakers` in `GET /api/monitoring/health` (§1.10).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[cfg(test)]
pub struct ProviderBreakerJson {
    pub provider: String,
    pub state: BreakerState,
    pub failure_count: u32,
    /// ISO 8601 UTC, or null.
    pub last_failure: Option<String>,
    pub retry_after_ms: u64,
}

#[cfg(test)]
impl ProviderBreakerJson {
    #[cfg(test)]
    pub fn new(name: String, status: &BreakerStatus) -> Self {
        Self {
            provider: name,
            state: status.state,
            failure_count: status.failure_count,
            last_failure: status.last_failure_wall_ms.map(iso8601_utc),
            retry_after_ms: status.retry_after_ms,
        }
    }
}

/// One value of `providerHealth` in `GET /api/monitoring/health` (§1.10).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[cfg(test)]
pub struct ProviderHealthJson {
    pub state: BreakerState,
    pub failures: u32,
    /// ISO 8601 UTC, or null.
    pub last_failure: Option<String>,
    pub retry_after_ms: u64,
}

#[cfg(test)]
impl From<&BreakerStatus> for ProviderHealthJson {
    fn from(status: &BreakerStatus) -> Self {
        Self {
            state: status.state,
            failures: status.failure_count,
            last_failure: status.last_failure_wall_ms.map(iso8601_utc),
            retry_after_ms: status.retry_after_ms,
        }
    }
}

/// `circuitBreakers` in `GET /api/monitoring/health` (§1.10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BreakerCounts {
    pub open: usize,
    pub half_open: usize,
    pub degraded: usize,
    pub closed: usize,
    pub total: usize,
}

impl BreakerCounts {
    pub fn add(&mut self, state: BreakerState) {
        match state {
            BreakerState::Open => self.open += 1,
            BreakerState::HalfOpen => self.half_open += 1,
            BreakerState::Degraded => self.degraded += 1,
            BreakerState::Closed => self.closed += 1,
        }
        self.total += 1;
    }
}

/// Wall-clock ms as JavaScript's `toISOString()` prints it: `2026-08-12T10:00:00.000Z`
/// (the one formatter, [`format_rfc3339_ms`]).
pub fn iso8601_utc(wall_ms: u64) -> String {
    format_rfc3339_ms(wall_ms)
}

// ---------------------------------------------------------------------------------------
// The registry of one owner shard
// ---------------------------------------------------------------------------------------

/// What a breaker guards: a provider, or one connection (§1.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BreakerKey {
    Provider(ProviderId),
    Connection(ConnectionId),
}

impl BreakerKey {
    /// The breakers an attempt on `connection` of `provider` must pass, provider first.
    pub fn gating(provider: ProviderId, connection: ConnectionId) -> [BreakerKey; 2] {
        [
            BreakerKey::Provider(provider),
            BreakerKey::Connection(connection),
        ]
    }

    /// The breaker a counted failure is recorded on (§1.9): the connection's, unless it
    /// is a network error (a dead proxy fails every account) or no connection is known.
    pub fn for_failure(
        provider: ProviderId,
        connection: Option<ConnectionId>,
        failure: Failure,
    ) -> BreakerKey {
        match connection {
            Some(c) if !failure.is_network() => BreakerKey::Connection(c),
            _ => BreakerKey::Provider(provider),
        }
    }

    /// The breakers a success is recorded on (§1.6): the connection's (primary) and the
    /// provider's.
    #[cfg(test)]
    pub fn for_success(provider: ProviderId, connection: Option<ConnectionId>) -> Vec<BreakerKey> {
        let mut keys = Vec::with_capacity(2);
        if let Some(c) = connection {
            keys.push(BreakerKey::Connection(c));
        }
        keys.push(BreakerKey::Provider(provider));
        keys
    }

    /// The registry name OmniRoute shows: `<provider>` or `<provider>::conn::<connection>`.
    pub fn name(self, config: &Config) -> String {
        let provider_name = |p: ProviderId| {
            config
                .provider_by_id(p)
                .map_or("unknown", |p| p.name.as_str())
        };
        match self {
            BreakerKey::Provider(p) => provider_name(p).to_owned(),
            BreakerKey::Connection(c) => match config.connection_by_id(c) {
                Some(conn) => format!("{}::conn::{}", provider_name(conn.provider), conn.name),
                None => format!("unknown::conn::{}", c.0),
            },
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    auth: AuthKind,
    breaker: Breaker,
    /// Monotonic ms of the last failure let through the connection dedupe.
    last_deduped_failure_ms: Option<i64>,
    /// Monotonic ms of the last network failure let through the provider dedupe.
    last_network_failure_ms: Option<i64>,
}

/// The breakers one owner shard holds, with the §1.6 dedupe policy, capacity eviction and
/// idle sweep (§1.5), resets (§1.11) and export/import for the snapshot.
///
/// Epochs: a breaker created for a key starts after the highest epoch any evicted breaker
/// of this table reached, so a replica holding a view of an evicted breaker never ignores
/// the new one's transitions.
#[derive(Clone, Debug)]
pub struct BreakerTable {
    settings: BreakerSettings,
    entries: HashMap<BreakerKey, Entry>,
    epoch_floor: u64,
    capacity: usize,
}

impl BreakerTable {
    pub fn new(settings: BreakerSettings) -> Self {
        Self::with_capacity(settings, MAX_BREAKERS)
    }

    pub fn with_capacity(settings: BreakerSettings, capacity: usize) -> Self {
        Self {
            settings,
            entries: HashMap::new(),
            epoch_floor: 0,
            capacity: capacity.max(1),
        }
    }

    #[cfg(test)]
    pub fn settings(&self) -> &BreakerSettings {
        &self.settings
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// How many breakers the table holds (`tidegate_owner_entries`).
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: BreakerKey) -> Option<&Breaker> {
        self.entries.get(&key).map(|e| &e.breaker)
    }

    pub fn iter(&self) -> impl Iterator<Item = (BreakerKey, &Breaker)> {
        self.entries.iter().map(|(k, e)| (*k, &e.breaker))
    }

    /// The breaker for `key`, created closed with `auth`'s profile on first use (evicting
    /// idle breakers first when the table is full).
    pub fn get_or_create(&mut self, key: BreakerKey, auth: AuthKind) -> &mut Breaker {
        &mut self.entry(key, auth).breaker
    }

    /// The view of `key` at `now`; closed when the table has no breaker for it.
    pub fn view(&self, now: Now, key: BreakerKey) -> BreakerView {
        self.get(key)
            .map_or(BreakerView::closed(self.epoch_floor), |b| b.view(now))
    }

    /// [`Breaker::admit`]; a key without a breaker is closed.
    pub fn admit(&mut self, now: Now, key: BreakerKey) -> Admission {
        match self.entries.get_mut(&key) {
            Some(e) => e.breaker.admit(now),
            None => Admission::Allow,
        }
    }

    /// [`Breaker::on_success`]; also clears the connection dedupe window (§1.6).
    pub fn on_success(
        &mut self,
        now: Now,
        key: BreakerKey,
        probe: Option<ProbeTicket>,
    ) -> Option<Transition> {
        let e = self.entries.get_mut(&key)?;
        if e.breaker.state(now) != BreakerState::Open {
            e.last_deduped_failure_ms = None;
        }
        e.breaker.on_success(now, probe)
    }

    /// [`Breaker::on_failure`] after the §1.6 dedupe: a connection-scoped breaker counts at
    /// most one failure per [`CONNECTION_FAILURE_DEDUPE_MS`], a provider breaker at most
    /// one network failure per [`NETWORK_FAILURE_DEDUPE_MS`]. Probe outcomes are never
    /// deduplicated. Creates the breaker on its first counted failure.
    pub fn on_failure(
        &mut self,
        now: Now,
        key: BreakerKey,
        auth: AuthKind,
        failure: Failure,
        probe: Option<ProbeTicket>,
    ) -> Option<Transition> {
        if !failure.counts() {
            let e = self.entries.get_mut(&key)?;
            return e.breaker.on_failure(now, failure, probe);
        }
        let now_ms = mono_ms(now);
        let e = self.entry(key, auth);
        let is_probe = probe.is_some_and(|t| e.breaker.is_probe(now, t));
        if !is_probe {
            let within =
                |last: Option<i64>, window: u64| last.is_some_and(|t| now_ms - t < ms_i64(window));
            match key {
                BreakerKey::Connection(_) => {
                    if within(e.last_deduped_failure_ms, CONNECTION_FAILURE_DEDUPE_MS) {
                        return None;
                    }
                    e.last_deduped_failure_ms = Some(now_ms);
                }
                BreakerKey::Provider(_) if failure.is_network() => {
                    if within(e.last_network_failure_ms, NETWORK_FAILURE_DEDUPE_MS) {
                        return None;
                    }
                    e.last_network_failure_ms = Some(now_ms);
                }
                BreakerKey::Provider(_) => {}
            }
        }
        e.breaker.on_failure(now, failure, probe)
    }

    /// [`Breaker::release_probe`].
    pub fn release_probe(
        &mut self,
        now: Now,
        key: BreakerKey,
        ticket: ProbeTicket,
    ) -> Option<Transition> {
        self.entries
            .get_mut(&key)?
            .breaker
            .release_probe(now, ticket)
    }

    /// Resets one breaker (it stays registered); `None` when the table has none for `key`.
    #[cfg(test)]
    pub fn reset(&mut self, now: Now, key: BreakerKey) -> Option<Transition> {
        let e = self.entries.get_mut(&key)?;
        e.last_deduped_failure_ms = None;
        e.last_network_failure_ms = None;
        Some(e.breaker.reset(now))
    }

    /// Resets every breaker (§1.11); the result's length is the `resetCount`.
    pub fn reset_all(&mut self, now: Now) -> Vec<(BreakerKey, Transition)> {
        let mut out: Vec<_> = self
            .entries
            .iter_mut()
            .map(|(k, e)| {
                e.last_deduped_failure_ms = None;
                e.last_network_failure_ms = None;
                (*k, e.breaker.reset(now))
            })
            .collect();
        out.sort_by_key(|(k, _)| *k);
        out
    }

    /// New settings (PATCH). Every breaker takes its category's new tuning from the next
    /// event. If the 429-hint switch of any category changed, every breaker is reset
    /// (§1.7, §5.3); those transitions are returned.
    pub fn apply_settings(
        &mut self,
        now: Now,
        settings: BreakerSettings,
    ) -> Vec<(BreakerKey, Transition)> {
        let hints_changed = settings.use_429_hints != self.settings.use_429_hints;
        self.settings = settings;
        for e in self.entries.values_mut() {
            e.breaker.set_config(self.settings.config(e.auth));
        }
        if hints_changed {
            self.reset_all(now)
        } else {
            Vec::new()
        }
    }

    /// Removes idle breakers (closed, no failures) whose last failure is unknown or older
    /// than [`IDLE_EVICT_AFTER_MS`] (§1.5). Call every [`SWEEP_INTERVAL_MS`]. Returns the
    /// number removed.
    pub fn sweep(&mut self, now: Now) -> usize {
        let now_ms = mono_ms(now);
        let cutoff = now_ms.saturating_sub(ms_i64(IDLE_EVICT_AFTER_MS));
        let stale: Vec<BreakerKey> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.breaker.is_idle() && e.breaker.counts.last_failure_ms.is_none_or(|t| t < cutoff)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in &stale {
            self.remove(*k);
        }
        stale.len()
    }

    /// Drops the breakers `keep` refuses (a reload removed their provider or connection:
    /// nothing routes to them any more, so no transition is reported). Returns how many.
    pub fn retain(&mut self, mut keep: impl FnMut(BreakerKey) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|k, _| keep(*k));
        before - self.entries.len()
    }

    /// `circuitBreakers` counts at `now`.
    #[cfg(test)]
    pub fn counts(&self, now: Now) -> BreakerCounts {
        let mut c = BreakerCounts::default();
        for e in self.entries.values() {
            c.add(e.breaker.state(now));
        }
        c
    }

    /// Every breaker's persisted form, in key order.
    #[cfg(test)]
    pub fn export(&self, now: Now) -> Vec<(BreakerKey, BreakerRecord)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .map(|(k, e)| (*k, e.breaker.export(now)))
            .collect();
        out.sort_by_key(|(k, _)| *k);
        out
    }

    /// Loads persisted breakers (see [`Breaker::restore`] for how deadlines are trusted),
    /// replacing any breaker of the same key. Returns the views to broadcast, in key order.
    pub fn import(
        &mut self,
        now: Now,
        records: impl IntoIterator<Item = (BreakerKey, AuthKind, BreakerRecord)>,
    ) -> Vec<(BreakerKey, BreakerView)> {
        let mut out = Vec::new();
        for (key, auth, record) in records {
            let floor = self.epoch_for_new(key);
            let breaker = Breaker::restore(self.settings.config(auth), &record, now, floor);
            out.push((key, breaker.view(now)));
            self.entries.insert(
                key,
                Entry {
                    auth,
                    breaker,
                    last_deduped_failure_ms: None,
                    last_network_failure_ms: None,
                },
            );
        }
        out.sort_by_key(|(k, _)| *k);
        out
    }

    // -- internals ----------------------------------------------------------------------

    fn entry(&mut self, key: BreakerKey, auth: AuthKind) -> &mut Entry {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.evict_for_room();
        }
        let epoch = self.epoch_for_new(key);
        let config = self.settings.config(auth);
        self.entries.entry(key).or_insert_with(|| Entry {
            auth,
            breaker: Breaker::with_epoch(config, epoch),
            last_deduped_failure_ms: None,
            last_network_failure_ms: None,
        })
    }

    /// The first epoch of a new breaker for `key`: after every epoch it had before.
    fn epoch_for_new(&self, key: BreakerKey) -> u64 {
        let current = self.entries.get(&key).map_or(0, |e| e.breaker.epoch);
        self.epoch_floor.max(current)
    }

    /// Evicts idle breakers, oldest last failure first (none counts as oldest), until one
    /// more fits. Busy breakers are never evicted, so the cap is soft.
    fn evict_for_room(&mut self) {
        let mut idle: Vec<(i64, BreakerKey)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.breaker.is_idle())
            .map(|(k, e)| (e.breaker.counts.last_failure_ms.unwrap_or(i64::MIN), *k))
            .collect();
        idle.sort();
        let excess = (self.entries.len() + 1).saturating_sub(self.capacity);
        for (_, k) in idle.into_iter().take(excess) {
            self.remove(k);
        }
    }

    fn remove(&mut self, key: BreakerKey) {
        if let Some(e) = self.entries.remove(&key) {
            self.epoch_floor = self.epoch_floor.max(e.breaker.epoch);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The timeline: monotonic ms inside, wall-clock ms at the edges
// ---------------------------------------------------------------------------------------

/// `now` on the monotonic timeline, in ms (signed: restored instants may predate the
/// process).
pub(crate) fn mono_ms(now: Now) -> i64 {
    ms_i64(now.mono_ms())
}

/// The wall-clock ms of monotonic instant `t`, as seen from `now`.
pub(crate) fn wall_of(now: Now, t: i64) -> u64 {
    let wall = ms_i64(now.wall_ms).saturating_add(t.saturating_sub(mono_ms(now)));
    u64::try_from(wall).unwrap_or(0)
}

/// The monotonic instant of wall-clock ms `wall`, as seen from `now`.
pub(crate) fn mono_of(now: Now, wall: u64) -> i64 {
    mono_ms(now).saturating_add(ms_i64(wall).saturating_sub(ms_i64(now.wall_ms)))
}

pub(crate) fn ms_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use proptest::prelude::*;
    use serde_json::json;

    const WALL0: u64 = 1_700_000_000_000;

    /// A point `ms` into a run that started at wall-clock `WALL0`.
    fn at(ms: u64) -> Now {
        Now {
            mono_ns: ms * 1_000_000,
            wall_ms: WALL0 + ms,
        }
    }

    fn config(auth: AuthKind) -> BreakerConfig {
        BreakerSettings::default().config(auth)
    }

    fn custom(threshold: u32, degr: u32, reset_ms: u64, hints: bool) -> BreakerConfig {
        BreakerConfig {
            profile: BreakerProfile {
                failure_threshold: threshold,
                degradation_threshold: degr,
                reset_timeout_ms: reset_ms,
                max_backoff_multiplier: 4,
                backoff_escalation_count: 3,
            },
            use_429_hints: hints,
            half_open_probe_timeout_ms: 30_000,
        }
    }

    fn fail(b: &mut Breaker, now: Now, n: u32) -> Vec<Transition> {
        (0..n)
            .filter_map(|_| b.on_failure(now, Failure::Status(503), None))
            .collect()
    }

    fn expect_probe(b: &mut Breaker, now: Now) -> ProbeTicket {
        match b.admit(now) {
            Admission::Probe { ticket, transition } => {
                assert_eq!(transition.to, BreakerState::HalfOpen);
                assert_eq!(transition.reason, TransitionReason::ProbeAdmitted);
                ticket
            }
            other => panic!("expected a probe, got {other:?}"),
        }
    }

    fn expect_reject(b: &mut Breaker, now: Now) -> (u64, BreakerState) {
        match b.admit(now) {
            Admission::Reject {
                retry_after_ms,
                state,
            } => (retry_after_ms, state),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    /// Opens `b` at `now` and returns the cooldown it opened with.
    fn open_cooldown(t: &Transition, now: Now) -> u64 {
        assert_eq!(t.to, BreakerState::Open);
        u64::try_from(t.view.until_mono_ms.unwrap() - mono_ms(now)).unwrap()
    }

    #[test]
    fn apikey_degrades_at_7_and_opens_at_12_for_30_s() {
        let clock = ManualClock::new(WALL0);
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        assert!(fail(&mut b, clock.now(), 6).is_empty());
        assert_eq!(b.state(clock.now()), BreakerState::Closed);
        let t = fail(&mut b, clock.now(), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].from, t[0].to),
            (BreakerState::Closed, BreakerState::Degraded)
        );
        assert_eq!(
            t[0].reason,
            TransitionReason::ElevatedFailures {
                failures: 7,
                threshold: 7
            }
        );
        assert_eq!(t[0].reason.to_string(), "elevated-failures (7/7)");
        assert_eq!(b.admit(clock.now()), Admission::Allow);
        assert!(fail(&mut b, clock.now(), 4).is_empty());
        let t = fail(&mut b, clock.now(), 1);
        assert_eq!(
            (t[0].from, t[0].to),
            (BreakerState::Degraded, BreakerState::Open)
        );
        let trip = TripReason::FailureThreshold {
            failures: 12,
            threshold: 12,
        };
        assert_eq!(t[0].reason, TransitionReason::Tripped(trip));
        assert_eq!(b.last_trip(), Some(trip));
        assert_eq!(open_cooldown(&t[0], clock.now()), 30_000);
        assert_eq!(t[0].view.until_wall_ms, Some(WALL0 + 30_000));
        assert_eq!(
            expect_reject(&mut b, clock.now()),
            (30_000, BreakerState::Open)
        );
        clock.advance_ms(29_999);
        assert_eq!(expect_reject(&mut b, clock.now()), (1, BreakerState::Open));
    }

    #[test]
    fn oauth_degrades_at_5_and_opens_at_8_for_60_s() {
        let mut b = Breaker::new(config(AuthKind::OAuth));
        assert!(fail(&mut b, at(0), 4).is_empty());
        assert_eq!(fail(&mut b, at(0), 1)[0].to, BreakerState::Degraded);
        assert!(fail(&mut b, at(0), 2).is_empty());
        let t = fail(&mut b, at(0), 1);
        assert_eq!(open_cooldown(&t[0], at(0)), 60_000);
        assert_eq!(b.state(at(59_999)), BreakerState::Open);
        assert_eq!(b.state(at(60_000)), BreakerState::HalfOpen);
    }

    #[test]
    fn open_turns_half_open_lazily_on_read() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        let epoch = b.epoch();
        // Reads take `&self`: nothing is mutated, nothing is broadcast.
        assert_eq!(b.state(at(30_000)), BreakerState::HalfOpen);
        let v = b.view(at(30_000));
        assert_eq!(v.state, BreakerState::HalfOpen);
        assert_eq!(v.until_mono_ms, None);
        assert_eq!(v.gate(at(30_000)), ViewGate::Probe);
        assert_eq!(b.epoch(), epoch);
        assert_eq!(b.status(at(30_000)).retry_after_ms, 0);
        assert_eq!(b.status(at(10_000)).retry_after_ms, 20_000);
    }

    #[test]
    fn exactly_one_probe_per_half_open_period() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        let ticket = expect_probe(&mut b, at(30_000));
        for (t, retry) in [
            (30_000, 1_000),
            (45_000, 1_000),
            (59_000, 1_000),
            (59_999, 1),
        ] {
            assert_eq!(
                expect_reject(&mut b, at(t)),
                (retry, BreakerState::HalfOpen),
                "at {t}"
            );
        }
        assert!(b.is_probe(at(40_000), ticket));
        let v = b.view(at(40_000));
        assert_eq!(v.until_mono_ms, Some(60_000));
        let r = circuit_open_response("openai", 1_000);
        assert_eq!(r.retry_after_s, 1);
    }

    #[test]
    fn probe_success_closes_and_clears_the_counters_but_keeps_the_failure_time() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        let ticket = expect_probe(&mut b, at(30_000));
        let t = b.on_success(at(31_000), Some(ticket)).unwrap();
        assert_eq!(
            (t.from, t.to),
            (BreakerState::HalfOpen, BreakerState::Closed)
        );
        assert_eq!(t.reason, TransitionReason::ProbeSucceeded);
        let s = b.status(at(31_000));
        assert_eq!(s.state, BreakerState::Closed);
        assert_eq!(s.failure_count, 0);
        assert_eq!(s.success_count, 1);
        assert_eq!(s.open_cycle_count, 0);
        assert_eq!(s.last_failure_wall_ms, Some(WALL0));
        assert_eq!(b.admit(at(31_000)), Admission::Allow);
        // The ticket is spent.
        assert_eq!(b.on_success(at(31_001), Some(ticket)), None);
    }

    #[test]
    fn probe_failure_reopens_with_escalated_cooldown_apikey() {
        // apikey: 30 s, escalation after 3 cycles, ×4 cap → 30, 30, 30, 60, 120, 120.
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        let t = fail(&mut b, at(0), 12);
        let mut now = 0;
        let mut until = now + open_cooldown(t.last().unwrap(), at(now));
        for (cycle, want) in [
            (1, 30_000),
            (2, 30_000),
            (3, 30_000),
            (4, 60_000),
            (5, 120_000),
            (6, 120_000),
        ] {
            now = until;
            let ticket = expect_probe(&mut b, at(now));
            now += 500;
            let t = b
                .on_failure(at(now), Failure::Status(502), Some(ticket))
                .unwrap();
            assert_eq!((t.from, t.to), (BreakerState::HalfOpen, BreakerState::Open));
            assert_eq!(
                t.reason,
                TransitionReason::Tripped(TripReason::ProbeFailed { cycle })
            );
            assert_eq!(open_cooldown(&t, at(now)), want, "cycle {cycle}");
            assert_eq!(b.status(at(now)).open_cycle_count, cycle);
            until = now + want;
        }
        assert_eq!(b.status(at(now)).failure_count, 18);
    }

    #[test]
    fn escalation_oauth() {
        // oauth: 60 s, escalation after 2 cycles, ×8 cap → cycles 0-2: 60, 3: 120, 4: 240, ≥5: 480.
        let mut b = Breaker::new(config(AuthKind::OAuth));
        for (cycles, want) in [
            (0, 60_000),
            (2, 60_000),
            (3, 120_000),
            (4, 240_000),
            (5, 480_000),
            (9, 480_000),
        ] {
            b.counts.open_cycle_count = cycles;
            assert_eq!(b.effective_reset_timeout_ms(), want, "cycles {cycles}");
        }
        // Huge cycle counts saturate instead of overflowing.
        b.counts.open_cycle_count = u32::MAX;
        assert_eq!(b.effective_cooldown_ms(), 480_000);
    }

    #[test]
    fn a_stuck_probe_returns_its_permit_after_the_probe_timeout() {
        let clock = ManualClock::new(WALL0);
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, clock.now(), 12);
        clock.advance_ms(30_000);
        let stuck = expect_probe(&mut b, clock.now());
        clock.advance_ms(29_999);
        assert_eq!(
            expect_reject(&mut b, clock.now()),
            (1, BreakerState::HalfOpen)
        );
        clock.advance_ms(1);
        // The view already says a probe may go; no broadcast was needed.
        let epoch = b.epoch();
        assert_eq!(b.view(clock.now()).gate(clock.now()), ViewGate::Probe);
        assert_eq!(b.epoch(), epoch);
        let fresh = expect_probe(&mut b, clock.now());
        assert_ne!(stuck, fresh);
        // The stuck probe finally answers: stale, ignored either way.
        assert_eq!(b.on_success(clock.now(), Some(stuck)), None);
        assert_eq!(
            b.on_failure(clock.now(), Failure::Status(503), Some(stuck)),
            None
        );
        assert_eq!(b.state(clock.now()), BreakerState::HalfOpen);
        assert_eq!(
            b.on_success(clock.now(), Some(fresh)).map(|t| t.to),
            Some(BreakerState::Closed)
        );
    }

    #[test]
    fn a_success_lowers_the_count_once() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 5);
        assert_eq!(b.on_success(at(1), None), None);
        assert_eq!(b.failure_count(), 4);
        for _ in 0..10 {
            b.on_success(at(2), None);
        }
        assert_eq!(b.failure_count(), 0);
    }

    #[test]
    fn degraded_recovers_once_the_count_is_at_most_the_degradation_threshold() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 9);
        assert_eq!(b.state(at(0)), BreakerState::Degraded);
        assert_eq!(b.on_success(at(1), None), None); // 8 > 7
        let t = b.on_success(at(2), None).unwrap(); // 7 ≤ 7
        assert_eq!(
            (t.from, t.to),
            (BreakerState::Degraded, BreakerState::Closed)
        );
        assert_eq!(t.reason, TransitionReason::Recovered);
        // Closed with 7: the next failure degrades again.
        assert_eq!(fail(&mut b, at(3), 1)[0].to, BreakerState::Degraded);
    }

    #[test]
    fn only_trip_statuses_timeouts_and_connect_failures_count() {
        for s in TRIP_STATUSES {
            assert!(counts_as_failure(s));
            assert!(Failure::Status(s).counts());
        }
        assert!(Failure::Timeout.counts());
        assert!(Failure::ConnectFailed.counts());
        let never = [
            Failure::Status(200),
            Failure::Status(400),
            Failure::Status(401),
            Failure::Status(403),
            Failure::Status(404),
            Failure::Status(429),
            Failure::Status(499),
            Failure::Status(501),
            Failure::Status(505),
            Failure::RequestScoped,
        ];
        let mut b = Breaker::new(config(AuthKind::Local));
        for f in never {
            assert!(!f.counts(), "{f:?}");
            for _ in 0..100 {
                assert_eq!(b.on_failure(at(0), f, None), None);
            }
        }
        assert_eq!(b.state(at(0)), BreakerState::Closed);
        assert_eq!(b.failure_count(), 0);
        // Local: opens at 2, degraded at 1.
        assert_eq!(
            b.on_failure(at(0), Failure::Timeout, None).map(|t| t.to),
            Some(BreakerState::Degraded)
        );
        assert_eq!(
            b.on_failure(at(0), Failure::ConnectFailed, None)
                .map(|t| t.to),
            Some(BreakerState::Open)
        );
    }

    #[test]
    fn failures_while_open_neither_count_nor_extend_the_cooldown() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        assert!(fail(&mut b, at(10_000), 50).is_empty());
        assert_eq!(b.failure_count(), 12);
        assert_eq!(expect_reject(&mut b, at(20_000)).0, 10_000);
        // Successes of requests admitted before the trip are ignored too.
        assert_eq!(b.on_success(at(20_000), None), None);
        assert_eq!(b.state(at(20_000)), BreakerState::Open);
    }

    #[test]
    fn outcomes_without_the_ticket_do_not_decide_a_half_open_period() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        assert_eq!(b.on_success(at(30_000), None), None);
        assert!(fail(&mut b, at(30_000), 3).is_empty());
        let ticket = expect_probe(&mut b, at(30_000));
        assert_eq!(b.on_success(at(30_001), None), None);
        assert!(fail(&mut b, at(30_001), 3).is_empty());
        assert_eq!(b.state(at(30_001)), BreakerState::HalfOpen);
        assert!(b.is_probe(at(30_001), ticket));
    }

    #[test]
    fn a_probe_answered_by_the_upstream_closes_and_one_without_a_verdict_is_released() {
        for answer in [400, 404, 429, 200] {
            let mut b = Breaker::new(config(AuthKind::ApiKey));
            fail(&mut b, at(0), 12);
            let ticket = expect_probe(&mut b, at(30_000));
            let t = b
                .on_failure(at(30_001), Failure::Status(answer), Some(ticket))
                .unwrap();
            assert_eq!(t.reason, TransitionReason::ProbeSucceeded, "{answer}");
            assert_eq!(t.to, BreakerState::Closed);
        }
        for neutral in [Failure::Status(499), Failure::RequestScoped] {
            let mut b = Breaker::new(config(AuthKind::ApiKey));
            fail(&mut b, at(0), 12);
            let ticket = expect_probe(&mut b, at(30_000));
            let t = b.on_failure(at(30_001), neutral, Some(ticket)).unwrap();
            assert_eq!(t.reason, TransitionReason::ProbeReleased, "{neutral:?}");
            assert_eq!(
                (t.from, t.to),
                (BreakerState::HalfOpen, BreakerState::HalfOpen)
            );
            assert_eq!(t.view.gate(at(30_001)), ViewGate::Probe);
            let again = expect_probe(&mut b, at(30_002));
            assert_ne!(again, ticket);
        }
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        let ticket = expect_probe(&mut b, at(30_000));
        assert!(b.release_probe(at(30_001), ticket).is_some());
        assert_eq!(b.release_probe(at(30_001), ticket), None);
    }

    #[test]
    fn a_429_never_counts_even_with_hints() {
        let mut b = Breaker::new(custom(1, 1, 30_000, true));
        for _ in 0..20 {
            assert_eq!(b.on_failure(at(0), Failure::Status(429), None), None);
        }
        assert_eq!(b.state(at(0)), BreakerState::Closed);
    }

    #[test]
    fn kind_cooldowns_replace_the_base_when_hints_are_on() {
        let mut b = Breaker::new(custom(1, 1, 30_000, true));
        let t = b
            .on_counted_failure(at(0), FailureKind::QuotaExhausted, None)
            .unwrap();
        assert_eq!(open_cooldown(&t, at(0)), QUOTA_EXHAUSTED_COOLDOWN_MS);
        let s = b.status(at(0));
        assert_eq!(s.last_failure_kind, Some(FailureKind::QuotaExhausted));
        assert_eq!(s.kind_failure_counts.quota_exhausted, 1);
        // `effectiveResetTimeout` ignores the kind override.
        assert_eq!(s.effective_reset_timeout_ms, 30_000);

        let mut b = Breaker::new(custom(1, 1, 30_000, true));
        let t = b
            .on_counted_failure(at(0), FailureKind::RateLimit, None)
            .unwrap();
        assert_eq!(open_cooldown(&t, at(0)), RATE_LIMIT_COOLDOWN_MS);
        // A transient probe failure goes back to the (escalated) base.
        let ticket = expect_probe(&mut b, at(60_000));
        let t = b
            .on_failure(at(60_000), Failure::Status(503), Some(ticket))
            .unwrap();
        assert_eq!(open_cooldown(&t, at(60_000)), 30_000);
        assert_eq!(
            b.status(at(60_000)).last_failure_kind,
            Some(FailureKind::Transient)
        );

        // Hints off: kinds are not even recorded.
        let mut b = Breaker::new(custom(1, 1, 30_000, false));
        let t = b
            .on_counted_failure(at(0), FailureKind::QuotaExhausted, None)
            .unwrap();
        assert_eq!(open_cooldown(&t, at(0)), 30_000);
        assert_eq!(b.status(at(0)).last_failure_kind, None);
        assert_eq!(b.status(at(0)).kind_failure_counts, KindCounts::default());
    }

    #[test]
    fn reset_clears_everything_and_is_a_transition() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        let before = b.epoch();
        let t = b.reset(at(1));
        assert_eq!((t.from, t.to), (BreakerState::Open, BreakerState::Closed));
        assert_eq!(t.reason, TransitionReason::ManualReset);
        assert!(t.epoch() > before);
        let s = b.status(at(1));
        assert_eq!((s.failure_count, s.last_failure_wall_ms), (0, None));
        assert_eq!(b.last_trip(), None);
        assert!(b.is_idle());
    }

    #[test]
    fn views_apply_idempotently() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        let mut replica = BreakerView::closed(0);
        let ts: Vec<_> = (0..12)
            .filter_map(|_| b.on_failure(at(0), Failure::Status(500), None))
            .collect();
        assert_eq!(ts.len(), 2);
        assert!(ts[1].epoch() > ts[0].epoch());
        // Out of order and duplicated: the newest wins.
        assert!(replica.apply(&ts[1].view));
        assert!(!replica.apply(&ts[0].view));
        assert!(!replica.apply(&ts[1].view));
        assert_eq!(replica, b.view(at(0)));
        assert_eq!(
            replica.gate(at(1_000)),
            ViewGate::Blocked {
                retry_after_ms: 29_000
            }
        );
        assert_eq!(replica.gate(at(30_000)), ViewGate::Probe);
        assert_eq!(BreakerView::closed(3).gate(at(0)), ViewGate::Pass);
    }

    #[test]
    fn set_config_applies_from_the_next_event() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 5);
        b.set_config(custom(6, 2, 5_000, false));
        let t = fail(&mut b, at(0), 1);
        assert_eq!(t[0].to, BreakerState::Open);
        assert_eq!(open_cooldown(&t[0], at(0)), 5_000);
    }

    #[test]
    fn the_503_facts() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1_000), 1);
        assert_eq!(retry_after_secs(1_001), 2);
        assert_eq!(retry_after_secs(29_999), 30);
        let r = circuit_open_response("openai", 12_345);
        assert_eq!(r.retry_after_s, 13);
        assert_eq!(r.message, "Provider openai circuit breaker is open");
        assert_eq!(
            connections_open_message("openai", &["c1"]),
            "Connection c1 circuit breaker is open (provider openai)"
        );
        assert_eq!(
            connections_open_message("openai", &["c1", "c2"]),
            "Connection circuit breakers are open for c1, c2 (provider openai)"
        );
        assert_eq!(r.provider, "openai");
    }

    #[test]
    fn health_json_has_the_spec_names() {
        let mut b = Breaker::new(config(AuthKind::ApiKey));
        fail(&mut b, at(0), 12);
        let s = b.status(at(10_000));
        let v = serde_json::to_value(ProviderBreakerJson::new("openai".into(), &s)).unwrap();
        assert_eq!(
            v,
            json!({"provider": "openai", "state": "OPEN", "failureCount": 12,
                   "lastFailure": "2023-11-14T22:13:20.000Z", "retryAfterMs": 20000})
        );
        let v = serde_json::to_value(ProviderHealthJson::from(&b.status(at(30_000)))).unwrap();
        assert_eq!(
            v,
            json!({"state": "HALF_OPEN", "failures": 12,
                   "lastFailure": "2023-11-14T22:13:20.000Z", "retryAfterMs": 0})
        );
        let fresh = Breaker::new(config(AuthKind::ApiKey)).status(at(0));
        let v = serde_json::to_value(ProviderHealthJson::from(&fresh)).unwrap();
        assert_eq!(v["lastFailure"], serde_json::Value::Null);
        let mut c = BreakerCounts::default();
        for s in [
            BreakerState::Open,
            BreakerState::HalfOpen,
            BreakerState::Degraded,
            BreakerState::Closed,
            BreakerState::Closed,
        ] {
            c.add(s);
        }
        assert_eq!(
            serde_json::to_value(c).unwrap(),
            json!({"open": 1, "halfOpen": 1, "degraded": 1, "closed": 2, "total": 5})
        );
    }

    #[test]
    fn iso8601_matches_javascript() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601_utc(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso8601_utc(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
        // Past year 9999 (JavaScript would throw): the last instant the formatter prints.
        assert_eq!(iso8601_utc(u64::MAX), "9999-12-31T23:59:59.999Z");
    }

    // -- the table ------------------------------------------------------------------------

    const P: BreakerKey = BreakerKey::Provider(ProviderId(0));
    const C: BreakerKey = BreakerKey::Connection(ConnectionId(7));

    fn table() -> BreakerTable {
        BreakerTable::new(BreakerSettings::default())
    }

    #[test]
    fn keys_follow_the_connection_scope_rules() {
        let (p, c) = (ProviderId(1), ConnectionId(2));
        assert_eq!(
            BreakerKey::for_failure(p, Some(c), Failure::Status(503)),
            BreakerKey::Connection(c)
        );
        assert_eq!(
            BreakerKey::for_failure(p, Some(c), Failure::ConnectFailed),
            BreakerKey::Provider(p)
        );
        assert_eq!(
            BreakerKey::for_failure(p, None, Failure::Timeout),
            BreakerKey::Provider(p)
        );
        assert_eq!(
            BreakerKey::for_success(p, Some(c)),
            vec![BreakerKey::Connection(c), BreakerKey::Provider(p)]
        );
        assert_eq!(
            BreakerKey::gating(p, c),
            [BreakerKey::Provider(p), BreakerKey::Connection(c)]
        );
        let cfg = crate::config::load_str(include_str!("../../config/tidegate.toml"), &|_| None)
            .unwrap()
            .config;
        let mock = cfg.provider_by_name("mock").unwrap().id;
        let conn = cfg.connections.iter().find(|c| c.provider == mock).unwrap();
        assert_eq!(BreakerKey::Provider(mock).name(&cfg), "mock");
        assert_eq!(
            BreakerKey::Connection(conn.id).name(&cfg),
            format!("mock::conn::{}", conn.name)
        );
    }

    #[test]
    fn an_unknown_key_is_closed_and_is_not_created_by_reads_or_successes() {
        let mut t = table();
        assert_eq!(t.admit(at(0), P), Admission::Allow);
        assert_eq!(t.view(at(0), P), BreakerView::closed(0));
        assert_eq!(t.on_success(at(0), P, None), None);
        assert_eq!(
            t.on_failure(at(0), P, AuthKind::ApiKey, Failure::RequestScoped, None),
            None
        );
        assert!(t.is_empty());
        t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(P).unwrap().failure_count(), 1);
    }

    #[test]
    fn connection_breakers_count_one_failure_per_5_s() {
        let mut t = table();
        let fail = |t: &mut BreakerTable, ms| {
            t.on_failure(at(ms), C, AuthKind::OAuth, Failure::Status(503), None)
        };
        fail(&mut t, 0);
        fail(&mut t, 1_000);
        fail(&mut t, 4_999);
        assert_eq!(t.get(C).unwrap().failure_count(), 1);
        fail(&mut t, 5_000);
        assert_eq!(t.get(C).unwrap().failure_count(), 2);
        // A success clears the window.
        t.on_success(at(5_001), C, None);
        fail(&mut t, 5_002);
        assert_eq!(t.get(C).unwrap().failure_count(), 2);
        // oauth opens at 8 counted failures: 6 more, 5 s apart.
        let mut last = None;
        for i in 1..=6 {
            last = fail(&mut t, 5_002 + i * 5_000);
        }
        assert_eq!(last.map(|t| t.to), Some(BreakerState::Open));
    }

    #[test]
    fn provider_breakers_count_one_network_failure_per_10_s_but_every_status() {
        let mut t = table();
        for ms in [0, 1_000, 9_999] {
            t.on_failure(at(ms), P, AuthKind::ApiKey, Failure::ConnectFailed, None);
        }
        assert_eq!(t.get(P).unwrap().failure_count(), 1);
        t.on_failure(
            at(10_000),
            P,
            AuthKind::ApiKey,
            Failure::ConnectFailed,
            None,
        );
        assert_eq!(t.get(P).unwrap().failure_count(), 2);
        for _ in 0..5 {
            t.on_failure(at(10_001), P, AuthKind::ApiKey, Failure::Status(502), None);
        }
        assert_eq!(t.get(P).unwrap().failure_count(), 7);
    }

    #[test]
    fn probe_outcomes_are_never_deduplicated() {
        let mut t = table();
        // Local: opens at 2 (5 s apart on a connection key).
        t.on_failure(at(0), C, AuthKind::Local, Failure::Status(503), None);
        let tr = t.on_failure(at(5_000), C, AuthKind::Local, Failure::Status(503), None);
        assert_eq!(tr.map(|t| t.to), Some(BreakerState::Open));
        let ticket = match t.admit(at(20_000), C) {
            Admission::Probe { ticket, .. } => ticket,
            other => panic!("{other:?}"),
        };
        // Within 5 s of the last counted failure? No: 15 s. Make one land inside the window
        // first, then the probe's failure must still count.
        let mut t2 = t.clone();
        let r = t2.on_failure(
            at(20_001),
            C,
            AuthKind::Local,
            Failure::Status(503),
            Some(ticket),
        );
        assert_eq!(r.map(|t| t.to), Some(BreakerState::Open));
        let r = t.on_failure(at(20_001), C, AuthKind::Local, Failure::Status(503), None);
        assert_eq!(r, None);
        let r = t.on_failure(
            at(20_002),
            C,
            AuthKind::Local,
            Failure::Status(503),
            Some(ticket),
        );
        assert_eq!(
            r.map(|t| t.reason),
            Some(TransitionReason::Tripped(TripReason::ProbeFailed {
                cycle: 1
            }))
        );
    }

    #[test]
    fn capacity_evicts_idle_breakers_oldest_first_and_never_busy_ones() {
        let mut t = BreakerTable::with_capacity(BreakerSettings::default(), 3);
        let k = |i| BreakerKey::Provider(ProviderId(i));
        // k0: failed then recovered (idle, last failure at 0); k1: never failed (idle);
        // k2: busy.
        t.on_failure(at(0), k(0), AuthKind::ApiKey, Failure::Status(503), None);
        t.on_success(at(1), k(0), None);
        t.get_or_create(k(1), AuthKind::ApiKey);
        t.on_failure(at(2), k(2), AuthKind::ApiKey, Failure::Status(503), None);
        t.get_or_create(k(3), AuthKind::ApiKey);
        assert_eq!(t.len(), 3);
        assert!(t.get(k(1)).is_none(), "no failure time evicts first");
        t.on_failure(at(5), k(3), AuthKind::ApiKey, Failure::Status(503), None);
        t.on_success(at(6), k(3), None);
        t.get_or_create(k(4), AuthKind::ApiKey);
        assert!(t.get(k(0)).is_none());
        assert!(t.get(k(2)).is_some());
        // Only busy breakers left besides the idle k3/k4: make them busy, the cap is soft.
        t.on_failure(at(3), k(3), AuthKind::ApiKey, Failure::Status(503), None);
        t.on_failure(at(3), k(4), AuthKind::ApiKey, Failure::Status(503), None);
        t.get_or_create(k(5), AuthKind::ApiKey);
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn a_recreated_breaker_continues_the_epochs_of_the_evicted_one() {
        let mut t = table();
        let mut replica = BreakerView::closed(0);
        for _ in 0..12 {
            if let Some(tr) = t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None) {
                replica.apply(&tr.view);
            }
        }
        replica.apply(&t.reset(at(1), P).unwrap().view);
        assert_eq!(t.sweep(at(1)), 1);
        assert!(t.is_empty());
        for _ in 0..7 {
            if let Some(tr) = t.on_failure(at(2), P, AuthKind::ApiKey, Failure::Status(503), None) {
                assert!(
                    replica.apply(&tr.view),
                    "the replica must take the new breaker's view"
                );
            }
        }
        assert_eq!(replica.state, BreakerState::Degraded);
    }

    #[test]
    fn sweep_removes_idle_breakers_after_30_min() {
        let mut t = table();
        t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None);
        t.on_success(at(1), P, None);
        t.on_failure(at(0), C, AuthKind::ApiKey, Failure::Status(503), None);
        assert_eq!(t.sweep(at(IDLE_EVICT_AFTER_MS)), 0);
        assert_eq!(t.sweep(at(IDLE_EVICT_AFTER_MS + 1)), 1);
        assert!(t.get(P).is_none());
        assert!(t.get(C).is_some(), "a breaker with failures stays");
    }

    #[test]
    fn reset_all_resets_every_breaker_and_keeps_them() {
        let mut t = table();
        for _ in 0..12 {
            t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None);
        }
        t.get_or_create(C, AuthKind::OAuth);
        let out = t.reset_all(at(1));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].0, P);
        assert_eq!(out[0].1.from, BreakerState::Open);
        assert!(out.iter().all(|(_, tr)| tr.to == BreakerState::Closed));
        assert_eq!(t.len(), 2);
        assert_eq!(t.counts(at(1)).closed, 2);
        assert_eq!(t.reset(at(1), BreakerKey::Provider(ProviderId(9))), None);
    }

    #[test]
    fn apply_settings_retunes_and_a_hint_change_resets_all() {
        let mut t = table();
        for _ in 0..5 {
            t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None);
        }
        let mut s = BreakerSettings::default();
        s.profiles.apikey.failure_threshold = 6;
        s.profiles.apikey.degradation_threshold = 5;
        assert!(t.apply_settings(at(0), s.clone()).is_empty());
        let tr = t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None);
        assert_eq!(tr.map(|t| t.to), Some(BreakerState::Open));
        s.use_429_hints.apikey = false;
        let out = t.apply_settings(at(1), s);
        assert_eq!(out.len(), 1);
        assert_eq!(t.get(P).unwrap().state(at(1)), BreakerState::Closed);
        assert!(!t.get(P).unwrap().config().use_429_hints);
    }

    #[test]
    fn counts_and_iteration() {
        let mut t = table();
        for _ in 0..12 {
            t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None);
        }
        for _ in 0..5 {
            t.on_failure(
                at(0),
                BreakerKey::Provider(ProviderId(1)),
                AuthKind::OAuth,
                Failure::Status(503),
                None,
            );
        }
        t.get_or_create(C, AuthKind::ApiKey);
        let c = t.counts(at(0));
        assert_eq!((c.open, c.degraded, c.closed, c.total), (1, 1, 1, 3));
        assert_eq!(t.counts(at(30_000)).half_open, 1);
        assert_eq!(t.iter().count(), 3);
    }

    // -- persistence ----------------------------------------------------------------------

    /// A restart: the new process's monotonic clock starts again near 0.
    fn after_restart(wall_ms: u64, mono_ms: u64) -> Now {
        Now {
            mono_ns: mono_ms * 1_000_000,
            wall_ms,
        }
    }

    #[test]
    fn export_import_round_trip_keeps_the_remaining_open_time() {
        let mut t = table();
        for _ in 0..12 {
            t.on_failure(at(0), P, AuthKind::ApiKey, Failure::Status(503), None);
        }
        for _ in 0..8 {
            t.on_failure(at(0), C, AuthKind::ApiKey, Failure::Status(503), None);
        }
        // C is a connection key: deduplicated to one failure.
        let records = t.export(at(10_000));
        assert_eq!(records.len(), 2);
        let (_, rec) = &records[0];
        assert_eq!(rec.state, BreakerState::Open);
        assert_eq!(rec.failure_count, 12);
        assert_eq!(rec.last_failure_wall_ms, Some(WALL0));
        assert_eq!(rec.open_until_wall_ms, Some(WALL0 + 30_000));
        let v = serde_json::to_value(rec).unwrap();
        assert_eq!(v["openUntilWallMs"], WALL0 + 30_000);
        assert_eq!(v["state"], "OPEN");

        // Restarted 5 s later (wall) with a fresh monotonic clock.
        let now = after_restart(WALL0 + 15_000, 3);
        let mut t2 = table();
        let views = t2.import(
            now,
            records
                .iter()
                .map(|(k, r)| (*k, AuthKind::ApiKey, r.clone())),
        );
        assert_eq!(views.len(), 2);
        assert_eq!(views[0].1.state, BreakerState::Open);
        assert_eq!(views[0].1.until_wall_ms, Some(WALL0 + 30_000));
        assert_eq!(expect_table_reject(&mut t2, now, P), 15_000);
        let s = t2.get(P).unwrap().status(now);
        assert_eq!(s.last_failure_wall_ms, Some(WALL0));
        assert_eq!(t2.export(now)[0].1, t.export(at(15_000))[0].1);
        assert_eq!(t2.get(C).unwrap().failure_count(), 1);
    }

    fn expect_table_reject(t: &mut BreakerTable, now: Now, key: BreakerKey) -> u64 {
        match t.admit(now, key) {
            Admission::Reject { retry_after_ms, .. } => retry_after_ms,
            other => panic!("{other:?}"),
        }
    }

    fn open_record(until: Option<u64>, last_failure: Option<u64>) -> BreakerRecord {
        BreakerRecord {
            state: BreakerState::Open,
            failure_count: 12,
            last_failure_wall_ms: last_failure,
            last_failure_kind: None,
            open_cycle_count: 0,
            kind_failure_counts: KindCounts::default(),
            open_until_wall_ms: until,
        }
    }

    #[test]
    fn import_never_trusts_deadlines_blindly() {
        let now = after_restart(WALL0 + 100_000, 0);
        let mut t = table();
        let views = t.import(
            now,
            [
                // Expired: half-open (one probe decides), never closed.
                (
                    P,
                    AuthKind::ApiKey,
                    open_record(Some(WALL0), Some(WALL0 - 30_000)),
                ),
                // A day ahead (clock was wrong): bounded by the 30 s cooldown.
                (
                    C,
                    AuthKind::ApiKey,
                    open_record(Some(WALL0 + 86_500_000), None),
                ),
                // No deadline: derived from the last failure, like OmniRoute.
                (
                    BreakerKey::Provider(ProviderId(2)),
                    AuthKind::ApiKey,
                    open_record(None, Some(WALL0 + 90_000)),
                ),
                // Nothing at all: half-open.
                (
                    BreakerKey::Provider(ProviderId(3)),
                    AuthKind::ApiKey,
                    open_record(None, None),
                ),
            ],
        );
        assert_eq!(views.len(), 4);
        assert_eq!(t.get(P).unwrap().state(now), BreakerState::HalfOpen);
        assert!(matches!(t.admit(now, P), Admission::Probe { .. }));
        assert_eq!(expect_table_reject(&mut t, now, C), 30_000);
        assert_eq!(
            expect_table_reject(&mut t, now, BreakerKey::Provider(ProviderId(2))),
            20_000
        );
        assert!(matches!(
            t.admit(now, BreakerKey::Provider(ProviderId(3))),
            Admission::Probe { .. }
        ));
    }

    #[test]
    fn import_restores_half_open_degraded_and_escalation() {
        let now = after_restart(WALL0, 0);
        let mut t = table();
        let half = BreakerRecord {
            state: BreakerState::HalfOpen,
            open_cycle_count: 4,
            ..open_record(None, Some(WALL0 - 1_000))
        };
        let degraded = BreakerRecord {
            state: BreakerState::Degraded,
            failure_count: 8,
            open_until_wall_ms: None,
            ..open_record(None, Some(WALL0 - 1_000))
        };
        t.import(
            now,
            [(P, AuthKind::ApiKey, half), (C, AuthKind::ApiKey, degraded)],
        );
        let ticket = match t.admit(now, P) {
            Admission::Probe { ticket, .. } => ticket,
            other => panic!("{other:?}"),
        };
        let tr = t
            .on_failure(now, P, AuthKind::ApiKey, Failure::Timeout, Some(ticket))
            .unwrap();
        // Cycle 5 on apikey: 120 s.
        assert_eq!(open_cooldown(&tr, now), 120_000);
        assert_eq!(t.get(C).unwrap().state(now), BreakerState::Degraded);
        assert!(t.get(C).unwrap().status(now).epoch > 0);
    }

    // -- properties -----------------------------------------------------------------------

    #[derive(Clone, Debug)]
    enum Op {
        Advance(u64),
        Admit,
        Success {
            with_ticket: bool,
        },
        Fail {
            failure: Failure,
            with_ticket: bool,
        },
        /// Forget a held probe ticket: the attempt never reports.
        Drop,
        Reset,
    }

    fn failure() -> impl Strategy<Value = Failure> {
        prop_oneof![
            4 => prop::sample::select(vec![200u16, 400, 404, 408, 429, 499, 500, 501, 502, 503, 504])
                .prop_map(Failure::Status),
            1 => any::<u16>().prop_map(Failure::Status),
            1 => Just(Failure::Timeout),
            1 => Just(Failure::ConnectFailed),
            1 => Just(Failure::RequestScoped),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => prop_oneof![0u64..2_000, 0u64..120_000].prop_map(Op::Advance),
            3 => Just(Op::Admit),
            2 => any::<bool>().prop_map(|with_ticket| Op::Success { with_ticket }),
            5 => (failure(), any::<bool>())
                .prop_map(|(failure, with_ticket)| Op::Fail { failure, with_ticket }),
            1 => Just(Op::Drop),
            1 => prop::bool::weighted(0.1).prop_map(|_| Op::Reset),
        ]
    }

    fn breaker_config() -> impl Strategy<Value = BreakerConfig> {
        (
            1u32..8,
            1u32..8,
            1_000u64..90_000,
            1u32..20,
            0u32..5,
            1_000u64..60_000,
            any::<bool>(),
        )
            .prop_map(
                |(thr, degr, reset, mult, esc, probe, hints)| BreakerConfig {
                    profile: BreakerProfile {
                        failure_threshold: thr,
                        degradation_threshold: if thr <= 1 { 1 } else { degr.min(thr - 1) },
                        reset_timeout_ms: reset,
                        max_backoff_multiplier: mult,
                        backoff_escalation_count: esc,
                    },
                    use_429_hints: hints,
                    half_open_probe_timeout_ms: probe,
                },
            )
    }

    /// What the checker knows from the transitions it has seen.
    #[derive(Default)]
    struct Model {
        last_epoch: u64,
        /// Deadline of the current OPEN period (from its transition).
        open_until: Option<i64>,
        /// The live probe: (ticket, permit deadline).
        probe: Option<(ProbeTicket, i64)>,
    }

    impl Model {
        fn saw(&mut self, t: &Transition, replica: &mut BreakerView) {
            assert!(
                t.epoch() > self.last_epoch,
                "epochs strictly increase: {t:?}"
            );
            self.last_epoch = t.epoch();
            assert!(
                !(t.from == BreakerState::Closed && t.to == BreakerState::HalfOpen),
                "CLOSED → HALF_OPEN: {t:?}"
            );
            assert!(
                !(t.from.is_closed() && t.to == BreakerState::HalfOpen),
                "closed → HALF_OPEN: {t:?}"
            );
            assert_eq!(t.view.state, t.to);
            assert!(replica.apply(&t.view));
            match t.to {
                BreakerState::Open => {
                    self.open_until = t.view.until_mono_ms;
                    self.probe = None;
                }
                BreakerState::HalfOpen => {
                    self.open_until = None;
                    if t.reason == TransitionReason::ProbeReleased {
                        self.probe = None;
                    }
                }
                BreakerState::Closed | BreakerState::Degraded => {
                    self.open_until = None;
                    self.probe = None;
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn breaker_invariants(cfg in breaker_config(), ops in prop::collection::vec(op(), 1..300)) {
            let mut b = Breaker::new(cfg);
            let mut now_ms: u64 = 0;
            let mut held: Vec<ProbeTicket> = Vec::new();
            let mut m = Model::default();
            let mut replica = BreakerView::closed(0);
            for op in ops {
                let now = at(now_ms);
                let t_now = mono_ms(now);
                let transition = match op {
                    Op::Advance(ms) => { now_ms += ms; None }
                    Op::Admit => {
                        let expected = replica.gate(now);
                        let admission = b.admit(now);
                        match &admission {
                            Admission::Allow => prop_assert_eq!(expected, ViewGate::Pass),
                            Admission::Reject { retry_after_ms, state } => {
                                prop_assert_eq!(expected, ViewGate::Blocked { retry_after_ms: *retry_after_ms });
                                prop_assert!(*retry_after_ms >= 1);
                                let limit = match state {
                                    BreakerState::Open => m.open_until,
                                    BreakerState::HalfOpen => m.probe.map(|(_, d)| d),
                                    _ => None,
                                };
                                let limit = limit.expect("a rejection has a known deadline");
                                prop_assert!(t_now + ms_i64(*retry_after_ms) <= limit);
                            }
                            Admission::Probe { .. } => {
                                prop_assert_eq!(expected, ViewGate::Probe);
                                if let Some(until) = m.open_until {
                                    prop_assert!(t_now >= until, "admitted while OPEN");
                                }
                                if let Some((_, deadline)) = m.probe {
                                    prop_assert!(t_now >= deadline, "a second probe while one is live");
                                }
                            }
                        }
                        if let Some(until) = m.open_until
                            && t_now < until
                        {
                            let rejected = matches!(admission, Admission::Reject { .. });
                            prop_assert!(rejected, "admitted before the OPEN deadline");
                        }
                        match admission {
                            Admission::Probe { ticket, transition } => {
                                m.saw(&transition, &mut replica);
                                m.probe = Some((ticket, transition.view.until_mono_ms.unwrap()));
                                held.push(ticket);
                                None
                            }
                            Admission::Allow | Admission::Reject { .. } => None,
                        }
                    }
                    Op::Success { with_ticket } => {
                        let ticket = if with_ticket { held.pop() } else { None };
                        b.on_success(now, ticket)
                    }
                    Op::Fail { failure, with_ticket } => {
                        let ticket = if with_ticket { held.pop() } else { None };
                        b.on_failure(now, failure, ticket)
                    }
                    Op::Drop => { held.pop(); None }
                    Op::Reset => Some(b.reset(now)),
                };
                if let Some(t) = transition {
                    m.saw(&t, &mut replica);
                }
                // The replica, fed only by transitions, routes exactly like the owner.
                let now = at(now_ms);
                prop_assert_eq!(replica.gate(now), b.view(now).gate(now));
                prop_assert_eq!(replica.state.is_closed(), b.state(now).is_closed());
                prop_assert_eq!(b.epoch(), m.last_epoch);
            }
        }

        #[test]
        fn export_then_import_preserves_routing(cfg in breaker_config(), ops in prop::collection::vec(op(), 1..100), gap in 0u64..200_000) {
            let mut b = Breaker::new(cfg.clone());
            let mut now_ms = 0;
            let mut held = Vec::new();
            for op in ops {
                let now = at(now_ms);
                match op {
                    Op::Advance(ms) => now_ms += ms,
                    Op::Admit => if let Admission::Probe { ticket, .. } = b.admit(now) { held.push(ticket) },
                    Op::Success { with_ticket } => { b.on_success(now, if with_ticket { held.pop() } else { None }); }
                    Op::Fail { failure, with_ticket } => { b.on_failure(now, failure, if with_ticket { held.pop() } else { None }); }
                    Op::Drop => { held.pop(); }
                    Op::Reset => { b.reset(now); }
                }
            }
            let now = at(now_ms);
            let record = b.export(now);
            let later = after_restart(now.wall_ms + gap, 7);
            let r = Breaker::restore(cfg, &record, later, 0);
            let (before, after) = (b.state(now), r.state(later));
            prop_assert_eq!(before.is_closed(), after.is_closed());
            prop_assert_eq!(r.failure_count(), b.failure_count());
            match b.view(now).gate(now) {
                ViewGate::Blocked { retry_after_ms } if before == BreakerState::Open => {
                    let left = retry_after_ms.saturating_sub(gap);
                    match r.view(later).gate(later) {
                        ViewGate::Blocked { retry_after_ms } => prop_assert_eq!(retry_after_ms, left),
                        ViewGate::Probe => prop_assert_eq!(left, 0),
                        ViewGate::Pass => prop_assert!(false, "an open breaker came back closed"),
                    }
                }
                _ => {}
            }
        }
    }
}
