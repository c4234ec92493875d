//! The combo runner (spec B §3.1, §3.3, §3.4): how a request for a combo walks its
//! targets. The relay's `attempt` does one (target, connection) attempt; this module
//! decides which attempt comes next and when, and what the client is told when none
//! serves.
//!
//! A combo's candidates are grouped into *steps*, one per target (its connections in
//! priority order). One pass over the set tries every step once, then — with
//! `failover_before_retry` — retries each step that failed retryably up to `max_retries`
//! times; without it, a step is retried before the next one is tried. A retry waits
//! `retry_delay_ms`, or longer when the upstream asked for longer (never a hint beyond the
//! remaining budget). A request-shape error (context length, malformed, invalid
//! parameters) is never re-sent to its target, and three steps in a row failing with the
//! identical one end the loop. After a failed pass come the set retries
//! (`max_set_retries`), then the combo cooldown wait (B §3.3): when the shortest live lock
//! on a target is short and waitable, the pass is re-run after it. Every wait is raced
//! against the client hanging up (nothing more is sent upstream then). `target_timeout_ms`
//! bounds each attempt up to its response head, `combo_timeout_ms` the whole request
//! (504 `COMBO_TIMEOUT`). With `hedging`, a first try that has no answer after
//! `hedge_delay_ms` races the next target's (see `Runner::hedged`).

use std::time::Duration;

use serde_json::json;

use super::After;
use bytes::Bytes;

use super::relay::{
    AttemptEnd, Downstream, FailureNote, LastFailure, Opened, Plan, Request, Walk, answer_last,
    attempt, deliver, log_candidate, open, order_available,
};
use super::respond::send_error;
use super::select::{self, Excluded, Exclusion, Gate};
use crate::config::{ComboSettings, ComboStrategy, ConnectionId};
use crate::error::{ErrorKind, GatewayError};
use crate::flow::gates::GateError;
use crate::http1::RequestHead;
use crate::net::downstream::unless_client_gone;
use crate::owners::Req;
use crate::owners::gates::{self, client::GatePermit};
use crate::owners::health::protocol::ComboAttempt;
use crate::providers::Endpoint;
use crate::resilience::connection::Terminal;
use crate::routing::resolve::Target;
use crate::shard::metrics::Abandoned;

/// Upstream attempts one combo request may make in all (the loop-safety cap): past it the
/// request ends with 503 `max_attempts_exceeded`.
pub const MAX_COMBO_ATTEMPTS: usize = 64;
/// Margin added to a cooldown wait (B §3.3).
const WAIT_MARGIN_MS: u64 = 50;
/// Request-shape failures in a row (identical) that end the loop.
const SHAPE_STREAK_STOP: u32 = 3;
/// At most this many tried targets are named in a `COMBO_TIMEOUT` message.
const TIMEOUT_LISTED: usize = 5;

/// One target of the combo and its candidates (indices into the plan's candidates).
struct Step {
    target: Target,
    candidates: Vec<usize>,
    /// Its last try failed in a way a same-target retry may fix.
    retryable: bool,
    /// The longest wait the upstream asked for in its last try, ms.
    hint_ms: Option<u64>,
    /// Same-target retries made in the current pass.
    retries: u32,
    /// It answered that the request itself is invalid: never sent to it again.
    shape_failed: bool,
}

/// One failed attempt, for the terminal answer.
struct Outcome {
    target: Target,
    note: FailureNote,
}

/// How one try of a step ended.
enum StepEnd {
    /// The request is over (served, relayed, or the client is gone).
    Over(After),
    Failed,
    Skipped,
}

/// Why the loop ended without a served answer.
enum Ended {
    /// Every pass failed; answer from what was seen.
    Exhausted,
    /// A failure the next target would not fix (relay it).
    Stop,
    /// Three identical request-shape errors in a row.
    ShapeStreak,
    Timeout,
    AttemptCap,
}

struct Runner<'a, 'r> {
    shard: &'a Req<'a>,
    req: &'a Request<'r>,
    s: &'a ComboSettings,
    combo: usize,
    steps: Vec<Step>,
    walk: Walk,
    /// Mono ms the request started.
    start_ms: u64,
    /// The last failure and the index of the candidate (in `plan.candidates`) it
    /// happened on.
    last: Option<(LastFailure, usize)>,
    outcomes: Vec<Outcome>,
    /// Skipped candidates of the current pass.
    excluded: Vec<Excluded>,
    /// Candidates a rule-scoped failure ruled out in the current pass.
    exhausted: Vec<(Target, ConnectionId)>,
    /// The earliest retry hint of the current pass (upstream or a skipped candidate's).
    hint_ms: Option<u64>,
    shape_streak: Option<(String, u32)>,
}

/// Serves a request whose plan names a combo (`plan.combo`): a quota-share combo's
/// candidates are ordered by its home first (the ticket counts the pick in flight until
/// the request ends), another strategy's by this shard's strategy state
/// (`proxy::strategy`); then the combo runs by its settings.
pub(super) async fn serve(
    shard: &Req<'_>,
    head: &RequestHead,
    endpoint: Endpoint,
    body: Bytes,
    plan: &mut Plan,
    combo: usize,
    mut downstream: Downstream<'_>,
) -> After {
    let _in_flight = match plan.quota_share {
        Some(qs) => order_available(shard, qs, &mut plan.candidates).await,
        None => {
            super::strategy::order(shard, combo, &mut plan.candidates);
            None
        }
    };
    let (body, notes) = super::relay::prepare(shard, endpoint, plan, body).await;
    let plan: &Plan = plan;
    let req = Request::new(shard, head, endpoint, &body, plan, notes);
    let after = run(shard, &req, combo, &mut downstream).await;
    // A stream cut after its first byte: the targets after the one that cut it may continue
    // it (mid-stream continuation, in the combo's order, without its retries and waits).
    if let Some(s) = downstream.splice.as_ref().filter(|s| s.cut_pending()) {
        let cut_at = s
            .cut_candidate()
            .and_then(|at| plan.candidates.iter().position(|c| c == at))
            .unwrap_or(usize::MAX);
        let mut walk = super::relay::Walk::default();
        // Boxed, as in `relay::run`: a continuation is rare.
        return Box::pin(super::relay::continue_stream(
            shard,
            &req,
            cut_at,
            &mut walk,
            &mut downstream,
        ))
        .await;
    }
    after
}

