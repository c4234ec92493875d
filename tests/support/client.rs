//! A small blocking HTTP/1.1 client over a std `TcpStream`, raw enough to send malformed or
//! pipelined bytes and to watch a streamed body arrive piece by piece. Every read is bounded by
//! a timeout.
//!
//! ```ignore
//! let mut c = Client::connect(gw.addr());
//! let r = c.request("POST", "/v1/chat/completions", &[("authorization", "Bearer k")], body);
//! assert_eq!(r.status, 200);
//!
//! c.start_request("POST", "/v1/chat/completions", &headers, stream_body);
//! let head = c.read_head();
//! while let Piece::Data(bytes) = c.next_body_piece(secs(2)) { /* ... */ }
//! ```

use super::Deadline;
use super::wire::{self, ChunkStep, Framing};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Default bound on any one read (head, body, close).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A complete response.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// Headers in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
    /// The body bytes as they were on the wire (chunk framing included).
    pub raw_body: Vec<u8>,
    pub chunked: bool,
}

impl Response {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }

    pub fn header_all(&self, name: &str) -> Vec<&str> {
        wire::header_all(&self.headers, name)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON; panics with the body if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "response {} body is not JSON ({e}): {:?}",
                self.status,
                self.text()
            )
        })
    }

    /// The SSE events of the body.
    pub fn sse_events(&self) -> Vec<SseEvent> {
        parse_sse(&self.body)
    }
}

/// A response head, read before its body.
#[derive(Clone, Debug)]
pub struct Head {
    pub status: u16,
    pub reason: String,
    pub version: u8,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }
}

/// What [`Client::next_body_piece`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Body bytes (de-chunked): everything complete that had arrived.
    Data(Vec<u8>),
    /// The body ended properly (last chunk, full length, or close for a close-delimited body).
    End,
    /// Nothing new within the timeout.
    Timeout,
    /// The connection closed or reset before the body ended.
    Closed,
}

#[derive(Clone, Copy, Debug)]
enum BodyState {
    Length(u64),
    Chunked,
    UntilClose,
    Done,
}

/// One connection, kept for keep-alive and pipelining.
pub struct Client {
    stream: TcpStream,
    addr: SocketAddr,
    /// Received bytes not yet consumed.
    buf: Vec<u8>,
    timeout: Duration,
    /// Methods of requests sent and not yet answered (a HEAD answer has no body).
    pending_methods: VecDeque<String>,
    body: BodyState,
    raw_body: Vec<u8>,
}

impl Client {
    /// Connects (bounded by 5 s); panics on failure.
    pub fn connect(addr: SocketAddr) -> Client {
        Client::try_connect(addr).unwrap_or_else(|e| panic!("client: connect to {addr}: {e}"))
    }

