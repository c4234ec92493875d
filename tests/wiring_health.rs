//! Health mechanisms on the request path, each shown through the real binary on two shards
//! (mock upstreams → Tidegate → a client):
//!
//! * auto-decay on selection: a connection failing on and off restarts at the base cooldown
//!   whenever it is selected again after its cooldown, so a primary that recovers carries
//!   traffic again within about one base cooldown — whichever shards own it and its
//!   fallback — while the fallback serves every request of the outage;
//! * the provider cooldown tracker (`provider_cooldown.enabled`): combo targets that just
//!   failed are skipped by the next combo requests; when no combo target is left the client
//!   gets 503 `all_targets_cooling_down` naming `provider_cooldown`;
//! * the provider breaker's half-open probe is settled by whatever the upstream does with
//!   it: a 5xx or a timeout reopens the breaker, a 4xx closes it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::*;

const CHAT: &str = "/v1/chat/completions";

fn chat(addr: SocketAddr, model: &str) -> Response {
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    Client::connect(addr).request("POST", CHAT, &[], body.as_bytes())
}

fn gateway_error(r: &Response) -> Option<&str> {
    r.header("x-tidegate-error")
}

// ---------------------------------------------------------------------------------------
// Auto-decay: a primary that recovers carries traffic again

/// The apikey base cooldown, scaled down from 3 s so the outage takes about a second.
const BASE_COOLDOWN_MS: u64 = 200;
/// Primary failures during the outage. Without auto-decay the sixth cools the primary for
/// 2^5 × base (6.4 s here, 96 s with the default 3 s): the level only ever climbs.
const OUTAGE_FAILURES: usize = 6;
/// The primary must serve again this soon after recovering (the issue's 30 s for a 3 s base
/// is ten base cooldowns; this is fifteen, still well under 2^5).
const RECOVERY_MS: u64 = 15 * BASE_COOLDOWN_MS;

/// Bare model `m1` resolves to provider `prim` first, then `back` (file order), one
/// connection each. With `spread`, a connection of an unrelated provider comes first, so
/// the ids are `prim-a` = 1 (owned by shard 0 of 2) and `back-a` = 2 (shard 1); without
/// it they are 0 and 1, both owned by shard 0.
fn failover_config(prim: &MockUpstream, back: &MockUpstream, spread: bool) -> String {
    let filler = if spread {
        format!(
            "{}{}",
            provider("other", &back.base_url(), &["zz"]),
            connection("other-a", "other")
        )
    } else {
        String::new()
    };
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{filler}{}{}{}{}\
         [resilience.connection_cooldown.apikey]\nbase_cooldown_ms = {BASE_COOLDOWN_MS}\n",
        provider("prim", &prim.base_url(), &["m1"]),
        provider("back", &back.base_url(), &["m1"]),
        connection("prim-a", "prim"),
        connection("back-a", "back"),
    )
}

fn primary_recovers_after_an_outage(spread: bool) {
    let prim = MockUpstream::start();
    prim.on_always(CHAT, Reply::error(503, "overloaded"));
    let back = MockUpstream::start();
    back.on_always(CHAT, Reply::openai_chat("fallback"));
    let gw = Gateway::start(&failover_config(&prim, &back, spread));
    assert_eq!(gw.shards(), 2);

    // The outage: the fallback serves every request; the primary is tried again each time
    // its cooldown has passed.
    eventually(
        secs(30),
        "the primary to fail OUTAGE_FAILURES times",
        || {
            let r = chat(gw.addr(), "m1");
            assert_eq!(r.status, 200, "the fallback serves: {}", r.text());
            assert_eq!(r.header("x-tidegate-provider"), Some("back"));
            (prim.hits(CHAT) >= OUTAGE_FAILURES).then_some(())
        },
    );
    // Recovery: the primary carries traffic again within about one base cooldown.
    prim.on_always(CHAT, Reply::openai_chat("primary"));
    let r = eventually(
        Duration::from_millis(RECOVERY_MS),
        "the recovered primary to carry traffic again",
        || {
            let r = chat(gw.addr(), "m1");
            assert_eq!(r.status, 200, "{}", r.text());
            (r.header("x-tidegate-provider") == Some("prim")).then_some(r)
        },
    );
    assert_eq!(r.json()["choices"][0]["message"]["content"], "primary");
}

#[test]
fn a_recovered_primary_carries_traffic_again_within_a_base_cooldown() {
    primary_recovers_after_an_outage(false);
}

#[test]
fn auto_decay_works_when_primary_and_fallback_have_different_owners() {
    primary_recovers_after_an_outage(true);
}

