//! Forward: one upstream answer, from the network (a pooled keep-alive connection, TLS
//! when https, one retry on a fresh connection when a reused one was closed while idle) or
//! from the in-process mock provider — the same head-and-body shape for the relay.

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::deadline::Deadline;
use super::peek::Rewrite;
use crate::config::{Connection, Provider, ProviderFormat};
use crate::error::{ErrorKind, GatewayError, Retry, TimeoutPhase};
use crate::http1::{BodyKind, RequestHead, ResponseHead};
use crate::net::upstream::{self, BodyReader, Buffered};
use crate::owners::Req;
use crate::providers::Endpoint;
use crate::providers::mock::{self, playback};
use crate::shard::metrics::bump;

/// The time budgets of one attempt.
pub struct Budgets {
    pub connect: Duration,
    pub header: Duration,
    pub idle: Duration,
}

impl Budgets {
    pub fn of(shard: &Req<'_>) -> Self {
        let s = &shard.config().server;
        Self {
            connect: Duration::from_millis(s.connect_timeout_ms),
            header: Duration::from_millis(s.response_header_timeout_ms),
            idle: Duration::from_millis(s.body_idle_timeout_ms),
        }
    }
}

/// The head of an upstream answer.
pub enum UpHead {
    Net(ResponseHead),
    Mock(playback::MockHead),
}

impl UpHead {
    pub fn status(&self) -> u16 {
        match self {
            UpHead::Net(h) => h.status(),
            UpHead::Mock(h) => h.status,
        }
    }

    pub fn body_kind(&self) -> BodyKind {
        match self {
            UpHead::Net(h) => h.body_kind(),
            UpHead::Mock(h) => h.kind,
        }
    }

    pub fn is_event_stream(&self) -> bool {
        match self {
            UpHead::Net(h) => h.header("content-type").is_some_and(|v| {
                v.len() >= 17 && v[..17].eq_ignore_ascii_case(b"text/event-stream")
            }),
            UpHead::Mock(h) => h.content_type == "text/event-stream",
        }
    }

    /// Every header field of the answer as the upstream sent it (the mock's content type
    /// and extra fields for the mock).
    pub fn fields(&self) -> Vec<(&str, &[u8])> {
        match self {
            UpHead::Net(h) => h.headers().collect(),
            UpHead::Mock(h) => {
                let mut hs: Vec<(&str, &[u8])> = vec![("content-type", h.content_type.as_bytes())];
                if h.content_type == "text/event-stream" {
                    hs.push(("cache-control", b"no-cache"));
                }
                hs.extend(h.extra.iter().map(|(n, v)| (*n, v.as_bytes())));
                hs
            }
        }
    }
}

enum UpBody {
    Net(BodyReader),
    Mock(playback::MockBody),
}

/// An upstream answer whose head has arrived: its [`Answer`], on the heap. The answer
/// (head, body reader with its connection and buffer) is some 300 bytes, and it travels
/// by value from `open` through every wrapper around the wait (timeouts, the client
/// watch) into the relay: inline, each of those hands copied all of it (a `memcpy` per
/// move, a dozen per request); boxed, each moves a pointer, for one allocation.
pub struct Up(Box<Answer>);

/// What an [`Up`] holds.
pub struct Answer {
    pub head: UpHead,
    body: UpBody,
    /// Headers the gateway adds to the client's response (warnings, the emergency
    /// fallback's note).
    pub extra: Vec<(&'static str, String)>,
    /// The head's content type is an event stream ([`UpHead::is_event_stream`], looked up
    /// once: the relay asks before its first read and again when it relays).
    event_stream: bool,
}

impl std::ops::Deref for Up {
    type Target = Answer;

    fn deref(&self) -> &Answer {
        &self.0
    }
}

impl std::ops::DerefMut for Up {
    fn deref_mut(&mut self) -> &mut Answer {
        &mut self.0
    }
}

impl Up {
    /// Allocated first, then filled (`Box::new` built the answer on the stack and copied
    /// it into the box).
    #[inline(always)]
    fn new(head: UpHead, body: UpBody) -> Self {
        let event_stream = head.is_event_stream();
        Up(Box::write(
            Box::new_uninit(),
            Answer {
                head,
                body,
                extra: Vec::new(),
                event_stream,
            },
        ))
    }

    /// The answer is an event stream (its head's content type, looked up once).
    pub fn is_event_stream(&self) -> bool {
        self.0.event_stream
    }

    /// The next body piece, waiting at most `idle`; `None` at the end.
    pub async fn next(&mut self, idle: Duration) -> Result<Option<Bytes>, GatewayError> {
        match &mut self.0.body {
            UpBody::Net(reader) => reader.next(idle).await,
            UpBody::Mock(body) => body.next(idle).await,
        }
    }

    /// The next piece available without waiting.
    pub fn next_buffered(&mut self) -> Result<Buffered, GatewayError> {
        match &mut self.0.body {
            UpBody::Net(reader) => reader.next_buffered(),
            UpBody::Mock(body) => Ok(match body.next_ready() {
                playback::Ready::Piece(p) => Buffered::Piece(p),
                playback::Ready::Empty => Buffered::Empty,
                playback::Ready::End => Buffered::End,
            }),
        }
    }

