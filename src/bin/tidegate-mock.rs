//! `tidegate-mock`: a fast standalone mock LLM upstream for load tests (`perf/`).
//! Thread-per-core like the gateway, built from the same codec, answering
//! `POST /v1/chat/completions` (and `/v1/messages`) with the in-process mock provider's
//! replies, streamed (chunked SSE) when the body says `"stream":true`. The request's
//! `model` picks the behaviour as in the in-process provider (`providers::mock`):
//! `slow-<ms>` delays the head, `drip-<ms>` spaces the stream's frames (one chunk per
//! frame), `stall` never answers (or, streamed, goes silent after its first frame),
//! `fail-<status>` answers that status; anything else is answered at once in one write.
//! An answer sent at once is rendered once per request body and copied afterwards with the
//! request's own ids (`Answers`): a load test's repeated body costs the mock a copy, not a
//! JSON rendering per frame.
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
use tidegate::http1::{BodyDecoder, BodyEvent, Decoded, Framing, Persist};
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
    about = "Fast mock LLM upstream for load tests",
    after_help = "What it answers:\n  \
        POST /v1/chat/completions, /v1/responses, /v1/embeddings, /v1/messages and\n  \
        /v1/messages/count_tokens, each in its API's shape (any other path as chat\n  \
        completions). A chat, Responses or Messages reply echoes the last user message,\n  \
        streamed (SSE) when the body has \"stream\": true. The request's model picks the\n  \
        behaviour:\n    \
        slow-<ms>      the head after <ms>\n    \
        drip-<ms>      a stream with <ms> between frames\n    \
        stall          no answer (streamed: silence after the first frame)\n    \
        fail-<status>  that status\n    \
        anything else  answered at once\n\n\
        Point a gateway provider at it: base_url = \"http://127.0.0.1:9100/v1\" (format\n\
        openai or anthropic). Start one mock per provider to tell them apart."
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
    // The workers listen with SO_REUSEPORT, which would let this mock join a port another
    // process (an earlier mock) listens on and silently take part of its connections. A
    // plain bind first fails while anyone listens there.
    if cli.listen.port() != 0
        && let Err(e) = std::net::TcpListener::bind(cli.listen)
    {
        eprintln!("tidegate-mock: cannot listen on {}: {e}", cli.listen);
        return ExitCode::FAILURE;
    }
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
        let keep_alive = head.keep_alive();
        // An answer rendered before for the same request is copied with this seq written in.
        let known = ANSWERS.with_borrow(|a| a.answer(endpoint, keep_alive, &body, seq));
        if let Some(out) = known {
            if write_all(&mut s, out).await.is_err() || !keep_alive {
                return;
            }
            continue;
        }
        let plan = plan_for(endpoint, &body, seq);
        let open = if plan.waits_for_nothing() {
            ANSWERS.with_borrow_mut(|a| a.learn(endpoint, keep_alive, &body, seq));
            write_all(&mut s, render_whole(plan, keep_alive))
                .await
                .is_ok()
        } else {
            play(&mut s, &mut buf, plan, keep_alive).await
        };
        if !open || !keep_alive {
            return;
        }
    }
}

/// The mock's plan for a request body on `endpoint`, its answer ids made from `seq`.
fn plan_for(endpoint: Endpoint, body: &[u8], seq: u64) -> mock::Plan {
    let stream = memchr::memmem::find(body, b"\"stream\":true").is_some()
        || memchr::memmem::find(body, b"\"stream\": true").is_some();
    let model = serde_json::from_slice::<Model>(body)
        .map(|m| m.model)
        .unwrap_or_default();
    mock::plan(endpoint, &model, stream, body, seq, 0)
}

/// The whole answer of a plan that waits for nothing (`Plan::waits_for_nothing`: no delay,
/// no drip, no stall) as the bytes of one write.
fn render_whole(mut plan: mock::Plan, keep_alive: bool) -> BytesMut {
    let (mut out, frames) = begin(&mut plan, keep_alive);
    if plan.streamed {
        for f in frames {
            http1::write_chunk(&mut out, &f);
        }
        http1::write_last_chunk(&mut out);
    }
    out
}

/// The reply's head, and for a reply not streamed its whole body; the frames left to play
/// (none for a reply not streamed).
fn begin(plan: &mut mock::Plan, keep_alive: bool) -> (BytesMut, mock::Frames) {
    let mut frames = plan.take_frames();
    // The gateway asks in HTTP/1.1: keep-alive goes without saying.
    let keep_alive = Persist::KeepAlive.and(keep_alive);
    let mut out = BytesMut::with_capacity(2048);
    let mut fields: Vec<(&str, &[u8])> = vec![("content-type", plan.content_type.as_bytes())];
    fields.extend(plan.extra_headers.iter().map(|(n, v)| (*n, v.as_bytes())));
    if plan.streamed {
        http1::write_response_head(&mut out, plan.status, fields, Framing::Chunked, keep_alive);
        return (out, frames);
    }
    let body: Vec<Bytes> = frames.by_ref().collect();
    let len: usize = body.iter().map(Bytes::len).sum();
    http1::write_response_head(
        &mut out,
        plan.status,
        fields,
        Framing::Length(len as u64),
        keep_alive,
    );
    for f in &body {
        out.extend_from_slice(f);
    }
    (out, frames)
}

