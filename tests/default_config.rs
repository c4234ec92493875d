//! The shipped `config/tidegate.toml` serves out of the box with no provider keys: the
//! in-process mock provider answers OpenAI and Anthropic shapes, streamed and not, and its
//! model-named behaviours show failover and timeouts.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::Duration;

use support::*;

const KEY: &str = "tidegate-dev-key";

/// The shipped config, on a free loopback port.
fn shipped(extra_server: &[(&str, &str)]) -> String {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tidegate.toml"))
            .unwrap();
    let mut out = String::new();
    let mut in_server = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            in_server = t == "[server]";
        }
        if in_server && t.starts_with("listen") {
            out.push_str("listen = \"127.0.0.1:0\"\n");
            for (k, v) in extra_server {
                out.push_str(&format!("{k} = {v}\n"));
            }
            continue;
        }
        if in_server
            && extra_server
                .iter()
                .any(|(k, _)| t.starts_with(&format!("{k} ")) || t.starts_with(&format!("{k}=")))
        {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn chat(gw: &Gateway, model: &str, stream: bool) -> Response {
    let body = format!(
        r#"{{"model":"{model}","stream":{stream},"messages":[{{"role":"user","content":"hello tide"}}]}}"#
    );
    Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {KEY}"))],
        body.as_bytes(),
    )
}

#[test]
fn the_shipped_config_serves_echo_streamed_and_not() {
    let gw = Gateway::start(&shipped(&[]));
    let r = chat(&gw, "mock/echo", false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "hello tide");
    let r = chat(&gw, "mock/echo", true);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.sse_events();
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let text: String = events[..events.len() - 1]
        .iter()
        .filter_map(|e| {
            e.json()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, "hello tide");
    // Anthropic format on the same provider.
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/v1/messages",
        &[("x-api-key", KEY)],
        br#"{"model":"mock/echo","max_tokens":10,"messages":[{"role":"user","content":"hi claude"}]}"#,
    );
    assert_eq!(r.json()["content"][0]["text"], "hi claude");
    // The catalog lists the mock models and the real providers' models.
    let models = Client::connect(gw.addr()).request(
        "GET",
        "/v1/models",
        &[("authorization", &format!("Bearer {KEY}"))],
        b"",
    );
    let ids: Vec<String> = models.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert!(ids.iter().any(|i| i == "mock/echo"), "{ids:?}");
}

#[test]
fn real_providers_without_keys_are_disabled_not_fatal() {
    let gw = Gateway::start_with_env(
        &shipped(&[]),
        &[("OPENAI_API_KEY", ""), ("ANTHROPIC_API_KEY", "")],
    );
    gw.wait_for_log("OPENAI_API_KEY", secs(5));
    let r = chat(&gw, "openai/gpt-4o-mini", false);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("no_available_connection")
    );
}

#[test]
fn mock_failures_fail_over_and_the_last_answer_is_relayed() {
    // The locked model is answered at once, not after waiting the lock out.
    let gw =
        Gateway::start(&(shipped(&[]) + "\n[resilience.wait_for_cooldown]\nenabled = false\n"));
    let r = chat(&gw, "mock-faults/fail-503", false);
    assert_eq!(r.status, 503);
    assert_eq!(
        r.header("x-tidegate-attempts"),
        Some("2"),
        "both mock connections were tried"
    );
    assert!(
        r.header("x-tidegate-error").is_none(),
        "the upstream's own 503 is relayed"
    );
    // The mock's limits are per model: the failing model is now locked on both
    // connections (the next request for it is answered by the gateway without trying
    // them), while other models still flow.
    // (Owners replicate lockouts asynchronously: allow them a moment to reach every shard.)
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let r = loop {
        let r = chat(&gw, "mock-faults/fail-503", false);
        if r.status == 429 || std::time::Instant::now() > deadline {
            break r;
        }
    };
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("model_cooldown"));
    assert!(r.header("retry-after").is_some());
    assert_eq!(r.json()["error"]["credentials_cooling"], 2);
    let r = chat(&gw, "mock/echo", false);
    assert_eq!(r.status, 200, "{}", r.text());

    // A 429 moves to the next connection too; the last one's answer is relayed.
    let gw = Gateway::start(&shipped(&[]));
    let r = chat(&gw, "mock-faults/fail-429", false);
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
}

#[test]
fn mock_timing_behaviours_meet_the_gateway_budgets() {
    let gw = Gateway::start(&shipped(&[
        ("response_header_timeout_ms", "300"),
        ("body_idle_timeout_ms", "300"),
    ]));
    // Non-stream stall: no head within the budget on either connection → 504.
    let r = chat(&gw, "mock-faults/stall", false);
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("upstream_timeout"));
    // Stream stall (on a fresh gateway: the timeouts above cooled both connections): a
    // role-only event arrives, then silence. It is lifecycle, held back until the first
    // model output (stream watchdog), so the idle timeout fires before any byte reached the
    // client: both connections are tried and the client gets the 504, not a broken stream.
    let gw = Gateway::start(&shipped(&[
        ("response_header_timeout_ms", "300"),
        ("body_idle_timeout_ms", "300"),
    ]));
    let r = chat(&gw, "mock-faults/stall", true);
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("upstream_timeout"));
    // Drip: words arrive one by one.
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {KEY}"))],
        br#"{"model":"mock/drip-100","stream":true,"messages":[{"role":"user","content":"a b c d"}]}"#,
    );
    assert_eq!(c.read_head().status, 200);
    let mut pieces = 0;
    loop {
        match c.next_body_piece(Duration::from_secs(5)) {
            Piece::Data(_) => pieces += 1,
            Piece::End => break,
            other => panic!("{other:?}"),
        }
    }
    assert!(
        pieces >= 4,
        "a dripped stream arrives in several pieces, got {pieces}"
    );
}

