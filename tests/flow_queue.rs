//! The per-connection request queue on two shards: queue-depth admission answers
//! 429 `rate_limit_queue_full` at once; a request queued past `max_wait_ms` gets 503
//! `rate_limit_queue_timeout` and never reaches the upstream; a slow upstream call outlives
//! `max_wait_ms` and is cut only at `execution_max_wait_ms` with 504; a success's rate-limit
//! headers teach the queue its spacing; a provider's sliding window holds the third start of
//! the minute while another provider flows.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::Duration;

use support::*;

fn config(mock: &MockUpstream, overrides: &str, queue: &str) -> String {
    // An explicit rate makes this connection's request queue active.
    let connection = format!(
        "[connections.rate_limit_overrides]\nrequests_per_minute = 60000\nmax_concurrent = 1\n{overrides}"
    );
    one_upstream(
        &mock.base_url(),
        2,
        &connection,
        &format!("[resilience.request_queue]\n{queue}"),
    )
}

fn ask(addr: std::net::SocketAddr) -> Response {
    let mut c = Client::connect(addr);
    c.set_timeout(Duration::from_secs(30));
    c.request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"up/m1","messages":[]}"#,
    )
}

#[test]
fn a_full_queue_answers_429_rate_limit_queue_full_at_once() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("ok").wait_for(&gate),
    );
    let gw = Gateway::start(&config(&mock, "", "max_queue_depth = 2"));
    let addr = gw.addr();
    // One running, two queued.
    let held: Vec<_> = (0..3)
        .map(|_| std::thread::spawn(move || ask(addr).status))
        .collect();
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(10));
    // Queued requests reach the owner in their own time: wait until all three are in the
    // queue (one holding the slot, two waiting), so no later ask can take a waiting place.
    eventually(
        Duration::from_secs(10),
        "three requests in the queue",
        || (metric(addr, "tidegate_queue_requests") == 3).then_some(()),
    );
    // The rest are refused without waiting.
    let r = eventually(Duration::from_secs(5), "the queue to be full", || {
        let r = ask(addr);
        (r.status == 429).then_some(r)
    });
    assert_eq!(r.header("x-tidegate-error"), Some("rate_limit_queue_full"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        message.contains("up/m1") && message.contains("maxQueueDepth 2"),
        "{message}"
    );
    for _ in 0..3 {
        assert_eq!(
            ask(addr).header("x-tidegate-error"),
            Some("rate_limit_queue_full")
        );
    }
    gate.open();
    let statuses: Vec<u16> = held.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(statuses, vec![200, 200, 200]);
    assert_eq!(mock.hits("/v1/chat/completions"), 3);
}

#[test]
fn a_request_queued_past_max_wait_gets_503_and_never_reaches_the_upstream() {
    let (mock, gate) = held_then_later();
    let gw = Gateway::start(&config(&mock, "max_wait_ms = 200", ""));
    let addr = gw.addr();
    let first = std::thread::spawn(move || ask(addr));
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(10));
    let r = ask(addr);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("rate_limit_queue_timeout")
    );
    assert_eq!(r.json()["error"]["type"], "service_unavailable");
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(message.contains("maxWaitMs (200ms) for up/m1"), "{message}");
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        1,
        "the queued request never reached the upstream"
    );
    gate.open();
    assert_eq!(first.join().unwrap().status, 200);
    assert_eq!(ask(addr).status, 200, "the slot came back");
}

#[test]
fn a_slow_call_outlives_max_wait_and_is_cut_only_at_the_execution_budget() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("slow but in time").delay_ms(600),
    );
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("too slow").delay_ms(6_000),
    );
    let gw = Gateway::start(&config(
        &mock,
        // 600 ms and 6 s calls against a 2.4 s execution budget: 1.8 s and 3.6 s either
        // side, so a loaded machine cannot move either call across it.
        "max_wait_ms = 200\nexecution_max_wait_ms = 2400",
        "",
    ));
    let r = ask(gw.addr());
    assert_eq!(
        r.status,
        200,
        "600 ms of execution outlives the 200 ms queue budget: {}",
        r.text()
    );
    let r = ask(gw.addr());
    assert_eq!(r.status, 504, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("rate_limit_execution_timeout")
    );
    assert_eq!(r.json()["error"]["type"], "gateway_timeout");
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(message.contains("up/m1"), "{message}");
}

#[test]
fn a_successful_answers_rate_limit_headers_space_the_next_request() {
    let mock = MockUpstream::start();
    // Two plain answers, then one that announces 6 requests per minute.
    mock.on("/v1/chat/completions", Reply::openai_chat("plain"));
    mock.on("/v1/chat/completions", Reply::openai_chat("plain"));
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("limited").header("x-ratelimit-limit-requests", "6"),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("later"));
    let gw = Gateway::start(&config(
        &mock,
        "max_wait_ms = 300",
        "min_time_between_requests_ms = 0",
    ));
    let addr = gw.addr();
    // Without rate-limit headers, back-to-back requests start at once.
    assert_eq!(ask(addr).status, 200);
    assert_eq!(ask(addr).status, 200);
    let r = ask(addr);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "limited");
    // The queue learned a spacing of 60000 / 6 − 10 = 9990 ms from that success: the next
    // request would start later than its 300 ms queue budget allows (by far: it is sent
    // after the third's answer, however late a loaded machine sends it).
    let r = ask(addr);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("rate_limit_queue_timeout")
    );
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        3,
        "it never reached the upstream"
    );
}

#[test]
fn a_provider_window_holds_the_third_start_of_the_minute_while_others_flow() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    // Provider `up` gets a sliding window of 2 starts per minute (no request queue); the
    // provider `other` has none.
    let tail = "[[providers]]\nid = \"other\"\nformat = \"openai\"\n\
                base_url = \"BASE\"\nmodels = [\"m2\"]\n\
                [[connections]]\nid = \"c2\"\nprovider = \"other\"\n\
                [resilience.provider_quota_overrides.up]\nrpm = 2\n"
        .replace("BASE", &mock.base_url());
    let gw = Gateway::start(&one_upstream(&mock.base_url(), 2, "", &tail));
    let addr = gw.addr();
    let send = |model: &str| {
        let mut c = Client::connect(addr);
        c.set_timeout(Duration::from_secs(10));
        let body = format!(r#"{{"model":"{model}","messages":[]}}"#);
        c.start_request("POST", "/v1/chat/completions", &[], body.as_bytes());
        c
    };
    assert_eq!(send("up/m1").read_response().status, 200);
    assert_eq!(send("up/m1").read_response().status, 200);
    let mut third = send("up/m1");
    third.set_timeout(Duration::from_millis(500));
    assert_eq!(
        send("other/m2").read_response().status,
        200,
        "no window on `other`"
    );
    assert!(
        third.try_read_response().is_err(),
        "the third start within the minute was answered"
    );
    let m1 = mock
        .requests_to("/v1/chat/completions")
        .iter()
        .filter(|r| r.json()["model"] == "m1")
        .count();
    assert_eq!(m1, 2, "the window let a third request through");
}
