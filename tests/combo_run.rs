//! How a combo runs (issue 10, items 1–7), through the real binary on two shards with
//! scripted upstreams: the config cascade, retries and failover order, request-shape
//! errors, timeouts, set retries, the combo cooldown wait, the terminal answers, nested
//! combos. Each test asserts the status, the body, the headers and what the upstreams saw
//! (how many attempts, and the gaps between them).

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

fn body(model: &str) -> Vec<u8> {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#).into_bytes()
}

fn ask(addr: std::net::SocketAddr, model: &str) -> Response {
    let mut c = Client::connect(addr);
    c.set_timeout(secs(30));
    c.request("POST", CHAT, &[], &body(model))
}

fn served_by(r: &Response) -> &str {
    r.header("x-omniroute-selected-connection-id").unwrap_or("")
}

/// The access-log line of the request with the id `id`.
fn access_line(gw: &Gateway, id: &str) -> String {
    eventually(secs(5), "the access line", || {
        gw.logs()
            .lines()
            .find(|l| l.contains("access") && l.contains(&format!("request_id={id} ")))
            .map(str::to_owned)
    })
}

/// The access-log line of the request `r` answered.
fn line_of(gw: &Gateway, r: &Response) -> String {
    access_line(gw, r.header("x-request-id").expect("a request id"))
}

/// Asserts `line` holds each of `fields`.
fn has(line: &str, fields: &[&str]) {
    for f in fields {
        assert!(line.contains(f), "{f} missing from {line}");
    }
}

/// The gap between the `i`-th and `j`-th requests `mock` saw.
fn gap(mock: &MockUpstream, i: usize, j: usize) -> Duration {
    let reqs = mock.requests_to(CHAT);
    reqs[j].at.duration_since(reqs[i].at)
}

/// Two providers, `p` (models a, b) and `q` (model x), one connection each (`cp`, `cq`),
/// and the combo `duo` = p/a then q/x; `extra` is appended (combo config, resilience).
fn two(p: &MockUpstream, q: &MockUpstream, combo_config: &str, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{pp}{qq}
[[connections]]
id = "cp"
provider = "p"

[[connections]]
id = "cq"
provider = "q"

[[combos]]
name = "duo"
targets = ["p/a", "q/x"]

[combos.config]
{combo_config}

{extra}
"#,
        pp = provider("p", &p.base_url(), &["a", "b"]),
        qq = provider("q", &q.base_url(), &["x"]),
    )
}

fn started(p: &MockUpstream, q: &MockUpstream, combo_config: &str, extra: &str) -> Gateway {
    let gw = Gateway::start(&two(p, q, combo_config, extra));
    assert_eq!(gw.shards(), 2);
    gw
}

// ---------------------------------------------------------------------------------------
// Retries and failover order

#[test]
fn a_429_with_retry_after_is_retried_on_the_primary_no_sooner_than_asked() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "2"),
    );
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = started(
        &p,
        &q,
        "failover_before_retry = false\nmax_retries = 2\nretry_delay_ms = 100",
        "",
    );
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cp");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "from p");
    assert_eq!(r.header("x-tidegate-provider"), Some("p"));
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(p.hits(CHAT), 2);
    assert_eq!(
        q.hits(CHAT),
        0,
        "the primary is retried before any failover"
    );
    let g = gap(&p, 0, 1);
    assert!(
        g >= ms(2000),
        "retried after {g:?}, sooner than Retry-After: 2"
    );
}

#[test]
fn a_retry_delay_ends_at_the_request_deadline() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(CHAT, Reply::error(500, "boom"));
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    // The primary is to be retried after 30 s, but the request has 3 s in all: the wait
    // ends with the deadline and the answer is the deadline's, not a retry 30 s later.
    // (3 s, not less: the first attempt must reach p inside the deadline on a loaded
    // machine too, or nothing is retried at all.)
    let config = two(
        &p,
        &q,
        "failover_before_retry = false\nmax_retries = 2\nretry_delay_ms = 30000",
        "",
    )
    .replace("workers = 2\n", "workers = 2\nrequest_timeout_ms = 3000\n");
    let gw = Gateway::start(&config);
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "duo");
    let took = clock.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "request_timeout", "{}", r.text());
    assert!(took >= ms(2900) && took < secs(20), "{took:?}");
    assert_eq!(p.hits(CHAT), 1, "no retry after the deadline");
    assert_eq!(q.hits(CHAT), 0, "nothing sent after the deadline");
}

#[test]
fn a_500_then_200_primary_is_retried_once_and_serves() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(CHAT, Reply::error(500, "boom"));
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    // The provider override of p sets the order; the combo's own table the delay.
    let gw = started(
        &p,
        &q,
        "retry_delay_ms = 600",
        "[combo_defaults]\nfailover_before_retry = true\nretry_delay_ms = 5000\n\n\
         [combo_provider_overrides.p]\nfailover_before_retry = false\n",
    );
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cp");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "from p");
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (2, 0));
    // Not before retry_delay_ms, nor before the transient lock p/a's 500 took (the apikey
    // base cooldown, 3 s); the combo's own retry_delay_ms (not 5 s) wins.
    let g = gap(&p, 0, 1);
    assert!(g >= ms(600), "retry_delay_ms is 600: {g:?}");
    assert!(g < ms(5000), "the combo's own retry_delay_ms wins: {g:?}");
}

