//! Format translation through the binary: an OpenAI Chat Completions client served by an
//! Anthropic-format upstream and an Anthropic Messages client served by an OpenAI-format
//! upstream — requests, complete answers, streams, upstream errors, refused fields, and a
//! combo whose targets alternate formats failing over between them; and Responses API
//! requests served by a Chat-Completions-only provider and by an Anthropic provider.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::json;
use support::*;

/// One OpenAI-format provider `oa` (model `gpt-x`) and one Anthropic-format provider `an`
/// (model `claude-x`), client key `k`, and two combos alternating formats.
fn config(openai: &MockUpstream, anthropic: &MockUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "k"
key = "k"

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

# The same upstream, known to speak only Chat Completions.
[[providers]]
id = "oc"
format = "openai"
base_url = "{0}"
models = ["gpt-c"]
responses_api = false

[[connections]]
id = "oa-1"
provider = "oa"
api_key_env = "TG_OA"

[[connections]]
id = "oc-1"
provider = "oc"
api_key_env = "TG_OA"

[[connections]]
id = "an-1"
provider = "an"
api_key_env = "TG_AN"

[[combos]]
name = "an-then-oa"
targets = ["an/claude-x", "oa/gpt-x"]

[[combos]]
name = "oa-then-an"
targets = ["oa/gpt-x", "an/claude-x"]
"#,
        openai.base_url(),
        anthropic.base_url()
    )
}

fn start(openai: &MockUpstream, anthropic: &MockUpstream) -> Gateway {
    Gateway::start_with_env(
        &config(openai, anthropic),
        &[("TG_OA", "oa-secret"), ("TG_AN", "an-secret")],
    )
}

fn post(gw: &Gateway, path: &str, body: &serde_json::Value) -> Response {
    json_post(gw.addr(), path, "k", body)
}

#[test]
fn an_openai_chat_request_is_served_by_an_anthropic_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        Reply::json(
            200,
            json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x-2025",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "tide"}}
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 4,
                          "cache_creation_input_tokens": 2}
            }),
        ),
    );
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({
            "model": "an/claude-x",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_0", "content": "nothing found"}
            ],
            "tools": [{"type": "function", "function": {"name": "lookup", "description": "Look up",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
            "tool_choice": "required",
            "stop": "END",
            "temperature": 0.5,
            "user": "u-1"
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-translated"),
        Some("openai-chat->anthropic-messages")
    );
    let body = r.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["id"], "msg_1");
    assert_eq!(body["model"], "claude-x-2025", "the model that served");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Let me look.");
    assert_eq!(choice["message"]["tool_calls"][0]["id"], "toolu_1");
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["arguments"],
        "{\"q\":\"tide\"}"
    );
    assert_eq!(body["usage"]["prompt_tokens"], 16);
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    // What reached the Anthropic upstream.
    let sent = anthropic.requests_to("/v1/messages");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].header("x-api-key"), Some("an-secret"));
    assert!(sent[0].has_header("anthropic-version"));
    let up = sent[0].json();
    assert_eq!(up["model"], "claude-x");
    assert_eq!(up["system"], "Be brief.");
    assert_eq!(up["max_tokens"], 4096, "the documented default");
    assert_eq!(up["stop_sequences"], json!(["END"]));
    assert_eq!(up["metadata"]["user_id"], "u-1");
    assert_eq!(up["tool_choice"], json!({"type": "any"}));
    assert_eq!(
        up["tools"][0]["input_schema"]["properties"]["q"]["type"],
        "string"
    );
    assert_eq!(
        up["messages"][0]["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}})
    );
    assert_eq!(up["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(up["messages"][1]["content"][0]["id"], "call_0");
    assert_eq!(up["messages"][1]["content"][0]["input"], json!({"q": "x"}));
    assert_eq!(
        up["messages"][2]["content"][0],
        json!({"type": "tool_result", "tool_use_id": "call_0", "content": "nothing found"})
    );
    assert_eq!(openai.total_hits(), 0);
}

#[test]
fn an_anthropic_messages_request_is_served_by_an_openai_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on(
        "/v1/chat/completions",
        Reply::json(
            200,
            json!({
                "id": "chatcmpl-9", "object": "chat.completion", "created": 1, "model": "gpt-x-0601",
                "choices": [{"index": 0, "finish_reason": "length", "message": {
                    "role": "assistant", "content": "Partial", "reasoning_content": "thinking...",
                    "tool_calls": [{"id": "call_7", "type": "function",
                        "function": {"name": "lookup", "arguments": "{\"q\":1}"}}]}}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
                          "prompt_tokens_details": {"cached_tokens": 5}}
            }),
        ),
    );
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/messages",
        &json!({
            "model": "oa/gpt-x",
            "max_tokens": 300,
            "system": [{"type": "text", "text": "Rule one.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {"q": 2}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "ok"},
                    {"type": "text", "text": "go on"}]}
            ],
            "tools": [{"name": "lookup", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "lookup", "disable_parallel_tool_use": true},
            "stop_sequences": ["STOP"],
            "thinking": {"type": "enabled", "budget_tokens": 4096},
            "metadata": {"user_id": "u-2"}
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let m = r.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["id"], "chatcmpl-9");
    assert_eq!(m["model"], "gpt-x-0601");
    assert_eq!(m["stop_reason"], "max_tokens");
    assert_eq!(m["content"][0]["type"], "thinking");
    assert_eq!(m["content"][1], json!({"type": "text", "text": "Partial"}));
    assert_eq!(
        m["content"][2],
        json!({"type": "tool_use", "id": "call_7", "name": "lookup", "input": {"q": 1}})
    );
    assert_eq!(m["usage"]["input_tokens"], 15);
    assert_eq!(m["usage"]["cache_read_input_tokens"], 5);
    assert_eq!(m["usage"]["output_tokens"], 7);
    let sent = openai.requests_to("/v1/chat/completions");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].header("authorization"), Some("Bearer oa-secret"));
    let up = sent[0].json();
    assert_eq!(up["model"], "gpt-x");
    assert_eq!(up["max_tokens"], 300);
    assert_eq!(
        up["messages"][0],
        json!({"role": "system", "content": [{"type": "text", "text": "Rule one."}]})
    );
    assert_eq!(up["messages"][2]["tool_calls"][0]["id"], "toolu_a");
    assert_eq!(
        up["messages"][3],
        json!({"role": "tool", "tool_call_id": "toolu_a", "content": "ok"})
    );
    assert_eq!(up["messages"][4]["content"][0]["text"], "go on");
    assert_eq!(up["tool_choice"]["function"]["name"], "lookup");
    assert_eq!(up["parallel_tool_calls"], false);
    assert_eq!(up["stop"], json!(["STOP"]));
    assert_eq!(up["reasoning_effort"], "medium");
    assert_eq!(up["user"], "u-2");
    assert_eq!(anthropic.total_hits(), 0);
}

#[test]
fn an_anthropic_stream_reaches_an_openai_client_as_chunks_with_usage_and_done() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        AnthropicEvents::start("msg_s", "claude-x", 9)
            .ping()
            .text(0, &["Hel", "lo"])
            .tool_use(1, "toolu_9", "f", &["{\"a\":", "1}"])
            .stop("tool_use", 12)
            .reply(),
    );
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "an/claude-x", "stream": true, "stream_options": {"include_usage": true},
                "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = r.sse_events();
    assert_eq!(events.last().unwrap().data, "[DONE]", "{}", r.text());
    let chunks: Vec<serde_json::Value> = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| e.json())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello");
    let args: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, "{\"a\":1}");
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["delta"]["tool_calls"][0]["id"] == "toolu_9")
    );
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "tool_calls")
    );
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 9);
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    assert!(chunks.iter().all(|c| c["id"] == "msg_s"));
}

#[test]
fn an_openai_stream_reaches_an_anthropic_client_as_message_events() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let c = ChatChunks::stamped("chatcmpl-s", "gpt-x", 1);
    let chunks = [
        c.role(),
        c.chunk(json!({"reasoning_content": "hmm"}), json!(null)),
        c.text("Hi "),
        c.text("there"),
        c.chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": ""}}]}),
            json!(null),
        ),
        c.chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\":2}"}}]}),
            json!(null),
        ),
        c.finish("tool_calls"),
        c.usage(11, 4),
    ];
    openai.on("/v1/chat/completions", chat_stream(chunks));
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/messages",
        &json!({"model": "oa/gpt-x", "stream": true, "max_tokens": 50,
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let up = openai.requests_to("/v1/chat/completions")[0].json();
    assert_eq!(up["stream"], true);
    assert_eq!(up["stream_options"]["include_usage"], true);
    let events = r.sse_events();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e.event.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ],
        "{}",
        r.text()
    );
    let data: Vec<serde_json::Value> = events.iter().map(|e| e.json()).collect();
    assert_eq!(data[0]["message"]["id"], "chatcmpl-s");
    assert_eq!(data[1]["content_block"]["type"], "thinking");
    assert_eq!(data[2]["delta"]["thinking"], "hmm");
    assert_eq!(data[5]["delta"]["text"], "Hi ");
    assert_eq!(data[8]["content_block"]["id"], "call_1");
    assert_eq!(data[9]["delta"]["partial_json"], "{\"x\":2}");
    assert_eq!(data[11]["delta"]["stop_reason"], "tool_use");
    assert_eq!(data[11]["usage"]["output_tokens"], 4);
    assert_eq!(data[11]["usage"]["input_tokens"], 11);
}

