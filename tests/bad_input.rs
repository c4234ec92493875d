//! Bad input over real sockets: every malformed, oversized, unauthenticated or misrouted
//! request gets its exact gateway-made answer (status, `x-tidegate-error`, JSON error body),
//! framing errors close the connection, and the gateway keeps serving afterwards. One shard
//! (`workers = 1`), so a panicked shard would show as a dead gateway in the next request.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::json;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use support::{Client, Deadline, Gateway, Response, Stopwatch, ms, secs};

const CHAT: &str = "/v1/chat/completions";
const KEY: &str = "test-key";
/// `max_request_body_bytes` of the test config.
const MAX_BODY: usize = 1024;
/// `header_timeout_ms` of the test config.
const HEADER_TIMEOUT_MS: u64 = 300;
/// `idle_timeout_ms` of the test config (also the longest gap inside a request body).
const IDLE_TIMEOUT_MS: u64 = 500;

fn config() -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1
header_timeout_ms = {HEADER_TIMEOUT_MS}
idle_timeout_ms = {IDLE_TIMEOUT_MS}
max_request_body_bytes = {MAX_BODY}

[[client_keys]]
id = "t"
key = "{KEY}"

[[providers]]
id = "mock"
format = "mock"
models = ["echo"]

[[connections]]
id = "c1"
provider = "mock"
"#
    )
}

fn start() -> Gateway {
    Gateway::start(&config())
}

/// A well-formed chat request body echoing `prompt`.
fn chat_body(prompt: &str) -> String {
    json!({"model": "mock/echo", "messages": [{"role": "user", "content": prompt}]}).to_string()
}

/// A complete, valid chat request with its body, as raw bytes.
fn good_request_bytes(prompt: &str) -> Vec<u8> {
    let body = chat_body(prompt);
    format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// `POST /v1/chat/completions` on a new connection with `headers` and `body`.
fn post(gw: &Gateway, headers: &[(&str, &str)], body: &[u8]) -> Response {
    Client::connect(gw.addr()).request("POST", CHAT, headers, body)
}

fn authed() -> [(&'static str, &'static str); 2] {
    [
        ("authorization", "Bearer test-key"),
        ("content-type", "application/json"),
    ]
}

/// The `error.type` docs/api.md gives for a status.
fn expected_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        503 => "service_unavailable",
        504 => "gateway_timeout",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// Checks a gateway-made error: status, `x-tidegate-error`, and the JSON error body.
fn assert_gateway_error(r: &Response, status: u16, code: &str) {
    assert_eq!(
        r.status,
        status,
        "expected {status} {code}, got {} {:?} with body {:?}",
        r.status,
        r.header("x-tidegate-error"),
        r.text()
    );
    assert_eq!(
        r.header("x-tidegate-error"),
        Some(code),
        "headers {:?}",
        r.headers
    );
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "headers {:?}",
        r.headers
    );
    let v = r.json();
    let err = &v["error"];
    assert_eq!(err["code"], code, "body {v}");
    assert_eq!(err["type"], expected_type(status), "body {v}");
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "error.message must be a non-empty string: {v}"
    );
}