#[test]
fn with_failover_before_retry_the_fallback_serves_first() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(CHAT, Reply::error(500, "boom"));
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    // The default: failover_before_retry = true.
    let gw = started(&p, &q, "", "");
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cq");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "from q");
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 1));
    // The fallback at once (fallback_delay_ms 0), not after the 2 s retry delay.
    let g = q.requests_to(CHAT)[0]
        .at
        .duration_since(p.requests_to(CHAT)[0].at);
    assert!(g < ms(2000), "{g:?}");
}

#[test]
fn when_every_target_fails_once_each_is_retried_once_after_the_delay() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(CHAT, Reply::error(500, "boom"));
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on_always(CHAT, Reply::error(500, "boom"));
    let gw = started(&p, &q, "retry_delay_ms = 400", "");
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cp");
    assert_eq!(r.header("x-tidegate-attempts"), Some("3"));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (2, 1));
    // p, q, then p again no sooner than retry_delay_ms after q.
    let q_at = q.requests_to(CHAT)[0].at;
    let p_again = p.requests_to(CHAT)[1].at;
    assert!(p_again.duration_since(q_at) >= ms(400));
}

#[test]
fn set_retries_rerun_the_whole_set_after_the_set_delay() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(CHAT, Reply::error(500, "boom"));
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on_always(CHAT, Reply::error(502, "bad gateway"));
    let gw = started(
        &p,
        &q,
        "max_retries = 0\nmax_set_retries = 1\nset_retry_delay_ms = 700",
        "",
    );
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (2, 1));
    let q_at = q.requests_to(CHAT)[0].at;
    let p_again = p.requests_to(CHAT)[1].at;
    assert!(p_again.duration_since(q_at) >= ms(700));
}

// ---------------------------------------------------------------------------------------
// Request-shape errors

#[test]
fn a_context_length_400_is_never_resent_and_the_fallback_serves() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(
        CHAT,
        Reply::error(400, "This model's maximum context length is 8192 tokens"),
    );
    q.on_always(CHAT, Reply::openai_chat("from q"));
    // Retries first, and a second connection of p: neither re-sends the request to p/a.
    let mut config = two(&p, &q, "failover_before_retry = false\nmax_retries = 3", "");
    config.push_str("\n[[connections]]\nid = \"cp2\"\nprovider = \"p\"\n");
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cq");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "from q");
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(p.hits(CHAT), 1, "the invalid request is sent to p/a once");
    assert_eq!(q.hits(CHAT), 1);
}

#[test]
fn a_content_filter_400_is_returned_to_the_client_as_is() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    let filtered = serde_json::json!({"error": {
        "message": "The response was filtered due to the prompt triggering our content management policy",
        "type": "invalid_request_error", "code": "content_filter"}});
    p.on_always(CHAT, Reply::json(400, filtered.clone()));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = started(&p, &q, "", "");
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json(), filtered);
    assert_eq!(
        r.header("x-tidegate-error"),
        None,
        "the upstream's own answer"
    );
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 0));
}

#[test]
fn three_targets_failing_with_the_identical_request_shape_error_stop_the_loop() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    let too_long = "This model's maximum context length is 8192 tokens";
    p.on_always(CHAT, Reply::error(400, too_long));
    q.on_always(CHAT, Reply::error(400, too_long));
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}\
         [[connections]]\nid = \"cp\"\nprovider = \"p\"\n\n\
         [[connections]]\nid = \"cq\"\nprovider = \"q\"\n\n\
         [[combos]]\nname = \"four\"\ntargets = [\"p/a\", \"p/b\", \"q/x\", \"q/y\"]\n",
        provider("p", &p.base_url(), &["a", "b"]),
        provider("q", &q.base_url(), &["x", "y"]),
    );
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "four");
    assert_eq!(
        r.status,
        400,
        "every target called it invalid: {}",
        r.text()
    );
    assert!(r.text().contains("maximum context length"), "{}", r.text());
    assert_eq!(r.header("x-tidegate-attempts"), Some("3"));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (2, 1), "q/y is never tried");
}

// ---------------------------------------------------------------------------------------
// Hedging

#[test]
fn hedging_a_primary_that_stalls_before_its_head_loses_to_the_fallback() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::stall_before_head());
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = started(&p, &q, "hedging = true\nhedge_delay_ms = 600", "");
    let clock = Stopwatch::start();
    let sent = std::time::Instant::now();
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cq");
    assert!(r.text().contains("from q"));
    assert!(clock.elapsed() < secs(5), "{:?}", clock.elapsed());
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 1));
    // The hedge delay runs from the first attempt's start, which is after the send; the
    // mock may read that attempt late on a loaded machine, so the hedge is measured from
    // the send, not from p's arrival.
    let started_after = q.requests_to(CHAT)[0].at.duration_since(sent);
    assert!(started_after >= ms(600), "{started_after:?}");
    // The stalled attempt is cancelled: the primary's upstream sees the hang-up.
    p.wait_until(secs(5), "the stalled attempt's connection to close", |m| {
        m.open_connections() == 0
    });
    // The loser took no penalty: the next request goes to p first again.
    p.on_always(CHAT, Reply::openai_chat("from p"));
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cp", "{}", r.text());
}

