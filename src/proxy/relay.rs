//! The attempt loop: try the plan's candidates in order until one answer reaches the
//! client. Each `attempt` ends in a closed `AttemptEnd`; until the first body byte is
//! written to the client, a failure moves on to the next candidate.
//!
//! One attempt runs, in order: select (the local views; a half-open breaker's probe permit
//! from its owner) → admit (quota-share slot, request-queue slot with its queue-wait budget,
//! gate permits; the wait raced against the client hanging up) → forward within the
//! execution budget → classify an error answer (restatement, verdict, gate block, queue
//! learning) → relay. Its outcome is recorded exactly once by the `Attempted` guard.

use std::pin::{Pin, pin};

use crate::net::io::ClientStream;
use bytes::{Bytes, BytesMut};
use serde_json::json;

use super::access::AccessLog;
use super::classify::{self, Failed};
use super::continuation::{self, Splice};
use super::deadline::{self, Budget, Deadline};
use super::respond::send_error;
use super::select::{self, Admit, Excluded, Exclusion, Gate};
use super::stream::{self, Buffered};
use super::upstream::{self, Budgets};
use super::{After, observe, peek};
use crate::config::{Connection, ConnectionId, Provider, ProviderFormat, ProviderId};
use crate::error::{Dialect, ErrorKind, GatewayError, Retry, TimeoutPhase};
use crate::flow::admission::{gate_block_ms, queue_of};
use crate::flow::queue::{QueueError, ResponseFacts};
use crate::http1::{Persist, RequestHead};
use crate::net::downstream::unless_client_gone;
use crate::owners::Req;
use crate::owners::affinity::{self, client::Session};
use crate::owners::health::client::{ProbePermits, is_quiet, report};
use crate::owners::health::protocol::{ComboAttempt, Ended, Verdict};
use crate::owners::{gates, queue, quota_share, tool_limits};
use crate::providers::Endpoint;
use crate::providers::translate::Translation;
use crate::resilience::backoff::retry_after_header;
use crate::resilience::breaker::{
    BreakerKey, Failure, circuit_open_response, connections_open_message,
};
use crate::resilience::classify::parse_error_body;
use crate::resilience::connection::Terminal;
use crate::resilience::emergency::{emergency_body, is_budget_failure};
use crate::resilience::restate::apply_status_restatement;
use crate::resilience::tool_limit::learned_threshold;
use crate::resilience::{OwnedHeaders, RuleScope};
use crate::routing::model_name::ModelName;
use crate::routing::resolve::Target;
use crate::shard::metrics::{Abandoned, bump};

/// The decided route of an inference request: what the client asked for and the
/// candidates to try in order.
pub struct Plan {
    pub peek: peek::Peek,
    pub candidates: Vec<(Target, ConnectionId)>,
    /// The combo the model names (its index), if it is one.
    pub combo: Option<usize>,
    /// The quota-share combo the model names (its index), if it is one.
    pub quota_share: Option<usize>,
    /// The request's session when session affinity is on (B §4).
    pub session: Option<Session>,
    /// The client key used (its index), if any: what the emergency target may use.
    pub key: Option<usize>,
}

/// The client side of a request: its connection, the connection's read buffer (bytes the
/// client pipelines while the request waits land there), and whether keep-alive holds
/// (and how the answer says so).
pub struct Downstream<'c> {
    pub client: &'c mut ClientStream,
    pub pending: &'c mut BytesMut,
    pub keep_alive: Persist,
    /// The error shape the client expects.
    pub dialect: Dialect,
    /// Set before the first byte is written to the client: from then on the end of the
    /// shutdown grace period is the stream relay's to handle (`stream::commit`).
    pub committed: &'c std::cell::Cell<bool>,
    /// The request's access-log record.
    pub log: &'c AccessLog,
    /// With `stream_recovery.continue_mid_stream`: the client stream a continuation may
    /// go on with (`proxy::continuation`).
    pub splice: Option<Box<Splice>>,
}

/// What the attempts of one request share.
pub(super) struct Request<'r> {
    head: &'r RequestHead,
    endpoint: Endpoint,
    body: &'r Bytes,
    pub(super) plan: &'r Plan,
    budgets: Budgets,
    /// Headers added to the client's response, whoever answers.
    notes: Vec<(&'static str, String)>,
    /// The overall request deadline (`[server] request_timeout_ms`): every attempt and
    /// wait until an answer's head reaches the client.
    pub(super) deadline: Option<Deadline>,
}