/// The gateway still answers a good request on a new connection, and no shard panicked.
fn assert_still_serves(gw: &Gateway) {
    let prompt = "still serving";
    let r = post(gw, &authed(), chat_body(prompt).as_bytes());
    assert_eq!(r.status, 200, "good request after bad input: {}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], prompt);
    let logs = gw.logs();
    assert!(!logs.contains("panicked"), "the gateway panicked:\n{logs}");
}

/// Writes `bytes` on a new connection, expects the error `status`/`code` with
/// `Connection: close`, and the connection closed after it.
fn expect_closing_error(gw: &Gateway, bytes: &[u8], status: u16, code: &str) -> Response {
    let mut c = Client::connect(gw.addr());
    c.write_raw(bytes);
    let r = c.read_response();
    assert_gateway_error(&r, status, code);
    assert_eq!(
        r.header("connection"),
        Some("close"),
        "a framing error must close the connection: {:?}",
        r.headers
    );
    assert!(
        c.closed_within(secs(5)),
        "connection still open after {status} {code}"
    );
    r
}

/// A request head (no body) for the chat route with the test key and `extra` header lines.
fn head_with(extra: &str) -> Vec<u8> {
    format!("POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n{extra}\r\n")
        .into_bytes()
}

// ----- request line and header syntax ---------------------------------------------------------

#[test]
fn malformed_request_lines_get_400_and_close() {
    let gw = start();
    let cases: [&[u8]; 5] = [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/chat/completions\r\nhost: gw\r\n\r\n",
        b"POST /v1/chat/completions HTTX/1.1\r\nhost: gw\r\n\r\n",
        b"POST  /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\nhost: gw\n\n",
    ];
    for case in cases {
        expect_closing_error(&gw, case, 400, "bad_request");
    }
    assert_still_serves(&gw);
}

#[test]
fn header_without_colon_gets_400_and_close() {
    let gw = start();
    expect_closing_error(&gw, &head_with("NoColonHere\r\n"), 400, "bad_request");
    assert_still_serves(&gw);
}

#[test]
fn invalid_header_names_get_400_and_close() {
    let gw = start();
    for line in [
        "bad header: v\r\n",
        "x(y): v\r\n",
        "x\u{1}y: v\r\n",
        ": empty-name\r\n",
    ] {
        expect_closing_error(&gw, &head_with(line), 400, "bad_request");
    }
    assert_still_serves(&gw);
}

#[test]
fn head_timeout_closes_the_connection_within_a_bound() {
    // Whatever the answer, half a head must not hold the connection (or the shard) forever.
    let gw = start();
    let mut c = Client::connect(gw.addr());
    c.write_raw(format!("POST {CHAT} HTTP/1.1\r\nhost: gw\r\n").as_bytes());
    let _ = c.read_until_close(secs(10));
    assert_still_serves(&gw);
}

#[test]
fn head_timeout_gets_408() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    let watch = Stopwatch::start();
    // Half a head: the request line and one field, no empty line.
    c.write_raw(format!("POST {CHAT} HTTP/1.1\r\nhost: gw\r\n").as_bytes());
    let r = c.read_response();
    let took = watch.elapsed();
    assert_gateway_error(&r, 408, "request_timeout");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(secs(5)), "connection open after 408");
    assert!(
        took >= ms(HEADER_TIMEOUT_MS - 50),
        "408 after {took:?}, before header_timeout_ms = {HEADER_TIMEOUT_MS}"
    );
    assert_still_serves(&gw);
}

#[test]
fn head_trickled_byte_by_byte_past_the_budget_gets_408() {
    // The budget runs from the first byte of the head: bytes that keep arriving do not
    // extend it (a slowloris client is cut off).
    let gw = start();
    let mut c = Client::connect(gw.addr());
    let watch = Stopwatch::start();
    c.write_raw(format!("POST {CHAT} HTTP/1.1\r\nhost: gw\r\nx-slow: ").as_bytes());
    let deadline = Deadline::after(secs(10));
    c.set_timeout(ms(50));
    // One more byte every 50 ms until the gateway answers.
    let head = loop {
        assert!(
            !deadline.passed(),
            "no answer while trickling a head for 10 s"
        );
        c.write_raw(b"a");
        match c.try_read_head() {
            Ok(head) => break head,
            Err(e) if e.kind() == ErrorKind::TimedOut => continue,
            Err(e) => panic!("connection ended without an answer: {e}"),
        }
    };
    assert!(
        watch.elapsed() >= ms(HEADER_TIMEOUT_MS - 50),
        "answered after {:?}",
        watch.elapsed()
    );
    assert_eq!(head.status, 408);
    assert_eq!(head.header("x-tidegate-error"), Some("request_timeout"));
    assert_eq!(head.header("connection"), Some("close"));
    let mut body = Vec::new();
    loop {
        match c.next_body_piece(secs(5)) {
            support::Piece::Data(d) => body.extend_from_slice(&d),
            support::Piece::End => break,
            other => panic!("408 body did not complete: {other:?}"),
        }
    }
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "request_timeout");
    assert_still_serves(&gw);
}