/// Runs the combo `combo` of `req.plan`.
async fn run(shard: &Req<'_>, req: &Request<'_>, combo: usize, down: &mut Downstream<'_>) -> After {
    let config = shard.config();
    let s = &config.combos[combo].settings;
    let mut steps: Vec<Step> = Vec::new();
    for (i, (t, _)) in req.plan.candidates.iter().enumerate() {
        match steps.last_mut() {
            Some(step) if step.target == *t => step.candidates.push(i),
            _ => steps.push(Step {
                target: t.clone(),
                candidates: vec![i],
                retryable: false,
                hint_ms: None,
                retries: 0,
                shape_failed: false,
            }),
        }
    }
    let mut r = Runner {
        shard,
        req,
        s,
        combo,
        steps,
        walk: Walk::default(),
        start_ms: shard.now().mono_ms(),
        last: None,
        outcomes: Vec::new(),
        excluded: Vec::new(),
        exhausted: Vec::new(),
        hint_ms: None,
        shape_streak: None,
    };
    match r.drive(down).await {
        Ok(ended) => match r.emergency(&ended, down).await {
            Some(after) => after,
            None => r.answer(ended, down).await,
        },
        Err(after) => after,
    }
}

impl Runner<'_, '_> {
    fn now_ms(&self) -> u64 {
        self.shard.now().mono_ms()
    }

    /// Ms left of `combo_timeout_ms` (`None`: no combo timeout).
    fn remaining_ms(&self) -> Option<u64> {
        (self.s.combo_timeout_ms > 0).then(|| {
            self.s
                .combo_timeout_ms
                .saturating_sub(self.now_ms().saturating_sub(self.start_ms))
        })
    }

    fn timed_out(&self) -> bool {
        self.remaining_ms() == Some(0)
    }

    /// The access line of a request the combo ends itself (its timeout, its attempt cap,
    /// every target cooling down or failed, the client gone during a wait): the attempts
    /// made and the last candidate tried, whose provider and connection stay `-` when none
    /// was.
    fn log_last(&self, down: &Downstream<'_>) {
        let k = self.last.as_ref().map(|(_, k)| *k);
        log_candidate(self.shard, self.req.plan, k, self.walk.attempts, down.log);
    }

    /// Waits `ms` unless the client hangs up (`Err`: the request is over, nothing more
    /// goes upstream) or the combo's budget or the request's deadline ends first
    /// (`Ok(false)`).
    async fn pause(&self, ms: u64, down: &mut Downstream<'_>) -> Result<bool, After> {
        if ms == 0 {
            return Ok(true);
        }
        let (ms, whole) = match self.remaining_ms() {
            Some(left) if left < ms => (left, false),
            _ => (ms, true),
        };
        // Nor past the request's own deadline (`[server] request_timeout_ms`): the wait ends
        // with it (`Ok(false)`; the answer is then the deadline's 504 `request_timeout`,
        // see `answer`), and nothing more is sent upstream.
        let (ms, whole) = match self.req.deadline {
            Some(d) => {
                let left = d
                    .at_ns
                    .saturating_sub(self.shard.now().mono_ns)
                    .div_ceil(1_000_000);
                if left < ms {
                    (left, false)
                } else {
                    (ms, whole)
                }
            }
            None => (ms, whole),
        };
        let sleep = std::pin::pin!(crate::timer::sleep(Duration::from_millis(ms)));
        match unless_client_gone(down.client, down.pending, sleep).await {
            Some(()) => Ok(whole),
            None => {
                self.shard.metrics().abandoned(Abandoned::Admission);
                self.log_last(down);
                tracing::info!(
                    combo = %self.shard.config().combos[self.combo].name,
                    "client hung up during a combo wait (499): nothing more sent upstream"
                );
                Err(After::Close)
            }
        }
    }

    /// Passes over the set until one serves, the loop must stop, or no set retry or
    /// cooldown wait is left.
    async fn drive(&mut self, down: &mut Downstream<'_>) -> Result<Ended, After> {
        let wait = &self.shard.config().resilience.combo_cooldown_wait;
        let mut set_retries = 0;
        let mut waits = 0;
        let mut wait_budget = wait.budget_ms;
        loop {
            self.excluded.clear();
            self.exhausted.clear();
            self.hint_ms = None;
            for step in &mut self.steps {
                step.retries = 0;
                step.retryable = false;
            }
            if let Some(ended) = self.pass(down).await? {
                return Ok(ended);
            }
            if set_retries < self.s.max_set_retries {
                set_retries += 1;
                if !self.pause(self.s.set_retry_delay_ms, down).await? {
                    return Ok(Ended::Timeout);
                }
                continue;
            }
            match self.cooldown_wait(waits, wait_budget) {
                Some(ms) => {
                    tracing::debug!(ms, "combo cooldown wait");
                    if !self.pause(ms, down).await? {
                        return Ok(Ended::Timeout);
                    }
                    waits += 1;
                    wait_budget = wait_budget.saturating_sub(ms);
                }
                None => return Ok(Ended::Exhausted),
            }
        }
    }

    /// One pass over the set: `Some` when the loop ends here.
    async fn pass(&mut self, down: &mut Downstream<'_>) -> Result<Option<Ended>, After> {
        let n = self.steps.len();
        if self.s.failover_before_retry {
            if let Some(e) = self.first_tries(down).await? {
                return Ok(Some(e));
            }
            for _ in 0..self.s.max_retries {
                for i in 0..n {
                    if !self.steps[i].retryable {
                        continue;
                    }
                    if let Some(e) = self.retry(i, down).await? {
                        return Ok(Some(e));
                    }
                }
            }
        } else {
            for i in 0..n {
                if let Some(e) = self.try_step(i, down).await? {
                    return Ok(Some(e));
                }
                while self.steps[i].retryable && self.steps[i].retries < self.s.max_retries {
                    if let Some(e) = self.retry(i, down).await? {
                        return Ok(Some(e));
                    }
                }
                if i + 1 < n && !self.pause(self.s.fallback_delay_ms, down).await? {
                    return Ok(Some(Ended::Timeout));
                }
            }
        }
        Ok(None)
    }

