//! The management API on two shards (issue 12): who may call it, every endpoint's success
//! and error answers, a PATCH that lowers a breaker threshold and is obeyed by traffic on
//! either shard, and a cooldown clear that makes a cooling connection serve at once. The
//! non-loopback half of the access rule (a caller from another host is refused while no
//! credential is configured) is covered by `admin::tests` in the library: a test here may
//! only reach loopback addresses.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const ADMIN: &str = "admin-secret";
const MANAGE_KEY: &str = "sk-manage";
const INFER_KEY: &str = "sk-infer";

/// One provider `up` at the mock with connection `c1` (cooling on unless `no_cooling`),
/// two shards, an admin token, a manage key and an inference key.
fn config(mock: &MockUpstream, no_cooling: bool) -> String {
    let cooling = if no_cooling {
        "disable_cooling = true"
    } else {
        ""
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2
admin_token_env = "TG_ADMIN"

[[client_keys]]
id = "ops"
key = "{MANAGE_KEY}"
scopes = ["manage"]

[[client_keys]]
id = "app"
key = "{INFER_KEY}"

[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "up"
{cooling}
"#,
        mock.base_url()
    )
}

fn start(mock: &MockUpstream, no_cooling: bool) -> Gateway {
    let gw = Gateway::start_with_env(&config(mock, no_cooling), &[("TG_ADMIN", ADMIN)]);
    assert_eq!(gw.shards(), 2);
    gw
}

/// A management call on a new client connection (the kernel spreads them over shards).
fn call(gw: &Gateway, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers: Vec<(&str, &str)> = vec![("content-type", "application/json")];
    if let Some(a) = &auth {
        headers.push(("authorization", a.as_str()));
    }
    Client::connect(gw.addr()).request(method, path, &headers, body)
}

fn admin(gw: &Gateway, method: &str, path: &str, body: &[u8]) -> Response {
    call(gw, method, path, Some(ADMIN), body)
}

fn ask(gw: &Gateway) -> Response {
    Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {INFER_KEY}"))],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    )
}

fn is_open(r: &Response) -> bool {
    r.status == 503 && r.header("x-tidegate-error") == Some("provider_circuit_open")
}

/// `server.admin_token_env` names a variable the gateway's environment lacks and no key has
/// scope manage: a caller presenting a credential is refused with a message naming it.
#[test]
fn a_missing_admin_token_variable_is_named_when_a_credential_is_refused() {
    let mock = MockUpstream::start();
    let manage =
        format!("[[client_keys]]\nid = \"ops\"\nkey = \"{MANAGE_KEY}\"\nscopes = [\"manage\"]\n");
    let cfg = config(&mock, true);
    assert!(cfg.contains(&manage), "{cfg}");
    let gw = Gateway::start(&cfg.replace(&manage, ""));
    let r = admin(&gw, "GET", "/api/resilience", b"");
    assert_eq!(r.status, 403, "{}", r.text());
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(
        message.contains("TG_ADMIN (server.admin_token_env) is not set"),
        "{message}"
    );
}

#[test]
fn management_calls_need_the_admin_token_or_a_manage_key_once_one_is_configured() {
    let mock = MockUpstream::start();
    let gw = start(&mock, true);
    for (method, path) in [
        ("GET", "/api/monitoring/health"),
        ("GET", "/api/resilience"),
        ("GET", "/api/resilience/cooldowns"),
        ("GET", "/api/resilience/model-cooldowns"),
        ("POST", "/api/resilience/reset"),
    ] {
        // No credential, even from loopback: 401 in the error envelope.
        let r = call(&gw, method, path, None, b"{}");
        assert_eq!(r.status, 401, "{method} {path}: {}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["type"], "authentication_error", "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains("manage"));
        // A wrong token: 401.
        let r = call(&gw, method, path, Some("nope"), b"{}");
        assert_eq!(r.status, 401, "{method} {path}");
        // An inference key: 403.
        let r = call(&gw, method, path, Some(INFER_KEY), b"{}");
        assert_eq!(r.status, 403, "{method} {path}");
        assert_eq!(r.json()["error"]["type"], "permission_error");
        // The admin token and a manage key: answered.
        assert_eq!(
            call(&gw, method, path, Some(ADMIN), b"{}").status,
            200,
            "{method} {path}"
        );
        assert_eq!(
            call(&gw, method, path, Some(MANAGE_KEY), b"{}").status,
            200,
            "{method} {path}"
        );
    }
    // A method a route does not take: 405 with Allow.
    let r = admin(&gw, "PUT", "/api/resilience", b"{}");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, PATCH"));
    // /metrics from loopback needs no token even when one is configured.
    let r = call(&gw, "GET", "/metrics", None, b"");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("tidegate_build_info"));
}

