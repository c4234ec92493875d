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

/// `outer` (quota-share) = a/ma (weight 1) and the nested combo `inner` (weight 1), whose
/// targets b/mb and c/mc split that weight: 2:1:1.
fn nested_config(mock: &MockUpstream, ref_weight: &str) -> String {
    let base = mock.base_url();
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{}{}{}{}\
         [[combos]]\nname = \"inner\"\ntargets = [\"b/mb\", \"c/mc\"]\n\n\
         [[combos]]\nname = \"outer\"\nstrategy = \"quota-share\"\n\
         targets = [{{ model = \"a/ma\", weight = 1 }}, {{ combo = \"inner\"{ref_weight} }}]\n\n\
         [[combos]]\nname = \"plain\"\n\
         targets = [\"a/ma\", {{ combo = \"inner\", weight = 5 }}]\n",
        provider("a", &base, &["ma"]),
        provider("b", &base, &["mb"]),
        provider("c", &base, &["mc"]),
        connection("ca", "a"),
        connection("cb", "b"),
        connection("cc", "c"),
    )
}

fn split(gw: &Gateway, mock: &MockUpstream, n: usize) -> (usize, usize, usize) {
    let mut c = Client::connect(gw.addr());
    c.set_timeout(Duration::from_secs(10));
    let body = br#"{"model":"outer","messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..n {
        let r = c.request("POST", "/v1/chat/completions", &[], body);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let reqs = mock.requests_to("/v1/chat/completions");
    let seen = |m: &str| reqs.iter().filter(|r| r.json()["model"] == m).count();
    (seen("ma"), seen("mb"), seen("mc"))
}

#[test]
fn a_nested_combo_weight_is_the_share_its_targets_split() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    // The reference weighs as much as a/ma: its two targets get a quarter each.
    let gw = Gateway::start(&nested_config(&mock, ", weight = 1"));
    assert_eq!(split(&gw, &mock, 400), (200, 100, 100));
    drop(gw);
    // Weight 2: the nested combo gets two thirds, one third per target.
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start(&nested_config(&mock, ", weight = 2"));
    assert_eq!(split(&gw, &mock, 300), (100, 100, 100));
}

#[test]
fn a_nested_combo_weight_no_quota_share_combo_reads_is_a_warning() {
    let mock = MockUpstream::start();
    let (code, _, stderr) = run_check(&nested_config(&mock, ", weight = 1"));
    assert_eq!(code, 0, "{stderr}");
    // `plain` (priority) gives its reference a weight nothing reads; `outer`'s is read.
    assert!(
        stderr.contains("combos[2].targets[1].weight: has no effect: combo \"plain\""),
        "{stderr}"
    );
    assert!(!stderr.contains("combos[1].targets[1].weight"), "{stderr}");
}
