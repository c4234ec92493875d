//! `MockUpstream`: a real HTTP/1.1 server on 127.0.0.1 that stands in for an LLM provider and
//! plays scripted replies per path, so a test can make the gateway's upstream fail, throttle,
//! stall or stream exactly as it needs, and then look at what the gateway sent.
//!
//! Plain std threads: one accepts, one serves each connection (keep-alive; pipelined requests are
//! answered in order). Optional TLS with a CA made per mock. Dropping the mock stops every
//! thread and releases stalled replies.
//!
//! ```ignore
//! let mock = MockUpstream::start();
//! mock.on("/v1/chat/completions", Reply::status(429).header("retry-after", "1"))
//!     .on_always("/v1/chat/completions", Reply::openai_chat("hi"));
//! // ... point the gateway at mock.base_url(), send requests ...
//! mock.wait_for_hits("/v1/chat/completions", 2, secs(5));
//! assert_eq!(mock.requests()[0].header("authorization"), Some("Bearer upstream-key"));
//! ```

use super::wire::{self, Framing};
use super::{Deadline, TempDir};
use bytes::Bytes;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a connection thread that is delaying or held by a gate looks at its socket, the
/// gate and the shutdown flag.
const POLL: Duration = Duration::from_millis(10);
/// The same while idle or stalled, when only a peer hang-up (which wakes the read at once) or
/// the shutdown (which shuts the socket down, waking it too) can end the wait: the flag check is
/// a safety net, so it need not be frequent.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// Replies

/// What the mock does with one request. Build with a constructor, refine with the builder
/// methods: `Reply::status(503).header("retry-after", "2").delay_ms(100)`.
#[derive(Clone, Debug)]
pub struct Reply {
    delay: Duration,
    gate: Option<Gate>,
    action: Action,
    close_after: bool,
}

#[derive(Clone, Debug)]
enum Action {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Body,
    },
    StallBeforeHead,
    Reset,
    Close,
}

#[derive(Clone, Debug)]
enum Body {
    /// Sent with `Content-Length` (unless the script set its own framing header).
    Full(Bytes),
    /// Sent with `Transfer-Encoding: chunked`, one HTTP chunk per step, flushed each time.
    Chunked(Vec<Chunk>),
}

impl Reply {
    /// A response with this status, no headers of its own and an empty body.
    pub fn status(code: u16) -> Reply {
        Reply {
            delay: Duration::ZERO,
            gate: None,
            action: Action::Respond {
                status: code,
                headers: Vec::new(),
                body: Body::Full(Bytes::new()),
            },
            close_after: false,
        }
    }

    /// A JSON response (`Content-Type: application/json`).
    pub fn json(code: u16, body: serde_json::Value) -> Reply {
        Reply::status(code)
            .header("content-type", "application/json")
            .body(body.to_string())
    }

    /// An OpenAI-style error body: `{"error":{"message","type","code"}}`.
    pub fn error(code: u16, message: &str) -> Reply {
        let kind = match code {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            _ => "api_error",
        };
        Reply::json(
            code,
            serde_json::json!({"error": {"message": message, "type": kind, "code": code}}),
        )
    }

    /// A `text/event-stream` response sent chunked, one HTTP chunk per [`Chunk`], flushed
    /// between them.
    pub fn sse(chunks: Vec<Chunk>) -> Reply {
        Reply::status(200)
            .header("content-type", "text/event-stream")
            .header("cache-control", "no-cache")
            .with_body(Body::Chunked(chunks))
    }

    /// A 200 response sent chunked, one HTTP chunk per part.
    pub fn chunked<I, T>(parts: I) -> Reply
    where
        I: IntoIterator<Item = T>,
        T: AsRef<[u8]>,
    {
        let chunks = parts.into_iter().map(Chunk::raw).collect();
        Reply::status(200).with_body(Body::Chunked(chunks))
    }

    /// Sends a 200 `text/event-stream` head (chunked) and then nothing, until the peer closes
    /// or the mock is dropped.
    pub fn stall() -> Reply {
        Reply::sse(vec![Chunk::stall()])
    }

    /// Sends nothing at all, until the peer closes or the mock is dropped.
    pub fn stall_before_head() -> Reply {
        Reply::with_action(Action::StallBeforeHead)
    }

    /// Resets the connection (RST, via `SO_LINGER` 0) without answering.
    pub fn reset() -> Reply {
        Reply::with_action(Action::Reset)
    }

    /// Closes the connection (FIN) without answering.
    pub fn close() -> Reply {
        Reply::with_action(Action::Close)
    }

