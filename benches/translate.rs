//! Format translation (`providers::translate`): a ~4 KiB request each way (target: under
//! 10 µs) and one stream event each way through the stateful translator (target: under
//! 1 µs). Each group has an in-run baseline: a plain `serde_json::from_slice::<Value>` of
//! the same input, so a figure taken on a loaded machine can be read against it. Results
//! are recorded in perf/RESULTS.md.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use tidegate::providers::translate::Translation;
use tidegate::providers::translate::request::{chat_to_messages, messages_to_chat};
use tidegate::providers::translate::responses::translate_request;
use tidegate::providers::translate::stream::StreamTranslator;

const TURN: &str = "Please look at {\"key\": [1, 2, 3]} and explain why it\u{2019}s slow. The loop runs 10\u{d7} per request; profile says 42% in parse(). Thanks!";

/// A chat request of about 4 KiB: system prompt, alternating turns, a tool call and its
/// result, one tool definition.
fn chat_request() -> Vec<u8> {
    chat_request_of(3300)
}

/// A chat request as [`chat_request`] whose turns stop once they pass `turns` bytes.
fn chat_request_of(turns: usize) -> Vec<u8> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful assistant. Answer in Markdown."}),
    ];
    let mut i = 0;
    loop {
        messages.push(json!({"role": "user", "content": format!("Turn {i}: {TURN}")}));
        messages.push(json!({"role": "assistant", "content": format!("Answer {i}: {TURN}")}));
        i += 1;
        let body = json!({"model": "gpt-4o", "messages": messages});
        if body.to_string().len() > turns {
            break;
        }
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search_docs", "arguments": "{\"query\":\"parse\",\"limit\":3}"}}]}));
    messages.push(
        json!({"role": "tool", "tool_call_id": "call_1", "content": "parse() is in src/parse.rs"}),
    );
    let body = json!({
        "model": "gpt-4o", "messages": messages, "max_tokens": 1024, "temperature": 0.7, "stream": true,
        "stream_options": {"include_usage": true},
        "tools": [{"type": "function", "function": {"name": "search_docs", "description": "Search the docs",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]}}}]
    });
    body.to_string().into_bytes()
}