    /// Every step once, in order (hedged when the combo hedges).
    async fn first_tries(&mut self, down: &mut Downstream<'_>) -> Result<Option<Ended>, After> {
        let n = self.steps.len();
        let mut i = 0;
        while i < n {
            let hedge = if self.s.hedging && i + 1 < n {
                self.hedged(i, i + 1, down).await?
            } else {
                HedgeEnd::NotHedged
            };
            let next = match hedge {
                HedgeEnd::End(e) => return Ok(Some(e)),
                HedgeEnd::NotHedged => {
                    if let Some(e) = self.try_step(i, down).await? {
                        return Ok(Some(e));
                    }
                    i + 1
                }
                HedgeEnd::First => {
                    if let Some(e) = self.rest(i, down).await? {
                        return Ok(Some(e));
                    }
                    i + 1
                }
                HedgeEnd::Both => {
                    if let Some(e) = self.rest(i, down).await? {
                        return Ok(Some(e));
                    }
                    if let Some(e) = self.rest(i + 1, down).await? {
                        return Ok(Some(e));
                    }
                    i + 2
                }
            };
            if next < n && !self.pause(self.s.fallback_delay_ms, down).await? {
                return Ok(Some(Ended::Timeout));
            }
            i = next;
        }
        Ok(None)
    }

    /// Step `i`'s candidates after its first (tried by a hedge).
    async fn rest(&mut self, i: usize, down: &mut Downstream<'_>) -> Result<Option<Ended>, After> {
        match self.step_from(i, 1, true, down).await {
            StepEndOr::End(e) => Ok(Some(e)),
            StepEndOr::Step(StepEnd::Over(after)) => Err(after),
            StepEndOr::Step(StepEnd::Failed | StepEnd::Skipped) => Ok(None),
        }
    }

    /// A same-target retry of step `i`, after its wait; not made when the upstream asked
    /// for longer than the budget left, or the views would skip it anyway.
    async fn retry(&mut self, i: usize, down: &mut Downstream<'_>) -> Result<Option<Ended>, After> {
        self.steps[i].retries += 1;
        let hint = self.steps[i].hint_ms;
        let ceiling = self.remaining_ms().unwrap_or_else(|| {
            let w = &self.shard.config().resilience.combo_cooldown_wait;
            self.s.retry_delay_ms.max(w.max_wait_ms)
        });
        if hint.is_some_and(|h| h > ceiling) {
            self.steps[i].retryable = false;
            return Ok(None);
        }
        // Never sooner than the target's own lock or cooldown lets it through either.
        let wait = self.s.retry_delay_ms.max(hint.unwrap_or(0));
        let wait = match self.skipped_for(i) {
            Some(Some(ms)) if ms <= ceiling => wait.max(ms),
            Some(_) => {
                self.steps[i].retryable = false;
                return Ok(None);
            }
            None => wait,
        };
        if !self.pause(wait, down).await? {
            return Ok(Some(Ended::Timeout));
        }
        self.try_step(i, down).await
    }

    /// `Some` when the views skip every candidate of step `i`: with the time until the
    /// first may pass again, when known.
    fn skipped_for(&self, i: usize) -> Option<Option<u64>> {
        let shard = self.shard;
        let views = shard.state().views.borrow();
        let (config, now) = (shard.config(), shard.now());
        let mut soonest: Option<Option<u64>> = None;
        for &k in &self.steps[i].candidates {
            let (t, c) = &self.req.plan.candidates[k];
            match select::gate(&views, config, t, *c, now) {
                Gate::Skip(_, Some(ms)) => {
                    soonest = Some(match soonest {
                        Some(Some(s)) => Some(s.min(ms)),
                        _ => Some(ms),
                    });
                }
                Gate::Skip(_, None) => {
                    if soonest.is_none() {
                        soonest = Some(None);
                    }
                }
                Gate::Pass | Gate::NeedProbe(_) => return None,
            }
        }
        soonest
    }

    /// One try of step `i`: its candidates in order until one serves or every one failed
    /// or was skipped. `Some` when the loop ends.
    async fn try_step(
        &mut self,
        i: usize,
        down: &mut Downstream<'_>,
    ) -> Result<Option<Ended>, After> {
        match self.step_once(i, down).await {
            StepEndOr::End(e) => Ok(Some(e)),
            StepEndOr::Step(StepEnd::Over(after)) => Err(after),
            StepEndOr::Step(StepEnd::Failed | StepEnd::Skipped) => Ok(None),
        }
    }

    async fn step_once(&mut self, i: usize, down: &mut Downstream<'_>) -> StepEndOr {
        self.steps[i].retryable = false;
        self.steps[i].hint_ms = None;
        self.step_from(i, 0, false, down).await
    }

    /// Step `i`'s candidates from `from` on; `failed`: an earlier candidate of this try
    /// already failed.
    async fn step_from(
        &mut self,
        i: usize,
        from: usize,
        mut failed: bool,
        down: &mut Downstream<'_>,
    ) -> StepEndOr {
        let candidates: Vec<usize> = self.steps[i]
            .candidates
            .iter()
            .skip(from)
            .copied()
            .collect();
        for k in candidates {
            if self.steps[i].shape_failed {
                break;
            }
            let (target, connection) = &self.req.plan.candidates[k];
            if let Some(end) = self.before_attempt(k) {
                match end {
                    Before::Ruled => continue,
                    Before::End(e) => return StepEndOr::End(e),
                }
            }
            let _slot = match self.slot(k, down).await {
                Ok(Slot::Held(permit)) => Some(permit),
                Ok(Slot::Free) => None,
                Ok(Slot::Busy(e)) => {
                    self.excluded.push(e);
                    continue;
                }
                Err(after) => return StepEndOr::Step(StepEnd::Over(after)),
            };
            self.walk.open_budget = Some(self.open_budget());
            self.walk.note = None;
            super::strategy::attempted(self.shard, self.combo, target);
            let combo = self.combo_attempt(k);
            let end = attempt(
                self.shard,
                self.req,
                target,
                *connection,
                Some(combo),
                &mut self.walk,
                down,
            )
            .await;
            self.walk.open_budget = None;
            let note = self.walk.note.take();
            match self.absorb(i, k, end, note) {
                Absorbed::Next => {}
                Absorbed::Failed => failed = true,
                Absorbed::End(e) => return e,
            }
        }
        StepEndOr::Step(if failed {
            StepEnd::Failed
        } else {
            StepEnd::Skipped
        })
    }