impl<'r> Request<'r> {
    pub(super) fn new(
        shard: &Req<'_>,
        head: &'r RequestHead,
        endpoint: Endpoint,
        body: &'r Bytes,
        plan: &'r Plan,
        notes: Vec<(&'static str, String)>,
    ) -> Self {
        Self {
            head,
            endpoint,
            body,
            plan,
            budgets: Budgets::of(shard),
            notes,
            deadline: Deadline::after(
                shard,
                Budget::Request {
                    ms: shard.config().server.request_timeout_ms,
                },
            ),
        }
    }
}

/// The last failure seen, answered when no candidate succeeds.
pub(super) enum LastFailure {
    Gateway(GatewayError),
    Upstream(Box<Buffered>),
}

/// How one attempt ended.
pub(super) enum AttemptEnd {
    /// The client has its answer (or is gone): the request is over.
    Done(After),
    /// Failed before the first byte reached the client: try the next candidate.
    MoveOn(LastFailure),
    /// Failed after the answer's head arrived but before its first byte reached the client
    /// (a watchdog, or a failure inside the hold-back): with stream recovery on, the same
    /// candidate is tried once more first (B §7.3 early recovery).
    Early(LastFailure),
    /// Not tried: the views rule it out for now.
    Skipped(Excluded),
    /// Failed in a way the next candidate would not fix: answer it.
    Stop(LastFailure),
}

/// Tries the plan's candidates in order and relays the first acceptable answer.
pub async fn run(
    shard: &Req<'_>,
    head: &RequestHead,
    endpoint: Endpoint,
    body: Bytes,
    plan: &mut Plan,
    mut downstream: Downstream<'_>,
) -> After {
    // A quota-share combo: the home orders the candidates that are available now and
    // counts the pick in flight until this request ends (the ticket's drop).
    let _in_flight = match plan.quota_share {
        Some(combo) => order_available(shard, combo, &mut plan.candidates).await,
        None => None,
    };
    // Only a session's affinity waits (`prepare`); without one, the rest is done in
    // place, and `prepare`'s future is neither built nor copied into this one.
    let (body, notes) = if plan.session.is_some() && plan.quota_share.is_none() {
        prepare(shard, endpoint, plan, body).await
    } else {
        arrange(shard, endpoint, plan, body)
    };
    let plan: &Plan = plan;
    let request = Request::new(shard, head, endpoint, &body, plan, notes);
    let mut budget_spent: Option<Target> = None;
    // The last failure and the index of the candidate it happened on.
    let mut last: Option<(LastFailure, usize)> = None;
    let mut excluded: Vec<Excluded> = Vec::new();
    let mut walk = Walk::default();
    let mut cooldown_waits = CooldownWaits::default();
    loop {
        for (i, (target, connection)) in plan.candidates.iter().enumerate() {
            if walk.exhausted.rules_out(target.provider, *connection) {
                continue;
            }
            let combo = plan.combo.map(|_| ComboAttempt {
                next_same_provider: next_target_provider(&plan.candidates, i)
                    == Some(target.provider),
            });
            let mut reopened = false;
            walk.then = Then::Candidate(i);
            let end = loop {
                walk.reopens_early = !reopened && walk.may_retry_early(shard);
                let end = attempt(
                    shard,
                    &request,
                    target,
                    *connection,
                    combo,
                    &mut walk,
                    &mut downstream,
                )
                .await;
                match end {
                    AttemptEnd::Early(failure) if !reopened && walk.may_retry_early(shard) => {
                        reopened = true;
                        walk.early_retries += 1;
                        last = Some((failure, i));
                    }
                    end => break end,
                }
            };
            match end {
                AttemptEnd::Done(after) => {
                    // A stream cut after its first byte: the candidates after this one may
                    // continue it.
                    // Boxed: a continuation is rare (off by default), and inline its
                    // attempt would make room in every request's future for a second one.
                    if downstream.splice.as_ref().is_some_and(|s| s.cut_pending()) {
                        return Box::pin(continue_stream(
                            shard,
                            &request,
                            i,
                            &mut walk,
                            &mut downstream,
                        ))
                        .await;
                    }
                    return after;
                }
                AttemptEnd::MoveOn(failure) | AttemptEnd::Early(failure) => {
                    note_budget(shard, &mut budget_spent, target, &failure);
                    if let LastFailure::Gateway(e) = &failure {
                        observe::fallback(shard.families(), None, e.kind);
                    }
                    last = Some((failure, i));
                }
                AttemptEnd::Skipped(e) => excluded.push(e),
                AttemptEnd::Stop(failure) => {
                    note_budget(shard, &mut budget_spent, target, &failure);
                    last = Some((failure, i));
                    break;
                }
            }
        }
        // A direct request whose every candidate was skipped for a short, waitable cooldown
        // waits for the earliest one and walks the candidates again (`wait_for_cooldown`).
        if plan.combo.is_some() || last.is_some() || excluded.is_empty() {
            break;
        }
        let Some(ms) = cooldown_waits.next(shard, &excluded, request.deadline) else {
            break;
        };
        tracing::info!(
            model = %plan.peek.model,
            wait_ms = ms,
            "every credential of the model is cooling: waiting for the earliest (wait_for_cooldown)"
        );
        let sleep = pin!(crate::timer::sleep(std::time::Duration::from_millis(ms)));
        if unless_client_gone(downstream.client, downstream.pending, sleep)
            .await
            .is_none()
        {
            shard.metrics().abandoned(Abandoned::Admission);
            tracing::info!(
                model = %plan.peek.model,
                "client hung up during a cooldown wait (499): nothing sent upstream"
            );
            return After::Close;
        }
        cooldown_waits.waited(ms);
        excluded.clear();
    }
    // Nothing answered because the connections are known to be out of credits: the same
    // spent budget.
    if budget_spent.is_none() && last.is_none() {
        budget_spent = excluded
            .iter()
            .find(|e| e.reason == Exclusion::Terminal(Terminal::CreditsExhausted))
            .map(|e| Target {
                provider: e.provider,
                model: e.model.clone(),
            });
    }
    if let Some(from) = budget_spent
        // Boxed: a rare path whose state every request's future would otherwise make room for.
        && let Some(after) =
            Box::pin(emergency(shard, &request, &from, &mut walk, &mut downstream)).await
    {
        return after;
    }
    answer_last(shard, plan, last, &excluded, walk.attempts, &mut downstream).await
}

/// Goes on with a client stream cut after its first byte (mid-stream continuation,
/// `proxy::continuation`): the candidates after `cut_at` of the request's plan, of either
/// format, are asked in order with the delivered text as an assistant prefill (the
/// client's request with the prefill, translated for a candidate of the other format like
/// any request); one that refuses the prefill gets the original request once more. Its
/// answer (translated into the client's format when it needs to be) is spliced into the
/// open stream; a continuation cut in turn goes on with the candidates after it. With no
/// candidate left the stream ends with the in-band error.
pub(super) async fn continue_stream(
    shard: &Req<'_>,
    request: &Request<'_>,
    cut_at: usize,
    walk: &mut Walk,
    down: &mut Downstream<'_>,
) -> After {
    let plan = request.plan;
    let mut broken: Option<GatewayError> = None;
    for (i, (target, connection)) in plan.candidates.iter().enumerate() {
        // Taken up after each cut: the cut's failure, and a new prefill part begins.
        if let Some(s) = down.splice.as_mut().filter(|s| s.cut_pending()) {
            broken = s.take_cut();
            s.begin(false);
        }
        if i <= cut_at || walk.exhausted.rules_out(target.provider, *connection) {
            continue;
        }
        // The prefill as this candidate's format takes it (`open` translates the request
        // for a candidate of the other format).
        let provider = shard.config().provider(target.provider);
        if !takes_prefill(request.endpoint, provider) {
            continue;
        }
        let for_anthropic = provider.format == ProviderFormat::Anthropic;
        let cont = down
            .splice
            .as_mut()
            .and_then(|s| continuation_request(request, s, for_anthropic));
        let Some((body, cont_plan)) = cont.as_ref() else {
            break;
        };
        let cont_request = Request {
            body,
            plan: cont_plan,
            budgets: Budgets::of(shard),
            notes: request.notes.clone(),
            ..*request
        };
        let combo = plan.combo.map(|_| ComboAttempt {
            next_same_provider: next_target_provider(&plan.candidates, i) == Some(target.provider),
        });
        let (mut reopened, mut replay) = (false, false);
        let left = plan.candidates.iter().skip(i + 1).any(|(t, c)| {
            !walk.exhausted.rules_out(t.provider, *c)
                && takes_prefill(request.endpoint, shard.config().provider(t.provider))
        });
        walk.then = Then::Left(left);
        let end = loop {
            let req = if replay { request } else { &cont_request };
            walk.reopens_early = !reopened && walk.may_retry_early(shard);
            let end = attempt(shard, req, target, *connection, combo, walk, down).await;
            match end {
                AttemptEnd::Early(_) if !reopened && walk.may_retry_early(shard) => {
                    reopened = true;
                    walk.early_retries += 1;
                }
                // The target refused the prefill: the original request once more, used if
                // its answer repeats what the client has.
                AttemptEnd::MoveOn(failure) if !replay && refused_prefill(down, &failure) => {
                    replay = true;
                    if let Some(s) = down.splice.as_mut() {
                        s.begin(true);
                    }
                }
                end => break end,
            }
        };
        match end {
            AttemptEnd::Done(after) => {
                if !down.splice.as_ref().is_some_and(|s| s.cut_pending()) {
                    return after;
                }
            }
            AttemptEnd::MoveOn(_) | AttemptEnd::Early(_) | AttemptEnd::Skipped(_) => {}
            AttemptEnd::Stop(_) => break,
        }
    }
    let cut = down.splice.as_mut().and_then(|s| s.take_cut()).or(broken);
    match cut {
        Some(e) => {
            let splice = down.splice.as_deref_mut();
            continuation::give_up(shard, splice, &e, request.endpoint, down.client).await
        }
        None => After::Close,
    }
}

/// The request that asks the next candidate to continue a cut stream: the original body
/// with the delivered text as an assistant prefill (`None` when it cannot be built).
fn continuation_request(
    request: &Request<'_>,
    s: &mut Splice,
    for_anthropic: bool,
) -> Option<(Bytes, Plan)> {
    let body = s.prefill_body(request.body, for_anthropic)?;
    let peek = peek::peek(&body, &mut Vec::new()).ok()?;
    let plan = Plan {
        peek,
        candidates: Vec::new(),
        combo: None,
        quota_share: request.plan.quota_share,
        session: request.plan.session,
        key: request.plan.key,
    };
    Some((body, plan))
}

/// Whether a candidate can be asked to continue a stream on `endpoint` with a prefill. A
/// provider serving `/v1/responses` as it is cannot: the Responses API has no assistant
/// prefill (an assistant item at the end of `input` is an earlier turn, which the model
/// answers anew rather than continues), so only a candidate the request is translated for
/// (Chat Completions or Anthropic) is asked.
fn takes_prefill(endpoint: Endpoint, provider: &crate::config::Provider) -> bool {
    endpoint != Endpoint::Responses || Translation::between(endpoint, provider).is_some()
}

/// A continuation's target answered that it takes no assistant prefill.
fn refused_prefill(down: &Downstream<'_>, failure: &LastFailure) -> bool {
    match (down.splice.as_deref(), failure) {
        (Some(s), LastFailure::Upstream(b)) => s.wants_replay(b.status, &b.body),
        _ => false,
    }
}

/// The single-model cooldown wait of one request (`wait_for_cooldown`, B §3.3): how many
/// waits it made and how long they took.
#[derive(Default)]
struct CooldownWaits {
    waits: u32,
    waited_ms: u64,
}

impl CooldownWaits {
    /// The wait before the next walk over the candidates, if one is allowed: the time until
    /// the earliest waitable cooldown among the skipped candidates (no margin), at most
    /// `max_retry_wait_sec`, within what is left of `budget_ms` and of the request deadline,
    /// and only `max_retries` times.
    fn next(
        &self,
        shard: &Req<'_>,
        excluded: &[Excluded],
        deadline: Option<Deadline>,
    ) -> Option<u64> {
        let (config, now) = (shard.config(), shard.now());
        let w = &config.resilience.wait_for_cooldown;
        if !w.enabled || w.max_retries == 0 || self.waits >= w.max_retries {
            return None;
        }
        let views = shard.state().views.borrow();
        let wait = excluded
            .iter()
            .filter_map(|e| select::waitable_ms(&views, config, e, now))
            .min()?
            .max(1);
        let budget_left = w.budget_ms.saturating_sub(self.waited_ms);
        let before_deadline = deadline
            .is_none_or(|d| now.mono_ns.saturating_add(wait.saturating_mul(1_000_000)) < d.at_ns);
        (wait <= w.max_retry_wait_ms() && wait <= budget_left && before_deadline).then_some(wait)
    }