#[test]
fn with_no_credential_configured_loopback_callers_are_answered() {
    let mock = MockUpstream::start();
    let text = one_upstream(&mock.base_url(), 2, "", "");
    let gw = Gateway::start(&text);
    let r = call(&gw, "GET", "/api/resilience", None, b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["providerBreaker"]["apikey"]["failureThreshold"],
        12
    );
}

#[test]
fn a_patch_that_lowers_the_breaker_threshold_is_obeyed_on_both_shards() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::error(503, "overloaded"));
    let gw = start(&mock, true);

    // Error answers first: nothing of them is applied.
    let r = admin(&gw, "PATCH", "/api/resilience", b"{not json");
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["details"][0]["message"],
        "Invalid JSON body"
    );
    let r = admin(&gw, "PATCH", "/api/resilience", b"{}");
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["details"][0]["message"],
        "Must provide resilience settings to update"
    );
    let r = admin(
        &gw,
        "PATCH",
        "/api/resilience",
        br#"{"providerBreaker":{"apikey":{"failureThreshold":0}}}"#,
    );
    assert_eq!(r.status, 400);
    let d = &r.json()["error"]["details"][0];
    assert_eq!(d["field"], "providerBreaker.apikey.failureThreshold");
    // The configuration file's own message for the same value.
    assert_eq!(
        d["message"],
        "resilience.provider_breaker.apikey.failure_threshold: 0 is out of range (1..=1000)"
    );
    let r = admin(
        &gw,
        "PATCH",
        "/api/resilience",
        br#"{"providerBreaker":{"apikey":{"failureThreshold":3,"degradationThreshold":3}}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = admin(
        &gw,
        "PATCH",
        "/api/resilience",
        br#"{"requestQueue":{"noSuchKey":1}}"#,
    );
    assert_eq!(r.status, 400);
    let r = admin(&gw, "GET", "/api/resilience", b"");
    assert_eq!(
        r.json()["providerBreaker"]["apikey"]["failureThreshold"],
        12
    );

    // Threshold 12 → 2.
    let r = admin(
        &gw,
        "PATCH",
        "/api/resilience",
        br#"{"providerBreaker":{"apikey":{"failureThreshold":2,"degradationThreshold":1}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["ok"], true);
    assert_eq!(body["providerBreaker"]["apikey"]["failureThreshold"], 2);
    // Every shard reads the new value.
    for _ in 0..6 {
        let r = admin(&gw, "GET", "/api/resilience", b"");
        assert_eq!(r.json()["providerBreaker"]["apikey"]["failureThreshold"], 2);
        assert_eq!(
            r.json()["providerBreaker"]["apikey"]["degradationThreshold"],
            1
        );
    }
    // Two failures open the breaker (the default would take twelve), wherever they land.
    for _ in 0..2 {
        let r = ask(&gw);
        assert_eq!(r.status, 503);
        assert!(!is_open(&r));
    }
    eventually(Duration::from_secs(3), "the breaker to open", || {
        is_open(&ask(&gw)).then_some(())
    });
    assert_eq!(mock.hits("/v1/chat/completions"), 2);
    for _ in 0..20 {
        assert!(is_open(&ask(&gw)), "every shard refuses");
    }
    assert_eq!(mock.hits("/v1/chat/completions"), 2);

    // The health endpoint shows it; a reset closes it on every shard.
    let h = admin(&gw, "GET", "/api/monitoring/health", b"").json();
    assert_eq!(h["status"], "healthy");
    assert_eq!(h["shards"], 2);
    assert_eq!(h["circuitBreakers"]["open"], 1, "{h}");
    // A 503 is counted on the connection-scoped breaker (A §1.9).
    assert_eq!(h["providerHealth"]["up::conn::c1"]["state"], "OPEN", "{h}");
    assert_eq!(h["providerBreakers"][0]["failureCount"], 2, "{h}");
    // Listed with its provider's name, its connection's in its own field.
    let open: Vec<&serde_json::Value> = h["providerBreakers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["state"] == "OPEN")
        .collect();
    assert_eq!(open.len(), 1, "{h}");
    assert_eq!(open[0]["provider"], "up", "{h}");
    assert_eq!(open[0]["connection"], "c1", "{h}");
    assert_eq!(open[0]["scope"], "connection", "{h}");
    assert_eq!(open[0]["breaker"], "up::conn::c1", "{h}");
    let r = admin(&gw, "POST", "/api/resilience/reset", b"ignored");
    assert_eq!(r.status, 200);
    let r = r.json();
    assert_eq!(r["ok"], true);
    assert!(r["resetCount"].as_u64().unwrap() >= 1, "{r}");
    mock.on_always("/v1/chat/completions", Reply::openai_chat("back"));
    for _ in 0..6 {
        assert_eq!(ask(&gw).status, 200);
    }
}

#[test]
fn a_cooldown_clear_makes_a_cooling_connection_serve_at_once() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(429, "slow down").header("retry-after", "600"),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("served"));
    let gw = start(&mock, false);
    assert_eq!(ask(&gw).status, 429);
    // c1 cools for ten minutes: every shard refuses without asking the upstream.
    eventually(Duration::from_secs(3), "c1 to cool everywhere", || {
        (0..4).all(|_| ask(&gw).status != 200).then_some(())
    });
    assert_eq!(mock.hits("/v1/chat/completions"), 1);
    let list = admin(&gw, "GET", "/api/resilience/cooldowns", b"").json();
    let c = &list["connections"][0];
    assert_eq!(c["id"], "c1");
    assert_eq!(c["provider"], "up");
    assert_eq!(c["status"], "cooling_down", "{list}");
    assert!(c["cooldownRemainingMs"].as_u64().unwrap() > 500_000);
    assert_eq!(c["errorCode"], "429");
    let h = admin(&gw, "GET", "/api/monitoring/health", b"").json();
    assert_eq!(h["connectionHealth"]["up"]["coolingDown"], 1, "{h}");
    let filtered = admin(&gw, "GET", "/api/resilience/cooldowns?provider=other", b"").json();
    assert_eq!(filtered["connections"], json!([]));

    // Error answers.
    let r = admin(&gw, "POST", "/api/resilience/cooldowns", b"{oops");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], "Invalid JSON body");
    let r = admin(&gw, "POST", "/api/resilience/cooldowns", b"{}");
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["details"][0]["message"],
        "Provide connectionIds or set all to true"
    );
    let r = admin(
        &gw,
        "POST",
        "/api/resilience/cooldowns",
        br#"{"all":true,"extra":1}"#,
    );
    assert_eq!(r.status, 400);
    let r = admin(
        &gw,
        "POST",
        "/api/resilience/cooldowns",
        br#"{"all":"yes"}"#,
    );
    assert_eq!(r.status, 400);
    // Unknown ids are ignored (A §5.2): nothing cleared.
    let r = admin(
        &gw,
        "POST",
        "/api/resilience/cooldowns",
        br#"{"connectionIds":["nope"]}"#,
    );
    assert_eq!(r.status, 200);
    let r = r.json();
    assert_eq!(
        (r["cleared"].as_u64(), r["unchanged"].as_u64()),
        (Some(0), Some(0))
    );
    assert_ne!(ask(&gw).status, 200, "still cooling");

    // The clear: the next request, on any shard, is served.
    let r = admin(
        &gw,
        "POST",
        "/api/resilience/cooldowns",
        br#"{"connectionIds":["c1"]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r: Value = r.json();
    assert_eq!(r["ok"], true);
    assert_eq!(r["cleared"], 1);
    assert_eq!(r["unchanged"], 0);
    assert_eq!(r["skippedTerminal"], 0);
    for _ in 0..6 {
        let r = ask(&gw);
        assert_eq!(r.status, 200, "served at once: {}", r.text());
    }
    let r = admin(
        &gw,
        "POST",
        "/api/resilience/cooldowns",
        br#"{"all":true,"provider":"up"}"#,
    );
    assert_eq!(r.json()["unchanged"], 1);
}

