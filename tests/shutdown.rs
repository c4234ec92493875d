//! Graceful shutdown of the real process: on SIGTERM or SIGINT the gateway stops accepting,
//! lets in-flight requests (streams included) finish within `shutdown_grace_ms`, cuts what is
//! still running after that, closes idle keep-alive connections, and exits 0.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::json;
use std::time::Duration;
use support::{
    Chunk, Client, Deadline, Gate, Gateway, MockUpstream, Piece, Reply, Stopwatch, ms,
    openai_stream_chunks, parse_sse, secs,
};

const CHAT: &str = "/v1/chat/completions";
const KEY: &str = "test-key";

/// One shard; the in-process mock provider (`mock/...`) and, with `upstream`, an OpenAI-format
/// provider `up` (model `m1`) pointing at it.
fn config(shutdown_grace_ms: u64, upstream: Option<&MockUpstream>) -> String {
    let mut cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1
shutdown_grace_ms = {shutdown_grace_ms}

[[client_keys]]
id = "t"
key = "{KEY}"

[[providers]]
id = "mock"
format = "mock"
models = ["echo"]

[[connections]]
id = "mock-c"
provider = "mock"
"#
    );
    if let Some(mock) = upstream {
        cfg.push_str(&format!(
            r#"
[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "up"
"#,
            mock.base_url()
        ));
    }
    cfg
}

fn headers() -> [(&'static str, &'static str); 2] {
    [
        ("authorization", "Bearer test-key"),
        ("content-type", "application/json"),
    ]
}

fn chat_body(model: &str, prompt: &str, stream: bool) -> Vec<u8> {
    json!({"model": model, "stream": stream,
        "messages": [{"role": "user", "content": prompt}]})
    .to_string()
    .into_bytes()
}

/// Reads body pieces into `body` until it contains `needle`; panics if the body ends first or
/// nothing comes for 10 s.
fn read_until_contains(c: &mut Client, body: &mut Vec<u8>, needle: &str) {
    while !String::from_utf8_lossy(body).contains(needle) {
        match c.next_body_piece(secs(10)) {
            Piece::Data(d) => body.extend_from_slice(&d),
            other => panic!(
                "body ended ({other:?}) before {needle:?}; got {:?}",
                String::from_utf8_lossy(body)
            ),
        }
    }
}

/// Reads the rest of the body into `body` and returns how it ended (`End` or `Closed`).
fn read_to_end(c: &mut Client, body: &mut Vec<u8>, timeout: Duration) -> Piece {
    let deadline = Deadline::after(timeout);
    loop {
        assert!(
            !deadline.passed(),
            "body not finished within {timeout:?}: {:?}",
            String::from_utf8_lossy(body)
        );
        match c.next_body_piece(deadline.remaining()) {
            Piece::Data(d) => body.extend_from_slice(&d),
            Piece::Timeout => {}
            end => return end,
        }
    }
}

