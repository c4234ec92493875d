//! Concurrency gates on two shards: a connection with `max_concurrent = 1` never sees two
//! concurrent requests whatever shard the clients landed on; `model_concurrency` caps one
//! model while another runs freely on the same connection; a request that waits past the
//! queue budget gets 429 `semaphore_timeout` and never reaches the upstream; the provider
//! gate (`provider_concurrency`) caps every connection of a provider together and the global
//! gate (`global_concurrent_requests`) caps everything, while other work runs freely; a 429
//! with a retry hint blocks the gate; permits come back on every exit path; a client that
//! hangs up while waiting (gate or request queue) never reaches the upstream.

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
    let (mock, gate) = held_then_later();
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
        r.json()["error"]["message"],
        "Semaphore timeout after 200ms for up:c1"
    );
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

/// Provider `up` with connections `c1` (client key `k1`) and `c2` (key `k2`); provider
/// `other` with `c3` (either key) serving `m2`. All three at the same mock.
fn three_connections(mock: &MockUpstream, resilience: &str) -> String {
    let base = mock.base_url();
    let keys = "[[client_keys]]\nid = \"one\"\nkey = \"k1\"\nallowed_connections = [\"c1\", \"c3\"]\n\n\
                [[client_keys]]\nid = \"two\"\nkey = \"k2\"\nallowed_connections = [\"c2\", \"c3\"]\n\n";
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{keys}{}{}{}{}{}{resilience}",
        provider("up", &base, &["m1"]),
        provider("other", &base, &["m2"]),
        connection("c1", "up"),
        connection("c2", "up"),
        connection("c3", "other"),
    )
}

fn ask_as(addr: std::net::SocketAddr, key: &str, model: &str) -> Response {
    let mut c = Client::connect(addr);
    c.set_timeout(Duration::from_secs(60));
    let auth = format!("Bearer {key}");
    c.request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", auth.as_str())],
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

fn by_model(mock: &MockUpstream, model: &str) -> usize {
    mock.requests_to("/v1/chat/completions")
        .iter()
        .filter(|r| r.json()["model"] == model)
        .count()
}

#[test]
fn provider_gate_caps_all_connections_of_the_provider_together() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("ok").wait_for(&gate),
    );
    let gw = Gateway::start(&three_connections(
        &mock,
        "[resilience.provider_quota_overrides.up]\nprovider_concurrency = 1\n",
    ));
    let addr = gw.addr();
    let mut clients = Vec::new();
    // Two connections of `up` (one per key) and two requests to `other`.
    for (key, model) in [
        ("k1", "up/m1"),
        ("k2", "up/m1"),
        ("k1", "other/m2"),
        ("k2", "other/m2"),
    ] {
        clients.push(std::thread::spawn(move || ask_as(addr, key, model).status));
    }
    mock.wait_for_hits("/v1/chat/completions", 3, Duration::from_secs(10));
    let deadline = Deadline::after(Duration::from_millis(300));
    while !deadline.passed() {
        assert_eq!(
            by_model(&mock, "m1"),
            1,
            "both connections of `up` ran at once"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(by_model(&mock, "m2"), 2, "`other` has no provider gate");
    gate.open();
    let statuses: Vec<u16> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(by_model(&mock, "m1"), 2);
}

#[test]
fn global_gate_caps_every_provider_across_shards() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("ok").delay_ms(10),
    );
    let gw = Gateway::start(&three_connections(
        &mock,
        "[resilience.request_queue]\nglobal_concurrent_requests = 1\n",
    ));
    let addr = gw.addr();
    let clients: Vec<_> = (0..30)
        .map(|i| {
            let (key, model) = match i % 3 {
                0 => ("k1", "up/m1"),
                1 => ("k2", "up/m1"),
                _ => ("k1", "other/m2"),
            };
            std::thread::spawn(move || ask_as(addr, key, model).status)
        })
        .collect();
    let statuses: Vec<u16> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(mock.hits("/v1/chat/completions"), 30);
    assert_eq!(
        mock.peak_concurrency(),
        1,
        "two requests passed the global gate at once"
    );
}