#[test]
fn upstream_errors_come_back_in_the_clients_shape_with_their_status() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        Reply::json(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad image"}}),
        ),
    );
    openai.on(
        "/v1/chat/completions",
        Reply::json(
            404,
            json!({"error": {"message": "no such model", "type": "invalid_request_error", "code": "model_not_found"}}),
        ),
    );
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "an/claude-x", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], "bad image", "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = post(
        &gw,
        "/v1/messages",
        &json!({"model": "oa/gpt-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["type"], "error", "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "not_found_error");
    assert_eq!(r.json()["error"]["message"], "no such model");
}

/// `POST path` with the headers Claude Code sends besides its key.
fn post_as_claude_code(gw: &Gateway, path: &str, body: &serde_json::Value) -> Response {
    Client::connect(gw.addr()).request(
        "POST",
        path,
        &[
            ("authorization", "Bearer k"),
            ("content-type", "application/json"),
            ("anthropic-version", "2023-06-01"),
            (
                "anthropic-beta",
                "claude-code-20250219,context-management-2025-06-27,effort-2025-11-24",
            ),
        ],
        body.to_string().as_bytes(),
    )
}

/// The fields Claude Code sends (seen from version 2.1 through the access log): adaptive
/// thinking with `output_config.effort`, a `context_management` edit clearing earlier
/// thinking, a system message between turns, `metadata.user_id`, and the `?beta=true` query.
fn claude_code_request(model: &str, edit: &str) -> serde_json::Value {
    json!({
        "model": model,
        "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "system", "content": "Available agent types: claude."},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Greeting.", "signature": "sig"},
                {"type": "text", "text": "hi"}]},
            {"role": "user", "content": "again"}
        ],
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}],
        "metadata": {"user_id": "{\"session_id\":\"s-1\"}"},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": edit, "keep": "all"}]},
        "output_config": {"effort": "max"},
        "stream": false
    })
}

