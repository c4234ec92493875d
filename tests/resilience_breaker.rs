//! The circuit breaker across two shards: it opens after the profile's count of counted
//! failures however the requests were spread, rejects with 503 `provider_circuit_open`
//! (Retry-After, `X-OmniRoute-Provider-Breaker: open`) on every shard, admits exactly one
//! probe after the reset timeout, and closes when the probe succeeds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::Deadline;
use support::*;

const THRESHOLD: usize = 6;
/// The breaker's reset timeout. Everything the test checks while the breaker is open (its
/// 503s on every shard, some 30 requests on new connections) must fit in it however slow a
/// loaded machine is, so it is far longer than that work takes; the test waits it out once.
const RESET_MS: u64 = 5_000;

fn config(mock: &MockUpstream) -> String {
    // Keep the connection itself routable so every 503 reaches the breaker.
    let breaker = format!(
        "[resilience.provider_breaker.apikey]\nfailure_threshold = {THRESHOLD}\ndegradation_threshold = 3\nreset_timeout_ms = {RESET_MS}"
    );
    one_upstream(&mock.base_url(), 2, "disable_cooling = true", &breaker)
}

fn ask(gw: &Gateway) -> Response {
    ask_at(gw.addr())
}

fn ask_at(addr: std::net::SocketAddr) -> Response {
    // A new client connection each time: the kernel spreads them over both shards.
    Client::connect(addr).request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    )
}

fn is_open(r: &Response) -> bool {
    r.status == 503 && r.header("x-tidegate-error") == Some("provider_circuit_open")
}

#[test]
fn opens_after_the_threshold_then_one_probe_then_closes() {
    let mock = MockUpstream::start();
    for _ in 0..THRESHOLD {
        mock.on("/v1/chat/completions", Reply::error(503, "overloaded"));
    }
    let gate = Gate::new();
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("probe ok").wait_for(&gate),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("closed again"));
    let gw = Gateway::start(&config(&mock));
    assert_eq!(gw.shards(), 2);

    // Started before the breaker can open: at least as long as it has been open.
    let since_open = Stopwatch::start();
    for i in 0..THRESHOLD {
        let r = ask(&gw);
        assert_eq!(r.status, 503, "failure {i} is the upstream's own 503");
        assert!(r.header("x-tidegate-error").is_none());
    }
    // The owner has counted THRESHOLD failures; its OPEN view reaches every shard.
    let r = eventually(Duration::from_secs(2), "the breaker to open", || {
        let r = ask(&gw);
        is_open(&r).then_some(r)
    });
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        THRESHOLD,
        "nothing passes an open breaker"
    );
    assert_eq!(r.header("x-omniroute-provider-breaker"), Some("open"));
    // Retry-After is the rest of the reset timeout, in whole seconds rounded up.
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    let open_for = since_open.elapsed();
    assert!(
        (1..=RESET_MS / 1000).contains(&retry)
            && u128::from(retry * 1000) + open_for.as_millis() >= u128::from(RESET_MS),
        "retry-after {retry} after {open_for:?} open"
    );
    let body = r.json();
    assert_eq!(body["error"]["type"], "server_error");
    assert_eq!(body["error"]["code"], "provider_circuit_open");
    assert_eq!(body["error"]["provider"], "up");
    // 5xx answers count on the connection's breaker: the answer says it is that one (not
    // the provider's) which is open.
    assert_eq!(
        body["error"]["message"],
        "Connection c1 circuit breaker is open (provider up)"
    );
    assert_eq!(body["error"]["connections"], serde_json::json!(["c1"]));
    // Every shard answers from its own view without touching the upstream.
    for i in 0..20 {
        let r = ask(&gw);
        assert!(
            is_open(&r),
            "request {i}, {:?} after the failures began (reset {RESET_MS} ms): {}",
            since_open.elapsed(),
            r.status
        );
    }
    assert_eq!(mock.hits("/v1/chat/completions"), THRESHOLD);

    // After the reset timeout: exactly one probe goes through; others are told to wait.
    let addr = gw.addr();
    let prober = std::thread::spawn(move || {
        let deadline = Deadline::after(Duration::from_millis(RESET_MS) + Duration::from_secs(5));
        loop {
            let r = ask_at(addr);
            if !is_open(&r) || deadline.passed() {
                return r;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    mock.wait_for_hits(
        "/v1/chat/completions",
        THRESHOLD + 1,
        Duration::from_millis(RESET_MS) + Duration::from_secs(5),
    );
    for _ in 0..10 {
        let r = ask(&gw);
        assert!(
            is_open(&r),
            "a second request during the probe is rejected, got {}",
            r.status
        );
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        THRESHOLD + 1,
        "exactly one probe"
    );
    gate.open();
    let r = prober.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "probe ok");
    // The probe's success closes the breaker everywhere.
    eventually(Duration::from_secs(2), "the breaker to close", || {
        let r = ask(&gw);
        (r.status == 200).then_some(())
    });
    for _ in 0..10 {
        assert_eq!(ask(&gw).status, 200);
    }
}

#[test]
fn client_errors_and_rate_limits_never_trip_the_breaker() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::error(400, "bad request"));
    let gw = Gateway::start(&config(&mock));
    for _ in 0..(THRESHOLD * 2) {
        let r = ask(&gw);
        assert_eq!(r.status, 400, "{}", r.text());
    }
    assert_eq!(mock.hits("/v1/chat/completions"), THRESHOLD * 2);
}

/// A connection held back by two things at once — its cooldown and the provider's open
/// breaker — is only usable when both have ended: the answer names the longer one and its
/// Retry-After is that one's, not the cooldown's shorter wait.
#[test]
fn a_connection_held_by_a_cooldown_and_an_open_breaker_waits_for_the_longer() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::error(503, "overloaded"));
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        1,
        "",
        "[resilience.provider_breaker.apikey]\nfailure_threshold = 1\n\
         degradation_threshold = 1\nreset_timeout_ms = 40000\n",
    ));
    let r = ask(&gw);
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.header("x-tidegate-error").is_none(),
        "the upstream's own 503"
    );
    let r = eventually(Duration::from_secs(2), "the breaker to open", || {
        let r = ask(&gw);
        (r.header("x-tidegate-error").is_some()).then_some(r)
    });
    assert_eq!(mock.hits("/v1/chat/completions"), 1, "{}", r.text());
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (30..=40).contains(&retry),
        "Retry-After {retry}: the breaker's 40 s, not the cooldown's shorter wait: {} {}",
        r.status,
        r.text()
    );
}
