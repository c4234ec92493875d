//! Failures on the combo path, through the real binary on two shards (issue 9, items 8, 17,
//! 18 and 20):
//! * a transient failure of one combo target locks that model on its connection instead of
//!   cooling the connection, so the combo's next target on the same connection is tried and
//!   serves, and the next request skips the locked model — also with the two connections
//!   owned by different shards;
//! * `[resilience.model_lockout]` (`enabled`, `base_cooldown_ms`, …) locks a failing combo
//!   target for its own cooldown;
//! * the connection breaker is not charged when the combo's next target is the same
//!   provider, and otherwise counts at most one failure per connection per 5 s;
//! * a provider-scoped rule failure keeps the provider's other connections out of the rest
//!   of the request.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use support::*;

const CHAT: &str = "/v1/chat/completions";

fn body(model: &str) -> Vec<u8> {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#).into_bytes()
}

/// Asks over `client` (one client connection stays on one shard).
fn ask(client: &mut Client, model: &str) -> Response {
    client.request("POST", CHAT, &[], &body(model))
}

fn models_seen(mock: &MockUpstream) -> Vec<String> {
    mock.requests_to(CHAT)
        .iter()
        .map(|r| r.json()["model"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn keys_seen(mock: &MockUpstream) -> Vec<String> {
    mock.requests_to(CHAT)
        .iter()
        .map(|r| r.header("authorization").unwrap_or("").to_owned())
        .collect()
}

fn served_by(r: &Response) -> &str {
    r.header("x-omniroute-selected-connection-id").unwrap_or("")
}

fn attempts(r: &Response) -> &str {
    r.header("x-tidegate-attempts").unwrap_or("")
}

fn retry_after_s(r: &Response) -> u64 {
    r.header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {} {}", r.status, r.text()))
}

/// A transient failure cools for a minute here, so a lock outlives a slow test machine.
const LONG_TRANSIENT: &str = r#"
[resilience.connection_cooldown.apikey]
base_cooldown_ms = 60000
"#;

// ---------------------------------------------------------------------------------------
// Item 8: two targets on one connection

#[test]
fn a_transient_failure_of_one_target_locks_the_model_and_the_next_target_serves() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(500, "internal error"));
    mock.on_always(CHAT, Reply::openai_chat("from b"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{provider}
[[connections]]
id = "c1"
provider = "p"
api_key_env = "TG_C1"

[[combos]]
name = "duo"
strategy = "priority"
targets = ["p/a", "p/b"]
{LONG_TRANSIENT}
# The direct request below is answered from the lock, not after waiting it out.
[resilience.wait_for_cooldown]
enabled = false
"#,
            provider = provider("p", &mock.base_url(), &["a", "b"]),
        ),
        &[("TG_C1", "key-c1")],
    );
    let mut client = Client::connect(gw.addr());
    let r = ask(&mut client, "duo");
    assert_eq!(
        r.status,
        200,
        "b serves on the same connection: {}",
        r.text()
    );
    assert_eq!(served_by(&r), "c1");
    assert_eq!(attempts(&r), "2");
    assert_eq!(models_seen(&mock), ["a", "b"]);

    // The next request sees a's lock and goes straight to b …
    let r = ask(&mut client, "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(attempts(&r), "1", "a is locked: not tried again");
    assert_eq!(models_seen(&mock), ["a", "b", "b"]);

    // … a direct request for a is answered from the lock …
    let r = ask(&mut client, "p/a");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "model_cooldown", "{}", r.text());
    assert!(
        retry_after_s(&r) > 3,
        "the transient cooldown: {}",
        r.text()
    );
    // … and the connection itself was never cooled: b is served directly.
    let r = ask(&mut client, "p/b");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(models_seen(&mock), ["a", "b", "b", "b"]);
}

#[test]
fn a_connection_that_never_cools_takes_no_transient_model_lock_either() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(500, "internal error"));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{provider}
[[connections]]
id = "c1"
provider = "p"
disable_cooling = true
api_key_env = "TG_C1"

