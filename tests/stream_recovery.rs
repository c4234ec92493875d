//! Early recovery and hold-back (issue 11 item 5, spec B §7.3, `stream_recovery.enabled`):
//! the first bytes are held back (750 ms / 64 KiB) so that a failure inside the hold-back
//! is invisible to the client and fails over; an attempt that fails before its first client
//! byte is reopened on the same account once, then the next target is tried.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

const CHAT: &str = "/v1/chat/completions";

/// Providers `a` then `b` (same model), one connection each.
fn config(a: &MockUpstream, b: &MockUpstream, recovery: bool) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{}{}\
         [resilience.stream_watchdog]\nstall_timeout_ms = 400\n\n\
         [resilience.stream_recovery]\nenabled = {recovery}\n",
        provider("a", &a.base_url(), &["m1"]),
        connection("first", "a"),
        provider("b", &b.base_url(), &["m1"]),
        connection("second", "b"),
    )
}

fn ask(addr: std::net::SocketAddr) -> Response {
    let mut c = Client::connect(addr);
    c.set_timeout(std::time::Duration::from_secs(30));
    c.request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    )
}

/// The de-chunked SSE text of a stream of `pieces` as `Reply::openai_stream` sends it.
fn stream_text(pieces: &[&str]) -> String {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_stream(pieces));
    let mut c = Client::connect(mock.addr());
    let r = c.request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"m1","stream":true,"messages":[]}"#,
    );
    r.text()
}

/// `a` sends two tokens and then cuts the connection, every time.
fn cut_after_two_tokens(a: &MockUpstream) {
    let mut chunks = openai_stream_chunks(&["Hel", "lo"]);
    chunks.truncate(3);
    chunks.push(Chunk::close());
    a.on_always(CHAT, Reply::sse(chunks));
}

#[test]
fn a_cut_inside_the_hold_back_is_invisible_and_fails_over() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    cut_after_two_tokens(&a);
    b.on_always(CHAT, Reply::openai_stream(&["Hel", "lo", " there"]));
    let gw = Gateway::start(&config(&a, &b, true));
    let r = ask(gw.addr());
    assert_eq!(r.status, 200, "{}", r.text());
    // Byte for byte b's stream, with a clean end: nothing of a's cut attempts.
    assert_eq!(r.text(), stream_text(&["Hel", "lo", " there"]));
    assert!(r.raw_body.ends_with(b"0\r\n\r\n"));
    assert_eq!(
        r.header("x-omniroute-selected-connection-id"),
        Some("second")
    );
    // A cut is an upstream failure that cools a's connection, so the reopen finds it
    // cooling and the walk moves on to b (a stall does not cool: see below).
    assert_eq!(a.hits(CHAT), 1);
    assert_eq!(b.hits(CHAT), 1);
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 0);
}

#[test]
fn without_recovery_the_same_cut_reaches_the_client() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    cut_after_two_tokens(&a);
    b.on_always(CHAT, Reply::openai_stream(&["never"]));
    let gw = Gateway::start(&config(&a, &b, false));
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(c.read_head().status, 200);
    let raw = String::from_utf8_lossy(&c.read_until_close(std::time::Duration::from_secs(10)))
        .into_owned();
    assert!(raw.contains("Hel") && raw.contains("\"error\""), "{raw}");
    assert!(!raw.ends_with("0\r\n\r\n"));
    assert_eq!(b.hits(CHAT), 0);
}

#[test]
fn a_stall_before_the_first_byte_reopens_the_same_account_once() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // a: the first answer never produces a token; the second does.
    a.on(CHAT, Reply::stall())
        .on_always(CHAT, Reply::openai_stream(&["from", " a"]));
    b.on_always(CHAT, Reply::openai_stream(&["from", " b"]));
    let gw = Gateway::start(&config(&a, &b, true));
    let r = ask(gw.addr());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), stream_text(&["from", " a"]));
    assert_eq!(
        r.header("x-omniroute-selected-connection-id"),
        Some("first")
    );
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(a.hits(CHAT), 2);
    assert_eq!(b.hits(CHAT), 0);
}