    fn waited(&mut self, ms: u64) {
        self.waits += 1;
        self.waited_ms = self.waited_ms.saturating_add(ms);
    }
}

/// Before the first attempt (direct requests and combos alike): session affinity puts each
/// provider's pinned connection first (quota-share combos pick their connection
/// themselves); targets a learned tool limit rules out for this many tools go last; a
/// Responses request with `background: true` is served synchronously (the flag goes out as
/// `null`, the client is told). Returns the body to send and the notes for the response.
pub(super) async fn prepare(
    shard: &Req<'_>,
    endpoint: Endpoint,
    plan: &mut Plan,
    body: Bytes,
) -> (Bytes, Vec<(&'static str, String)>) {
    if let Some(session) = plan.session
        && plan.quota_share.is_none()
    {
        super::affinity::prefer(shard, session, plan.combo.is_some(), &mut plan.candidates).await;
    }
    arrange(shard, endpoint, plan, body)
}

/// `prepare` after the session's affinity: tool-limit steering and the `background` flag.
fn arrange(
    shard: &Req<'_>,
    endpoint: Endpoint,
    plan: &mut Plan,
    body: Bytes,
) -> (Bytes, Vec<(&'static str, String)>) {
    if plan.peek.tool_count > 0 {
        let tools = plan.peek.tool_count;
        let (fit, steered): (Vec<_>, Vec<_>) = std::mem::take(&mut plan.candidates)
            .into_iter()
            .partition(|(t, _)| {
                !tool_limits::client::steers_away(shard, t.provider, &t.model, tools)
            });
        plan.candidates = fit;
        plan.candidates.extend(steered);
    }
    let mut notes = Vec::new();
    let body = match (&plan.peek.background_span, endpoint) {
        (Some(span), Endpoint::Responses) => {
            notes.push(("x-tidegate-warning", "background-degraded".to_owned()));
            peek::degrade_background(&body, span.clone())
        }
        _ => body,
    };
    (body, notes)
}

/// Remembers the first target whose answer said its budget is spent (B §9.1).
pub(super) fn note_budget(
    shard: &Req<'_>,
    spent: &mut Option<Target>,
    target: &Target,
    failure: &LastFailure,
) {
    if spent.is_none()
        && shard.config().emergency_fallback.is_some()
        && let LastFailure::Upstream(b) = failure
        && is_budget_failure(b.status, &String::from_utf8_lossy(&b.body))
    {
        *spent = Some(target.clone());
    }
}

/// Whether a spent budget on `target` sends the request to the emergency target: one is
/// configured (and not switched off), it is another target, the request has no tools, and
/// the endpoint has an output limit to cap.
fn emergency_applies(shard: &Req<'_>, req: &Request<'_>, target: &Target) -> bool {
    // A lease-managed key's request goes to its leased connection only (B §5.4).
    let config = shard.config();
    let managed = req.plan.key.and_then(|i| config.client_keys.get(i));
    !managed.is_some_and(crate::config::ClientKey::is_lease_managed)
        && config.emergency_fallback.as_ref().is_some_and(|fb| {
            (fb.provider, fb.model.as_str()) != (target.provider, target.model.as_str())
                && !req.plan.peek.has_tools
                && output_limit_field(req.endpoint).is_some()
        })
}

fn output_limit_field(endpoint: Endpoint) -> Option<&'static str> {
    match endpoint {
        Endpoint::ChatCompletions | Endpoint::Messages => Some("max_tokens"),
        Endpoint::Responses => Some("max_output_tokens"),
        Endpoint::Embeddings | Endpoint::CountTokens => None,
    }
}

/// The emergency fallback (B §9.1): the request re-run once on the configured target, output
/// capped at 4096 tokens, answered with `X-OmniRoute-Emergency-Fallback: from=…; to=…`.
/// `None` when it does not apply or nothing on the target could serve (the original
/// failure is answered then).
pub(super) async fn emergency(
    shard: &Req<'_>,
    req: &Request<'_>,
    from: &Target,
    walk: &mut Walk,
    down: &mut Downstream<'_>,
) -> Option<After> {
    if !emergency_applies(shard, req, from) {
        return None;
    }
    let config = shard.config();
    let fb = config.emergency_fallback.as_ref()?;
    let provider = config.provider(fb.provider);
    if !crate::providers::serves(provider, req.endpoint) {
        return None;
    }
    let target = Target {
        provider: fb.provider,
        model: ModelName::new(&fb.model),
    };
    let key = req.plan.key.and_then(|i| config.client_keys.get(i));
    let candidates: Vec<(Target, ConnectionId)> = shard
        .shared()
        .routes
        .connections(fb.provider)
        .iter()
        .filter(|c| key.is_none_or(|k| k.may_use(**c)))
        .map(|c| (target.clone(), *c))
        .collect();
    let limit = output_limit_field(req.endpoint)?;
    let body = Bytes::from(emergency_body(req.body, &fb.model, limit)?);
    let mut peek = req.plan.peek.clone();
    peek.model = ModelName::new(&fb.model);
    let plan = Plan {
        peek,
        candidates,
        combo: None,
        quota_share: None,
        session: None,
        key: req.plan.key,
    };
    let mut notes = req.notes.clone();
    notes.push((
        "x-omniroute-emergency-fallback",
        format!(
            "from={}/{}; to={}/{}",
            config.provider(from.provider).name,
            from.model,
            provider.name,
            fb.model
        ),
    ));
    tracing::info!(from = %config.provider(from.provider).name, to = %provider.name, "emergency fallback");
    let request = Request {
        head: req.head,
        endpoint: req.endpoint,
        body: &body,
        plan: &plan,
        budgets: Budgets::of(shard),
        notes,
        // The same client request: the fallback runs under what is left of its deadline.
        deadline: req.deadline,
    };
    walk.reopens_early = false;
    for (i, (target, connection)) in plan.candidates.iter().enumerate() {
        walk.then = Then::Candidate(i);
        match attempt(shard, &request, target, *connection, None, walk, down).await {
            AttemptEnd::Done(after) => {
                if let Some(e) = down.splice.as_mut().and_then(|s| s.take_cut()) {
                    let splice = down.splice.as_deref_mut();
                    let after =
                        continuation::give_up(shard, splice, &e, req.endpoint, down.client).await;
                    return Some(after);
                }
                return Some(after);
            }
            AttemptEnd::MoveOn(_) | AttemptEnd::Early(_) | AttemptEnd::Skipped(_) => {}
            AttemptEnd::Stop(_) => break,
        }
    }
    None
}

/// Quota-share ordering over the candidates the local views let through now (spec B §3.1:
/// unavailable steps are filtered before the strategy runs). A cooling, locked, terminal,
/// open-breaker or tracker-cooled (`provider_cooldown`) candidate takes no deficit turn and
/// no in-flight ticket; it stays at the end of the list, where its attempt is skipped and
/// named in the terminal answer. With nothing available nobody is asked.
pub(super) async fn order_available<'s>(
    shard: &'s Req<'s>,
    combo: usize,
    candidates: &mut Vec<(Target, ConnectionId)>,
) -> Option<quota_share::client::QsTicket<'s>> {
    let (mut available, unavailable): (Vec<_>, Vec<_>) = {
        let views = shard.state().views.borrow();
        let (config, now) = (shard.config(), shard.now());
        std::mem::take(candidates).into_iter().partition(|(t, c)| {
            !matches!(select::gate(&views, config, t, *c, now), Gate::Skip(..))
                && views.tracker_cooling(t.provider, *c, now).is_none()
        })
    };
    let ticket = if available.is_empty() {
        None
    } else {
        quota_share::client::order(shard, combo, &mut available).await
    };
    *candidates = available;
    candidates.extend(unavailable);
    ticket
}

/// The provider of the first candidate after `i` whose target differs from candidate `i`'s
/// (the combo's next target), if any.
fn next_target_provider(candidates: &[(Target, ConnectionId)], i: usize) -> Option<ProviderId> {
    let (target, _) = candidates.get(i)?;
    candidates
        .iter()
        .skip(i + 1)
        .find(|(t, _)| t != target)
        .map(|(t, _)| t.provider)
}

/// How far one request's walk over its candidates has come.
#[derive(Debug, Default)]
pub(super) struct Walk {
    /// Upstream attempts made so far.
    pub(super) attempts: usize,
    pub(super) exhausted: Exhausted,
    /// The next attempt's budget up to its response head (a combo's target timeout).
    pub(super) open_budget: Option<std::time::Duration>,
    /// What the last attempt that moved on failed with.
    pub(super) note: Option<FailureNote>,
    /// Early-recovery retries made so far (same candidate again).
    pub(super) early_retries: usize,
    /// What follows the current attempt if it fails and moves on, for its INFO line.
    pub(super) then: Then,
    /// A failure of the current attempt before its first client byte reopens it on the same
    /// candidate (stream recovery), for its INFO line.
    pub(super) reopens_early: bool,
}

/// What follows an attempt that fails and moves on, as the walk running it knows it; set
/// before each attempt, read only when one fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Then {
    /// A combo's runner decides: a retry, its next target, a wait, or its answer.
    #[default]
    Combo,
    /// A direct walk at candidate `i` of the request's plan: the candidates after it that
    /// the walk has not ruled out (read when the attempt fails, after its own failure had
    /// its say).
    Candidate(usize),
    /// Whether another candidate is left (a walk whose candidates are not the plan's).
    Left(bool),
}