/// The first request's 429 (`retry-after: 5`) blocks the connection's gate for 5 s: the
/// second, queued behind it, waits out its 1 s budget instead of being sent on the first's
/// release. `toml` gives `up/m1` one connection with `max_concurrent = 1` and
/// `max_wait_ms = 1000`.
fn retry_after_blocks_the_gate(mock: MockUpstream, toml: &str) {
    mock.on(
        "/v1/chat/completions",
        Reply::error(429, "slow down")
            .header("retry-after", "5")
            .delay_ms(600),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start(toml);
    let addr = gw.addr();
    let first = std::thread::spawn(move || ask(addr, "m1"));
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(10));
    let second = ask(addr, "m1");
    assert_eq!(first.join().unwrap().status, 429);
    assert_eq!(second.status, 429, "{}", second.text());
    assert_eq!(second.header("x-tidegate-error"), Some("semaphore_timeout"));
    assert_eq!(mock.hits("/v1/chat/completions"), 1);
}

const ONE_AT_A_TIME: &str =
    "max_concurrent = 1\n[connections.rate_limit_overrides]\nmax_wait_ms = 1000\n\n";

#[test]
fn a_429_with_retry_after_blocks_the_gate_so_its_waiter_never_meets_the_same_refusal() {
    let mock = MockUpstream::start();
    let toml = one_upstream(&mock.base_url(), 2, ONE_AT_A_TIME, "");
    retry_after_blocks_the_gate(mock, &toml);
}

#[test]
fn the_block_reaches_a_gate_home_that_is_not_the_connections_owner() {
    // A global gate puts every connection's gates on the owner of `global` (shard 0 of 2);
    // `c1` is the third connection, owned by shard 1, so the 429 is classified on shard 1
    // and the block travels to shard 0.
    let mock = MockUpstream::start();
    let base = mock.base_url();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{}{}{}{ONE_AT_A_TIME}\
         [resilience.request_queue]\nglobal_concurrent_requests = 5\n",
        provider("up", &base, &["m1"]),
        provider("other", &base, &["zz"]),
        connection("x0", "other"),
        connection("x1", "other"),
        connection("c1", "up"),
    );
    retry_after_blocks_the_gate(mock, &toml);
}

#[test]
fn permits_come_back_when_a_stream_ends_and_when_its_client_goes_away() {
    let mock = MockUpstream::start();
    let mut pieces = Vec::new();
    for i in 0..40 {
        pieces.push(Chunk::openai_delta(&format!("p{i}")));
        pieces.push(Chunk::delay_ms(50));
    }
    pieces.push(Chunk::done());
    mock.on("/v1/chat/completions", Reply::sse(pieces));
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_stream(&["short", " stream"]),
    );
    let gw = Gateway::start(&config(
        &mock,
        "max_concurrent = 1\n[connections.rate_limit_overrides]\nmax_wait_ms = 3000",
    ));
    let addr = gw.addr();
    let body = br#"{"model":"up/m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    // A 2 s stream whose client hangs up after the head.
    let mut c = Client::connect(addr);
    c.start_request("POST", "/v1/chat/completions", &[], body);
    assert_eq!(c.read_head().status, 200);
    drop(c);
    // Its permit comes back when the gateway notices (its next write), long before the
    // stream would have ended; then two streams in a row each return theirs at the end.
    for _ in 0..2 {
        let mut c = Client::connect(addr);
        c.set_timeout(Duration::from_secs(10));
        let r = c.request("POST", "/v1/chat/completions", &[], body);
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.text().contains("short"), "{}", r.text());
    }
    // (The mock's own concurrency count is no measure here: it counts the abandoned
    // stream until its next write fails, after the gateway has let go of it.)
    eventually(Duration::from_secs(5), "every permit back", || {
        (flow_held(addr) == 0).then_some(())
    });
}

/// One request holds the connection; a second waits for admission and its client hangs
/// up: it is counted as abandoned, never reaches the upstream, and gives its place back.
fn hang_up_while_waiting(config_toml: String, mock: &MockUpstream, gate: &Gate) {
    let gw = Gateway::start(&config_toml);
    let addr = gw.addr();
    let first = std::thread::spawn(move || ask(addr, "m1"));
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(10));
    let mut quitter = Client::connect(addr);
    quitter.start_request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"up/m1","messages":[]}"#,
    );
    // It waits at its owner (a gate waiter or a queue entry beside the first's) before its
    // client hangs up.
    eventually(
        Duration::from_secs(5),
        "the second request to wait for admission",
        || (flow_held(addr) >= 2).then_some(()),
    );
    drop(quitter);
    eventually(
        Duration::from_secs(5),
        "the abandoned request to be counted",
        || {
            (metric(
                addr,
                "tidegate_requests_abandoned_total{phase=\"admission\"}",
            ) == 1)
                .then_some(())
        },
    );
    // Only the first request holds its place (the cancel reaches the owner shortly).
    eventually(
        Duration::from_secs(5),
        "the abandoned waiter to be gone",
        || (flow_held(addr) == 1).then_some(()),
    );
    gate.open();
    assert_eq!(first.join().unwrap().status, 200);
    // The next request flows, and the upstream saw two requests, not three.
    assert_eq!(
        ask(addr, "m1").json()["choices"][0]["message"]["content"],
        "later"
    );
    assert_eq!(mock.hits("/v1/chat/completions"), 2);
    // Nothing is left held or waiting anywhere.
    eventually(Duration::from_secs(5), "every permit and slot back", || {
        (flow_held(addr) == 0).then_some(())
    });
}

