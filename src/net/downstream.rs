//! A client connection: read a request head (idle budget before its first byte, head
//! budget after), read its body (length or chunked, bounded, `Expect: 100-continue`),
//! hand it to the [`Handler`] it was given, and loop while keep-alive holds. Pipelined requests are read
//! from the same buffer and so answered in order. Bad input gets its typed response
//! and closes the connection; nothing here panics.

use std::pin::{Pin, pin};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use monoio::io::AsyncWriteRent;

use crate::clock::OneReading;
use crate::error::{ErrorKind, GatewayError};
use crate::http1::{
    self, BodyDecoder, BodyEvent, BodyKind, CONTINUE_100, Decoded, HeadError, RequestHead,
};
use crate::net::io::{ClientStream, READ_BUF_BYTES, read_more, write_all};
use crate::net::watch::Watch;
use crate::timer::timeout;

/// What happens to the client connection after a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    KeepAlive,
    Close,
}

/// How a request ended: what happens to its connection, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    pub after: After,
    /// Monotonic now at the request's end, in ns: the reading its last poll took
    /// (`clock::OneReading`). The keep-alive wait that follows counts its idle budget from
    /// it, without a clock read of its own.
    pub end_ns: u64,
}

/// The budgets and limits of reading requests.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Before a request's first byte (keep-alive idle).
    pub idle_timeout_ms: u64,
    /// From a head's first byte to its end.
    pub header_timeout_ms: u64,
    pub max_request_body_bytes: usize,
}

/// What serves the requests of a connection.
pub trait Handler {
    /// A request, held from its complete head to the end of its response (its in-flight
    /// mark, and whatever the handler keeps for it from the start, e.g. its configuration).
    type Request<'a>
    where
        Self: 'a;

