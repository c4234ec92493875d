//! Client connection handling over real sockets: keep-alive, pipelining, HTTP/1.0 and
//! `Connection: close` semantics, `Expect: 100-continue`, chunked uploads relayed upstream with
//! a `Content-Length`, and the idle keep-alive timeout.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::json;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use support::{
    Client, Deadline, Gateway, MockUpstream, Reply, Response, Stopwatch, eventually, ms, secs,
};

const CHAT: &str = "/v1/chat/completions";
const KEY: &str = "test-key";

/// A gateway with the in-process mock provider (`mock/...`) and, when `upstream` is given, an
/// OpenAI-format provider `up` (model `m1`) pointing at it.
fn config(idle_timeout_ms: u64, upstream: Option<&MockUpstream>) -> String {
    let mut cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1
idle_timeout_ms = {idle_timeout_ms}

[[client_keys]]
id = "t"
key = "{KEY}"
scopes = ["inference", "manage"]

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

fn start() -> Gateway {
    Gateway::start(&config(60_000, None))
}

fn chat_body(model: &str, prompt: &str, stream: bool) -> String {
    json!({"model": model, "stream": stream,
        "messages": [{"role": "user", "content": prompt}]})
    .to_string()
}

fn headers() -> [(&'static str, &'static str); 2] {
    [
        ("authorization", "Bearer test-key"),
        ("content-type", "application/json"),
    ]
}

/// Raw bytes of a chat request for `prompt` (HTTP/1.`minor`), with `extra` header lines.
fn request_bytes(minor: u8, model: &str, prompt: &str, stream: bool, extra: &str) -> Vec<u8> {
    let body = chat_body(model, prompt, stream);
    format!(
        "POST {CHAT} HTTP/1.{minor}\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The assistant text of a chat answer, plain or streamed.
fn answer_text(r: &Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    if r.header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream"))
    {
        let events = r.sse_events();
        assert_eq!(
            events.last().map(|e| e.data.as_str()),
            Some("[DONE]"),
            "stream did not end with [DONE]: {}",
            r.text()
        );
        events
            .iter()
            .filter(|e| e.data != "[DONE]")
            .filter_map(|e| {
                e.json()["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    } else {
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("no content in {}", r.text()))
            .to_owned()
    }
}

/// A `Connection` header value lists `close`.
fn says_close(r: &Response) -> bool {
    r.header_all("connection")
        .iter()
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("close"))
}

/// `tidegate_connections_accepted_total` from `/metrics`, asked on a new connection.
fn connections_accepted(gw: &Gateway) -> u64 {
    let r = Client::connect(gw.addr()).request(
        "GET",
        "/metrics",
        &[("authorization", "Bearer test-key")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix("tidegate_connections_accepted_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no tidegate_connections_accepted_total in {}", r.text()))
}

#[test]
fn several_requests_share_one_connection() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    for i in 0..5 {
        let prompt = format!("request number {i}");
        let stream = i % 2 == 1;
        let body = chat_body("mock/echo", &prompt, stream);
        let r = c.request("POST", CHAT, &headers(), body.as_bytes());
        assert_eq!(answer_text(&r), prompt);
        assert!(
            !says_close(&r),
            "keep-alive answer says close: {:?}",
            r.headers
        );
    }
    // Five requests, one connection (plus the one asking for the metrics).
    assert_eq!(connections_accepted(&gw), 2);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let gw = start();
    let prompts = ["first, a short one", "second", "third and the last of them"];
    let mut bytes = Vec::new();
    for p in prompts {
        bytes.extend(request_bytes(1, "mock/echo", p, false, ""));
    }
    let mut c = Client::connect(gw.addr());
    c.write_raw(&bytes);
    for p in prompts {
        let r = c.read_response();
        assert_eq!(answer_text(&r), p);
    }
    // The connection is still good for one more.
    let r = c.request(
        "POST",
        CHAT,
        &headers(),
        chat_body("mock/echo", "after", false).as_bytes(),
    );
    assert_eq!(answer_text(&r), "after");
}

#[test]
fn pipelined_answers_keep_order_behind_a_slow_and_a_streamed_one() {
    let gw = start();
    let mut bytes = request_bytes(1, "mock/slow-200", "slow one first", false, "");
    bytes.extend(request_bytes(
        1,
        "mock/drip-5",
        "then a streamed one",
        true,
        "",
    ));
    bytes.extend(request_bytes(1, "mock/echo", "fast one last", false, ""));
    let mut c = Client::connect(gw.addr());
    c.write_raw(&bytes);
    for expected in ["slow one first", "then a streamed one", "fast one last"] {
        let r = c.read_response();
        assert_eq!(answer_text(&r), expected);
    }
}

#[test]
fn http_1_0_request_gets_connection_close() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    c.write_raw(&request_bytes(0, "mock/echo", "old client", false, ""));
    let r = c.read_response();
    assert_eq!(answer_text(&r), "old client");
    assert!(
        says_close(&r),
        "HTTP/1.0 answer without Connection: close: {:?}",
        r.headers
    );
    assert!(c.closed_within(secs(5)), "HTTP/1.0 connection left open");
}

#[test]
fn http_1_0_stream_is_close_delimited_not_chunked() {
    // An HTTP/1.0 client cannot decode chunked framing.
    let gw = start();
    let mut c = Client::connect(gw.addr());
    c.write_raw(&request_bytes(
        0,
        "mock/echo",
        "old streaming client",
        true,
        "",
    ));
    let r = c.read_response();
    assert!(
        !r.chunked,
        "chunked answer to an HTTP/1.0 client: {:?}",
        r.headers
    );
    assert!(says_close(&r), "{:?}", r.headers);
    assert_eq!(answer_text(&r), "old streaming client");
}

#[test]
fn http_1_0_keep_alive_is_honoured() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    for p in ["one", "two"] {
        c.write_raw(&request_bytes(
            0,
            "mock/echo",
            p,
            false,
            "connection: keep-alive\r\n",
        ));
        let r = c.read_response();
        assert_eq!(answer_text(&r), p);
        assert!(!says_close(&r), "{:?}", r.headers);
    }
}

/// A `Connection` header value lists `keep-alive`.
fn says_keep_alive(r: &Response) -> bool {
    r.header_all("connection")
        .iter()
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("keep-alive"))
}

/// An HTTP/1.0 client that asks for keep-alive hears it back (RFC 9112 §9.3): without
/// `Connection: keep-alive` in the answer it must take the connection as closing. Every
/// kind of answer says it — health, management, a gateway-made error, an in-process
/// answer, a proxied one — on one connection that stays open. A streamed answer cannot be
/// chunked for HTTP/1.0: it is close-delimited, says `close` and the connection closes. An
/// HTTP/1.0 request without keep-alive hears `close` and its connection closes.
#[test]
fn http_1_0_keep_alive_is_echoed_on_every_answer() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("from upstream"));
    let gw = Gateway::start(&config(60_000, Some(&mock)));
    let keep = "connection: keep-alive\r\n";
    let get = |path: &str, extra: &str| {
        format!("GET {path} HTTP/1.0\r\nauthorization: Bearer {KEY}\r\n{extra}\r\n").into_bytes()
    };
    let mut c = Client::connect(gw.addr());
    let asks: Vec<(&str, Vec<u8>)> = vec![
        ("health", get("/healthz", keep)),
        ("management", get("/api/monitoring/health", keep)),
        ("route not found", get("/v1/nowhere", keep)),
        (
            "unknown model",
            request_bytes(0, "nope/none", "x", false, keep),
        ),
        (
            "in-process answer",
            request_bytes(0, "mock/echo", "kept", false, keep),
        ),
        (
            "proxied answer",
            request_bytes(0, "up/m1", "relayed", false, keep),
        ),
    ];
    for (what, bytes) in asks {
        c.write_raw(&bytes);
        let r = c.read_response();
        assert!(
            says_keep_alive(&r) && !says_close(&r),
            "{what}: {} {:?}",
            r.status,
            r.headers
        );
        match what {
            "health" | "management" | "in-process answer" | "proxied answer" => {
                assert_eq!(r.status, 200, "{what}: {}", r.text());
            }
            _ => assert!(
                r.header("x-tidegate-error").is_some(),
                "{what}: not a gateway error: {} {:?}",
                r.status,
                r.headers
            ),
        }
    }
    assert_eq!(mock.hits(CHAT), 1);
    // The same connection, now a stream: close-delimited, and the connection ends with it.
    c.write_raw(&request_bytes(0, "mock/echo", "streamed", true, keep));
    let r = c.read_response();
    assert!(!r.chunked, "chunked answer to HTTP/1.0: {:?}", r.headers);
    assert!(
        says_close(&r) && !says_keep_alive(&r),
        "a close-delimited answer says close: {:?}",
        r.headers
    );
    assert_eq!(answer_text(&r), "streamed");
    assert!(c.closed_within(secs(5)), "close-delimited stream left open");
    // A proxied stream from a real upstream is close-delimited too.
    mock.on(CHAT, Reply::openai_stream(&["up", "stream"]));
    let mut c = Client::connect(gw.addr());
    c.write_raw(&request_bytes(0, "up/m1", "s", true, keep));
    let r = c.read_response();
    assert!(!r.chunked && says_close(&r), "{:?}", r.headers);
    assert_eq!(answer_text(&r), "upstream");
    assert!(c.closed_within(secs(5)), "close-delimited stream left open");
    // Without keep-alive: `close`, and the connection closes.
    for bytes in [get("/healthz", ""), get("/v1/nowhere", "")] {
        let mut c = Client::connect(gw.addr());
        c.write_raw(&bytes);
        let r = c.read_response();
        assert!(
            says_close(&r) && !says_keep_alive(&r),
            "{} {:?}",
            r.status,
            r.headers
        );
        assert!(c.closed_within(secs(5)), "HTTP/1.0 connection left open");
    }
}