/// The body for an Anthropic-format provider without the unsigned thinking blocks the
/// request replays (`providers::translate::unsigned`); `None`: the body goes as it is.
fn unsigned_thinking_cleared(req: &Request<'_>, provider: &Provider, model: &str) -> Option<Bytes> {
    let same_format = provider.format == ProviderFormat::Anthropic
        && matches!(req.endpoint, Endpoint::Messages | Endpoint::CountTokens);
    if !same_format {
        return None;
    }
    let cleared =
        crate::providers::translate::unsigned::without_unsigned_thinking(req.body, model)?;
    tracing::debug!(
        model,
        "unsigned thinking blocks left out for an Anthropic provider"
    );
    Some(Bytes::from(cleared))
}

/// The end of a moving-on failure's INFO line: what the request does next.
fn what_next(req: &Request<'_>, walk: &Walk, early: bool) -> &'static str {
    if early && walk.reopens_early {
        return "retrying the same candidate once (stream recovery)";
    }
    let left = match walk.then {
        Then::Combo => return "the combo goes on (a retry, its next target, or its answer)",
        Then::Candidate(i) => req
            .plan
            .candidates
            .iter()
            .skip(i + 1)
            .any(|(t, c)| !walk.exhausted.rules_out(t.provider, *c)),
        Then::Left(left) => left,
    };
    if left {
        "trying the next candidate"
    } else {
        "no candidate left"
    }
}

/// Early-recovery retries per request at most (spec B §7.3).
const MAX_EARLY_RETRIES: usize = 4;

impl Walk {
    /// With stream recovery on, an attempt that failed before its first client byte is
    /// reopened on the same candidate once, up to [`MAX_EARLY_RETRIES`] per request.
    fn may_retry_early(&self, shard: &Req<'_>) -> bool {
        shard.config().resilience.stream_recovery.enabled && self.early_retries < MAX_EARLY_RETRIES
    }
}

/// What one failed attempt teaches a combo's loop: the upstream status (none for a
/// gateway-side failure), its class, the upstream's retry hint, and, for an answer that
/// calls the request itself invalid, the error's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FailureNote {
    pub(super) status: Option<u16>,
    pub(super) class: &'static str,
    /// How long the upstream asked to wait (Retry-After or a reset hint), ms.
    pub(super) hint_ms: Option<u64>,
    /// `Some(identity)` for a request-shape error (context length, malformed or invalid
    /// parameters): never re-sent to the same target.
    pub(super) request_shape: Option<String>,
}

impl FailureNote {
    fn of_error(e: &GatewayError) -> Self {
        Self {
            status: None,
            class: e.kind.code(),
            hint_ms: None,
            request_shape: None,
        }
    }

    fn of_answer(v: &Verdict, hint_ms: Option<u64>, message: &str) -> Self {
        let class = match v.error_type {
            Some(t) => t.as_str(),
            None => v.decision.reason.as_str(),
        };
        let shape = matches!(v.status, 400 | 413 | 422)
            && v.decision.reason != crate::resilience::Reason::RateLimitExceeded
            && v.decision.rule_scope.is_none();
        Self {
            status: Some(v.status),
            class,
            hint_ms,
            request_shape: shape.then(|| {
                let m: String = message.chars().take(200).collect();
                format!("{} {}", v.status, m.to_lowercase())
            }),
        }
    }
}

/// What rule-scoped failures ruled out for the rest of one request (A §6.3): a failure whose
/// provider rule is scoped to the provider excludes every connection of that provider (for
/// every target); one scoped to the connection excludes that connection.
#[derive(Debug, Default)]
pub(super) struct Exhausted {
    providers: Vec<ProviderId>,
    connections: Vec<ConnectionId>,
}

impl Exhausted {
    fn note(&mut self, scope: Option<RuleScope>, provider: ProviderId, connection: ConnectionId) {
        match scope {
            Some(RuleScope::Provider) if !self.providers.contains(&provider) => {
                self.providers.push(provider);
            }
            Some(RuleScope::Connection) if !self.connections.contains(&connection) => {
                self.connections.push(connection);
            }
            Some(RuleScope::Provider | RuleScope::Connection | RuleScope::Model) | None => {}
        }
    }

    /// Takes in what another walk ruled out (a hedged attempt's).
    pub(super) fn merge(&mut self, other: &Exhausted) {
        for p in &other.providers {
            if !self.providers.contains(p) {
                self.providers.push(*p);
            }
        }
        for c in &other.connections {
            if !self.connections.contains(c) {
                self.connections.push(*c);
            }
        }
    }

    pub(super) fn rules_out(&self, provider: ProviderId, connection: ConnectionId) -> bool {
        self.providers.contains(&provider) || self.connections.contains(&connection)
    }
}

/// Reports an attempt's outcome to the owners exactly once: [`Attempted::end`] consumes
/// it. An attempt dropped before its end (its future cancelled with the client) counts as
/// a client abort: its probe permits go back when they drop, nothing counts against the
/// upstream.
pub(super) struct Attempted<'s> {
    shard: &'s Req<'s>,
    target: &'s Target,
    connection: ConnectionId,
    /// A combo target (the owners apply the combo path's rules; its failures feed the
    /// provider cooldown tracker).
    combo: Option<ComboAttempt>,
    permits: Option<ProbePermits<'s>>,
    /// The combo whose strategy hears how the attempt ended (`proxy::strategy::ended`).
    strategy: Option<usize>,
    /// How long the answer's head took, once it came.
    head_ms: Option<u64>,
}

impl<'s> Attempted<'s> {
    /// Tells the combo's strategy how the attempt ended: served, failed, or nothing (the
    /// client left). Every ending passes here once: through [`Attempted::end`], or on
    /// its own where a quiet ending is dropped.
    fn tell_strategy(&self, ended: &Ended) {
        let Some(combo) = self.strategy else {
            return;
        };
        let ok = match ended {
            Ended::Success => true,
            Ended::Failed(_) | Ended::StreamBroken { .. } => false,
            Ended::ClientAbort => return,
        };
        super::strategy::ended(
            self.shard,
            combo,
            self.target,
            self.connection,
            ok,
            self.head_ms,
        );
    }

    async fn end(mut self, ended: Ended) {
        self.tell_strategy(&ended);
        // A stalled or broken stream is a failed attempt of its type (a classified failure
        // was counted when it was classified).
        if let Ended::StreamBroken { error_type, .. } = &ended {
            self.shard.metrics().upstream_error(Some(*error_type));
        }
        if let Some(permits) = self.permits.take() {
            report(
                self.shard,
                self.target.provider,
                self.connection,
                &self.target.model,
                self.combo,
                permits,
                ended,
            )
            .await;
        }
    }

    /// Whether ending with `ended` has nothing to report (`health::client::is_quiet`), no
    /// probe held and no stream break to count: the attempt may simply be dropped.
    fn is_quiet(&self, ended: &Ended) -> bool {
        !matches!(ended, Ended::StreamBroken { .. })
            && self.permits.as_ref().is_none_or(|p| {
                is_quiet(self.shard, self.target.provider, self.connection, p, ended)
            })
    }

    /// The backoff level this shard's view has for the connection.
    fn level(&self) -> u32 {
        let views = self.shard.state().views.borrow();
        views.connections.get(self.connection).backoff_level
    }

    /// Ends the attempt on an error before or while reading an answer.
    async fn end_with_error(self, err: &GatewayError) {
        let shard = self.shard;
        let verdict = classify::verdict_of_error(
            shard.config(),
            self.level(),
            self.target.provider,
            self.connection,
            &self.target.model,
            err,
            shard.now(),
        );
        let ended = match verdict {
            Some(v) => {
                shard.metrics().upstream_error(v.error_type);
                Ended::Failed(Box::new(v))
            }
            None => Ended::ClientAbort,
        };
        self.end(ended).await;
    }
}

/// One attempt on `(target, connection)`; `combo` when it is for a combo's target.
pub(super) async fn attempt(
    shard: &Req<'_>,
    req: &Request<'_>,
    target: &Target,
    connection: ConnectionId,
    combo: Option<ComboAttempt>,
    walk: &mut Walk,
    down: &mut Downstream<'_>,
) -> AttemptEnd {
    // Inline, not boxed: `open` is only a little larger than `deliver`, and a box freed
    // after the first bytes stays resident between the streams' live request futures
    // (measured: more memory per stream, not less, and a copy per request).
    let opened = open(
        shard,
        req,
        target,
        connection,
        combo,
        walk,
        Some((&mut *down.client, &mut *down.pending)),
    )
    .await;
    match opened {
        Opened::End(end) => end,
        Opened::Ready(ready) => deliver(shard, req, ready, walk.attempts, down).await,
    }
}