#[test]
fn hedging_starts_no_second_target_when_the_first_answers_in_time() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::openai_chat("from p").delay_ms(50));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    // A 50 ms answer against a 10 s hedge delay: in time even on a loaded machine.
    let gw = started(&p, &q, "hedging = true\nhedge_delay_ms = 10000", "");
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cp");
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 0));
}

/// A client that hangs up while both hedged attempts wait for their heads: the access
/// line names the one started last.
#[test]
fn a_client_gone_during_a_hedge_race_logs_the_candidate_started_last() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::stall_before_head());
    q.on_always(CHAT, Reply::stall_before_head());
    let gw = started(&p, &q, "hedging = true\nhedge_delay_ms = 200", "");
    let mut c = Client::connect(gw.addr());
    c.start_request("POST", CHAT, &[("x-request-id", "gone-1")], &body("duo"));
    p.wait_for_hits(CHAT, 1, secs(10));
    q.wait_for_hits(CHAT, 1, secs(10));
    drop(c);
    has(
        &access_line(&gw, "gone-1"),
        &["combo=duo", "provider=q connection=cq attempts=2"],
    );
}

// ---------------------------------------------------------------------------------------
// Timeouts

#[test]
fn a_target_that_sends_no_head_within_target_timeout_ms_fails_over() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::stall_before_head());
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = started(&p, &q, "target_timeout_ms = 1000\nmax_retries = 0", "");
    let clock = Stopwatch::start();
    // The target timeout starts once the gateway has the request, which is after it was
    // sent; the mock may read the first try later than that on a loaded machine, so the
    // second try is measured from the send, not from the first try's arrival.
    let sent = std::time::Instant::now();
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cq");
    let q_at = q.requests_to(CHAT)[0].at;
    assert_eq!(p.hits(CHAT), 1);
    assert!(q_at.duration_since(sent) >= ms(1000));
    assert!(clock.elapsed() < secs(10));
}

#[test]
fn combo_timeout_ms_ends_the_request_with_504_combo_timeout() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::stall_before_head());
    q.on_always(CHAT, Reply::stall_before_head());
    let gw = started(
        &p,
        &q,
        // q is tried once p's 2 s target timeout ends and is still waiting when the
        // combo's 3 s end: a second either side, so a loaded machine keeps the order.
        "combo_timeout_ms = 3000\ntarget_timeout_ms = 2000",
        "",
    );
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "duo");
    let took = clock.elapsed();
    assert_eq!(r.status, 504, "{}", r.text());
    let body = r.json();
    assert_eq!(body["error"]["code"], "COMBO_TIMEOUT", "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Combo global timeout (3000ms) after 2/2 targets | tried: a ("),
        "{message}"
    );
    assert_eq!(body["diagnostics"]["terminalReason"], "combo_timeout");
    assert_eq!(
        r.header("x-omniroute-combo-terminal-reason"),
        Some("combo_timeout")
    );
    assert!(took >= ms(3000) && took < secs(10), "{took:?}");
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 1));
    // The combo's own answer names the last candidate tried in its access line.
    has(
        &line_of(&gw, &r),
        &[
            "combo=duo",
            "provider=q connection=cq attempts=2 status=504",
        ],
    );
}

// ---------------------------------------------------------------------------------------
// The combo cooldown wait (B §3.3)

/// Combo target failures lock the model for at least 5 s (the upstream's hint when longer).
const LOCKOUT: &str = "[resilience.model_lockout]\nenabled = true\nbase_cooldown_ms = 5000\n";

#[test]
fn when_both_targets_are_briefly_locked_the_request_waits_and_succeeds() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "1"),
    );
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "1"),
    );
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = started(
        &p,
        &q,
        "max_retries = 0",
        &format!("{LOCKOUT}[resilience.combo_cooldown_wait]\nmax_wait_ms = 8000\n"),
    );
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "duo");
    let took = clock.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cp");
    assert_eq!(r.json()["choices"][0]["message"]["content"], "from p");
    assert_eq!(r.header("x-tidegate-attempts"), Some("3"));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (2, 1));
    let g = gap(&p, 0, 1);
    assert!(g >= ms(4900), "waited for the lock: {g:?}");
    assert!(took < ms(8000), "inside max_wait_ms: {took:?}");
}

