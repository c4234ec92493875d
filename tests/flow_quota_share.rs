//! Quota-share combos on two shards (spec B §2.4): the quota-share home orders each
//! dispatch by deficit round robin over the targets' weights, so 400 sequential requests to
//! a 3:1 combo split exactly 300:100; with requests held in flight, the power-of-two-choices
//! step sends the next dispatch to the connection with fewer in flight.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::Duration;

use support::*;

fn config(mock: &MockUpstream) -> String {
    let base = mock.base_url();
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{}{}\
         [[combos]]\nname = \"share\"\nstrategy = \"quota-share\"\n\
         targets = [{{ model = \"a/ma\", weight = 3 }}, {{ model = \"b/mb\", weight = 1 }}]\n",
        provider("a", &base, &["ma"]),
        provider("b", &base, &["mb"]),
        connection("ca", "a"),
        connection("cb", "b"),
    )
}

fn models_seen(mock: &MockUpstream) -> (usize, usize) {
    let reqs = mock.requests_to("/v1/chat/completions");
    let n = |m: &str| reqs.iter().filter(|r| r.json()["model"] == m).count();
    (n("ma"), n("mb"))
}

const BODY: &[u8] = br#"{"model":"share","messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn weights_three_to_one_split_four_hundred_requests_exactly_300_to_100() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start(&config(&mock));
    // One keep-alive connection: each request ends (and returns its in-flight ticket)
    // before the next is read, so no dispatch sees another in flight.
    let mut c = Client::connect(gw.addr());
    c.set_timeout(Duration::from_secs(10));
    let mut order = String::new();
    for _ in 0..400 {
        let r = c.request("POST", "/v1/chat/completions", &[], BODY);
        assert_eq!(r.status, 200, "{}", r.text());
        order.push(match r.header("x-tidegate-provider") {
            Some("a") => 'A',
            Some("b") => 'B',
            other => panic!("provider header {other:?}"),
        });
    }
    assert_eq!(models_seen(&mock), (300, 100));
    // The deficit cycle of the spec's worked example.
    assert!(order.starts_with("AABAAABA"), "{}", &order[..16]);
}

#[test]
fn a_dispatch_goes_to_the_connection_with_fewer_in_flight() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("ok").wait_for(&gate),
    );
    let gw = Gateway::start(&config(&mock));
    let addr = gw.addr();
    let send = || {
        let mut c = Client::connect(addr);
        c.set_timeout(Duration::from_secs(10));
        c.start_request("POST", "/v1/chat/completions", &[], BODY);
        c
    };
    // The first pick is A (deficit .75 against .25) and stays in flight; on the second,
    // DRR picks A again (.5 against .5, earliest wins) but B has fewer in flight.
    let mut first = send();
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(10));
    let mut second = send();
    mock.wait_for_hits("/v1/chat/completions", 2, Duration::from_secs(10));
    assert_eq!(models_seen(&mock), (1, 1));
    gate.open();
    assert_eq!(
        first.read_response().header("x-tidegate-provider"),
        Some("a")
    );
    assert_eq!(
        second.read_response().header("x-tidegate-provider"),
        Some("b")
    );
}
