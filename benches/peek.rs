//! `proxy::peek` (and its two paths, the small-body scanner and simd-json's tape, alone)
//! against the naive baseline (serde_json into a `Value`, then lookups), on a
//! ~1, 4, 16 and 64 KiB chat body with `model` after `messages` (the order the OpenAI and
//! Anthropic SDKs send, and the worst case for the span scanner); plus the model splice
//! (`Rewrite`, built: the bench group keeps its name `rewrite_model`)
//! against a serde_json parse-modify-serialize round trip.
//!
//! `simd_json_serde_struct` is the design alternative that was measured and not taken:
//! simd-json's serde path into a small struct (buffers reused, tape allocated per call;
//! it yields no `model_span`, so it does less work than `tidegate_peek`).

use std::borrow::Cow;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tidegate::proxy::peek::{Rewrite, peek, peek_tape};

const TAIL: &str = r#"],"tools":[{"type":"function","function":{"name":"search_docs","description":"Search the docs","parameters":{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"}},"required":["query"]}}}],"temperature":0.7,"max_tokens":1024,"stream":true,"model":"openai/gpt-4o-2024-08-06"}"#;

/// A chat body of about `target` bytes (at most one turn over): system prompt, alternating
/// turns with escapes, a tool definition, then `stream` and `model`.
fn chat_body(target: usize) -> Vec<u8> {
    let mut body = String::from(
        r#"{"messages":[{"role":"system","content":"You are a careful assistant. Answer in Markdown; quote code with \"```\"."}"#,
    );
    let mut turn = 0usize;
    while body.len() + TAIL.len() < target {
        let role = if turn.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        };
        body.push_str(&format!(
            r#",{{"role":"{role}","content":"Turn {turn}: please look at {{\"key\": [1, 2, 3]}} and explain why it\u2019s slow.\nThe loop runs 10\u00d7 per request; profile says 42% in parse(). Thanks!"}}"#
        ));
        turn += 1;
    }
    body.push_str(TAIL);
    body.into_bytes()
}

fn serde_json_baseline(body: &[u8]) -> Option<(String, bool, bool)> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    let model = object.get("model")?.as_str()?.to_owned();
    let stream = object
        .get("stream")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let has_tools = object
        .get("tools")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|tools| !tools.is_empty());
    Some((model, stream, has_tools))
}

#[derive(serde::Deserialize)]
struct Routing<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    stream: Option<bool>,
    tools: Option<serde::de::IgnoredAny>,
}

fn simd_json_serde_struct(
    body: &[u8],
    scratch: &mut Vec<u8>,
    buffers: &mut simd_json::Buffers,
) -> Option<(String, bool, bool)> {
    scratch.clear();
    scratch.extend_from_slice(body);
    let routing: Routing<'_> = simd_json::serde::from_slice_with_buffers(scratch, buffers).ok()?;
    Some((
        routing.model?.into_owned(),
        routing.stream.unwrap_or(false),
        routing.tools.is_some(),
    ))
}

fn serde_json_rewrite(body: &[u8], new_model: &str) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    *value.as_object_mut()?.get_mut("model")? = serde_json::Value::from(new_model);
    serde_json::to_vec(&value).ok()
}

fn bench_peek(c: &mut Criterion) {
    for (label, target) in [
        ("1KiB", 1024),
        ("4KiB", 4 * 1024),
        ("16KiB", 16 * 1024),
        ("64KiB", 64 * 1024),
    ] {
        let body = chat_body(target);
        let mut group = c.benchmark_group(format!("peek/{label}"));
        group.throughput(Throughput::Bytes(body.len() as u64));

        let mut scratch = Vec::new();
        group.bench_function("tidegate_peek", |b| {
            b.iter(|| peek(black_box(&body), &mut scratch))
        });
        // simd-json alone: the path `peek` takes for bodies the scanner leaves.
        let mut scratch = Vec::new();
        group.bench_function("tidegate_peek_tape", |b| {
            b.iter(|| peek_tape(black_box(&body), &mut scratch))
        });
        // The scanner alone, whatever the body's size.
        group.bench_function("tidegate_scan", |b| {
            b.iter(|| tidegate::proxy::peek::scan::scan(black_box(&body)))
        });
        group.bench_function("serde_json_value_baseline", |b| {
            b.iter(|| serde_json_baseline(black_box(&body)))
        });
        let mut scratch = Vec::new();
        let mut buffers = simd_json::Buffers::default();
        group.bench_function("simd_json_serde_struct", |b| {
            b.iter(|| simd_json_serde_struct(black_box(&body), &mut scratch, &mut buffers))
        });
        group.finish();
    }
}

fn bench_rewrite(c: &mut Criterion) {
    let mut group = c.benchmark_group("rewrite_model");
    for (label, target) in [("1KiB", 1024), ("64KiB", 64 * 1024)] {
        let body = chat_body(target);
        let Ok(found) = peek(&body, &mut Vec::new()) else {
            return;
        };
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("splice", label), &body, |b, body| {
            b.iter(|| {
                Rewrite::new(
                    black_box(body),
                    found.model_span.clone(),
                    "gpt-4o-2024-08-06",
                )
                .to_bytes()
            })
        });
        group.bench_with_input(
            BenchmarkId::new("serde_json_roundtrip_baseline", label),
            &body,
            |b, body| b.iter(|| serde_json_rewrite(black_box(body), "gpt-4o-2024-08-06")),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_peek, bench_rewrite);
criterion_main!(benches);
