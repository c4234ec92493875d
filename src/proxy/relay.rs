//! Forward → relay: try the candidates in order, and stream the first acceptable answer
//! back. Until the first body byte is written to the client, a connect failure, a
//! timeout, a 5xx or a body failure moves on to the next candidate; after it, the stream
//! is never replayed — an upstream failure ends it with an in-band error event.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use monoio::net::TcpStream;

use serde_json::json;

use super::record;
use super::select::{self, Admit, Excluded, Exclusion};
use super::{After, Plan, peek, respond, send_error};
use crate::config::{Connection, Provider, ProviderFormat};
use crate::error::{ErrorKind, GatewayError, Retry, TimeoutPhase};
use crate::flow::admission::gate_block_ms;
use crate::flow::queue::QueueError;
use crate::http1::{
    BodyKind, Framing, RequestHead, ResponseHead, is_hop_by_hop, write_chunk, write_last_chunk,
    write_response_head,
};
use crate::net::downstream::unless_client_gone;
use crate::net::io::write_all;
use crate::net::upstream::{self, BodyReader, Buffered as InBuffer};
use crate::providers::{Endpoint, mock};
use crate::resilience::breaker::circuit_open_response;
use crate::resilience::restate::apply_status_restatement;
use crate::runtime::msg::{AttemptResult, Outcome};
use crate::shard::owned;
use crate::shard::{Shard, metrics::bump};

/// Pieces of a length-delimited body at least this large are written without copying.
const DIRECT_WRITE_BYTES: usize = 16 * 1024;

/// The head of an upstream answer, from the network or from the in-process mock.
enum UpHead {
    Net(ResponseHead),
    Mock {
        status: u16,
        content_type: &'static str,
        extra: Vec<(&'static str, String)>,
        kind: BodyKind,
    },
}

impl UpHead {
    fn status(&self) -> u16 {
        match self {
            UpHead::Net(h) => h.status(),
            UpHead::Mock { status, .. } => *status,
        }
    }

    fn body_kind(&self) -> BodyKind {
        match self {
            UpHead::Net(h) => h.body_kind(),
            UpHead::Mock { kind, .. } => *kind,
        }
    }

    fn is_event_stream(&self) -> bool {
        match self {
            UpHead::Net(h) => h.header("content-type").is_some_and(|v| {
                v.len() >= 17 && v[..17].eq_ignore_ascii_case(b"text/event-stream")
            }),
            UpHead::Mock { content_type, .. } => *content_type == "text/event-stream",
        }
    }
}

/// The body of an upstream answer.
enum UpBody {
    Net(BodyReader),
    Mock {
        frames: std::vec::IntoIter<Bytes>,
        gap_ms: u64,
        sent: usize,
        stall: bool,
    },
}

struct Up {
    head: UpHead,
    body: UpBody,
}

impl Up {
    async fn next(&mut self, idle: Duration) -> Result<Option<Bytes>, GatewayError> {
        match &mut self.body {
            UpBody::Net(reader) => reader.next(idle).await,
            UpBody::Mock {
                frames,
                gap_ms,
                sent,
                stall,
            } => {
                if let Some(f) = frames.next() {
                    if *sent > 0 && *gap_ms > 0 {
                        monoio::time::sleep(Duration::from_millis(*gap_ms)).await;
                    }
                    *sent += 1;
                    return Ok(Some(f));
                }
                if *stall {
                    monoio::time::sleep(idle).await;
                    return Err(GatewayError::new(
                        ErrorKind::UpstreamTimeout(TimeoutPhase::BodyIdle),
                        format!("upstream body idle for {} ms", idle.as_millis()),
                    ));
                }
                Ok(None)
            }
        }
    }