#[test]
fn a_claude_code_request_is_served_by_an_openai_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on(
        "/v1/chat/completions",
        chat_completion(
            "chatcmpl-cc",
            "gpt-x",
            json!({"role": "assistant", "content": "hello"}),
            "stop",
            (9, 1),
        ),
    );
    anthropic.on(
        "/v1/messages",
        Reply::json(
            200,
            json!({"id": "msg_cc", "type": "message", "role": "assistant", "model": "claude-x",
                "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 9, "output_tokens": 1}}),
        ),
    );
    let gw = start(&openai, &anthropic);
    let r = post_as_claude_code(
        &gw,
        "/v1/messages?beta=true",
        &claude_code_request("oa/gpt-x", "clear_thinking_20251015"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], "hello");
    let sent = openai.requests_to("/v1/chat/completions");
    assert_eq!(sent.len(), 1);
    // The query and the anthropic-* fields belong to the client's endpoint.
    assert_eq!(sent[0].target, "/v1/chat/completions");
    assert_eq!(sent[0].header("anthropic-beta"), None);
    assert_eq!(sent[0].header("anthropic-version"), None);
    let up = sent[0].json();
    // Anthropic's top effort level goes as high: every OpenAI reasoning model takes it.
    assert_eq!(up["reasoning_effort"], "high");
    assert_eq!(up["user"], "{\"session_id\":\"s-1\"}");
    assert_eq!(
        up["messages"][2],
        json!({"role": "system", "content": "Available agent types: claude."})
    );
    assert_eq!(
        up["messages"][3]["content"],
        json!([{"type": "text", "text": "hi"}])
    );
    assert!(up.get("context_management").is_none() && up.get("output_config").is_none());
    // The same request to an Anthropic provider is forwarded as it came.
    let r = post_as_claude_code(
        &gw,
        "/v1/messages?beta=true",
        &claude_code_request("an/claude-x", "clear_thinking_20251015"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = anthropic.requests_to("/v1/messages");
    assert_eq!(sent[0].target, "/v1/messages?beta=true");
    assert_eq!(
        sent[0].header("anthropic-beta"),
        Some("claude-code-20250219,context-management-2025-06-27,effort-2025-11-24")
    );
    assert_eq!(
        sent[0].json()["context_management"]["edits"][0]["keep"],
        "all"
    );
    // An edit that would change the conversation cannot be honoured by the OpenAI provider.
    let r = post_as_claude_code(
        &gw,
        "/v1/messages",
        &claude_code_request("oa/gpt-x", "clear_tool_uses_20250919"),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        r.json()["error"]["param"],
        "context_management.edits[0].type"
    );
    assert_eq!(openai.hits("/v1/chat/completions"), 1);
}

/// An OpenAI provider's reasoning reaches an Anthropic client as a thinking block with an
/// empty signature; replayed in the next turn to an Anthropic provider (which refuses an
/// invalid signature), that block is left out and the rest goes as it came. A body without
/// such a block is forwarded byte for byte (but the model).
#[test]
fn an_unsigned_thinking_block_replayed_to_an_anthropic_provider_is_left_out() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on(
        "/v1/chat/completions",
        chat_completion(
            "chatcmpl-r",
            "gpt-x",
            json!({"role": "assistant", "reasoning_content": "Think first.", "content": "hello"}),
            "stop",
            (5, 2),
        ),
    );
    anthropic.on_always(
        "/v1/messages",
        Reply::json(
            200,
            json!({"id": "msg_r", "type": "message", "role": "assistant", "model": "claude-x",
                "content": [{"type": "text", "text": "again"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 9, "output_tokens": 1}}),
        ),
    );
    let gw = start(&openai, &anthropic);
    let first = json!({"model": "oa/gpt-x", "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&gw, "/v1/messages", &first);
    assert_eq!(r.status, 200, "{}", r.text());
    let answer = r.json()["content"].clone();
    assert_eq!(
        answer[0],
        json!({"type": "thinking", "thinking": "Think first.", "signature": ""})
    );
    // The next turn, with the answer as it came, to an Anthropic provider.
    let signed = json!({"type": "thinking", "thinking": "Mine.", "signature": "sig-an"});
    let next = json!({"model": "an/claude-x", "max_tokens": 100, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": [signed, {"type": "text", "text": "so"}]},
        {"role": "user", "content": "more"}
    ]});
    let r = post(&gw, "/v1/messages", &next);
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = anthropic.requests_to("/v1/messages");
    let up = sent[0].json();
    assert_eq!(up["model"], "claude-x");
    assert_eq!(
        up["messages"][1]["content"],
        json!([{"type": "text", "text": "hello"}])
    );
    let mut want = next.clone();
    want["model"] = json!("claude-x");
    want["messages"][1]["content"] = json!([{"type": "text", "text": "hello"}]);
    assert_eq!(up, want, "the rest goes as it came");
    // Counting the same history's tokens, too.
    anthropic.on_always(
        "/v1/messages/count_tokens",
        Reply::json(200, json!({"input_tokens": 12})),
    );
    let r = post(&gw, "/v1/messages/count_tokens", &next);
    assert_eq!(r.status, 200, "{}", r.text());
    let counted = anthropic.requests_to("/v1/messages/count_tokens");
    assert_eq!(counted[0].json(), want);
    // Signed thinking only: byte for byte, but the model.
    let plain = json!({"model": "an/claude-x", "max_tokens": 100, "messages": [
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": [signed, {"type": "text", "text": "so"}]},
        {"role": "user", "content": "more"}
    ]});
    let r = post(&gw, "/v1/messages", &plain);
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = anthropic.requests_to("/v1/messages");
    assert_eq!(
        sent[1].text(),
        plain.to_string().replace("\"an/claude-x\"", "\"claude-x\"")
    );
}

/// Each `output_config.effort` level of a Messages request reaches an OpenAI provider as the
/// `reasoning_effort` of the same rank; `max`, Anthropic's top level, as `high` (OpenAI's
/// `xhigh` is refused by its models before gpt-5.1-codex-max).
#[test]
fn each_effort_level_reaches_an_openai_provider_at_its_rank() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on_always(
        "/v1/chat/completions",
        chat_completion(
            "chatcmpl-e",
            "gpt-x",
            json!({"role": "assistant", "content": "ok"}),
            "stop",
            (3, 1),
        ),
    );
    let gw = start(&openai, &anthropic);
    let levels = [
        ("low", "low"),
        ("medium", "medium"),
        ("high", "high"),
        ("max", "high"),
    ];
    for (effort, _) in levels {
        let mut body = claude_code_request("oa/gpt-x", "clear_thinking_20251015");
        body["output_config"]["effort"] = json!(effort);
        let r = post_as_claude_code(&gw, "/v1/messages", &body);
        assert_eq!(r.status, 200, "{effort}: {}", r.text());
    }
    let sent = openai.requests_to("/v1/chat/completions");
    assert_eq!(sent.len(), levels.len());
    for (req, (effort, want)) in sent.iter().zip(levels) {
        assert_eq!(
            req.json()["reasoning_effort"],
            want,
            "output_config.effort {effort}"
        );
    }
}

#[test]
fn a_field_the_target_cannot_express_is_refused_naming_it() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "an/claude-x", "seed": 7, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert_eq!(r.json()["error"]["param"], "seed");
    assert_eq!(r.header("x-tidegate-error"), Some("untranslatable_request"));
    let r = post(
        &gw,
        "/v1/messages",
        &json!({"model": "oa/gpt-x", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["param"], "messages[0].content[0].type");
    assert_eq!(openai.total_hits() + anthropic.total_hits(), 0);
}

#[test]
fn a_combo_whose_targets_alternate_formats_fails_over_between_them() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    // The Anthropic target fails first; the OpenAI one answers (an OpenAI client: the
    // first attempt is translated, the second passes through).
    anthropic.on("/v1/messages", Reply::error(503, "overloaded"));
    openai.on("/v1/chat/completions", Reply::openai_chat("from openai"));
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "an-then-oa", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(r.json()["choices"][0]["message"]["content"], "from openai");
    // Then (a fresh gateway: the failed connection above is cooling) the OpenAI target
    // fails first and the Anthropic one answers (an Anthropic client: the first attempt is
    // translated, the second passes through).
    drop(gw);
    openai.on("/v1/chat/completions", Reply::error(503, "busy"));
    anthropic.on("/v1/messages", Reply::anthropic_message("from anthropic"));
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/messages",
        &json!({"model": "oa-then-an", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(r.json()["content"][0]["text"], "from anthropic");
    // Each upstream got one request in its own format.
    let to_an = anthropic.requests_to("/v1/messages");
    assert_eq!(to_an.len(), 2);
    assert_eq!(to_an[0].json()["max_tokens"], 4096, "translated from chat");
    let to_oa = openai.requests_to("/v1/chat/completions");
    assert_eq!(to_oa.len(), 2);
    assert_eq!(to_oa[1].json()["messages"][0]["content"], "hi");
}

/// Anthropic structured output (`output_config.format`) reaches an OpenAI-format provider as
/// a strict `json_schema` response format, and the JSON answer comes back as a text block.
#[test]
fn anthropic_structured_output_is_served_by_an_openai_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on("/v1/chat/completions", Reply::openai_chat("{\"a\":\"b\"}"));
    let gw = start(&openai, &anthropic);
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
        "required": ["a"], "additionalProperties": false});
    let r = post(
        &gw,
        "/v1/messages",
        &json!({"model": "oa/gpt-x", "max_tokens": 50,
                "output_config": {"format": {"type": "json_schema", "schema": schema}},
                "messages": [{"role": "user", "content": "give json"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["content"][0]["text"], "{\"a\":\"b\"}");
    let up = openai.requests_to("/v1/chat/completions")[0].json();
    assert_eq!(
        up["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": true}})
    );
    // Another format type is refused, naming it, before any upstream is asked.
    let r = post(
        &gw,
        "/v1/messages",
        &json!({"model": "oa/gpt-x", "max_tokens": 50,
                "output_config": {"format": {"type": "grammar"}},
                "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "output_config.format.type");
    assert_eq!(openai.total_hits(), 1);
}

/// An OpenAI `json_schema` response format (Chat Completions `response_format`, Responses
/// `text.format`) reaches an Anthropic provider as its structured output,
/// `output_config.format` with the schema (the name left behind), and the JSON answer comes
/// back as the message's content; `json_object`, which has no schema to give, is refused.
#[test]
fn an_openai_json_schema_is_served_by_an_anthropic_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on_always("/v1/messages", Reply::anthropic_message("{\"a\":\"b\"}"));
    let gw = start(&openai, &anthropic);
    let schema = json!({"type": "object", "properties": {"a": {"type": "string"}},
        "required": ["a"], "additionalProperties": false});
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "an/claude-x",
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "answer", "schema": schema, "strict": true}},
                "messages": [{"role": "user", "content": "give json"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "{\"a\":\"b\"}"
    );
    let up = anthropic.requests_to("/v1/messages")[0].json();
    assert_eq!(
        up["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
    assert!(up.get("response_format").is_none());
    // The Responses API's text.format likewise.
    let mut req = codex_request("an/claude-x", false);
    req["text"] = json!({"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}});
    let r = post(&gw, "/v1/responses", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["output"][0]["content"][0]["text"], "{\"a\":\"b\"}");
    let up = anthropic.requests_to("/v1/messages")[1].json();
    assert_eq!(
        up["output_config"],
        json!({"format": {"type": "json_schema", "schema": schema}})
    );
    // JSON without a schema is refused, naming the field, before any upstream is asked.
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "an/claude-x", "response_format": {"type": "json_object"},
                "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "response_format");
    assert_eq!(anthropic.total_hits(), 2);
}

/// Three targets whose formats alternate (OpenAI, Anthropic, OpenAI): the first two fail, so
/// the answer comes from the third after a failover in the middle of the list, from the
/// Anthropic target to an OpenAI one, each attempt in its target's own format.
#[test]
fn a_combo_of_alternating_formats_fails_over_mid_list() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let cfg = format!(
        "{}\n[[combos]]\nname = \"alt3\"\ntargets = [\"oa/gpt-x\", \"an/claude-x\", \"oc/gpt-c\"]\n",
        config(&openai, &anthropic)
    );
    // An OpenAI client, non-stream: oa (as it is) 503, an (translated) 529, oc (as it is) answers.
    openai.on("/v1/chat/completions", Reply::error(503, "busy"));
    anthropic.on("/v1/messages", Reply::error(529, "overloaded"));
    openai.on("/v1/chat/completions", Reply::openai_chat("third"));
    let env = [("TG_OA", "oa-secret"), ("TG_AN", "an-secret")];
    let gw = Gateway::start_with_env(&cfg, &env);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "alt3", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-attempts"), Some("3"));
    assert_eq!(
        r.header("x-tidegate-translated"),
        None,
        "the answering target is the client's format"
    );
    assert_eq!(r.json()["choices"][0]["message"]["content"], "third");
    let to_an = anthropic.requests_to("/v1/messages");
    assert_eq!(to_an.len(), 1);
    assert_eq!(
        to_an[0].json()["max_tokens"],
        4096,
        "the middle attempt was translated"
    );
    assert_eq!(to_an[0].json()["messages"][0]["content"], "hi");
    let to_oa = openai.requests_to("/v1/chat/completions");
    assert_eq!(to_oa.len(), 2);
    assert_eq!(to_oa[1].json()["model"], "gpt-c");
    drop(gw);

    // An Anthropic client, streaming, on a fresh gateway: oa (translated) 503, an (as it is)
    // 529, oc (translated) streams the answer, which reaches the client as Messages events.
    openai.on("/v1/chat/completions", Reply::error(503, "busy"));
    anthropic.on("/v1/messages", Reply::error(529, "overloaded"));
    openai.on(
        "/v1/chat/completions",
        Reply::openai_stream(&["mid ", "list"]),
    );
    let gw = Gateway::start_with_env(&cfg, &env);
    let r = post(
        &gw,
        "/v1/messages",
        &json!({"model": "alt3", "stream": true, "max_tokens": 20,
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-tidegate-attempts"), Some("3"));
    assert_eq!(
        r.header("x-tidegate-translated"),
        Some("anthropic-messages->openai-chat")
    );
    let events = r.sse_events();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e.event.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"), "{}", r.text());
    assert_eq!(names.last(), Some(&"message_stop"), "{}", r.text());
    let text: String = events
        .iter()
        .map(|e| e.json())
        .filter(|d| d["delta"]["type"] == "text_delta")
        .filter_map(|d| d["delta"]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "mid list");
    let to_an = anthropic.requests_to("/v1/messages");
    assert_eq!(to_an.len(), 2);
    assert_eq!(
        to_an[1].json()["stream"],
        true,
        "the middle attempt went as it is"
    );
    let to_oa = openai.requests_to("/v1/chat/completions");
    assert_eq!(to_oa.len(), 4);
    for up in &to_oa[2..] {
        let up = up.json();
        assert_eq!(
            up["stream_options"]["include_usage"], true,
            "translated: {up}"
        );
        assert_eq!(up["max_tokens"], 20);
    }
    assert_eq!(to_oa[3].json()["model"], "gpt-c");
}

#[test]
fn a_translated_stream_that_stalls_ends_with_an_in_band_error_in_the_clients_shape() {
    let anthropic = MockUpstream::start();
    // A message start without a stop reason or output tokens, as some upstreams send it.
    let events = AnthropicEvents::default()
        .event(
            json!({"type": "message_start", "message": {"id": "msg_w", "type": "message",
            "role": "assistant", "model": "claude-x", "content": [],
            "usage": {"input_tokens": 1}}}),
        )
        .open_text(0, &["Hel"]);
    let mut steps = events.chunks();
    steps.push(Chunk::stall());
    anthropic.on_always("/v1/messages", Reply::sse(steps));
    let gw = Gateway::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[providers]]
id = "an"
format = "anthropic"
base_url = "{}"
models = ["claude-x"]

[[connections]]
id = "an-1"
provider = "an"

[resilience.stream_watchdog]
stall_timeout_ms = 400
"#,
        anthropic.base_url()
    ));
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"an/claude-x","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let head = c.read_head();
    assert_eq!(head.status, 200);
    let body = unterminated_body(&mut c);
    let events = parse_sse(&body);
    assert_eq!(events[0].json()["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[1].json()["choices"][0]["delta"]["content"], "Hel");
    let last = events.last().unwrap().json();
    assert_eq!(last["error"]["code"], "stream_content_stall", "{last}");
    assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));
}

/// The chunked body read until the gateway closes; it must not end cleanly (no zero-size
/// last chunk).
fn unterminated_body(c: &mut Client) -> Vec<u8> {
    let raw = c.read_until_close(std::time::Duration::from_secs(10));
    let (mut body, mut rest, mut terminated) = (Vec::new(), &raw[..], false);
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap(), 16).unwrap();
        rest = &rest[eol + 2..];
        if size == 0 {
            terminated = true;
            break;
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
    assert!(!terminated, "a broken stream must not end cleanly");
    body
}

// --- the Responses API ----------------------------------------------------------------------

/// A Codex-style request: instructions, a turn with a function call and its output,
/// function tools, reasoning, nothing stored, and the fields Codex CLI 0.171 adds
/// (`include`, `prompt_cache_key`, `client_metadata`, item ids).
fn codex_request(model: &str, stream: bool) -> serde_json::Value {
    json!({
        "model": model,
        "instructions": "You are a coding agent.",
        "input": [
            {"type": "message", "id": "msg_1", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.rs"}
        ],
        "tools": [{"type": "function", "name": "shell", "description": "Run a command",
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
        "tool_choice": "auto",
        "reasoning": {"effort": "low", "summary": "auto"},
        "max_output_tokens": 300,
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "client_metadata": {"x-codex-turn-metadata": "{\"turn_id\":\"t-1\"}"},
        "stream": stream
    })
}

#[test]
fn a_responses_request_is_served_by_a_chat_completions_only_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on(
        "/v1/chat/completions",
        chat_completion(
            "chatcmpl-r",
            "gpt-c-1",
            json!({"role": "assistant", "content": "Reading it.", "tool_calls": [
                {"id": "call_2", "type": "function",
                 "function": {"name": "shell", "arguments": "{\"cmd\":\"cat a.rs\"}"}}]}),
            "tool_calls",
            (30, 8),
        ),
    );
    let gw = start(&openai, &anthropic);
    let r = post(&gw, "/v1/responses", &codex_request("oc/gpt-c", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-translated"),
        Some("openai-responses->openai-chat")
    );
    let v = r.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "gpt-c-1");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["content"][0]["text"], "Reading it.");
    assert_eq!(v["output"][1]["type"], "function_call");
    assert_eq!(v["output"][1]["call_id"], "call_2");
    assert_eq!(v["output"][1]["arguments"], "{\"cmd\":\"cat a.rs\"}");
    assert_eq!(v["usage"]["input_tokens"], 30);
    assert_eq!(v["usage"]["output_tokens"], 8);
    assert_eq!(v["instructions"], "You are a coding agent.");
    // What the provider got: a chat completions request.
    assert_eq!(openai.hits("/v1/responses"), 0);
    let sent = openai.requests_to("/v1/chat/completions");
    assert_eq!(sent.len(), 1);
    let sent = sent[0].json();
    assert_eq!(sent["model"], "gpt-c");
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "You are a coding agent."})
    );
    assert_eq!(sent["messages"][2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        sent["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "a.rs"})
    );
    assert_eq!(sent["tools"][0]["function"]["name"], "shell");
    assert_eq!(sent["reasoning_effort"], "low");
    assert_eq!(sent["max_tokens"], 300);
    // Codex's own labels are not model input: not carried.
    assert!(sent.get("client_metadata").is_none());
    assert_eq!(sent["prompt_cache_key"], "thread-1");
    // An openai-format provider that serves the Responses API gets the request as it is.
    openai.on(
        "/v1/responses",
        Reply::json(
            200,
            json!({"id": "resp_native", "object": "response", "output": []}),
        ),
    );
    let r = post(&gw, "/v1/responses", &codex_request("oa/gpt-x", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "resp_native");
    assert_eq!(r.header("x-tidegate-translated"), None);
    assert_eq!(openai.hits("/v1/responses"), 1);
}

#[test]
fn a_responses_stream_is_served_by_an_anthropic_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        AnthropicEvents::start("msg_r", "claude-x-1", 9)
            .thinking(0, &["Need ls."])
            .ping()
            .text(1, &["Run", "ning."])
            .tool_use(2, "toolu_r", "shell", &["{\"cmd\":", "\"ls\"}"])
            .stop("tool_use", 14)
            .reply(),
    );
    let gw = start(&openai, &anthropic);
    let r = post(&gw, "/v1/responses", &codex_request("an/claude-x", true));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-translated"),
        Some("openai-responses->anthropic-messages")
    );
    let events = r.sse_events();
    let data: Vec<serde_json::Value> = events.iter().map(|e| e.json()).collect();
    let names: Vec<&str> = data.iter().map(|d| d["type"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"response.created"), "{}", r.text());
    assert_eq!(names.last(), Some(&"response.completed"));
    let joined = |kind: &str| -> String {
        data.iter()
            .filter(|d| d["type"] == kind)
            .map(|d| d["delta"].as_str().unwrap())
            .collect()
    };
    assert_eq!(joined("response.reasoning_summary_text.delta"), "Need ls.");
    assert_eq!(joined("response.output_text.delta"), "Running.");
    assert_eq!(
        joined("response.function_call_arguments.delta"),
        "{\"cmd\":\"ls\"}"
    );
    let done = &data.last().unwrap()["response"];
    assert_eq!(done["model"], "claude-x-1");
    assert_eq!(done["output"][2]["call_id"], "toolu_r");
    assert_eq!(done["usage"]["input_tokens"], 9);
    assert_eq!(done["usage"]["output_tokens"], 14);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["sequence_number"], i);
    }
    // What the provider got: a Messages request, ids kept, thinking from the effort.
    let sent = anthropic.requests_to("/v1/messages");
    assert_eq!(sent.len(), 1);
    let sent = sent[0].json();
    assert_eq!(sent["model"], "claude-x");
    assert_eq!(sent["stream"], true);
    assert_eq!(sent["system"], "You are a coding agent.");
    assert_eq!(sent["messages"][1]["content"][0]["id"], "call_1");
    assert_eq!(sent["messages"][2]["content"][0]["tool_use_id"], "call_1");
    assert_eq!(sent["thinking"]["budget_tokens"], 1024);
    assert_eq!(sent["tools"][0]["name"], "shell");
}

/// Codex CLI 0.171.0's default tool list, shortened: function tools, the multi-agent
/// `namespace` (a group of function tools), and, with `web_search`, the hosted web search.
fn codex_default_tools(web_search: bool) -> serde_json::Value {
    let f = |name: &str| {
        json!({"type": "function", "name": name, "description": format!("{name}."), "strict": false,
               "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}})
    };
    let mut tools = vec![
        f("exec_command"),
        json!({"type": "namespace", "name": "multi_agent_v1",
               "description": "Tools for spawning and managing sub-agents.",
               "tools": [f("spawn_agent"), f("close_agent")]}),
    ];
    if web_search {
        tools.push(json!({"type": "web_search", "external_web_access": true}));
    }
    serde_json::Value::Array(tools)
}

#[test]
fn codex_multi_agent_namespace_tools_are_served_by_chat_and_anthropic_providers() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    // The Chat Completions provider calls a namespaced tool by its flat name.
    openai.on(
        "/v1/chat/completions",
        chat_completion(
            "chatcmpl-n",
            "gpt-c-1",
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_s", "type": "function", "function": {
                    "name": "multi_agent_v1__spawn_agent", "arguments": "{\"target\":\"t\"}"}}]}),
            "tool_calls",
            (3, 2),
        ),
    );
    anthropic.on(
        "/v1/messages",
        AnthropicEvents::start("msg_n", "claude-x-1", 4)
            .tool_use(
                0,
                "toolu_c",
                "multi_agent_v1__close_agent",
                &["{\"target\":\"1\"}"],
            )
            .stop("tool_use", 6)
            .reply(),
    );
    let gw = start(&openai, &anthropic);
    // A later turn: Codex sends the earlier namespaced call back with its namespace.
    let request = |model: &str, stream: bool| {
        let mut req = codex_request(model, stream);
        req["tools"] = codex_default_tools(false);
        req["input"] = json!([
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Spawn a helper."}]},
            {"type": "function_call", "call_id": "call_1", "name": "wait_agent", "namespace": "multi_agent_v1", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "no agents"}
        ]);
        req
    };

    let r = post(&gw, "/v1/responses", &request("oc/gpt-c", false));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(v["output"][0]["name"], "spawn_agent");
    assert_eq!(v["output"][0]["namespace"], "multi_agent_v1");
    assert_eq!(v["output"][0]["call_id"], "call_s");
    let sent = openai.requests_to("/v1/chat/completions")[0].json();
    let names: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "exec_command",
            "multi_agent_v1__spawn_agent",
            "multi_agent_v1__close_agent"
        ]
    );
    assert_eq!(
        sent["messages"][2]["tool_calls"][0]["function"]["name"],
        "multi_agent_v1__wait_agent"
    );

    let r = post(&gw, "/v1/responses", &request("an/claude-x", true));
    assert_eq!(r.status, 200, "{}", r.text());
    let data: Vec<serde_json::Value> = r.sse_events().iter().map(|e| e.json()).collect();
    let added = data
        .iter()
        .find(|d| d["type"] == "response.output_item.added")
        .expect("an item");
    assert_eq!(added["item"]["name"], "close_agent");
    assert_eq!(added["item"]["namespace"], "multi_agent_v1");
    let done = &data.last().unwrap()["response"];
    assert_eq!(data.last().unwrap()["type"], "response.completed");
    assert_eq!(done["output"][0]["name"], "close_agent");
    assert_eq!(done["output"][0]["namespace"], "multi_agent_v1");
    assert_eq!(done["output"][0]["arguments"], "{\"target\":\"1\"}");
    let sent = anthropic.requests_to("/v1/messages")[0].json();
    assert_eq!(sent["tools"][1]["name"], "multi_agent_v1__spawn_agent");
    assert_eq!(
        sent["messages"][1]["content"][0]["name"],
        "multi_agent_v1__wait_agent"
    );

    // With the hosted web search still on (Codex's default), the refusal names it and the
    // one setting that drops it.
    for model in ["oc/gpt-c", "an/claude-x"] {
        let mut req = request(model, true);
        req["tools"] = codex_default_tools(true);
        let r = post(&gw, "/v1/responses", &req);
        assert_eq!(r.status, 400, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], "tools[2].type");
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains("\"web_search\""), "{msg}");
        assert!(msg.contains("web_search = \"disabled\""), "{msg}");
    }
    assert_eq!(openai.requests_to("/v1/chat/completions").len(), 1);
    assert_eq!(anthropic.requests_to("/v1/messages").len(), 1);
}

