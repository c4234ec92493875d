//! Self-tests of the integration-test support code (`tests/support/`): the scripted
//! `MockUpstream` driven by the support client and by raw sockets, its TLS against a verifying
//! rustls client, the gateway launcher against a stand-in process, and the Python SDK client
//! against the mock's LLM-shaped replies.
// Test code: a failed unwrap is a failed test, in helpers as in `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc;
use support::{
    Chunk, Client, Gate, Gateway, MockUpstream, Piece, ReadyLine, Reply, Stopwatch, ms, parse_sse,
    secs, send_raw,
};

const CHAT: &str = "/v1/chat/completions";

fn post(client: &mut Client, path: &str, body: &str) -> support::Response {
    client.request(
        "POST",
        path,
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
}

// ----- scripting -----------------------------------------------------------------------------

#[test]
fn queued_replies_play_in_order_then_the_fallback_repeats() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(500, "boom"))
        .on(CHAT, Reply::status(429).header("retry-after", "7"))
        .on_always(CHAT, Reply::openai_chat("hello"));

    let mut c = Client::connect(mock.addr());
    let statuses: Vec<u16> = (0..4).map(|_| post(&mut c, CHAT, "{}").status).collect();
    assert_eq!(statuses, [500, 429, 200, 200]);

    let second = {
        let mut c2 = Client::connect(mock.addr());
        post(&mut c2, CHAT, "{}")
    };
    assert_eq!(second.json()["choices"][0]["message"]["content"], "hello");
    assert_eq!(mock.hits(CHAT), 5);
    assert_eq!(mock.total_hits(), 5);
    assert!(mock.problems().is_empty(), "{:?}", mock.problems());
}

#[test]
fn scripted_headers_status_and_body_are_sent_as_given() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/x",
        Reply::status(429)
            .header("retry-after", "7")
            .header("x-ratelimit-remaining-requests", "0")
            .body("slow down"),
    );
    let r = Client::connect(mock.addr()).request("GET", "/v1/x", &[], b"");
    assert_eq!((r.status, r.reason.as_str()), (429, "Too Many Requests"));
    assert_eq!(r.header("Retry-After"), Some("7"));
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(r.header("content-length"), Some("9"));
    assert_eq!(r.text(), "slow down");
}

#[test]
fn unscripted_paths_get_a_404_and_are_reported() {
    let mock = MockUpstream::start();
    let r = Client::connect(mock.addr()).request("POST", "/v1/nope", &[], b"{}");
    assert_eq!(r.status, 404);
    assert!(
        r.text().contains("nothing scripted for POST /v1/nope"),
        "{}",
        r.text()
    );
    let problems = mock.problems();
    assert_eq!(problems.len(), 1);
    assert!(problems[0].contains("unscripted request POST /v1/nope"));
}

// ----- recording -----------------------------------------------------------------------------

#[test]
fn requests_are_recorded_with_headers_in_order_and_exact_bodies() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let body: Vec<u8> = (0..=255u8)
        .chain(b"\r\n\r\n0\r\n".iter().copied())
        .collect();
    let r = Client::connect(mock.addr()).request(
        "POST",
        "/v1/chat/completions?beta=true",
        &[
            ("Authorization", "Bearer upstream-key"),
            ("X-Custom", "one"),
            ("x-custom", "two"),
        ],
        &body,
    );
    assert_eq!(r.status, 200);

    let reqs = mock.requests_to(CHAT);
    assert_eq!(reqs.len(), 1);
    let req = &reqs[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.target, "/v1/chat/completions?beta=true");
    assert_eq!(req.path, CHAT);
    assert_eq!(req.version, 1);
    assert_eq!(req.connection, 1);
    assert_eq!(req.body, body);
    assert_eq!(req.header("authorization"), Some("Bearer upstream-key"));
    assert_eq!(req.header_all("X-CUSTOM"), ["one", "two"]);
    let names: Vec<&str> = req.headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "host",
            "Authorization",
            "X-Custom",
            "x-custom",
            "content-length"
        ]
    );
}