[[combos]]
name = "duo"
targets = ["p/a", "p/b"]
{LONG_TRANSIENT}
"#,
            provider = provider("p", &mock.base_url(), &["a", "b"]),
        ),
        &[("TG_C1", "key-c1")],
    );
    let mut client = Client::connect(gw.addr());
    let r = ask(&mut client, "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(attempts(&r), "2");
    // a is tried again at once: nothing cooled, nothing locked.
    let r = ask(&mut client, "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(attempts(&r), "1");
    assert_eq!(models_seen(&mock), ["a", "b", "a"]);
}

#[test]
fn the_lock_holds_for_both_connections_when_their_owners_are_different_shards() {
    // Connection ids are dense in file order; with two shards, connection 0 is owned by
    // shard 0 and connection 2 by shard 1 (`mix64(DOMAIN_CONNECTION | id) % 2`).
    let mock = MockUpstream::start();
    let other = MockUpstream::start();
    mock.on(CHAT, Reply::error(503, "overloaded"));
    mock.on(CHAT, Reply::error(503, "overloaded"));
    mock.on_always(CHAT, Reply::openai_chat("from b"));
    other.on_always(CHAT, Reply::openai_chat("unused"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{p}{q}
[[connections]]
id = "c0"
provider = "p"
priority = 1
api_key_env = "TG_C0"

[[connections]]
id = "pad"
provider = "q"
api_key_env = "TG_PAD"

[[connections]]
id = "c2"
provider = "p"
priority = 2
api_key_env = "TG_C2"

[[combos]]
name = "duo"
targets = ["p/a", "p/b"]
{LONG_TRANSIENT}
"#,
            p = provider("p", &mock.base_url(), &["a", "b"]),
            q = provider("q", &other.base_url(), &["x"]),
        ),
        &[
            ("TG_C0", "key-c0"),
            ("TG_PAD", "key-pad"),
            ("TG_C2", "key-c2"),
        ],
    );
    let mut client = Client::connect(gw.addr());
    let r = ask(&mut client, "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    // a failed on both connections; b was still tried on the first and served.
    assert_eq!(attempts(&r), "3");
    assert_eq!(served_by(&r), "c0");
    assert_eq!(models_seen(&mock), ["a", "a", "b"]);
    assert_eq!(
        keys_seen(&mock),
        ["Bearer key-c0", "Bearer key-c2", "Bearer key-c0"]
    );

    // Both owners' locks reached this shard: a is skipped on c0 and on c2.
    for n in 0..3 {
        let r = ask(&mut client, "duo");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(attempts(&r), "1", "request {n}");
        assert_eq!(served_by(&r), "c0");
    }
    assert_eq!(models_seen(&mock), ["a", "a", "b", "b", "b", "b"]);
    // Neither connection cooled: the direct route to b still uses c0 first.
    let r = ask(&mut client, "p/b");
    assert_eq!(served_by(&r), "c0", "{}", r.text());
    assert_eq!(other.hits(CHAT), 0);
}

#[test]
fn a_lock_on_one_shards_connection_routes_the_next_request_to_the_other_shards_target() {
    // c0 (connection 0) is owned by shard 0, d2 (connection 2) by shard 1.
    let p_mock = MockUpstream::start();
    let q_mock = MockUpstream::start();
    p_mock.on(CHAT, Reply::error(502, "bad gateway"));
    p_mock.on_always(CHAT, Reply::openai_chat("from p"));
    q_mock.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{p}{q}
[[connections]]
id = "c0"
provider = "p"
api_key_env = "TG_C0"

[[connections]]
id = "pad"
provider = "q"
priority = 9
api_key_env = "TG_PAD"

[[connections]]
id = "d2"
provider = "q"
priority = 1
api_key_env = "TG_D2"

[[combos]]
name = "split"
targets = ["p/a", "q/x"]
{LONG_TRANSIENT}
"#,
            p = provider("p", &p_mock.base_url(), &["a", "b"]),
            q = provider("q", &q_mock.base_url(), &["x"]),
        ),
        &[
            ("TG_C0", "key-c0"),
            ("TG_PAD", "key-pad"),
            ("TG_D2", "key-d2"),
        ],
    );
    let mut client = Client::connect(gw.addr());
    let r = ask(&mut client, "split");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "d2");
    assert_eq!(attempts(&r), "2");
    for n in 0..3 {
        let r = ask(&mut client, "split");
        assert_eq!(served_by(&r), "d2", "request {n}: {}", r.text());
        assert_eq!(attempts(&r), "1", "request {n}: a is locked on c0");
    }
    // Only the model is out: c0 still serves p's other model.
    let r = ask(&mut client, "p/b");
    assert_eq!(r.status, 200, "c0 was cooled: {}", r.text());
    assert_eq!(served_by(&r), "c0");
    assert_eq!(models_seen(&p_mock), ["a", "b"]);
}

// ---------------------------------------------------------------------------------------
// Item 17: combo model lockouts

