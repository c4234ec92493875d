//! The guide's other resilience features: the emergency fallback (spec B §9.1) — a spent
//! budget re-runs the request once on `[emergency_fallback] target` with its output capped
//! at 4096 tokens, unless the request has tools or `OMNIROUTE_EMERGENCY_FALLBACK=false` —
//! and background degradation (a Responses `background: true` is served synchronously, with
//! `x-tidegate-warning: background-degraded`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

const CHAT: &str = "/v1/chat/completions";

/// Two shards; `paid` (model m1) on one mock, `rescue` (model big) on another; the
/// emergency target is `rescue/big`.
fn config(paid: &str, rescue: &str, emergency: bool) -> String {
    let fallback = if emergency {
        "[emergency_fallback]\ntarget = \"rescue/big\"\n"
    } else {
        ""
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "paid"
format = "openai"
base_url = "{paid}"
models = ["m1"]

[[providers]]
id = "rescue"
format = "openai"
base_url = "{rescue}"
models = ["big"]

[[connections]]
id = "p1"
provider = "paid"

[[connections]]
id = "r1"
provider = "rescue"

{fallback}
"#
    )
}

fn chat(gw: &Gateway, body: serde_json::Value) -> Response {
    json_post(gw.addr(), CHAT, "test-key", &body)
}

fn plain_request() -> serde_json::Value {
    serde_json::json!({"model": "m1", "max_tokens": 9000,
                       "messages": [{"role": "user", "content": "hi"}]})
}

#[test]
fn a_spent_budget_reruns_once_on_the_emergency_target_with_capped_output() {
    let paid = MockUpstream::start();
    let rescue = MockUpstream::start();
    paid.on_always(CHAT, Reply::error(402, "Payment Required: out of credits"));
    rescue.on_always(CHAT, Reply::openai_chat("rescued"));
    let gw = Gateway::start(&config(&paid.base_url(), &rescue.base_url(), true));

    let resp = chat(&gw, plain_request());
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["choices"][0]["message"]["content"], "rescued");
    assert_eq!(
        resp.header("x-omniroute-emergency-fallback"),
        Some("from=paid/m1; to=rescue/big")
    );
    assert_eq!(
        resp.header("x-omniroute-selected-connection-id"),
        Some("r1")
    );
    assert_eq!(paid.hits(CHAT), 1);
    let seen = rescue.requests_to(CHAT);
    assert_eq!(seen.len(), 1, "re-run once");
    let body = seen[0].json();
    assert_eq!(body["model"], "big");
    assert_eq!(body["max_tokens"], 4096);

    // The connection is now known to be out of credits (terminal): the next request is
    // not sent to it, and goes to the emergency target all the same.
    let resp = chat(&gw, plain_request());
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-omniroute-emergency-fallback"),
        Some("from=paid/m1; to=rescue/big")
    );
    assert_eq!(paid.hits(CHAT), 1);
    assert_eq!(rescue.hits(CHAT), 2);
}

#[test]
fn a_budget_named_in_an_error_message_triggers_it_too() {
    let paid = MockUpstream::start();
    let rescue = MockUpstream::start();
    // A 400 is not failed over by itself; its message names a spent budget.
    paid.on_always(
        CHAT,
        Reply::error(400, "Your monthly spending limit was reached"),
    );
    rescue.on_always(CHAT, Reply::openai_chat("rescued"));
    let gw = Gateway::start(&config(&paid.base_url(), &rescue.base_url(), true));
    let resp = chat(&gw, plain_request());
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-omniroute-emergency-fallback"),
        Some("from=paid/m1; to=rescue/big")
    );
    assert_eq!((paid.hits(CHAT), rescue.hits(CHAT)), (1, 1));
}