#[test]
fn chunked_request_bodies_are_decoded_exactly_even_when_split_across_writes() {
    let mock = MockUpstream::start();
    mock.on_always("/upload", Reply::status(204));
    let mut raw = TcpStream::connect(mock.addr()).unwrap();
    raw.set_read_timeout(Some(secs(10))).unwrap();
    let request: &[u8] =
        b"POST /upload HTTP/1.1\r\nhost: mock\r\ntransfer-encoding: chunked\r\n\r\n\
        5;ext=1\r\nhello\r\n\
        1\r\n \r\n\
        A\r\n\r\n0123\r\n45\r\n\
        0\r\nx-trailer: yes\r\n\r\n";
    // Every few bytes in its own write: the parser must wait for the rest at any split point.
    for piece in request.chunks(7) {
        raw.write_all(piece).unwrap();
        raw.flush().unwrap();
    }
    mock.wait_for_hits("/upload", 1, secs(10));
    let req = &mock.requests_to("/upload")[0];
    assert_eq!(req.body, b"hello \r\n0123\r\n45");
    assert_eq!(req.header("transfer-encoding"), Some("chunked"));

    let mut answer = [0u8; 64];
    let n = raw.read(&mut answer).unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 204 No Content\r\n"));
    assert!(mock.problems().is_empty(), "{:?}", mock.problems());
}

#[test]
fn expect_100_continue_is_answered_before_the_body() {
    let mock = MockUpstream::start();
    mock.on_always("/up", Reply::status(200).body("done"));
    let mut c = Client::connect(mock.addr());
    c.write_raw(
        b"POST /up HTTP/1.1\r\nhost: m\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n",
    );
    // The interim answer comes while the body is still unsent.
    let mut raw = TcpStream::connect(mock.addr()).unwrap();
    raw.set_read_timeout(Some(secs(10))).unwrap();
    raw.write_all(
        b"POST /up HTTP/1.1\r\nhost: m\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n",
    )
    .unwrap();
    let mut interim = [0u8; 25];
    raw.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");

    c.write_raw(b"body");
    let r = c.read_response();
    assert_eq!((r.status, r.text().as_str()), (200, "done"));
    assert_eq!(mock.requests_to("/up")[0].body, b"body");
}

#[test]
fn malformed_requests_get_a_400_and_are_reported() {
    let mock = MockUpstream::start();
    let r = send_raw(
        mock.addr(),
        b"POST /x HTTP/1.1\r\nhost: m\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(mock.total_hits(), 0);
    let problems = mock.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("both Transfer-Encoding and Content-Length")),
        "{problems:?}"
    );
}

// ----- connections ---------------------------------------------------------------------------

#[test]
fn keep_alive_reuse_counts_as_one_connection() {
    let mock = MockUpstream::start();
    mock.on_always("/a", Reply::status(200).body("a"));
    let mut c = Client::connect(mock.addr());
    for _ in 0..3 {
        assert_eq!(c.request("GET", "/a", &[], b"").text(), "a");
    }
    assert_eq!(mock.connections_accepted(), 1);
    assert_eq!(mock.open_connections(), 1);

    let mut other = Client::connect(mock.addr());
    other.request("GET", "/a", &[], b"");
    assert_eq!(mock.connections_accepted(), 2);
    let conns: Vec<u64> = mock.requests().iter().map(|r| r.connection).collect();
    assert_eq!(conns, [1, 1, 1, 2]);

    drop(c);
    mock.wait_until(secs(10), "one open connection", |m| {
        m.open_connections() == 1
    });
}

#[test]
fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let mock = MockUpstream::start();
    mock.on("/p", Reply::status(200).body("first"))
        .on("/p", Reply::status(201).body("second"))
        .on("/q", Reply::status(202).body("third"));
    let mut c = Client::connect(mock.addr());
    c.write_raw(
        b"GET /p HTTP/1.1\r\nhost: m\r\n\r\n\
          POST /p HTTP/1.1\r\nhost: m\r\ncontent-length: 2\r\n\r\nhi\
          GET /q HTTP/1.1\r\nhost: m\r\n\r\n",
    );
    let answers: Vec<(u16, String)> = (0..3)
        .map(|_| {
            let r = c.read_response();
            (r.status, r.text())
        })
        .collect();
    assert_eq!(
        answers,
        [
            (200, "first".to_string()),
            (201, "second".to_string()),
            (202, "third".to_string())
        ]
    );
    assert_eq!(mock.connections_accepted(), 1);
    assert_eq!(mock.requests_to("/p")[1].body, b"hi");
    assert_eq!(mock.peak_concurrency(), 1);
}

