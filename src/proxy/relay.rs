//! Forward → relay: try the candidates in order, and stream the first acceptable answer
//! back. Until the first body byte is written to the client, a connect failure, a
//! timeout, a 5xx or a body failure moves on to the next candidate; after it, the stream
//! is never replayed — an upstream failure ends it with an in-band error event.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use monoio::net::TcpStream;

use super::{After, Plan, peek, respond, send_error};
use crate::config::{Connection, Provider, ProviderFormat};
use crate::error::{ErrorKind, GatewayError, Retry, TimeoutPhase};
use crate::http1::{
    BodyKind, Framing, RequestHead, ResponseHead, write_chunk, write_last_chunk,
    write_response_head,
};
use crate::net::io::write_all;
use crate::net::upstream::{self, BodyReader, Buffered};
use crate::providers::{Endpoint, mock};
use crate::shard::{Shard, metrics::bump};

/// Upstream response headers never relayed (framing and hop-by-hop).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
];

/// Non-final 5xx bodies are read (to keep the connection) up to this size, else dropped.
const DRAIN_LIMIT_BYTES: usize = 64 * 1024;

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
    fn next_buffered(&mut self) -> Result<Buffered, GatewayError> {
        match &mut self.body {
            UpBody::Net(reader) => reader.next_buffered(),
            UpBody::Mock {
                frames,
                gap_ms,
                sent,
                stall,
            } => {
                if *gap_ms > 0 && *sent > 0 {
                    return Ok(Buffered::Empty);
                }
                match frames.next() {
                    Some(f) => {
                        *sent += 1;
                        Ok(Buffered::Piece(f))
                    }
                    None if *stall => Ok(Buffered::Empty),
                    None => Ok(Buffered::End),
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

    /// Discards the rest of a body we will not relay, keeping the connection if cheap.
    async fn discard(mut self, shard: &Shard, idle: Duration) {
        if let UpBody::Net(reader) = &mut self.body {
            reader.drain(idle, DRAIN_LIMIT_BYTES).await;
        }
        self.finish(shard);
    }
}

struct Budgets {
    connect: Duration,
    header: Duration,
    idle: Duration,
}

/// Tries the plan's candidates in order and relays the first acceptable answer.
pub async fn run(
    shard: &Shard,
    head: &RequestHead,
    endpoint: Endpoint,
    body: Bytes,
    plan: Plan,
    client: &mut TcpStream,
    keep_alive: bool,
) -> After {
    let config = shard.config();
    let s = &config.server;
    let budgets = Budgets {
        connect: Duration::from_millis(s.connect_timeout_ms),
        header: Duration::from_millis(s.response_header_timeout_ms),
        idle: Duration::from_millis(s.body_idle_timeout_ms),
    };
    let total = plan.candidates.len();
    let mut last_err = None;
    for (i, (target, cid)) in plan.candidates.iter().enumerate() {
        let is_last = i + 1 == total;
        let provider = config.provider(target.provider);
        let conn = config.connection(*cid);
        bump(&shard.metrics.upstream_attempts);
        if i > 0 {
            bump(&shard.metrics.upstream_failovers);
        }
        let body = if target.model == plan.peek.model {
            body.clone()
        } else {
            peek::rewrite_model(&body, plan.peek.model_span.clone(), &target.model)
        };
        let opened = match provider.format {
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
        };
        let mut up = match opened {
            Ok(up) => up,
            Err(e) => {
                tracing::debug!(connection = %conn.name, "attempt failed: {e}");
                let retry = e.kind.retry() != Retry::Decided(false);
                last_err = Some(e);
                if retry {
                    continue;
                }
                break;
            }
        };
        let status = up.head.status();
        if status >= 500 && !is_last {
            tracing::debug!(connection = %conn.name, status, "upstream 5xx, trying the next connection");
            last_err = Some(GatewayError::new(
                ErrorKind::UpstreamProtocol,
                format!("upstream answered {status}"),
            ));
            up.discard(shard, budgets.idle).await;
            continue;
        }
        // The first piece is read before anything reaches the client, so a failure here
        // can still move on.
        let first = match up.next(budgets.idle).await {
            Ok(first) => first,
            Err(e) if !is_last => {
                tracing::debug!(connection = %conn.name, "body failed before the first byte: {e}");
                last_err = Some(e);
                continue;
            }
            Err(e) => {
                last_err = Some(e);
                break;
            }
        };
        let attempts = i + 1;
        return commit(
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
    }
    let err = last_err.unwrap_or_else(|| {
        GatewayError::new(ErrorKind::UpstreamProtocol, "every upstream attempt failed")
    });
    send_error(shard, client, &err, keep_alive).await
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
) -> After {
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
                let relayed = h
                    .headers()
                    .filter(|(n, _)| !HOP_BY_HOP.iter().any(|x| x.eq_ignore_ascii_case(n)));
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
        return After::Close;
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
                        return After::Close;
                    }
                }
                continue;
            }
            Err(e) => return break_stream(shard, conn, &e, chunked, event_stream, client).await,
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
            return After::Close;
        }
    }
    up.finish(shard);
    if keep_alive {
        After::KeepAlive
    } else {
        After::Close
    }
}

/// Appends every piece already buffered; true when the body ended. A decode failure is
/// left for the next blocking read to report.
fn gather(up: &mut Up, out: &mut BytesMut, chunked: bool) -> bool {
    loop {
        match up.next_buffered() {
            Ok(Buffered::Piece(p)) => put_piece(out, &p, chunked),
            Ok(Buffered::End) => return true,
            Ok(Buffered::Empty) | Err(_) => return false,
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