#[test]
fn a_lock_longer_than_max_wait_ms_is_not_waited_and_the_answer_says_cooling() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "1"),
    );
    q.on_always(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "1"),
    );
    let gw = started(
        &p,
        &q,
        "max_retries = 0",
        &format!("{LOCKOUT}[resilience.combo_cooldown_wait]\nmax_wait_ms = 2000\n"),
    );
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "duo");
    assert_eq!(
        r.status,
        429,
        "one class of failure: the last answer: {}",
        r.text()
    );
    assert!(clock.elapsed() < ms(4000));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 1));
    // The next request finds both locked and is told so, with the headers.
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json();
    assert_eq!(body["error"]["code"], "all_targets_cooling_down", "{body}");
    assert_eq!(body["error"]["type"], "service_unavailable");
    let excluded = body["diagnostics"]["excluded"].as_array().unwrap();
    let listed: Vec<(String, String, String)> = excluded
        .iter()
        .map(|e| {
            (
                e["provider"].as_str().unwrap().to_owned(),
                e["model"].as_str().unwrap().to_owned(),
                e["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("p".into(), "a".into(), "model_lockout".into()),
            ("q".into(), "x".into(), "model_lockout".into())
        ]
    );
    assert_eq!(body["diagnostics"]["poolSize"], 2);
    assert_eq!(body["diagnostics"]["attempted"], 0);
    assert_eq!(
        body["diagnostics"]["terminalReason"],
        "all_targets_cooling_down"
    );
    assert_eq!(body["recovery_hint"]["action"], "wait");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry), "{retry}");
    assert_eq!(body["recovery_hint"]["retry_after_seconds"], retry);
    assert_eq!(r.header("x-omniroute-combo-pool-size"), Some("2"));
    assert_eq!(r.header("x-omniroute-combo-attempted"), Some("0"));
    assert_eq!(
        r.header("x-omniroute-combo-excluded"),
        Some("p/a:model_lockout,q/x:model_lockout")
    );
    assert_eq!(
        r.header("x-omniroute-combo-terminal-reason"),
        Some("all_targets_cooling_down")
    );
    assert_eq!(r.header("x-omniroute-recovery-action"), Some("wait"));
    assert!(r.header("x-omniroute-recovery-next-step").is_some());
    assert_eq!(
        r.header("x-omniroute-retry-after-seconds"),
        Some(retry.to_string().as_str())
    );
    assert_eq!(
        (p.hits(CHAT), q.hits(CHAT)),
        (1, 1),
        "nothing was attempted"
    );
    // No candidate was tried: the access line names none.
    has(
        &line_of(&gw, &r),
        &["provider=- connection=- attempts=0 status=503"],
    );
}

#[test]
fn a_single_provider_combo_whose_targets_all_cool_answers_all_targets_cooling_down() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::error(503, "overloaded"));
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}\
         [[connections]]\nid = \"cp\"\nprovider = \"p\"\n\n\
         [[combos]]\nname = \"solo\"\ntargets = [\"p/a\", \"p/b\"]\n\n\
         [combos.config]\nmax_retries = 0\n\n{LOCKOUT}\
         [resilience.combo_cooldown_wait]\nenabled = false\n",
        provider("p", &p.base_url(), &["a", "b"]),
        provider("q", &q.base_url(), &["x"]),
    );
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "solo");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(p.hits(CHAT), 2);
    let r = ask(gw.addr(), "solo");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.json()["error"]["code"],
        "all_targets_cooling_down",
        "{}",
        r.text()
    );
    assert!(r.header("retry-after").is_some());
    assert_eq!(p.hits(CHAT), 2);
}

#[test]
fn a_quota_exhausted_lock_is_never_waited_on() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    // A combo target's 403 locks its model as quota_exhausted (B §9.0).
    let quota = "daily quota exhausted for this model";
    p.on_always(CHAT, Reply::error(403, quota).header("retry-after", "1"));
    q.on_always(CHAT, Reply::error(403, quota).header("retry-after", "1"));
    let gw = started(&p, &q, "max_retries = 0", LOCKOUT);
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "duo");
    assert_eq!(
        r.status,
        403,
        "one class of failure: the last answer: {}",
        r.text()
    );
    assert!(r.text().contains(quota), "{}", r.text());
    assert!(clock.elapsed() < ms(4000), "no wait: {:?}", clock.elapsed());
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 1));
    // Both are locked (so a wait was possible) and the next request is not held either.
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "all_targets_cooling_down");
    assert!(clock.elapsed() < ms(4000));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 1));
}

#[test]
fn a_client_that_hangs_up_during_the_wait_causes_no_upstream_call() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "1"),
    );
    p.on_always(CHAT, Reply::openai_chat("from p"));
    q.on(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "1"),
    );
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = started(&p, &q, "max_retries = 0", LOCKOUT);
    let before = metric(
        gw.addr(),
        "tidegate_requests_abandoned_total{phase=\"admission\"}",
    );
    let mut c = Client::connect(gw.addr());
    c.start_request("POST", CHAT, &[("x-request-id", "left-1")], &body("duo"));
    // Both targets answered 429; the request now waits for the locks. The client leaves.
    // (Once both answers are classified: a hang-up while an attempt still waits for its
    // answer is abandoned{phase="response"}, not the combo wait.)
    p.wait_for_hits(CHAT, 1, secs(10));
    q.wait_for_hits(CHAT, 1, secs(10));
    eventually(secs(10), "both 429s to be classified", || {
        (upstream_errors(gw.addr()) >= 2).then_some(())
    });
    drop(c);
    eventually(secs(10), "the wait to be abandoned", || {
        (metric(
            gw.addr(),
            "tidegate_requests_abandoned_total{phase=\"admission\"}",
        ) > before)
            .then_some(())
    });
    gw.wait_for_log("client hung up during a combo wait", secs(5));
    // Its access line names the last candidate tried.
    has(
        &access_line(&gw, "left-1"),
        &["provider=q connection=cq attempts=2"],
    );
    // A new request finds both targets still locked before any dispatch (#16319): it
    // waits for the shorter lock and is served. The abandoned request, whose wait ended
    // at about the same time, sent nothing: p saw this request's one attempt only.
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cp");
    assert_eq!(r.header("x-tidegate-attempts"), Some("1"));
    assert!(clock.elapsed() < secs(8));
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (2, 1));
}