/// The shipped config with OpenAI's base URL pointed at `upstream`.
fn shipped_with_openai_at(upstream: &MockUpstream) -> String {
    shipped(&[]).replace("https://api.openai.com/v1", &upstream.base_url())
}

#[test]
fn a_real_model_name_is_never_answered_by_the_mock() {
    let upstream = MockUpstream::start();
    upstream.on_always("/v1/chat/completions", Reply::openai_chat("from openai"));
    let gw = Gateway::start_with_env(
        &shipped_with_openai_at(&upstream),
        &[("OPENAI_API_KEY", "sk-test"), ("OPENROUTER_API_KEY", "")],
    );
    // A bare real model name goes to the real provider, not the mock's echo.
    let r = chat(&gw, "gpt-4o-mini", false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-provider"), Some("openai"));
    assert_eq!(r.json()["choices"][0]["message"]["content"], "from openai");
    assert_eq!(upstream.hits("/v1/chat/completions"), 1);

    // With no key at all, the real name is not served by the mock either: 503.
    let gw = Gateway::start_with_env(&shipped(&[]), &[("OPENAI_API_KEY", "")]);
    let r = chat(&gw, "gpt-4o-mini", false);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_ne!(r.header("x-tidegate-provider"), Some("mock"));
}

#[test]
fn the_shipped_combo_does_not_fall_back_to_the_mock() {
    let upstream = MockUpstream::start();
    upstream.on_always(
        "/v1/chat/completions",
        Reply::error(503, "upstream overloaded"),
    );
    let gw = Gateway::start_with_env(
        &shipped_with_openai_at(&upstream),
        &[("OPENAI_API_KEY", "sk-test"), ("OPENROUTER_API_KEY", "")],
    );
    let r = chat(&gw, "chat-fast", false);
    assert_eq!(
        r.status,
        503,
        "the upstream's failure, not a mock echo: {}",
        r.text()
    );
    assert_ne!(r.header("x-tidegate-provider"), Some("mock"));
    assert!(upstream.hits("/v1/chat/completions") >= 1);
}

#[test]
fn failure_demos_leave_mock_echo_serving() {
    let gw = Gateway::start(&shipped(&[
        ("response_header_timeout_ms", "300"),
        ("body_idle_timeout_ms", "300"),
    ]));
    // The stall times out on both fault connections (cooling them) …
    let r = chat(&gw, "mock-faults/stall", false);
    assert_eq!(r.status, 504, "{}", r.text());
    // … and the 503 demo locks its model there, yet the echo is answered at once by the
    // first mock connection.
    let r = chat(&gw, "mock-faults/fail-503", false);
    assert_eq!(r.status, 503, "{}", r.text());
    let r = chat(&gw, "mock/echo", false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-attempts"), Some("1"));
    assert_eq!(
        r.header("x-omniroute-selected-connection-id"),
        Some("mock-a")
    );
    // The keyless fallback demo fails on the fault provider and lands on the echo.
    let r = chat(&gw, "demo-fallback", false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-provider"), Some("mock"));
}

/// README, "Failure demos": the fault connections' breakers follow a mock's `local` profile
/// (2 failures, open 15 s), so a second `fail-503` request opens both and every
/// `mock-faults/*` model then answers 503 `provider_circuit_open` with `Retry-After`, while
/// `mock/echo` serves as before.
#[test]
fn two_fail_503_requests_open_the_fault_breakers_and_leave_mock_echo_serving() {
    let gw = Gateway::start(&shipped(&[]));
    for round in 0..2 {
        if round == 1 {
            // Past both 2 s model locks of the first request: the two locks end a few ms
            // apart (one per 503), and a request that waits out the earliest one
            // (wait_for_cooldown) tries only the connection whose lock has ended — on a
            // loaded machine the other may not have.
            std::thread::sleep(Duration::from_millis(2_500));
        }
        let r = chat(&gw, "mock-faults/fail-503", false);
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    }
    for model in ["mock-faults/fail-429", "mock-faults/fail-503"] {
        let r = chat(&gw, model, false);
        assert_eq!(r.status, 503, "{model}: {}", r.text());
        assert_eq!(
            r.header("x-tidegate-error"),
            Some("provider_circuit_open"),
            "{model}"
        );
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=15).contains(&retry), "{retry}");
    }
    let r = chat(&gw, "mock/echo", false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-attempts"), Some("1"));
}