    /// The next piece available without waiting.
    fn next_buffered(&mut self) -> Result<InBuffer, GatewayError> {
        match &mut self.body {
            UpBody::Net(reader) => reader.next_buffered(),
            UpBody::Mock {
                frames,
                gap_ms,
                sent,
                stall,
            } => {
                if *gap_ms > 0 && *sent > 0 {
                    return Ok(InBuffer::Empty);
                }
                match frames.next() {
                    Some(f) => {
                        *sent += 1;
                        Ok(InBuffer::Piece(f))
                    }
                    None if *stall => Ok(InBuffer::Empty),
                    None => Ok(InBuffer::End),
                }
            }
        }
    }

    /// Hands a cleanly finished connection back to the pool.
    fn finish(self, shard: &Shard) {
        if let UpBody::Net(reader) = self.body
            && let Some(conn) = reader.into_reusable()
        {
            shard.pool.checkin(conn, shard.now().mono_ns);
        }
    }
}

struct Budgets {
    connect: Duration,
    header: Duration,
    idle: Duration,
}

/// Upstream response fields never relayed: hop-by-hop fields (`http1::is_hop_by_hop`) and
/// `content-length`, which the gateway writes from its own framing.
fn relayed_never(name: &str) -> bool {
    is_hop_by_hop(name) || name.eq_ignore_ascii_case("content-length")
}

/// An upstream error answer read in full, kept to relay if nothing better comes.
struct Buffered {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Bytes,
    provider: String,
    connection: String,
    /// `Retry-After` told to the client when the status was restated.
    retry_after_s: Option<u64>,
}

/// The last failure seen, answered when no candidate succeeds.
enum LastFailure {
    Gateway(GatewayError),
    Upstream(Box<Buffered>),
}

/// Longest upstream error body read for classification and relaying.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// What an attempt that failed before its head tells the owners.
fn result_of(err: &GatewayError) -> AttemptResult {
    match err.kind {
        ErrorKind::UpstreamTimeout(_) => AttemptResult::Timeout,
        ErrorKind::UpstreamConnect => AttemptResult::ConnectFailed,
        ErrorKind::UpstreamProtocol => AttemptResult::Upstream {
            status: 502,
            text: err.message.to_string(),
            headers: Vec::new(),
        },
        _ => AttemptResult::ClientAbort,
    }
}

/// The client side of a request: its connection, the connection's read buffer (bytes the
/// client pipelines while the request waits land there), and whether keep-alive holds.
pub struct Downstream<'c> {
    pub client: &'c mut TcpStream,
    pub pending: &'c mut BytesMut,
    pub keep_alive: bool,
}

