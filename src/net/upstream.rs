//! The upstream HTTP/1.1 client of one shard: a keep-alive pool keyed by
//! (scheme, host, port, TLS identity), connect with a budget, one request/response
//! exchange with a response-head budget, and a body reader with an idle budget that
//! hands the connection back to the pool only when the response ended cleanly. The
//! response-head and body-idle budgets are kept by the connection's slot in its shard's
//! read sweep ([`Watch`]: no timer per read; a read ends within
//! [`crate::net::watch::SWEEP_TICK_MS`] after its budget); a connect, once per connection,
//! has a timer.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use monoio::buf::IoBuf;
use monoio::io::AsyncWriteRentExt as _;
use monoio::net::TcpStream;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;

use crate::clock::{Clock as _, MonoClock};
use crate::config::Scheme;
use crate::error::{ErrorKind, GatewayError, TimeoutPhase};
use crate::http1::{self, BodyDecoder, BodyEvent, Decoded, Method, ResponseHead};
use crate::net::dns::DnsCache;
use crate::net::io::{READ_BUF_BYTES, UpStream, read_more};
use crate::net::watch::Watch;
use crate::timer::timeout;

/// The smallest read a response body read asks for. A stream that trickles small
/// pieces (an LLM's events, one every few hundred ms) spends most of its life waiting in a
/// read, holding that read's buffer: 1 KiB rather than [`READ_BUF_BYTES`] per stream. A read
/// that fills its buffer doubles the next one, up to [`READ_BUF_BYTES`].
const BODY_READ_MIN_BYTES: usize = 1024;

/// Bodies up to this size are copied behind the head and sent in one write.
const COALESCE_BODY_BYTES: usize = 16 * 1024;

/// Identity of a reusable upstream connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub scheme: Scheme,
    pub host: Rc<str>,
    pub port: u16,
    /// Which TLS configuration the connection was made with (the provider's CA set).
    pub tls_id: u16,
}

/// An open upstream connection with its read buffer, on the heap: it is handed by value
/// from the pool to the exchange, into the answer's body reader and back to the pool on
/// every request, and inline (144 bytes: the socket, buffer and pool key) each of those
/// hands was a `memcpy`. The box is made once per connection, not per request.
pub struct UpConn(Box<Conn>);

/// What an [`UpConn`] holds (its fields are this module's).
pub struct Conn {
    io: UpStream,
    buf: BytesMut,
    key: PoolKey,
    /// Served at least one earlier request (so a failure may just be a stale socket).
    reused: bool,
    /// The deadlines of its reads (response head, body idle): one slot of its shard's
    /// read sweep for the connection's life, whichever request it serves. The slot keeps
    /// the waker of the last task whose read had to wait (so, while the connection idles in
    /// the pool, that task's allocation, even if its client connection has closed): bounded
    /// by the pool's size, and let go when a later read on the connection has to wait or
    /// the connection closes.
    watch: Watch,
}

impl std::ops::Deref for UpConn {
    type Target = Conn;

    fn deref(&self) -> &Conn {
        &self.0
    }
}

impl std::ops::DerefMut for UpConn {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.0
    }
}

impl UpConn {
    pub fn reused(&self) -> bool {
        self.reused
    }
}

struct Idle {
    conn: UpConn,
    since_ns: u64,
}

/// Hasher of [`PoolKey`]s (word-at-a-time multiply-rotate, as rustc's `FxHasher`). The keys
/// come from the configuration (a provider's scheme, host and port), never from a client,
/// so SipHash's resistance to chosen keys buys nothing here; it was paid on every checkout
/// and every checkin, two hashes of the host name per request.
#[derive(Default)]
struct KeyHasher(u64);

impl KeyHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.add(u64::from_le_bytes(b));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// Per-shard pool of idle keep-alive connections.
pub struct Pool {
    idle: RefCell<HashMap<PoolKey, Vec<Idle>, BuildHasherDefault<KeyHasher>>>,
    max_idle_per_host: usize,
    idle_timeout_ns: u64,
}

impl Pool {
    pub fn new(max_idle_per_host: usize, idle_timeout_ms: u64) -> Self {
        Self {
            idle: RefCell::new(HashMap::default()),
            max_idle_per_host,
            idle_timeout_ns: idle_timeout_ms.saturating_mul(1_000_000),
        }
    }