    pub fn try_connect(addr: SocketAddr) -> io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            addr,
            buf: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            pending_methods: VecDeque::new(),
            body: BodyState::Done,
            raw_body: Vec::new(),
        })
    }

    /// Changes the bound on reads (default [`DEFAULT_TIMEOUT`]).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The local address of this connection (to tell connections apart in logs).
    pub fn local_addr(&self) -> SocketAddr {
        self.stream.local_addr().expect("client: local_addr")
    }

    /// Bytes this client wrote that the gateway has not read from its socket yet: the
    /// receive queue of the gateway's end of this connection, from `/proc/net/tcp` (Linux,
    /// IPv4). `None` when the kernel lists no such connection (closed, or not IPv4).
    pub fn unread_by_server(&self) -> Option<u64> {
        let (SocketAddr::V4(server), SocketAddr::V4(client)) = (self.addr, self.local_addr())
        else {
            return None;
        };
        let hex = |a: std::net::SocketAddrV4| {
            format!(
                "{:08X}:{:04X}",
                u32::from_ne_bytes(a.ip().octets()),
                a.port()
            )
        };
        let (local, remote) = (hex(server), hex(client));
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        table.lines().skip(1).find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 5 || f[1] != local || f[2] != remote {
                return None;
            }
            let (_tx, rx) = f[4].split_once(':')?;
            u64::from_str_radix(rx, 16).ok()
        })
    }

    /// Writes `bytes` as they are.
    pub fn write_raw(&mut self, bytes: &[u8]) {
        self.try_write_raw(bytes)
            .unwrap_or_else(|e| panic!("client: write to {}: {e}", self.addr));
    }

    pub fn try_write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Sends a request without reading the answer (for streaming and pipelining). Adds `Host`
    /// and `Content-Length` unless `headers` has them (or `Transfer-Encoding`).
    pub fn start_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) {
        let bytes = encode_request(self.addr, method, path, headers, body);
        self.pending_methods.push_back(method.to_string());
        self.write_raw(&bytes);
    }

    /// Sends a request and reads its whole response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.start_request(method, path, headers, body);
        self.read_response()
    }

    /// Reads the next whole response; panics if the connection ends first or a read times out.
    pub fn read_response(&mut self) -> Response {
        self.try_read_response()
            .unwrap_or_else(|e| panic!("client: reading response from {}: {e}", self.addr))
    }

    pub fn try_read_response(&mut self) -> io::Result<Response> {
        let head = self.try_read_head()?;
        let chunked = matches!(self.body, BodyState::Chunked);
        let mut body = Vec::new();
        loop {
            match self.next_body_piece(self.timeout) {
                Piece::Data(bytes) => body.extend_from_slice(&bytes),
                Piece::End => break,
                Piece::Timeout => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "body of {} not complete after {:?}",
                            head.status, self.timeout
                        ),
                    ));
                }
                Piece::Closed => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "connection closed mid-body of {} after {} body bytes",
                            head.status,
                            body.len()
                        ),
                    ));
                }
            }
        }
        Ok(Response {
            status: head.status,
            reason: head.reason,
            version: head.version,
            headers: head.headers,
            body,
            raw_body: std::mem::take(&mut self.raw_body),
            chunked,
        })
    }

    /// Reads the next response head (skipping `1xx` interim ones); its body is then read with
    /// [`next_body_piece`](Self::next_body_piece).
    pub fn read_head(&mut self) -> Head {
        self.try_read_head()
            .unwrap_or_else(|e| panic!("client: reading head from {}: {e}", self.addr))
    }

    pub fn try_read_head(&mut self) -> io::Result<Head> {
        let deadline = Deadline::after(self.timeout);
        loop {
            if let Some((head, used)) = parse_head(&self.buf)? {
                self.buf.drain(..used);
                if (100..200).contains(&head.status) && head.status != 101 {
                    continue;
                }
                let method = self.pending_methods.pop_front().unwrap_or_default();
                let no_body = method.eq_ignore_ascii_case("HEAD")
                    || head.status == 204
                    || head.status == 304
                    || head.status == 101;
                self.body = if no_body {
                    BodyState::Length(0)
                } else {
                    match wire::framing(&head.headers, true)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
                    {
                        Framing::Length(n) => BodyState::Length(n),
                        Framing::Chunked => BodyState::Chunked,
                        Framing::UntilClose => BodyState::UntilClose,
                    }
                };
                self.raw_body.clear();
                return Ok(head);
            }
            match self.read_more(deadline)? {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "connection closed before a response head ({} bytes: {:?})",
                            self.buf.len(),
                            String::from_utf8_lossy(&self.buf)
                        ),
                    ));
                }
                _ => continue,
            }
        }
    }

    /// Waits up to `timeout` for more of the current body: everything complete that has
    /// arrived comes back as one `Data`. Call after [`read_head`](Self::read_head).
    pub fn next_body_piece(&mut self, timeout: Duration) -> Piece {
        let deadline = Deadline::after(timeout);
        loop {
            match self.take_body() {
                Ok(Some(piece)) => return piece,
                Ok(None) => {}
                Err(_) => return Piece::Closed,
            }
            match self.read_more(deadline) {
                Ok(0) => {
                    return match self.body {
                        BodyState::UntilClose => {
                            self.body = BodyState::Done;
                            Piece::End
                        }
                        _ => Piece::Closed,
                    };
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Piece::Timeout,
                Err(_) => return Piece::Closed,
            }
        }
    }

    /// What the buffer holds of the current body, if anything.
    fn take_body(&mut self) -> io::Result<Option<Piece>> {
        match self.body {
            BodyState::Done => Ok(Some(Piece::End)),
            BodyState::Length(0) => {
                self.body = BodyState::Done;
                Ok(Some(Piece::End))
            }
            BodyState::Length(left) => {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(self.buf.len());
                let data: Vec<u8> = self.buf.drain(..n).collect();
                self.raw_body.extend_from_slice(&data);
                self.body = BodyState::Length(left - n as u64);
                Ok(Some(Piece::Data(data)))
            }
            BodyState::UntilClose => {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let data = std::mem::take(&mut self.buf);
                self.raw_body.extend_from_slice(&data);
                Ok(Some(Piece::Data(data)))
            }
            BodyState::Chunked => {
                let mut data = Vec::new();
                let mut at = 0;
                let mut ended = false;
                loop {
                    match wire::next_chunk(&self.buf[at..])
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
                    {
                        None => break,
                        Some(ChunkStep::Data(bytes, used)) => {
                            data.extend_from_slice(&bytes);
                            at += used;
                        }
                        Some(ChunkStep::End(used)) => {
                            at += used;
                            ended = true;
                            break;
                        }
                    }
                }
                self.raw_body.extend(self.buf.drain(..at));
                if ended {
                    self.body = BodyState::Done;
                }
                Ok(match (data.is_empty(), ended) {
                    (false, _) => Some(Piece::Data(data)),
                    (true, true) => Some(Piece::End),
                    (true, false) => None,
                })
            }
        }
    }

    /// Reads everything until the peer closes (FIN or reset) and returns it, including
    /// anything already buffered; panics if it has not closed within `timeout`.
    pub fn read_until_close(&mut self, timeout: Duration) -> Vec<u8> {
        let deadline = Deadline::after(timeout);
        loop {
            match self.read_more(deadline) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::TimedOut => panic!(
                    "client: {} did not close within {timeout:?}; got {:?}",
                    self.addr,
                    String::from_utf8_lossy(&self.buf)
                ),
                Err(_) => break,
            }
        }
        self.body = BodyState::Done;
        std::mem::take(&mut self.buf)
    }

    /// Whether the peer closes the connection within `timeout` without sending anything more.
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        match self.read_more(Deadline::after(timeout)) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::TimedOut,
        }
    }

    /// One read into the buffer, bounded by `deadline`: `Ok(0)` at end of stream, `TimedOut`
    /// when the deadline passes.
    fn read_more(&mut self, deadline: Deadline) -> io::Result<usize> {
        let mut scratch = [0u8; 16 * 1024];
        loop {
            let left = deadline.remaining();
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "read timed out"));
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut scratch) {
                Ok(n) => {
                    self.buf.extend_from_slice(&scratch[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "read timed out"));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn encode_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    if !has("host") {
        head.push_str(&format!("host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let bodyless_method = matches!(method, "GET" | "HEAD" | "DELETE" | "OPTIONS");
    if !has("content-length") && !has("transfer-encoding") && (!body.is_empty() || !bodyless_method)
    {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn parse_head(buf: &[u8]) -> io::Result<Option<(Head, usize)>> {
    let mut header_space = [httparse::EMPTY_HEADER; wire::MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut header_space);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(used)) => Ok(Some((
            Head {
                status: resp.code.unwrap_or_default(),
                reason: resp.reason.unwrap_or_default().to_string(),
                version: resp.version.unwrap_or(1),
                headers: wire::to_pairs(resp.headers),
            },
            used,
        ))),
        Ok(httparse::Status::Partial) if buf.len() > wire::MAX_HEAD_BYTES => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "response head too large",
        )),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "malformed response head ({e}): {:?}",
                String::from_utf8_lossy(&buf[..buf.len().min(512)])
            ),
        )),
    }
}