thread_local! {
    static ANSWERS: std::cell::RefCell<Answers> = std::cell::RefCell::new(Answers::default());
}

/// Answers already rendered, per thread. A load test sends the same body again and again;
/// rendering its answer (a JSON parse, a `serde_json` value per stream frame) cost the mock
/// ~20 µs per streamed request, which made a single-threaded mock the limit of every
/// streamed load cell. An answer that waits for nothing depends on the request only through
/// the body, the endpoint, keep-alive and the seq in its ids, so it is rendered twice for
/// the seq's width (all ones, all twos): the bytes that differ are where the seq's digits
/// go, and an answer is that rendering with the digits written in — the bytes `play` would
/// have sent (`tests` below compare the two). Bounded: at most `ANSWERS_MAX` renderings,
/// all forgotten when full (a test that sends a new body each time renders each as before).
#[derive(Default)]
struct Answers {
    by_body: std::collections::HashMap<Box<[u8]>, Vec<Answer>>,
    len: usize,
}

const ANSWERS_MAX: usize = 256;

struct Answer {
    endpoint: Endpoint,
    keep_alive: bool,
    /// The width of the seq it was rendered for.
    digits: usize,
    /// The rendering with the seq all ones.
    wire: Bytes,
    /// Where each copy of the seq's digits starts in `wire`.
    seq_at: Box<[usize]>,
}

impl Answers {
    fn find(
        &self,
        endpoint: Endpoint,
        keep_alive: bool,
        digits: usize,
        body: &[u8],
    ) -> Option<&Answer> {
        self.by_body
            .get(body)?
            .iter()
            .find(|a| a.endpoint == endpoint && a.keep_alive == keep_alive && a.digits == digits)
    }

    /// The answer for this request with `seq` written in, when it was rendered before.
    fn answer(
        &self,
        endpoint: Endpoint,
        keep_alive: bool,
        body: &[u8],
        seq: u64,
    ) -> Option<BytesMut> {
        let digits = seq.to_string();
        let digits = digits.as_bytes();
        let a = self.find(endpoint, keep_alive, digits.len(), body)?;
        let mut out = BytesMut::from(&a.wire[..]);
        for &at in &a.seq_at {
            out[at..at + digits.len()].copy_from_slice(digits);
        }
        Some(out)
    }

    /// Renders and keeps the answer to this request for every seq as wide as `seq`, unless
    /// it is kept already, or the renderings do not differ only in whole copies of the seq.
    fn learn(&mut self, endpoint: Endpoint, keep_alive: bool, body: &[u8], seq: u64) {
        let digits = seq.to_string().len();
        if self.find(endpoint, keep_alive, digits, body).is_some() {
            return;
        }
        let Some(answer) = Answer::render(endpoint, keep_alive, digits, body) else {
            return;
        };
        if self.len == ANSWERS_MAX {
            self.by_body.clear();
            self.len = 0;
        }
        self.by_body.entry(body.into()).or_default().push(answer);
        self.len += 1;
    }
}