#[test]
fn a_client_that_hangs_up_while_queued_at_a_gate_never_reaches_the_upstream() {
    let (mock, gate) = held_then_later();
    hang_up_while_waiting(config(&mock, "max_concurrent = 1"), &mock, &gate);
}

#[test]
fn a_client_that_hangs_up_while_in_the_request_queue_never_reaches_the_upstream() {
    let (mock, gate) = held_then_later();
    // The connection's request queue (one at a time), no concurrency gate.
    let toml = one_upstream(
        &mock.base_url(),
        2,
        "[connections.rate_limit_overrides]\nrequests_per_minute = 60000",
        "[resilience.request_queue]\nconcurrent_requests = 1\nmin_time_between_requests_ms = 0",
    );
    hang_up_while_waiting(toml, &mock, &gate);
}

#[test]
fn a_request_pipelined_while_the_previous_waits_is_kept_and_answered_in_order() {
    let (mock, gate) = held_then_later();
    let gw = Gateway::start(&config(&mock, "max_concurrent = 1"));
    let addr = gw.addr();
    let first = std::thread::spawn(move || ask(addr, "m1"));
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(10));
    let mut c = Client::connect(addr);
    c.set_timeout(Duration::from_secs(10));
    let body = |m: &str| format!(r#"{{"model":"up/{m}","messages":[]}}"#);
    c.start_request("POST", "/v1/chat/completions", &[], body("m1").as_bytes());
    eventually(
        Duration::from_secs(5),
        "this connection's first request to wait for its permit",
        || (metric(addr, "tidegate_gate_waiters") == 1).then_some(()),
    );
    // Sent while the first of this connection waits for its permit: the wait reads it
    // from the socket (watching for a hang-up) and must keep it.
    c.start_request("POST", "/v1/chat/completions", &[], body("m2").as_bytes());
    eventually(
        Duration::from_secs(5),
        "the waiting request to read the pipelined one off the socket",
        || (c.unread_by_server() == Some(0)).then_some(()),
    );
    gate.open();
    assert_eq!(first.join().unwrap().status, 200);
    for _ in 0..2 {
        let r = c.read_response();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let models: Vec<String> = mock
        .requests_to("/v1/chat/completions")
        .iter()
        .map(|r| r.json()["model"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(models, vec!["m1", "m1", "m2"]);
}

#[test]
fn with_tiny_mesh_rings_no_permit_is_lost() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok").delay_ms(5));
    // Two-slot rings between the shards: requests, grants, releases and cancels find them
    // full and wait in the sender's outbox; every request is still served.
    let toml = config(&mock, "max_concurrent = 4")
        .replace("workers = 2", "workers = 2\nmesh_ring_capacity = 2");
    let gw = Gateway::start(&toml);
    let addr = gw.addr();
    // Bursts of 80 until the rings have been seen full (a quiet machine drains two slots
    // fast enough that one burst may not fill them); at most 10 bursts.
    for _ in 0..10 {
        let clients: Vec<_> = (0..80)
            .map(|_| std::thread::spawn(move || ask(addr, "m1")))
            .collect();
        for c in clients {
            let r = c.join().unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        }
        if metric(addr, "tidegate_mesh_drops_total{reason=\"ring_full\"}") > 0 {
            break;
        }
    }
    assert!(
        mock.peak_concurrency() <= 4,
        "the gate let more than 4 through"
    );
    assert!(
        metric(addr, "tidegate_mesh_drops_total{reason=\"ring_full\"}") > 0,
        "the rings never filled: the test proves nothing"
    );
    // Every permit came back: nothing held, nothing waiting, and the connection still
    // serves.
    eventually(Duration::from_secs(5), "every permit back", || {
        (flow_held(addr) == 0).then_some(())
    });
    assert_eq!(ask(addr, "m1").status, 200);
}