fn lockout_gateway(mock: &MockUpstream, lockout: &str) -> Gateway {
    Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{provider}
[[connections]]
id = "c1"
provider = "p"
api_key_env = "TG_C1"

[[combos]]
name = "duo"
targets = ["p/a", "p/b"]

{lockout}
"#,
            provider = provider("p", &mock.base_url(), &["a", "b"]),
        ),
        &[("TG_C1", "key-c1")],
    )
}

#[test]
fn an_enabled_model_lockout_locks_a_failing_combo_target_for_its_own_cooldown() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(503, "overloaded"));
    mock.on_always(CHAT, Reply::openai_chat("from b"));
    let gw = lockout_gateway(
        &mock,
        "[resilience.model_lockout]\nenabled = true\nbase_cooldown_ms = 90000\n",
    );
    assert!(
        !gw.logs().contains("model_lockout"),
        "model_lockout is active, not warned about: {}",
        gw.logs()
    );
    let mut client = Client::connect(gw.addr());
    let r = ask(&mut client, "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(attempts(&r), "2");
    // The combo lock: 90 s (the transient cooldown alone would be 3 s).
    let r = ask(&mut client, "p/a");
    assert_eq!(r.status, 429, "{}", r.text());
    let wait = retry_after_s(&r);
    assert!(
        (80..=90).contains(&wait),
        "Retry-After {wait}: {}",
        r.text()
    );
    assert_eq!(models_seen(&mock), ["a", "b"]);
}

#[test]
fn a_status_outside_the_lockout_error_codes_is_not_locked_by_the_combo_lockout() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(503, "overloaded"));
    mock.on_always(CHAT, Reply::openai_chat("from b"));
    let gw = lockout_gateway(
        &mock,
        "[resilience.model_lockout]\nenabled = true\nbase_cooldown_ms = 90000\nerror_codes = [429]\n",
    );
    let mut client = Client::connect(gw.addr());
    let r = ask(&mut client, "duo");
    assert_eq!(r.status, 200, "{}", r.text());
    // Only the transient lock (3 s base) holds a.
    let r = ask(&mut client, "p/a");
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(retry_after_s(&r) <= 3, "{}", r.text());
}

// ---------------------------------------------------------------------------------------
// Item 18: the connection breaker on the combo path

/// A breaker that opens on its second counted failure, on a connection whose failures cool
/// nothing (`disable_cooling`), so only the breaker keeps it out.
const TWO_STRIKES: &str = r#"
[resilience.provider_breaker.apikey]
failure_threshold = 2
degradation_threshold = 1
"#;

#[test]
fn a_failure_is_not_counted_on_the_connection_breaker_when_the_next_target_is_the_same_provider() {
    let mock = MockUpstream::start();
    // a fails (a breaker status), then b refuses the request itself (a 400 is relayed and
    // is no breaker failure, nor a success that would lower the count).
    mock.on(CHAT, Reply::error(503, "overloaded"));
    mock.on(CHAT, Reply::error(400, "invalid value for 'temperature'"));
    mock.on(CHAT, Reply::error(503, "overloaded"));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{provider}
[[connections]]
id = "c1"
provider = "p"
disable_cooling = true
api_key_env = "TG_C1"

[[combos]]
name = "duo"
targets = ["p/a", "p/b"]
{TWO_STRIKES}
"#,
            provider = provider("p", &mock.base_url(), &["a", "b", "c", "d"]),
        ),
        &[("TG_C1", "key-c1")],
    );
    let mut client = Client::connect(gw.addr());
    // a fails, b (same provider) is next: not a breaker failure.
    let r = ask(&mut client, "duo");
    assert_eq!(r.status, 400, "b's answer is relayed: {}", r.text());
    assert_eq!(attempts(&r), "2");
    // A direct failure always counts: the first one here, below the threshold of 2.
    assert_eq!(ask(&mut client, "p/c").status, 503);
    // c1's breaker is still closed.
    let r = ask(&mut client, "p/d");
    assert_eq!(
        r.status,
        200,
        "the breaker counted the combo failure: {}",
        r.text()
    );
    assert_eq!(models_seen(&mock), ["a", "b", "c", "d"]);
}