    /// The most recently used idle connection for `key` that has not expired.
    pub fn checkout(&self, key: &PoolKey, now_ns: u64) -> Option<UpConn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        while let Some(entry) = list.pop() {
            if now_ns.saturating_sub(entry.since_ns) < self.idle_timeout_ns {
                let mut conn = entry.conn;
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    /// Returns a connection whose last response ended cleanly.
    pub fn checkin(&self, conn: UpConn, now_ns: u64) {
        if self.max_idle_per_host == 0 || !conn.buf.is_empty() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(conn.key.clone()).or_default();
        if list.len() >= self.max_idle_per_host {
            list.remove(0);
        }
        list.push(Idle {
            conn,
            since_ns: now_ns,
        });
    }

    /// Closes idle connections past the idle timeout.
    pub fn sweep(&self, now_ns: u64) {
        let timeout = self.idle_timeout_ns;
        self.idle.borrow_mut().retain(|_, list| {
            list.retain(|e| now_ns.saturating_sub(e.since_ns) < timeout);
            !list.is_empty()
        });
    }
}

/// Opens a new connection (DNS, TCP, TLS) within `budget`.
pub async fn connect(
    dns: &DnsCache,
    key: &PoolKey,
    tls: Option<Arc<ClientConfig>>,
    budget: Duration,
    now_ms: u64,
) -> Result<UpConn, GatewayError> {
    // Pinned in place: `timeout` then holds it by reference, not as a second copy.
    let fut = std::pin::pin!(async {
        let addrs = dns
            .resolve(&key.host, key.port, now_ms)
            .await
            .map_err(|e| {
                GatewayError::new(
                    ErrorKind::UpstreamConnect,
                    format!("resolving {}: {e}", key.host),
                )
            })?;
        let mut last = None;
        let mut tcp = None;
        for addr in addrs {
            match TcpStream::connect_addr(addr).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let tcp = tcp.ok_or_else(|| {
            let why = last.map(|e| e.to_string()).unwrap_or_default();
            GatewayError::new(
                ErrorKind::UpstreamConnect,
                format!("connecting to {}:{}: {why}", key.host, key.port),
            )
        })?;
        let _ = tcp.set_nodelay(true);
        let io = match (key.scheme, tls) {
            (Scheme::Http, _) => UpStream::Plain(tcp),
            (Scheme::Https, Some(cfg)) => {
                let bare = key.host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(bare.to_owned()).map_err(|e| {
                    GatewayError::new(ErrorKind::UpstreamConnect, format!("bad TLS name: {e}"))
                })?;
                let connector = monoio_rustls::TlsConnector::from(cfg);
                let s = connector.connect(name, tcp).await.map_err(|e| {
                    GatewayError::new(
                        ErrorKind::UpstreamConnect,
                        format!("TLS handshake with {}: {e}", key.host),
                    )
                })?;
                UpStream::Tls(Box::new(s))
            }
            (Scheme::Https, None) => {
                return Err(GatewayError::new(
                    ErrorKind::Internal,
                    "https upstream without TLS config",
                ));
            }
        };
        Ok(UpConn(Box::new(Conn {
            io,
            buf: BytesMut::with_capacity(READ_BUF_BYTES),
            key: key.clone(),
            reused: false,
            watch: Watch::default(),
        })))
    });
    match timeout(budget, fut).await {
        Ok(r) => r,
        Err(_) => Err(GatewayError::new(
            ErrorKind::UpstreamTimeout(TimeoutPhase::Connect),
            format!(
                "connect to {}:{} took longer than {} ms (server.connect_timeout_ms)",
                key.host,
                key.port,
                budget.as_millis()
            ),
        )),
    }
}

/// A failed exchange, with what the retry decision needs to know.
#[derive(Debug)]
pub struct ExchangeError {
    pub error: GatewayError,
    /// The connection came from the pool (a failure may be a stale socket).
    pub reused: bool,
    /// Some response bytes had arrived (the upstream did see the request).
    pub got_response_bytes: bool,
}

/// An upstream response whose head has arrived; the body is read on demand.
pub struct Response {
    pub head: ResponseHead,
    pub body: BodyReader,
}

/// A request ready for the wire: the encoded head with a small body already behind it (one
/// write), and the rest of the body, if any, written apart. [`exchange`] lends its buffers
/// to the writes and puts them back, so a retry on a fresh connection sends the same bytes
/// again: no copy, and no shared handle to allocate for a clone (`BytesMut::freeze` of a
/// buffer with room to spare boxed one for every request).
#[derive(Debug)]
pub struct Outgoing {
    wire: BytesMut,
    rest: Bytes,
}

impl Outgoing {
    /// Bytes `head` should have room for beyond its own, so a body of `body_len` bytes can be
    /// appended to it without growing the buffer.
    pub fn body_room(body_len: usize) -> usize {
        if body_len <= COALESCE_BODY_BYTES {
            body_len
        } else {
            0
        }
    }

    /// `head` already encoded; `body` framed by its Content-Length.
    pub fn new(mut wire: BytesMut, body: Bytes) -> Self {
        if body.len() <= COALESCE_BODY_BYTES {
            wire.extend_from_slice(&body);
            Self {
                wire,
                rest: Bytes::new(),
            }
        } else {
            Self { wire, rest: body }
        }
    }
}

/// Writes all of `*buf`, lent to the write and put back whatever its outcome (see
/// [`Outgoing`]).
async fn write_lent<T: IoBuf + Default + 'static>(
    io: &mut UpStream,
    buf: &mut T,
) -> std::io::Result<()> {
    let (res, lent) = pin!(io.write_all(std::mem::take(buf))).await;
    *buf = lent;
    res.map(|_| ())
}

/// Sends one request and waits for the response head until `header_at(sent)` (monotonic ns;
/// `sent` is the reading as the request's write ended, so a slow upload does not spend the
/// head's budget; kept by the connection's [`Watch`]). `header_budget` is what a timeout's
/// message names. `request` is as it was afterwards, whatever the outcome (unless the
/// exchange is dropped midway).
pub async fn exchange(
    mut conn: UpConn,
    request: &mut Outgoing,
    header_budget: Duration,
    header_at: impl FnOnce(u64) -> u64,
) -> Result<Response, ExchangeError> {
    let reused = conn.reused;
    let io_err = |e: std::io::Error, got: bool| ExchangeError {
        error: GatewayError::new(ErrorKind::UpstreamProtocol, format!("upstream I/O: {e}")),
        reused,
        got_response_bytes: got,
    };
    write_lent(&mut conn.io, &mut request.wire)
        .await
        .map_err(|e| io_err(e, false))?;
    if !request.rest.is_empty() {
        write_lent(&mut conn.io, &mut request.rest)
            .await
            .map_err(|e| io_err(e, false))?;
    }
    let header_at = header_at(MonoClock.mono_ns());
    let Conn { io, buf, watch, .. } = &mut *conn;
    let read_head = async {
        loop {
            match http1::decode_response_head(buf, Method::Post) {
                Ok(Decoded::Complete(h)) => return Ok(h),
                Ok(Decoded::Partial) => {}
                Err(e) => {
                    return Err(ExchangeError {
                        error: GatewayError::new(
                            ErrorKind::UpstreamProtocol,
                            format!("upstream response head: {e:?}"),
                        ),
                        reused,
                        got_response_bytes: true,
                    });
                }
            }
            let got = !buf.is_empty();
            let (res, b) = read_more(io, std::mem::take(buf), READ_BUF_BYTES).await;
            *buf = b;
            match res {
                Ok(0) => {
                    return Err(ExchangeError {
                        error: GatewayError::new(
                            ErrorKind::UpstreamProtocol,
                            "upstream closed the connection before a complete response head",
                        ),
                        reused,
                        got_response_bytes: got,
                    });
                }
                // An over-long head is reported by decode_response_head on the next turn.
                Ok(_) => {}
                Err(e) => return Err(io_err(e, got)),
            }
        }
    };
    let mut head = match watch.within(header_at, pin!(read_head)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(ExchangeError {
                error: GatewayError::new(
                    ErrorKind::UpstreamTimeout(TimeoutPhase::ResponseHeader),
                    format!(
                        "no response head within {} ms (server.response_header_timeout_ms, per attempt)",
                        header_budget.as_millis()
                    ),
                ),
                reused,
                got_response_bytes: false,
            });
        }
    };
    // The body is read into the same buffer: a head that kept sharing it would make the
    // first body read allocate another one, held for as long as the answer streams.
    head.detach();
    let keep_alive = head.keep_alive();
    let decoder = BodyDecoder::new(head.body_kind());
    Ok(Response {
        head,
        body: BodyReader {
            conn: Some(conn),
            decoder,
            keep_alive,
            done: false,
            read_bytes: BODY_READ_MIN_BYTES,
        },
    })
}

/// What the read buffer holds right now.
#[derive(Debug)]
pub enum Buffered {
    Piece(Bytes),
    /// Nothing decodable without reading more.
    Empty,
    /// The body is complete.
    End,
}

/// Reads a response body piece by piece.
pub struct BodyReader {
    conn: Option<UpConn>,
    decoder: BodyDecoder,
    keep_alive: bool,
    done: bool,
    /// What the next read asks for: [`BODY_READ_MIN_BYTES`] to [`READ_BUF_BYTES`],
    /// following what the reads before it returned.
    read_bytes: usize,
}

impl BodyReader {
    /// The next piece of body, `None` at the end. Each wait for bytes is bounded by `idle`.
    pub async fn next(&mut self, idle: Duration) -> Result<Option<Bytes>, GatewayError> {
        if self.done {
            return Ok(None);
        }
        let Some(conn) = self.conn.as_mut() else {
            // An earlier failure dropped the connection before the body ended.
            return Err(GatewayError::new(
                ErrorKind::UpstreamProtocol,
                "upstream body failed",
            ));
        };
        loop {
            match self.decoder.decode(&mut conn.buf) {
                Ok(BodyEvent::Data(b)) => return Ok(Some(b)),
                Ok(BodyEvent::Done) => {
                    self.done = true;
                    return Ok(None);
                }
                Ok(BodyEvent::NeedMore) => {}
                Err(e) => {
                    self.conn = None;
                    return Err(GatewayError::new(
                        ErrorKind::UpstreamProtocol,
                        format!("upstream body: {e:?}"),
                    ));
                }
            }
            let want = self.read_bytes;
            let mut buf = std::mem::take(&mut conn.buf);
            // An empty buffer larger than this read needs (the head's, or one grown for a
            // burst) is let go: the wait takes one of the size it asks for.
            if buf.is_empty() && buf.capacity() > 2 * want {
                buf = BytesMut::new();
            }
            let got = {
                let c = &mut **conn;
                let read = pin!(read_more(&mut c.io, buf, want));
                c.watch.within_for(idle, read).await
            };
            let (res, buf) = match got {
                Ok(r) => r,
                Err(_) => {
                    self.conn = None;
                    return Err(GatewayError::new(
                        ErrorKind::UpstreamTimeout(TimeoutPhase::BodyIdle),
                        format!(
                            "upstream body idle for {} ms (server.body_idle_timeout_ms)",
                            idle.as_millis()
                        ),
                    ));
                }
            };
            conn.buf = buf;
            match res {
                Ok(0) => {
                    return match self.decoder.on_eof() {
                        Ok(()) => {
                            self.done = true;
                            self.keep_alive = false;
                            Ok(None)
                        }
                        Err(e) => {
                            self.conn = None;
                            Err(GatewayError::new(
                                ErrorKind::UpstreamProtocol,
                                format!("upstream closed mid-body: {e:?}"),
                            ))
                        }
                    };
                }
                Ok(n) => {
                    self.read_bytes = if n >= want {
                        (want * 2).min(READ_BUF_BYTES)
                    } else if n < want / 4 {
                        (want / 2).max(BODY_READ_MIN_BYTES)
                    } else {
                        want
                    };
                }
                Err(e) => {
                    self.conn = None;
                    return Err(GatewayError::new(
                        ErrorKind::UpstreamProtocol,
                        format!("upstream body read: {e}"),
                    ));
                }
            }
        }
    }

