//! Black-box integration-test support: a scripted upstream, a launcher for the real binary and
//! a raw HTTP/1.1 client. It owns nothing of the gateway and imports none of its code, so a test
//! built on it checks the contract a user sees, not the implementation.
//!
//! Every integration test file compiles this module anew and uses only part of it, hence the
//! `dead_code` allowance. Helpers panic with a message on failure (they are test code: a failed
//! helper is a failed test), and they read real time, which is the point of a real-socket
//! harness; both are allowed here once instead of at every call.
#![allow(dead_code)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    clippy::disallowed_methods
)]

pub mod client;
pub mod compat;
pub mod config;
pub mod eventually;
pub mod flow;
pub mod gateway;
pub mod mock_upstream;
pub mod resilience_state;
pub mod streams;
mod wire;

// Re-exported for the test files; each uses only some of them.
#[allow(unused_imports)]
pub use client::{Client, Piece, Response, SseEvent, json_post, parse_sse, send_raw};
#[allow(unused_imports)]
pub use compat::{SDK_TRANSLATE, python, run_sdk_client, run_sdk_script};
#[allow(unused_imports)]
pub use config::{connection, one_upstream, provider};
#[allow(unused_imports)]
pub use eventually::eventually;
#[allow(unused_imports)]
pub use flow::{all_flow_released, flow_held, held_then_later, metric, metric_becomes};
#[allow(unused_imports)]
pub use gateway::{Gateway, ReadyLine, RunOutput, StartFailure, run_check, run_tidegate};
#[allow(unused_imports)]
pub use mock_upstream::{
    Chunk, Gate, MockUpstream, RecordedRequest, Reply, anthropic_stream_chunks,
    openai_stream_chunks,
};
#[allow(unused_imports)]
pub use resilience_state::{breaker_failures, connection_once};
#[allow(unused_imports)]
pub use streams::{
    AnthropicEvents, ChatChunks, SSE_DONE, Streamed, chat_completion, chat_stream, continuation_on,
    last_message, last_of, provider_of, raw, read_stream, script, sse_data, two_providers,
    typed_chunk, typed_sse, words,
};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A point in time after which a bounded wait gives up. The one place the support code asks
/// the clock, so every wait in it is visibly bounded.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(Instant);

impl Deadline {
    pub fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now() + timeout)
    }

    /// Time left, zero once passed.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    pub fn passed(&self) -> bool {
        self.remaining().is_zero()
    }
}

/// Measures how long something took (for lower-bound checks of scripted delays only).
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch(Instant::now())
    }

    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// Shorthand for test code: `ms(250)`.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Shorthand for test code: `secs(5)`.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A loopback port that refuses every connection for as long as this value lives: a socket
/// bound to it that never listens. The kernel answers a connect with a reset (connection
/// refused), and while the socket holds the port no other process can be given it, so the
/// port cannot turn into somebody else's server halfway through a test (a port merely
/// reserved and released can).
#[derive(Debug)]
pub struct RefusingPort {
    socket: socket2::Socket,
    addr: std::net::SocketAddr,
}

impl RefusingPort {
    pub fn new() -> RefusingPort {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        RefusingPort { socket, addr }
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// `http://<addr>/v1`, a provider `base_url` on this port.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Starts listening on the held socket: from now on the port accepts connections. The
    /// port changes hands without ever being free, so no other process can take it between
    /// the refusing phase and the serving one (see [`MockUpstream::start_on`]).
    pub fn listen(self) -> std::net::TcpListener {
        self.socket.listen(128).unwrap();
        self.socket.into()
    }
}

/// A fresh directory under the system temp dir, removed with its contents on drop.
/// Named after the process id and a counter, so parallel tests and test binaries never share
/// one; no extra crate needed.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        let base = std::env::temp_dir();
        loop {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("tidegate-test-{label}-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return TempDir { path },
                // Left over by an earlier process that had the same pid: take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create temp dir {}: {e}", path.display()),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()` joined with `name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `contents` to `name` inside the directory and returns the file's path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.join(name);
        std::fs::write(&path, contents)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