#[test]
fn model_cooldowns_are_listed_and_their_delete_validates_its_body() {
    let mock = MockUpstream::start();
    let gw = start(&mock, true);
    let r = admin(&gw, "GET", "/api/resilience/model-cooldowns", b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"items": []}));
    let r = admin(
        &gw,
        "DELETE",
        "/api/resilience/model-cooldowns",
        br#"{"provider":"up"}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["message"],
        "provider and model are required"
    );
    // Invalid JSON counts as {} (A §4.8).
    let r = admin(&gw, "DELETE", "/api/resilience/model-cooldowns", b"{x");
    assert_eq!(r.status, 400);
    let r = admin(
        &gw,
        "DELETE",
        "/api/resilience/model-cooldowns",
        br#"{"all":1}"#,
    );
    assert_eq!(r.status, 400);
    let r = admin(
        &gw,
        "DELETE",
        "/api/resilience/model-cooldowns",
        br#"{"all":true}"#,
    );
    assert_eq!(r.json(), json!({"ok": true, "clearedAll": true}));
    let r = admin(
        &gw,
        "DELETE",
        "/api/resilience/model-cooldowns",
        br#"{"provider":"up","model":"m1","connection":"ignored"}"#,
    );
    assert_eq!(r.json(), json!({"ok": true, "removed": false}));
}