    /// Whether candidate `k` may be attempted now: `None` = yes.
    fn before_attempt(&mut self, k: usize) -> Option<Before> {
        let (target, connection) = &self.req.plan.candidates[k];
        if self.walk.exhausted.rules_out(target.provider, *connection) {
            self.exhausted.push((target.clone(), *connection));
            return Some(Before::Ruled);
        }
        if self.timed_out() {
            return Some(Before::End(Ended::Timeout));
        }
        if self.walk.attempts >= MAX_COMBO_ATTEMPTS {
            return Some(Before::End(Ended::AttemptCap));
        }
        None
    }

    fn open_budget(&self) -> Duration {
        let ms = match self.remaining_ms() {
            Some(left) => left.min(self.s.target_timeout_ms),
            None => self.s.target_timeout_ms,
        };
        Duration::from_millis(ms)
    }

    fn combo_attempt(&self, k: usize) -> ComboAttempt {
        let (target, _) = &self.req.plan.candidates[k];
        ComboAttempt {
            next_same_provider: self.next_provider(k) == Some(target.provider),
        }
    }

    /// Takes in how candidate `k` of step `i` ended.
    fn absorb(
        &mut self,
        i: usize,
        k: usize,
        end: AttemptEnd,
        note: Option<FailureNote>,
    ) -> Absorbed {
        let (target, _) = &self.req.plan.candidates[k];
        match end {
            AttemptEnd::Done(after) => Absorbed::End(StepEndOr::Step(StepEnd::Over(after))),
            AttemptEnd::Skipped(e) => {
                if let Some(ms) = e.retry_after_ms {
                    self.hint(ms);
                }
                self.excluded.push(e);
                Absorbed::Next
            }
            AttemptEnd::Stop(f) => {
                self.last = Some((f, k));
                Absorbed::End(StepEndOr::End(Ended::Stop))
            }
            // A failure before the first client byte: the combo's own retries decide
            // whether the target is tried again (no separate early-recovery reopen).
            AttemptEnd::MoveOn(f) | AttemptEnd::Early(f) => {
                // Counted like the direct walk's: a gateway-made failure here (an upstream
                // answer's was counted where it was classified, in `relay::open`).
                if let LastFailure::Gateway(e) = &f {
                    super::observe::fallback(self.shard.families(), None, e.kind);
                }
                self.last = Some((f, k));
                let Some(note) = note else {
                    if self.timed_out() {
                        return Absorbed::End(StepEndOr::End(Ended::Timeout));
                    }
                    return Absorbed::Failed;
                };
                if let Some(h) = note.hint_ms {
                    self.hint(h);
                    let step = &mut self.steps[i];
                    step.hint_ms = Some(step.hint_ms.map_or(h, |o| o.max(h)));
                }
                let shape = note.request_shape.clone();
                self.outcomes.push(Outcome {
                    target: target.clone(),
                    note,
                });
                if self.timed_out() {
                    return Absorbed::End(StepEndOr::End(Ended::Timeout));
                }
                if let Some(shape) = shape {
                    // Never re-sent to this target, on any of its connections, in any
                    // retry or pass.
                    self.steps[i].retryable = false;
                    self.steps[i].shape_failed = true;
                    let count = match &self.shape_streak {
                        Some((s, n)) if *s == shape => n + 1,
                        _ => 1,
                    };
                    self.shape_streak = Some((shape, count));
                    if count >= SHAPE_STREAK_STOP {
                        return Absorbed::End(StepEndOr::End(Ended::ShapeStreak));
                    }
                    return Absorbed::End(StepEndOr::Step(StepEnd::Failed));
                }
                self.shape_streak = None;
                self.steps[i].retryable = true;
                Absorbed::Failed
            }
        }
    }

