//! Proxying to a real (mock) upstream: byte-exact non-stream and stream passthrough, the
//! request the upstream sees (model rewrite, injected credentials, stripped client-only
//! headers), and the success headers.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::*;

fn config(mock: &MockUpstream, format: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "up"
format = "{format}"
base_url = "{base}"
models = ["m1"]
{extra}

[[connections]]
id = "c1"
provider = "up"
api_key_env = "TG_TEST_UPSTREAM_KEY"
"#,
        base = mock.base_url()
    )
}

const ENV: &[(&str, &str)] = &[("TG_TEST_UPSTREAM_KEY", "sk-upstream-secret")];

#[test]
fn a_non_stream_answer_reaches_the_client_byte_for_byte() {
    let mock = MockUpstream::start();
    // An odd body: key order, spacing and unicode a re-serializer would change.
    let body = "{ \"z\":1,  \"id\":\"x\",\n\"choices\":[{\"message\":{\"content\":\"h\u{e9}llo \\u00e9\"}}] }";
    mock.on(
        "/v1/chat/completions",
        Reply::status(200)
            .header("content-type", "application/json")
            .header("x-upstream-id", "u-1")
            .body(body),
    );
    let gw = Gateway::start_with_env(&config(&mock, "openai", ""), ENV);
    let mut c = Client::connect(gw.addr());
    let resp = c.request(
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", "Bearer test-key"),
            ("content-type", "application/json"),
        ],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, body.as_bytes(), "body must be relayed unchanged");
    assert_eq!(
        resp.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(resp.header("x-upstream-id"), Some("u-1"));
    assert_eq!(
        resp.header("x-omniroute-selected-connection-id"),
        Some("c1")
    );
    assert_eq!(resp.header("x-tidegate-provider"), Some("up"));
    assert_eq!(resp.header("x-tidegate-attempts"), Some("1"));
    assert!(resp.header("x-tidegate-error").is_none());
}

#[test]
fn the_upstream_sees_the_rewritten_model_its_credentials_and_no_client_only_headers() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start_with_env(
        &config(&mock, "openai", "headers = { \"x-org\" = \"acme\" }"),
        ENV,
    );
    let body =
        r#"{"messages":[{"role":"user","content":"hi"}], "model" : "up/m1", "temperature":0.5}"#;
    let mut c = Client::connect(gw.addr());
    let resp = c.request(
        "POST",
        "/v1/chat/completions?api-version=7",
        &[
            ("authorization", "Bearer test-key"),
            ("content-type", "application/json"),
            ("x-session-id", "sess-1"),
            ("x-codex-session-id", "sess-2"),
            ("x-omniroute-session", "sess-3"),
            ("x-omniroute-lease-owner", "owner"),
            ("x-omniroute-lease-generation", "4"),
            ("x-goog-api-key", "client-google-key"),
            ("accept-encoding", "gzip"),
            ("x-custom", "kept"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "dropped"),
            ("proxy-authorization", "Basic c2VjcmV0"),
            ("te", "trailers"),
        ],
        body.as_bytes(),
    );
    assert_eq!(resp.status, 200);
    let seen = mock.requests_to("/v1/chat/completions");
    assert_eq!(seen.len(), 1);
    let r = &seen[0];
    assert_eq!(r.target, "/v1/chat/completions?api-version=7");
    // Only the model value changed, everything else is byte-identical.
    assert_eq!(r.text(), body.replace("\"up/m1\"", "\"m1\""));
    assert_eq!(
        r.header("content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert_eq!(r.header("authorization"), Some("Bearer sk-upstream-secret"));
    assert_eq!(r.header("x-org"), Some("acme"));
    assert_eq!(r.header("x-custom"), Some("kept"));
    for gone in [
        "x-session-id",
        "x-codex-session-id",
        "x-omniroute-session",
        "x-omniroute-lease-owner",
        "x-omniroute-lease-generation",
        "x-goog-api-key",
        "accept-encoding",
        "x-hop",
        "proxy-authorization",
        "te",
    ] {
        assert!(!r.has_header(gone), "{gone} must not reach the upstream");
    }
    assert_eq!(
        r.header_all("authorization").len(),
        1,
        "the client's key never reaches the upstream"
    );
    let host = r.header("host").unwrap();
    assert_eq!(host, format!("127.0.0.1:{}", mock.addr().port()));
}

#[test]
fn anthropic_requests_carry_x_api_key_and_a_version() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/messages", Reply::anthropic_message("hello"));
    let gw = Gateway::start_with_env(&config(&mock, "anthropic", ""), ENV);
    let body = br#"{"model":"up/m1","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut c = Client::connect(gw.addr());
    let resp = c.request("POST", "/v1/messages", &[("x-api-key", "test-key")], body);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["content"][0]["text"], "hello");
    // A client-sent version is kept.
    let resp = c.request(
        "POST",
        "/v1/messages",
        &[
            ("x-api-key", "test-key"),
            ("anthropic-version", "2099-01-01"),
        ],
        body,
    );
    assert_eq!(resp.status, 200);
    let seen = mock.requests_to("/v1/messages");
    assert_eq!(seen[0].header("x-api-key"), Some("sk-upstream-secret"));
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen[1].header_all("anthropic-version"), vec!["2099-01-01"]);
    assert!(!seen[0].has_header("authorization"));
}