#[test]
fn a_combo_behind_an_open_breaker_waits_for_the_probe_time_and_is_served() {
    // A port that refuses connections yet: the first request's connect failure opens the
    // provider breaker (threshold 1, reset 2 s). Then a mock takes the port (the same
    // socket, now listening: no other process can take the port in between).
    let port = RefusingPort::new();
    let addr = port.addr();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n\
         [[providers]]\nid = \"up\"\nformat = \"openai\"\nbase_url = \"http://{addr}/v1\"\n\
         models = [\"m1\"]\n\n\
         [[connections]]\nid = \"c1\"\nprovider = \"up\"\ndisable_cooling = true\n\n\
         [[combos]]\nname = \"solo\"\ntargets = [\"up/m1\"]\n\
         [combos.config]\nmax_retries = 0\n\n\
         [resilience.provider_breaker.apikey]\nfailure_threshold = 1\nreset_timeout_ms = 2000\n"
    );
    let gw = Gateway::start(&config);
    // The breaker opens after this clock starts, so its probe time is 2 s or more after.
    let before_the_failure = Stopwatch::start();
    let r = ask(gw.addr(), "solo");
    assert_eq!(r.status, 503, "{}", r.text());
    let mock = MockUpstream::start_on(port.listen());
    mock.on_always(CHAT, Reply::openai_chat("after the probe time"));
    // Nothing can be attempted now (the breaker is open): the combo waits for its probe
    // time instead of answering all_targets_cooling_down, then is served by the probe.
    // Measured from before the failure, not from this request's send: a loaded machine
    // may take a while to get here, and the wait left is then shorter (it still ends at
    // the probe time).
    let clock = Stopwatch::start();
    let r = ask(gw.addr(), "solo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("after the probe time"));
    assert!(
        before_the_failure.elapsed() >= ms(1900),
        "served before the probe time: {:?} after the failure, {:?} after the send",
        before_the_failure.elapsed(),
        clock.elapsed()
    );
    assert!(clock.elapsed() < secs(10), "{:?}", clock.elapsed());
    assert_eq!(mock.hits(CHAT), 1);
}

// ---------------------------------------------------------------------------------------
// Terminal answers

#[test]
fn mixed_failure_classes_become_a_5xx_naming_each_class() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::error(500, "boom"));
    q.on_always(
        CHAT,
        Reply::error(400, "This model's maximum context length is 8192 tokens"),
    );
    // A set retry re-sends to p/a (its connection never cools here), never to q/x, which
    // called the request invalid.
    let config = two(
        &p,
        &q,
        "max_retries = 0\nmax_set_retries = 1\nset_retry_delay_ms = 0",
        "",
    )
    .replace(
        "provider = \"p\"\n",
        "provider = \"p\"\ndisable_cooling = true\n",
    );
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 502, "{}", r.text());
    let body = r.json();
    assert_eq!(body["error"]["code"], "all_targets_failed", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("server_error (p/a 500)")
            && message.contains("context_overflow (q/x 400)"),
        "{message}"
    );
    assert!(
        !message.contains("cp") && !message.contains("cq"),
        "{message}"
    );
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (2, 1));
    // The set retry's p/a was the last candidate tried.
    has(
        &line_of(&gw, &r),
        &["provider=p connection=cp attempts=3 status=502"],
    );
}

#[test]
fn targets_that_never_answer_give_all_accounts_inactive() {
    // Two ports that refuse every connection for the whole test (held, never listening):
    // every attempt fails to connect, no status comes back.
    let (dead_p, dead_q) = (RefusingPort::new(), RefusingPort::new());
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}\
         [[connections]]\nid = \"cp\"\nprovider = \"p\"\n\n\
         [[connections]]\nid = \"cq\"\nprovider = \"q\"\n\n\
         [[combos]]\nname = \"duo\"\ntargets = [\"p/a\", \"q/x\"]\n",
        provider("p", &dead_p.base_url(), &["a"]),
        provider("q", &dead_q.base_url(), &["x"]),
    );
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json();
    assert_eq!(body["error"]["code"], "ALL_ACCOUNTS_INACTIVE", "{body}");
    assert_eq!(body["error"]["type"], "service_unavailable");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Service temporarily unavailable: all upstream accounts are inactive"),
        "{body}"
    );
    assert_eq!(body["diagnostics"]["attempted"], 2, "{body}");
    assert_eq!(
        r.header("x-omniroute-combo-terminal-reason"),
        Some("all_accounts_inactive")
    );
    let line = line_of(&gw, &r);
    assert!(
        line.contains("provider=p connection=cp") || line.contains("provider=q connection=cq"),
        "the last candidate tried is named: {line}"
    );
    has(&line, &["status=503"]);
}