#[test]
fn no_emergency_fallback_for_tools_for_other_failures_or_when_switched_off() {
    let paid = MockUpstream::start();
    let rescue = MockUpstream::start();
    paid.on_always(CHAT, Reply::error(402, "Payment Required"));
    rescue.on_always(CHAT, Reply::openai_chat("rescued"));

    // A plain 400 that names no budget is not a trigger.
    let gw = Gateway::start(&config(&paid.base_url(), &rescue.base_url(), true));
    paid.on(CHAT, Reply::error(400, "messages must not be empty"));
    let resp = chat(&gw, plain_request());
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(rescue.hits(CHAT), 0);

    // A request with tools gets the upstream's own answer.
    let mut with_tools = plain_request();
    with_tools["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    let resp = chat(&gw, with_tools);
    assert_eq!(resp.status, 402, "{}", resp.text());
    assert_eq!(resp.header("x-omniroute-emergency-fallback"), None);
    assert_eq!(rescue.hits(CHAT), 0);
    drop(gw);

    // OMNIROUTE_EMERGENCY_FALLBACK=false switches it off.
    let gw = Gateway::start_with_env(
        &config(&paid.base_url(), &rescue.base_url(), true),
        &[("OMNIROUTE_EMERGENCY_FALLBACK", "false")],
    );
    let resp = chat(&gw, plain_request());
    assert_eq!(resp.status, 402, "{}", resp.text());
    assert_eq!(rescue.hits(CHAT), 0);
    drop(gw);

    // Without a target there is none.
    let gw = Gateway::start(&config(&paid.base_url(), &rescue.base_url(), false));
    let resp = chat(&gw, plain_request());
    assert_eq!(resp.status, 402, "{}", resp.text());
    assert_eq!(rescue.hits(CHAT), 0);
}

#[test]
fn an_emergency_target_that_names_an_unknown_provider_is_a_config_error() {
    let text = config("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", false)
        + "[emergency_fallback]\ntarget = \"nvidia/openai/gpt-oss-120b\"\n";
    let (code, _out, err) = run_check(&text);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("emergency_fallback.target") && err.contains("unknown provider \"nvidia\""),
        "{err}"
    );
}

#[test]
fn a_background_responses_request_is_served_synchronously_with_a_warning() {
    let up = MockUpstream::start();
    up.on_always(
        "/v1/responses",
        Reply::json(
            200,
            serde_json::json!({"id": "resp_1", "status": "completed"}),
        ),
    );
    let gw = Gateway::start(&config(&up.base_url(), &up.base_url(), false));
    let body = serde_json::json!({"model": "m1", "background": true, "input": "hi"});
    let resp = json_post(gw.addr(), "/v1/responses", "test-key", &body);
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-tidegate-warning"),
        Some("background-degraded")
    );
    assert_eq!(resp.json()["status"], "completed");
    let seen = up.requests_to("/v1/responses");
    assert_eq!(seen.len(), 1);
    let sent = seen[0].json();
    assert!(sent["background"].is_null(), "{sent}");
    assert_eq!(sent["input"], "hi");

    // Without the flag, no warning.
    let body = serde_json::json!({"model": "m1", "input": "hi"});
    let resp = json_post(gw.addr(), "/v1/responses", "test-key", &body);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("x-tidegate-warning"), None);
}

/// `small` and `large` both serve `m1` (small first, file order); the model lockout's base
/// cooldown — the tool limit's duration — is 5 s.
fn two_sizes(small: &str, large: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "small"
format = "openai"
base_url = "{small}"
models = ["m1"]

[[providers]]
id = "large"
format = "openai"
base_url = "{large}"
models = ["m1"]

[[connections]]
id = "s1"
provider = "small"

[[connections]]
id = "l1"
provider = "large"

[resilience.model_lockout]
base_cooldown_ms = 5000
"#
    )
}