/// An attempt up to the answer it has for the client, nothing written yet.
pub(super) enum Opened<'s> {
    /// Skipped, failed (move on or stop), or the client left while it waited.
    End(AttemptEnd),
    Ready(Ready<'s>),
}

/// An answer ready for the client.
pub(super) enum Ready<'s> {
    /// An error answer the next candidate would not fix: relayed as it is (its outcome is
    /// already recorded).
    Relay(Box<Buffered>),
    /// A 2xx with its first bytes; it holds its admission (slot, permits) until it ends.
    Stream(Box<Streaming<'s>>),
}

pub(super) struct Streaming<'s> {
    attempted: Attempted<'s>,
    /// The provider is of the other format: the answer is translated (and whether the
    /// OpenAI client asked for the usage chunk).
    translation: Option<(Translation, super::translate::Carry)>,
    up: upstream::Up,
    first: Option<Bytes>,
    wd: Option<super::watchdog::Watchdog>,
    /// The attempt's hard deadline (`stream_watchdog.active_timeout_ms`), still running
    /// while the answer streams.
    active: Option<Deadline>,
    _held: (
        Option<gates::client::GatePermit<'s>>,
        Option<queue::client::QueueSlot<'s>>,
        Option<gates::client::GatePermit<'s>>,
    ),
}

/// Writes a ready answer to the client; `attempts` so far are reported with it.
pub(super) async fn deliver(
    shard: &Req<'_>,
    req: &Request<'_>,
    ready: Ready<'_>,
    attempts: usize,
    down: &mut Downstream<'_>,
) -> AttemptEnd {
    match ready {
        Ready::Relay(buffered) => {
            // A continuation's error answer never reaches the client's open stream.
            if down.splice.as_ref().is_some_and(|s| s.continuing()) {
                return AttemptEnd::MoveOn(LastFailure::Upstream(buffered));
            }
            down.committed.set(true);
            let after = stream::relay_buffered(
                shard,
                &buffered,
                attempts,
                down.client,
                down.keep_alive,
                down.log,
            )
            .await;
            AttemptEnd::Done(after)
        }
        Ready::Stream(mut s) => {
            // Relayed from its box, not unpacked onto the stack: the watchdog and the
            // admission guards stay where `open` put them (each move out was a copy).
            let config = shard.config();
            let provider = config.provider(s.attempted.target.provider);
            let conn = config.connection(s.attempted.connection);
            down.committed.set(true);
            down.log.upstream(&provider.name, &conn.name, attempts);
            // Mid-stream continuation: the splice follows the stream (in the client's
            // format: a translated answer goes through it after its translation).
            if down.splice.is_none() && config.resilience.stream_recovery.continue_mid_stream {
                down.splice = Splice::new(req.endpoint, s.translation.is_some()).map(Box::new);
            }
            let (up, first, active) = (s.up, s.first.take(), s.active);
            let (after, ended) = match s.translation.take() {
                Some((t, carry)) => {
                    let tr = super::translate::Translated {
                        translation: t,
                        carry,
                        provider,
                        conn,
                        attempts,
                        idle: req.budgets.idle,
                    };
                    super::translate::commit(
                        shard,
                        req.head,
                        up,
                        first,
                        tr,
                        down.client,
                        down.pending,
                        down.keep_alive,
                        &mut s.wd,
                        down.log,
                        active,
                        down.splice.as_deref_mut(),
                    )
                    .await
                }
                None => {
                    stream::commit(
                        shard,
                        req.head,
                        up,
                        first,
                        provider,
                        conn,
                        attempts,
                        down.client,
                        down.pending,
                        down.keep_alive,
                        req.budgets.idle,
                        req.endpoint,
                        &mut s.wd,
                        down.log,
                        active,
                        down.splice.as_deref_mut(),
                    )
                    .await
                }
            };
            if let Some(sp) = down.splice.as_mut().filter(|sp| sp.cut_pending()) {
                sp.cut_on(s.attempted.target, s.attempted.connection);
            }
            let ended = failed_by_event(shard, &s.attempted, ended, s.wd.as_ref());
            // Most attempts end with nothing to report: `end`'s future (the owner call
            // inside it) is then neither built nor copied.
            if s.attempted.is_quiet(&ended) {
                s.attempted.tell_strategy(&ended);
            } else {
                s.attempted.end(ended).await;
            }
            // The admission (slot, permits) is held to the end: `s` drops here.
            AttemptEnd::Done(after)
        }
    }
}

