//! The per-request hot path end to end, in process, stage by stage and whole: parse the
//! client's request head → identify the client key → peek the JSON body (`model`,
//! `stream`) → resolve the model to targets → select a connection over the shard's views →
//! encode the upstream request head; after the answer, read its token counts; for a
//! streamed answer, read each event (frame class, useful bytes, token counts). No sockets:
//! what is measured is the CPU the gateway spends deciding and re-encoding, not I/O.
//!
//! Beside each stage, and beside the whole, a naive baseline that does the same job the way a
//! dynamic-language gateway typically does: headers into a `HashMap<String, String>`, the body
//! into a `serde_json::Value`, routing and state keyed by strings built per lookup, the
//! upstream head assembled with `format!`.
//!
//! `cargo bench --bench hot_path`; figures in perf/RESULTS.md.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, criterion_group, criterion_main};
use tidegate::auth::{Caller, KeyIndex};
use tidegate::clock::Now;
use tidegate::config::{Config, ConnectionId, load_str};
use tidegate::http1::{Decoded, RequestHead, decode_request_head};
use tidegate::owners::health::views::Views;
use tidegate::providers::Endpoint;
use tidegate::proxy::forward::encode_head;
use tidegate::proxy::peek::peek;
use tidegate::proxy::select::{Gate, gate};
use tidegate::routing::resolve::{Resolved, RouteTable, resolve};
use tidegate::sse::usage::Usage;
use tidegate::sse::{Event, classify, throughput};

const CONNECTIONS: u32 = 8;
const NOW: Now = Now {
    mono_ns: 5_000_000_000,
    wall_ms: 1_800_000_000_000,
};

/// A request head as the OpenAI Python SDK sends it.
fn request_head(body_len: usize) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\n\
         Host: 127.0.0.1:8080\r\n\
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
         X-Stainless-Runtime-Version: 3.11.2\r\n\
         Authorization: Bearer sk-tidegate-bench-key\r\n\
         X-Stainless-Async: false\r\n\
         X-Stainless-Retry-Count: 0\r\n\
         Content-Length: {body_len}\r\n\r\n"
    )
    .into_bytes()
}