fn bench(c: &mut Criterion) {
    let chat = chat_request();
    let messages = chat_to_messages(&chat, "claude")
        .map(|t| t.body)
        .unwrap_or_default();
    let responses = responses_request(&chat);
    // The Responses request of the size the target names, 4 KiB (the one above, from the
    // same conversation as the chat request, is larger): the longest conversation that
    // fits, its instructions lengthened to make up the rest.
    let responses_4k = (0..33)
        .map(|k| responses_request(&chat_request_of(3300 - 100 * k)))
        .find(|r| r.len() <= 4096)
        .map(|r| padded(&r, 4096))
        .unwrap_or_default();
    let mut g = c.benchmark_group("translate_request");
    g.throughput(Throughput::Bytes(chat.len() as u64));
    g.bench_function(format!("baseline_parse_value_{}B", chat.len()), |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&chat)))
    });
    g.bench_function(format!("chat_to_messages_{}B", chat.len()), |b| {
        b.iter(|| chat_to_messages(black_box(&chat), "claude"))
    });
    g.throughput(Throughput::Bytes(messages.len() as u64));
    g.bench_function(format!("messages_to_chat_{}B", messages.len()), |b| {
        b.iter(|| messages_to_chat(black_box(&messages), "gpt-4o"))
    });
    g.throughput(Throughput::Bytes(responses.len() as u64));
    g.bench_function(format!("responses_to_chat_{}B", responses.len()), |b| {
        b.iter(|| translate_request(black_box(&responses), "gpt-4o", false))
    });
    g.bench_function(format!("responses_to_messages_{}B", responses.len()), |b| {
        b.iter(|| translate_request(black_box(&responses), "claude", true))
    });
    g.throughput(Throughput::Bytes(responses_4k.len() as u64));
    g.bench_function(
        format!("baseline_parse_value_{}B", responses_4k.len()),
        |b| b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&responses_4k))),
    );
    g.bench_function(format!("responses_to_chat_{}B", responses_4k.len()), |b| {
        b.iter(|| translate_request(black_box(&responses_4k), "gpt-4o", false))
    });
    g.bench_function(
        format!("responses_to_messages_{}B", responses_4k.len()),
        |b| b.iter(|| translate_request(black_box(&responses_4k), "claude", true)),
    );
    g.finish();

    let mut g = c.benchmark_group("translate_stream_event");
    let anthropic_event: &[u8] = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello there, how are you doing today?\"}}\n\n";
    let openai_event: &[u8] = b"data: {\"id\":\"chatcmpl-AbC123\",\"object\":\"chat.completion.chunk\",\"created\":1733000000,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello there, how are you doing today?\"},\"finish_reason\":null}]}\n\n";
    let mut out = Vec::with_capacity(4096);
    g.bench_function("baseline_parse_value_chat_chunk", |b| {
        let data = &openai_event[6..openai_event.len() - 2];
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(data)))
    });
    let mut to_chat = StreamTranslator::new(Translation::ChatToMessages, true, 1);
    to_chat.feed(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude\",\"usage\":{\"input_tokens\":5}}}\n\n", &mut out);
    g.bench_function("anthropic_text_delta_to_chat_chunk", |b| {
        b.iter(|| {
            out.clear();
            to_chat.feed(black_box(anthropic_event), &mut out);
        })
    });
    let mut to_messages = StreamTranslator::new(Translation::MessagesToChat, false, 1);
    to_messages.feed(openai_event, &mut out);
    g.bench_function("chat_chunk_to_anthropic_text_delta", |b| {
        b.iter(|| {
            out.clear();
            to_messages.feed(black_box(openai_event), &mut out);
        })
    });
    let mut to_responses = StreamTranslator::new(Translation::ResponsesToChat, false, 1);
    to_responses.feed(openai_event, &mut out);
    g.bench_function("chat_chunk_to_responses_output_text_delta", |b| {
        b.iter(|| {
            out.clear();
            to_responses.feed(black_box(openai_event), &mut out);
        })
    });
    g.finish();
}

/// `request` (a Responses request) with its instructions lengthened by plain words to
/// make it `size` bytes long.
fn padded(request: &[u8], size: usize) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(request).unwrap_or_default();
    let more = size.saturating_sub(request.len());
    let words: String = " Keep each answer short and cite the file you read."
        .chars()
        .cycle()
        .take(more)
        .collect();
    if let Some(serde_json::Value::String(s)) = v.get_mut("instructions") {
        s.push_str(&words);
    }
    v.to_string().into_bytes()
}

/// The chat request's conversation as a Responses request of the same size.
fn responses_request(chat: &[u8]) -> Vec<u8> {
    let chat: serde_json::Value = serde_json::from_slice(chat).unwrap_or_default();
    let mut input = Vec::new();
    for m in chat["messages"].as_array().into_iter().flatten().skip(1) {
        match m["role"].as_str() {
            Some("tool") => input.push(json!({"type": "function_call_output",
                "call_id": m["tool_call_id"], "output": m["content"]})),
            Some("assistant") if m["tool_calls"].is_array() => {
                let c = &m["tool_calls"][0];
                input.push(json!({"type": "function_call", "call_id": c["id"],
                    "name": c["function"]["name"], "arguments": c["function"]["arguments"]}));
            }
            Some(role) => {
                let kind = if role == "user" {
                    "input_text"
                } else {
                    "output_text"
                };
                input.push(json!({"type": "message", "role": role,
                    "content": [{"type": kind, "text": m["content"]}]}));
            }
            None => {}
        }
    }
    json!({"model": "gpt-4o", "instructions": chat["messages"][0]["content"], "input": input,
        "max_output_tokens": 1024, "temperature": 0.7, "stream": true, "store": false,
        "reasoning": {"effort": "low", "summary": "auto"},
        "tools": [{"type": "function", "name": "search_docs", "description": "Search the docs",
            "parameters": chat["tools"][0]["function"]["parameters"]}]})
    .to_string()
    .into_bytes()
}

criterion_group!(benches, bench);
criterion_main!(benches);