    /// Body bytes already read from the network and not yet handed out, framing included
    /// (0 for the mock): a bound on what [`Up::next_buffered`] gives before it waits.
    pub fn buffered_len(&self) -> usize {
        match &self.0.body {
            UpBody::Net(reader) => reader.buffered_len(),
            UpBody::Mock(_) => 0,
        }
    }

    /// The length of the head as the upstream sent it (0 for the mock): a bound on the
    /// relayed part of the head the client gets.
    pub fn head_len(&self) -> usize {
        match &self.0.head {
            UpHead::Net(h) => h.wire_len(),
            UpHead::Mock(_) => 0,
        }
    }

    /// Hands a cleanly finished connection back to the pool.
    pub fn finish(self, shard: &Req<'_>) {
        if let UpBody::Net(reader) = self.0.body
            && let Some(conn) = reader.into_reusable()
        {
            shard.pool().checkin(conn, shard.now().mono_ns);
        }
    }
}

/// The body of an upstream request.
pub enum Body<'a> {
    /// Sent as it is: the client's own, or a translated one.
    Bytes(Bytes),
    /// The client's body with another model: written once, straight behind the head in
    /// the buffer that is sent (never built on its own and copied there).
    Rewritten(Rewrite<'a>),
}

impl Body<'_> {
    fn len(&self) -> usize {
        match self {
            Body::Bytes(b) => b.len(),
            Body::Rewritten(r) => r.body_len(),
        }
    }
}