#[test]
fn close_after_announces_and_closes() {
    let mock = MockUpstream::start();
    mock.on_always("/c", Reply::status(200).body("bye").close_after());
    let mut c = Client::connect(mock.addr());
    let r = c.request("GET", "/c", &[], b"");
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(r.text(), "bye");
    assert!(c.closed_within(secs(10)));
}

#[test]
fn a_client_asking_for_close_is_closed_after_the_answer() {
    let mock = MockUpstream::start();
    mock.on_always("/c", Reply::status(200));
    let mut c = Client::connect(mock.addr());
    let r = c.request("GET", "/c", &[("connection", "close")], b"");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.closed_within(secs(10)));
}

#[test]
fn reset_aborts_the_connection_with_rst() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::reset());
    let mut c = Client::connect(mock.addr());
    c.start_request("POST", CHAT, &[], b"{}");
    let err = c.try_read_response().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    assert_eq!(mock.hits(CHAT), 1);
    mock.wait_for_in_flight(0, secs(10));
}

#[test]
fn close_hangs_up_without_answering() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::close());
    let mut c = Client::connect(mock.addr());
    c.start_request("POST", CHAT, &[], b"{}");
    let err = c.try_read_response().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
}

// ----- timing and streaming ------------------------------------------------------------------

#[test]
fn sse_chunks_are_visible_one_by_one_as_they_are_sent() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(
        CHAT,
        Reply::sse(vec![
            Chunk::data("first"),
            Chunk::wait_for(&gate),
            Chunk::event("second", "two\nlines"),
            Chunk::done(),
        ]),
    );
    let mut c = Client::connect(mock.addr());
    c.start_request("POST", CHAT, &[], b"{}");
    let head = c.read_head();
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    assert_eq!(head.header("transfer-encoding"), Some("chunked"));

    // The first event arrives while the mock is still holding the rest back.
    assert_eq!(
        c.next_body_piece(secs(10)),
        Piece::Data(b"data: first\n\n".to_vec())
    );
    assert_eq!(c.next_body_piece(ms(20)), Piece::Timeout);
    assert_eq!(mock.current_in_flight(), 1);

    gate.open();
    let mut rest = Vec::new();
    loop {
        match c.next_body_piece(secs(10)) {
            Piece::Data(bytes) => rest.extend(bytes),
            Piece::End => break,
            other => panic!("stream broke: {other:?}"),
        }
    }
    let events = parse_sse(&rest);
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].event.as_deref(), Some("second"));
    assert_eq!(events[0].data, "two\nlines");
    assert_eq!(events[1].data, "[DONE]");
    mock.wait_for_in_flight(0, secs(10));
}

#[test]
fn delays_hold_the_reply_and_the_chunks_back() {
    let mock = MockUpstream::start();
    mock.on("/slow", Reply::status(200).body("late").delay_ms(150));
    mock.on(
        "/slow-stream",
        Reply::sse(vec![
            Chunk::data("a"),
            Chunk::delay_ms(150),
            Chunk::data("b"),
        ]),
    );
    let mut c = Client::connect(mock.addr());

    let t = Stopwatch::start();
    assert_eq!(c.request("GET", "/slow", &[], b"").text(), "late");
    assert!(t.elapsed() >= ms(150), "answered after {:?}", t.elapsed());

    let t = Stopwatch::start();
    let r = c.request("GET", "/slow-stream", &[], b"");
    assert!(t.elapsed() >= ms(150), "streamed in {:?}", t.elapsed());
    assert_eq!(r.text(), "data: a\n\ndata: b\n\n");
    assert!(r.chunked);
    assert_eq!(
        r.raw_body,
        b"9\r\ndata: a\n\n\r\n9\r\ndata: b\n\n\r\n0\r\n\r\n".to_vec()
    );
}

#[test]
fn chunked_replies_send_each_part_as_one_chunk() {
    let mock = MockUpstream::start();
    mock.on("/c", Reply::chunked(["ab", "", "cde"]));
    let r = Client::connect(mock.addr()).request("GET", "/c", &[], b"");
    assert_eq!(r.body, b"abcde");
    assert_eq!(r.raw_body, b"2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n");
}

