//! Concurrency gates on two shards: a connection with `max_concurrent = 1` never sees two
//! concurrent requests whatever shard the clients landed on; `model_concurrency` caps one
//! model while another runs freely on the same connection; a request that waits past the
//! queue budget gets 429 `semaphore_timeout` and never reaches the upstream.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::Duration;

use support::Deadline;
use support::*;

fn config(mock: &MockUpstream, connection_extra: &str) -> String {
    one_upstream(&mock.base_url(), 2, connection_extra, "")
}

fn ask(addr: std::net::SocketAddr, model: &str) -> Response {
    let mut c = Client::connect(addr);
    c.set_timeout(Duration::from_secs(60));
    c.request(
        "POST",
        "/v1/chat/completions",
        &[],
        format!(r#"{{"model":"up/{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

#[test]
fn max_concurrent_one_means_one_at_a_time_across_shards() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("ok").delay_ms(10),
    );
    let gw = Gateway::start(&config(&mock, "max_concurrent = 1"));
    let addr = gw.addr();
    let clients: Vec<_> = (0..50)
        .map(|_| std::thread::spawn(move || ask(addr, "m1").status))
        .collect();
    let statuses: Vec<u16> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(mock.hits("/v1/chat/completions"), 50);
    assert_eq!(
        mock.peak_concurrency(),
        1,
        "the upstream saw two requests at once"
    );
}

#[test]
fn model_concurrency_caps_one_model_while_another_runs_freely() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("ok").wait_for(&gate),
    );
    let gw = Gateway::start(&config(
        &mock,
        "[connections.rate_limit_overrides]\nmodel_concurrency = { \"m1\" = 1 }",
    ));
    let addr = gw.addr();
    let mut clients = Vec::new();
    for model in ["m1", "m1", "m1", "m2", "m2", "m2"] {
        clients.push(std::thread::spawn(move || ask(addr, model).status));
    }
    // One m1 and all three m2 reach the upstream while the replies are held.
    mock.wait_for_hits("/v1/chat/completions", 4, Duration::from_secs(10));
    let by_model = |m: &str| {
        mock.requests_to("/v1/chat/completions")
            .iter()
            .filter(|r| r.json()["model"] == m)
            .count()
    };
    let deadline = Deadline::after(Duration::from_millis(300));
    while !deadline.passed() {
        assert_eq!(by_model("m1"), 1, "a second m1 passed its gate");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(by_model("m2"), 3);
    gate.open();
    let statuses: Vec<u16> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(by_model("m1"), 3);
}

#[test]
fn waiting_past_the_queue_budget_is_a_429_that_never_reaches_the_upstream() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("first").wait_for(&gate),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("later"));
    let gw = Gateway::start(&config(
        &mock,
        "max_concurrent = 1\n[connections.rate_limit_overrides]\nmax_wait_ms = 200",
    ));
    let addr = gw.addr();
    let first = std::thread::spawn(move || ask(addr, "m1"));
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(10));
    let r = ask(addr, "m1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("semaphore_timeout"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        1,
        "the timed-out request never reached the upstream"
    );
    gate.open();
    assert_eq!(first.join().unwrap().status, 200);
    // The permit came back: the next request flows.
    assert_eq!(
        ask(addr, "m1").json()["choices"][0]["message"]["content"],
        "later"
    );
}