    /// Hedging (B §3.1): step `i`'s first candidate alone for `hedge_delay_ms`; when it
    /// has no answer by then, step `j`'s first candidate starts too and the first ready
    /// answer wins. The other attempt is dropped: its admission guards go back, it is
    /// recorded as a client abort (no breaker or cooldown penalty), and its upstream
    /// connection is closed. `Ok(None)`: nothing served, continue with step `i`'s other
    /// candidates (and, when it started, step `j`'s), from `next`.
    async fn hedged(
        &mut self,
        i: usize,
        j: usize,
        down: &mut Downstream<'_>,
    ) -> Result<HedgeEnd, After> {
        let (ka, kb) = (self.steps[i].candidates[0], self.steps[j].candidates[0]);
        // A round-robin combo's attempts each hold a semaphore slot; the hedge race does
        // not take them, so such a combo runs its targets one at a time.
        let round_robin =
            self.shard.config().combos[self.combo].strategy == ComboStrategy::RoundRobin;
        if round_robin || self.steps[i].shape_failed || self.steps[j].shape_failed {
            return Ok(HedgeEnd::NotHedged);
        }
        for k in [ka, kb] {
            if self.before_attempt(k).is_some() {
                // Ruled out, out of time or attempts: the plain walk says so.
                return Ok(HedgeEnd::NotHedged);
            }
        }
        self.steps[i].retryable = false;
        self.steps[i].hint_ms = None;
        self.steps[j].retryable = false;
        self.steps[j].hint_ms = None;
        let (shard, req) = (self.shard, self.req);
        let (ta, ca) = &req.plan.candidates[ka];
        let (tb, cb) = &req.plan.candidates[kb];
        let (combo_a, combo_b) = (self.combo_attempt(ka), self.combo_attempt(kb));
        let combo = self.combo;
        let delay = Duration::from_millis(self.s.hedge_delay_ms);
        let mut wa = Walk {
            open_budget: Some(self.open_budget()),
            ..Walk::default()
        };
        let mut wb = Walk {
            open_budget: Some(self.open_budget()),
            ..Walk::default()
        };
        let race = {
            let race = std::pin::pin!(async {
                // Each attempt on the heap: two of them inline would double every combo
                // request's future (`relay::attempt` boxes its one too).
                super::strategy::attempted(shard, combo, ta);
                let mut a = Box::pin(open(shard, req, ta, *ca, Some(combo_a), &mut wa, None));
                monoio::select! {
                    r = &mut a => return Race::Alone(r),
                    () = crate::timer::sleep(delay) => {}
                }
                tracing::debug!(
                    "hedging: no answer after hedge_delay_ms, starting the next target"
                );
                super::strategy::attempted(shard, combo, tb);
                let mut b = Box::pin(open(shard, req, tb, *cb, Some(combo_b), &mut wb, None));
                monoio::select! {
                    r = &mut a => {
                        if matches!(r, Opened::Ready(_)) {
                            return Race::A(r);
                        }
                        let rb = b.await;
                        Race::Both(r, rb)
                    }
                    r = &mut b => {
                        if matches!(r, Opened::Ready(_)) {
                            return Race::B(r);
                        }
                        let ra = a.await;
                        Race::Both(ra, r)
                    }
                }
            });
            unless_client_gone(down.client, down.pending, race).await
        };
        let Some(race) = race else {
            // The hedged attempts are dropped with the race: an upstream request either
            // had sent is cancelled, their guards record a client abort.
            let phase = if wa.attempts + wb.attempts > 0 {
                Abandoned::Response
            } else {
                Abandoned::Admission
            };
            shard.metrics().abandoned(phase);
            // The access line names the hedged candidate started last.
            let tried = if wb.attempts > 0 {
                Some(kb)
            } else if wa.attempts > 0 {
                Some(ka)
            } else {
                self.last.as_ref().map(|(_, k)| *k)
            };
            let attempts = self.walk.attempts + wa.attempts + wb.attempts;
            log_candidate(shard, req.plan, tried, attempts, down.log);
            return Err(After::Close);
        };
        self.walk.attempts += wa.attempts + wb.attempts;
        self.walk.exhausted.merge(&wa.exhausted);
        self.walk.exhausted.merge(&wb.exhausted);
        let (a, b) = match race {
            Race::Alone(a) => (Some(a), None),
            Race::A(a) => (Some(a), None),
            Race::B(b) => (None, Some(b)),
            Race::Both(a, b) => (Some(a), Some(b)),
        };
        let started_b = b.is_some() || wb.attempts > 0;
        for (step, k, opened, note) in [(i, ka, a, wa.note.take()), (j, kb, b, wb.note.take())] {
            let Some(opened) = opened else { continue };
            let end = match opened {
                Opened::End(end) => end,
                Opened::Ready(ready) => deliver(shard, req, ready, self.walk.attempts, down).await,
            };
            match self.absorb(step, k, end, note) {
                Absorbed::Next | Absorbed::Failed => {}
                Absorbed::End(StepEndOr::Step(StepEnd::Over(after))) => return Err(after),
                Absorbed::End(StepEndOr::End(e)) => return Ok(HedgeEnd::End(e)),
                Absorbed::End(StepEndOr::Step(StepEnd::Failed | StepEnd::Skipped)) => {}
            }
        }
        Ok(if started_b {
            HedgeEnd::Both
        } else {
            HedgeEnd::First
        })
    }

    fn hint(&mut self, ms: u64) {
        self.hint_ms = Some(self.hint_ms.map_or(ms, |h| h.min(ms)));
    }

    /// The provider of the next step after candidate `k`'s.
    fn next_provider(&self, k: usize) -> Option<crate::config::ProviderId> {
        let (target, _) = self.req.plan.candidates.get(k)?;
        self.req
            .plan
            .candidates
            .iter()
            .skip(k + 1)
            .find(|(t, _)| t != target)
            .map(|(t, _)| t.provider)
    }

    /// B §3.3: after a failed pass, wait for the shortest live lock on a target when it
    /// is short, its reason waitable, and the pass recorded a retry hint; `None` = answer
    /// now. Also the circuit-open wait (earliest probe time) and the pre-dispatch wait (a
    /// pass that attempted nothing because every candidate was under a short lock).
    fn cooldown_wait(&self, waits: u32, budget_ms: u64) -> Option<u64> {
        let shard = self.shard;
        let w = &shard.config().resilience.combo_cooldown_wait;
        if !w.enabled || waits >= w.max_attempts {
            return None;
        }
        let hint = self.hint_ms?;
        let (lock_ms, waitable) = self.shortest_lock()?;
        if !waitable {
            return None;
        }
        let wait = lock_ms.max(hint) + WAIT_MARGIN_MS;
        let fits_combo = self.remaining_ms().is_none_or(|left| wait <= left);
        (wait <= w.max_wait_ms && wait <= budget_ms && fits_combo).then_some(wait)
    }

    /// The shortest positive time a candidate's model is still locked (a model lockout),
    /// and whether its reason is one a combo may wait out. When the pass attempted nothing
    /// and every candidate sat behind an open breaker, the earliest probe time instead
    /// (the circuit-open wait).
    fn shortest_lock(&self) -> Option<(u64, bool)> {
        let shard = self.shard;
        let views = shard.state().views.borrow();
        let (config, now) = (shard.config(), shard.now());
        let mut best: Option<(u64, bool)> = None;
        let mut consider = |ms: u64, ok: bool| {
            if ms > 0 && best.is_none_or(|(b, _)| ms < b) {
                best = Some((ms, ok));
            }
        };
        let all_open = !self.excluded.is_empty()
            && self.exhausted.is_empty()
            && self
                .excluded
                .iter()
                .all(|e| matches!(e.reason, Exclusion::CircuitOpen(_)));
        let attempted_now = self.excluded.len() < self.req.plan.candidates.len();
        if all_open && !attempted_now {
            for e in &self.excluded {
                consider(e.retry_after_ms.unwrap_or(0), true);
            }
            return best;
        }
        for (t, c) in &self.req.plan.candidates {
            let p = config.provider(t.provider);
            if let Some(l) =
                views
                    .lockouts
                    .lock_of(&p.name, p.quirks.quota_family, Some(*c), &t.model, now)
            {
                consider(
                    l.until_ms.saturating_sub(now.mono_ms()),
                    l.reason.is_waitable(),
                );
            }
        }
        best
    }

    // -- the answer ------------------------------------------------------------------