/// A ~1 KiB chat body, `model` last (the SDKs' order).
fn request_body() -> Vec<u8> {
    let mut body = String::from(
        r#"{"messages":[{"role":"system","content":"You are a careful assistant. Answer briefly."}"#,
    );
    while body.len() < 900 {
        body.push_str(r#",{"role":"user","content":"Summarise the last answer in one line, please; keep the \"quoted\" part."}"#);
    }
    body.push_str(r#"],"temperature":0.2,"stream":false,"model":"bench/gpt-4o-mini"}"#);
    body.into_bytes()
}

fn config() -> Config {
    let mut toml = String::from(
        "[[client_keys]]\nid = \"bench\"\nkey = \"sk-tidegate-bench-key\"\n\n\
         [[providers]]\nid = \"bench\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"gpt-4o-mini\"]\n",
    );
    for i in 0..CONNECTIONS {
        toml.push_str(&format!(
            "[[connections]]\nid = \"c{i}\"\nprovider = \"bench\"\napi_key_env = \"BENCH_UPSTREAM_KEY_{i}\"\npriority = {i}\n"
        ));
    }
    match load_str(&toml, &|name| {
        name.starts_with("BENCH_UPSTREAM_KEY_")
            .then(|| format!("sk-upstream-{name}"))
    }) {
        Ok(o) => o.config,
        Err(e) => panic!("bench config: {e}"),
    }
}

struct Gateway {
    config: Config,
    keys: KeyIndex,
    routes: RouteTable,
    views: Views,
}

impl Gateway {
    fn new() -> Self {
        let config = config();
        Self {
            keys: KeyIndex::new(&config),
            routes: RouteTable::new(&config),
            views: Views::default(),
            config,
        }
    }

    fn parse(buf: &mut BytesMut) -> RequestHead {
        match decode_request_head(buf) {
            Ok(Decoded::Complete(h)) => h,
            other => panic!("head: {other:?}"),
        }
    }

    fn select(&self, resolved: &Resolved) -> ConnectionId {
        let target = &resolved.targets[0];
        *self
            .routes
            .connections(target.provider)
            .iter()
            .find(|c| gate(&self.views, &self.config, target, **c, NOW) == Gate::Pass)
            .expect("a routable connection")
    }

    /// The whole path; returns the upstream head's length.
    fn run(
        &self,
        head: &[u8],
        body: &[u8],
        buf: &mut BytesMut,
        scratch: &mut Vec<u8>,
        out: &mut BytesMut,
    ) -> usize {
        buf.clear();
        buf.extend_from_slice(head);
        let head = Self::parse(buf);
        assert!(matches!(self.keys.identify(&head), Caller::Key(_)));
        let peeked = peek(body, scratch).expect("peek");
        let resolved = resolve(&self.config, &self.routes, &peeked.model).expect("resolve");
        let connection = self.select(&resolved);
        let conn = self.config.connection(connection);
        let provider = self.config.provider(conn.provider);
        let base = provider.base_url.as_ref().expect("base url");
        out.clear();
        encode_head(
            out,
            &head,
            provider,
            base,
            conn,
            Endpoint::ChatCompletions,
            body.len(),
        );
        out.len()
    }
}

/// The same job, dynamic-language style.
struct Naive {
    keys: HashMap<String, String>,
    providers: HashMap<String, (String, Vec<String>)>,
    connections: Vec<(String, String, String)>,
    cooling: HashMap<String, u64>,
    locks: HashMap<String, u64>,
    open: HashMap<String, u64>,
}

impl Naive {
    fn new() -> Self {
        let mut keys = HashMap::new();
        keys.insert("sk-tidegate-bench-key".to_owned(), "bench".to_owned());
        let mut providers = HashMap::new();
        providers.insert(
            "bench".to_owned(),
            (
                "http://127.0.0.1:9/v1".to_owned(),
                vec!["gpt-4o-mini".to_owned()],
            ),
        );
        let connections = (0..CONNECTIONS)
            .map(|i| {
                (
                    format!("c{i}"),
                    "bench".to_owned(),
                    format!("sk-upstream-{i}"),
                )
            })
            .collect();
        Self {
            keys,
            providers,
            connections,
            cooling: HashMap::new(),
            locks: HashMap::new(),
            open: HashMap::new(),
        }
    }

    fn parse(bytes: &[u8]) -> (String, String, HashMap<String, String>) {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        assert!(req.parse(bytes).expect("parse").is_complete());
        let map = req
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        (
            req.method.unwrap_or("").to_owned(),
            req.path.unwrap_or("").to_owned(),
            map,
        )
    }

    fn identify(&self, headers: &HashMap<String, String>) -> Option<String> {
        let auth = headers.get("authorization")?;
        let key = auth.strip_prefix("Bearer ")?;
        self.keys.get(key).cloned()
    }

    fn peek(body: &[u8]) -> (String, bool) {
        let v: serde_json::Value = serde_json::from_slice(body).expect("json");
        (
            v["model"].as_str().unwrap_or("").to_owned(),
            v["stream"].as_bool().unwrap_or(false),
        )
    }

    fn resolve(&self, model: &str) -> (String, String) {
        let (provider, m) = model.split_once('/').expect("provider/model");
        let (_, models) = self.providers.get(provider).expect("provider");
        assert!(models.iter().any(|x| x == m));
        (provider.to_owned(), m.to_owned())
    }

    fn select(&self, provider: &str, model: &str) -> usize {
        self.connections
            .iter()
            .position(|(name, p, _)| {
                p == provider
                    && self.cooling.get(name).is_none_or(|u| *u <= NOW.wall_ms)
                    && self
                        .locks
                        .get(&format!("{provider}:{name}:{model}"))
                        .is_none_or(|u| *u <= NOW.wall_ms)
                    && self
                        .open
                        .get(&format!("{provider}::conn::{name}"))
                        .is_none_or(|u| *u <= NOW.wall_ms)
            })
            .expect("a routable connection")
    }

    fn encode(
        &self,
        method: &str,
        path: &str,
        headers: &HashMap<String, String>,
        conn: usize,
        body_len: usize,
    ) -> String {
        let (_, provider, key) = &self.connections[conn];
        let (base, _) = &self.providers[provider];
        let rest = base.strip_prefix("http://").unwrap_or(base);
        let (host, root) = rest.split_once('/').unwrap_or((rest, ""));
        let mut out = format!(
            "{method} /{root}{} HTTP/1.1\r\nhost: {host}\r\n",
            path.trim_start_matches("/v1")
        );
        for (n, v) in headers {
            if !matches!(
                n.as_str(),
                "host" | "authorization" | "content-length" | "connection"
            ) {
                out.push_str(&format!("{n}: {v}\r\n"));
            }
        }
        out.push_str(&format!(
            "authorization: Bearer {key}\r\ncontent-length: {body_len}\r\n\r\n"
        ));
        out
    }

    fn run(&self, head: &[u8], body: &[u8]) -> usize {
        let (method, path, headers) = Self::parse(head);
        assert!(self.identify(&headers).is_some());
        let (model, _stream) = Self::peek(body);
        let (provider, m) = self.resolve(&model);
        let conn = self.select(&provider, &m);
        self.encode(&method, &path, &headers, conn, body.len())
            .len()
    }
}

fn stages(c: &mut Criterion) {
    let body = request_body();
    let head = request_head(body.len());
    let gw = Gateway::new();
    let naive = Naive::new();
    let mut buf = BytesMut::with_capacity(4096);
    let mut scratch = Vec::new();
    let mut out = BytesMut::with_capacity(4096);

    let mut g = c.benchmark_group("hot_path");
    g.bench_function("whole/tidegate", |b| {
        b.iter(|| {
            black_box(gw.run(
                black_box(&head),
                black_box(&body),
                &mut buf,
                &mut scratch,
                &mut out,
            ))
        })
    });
    g.bench_function("whole/naive", |b| {
        b.iter(|| black_box(naive.run(black_box(&head), black_box(&body))))
    });

    g.bench_function("parse_head/tidegate", |b| {
        b.iter(|| {
            buf.clear();
            buf.extend_from_slice(&head);
            black_box(Gateway::parse(&mut buf))
        })
    });
    g.bench_function("parse_head/naive", |b| {
        b.iter(|| black_box(Naive::parse(black_box(&head))))
    });
    // The floor: httparse alone into a stack array (no spans kept, no framing checks).
    g.bench_function("parse_head/httparse_only", |b| {
        b.iter(|| {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            black_box(req.parse(black_box(&head)).is_ok())
        })
    });

    buf.clear();
    buf.extend_from_slice(&head);
    let parsed = Gateway::parse(&mut buf);
    let (_, _, naive_headers) = Naive::parse(&head);
    g.bench_function("identify/tidegate", |b| {
        b.iter(|| black_box(gw.keys.identify(black_box(&parsed))))
    });
    g.bench_function("identify/naive", |b| {
        b.iter(|| black_box(naive.identify(black_box(&naive_headers))))
    });

    g.bench_function("peek/tidegate", |b| {
        b.iter(|| black_box(peek(black_box(&body), &mut scratch).is_ok()))
    });
    g.bench_function("peek/naive", |b| {
        b.iter(|| black_box(Naive::peek(black_box(&body))))
    });

    g.bench_function("resolve/tidegate", |b| {
        b.iter(|| {
            black_box(resolve(&gw.config, &gw.routes, black_box("bench/gpt-4o-mini")).is_ok())
        })
    });
    g.bench_function("resolve/naive", |b| {
        b.iter(|| black_box(naive.resolve(black_box("bench/gpt-4o-mini"))))
    });

    let resolved = resolve(&gw.config, &gw.routes, "bench/gpt-4o-mini").expect("resolve");
    g.bench_function("select/tidegate", |b| {
        b.iter(|| black_box(gw.select(black_box(&resolved))))
    });
    g.bench_function("select/naive", |b| {
        b.iter(|| black_box(naive.select(black_box("bench"), black_box("gpt-4o-mini"))))
    });

    let connection = gw.select(&resolved);
    let conn = gw.config.connection(connection);
    let provider = gw.config.provider(conn.provider);
    let base = provider.base_url.as_ref().expect("base url");
    g.bench_function("encode_head/tidegate", |b| {
        b.iter(|| {
            out.clear();
            encode_head(
                &mut out,
                black_box(&parsed),
                provider,
                base,
                conn,
                Endpoint::ChatCompletions,
                body.len(),
            );
            black_box(out.len())
        })
    });
    g.bench_function("encode_head/naive", |b| {
        b.iter(|| {
            black_box(naive.encode(
                "POST",
                "/v1/chat/completions",
                black_box(&naive_headers),
                0,
                body.len(),
            ))
        })
    });
    // After the answer: its token counts, read from the tail of a whole (non-stream)
    // answer as OpenAI sends it (usage last, with its `*_details` objects).
    let answer = br#"{"id":"chatcmpl-bench","object":"chat.completion","created":1800000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello, load test! Nice to meet you."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":31,"completion_tokens":9,"total_tokens":40,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"system_fingerprint":"fp_bench"}"#;
    g.bench_function("answer_usage/tidegate", |b| {
        b.iter(|| black_box(Usage::of_answer(black_box(&answer[..]))))
    });
    g.bench_function("answer_usage/naive", |b| {
        b.iter(|| {
            let v: serde_json::Value =
                serde_json::from_slice(black_box(&answer[..])).expect("json");
            black_box((
                v["usage"]["prompt_tokens"].as_u64(),
                v["usage"]["completion_tokens"].as_u64(),
            ))
        })
    });
    // A streamed answer, per event: what the watchdog reads of one OpenAI chat chunk (its
    // frame class for the stall budget, its useful bytes for the throughput meter, its
    // token counts). The naive baseline builds the chunk's `serde_json::Value` tree.
    let chunk = br#"{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1800000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"hello "},"logprobs":null,"finish_reason":null}]}"#;
    let event = Event {
        name: None,
        data: Some(&chunk[..]),
        comment: false,
    };
    g.bench_function("stream_event/tidegate", |b| {
        b.iter(|| {
            let ev = black_box(&event);
            let mut usage = Usage::default();
            usage.observe(ev);
            black_box((classify(ev).output, throughput::useful(ev), usage))
        })
    });
    g.bench_function("stream_event/naive", |b| {
        b.iter(|| {
            let v: serde_json::Value = serde_json::from_slice(black_box(&chunk[..])).expect("json");
            let delta = &v["choices"][0]["delta"];
            black_box((
                delta["content"].as_str().map(str::len),
                delta["tool_calls"].is_array(),
                v["usage"]["prompt_tokens"].as_u64(),
            ))
        })
    });
    g.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