#[test]
fn a_stream_is_relayed_as_it_arrives_and_byte_exact() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    let mut chunks = vec![
        Chunk::data(r#"{"choices":[{"delta":{"content":"first"}}]}"#),
        Chunk::wait_for(&gate),
    ];
    chunks.push(Chunk::data(
        r#"{"choices":[{"delta":{"content":" second"}}]}"#,
    ));
    chunks.push(Chunk::raw(": keep-alive comment\n\n"));
    chunks.push(Chunk::done());
    mock.on("/v1/chat/completions", Reply::sse(chunks));
    let gw = Gateway::start_with_env(&config(&mock, "openai", ""), ENV);
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer test-key")],
        br#"{"model":"up/m1","stream":true,"messages":[]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        head.header("x-omniroute-selected-connection-id"),
        Some("c1")
    );
    // The first event arrives while the upstream still holds the rest back.
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("first") {
        match c.next_body_piece(Duration::from_secs(5)) {
            Piece::Data(d) => got.extend_from_slice(&d),
            other => panic!("expected the first event before the gate opens, got {other:?}"),
        }
    }
    assert!(!String::from_utf8_lossy(&got).contains("second"));
    gate.open();
    loop {
        match c.next_body_piece(Duration::from_secs(5)) {
            Piece::Data(d) => got.extend_from_slice(&d),
            Piece::End => break,
            other => panic!("stream ended badly: {other:?}"),
        }
    }
    let expected = "data: {\"choices\":[{\"delta\":{\"content\":\"first\"}}]}\n\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\" second\"}}]}\n\n\
                    : keep-alive comment\n\n\
                    data: [DONE]\n\n";
    assert_eq!(String::from_utf8_lossy(&got), expected);
    // The connection stays usable after a stream.
    mock.on("/v1/chat/completions", Reply::openai_chat("after"));
    let resp = c.request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer test-key")],
        br#"{"model":"up/m1","messages":[]}"#,
    );
    assert_eq!(resp.json()["choices"][0]["message"]["content"], "after");
}

/// A recorded stream reaches the client byte for byte however the upstream's chunks cut
/// it (each gateway write goes out as one chunk, framed behind room left for its size
/// line): in two pieces cut at points across it, in seven-byte pieces, and in pieces with
/// pauses between them (more, smaller writes); long enough that a write's size line has
/// four hex digits.
#[test]
fn a_recorded_stream_reaches_the_client_byte_exact_however_it_is_cut() {
    let mut recorded = String::new();
    for i in 0..60 {
        let event = serde_json::json!({"id": "c", "object": "chat.completion.chunk",
            "created": 1, "model": "m1", "choices": [{"index": 0,
            "delta": {"content": format!("word{i} ")}, "finish_reason": null}]});
        recorded.push_str(&format!("data: {event}\n\n"));
    }
    recorded.push_str("data: [DONE]\n\n");
    let recorded = recorded.as_bytes();
    assert!(recorded.len() > 0x1000, "{}", recorded.len());
    let mut cuts: Vec<Vec<Chunk>> = (1..recorded.len())
        .step_by(recorded.len() / 16)
        .map(|at| vec![Chunk::raw(&recorded[..at]), Chunk::raw(&recorded[at..])])
        .collect();
    cuts.push(recorded.chunks(7).map(Chunk::raw).collect());
    cuts.push(
        recorded
            .chunks(300)
            .flat_map(|p| [Chunk::raw(p), Chunk::delay_ms(2)])
            .collect(),
    );
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock, "openai", ""), ENV);
    for (i, chunks) in cuts.into_iter().enumerate() {
        mock.on("/v1/chat/completions", Reply::sse(chunks));
        let mut c = Client::connect(gw.addr());
        let resp = c.request(
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer test-key")],
            br#"{"model":"up/m1","stream":true,"messages":[]}"#,
        );
        assert_eq!(resp.status, 200, "cut {i}");
        assert!(resp.chunked, "cut {i}");
        assert!(
            resp.body == recorded,
            "cut {i}: {}",
            String::from_utf8_lossy(&resp.body)
        );
    }
}