#[test]
fn a_stream_can_be_cut_mid_body() {
    let mock = MockUpstream::start();
    let mut reset = support::openai_stream_chunks(&["Hel", "lo"]);
    reset.truncate(2);
    reset.push(Chunk::reset());
    mock.on(CHAT, Reply::sse(reset));
    mock.on(CHAT, Reply::sse(vec![Chunk::data("x"), Chunk::close()]));

    for _ in 0..2 {
        let mut c = Client::connect(mock.addr());
        c.start_request("POST", CHAT, &[], b"{}");
        assert_eq!(c.read_head().status, 200);
        let mut pieces = 0;
        let end = loop {
            match c.next_body_piece(secs(10)) {
                Piece::Data(_) => pieces += 1,
                other => break other,
            }
        };
        assert!(pieces >= 1);
        assert_eq!(end, Piece::Closed);
    }
}

#[test]
fn peak_concurrency_counts_requests_answered_at_once() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on_always(CHAT, Reply::openai_chat("held").wait_for(&gate));

    let mut a = Client::connect(mock.addr());
    let mut b = Client::connect(mock.addr());
    a.start_request("POST", CHAT, &[], b"{}");
    b.start_request("POST", CHAT, &[], b"{}");
    mock.wait_for_in_flight(2, secs(10));
    gate.open();
    assert_eq!(a.read_response().status, 200);
    assert_eq!(b.read_response().status, 200);
    mock.wait_for_in_flight(0, secs(10));
    assert_eq!(mock.peak_concurrency(), 2);

    // A request stops counting before its answer completes or its connection is cut, so a
    // client that waits for each outcome before the next request is never seen overlapping.
    let sequential = MockUpstream::start();
    sequential
        .on(CHAT, Reply::reset())
        .on(CHAT, Reply::close())
        .on(CHAT, Reply::openai_stream(&["a"]))
        .on_always(CHAT, Reply::openai_chat("one at a time"));
    for _ in 0..20 {
        let mut c = Client::connect(sequential.addr());
        c.start_request("POST", CHAT, &[], b"{}");
        let _ = c.try_read_response();
    }
    assert_eq!(sequential.total_hits(), 20);
    assert_eq!(sequential.peak_concurrency(), 1);
}

#[test]
fn a_stalled_reply_stops_counting_when_the_peer_hangs_up() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::stall());
    let mut c = Client::connect(mock.addr());
    c.start_request("POST", CHAT, &[], b"{}");
    assert_eq!(c.read_head().status, 200);
    assert_eq!(c.next_body_piece(ms(20)), Piece::Timeout);
    mock.wait_for_in_flight(1, secs(10));
    drop(c);
    mock.wait_for_in_flight(0, secs(10));
    mock.wait_until(secs(10), "no open connection", |m| {
        m.open_connections() == 0
    });
}

#[test]
fn dropping_the_mock_releases_stalled_replies() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::stall_before_head());
    mock.on("/s", Reply::stall());
    let mut c1 = Client::connect(mock.addr());
    let mut c2 = Client::connect(mock.addr());
    c1.start_request("POST", CHAT, &[], b"{}");
    c2.start_request("POST", "/s", &[], b"{}");
    mock.wait_for_in_flight(2, secs(10));
    assert_eq!(c2.read_head().status, 200);

    // Drop on another thread so a hang fails the test instead of blocking it.
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(mock);
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(secs(10))
        .expect("dropping the mock did not finish");
    assert!(c1.closed_within(secs(10)));
    assert_eq!(c2.next_body_piece(secs(10)), Piece::Closed);
}

// ----- TLS -----------------------------------------------------------------------------------

