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
use bytes::{BufMut, Bytes, BytesMut};

use super::access::{AccessLog, REQUEST_ID_HEADER};
use super::continuation::Splice;
use super::deadline::Deadline;
use super::upstream::{Up, UpHead};
use super::watchdog::{self, Watchdog};
use super::{After, respond};
use crate::config::{Connection, Provider};
use crate::error::{ErrorKind, GatewayError};
use crate::http1::{
    BodyKind, Framing, Persist, RequestHead, is_hop_by_hop_name, write_chunk, write_last_chunk,
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

/// Room in a write's buffer for the fields the gateway adds to the head beyond the
/// upstream's own (its three, the access fields, the framing and `Connection` lines) and
/// for a chunk's framing (a size line, its CRLF, the last chunk) or a splice's few bytes.
const OUR_HEAD_BYTES: usize = 512;
const FRAMING_BYTES: usize = 64;

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
    keep_alive: Persist,
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
        Ok(_) if keep_alive.is_kept() => After::KeepAlive,
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
    keep_alive: Persist,
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
                splice.as_deref().map_or(Persist::Close, Splice::keep_alive),
            ),
            BodyKind::Length(n) => (Framing::Length(n), keep_alive),
            BodyKind::Empty if status == 204 || status == 304 => (Framing::NoBody, keep_alive),
            BodyKind::Empty => (Framing::Length(0), keep_alive),
            BodyKind::Chunked | BodyKind::CloseDelimited if http11 => {
                (Framing::Chunked, keep_alive)
            }
            BodyKind::Chunked | BodyKind::CloseDelimited => (Framing::Close, Persist::Close),
        };
        let chunked = framing == Framing::Chunked;
        // Without a splice, what one write carries goes out as one chunk, however many
        // pieces it gathered (the pieces are written bare behind room for the size line,
        // then framed: `ChunkRoom`); a splice frames what it passes itself.
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
        let mut attempts_digits = [0u8; 20];
        let attempts_s = decimal(attempts, &mut attempts_digits);
        let extra = std::mem::take(&mut up.extra);
        // One buffer for the head and every body byte already read (`gather` writes no
        // more than that): it does not regrow on the way.
        let body_bound = first.as_ref().map_or(0, Bytes::len) + up.buffered_len();
        let extra_len: usize = extra.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
        let mut out = BytesMut::with_capacity(
            up.head_len() + OUR_HEAD_BYTES + extra_len + body_bound + FRAMING_BYTES,
        );
        if !continuing {
            // Names as bytes: no UTF-8 check of each; no list built (an iterator chain).
            let ours = [
                (
                    &b"x-omniroute-selected-connection-id"[..],
                    conn.name.as_bytes(),
                ),
                (b"x-tidegate-provider", provider.name.as_bytes()),
                (b"x-tidegate-attempts", attempts_s),
            ]
            .into_iter()
            .chain(
                log.response_headers()
                    .into_iter()
                    .map(|(n, v)| (n.as_bytes(), v)),
            )
            .chain(extra.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
            match &up.head {
                UpHead::Net(h) => {
                    let relayed = h.fields().filter(|(n, _)| !relayed_never_name(n));
                    let fields = relayed.chain(ours);
                    write_response_head_bytes(&mut out, status, fields, framing, keep_alive);
                }
                UpHead::Mock(_) => {
                    let hs = up.head.fields();
                    let fields = hs.into_iter().map(|(n, v)| (n.as_bytes(), v)).chain(ours);
                    write_response_head_bytes(&mut out, status, fields, framing, keep_alive);
                }
            }
        }
        if !continuing {
            shard.metrics().response(status);
            log.responding(shard, status);
        }
        // Everything that is already here goes out with the head, in one write.
        let room = one_chunk.then(|| ChunkRoom::open(&mut out, body_bound));
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
        if let Some(room) = room {
            room.close(&mut out);
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
            // why); one bound (the body read's read-sweep deadline) ends the wait, for
            // whichever budget runs out first.
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
                let bound = piece.len() + up.buffered_len();
                let mut out = BytesMut::with_capacity(bound + FRAMING_BYTES);
                let room = one_chunk.then(|| ChunkRoom::open(&mut out, bound));
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
                if let Some(room) = room {
                    room.close(&mut out);
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
        let after = if keep_alive.is_kept() {
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

/// Room left in a write's buffer for the size line of the one chunk its bytes become
/// (without a splice, what one write carries goes out as one chunk, however many pieces it
/// gathered): the pieces are written bare behind it and framed once their length is known
/// ([`ChunkRoom::close`]). The room is as wide as the size line of a bound on that length
/// (the upstream bytes already read), which is the line's width unless the bound is far
/// off: the bytes behind it do not move.
struct ChunkRoom {
    /// Where the size line goes.
    at: usize,
    /// Hex digits the room holds (CRLF follows them).
    digits: usize,
}

impl ChunkRoom {
    /// Leaves room at the end of `out` for the size line of a chunk of `bound` bytes.
    fn open(out: &mut BytesMut, bound: usize) -> Self {
        let at = out.len();
        let digits = hex_digits(bound);
        out.put_bytes(b'0', digits + 2);
        Self { at, digits }
    }

    /// Frames the bytes written behind the room as one chunk: its size line goes into the
    /// room and its CRLF after them. When the line is not as wide as the room (the bound
    /// was off by a hex digit or more) they move by the difference, one `memmove`. No
    /// bytes, no chunk (an empty chunk would end the body): the room is taken back.
    fn close(self, out: &mut BytesMut) {
        let from = self.at + self.digits + 2;
        let len = out.len().saturating_sub(from);
        if len == 0 {
            out.truncate(self.at);
            return;
        }
        let digits = hex_digits(len);
        let to = self.at + digits + 2;
        if to > from {
            out.resize(to + len, 0);
        }
        if to != from {
            out.copy_within(from..from + len, to);
            out.truncate(to + len);
        }
        for (i, d) in out[self.at..self.at + digits].iter_mut().enumerate() {
            let nibble = (len >> (4 * (digits - 1 - i))) & 0xf;
            *d = b"0123456789ABCDEF"[nibble];
        }
        out[self.at + digits..to].copy_from_slice(b"\r\n");
        out.extend_from_slice(b"\r\n");
    }
}

/// Hex digits of `n` as a chunk size (at least one).
fn hex_digits(n: usize) -> usize {
    ((usize::BITS - n.leading_zeros()).div_ceil(4) as usize).max(1)
}

/// `n` in decimal, in the end of `buf` (`to_string` allocated, once per answer).
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
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
    use proptest::prelude::*;

    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";

    /// `pieces` written behind a room for a chunk of `bound` bytes after `prefix`, then
    /// framed.
    fn framed(prefix: &[u8], pieces: &[&[u8]], bound: usize) -> BytesMut {
        let mut out = BytesMut::from(prefix);
        let room = ChunkRoom::open(&mut out, bound);
        for p in pieces {
            out.extend_from_slice(p);
        }
        room.close(&mut out);
        out
    }

    /// What the client got before the room: `prefix`, then the pieces as one chunk
    /// (`write_chunk`), nothing when there are none.
    fn expected(prefix: &[u8], pieces: &[&[u8]]) -> BytesMut {
        let mut out = BytesMut::from(prefix);
        write_chunk(&mut out, &pieces.concat());
        out
    }

    /// Every length at a hex-width edge, framed behind a room sized for every bound at
    /// such an edge (too narrow, right, too wide), in one piece and in three, with and
    /// without a head before it: the chunk `write_chunk` makes, and no chunk for none.
    #[test]
    fn a_write_s_bytes_framed_in_their_room_are_one_chunk_whatever_the_bound() {
        let mut edges = vec![0usize, 1, 2];
        for w in 1..=4 {
            let p = 16usize.pow(w);
            edges.extend([p - 1, p, p + 1]);
        }
        let data: Vec<u8> = (0..70_000).map(|i| (i % 251) as u8).collect();
        for &len in &edges {
            let d = &data[..len];
            let (a, rest) = d.split_at(len / 3);
            let (b, c) = rest.split_at(rest.len() / 2);
            for &bound in &edges {
                for prefix in [&b""[..], HEAD] {
                    assert_eq!(
                        framed(prefix, &[d], bound),
                        expected(prefix, &[d]),
                        "{len} in {bound}"
                    );
                    assert_eq!(
                        framed(prefix, &[a, b, c], bound),
                        expected(prefix, &[d]),
                        "{len} in {bound}"
                    );
                }
            }
        }
        let big: Vec<u8> = (0..1_048_577).map(|i| (i % 251) as u8).collect();
        for bound in [0, 1_048_576, 1_048_577, 1 << 24] {
            assert_eq!(framed(HEAD, &[&big], bound), expected(HEAD, &[&big]));
        }
    }

    proptest! {
        /// Any pieces behind a room of any bound are the one chunk of their bytes.
        #[test]
        fn any_pieces_in_any_room_are_one_chunk(
            prefix in proptest::collection::vec(any::<u8>(), 0..300),
            pieces in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..400), 0..12),
            bound in prop_oneof![0usize..5_000, 0usize..70_000, Just(usize::MAX)],
        ) {
            let pieces: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(framed(&prefix, &pieces, bound), expected(&prefix, &pieces));
        }
    }

    /// When the bound is the length's width, the framed bytes stay where they were
    /// written (only the size line and the CRLF after them are written).
    #[test]
    fn a_bound_of_the_same_width_moves_no_byte() {
        let data = vec![7u8; 2451];
        let mut out = BytesMut::with_capacity(4096);
        out.extend_from_slice(HEAD);
        let room = ChunkRoom::open(&mut out, 2540);
        let body_at = out.len();
        out.extend_from_slice(&data);
        let before = out.as_ptr();
        room.close(&mut out);
        assert_eq!(out.as_ptr(), before);
        assert_eq!(&out[body_at..body_at + data.len()], &data[..]);
        assert_eq!(&out[HEAD.len()..body_at], b"993\r\n");
    }

    /// The attempts count reads as `to_string` writes it.
    #[test]
    fn decimal_is_to_string() {
        let mut buf = [0u8; 20];
        for n in (0..=10_000).chain([99_999, 100_000, usize::MAX - 1, usize::MAX]) {
            assert_eq!(decimal(n, &mut buf), n.to_string().as_bytes());
        }
    }
}