#[test]
fn a_combo_whose_connections_are_all_terminal_has_no_executable_targets() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    // An OAuth 403 nobody recognises bans the connection (A §3.6).
    p.on_always(CHAT, Reply::error(403, "You are not allowed to do that"));
    q.on_always(CHAT, Reply::error(403, "You are not allowed to do that"));
    let config = two(&p, &q, "max_retries = 0", "").replace(
        "format = \"openai\"\n",
        "format = \"openai\"\nauth = \"oauth\"\n",
    );
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 403, "{}", r.text());
    let r = eventually(secs(5), "both connections terminal", || {
        let r = ask(gw.addr(), "duo");
        (r.status == 404).then_some(r)
    });
    let body = r.json();
    assert_eq!(body["error"]["code"], "no_executable_targets", "{body}");
    assert_eq!(body["error"]["message"], "Combo has no executable targets");
    assert_eq!(body["recovery_hint"]["action"], "switch-combo");
    assert_eq!(
        r.header("x-omniroute-recovery-action"),
        Some("switch-combo")
    );
    assert_eq!(body["diagnostics"]["excluded"].as_array().unwrap().len(), 2);
    assert_eq!((p.hits(CHAT), q.hits(CHAT)), (1, 1));
    has(
        &line_of(&gw, &r),
        &["provider=- connection=- attempts=0 status=404"],
    );
}

#[test]
fn the_attempt_cap_answers_max_attempts_exceeded() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::error(500, "boom"));
    q.on_always(CHAT, Reply::error(500, "boom"));
    // Connections that never cool take no transient lock: every retry reaches them.
    let config = two(
        &p,
        &q,
        "max_retries = 10\nretry_delay_ms = 0\nmax_set_retries = 10\nset_retry_delay_ms = 0",
        "",
    )
    .replace(
        "provider = \"p\"\n",
        "provider = \"p\"\ndisable_cooling = true\n",
    )
    .replace(
        "provider = \"q\"\n",
        "provider = \"q\"\ndisable_cooling = true\n",
    );
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "duo");
    assert_eq!(r.status, 503, "{}", r.text());
    let body = r.json();
    assert_eq!(body["error"]["code"], "max_attempts_exceeded", "{body}");
    assert_eq!(
        body["error"]["message"],
        "Maximum combo retry limit reached"
    );
    assert_eq!(p.hits(CHAT) + q.hits(CHAT), 64);
    let line = line_of(&gw, &r);
    assert!(
        line.contains("provider=p connection=cp") || line.contains("provider=q connection=cq"),
        "the last candidate tried is named: {line}"
    );
    has(&line, &["attempts=64 status=503"]);
}

// ---------------------------------------------------------------------------------------
// Nested combos