#[test]
fn a_patched_connection_cap_applies_to_the_next_request_on_either_shard() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("held").wait_for(&gate),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("quick"));
    let gw = start(&mock, true);

    // Error answers: nothing of them is applied.
    let r = admin(
        &gw,
        "PATCH",
        "/api/providers/nope",
        br#"{"max_concurrent":1}"#,
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["message"], "no connection \"nope\"");
    let r = admin(&gw, "PATCH", "/api/providers/c1", b"{bad");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["message"], "Invalid JSON body");
    let r = admin(
        &gw,
        "PATCH",
        "/api/providers/c1",
        br#"{"max_concurrent":0}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["details"][0]["message"],
        "connections[0].max_concurrent: 0 is out of range (1..=100000)"
    );
    let r = admin(
        &gw,
        "PATCH",
        "/api/providers/c1",
        br#"{"rateLimitOverrides":{"maxWaitMs":999999}}"#,
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"]["details"][0]["message"],
        "connections[0].rate_limit_overrides.max_wait_ms: 999999 is out of range (1..=120000)"
    );
    let r = admin(&gw, "PATCH", "/api/providers/c1", br#"{"weight":3}"#);
    assert_eq!(r.status, 400);
    let r = call(
        &gw,
        "PATCH",
        "/api/providers/c1",
        Some(INFER_KEY),
        br#"{"max_concurrent":1}"#,
    );
    assert_eq!(r.status, 403);
    let r = admin(&gw, "GET", "/api/providers/c1", b"");
    assert_eq!(r.status, 405);

    // One request at a time on c1, and a short wait for the permit.
    let r = admin(
        &gw,
        "PATCH",
        "/api/providers/c1",
        br#"{"max_concurrent":1,"rateLimitOverrides":{"maxWaitMs":50,"modelConcurrency":{"m1":1}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["ok"], true);
    assert_eq!(body["maxConcurrent"], 1);
    assert_eq!(body["rateLimitOverrides"]["maxWaitMs"], 50);
    assert_eq!(body["rateLimitOverrides"]["modelConcurrency"]["m1"], 1);

    let addr = gw.addr();
    let held = std::thread::spawn(move || {
        Client::connect(addr).request(
            "POST",
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {INFER_KEY}"))],
            br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
        )
    });
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(5));
    // Every other request, on either shard, finds the one permit taken.
    for _ in 0..6 {
        let r = ask(&gw);
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.header("x-tidegate-error"), Some("semaphore_timeout"));
    }
    assert_eq!(mock.hits("/v1/chat/completions"), 1);
    gate.open();
    assert_eq!(held.join().unwrap().status, 200);

    // Unset again: no cap.
    let r = admin(
        &gw,
        "PATCH",
        "/api/providers/c1",
        br#"{"max_concurrent":null,"rateLimitOverrides":{"maxWaitMs":null,"modelConcurrency":null}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["maxConcurrent"], Value::Null);
    assert_eq!(ask(&gw).status, 200);
}