    /// An OpenAI chat completion whose assistant message is `content`.
    pub fn openai_chat(content: &str) -> Reply {
        Reply::json(
            200,
            serde_json::json!({
                "id": "chatcmpl-mock",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": "mock-model",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop"
                }],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
            }),
        )
    }

    /// An OpenAI chat completion stream of `pieces`, ending with `data: [DONE]`.
    pub fn openai_stream(pieces: &[&str]) -> Reply {
        Reply::sse(openai_stream_chunks(pieces))
    }

    /// An Anthropic message whose text content is `text`.
    pub fn anthropic_message(text: &str) -> Reply {
        Reply::json(
            200,
            serde_json::json!({
                "id": "msg_mock",
                "type": "message",
                "role": "assistant",
                "model": "mock-model",
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn",
                "stop_sequence": null,
                "usage": {"input_tokens": 3, "output_tokens": 2}
            }),
        )
    }

    /// An Anthropic message stream (`message_start` … `message_stop`) of `pieces`.
    pub fn anthropic_stream(pieces: &[&str]) -> Reply {
        Reply::sse(anthropic_stream_chunks(pieces))
    }

    /// Adds a response header (ignored by replies that send no head).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        if let Action::Respond { headers, .. } = &mut self.action {
            headers.push((name.to_string(), value.to_string()));
        }
        self
    }

    /// Replaces the body with `body`, sent with `Content-Length`. If the script set
    /// `Content-Length` or `Transfer-Encoding` itself, the body is written verbatim instead, so
    /// a test can send a lying length or hand-made chunks.
    pub fn body(self, body: impl AsRef<[u8]>) -> Reply {
        self.with_body(Body::Full(Bytes::copy_from_slice(body.as_ref())))
    }

    /// Changes the status code.
    pub fn with_status(mut self, code: u16) -> Reply {
        if let Action::Respond { status, .. } = &mut self.action {
            *status = code;
        }
        self
    }

    /// Waits this long after the request arrived before doing anything.
    pub fn delay_ms(mut self, ms: u64) -> Reply {
        self.delay = Duration::from_millis(ms);
        self
    }

    /// Holds the reply (after any delay) until `gate` is opened, the peer hangs up or the mock
    /// is dropped: a test decides when the upstream answers, with no timing involved.
    pub fn wait_for(mut self, gate: &Gate) -> Reply {
        self.gate = Some(gate.clone());
        self
    }

    /// Answers with `Connection: close` and closes the connection afterwards.
    pub fn close_after(mut self) -> Reply {
        self.close_after = true;
        self.header("connection", "close")
    }

    fn with_action(action: Action) -> Reply {
        Reply {
            delay: Duration::ZERO,
            gate: None,
            action,
            close_after: false,
        }
    }

    fn with_body(mut self, new_body: Body) -> Reply {
        if let Action::Respond { body, .. } = &mut self.action {
            *body = new_body;
        }
        self
    }
}

/// One step of a chunked reply: bytes sent as one HTTP chunk and flushed, or a pause, or an
/// abrupt end.
#[derive(Clone, Debug)]
pub struct Chunk(Step);

#[derive(Clone, Debug)]
enum Step {
    Bytes(Bytes),
    Delay(Duration),
    Gate(Gate),
    Stall,
    Reset,
    Close,
}

impl Chunk {
    /// An SSE event with only data: `data: <text>\n\n` (one `data:` line per line of `text`).
    pub fn data(text: &str) -> Chunk {
        Chunk::raw(sse_event(None, text))
    }

    /// An SSE event with a name: `event: <name>\ndata: <data>\n\n`.
    pub fn event(name: &str, data: &str) -> Chunk {
        Chunk::raw(sse_event(Some(name), data))
    }

    /// `data: <value as JSON>\n\n`.
    pub fn json(value: serde_json::Value) -> Chunk {
        Chunk::data(&value.to_string())
    }

    /// `data: [DONE]\n\n`, the OpenAI end-of-stream marker.
    pub fn done() -> Chunk {
        Chunk::data("[DONE]")
    }

    /// These bytes as one HTTP chunk.
    pub fn raw(bytes: impl AsRef<[u8]>) -> Chunk {
        Chunk(Step::Bytes(Bytes::copy_from_slice(bytes.as_ref())))
    }

    /// A pause before the next step.
    pub fn delay_ms(ms: u64) -> Chunk {
        Chunk(Step::Delay(Duration::from_millis(ms)))
    }

    /// Sends nothing more until `gate` is opened (or the peer closes, or the mock is dropped).
    pub fn wait_for(gate: &Gate) -> Chunk {
        Chunk(Step::Gate(gate.clone()))
    }

    /// Sends nothing more, until the peer closes or the mock is dropped.
    pub fn stall() -> Chunk {
        Chunk(Step::Stall)
    }

    /// Resets the connection mid-body (RST).
    pub fn reset() -> Chunk {
        Chunk(Step::Reset)
    }

    /// Closes the connection mid-body (FIN, no last chunk): a truncated response.
    pub fn close() -> Chunk {
        Chunk(Step::Close)
    }

    /// One OpenAI chat-completion chunk carrying `text` as content delta.
    pub fn openai_delta(text: &str) -> Chunk {
        Chunk::json(openai_chunk(serde_json::json!({"content": text}), None))
    }
}