/// One attempt on `(target, connection)` up to the answer it has for the client. The
/// admission wait is raced against `client` hanging up when it is given (a hedged attempt
/// leaves that to its caller).
pub(super) async fn open<'s>(
    shard: &'s Req<'s>,
    req: &Request<'_>,
    target: &'s Target,
    connection: ConnectionId,
    combo: Option<ComboAttempt>,
    walk: &mut Walk,
    mut client: Option<(&mut ClientStream, &mut BytesMut)>,
) -> Opened<'s> {
    use AttemptEnd as E;
    let config = shard.config();
    // A provider of the other format gets the request translated (before anything is
    // admitted: a field its format cannot express rules the candidate out).
    let translation = Translation::between(req.endpoint, config.provider(target.provider));
    let translated = match translation {
        Some(t) => match super::translate::request_body(t, req.body, &target.model) {
            Ok(tr) => Some(tr),
            Err(e) => return Opened::End(E::MoveOn(LastFailure::Gateway(e))),
        },
        None => None,
    };
    // Select: the local views, and a half-open breaker's probe permit from its owner.
    let permits = match select::admit(shard, target, connection, combo.is_some()).await {
        Admit::Yes(p) => p,
        Admit::No(e) => return Opened::End(E::Skipped(e)),
        Admit::Failed(e) => return Opened::End(E::MoveOn(LastFailure::Gateway(e))),
    };
    // Admit: a quota-share combo's attempt holds its connection's qsconn slot (fail open);
    // then a slot in the connection's request queue and its concurrency permits. All are
    // returned when their guards drop. A client that hangs up meanwhile ends the request
    // here: it never reaches the upstream.
    let admission_started = shard.now().mono_ns;
    // Every wait below is pinned where it is made and handed on by reference (a wrapper
    // taking a future by value stores it twice: `deadline::within`), inside a block, so
    // it is dropped — and what it was doing cancelled — as soon as it ends.
    // The waits' results are matched inside the blocks that await them (here and for the
    // upstream's answer and its first bytes below): held in a `let` of the function's own
    // scope, each stayed in this future's state through every later await.
    let (qs_slot, mut queue_slot, gate) = {
        let admitted = {
            let admission = pin!(async {
                let qs_slot = match req.plan.quota_share {
                    Some(combo) => gates::client::quota_share_slot(shard, combo, connection).await,
                    None => None,
                };
                let queue_slot = queue::client::acquire(shard, connection, &target.model).await?;
                let gate = gates::client::acquire(shard, connection, &target.model).await?;
                Ok::<_, GatewayError>((qs_slot, queue_slot, gate))
            });
            let admission = pin!(deadline::within(shard, req.deadline, admission));
            watch(&mut client, admission).await
        };
        match admitted {
            Some(Ok(Ok(admitted))) => {
                let waited = shard.now().mono_ns.saturating_sub(admission_started);
                observe::admitted(shard.families(), shard.config(), target.provider, waited);
                admitted
            }
            Some(Ok(Err(e))) => return Opened::End(E::MoveOn(LastFailure::Gateway(e))),
            Some(Err(e)) => {
                walk.note = Some(FailureNote::of_error(&e));
                return Opened::End(E::Stop(LastFailure::Gateway(e)));
            }
            None => {
                shard.metrics().abandoned(Abandoned::Admission);
                return Opened::End(E::Done(After::Close));
            }
        }
    };
    let mut attempted = Attempted {
        shard,
        target,
        connection,
        combo,
        permits: Some(permits),
        strategy: combo.and(req.plan.combo),
        head_ms: None,
    };
    let provider = config.provider(target.provider);
    let conn = config.connection(connection);
    bump(&shard.metrics().upstream_attempts);
    if walk.attempts > 0 {
        bump(&shard.metrics().upstream_failovers);
    }
    walk.attempts += 1;
    // From here the attempt runs under the hard per-attempt deadline too (B §7.3); until
    // the answer's head reaches the client, under whichever passes first.
    let active = Deadline::after(
        shard,
        Budget::Active {
            ms: config.resilience.stream_watchdog.active_timeout_ms,
        },
    );
    let bound = deadline::earliest(req.deadline, active);
    // Forward, within the execution budget when the connection has a request queue (spec
    // B §1.3: separate from the time spent queued).
    let (body, carry) = match translated {
        Some((body, carry)) => (upstream::Body::Bytes(body), carry),
        // An Anthropic client replaying the unsigned thinking blocks of an answer translated
        // from an OpenAI-format provider: left out for an Anthropic provider, which would
        // refuse their signature (the body is read only when it holds an empty one).
        None if let Some(cleared) = unsigned_thinking_cleared(req, provider, &target.model) => {
            (upstream::Body::Bytes(cleared), Default::default())
        }
        None if target.model == req.plan.peek.model => {
            (upstream::Body::Bytes(req.body.clone()), Default::default())
        }
        None => (
            upstream::Body::Rewritten(peek::Rewrite::new(
                req.body,
                req.plan.peek.model_span.clone(),
                &target.model,
            )),
            Default::default(),
        ),
    };
    let sent_ns = shard.now().mono_ns;
    let execution_budget = queue_slot.as_ref().and_then(|q| q.execution_budget);
    let open_budget = walk.open_budget.take();
    // A client that hangs up while the upstream thinks cancels the upstream request (its
    // connection is dropped with the future).
    let mut up = {
        let opened = {
            let open = move || {
                upstream::open(
                    shard,
                    req.head,
                    provider,
                    conn,
                    translation.map_or(req.endpoint, Translation::upstream_endpoint),
                    &target.model,
                    req.plan.peek.stream,
                    body,
                    &req.budgets,
                    bound,
                )
            };
            // The deadline bounds each phase inside (`upstream::open`): no timer of its own.
            // Without a budget of the attempt's own (a combo's target timeout, a queue's
            // execution budget: the common case) the open is watched as it is: the two
            // wrappers below cost a state-machine step each on every poll of it. The open is
            // made (and pinned) inside each branch: held across both awaits, it would take
            // room of its own in every state of this future instead of sharing it.
            if open_budget.is_none() && execution_budget.is_none() {
                watch(&mut client, pin!(open())).await
            } else {
                let open = pin!(open());
                let open = pin!(async {
                    match open_budget {
                        Some(b) => match crate::timer::timeout(b, open).await {
                            Ok(r) => r,
                            Err(_) => Err(GatewayError::new(
                                ErrorKind::UpstreamTimeout(
                                    crate::error::TimeoutPhase::ResponseHeader,
                                ),
                                format!(
                                    "no response head within the combo's target timeout ({} ms)",
                                    b.as_millis()
                                ),
                            )),
                        },
                        None => open.await,
                    }
                });
                let opened = pin!(async {
                    match execution_budget {
                        Some(b) => match crate::timer::timeout(b, open).await {
                            Ok(r) => r,
                            Err(_) => Err(queue::client::error(
                                QueueError::ExecutionTimeout {
                                    execution_max_wait_ms: u64::try_from(b.as_millis())
                                        .unwrap_or(u64::MAX),
                                },
                                &queue::client::target_name(shard, connection, &target.model),
                            )),
                        },
                        None => open.await,
                    }
                });
                watch(&mut client, opened).await
            }
        };
        // The failure paths below box their ending (`hung_up`, `end_with_error`, `end`: the
        // owner call inside, ~1 KiB each), so that their state takes no room in every
        // request's future; they allocate only when taken.
        let opened = match opened {
            Some(r) => r,
            None => return Opened::End(Box::pin(hung_up(attempted, Abandoned::Response)).await),
        };
        // The attempt's metrics: its answer head's status class and how long the head took,
        // or the `error` class (no head: connect failure, timeout).
        let (status, head_ns) = match &opened {
            Ok(up) => (
                Some(up.head.status()),
                Some(shard.now().mono_ns.saturating_sub(sent_ns)),
            ),
            Err(_) => (None, None),
        };
        observe::attempt(
            shard.families(),
            config,
            target.provider,
            connection,
            &target.model,
            status,
            head_ns,
        );
        attempted.head_ms = head_ns.map(|ns| ns / 1_000_000);
        match opened {
            Ok(up) => up,
            Err(e) => {
                // A failure that moves the request on to another candidate is an operator's
                // business: INFO.
                let retry = e.kind.retry() != Retry::Decided(false);
                if retry {
                    let next = what_next(req, walk, false);
                    tracing::info!(connection = %conn.name, code = e.kind.code(), "upstream attempt failed: {e}; {next}");
                } else {
                    tracing::info!(connection = %conn.name, code = e.kind.code(), "upstream attempt failed: {e}");
                }
                Box::pin(attempted.end_with_error(&e)).await;
                walk.note = Some(FailureNote::of_error(&e));
                // A per-model timeout in a combo (the target timeout, or no response head in
                // time) evicts the session's pin when it points to this connection (B §4).
                if combo.is_some()
                    && matches!(
                        e.kind,
                        ErrorKind::UpstreamTimeout(
                            TimeoutPhase::ResponseHeader | TimeoutPhase::Active
                        )
                    )
                    && let Some(session) = req.plan.session
                {
                    affinity::client::drop_pin(shard, session, target.provider, connection);
                }
                let failure = LastFailure::Gateway(e);
                return Opened::End(if retry {
                    E::MoveOn(failure)
                } else {
                    E::Stop(failure)
                });
            }
        }
    };
    let status = up.head.status();
    if status >= 400 {
        // An error answer: read it whole (bounded), restate, classify, record, and either
        // move on or relay it.
        let read = {
            let read = pin!(stream::buffer_error(
                &mut up,
                provider,
                conn,
                req.budgets.idle
            ));
            let read = pin!(deadline::within(shard, bound, read));
            watch(&mut client, read).await
        };
        let mut buffered = match read {
            Some(r) => match r.and_then(|r| r) {
                Ok(b) => b,
                Err(e) => {
                    Box::pin(attempted.end_with_error(&e)).await;
                    walk.note = Some(FailureNote::of_error(&e));
                    return Opened::End(move_on_or_stop(LastFailure::Gateway(e)));
                }
            },
            None => {
                drop(up);
                return Opened::End(Box::pin(hung_up(attempted, Abandoned::Response)).await);
            }
        };
        up.finish(shard);
        buffered.headers.extend(
            req.notes
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.clone().into_bytes())),
        );
        let verdict = classify_answer(shard, &attempted, &mut buffered);
        walk.note = Some(FailureNote::of_answer(
            &verdict,
            retry_hint_ms(shard, &buffered, &verdict),
            &parse_error_body(&String::from_utf8_lossy(&buffered.body))
                .error
                .message
                .unwrap_or_default(),
        ));
        // Classified on the upstream's own body; the client gets it in its own format.
        if let Some(t) = translation {
            super::translate::reshape_error(&mut buffered, t);
        }
        walk.exhausted
            .note(verdict.decision.rule_scope, target.provider, connection);
        if let Some(g) = &gate
            && let Some(ms) = gate_block_ms(config, connection, verdict.status, &verdict.decision)
        {
            g.block_for(&target.model, ms);
        }
        // An answer saying the request has too many tools: every shard learns the limit
        // for the lockout's duration, and another target is tried.
        let tool_limit = learned_threshold(
            verdict.status,
            &String::from_utf8_lossy(&buffered.body),
            req.plan.peek.tool_count,
        );
        if let Some(tools) = tool_limit {
            let for_ms = config.resilience.model_lockout.base_cooldown_ms;
            tool_limits::client::learn(shard, target.provider, &target.model, tools, for_ms);
        }
        let move_on =
            verdict.decision.should_fallback || verdict.status >= 500 || tool_limit.is_some();
        // A failover after a 429 drops the session's pin to this connection (B §4).
        if move_on
            && verdict.status == 429
            && let Some(session) = req.plan.session
        {
            affinity::client::drop_pin(shard, session, target.provider, connection);
        }
        if move_on {
            let next = what_next(req, walk, false);
            tracing::info!(connection = %conn.name, status, reason = verdict.decision.reason.as_str(), "upstream error; {next}");
        } else {
            tracing::debug!(connection = %conn.name, status, reason = verdict.decision.reason.as_str(), "upstream error relayed");
        }
        let reason = verdict.decision.reason;
        Box::pin(attempted.end(Ended::Failed(Box::new(verdict)))).await;
        if move_on {
            observe::fallback(shard.families(), Some(reason), ErrorKind::Internal);
            return Opened::End(E::MoveOn(LastFailure::Upstream(Box::new(buffered))));
        }
        // A spent budget the emergency fallback may still serve: answered after the walk.
        if emergency_applies(shard, req, target)
            && is_budget_failure(buffered.status, &String::from_utf8_lossy(&buffered.body))
        {
            return Opened::End(E::Stop(LastFailure::Upstream(Box::new(buffered))));
        }
        return Opened::Ready(Ready::Relay(Box::new(buffered)));
    }
    if let Some(q) = queue_slot.as_mut() {
        q.learn_from(status, up.head.fields().into_iter());
    }
    up.extra.extend(req.notes.iter().cloned());
    // The first bytes are read before anything reaches the client, so a failure here can
    // still move on. An event stream under the content-stall watchdog holds its lifecycle
    // frames back until the first model output; a stall meanwhile fails over (B §7.1).
    let mut wd = super::watchdog::Watchdog::arm(shard, up.is_event_stream());
    let hold = super::watchdog::HoldBack::of(shard);
    let first = {
        let first = {
            let first = pin!(super::watchdog::first_bytes(
                shard,
                &mut up,
                req.budgets.idle,
                wd.as_mut(),
                hold,
                bound,
            ));
            watch(&mut client, first).await
        };
        let first = match first {
            Some(r) => r,
            None => {
                drop(up);
                return Opened::End(Box::pin(hung_up(attempted, Abandoned::Response)).await);
            }
        };
        match first {
            Ok(first) => {
                let ns = shard.now().mono_ns.saturating_sub(sent_ns);
                observe::first_byte(shard.families(), shard.config(), target.provider, ns);
                first
            }
            Err(e)
                if e.kind == ErrorKind::StreamContentStall
                    || e.kind == ErrorKind::StreamThroughputTooLow =>
            {
                let next = what_next(req, walk, true);
                tracing::info!(connection = %conn.name, "{e}; {next}");
                Box::pin(attempted.end(stream::broken(&e))).await;
                walk.note = Some(FailureNote::of_error(&e));
                return Opened::End(E::Early(LastFailure::Gateway(e)));
            }
            Err(e) => {
                // The upstream's stream began with an error event: an error answer, as if it
                // had come with its status.
                if let Some(ev) = wd.as_ref().and_then(|w| w.error_event()) {
                    let mut buffered = event_answer(&ev.data, provider, conn);
                    let verdict = classify_answer(shard, &attempted, &mut buffered);
                    let message = parse_error_body(&ev.data).error.message;
                    walk.note = Some(FailureNote::of_answer(
                        &verdict,
                        None,
                        message.as_deref().unwrap_or_default(),
                    ));
                    if let Some(t) = translation {
                        super::translate::reshape_error(&mut buffered, t);
                    }
                    let move_on = verdict.decision.should_fallback || verdict.status >= 500;
                    tracing::info!(connection = %conn.name, status = verdict.status, "the upstream's stream began with an error event");
                    Box::pin(attempted.end(Ended::Failed(Box::new(verdict)))).await;
                    return if move_on {
                        Opened::End(E::MoveOn(LastFailure::Upstream(Box::new(buffered))))
                    } else {
                        Opened::Ready(Ready::Relay(Box::new(buffered)))
                    };
                }
                Box::pin(attempted.end_with_error(&e)).await;
                walk.note = Some(FailureNote::of_error(&e));
                let line = format!("body failed before the first byte: {e}");
                return Opened::End(match move_on_or_stop(LastFailure::Gateway(e)) {
                    E::MoveOn(failure) => {
                        let next = what_next(req, walk, true);
                        tracing::info!(connection = %conn.name, "{line}; {next}");
                        E::Early(failure)
                    }
                    end => {
                        tracing::info!(connection = %conn.name, "{line}");
                        end
                    }
                });
            }
        }
    };
    // Allocated first, then filled. The literal is still assembled on the stack from the
    // fields in this future's state and copied into the box (one ~600 B `memcpy` per
    // answer in session 12's profile).
    Opened::Ready(Ready::Stream(Box::write(
        Box::new_uninit(),
        Streaming {
            attempted,
            translation: translation.map(|t| (t, carry)),
            up,
            first,
            wd,
            active,
            _held: (qs_slot, queue_slot, gate),
        },
    )))
}

