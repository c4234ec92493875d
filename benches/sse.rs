//! The stream relay's per-read work on an event stream: SSE framing (`sse::Scanner`), and what
//! the stream watchdog reads of every event (its frame class for the content-stall budget,
//! an error event, the token counts), on an OpenAI chat stream (`stream_options.include_usage`,
//! so every chunk carries `"usage":null` and the last one the counts) and an Anthropic
//! Messages stream, both in the shape those APIs send them.
//!
//! - `framing`: the scanner alone, the stream as one read and cut in 64-byte reads.
//! - `watchdog/one_read`: `proxy::watchdog::Watchdog::observe` over the whole stream as one
//!   read; `watchdog/event_pieces_one_reading`: one piece per event, all at one clock
//!   reading (a fast upstream's chunked answer: each chunk is a piece, and the relay observes
//!   the pieces already buffered at one reading); `watchdog/read_per_event`: one piece per
//!   event, each at its own reading (a slow upstream, one event at a time).
//! - `every_event`: classify + usage + useful bytes on every event (what the watchdog read of
//!   each event before it stopped looking for output once a clock reading had shown some).
//! - `naive`: the baseline a dynamic-language gateway would run: split on blank lines, each
//!   event's data into a `serde_json::Value`, then the same questions by lookups.
//!
//! `cargo bench --bench sse`; figures in perf/RESULTS.md.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tidegate::proxy::watchdog::Watchdog;
use tidegate::sse::usage::Usage;
use tidegate::sse::{Scanner, classify, throughput};

