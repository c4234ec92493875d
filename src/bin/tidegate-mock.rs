//! `tidegate-mock`: a fast standalone mock LLM upstream for load tests (`perf/`).
//! Thread-per-core like the gateway, built from the same codec, answering
//! `POST /v1/chat/completions` (and `/v1/messages`) with the in-process mock provider's
//! replies, streamed (chunked SSE) when the body says `"stream":true`. The request's
//! `model` picks the behaviour as in the in-process provider (`providers::mock`):
//! `slow-<ms>` delays the head, `drip-<ms>` spaces the stream's frames (one chunk per
//! frame), `stall` never answers (or, streamed, goes silent after its first frame),
//! `fail-<status>` answers that status; anything else is answered at once in one write.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use clap::Parser;
use mimalloc::MiMalloc;
use monoio::net::TcpStream;

// The unreachable-code check (scripts/check-dead-code) also builds this binary with
// `--cfg tidegate_reach`, the library's modules compiled in; an item counts as unreachable
// only when neither binary reaches it. The list must equal lib.rs's.
#[cfg(tidegate_reach)]
use crate as tidegate;
#[cfg(tidegate_reach)]
#[path = "../admin/mod.rs"]
mod admin;
#[cfg(tidegate_reach)]
#[path = "../auth/mod.rs"]
mod auth;
#[cfg(tidegate_reach)]
#[path = "../clock.rs"]
mod clock;
#[cfg(tidegate_reach)]
#[path = "../config/mod.rs"]
mod config;
#[cfg(tidegate_reach)]
#[path = "../error.rs"]
mod error;
#[cfg(tidegate_reach)]
#[path = "../flow/mod.rs"]
mod flow;
#[cfg(tidegate_reach)]
#[path = "../heap.rs"]
mod heap;
#[cfg(tidegate_reach)]
#[path = "../http1/mod.rs"]
mod http1;
#[cfg(tidegate_reach)]
#[path = "../mesh/mod.rs"]
mod mesh;
#[cfg(tidegate_reach)]
#[path = "../net/mod.rs"]
mod net;
#[cfg(tidegate_reach)]
#[path = "../notify.rs"]
mod notify;
#[cfg(tidegate_reach)]
#[path = "../owners/mod.rs"]
mod owners;
#[cfg(tidegate_reach)]
#[path = "../providers/mod.rs"]
mod providers;
#[cfg(tidegate_reach)]
#[path = "../proxy/mod.rs"]
mod proxy;
#[cfg(tidegate_reach)]
#[path = "../resilience/mod.rs"]
mod resilience;
#[cfg(tidegate_reach)]
#[path = "../routing/mod.rs"]
mod routing;
#[cfg(tidegate_reach)]
#[path = "../server.rs"]
mod server;
#[cfg(tidegate_reach)]
#[path = "../shard/mod.rs"]
mod shard;
#[cfg(tidegate_reach)]
#[path = "../snapshot/mod.rs"]
mod snapshot;
#[cfg(tidegate_reach)]
#[path = "../sse/mod.rs"]
mod sse;
#[cfg(tidegate_reach)]
#[path = "../timer.rs"]
mod timer;

#[cfg(not(tidegate_reach))]
use tidegate::http1;
use tidegate::http1::{BodyDecoder, BodyEvent, Decoded, Framing};
use tidegate::net::io::{READ_BUF_BYTES, read_more, write_all};
use tidegate::net::listener::bind_shards;
use tidegate::providers::{Endpoint, mock};

/// The only request field the mock reads itself (the plan reads the rest).
#[derive(serde::Deserialize)]
struct Model {
    #[serde(default)]
    model: String,
}

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

