//! Failover before the first byte: a connect failure, a 5xx, a reset or a response-head
//! timeout on one connection moves the request to the next connection (priority order);
//! nothing moves once the first byte reached the client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

/// Two providers-worth of connections: `first` (priority 1) and `second` (priority 2).
fn config(first_base: &str, second_base: &str, extra_server: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1
{extra_server}

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "a"
format = "openai"
base_url = "{first_base}"
models = ["m1"]

[[providers]]
id = "b"
format = "openai"
base_url = "{second_base}"
models = ["m1"]

[[connections]]
id = "first"
provider = "a"
priority = 1

[[connections]]
id = "second"
provider = "b"
priority = 1
"#
    )
}

fn ask(gw: &Gateway, model: &str) -> Response {
    let mut c = Client::connect(gw.addr());
    c.request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer test-key")],
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

#[test]
fn a_5xx_moves_to_the_next_candidate_and_the_attempts_are_counted() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    a.on_always("/v1/chat/completions", Reply::error(503, "overloaded"));
    b.on_always("/v1/chat/completions", Reply::openai_chat("from b"));
    let gw = Gateway::start(&config(&a.base_url(), &b.base_url(), ""));
    // The bare model is in both catalogs: provider a first (file order), then b.
    let resp = ask(&gw, "m1");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["choices"][0]["message"]["content"], "from b");
    assert_eq!(
        resp.header("x-omniroute-selected-connection-id"),
        Some("second")
    );
    assert_eq!(resp.header("x-tidegate-provider"), Some("b"));
    assert_eq!(resp.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(a.hits("/v1/chat/completions"), 1);
}

#[test]
fn a_refused_connection_moves_to_the_next_candidate() {
    // The first candidate's port refuses every connection (held for the whole test).
    let dead = RefusingPort::new();
    let b = MockUpstream::start();
    b.on_always("/v1/chat/completions", Reply::openai_chat("from b"));
    let gw = Gateway::start(&config(&dead.base_url(), &b.base_url(), ""));
    let resp = ask(&gw, "m1");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(
        resp.header("x-omniroute-selected-connection-id"),
        Some("second")
    );
}

#[test]
fn a_reset_before_the_head_moves_to_the_next_candidate() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    a.on_always("/v1/chat/completions", Reply::reset());
    b.on_always("/v1/chat/completions", Reply::openai_chat("from b"));
    let gw = Gateway::start(&config(&a.base_url(), &b.base_url(), ""));
    let resp = ask(&gw, "m1");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-tidegate-attempts"), Some("2"));
}

#[test]
fn a_response_head_timeout_moves_to_the_next_candidate() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    a.on_always("/v1/chat/completions", Reply::stall_before_head());
    b.on_always("/v1/chat/completions", Reply::openai_chat("from b"));
    let gw = Gateway::start(&config(
        &a.base_url(),
        &b.base_url(),
        "response_header_timeout_ms = 300",
    ));
    let resp = ask(&gw, "m1");
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("x-omniroute-selected-connection-id"),
        Some("second")
    );
}

#[test]
fn a_body_that_fails_before_its_first_byte_moves_on_too() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    // Head, then the connection dies before any body byte.
    a.on_always("/v1/chat/completions", Reply::sse(vec![Chunk::reset()]));
    b.on_always("/v1/chat/completions", Reply::openai_chat("from b"));
    let gw = Gateway::start(&config(&a.base_url(), &b.base_url(), ""));
    let resp = ask(&gw, "m1");
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-tidegate-attempts"), Some("2"));
}

#[test]
fn the_last_candidates_5xx_is_relayed_as_the_upstream_sent_it() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    a.on_always("/v1/chat/completions", Reply::error(500, "a broke"));
    b.on_always(
        "/v1/chat/completions",
        Reply::error(502, "b broke").header("x-from", "b"),
    );
    let gw = Gateway::start(&config(&a.base_url(), &b.base_url(), ""));
    let resp = ask(&gw, "m1");
    assert_eq!(resp.status, 502);
    assert_eq!(resp.header("x-from"), Some("b"));
    assert!(resp.header("x-tidegate-error").is_none());
    assert_eq!(resp.header("x-tidegate-attempts"), Some("2"));
}

#[test]
fn when_every_candidate_is_unreachable_the_gateway_answers_502() {
    let (dead, dead_too) = (RefusingPort::new(), RefusingPort::new());
    let gw = Gateway::start(&config(&dead.base_url(), &dead_too.base_url(), ""));
    let resp = ask(&gw, "m1");
    assert_eq!(resp.status, 502);
    assert_eq!(
        resp.header("x-tidegate-error"),
        Some("upstream_connect_failed")
    );
    assert_eq!(resp.json()["error"]["code"], "upstream_connect_failed");
    assert_eq!(resp.json()["error"]["type"], "server_error");
}

#[test]
fn nothing_fails_over_after_the_first_byte() {
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let mut chunks = openai_stream_chunks(&["one"]);
    chunks.truncate(2);
    chunks.push(Chunk::close());
    a.on_always("/v1/chat/completions", Reply::sse(chunks));
    b.on_always("/v1/chat/completions", Reply::openai_chat("from b"));
    let gw = Gateway::start(&config(&a.base_url(), &b.base_url(), ""));
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer test-key")],
        br#"{"model":"m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("x-omniroute-selected-connection-id"),
        Some("first")
    );
    // The cut stream ends with an in-band error event and no chunked terminator.
    let raw = c.read_until_close(std::time::Duration::from_secs(10));
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("\"content\":\"one\""), "{text}");
    assert!(text.contains("data: {\"error\":"), "{text}");
    assert!(!text.ends_with("0\r\n\r\n"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    assert_eq!(
        b.hits("/v1/chat/completions"),
        0,
        "a started stream is never replayed"
    );
}

#[test]
fn priority_orders_the_connections_of_one_provider() {
    let a = MockUpstream::start();
    a.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let cfg = format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[providers]]
id = "a"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "low"
provider = "a"
priority = 5

[[connections]]
id = "high"
provider = "a"
priority = 1
"#,
        a.base_url()
    );
    let gw = Gateway::start(&cfg);
    let resp = ask(&gw, "a/m1");
    assert_eq!(
        resp.header("x-omniroute-selected-connection-id"),
        Some("high")
    );
}