    /// The limits of reading the next request's head (the configuration in force now).
    fn limits(&self) -> Limits;
    /// The limits of reading `request`'s body: those of the configuration it started on,
    /// whatever a reload changes meanwhile.
    fn body_limits(&self, request: &Self::Request<'_>) -> Limits;
    /// Monotonic now, in ns.
    fn now_ns(&self) -> u64;
    /// Shutting down: finish what is in flight, read no new request.
    fn is_draining(&self) -> bool;
    fn connection_opened(&self);
    fn connection_closed(&self);
    /// A complete request head has arrived.
    fn request_started(&self) -> Self::Request<'_>;
    /// Serves one request whose head and body have been read, writing its whole response.
    fn handle(
        &self,
        request: &Self::Request<'_>,
        head: &RequestHead,
        body: Bytes,
        client: &mut ClientStream,
        pending: &mut BytesMut,
    ) -> impl std::future::Future<Output = Served>;
    /// Answers bad input with its typed error; the connection closes after it.
    /// `head` is the request's head when it was read (the body was refused).
    fn reject(
        &self,
        head: Option<&RequestHead>,
        client: &mut ClientStream,
        err: &GatewayError,
    ) -> impl std::future::Future<Output = ()>;
}

/// Serves one accepted client connection until it closes.
pub async fn serve<H: Handler>(handler: Rc<H>, mut stream: ClientStream) {
    handler.connection_opened();
    let mut buf = BytesMut::with_capacity(READ_BUF_BYTES);
    // The deadlines of this connection's head and body reads, kept by its thread's sweep.
    let mut watch = Watch::default();
    // When the last request ended (its own clock reading): the idle wait's start.
    let mut ended_ns: Option<u64> = None;
    loop {
        let idle_from_ns = ended_ns.take();
        let mut head =
            match read_head(&*handler, &mut stream, &mut buf, &mut watch, idle_from_ns).await {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(err) => {
                    handler.reject(None, &mut stream, &err).await;
                    break;
                }
            };
        let request = handler.request_started();
        let limits = handler.body_limits(&request);
        let mut body = match read_body(limits, &mut stream, &mut buf, &head, &mut watch).await {
            Ok(b) => b,
            Err(Some(err)) => {
                handler.reject(Some(&head), &mut stream, &err).await;
                break;
            }
            Err(None) => break,
        };
        // The head and body are slices of the read buffer, and would hold all of it for as
        // long as the request runs (minutes, for a slow stream). With nothing pipelined
        // behind them they get exact allocations of their own and the buffer is freed; the
        // next read takes a fresh one.
        if buf.is_empty() {
            head.detach();
            body = Bytes::copy_from_slice(&body);
            buf = BytesMut::new();
        }
        // The request's future lives on the heap while it runs: the connection's own task
        // stays small (an idle keep-alive connection holds only this loop's state), and
        // the request's size is paid only while a request is served. The box is allocated
        // before the future is made, so the future is built in it: `Box::pin(make())`
        // built it on the stack and copied all of it (12 KiB, the largest user-space cost
        // per request in the session-7 profile) into the box.
        let work = Box::write(
            Box::new_uninit(),
            handler.handle(&request, &head, body, &mut stream, &mut buf),
        );
        // One clock reading per poll of the request (`clock::OneReading`).
        let served = OneReading(Box::into_pin(work)).await;
        drop(request);
        ended_ns = Some(served.end_ns);
        if served.after == After::Close || handler.is_draining() {
            break;
        }
        // Keep an idle connection's buffer small: drop a grown one.
        if buf.is_empty() && buf.capacity() > 4 * READ_BUF_BYTES {
            buf = BytesMut::with_capacity(READ_BUF_BYTES);
        }
    }
    if matches!(stream, ClientStream::Tls(..)) {
        // TLS ends with close_notify, so the client can tell a complete response from a
        // cut one (bounded: a client that stopped reading does not hold the task).
        let budget = Duration::from_millis(handler.limits().header_timeout_ms);
        let _ = timeout(budget, pin!(stream.shutdown())).await;
    }
    handler.connection_closed();
}

/// Most pipelined bytes read from a client while its request waits for admission; past
/// this the watch stops (the wait goes on, unwatched).
pub const MAX_PENDING_WHILE_WAITING: usize = 64 * 1024;

/// Runs `wait` (a request's admission: queue slot, gate permits) unless the client hangs
/// up first (`None`), so a request whose client is gone never reaches the upstream and
/// gives its place back. `wait` is polled first: one that is ready at once costs nothing;
/// one that ends within [`crate::timer::GRACE_MS`] costs a grace (no timer), no readiness
/// poll; a longer one watches the client socket (a readiness poll) until it ends. Bytes the
/// client pipelines meanwhile are appended to `pending` (the connection's read buffer),
/// where the keep-alive loop finds them. `wait` is pinned by the caller, in place (taken by
/// value, it would be stored twice: `proxy::deadline::within`).
pub async fn unless_client_gone<F: std::future::Future>(
    client: &mut ClientStream,
    pending: &mut BytesMut,
    mut wait: Pin<&mut F>,
) -> Option<F::Output> {
    if let Some(out) = poll_once(wait.as_mut()).await {
        return Some(out);
    }
    {
        let grace = std::pin::pin!(crate::timer::grace());
        monoio::select! {
            biased;
            out = &mut wait => return Some(out),
            () = grace => {}
        }
    }
    loop {
        if pending.len() >= MAX_PENDING_WHILE_WAITING {
            return Some(wait.await);
        }
        monoio::select! {
            biased;
            out = &mut wait => return Some(out),
            ready = client.readable() => {
                if ready.is_err() {
                    return None;
                }
            }
        }
        // Readable: the client closed (EOF), reset, or pipelined more bytes. Data is
        // waiting, so this read completes at once.
        let (res, b) = read_more(client, std::mem::take(pending), READ_BUF_BYTES).await;
        *pending = b;
        match res {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Polls `wait` once: its output when it is ready at once, `None` (and `wait` untouched
/// apart from that poll, its waker registered) when it is not.
async fn poll_once<F: std::future::Future>(mut wait: Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(|cx| match wait.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

fn head_error(e: HeadError) -> GatewayError {
    match e {
        HeadError::TooLarge => GatewayError::new(ErrorKind::HeadTooLarge, "request head too large"),
        HeadError::TooManyHeaders => {
            GatewayError::new(ErrorKind::HeadTooLarge, "too many request headers")
        }
        HeadError::Malformed(why) => GatewayError::new(
            ErrorKind::MalformedRequest,
            format!("malformed request: {why}"),
        ),
        HeadError::BadContentLength => {
            GatewayError::new(ErrorKind::MalformedRequest, "invalid Content-Length")
        }
        HeadError::ConflictingFraming => GatewayError::new(
            ErrorKind::MalformedRequest,
            "both Transfer-Encoding and Content-Length are present",
        ),
        HeadError::UnsupportedTransferEncoding => GatewayError::new(
            ErrorKind::UnsupportedTransferEncoding,
            "only the chunked transfer coding is supported",
        ),
        HeadError::UnsupportedVersion => GatewayError::new(
            ErrorKind::MalformedRequest,
            "only HTTP/1.0 and HTTP/1.1 are served",
        ),
    }
}

/// Reads the next request head. `Ok(None)`: the client closed or stayed idle too long
/// between requests (closed silently). Both budgets are kept by `watch` (no timer per
/// read): a read ends within [`crate::net::watch::SWEEP_TICK_MS`] after its deadline. The
/// idle budget counts from `idle_from_ns` when given (the previous request's end, as its
/// last poll read the clock), else from now.
async fn read_head<H: Handler>(
    handler: &H,
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    watch: &mut Watch,
    mut idle_from_ns: Option<u64>,
) -> Result<Option<RequestHead>, GatewayError> {
    let cfg = handler.limits();
    let mut head_deadline_ns: Option<u64> = None;
    loop {
        match http1::decode_request_head(buf) {
            Ok(Decoded::Complete(h)) => return Ok(Some(h)),
            Ok(Decoded::Partial) => {}
            Err(e) => return Err(head_error(e)),
        }
        let deadline_ns = if buf.is_empty() {
            if handler.is_draining() {
                return Ok(None);
            }
            idle_deadline_ns(
                idle_from_ns.take(),
                || handler.now_ns(),
                cfg.idle_timeout_ms,
            )
        } else {
            *head_deadline_ns.get_or_insert_with(|| {
                handler
                    .now_ns()
                    .saturating_add(cfg.header_timeout_ms.saturating_mul(1_000_000))
            })
        };
        let read = pin!(read_more(stream, std::mem::take(buf), READ_BUF_BYTES));
        match watch.within(deadline_ns, read).await {
            Ok((res, b)) => {
                *buf = b;
                match res {
                    Ok(0) | Err(_) => return Ok(None),
                    Ok(_) => {}
                }
            }
            // The timed-out read took the buffer with it; whether a head had begun is
            // known from its deadline.
            Err(_) if head_deadline_ns.is_none() => return Ok(None),
            Err(_) => {
                return Err(GatewayError::new(
                    ErrorKind::HeadTimeout,
                    format!(
                        "request head not complete within {} ms",
                        cfg.header_timeout_ms
                    ),
                ));
            }
        }
    }
}

/// The deadline of the wait for a request's first byte: the idle budget from `from_ns` (the
/// previous request's end, as its last poll read the clock) when it is known, else from
/// `now_ns()` (the clock is read only then).
fn idle_deadline_ns(from_ns: Option<u64>, now_ns: impl FnOnce() -> u64, idle_ms: u64) -> u64 {
    from_ns
        .unwrap_or_else(now_ns)
        .saturating_add(idle_ms.saturating_mul(1_000_000))
}

/// Reads the whole request body. `Err(None)`: the connection failed (no response possible).
/// Each wait for more of it is bounded by the idle budget, kept by `watch` (no timer per
/// read: it ends within [`crate::net::watch::SWEEP_TICK_MS`] after the budget).
async fn read_body(
    cfg: Limits,
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    head: &RequestHead,
    watch: &mut Watch,
) -> Result<Bytes, Option<GatewayError>> {
    let max = cfg.max_request_body_bytes;
    let too_large = || {
        Some(GatewayError::new(
            ErrorKind::BodyTooLarge,
            format!("request body exceeds {max} bytes"),
        ))
    };
    let kind = head.body_kind();
    match kind {
        BodyKind::Empty | BodyKind::CloseDelimited => return Ok(Bytes::new()),
        BodyKind::Length(n) if n > max as u64 => return Err(too_large()),
        BodyKind::Length(n) if buf.len() as u64 >= n => {
            return Ok(buf.split_to(n as usize).freeze());
        }
        BodyKind::Length(_) | BodyKind::Chunked => {}
    }
    if head.expect_continue() && buf.is_empty() {
        write_all(stream, Bytes::from_static(CONTINUE_100))
            .await
            .map_err(|_| None)?;
    }
    let idle = Duration::from_millis(cfg.idle_timeout_ms);
    let mut decoder = BodyDecoder::new(kind);
    let mut body = match kind {
        BodyKind::Length(n) => BytesMut::with_capacity(n as usize),
        _ => BytesMut::new(),
    };
    loop {
        match decoder.decode(buf) {
            Ok(BodyEvent::Data(d)) => {
                if body.len() + d.len() > max {
                    return Err(too_large());
                }
                if body.is_empty() && matches!(kind, BodyKind::Length(n) if d.len() as u64 == n) {
                    return Ok(d);
                }
                body.extend_from_slice(&d);
                continue;
            }
            Ok(BodyEvent::Done) => return Ok(body.freeze()),
            Ok(BodyEvent::NeedMore) => {}
            Err(e) => {
                return Err(Some(GatewayError::new(
                    ErrorKind::MalformedRequest,
                    format!("malformed request body: {e:?}"),
                )));
            }
        }
        let want = match kind {
            BodyKind::Length(n) => (n as usize)
                .saturating_sub(body.len())
                .clamp(READ_BUF_BYTES, 256 * 1024),
            _ => READ_BUF_BYTES,
        };
        let read = pin!(read_more(stream, std::mem::take(buf), want));
        match watch.within_for(idle, read).await {
            Ok((Ok(n), b)) if n > 0 => *buf = b,
            Ok(_) => return Err(None),
            Err(_) => {
                return Err(Some(GatewayError::new(
                    ErrorKind::HeadTimeout,
                    "request body stalled",
                )));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::idle_deadline_ns;
    use std::cell::Cell;

    #[test]
    fn the_idle_deadline_counts_from_the_last_end_without_reading_the_clock() {
        let reads = Cell::new(0);
        let now = || {
            reads.set(reads.get() + 1);
            7_000_000_000
        };
        for (from, ms) in [(0, 0), (1, 1), (5_000_000_000, 300), (u64::MAX - 1, 1)] {
            let expected = from.saturating_add(ms * 1_000_000);
            assert_eq!(idle_deadline_ns(Some(from), now, ms), expected);
        }
        assert_eq!(reads.get(), 0, "a known end reading needs no clock read");
        // Without one (a connection's first request) the clock is read, once.
        assert_eq!(idle_deadline_ns(None, now, 300), 7_300_000_000);
        assert_eq!(reads.get(), 1);
        assert_eq!(idle_deadline_ns(None, now, u64::MAX), u64::MAX);
    }
}