#[test]
fn a_responses_request_is_refused_naming_the_field_and_errors_come_back_in_openai_shape() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let gw = start(&openai, &anthropic);
    for model in ["an/claude-x", "oc/gpt-c"] {
        let mut req = codex_request(model, false);
        req["tools"] = json!([{"type": "web_search"}]);
        let r = post(&gw, "/v1/responses", &req);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], "tools[0].type", "{}", r.text());
        assert_eq!(r.header("x-tidegate-error"), Some("untranslatable_request"));
        let mut req = codex_request(model, false);
        req["previous_response_id"] = json!("resp_1");
        let r = post(&gw, "/v1/responses", &req);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], "previous_response_id");
    }
    assert_eq!(openai.total_hits() + anthropic.total_hits(), 0);
    anthropic.on(
        "/v1/messages",
        Reply::json(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad tool"}}),
        ),
    );
    let r = post(&gw, "/v1/responses", &codex_request("an/claude-x", false));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], "bad tool", "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}

#[test]
fn a_responses_stream_cut_short_ends_with_a_responses_error_event() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let c = ChatChunks::stamped("chatcmpl-c", "gpt-c", 1);
    openai.on(
        "/v1/chat/completions",
        Reply::sse(vec![Chunk::json(c.role()), Chunk::json(c.text("Half"))]),
    );
    let gw = start(&openai, &anthropic);
    let mut c = Client::connect(gw.addr());
    let body = serde_json::to_vec(&codex_request("oc/gpt-c", true)).unwrap();
    c.start_request(
        "POST",
        "/v1/responses",
        &[("authorization", "Bearer k")],
        &body,
    );
    assert_eq!(c.read_head().status, 200);
    let body = unterminated_body(&mut c);
    let text = String::from_utf8_lossy(&body).into_owned();
    let events = parse_sse(&body);
    let last = events.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"), "{text}");
    assert_eq!(last.json()["type"], "error");
    assert!(!text.contains("response.completed"));
    assert!(text.contains("\"delta\":\"Half\""), "{text}");
}