/// A latch a test opens to let a held reply or chunk go on ([`Reply::wait_for`],
/// [`Chunk::wait_for`]). Clones share the latch; once open it stays open.
#[derive(Clone, Debug, Default)]
pub struct Gate(Arc<AtomicBool>);

impl Gate {
    pub fn new() -> Gate {
        Gate::default()
    }

    pub fn open(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

fn sse_event(name: Option<&str>, data: &str) -> String {
    let mut out = String::new();
    if let Some(name) = name {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

fn openai_chunk(delta: serde_json::Value, finish: Option<&str>) -> serde_json::Value {
    serde_json::json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "mock-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    })
}

/// The steps of an OpenAI chat stream: a role delta, one content delta per piece, a
/// `finish_reason: "stop"` chunk and `data: [DONE]`. Edit the list to truncate or break it.
pub fn openai_stream_chunks(pieces: &[&str]) -> Vec<Chunk> {
    let mut chunks = vec![Chunk::json(openai_chunk(
        serde_json::json!({"role": "assistant", "content": ""}),
        None,
    ))];
    chunks.extend(pieces.iter().map(|p| Chunk::openai_delta(p)));
    chunks.push(Chunk::json(openai_chunk(
        serde_json::json!({}),
        Some("stop"),
    )));
    chunks.push(Chunk::done());
    chunks
}

/// The steps of an Anthropic message stream: `message_start`, `content_block_start`, one
/// `content_block_delta` per piece, `content_block_stop`, `message_delta` (end_turn),
/// `message_stop`.
pub fn anthropic_stream_chunks(pieces: &[&str]) -> Vec<Chunk> {
    let event = |name: &str, v: serde_json::Value| Chunk::event(name, &v.to_string());
    let mut chunks = vec![
        event(
            "message_start",
            serde_json::json!({"type": "message_start", "message": {
                "id": "msg_mock", "type": "message", "role": "assistant", "model": "mock-model",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 3, "output_tokens": 0}
            }}),
        ),
        event(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    for piece in pieces {
        chunks.push(event(
            "content_block_delta",
            serde_json::json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    chunks.push(event(
        "content_block_stop",
        serde_json::json!({"type": "content_block_stop", "index": 0}),
    ));
    chunks.push(event(
        "message_delta",
        serde_json::json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": pieces.len()}}),
    ));
    chunks.push(event(
        "message_stop",
        serde_json::json!({"type": "message_stop"}),
    ));
    chunks
}

// ---------------------------------------------------------------------------------------------
// Recorded requests

/// A request as the mock received it, body decoded (Content-Length or chunked).
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// Which TCP connection it came on (1, 2, … in accept order).
    pub connection: u64,
    pub method: String,
    /// The request target as sent, query included.
    pub target: String,
    /// The target without its query: what replies are scripted by.
    pub path: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub version: u8,
    /// Headers in order, names as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When the mock had read it whole.
    pub at: std::time::Instant,
}

impl RecordedRequest {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }

    /// Every value of header `name` (case-insensitive).
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        wire::header_all(&self.headers, name)
    }

    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON; panics if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} {} body is not JSON ({e}): {:?}",
                self.method,
                self.target,
                self.text()
            )
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The server

/// A scripted HTTP/1.1 upstream on 127.0.0.1. See the module docs.
pub struct MockUpstream {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tls: Option<TlsFiles>,
    accept: Option<JoinHandle<()>>,
}

struct TlsFiles {
    ca_pem: String,
    dir: TempDir,
}

struct Shared {
    state: Mutex<State>,
    /// Notified whenever `State::generation` moves.
    changed: Condvar,
    tls: Option<Arc<rustls::ServerConfig>>,
}

#[derive(Default)]
struct State {
    /// Bumped on every observable change, so waiters never miss one.
    generation: u64,
    shutting_down: bool,
    routes: HashMap<String, Route>,
    requests: Vec<RecordedRequest>,
    problems: Vec<String>,
    connections_accepted: u64,
    open_connections: usize,
    in_flight: usize,
    peak_in_flight: usize,
    /// (received, reply finished) of every request answered in full.
    answered: Vec<(std::time::Instant, std::time::Instant)>,
    /// A second handle on every open socket, to shut it down when the mock is dropped.
    sockets: HashMap<u64, TcpStream>,
    /// Set by [`MockUpstream::read_bodies_late`]: how long a connection waits between a
    /// request's head and the rest of its body.
    body_read_pause: Option<Duration>,
    workers: Vec<JoinHandle<()>>,
}

#[derive(Default)]
struct Route {
    queue: VecDeque<Reply>,
    always: Option<Reply>,
}

impl State {
    fn touch(&mut self, shared: &Shared) {
        self.generation += 1;
        shared.changed.notify_all();
    }
}

impl MockUpstream {
    /// Starts a plain-HTTP mock on 127.0.0.1 with an OS-chosen port.
    pub fn start() -> MockUpstream {
        MockUpstream::launch(None)
    }

    /// Starts an HTTPS mock whose certificate (for `localhost` and `127.0.0.1`) is signed by a
    /// CA made for this mock; give the gateway [`ca_pem_path`](Self::ca_pem_path) to trust it.
    pub fn start_tls() -> MockUpstream {
        let (config, ca_pem) = tls_material();
        MockUpstream::launch(Some((config, ca_pem)))
    }

    /// Starts a plain-HTTP mock on `listener`, e.g. a [`RefusingPort`](super::RefusingPort)
    /// turned listening, so the gateway first finds the port refusing connections and then
    /// this mock (a port reserved and released instead could be taken by another process in
    /// between).
    pub fn start_on(listener: TcpListener) -> MockUpstream {
        MockUpstream::launch_on(listener, None)
    }

    fn launch(tls: Option<(Arc<rustls::ServerConfig>, String)>) -> MockUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("mock upstream: bind 127.0.0.1:0: {e}"));
        MockUpstream::launch_on(listener, tls)
    }

    fn launch_on(
        listener: TcpListener,
        tls: Option<(Arc<rustls::ServerConfig>, String)>,
    ) -> MockUpstream {
        let addr = listener.local_addr().expect("mock upstream: local_addr");
        let (tls_config, tls_files) = match tls {
            Some((config, ca_pem)) => (
                Some(config),
                Some(TlsFiles {
                    ca_pem,
                    dir: TempDir::new("mock-ca"),
                }),
            ),
            None => (None, None),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            tls: tls_config,
        });
        let accept_shared = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name(format!("mock-accept-{}", addr.port()))
            .spawn(move || accept_loop(&accept_shared, &listener))
            .expect("mock upstream: spawn accept thread");
        MockUpstream {
            shared,
            addr,
            tls: tls_files,
            accept: Some(accept),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, or `https://localhost:PORT` for a TLS mock.
    pub fn origin(&self) -> String {
        match self.tls {
            Some(_) => format!("https://localhost:{}", self.addr.port()),
            None => format!("http://{}", self.addr),
        }
    }

    /// The provider `base_url` to configure: [`origin`](Self::origin) + `/v1`.
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.origin())
    }

    /// [`origin`](Self::origin) + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.origin())
    }

