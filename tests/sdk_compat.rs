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
    let gw = Gateway::start(&format!(
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
    ));
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