/// Tries the plan's candidates in order and relays the first acceptable answer.
pub async fn run(
    shard: &Shard,
    head: &RequestHead,
    endpoint: Endpoint,
    body: Bytes,
    plan: Plan,
    downstream: Downstream<'_>,
) -> After {
    let Downstream {
        client,
        pending,
        keep_alive,
    } = downstream;
    let config = shard.config();
    let s = &config.server;
    let budgets = Budgets {
        connect: Duration::from_millis(s.connect_timeout_ms),
        header: Duration::from_millis(s.response_header_timeout_ms),
        idle: Duration::from_millis(s.body_idle_timeout_ms),
    };
    let mut plan = plan;
    // A quota-share combo: the home orders the candidates and counts the pick in flight
    // until this request ends (the ticket's drop).
    let _in_flight = match plan.quota_share {
        Some(combo) => super::quota_share::order(shard, combo, &mut plan.candidates).await,
        None => None,
    };
    let mut last: Option<LastFailure> = None;
    let mut excluded: Vec<Excluded> = Vec::new();
    let mut attempts = 0usize;
    for (target, cid) in &plan.candidates {
        let permit = match select::admit(shard, target, *cid).await {
            Admit::Yes(p) => p,
            Admit::No(e) => {
                excluded.push(e);
                continue;
            }
            Admit::Failed(e) => {
                last = Some(LastFailure::Gateway(e));
                continue;
            }
        };
        // Admission: a quota-share combo's attempt holds its connection's qsconn slot (fail
        // open); then a slot in the connection's request queue and its concurrency permits.
        // All are returned when their guards drop, on every path below. A client that hangs
        // up meanwhile ends the request here: it never reaches the upstream.
        let admission = async {
            let qs_slot = match plan.quota_share {
                Some(_) => super::gate::quota_share_slot(shard, *cid).await,
                None => None,
            };
            let queue_slot = super::queue::acquire(shard, *cid, &target.model).await?;
            let gate = super::gate::acquire(shard, *cid, &target.model).await?;
            Ok::<_, GatewayError>((qs_slot, queue_slot, gate))
        };
        let (_qs_slot, mut queue_slot, gate) =
            match unless_client_gone(client, pending, admission).await {
                Some(Ok(admitted)) => admitted,
                Some(Err(e)) => {
                    select::release(shard, target.provider, *cid, &permit);
                    last = Some(LastFailure::Gateway(e));
                    continue;
                }
                None => {
                    select::release(shard, target.provider, *cid, &permit);
                    bump(&shard.metrics.abandoned_while_waiting);
                    return After::Close;
                }
            };
        let execution_budget = queue_slot.as_ref().and_then(|q| q.execution_budget);
        let provider = config.provider(target.provider);
        let conn = config.connection(*cid);
        bump(&shard.metrics.upstream_attempts);
        if attempts > 0 {
            bump(&shard.metrics.upstream_failovers);
        }
        attempts += 1;
        let body = if target.model == plan.peek.model {
            body.clone()
        } else {
            peek::rewrite_model(&body, plan.peek.model_span.clone(), &target.model)
        };
        let open = async {
            match provider.format {
                ProviderFormat::Mock => {
                    open_mock(
                        shard,
                        endpoint,
                        &target.model,
                        plan.peek.stream,
                        &body,
                        &budgets,
                    )
                    .await
                }
                ProviderFormat::Openai | ProviderFormat::Anthropic => {
                    open_net(shard, head, provider, conn, endpoint, body, &budgets).await
                }
            }
        };
        // With a request queue, the upstream call is bounded by the execution budget,
        // separately from the time spent queued (spec B §1.3).
        let opened = match execution_budget {
            Some(b) => match monoio::time::timeout(b, open).await {
                Ok(r) => r,
                Err(_) => Err(super::queue::error(
                    QueueError::ExecutionTimeout {
                        execution_max_wait_ms: u64::try_from(b.as_millis()).unwrap_or(u64::MAX),
                    },
                    &super::queue::target_name(shard, *cid, &target.model),
                )),
            },
            None => open.await,
        };
        let mut up = match opened {
            Ok(up) => up,
            Err(e) => {
                tracing::debug!(connection = %conn.name, "attempt failed: {e}");
                record::attempt(shard, target, *cid, &permit, result_of(&e)).await;
                let retry = e.kind.retry() != Retry::Decided(false);
                last = Some(LastFailure::Gateway(e));
                if retry {
                    continue;
                }
                break;
            }
        };
        let status = up.head.status();
        if status >= 400 {
            // An error answer: read it whole (bounded), restate, classify, record, and
            // either move on or keep it to relay.
            let buffered = match buffer_error(shard, &mut up, provider, conn, budgets.idle).await {
                Ok(b) => b,
                Err(e) => {
                    record::attempt(shard, target, *cid, &permit, result_of(&e)).await;
                    last = Some(LastFailure::Gateway(e));
                    continue;
                }
            };
            up.finish(shard);
            let text = String::from_utf8_lossy(&buffered.body).into_owned();
            let headers: Vec<(String, String)> = buffered
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            let restated = apply_status_restatement(Some(&provider.name), status, "", &text, None);
            let mut buffered = buffered;
            if restated.is_restated() {
                buffered.status = restated.status;
                buffered.retry_after_s = restated.client_retry_after_secs();
            }
            let decision = {
                let outcome = Outcome {
                    provider: target.provider,
                    connection: *cid,
                    model: target.model.clone(),
                    result: AttemptResult::Success,
                    probe: None,
                };
                let level = shard.views.borrow().connections.get(*cid).backoff_level;
                owned::classify(
                    config,
                    level,
                    &outcome,
                    buffered.status,
                    &text,
                    &headers,
                    provider.auth,
                    shard.now(),
                )
            };
            if let Some(g) = &gate
                && let Some(ms) = gate_block_ms(config, *cid, buffered.status, &decision)
            {
                g.block_for(&target.model, ms);
            }
            record::attempt(
                shard,
                target,
                *cid,
                &permit,
                AttemptResult::Upstream {
                    status: buffered.status,
                    text,
                    headers,
                },
            )
            .await;
            let move_on = decision.should_fallback || buffered.status >= 500;
            tracing::debug!(connection = %conn.name, status, reason = decision.reason.as_str(), move_on, "upstream error");
            if move_on {
                last = Some(LastFailure::Upstream(Box::new(buffered)));
                continue;
            }
            return relay_buffered(shard, &buffered, attempts, client, keep_alive).await;
        }
        if let Some(q) = queue_slot.as_mut() {
            match &up.head {
                UpHead::Net(h) => q.learn_from(status, h.headers()),
                UpHead::Mock { extra, .. } => {
                    q.learn_from(status, extra.iter().map(|(n, v)| (*n, v.as_bytes())));
                }
            }
        }
        // The first piece is read before anything reaches the client, so a failure here
        // can still move on.
        let first = match up.next(budgets.idle).await {
            Ok(first) => first,
            Err(e) => {
                tracing::debug!(connection = %conn.name, "body failed before the first byte: {e}");
                record::attempt(shard, target, *cid, &permit, result_of(&e)).await;
                last = Some(LastFailure::Gateway(e));
                continue;
            }
        };
        let (after, result) = commit(
            shard,
            head,
            up,
            first,
            provider,
            conn,
            attempts,
            client,
            keep_alive,
            budgets.idle,
        )
        .await;
        record::attempt(shard, target, *cid, &permit, result).await;
        return after;
    }
    match last {
        Some(LastFailure::Upstream(b)) => {
            relay_buffered(shard, &b, attempts, client, keep_alive).await
        }
        Some(LastFailure::Gateway(e)) if attempts > 0 || excluded.is_empty() => {
            send_error(shard, client, &e, keep_alive).await
        }
        _ if !excluded.is_empty() => {
            let err = exclusion_error(shard, &plan, &excluded);
            send_error(shard, client, &err, keep_alive).await
        }
        _ => {
            let err =
                GatewayError::new(ErrorKind::UpstreamProtocol, "every upstream attempt failed");
            send_error(shard, client, &err, keep_alive).await
        }
    }
}