    /// The CA certificate (PEM) of a TLS mock; panics for a plain one.
    pub fn ca_pem(&self) -> &str {
        &self.tls_files().ca_pem
    }

    /// Writes the CA certificate to a file that lives as long as the mock and returns its path.
    pub fn ca_pem_path(&self) -> PathBuf {
        let files = self.tls_files();
        files.dir.write("ca.pem", &files.ca_pem)
    }

    fn tls_files(&self) -> &TlsFiles {
        self.tls
            .as_ref()
            .expect("this MockUpstream was started without TLS (use MockUpstream::start_tls)")
    }

    /// Queues `reply` for the next request to `path` (the target without its query); queued
    /// replies are used in order, each once.
    pub fn on(&self, path: &str, reply: Reply) -> &MockUpstream {
        let mut state = self.lock();
        state
            .routes
            .entry(path.to_string())
            .or_default()
            .queue
            .push_back(reply);
        self
    }

    /// Sets the reply used for `path` whenever its queue is empty. Without one, an unscripted
    /// request gets a 404 JSON error and is listed in [`problems`](Self::problems).
    pub fn on_always(&self, path: &str, reply: Reply) -> &MockUpstream {
        let mut state = self.lock();
        state.routes.entry(path.to_string()).or_default().always = Some(reply);
        self
    }

    /// From now on, every connection waits `pause` after a request's head arrived before it
    /// reads any more of that request, with a small receive buffer: an upstream that reads its
    /// request slowly, so a gateway's write of a large body takes about `pause` to finish.
    pub fn read_bodies_late(&self, pause: Duration) -> &MockUpstream {
        self.lock().body_read_pause = Some(pause);
        self
    }