#[test]
fn connection_close_from_the_client_closes_after_the_answer() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    let mut h = headers().to_vec();
    h.push(("connection", "close"));
    let r = c.request(
        "POST",
        CHAT,
        &h,
        chat_body("mock/echo", "bye", false).as_bytes(),
    );
    assert_eq!(answer_text(&r), "bye");
    assert!(says_close(&r), "{:?}", r.headers);
    assert!(c.closed_within(secs(5)), "connection left open after close");
}

#[test]
fn connection_close_on_a_streamed_answer_closes_after_it() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    let mut h = headers().to_vec();
    h.push(("connection", "close"));
    let r = c.request(
        "POST",
        CHAT,
        &h,
        chat_body("mock/drip-5", "streamed bye", true).as_bytes(),
    );
    assert_eq!(answer_text(&r), "streamed bye");
    assert!(says_close(&r), "{:?}", r.headers);
    assert!(c.closed_within(secs(5)), "connection left open after close");
}

/// Reads exactly `n` bytes within `timeout`; panics if they do not come.
fn read_exactly(s: &mut TcpStream, n: usize, timeout: std::time::Duration) -> Vec<u8> {
    let deadline = Deadline::after(timeout);
    let mut got = Vec::new();
    let mut scratch = vec![0u8; n];
    while got.len() < n {
        let left = deadline.remaining();
        assert!(
            !left.is_zero(),
            "only {:?} within {timeout:?}",
            String::from_utf8_lossy(&got)
        );
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut scratch[..n - got.len()]) {
            Ok(0) => panic!(
                "closed after {:?}, expected {n} bytes",
                String::from_utf8_lossy(&got)
            ),
            Ok(k) => got.extend_from_slice(&scratch[..k]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    got
}

#[test]
fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let gw = start();
    let body = chat_body("mock/echo", "after continue", false);
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\nexpect: 100-continue\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut s = TcpStream::connect_timeout(&gw.addr(), secs(5)).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let interim = read_exactly(&mut s, 25, secs(10));
    assert_eq!(
        String::from_utf8_lossy(&interim),
        "HTTP/1.1 100 Continue\r\n\r\n"
    );
    s.write_all(body.as_bytes()).unwrap();
    // `connection: close`, so the rest is the final answer up to the close.
    let mut rest = Vec::new();
    let deadline = Deadline::after(secs(10));
    let mut scratch = [0u8; 4096];
    loop {
        let left = deadline.remaining();
        assert!(!left.is_zero(), "final answer not complete within 10 s");
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut scratch) {
            Ok(0) => break,
            Ok(n) => rest.extend_from_slice(&scratch[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("read: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.starts_with("HTTP/1.1 200 "),
        "final answer after 100 Continue: {text:?}"
    );
    let (_, json_body) = text.split_once("\r\n\r\n").unwrap();
    let v: serde_json::Value = serde_json::from_str(json_body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "after continue");
}

#[test]
fn chunked_upload_reaches_the_upstream_byte_identical_with_a_content_length() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("uploaded"));
    let gw = Gateway::start(&config(60_000, Some(&mock)));

    // A body with multi-byte UTF-8, escapes and odd spacing, so a re-serialisation would
    // show. The bare model `m1` is sent upstream as is (a `provider/model` would be rewritten
    // to the part after the `/`).
    let body = format!(
        "{{\"model\":\"m1\",  \"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}],\
         \"temperature\":0.50, \"x\":\"\\u00e9 \u{e9} \\\" tab\\t\"}}",
        "chunk me ".repeat(40)
    );
    let bytes = body.as_bytes();
    // Odd chunk sizes, one with an extension, and a trailer at the end.
    let mut wire = Vec::new();
    let sizes = [1usize, 7, 13, 2, 31, 64, 3, 127, 5];
    let mut at = 0;
    let mut i = 0;
    while at < bytes.len() {
        let n = sizes[i % sizes.len()].min(bytes.len() - at);
        if i == 3 {
            wire.extend(format!("{n:x};ext=yes\r\n").as_bytes());
        } else {
            wire.extend(format!("{n:X}\r\n").as_bytes());
        }
        wire.extend_from_slice(&bytes[at..at + n]);
        wire.extend_from_slice(b"\r\n");
        at += n;
        i += 1;
    }
    wire.extend_from_slice(b"0\r\nx-trailer: t\r\n\r\n");

    let mut c = Client::connect(gw.addr());
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    c.write_raw(head.as_bytes());
    // Written slowly in pieces that cut across chunk-size lines and data.
    for piece in wire.chunks(11) {
        c.write_raw(piece);
        std::thread::sleep(ms(2));
    }
    let r = c.read_response();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "uploaded");

    let reqs = mock.requests_to(CHAT);
    assert_eq!(reqs.len(), 1);
    let up = &reqs[0];
    assert_eq!(
        String::from_utf8_lossy(&up.body),
        body,
        "the upstream got a different body"
    );
    assert_eq!(
        up.header("content-length"),
        Some(body.len().to_string().as_str()),
        "upstream headers {:?}",
        up.headers
    );
    assert_eq!(up.header("transfer-encoding"), None, "{:?}", up.headers);
    assert_eq!(up.header("x-trailer"), None, "{:?}", up.headers);
    assert!(mock.problems().is_empty(), "{:?}", mock.problems());

    // Keep-alive holds after a chunked upload.
    let r = c.request(
        "POST",
        CHAT,
        &headers(),
        chat_body("up/m1", "again", false).as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.hits(CHAT), 2);
}

#[test]
fn idle_keep_alive_connection_is_closed_after_idle_timeout() {
    let gw = Gateway::start(&config(300, None));
    let mut c = Client::connect(gw.addr());
    let r = c.request(
        "POST",
        CHAT,
        &headers(),
        chat_body("mock/echo", "then idle", false).as_bytes(),
    );
    assert_eq!(answer_text(&r), "then idle");
    assert!(!says_close(&r));
    let idle = Stopwatch::start();
    assert!(
        c.closed_within(secs(10)),
        "idle connection not closed (silently) within 10 s"
    );
    assert!(
        idle.elapsed() >= ms(200),
        "closed after {:?}, before idle_timeout_ms = 300",
        idle.elapsed()
    );
    // A connection that keeps talking is not cut by the idle timeout: it keeps asking until
    // a silent connection opened beside it has been closed for idleness, and still works.
    let mut busy = Client::connect(gw.addr());
    let mut silent = Client::connect(gw.addr());
    let mut i = 0;
    let talk = |busy: &mut Client, i: u32| {
        let prompt = format!("busy {i}");
        let r = busy.request(
            "POST",
            CHAT,
            &headers(),
            chat_body("mock/echo", &prompt, false).as_bytes(),
        );
        assert_eq!(answer_text(&r), prompt);
        assert!(!says_close(&r));
    };
    eventually(secs(10), "the silent connection to be closed", || {
        talk(&mut busy, i);
        i += 1;
        silent.closed_within(ms(50)).then_some(())
    });
    talk(&mut busy, i);
}

#[test]
fn a_reloaded_idle_timeout_applies_to_the_next_idle_wait_of_an_open_connection() {
    // Opened under a long idle timeout; the reload shortens it. The connection's next wait
    // between requests (it began under the long one) gets the new budget, and so does a
    // connection opened after the reload.
    let mut gw = Gateway::start(&config(60_000, None));
    let mut open = Client::connect(gw.addr());
    let ask = |c: &mut Client, prompt: &str| {
        let r = c.request(
            "POST",
            CHAT,
            &headers(),
            chat_body("mock/echo", prompt, false).as_bytes(),
        );
        assert_eq!(answer_text(&r), prompt);
        assert!(!says_close(&r));
    };
    ask(&mut open, "before");
    std::fs::write(gw.config_path(), config(300, None)).unwrap();
    gw.signal(libc::SIGHUP);
    gw.wait_for_log("configuration reloaded", secs(10));
    // Its wait under the old budget ends with this request; the next one is 300 ms.
    ask(&mut open, "after");
    let idle = Stopwatch::start();
    assert!(
        open.closed_within(secs(10)),
        "connection open before the reload not closed within 10 s of idleness"
    );
    assert!(
        idle.elapsed() >= ms(200),
        "closed after {:?}, before idle_timeout_ms = 300",
        idle.elapsed()
    );
    let mut fresh = Client::connect(gw.addr());
    ask(&mut fresh, "new");
    assert!(
        fresh.closed_within(secs(10)),
        "connection opened after the reload not closed within 10 s of idleness"
    );
}