/// Runs `wait`, raced against the client hanging up when there is one to watch (a hedged
/// attempt has none: its caller watches the client); `None` when the client went away.
async fn watch<F: std::future::Future>(
    client: &mut Option<(&mut ClientStream, &mut BytesMut)>,
    wait: Pin<&mut F>,
) -> Option<F::Output> {
    match client {
        Some((client, pending)) => unless_client_gone(client, pending, wait).await,
        None => Some(wait.await),
    }
}

/// A failure before the first client byte: the overall request deadline ends the request,
/// anything else moves on to the next candidate.
fn move_on_or_stop(failure: LastFailure) -> AttemptEnd {
    match &failure {
        LastFailure::Gateway(e) if e.kind == ErrorKind::RequestTimeout => AttemptEnd::Stop(failure),
        _ => AttemptEnd::MoveOn(failure),
    }
}

/// How long an error answer asked to wait: its `Retry-After`, else the reset hint its
/// classification found (ms).
fn retry_hint_ms(shard: &Req<'_>, buffered: &Buffered, verdict: &Verdict) -> Option<u64> {
    let now = shard.now();
    buffered
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .and_then(|v| retry_after_header(v, now.wall_ms))
        .or(buffered.retry_after_s.map(|s| s.saturating_mul(1000)))
        .or(verdict.decision.quota_reset_hint_ms)
}

/// The client hung up while the attempt waited on the upstream: the upstream request is
/// already cancelled (its connection dropped); nothing counts against the upstream, every
/// permit and slot goes back as the attempt's guards drop.
async fn hung_up(attempted: Attempted<'_>, phase: Abandoned) -> AttemptEnd {
    attempted.shard.metrics().abandoned(phase);
    attempted.end(Ended::ClientAbort).await;
    AttemptEnd::Done(After::Close)
}

/// An error event the upstream sent in its stream, as the error answer it stands for: the
/// status its type or code names (`classify::status_of_error_event`), the event's data as
/// the body.
fn event_answer(data: &str, provider: &Provider, conn: &Connection) -> Buffered {
    Buffered {
        status: classify::status_of_error_event(data),
        headers: vec![("content-type".to_owned(), b"application/json".to_vec())],
        body: Bytes::from(data.to_owned()),
        provider: provider.name.clone(),
        connection: conn.name.clone(),
        retry_after_s: None,
    }
}

/// A stream that ended with the upstream's own error event (after its first byte) failed
/// as that event says: classified like an error answer with the event's status and text
/// (connection state, breaker, lockouts, `tidegate_upstream_errors_total`), not as a bare
/// stream break. Any other ending is kept.
fn failed_by_event(
    shard: &Req<'_>,
    attempted: &Attempted<'_>,
    ended: Ended,
    wd: Option<&super::watchdog::Watchdog>,
) -> Ended {
    match (ended, wd.and_then(|w| w.error_event())) {
        (Ended::StreamBroken { .. }, Some(ev)) => {
            let config = shard.config();
            let provider = config.provider(attempted.target.provider);
            let conn = config.connection(attempted.connection);
            let mut answer = event_answer(&ev.data, provider, conn);
            Ended::Failed(Box::new(classify_answer(shard, attempted, &mut answer)))
        }
        (ended, _) => ended,
    }
}

/// Restates and classifies an error answer (once, here), and tells the connection's
/// request queue what it learned.
fn classify_answer(shard: &Req<'_>, attempted: &Attempted<'_>, buffered: &mut Buffered) -> Verdict {
    let config = shard.config();
    let target = attempted.target;
    let connection = attempted.connection;
    let provider = config.provider(target.provider);
    let now = shard.now();
    let text = String::from_utf8_lossy(&buffered.body);
    let headers: Vec<(String, String)> = buffered
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    // Restatement reads the decoded error message (an escaped `\u989d…` body says the
    // same as a raw one) and keeps the upstream's own Retry-After; the rule's window only
    // fills a missing one.
    let message = parse_error_body(&text).error.message.unwrap_or_default();
    let upstream_retry_after_ms = buffered
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .and_then(|v| retry_after_header(v, now.wall_ms));
    let restated = apply_status_restatement(
        Some(provider.quirks.kind.name()),
        buffered.status,
        &message,
        &text,
        upstream_retry_after_ms,
    );
    if restated.is_restated() {
        buffered.status = restated.status;
        if upstream_retry_after_ms.is_none() {
            buffered.retry_after_s = restated.client_retry_after_secs();
        }
    }
    let status = buffered.status;
    if queue_of(config, connection, &target.model).is_some() {
        let facts = ResponseFacts::read(status, &OwnedHeaders(&headers), &text, now);
        let fact = queue::protocol::Fact::Learn {
            connection,
            model: target.model.to_string(),
            facts,
        };
        shard.send_fact(shard.owner(&connection), fact.into());
    }
    let failed = Failed {
        provider: target.provider,
        connection,
        model: &target.model,
        status,
        text: &text,
        headers: &headers,
        breaker: Failure::Status(status),
    };
    let verdict = classify::verdict(config, attempted.level(), &failed, now);
    shard.metrics().upstream_error(verdict.error_type);
    verdict
}