#[test]
fn a_patched_cap_rise_admits_the_queued_requests_at_once() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("held").wait_for(&gate),
    );
    // One request at a time on c1; the others wait for its permit (the default 30 s queue
    // budget outlasts the test).
    let cfg = config(&mock, true).replace(
        "provider = \"up\"\n",
        "provider = \"up\"\nmax_concurrent = 1\n",
    );
    let gw = Gateway::start_with_env(&cfg, &[("TG_ADMIN", ADMIN)]);
    let addr = gw.addr();
    let held: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                Client::connect(addr).request(
                    "POST",
                    "/v1/chat/completions",
                    &[("authorization", &format!("Bearer {INFER_KEY}"))],
                    br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
                )
            })
        })
        .collect();
    eventually(secs(10), "one request upstream, two queued", || {
        (mock.current_in_flight() == 1 && metric(addr, "tidegate_gate_waiters") == 2).then_some(())
    });
    // Raise the cap while the first is still held: the two queued start now, none finished.
    let r = admin(
        &gw,
        "PATCH",
        "/api/providers/c1",
        br#"{"max_concurrent":3}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    eventually(secs(5), "the queued requests upstream", || {
        (mock.current_in_flight() == 3).then_some(())
    });
    assert_eq!(metric(addr, "tidegate_gate_waiters"), 0);
    assert_eq!(metric(addr, "tidegate_gate_permits"), 3);
    gate.open();
    for h in held {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// `sessions` in the health answer counts the session affinity pins of every owner shard:
/// 12 sessions pinned over many client connections (both shards serve and own some) are
/// 12 live pins of 12 sessions, split over the shards; a session asked again adds none.
#[test]
fn health_counts_session_pins_of_every_shard() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    // Pins are made when a provider has more than one connection to choose from.
    let toml = format!(
        "{}\n[[connections]]\nid = \"c2\"\nprovider = \"up\"\n\n[resilience]\nsession_affinity_ttl_ms = 600000\n",
        config(&mock, true)
    );
    let gw = Gateway::start_with_env(&toml, &[("TG_ADMIN", ADMIN)]);
    let health = |gw: &Gateway| -> Value {
        let r = admin(gw, "GET", "/api/monitoring/health", b"");
        assert_eq!(r.status, 200, "{}", r.text());
        serde_json::from_str::<Value>(&r.text()).unwrap()["sessions"].clone()
    };
    let empty = health(&gw);
    assert_eq!(
        empty,
        json!({"activeCount": 0, "stickyBoundCount": 0, "byApiKey": {}, "top": [], "byShard": [0, 0]})
    );
    let pin = |session: &str| {
        let r = Client::connect(gw.addr()).request(
            "POST",
            "/v1/chat/completions",
            &[
                ("authorization", &format!("Bearer {INFER_KEY}")),
                ("x-session-id", session),
            ],
            br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert_eq!(r.status, 200, "{}", r.text());
    };
    for i in 0..12 {
        pin(&format!("session-{i}"));
    }
    pin("session-0");
    let s = health(&gw);
    assert_eq!(s["activeCount"], 12, "{s:#}");
    assert_eq!(s["stickyBoundCount"], 12, "{s:#}");
    let by_shard: Vec<u64> = s["byShard"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(by_shard.len(), 2);
    assert_eq!(by_shard.iter().sum::<u64>(), 12);
}

/// A PATCH that moves a connection's gate home (a provider gate turned on puts its gates
/// on the provider's owner shard) drains the old home rather than migrating permits: a
/// permit held across the PATCH goes back to the home that granted it (nothing leaks,
/// every gauge returns to 0), and from then on the new home enforces the cap on either
/// shard.
#[test]
fn a_patch_that_moves_a_gate_home_drains_the_old_home() {
    let mock = MockUpstream::start();
    let first = Gate::new();
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("held").wait_for(&first),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("quick"));
    let gw = start(&mock, true);
    let addr = gw.addr();
    let r = admin(
        &gw,
        "PATCH",
        "/api/providers/c1",
        br#"{"max_concurrent":1,"rateLimitOverrides":{"maxWaitMs":50}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let hold = move || {
        std::thread::spawn(move || {
            Client::connect(addr).request(
                "POST",
                "/v1/chat/completions",
                &[("authorization", &format!("Bearer {INFER_KEY}"))],
                br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
            )
        })
    };
    // A permit taken at the connection's own gate home…
    let held = hold();
    mock.wait_for_hits("/v1/chat/completions", 1, Duration::from_secs(5));
    assert_eq!(metric(addr, "tidegate_gate_permits"), 1);
    // …then the home moves: the provider gets a gate of its own.
    let r = admin(
        &gw,
        "PATCH",
        "/api/resilience",
        br#"{"providerQuotaOverrides":{"up":{"providerConcurrency":1}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    first.open();
    assert_eq!(held.join().unwrap().status, 200);
    eventually(Duration::from_secs(5), "the old home drained", || {
        (flow_held(addr) == 0).then_some(())
    });

    // The new home enforces the cap of one, whichever shard a request lands on.
    let second = Gate::new();
    mock.on(
        "/v1/chat/completions",
        Reply::openai_chat("held again").wait_for(&second),
    );
    let hits = mock.hits("/v1/chat/completions");
    let held = hold();
    mock.wait_for_hits("/v1/chat/completions", hits + 1, Duration::from_secs(5));
    for _ in 0..6 {
        let r = ask(&gw);
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.header("x-tidegate-error"), Some("semaphore_timeout"));
    }
    second.open();
    assert_eq!(held.join().unwrap().status, 200);
    eventually(Duration::from_secs(5), "every permit back", || {
        (flow_held(addr) == 0).then_some(())
    });
}
