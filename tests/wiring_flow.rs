//! Flow-control rules a client sees wrong until issue 9 (items 10–14), through the real
//! binary on two shards: a quota-share combo spreads over the connections that are available
//! (a cooling one takes no turn); an upstream far from its limit (remaining > 50 %) is not
//! paced; `max_wait_ms = 0` at a gate means no wait; a connection's explicit
//! `min_time_between_requests_ms = 0` means no spacing while `max_concurrent` alone does not
//! turn its request queue on; `RATE_LIMIT_AUTO_ENABLE` wins over the file.
//!
//! Item 9 (the queue wedge watchdog's heartbeat) needs a limiter older than 120 s of wall
//! time: it has its own test binary, `tests/queue_wedge.rs`, and an owner-level test with a
//! driven clock (`owners::queue::owner` tests,
//! `a_limiter_older_than_the_wedge_threshold_is_not_wedged_by_its_spacing`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::Duration;

use support::*;

const CHAT: &str = "/v1/chat/completions";

/// One keep-alive client: each request ends (and gives its queue slot back, with what its
/// answer taught) before the next is read, on the same shard.
fn keep_alive(gw: &Gateway) -> Client {
    let mut c = Client::connect(gw.addr());
    c.set_timeout(Duration::from_secs(15));
    c
}

fn chat(c: &mut Client, model: &str) -> Response {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    c.request("POST", CHAT, &[], body.as_bytes())
}

// ---- item 10: quota-share filters unavailable candidates first ----

#[test]
fn a_cooling_connection_takes_no_quota_share_turn_and_the_others_split_evenly() {
    // Three equal-weight targets on three upstreams; `a` refuses with a 5-minute retry hint
    // and so cools down after its first answer.
    let (ma, mb, mc) = (
        MockUpstream::start(),
        MockUpstream::start(),
        MockUpstream::start(),
    );
    ma.on_always(
        CHAT,
        Reply::error(429, "rate limited").header("retry-after", "300"),
    );
    mb.on_always(CHAT, Reply::openai_chat("b"));
    mc.on_always(CHAT, Reply::openai_chat("c"));
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{}{}{}{}\
         [[combos]]\nname = \"share\"\nstrategy = \"quota-share\"\n\
         targets = [\"a/ma\", \"b/mb\", \"c/mc\"]\n",
        provider("a", &ma.base_url(), &["ma"]),
        provider("b", &mb.base_url(), &["mb"]),
        provider("c", &mc.base_url(), &["mc"]),
        connection("ca", "a"),
        connection("cb", "b"),
        connection("cc", "c"),
    );
    let gw = Gateway::start(&toml);
    let mut c = keep_alive(&gw);
    // The first pick is `a` (deficits tie, the earliest wins): it refuses, cools down, and
    // the request fails over.
    let first = chat(&mut c, "share");
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(ma.hits(CHAT), 1);
    // From now on `a` is cooling: the deficit round robin runs over `b` and `c` only.
    let (mut b, mut other) = (0usize, 0usize);
    for _ in 0..60 {
        let r = chat(&mut c, "share");
        assert_eq!(r.status, 200, "{}", r.text());
        match r.header("x-tidegate-provider") {
            Some("b") => b += 1,
            Some("c") => other += 1,
            p => panic!("served by {p:?}"),
        }
    }
    assert_eq!(ma.hits(CHAT), 1, "the cooling connection was tried again");
    // Equal weights alternate, 30/30 (the slack only guards scheduling noise). Letting `a`
    // win its turns and fall to the next in file order gives about 40/20.
    assert!(
        b.abs_diff(other) <= 2,
        "b served {b}, c served {other} of 60"
    );
}

// ---- item 11: learned limits relax ----

#[test]
fn an_upstream_far_from_its_limit_is_not_paced() {
    let mock = MockUpstream::start();
    // 8 of 10 left (> 50 %): relax. Then 5 of 10 (between 10 % and 50 %): the header's
    // spacing, 60000 / 10 − 10 = 5990 ms.
    mock.on(
        CHAT,
        Reply::openai_chat("relaxed")
            .header("x-ratelimit-limit-requests", "10")
            .header("x-ratelimit-remaining-requests", "8"),
    );
    mock.on(CHAT, Reply::openai_chat("plain"));
    mock.on(
        CHAT,
        Reply::openai_chat("paced")
            .header("x-ratelimit-limit-requests", "10")
            .header("x-ratelimit-remaining-requests", "5"),
    );
    mock.on_always(CHAT, Reply::openai_chat("later"));
    // The connection's queue is on (explicit rate), configured without spacing, with a
    // 300 ms queue budget: a spacing learned from the headers would time the next request out.
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        2,
        "[connections.rate_limit_overrides]\nrequests_per_minute = 60000\nmax_wait_ms = 300\n",
        "[resilience.request_queue]\nmin_time_between_requests_ms = 0\n",
    ));
    let mut c = keep_alive(&gw);
    let r = chat(&mut c, "up/m1");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "relaxed");
    let r = chat(&mut c, "up/m1");
    assert_eq!(r.status, 200, "paced after a relaxing answer: {}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "plain");
    let r = chat(&mut c, "up/m1");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "paced");
    // The contrast: half the limit left does pace the next request past its budget.
    let r = chat(&mut c, "up/m1");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("rate_limit_queue_timeout")
    );
    assert_eq!(mock.hits(CHAT), 3, "the paced request reached the upstream");
}