    /// The next piece already in the read buffer, without waiting for the network — lets
    /// the relay write everything that arrived together in one write.
    pub fn next_buffered(&mut self) -> Result<Buffered, GatewayError> {
        if self.done {
            return Ok(Buffered::End);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Buffered::End);
        };
        match self.decoder.decode(&mut conn.buf) {
            Ok(BodyEvent::Data(b)) => Ok(Buffered::Piece(b)),
            Ok(BodyEvent::Done) => {
                self.done = true;
                Ok(Buffered::End)
            }
            Ok(BodyEvent::NeedMore) => Ok(Buffered::Empty),
            Err(e) => {
                self.conn = None;
                Err(GatewayError::new(
                    ErrorKind::UpstreamProtocol,
                    format!("upstream body: {e:?}"),
                ))
            }
        }
    }

    /// Bytes read but not yet handed out (body framing included): at least as many as
    /// [`BodyReader::next_buffered`] can still hand out without a read.
    pub fn buffered_len(&self) -> usize {
        match &self.conn {
            Some(conn) if !self.done => conn.buf.len(),
            _ => 0,
        }
    }

    /// The connection, if the response ended cleanly and it may carry another request.
    pub fn into_reusable(self) -> Option<UpConn> {
        if self.done && self.keep_alive {
            self.conn
        } else {
            None
        }
    }
}