/// Reads an upstream error answer whole (up to [`MAX_ERROR_BODY_BYTES`]).
async fn buffer_error(
    shard: &Shard,
    up: &mut Up,
    provider: &Provider,
    conn: &Connection,
    idle: Duration,
) -> Result<Buffered, GatewayError> {
    let _ = shard;
    let status = up.head.status();
    let headers: Vec<(String, Vec<u8>)> = match &up.head {
        UpHead::Net(h) => h
            .headers()
            .filter(|(n, _)| !relayed_never(n))
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect(),
        UpHead::Mock {
            content_type,
            extra,
            ..
        } => {
            let mut hs = vec![("content-type".to_owned(), content_type.as_bytes().to_vec())];
            hs.extend(
                extra
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec())),
            );
            hs
        }
    };
    let mut body = BytesMut::new();
    while let Some(piece) = up.next(idle).await? {
        let room = MAX_ERROR_BODY_BYTES.saturating_sub(body.len());
        body.extend_from_slice(&piece[..piece.len().min(room)]);
        if piece.len() > room {
            break;
        }
    }
    Ok(Buffered {
        status,
        headers,
        body: body.freeze(),
        provider: provider.name.clone(),
        connection: conn.name.clone(),
        retry_after_s: None,
    })
}

/// Relays a buffered upstream error answer.
async fn relay_buffered(
    shard: &Shard,
    b: &Buffered,
    attempts: usize,
    client: &mut TcpStream,
    keep_alive: bool,
) -> After {
    let keep_alive = super::keep_alive_now(shard, keep_alive);
    let attempts_s = attempts.to_string();
    let retry_after = b.retry_after_s.map(|s| s.to_string());
    let mut headers: Vec<(&str, &[u8])> = b
        .headers
        .iter()
        .filter(|(n, _)| !(retry_after.is_some() && n.eq_ignore_ascii_case("retry-after")))
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    if let Some(ra) = &retry_after {
        headers.push(("retry-after", ra.as_bytes()));
    }
    headers.push((
        "x-omniroute-selected-connection-id",
        b.connection.as_bytes(),
    ));
    headers.push(("x-tidegate-provider", b.provider.as_bytes()));
    headers.push(("x-tidegate-attempts", attempts_s.as_bytes()));
    let mut out = BytesMut::with_capacity(512 + b.body.len());
    write_response_head(
        &mut out,
        b.status,
        headers,
        Framing::Length(b.body.len() as u64),
        keep_alive,
    );
    out.extend_from_slice(&b.body);
    shard.metrics.response(b.status);
    match write_all(client, out).await {
        Ok(_) if keep_alive => After::KeepAlive,
        _ => After::Close,
    }
}