// ---- item 12: max_wait_ms = 0 at a gate ----

#[test]
fn a_contended_gate_with_max_wait_zero_answers_429_at_once() {
    let (mock, gate) = held_then_later();
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        2,
        "max_concurrent = 1\n",
        "[resilience.request_queue]\nmax_wait_ms = 0\n",
    ));
    let addr = gw.addr();
    let mut first = Client::connect(addr);
    first.set_timeout(Duration::from_secs(15));
    first.start_request("POST", CHAT, &[], br#"{"model":"up/m1","messages":[]}"#);
    mock.wait_for_hits(CHAT, 1, Duration::from_secs(10));
    // The account gate is held: a second request does not wait for it.
    let mut second = Client::connect(addr);
    second.set_timeout(Duration::from_secs(5));
    let watch = Stopwatch::start();
    let r = chat(&mut second, "up/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("semaphore_timeout"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert!(
        watch.elapsed() < Duration::from_secs(2),
        "answered after {:?}",
        watch.elapsed()
    );
    assert_eq!(
        mock.hits(CHAT),
        1,
        "the refused request reached the upstream"
    );
    gate.open();
    assert_eq!(first.read_response().status, 200);
    // Uncontended, a zero wait is granted at once.
    let r = eventually(Duration::from_secs(5), "the permit to come back", || {
        let r = chat(&mut second, "up/m1");
        (r.status == 200).then_some(r)
    });
    assert_eq!(r.json()["choices"][0]["message"]["content"], "later");
}

// ---- item 13: min_time_between_requests_ms = 0 per connection; max_concurrent alone ----

#[test]
fn an_explicit_zero_spacing_on_a_connection_means_no_spacing() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    // The global spacing is 3 s; this connection's queue is on (explicit rate) with no
    // spacing of its own and a 300 ms queue budget.
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        2,
        "[connections.rate_limit_overrides]\nrequests_per_minute = 60000\n\
         min_time_between_requests_ms = 0\nmax_wait_ms = 300\n",
        "[resilience.request_queue]\nmin_time_between_requests_ms = 3000\n",
    ));
    let mut c = keep_alive(&gw);
    for i in 0..3 {
        let r = chat(&mut c, "up/m1");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    assert_eq!(mock.hits(CHAT), 3);
}

#[test]
fn max_concurrent_alone_is_a_gate_not_the_request_queue() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    // Were the queue on, its 3 s spacing would time the second request out (300 ms budget).
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        2,
        "[connections.rate_limit_overrides]\nmax_concurrent = 1\n",
        "[resilience.request_queue]\nmin_time_between_requests_ms = 3000\nmax_wait_ms = 300\n",
    ));
    let mut c = keep_alive(&gw);
    for i in 0..3 {
        let r = chat(&mut c, "up/m1");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    assert_eq!(metric(gw.addr(), "tidegate_queue_requests"), 0);
}

// ---- item 14: RATE_LIMIT_AUTO_ENABLE is the kill switch ----

/// Two back-to-back requests to an api-key connection whose queue, when on, spaces starts by
/// 3 s within a 100 ms budget; the second's status tells whether the queue is on.
fn second_status(file_auto_enable: bool, env: &str) -> (u16, Gateway) {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let toml = one_upstream(
        &mock.base_url(),
        2,
        "",
        &format!(
            "[resilience.request_queue]\nauto_enable_api_key_providers = {file_auto_enable}\n\
             min_time_between_requests_ms = 3000\nmax_wait_ms = 100\n"
        ),
    );
    let gw = Gateway::start_with_env(&toml, &[("RATE_LIMIT_AUTO_ENABLE", env)]);
    let mut c = keep_alive(&gw);
    assert_eq!(chat(&mut c, "up/m1").status, 200);
    let r = chat(&mut c, "up/m1");
    if r.status != 200 {
        assert_eq!(
            r.header("x-tidegate-error"),
            Some("rate_limit_queue_timeout")
        );
    }
    (r.status, gw)
}

/// The operator is told that the file's value does not apply.
fn names_the_override(gw: &Gateway, file_value: bool) {
    gw.wait_for_log(
        &format!(
            "resilience.request_queue.auto_enable_api_key_providers = {file_value} in the file \
             is overridden by RATE_LIMIT_AUTO_ENABLE"
        ),
        Duration::from_secs(5),
    );
}

#[test]
fn rate_limit_auto_enable_off_wins_over_the_file() {
    let (status, gw) = second_status(true, "off");
    assert_eq!(status, 200, "the queue stayed on");
    names_the_override(&gw, true);
}

#[test]
fn rate_limit_auto_enable_on_wins_over_the_file() {
    let (status, gw) = second_status(false, "true");
    assert_eq!(status, 503, "the queue stayed off");
    names_the_override(&gw, false);
}