    /// The emergency fallback (B §9.1) for a combo: when the combo's own terminal answer
    /// would be a spent budget — the last upstream failure relayed as it is, and that
    /// answer is a 402 or names a budget — or nothing was attempted because every
    /// connection is out of credits, the request is re-run once on the emergency target
    /// (same rules as a direct request: configured, no tools). `None`: answer as usual.
    async fn emergency(&mut self, ended: &Ended, down: &mut Downstream<'_>) -> Option<After> {
        let shard = self.shard;
        shard.config().emergency_fallback.as_ref()?;
        let relays_last = match ended {
            Ended::Stop | Ended::ShapeStreak => true,
            Ended::Exhausted => self.exhausted_error().is_none(),
            Ended::Timeout | Ended::AttemptCap => false,
        };
        let from = if relays_last {
            let (last, k) = self.last.as_ref()?;
            let (target, _) = &self.req.plan.candidates[*k];
            let mut spent = None;
            super::relay::note_budget(shard, &mut spent, target, last);
            spent?
        } else if matches!(ended, Ended::Exhausted)
            && self.outcomes.is_empty()
            && self.exhausted.is_empty()
            && !self.excluded.is_empty()
            && self
                .excluded
                .iter()
                .all(|e| e.reason == Exclusion::Terminal(Terminal::CreditsExhausted))
        {
            let e = &self.excluded[0];
            Target {
                provider: e.provider,
                model: e.model.clone(),
            }
        } else {
            return None;
        };
        super::relay::emergency(shard, self.req, &from, &mut self.walk, down).await
    }

    async fn answer(mut self, ended: Ended, down: &mut Downstream<'_>) -> After {
        let shard = self.shard;
        let err = match ended {
            Ended::Stop | Ended::ShapeStreak => None,
            // A pause cut short by the request's own deadline rather than the combo's.
            Ended::Timeout => Some(match self.req.deadline {
                Some(d) if !self.timed_out() => d.error(),
                _ => self.timeout_error(),
            }),
            Ended::AttemptCap => Some(self.diagnosed(
                GatewayError::new(
                    ErrorKind::MaxAttemptsExceeded,
                    "Maximum combo retry limit reached",
                ),
                "max_attempts_exceeded",
                "retry",
                "Retry the request later",
                None,
            )),
            Ended::Exhausted => self.exhausted_error(),
        };
        match err {
            Some(e) => {
                down.committed.set(true);
                self.log_last(down);
                send_error(
                    shard,
                    down.client,
                    &e,
                    down.dialect,
                    down.keep_alive,
                    Some(down.log),
                )
                .await
            }
            None => {
                let last = self.last.take();
                answer_last(
                    shard,
                    self.req.plan,
                    last,
                    &self.excluded,
                    self.walk.attempts,
                    down,
                )
                .await
            }
        }
    }

    /// The answer after every pass failed; `None` = relay the last failure as it is.
    fn exhausted_error(&self) -> Option<GatewayError> {
        let cooling = |r: &Exclusion| {
            matches!(
                r,
                Exclusion::CircuitOpen(_)
                    | Exclusion::ConnectionCooldown
                    | Exclusion::Unreachable
                    | Exclusion::ModelLockout
                    | Exclusion::ProviderCooldown
            )
        };
        if self.outcomes.is_empty() {
            if let Some((LastFailure::Gateway(_), _)) = &self.last
                && self.excluded.is_empty()
            {
                // Refused locally (queue, gate) before any upstream call: that refusal.
                return None;
            }
            // B §3.4: a cooling reason makes it `all_targets_cooling_down`; only
            // "unavailable" connections (terminal states) make it `no_executable_targets`;
            // any other pre-dispatch skip (a busy round-robin semaphore, a target this
            // request already exhausted) makes it `ALL_TARGETS_SKIPPED`.
            if self.excluded.iter().any(|e| cooling(&e.reason)) {
                return Some(self.cooling_error());
            }
            if !self.excluded.is_empty()
                && self.exhausted.is_empty()
                && self
                    .excluded
                    .iter()
                    .all(|e| matches!(e.reason, Exclusion::Terminal(_)))
            {
                return Some(self.no_executable_error());
            }
            if !self.exhausted.is_empty() || !self.excluded.is_empty() {
                return Some(self.skipped_error());
            }
            return None;
        }
        if self.outcomes.iter().all(|o| o.note.status.is_none()) {
            return Some(self.inactive_error());
        }
        // #10501: the status comes from every outcome. One class throughout, or every
        // target calling the request invalid: the last answer as it is.
        let first = &self.outcomes[0].note.class;
        let one_class = self.outcomes.iter().all(|o| o.note.class == *first);
        let all_invalid = self.outcomes.iter().all(|o| {
            o.note
                .status
                .is_some_and(|s| (400..500).contains(&s) && s != 429 && s != 408)
        });
        if one_class || all_invalid {
            return None;
        }
        Some(self.mixed_error())
    }

    fn name(&self, t: &Target) -> String {
        format!(
            "{}/{}",
            self.shard.config().provider(t.provider).name,
            t.model
        )
    }

    fn attempted_targets(&self) -> usize {
        let mut seen: Vec<&Target> = Vec::new();
        for o in &self.outcomes {
            if !seen.contains(&&o.target) {
                seen.push(&o.target);
            }
        }
        seen.len()
    }