/// The answer when no candidate could even be tried (spec A §1.8, B §3.4).
fn exclusion_error(shard: &Shard, plan: &Plan, excluded: &[Excluded]) -> GatewayError {
    let config = shard.config();
    let now = shard.now();
    let min_wait = excluded.iter().filter_map(|e| e.retry_after_ms).min();
    let secs = |ms: u64| ms.div_ceil(1000).max(1);
    let all = |r: fn(&Exclusion) -> bool| excluded.iter().all(|e| r(&e.reason));
    let providers: std::collections::BTreeSet<u16> =
        excluded.iter().map(|e| e.provider.0).collect();
    let single_provider = providers.len() == 1;
    if single_provider && all(|r| *r == Exclusion::CircuitOpen) {
        let name = &config.provider(excluded[0].provider).name;
        let resp = circuit_open_response(name, min_wait.unwrap_or(1_000));
        return GatewayError::new(ErrorKind::ProviderCircuitOpen, resp.message)
            .with_retry_after(resp.retry_after_s)
            .with_extra("provider", json!(resp.provider))
            .with_extra("retry_after", json!(resp.retry_after_s));
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
    if single_provider
        && all(|r| matches!(r, Exclusion::ConnectionCooldown | Exclusion::ModelLockout))
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
            match e.retry_after_ms {
                Some(ms) => format!("{p}/{}: {} ({}s)", e.model, e.reason.as_str(), secs(ms)),
                None => format!("{p}/{}: {}", e.model, e.reason.as_str()),
            }
        })
        .collect();
    let list: Vec<serde_json::Value> = excluded
        .iter()
        .map(|e| json!({"provider": config.provider(e.provider).name, "model": e.model, "reason": e.reason.as_str()}))
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

async fn open_mock(
    shard: &Shard,
    endpoint: Endpoint,
    model: &str,
    stream: bool,
    body: &[u8],
    budgets: &Budgets,
) -> Result<Up, GatewayError> {
    let now = shard.now();
    let plan = mock::plan(
        endpoint,
        model,
        stream,
        body,
        shard.next_seq(),
        now.wall_ms / 1000,
    );
    if plan.stall_before_head {
        monoio::time::sleep(budgets.header).await;
        return Err(GatewayError::new(
            ErrorKind::UpstreamTimeout(TimeoutPhase::ResponseHeader),
            format!("no response head within {} ms", budgets.header.as_millis()),
        ));
    }
    if plan.head_delay_ms > 0 {
        let wait = Duration::from_millis(plan.head_delay_ms);
        if wait >= budgets.header {
            monoio::time::sleep(budgets.header).await;
            return Err(GatewayError::new(
                ErrorKind::UpstreamTimeout(TimeoutPhase::ResponseHeader),
                format!("no response head within {} ms", budgets.header.as_millis()),
            ));
        }
        monoio::time::sleep(wait).await;
    }
    let kind = if plan.streamed {
        BodyKind::Chunked
    } else {
        BodyKind::Length(plan.frames.iter().map(|f| f.len() as u64).sum())
    };
    Ok(Up {
        head: UpHead::Mock {
            status: plan.status,
            content_type: plan.content_type,
            extra: plan.extra_headers,
            kind,
        },
        body: UpBody::Mock {
            frames: plan.frames.into_iter(),
            gap_ms: plan.frame_delay_ms,
            sent: 0,
            stall: plan.stall_after_frames,
        },
    })
}