/// Sends the request to `provider` on `conn` and waits for the answer's head.
#[allow(clippy::too_many_arguments)]
pub async fn open(
    shard: &Req<'_>,
    head: &RequestHead,
    provider: &Provider,
    conn: &Connection,
    endpoint: Endpoint,
    model: &str,
    stream: bool,
    body: Body<'_>,
    budgets: &Budgets,
    until: Option<Deadline>,
) -> Result<Up, GatewayError> {
    if let Some(d) = until
        && d.at_ns <= shard.now().mono_ns
    {
        return Err(d.error());
    }
    match provider.format {
        ProviderFormat::Mock => {
            let now = shard.now();
            let body = match body {
                Body::Bytes(b) => b,
                Body::Rewritten(r) => r.to_bytes(),
            };
            let plan = mock::plan(
                endpoint,
                model,
                stream,
                &body,
                shard.next_seq(),
                now.wall_ms / 1000,
            );
            let (header, clamped) = phase_budget(shard, budgets.header, until);
            let (head, body) = playback::open(plan, header)
                .await
                .map_err(|e| past_deadline(e, TimeoutPhase::ResponseHeader, clamped))?;
            Ok(Up::new(UpHead::Mock(head), UpBody::Mock(body)))
        }
        ProviderFormat::Openai | ProviderFormat::Anthropic => {
            open_net(shard, head, provider, conn, endpoint, body, budgets, until).await
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn open_net(
    shard: &Req<'_>,
    head: &RequestHead,
    provider: &Provider,
    conn: &Connection,
    endpoint: Endpoint,
    body: Body<'_>,
    budgets: &Budgets,
    until: Option<Deadline>,
) -> Result<Up, GatewayError> {
    let (Some(base), Some(key)) = (provider.base_url.as_ref(), shard.pool_key(provider.id)) else {
        return Err(GatewayError::new(
            ErrorKind::Internal,
            format!("provider {} has no base_url", provider.name),
        ));
    };
    // Head and (small) body in one buffer, sized up front: encoded once, written once,
    // and a retry on a fresh connection re-sends the same bytes without copying them. A
    // rewritten body, of any size, is written there and nowhere else (one copy).
    let len = body.len();
    let room = super::forward::head_capacity(head, provider, base)
        + match body {
            Body::Bytes(_) => upstream::Outgoing::body_room(len),
            Body::Rewritten(_) => len,
        };
    let mut req = BytesMut::with_capacity(room);
    super::forward::encode_head(&mut req, head, provider, base, conn, endpoint, len);
    let mut req = match body {
        Body::Bytes(b) => upstream::Outgoing::new(req, b),
        Body::Rewritten(r) => {
            r.write_to(&mut req);
            upstream::Outgoing::new(req, Bytes::new())
        }
    };
    // A pooled connection may have been closed by the upstream while idle: if it fails
    // before any response byte, try once more on a fresh connection.
    let mut fresh = false;
    loop {
        let now = shard.now();
        let pooled = if fresh {
            None
        } else {
            shard.pool().checkout(&key, now.mono_ns)
        };
        let c = match pooled {
            Some(c) => {
                bump(&shard.metrics().upstream_reuses);
                c
            }
            None => {
                bump(&shard.metrics().upstream_connects);
                let tls = shard.shared().tls.for_provider(provider.id);
                // Boxed: the connect future (DNS, TCP, TLS handshake) is large, and inline it
                // would make every request's future that much bigger (and moved) even when
                // the pool has a connection — the common case.
                let (budget, clamped) = phase_budget(shard, budgets.connect, until);
                Box::pin(upstream::connect(
                    shard.dns(),
                    &key,
                    Some(tls),
                    budget,
                    now.mono_ms(),
                ))
                .await
                .map_err(|e| past_deadline(e, TimeoutPhase::Connect, clamped))?
            }
        };
        let reused = c.reused();
        // The head's deadline counts from the end of the request's write (`exchange` gives
        // the reading then); a head timeout at or past the attempt's deadline is the
        // deadline's.
        let header_at = |sent_ns| phase_deadline(sent_ns, budgets.header, until);
        let result = upstream::exchange(c, &mut req, budgets.header, header_at).await;
        // Read (the clock) only for a failure: an answer costs no reading here.
        let clamped = || until.filter(|d| shard.now().mono_ns >= d.at_ns);
        match result {
            // The deadline passed: no retry on a fresh connection.
            Err(e)
                if e.error.kind == ErrorKind::UpstreamTimeout(TimeoutPhase::ResponseHeader)
                    && clamped().is_some() =>
            {
                return Err(past_deadline(
                    e.error,
                    TimeoutPhase::ResponseHeader,
                    clamped(),
                ));
            }
            Ok(resp) => {
                return Ok(Up::new(UpHead::Net(resp.head), UpBody::Net(resp.body)));
            }
            Err(e)
                if reused && !e.got_response_bytes && e.error.kind.retry() == Retry::IfReused =>
            {
                fresh = true;
            }
            Err(e) => {
                return Err(past_deadline(
                    e.error,
                    TimeoutPhase::ResponseHeader,
                    clamped(),
                ));
            }
        }
    }
}

/// The budget of one phase of opening an answer (the connect; the mock's response head)
/// under the attempt's deadline `until`: the phase's own, or what is left of the deadline
/// when that is shorter — then the deadline is returned too, and the phase's timeout
/// stands for it (`past_deadline`). One timer bounds the phase, for whichever budget runs
/// out first (a timer for the deadline around the phase's own cost a second per request).
fn phase_budget(
    shard: &Req<'_>,
    own: Duration,
    until: Option<Deadline>,
) -> (Duration, Option<Deadline>) {
    phase_budget_at(own, until, || shard.now().mono_ns)
}

/// [`phase_budget`] at the clock reading `now_ns` (read only when there is a deadline).
fn phase_budget_at(
    own: Duration,
    until: Option<Deadline>,
    now_ns: impl FnOnce() -> u64,
) -> (Duration, Option<Deadline>) {
    match until {
        Some(d) => {
            let left = Duration::from_nanos(d.at_ns.saturating_sub(now_ns()));
            if left < own {
                (left, Some(d))
            } else {
                (own, None)
            }
        }
        None => (own, None),
    }
}

/// The deadline of the response-head phase (monotonic ns), as [`phase_budget`] for the
/// other phases: the phase's own budget from `sent_ns` (the reading as the request's write
/// ended), or the attempt's deadline `until` when that passes first. The connection's read
/// sweep keeps it (`net::watch`, no timer).
fn phase_deadline(sent_ns: u64, own: Duration, until: Option<Deadline>) -> u64 {
    let at = sent_ns.saturating_add(u64::try_from(own.as_nanos()).unwrap_or(u64::MAX));
    match until {
        Some(d) if d.at_ns < at => d.at_ns,
        _ => at,
    }
}

/// A phase's timeout when its budget was the deadline's (`phase_budget`): the deadline's
/// own error; any other error as it is.
fn past_deadline(e: GatewayError, phase: TimeoutPhase, clamped: Option<Deadline>) -> GatewayError {
    match clamped {
        Some(d) if e.kind == ErrorKind::UpstreamTimeout(phase) => d.error(),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::deadline::Budget;
    use proptest::prelude::*;

    proptest! {
        /// The response head's deadline is `now` plus the budget `phase_budget` gives the
        /// phase (the attempt's deadline when that comes first).
        #[test]
        fn the_head_deadline_is_now_plus_the_phase_budget(
            now in 0u64..1 << 50,
            own_ms in 1u64..86_400_000,
            until in proptest::option::of((0u64..1 << 51, any::<bool>())),
        ) {
            let until = until.map(|(at_ns, request)| Deadline {
                at_ns,
                budget: if request { Budget::Request { ms: 1 } } else { Budget::Active { ms: 1 } },
            });
            let own = Duration::from_millis(own_ms);
            // A deadline already passed is answered before the phase starts (`open`); the
            // two differ there (`phase_budget` saturates to 0).
            prop_assume!(until.is_none_or(|d| d.at_ns > now));
            let (budget, clamped) = phase_budget_at(own, until, || now);
            let at = phase_deadline(now, own, until);
            prop_assert_eq!(u128::from(at), u128::from(now) + budget.as_nanos());
            // The deadline is returned (its error stands for the phase's) exactly when it
            // cut the phase's own budget.
            prop_assert_eq!(clamped, until.filter(|_| budget < own));
        }
    }
}