// ---------------------------------------------------------------------------------------
// The provider cooldown tracker: combos skip what just failed

/// Combo `duo` = [`a/m1`, `b/m1`]; `a`'s connections never cool themselves
/// (`disable_cooling`), so only the tracker can make a combo skip them.
fn tracker_config(a: &MockUpstream, b: &MockUpstream, a_connections: usize, tail: &str) -> String {
    let mut connections = String::new();
    for i in 0..a_connections {
        connections.push_str(&format!(
            "[[connections]]\nid = \"a{i}\"\nprovider = \"a\"\ndisable_cooling = true\n\n"
        ));
    }
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}{}{connections}\
         [[connections]]\nid = \"b0\"\nprovider = \"b\"\ndisable_cooling = true\n\n\
         [[combos]]\nname = \"duo\"\nstrategy = \"priority\"\n\
         targets = [{{ model = \"a/m1\" }}, {{ model = \"b/m1\" }}]\n\n\
         [resilience.provider_cooldown]\nenabled = true\n{tail}",
        provider("a", &a.base_url(), &["m1"]),
        provider("b", &b.base_url(), &["m1"]),
    )
}

#[test]
fn a_combo_skips_a_connection_that_just_failed() {
    let a = MockUpstream::start();
    a.on_always(CHAT, Reply::error(503, "overloaded"));
    let b = MockUpstream::start();
    b.on_always(CHAT, Reply::openai_chat("from b"));
    // The connection-level entry cools for a minute after one failure.
    let tail = "min_retry_cooldown_ms = 60000\n";
    let gw = Gateway::start(&tracker_config(&a, &b, 1, tail));
    assert_eq!(gw.shards(), 2);
    for i in 0..5 {
        let r = chat(gw.addr(), "duo");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-tidegate-provider"), Some("b"));
    }
    assert_eq!(
        a.hits(CHAT),
        1,
        "after its failure the combo skips a's connection"
    );
    assert_eq!(b.hits(CHAT), 5);
}

#[test]
fn the_provider_window_gate_skips_a_provider_after_its_threshold() {
    let a = MockUpstream::start();
    a.on_always(CHAT, Reply::error(503, "overloaded"));
    let b = MockUpstream::start();
    b.on_always(CHAT, Reply::openai_chat("from b"));
    // Connection-level entries never cool (0 ms); the provider cools after 2 failures.
    let tail = "min_retry_cooldown_ms = 0\n\n\
                [resilience.provider_cooldown.apikey]\nfailure_threshold = 2\n\
                failure_window_ms = 60000\ncooldown_ms = 60000\n";
    let gw = Gateway::start(&tracker_config(&a, &b, 2, tail));
    // Both of a's connections fail once (the second failure reaches the threshold), then b.
    let r = chat(gw.addr(), "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(a.hits(CHAT), 2);
    for i in 0..4 {
        let r = chat(gw.addr(), "duo");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
        assert_eq!(r.header("x-tidegate-provider"), Some("b"));
    }
    assert_eq!(
        a.hits(CHAT),
        2,
        "provider a cools: no connection of it is tried"
    );
}

#[test]
fn when_every_combo_target_cools_the_client_gets_all_targets_cooling_down() {
    let a = MockUpstream::start();
    a.on_always(CHAT, Reply::error(503, "a overloaded"));
    let b = MockUpstream::start();
    b.on_always(CHAT, Reply::error(503, "b overloaded"));
    let tail = "min_retry_cooldown_ms = 60000\n";
    let gw = Gateway::start(&tracker_config(&a, &b, 1, tail));
    // Both targets fail: the client gets the last upstream answer.
    let r = chat(gw.addr(), "duo");
    assert_eq!(r.status, 503);
    assert_eq!(gateway_error(&r), None, "{}", r.text());
    // Both are now skipped before dispatch.
    let r = chat(gw.addr(), "duo");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(gateway_error(&r), Some("all_targets_cooling_down"));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry), "retry-after {retry}");
    let body = r.json();
    assert_eq!(body["error"]["code"], "all_targets_cooling_down");
    let excluded = body["diagnostics"]["excluded"].as_array().unwrap().clone();
    assert_eq!(excluded.len(), 2, "{body}");
    for e in &excluded {
        assert_eq!(e["reason"], "provider_cooldown", "{body}");
    }
    assert_eq!((a.hits(CHAT), b.hits(CHAT)), (1, 1));
}

// ---------------------------------------------------------------------------------------
// The provider breaker's half-open probe