/// Anthropic's server tools (web search) run at Anthropic: their `server_tool_use` and
/// `web_search_tool_result` blocks are not the OpenAI client's tool calls. A complete answer
/// and a stream translate them the same way — left out — and the client's own tool call
/// keeps tool-call index 0.
#[test]
fn server_tool_blocks_are_left_out_of_complete_answers_and_streams_alike() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let search = json!({"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
        "input": {"query": "tidegate"}});
    let results = json!({"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
        "content": [{"type": "web_search_result", "url": "https://example.com", "title": "T",
            "encrypted_content": "x"}]});
    let call = json!({"type": "tool_use", "id": "toolu_2", "name": "f", "input": {"a": 1}});
    anthropic.on(
        "/v1/messages",
        Reply::json(
            200,
            json!({"id": "msg_w", "type": "message", "role": "assistant", "model": "claude-x",
                "content": [search, results, {"type": "text", "text": "Found it."}, call],
                "stop_reason": "tool_use", "usage": {"input_tokens": 9, "output_tokens": 12}}),
        ),
    );
    let event = |v: serde_json::Value| Chunk::event(v["type"].as_str().unwrap(), &v.to_string());
    let block_start = |i: u64, block: &serde_json::Value| {
        let mut b = block.clone();
        if b["type"] != "web_search_tool_result" {
            b["input"] = json!({});
        }
        event(json!({"type": "content_block_start", "index": i, "content_block": b}))
    };
    let input = |i: u64, json: &str| {
        event(json!({"type": "content_block_delta", "index": i,
            "delta": {"type": "input_json_delta", "partial_json": json}}))
    };
    let stop = |i: u64| event(json!({"type": "content_block_stop", "index": i}));
    anthropic.on(
        "/v1/messages",
        Reply::sse(vec![
            event(json!({"type": "message_start", "message": {"id": "msg_w", "type": "message",
                "role": "assistant", "model": "claude-x", "content": [], "stop_reason": null,
                "usage": {"input_tokens": 9, "output_tokens": 1}}})),
            block_start(0, &search),
            input(0, "{\"query\": \"tidegate\"}"),
            stop(0),
            block_start(1, &results),
            stop(1),
            event(json!({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}})),
            event(json!({"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Found it."}})),
            stop(2),
            block_start(3, &call),
            input(3, "{\"a\":1}"),
            stop(3),
            event(json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}})),
            event(json!({"type": "message_stop"})),
        ]),
    );
    let gw = start(&openai, &anthropic);
    let ask = |stream: bool| {
        post(
            &gw,
            "/v1/chat/completions",
            &json!({"model": "an/claude-x", "stream": stream, "max_tokens": 50,
                "messages": [{"role": "user", "content": "search"}]}),
        )
    };

    let r = ask(false);
    assert_eq!(r.status, 200, "{}", r.text());
    let message = &r.json()["choices"][0]["message"];
    assert_eq!(message["content"], "Found it.", "{message}");
    assert_eq!(
        message["tool_calls"],
        json!([{"id": "toolu_2", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\":1}"}}]),
        "{message}"
    );

    let r = ask(true);
    assert_eq!(r.status, 200, "{}", r.text());
    let chunks: Vec<serde_json::Value> = r
        .sse_events()
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| e.json())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Found it.");
    let calls: Vec<&serde_json::Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(!calls.is_empty(), "{}", r.text());
    assert!(calls.iter().all(|c| c["index"] == 0), "{}", r.text());
    assert_eq!(calls[0]["id"], "toolu_2", "{}", r.text());
    assert_eq!(calls[0]["function"]["name"], "f", "{}", r.text());
    let args: String = calls
        .iter()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, "{\"a\":1}");
    assert!(!r.text().contains("web_search"), "{}", r.text());
}

