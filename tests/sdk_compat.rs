//! Client compatibility: the official `openai` and `anthropic` Python SDKs call the gateway,
//! streamed and not — against the in-process mock provider, and against a real-socket
//! upstream of each format. Needs `TIDEGATE_PYTHON` (set by `scripts/test`); fails without.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::Value;
use support::*;

/// The gateway on `workers` shards with one client key (`sdk-key`) and the in-process mock.
fn mock_gateway(workers: u32) -> Gateway {
    Gateway::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = {workers}

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
"#
    ))
}

#[test]
fn official_sdks_work_against_the_mock_provider() {
    let gw = mock_gateway(2);
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
    let gw = Gateway::start(&sdk_providers(&openai, &anthropic));
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
    // answers the next calls itself (429 in Anthropic's shape). For 10 minutes: the SDK
    // script's call comes after the Python interpreter and both SDKs have loaded, which on
    // a loaded machine took over a minute (a 60 s hold had ended and the call reached the
    // upstream).
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        Reply::json(
            429,
            serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
        )
        .header("retry-after", "600"),
    );
    let openai = MockUpstream::start();
    // The cooling model is answered at once, not after waiting the 600 s out.
    let cfg =
        sdk_providers(&openai, &anthropic) + "\n[resilience.wait_for_cooldown]\nenabled = false\n";
    let gw = Gateway::start(&cfg);
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

#[test]
fn the_openai_sdk_is_served_by_an_anthropic_format_upstream() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let usage = serde_json::json!({"input_tokens": 12, "output_tokens": 6});
    let message = |content: serde_json::Value, stop: &str| {
        Reply::json(
            200,
            serde_json::json!({"id": "msg_x", "type": "message", "role": "assistant",
                "model": "claude-x", "content": content, "stop_reason": stop,
                "stop_sequence": null, "usage": usage}),
        )
    };
    // In the order sdk_translate.py makes its calls.
    anthropic.on(
        "/v1/messages",
        message(
            serde_json::json!([{"type": "text", "text": "A red dot."}]),
            "end_turn",
        ),
    );
    anthropic.on("/v1/messages", Reply::anthropic_stream(&["one ", "two"]));
    anthropic.on(
        "/v1/messages",
        message(
            serde_json::json!([{"type": "tool_use", "id": "toolu_w", "name": "get_weather",
                "input": {"city": "Paris"}}]),
            "tool_use",
        ),
    );
    anthropic.on(
        "/v1/messages",
        message(
            serde_json::json!([{"type": "text", "text": "Sunny."}]),
            "end_turn",
        ),
    );
    let r = run_translate(&openai, &anthropic, &["openai", "an/claude-x"]);
    assert_eq!(r["chat"]["content"], "A red dot.", "{r}");
    assert_eq!(r["stream"]["content"], "one two", "{r}");
    assert_eq!(r["tool_call"]["id"], "toolu_w", "{r}");
    assert_eq!(r["tool_result"]["content"], "Sunny.", "{r}");
    let sent = anthropic.requests_to("/v1/messages");
    assert_eq!(sent.len(), 4);
    let first = sent[0].json();
    assert_eq!(first["system"], "Be brief.");
    assert_eq!(first["messages"][0]["content"][1]["type"], "image");
    assert_eq!(
        first["messages"][0]["content"][1]["source"]["media_type"],
        "image/png"
    );
    assert_eq!(sent[1].json()["stream"], true);
    // The tool result went back with the tool call's id.
    let last = sent[3].json();
    assert_eq!(last["messages"][1]["content"][0]["id"], "toolu_w");
    assert_eq!(last["messages"][2]["content"][0]["type"], "tool_result");
    assert_eq!(last["messages"][2]["content"][0]["tool_use_id"], "toolu_w");
    assert_eq!(openai.total_hits(), 0);
}

/// Starts the gateway of [`sdk_providers`] and runs sdk_translate.py's `args` against it
/// with the client key; returns what the script printed.
fn run_translate(openai: &MockUpstream, anthropic: &MockUpstream, args: &[&str]) -> Value {
    let gw = Gateway::start(&sdk_providers(openai, anthropic));
    let origin = format!("http://{}", gw.addr());
    run_sdk_script(SDK_TRANSLATE, &origin, "sdk-key", args)
}

