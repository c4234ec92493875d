//! Connection cooldowns on two shards: a 429 with `Retry-After: 7` cools exactly that
//! connection for about 7 s while its sibling serves; a ban body makes a connection
//! `banned` for good; an agentrouter 403 `额度不足` reaches the client as 429 with
//! `Retry-After: 60`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::{Duration, Instant};

use support::*;

/// One provider `up` (id configurable) with connections `c1` (priority 1, key K1) and
/// `c2` (priority 2, key K2) on the same mock upstream.
fn config(mock: &MockUpstream, provider_id: &str, two: bool) -> String {
    let second = if two {
        format!(
            "[[connections]]\nid = \"c2\"\nprovider = \"{provider_id}\"\npriority = 2\napi_key_env = \"TG_K2\"\n"
        )
    } else {
        String::new()
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[providers]]
id = "{provider_id}"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "{provider_id}"
priority = 1
api_key_env = "TG_K1"

{second}
"#,
        mock.base_url()
    )
}

const KEYS: &[(&str, &str)] = &[("TG_K1", "key-one"), ("TG_K2", "key-two")];

fn ask(gw: &Gateway, model: &str) -> Response {
    Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[],
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

fn served_by(r: &Response) -> &str {
    r.header("x-omniroute-selected-connection-id").unwrap_or("")
}

#[test]
fn a_429_with_retry_after_cools_exactly_that_connection_while_its_sibling_serves() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(429, "rate limited").header("retry-after", "7"),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start_with_env(&config(&mock, "up", true), KEYS);

    // The cooldown starts while the first request is served: after `first_sent`, before
    // `answered`.
    let first_sent = Instant::now();
    let r = ask(&gw, "up/m1");
    let answered = Instant::now();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        served_by(&r),
        "c2",
        "the 429 moved the request to the sibling"
    );
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    let sent = mock.requests_to("/v1/chat/completions");
    assert_eq!(sent[0].header("authorization"), Some("Bearer key-one"));
    assert_eq!(sent[1].header("authorization"), Some("Bearer key-two"));

    // While c1 cools, every request goes straight to c2, on both shards.
    for _ in 0..10 {
        let r = ask(&gw, "up/m1");
        assert_eq!(served_by(&r), "c2");
        assert_eq!(
            r.header("x-tidegate-attempts"),
            Some("1"),
            "c1 is skipped, not tried"
        );
    }
    // After 7 s c1 (priority 1) serves again. Bounds that load cannot bend: a request sent
    // at t and served by c2 shows the cooldown still ran at t, so it began before
    // `answered` and ran at most 7 s; one answered by c1 at t shows it over by t, so it
    // began after `first_sent` and ran at least (about) 7 s.
    let mut last_c2_sent = answered;
    let back = eventually(Duration::from_secs(12), "c1 to serve again", || {
        let asked = Instant::now();
        let r = ask(&gw, "up/m1");
        if served_by(&r) == "c1" {
            return Some(first_sent.elapsed());
        }
        last_c2_sent = asked;
        None
    });
    assert!(
        back >= Duration::from_millis(6_000),
        "c1 came back {back:?} after the 429 was sent, before its 7 s"
    );
    let still_cool = last_c2_sent.duration_since(answered);
    assert!(
        still_cool < Duration::from_millis(7_500),
        "c1 still cooled {still_cool:?} after the 429 was answered (Retry-After: 7)"
    );
    let by_key = |k: &str| {
        mock.requests_to("/v1/chat/completions")
            .iter()
            .filter(|r| r.header("authorization") == Some(k))
            .count()
    };
    assert_eq!(
        by_key("Bearer key-one"),
        2,
        "c1 saw only the 429 and the request after its cooldown"
    );
}

#[test]
fn when_every_connection_cools_the_gateway_answers_429_model_cooldown() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::error(429, "rate limited").header("retry-after", "30"),
    );
    // Answered at once, not after waiting the 30 s out (`wait_for_cooldown` off).
    let cfg = config(&mock, "up", true) + "\n[resilience.wait_for_cooldown]\nenabled = false\n";
    let gw = Gateway::start_with_env(&cfg, KEYS);
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 429);
    assert!(
        r.header("x-tidegate-error").is_none(),
        "the last upstream 429 is relayed"
    );
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-tidegate-error"), Some("model_cooldown"));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((25..=30).contains(&retry), "retry-after {retry}");
    let e = &r.json()["error"];
    assert_eq!(e["type"], "rate_limit_error");
    assert_eq!(e["code"], "model_cooldown");
    assert_eq!(e["model"], "up/m1");
    assert_eq!(e["credentials_cooling"], 2);
    assert!(e["reset_seconds"].as_u64().unwrap() >= 25);
    assert!(e["retry_after"].as_str().unwrap().ends_with('Z'));
    assert_eq!(mock.hits("/v1/chat/completions"), 2);
}