#[test]
fn the_combo_path_counts_one_failure_per_connection_per_five_seconds() {
    let failing = MockUpstream::start();
    let healthy = MockUpstream::start();
    for _ in 0..3 {
        failing.on(CHAT, Reply::error(503, "overloaded"));
    }
    failing.on_always(CHAT, Reply::openai_chat("from p"));
    healthy.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{p}{q}
[[connections]]
id = "c1"
provider = "p"
disable_cooling = true
api_key_env = "TG_C1"

[[connections]]
id = "d1"
provider = "q"
api_key_env = "TG_D1"

[[combos]]
name = "first"
targets = ["p/a", "q/x"]

[[combos]]
name = "second"
targets = ["p/b", "q/x"]

[resilience.provider_breaker.apikey]
failure_threshold = 3
degradation_threshold = 2
"#,
            p = provider("p", &failing.base_url(), &["a", "b", "c", "d"]),
            q = provider("q", &healthy.base_url(), &["x"]),
        ),
        &[("TG_C1", "key-c1"), ("TG_D1", "key-d1")],
    );
    let mut client = Client::connect(gw.addr());
    // Two combo failures of c1 in quick succession (the next target is another provider,
    // so they are breaker failures): the second is inside the first's 5 s window.
    for model in ["first", "second"] {
        let r = ask(&mut client, model);
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_eq!(served_by(&r), "d1");
        assert_eq!(attempts(&r), "2", "{model}: c1 was tried");
    }
    // A direct failure counts: the second counted one, below the threshold of 3.
    assert_eq!(ask(&mut client, "p/c").status, 503);
    let r = ask(&mut client, "p/d");
    assert_eq!(
        r.status,
        200,
        "c1's breaker counted both combo failures: {}",
        r.text()
    );
    assert_eq!(models_seen(&failing), ["a", "b", "c", "d"]);
}

#[test]
fn a_direct_request_still_counts_every_failure() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::error(503, "overloaded"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{provider}
[[connections]]
id = "c1"
provider = "p"
disable_cooling = true
api_key_env = "TG_C1"
{TWO_STRIKES}
"#,
            provider = provider("p", &mock.base_url(), &["a"]),
        ),
        &[("TG_C1", "key-c1")],
    );
    let mut client = Client::connect(gw.addr());
    for _ in 0..2 {
        assert_eq!(ask(&mut client, "p/a").status, 503);
    }
    let r = ask(&mut client, "p/a");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.json()["error"]["code"],
        "provider_circuit_open",
        "{}",
        r.text()
    );
    assert_eq!(mock.hits(CHAT), 2);
}

// ---------------------------------------------------------------------------------------
// Item 20: rule scope

fn scoped_gateway(up: &MockUpstream, q: &MockUpstream, scope: &str) -> Gateway {
    Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

{pu}{pq}
[[connections]]
id = "c1"
provider = "up"
priority = 1
api_key_env = "TG_C1"

[[connections]]
id = "c2"
provider = "up"
priority = 2
api_key_env = "TG_C2"

[[connections]]
id = "d1"
provider = "q"
api_key_env = "TG_D1"

[[combos]]
name = "mix"
targets = ["up/m1", "up/m2", "q/x"]

[[resilience.provider_error_rules.up]]
status = 429
match = "organization quota"
scope = "{scope}"
"#,
            pu = provider("up", &up.base_url(), &["m1", "m2"]),
            pq = provider("q", &q.base_url(), &["x"]),
        ),
        &[
            ("TG_C1", "key-c1"),
            ("TG_C2", "key-c2"),
            ("TG_D1", "key-d1"),
        ],
    )
}

#[test]
fn a_provider_scoped_failure_skips_the_providers_other_connections_for_the_request() {
    let up = MockUpstream::start();
    let q = MockUpstream::start();
    up.on_always(
        CHAT,
        Reply::error(429, "Your organization quota is used up"),
    );
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = scoped_gateway(&up, &q, "provider");
    let r = Client::connect(gw.addr()).request("POST", CHAT, &[], &body("mix"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "d1");
    assert_eq!(attempts(&r), "2", "up was tried once, then q");
    // Neither c2 nor up's other target was tried after c1's provider-scoped 429.
    assert_eq!(keys_seen(&up), ["Bearer key-c1"]);
}

#[test]
fn a_connection_scoped_failure_skips_only_that_connection() {
    let up = MockUpstream::start();
    let q = MockUpstream::start();
    up.on(
        CHAT,
        Reply::error(429, "Your organization quota is used up"),
    );
    up.on_always(CHAT, Reply::openai_chat("from c2"));
    q.on_always(CHAT, Reply::openai_chat("from q"));
    let gw = scoped_gateway(&up, &q, "connection");
    let r = Client::connect(gw.addr()).request("POST", CHAT, &[], &body("mix"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        served_by(&r),
        "c2",
        "the provider's other connection serves"
    );
    assert_eq!(keys_seen(&up), ["Bearer key-c1", "Bearer key-c2"]);
    assert_eq!(q.hits(CHAT), 0);
}