impl Answer {
    fn render(endpoint: Endpoint, keep_alive: bool, digits: usize, body: &[u8]) -> Option<Answer> {
        // 1…1 and 2…2: every digit differs, so every copy of the seq shows as a run of
        // `digits` differing bytes (a u64 has at most 20 digits; 2…2 fits up to 19).
        let ones = (0..digits).try_fold(0u64, |n, _| n.checked_mul(10)?.checked_add(1))?;
        let whole = |seq| {
            let plan = plan_for(endpoint, body, seq);
            plan.waits_for_nothing()
                .then(|| render_whole(plan, keep_alive))
        };
        let (a, b) = (whole(ones)?, whole(ones.checked_mul(2)?)?);
        if a.len() != b.len() {
            return None;
        }
        let mut seq_at = Vec::new();
        let mut i = 0;
        while i < a.len() {
            if a[i] == b[i] {
                i += 1;
                continue;
            }
            let run = a[i..]
                .iter()
                .zip(&b[i..])
                .take_while(|(x, y)| x != y)
                .count();
            if run != digits || a[i..i + run].iter().any(|&c| c != b'1') {
                return None;
            }
            seq_at.push(i);
            i += run;
        }
        Some(Answer {
            endpoint,
            keep_alive,
            digits,
            wire: a.freeze(),
            seq_at: seq_at.into(),
        })
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
    let (mut out, mut frames) = begin(&mut plan, keep_alive);
    if !plan.streamed {
        return write_all(s, out).await.is_ok();
    }
    let gap = Duration::from_millis(plan.frame_delay_ms);
    if gap.is_zero() {
        // A stall after the frames: they go at once (a plan that waits for nothing is
        // sent whole by `render_whole`).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(stream: bool, text: &str) -> Vec<u8> {
        format!(
            r#"{{"model":"perf/gpt-4o-mini","stream":{stream},"messages":[{{"role":"user","content":"{text}"}}]}}"#
        )
        .into_bytes()
    }

    /// What the mock sends without the table: the plan rendered for this seq.
    fn fresh(endpoint: Endpoint, keep_alive: bool, body: &[u8], seq: u64) -> BytesMut {
        let plan = plan_for(endpoint, body, seq);
        assert!(plan.waits_for_nothing());
        render_whole(plan, keep_alive)
    }

    #[test]
    fn a_known_answer_is_the_bytes_the_plan_renders_for_that_seq() {
        let bodies = [
            (Endpoint::ChatCompletions, chat(true, "Say hello to the load test in a few words please.")),
            (Endpoint::ChatCompletions, chat(false, "Say hello to the load test in a few words please.")),
            // the user's text holds digits and the placeholder's own shapes
            (Endpoint::ChatCompletions, chat(true, "mock-1 mock-11 chatcmpl-111 2 22 1")),
            (Endpoint::Messages, br#"{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi there"}]}"#.to_vec()),
            (Endpoint::Messages, br#"{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#.to_vec()),
            (Endpoint::Responses, br#"{"model":"m","stream":true,"input":"one two three"}"#.to_vec()),
            (Endpoint::Responses, br#"{"model":"m","input":"one two"}"#.to_vec()),
            (Endpoint::Embeddings, br#"{"model":"m","input":"x"}"#.to_vec()),
        ];
        let mut answers = Answers::default();
        for (endpoint, body) in &bodies {
            for keep_alive in [true, false] {
                for seq in [
                    1, 2, 9, 10, 11, 99, 100, 123, 999, 1000, 12_345, 100_000, 999_999,
                ] {
                    answers.learn(*endpoint, keep_alive, body, seq);
                    let known = answers
                        .answer(*endpoint, keep_alive, body, seq)
                        .unwrap_or_else(|| panic!("{endpoint:?} seq {seq}: not kept"));
                    assert_eq!(
                        known,
                        fresh(*endpoint, keep_alive, body, seq),
                        "{endpoint:?} seq {seq}"
                    );
                }
                // a seq wider than the kept widths is rendered afresh (until learnt)
                assert!(
                    answers
                        .answer(*endpoint, keep_alive, body, 1_000_000)
                        .is_none()
                );
            }
        }
        assert!(
            answers
                .answer(Endpoint::Messages, true, &bodies[0].1, 1)
                .is_none(),
            "another endpoint"
        );
    }

    #[test]
    fn timed_and_failing_plans() {
        let mut answers = Answers::default();
        // timed plans are never kept (they are played)
        for model in ["slow-5", "drip-5", "stall"] {
            let body = format!(r#"{{"model":"{model}","stream":true,"messages":[]}}"#);
            answers.learn(Endpoint::ChatCompletions, true, body.as_bytes(), 1);
            assert!(
                answers
                    .answer(Endpoint::ChatCompletions, true, body.as_bytes(), 1)
                    .is_none(),
                "{model}"
            );
        }
        // a failing answer waits for nothing: kept, the same bytes
        let body = br#"{"model":"fail-429","messages":[]}"#;
        answers.learn(Endpoint::ChatCompletions, true, body, 7);
        let known = answers
            .answer(Endpoint::ChatCompletions, true, body, 7)
            .unwrap();
        assert_eq!(known, fresh(Endpoint::ChatCompletions, true, body, 7));
        assert!(known.starts_with(b"HTTP/1.1 429"));
    }

    #[test]
    fn the_table_is_bounded() {
        let mut answers = Answers::default();
        for i in 0..(ANSWERS_MAX + 5) {
            answers.learn(
                Endpoint::ChatCompletions,
                true,
                &chat(false, &format!("body {i}")),
                3,
            );
            assert!(answers.len <= ANSWERS_MAX, "{}", answers.len);
        }
        let last = chat(false, &format!("body {}", ANSWERS_MAX + 4));
        assert!(
            answers
                .answer(Endpoint::ChatCompletions, true, &last, 3)
                .is_some()
        );
    }
}