#[test]
fn a_stream_broken_after_the_first_byte_ends_with_an_error_event_and_no_done() {
    let mock = MockUpstream::start();
    let mut chunks = openai_stream_chunks(&["partial"]);
    chunks.truncate(2);
    chunks.push(Chunk::reset());
    mock.on("/v1/chat/completions", Reply::sse(chunks));
    let gw = Gateway::start_with_env(&config(&mock, "openai", ""), ENV);
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer test-key")],
        br#"{"model":"up/m1","stream":true,"messages":[]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    // The connection closes after the error event, without the chunked terminator.
    let raw = c.read_until_close(Duration::from_secs(5));
    assert!(
        !raw.ends_with(b"0\r\n\r\n"),
        "a broken stream never ends cleanly"
    );
    let mut body = Vec::new();
    let mut rest = &raw[..];
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
        body.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[eol + 4 + size..];
    }
    assert!(rest.is_empty());
    let events = parse_sse(&body);
    let last = events.last().expect("events");
    // The OpenAI shape: a data-only event with the error body.
    assert_eq!(last.event, None, "{events:?}");
    assert!(last.json()["error"]["code"].is_string());
    assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));
}

#[test]
fn a_chunked_upstream_body_without_sse_is_relayed_chunked() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/embeddings",
        Reply::chunked(["{\"data\":", "[1,2,3]", "}"]).header("content-type", "application/json"),
    );
    let gw = Gateway::start_with_env(&config(&mock, "openai", ""), ENV);
    let mut c = Client::connect(gw.addr());
    let resp = c.request(
        "POST",
        "/v1/embeddings",
        &[("authorization", "Bearer test-key")],
        br#"{"model":"up/m1","input":"x"}"#,
    );
    assert_eq!(resp.status, 200);
    assert!(resp.chunked);
    assert_eq!(resp.body, b"{\"data\":[1,2,3]}");
}

#[test]
fn large_request_and_response_bodies_pass_through_intact() {
    let mock = MockUpstream::start();
    let big_answer: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let answer = format!("{{\"x\":\"{big_answer}\"}}");
    mock.on(
        "/v1/chat/completions",
        Reply::status(200)
            .header("content-type", "application/json")
            .body(&answer),
    );
    let gw = Gateway::start_with_env(&config(&mock, "openai", ""), ENV);
    let prompt: String = (0..500_000)
        .map(|i| char::from(b'A' + (i % 26) as u8))
        .collect();
    let body =
        format!(r#"{{"model":"up/m1","messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
    let mut c = Client::connect(gw.addr());
    let resp = c.request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer test-key")],
        body.as_bytes(),
    );
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, answer.as_bytes());
    let seen = mock.requests_to("/v1/chat/completions");
    assert_eq!(seen[0].body.len(), body.len() - "up/".len());
}

#[test]
fn upstream_4xx_answers_are_relayed_not_retried() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::error(400, "bad thing"));
    let gw = Gateway::start_with_env(&config(&mock, "openai", ""), ENV);
    let mut c = Client::connect(gw.addr());
    let resp = c.request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer test-key")],
        br#"{"model":"up/m1","messages":[]}"#,
    );
    assert_eq!(resp.status, 400);
    assert!(
        resp.header("x-tidegate-error").is_none(),
        "upstream errors are not gateway errors"
    );
    assert_eq!(mock.hits("/v1/chat/completions"), 1);
}

#[test]
fn count_tokens_is_forwarded_to_an_anthropic_provider() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/messages/count_tokens",
        Reply::json(200, serde_json::json!({"input_tokens": 42})),
    );
    let gw = Gateway::start_with_env(&config(&mock, "anthropic", ""), ENV);
    let body = br#"{"model":"up/m1","messages":[{"role":"user","content":"count me"}]}"#;
    let mut c = Client::connect(gw.addr());
    let resp = c.request(
        "POST",
        "/v1/messages/count_tokens",
        &[("x-api-key", "test-key")],
        body,
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["input_tokens"], 42);
    let seen = mock.requests_to("/v1/messages/count_tokens");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-api-key"), Some("sk-upstream-secret"));
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));

    // An OpenAI-format provider does not serve it: an Anthropic-shaped error.
    let mock2 = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock2, "openai", ""), ENV);
    let resp = Client::connect(gw.addr()).request(
        "POST",
        "/v1/messages/count_tokens",
        &[("x-api-key", "test-key")],
        body,
    );
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(resp.json()["type"], "error");
    assert_eq!(mock2.total_hits(), 0);
}