/// The content deltas of an OpenAI chat stream, and whether it ended with `[DONE]`.
fn stream_text(body: &[u8]) -> (String, bool) {
    let events = parse_sse(body);
    let done = events.last().is_some_and(|e| e.data == "[DONE]");
    let text = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| {
            e.json()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    (text, done)
}

/// What became of the connection attempts made while waiting for the gateway to refuse.
#[derive(Debug, Default)]
struct Probes {
    /// Accepted and answered (they reached the listener before it stopped accepting).
    served: usize,
    /// Accepted, then neither answered nor closed within the probe's bound.
    hung: usize,
}

/// Probes with new connections until one is refused, or accepted and closed without an
/// answer (both fine: the gateway no longer takes connections); panics if that does not
/// happen within `within`. A probe that gets no answer and no close within `hang_after` is
/// counted as hung and the next one is tried.
fn probe_until_refused(gw: &Gateway, within: Duration, hang_after: Duration) -> Probes {
    let deadline = Deadline::after(within);
    let mut probes = Probes::default();
    let body = chat_body("mock/echo", "late", false);
    let mut request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend(body);
    loop {
        assert!(
            !deadline.passed(),
            "new connections still taken within {within:?} of the signal: {probes:?}"
        );
        let mut c = match Client::try_connect(gw.addr()) {
            Err(_) => return probes,
            Ok(c) => c,
        };
        c.set_timeout(hang_after);
        if c.try_write_raw(&request).is_err() {
            return probes;
        }
        match c.try_read_response() {
            Ok(_) => {
                probes.served += 1;
                std::thread::sleep(ms(20));
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => probes.hung += 1,
            Err(_) => return probes,
        }
    }
}

/// Waits (bounded) until new connections are refused (or closed without an answer).
fn assert_new_connections_refused(gw: &Gateway, within: Duration) {
    // A probe that hangs is tolerated here (see
    // `a_connection_accepted_as_shutdown_begins_is_not_left_hanging`).
    probe_until_refused(gw, within, secs(1));
}

/// Waits for the process to exit and checks it exited 0.
fn assert_exits_cleanly(gw: &mut Gateway, within: Duration) {
    let status = gw.wait_exit(within).unwrap_or_else(|| {
        panic!(
            "tidegate still running {within:?} after the signal; output:\n{}",
            gw.logs()
        )
    });
    assert_eq!(
        status.code(),
        Some(0),
        "exit status {status:?}; output:\n{}",
        gw.logs()
    );
}

#[test]
fn sigterm_drains_an_in_flight_stream_and_exits_0() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    let mut chunks = openai_stream_chunks(&["one ", "two ", "three"]);
    // Role chunk, "one ", then hold the rest until the test opens the gate.
    chunks.insert(2, Chunk::wait_for(&gate));
    mock.on(CHAT, Reply::sse(chunks));
    let mut gw = Gateway::start(&config(10_000, Some(&mock)));

    let mut c = Client::connect(gw.addr());
    c.start_request("POST", CHAT, &headers(), &chat_body("up/m1", "go", true));
    let head = c.read_head();
    assert_eq!(head.status, 200);
    let mut body = Vec::new();
    read_until_contains(&mut c, &mut body, "one ");

    gw.terminate();
    gw.wait_for_log("shutting down", secs(5));
    assert_new_connections_refused(&gw, secs(5));
    assert!(
        gw.wait_exit(ms(0)).is_none(),
        "exited with a stream in flight"
    );

    gate.open();
    let end = read_to_end(&mut c, &mut body, secs(10));
    assert_eq!(
        end,
        Piece::End,
        "stream cut: {:?}",
        String::from_utf8_lossy(&body)
    );
    let (text, done) = stream_text(&body);
    assert_eq!(text, "one two three");
    assert!(done, "no [DONE]: {:?}", String::from_utf8_lossy(&body));
    assert!(
        c.closed_within(secs(5)),
        "client connection left open after the drain"
    );
    assert_exits_cleanly(&mut gw, secs(10));
}

#[test]
fn a_stalled_stream_is_cut_after_the_grace_period_with_the_in_band_error_event_and_exit_0() {
    let mock = MockUpstream::start();
    mock.on(
        CHAT,
        Reply::sse(vec![Chunk::openai_delta("first "), Chunk::stall()]),
    );
    let mut gw = Gateway::start(&config(300, Some(&mock)));

    let mut c = Client::connect(gw.addr());
    c.start_request("POST", CHAT, &headers(), &chat_body("up/m1", "go", true));
    assert_eq!(c.read_head().status, 200);
    let mut body = Vec::new();
    read_until_contains(&mut c, &mut body, "first ");

    let since_signal = Stopwatch::start();
    gw.terminate();
    assert_exits_cleanly(&mut gw, secs(10));
    assert!(
        since_signal.elapsed() >= ms(250),
        "exited after {:?}, before shutdown_grace_ms = 300 was over",
        since_signal.elapsed()
    );
    assert!(
        gw.logs().contains("grace period over"),
        "no log of the cut: {}",
        gw.logs()
    );
    // The stream was cut: it ends without [DONE], with the in-band error event.
    let end = read_to_end(&mut c, &mut body, secs(5));
    let (_, done) = stream_text(&body);
    let events = parse_sse(&body);
    let last = events.last().map(|e| e.json()).unwrap_or_default();
    assert_eq!(
        last["error"]["code"],
        "shutting_down",
        "a stream cut at the end of the grace period must end with the in-band error event: {:?}",
        String::from_utf8_lossy(&body)
    );
    assert!(
        !done,
        "a stalled stream got [DONE]: {:?}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(
        end,
        Piece::Closed,
        "a cut stream must not end like a complete one: {:?}",
        String::from_utf8_lossy(&body)
    );
}

#[test]
fn an_idle_keep_alive_connection_is_closed_at_shutdown_and_the_process_exits_promptly() {
    // A long grace and idle timeout: an idle connection must count as neither in flight nor a
    // reason to wait.
    let mut gw = Gateway::start(&config(30_000, None));
    let mut c = Client::connect(gw.addr());
    let r = c.request(
        "POST",
        CHAT,
        &headers(),
        &chat_body("mock/echo", "idle next", false),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    gw.terminate();
    assert!(
        c.closed_within(secs(5)),
        "idle keep-alive connection not closed at shutdown"
    );
    assert_exits_cleanly(&mut gw, secs(5));
}

#[test]
fn sigint_behaves_like_sigterm() {
    let mut gw = Gateway::start(&config(10_000, None));
    let mut idle = Client::connect(gw.addr());
    let r = idle.request(
        "POST",
        CHAT,
        &headers(),
        &chat_body("mock/echo", "idle", false),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // An in-process stream of six words, one every 100 ms.
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        CHAT,
        &headers(),
        &chat_body("mock/drip-100", "a b c d e f", true),
    );
    assert_eq!(c.read_head().status, 200);
    let mut body = Vec::new();
    read_until_contains(&mut c, &mut body, "\"a ");

    gw.signal(libc::SIGINT);
    gw.wait_for_log("shutting down", secs(5));
    assert!(
        idle.closed_within(secs(5)),
        "idle connection not closed on SIGINT"
    );
    assert_new_connections_refused(&gw, secs(5));
    let end = read_to_end(&mut c, &mut body, secs(10));
    assert_eq!(end, Piece::End, "{:?}", String::from_utf8_lossy(&body));
    let (text, done) = stream_text(&body);
    assert_eq!(text, "a b c d e f");
    assert!(done);
    assert_exits_cleanly(&mut gw, secs(10));
}

/// A non-stream request held by the upstream across SIGTERM, answered once the shard is
/// draining: returns that answer (after checking the connection closes and the process exits
/// 0).
fn answer_finished_during_the_drain() -> support::Response {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(CHAT, Reply::openai_chat("late answer").wait_for(&gate));
    let mut gw = Gateway::start(&config(10_000, Some(&mock)));

    let mut c = Client::connect(gw.addr());
    c.start_request("POST", CHAT, &headers(), &chat_body("up/m1", "go", false));
    mock.wait_for_hits(CHAT, 1, secs(10));

    gw.terminate();
    gw.wait_for_log("shutting down", secs(5));
    // Once new connections are refused the shard is draining.
    assert_new_connections_refused(&gw, secs(5));
    gate.open();
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "late answer");
    assert!(
        c.closed_within(secs(5)),
        "connection left open after the drain"
    );
    assert_exits_cleanly(&mut gw, secs(10));
    r
}

#[test]
fn a_request_in_flight_at_sigterm_is_answered_then_its_connection_closed() {
    answer_finished_during_the_drain();
}

#[test]
fn a_response_finished_during_the_drain_carries_connection_close() {
    // Operator guide: "Responses finished during the drain carry `Connection: close`."
    let r = answer_finished_during_the_drain();
    assert_eq!(
        r.header("connection"),
        Some("close"),
        "answer finished during the drain without Connection: close: {:?}",
        r.headers
    );
}

#[test]
fn a_connection_accepted_as_shutdown_begins_is_not_left_hanging() {
    // The race is narrow, so the scenario runs several times; it shows within a few runs.
    for trial in 0..10 {
        let mock = MockUpstream::start();
        let gate = Gate::new();
        mock.on(CHAT, Reply::openai_chat("held").wait_for(&gate));
        let mut gw = Gateway::start(&config(10_000, Some(&mock)));
        // A request in flight keeps the process draining (and so the leaked socket open).
        let mut c = Client::connect(gw.addr());
        c.start_request("POST", CHAT, &headers(), &chat_body("up/m1", "go", false));
        mock.wait_for_hits(CHAT, 1, secs(10));

        gw.terminate();
        gw.wait_for_log("shutting down", secs(5));
        let probes = probe_until_refused(&gw, secs(10), secs(2));
        gate.open();
        assert_eq!(c.read_response().status, 200);
        assert_exits_cleanly(&mut gw, secs(10));
        assert_eq!(
            probes.hung, 0,
            "trial {trial}: a connection made as shutdown began got no answer and no close \
             for 2 s: {probes:?}"
        );
    }
}

fn get(c: &mut Client, path: &str) -> support::Response {
    c.request("GET", path, &[("authorization", "Bearer test-key")], b"")
}

#[test]
fn healthz_and_readyz_answer_503_draining_during_the_drain() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(CHAT, Reply::openai_chat("late").wait_for(&gate));
    let mut gw = Gateway::start(&config(10_000, Some(&mock)));

    // Two keep-alive connections that see the drain begin.
    let mut health = Client::connect(gw.addr());
    let mut ready = Client::connect(gw.addr());
    let r = get(&mut ready, "/readyz");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "ready");
    let r = get(&mut health, "/healthz");
    assert_eq!(r.status, 200, "{}", r.text());

    let mut held = Client::connect(gw.addr());
    held.start_request("POST", CHAT, &headers(), &chat_body("up/m1", "go", false));
    mock.wait_for_hits(CHAT, 1, secs(10));
    gw.terminate();
    gw.wait_for_log("shutting down", secs(5));
    assert_new_connections_refused(&gw, secs(5));

    for (c, path) in [(&mut health, "/healthz"), (&mut ready, "/readyz")] {
        let r = get(c, path);
        assert_eq!(r.status, 503, "{path} during the drain: {}", r.text());
        assert_eq!(r.json()["status"], "draining", "{path}");
        assert_eq!(r.header("connection"), Some("close"), "{path}");
    }
    gate.open();
    assert_eq!(held.read_response().status, 200);
    assert_exits_cleanly(&mut gw, secs(10));
}

#[test]
fn a_pending_request_at_the_end_of_the_grace_period_gets_503_shutting_down() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(CHAT, Reply::openai_chat("too late").wait_for(&gate));
    let mut gw = Gateway::start(&config(300, Some(&mock)));

    let mut c = Client::connect(gw.addr());
    c.start_request("POST", CHAT, &headers(), &chat_body("up/m1", "go", false));
    mock.wait_for_hits(CHAT, 1, secs(10));
    gw.terminate();
    let r = c.read_response();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("shutting_down"));
    assert_eq!(r.json()["error"]["code"], "shutting_down");
    assert_exits_cleanly(&mut gw, secs(10));
    assert!(
        gw.logs().contains("signal=SIGTERM"),
        "the log names the signal: {}",
        gw.logs()
    );
    gate.open();
}