    /// Adds the diagnostics body, the recovery hint and the `x-omniroute-combo-*` /
    /// `x-omniroute-recovery-*` headers to a terminal answer.
    fn diagnosed(
        &self,
        mut err: GatewayError,
        terminal: &'static str,
        action: &'static str,
        next_step: &str,
        retry_s: Option<u64>,
    ) -> GatewayError {
        let config = self.shard.config();
        let excluded: Vec<serde_json::Value> = self
            .excluded
            .iter()
            .map(|e| {
                json!({"provider": config.provider(e.provider).name, "model": e.model,
                       "reason": e.reason.as_str()})
            })
            .chain(self.exhausted.iter().map(|(t, _)| {
                json!({"provider": config.provider(t.provider).name, "model": t.model,
                       "reason": "request_exhaustion"})
            }))
            .collect();
        let order: Vec<String> = self.outcomes.iter().map(|o| self.name(&o.target)).collect();
        let recovery = match retry_s {
            Some(s) => json!({"action": action, "next_step": next_step, "retry_after_seconds": s}),
            None => json!({"action": action, "next_step": next_step}),
        };
        let excluded_header: String = self
            .excluded
            .iter()
            .map(|e| {
                format!(
                    "{}/{}:{}",
                    config.provider(e.provider).name,
                    e.model,
                    e.reason.as_str()
                )
            })
            .chain(
                self.exhausted
                    .iter()
                    .map(|(t, _)| format!("{}:request_exhaustion", self.name(t))),
            )
            .collect::<Vec<_>>()
            .join(",");
        let attempted = self.attempted_targets();
        err = err
            .with_top_level(
                "diagnostics",
                json!({"poolSize": self.steps.len(), "attempted": attempted,
                       "excluded": excluded, "attemptOrder": order,
                       "terminalReason": terminal, "recovery": recovery.clone()}),
            )
            .with_top_level("recovery_hint", recovery)
            .with_header("x-omniroute-combo-pool-size", self.steps.len().to_string())
            .with_header("x-omniroute-combo-attempted", attempted.to_string())
            .with_header(
                "x-omniroute-combo-excluded",
                truncate(&excluded_header, 900),
            )
            .with_header("x-omniroute-combo-terminal-reason", terminal)
            .with_header("x-omniroute-recovery-action", action)
            .with_header(
                "x-omniroute-recovery-next-step",
                truncate(&header_safe(next_step), 128),
            );
        if let Some(s) = retry_s {
            err = err
                .with_retry_after(s)
                .with_header("x-omniroute-retry-after-seconds", s.to_string());
        }
        err
    }

    fn min_retry_ms(&self) -> Option<u64> {
        self.excluded.iter().filter_map(|e| e.retry_after_ms).min()
    }

    fn cooling_error(&self) -> GatewayError {
        let config = self.shard.config();
        let now = self.shard.now();
        let summary: Vec<String> = self
            .excluded
            .iter()
            .map(|e| {
                let p = &config.provider(e.provider).name;
                match e.retry_after_ms {
                    Some(ms) => format!("{p}/{}: {} ({}s)", e.model, e.reason.as_str(), secs(ms)),
                    None => format!("{p}/{}: {}", e.model, e.reason.as_str()),
                }
            })
            .collect();
        let min = self.min_retry_ms();
        let retry_s = min.map(secs);
        let mut err = GatewayError::new(
            ErrorKind::AllTargetsCoolingDown,
            format!(
                "Service temporarily unavailable: every target in this combo is cooling down \
                 ({} of {} excluded): {}",
                self.excluded.len(),
                self.req.plan.candidates.len(),
                summary.join(", ")
            ),
        );
        if let (Some(ms), Some(s)) = (min, retry_s) {
            err = err.with_extra("retry_after", json!(s)).with_extra(
                "reset_at",
                json!(crate::resilience::breaker::iso8601_utc(
                    now.wall_ms.saturating_add(ms)
                )),
            );
        }
        let next = match retry_s {
            Some(s) => format!("Wait {s}s for the first target to cool down, then retry"),
            None => "Wait for a target to cool down, then retry".to_owned(),
        };
        self.diagnosed(err, "all_targets_cooling_down", "wait", &next, retry_s)
    }

    fn no_executable_error(&self) -> GatewayError {
        let err = GatewayError::new(
            ErrorKind::NoExecutableTargets,
            "Combo has no executable targets",
        );
        self.diagnosed(
            err,
            "no_executable_targets",
            "switch-combo",
            "Every target's connections are unavailable; use another combo or reconnect them",
            None,
        )
    }

