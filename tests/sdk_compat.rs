//! Client compatibility: the official `openai` and `anthropic` Python SDKs call the gateway,
//! streamed and not — against the in-process mock provider, and against a real-socket
//! upstream of each format. Needs `TIDEGATE_PYTHON` (set by `scripts/test`); fails without.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

#[test]
fn official_sdks_work_against_the_mock_provider() {
    let gw = Gateway::start(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "sdk"
key = "sdk-key"

[[providers]]
id = "mock"
format = "mock"
models = ["echo"]

[[connections]]
id = "mock-a"
provider = "mock"
"#,
    );
    let origin = format!("http://{}", gw.addr());
    let result = run_sdk_client(
        &origin,
        "sdk-key",
        &["--model", "mock/echo", "--expect-echo"],
    );
    assert!(result.is_object(), "{result}");
}

#[test]
fn official_sdks_work_through_to_real_socket_upstreams() {
    // Replies in the order sdk_client.py makes its calls: non-stream, then stream.
    let openai = MockUpstream::start();
    openai.on(
        "/v1/chat/completions",
        Reply::openai_chat("hello from openai"),
    );
    openai.on(
        "/v1/chat/completions",
        Reply::openai_stream(&["hello ", "from ", "openai"]),
    );
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        Reply::anthropic_message("hello from anthropic"),
    );
    anthropic.on(
        "/v1/messages",
        Reply::anthropic_stream(&["hello ", "from ", "anthropic"]),
    );
    let gw = Gateway::start(&two_providers(&openai, &anthropic));
    let origin = format!("http://{}", gw.addr());
    let oa = run_sdk_client(
        &origin,
        "sdk-key",
        &["--only", "openai", "--model", "oa/gpt-x"],
    );
    assert_eq!(
        oa["openai_chat_stream"]["content"], "hello from openai",
        "{oa}"
    );
    let an = run_sdk_client(
        &origin,
        "sdk-key",
        &["--only", "anthropic", "--model", "an/claude-x"],
    );
    assert_eq!(
        an["anthropic_stream"]["content"], "hello from anthropic",
        "{an}"
    );
    assert_eq!(openai.hits("/v1/chat/completions"), 2);
    assert_eq!(anthropic.hits("/v1/messages"), 2);
    // What the SDKs sent reached the upstreams with the model rewritten.
    let sent = openai.requests_to("/v1/chat/completions");
    assert_eq!(sent[1].json()["model"], "gpt-x");
    assert_eq!(sent[1].json()["stream"], true);
}

#[test]
fn sdks_type_the_gateways_own_errors() {
    // The Anthropic upstream rate-limits once; the gateway then holds the model back and
    // answers the next calls itself (429 in Anthropic's shape).
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        Reply::json(
            429,
            serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
        )
        .header("retry-after", "60"),
    );
    let openai = MockUpstream::start();
    let gw = Gateway::start(&two_providers(&openai, &anthropic));
    let body =
        br#"{"model":"an/claude-x","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let ask = || {
        Client::connect(gw.addr()).request(
            "POST",
            "/v1/messages",
            &[("x-api-key", "sdk-key")],
            body,
        )
    };
    assert_eq!(ask().status, 429, "the upstream's 429 is relayed");
    eventually(
        std::time::Duration::from_secs(5),
        "the gateway answers the cooling model itself",
        || ask().header("x-tidegate-error").is_some().then_some(()),
    );
    let origin = format!("http://{}", gw.addr());
    let r = run_sdk_client(
        &origin,
        "sdk-key",
        &[
            "--errors",
            "--model",
            "oa/gpt-x",
            "--anthropic-model",
            "an/claude-x",
            "--cooling-model",
            "an/claude-x",
        ],
    );
    assert_eq!(r["openai_retrieve"]["id"], "oa/gpt-x", "{r}");
    assert_eq!(r["openai_retrieve"]["not_found"], "NotFoundError", "{r}");
    assert_eq!(
        r["anthropic_authentication_error"]["exception"], "AuthenticationError",
        "{r}"
    );
    assert_eq!(
        r["anthropic_rate_limit_error"]["exception"], "RateLimitError",
        "{r}"
    );
    assert_eq!(
        anthropic.hits("/v1/messages"),
        1,
        "only the first call reached it"
    );
    assert_eq!(openai.requests().len(), 0);
}

/// One OpenAI-format provider `oa` (model `gpt-x`) and one Anthropic-format provider `an`
/// (model `claude-x`), one connection each, client key `sdk-key`.
fn two_providers(openai: &MockUpstream, anthropic: &MockUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[client_keys]]
id = "sdk"
key = "sdk-key"

[[providers]]
id = "oa"
format = "openai"
base_url = "{}"
models = ["gpt-x"]

[[providers]]
id = "an"
format = "anthropic"
base_url = "{}"
models = ["claude-x"]

[[connections]]
id = "oa-1"
provider = "oa"

[[connections]]
id = "an-1"
provider = "an"
"#,
        openai.base_url(),
        anthropic.base_url()
    )
}

#[test]
fn the_openai_sdk_responses_stream_helper_reads_the_mock_responses_stream() {
    let gw = Gateway::start(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[client_keys]]
id = "sdk"
key = "sdk-key"

[[providers]]
id = "mock"
format = "mock"
models = ["echo"]

[[connections]]
id = "mock-a"
provider = "mock"
"#,
    );
    let origin = format!("http://{}", gw.addr());
    let result = run_sdk_client(
        &origin,
        "sdk-key",
        &["--responses", "--model", "mock/echo", "--expect-echo"],
    );
    let events: Vec<&str> = result["openai_responses_stream"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let added = events
        .iter()
        .position(|e| *e == "response.output_item.added");
    let first_delta = events
        .iter()
        .position(|e| *e == "response.output_text.delta");
    assert!(
        added.is_some() && added < first_delta,
        "output_item.added before the text: {events:?}"
    );
}