/// An OpenAI chat completion stream with usage: a role chunk, one chunk per word, the finish
/// chunk, the usage chunk (`choices` empty) and `[DONE]`.
fn openai_stream() -> Vec<u8> {
    let head = r#"{"id":"chatcmpl-BQx1bench","object":"chat.completion.chunk","created":1745000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_b376dfbbd5","choices":[{"index":0,"delta":"#;
    let mut s = String::new();
    let mut chunk = |delta: &str, finish: &str| {
        s.push_str("data: ");
        s.push_str(head);
        s.push_str(delta);
        s.push_str(r#","logprobs":null,"finish_reason":"#);
        s.push_str(finish);
        s.push_str("}],\"usage\":null}\n\n");
    };
    chunk(
        r#"{"role":"assistant","content":"","refusal":null}"#,
        "null",
    );
    for w in WORDS {
        chunk(&format!(r#"{{"content":"{w}"}}"#), "null");
    }
    chunk("{}", r#""stop""#);
    s.push_str(r#"data: {"id":"chatcmpl-BQx1bench","object":"chat.completion.chunk","created":1745000000,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_b376dfbbd5","choices":[],"usage":{"prompt_tokens":31,"completion_tokens":12,"total_tokens":43,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}"#);
    s.push_str("\n\ndata: [DONE]\n\n");
    s.into_bytes()
}

/// An Anthropic Messages stream: `message_start` (input tokens), a text block with one
/// delta per word and a ping, `message_delta` (output tokens), `message_stop`.
fn anthropic_stream() -> Vec<u8> {
    let mut s = String::new();
    s.push_str("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XbenchBench\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-20250514\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":31,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1,\"service_tier\":\"standard\"}}}\n\n");
    s.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    s.push_str("event: ping\ndata: {\"type\": \"ping\"}\n\n");
    for w in WORDS {
        s.push_str(&format!(
            "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{w}\"}}}}\n\n"
        ));
    }
    s.push_str(
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    );
    s.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":12}}\n\n");
    s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s.into_bytes()
}

const WORDS: [&str; 12] = [
    "Hello", " there", ",", " load", " test", "!", " Nice", " to", " meet", " you", " today", ".",
];

/// The stream cut after every blank line: one read per event.
fn per_event(stream: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    for end in memchr::memmem::find_iter(stream, b"\n\n") {
        out.push(&stream[start..end + 2]);
        start = end + 2;
    }
    out
}

/// What the naive baseline answers per stream: events with model output, error events,
/// and the last token counts.
fn naive(stream: &[u8]) -> (usize, usize, Option<u64>, Option<u64>) {
    let text = std::str::from_utf8(stream).expect("utf-8");
    let (mut output, mut errors, mut prompt, mut completion) = (0, 0, None, None);
    for event in text.split("\n\n").filter(|e| !e.is_empty()) {
        let mut name = None;
        let mut data = String::new();
        for line in event.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if data == "[DONE]" {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&data) else {
            continue;
        };
        let ty = v["type"].as_str().map(str::to_owned).or(name);
        let delta = &v["choices"][0]["delta"];
        let is_output = match ty.as_deref() {
            Some("content_block_delta") => true,
            Some(_) => false,
            None => {
                delta["content"].as_str().is_some_and(|c| !c.is_empty())
                    || delta["tool_calls"].is_array()
            }
        };
        output += usize::from(is_output);
        errors += usize::from(ty.as_deref() == Some("error") || !v["error"].is_null());
        for u in [&v["usage"], &v["message"]["usage"]] {
            if let Some(n) = u["prompt_tokens"].as_u64().or(u["input_tokens"].as_u64()) {
                prompt = Some(n);
            }
            if let Some(n) = u["completion_tokens"]
                .as_u64()
                .or(u["output_tokens"].as_u64())
            {
                completion = Some(n);
            }
        }
    }
    (output, errors, prompt, completion)
}

fn streams(c: &mut Criterion) {
    for (label, stream) in [
        ("openai", openai_stream()),
        ("anthropic", anthropic_stream()),
    ] {
        let reads = per_event(&stream);
        let mut g = c.benchmark_group(format!("sse/{label}"));
        g.throughput(Throughput::Elements(reads.len() as u64));
        // The watch's answers, checked once: the benches measure work that gets them right.
        let mut w = Watchdog::new(80_000, None, 0);
        w.observe(&stream, 1);
        let u = w.usage();
        assert!(u.prompt_tokens == 31 && u.completion_tokens == 12 && w.error_event().is_none());
        assert_eq!(naive(&stream), (12, 0, Some(31), Some(12)));

        g.bench_function("framing/one_read", |b| {
            let mut sc = Scanner::default();
            b.iter(|| {
                let mut n = 0usize;
                sc.feed(black_box(&stream), &mut |r| n += usize::from(r.is_ok()));
                black_box(n)
            })
        });
        g.bench_function("framing/64B_reads", |b| {
            let mut sc = Scanner::default();
            b.iter(|| {
                let mut n = 0usize;
                for piece in black_box(&stream).chunks(64) {
                    sc.feed(piece, &mut |r| n += usize::from(r.is_ok()));
                }
                black_box(n)
            })
        });
        g.bench_function("watchdog/one_read", |b| {
            b.iter(|| {
                let mut w = Watchdog::new(80_000, None, 0);
                w.observe(black_box(&stream), 1);
                black_box(w.usage())
            })
        });
        g.bench_function("watchdog/event_pieces_one_reading", |b| {
            b.iter(|| {
                let mut w = Watchdog::new(80_000, None, 0);
                for piece in &reads {
                    w.observe(black_box(piece), 1);
                }
                black_box(w.usage())
            })
        });
        g.bench_function("watchdog/read_per_event", |b| {
            b.iter(|| {
                let mut w = Watchdog::new(80_000, None, 0);
                for (i, piece) in reads.iter().enumerate() {
                    w.observe(black_box(piece), i as u64);
                }
                black_box(w.usage())
            })
        });
        g.bench_function("every_event", |b| {
            let mut sc = Scanner::default();
            b.iter(|| {
                let mut usage = Usage::default();
                let (mut output, mut useful) = (0usize, 0u64);
                sc.feed(black_box(&stream), &mut |r| {
                    if let Ok(ev) = r {
                        usage.observe(&ev);
                        output += usize::from(classify(&ev).output);
                        useful += throughput::useful(&ev).bytes;
                    }
                });
                black_box((output, useful, usage))
            })
        });
        g.bench_function("naive", |b| b.iter(|| black_box(naive(black_box(&stream)))));
        g.finish();
    }
}

criterion_group!(benches, streams);
criterion_main!(benches);