/// Provider `up` at `addr` with two connections that never cool themselves; its breaker
/// opens on the first connect failure and half-opens 2 s later.
fn probe_config(addr: SocketAddr, server_extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n{server_extra}\n\n\
         [[providers]]\nid = \"up\"\nformat = \"openai\"\nbase_url = \"http://{addr}/v1\"\n\
         models = [\"m1\"]\n\n\
         [[connections]]\nid = \"c1\"\nprovider = \"up\"\ndisable_cooling = true\n\n\
         [[connections]]\nid = \"c2\"\nprovider = \"up\"\ndisable_cooling = true\n\n\
         [resilience.provider_breaker.apikey]\nfailure_threshold = 1\nreset_timeout_ms = 2000\n"
    )
}

/// Starts the gateway against a port that refuses connections, opens the provider breaker
/// with a connect failure, then puts a mock on the port (the same socket, now listening: the
/// port is held throughout, so no other process can take it in between).
fn provider_breaker_open(server_extra: &str) -> (Gateway, MockUpstream) {
    let port = RefusingPort::new();
    let gw = Gateway::start(&probe_config(port.addr(), server_extra));
    assert_eq!(gw.shards(), 2);
    let r = chat(gw.addr(), "up/m1");
    assert_ne!(r.status, 200);
    eventually(secs(5), "the provider breaker to open", || {
        let r = chat(gw.addr(), "up/m1");
        (gateway_error(&r) == Some("provider_circuit_open")).then_some(())
    });
    (gw, MockUpstream::start_on(port.listen()))
}

/// Sends requests until the half-open probe reaches the mock; returns its answer.
fn probe(gw: &Gateway, mock: &MockUpstream) -> Response {
    eventually(secs(10), "the half-open probe", || {
        let r = chat(gw.addr(), "up/m1");
        if mock.hits(CHAT) == 0 {
            assert_eq!(gateway_error(&r), Some("provider_circuit_open"));
            return None;
        }
        Some(r)
    })
}

/// After a failed probe the breaker is open again: nothing reaches the upstream.
fn assert_reopened(gw: &Gateway, mock: &MockUpstream) {
    for i in 0..5 {
        let r = chat(gw.addr(), "up/m1");
        assert_eq!(
            gateway_error(&r),
            Some("provider_circuit_open"),
            "request {i} after the failed probe got {}: {}",
            r.status,
            r.text()
        );
        assert_eq!(r.header("x-omniroute-provider-breaker"), Some("open"));
    }
    assert_eq!(mock.hits(CHAT), 1, "the failed probe reopened the breaker");
    // The next half-open period admits a probe again; its success closes the breaker.
    mock.on_always(CHAT, Reply::openai_chat("back"));
    eventually(secs(10), "the breaker to close after a good probe", || {
        (chat(gw.addr(), "up/m1").status == 200).then_some(())
    });
}

#[test]
fn a_probe_answered_with_a_5xx_reopens_the_provider_breaker() {
    let (gw, mock) = provider_breaker_open("");
    mock.on_always(CHAT, Reply::error(503, "still down"));
    let r = probe(&gw, &mock);
    assert_eq!(r.status, 503);
    assert_reopened(&gw, &mock);
}

#[test]
fn a_probe_that_times_out_reopens_the_provider_breaker() {
    let (gw, mock) = provider_breaker_open("response_header_timeout_ms = 300");
    mock.on_always(CHAT, Reply::stall_before_head());
    let r = probe(&gw, &mock);
    assert_eq!(r.status, 504, "{}", r.text());
    assert_reopened(&gw, &mock);
}

#[test]
fn a_probe_answered_with_a_4xx_closes_the_provider_breaker() {
    let (gw, mock) = provider_breaker_open("");
    let gate = Gate::new();
    mock.on(CHAT, Reply::error(400, "bad request"))
        .on(CHAT, Reply::openai_chat("held").wait_for(&gate))
        .on_always(CHAT, Reply::openai_chat("free"));
    let r = probe(&gw, &mock);
    assert_eq!(r.status, 400, "{}", r.text());
    // The upstream answered: the breaker is closed, so two requests may be in flight at
    // once (a half-open breaker lets only its one probe through).
    let addr = gw.addr();
    let held = std::thread::spawn(move || chat(addr, "up/m1"));
    mock.wait_for_hits(CHAT, 2, secs(5));
    let r = chat(gw.addr(), "up/m1");
    assert_eq!(
        r.status,
        200,
        "a second request while the first is in flight: {}",
        r.text()
    );
    assert_eq!(r.json()["choices"][0]["message"]["content"], "free");
    gate.open();
    let r = held.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "held");
}