/// Scripts `openai` as a Chat Completions upstream of `model` for sdk_translate.py's three
/// calls, in the order it makes them: a call of `get_weather`, then "Sunny.", then a
/// stream with the reasoning `reasoning` and the text "The answer is 4." (5 prompt and 8
/// completion tokens).
fn script_chat_calls(openai: &MockUpstream, model: &str, reasoning: [&str; 2]) {
    // 9 prompt and 4 completion tokens each.
    let completion =
        |message, finish| chat_completion("chatcmpl-x", model, message, finish, (9, 4));
    openai.on(
        "/v1/chat/completions",
        completion(
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_w", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
            "tool_calls",
        ),
    );
    openai.on(
        "/v1/chat/completions",
        completion(
            serde_json::json!({"role": "assistant", "content": "Sunny."}),
            "stop",
        ),
    );
    let c = ChatChunks::stamped("chatcmpl-s", model, 1);
    let thought = |t: &str| c.chunk(serde_json::json!({"reasoning_content": t}), Value::Null);
    let chunks = [
        c.role(),
        thought(reasoning[0]),
        thought(reasoning[1]),
        c.text("The answer "),
        c.text("is 4."),
        c.finish("stop"),
        c.usage(5, 8),
    ];
    openai.on("/v1/chat/completions", chat_stream(chunks));
}

/// The three requests [`script_chat_calls`]' upstream got, checked for what every
/// translated client sends alike: the tool offered, the call and its output sent back
/// with the call's id, the stream asked with the reasoning effort.
fn chat_calls_sent(openai: &MockUpstream) -> [Value; 3] {
    let sent = openai.requests_to("/v1/chat/completions");
    assert_eq!(sent.len(), 3);
    let [first, second, third] = [0, 1, 2].map(|i| sent[i].json());
    assert_eq!(first["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(second["messages"][2]["tool_calls"][0]["id"], "call_w");
    assert_eq!(
        second["messages"][3],
        serde_json::json!({"role": "tool", "tool_call_id": "call_w", "content": "sunny, 21C"})
    );
    assert_eq!(third["stream"], true);
    assert_eq!(third["reasoning_effort"], "medium");
    [first, second, third]
}

#[test]
fn the_anthropic_sdk_is_served_by_an_openai_format_upstream() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    script_chat_calls(&openai, "gpt-x", ["Let me think. ", "Done."]);
    let r = run_translate(&openai, &anthropic, &["anthropic", "oa/gpt-x"]);
    assert_eq!(r["tool_use"]["id"], "call_w", "{r}");
    assert_eq!(r["tool_result"]["content"], "Sunny.", "{r}");
    assert_eq!(r["stream"]["thinking"], "Let me think. Done.", "{r}");
    assert_eq!(r["stream"]["content"], "The answer is 4.", "{r}");
    assert_eq!(r["stream"]["output_tokens"], 8, "{r}");
    let [first, _, _] = chat_calls_sent(&openai);
    assert_eq!(
        first["messages"][0],
        serde_json::json!({"role": "system", "content": [
            {"type": "text", "text": "You are terse."}, {"type": "text", "text": "Use tools."}]})
    );
    assert_eq!(anthropic.total_hits(), 0);
}

#[test]
fn the_openai_sdk_responses_api_is_served_by_a_chat_completions_only_upstream() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    script_chat_calls(&openai, "gpt-c", ["Let me ", "think."]);
    let r = run_translate(&openai, &anthropic, &["responses", "oc/gpt-c"]);
    assert_eq!(r["call"]["call_id"], "call_w", "{r}");
    assert_eq!(r["answer"]["text"], "Sunny.", "{r}");
    assert_eq!(r["stream"]["summary"], "Let me think.", "{r}");
    assert_eq!(r["stream"]["text"], "The answer is 4.", "{r}");
    assert_eq!(r["stream"]["output_tokens"], 8, "{r}");
    assert_eq!(openai.hits("/v1/responses"), 0);
    let [first, _, _] = chat_calls_sent(&openai);
    assert_eq!(
        first["messages"][0],
        serde_json::json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(anthropic.total_hits(), 0);
}

#[test]
fn the_openai_sdk_responses_api_is_served_by_an_anthropic_format_upstream() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let usage = serde_json::json!({"input_tokens": 12, "output_tokens": 6});
    let message = |content: serde_json::Value, stop: &str| {
        Reply::json(
            200,
            serde_json::json!({"id": "msg_x", "type": "message", "role": "assistant",
                "model": "claude-x", "content": content, "stop_reason": stop,
                "stop_sequence": null, "usage": usage}),
        )
    };
    anthropic.on(
        "/v1/messages",
        message(
            serde_json::json!([{"type": "tool_use", "id": "toolu_w", "name": "get_weather",
                "input": {"city": "Paris"}}]),
            "tool_use",
        ),
    );
    anthropic.on(
        "/v1/messages",
        message(
            serde_json::json!([{"type": "text", "text": "Sunny."}]),
            "end_turn",
        ),
    );
    anthropic.on(
        "/v1/messages",
        AnthropicEvents::start("msg_s", "claude-x", 7)
            .open(0, serde_json::json!({"type": "thinking", "thinking": ""}))
            .delta(
                0,
                serde_json::json!({"type": "thinking_delta", "thinking": "Two and two."}),
            )
            .delta(
                0,
                serde_json::json!({"type": "signature_delta", "signature": "sig"}),
            )
            .close(0)
            .text(1, &["Four", "."])
            .stop("end_turn", 11)
            .reply(),
    );
    let r = run_translate(&openai, &anthropic, &["responses", "an/claude-x"]);
    assert_eq!(r["call"]["call_id"], "toolu_w", "{r}");
    assert_eq!(r["answer"]["text"], "Sunny.", "{r}");
    assert_eq!(r["stream"]["summary"], "Two and two.", "{r}");
    assert_eq!(r["stream"]["text"], "Four.", "{r}");
    assert_eq!(r["stream"]["output_tokens"], 11, "{r}");
    let sent = anthropic.requests_to("/v1/messages");
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[0].json()["system"], "Be brief.");
    assert_eq!(sent[0].json()["tools"][0]["name"], "get_weather");
    let second = sent[1].json();
    assert_eq!(second["messages"][1]["content"][0]["id"], "toolu_w");
    assert_eq!(
        second["messages"][2]["content"][0]["tool_use_id"],
        "toolu_w"
    );
    let third = sent[2].json();
    assert_eq!(third["stream"], true);
    assert_eq!(third["thinking"]["budget_tokens"], 4096);
    assert_eq!(openai.total_hits(), 0);
}