fn tls_client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn tls_get(
    mock: &MockUpstream,
    config: Arc<rustls::ClientConfig>,
    name: &str,
) -> io::Result<String> {
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(config, server_name).unwrap();
    let tcp = TcpStream::connect(mock.addr())?;
    tcp.set_read_timeout(Some(secs(10)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(b"GET /v1/models HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    match tls.read_to_end(&mut answer) {
        Ok(_) => {}
        // A peer that closes after close_notify may still surface as EOF; the bytes are in.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[test]
fn tls_mock_is_verified_with_its_generated_ca() {
    let mock = MockUpstream::start_tls();
    mock.on_always(
        "/v1/models",
        Reply::json(200, serde_json::json!({"data": []})),
    );
    assert_eq!(
        mock.base_url(),
        format!("https://localhost:{}/v1", mock.addr().port())
    );
    let path = mock.ca_pem_path();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), mock.ca_pem());
    assert!(mock.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));

    let config = tls_client_config(mock.ca_pem());
    for name in ["localhost", "127.0.0.1"] {
        let answer = tls_get(&mock, Arc::clone(&config), name).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with(r#"{"data":[]}"#), "{answer}");
    }
    assert_eq!(mock.hits("/v1/models"), 2);

    // Another mock's CA does not vouch for this one.
    let stranger = MockUpstream::start_tls();
    let err = tls_get(&mock, tls_client_config(stranger.ca_pem()), "localhost").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    mock.wait_until(secs(10), "the TLS failure reported", |m| {
        m.problems().iter().any(|p| p.contains("tls"))
    });
    // Nor is the certificate good for another name.
    let err = tls_get(&mock, Arc::clone(&config), "example.com").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
}

// ----- client helpers ------------------------------------------------------------------------

#[test]
fn parse_sse_handles_names_multiline_data_crlf_and_comments() {
    let events = parse_sse(
        b": keep-alive\n\nevent: message_start\ndata: {\"a\":1}\n\ndata: x\r\ndata:y\r\n\r\ndata: cut",
    );
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].event.as_deref(), Some("message_start"));
    assert_eq!(events[0].json()["a"], 1);
    assert_eq!(events[1].event, None);
    assert_eq!(events[1].data, "x\ny");
}

#[test]
fn llm_shaped_replies_are_well_formed() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::openai_stream(&["Hel", "lo"]));
    mock.on("/v1/messages", Reply::anthropic_stream(&["Hi", "!"]));
    let events = Client::connect(mock.addr())
        .request("POST", CHAT, &[], b"{}")
        .sse_events();
    let text: String = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| {
            e.json()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "Hello");
    assert_eq!(events.last().unwrap().data, "[DONE]");

    let events = Client::connect(mock.addr())
        .request("POST", "/v1/messages", &[], b"{}")
        .sse_events();
    let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for e in &events {
        assert_eq!(e.json()["type"], e.event.as_deref().unwrap());
    }
}

// ----- gateway launcher ----------------------------------------------------------------------

#[test]
fn ready_line_is_parsed_with_or_without_a_log_prefix() {
    let plain =
        ReadyLine::parse("tidegate listening on 127.0.0.1:8080 (shards=4, driver=io_uring)");
    assert_eq!(
        plain,
        Some(ReadyLine {
            addr: "127.0.0.1:8080".parse().unwrap(),
            shards: 4,
            driver: "io_uring".to_string()
        })
    );
    let logged = ReadyLine::parse(
        "2026-01-01T00:00:00Z  INFO tidegate: tidegate listening on [::1]:9 (shards=1, driver=epoll)\n",
    )
    .unwrap();
    assert_eq!(logged.addr, "[::1]:9".parse().unwrap());
    assert_eq!((logged.shards, logged.driver.as_str()), (1, "epoll"));

    for bad in [
        "tidegate listening on 127.0.0.1:8080",
        "tidegate listening on 127.0.0.1:8080 (shards=x, driver=epoll)",
        "tidegate listening on 127.0.0.1:8080 (shards=2, driver=kqueue)",
        "tidegate listening on localhost:80 (shards=2, driver=epoll)",
    ] {
        assert_eq!(ReadyLine::parse(bad), None, "{bad}");
    }
    assert_eq!(
        ReadyLine::find("starting\ntidegate listening on 127.0.0.1:1 (shards=2, driver=epoll)\n")
            .map(|r| r.shards),
        Some(2)
    );
}

fn fake(script: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    cmd
}