    fn skipped_error(&self) -> GatewayError {
        let config = self.shard.config();
        let mut groups: Vec<(&'static str, Vec<String>)> = Vec::new();
        let mut add = |reason: &'static str, name: String| match groups
            .iter_mut()
            .find(|(r, _)| *r == reason)
        {
            Some((_, list)) if !list.contains(&name) => list.push(name),
            Some(_) => {}
            None => groups.push((reason, vec![name])),
        };
        for (t, _) in &self.exhausted {
            add("request_exhaustion", self.name(t));
        }
        for e in &self.excluded {
            // The spec's allow-list of skip reasons names an unusable connection
            // `availability`.
            let reason = match e.reason {
                Exclusion::Terminal(_) => "availability",
                r => r.as_str(),
            };
            add(
                reason,
                format!("{}/{}", config.provider(e.provider).name, e.model),
            );
        }
        let skipped: Vec<serde_json::Value> = groups
            .iter()
            .map(|(r, ts)| json!({"reason": r, "targets": ts}))
            .collect();
        let min = self.min_retry_ms();
        let (kind, message) = match min {
            Some(ms) => (
                ErrorKind::AllTargetsSkippedRateLimited,
                format!(
                    "Service temporarily unavailable: all targets were skipped by pre-dispatch \
                     filters; retry after {}",
                    crate::resilience::backoff::human_duration(ms)
                ),
            ),
            None => (
                ErrorKind::AllTargetsSkipped,
                "Service temporarily unavailable: all targets were skipped by pre-dispatch \
                 filters"
                    .to_owned(),
            ),
        };
        let mut err = GatewayError::new(kind, message).with_extra("skippedTargets", json!(skipped));
        if let Some(ms) = min {
            err = self.with_reset(err, ms);
        }
        self.diagnosed(
            err,
            "all_targets_skipped",
            "retry",
            "Every target was ruled out for this request; retry or use another combo",
            min.map(secs),
        )
    }

    fn with_reset(&self, err: GatewayError, ms: u64) -> GatewayError {
        let now = self.shard.now();
        err.with_extra("retry_after", json!(secs(ms))).with_extra(
            "reset_at",
            json!(crate::resilience::breaker::iso8601_utc(
                now.wall_ms.saturating_add(ms)
            )),
        )
    }

    fn inactive_error(&self) -> GatewayError {
        let min = self
            .outcomes
            .iter()
            .filter_map(|o| o.note.hint_ms)
            .chain(self.min_retry_ms())
            .min();
        let kind = if min.is_some() {
            ErrorKind::AllAccountsInactiveRateLimited
        } else {
            ErrorKind::AllAccountsInactive
        };
        let mut err = GatewayError::new(
            kind,
            format!(
                "Service temporarily unavailable: all upstream accounts are inactive \
                 (no upstream answered: {})",
                self.classes()
            ),
        );
        if let Some(ms) = min {
            err = self.with_reset(err, ms);
        }
        self.diagnosed(
            err,
            "all_accounts_inactive",
            "retry",
            "No upstream answered; retry later",
            min.map(secs),
        )
    }

    /// `class (provider/model status), …`, each distinct class once; connection ids are
    /// never named.
    fn classes(&self) -> String {
        let mut seen: Vec<String> = Vec::new();
        for o in &self.outcomes {
            let line = match o.note.status {
                Some(s) => format!("{} ({} {s})", o.note.class, self.name(&o.target)),
                None => format!("{} ({})", o.note.class, self.name(&o.target)),
            };
            if !seen.iter().any(|l| l.starts_with(o.note.class)) {
                seen.push(line);
            }
        }
        seen.join(", ")
    }

    fn mixed_error(&self) -> GatewayError {
        let min = self.outcomes.iter().filter_map(|o| o.note.hint_ms).min();
        let mut err = GatewayError::new(
            ErrorKind::AllTargetsFailed,
            format!(
                "All {} attempted combo targets failed: {}",
                self.attempted_targets(),
                self.classes()
            ),
        );
        if let Some(ms) = min {
            err = self.with_reset(err, ms);
        }
        self.diagnosed(
            err,
            "all_targets_failed",
            "retry",
            "Every target failed; retry later",
            min.map(secs),
        )
    }

    fn timeout_error(&self) -> GatewayError {
        let tried: Vec<String> = self
            .outcomes
            .iter()
            .take(TIMEOUT_LISTED)
            .map(|o| match o.note.status {
                Some(s) => format!("{} ({s})", o.target.model),
                None => format!("{} ({})", o.target.model, o.note.class),
            })
            .collect();
        let mut message = format!(
            "Combo global timeout ({}ms) after {}/{} targets",
            self.s.combo_timeout_ms,
            self.attempted_targets(),
            self.steps.len()
        );
        if !tried.is_empty() {
            message.push_str(" | tried: ");
            message.push_str(&tried.join(", "));
        }
        let err = GatewayError::new(ErrorKind::ComboTimeout, message);
        self.diagnosed(
            err,
            "combo_timeout",
            "retry",
            "The combo ran out of time; retry, or raise combo_timeout_ms",
            None,
        )
    }
}

impl<'a> Runner<'a, '_> {
    /// A round-robin combo's per-model semaphore for candidate `k` (B §2.2), taken before
    /// the attempt and held until it ends; a candidate the local views skip anyway takes
    /// none (its attempt says why). Busy past the queue (timed out, or `queue_depth`
    /// waiters already): the candidate is skipped for `concurrency_cap`. The wait is
    /// raced against the client hanging up and bounded by the combo's time left.
    async fn slot(&self, k: usize, down: &mut Downstream<'_>) -> Result<Slot<'a>, After> {
        let shard: &'a Req<'a> = self.shard;
        if shard.config().combos[self.combo].strategy != ComboStrategy::RoundRobin {
            return Ok(Slot::Free);
        }
        let (target, connection) = &self.req.plan.candidates[k];
        let skipped = matches!(
            select::gate(
                &shard.state().views.borrow(),
                shard.config(),
                target,
                *connection,
                shard.now()
            ),
            Gate::Skip(..)
        );
        if skipped {
            return Ok(Slot::Free);
        }
        // Pinned in place, each wrapper holding the one inside by reference
        // (`deadline::within` says why).
        let waited = {
            let take = std::pin::pin!(gates::client::combo_slot(
                shard,
                self.combo,
                *connection,
                &target.model
            ));
            let bounded = std::pin::pin!(async {
                match self.remaining_ms() {
                    Some(left) => crate::timer::timeout(Duration::from_millis(left), take)
                        .await
                        .unwrap_or(Err(GateError::Timeout)),
                    None => take.await,
                }
            });
            let bounded =
                std::pin::pin!(super::deadline::within(shard, self.req.deadline, bounded));
            unless_client_gone(down.client, down.pending, bounded).await
        };
        match waited {
            Some(Ok(Ok(permit))) => Ok(Slot::Held(permit)),
            // The request's own deadline passed while it waited: the attempt's admission
            // answers it at once (504 `request_timeout`); nothing is sent upstream.
            Some(Err(_)) => Ok(Slot::Free),
            Some(Ok(Err(e))) => {
                tracing::debug!(connection = %shard.config().connection(*connection).name, error = ?e, "combo semaphore busy; skipping the target");
                Ok(Slot::Busy(Excluded {
                    provider: target.provider,
                    connection: *connection,
                    model: target.model.clone(),
                    reason: Exclusion::ConcurrencyCap,
                    retry_after_ms: None,
                }))
            }
            None => {
                shard.metrics().abandoned(Abandoned::Admission);
                self.log_last(down);
                Err(After::Close)
            }
        }
    }
}

/// A round-robin combo's semaphore for one candidate.
enum Slot<'s> {
    /// Not a round-robin combo, or the views skip the candidate anyway.
    Free,
    Held(GatePermit<'s>),
    Busy(Excluded),
}

enum StepEndOr {
    Step(StepEnd),
    End(Ended),
}

/// Whether a candidate may be attempted.
enum Before {
    /// A rule-scoped failure ruled it out for this request.
    Ruled,
    End(Ended),
}

/// What one attempt's end means for the loop.
enum Absorbed {
    Next,
    Failed,
    End(StepEndOr),
}

/// How a hedged pair ended.
enum HedgeEnd {
    /// Not raced: try the step plainly.
    NotHedged,
    /// Only the first ran (it ended before the hedge delay): its other candidates next.
    First,
    /// Both ran, neither served: both steps' other candidates next.
    Both,
    End(Ended),
}

/// The hedge race's result.
enum Race<'s> {
    /// The first ended before the hedge delay.
    Alone(Opened<'s>),
    A(Opened<'s>),
    B(Opened<'s>),
    Both(Opened<'s>, Opened<'s>),
}

fn secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Printable ASCII only (a header value).
fn header_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_cut_on_char_boundaries_and_kept_printable() {
        assert_eq!(truncate("abcdef", 3), "abc");
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(header_safe("wait\r\nnow"), "wait??now");
        assert_eq!(secs(1), 1);
        assert_eq!(secs(1001), 2);
    }
}