#[test]
fn a_ban_makes_the_connection_banned_and_later_failures_do_not_change_it() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(
            403,
            "Your account has been suspended for violating our terms",
        ),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("sibling"));
    let gw = Gateway::start_with_env(&config(&mock, "up", true), KEYS);
    let r = ask(&gw, "up/m1");
    assert_eq!(served_by(&r), "c2");
    // c1 is never tried again, however long we wait past any transient cooldown.
    for _ in 0..10 {
        assert_eq!(served_by(&ask(&gw, "up/m1")), "c2");
    }
    let one = |m: &MockUpstream| {
        m.requests_to("/v1/chat/completions")
            .iter()
            .filter(|r| r.header("authorization") == Some("Bearer key-one"))
            .count()
    };
    assert_eq!(one(&mock), 1);

    // With only the banned connection left, the gateway says so (401, terminal).
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(403, "account_deactivated"),
    );
    mock.on_always(
        "/v1/chat/completions",
        Reply::error(429, "slow down").header("retry-after", "1"),
    );
    let gw = Gateway::start_with_env(&config(&mock, "up", false), KEYS);
    assert_eq!(ask(&gw, "up/m1").status, 403);
    for _ in 0..5 {
        let r = ask(&gw, "up/m1");
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(
            r.header("x-tidegate-error"),
            Some("all_connections_unavailable")
        );
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("banned")
        );
    }
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        1,
        "a banned connection never sees a 429 to overwrite it"
    );
}

#[test]
fn agentrouters_quota_403_reaches_the_client_as_429_with_retry_after_60() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::json(
            403,
            serde_json::json!({"error": {"message": "额度不足", "type": "forbidden"}}),
        ),
    );
    let gw = Gateway::start_with_env(&config(&mock, "agentrouter", false), KEYS);
    let r = ask(&gw, "agentrouter/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("60"));
    assert!(
        r.text().contains("额度不足"),
        "the upstream's body is relayed"
    );
}

// ---------------------------------------------------------------------------------------
// `wait_for_cooldown` (B §3.3): a direct request whose only connection cools briefly waits
// it out instead of answering 429 at once.

/// One connection `c1` on a mock whose first answer is `first`, every later one 200.
fn one_connection(first: Reply) -> (MockUpstream, Gateway) {
    let mock = MockUpstream::start();
    mock.on("/v1/chat/completions", first);
    mock.on_always("/v1/chat/completions", Reply::openai_chat("after the wait"));
    let gw = Gateway::start_with_env(&config(&mock, "up", false), KEYS);
    (mock, gw)
}

#[test]
fn a_direct_request_waits_out_a_short_rate_limit_cooldown_and_is_served() {
    let (mock, gw) = one_connection(Reply::error(429, "rate limited").header("retry-after", "1"));
    // The 429 itself is relayed (something was attempted) and cools c1 for about 1 s.
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    // Now every credential is cooling: the request waits for c1 and is served by it.
    let started = Instant::now();
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "after the wait"
    );
    assert_eq!(served_by(&r), "c1");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(mock.hits("/v1/chat/completions"), 2);
    // Logged as the wait began, on stderr (drained by another thread than the client's).
    gw.wait_for_log("waiting for the earliest (wait_for_cooldown)", secs(5));
}

#[test]
fn a_quota_exhausted_lock_is_never_waited_on() {
    // A self-hosted provider (limits per model): a quota 429 with `Retry-After: 1` locks
    // the model for that second with reason `quota_exhausted` — short enough to wait, but
    // a quota is never waited on.
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(429, "Monthly usage limit reached").header("retry-after", "1"),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("after the wait"));
    let cfg = config(&mock, "up", false).replace(
        "format = \"openai\"\n",
        "format = \"openai\"\nauth = \"local\"\n",
    ) + "\n[resilience.connection_cooldown.local]\nuse_upstream_retry_hints = true\n";
    let gw = Gateway::start_with_env(&cfg, KEYS);
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("model_cooldown"),
        "{}",
        r.text()
    );
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry <= 2,
        "a short lock, within the wait cap: retry-after {retry}"
    );
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        1,
        "answered without a retry"
    );
    assert!(!gw.logs().contains("wait_for_cooldown"), "{}", gw.logs());
    let listed = Client::connect(gw.addr())
        .request("GET", "/api/resilience/model-cooldowns", &[], b"")
        .json();
    assert_eq!(listed["items"][0]["reason"], "quota_exhausted", "{listed}");
}

#[test]
fn a_client_that_hangs_up_during_the_wait_costs_nothing_upstream() {
    let (mock, gw) = one_connection(Reply::error(429, "rate limited").header("retry-after", "5"));
    assert_eq!(ask(&gw, "up/m1").status, 429);
    let mut c = Client::connect(gw.addr());
    c.start_request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    eventually(secs(5), "the request to wait", || {
        gw.logs()
            .contains("waiting for the earliest (wait_for_cooldown)")
            .then_some(())
    });
    drop(c);
    let phase = "tidegate_requests_abandoned_total{phase=\"admission\"}";
    eventually(secs(5), "the hang-up to be seen", || {
        (metric(gw.addr(), phase) == 1).then_some(())
    });
    // The log line is written right after the counter, and read from the child's stderr
    // by another thread: wait for it rather than race it.
    gw.wait_for_log("client hung up during a cooldown wait", secs(5));
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        1,
        "nothing sent upstream"
    );
    // Only the scrape itself is in flight, once the previous scrape's request has ended:
    // its client reads the answer before the shard has counted the request done.
    metric_becomes(gw.addr(), "tidegate_requests_in_flight", 1);
}