/// The answer when every candidate failed or was skipped. `last` comes with the index of
/// the candidate (in `plan.candidates`) it happened on: a gateway-made answer to it (a queue
/// or gate refusal, an upstream that could not be reached or timed out) names that provider
/// and connection in the access line, as a relayed answer names the upstream that sent it.
pub(super) async fn answer_last(
    shard: &Req<'_>,
    plan: &Plan,
    last: Option<(LastFailure, usize)>,
    excluded: &[Excluded],
    attempts: usize,
    down: &mut Downstream<'_>,
) -> After {
    down.committed.set(true);
    let (client, keep_alive, dialect) = (&mut *down.client, down.keep_alive, down.dialect);
    let log = Some(down.log);
    down.log.attempts(attempts);
    match last {
        Some((LastFailure::Upstream(b), _)) => {
            stream::relay_buffered(shard, &b, attempts, client, keep_alive, down.log).await
        }
        Some((LastFailure::Gateway(e), k)) if attempts > 0 || excluded.is_empty() => {
            log_candidate(shard, plan, Some(k), attempts, down.log);
            send_error(shard, client, &e, dialect, keep_alive, log).await
        }
        _ if !excluded.is_empty() => {
            let err = exclusion_error(shard, plan, excluded);
            send_error(shard, client, &err, dialect, keep_alive, log).await
        }
        _ => {
            let err =
                GatewayError::new(ErrorKind::UpstreamProtocol, "every upstream attempt failed");
            send_error(shard, client, &err, dialect, keep_alive, log).await
        }
    }
}

/// Writes into the access line the `attempts` made and, when a candidate was tried, the
/// provider and connection of candidate `k` of `plan` (the last one tried): a
/// gateway-made answer to the request names where it failed last.
pub(super) fn log_candidate(
    shard: &Req<'_>,
    plan: &Plan,
    k: Option<usize>,
    attempts: usize,
    log: &AccessLog,
) {
    match k.and_then(|k| plan.candidates.get(k)) {
        Some((target, connection)) => {
            let config = shard.config();
            let (provider, connection) = (
                config.provider(target.provider),
                config.connection(*connection),
            );
            log.upstream(&provider.name, &connection.name, attempts);
        }
        None => log.attempts(attempts),
    }
}

/// The answer when no candidate could even be tried (spec A §1.8, B §3.4).
fn exclusion_error(shard: &Req<'_>, plan: &Plan, excluded: &[Excluded]) -> GatewayError {
    let config = shard.config();
    let now = shard.now();
    let min_wait = excluded.iter().filter_map(|e| e.retry_after_ms).min();
    let secs = |ms: u64| ms.div_ceil(1000).max(1);
    let all = |r: fn(&Exclusion) -> bool| excluded.iter().all(|e| r(&e.reason));
    let providers: std::collections::BTreeSet<u16> =
        excluded.iter().map(|e| e.provider.0).collect();
    let single_provider = providers.len() == 1;
    if single_provider && all(|r| matches!(r, Exclusion::CircuitOpen(_))) {
        let name = &config.provider(excluded[0].provider).name;
        let mut resp = circuit_open_response(name, min_wait.unwrap_or(1_000));
        // Only connections' breakers are open (not the provider's): the message names them.
        let mut open: Vec<&str> = Vec::new();
        for e in excluded {
            if let Exclusion::CircuitOpen(BreakerKey::Connection(c)) = e.reason {
                let conn = config.connection(c).name.as_str();
                if !open.contains(&conn) {
                    open.push(conn);
                }
            }
        }
        let connection_scoped = excluded
            .iter()
            .all(|e| matches!(e.reason, Exclusion::CircuitOpen(BreakerKey::Connection(_))));
        if connection_scoped {
            resp.message = connections_open_message(name, &open);
        }
        let err = GatewayError::new(ErrorKind::ProviderCircuitOpen, resp.message)
            .with_retry_after(resp.retry_after_s)
            .with_extra("provider", json!(resp.provider))
            .with_extra("retry_after", json!(resp.retry_after_s));
        return if connection_scoped {
            err.with_extra("connections", json!(open))
        } else {
            err
        };
    }
    if single_provider && all(|r| matches!(r, Exclusion::Terminal(_))) {
        let name = &config.provider(excluded[0].provider).name;
        let what = match excluded[0].reason {
            Exclusion::Terminal(t) => t.describe(),
            _ => "unavailable",
        };
        return GatewayError::new(
            ErrorKind::AllConnectionsTerminal,
            format!(
                "[{name}] All {} connection(s) {what} — update or reconnect them",
                excluded.len()
            ),
        );
    }
    if single_provider && all(|r| *r == Exclusion::Unreachable) {
        // Nothing answered, so nothing was rate limited: say what happened.
        let name = &config.provider(excluded[0].provider).name;
        let wait = min_wait.unwrap_or(1_000);
        let retry_s = secs(wait);
        return GatewayError::new(
            ErrorKind::UpstreamUnreachable,
            format!(
                "[{name}] All {} connection(s) for model {} are unreachable after network errors \
                 (DNS, connect or TLS failure); retry after {}",
                excluded.len(),
                plan.peek.model,
                crate::resilience::backoff::human_duration(wait)
            ),
        )
        .with_retry_after(retry_s)
        .with_extra("provider", json!(name))
        .with_extra("model", json!(plan.peek.model))
        .with_extra("retry_after", json!(retry_s));
    }
    if single_provider
        && all(|r| {
            matches!(
                r,
                Exclusion::ConnectionCooldown | Exclusion::ModelLockout | Exclusion::Unreachable
            )
        })
    {
        let wait = min_wait.unwrap_or(1_000);
        let reset_s = secs(wait);
        let reset_at = crate::resilience::breaker::iso8601_utc(now.wall_ms.saturating_add(wait));
        let cooling = excluded.len();
        return GatewayError::new(
            ErrorKind::ModelCooldown,
            format!(
                "All {cooling} credential(s) for model {} are cooling down; reset after {}",
                plan.peek.model,
                crate::resilience::backoff::human_duration(wait)
            ),
        )
        .with_retry_after(reset_s)
        .with_extra("model", json!(plan.peek.model))
        .with_extra("reset_seconds", json!(reset_s))
        .with_extra("retry_after", json!(reset_at))
        .with_extra("credentials_cooling", json!(cooling));
    }
    let summary: Vec<String> = excluded
        .iter()
        .map(|e| {
            let p = &config.provider(e.provider).name;
            let c = &config.connection(e.connection).name;
            match e.retry_after_ms {
                Some(ms) => format!(
                    "{p}/{} on {c}: {} ({}s)",
                    e.model,
                    e.reason.as_str(),
                    secs(ms)
                ),
                None => format!("{p}/{} on {c}: {}", e.model, e.reason.as_str()),
            }
        })
        .collect();
    let list: Vec<serde_json::Value> = excluded
        .iter()
        .map(|e| json!({"provider": config.provider(e.provider).name, "connection": config.connection(e.connection).name, "model": e.model, "reason": e.reason.as_str()}))
        .collect();
    let mut err = GatewayError::new(
        ErrorKind::AllTargetsCoolingDown,
        format!(
            "Service temporarily unavailable: every target is cooling down: {}",
            summary.join(", ")
        ),
    )
    .with_top_level(
        "diagnostics",
        json!({"poolSize": plan.candidates.len(), "attempted": 0, "excluded": list,
               "attemptOrder": [], "terminalReason": "all_targets_cooling_down"}),
    );
    if let Some(ms) = min_wait {
        err = err
            .with_retry_after(secs(ms))
            .with_extra("retry_after", json!(secs(ms)));
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(provider: u16, model: &str) -> Target {
        Target {
            provider: ProviderId(provider),
            model: ModelName::new(model),
        }
    }

    #[test]
    fn the_next_target_is_the_first_candidate_of_another_target() {
        let c = |i| ConnectionId(i);
        let candidates = vec![
            (t(0, "a"), c(0)),
            (t(0, "a"), c(1)),
            (t(0, "b"), c(0)),
            (t(1, "x"), c(2)),
        ];
        let next: Vec<Option<ProviderId>> = (0..5)
            .map(|i| next_target_provider(&candidates, i))
            .collect();
        assert_eq!(
            next,
            vec![
                Some(ProviderId(0)),
                Some(ProviderId(0)),
                Some(ProviderId(1)),
                None,
                None
            ]
        );
    }

    #[test]
    fn rule_scopes_rule_out_a_provider_or_a_connection() {
        let mut e = Exhausted::default();
        e.note(Some(RuleScope::Model), ProviderId(0), ConnectionId(0));
        e.note(None, ProviderId(0), ConnectionId(0));
        assert!(!e.rules_out(ProviderId(0), ConnectionId(0)));
        e.note(Some(RuleScope::Connection), ProviderId(0), ConnectionId(1));
        assert!(e.rules_out(ProviderId(0), ConnectionId(1)));
        assert!(!e.rules_out(ProviderId(0), ConnectionId(2)));
        e.note(Some(RuleScope::Provider), ProviderId(1), ConnectionId(3));
        assert!(e.rules_out(ProviderId(1), ConnectionId(4)));
        assert!(!e.rules_out(ProviderId(2), ConnectionId(4)));
    }
}