/// Connects, writes `bytes` as they are and reads one response.
pub fn send_raw(addr: SocketAddr, bytes: &[u8]) -> Response {
    let mut client = Client::connect(addr);
    client.write_raw(bytes);
    client.read_response()
}

/// `POST path` with `Authorization: Bearer key` and a JSON body, on a new connection.
pub fn json_post(addr: SocketAddr, path: &str, key: &str, json: &serde_json::Value) -> Response {
    let auth = format!("Bearer {key}");
    let body = json.to_string();
    Client::connect(addr).request(
        "POST",
        path,
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    )
}

/// One server-sent event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    pub id: Option<String>,
}

impl SseEvent {
    /// The data parsed as JSON; panics if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {:?}", self.data))
    }
}

/// Splits an SSE body into events (LF or CRLF line ends; comments skipped; an incomplete last
/// event is dropped).
pub fn parse_sse(body: &[u8]) -> Vec<SseEvent> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    let mut events = Vec::new();
    let mut current = SseEvent::default();
    let mut has_data = false;
    let mut rest = text.as_str();
    while let Some(nl) = rest.find('\n') {
        let line = &rest[..nl];
        rest = &rest[nl + 1..];
        if line.is_empty() {
            if has_data || current.event.is_some() {
                events.push(std::mem::take(&mut current));
            }
            has_data = false;
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line, ""),
        };
        match field {
            "event" => current.event = Some(value.to_string()),
            "data" => {
                if has_data {
                    current.data.push('\n');
                }
                current.data.push_str(value);
                has_data = true;
            }
            "id" => current.id = Some(value.to_string()),
            _ => {}
        }
    }
    events
}
