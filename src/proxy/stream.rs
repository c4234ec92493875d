//! Relay: an upstream answer to the client. A success streams back piece by piece (head
//! and whatever is already here in one write; long length-delimited pieces without a
//! copy); after its first byte a stream is never replayed — an upstream failure or a
//! content stall ([`super::watchdog`]) ends it with an in-band error event in the
//! endpoint's own shape and a close without the chunked terminator, so the body the client
//! holds is visibly incomplete. An error answer is read whole (bounded) first, so the
//! attempt loop can still move on, and relayed as it came when nothing better does.

use std::pin::pin;
use std::time::Duration;

use crate::net::io::ClientStream;
use bytes::{Bytes, BytesMut};

use super::access::{AccessLog, REQUEST_ID_HEADER};
use super::continuation::Splice;
use super::deadline::Deadline;
use super::upstream::{Up, UpHead};
use super::watchdog::{self, Watchdog};
use super::{After, respond};
use crate::config::{Connection, Provider};
use crate::error::{ErrorKind, GatewayError};
use crate::http1::{
    BodyKind, Framing, RequestHead, is_hop_by_hop_name, write_chunk, write_last_chunk,
    write_response_head, write_response_head_bytes,
};
use crate::net::downstream::unless_client_gone;
use crate::net::io::write_all;
use crate::net::upstream::Buffered as InBuffer;
use crate::owners::Req;
use crate::owners::health::protocol::{Ended, LastError};
use crate::providers::Endpoint;
use crate::resilience::connection::ProviderErrorType;
use crate::shard::metrics::{Abandoned, add_one_writer, bump};
use crate::sse::usage::{AnswerTail, Usage};

/// Pieces of a length-delimited body at least this large are written without copying.
const DIRECT_WRITE_BYTES: usize = 16 * 1024;

/// Upstream response fields never relayed: hop-by-hop fields (`http1::is_hop_by_hop_name`),
/// `content-length`, which the gateway writes from its own framing, and `x-request-id`,
/// which carries the gateway's own request id.
pub(super) fn relayed_never(name: &str) -> bool {
    relayed_never_name(name.as_bytes())
}

/// [`relayed_never`] for a name as bytes.
fn relayed_never_name(name: &[u8]) -> bool {
    is_hop_by_hop_name(name)
        || name.eq_ignore_ascii_case(b"content-length")
        || name.eq_ignore_ascii_case(REQUEST_ID_HEADER.as_bytes())
}

/// An upstream error answer read in full, kept to relay if nothing better comes.
pub struct Buffered {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Bytes,
    pub provider: String,
    pub connection: String,
    /// `Retry-After` told to the client when the status was restated.
    pub retry_after_s: Option<u64>,
}