#[derive(Parser)]
#[command(
    name = "tidegate-mock",
    about = "Fast mock LLM upstream for load tests"
)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: SocketAddr,
    /// Threads (0 = one per core).
    #[arg(long, default_value_t = 1)]
    workers: usize,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let workers = tidegate::server::shard_count(cli.workers);
    let (addr, listeners) = match bind_shards(cli.listen, workers) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("tidegate-mock: cannot listen on {}: {e}", cli.listen);
            return ExitCode::FAILURE;
        }
    };
    println!("tidegate-mock listening on {addr} (workers={workers})");
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            std::thread::spawn(move || {
                let rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
                    .enable_timer()
                    .build();
                let Ok(mut rt) = rt else { return };
                rt.block_on(async move {
                    let Ok(listener) = monoio::net::TcpListener::from_std(l) else {
                        return;
                    };
                    while let Ok((s, _)) = listener.accept().await {
                        monoio::spawn(serve(s));
                    }
                });
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    ExitCode::SUCCESS
}

async fn serve(mut s: TcpStream) {
    let _ = s.set_nodelay(true);
    let mut buf = BytesMut::with_capacity(READ_BUF_BYTES);
    let mut seq = 0u64;
    loop {
        let head = loop {
            match http1::decode_request_head(&mut buf) {
                Ok(Decoded::Complete(h)) => break h,
                Ok(Decoded::Partial) => {}
                Err(_) => return,
            }
            let (res, b) = read_more(&mut s, std::mem::take(&mut buf), READ_BUF_BYTES).await;
            buf = b;
            if !matches!(res, Ok(n) if n > 0) {
                return;
            }
        };
        let mut dec = BodyDecoder::new(head.body_kind());
        let mut body = BytesMut::new();
        loop {
            match dec.decode(&mut buf) {
                Ok(BodyEvent::Data(d)) => body.extend_from_slice(&d),
                Ok(BodyEvent::Done) => break,
                Ok(BodyEvent::NeedMore) => {
                    let (res, b) =
                        read_more(&mut s, std::mem::take(&mut buf), READ_BUF_BYTES).await;
                    buf = b;
                    if !matches!(res, Ok(n) if n > 0) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        seq += 1;
        let endpoint = Endpoint::from_path(head.path()).unwrap_or(Endpoint::ChatCompletions);
        let stream = memchr::memmem::find(&body, b"\"stream\":true").is_some()
            || memchr::memmem::find(&body, b"\"stream\": true").is_some();
        let model = serde_json::from_slice::<Model>(&body)
            .map(|m| m.model)
            .unwrap_or_default();
        let plan = mock::plan(endpoint, &model, stream, &body, seq, 0);
        if !play(&mut s, &mut buf, plan, head.keep_alive()).await || !head.keep_alive() {
            return;
        }
    }
}

/// Plays `plan` on the connection; false when the connection is done (failed, or left
/// silent by a stall until the client hung up).
async fn play(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    mut plan: mock::Plan,
    keep_alive: bool,
) -> bool {
    if plan.stall_before_head {
        wait_for_hang_up(s, buf).await;
        return false;
    }
    if plan.head_delay_ms > 0 {
        monoio::time::sleep(Duration::from_millis(plan.head_delay_ms)).await;
    }
    let mut frames = plan.take_frames();
    let mut out = BytesMut::with_capacity(2048);
    let mut fields: Vec<(&str, &[u8])> = vec![("content-type", plan.content_type.as_bytes())];
    fields.extend(plan.extra_headers.iter().map(|(n, v)| (*n, v.as_bytes())));
    if !plan.streamed {
        let frames: Vec<Bytes> = frames.collect();
        let len: usize = frames.iter().map(Bytes::len).sum();
        http1::write_response_head(
            &mut out,
            plan.status,
            fields,
            Framing::Length(len as u64),
            keep_alive,
        );
        for f in &frames {
            out.extend_from_slice(f);
        }
        return write_all(s, out).await.is_ok();
    }
    http1::write_response_head(&mut out, plan.status, fields, Framing::Chunked, keep_alive);
    let gap = Duration::from_millis(plan.frame_delay_ms);
    if gap.is_zero() {
        // Everything in one write: the load tests' fast path.
        for f in frames.by_ref() {
            http1::write_chunk(&mut out, &f);
        }
    } else if let Some(f) = frames.next() {
        // The head and the first frame at once, then one chunk per gap.
        http1::write_chunk(&mut out, &f);
        if write_all(s, out).await.is_err() {
            return false;
        }
        for f in frames.by_ref() {
            monoio::time::sleep(gap).await;
            let mut piece = BytesMut::with_capacity(f.len() + 16);
            http1::write_chunk(&mut piece, &f);
            if write_all(s, piece).await.is_err() {
                return false;
            }
        }
        out = BytesMut::with_capacity(8);
    }
    if plan.stall_after_frames {
        if write_all(s, out).await.is_ok() {
            wait_for_hang_up(s, buf).await;
        }
        return false;
    }
    http1::write_last_chunk(&mut out);
    write_all(s, out).await.is_ok()
}

/// A stalled answer: silence until the client hangs up (whatever it sends is dropped).
async fn wait_for_hang_up(s: &mut TcpStream, buf: &mut BytesMut) {
    loop {
        buf.clear();
        let (res, b) = read_more(s, std::mem::take(buf), READ_BUF_BYTES).await;
        *buf = b;
        if !matches!(res, Ok(n) if n > 0) {
            return;
        }
    }
}