// --- the issue's field list, item by item ---------------------------------------------------

/// The Chat Completions fields of the field map not shown above, through the binary: system
/// text parts, an image by URL, a text part's `cache_control` (passed through), an earlier
/// assistant string, `max_completion_tokens`, `top_p`, `reasoning_effort` (a thinking budget
/// that raises `max_tokens`), `parallel_tool_calls: false` without a tool choice; and on the
/// way back a `thinking` block as `reasoning_content` and `stop_sequence` as `stop`. Then
/// `response_format` JSON modes and `stream_options` keys the target has no field for are
/// refused by name, before any upstream is asked.
#[test]
fn the_rest_of_the_chat_field_map_reaches_an_anthropic_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        Reply::json(
            200,
            json!({"id": "msg_f", "type": "message", "role": "assistant", "model": "claude-x",
                "content": [{"type": "thinking", "thinking": "Mull.", "signature": "sig"},
                            {"type": "text", "text": "Done"}],
                "stop_reason": "stop_sequence", "stop_sequence": "END",
                "usage": {"input_tokens": 3, "output_tokens": 2}}),
        ),
    );
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({
            "model": "an/claude-x",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                    {"type": "image_url", "image_url": {"url": "https://img.example/a.png", "detail": "high"}}
                ]},
                {"role": "assistant", "content": "A cat."},
                {"role": "user", "content": "Sure?"}
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "parallel_tool_calls": false,
            "max_completion_tokens": 500,
            "top_p": 0.9,
            "temperature": 0.25,
            "reasoning_effort": "low"
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "stop_sequence → stop");
    assert_eq!(choice["message"]["content"], "Done");
    assert_eq!(choice["message"]["reasoning_content"], "Mull.");
    let up = anthropic.requests_to("/v1/messages")[0].json();
    assert_eq!(
        up["system"],
        json!([{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}])
    );
    assert_eq!(
        up["messages"][0]["content"],
        json!([{"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
               {"type": "image", "source": {"type": "url", "url": "https://img.example/a.png"}}])
    );
    assert_eq!(
        up["messages"][1],
        json!({"role": "assistant", "content": "A cat."})
    );
    assert_eq!(
        up["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(
        up["max_tokens"],
        500 + 1024,
        "raised above the thinking budget"
    );
    assert_eq!(up["top_p"], 0.9);
    assert_eq!(up["temperature"], 0.25);
    assert_eq!(
        up["tool_choice"],
        json!({"type": "auto", "disable_parallel_tool_use": true})
    );
    assert!(up.get("max_completion_tokens").is_none() && up.get("reasoning_effort").is_none());

    for (field, value) in [
        ("response_format", json!({"type": "json_object"})),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "description": "d", "schema": {"type": "object"}}}),
        ),
        ("stream_options", json!({"include_obfuscation": true})),
        ("logit_bias", json!({"1": 2})),
    ] {
        let mut req =
            json!({"model": "an/claude-x", "messages": [{"role": "user", "content": "hi"}]});
        req[field] = value;
        let r = post(&gw, "/v1/chat/completions", &req);
        assert_eq!(r.status, 400, "{field}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert!(
            e["param"].as_str().unwrap().starts_with(field),
            "{field}: {e}"
        );
    }
    assert_eq!(anthropic.hits("/v1/messages"), 1);
    assert_eq!(openai.total_hits(), 0);
}

/// The Messages fields of the field map not shown above, through the binary: images by
/// base64 and by URL, `cache_control` on a text block and a tool (dropped), temperature and
/// `top_p`, `tool_choice: any`, `thinking` disabled (no effort); and on the way back
/// `content_filter` as `refusal` with the cache-creation tokens taken out of the input.
#[test]
fn the_rest_of_the_messages_field_map_reaches_an_openai_provider() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on(
        "/v1/chat/completions",
        Reply::json(
            200,
            json!({"id": "chatcmpl-f", "object": "chat.completion", "created": 1, "model": "gpt-x",
                "choices": [{"index": 0, "finish_reason": "content_filter",
                    "message": {"role": "assistant", "content": "No."}}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21,
                    "prompt_tokens_details": {"cached_tokens": 5, "cache_creation_tokens": 3}}}),
        ),
    );
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/messages",
        &json!({
            "model": "oa/gpt-x",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Compare", "cache_control": {"type": "ephemeral"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
                {"type": "image", "source": {"type": "url", "url": "https://img.example/b.jpg"}}
            ]}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "any"},
            "temperature": 0.5,
            "top_p": 0.75,
            "thinking": {"type": "disabled"}
        }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let m = r.json();
    assert_eq!(m["stop_reason"], "refusal");
    assert_eq!(m["content"], json!([{"type": "text", "text": "No."}]));
    assert_eq!(m["usage"]["input_tokens"], 12);
    assert_eq!(m["usage"]["cache_read_input_tokens"], 5);
    assert_eq!(m["usage"]["cache_creation_input_tokens"], 3);
    let up = openai.requests_to("/v1/chat/completions")[0].json();
    assert_eq!(
        up["messages"][0]["content"],
        json!([{"type": "text", "text": "Compare"},
               {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}},
               {"type": "image_url", "image_url": {"url": "https://img.example/b.jpg"}}])
    );
    assert_eq!(
        up["tools"],
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    );
    assert_eq!(up["tool_choice"], "required");
    assert_eq!(up["temperature"], 0.5);
    assert_eq!(up["top_p"], 0.75);
    assert!(up.get("reasoning_effort").is_none(), "{up}");
    assert!(!up.to_string().contains("cache_control"), "{up}");
}

/// An Anthropic stream with thinking, a ping and cache usage reaches an OpenAI client as
/// `reasoning_content` chunks, an SSE comment, and a usage chunk counting the cache tokens —
/// only when the client asked for it with `stream_options.include_usage`.
#[test]
fn a_translated_chat_stream_carries_thinking_and_usage_only_when_asked() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    let event = |v: serde_json::Value| Chunk::event(v["type"].as_str().unwrap(), &v.to_string());
    let stream = || {
        Reply::sse(vec![
            event(
                json!({"type": "message_start", "message": {"id": "msg_t", "type": "message",
                "role": "assistant", "model": "claude-x", "content": [], "stop_reason": null,
                "usage": {"input_tokens": 4, "output_tokens": 1, "cache_read_input_tokens": 10,
                          "cache_creation_input_tokens": 6}}}),
            ),
            event(
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            ),
            event(
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm"}}),
            ),
            event(
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}}),
            ),
            event(json!({"type": "content_block_stop", "index": 0})),
            event(json!({"type": "ping"})),
            event(
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            ),
            event(
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Yes"}}),
            ),
            event(json!({"type": "content_block_stop", "index": 1})),
            event(
                json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 7}}),
            ),
            event(json!({"type": "message_stop"})),
        ])
    };
    anthropic.on("/v1/messages", stream());
    anthropic.on("/v1/messages", stream());
    let gw = start(&openai, &anthropic);
    let ask = |options: Option<serde_json::Value>| {
        let mut req = json!({"model": "an/claude-x", "stream": true, "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}]});
        if let Some(o) = options {
            req["stream_options"] = o;
        }
        post(&gw, "/v1/chat/completions", &req)
    };

    let r = ask(Some(json!({"include_usage": true})));
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("\n: ping\n") || text.starts_with(": ping\n"),
        "{text}"
    );
    let events = r.sse_events();
    assert_eq!(events.last().unwrap().data, "[DONE]", "{text}");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| e.json())
        .collect();
    let field = |name: &str| -> String {
        chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"][name].as_str())
            .collect()
    };
    assert_eq!(field("reasoning_content"), "Hmm");
    assert_eq!(field("content"), "Yes");
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "length"),
        "{text}"
    );
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage["prompt_tokens"], 20,
        "input + cache read + cache creation"
    );
    assert_eq!(usage["completion_tokens"], 7);
    assert_eq!(usage["total_tokens"], 27);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 10);

    let r = ask(None);
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.sse_events();
    assert_eq!(events.last().unwrap().data, "[DONE]", "{}", r.text());
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e.json().get("usage").is_none() && e.json()["choices"][0].is_object()),
        "no usage chunk unless asked: {}",
        r.text()
    );
    let sent = anthropic.requests_to("/v1/messages");
    assert!(
        sent.iter()
            .all(|s| s.json().get("stream_options").is_none())
    );
}