#[test]
fn body_stalled_mid_way_gets_408() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    let watch = Stopwatch::start();
    c.write_raw(&head_with("content-length: 50\r\n"));
    c.write_raw(b"{\"model\":");
    let r = c.read_response();
    assert_gateway_error(&r, 408, "request_timeout");
    assert!(c.closed_within(secs(5)), "connection open after 408");
    assert!(
        watch.elapsed() >= ms(IDLE_TIMEOUT_MS - 50),
        "408 after {:?}, before idle_timeout_ms = {IDLE_TIMEOUT_MS}",
        watch.elapsed()
    );
    assert_still_serves(&gw);
}

// ----- size limits ----------------------------------------------------------------------------

#[test]
fn head_over_16_kib_gets_431() {
    let gw = start();
    // Exactly 16 KiB of head with no end in sight: anything longer would be over the limit.
    // (Exactly that much, so the gateway has read every byte when it closes and the kernel
    // sends no reset that could race the answer.)
    let mut head = head_with("x-big: ");
    head.pop();
    head.pop();
    head.resize(16 * 1024, b'a');
    expect_closing_error(&gw, &head, 431, "request_header_fields_too_large");
    assert_still_serves(&gw);
}

#[test]
fn a_long_head_under_16_kib_is_served() {
    let gw = start();
    let big = "a".repeat(15 * 1024);
    let mut headers = authed().to_vec();
    headers.push(("x-big", big.as_str()));
    let r = post(&gw, &headers, chat_body("big head").as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
}

fn head_with_fields(n: usize) -> Vec<u8> {
    // host, authorization, content-type and content-length, plus x-h-* fields up to `n`.
    let body = chat_body("many headers");
    let mut head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for i in 4..n {
        head.push_str(&format!("x-h-{i}: v\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

#[test]
fn ninety_seven_headers_get_431_and_ninety_six_are_served() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    c.write_raw(&head_with_fields(96));
    let r = c.read_response();
    assert_eq!(r.status, 200, "96 header fields are allowed: {}", r.text());

    // The body follows the head; the gateway refuses at the head, so send only the head to
    // leave no unread bytes behind.
    let bytes = head_with_fields(97);
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    expect_closing_error(
        &gw,
        &bytes[..head_end],
        431,
        "request_header_fields_too_large",
    );
    assert_still_serves(&gw);
}

#[test]
fn content_length_over_the_max_gets_413_before_the_body_is_sent() {
    let gw = start();
    let head = head_with(&format!("content-length: {}\r\n", MAX_BODY + 1));
    // Only the head is written: the answer must come without waiting for the body.
    expect_closing_error(&gw, &head, 413, "request_too_large");
    let huge = head_with("content-length: 99999999999999\r\n");
    expect_closing_error(&gw, &huge, 413, "request_too_large");
    assert_still_serves(&gw);
}

#[test]
fn a_body_of_exactly_the_max_is_read() {
    let gw = start();
    // A JSON body padded with spaces to exactly max_request_body_bytes.
    let mut body = chat_body("exact").into_bytes();
    body.resize(MAX_BODY, b' ');
    let r = post(&gw, &authed(), &body);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn chunked_body_growing_over_the_max_gets_413() {
    let gw = start();
    let mut c = Client::connect(gw.addr());
    c.write_raw(&head_with("transfer-encoding: chunked\r\n"));
    let half = vec![b' '; MAX_BODY / 2];
    let mut chunk = format!("{:x}\r\n", half.len()).into_bytes();
    chunk.extend_from_slice(&half);
    chunk.extend_from_slice(b"\r\n");
    // Two halves reach the limit exactly, which is allowed; one byte more is not.
    c.write_raw(&chunk);
    c.write_raw(&chunk);
    c.write_raw(b"1\r\nx\r\n");
    let r = c.read_response();
    assert_gateway_error(&r, 413, "request_too_large");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(secs(5)), "connection open after 413");
    assert_still_serves(&gw);
}

// ----- body framing ---------------------------------------------------------------------------

#[test]
fn content_length_with_transfer_encoding_gets_400() {
    let gw = start();
    let head = head_with("content-length: 5\r\ntransfer-encoding: chunked\r\n");
    expect_closing_error(&gw, &head, 400, "bad_request");
    assert_still_serves(&gw);
}

#[test]
fn transfer_encoding_other_than_chunked_gets_501() {
    let gw = start();
    for te in ["gzip", "gzip, chunked", "chunked, gzip", "identity"] {
        let head = head_with(&format!("transfer-encoding: {te}\r\n"));
        expect_closing_error(&gw, &head, 501, "unsupported_transfer_encoding");
    }
    assert_still_serves(&gw);
}

#[test]
fn bad_content_lengths_get_400() {
    let gw = start();
    for cl in ["abc", "-1", "1 2", "0x10", "+5", "5, 6"] {
        let head = head_with(&format!("content-length: {cl}\r\n"));
        expect_closing_error(&gw, &head, 400, "bad_request");
    }
    let two = head_with("content-length: 5\r\ncontent-length: 6\r\n");
    expect_closing_error(&gw, &two, 400, "bad_request");
    assert_still_serves(&gw);
}

#[test]
fn invalid_chunked_framing_gets_400() {
    let gw = start();
    let cases: [&[u8]; 4] = [
        b"zz\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhelloXX0\r\n\r\n",
        b"5\nhello\n0\n\n",
        b"fffffffffffffffffffff\r\n",
    ];
    for body in cases {
        let mut bytes = head_with("transfer-encoding: chunked\r\n");
        bytes.extend_from_slice(body);
        expect_closing_error(&gw, &bytes, 400, "bad_request");
    }
    assert_still_serves(&gw);
}

// ----- body content ---------------------------------------------------------------------------

/// Sends `body` as a well-framed POST and expects 400 invalid_json; the connection stays
/// usable (the request stream is still in sync).
fn expect_invalid_json(gw: &Gateway, body: &[u8]) {
    let mut c = Client::connect(gw.addr());
    let r = c.request("POST", CHAT, &authed(), body);
    assert_gateway_error(&r, 400, "invalid_json");
    let next = c.request(
        "POST",
        CHAT,
        &authed(),
        chat_body("same connection").as_bytes(),
    );
    assert_eq!(
        next.status,
        200,
        "keep-alive after invalid_json: {}",
        next.text()
    );
}

#[test]
fn invalid_json_body_gets_400_invalid_json() {
    let gw = start();
    for body in [
        &b"{not json"[..],
        b"",
        b"{\"model\":\"mock/echo\"",
        b"\xff\xfe{}",
    ] {
        expect_invalid_json(&gw, body);
    }
    assert_still_serves(&gw);
}

#[test]
fn json_that_is_not_an_object_gets_400_invalid_json() {
    let gw = start();
    for body in [r#"[{"model":"mock/echo"}]"#, r#""mock/echo""#, "42", "null"] {
        expect_invalid_json(&gw, body.as_bytes());
    }
    assert_still_serves(&gw);
}

#[test]
fn non_string_model_gets_400_invalid_json() {
    let gw = start();
    // (A body without `model` gets 400 `missing_model`: tests/client_experience.rs.)
    for body in [
        json!({"model": 7, "messages": []}),
        json!({"model": null, "messages": []}),
    ] {
        expect_invalid_json(&gw, body.to_string().as_bytes());
    }
    assert_still_serves(&gw);
}

#[test]
fn non_bool_stream_gets_400_invalid_json() {
    let gw = start();
    for stream in [json!("yes"), json!(1), json!("true"), json!([true])] {
        let body = json!({"model": "mock/echo", "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]});
        expect_invalid_json(&gw, body.to_string().as_bytes());
    }
    // `null` is read as `false` on purpose (the OpenAI schema declares `stream` nullable).
    let body = json!({"model": "mock/echo", "stream": null,
        "messages": [{"role": "user", "content": "null stream"}]});
    let r = post(&gw, &authed(), body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "null stream");
    assert_still_serves(&gw);
}

// ----- authentication -------------------------------------------------------------------------

#[test]
fn missing_key_gets_401() {
    let gw = start();
    let r = post(
        &gw,
        &[("content-type", "application/json")],
        chat_body("x").as_bytes(),
    );
    assert_gateway_error(&r, 401, "invalid_api_key");
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_still_serves(&gw);
}

#[test]
fn wrong_keys_get_401() {
    let gw = start();
    for auth in [
        "Bearer wrong-key",
        "Bearer test-key-but-longer",
        "Bearer ",
        "Basic dGVzdC1rZXk=",
        "test-key",
    ] {
        let r = post(
            &gw,
            &[
                ("authorization", auth),
                ("content-type", "application/json"),
            ],
            chat_body("x").as_bytes(),
        );
        assert_gateway_error(&r, 401, "invalid_api_key");
    }
    let r = post(
        &gw,
        &[("x-api-key", "nope"), ("content-type", "application/json")],
        chat_body("x").as_bytes(),
    );
    assert_gateway_error(&r, 401, "invalid_api_key");
    assert_still_serves(&gw);
}

#[test]
fn x_api_key_is_accepted() {
    let gw = start();
    let r = post(
        &gw,
        &[("x-api-key", KEY), ("content-type", "application/json")],
        chat_body("via x-api-key").as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "via x-api-key"
    );
    assert_eq!(r.header("x-tidegate-error"), None);
}

// ----- routing --------------------------------------------------------------------------------

#[test]
fn unknown_route_gets_404_not_found() {
    let gw = start();
    for (method, path) in [
        ("POST", "/v1/nope"),
        ("GET", "/"),
        ("POST", "/v2/chat/completions"),
    ] {
        let r =
            Client::connect(gw.addr()).request(method, path, &authed(), chat_body("x").as_bytes());
        assert_gateway_error(&r, 404, "not_found");
    }
    assert_still_serves(&gw);
}

#[test]
fn get_on_chat_completions_gets_405() {
    let gw = start();
    let r = Client::connect(gw.addr()).request("GET", CHAT, &authed(), b"");
    assert_gateway_error(&r, 405, "method_not_allowed");
    let r = Client::connect(gw.addr()).request("PUT", CHAT, &authed(), chat_body("x").as_bytes());
    assert_gateway_error(&r, 405, "method_not_allowed");
    assert_still_serves(&gw);
}

#[test]
fn unknown_model_gets_404_model_not_found() {
    let gw = start();
    for model in ["no-such-model", "nobody/m1", "mock/"] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "x"}]});
        let r = post(&gw, &authed(), body.to_string().as_bytes());
        assert_gateway_error(&r, 404, "model_not_found");
    }
    assert_still_serves(&gw);
}

// ----- other protocols and garbage ------------------------------------------------------------

#[test]
fn http2_preface_gets_400_and_close() {
    let gw = start();
    // The HTTP/2 connection preface followed by an empty SETTINGS frame, as h2c
    // prior-knowledge clients send it.
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let mut c = Client::connect(gw.addr());
    c.write_raw(&bytes);
    // Not a hang: an answer or a close within the bound. The gateway answers 400.
    let r = c.read_response();
    assert_gateway_error(&r, 400, "bad_request");
    assert!(
        c.closed_within(secs(5)),
        "connection open after the preface"
    );
    assert_still_serves(&gw);
}

#[test]
fn binary_garbage_gets_400_and_close() {
    let gw = start();
    let tls_client_hello: &[u8] = &[
        0x16, 0x03, 0x01, 0x00, 0x2f, 0x01, 0x00, 0x00, 0x2b, 0x03, 0x03, 0x00, 0x01, 0x02,
    ];
    let cases: [&[u8]; 4] = [
        tls_client_hello,
        &[0, 0, 0, 0, 0, 0, 0, 0],
        &[0xff; 64],
        b"\x7fELF\x02\x01\x01\0\0\0",
    ];
    for case in cases {
        expect_closing_error(&gw, case, 400, "bad_request");
    }
    assert_still_serves(&gw);
}

/// A tiny deterministic PRNG (xorshift64*), so the byte strings are the same on every run.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Pieces of HTTP the token-soup inputs are made of, so many of them get past the first byte.
const VOCABULARY: &[&str] = &[
    "POST",
    "GET",
    "HEAD",
    " ",
    "  ",
    "/v1/chat/completions",
    "/v1/models",
    "/healthz",
    "/",
    "*",
    "HTTP/1.1",
    "HTTP/1.0",
    "HTTP/2.0",
    "\r\n",
    "\r\n\r\n",
    "\n",
    "\r",
    ":",
    "host: gw",
    "content-length: ",
    "transfer-encoding: chunked",
    "transfer-encoding: gzip",
    "expect: 100-continue",
    "connection: close",
    "connection: keep-alive",
    "authorization: Bearer test-key",
    "x-api-key: test-key",
    "0",
    "5",
    "1024",
    "ffffffffffffffffffff",
    "-1",
    ";ext=1",
    "{\"model\":\"mock/echo\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
    "{\"model\":",
    "{",
    "}",
    "[",
    "\"",
    "\0",
    "\x7f",
    "\u{e9}",
    "\t",
];

/// The `i`th fuzz input: pure random bytes, a method followed by random bytes, a soup of
/// HTTP tokens, or a valid request with a few random mutations.
fn fuzz_case(rng: &mut XorShift, i: usize) -> Vec<u8> {
    match i % 4 {
        0 => {
            let n = 1 + rng.below(512);
            rng.bytes(n)
        }
        1 => {
            let mut b = b"POST ".to_vec();
            let n = rng.below(256);
            b.extend(rng.bytes(n));
            b
        }
        2 => {
            let n = 1 + rng.below(40);
            let mut b = Vec::new();
            for _ in 0..n {
                if rng.below(8) == 0 {
                    b.push(rng.next() as u8);
                } else {
                    b.extend_from_slice(VOCABULARY[rng.below(VOCABULARY.len())].as_bytes());
                }
            }
            b
        }
        _ => {
            let mut b = good_request_bytes("fuzz");
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(b.len());
                match rng.below(4) {
                    0 => b[at] = rng.next() as u8,
                    1 => {
                        b.remove(at);
                    }
                    2 => b.insert(at, rng.next() as u8),
                    _ => b.truncate(at.max(1)),
                }
            }
            b
        }
    }
}

