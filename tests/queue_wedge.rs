//! Issue 9 item 9 through the real binary: a request queue older than the wedge threshold
//! (120 s, not a setting) whose head only waits out a learned spacing is not "wedged". The
//! head gets its own queue timeout, never 503 `rate_limit_queue_wedged`.
//!
//! The threshold is wall-clock time the binary has no way to skip, so this file's one test
//! lets ~125 s pass between two requests (its own test binary, so nothing else waits on it).
//! The owner-level test with a driven clock is
//! `owners::queue::owner::tests::a_limiter_older_than_the_wedge_threshold_is_not_wedged_by_its_spacing`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::{Duration, Instant};

use support::*;

const CHAT: &str = "/v1/chat/completions";
/// The watchdog's threshold (`flow::queue::limiter::WEDGE_AFTER_MS`) plus a margin.
const PAST_THE_WEDGE_THRESHOLD: Duration = Duration::from_secs(125);

fn chat(gw: &Gateway) -> Response {
    let mut c = Client::connect(gw.addr());
    c.set_timeout(Duration::from_secs(30));
    c.request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    )
}

#[test]
fn an_old_queue_waiting_out_its_spacing_is_not_wedged() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::openai_chat("first"));
    // One request a minute: the next start is spaced ~60 s after this one.
    mock.on(
        CHAT,
        Reply::openai_chat("second").header("x-ratelimit-limit-requests", "1"),
    );
    mock.on_always(CHAT, Reply::openai_chat("later"));
    // The queue is on (explicit rate) with no configured spacing and a 10 s queue budget:
    // the watchdog (every 5 s on the owner) surely looks while the third request waits.
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        2,
        "[connections.rate_limit_overrides]\nrequests_per_minute = 60000\nmax_wait_ms = 10000\n",
        "[resilience.request_queue]\nmin_time_between_requests_ms = 0\n",
    ));
    // The queue is created here and serves its first request.
    let created = Instant::now();
    assert_eq!(chat(&gw).status, 200);
    std::thread::sleep(PAST_THE_WEDGE_THRESHOLD.saturating_sub(created.elapsed()));
    // Past the threshold: the second starts at once and teaches the one-a-minute spacing.
    let r = chat(&gw);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "second");
    // The third cannot start before ~60 s, past its 10 s budget: it waits at the head of
    // the queue, and the queue's last start was a moment ago. Not a wedge: its own timeout.
    let r = chat(&gw);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("rate_limit_queue_timeout"),
        "{}",
        r.text()
    );
    assert_eq!(mock.hits(CHAT), 2, "the third never reached the upstream");
}