async fn open_net(
    shard: &Shard,
    head: &RequestHead,
    provider: &Provider,
    conn: &Connection,
    endpoint: Endpoint,
    body: Bytes,
    budgets: &Budgets,
) -> Result<Up, GatewayError> {
    let (Some(base), Some(key)) = (provider.base_url.as_ref(), shard.pool_key(provider.id)) else {
        return Err(GatewayError::new(
            ErrorKind::Internal,
            format!("provider {} has no base_url", provider.name),
        ));
    };
    let mut req = BytesMut::with_capacity(1024);
    super::forward::encode_head(&mut req, head, provider, base, conn, endpoint, body.len());
    // A pooled connection may have been closed by the upstream while idle: if it fails
    // before any response byte, try once more on a fresh connection.
    let mut fresh = false;
    loop {
        let now = shard.now();
        let pooled = if fresh {
            None
        } else {
            shard.pool.checkout(&key, now.mono_ns)
        };
        let c = match pooled {
            Some(c) => {
                bump(&shard.metrics.upstream_reuses);
                c
            }
            None => {
                bump(&shard.metrics.upstream_connects);
                let tls = shard.shared.tls.for_provider(provider.id);
                upstream::connect(&shard.dns, &key, Some(tls), budgets.connect, now.mono_ms())
                    .await?
            }
        };
        let reused = c.reused();
        match upstream::exchange(c, req.clone(), body.clone(), budgets.header).await {
            Ok(resp) => {
                return Ok(Up {
                    head: UpHead::Net(resp.head),
                    body: UpBody::Net(resp.body),
                });
            }
            Err(e)
                if reused && !e.got_response_bytes && e.error.kind.retry() == Retry::IfReused =>
            {
                fresh = true;
            }
            Err(e) => return Err(e.error),
        }
    }
}