/// Writes `bytes` on a new connection, half-closes it, and returns everything the gateway
/// sends until it closes; panics if it neither answers nor closes within the bound.
fn send_and_drain(gw: &Gateway, bytes: &[u8], what: &str) -> Vec<u8> {
    let mut s = TcpStream::connect_timeout(&gw.addr(), secs(5))
        .unwrap_or_else(|e| panic!("{what}: connect: {e}"));
    // The gateway may refuse early and close while we still write: not a failure.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    let deadline = Deadline::after(secs(10));
    let mut got = Vec::new();
    let mut scratch = [0u8; 4096];
    loop {
        let left = deadline.remaining();
        assert!(
            !left.is_zero(),
            "{what}: the gateway neither answered nor closed within 10 s (got {:?})",
            String::from_utf8_lossy(&got)
        );
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut scratch) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&scratch[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            // A reset (the gateway closed with our bytes unread) is a close too.
            Err(_) => return got,
        }
    }
}

#[test]
fn two_hundred_random_inputs_are_answered_or_closed_and_the_gateway_survives() {
    let gw = start();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut answered = 0;
    for i in 0..200 {
        let input = fuzz_case(&mut rng, i);
        let what = format!("case {i} ({:?})", String::from_utf8_lossy(&input));
        let got = send_and_drain(&gw, &input, &what);
        if got.is_empty() {
            continue;
        }
        answered += 1;
        // Whatever came back is HTTP/1.1 responses, the first one a complete status line.
        assert!(
            got.starts_with(b"HTTP/1.1 "),
            "{what}: answer is not HTTP/1.1: {:?}",
            String::from_utf8_lossy(&got)
        );
        let status: u16 = std::str::from_utf8(&got[9..12])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "{what}: bad status line {:?}",
                    String::from_utf8_lossy(&got)
                )
            });
        assert!((100..600).contains(&status), "{what}: status {status}");
        // Every error here is gateway-made (the mock provider only echoes).
        if status >= 400 {
            let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
            assert!(
                text.contains("x-tidegate-error: "),
                "{what}: error answer without x-tidegate-error: {text:?}"
            );
        }
    }
    assert!(answered > 0, "no input was answered at all");
    assert_still_serves(&gw);
}