/// Upstream errors of the other format keep their status for the statuses failover does not
/// replace, in both directions: rate limits, overload and server errors come back re-shaped
/// into the client's error body.
#[test]
fn provider_errors_of_the_other_format_keep_their_status_both_ways() {
    let anthropic_error = |status: u16, kind: &str| {
        Reply::json(
            status,
            json!({"type": "error", "error": {"type": kind, "message": format!("{kind} here")}}),
        )
    };
    for (status, kind, openai_type) in [
        (429, "rate_limit_error", "rate_limit_error"),
        (529, "overloaded_error", "server_error"),
        (500, "api_error", "server_error"),
    ] {
        let openai = MockUpstream::start();
        let anthropic = MockUpstream::start();
        anthropic.on_always("/v1/messages", anthropic_error(status, kind));
        let gw = start(&openai, &anthropic);
        let r = post(
            &gw,
            "/v1/chat/completions",
            &json!({"model": "an/claude-x", "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(r.status, status, "{}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["type"], openai_type, "{}", r.text());
        assert_eq!(e["code"], kind, "{}", r.text());
        assert_eq!(e["message"], format!("{kind} here"), "{}", r.text());
    }
    for (status, anthropic_type) in [
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "api_error"),
    ] {
        let openai = MockUpstream::start();
        let anthropic = MockUpstream::start();
        openai.on_always(
            "/v1/chat/completions",
            Reply::error(status, "upstream says no"),
        );
        let gw = start(&openai, &anthropic);
        let r = post(
            &gw,
            "/v1/messages",
            &json!({"model": "oa/gpt-x", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(r.status, status, "{}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], anthropic_type, "{v}");
        assert_eq!(v["error"]["message"], "upstream says no", "{v}");
    }
}

/// With both formats configured, a request of the provider's own format is forwarded as it
/// is: the upstream gets the client's bytes with only the model renamed, and the client gets
/// the upstream's bytes — non-stream and stream, on both endpoints — with no translation
/// header.
#[test]
fn same_format_traffic_beside_translation_passes_through_byte_for_byte() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    // Key order, spacing and escapes a re-serialiser would change.
    let chat_answer =
        "{ \"z\":1, \"id\":\"c\",\n\"choices\":[{\"message\":{\"content\":\"h\\u00e9\"}}] }";
    let messages_answer = "{\"type\":\"message\" ,\"content\":[{\"type\":\"text\",\"text\":\"\\u00e9\"}],\"id\":\"m\"}";
    let chat_stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}] , \"x\":1}\n\n: note\n\ndata: [DONE]\n\n";
    let messages_stream = "event: message_start\ndata: {\"type\":\"message_start\",  \"message\":{}}\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let raw = |ct: &str, body: &str| Reply::status(200).header("content-type", ct).body(body);
    openai.on("/v1/chat/completions", raw("application/json", chat_answer));
    openai.on(
        "/v1/chat/completions",
        raw("text/event-stream", chat_stream),
    );
    anthropic.on("/v1/messages", raw("application/json", messages_answer));
    anthropic.on("/v1/messages", raw("text/event-stream", messages_stream));
    let gw = start(&openai, &anthropic);
    let send = |path: &str, body: &str| {
        Client::connect(gw.addr()).request(
            "POST",
            path,
            &[
                ("authorization", "Bearer k"),
                ("content-type", "application/json"),
            ],
            body.as_bytes(),
        )
    };
    let chat = "{\"model\" : \"oa/gpt-x\",\"messages\":[{\"role\":\"user\",\"content\":\"h\\u00e9\"}], \"seed\": 7}";
    let chat_s = "{\"model\":\"oa/gpt-x\",\"stream\":true,\"messages\":[{\"content\":\"x\",\"role\":\"user\"}]}";
    let msg = "{\"max_tokens\":5, \"model\":\"an/claude-x\",\"messages\":[{\"role\":\"user\",\"content\":\"\\u00e9\"}],\"top_k\":3}";
    let msg_s = "{\"model\":\"an/claude-x\",\"stream\":true,\"max_tokens\":5,\"messages\":[]}";
    for (path, body, want) in [
        ("/v1/chat/completions", chat, chat_answer),
        ("/v1/chat/completions", chat_s, chat_stream),
        ("/v1/messages", msg, messages_answer),
        ("/v1/messages", msg_s, messages_stream),
    ] {
        let r = send(path, body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.body, want.as_bytes(), "{path}: {}", r.text());
        assert_eq!(r.header("x-tidegate-translated"), None);
    }
    let sent: Vec<String> = openai
        .requests_to("/v1/chat/completions")
        .iter()
        .chain(anthropic.requests_to("/v1/messages").iter())
        .map(|s| s.text())
        .collect();
    assert_eq!(
        sent,
        [
            chat.replace("\"oa/gpt-x\"", "\"gpt-x\""),
            chat_s.replace("\"oa/gpt-x\"", "\"gpt-x\""),
            msg.replace("\"an/claude-x\"", "\"claude-x\""),
            msg_s.replace("\"an/claude-x\"", "\"claude-x\""),
        ]
    );
}

/// A 2xx answer that is not of the provider's format (a provider whose `format` is set
/// wrong: an OpenAI completion from an `anthropic` provider, an Anthropic message from an
/// `openai` one) is not translated into an empty answer: the client gets 502
/// `bad_upstream_response` in its own error shape, naming the provider. So does a body that
/// is not JSON.
#[test]
fn an_answer_not_of_the_providers_format_is_a_bad_upstream_response_not_an_empty_answer() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on_always("/v1/messages", Reply::openai_chat("misplaced"));
    openai.on_always(
        "/v1/chat/completions",
        Reply::anthropic_message("misplaced"),
    );
    let gw = start(&openai, &anthropic);
    let chat = json!({"model": "an/claude-x", "messages": [{"role": "user", "content": "hi"}]});
    let messages = json!({"model": "oa/gpt-x", "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}]});
    for (path, body, provider) in [
        ("/v1/chat/completions", &chat, "an"),
        ("/v1/messages", &messages, "oa"),
        ("/v1/responses", &codex_request("an/claude-x", false), "an"),
        ("/v1/responses", &codex_request("oc/gpt-c", false), "oc"),
    ] {
        let r = post(&gw, path, body);
        assert_eq!(r.status, 502, "{path} via {provider}: {}", r.text());
        assert_eq!(r.header("x-tidegate-error"), Some("bad_upstream_response"));
        let v = r.json();
        let e = &v["error"];
        if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{v}");
        } else {
            assert_eq!(e["code"], "bad_upstream_response", "{v}");
        }
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(&format!("provider {provider}")), "{msg}");
        assert!(!r.text().contains("misplaced"), "{}", r.text());
    }
    // A body that is not JSON at all: the same answer.
    anthropic.on_always(
        "/v1/messages",
        Reply::status(200)
            .header("content-type", "application/json")
            .body("<html>gateway</html>"),
    );
    let r = post(&gw, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "bad_upstream_response");
}

/// A translated request leaves the client API's own headers behind: `openai-*` ones do not
/// reach an Anthropic provider (the mirror of the Claude Code test's `anthropic-*`), while a
/// same-format request keeps them.
#[test]
fn the_client_apis_own_headers_stay_behind_when_translated() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on("/v1/messages", Reply::anthropic_message("hi"));
    openai.on("/v1/chat/completions", Reply::openai_chat("hi"));
    let gw = start(&openai, &anthropic);
    for model in ["an/claude-x", "oa/gpt-x"] {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        let r = Client::connect(gw.addr()).request(
            "POST",
            "/v1/chat/completions?trace=1",
            &[
                ("authorization", "Bearer k"),
                ("content-type", "application/json"),
                ("openai-organization", "org-1"),
                ("openai-project", "proj-1"),
                ("x-custom", "kept"),
            ],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let to_an = &anthropic.requests_to("/v1/messages")[0];
    assert_eq!(to_an.target, "/v1/messages");
    assert_eq!(to_an.header("openai-organization"), None);
    assert_eq!(to_an.header("openai-project"), None);
    assert_eq!(to_an.header("x-custom"), Some("kept"));
    let to_oa = &openai.requests_to("/v1/chat/completions")[0];
    assert_eq!(to_oa.target, "/v1/chat/completions?trace=1");
    assert_eq!(to_oa.header("openai-organization"), Some("org-1"));
    assert_eq!(to_oa.header("openai-project"), Some("proj-1"));
}

fn anthropic_ok() -> Reply {
    Reply::json(
        200,
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "stop_sequence": null, "usage": {"input_tokens": 1, "output_tokens": 1}}),
    )
}