#[test]
fn launcher_reads_the_ready_line_and_terminates_its_process() {
    let mut gw = Gateway::try_start_command(fake(
        "trap 'echo got TERM; exit 0' TERM; echo booting >&2; \
         echo 'tidegate listening on 127.0.0.1:4321 (shards=3, driver=epoll)'; \
         while :; do sleep 0.05; done",
    ))
    .unwrap();
    assert_eq!(gw.addr(), "127.0.0.1:4321".parse().unwrap());
    assert_eq!((gw.shards(), gw.driver()), (3, "epoll"));
    assert_eq!(gw.url("/healthz"), "http://127.0.0.1:4321/healthz");
    // stderr is drained apart from stdout, so it may trail the ready line.
    gw.wait_for_log("booting", secs(10));
    assert!(gw.pid() > 0);

    gw.terminate();
    let status = gw.wait_exit(secs(10)).expect("fake exits on SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(gw.logs().contains("got TERM"), "{}", gw.logs());
    gw.terminate(); // already exited: no signal to a reused pid
}

#[test]
fn launcher_reports_a_process_that_exits_before_ready() {
    let failure = Gateway::try_start_command(fake("echo 'config: bad key' >&2; exit 2"))
        .err()
        .expect("no ready line, so no gateway");
    assert_eq!(failure.status.and_then(|s| s.code()), Some(2));
    assert!(failure.logs.contains("config: bad key"));
}

#[test]
fn bounded_runs_keep_stdout_and_stderr_apart() {
    let out = support::gateway::run_bounded(fake("echo out; echo err >&2; exit 3"), secs(10));
    assert_eq!(out.code, 3);
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "err\n");
}

// ----- Python SDKs ---------------------------------------------------------------------------

/// The official SDKs (tests/compat/sdk_client.py) parse the mock's OpenAI and Anthropic shapes,
/// so the same script can vouch for the gateway. Needs TIDEGATE_PYTHON (scripts/test sets it).
#[test]
fn python_sdks_accept_the_mock_llm_replies() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::openai_chat("hello from mock"))
        .on(CHAT, Reply::openai_stream(&["hello ", "stream"]))
        .on("/v1/messages", Reply::anthropic_message("hi from mock"))
        .on("/v1/messages", Reply::anthropic_stream(&["hi ", "stream"]));

    let result = support::run_sdk_client(&mock.origin(), "sk-compat", &[]);
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["openai_chat"]["content"], "hello from mock");
    assert_eq!(result["openai_chat_stream"]["content"], "hello stream");
    assert_eq!(result["openai_chat_stream"]["finish_reason"], "stop");
    assert_eq!(result["anthropic_message"]["content"], "hi from mock");
    assert_eq!(result["anthropic_stream"]["content"], "hi stream");
    assert_eq!(result["anthropic_stream"]["stop_reason"], "end_turn");

    let chat = mock.requests_to(CHAT);
    assert_eq!(chat.len(), 2);
    assert_eq!(chat[0].header("authorization"), Some("Bearer sk-compat"));
    assert_eq!(chat[0].json()["model"], "mock/echo");
    assert_eq!(chat[1].json()["stream"], true);
    let messages = mock.requests_to("/v1/messages");
    assert_eq!(messages.len(), 2);
    // anthropic 2.x sends the API key as a bearer token; older releases used x-api-key.
    let key = messages[0]
        .header("x-api-key")
        .map(str::to_string)
        .or_else(|| {
            messages[0]
                .header("authorization")
                .map(|v| v.replace("Bearer ", ""))
        });
    assert_eq!(key.as_deref(), Some("sk-compat"));
    assert!(messages[0].has_header("anthropic-version"));
    assert_eq!(messages[1].json()["stream"], true);
    assert!(mock.problems().is_empty(), "{:?}", mock.problems());
}

#[test]
fn python_sdk_client_fails_loudly_on_a_malformed_answer() {
    let mock = MockUpstream::start();
    // A completion without content: the script must exit non-zero and say why.
    mock.on(
        CHAT,
        Reply::json(
            200,
            serde_json::json!({"id": "x", "object": "chat.completion", "created": 1,
                "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": ""}}]}),
        ),
    );
    let mut cmd = Command::new(support::python());
    cmd.arg(support::compat::SDK_CLIENT)
        .arg(mock.origin())
        .arg("k")
        .args(["--only", "openai"]);
    let out = support::gateway::run_bounded(cmd, secs(120));
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr
            .contains("openai_chat FAILED: openai chat: empty text"),
        "{out:?}"
    );
    let line: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(line["ok"], false);
    assert_eq!(line["failed"], "openai_chat");
}