/// Writes the response head and the first piece, then streams the rest.
#[allow(clippy::too_many_arguments)]
async fn commit(
    shard: &Shard,
    client_head: &RequestHead,
    mut up: Up,
    first: Option<Bytes>,
    provider: &Provider,
    conn: &Connection,
    attempts: usize,
    client: &mut TcpStream,
    keep_alive: bool,
    idle: Duration,
) -> (After, AttemptResult) {
    let status = up.head.status();
    let keep_alive = super::keep_alive_now(shard, keep_alive);
    let http11 = client_head.minor_version() == 1;
    let (framing, keep_alive) = match up.head.body_kind() {
        BodyKind::Length(n) => (Framing::Length(n), keep_alive),
        BodyKind::Empty if status == 204 || status == 304 => (Framing::NoBody, keep_alive),
        BodyKind::Empty => (Framing::Length(0), keep_alive),
        BodyKind::Chunked | BodyKind::CloseDelimited if http11 => (Framing::Chunked, keep_alive),
        BodyKind::Chunked | BodyKind::CloseDelimited => (Framing::Close, false),
    };
    let chunked = framing == Framing::Chunked;
    let event_stream = up.head.is_event_stream();
    let attempts_s = attempts.to_string();
    let mut out = BytesMut::with_capacity(1024 + first.as_ref().map_or(0, Bytes::len));
    {
        let ours: [(&str, &[u8]); 3] = [
            ("x-omniroute-selected-connection-id", conn.name.as_bytes()),
            ("x-tidegate-provider", provider.name.as_bytes()),
            ("x-tidegate-attempts", attempts_s.as_bytes()),
        ];
        match &up.head {
            UpHead::Net(h) => {
                let relayed = h.headers().filter(|(n, _)| !relayed_never(n));
                write_response_head(&mut out, status, relayed.chain(ours), framing, keep_alive);
            }
            UpHead::Mock {
                content_type,
                extra,
                ..
            } => {
                let mut hs: Vec<(&str, &[u8])> = vec![("content-type", content_type.as_bytes())];
                if *content_type == "text/event-stream" {
                    hs.push(("cache-control", b"no-cache"));
                }
                hs.extend(extra.iter().map(|(n, v)| (*n, v.as_bytes())));
                write_response_head(
                    &mut out,
                    status,
                    hs.into_iter().chain(ours),
                    framing,
                    keep_alive,
                );
            }
        }
    }
    shard.metrics.response(status);
    // Everything that is already here goes out with the head, in one write.
    let mut done = match first {
        None => true,
        Some(piece) => {
            put_piece(&mut out, &piece, chunked);
            gather(&mut up, &mut out, chunked)
        }
    };
    if done && chunked {
        write_last_chunk(&mut out);
    }
    if write_all(client, out).await.is_err() {
        let result = if done {
            AttemptResult::Success
        } else {
            AttemptResult::ClientAbort
        };
        return (After::Close, result);
    }
    while !done {
        let piece = match up.next(idle).await {
            Ok(Some(piece)) => piece,
            Ok(None) => {
                done = true;
                if chunked {
                    let mut out = BytesMut::with_capacity(8);
                    write_last_chunk(&mut out);
                    if write_all(client, out).await.is_err() {
                        return (After::Close, AttemptResult::Success);
                    }
                }
                continue;
            }
            Err(e) => {
                let after = break_stream(shard, conn, &e, chunked, event_stream, client).await;
                return (after, AttemptResult::StreamStall);
            }
        };
        let res = if !chunked && piece.len() >= DIRECT_WRITE_BYTES {
            write_all(client, piece).await.map(|_| ())
        } else {
            let mut out = BytesMut::with_capacity(piece.len() + 64);
            put_piece(&mut out, &piece, chunked);
            done = gather(&mut up, &mut out, chunked);
            if done && chunked {
                write_last_chunk(&mut out);
            }
            write_all(client, out).await.map(|_| ())
        };
        if res.is_err() {
            // The client went away; the upstream connection is dropped with `up`.
            return (After::Close, AttemptResult::ClientAbort);
        }
    }
    up.finish(shard);
    let after = if keep_alive {
        After::KeepAlive
    } else {
        After::Close
    };
    (after, AttemptResult::Success)
}

/// Appends every piece already buffered; true when the body ended. A decode failure is
/// left for the next blocking read to report.
fn gather(up: &mut Up, out: &mut BytesMut, chunked: bool) -> bool {
    loop {
        match up.next_buffered() {
            Ok(InBuffer::Piece(p)) => put_piece(out, &p, chunked),
            Ok(InBuffer::End) => return true,
            Ok(InBuffer::Empty) | Err(_) => return false,
        }
    }
}

/// Ends a stream whose upstream failed after the first byte: an in-band error event for
/// event streams, a clean end of the chunked body, and the connection closed.
async fn break_stream(
    shard: &Shard,
    conn: &Connection,
    err: &GatewayError,
    chunked: bool,
    event_stream: bool,
    client: &mut TcpStream,
) -> After {
    bump(&shard.metrics.streams_broken);
    tracing::warn!(connection = %conn.name, "stream broken after the first byte: {err}");
    if chunked {
        let mut out = BytesMut::with_capacity(256);
        if event_stream {
            put_piece(&mut out, respond::stream_error_event(err).as_bytes(), true);
        }
        write_last_chunk(&mut out);
        let _ = write_all(client, out).await;
    }
    After::Close
}

fn put_piece(out: &mut BytesMut, piece: &[u8], chunked: bool) {
    if chunked {
        write_chunk(out, piece);
    } else {
        out.extend_from_slice(piece);
    }
}