/// One OpenAI-format provider `oa` (model `gpt-x`), one Anthropic-format provider `an`
/// (model `claude-x`), and `oc` (model `gpt-c`) on the OpenAI-format upstream marked as
/// Chat Completions only; one connection each, client key `sdk-key`.
fn sdk_providers(openai: &MockUpstream, anthropic: &MockUpstream) -> String {
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

# The OpenAI-format upstream, known to speak only Chat Completions.
[[providers]]
id = "oc"
format = "openai"
base_url = "{0}"
models = ["gpt-c"]
responses_api = false

[[connections]]
id = "oa-1"
provider = "oa"

[[connections]]
id = "an-1"
provider = "an"

[[connections]]
id = "oc-1"
provider = "oc"
"#,
        openai.base_url(),
        anthropic.base_url()
    )
}

#[test]
fn the_openai_sdk_responses_stream_helper_reads_the_mock_responses_stream() {
    let gw = mock_gateway(1);
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

#[test]
fn the_openai_sdk_reads_a_responses_stream_continued_after_a_cut() {
    // Two Chat-Completions-only upstreams for `m1`, mid-stream continuation on: `a` cuts its
    // stream after a reasoning summary and some text, `b` continues it (repeating the last
    // 15 characters, with reasoning of its own that the client never sees).
    let a = MockUpstream::start();
    let b = MockUpstream::start();
    let (ca, cb) = (
        ChatChunks::stamped("chatcmpl-a", "gpt-c", 1),
        ChatChunks::stamped("chatcmpl-b", "gpt-c", 1),
    );
    let thought =
        |c: &ChatChunks, t: &str| c.chunk(serde_json::json!({"reasoning_content": t}), Value::Null);
    let a_chunks = [
        ca.role(),
        thought(&ca, "Let me "),
        thought(&ca, "think."),
        ca.text("The answer "),
        ca.text("is forty"),
    ];
    let a_chunks: Vec<String> = a_chunks.iter().map(sse_data).collect();
    script(&a, "/v1/chat/completions", &a_chunks, Some(Chunk::close()));
    let b_chunks = [
        cb.role(),
        thought(&cb, "Again."),
        cb.text("answer is forty"),
        cb.text("-two."),
        cb.finish("stop"),
        cb.usage(30, 6),
    ];
    b.on_always("/v1/chat/completions", chat_stream(b_chunks));
    let chat_only = |id: &str, m: &MockUpstream| {
        provider_of(id, m, "chat") + &connection(&format!("{id}-1"), id)
    };
    let gw = Gateway::start(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\n\
         [[client_keys]]\nid = \"sdk\"\nkey = \"sdk-key\"\n\n{}{}\
         [resilience.stream_recovery]\ncontinue_mid_stream = true\n",
        chat_only("a", &a),
        chat_only("b", &b),
    ));
    let origin = format!("http://{}", gw.addr());
    let r = run_sdk_script(
        SDK_TRANSLATE,
        &origin,
        "sdk-key",
        &["responses-stream", "m1"],
    );
    let s = &r["stream"];
    // What the deltas built, and the final response the SDK parsed from response.completed.
    assert_eq!(s["text"], "The answer is forty-two.", "{r}");
    assert_eq!(s["final_text"], "The answer is forty-two.", "{r}");
    assert_eq!(s["summary"], "Let me think.", "{r}");
    assert_eq!(s["id"], "resp_chatcmpl-a", "{r}");
    assert_eq!(
        s["output_ids"],
        serde_json::json!(["rs_chatcmpl-a_0", "msg_chatcmpl-a_1"]),
        "{r}"
    );
    // Usage over the whole answer: b's prompt less a's 2 text deltas, 2 + 6 output tokens.
    assert_eq!(
        (&s["input_tokens"], &s["output_tokens"]),
        (&serde_json::json!(28), &serde_json::json!(8)),
        "{r}"
    );
    let kinds = s["kinds"].as_array().unwrap();
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(count("response.created"), 1, "{r}");
    assert_eq!(count("response.output_item.added"), 2, "{r}");
    assert_eq!(count("response.completed"), 1, "{r}");
    let seqs: Vec<u64> = s["sequence_numbers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "{r}");
    // b was asked with the delivered text as an assistant prefill.
    let (last, _) = last_message(&b, "/v1/chat/completions");
    assert_eq!(
        last,
        serde_json::json!({"role": "assistant", "content": "The answer is forty"})
    );
}

/// Runs `sdk_translate.py`'s `mode` against combo `combo` on a gateway over an OpenAI-format
/// and an Anthropic-format mock, scripted by `script`; gives the script's result and the two
/// mocks (for what reached them).
fn through_combo(
    mode: &str,
    combo: &str,
    script: impl FnOnce(&MockUpstream, &MockUpstream),
) -> (Value, MockUpstream, MockUpstream) {
    let combos = "\n[[combos]]\nname = \"oc-an-oa\"\ntargets = [\"oc/gpt-c\", \"an/claude-x\", \"oa/gpt-x\"]\n\
                  \n[[combos]]\nname = \"an-oc-oa\"\ntargets = [\"an/claude-x\", \"oc/gpt-c\", \"oa/gpt-x\"]\n";
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    script(&openai, &anthropic);
    let gw = Gateway::start(&format!("{}{combos}", sdk_providers(&openai, &anthropic)));
    let origin = format!("http://{}", gw.addr());
    let r = run_sdk_script(SDK_TRANSLATE, &origin, "sdk-key", &[mode, combo]);
    (r, openai, anthropic)
}

/// Combos whose targets alternate formats, through the official SDKs: each fails over in the
/// middle of its list from a provider of the client's format to one of the other format,
/// whose answers (complete and streamed) the SDK parses with its own types.
#[test]
fn the_sdks_are_served_by_a_combo_failing_over_to_the_other_format() {
    // The openai SDK: oc (its own format) fails, an (translated) answers.
    let (r, openai, anthropic) = through_combo("combo-openai", "oc-an-oa", |openai, anthropic| {
        openai.on_always("/v1/chat/completions", Reply::error(503, "busy"));
        anthropic.on("/v1/messages", Reply::anthropic_message("from claude"));
        anthropic.on(
            "/v1/messages",
            Reply::anthropic_stream(&["claude ", "streams"]),
        );
    });
    assert_eq!(r["create"], "from claude", "{r}");
    assert_eq!(r["stream"], "claude streams", "{r}");
    let to_oc = openai.requests_to("/v1/chat/completions");
    assert!(!to_oc.is_empty());
    assert!(
        to_oc.iter().all(|s| s.json()["model"] == "gpt-c"),
        "oa is last: not reached"
    );
    let to_an = anthropic.requests_to("/v1/messages");
    assert_eq!(to_an.len(), 2);
    assert_eq!(to_an[0].json()["max_tokens"], 50, "translated from chat");
    assert_eq!(to_an[1].json()["stream"], true);

    // The anthropic SDK: an (its own format) fails, oc (translated) answers.
    let (r, openai, anthropic) =
        through_combo("combo-anthropic", "an-oc-oa", |openai, anthropic| {
            anthropic.on_always("/v1/messages", Reply::error(529, "overloaded"));
            openai.on("/v1/chat/completions", Reply::openai_chat("from gpt"));
            openai.on(
                "/v1/chat/completions",
                Reply::openai_stream(&["gpt ", "streams"]),
            );
        });
    assert_eq!(r["create"], "from gpt", "{r}");
    assert_eq!(r["stream"], "gpt streams", "{r}");
    assert!(anthropic.hits("/v1/messages") >= 1);
    let to_oc = openai.requests_to("/v1/chat/completions");
    assert_eq!(to_oc.len(), 2);
    for up in &to_oc {
        assert_eq!(up.json()["model"], "gpt-c", "the middle target answered");
        assert_eq!(up.json()["max_tokens"], 50, "translated from messages");
    }
    assert_eq!(to_oc[1].json()["stream_options"]["include_usage"], true);
}