    /// Requests received for `path` (target without query).
    pub fn hits(&self, path: &str) -> usize {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    pub fn total_hits(&self) -> usize {
        self.lock().requests.len()
    }

    /// TCP connections accepted so far.
    pub fn connections_accepted(&self) -> usize {
        usize::try_from(self.lock().connections_accepted).unwrap_or(usize::MAX)
    }

    /// TCP connections open right now.
    pub fn open_connections(&self) -> usize {
        self.lock().open_connections
    }

    /// Every request received, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// The requests received for `path`, in arrival order.
    pub fn requests_to(&self, path: &str) -> Vec<RecordedRequest> {
        self.lock()
            .requests
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Requests being answered right now: received in full, reply not yet finished (a delayed,
    /// streaming or stalled reply counts until it ends or its peer hangs up).
    pub fn current_in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// The most requests ever in flight at once.
    pub fn peak_concurrency(&self) -> usize {
        self.lock().peak_in_flight
    }

    /// The most requests ever in flight at once, counting only requests answered in full.
    /// A request whose caller hung up (the gateway cancels it and frees its slot at once)
    /// still counts in [`Self::peak_concurrency`] until this mock notices the closed socket,
    /// up to one `POLL` later; here it does not count at all.
    pub fn peak_answered_concurrency(&self) -> usize {
        let state = self.lock();
        let mut events: Vec<(std::time::Instant, i32)> = Vec::new();
        for (start, end) in &state.answered {
            events.push((*start, 1));
            events.push((*end, -1));
        }
        // Ends sort before starts at the same instant.
        events.sort();
        let (mut now, mut peak) = (0i32, 0i32);
        for (_, d) in events {
            now += d;
            peak = peak.max(now);
        }
        usize::try_from(peak).unwrap_or(0)
    }

    /// What the mock could not serve as scripted: malformed requests, TLS failures, requests
    /// nothing was scripted for. Empty in a healthy test.
    pub fn problems(&self) -> Vec<String> {
        self.lock().problems.clone()
    }

    /// Waits until `path` has had at least `n` requests; panics after `timeout`.
    pub fn wait_for_hits(&self, path: &str, n: usize, timeout: Duration) {
        self.wait_until(timeout, &format!("{n} hits on {path}"), |m| {
            m.hits(path) >= n
        });
    }

    /// Waits until exactly `n` requests are in flight; panics after `timeout`.
    pub fn wait_for_in_flight(&self, n: usize, timeout: Duration) {
        self.wait_until(timeout, &format!("{n} requests in flight"), |m| {
            m.current_in_flight() == n
        });
    }

    /// Waits until `cond` holds, re-checking it whenever the mock's state changes; panics
    /// after `timeout` with `what` and a summary of what the mock saw.
    pub fn wait_until(&self, timeout: Duration, what: &str, cond: impl Fn(&MockUpstream) -> bool) {
        let deadline = Deadline::after(timeout);
        loop {
            let seen = self.lock().generation;
            if cond(self) {
                return;
            }
            let state = self.lock();
            if state.generation != seen {
                continue;
            }
            if deadline.passed() {
                let summary = summarize(&state);
                drop(state);
                panic!("mock upstream: timed out after {timeout:?} waiting for {what}; {summary}");
            }
            // The guard is dropped at once: `cond` takes the lock itself.
            drop(
                self.shared
                    .changed
                    .wait_timeout_while(state, deadline.remaining(), |s| s.generation == seen)
                    .expect("mock upstream state poisoned"),
            );
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }
}

fn summarize(state: &State) -> String {
    let seen: Vec<String> = state
        .requests
        .iter()
        .map(|r| format!("{} {}", r.method, r.target))
        .collect();
    format!(
        "saw {} connections, {} in flight, requests {:?}, problems {:?}",
        state.connections_accepted, state.in_flight, seen, state.problems
    )
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panicking connection thread must not hide the state from the test.
    shared
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        {
            let mut state = self.lock();
            state.shutting_down = true;
            for socket in state.sockets.values() {
                let _ = socket.shutdown(Shutdown::Both);
            }
            state.touch(&self.shared);
        }
        // Wake the accept thread, which then sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let workers = std::mem::take(&mut self.lock().workers);
        for worker in workers {
            let _ = worker.join();
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: &TcpListener) {
    for stream in listener.incoming() {
        let mut state = lock(shared);
        if state.shutting_down {
            return;
        }
        let Ok(stream) = stream else {
            continue;
        };
        state.connections_accepted += 1;
        let id = state.connections_accepted;
        let control = match stream.try_clone() {
            Ok(c) => c,
            Err(e) => {
                state
                    .problems
                    .push(format!("connection {id}: try_clone: {e}"));
                continue;
            }
        };
        state.sockets.insert(id, control);
        state.open_connections += 1;
        state.workers.retain(|w| !w.is_finished());
        let worker_shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(format!("mock-conn-{id}"))
            .spawn(move || serve_connection(&worker_shared, id, stream));
        match spawned {
            Ok(handle) => state.workers.push(handle),
            Err(e) => {
                state.sockets.remove(&id);
                state.open_connections -= 1;
                state.problems.push(format!("connection {id}: spawn: {e}"));
            }
        }
        state.touch(shared);
    }
}

// ---------------------------------------------------------------------------------------------
// One connection

enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }
}

/// How a reply, or a wait inside one, ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Reply done, connection may serve the next request.
    KeepAlive,
    /// Close gracefully.
    Close,
    /// Abort with RST.
    Reset,
    /// The peer closed, or the mock is shutting down: just drop the connection.
    Gone,
}

#[derive(Clone, Copy)]
enum Until<'a> {
    Elapsed(Duration),
    Open(&'a Gate),
    Forever,
}

enum Fill {
    Data,
    Idle,
    Closed,
}

struct Conn<'a> {
    shared: &'a Shared,
    id: u64,
    stream: Stream,
    /// Received bytes not yet parsed into a request.
    buf: Vec<u8>,
    scratch: Box<[u8]>,
    /// Whether the current request still counts as in flight.
    answering: bool,
    /// When the request being answered was received in full.
    answering_since: Option<std::time::Instant>,
}

struct Incoming {
    method: String,
    target: String,
    version: u8,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn serve_connection(shared: &Shared, id: u64, tcp: TcpStream) {
    let _ = tcp.set_nodelay(true);
    if lock(shared).body_read_pause.is_some() {
        // No receive-window autotuning: the peer's write waits for this side's reads.
        let _ = socket2::SockRef::from(&tcp).set_recv_buffer_size(READ_CHUNK);
    }
    let _ = tcp.set_read_timeout(Some(IDLE_POLL));
    let stream = match &shared.tls {
        Some(config) => match rustls::ServerConnection::new(Arc::clone(config)) {
            Ok(server) => Stream::Tls(Box::new(rustls::StreamOwned::new(server, tcp))),
            Err(e) => {
                finish_connection(shared, id, &format!("tls setup: {e}"));
                return;
            }
        },
        None => Stream::Plain(tcp),
    };
    let mut conn = Conn {
        shared,
        id,
        stream,
        buf: Vec::new(),
        scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
        answering: false,
        answering_since: None,
    };
    let end = conn.serve();
    match end {
        End::Reset => {
            // Only this handle may remain open, or closing it would not reset the socket.
            lock(shared).sockets.remove(&id);
            let _ = socket2::SockRef::from(conn.stream.tcp()).set_linger(Some(Duration::ZERO));
        }
        End::Close => {
            if let Stream::Tls(tls) = &mut conn.stream {
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
            let _ = conn.stream.tcp().shutdown(Shutdown::Write);
        }
        End::KeepAlive | End::Gone => {}
    }
    drop(conn);
    finish_connection(shared, id, "");
}

fn finish_connection(shared: &Shared, id: u64, problem: &str) {
    let mut state = lock(shared);
    state.sockets.remove(&id);
    state.open_connections -= 1;
    if !problem.is_empty() {
        state.problems.push(format!("connection {id}: {problem}"));
    }
    state.touch(shared);
}

impl Conn<'_> {
    fn serve(&mut self) -> End {
        loop {
            let incoming = match self.read_request() {
                Ok(Some(incoming)) => incoming,
                Ok(None) => return End::Gone,
                Err(problem) => {
                    self.problem(&problem);
                    let body = format!("mock upstream: {problem}\n");
                    let head = format!(
                        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = self.write_all(head.as_bytes());
                    let _ = self.write_all(body.as_bytes());
                    return End::Close;
                }
            };
            let wants_close = (incoming.version == 0
                && !wire::header_has_token(&incoming.headers, "connection", "keep-alive"))
                || wire::header_has_token(&incoming.headers, "connection", "close");
            let is_head = incoming.method.eq_ignore_ascii_case("HEAD");
            let reply = self.admit(incoming);
            let end = self.play(&reply, is_head, wants_close);
            self.leave();
            if end != End::KeepAlive {
                return end;
            }
        }
    }

    /// Records the request, picks its reply and counts it in flight, all at once.
    fn admit(&mut self, incoming: Incoming) -> Reply {
        self.answering = true;
        let path = match incoming.target.find('?') {
            Some(i) => incoming.target[..i].to_string(),
            None => incoming.target.clone(),
        };
        let mut state = lock(self.shared);
        let scripted = state
            .routes
            .get_mut(&path)
            .and_then(|route| route.queue.pop_front().or_else(|| route.always.clone()));
        let reply = scripted.unwrap_or_else(|| {
            let what = format!("{} {}", incoming.method, incoming.target);
            state
                .problems
                .push(format!("connection {}: unscripted request {what}", self.id));
            Reply::error(404, &format!("mock upstream: nothing scripted for {what}"))
        });
        state.requests.push(RecordedRequest {
            connection: self.id,
            method: incoming.method,
            target: incoming.target,
            path,
            version: incoming.version,
            headers: incoming.headers,
            body: incoming.body,
            at: std::time::Instant::now(),
        });
        state.in_flight += 1;
        state.peak_in_flight = state.peak_in_flight.max(state.in_flight);
        self.answering_since = Some(std::time::Instant::now());
        state.touch(self.shared);
        reply
    }

    /// Stops counting the current request in flight. Called *before* the write that completes
    /// the reply and before a connection is closed or reset: a peer can then never see a reply
    /// end while its request still counts, so a client that waits for each answer before
    /// sending the next is never seen with two in flight.
    fn leave(&mut self) {
        if !self.answering {
            return;
        }
        self.answering = false;
        let mut state = lock(self.shared);
        state.in_flight -= 1;
        state.touch(self.shared);
    }

    /// The last write of a reply.
    fn finish(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.answering
            && let Some(since) = self.answering_since.take()
        {
            lock(self.shared)
                .answered
                .push((since, std::time::Instant::now()));
        }
        self.leave();
        self.write_all(bytes)
    }

    fn problem(&self, problem: &str) {
        let mut state = lock(self.shared);
        state
            .problems
            .push(format!("connection {}: {problem}", self.id));
        state.touch(self.shared);
    }

    fn shutting_down(&self) -> bool {
        lock(self.shared).shutting_down
    }

    /// Reads one whole request (head and decoded body). `Ok(None)`: the peer closed or the mock
    /// is shutting down. `Err`: the request is malformed.
    fn read_request(&mut self) -> Result<Option<Incoming>, String> {
        let mut sent_continue = false;
        let mut paused = false;
        loop {
            if let Some((incoming, used, expects_continue)) = parse_request(&self.buf)? {
                match incoming {
                    Some(incoming) => {
                        self.buf.drain(..used);
                        return Ok(Some(incoming));
                    }
                    None if !paused && !expects_continue => {
                        paused = true;
                        if !self.pause_body_read() {
                            return Ok(None);
                        }
                    }
                    None if expects_continue && !sent_continue => {
                        sent_continue = true;
                        if self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").is_err() {
                            return Ok(None);
                        }
                    }
                    None => {}
                }
            }
            match self.fill() {
                Fill::Data => {}
                Fill::Idle => {
                    if self.shutting_down() {
                        return Ok(None);
                    }
                }
                Fill::Closed => return Ok(None),
            }
        }
    }

    /// Sleeps [`State::body_read_pause`], if set, without reading. `false`: the mock is
    /// shutting down.
    fn pause_body_read(&self) -> bool {
        let Some(pause) = lock(self.shared).body_read_pause else {
            return true;
        };
        let deadline = Deadline::after(pause);
        while !deadline.passed() {
            if self.shutting_down() {
                return false;
            }
            std::thread::sleep(deadline.remaining().min(POLL));
        }
        true
    }

    /// Reads whatever arrives within one poll interval into the buffer.
    fn fill(&mut self) -> Fill {
        match self.stream.read(&mut self.scratch) {
            Ok(0) => Fill::Closed,
            Ok(n) => {
                self.buf.extend_from_slice(&self.scratch[..n]);
                Fill::Data
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                Fill::Idle
            }
            Err(e) => {
                if matches!(self.stream, Stream::Tls(_)) && e.kind() == io::ErrorKind::InvalidData {
                    self.problem(&format!("tls: {e}"));
                }
                Fill::Closed
            }
        }
    }

    /// Waits `until` while watching the socket: returns early with `End::Gone` if the peer
    /// hangs up or the mock shuts down. Bytes that arrive meanwhile (a pipelined request) are
    /// kept.
    fn wait(&mut self, until: Until<'_>) -> Option<End> {
        let deadline = match until {
            Until::Elapsed(d) => Some(Deadline::after(d)),
            Until::Open(_) | Until::Forever => None,
        };
        loop {
            if self.shutting_down() {
                return Some(End::Gone);
            }
            if let Until::Open(gate) = until
                && gate.is_open()
            {
                break;
            }
            let slice = match deadline {
                Some(d) if d.passed() => break,
                Some(d) => d.remaining().min(POLL),
                None if matches!(until, Until::Open(_)) => POLL,
                None => IDLE_POLL,
            };
            let _ = self.stream.tcp().set_read_timeout(Some(slice));
            let filled = self.fill();
            if let Fill::Closed = filled {
                let _ = self.stream.tcp().set_read_timeout(Some(IDLE_POLL));
                return Some(End::Gone);
            }
        }
        let _ = self.stream.tcp().set_read_timeout(Some(IDLE_POLL));
        None
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    fn play(&mut self, reply: &Reply, is_head: bool, wants_close: bool) -> End {
        if !reply.delay.is_zero()
            && let Some(end) = self.wait(Until::Elapsed(reply.delay))
        {
            return end;
        }
        if let Some(gate) = &reply.gate
            && let Some(end) = self.wait(Until::Open(gate))
        {
            return end;
        }
        let (status, headers, body) = match &reply.action {
            Action::Respond {
                status,
                headers,
                body,
            } => (*status, headers, body),
            Action::StallBeforeHead => return self.wait(Until::Forever).unwrap_or(End::Gone),
            Action::Reset => return End::Reset,
            Action::Close => return End::Close,
        };
        let mut head = format!("HTTP/1.1 {status} {}\r\n", wire::reason(status));
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        let framed_by_script = wire::header(headers, "content-length").is_some()
            || wire::header(headers, "transfer-encoding").is_some();
        let no_body = is_head || status == 204 || status == 304 || (100..200).contains(&status);
        match body {
            Body::Full(bytes) if !framed_by_script && !no_body => {
                head.push_str(&format!("content-length: {}\r\n", bytes.len()));
            }
            Body::Chunked(_) if !framed_by_script && !no_body => {
                head.push_str("transfer-encoding: chunked\r\n");
            }
            Body::Full(_) | Body::Chunked(_) => {}
        }
        let close = reply.close_after || wants_close;
        if wants_close && !reply.close_after {
            head.push_str("connection: close\r\n");
        }
        head.push_str("\r\n");
        let mut head = head.into_bytes();
        let sent = match body {
            Body::Full(_) if no_body => self.finish(&head),
            Body::Full(bytes) => {
                head.extend_from_slice(bytes);
                self.finish(&head)
            }
            Body::Chunked(_) if no_body => self.finish(&head),
            Body::Chunked(chunks) => match self.write_all(&head) {
                Ok(()) => match self.play_chunks(chunks, framed_by_script) {
                    Some(end) => return end,
                    None => Ok(()),
                },
                Err(e) => Err(e),
            },
        };
        match (sent, close) {
            (Err(_), _) => End::Gone,
            (Ok(()), true) => End::Close,
            (Ok(()), false) => End::KeepAlive,
        }
    }

    /// Sends the chunked body; `Some(end)` if it ended the connection early.
    /// `raw`: the script framed the body itself, so steps are written verbatim and no last chunk
    /// is added.
    fn play_chunks(&mut self, chunks: &[Chunk], raw: bool) -> Option<End> {
        for (i, Chunk(step)) in chunks.iter().enumerate() {
            match step {
                Step::Bytes(bytes) => {
                    let written = if !raw {
                        self.write_all(&wire::encode_chunk(bytes))
                    } else if i + 1 == chunks.len() {
                        self.finish(bytes)
                    } else {
                        self.write_all(bytes)
                    };
                    if written.is_err() {
                        return Some(End::Gone);
                    }
                }
                Step::Delay(d) => {
                    if let Some(end) = self.wait(Until::Elapsed(*d)) {
                        return Some(end);
                    }
                }
                Step::Gate(gate) => {
                    if let Some(end) = self.wait(Until::Open(gate)) {
                        return Some(end);
                    }
                }
                Step::Stall => return Some(self.wait(Until::Forever).unwrap_or(End::Gone)),
                Step::Reset => return Some(End::Reset),
                Step::Close => return Some(End::Close),
            }
        }
        if !raw && self.finish(wire::LAST_CHUNK).is_err() {
            return Some(End::Gone);
        }
        None
    }
}

/// Parses one request at the start of `buf`. `Ok(None)`: head incomplete. `Ok(Some((None, _,
/// expects_continue)))`: head complete, body incomplete. `Ok(Some((Some(req), used, _)))`:
/// complete, `used` bytes long.
#[allow(clippy::type_complexity)]
fn parse_request(buf: &[u8]) -> Result<Option<(Option<Incoming>, usize, bool)>, String> {
    let mut header_space = [httparse::EMPTY_HEADER; wire::MAX_HEADERS];
    let mut req = httparse::Request::new(&mut header_space);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() > wire::MAX_HEAD_BYTES {
                return Err(format!("request head over {} bytes", wire::MAX_HEAD_BYTES));
            }
            return Ok(None);
        }
        Err(e) => return Err(format!("malformed request head: {e}")),
    };
    let method = req.method.unwrap_or_default().to_string();
    let target = req.path.unwrap_or_default().to_string();
    let version = req.version.unwrap_or(1);
    let headers = wire::to_pairs(req.headers);
    let expects_continue = wire::header_has_token(&headers, "expect", "100-continue");
    let rest = &buf[head_len..];
    let (body, body_len) = match wire::framing(&headers, false)? {
        Framing::Length(n) => {
            let n = usize::try_from(n).map_err(|_| "Content-Length too large".to_string())?;
            if rest.len() < n {
                return Ok(Some((None, 0, expects_continue)));
            }
            (rest[..n].to_vec(), n)
        }
        Framing::Chunked => match wire::decode_chunked(rest)? {
            Some((body, used)) => (body, used),
            None => return Ok(Some((None, 0, expects_continue))),
        },
        Framing::UntilClose => return Err("request body without framing".to_string()),
    };
    let incoming = Incoming {
        method,
        target,
        version,
        headers,
        body,
    };
    Ok(Some((
        Some(incoming),
        head_len + body_len,
        expects_continue,
    )))
}

// ---------------------------------------------------------------------------------------------
// TLS

/// A fresh CA and a leaf for `localhost` / `127.0.0.1` signed by it: the server config
/// (rustls with the `ring` provider, passed explicitly) and the CA's PEM.
fn tls_material() -> (Arc<rustls::ServerConfig>, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().expect("rcgen: CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("rcgen: CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Tidegate test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).expect("rcgen: CA cert");

    let leaf_key = KeyPair::generate().expect("rcgen: leaf key");
    let mut leaf_params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .expect("rcgen: leaf params");
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_cert = leaf_params
        .signed_by(&leaf_key, &ca_cert, &ca_key)
        .expect("rcgen: leaf cert");

    let chain: Vec<CertificateDer<'static>> = vec![leaf_cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("rustls: protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("rustls: server cert");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (Arc::new(config), ca_cert.pem())
}