#[test]
fn a_nested_combo_is_flattened_in_place() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    p.on_always(CHAT, Reply::error(500, "boom"));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}\
         [[connections]]\nid = \"cp\"\nprovider = \"p\"\n\n\
         [[connections]]\nid = \"cq\"\nprovider = \"q\"\n\n\
         [[combos]]\nname = \"outer\"\ntargets = [{{ combo = \"inner\" }}, \"q/x\"]\n\
         [combos.config]\nmax_retries = 0\n\n\
         [[combos]]\nname = \"inner\"\ntargets = [\"p/a\", \"p/b\"]\n",
        provider("p", &p.base_url(), &["a", "b"]),
        provider("q", &q.base_url(), &["x"]),
    );
    let gw = Gateway::start(&config);
    let r = ask(gw.addr(), "outer");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "cq");
    let models: Vec<String> = p
        .requests_to(CHAT)
        .iter()
        .map(|r| r.json()["model"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(models, ["a", "b"], "inner's targets, in place, before q/x");
}

#[test]
fn combo_cycles_and_deep_nesting_are_config_errors() {
    let base = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                models = [\"a\"]\n\n[[connections]]\nid = \"cp\"\nprovider = \"p\"\n\n";
    let cycle = format!(
        "{base}[[combos]]\nname = \"x\"\ntargets = [{{ combo = \"y\" }}]\n\n\
         [[combos]]\nname = \"y\"\ntargets = [{{ combo = \"x\" }}, \"p/a\"]\n"
    );
    let (code, _out, err) = run_check(&cycle);
    assert_ne!(code, 0);
    assert!(
        err.contains(
            "combos[0].targets: combo references form a cycle or nest past 10: x -> y -> x"
        ),
        "{err}"
    );
    let deep = format!(
        "{base}[[combos]]\nname = \"c1\"\ntargets = [{{ combo = \"c2\" }}]\n\n\
         [[combos]]\nname = \"c2\"\ntargets = [{{ combo = \"c3\" }}]\n\n\
         [[combos]]\nname = \"c3\"\ntargets = [{{ combo = \"c4\" }}]\n\n\
         [[combos]]\nname = \"c4\"\ntargets = [\"p/a\"]\n"
    );
    let (code, _out, err) = run_check(&deep);
    assert_ne!(code, 0);
    assert!(
        err.contains("combos[0].targets: combo \"c1\" nests 4 levels deep; max_combo_depth is 3"),
        "{err}"
    );
    // Raised in [combo_defaults], the same nesting is accepted.
    let (code, _out, err) = run_check(&format!("{deep}\n[combo_defaults]\nmax_combo_depth = 4\n"));
    assert_eq!(code, 0, "{err}");
}

#[test]
fn every_bad_cascade_key_is_one_problem_line() {
    let text = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                models = [\"a\"]\n\n[[connections]]\nid = \"cp\"\nprovider = \"p\"\n\n\
                [[combos]]\nname = \"c\"\ntargets = [\"p/a\"]\n\
                [combos.config]\nqueue_depth = 101\nhedge_delay_ms = 0\n\n\
                [combo_defaults]\nmax_retries = 11\n\n\
                [combo_provider_overrides.nope]\nconcurrency_per_model = 33\n";
    let (code, _out, err) = run_check(text);
    assert_ne!(code, 0);
    for line in [
        "combos[0].config.queue_depth: 101 is out of range (0..=100)",
        "combos[0].config.hedge_delay_ms: 0 is out of range (1..=60000)",
        "combo_defaults.max_retries: 11 is out of range (0..=10)",
        "combo_provider_overrides.nope: unknown provider \"nope\"",
        "combo_provider_overrides.nope.concurrency_per_model: 33 is out of range (1..=32)",
    ] {
        assert!(err.contains(line), "missing {line:?} in:\n{err}");
    }
}

/// Every failed upstream attempt the gateway has classified, over all error types.
fn upstream_errors(addr: std::net::SocketAddr) -> u64 {
    let r = Client::connect(addr).request("GET", "/metrics", &[], b"");
    r.text()
        .lines()
        .filter(|l| l.starts_with("tidegate_upstream_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<u64>().ok())
        .sum()
}

// -- round-robin semaphore (B §2.2) and ALL_TARGETS_SKIPPED (B §3.4) -------------------

/// `duo` plus the round-robin combo `rr` (p/a then q/x) with the given semaphore keys. Its
/// rotation is held at the first target (a sticky limit no test reaches), so on either shard
/// every request starts at p/a: these tests are about the semaphore, and the rotation's own
/// tests are in `tests/combo_strategies.rs`.
fn round_robin(p: &MockUpstream, q: &MockUpstream, targets: &str, keys: &str) -> Gateway {
    let extra = format!(
        "[[combos]]\nname = \"rr\"\nstrategy = \"round-robin\"\ntargets = {targets}\n\n\
         [combos.config]\nsticky_round_robin_limit = 10000\n{keys}\n"
    );
    started(p, q, "", &extra)
}

fn ask_in_thread(
    addr: std::net::SocketAddr,
    model: &'static str,
) -> std::thread::JoinHandle<Response> {
    std::thread::spawn(move || ask(addr, model))
}

#[test]
fn a_busy_round_robin_semaphore_skips_to_the_next_target_then_answers_all_targets_skipped() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    let (gp, gq) = (Gate::new(), Gate::new());
    p.on(CHAT, Reply::openai_chat("held-p").wait_for(&gp));
    p.on_always(CHAT, Reply::openai_chat("from-p"));
    q.on(CHAT, Reply::openai_chat("held-q").wait_for(&gq));
    q.on_always(CHAT, Reply::openai_chat("from-q"));
    let gw = round_robin(
        &p,
        &q,
        r#"["p/a", "q/x"]"#,
        "concurrency_per_model = 1\nqueue_depth = 0",
    );
    let addr = gw.addr();

    // A holds p/a's one slot; B finds it busy (depth 0: never wait) and goes to q/x.
    let a = ask_in_thread(addr, "rr");
    eventually(secs(10), "p saw A", || {
        (p.requests_to(CHAT).len() == 1).then_some(())
    });
    let b = ask_in_thread(addr, "rr");
    eventually(secs(10), "q saw B", || {
        (q.requests_to(CHAT).len() == 1).then_some(())
    });

    // C finds both slots busy: nothing goes upstream, 503 ALL_TARGETS_SKIPPED.
    let c = ask(addr, "rr");
    assert_eq!(c.status, 503, "{}", c.text());
    let j = c.json();
    assert_eq!(j["error"]["code"], "ALL_TARGETS_SKIPPED");
    assert_eq!(j["error"]["type"], "service_unavailable");
    assert_eq!(
        j["error"]["message"],
        "Service temporarily unavailable: all targets were skipped by pre-dispatch filters"
    );
    assert_eq!(
        j["error"]["skippedTargets"],
        serde_json::json!([{"reason": "concurrency_cap", "targets": ["p/a", "q/x"]}])
    );
    assert_eq!(j["diagnostics"]["terminalReason"], "all_targets_skipped");
    assert_eq!(j["diagnostics"]["attempted"], 0);
    assert_eq!(j["diagnostics"]["poolSize"], 2);
    assert_eq!(
        c.header("x-omniroute-combo-terminal-reason"),
        Some("all_targets_skipped")
    );
    assert_eq!(
        c.header("x-omniroute-combo-excluded"),
        Some("p/a:concurrency_cap,q/x:concurrency_cap")
    );
    assert_eq!(c.header("retry-after"), None);
    assert_eq!(
        (p.requests_to(CHAT).len(), q.requests_to(CHAT).len()),
        (1, 1)
    );

    // The held answers are served; their slots come back and the next request uses p/a.
    gp.open();
    gq.open();
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!((a.status, served_by(&a)), (200, "cp"), "{}", a.text());
    assert_eq!((b.status, served_by(&b)), (200, "cq"), "{}", b.text());
    eventually(secs(10), "slots back", || {
        (metric(addr, "tidegate_gate_permits") == 0).then_some(())
    });
    let d = ask(addr, "rr");
    assert_eq!((d.status, served_by(&d)), (200, "cp"), "{}", d.text());
    assert_eq!(p.requests_to(CHAT).len(), 2);
}

#[test]
fn the_round_robin_queue_holds_queue_depth_waiters_for_queue_timeout_ms() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    let (g1, g2) = (Gate::new(), Gate::new());
    p.on(CHAT, Reply::openai_chat("held").wait_for(&g1));
    p.on_always(CHAT, Reply::openai_chat("waited"));
    let gw = round_robin(
        &p,
        &q,
        r#"["p/a"]"#,
        "concurrency_per_model = 1\nqueue_depth = 1\nqueue_timeout_ms = 3000",
    );
    let addr = gw.addr();

    // A holds the slot, B waits in the queue (one place), C finds the queue full: 503 at
    // once while B still waits. (B waits at most queue_timeout_ms: long enough for a loaded
    // machine to see it waiting.)
    let a = ask_in_thread(addr, "rr");
    eventually(secs(10), "p saw A", || {
        (p.requests_to(CHAT).len() == 1).then_some(())
    });
    let b = ask_in_thread(addr, "rr");
    eventually(secs(10), "B queued", || {
        (metric(addr, "tidegate_gate_waiters") == 1).then_some(())
    });
    let c = ask(addr, "rr");
    assert_eq!(c.status, 503, "{}", c.text());
    assert_eq!(c.json()["error"]["code"], "ALL_TARGETS_SKIPPED");
    assert_eq!(p.requests_to(CHAT).len(), 1);
    // B is let in when A's slot comes back (within its 3 s, or it is skipped too).
    g1.open();
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!(a.status, 200, "{}", a.text());
    if b.status == 200 {
        assert_eq!(b.json()["choices"][0]["message"]["content"], "waited");
    } else {
        // The machine was too slow to let B in within 3 s: it was skipped, not sent.
        assert_eq!(
            b.json()["error"]["code"],
            "ALL_TARGETS_SKIPPED",
            "{}",
            b.text()
        );
    }

    // A waiter is given up after queue_timeout_ms: 503 no sooner than 3 s.
    eventually(secs(10), "slot back", || {
        (metric(addr, "tidegate_gate_permits") == 0).then_some(())
    });
    let sent = p.requests_to(CHAT).len();
    p.on(CHAT, Reply::openai_chat("held-2").wait_for(&g2));
    let d = ask_in_thread(addr, "rr");
    eventually(secs(10), "p saw D", || {
        (p.requests_to(CHAT).len() == sent + 1).then_some(())
    });
    let started = std::time::Instant::now();
    let e = ask(addr, "rr");
    assert!(
        started.elapsed() >= Duration::from_millis(3000),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(e.status, 503, "{}", e.text());
    assert_eq!(
        e.json()["error"]["skippedTargets"][0]["reason"],
        "concurrency_cap"
    );
    assert_eq!(p.requests_to(CHAT).len(), sent + 1);
    g2.open();
    assert_eq!(d.join().unwrap().status, 200);
}

#[test]
fn a_wait_for_the_round_robin_semaphore_ends_at_the_request_deadline() {
    let (p, q) = (MockUpstream::start(), MockUpstream::start());
    // A's stream sends its first piece and then nothing: relaying, it is past the request
    // deadline's reach and holds p/a's one slot.
    p.on(
        CHAT,
        Reply::sse(vec![
            Chunk::json(
                serde_json::json!({"id": "s", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": "hi"}}]}),
            ),
            Chunk::stall(),
        ]),
    );
    p.on_always(CHAT, Reply::openai_chat("later"));
    let extra = "[[combos]]\nname = \"rr\"\nstrategy = \"round-robin\"\ntargets = [\"p/a\"]\n\n\
                 [combos.config]\nconcurrency_per_model = 1\nqueue_timeout_ms = 30000\n";
    // A 3 s request deadline: A's head must come inside it on a loaded machine too.
    let config =
        two(&p, &q, "", extra).replace("workers = 2\n", "workers = 2\nrequest_timeout_ms = 3000\n");
    let gw = Gateway::start(&config);
    let mut a = Client::connect(gw.addr());
    a.set_timeout(secs(10));
    a.start_request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"rr","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(a.read_head().status, 200);
    // B waits for the slot A holds; its 3 s request deadline ends the wait, not the 30 s
    // queue timeout.
    let clock = Stopwatch::start();
    let b = ask(gw.addr(), "rr");
    let took = clock.elapsed();
    assert_eq!(b.status, 504, "{}", b.text());
    assert_eq!(b.json()["error"]["code"], "request_timeout", "{}", b.text());
    assert!(took >= ms(2900) && took < secs(20), "{took:?}");
    assert_eq!(p.requests_to(CHAT).len(), 1, "nothing sent for B");
    drop(a);
}