fn openai_ok() -> Reply {
    Reply::json(
        200,
        json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    )
}

/// OpenAI's `xhigh` reasoning effort (its newer models take it) reaches an Anthropic
/// provider as a 32768-token thinking budget, from Chat Completions and from Responses.
#[test]
fn an_xhigh_reasoning_effort_is_the_largest_thinking_budget() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on_always("/v1/messages", anthropic_ok());
    let gw = start(&openai, &anthropic);
    let r = post(
        &gw,
        "/v1/chat/completions",
        &json!({"model": "an/claude-x", "reasoning_effort": "xhigh",
                "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut req = codex_request("an/claude-x", false);
    req["reasoning"] = json!({"effort": "xhigh"});
    let r = post(&gw, "/v1/responses", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let up = anthropic.requests_to("/v1/messages");
    assert_eq!(up.len(), 2);
    let (chat, responses) = (up[0].json(), up[1].json());
    assert_eq!(
        chat["thinking"],
        json!({"type": "enabled", "budget_tokens": 32768})
    );
    assert_eq!(chat["max_tokens"], 4096 + 32768, "the budget on top");
    assert_eq!(
        responses["thinking"],
        json!({"type": "enabled", "budget_tokens": 32768})
    );
    assert_eq!(responses["max_tokens"], 300 + 32768);
}

/// An OpenAI-format provider's in-band stream error reaches an Anthropic client as an
/// `error` event of the Anthropic type its code corresponds to (a rate limit stays a rate
/// limit, which Anthropic's SDKs retry), not as a catch-all `api_error`.
#[test]
fn an_in_band_openai_stream_error_keeps_its_kind_for_an_anthropic_client() {
    let cases = [
        (
            json!({"message": "Rate limit reached", "type": "tokens", "param": null, "code": "rate_limit_exceeded"}),
            "rate_limit_error",
        ),
        (
            json!({"message": "Overloaded", "type": "server_error", "param": null, "code": "server_is_overloaded"}),
            "overloaded_error",
        ),
        (
            json!({"message": "Too long", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}),
            "invalid_request_error",
        ),
        (
            json!({"message": "Oops", "type": "server_error", "param": null, "code": null}),
            "api_error",
        ),
    ];
    for (err, want) in cases {
        let openai = MockUpstream::start();
        let anthropic = MockUpstream::start();
        let c = ChatChunks::stamped("chatcmpl-e", "gpt-x", 1);
        openai.on(
            "/v1/chat/completions",
            Reply::sse(vec![
                Chunk::json(c.role()),
                Chunk::json(c.text("Hal")),
                Chunk::json(json!({ "error": err })),
            ]),
        );
        let gw = start(&openai, &anthropic);
        let mut c = Client::connect(gw.addr());
        let body = json!({"model": "oa/gpt-x", "stream": true, "max_tokens": 50,
                "messages": [{"role": "user", "content": "hi"}]});
        c.start_request(
            "POST",
            "/v1/messages",
            &[
                ("authorization", "Bearer k"),
                ("content-type", "application/json"),
            ],
            body.to_string().as_bytes(),
        );
        assert_eq!(c.read_head().status, 200);
        let body = unterminated_body(&mut c);
        let events = parse_sse(&body);
        let last = events.last().expect("events");
        let text = String::from_utf8_lossy(&body);
        assert_eq!(last.event.as_deref(), Some("error"), "{text}");
        assert_eq!(
            last.json(),
            json!({"type": "error", "error": {"type": want, "message": err["message"]}}),
            "{text}"
        );
        assert!(!text.contains("message_stop"), "{text}");
    }
}

/// A Messages request without `max_tokens` gets Anthropic's own answer whichever provider
/// serves it: the same-format request goes to the Anthropic provider as it is (Anthropic
/// answers it 400 invalid_request_error), and one for an OpenAI-format provider is refused
/// by the gateway with 400 invalid_request_error, `param` `max_tokens`, in Anthropic's shape.
#[test]
fn a_messages_request_without_max_tokens_is_held_to_anthropics_contract() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    anthropic.on(
        "/v1/messages",
        Reply::json(
            400,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}),
        ),
    );
    let gw = start(&openai, &anthropic);
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    let mut same = body.clone();
    same["model"] = json!("an/claude-x");
    let r = post(&gw, "/v1/messages", &same);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["message"], "max_tokens: Field required");
    assert_eq!(anthropic.requests_to("/v1/messages").len(), 1);
    let mut other = body;
    other["model"] = json!("oa/gpt-x");
    let r = post(&gw, "/v1/messages", &other);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert_eq!(r.json()["error"]["param"], "max_tokens");
    assert_eq!(r.header("x-tidegate-error"), Some("untranslatable_request"));
    assert_eq!(openai.total_hits(), 0);
}

/// An assistant `thinking` block in Anthropic-format history needs its signature, as
/// Anthropic's API requires: one without it is refused for an OpenAI-format provider too
/// (naming it), while a signed one — Anthropic's, or the empty one the gateway's own
/// translated answers carry — is left out of the request, as earlier thinking may be.
#[test]
fn an_unsigned_thinking_block_in_history_is_refused_as_anthropic_refuses_it() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on_always("/v1/chat/completions", openai_ok());
    let gw = start(&openai, &anthropic);
    let with = |thinking: serde_json::Value| {
        json!({"model": "oa/gpt-x", "max_tokens": 50, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "again"}
        ]})
    };
    let r = post(
        &gw,
        "/v1/messages",
        &with(json!({"type": "thinking", "thinking": "Greeting."})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["type"], "error");
    assert_eq!(
        r.json()["error"]["param"],
        "messages[1].content[0].signature"
    );
    assert_eq!(openai.total_hits(), 0);
    for signature in ["", "EqQBCkYIBxgCKkA"] {
        let r = post(
            &gw,
            "/v1/messages",
            &with(json!({"type": "thinking", "thinking": "Greeting.", "signature": signature})),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for req in openai.requests_to("/v1/chat/completions") {
        assert_eq!(
            req.json()["messages"][1],
            json!({"role": "assistant", "content": [{"type": "text", "text": "Hello."}]})
        );
    }
}

/// A `json_schema` `text.format` member OpenAI does not document is refused, named, for a
/// Chat-Completions-only provider as for an Anthropic one (as `response_format.json_schema`
/// refuses other keys); the documented ones reach the provider.
#[test]
fn a_responses_json_schema_format_refuses_unknown_members_by_name() {
    let openai = MockUpstream::start();
    let anthropic = MockUpstream::start();
    openai.on_always("/v1/chat/completions", openai_ok());
    let gw = start(&openai, &anthropic);
    let format = json!({"type": "json_schema", "name": "answer", "description": "The answer.",
        "schema": {"type": "object", "properties": {"a": {"type": "string"}}}, "strict": true});
    for model in ["oc/gpt-c", "an/claude-x"] {
        let mut req = codex_request(model, false);
        let mut f = format.clone();
        f["additional"] = json!(1);
        req["text"] = json!({ "format": f });
        let r = post(&gw, "/v1/responses", &req);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.json()["error"]["param"], "text.format.additional");
        assert_eq!(r.header("x-tidegate-error"), Some("untranslatable_request"));
    }
    assert_eq!(openai.total_hits() + anthropic.total_hits(), 0);
    let mut req = codex_request("oc/gpt-c", false);
    req["text"] = json!({ "format": format });
    let r = post(&gw, "/v1/responses", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let up = openai.requests_to("/v1/chat/completions")[0].json();
    assert_eq!(
        up["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "answer", "description": "The answer.",
            "schema": format["schema"], "strict": true}})
    );
}