fn with_tools(n: usize) -> serde_json::Value {
    let tools: Vec<serde_json::Value> = (0..n)
        .map(|i| serde_json::json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    serde_json::json!({"model": "m1", "tools": tools,
                       "messages": [{"role": "user", "content": "hi"}]})
}

#[test]
fn a_tool_limit_answer_steers_requests_with_that_many_tools_away_until_it_ends() {
    let small = MockUpstream::start();
    let large = MockUpstream::start();
    small.on_always(
        CHAT,
        Reply::error(
            400,
            "Invalid 'tools': array too long. Expected an array with maximum length 3, but \
             got an array with length 5 instead.",
        ),
    );
    large.on_always(CHAT, Reply::openai_chat("large"));
    let gw = Gateway::start(&two_sizes(&small.base_url(), &large.base_url()));

    // The first request learns the limit (at most 3: four tools or more) and is served by
    // the next target.
    let resp = chat(&gw, with_tools(5));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-tidegate-provider"), Some("large"));
    assert_eq!(small.hits(CHAT), 1);

    // Every shard now sends requests with four or more tools to `large` first.
    for n in [4, 5, 9, 4, 6, 5, 8, 4] {
        let resp = chat(&gw, with_tools(n));
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.header("x-tidegate-attempts"), Some("1"), "{n} tools");
        assert_eq!(resp.header("x-tidegate-provider"), Some("large"));
    }
    assert_eq!(small.hits(CHAT), 1);

    // Fewer tools still go to `small` first.
    small.on(CHAT, Reply::openai_chat("small"));
    let resp = chat(&gw, with_tools(3));
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-tidegate-provider"), Some("small"));
    assert_eq!(small.hits(CHAT), 2);

    // Once the lockout's duration has passed, `small` is tried first again.
    eventually(
        std::time::Duration::from_secs(20),
        "the tool limit to end",
        || {
            let resp = chat(&gw, with_tools(5));
            assert_eq!(resp.status, 200, "{}", resp.text());
            (small.hits(CHAT) > 2).then_some(())
        },
    );
}

#[test]
fn a_combo_whose_terminal_answer_is_a_spent_budget_reruns_on_the_emergency_target() {
    let paid = MockUpstream::start();
    let paid2 = MockUpstream::start();
    let rescue = MockUpstream::start();
    paid.on_always(CHAT, Reply::error(402, "Payment Required: out of credits"));
    paid2.on_always(CHAT, Reply::error(402, "Payment Required: no credits"));
    rescue.on_always(CHAT, Reply::openai_chat("rescued"));
    let combo = format!(
        r#"
[[providers]]
id = "paid2"
format = "openai"
base_url = "{}"
models = ["m2"]

[[connections]]
id = "p2"
provider = "paid2"

[[combos]]
name = "team"
targets = ["paid/m1", "paid2/m2"]
"#,
        paid2.base_url()
    );
    let gw = Gateway::start(&(config(&paid.base_url(), &rescue.base_url(), true) + &combo));
    let mut request = plain_request();
    request["model"] = "team".into();

    // Both targets answer 402: the combo's answer would be that 402, so the request is
    // re-run once on the emergency target, after both targets were tried.
    let resp = chat(&gw, request.clone());
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.json()["choices"][0]["message"]["content"], "rescued");
    assert_eq!(
        resp.header("x-omniroute-emergency-fallback"),
        Some("from=paid2/m2; to=rescue/big")
    );
    assert_eq!((paid.hits(CHAT), paid2.hits(CHAT)), (1, 1));
    let seen = rescue.requests_to(CHAT);
    assert_eq!(seen.len(), 1, "re-run once");
    assert_eq!(seen[0].json()["model"], "big");
    assert_eq!(seen[0].json()["max_tokens"], 4096);

    // Both connections are now known to be out of credits: nothing is sent to them and
    // the emergency target serves.
    let resp = chat(&gw, request.clone());
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-omniroute-emergency-fallback"),
        Some("from=paid/m1; to=rescue/big")
    );
    assert_eq!(
        (paid.hits(CHAT), paid2.hits(CHAT), rescue.hits(CHAT)),
        (1, 1, 2)
    );

    // A request with tools is not re-run: the combo's own answer.
    request["tools"] = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
    let resp = chat(&gw, request);
    assert_eq!(resp.status, 404, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "no_executable_targets");
    assert_eq!(resp.header("x-omniroute-emergency-fallback"), None);
    assert_eq!(rescue.hits(CHAT), 2);
}
