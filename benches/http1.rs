//! The http1 codec on the hot path of every request, against a naive baseline
//! (`String::from_utf8` + split on CRLF + `split_once(':')` into a `HashMap`).
//!
//! Run: `cargo bench --bench http1 -- --warm-up-time 1 --measurement-time 3`

use std::collections::HashMap;
use std::hint::black_box;

use bytes::BytesMut;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tidegate::http1::{
    BodyDecoder, BodyEvent, BodyKind, Decoded, Method, decode_request_head, decode_response_head,
    write_chunk, write_last_chunk,
};

/// What the OpenAI Python SDK sends for a chat completion (16 fields).
const REQUEST_HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\n\
Host: gateway.internal:8080\r\n\
Accept-Encoding: gzip, deflate\r\n\
Connection: keep-alive\r\n\
Accept: application/json\r\n\
Content-Type: application/json\r\n\
User-Agent: OpenAI/Python 1.54.4\r\n\
X-Stainless-Lang: python\r\n\
X-Stainless-Package-Version: 1.54.4\r\n\
X-Stainless-OS: Linux\r\n\
X-Stainless-Arch: x64\r\n\
X-Stainless-Runtime: CPython\r\n\
X-Stainless-Runtime-Version: 3.12.7\r\n\
Authorization: Bearer sk-tg-3f9a1c0d7e5b4a2f8c6d1e0b9a8f7c6d5e4b3a2f1c0d9e8f\r\n\
X-Stainless-Async: false\r\n\
x-stainless-retry-count: 0\r\n\
Content-Length: 1187\r\n\
\r\n";

/// A typical upstream answer head for a streamed completion (21 fields).
const RESPONSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\n\
Date: Tue, 14 Jan 2025 10:21:07 GMT\r\n\
Content-Type: text/event-stream; charset=utf-8\r\n\
Transfer-Encoding: chunked\r\n\
Connection: keep-alive\r\n\
access-control-expose-headers: X-Request-ID\r\n\
openai-organization: user-abc123def456\r\n\
openai-processing-ms: 231\r\n\
openai-version: 2020-10-01\r\n\
x-ratelimit-limit-requests: 10000\r\n\
x-ratelimit-limit-tokens: 2000000\r\n\
x-ratelimit-remaining-requests: 9999\r\n\
x-ratelimit-remaining-tokens: 1999812\r\n\
x-ratelimit-reset-requests: 6ms\r\n\
x-ratelimit-reset-tokens: 5ms\r\n\
x-request-id: req_8f3c2a9b71d04e6f9a0b1c2d3e4f5a6b\r\n\
strict-transport-security: max-age=31536000; includeSubDomains; preload\r\n\
CF-Cache-Status: DYNAMIC\r\n\
X-Content-Type-Options: nosniff\r\n\
Server: cloudflare\r\n\
CF-RAY: 901c2e4b7f3a1d2c-FRA\r\n\
alt-svc: h3=\":443\"; ma=86400\r\n\
\r\n";

/// The baseline: what a first attempt without a parser looks like.
fn naive_head(bytes: &[u8]) -> Option<(String, HashMap<String, String>)> {
    let text = String::from_utf8(bytes.to_vec()).ok()?;
    let (head, _body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let start = lines.next()?.to_owned();
    let mut fields = HashMap::new();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        fields.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
    Some((start, fields))
}

fn heads(c: &mut Criterion) {
    // Both decoders must accept the inputs, or the numbers mean nothing.
    assert!(matches!(
        decode_request_head(&mut BytesMut::from(REQUEST_HEAD)),
        Ok(Decoded::Complete(_))
    ));
    assert!(matches!(
        decode_response_head(&mut BytesMut::from(RESPONSE_HEAD), Method::Post),
        Ok(Decoded::Complete(_))
    ));
    assert!(naive_head(REQUEST_HEAD).is_some() && naive_head(RESPONSE_HEAD).is_some());

    let mut group = c.benchmark_group("http1_head");

    group.throughput(Throughput::Bytes(REQUEST_HEAD.len() as u64));
    group.bench_function("request/tidegate", |b| {
        b.iter_batched(
            || BytesMut::from(REQUEST_HEAD),
            |mut buf| {
                let decoded = decode_request_head(&mut buf);
                if let Ok(Decoded::Complete(head)) = &decoded {
                    black_box((
                        head.body_kind(),
                        head.keep_alive(),
                        head.header("authorization"),
                    ));
                }
                decoded
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("request/naive", |b| {
        b.iter(|| {
            let parsed = naive_head(black_box(REQUEST_HEAD));
            if let Some((_, fields)) = &parsed {
                black_box((fields.get("content-length"), fields.get("authorization")));
            }
            parsed
        });
    });

    group.throughput(Throughput::Bytes(RESPONSE_HEAD.len() as u64));
    group.bench_function("response/tidegate", |b| {
        b.iter_batched(
            || BytesMut::from(RESPONSE_HEAD),
            |mut buf| {
                let decoded = decode_response_head(&mut buf, Method::Post);
                if let Ok(Decoded::Complete(head)) = &decoded {
                    black_box((head.status(), head.body_kind(), head.header("x-request-id")));
                }
                decoded
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("response/naive", |b| {
        b.iter(|| {
            let parsed = naive_head(black_box(RESPONSE_HEAD));
            if let Some((_, fields)) = &parsed {
                black_box((fields.get("transfer-encoding"), fields.get("x-request-id")));
            }
            parsed
        });
    });
    group.finish();
}

const BODY_BYTES: usize = 16 * 1024;
const CHUNK_BYTES: usize = 512;

/// Baseline chunked decoding: find each size line, parse it with `from_str_radix`, copy data.
fn naive_chunked(mut wire: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = wire.windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&wire[..line_end]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        wire = &wire[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(wire.get(..size)?);
        wire = wire.get(size + 2..)?;
    }
}

fn chunked(c: &mut Criterion) {
    let pattern = b"data: {\"delta\":\"x\"}\n\n";
    let body: Vec<u8> = pattern.iter().copied().cycle().take(BODY_BYTES).collect();
    let mut wire = BytesMut::new();
    for chunk in body.chunks(CHUNK_BYTES) {
        write_chunk(&mut wire, chunk);
    }
    write_last_chunk(&mut wire);
    let wire = wire.freeze();
    assert_eq!(naive_chunked(&wire).as_deref(), Some(&body[..]));
    let mut check = BytesMut::from(&wire[..]);
    let mut dec = BodyDecoder::new(BodyKind::Chunked);
    let mut decoded = Vec::new();
    while let Ok(BodyEvent::Data(data)) = dec.decode(&mut check) {
        decoded.extend_from_slice(&data);
    }
    assert!(dec.is_done() && decoded == body);

    let mut group = c.benchmark_group("http1_chunked_16k_in_512");
    group.throughput(Throughput::Bytes(BODY_BYTES as u64));
    group.bench_function("tidegate", |b| {
        b.iter_batched(
            || BytesMut::from(&wire[..]),
            |mut buf| {
                let mut dec = BodyDecoder::new(BodyKind::Chunked);
                let mut total = 0;
                while let Ok(BodyEvent::Data(data)) = dec.decode(&mut buf) {
                    total += black_box(data).len();
                }
                total
            },
            BatchSize::SmallInput,
        );
    });
    group.bench_function("naive", |b| {
        b.iter(|| naive_chunked(black_box(&wire)));
    });
    group.finish();
}

criterion_group!(benches, heads, chunked);
criterion_main!(benches);