#[test]
fn a_cut_after_the_hold_back_window_reaches_the_client() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // a: the role chunk and a token, then after 1.2 s (past the 750 ms window) another
    // token, then the cut. The window ends with the first piece after 750 ms, so the cut
    // comes after the first client byte.
    let mut chunks = openai_stream_chunks(&["Hel", "lo"]);
    chunks.truncate(3);
    chunks.insert(2, Chunk::delay_ms(1_200));
    chunks.push(Chunk::close());
    a.on_always(CHAT, Reply::sse(chunks));
    b.on_always(CHAT, Reply::openai_stream(&["never"]));
    // A stall budget longer than the gap, so only the window decides.
    let gw = Gateway::start(
        &config(&a, &b, true).replace("stall_timeout_ms = 400", "stall_timeout_ms = 5000"),
    );
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("x-omniroute-selected-connection-id"),
        Some("first")
    );
    let raw = String::from_utf8_lossy(&c.read_until_close(std::time::Duration::from_secs(10)))
        .into_owned();
    // a's tokens as they came, then the in-band error; no clean end, nothing of b.
    assert!(raw.contains("Hel") && raw.contains("lo"), "{raw}");
    assert!(raw.contains("data: {\"error\":"), "{raw}");
    assert!(!raw.contains("never") && !raw.contains("[DONE]"), "{raw}");
    assert!(!raw.ends_with("0\r\n\r\n"), "{raw}");
    assert_eq!(a.hits(CHAT), 1);
    assert_eq!(b.hits(CHAT), 0);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 1);
}

#[test]
fn at_most_four_early_retries_per_request() {
    // Five providers, one connection each, every answer a head and then silence: a stall
    // before the first client byte, which does not cool the connection.
    let mocks: Vec<MockUpstream> = (0..5).map(|_| MockUpstream::start()).collect();
    for m in &mocks {
        m.on_always(CHAT, Reply::stall());
    }
    let mut cfg = "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\n".to_owned();
    for (i, m) in mocks.iter().enumerate() {
        cfg.push_str(&provider(&format!("p{i}"), &m.base_url(), &["m1"]));
        cfg.push_str(&connection(&format!("c{i}"), &format!("p{i}")));
    }
    cfg.push_str(
        "[resilience.stream_watchdog]\nstall_timeout_ms = 300\n\n\
         [resilience.stream_recovery]\nenabled = true\n",
    );
    let gw = Gateway::start(&cfg);
    let r = ask(gw.addr());
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("stream_content_stall"));
    // The first four candidates are reopened once each (4 early retries), the fifth is not.
    let hits: Vec<usize> = mocks.iter().map(|m| m.hits(CHAT)).collect();
    assert_eq!(hits, vec![2, 2, 2, 2, 1]);
}

#[test]
fn a_cut_after_64_kib_reaches_the_client_even_inside_750_ms() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // a: 80 tokens of 1 000 bytes at once (past the 64 KiB hold-back), then the cut.
    let piece = "x".repeat(1_000);
    let pieces: Vec<&str> = (0..80).map(|_| piece.as_str()).collect();
    let mut chunks = openai_stream_chunks(&pieces);
    chunks.truncate(1 + pieces.len());
    chunks.push(Chunk::close());
    a.on_always(CHAT, Reply::sse(chunks));
    b.on_always(CHAT, Reply::openai_stream(&["never"]));
    let gw = Gateway::start(&config(&a, &b, true));
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("x-omniroute-selected-connection-id"),
        Some("first")
    );
    let raw = String::from_utf8_lossy(&c.read_until_close(std::time::Duration::from_secs(10)))
        .into_owned();
    // At least the 64 KiB held back reached the client, then the in-band error; nothing of b.
    assert!(
        raw.matches(piece.as_str()).count() >= 64,
        "{} tokens",
        raw.matches(piece.as_str()).count()
    );
    assert!(raw.contains("data: {\"error\":"));
    assert!(!raw.contains("never") && !raw.contains("[DONE]"));
    assert!(!raw.ends_with("0\r\n\r\n"));
    assert_eq!(b.hits(CHAT), 0);
    assert_eq!(metric(gw.addr(), "tidegate_streams_broken_total"), 1);
}