/// Longest upstream error body read for classification and relaying.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Reads an upstream error answer whole (up to `MAX_ERROR_BODY_BYTES`).
pub async fn buffer_error(
    up: &mut Up,
    provider: &Provider,
    conn: &Connection,
    idle: Duration,
) -> Result<Buffered, GatewayError> {
    let status = up.head.status();
    let headers: Vec<(String, Vec<u8>)> = match &up.head {
        UpHead::Net(h) => h
            .headers()
            .filter(|(n, _)| !relayed_never(n))
            .map(|(n, v)| (n.to_owned(), v.to_vec()))
            .collect(),
        UpHead::Mock(h) => {
            let mut hs = vec![(
                "content-type".to_owned(),
                h.content_type.as_bytes().to_vec(),
            )];
            hs.extend(
                h.extra
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
pub async fn relay_buffered(
    shard: &Req<'_>,
    b: &Buffered,
    attempts: usize,
    client: &mut ClientStream,
    keep_alive: bool,
    log: &AccessLog,
) -> After {
    let keep_alive = respond::keep_alive_now(shard, keep_alive);
    log.upstream(&b.provider, &b.connection, attempts);
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
    headers.extend(log.response_headers());
    let mut out = BytesMut::with_capacity(512 + b.body.len());
    write_response_head(
        &mut out,
        b.status,
        headers,
        Framing::Length(b.body.len() as u64),
        keep_alive,
    );
    out.extend_from_slice(&b.body);
    shard.metrics().response(b.status);
    log.responding(shard, b.status);
    log.sent(out.len());
    match write_all(client, out).await {
        Ok(_) if keep_alive => After::KeepAlive,
        _ => After::Close,
    }
}

/// Writes the response head and the first piece, then streams the rest, and finalizes
/// once, however the relay ended (completed, broken, cut by a watchdog or a deadline, or
/// the client gone): the usage the stream reported goes into the token counters. The
/// caller records the outcome (its `Attempted` guard) and the permits go back as their
/// guards drop.
///
/// Every wait for the next piece is raced against the client hanging up (the upstream
/// connection is then dropped, so the upstream sees it too) and bounded by the attempt's
/// hard deadline. One function, not a wrapper around the relay: an `async fn` calling
/// another keeps every argument it passes on twice, for as long as the answer streams.
#[allow(clippy::too_many_arguments)]
pub async fn commit(
    shard: &Req<'_>,
    client_head: &RequestHead,
    mut up: Up,
    first: Option<Bytes>,
    provider: &Provider,
    conn: &Connection,
    attempts: usize,
    client: &mut ClientStream,
    pending: &mut BytesMut,
    keep_alive: bool,
    idle: Duration,
    endpoint: Endpoint,
    wd: &mut Option<Watchdog>,
    log: &AccessLog,
    active: Option<Deadline>,
    mut splice: Option<&mut Splice>,
) -> (After, Ended) {
    // A whole JSON answer's usage is read from its last bytes (streams': by the watchdog).
    let mut tail =
        (wd.is_none() && (200..300).contains(&up.head.status())).then(AnswerTail::default);
    let ended = 'relay: {
        let status = up.head.status();
        let keep_alive = respond::keep_alive_now(shard, keep_alive);
        let http11 = client_head.minor_version() == 1;
        // A continuation writes into the client's open stream: no head, its chunked framing.
        let continuing = splice.as_deref().is_some_and(Splice::continuing);
        let (framing, keep_alive) = match up.head.body_kind() {
            _ if continuing => (
                Framing::Chunked,
                splice.as_deref().is_some_and(Splice::keep_alive),
            ),
            BodyKind::Length(n) => (Framing::Length(n), keep_alive),
            BodyKind::Empty if status == 204 || status == 304 => (Framing::NoBody, keep_alive),
            BodyKind::Empty => (Framing::Length(0), keep_alive),
            BodyKind::Chunked | BodyKind::CloseDelimited if http11 => {
                (Framing::Chunked, keep_alive)
            }
            BodyKind::Chunked | BodyKind::CloseDelimited => (Framing::Close, false),
        };
        let chunked = framing == Framing::Chunked;
        // Without a splice, what one write carries goes out as one chunk, however many
        // pieces it gathered (the pieces are written bare, then framed: `frame_chunk`); a
        // splice frames what it passes itself.
        let one_chunk = chunked && splice.is_none();
        let per_piece = chunked && !one_chunk;
        let event_stream = up.is_event_stream();
        if let Some(s) = splice.as_deref_mut()
            && !continuing
        {
            s.set_keep_alive(keep_alive);
            if !(chunked && event_stream) {
                s.turn_off();
            }
        }
        let attempts_s = attempts.to_string();
        let mut out = BytesMut::with_capacity(1024 + first.as_ref().map_or(0, Bytes::len));
        let extra = std::mem::take(&mut up.extra);
        if !continuing {
            let mut ours: Vec<(&str, &[u8])> = vec![
                ("x-omniroute-selected-connection-id", conn.name.as_bytes()),
                ("x-tidegate-provider", provider.name.as_bytes()),
                ("x-tidegate-attempts", attempts_s.as_bytes()),
            ];
            ours.extend(log.response_headers());
            ours.extend(extra.iter().map(|(n, v)| (*n, v.as_bytes())));
            match &up.head {
                UpHead::Net(h) => {
                    // Names as bytes: no UTF-8 check of each.
                    let relayed = h.fields().filter(|(n, _)| !relayed_never_name(n));
                    let ours = ours.iter().map(|(n, v)| (n.as_bytes(), *v));
                    let fields = relayed.chain(ours);
                    write_response_head_bytes(&mut out, status, fields, framing, keep_alive);
                }
                UpHead::Mock(_) => {
                    let hs = up.head.fields();
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
        if !continuing {
            shard.metrics().response(status);
            log.responding(shard, status);
        }
        // Everything that is already here goes out with the head, in one write.
        let body_at = out.len();
        let mut done = match first {
            None => true,
            Some(piece) => {
                if let Some(t) = tail.as_mut() {
                    t.feed(&piece);
                }
                emit(&mut out, &piece, per_piece, splice.as_deref_mut());
                gather(
                    shard,
                    &mut up,
                    &mut out,
                    per_piece,
                    wd.as_mut(),
                    splice.as_deref_mut(),
                    tail.as_mut(),
                )
            }
        };
        done = done && ended_well(&mut out, chunked, splice.as_deref_mut());
        if one_chunk {
            frame_chunk(&mut out, body_at);
        }
        if done && chunked {
            write_last_chunk(&mut out);
        }
        log.sent(out.len());
        if write_all(client, out).await.is_err() {
            if done {
                break 'relay (After::Close, Ended::Success);
            }
            break 'relay client_gone(shard, up);
        }
        // The end of the shutdown grace period cuts the stream like an upstream failure.
        let mut cut = std::pin::pin!(shard.cut_signal());
        while !done {
            // A replay that does not repeat the delivered text ends the stream.
            if let Some(e) = splice.as_deref_mut().and_then(Splice::failure) {
                let after = break_stream(shard, conn, &e, chunked, true, endpoint, client).await;
                break 'relay (after, broken(&e));
            }
            // Pinned in place, the wrapper holding it by reference (`deadline::within` says
            // why); one timer bounds the wait, for whichever budget runs out first.
            let got = {
                let wait = pin!(watchdog::next(shard, &mut up, idle, wd.as_mut(), active));
                let wait = unless_client_gone(client, pending, wait);
                monoio::select! {
                    biased;
                    () = &mut cut => Some(Err(GatewayError::new(
                        ErrorKind::ShuttingDown,
                        "the gateway is shutting down: the stream did not finish within the grace period",
                    ))),
                    got = wait => got,
                }
            };
            let Some(got) = got else {
                break 'relay client_gone(shard, up);
            };
            let piece = match got {
                Ok(Some(piece)) => piece,
                Ok(None) => {
                    let mut out = BytesMut::with_capacity(8);
                    done = ended_well(&mut out, chunked, splice.as_deref_mut());
                    if !done {
                        continue;
                    }
                    if chunked {
                        write_last_chunk(&mut out);
                    }
                    if !out.is_empty() && write_all(client, out).await.is_err() {
                        break 'relay (After::Close, Ended::Success);
                    }
                    continue;
                }
                Err(e) => {
                    // The upstream ended its stream with its own error event (relayed): not
                    // continued, no second error event; the attempt failed as the event says
                    // (`relay::deliver` classifies it).
                    let upstream_said = wd.as_ref().is_some_and(|w| w.error_event().is_some());
                    // With continuation on, the walk looks for a candidate to go on with.
                    if !upstream_said
                        && let Some(s) = splice.as_deref_mut()
                        && s.cut_by(&e)
                    {
                        tracing::info!(connection = %conn.name, "stream cut after the first byte: {e}; looking for a continuation");
                        break 'relay (After::Close, broken(&e));
                    }
                    let close_delimited = framing == Framing::Close;
                    let inband = event_stream && (chunked || close_delimited) && !upstream_said;
                    let after =
                        break_stream(shard, conn, &e, chunked, inband, endpoint, client).await;
                    if e.kind == ErrorKind::ShuttingDown {
                        // Not the upstream's doing: nothing counts against it.
                        break 'relay (after, Ended::ClientAbort);
                    }
                    break 'relay (after, broken(&e));
                }
            };
            if let Some(t) = tail.as_mut() {
                t.feed(&piece);
            }
            let res = if !chunked && piece.len() >= DIRECT_WRITE_BYTES && splice.is_none() {
                log.sent(piece.len());
                write_all(client, piece).await.map(|_| ())
            } else {
                let mut out = BytesMut::with_capacity(piece.len() + 64);
                emit(&mut out, &piece, per_piece, splice.as_deref_mut());
                done = gather(
                    shard,
                    &mut up,
                    &mut out,
                    per_piece,
                    wd.as_mut(),
                    splice.as_deref_mut(),
                    tail.as_mut(),
                );
                done = done && ended_well(&mut out, chunked, splice.as_deref_mut());
                if one_chunk {
                    frame_chunk(&mut out, 0);
                }
                if done && chunked {
                    write_last_chunk(&mut out);
                }
                log.sent(out.len());
                write_all(client, out).await.map(|_| ())
            };
            if res.is_err() {
                break 'relay client_gone(shard, up);
            }
        }
        up.finish(shard);
        let after = if keep_alive {
            After::KeepAlive
        } else {
            After::Close
        };
        (after, Ended::Success)
    };
    // A spliced stream counts the usage of the whole answer once, when it is over
    // (`continuation::Splice::count_usage`).
    match splice {
        Some(s) if s.spliced() => {
            if !s.cut_pending() {
                s.count_usage(shard);
            }
        }
        _ => {
            let usage = match (&wd, &tail) {
                (Some(w), _) => Some(w.usage()),
                (None, Some(t)) => t.usage(),
                (None, None) => None,
            };
            count_usage(shard, usage);
        }
    }
    ended
}

/// Adds what an answer reported about its tokens to the usage counters (once per answer).
pub fn count_usage(shard: &Req<'_>, usage: Option<Usage>) {
    if let Some(usage) = usage {
        let m = shard.metrics();
        add_one_writer(&m.usage_prompt_tokens, usage.prompt_tokens);
        add_one_writer(&m.usage_completion_tokens, usage.completion_tokens);
    }
}

/// The client went away mid-answer: the upstream connection is dropped (the upstream sees
/// the hang-up), the request is counted as abandoned while streaming, and nothing counts
/// against the upstream.
fn client_gone(shard: &Req<'_>, up: Up) -> (After, Ended) {
    drop(up);
    shard.metrics().abandoned(Abandoned::Streaming);
    (After::Close, Ended::ClientAbort)
}

/// Appends every piece already buffered (each one scanned by the watchdog); true when the
/// body ended. A decode failure is left for the next blocking read to report.
fn gather(
    shard: &Req<'_>,
    up: &mut Up,
    out: &mut BytesMut,
    chunked: bool,
    mut wd: Option<&mut Watchdog>,
    mut splice: Option<&mut Splice>,
    mut tail: Option<&mut AnswerTail>,
) -> bool {
    // One clock reading for everything already here.
    let mut now_ns = None;
    loop {
        if wd.as_deref().is_some_and(|w| w.error_event().is_some()) {
            return false;
        }
        match up.next_buffered() {
            Ok(InBuffer::Piece(p)) => {
                if let Some(w) = wd.as_deref_mut() {
                    let now = *now_ns.get_or_insert_with(|| shard.mono_ns());
                    w.observe(&p, now);
                    if w.tripped() {
                        // The throughput watchdog ended the stream: the next read reports it.
                        return false;
                    }
                    if w.error_event().is_some() {
                        // The upstream's error event is the last thing relayed: the next
                        // read reports the failure.
                        let p = w.cut_at_error(p);
                        if let Some(t) = tail.as_deref_mut() {
                            t.feed(&p);
                        }
                        emit(out, &p, chunked, splice.as_deref_mut());
                        return false;
                    }
                }
                if let Some(t) = tail.as_deref_mut() {
                    t.feed(&p);
                }
                emit(out, &p, chunked, splice.as_deref_mut())
            }
            Ok(InBuffer::End) => return true,
            Ok(InBuffer::Empty) | Err(_) => return false,
        }
    }
}

/// How a stream that failed is recorded on its connection (never on a breaker): a content
/// stall or the throughput watchdog as `stream_content_stall`, a body-idle or hard-deadline
/// budget that ran out as `timeout`, anything else that broke it after its first byte (a
/// cut or reset, broken framing, an end before its last event, a continuation that could
/// not go on) as `stream_interrupted`; the error's message is its last error.
pub(super) fn broken(e: &GatewayError) -> Ended {
    let error_type = match e.kind {
        ErrorKind::StreamContentStall | ErrorKind::StreamThroughputTooLow => {
            ProviderErrorType::StreamContentStall
        }
        ErrorKind::UpstreamTimeout(_) => ProviderErrorType::Timeout,
        _ => ProviderErrorType::StreamInterrupted,
    };
    Ended::StreamBroken {
        error_type,
        last_error: LastError::new(&e.message),
    }
}

/// Ends a stream whose upstream failed (or stalled) after the first byte: an in-band error
/// event in the endpoint's shape for event streams, then the connection is closed without
/// the chunked terminator — never a clean end, never a `[DONE]`.
pub(super) async fn break_stream(
    shard: &Req<'_>,
    conn: &Connection,
    err: &GatewayError,
    chunked: bool,
    inband: bool,
    endpoint: Endpoint,
    client: &mut ClientStream,
) -> After {
    bump(&shard.metrics().streams_broken);
    tracing::warn!(connection = %conn.name, "stream broken after the first byte: {err}");
    if inband {
        let mut out = BytesMut::with_capacity(256);
        put_piece(
            &mut out,
            respond::stream_error_event(err, endpoint).as_bytes(),
            chunked,
        );
        let _ = write_all(client, out).await;
    }
    After::Close
}

/// A piece for the client: through the continuation splice when there is one.
pub(super) fn emit(out: &mut BytesMut, piece: &[u8], chunked: bool, splice: Option<&mut Splice>) {
    match splice {
        Some(s) => s.pass(piece, out, chunked),
        None => put_piece(out, piece, chunked),
    }
}

/// The upstream ended its body: the splice sends what it still holds; false when that
/// showed the stream cannot end well (its failure is reported by the next loop turn).
pub(super) fn ended_well(out: &mut BytesMut, chunked: bool, splice: Option<&mut Splice>) -> bool {
    match splice {
        Some(s) => {
            s.finish(out, chunked);
            !s.has_failed()
        }
        None => true,
    }
}

/// Frames the bytes of `out` from `at` on as one chunk: its size line goes in before them
/// (they move up by its length, one `memmove`) and its CRLF after. Nothing when there are
/// none (an empty chunk would end the body).
fn frame_chunk(out: &mut BytesMut, at: usize) {
    let len = out.len().saturating_sub(at);
    if len == 0 {
        return;
    }
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4) as usize;
    let line = digits + 2;
    out.resize(out.len() + line, 0);
    out.copy_within(at..at + len, at + line);
    for (i, d) in out[at..at + digits].iter_mut().enumerate() {
        let nibble = (len >> (4 * (digits - 1 - i))) & 0xf;
        *d = b"0123456789ABCDEF"[nibble];
    }
    out[at + digits..at + line].copy_from_slice(b"\r\n");
    out.extend_from_slice(b"\r\n");
}

pub(super) fn put_piece(out: &mut BytesMut, piece: &[u8], chunked: bool) {
    if chunked {
        write_chunk(out, piece);
    } else {
        out.extend_from_slice(piece);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes framed in place are the chunk `write_chunk` makes of them, after what was
    /// already in the buffer; no bytes, no chunk.
    #[test]
    fn a_write_s_bytes_framed_in_place_are_one_chunk() {
        for len in [
            0usize, 1, 9, 15, 16, 17, 255, 256, 4095, 4096, 65_536, 1_048_577,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut framed = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
            let at = framed.len();
            framed.extend_from_slice(&data);
            frame_chunk(&mut framed, at);
            let mut expected = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\n"[..]);
            write_chunk(&mut expected, &data);
            assert_eq!(framed, expected, "{len} bytes");
        }
    }
}
