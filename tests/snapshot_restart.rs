//! The snapshot across restarts of the real binary: an open breaker, a cooling connection,
//! a banned one, session pins, PATCHed resilience settings and a PATCHed connection survive
//! SIGTERM and a start with another `workers` count — shown by `tidegate snapshot
//! inspect`, by the management API and by traffic (nothing reaches the upstreams that the
//! restored state rules out; a pinned session keeps its connection). A `kill -9` loop under load never leaves a slot that fails
//! validation, and never loses a write the gateway reported done.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use support::gateway::run_tidegate;
use support::*;

const KEYS: &[(&str, &str)] = &[
    ("TG_K1", "key-one"),
    ("TG_K2", "key-two"),
    ("TG_K3", "key-three"),
];

/// The mocks behind the three providers.
struct Upstreams {
    down: MockUpstream,
    up: MockUpstream,
    pair: MockUpstream,
}

/// Provider `down` (one connection `d1`, never cooled, so its 503s reach the breaker),
/// provider `up` with `c1`, `c2`, `c3` in priority order, and provider `pair` with two
/// healthy connections `x1`, `x2` for session pins.
fn config(u: &Upstreams, workers: usize, state_dir: &Path) -> String {
    let (down, up) = (&u.down, &u.up);
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = {workers}
state_dir = "{}"
snapshot_interval_ms = 50

[[providers]]
id = "down"
format = "openai"
base_url = "{}"
models = ["m1"]

[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "d1"
provider = "down"
disable_cooling = true

[[connections]]
id = "c1"
provider = "up"
priority = 1
api_key_env = "TG_K1"

[[connections]]
id = "c2"
provider = "up"
priority = 2
api_key_env = "TG_K2"

[[connections]]
id = "c3"
provider = "up"
priority = 3
api_key_env = "TG_K3"

[[providers]]
id = "pair"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "x1"
provider = "pair"
priority = 1

[[connections]]
id = "x2"
provider = "pair"
priority = 2

[resilience]
session_affinity_ttl_ms = 600000

[resilience.provider_breaker.apikey]
failure_threshold = 3
degradation_threshold = 2
reset_timeout_ms = 120000
"#,
        state_dir.display(),
        down.base_url(),
        up.base_url(),
        u.pair.base_url()
    )
}

/// A request of session `session` to `pair/m1`: the connection that served it.
fn ask_session(gw: &Gateway, session: &str) -> String {
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[("x-session-id", session)],
        br#"{"model":"pair/m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-omniroute-selected-connection-id")
        .unwrap_or_default()
        .to_owned()
}

fn management(gw: &Gateway, method: &str, path: &str, body: &[u8]) -> serde_json::Value {
    let r = Client::connect(gw.addr()).request(
        method,
        path,
        &[("content-type", "application/json")],
        body,
    );
    assert_eq!(r.status, 200, "{method} {path}: {}", r.text());
    serde_json::from_str(&r.text()).unwrap()
}

/// What the management API shows of the pins (as many as `pins`, of `sessions` distinct
/// sessions) and the PATCHed settings.
fn assert_runtime_state_served(gw: &Gateway, pins: usize, sessions: usize) {
    let health = management(gw, "GET", "/api/monitoring/health", b"");
    let s = &health["sessions"];
    assert_eq!(s["stickyBoundCount"], pins, "{health:#}");
    assert_eq!(s["activeCount"], sessions, "{health:#}");
    let by_shard: u64 = s["byShard"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(by_shard as usize, pins, "{health:#}");
    let settings = management(gw, "GET", "/api/resilience", b"");
    assert_eq!(
        settings["requestQueue"]["maxWaitMs"], 4321,
        "the PATCHed setting is in force: {settings:#}"
    );
    assert_eq!(
        settings["providerBreaker"]["apikey"]["failureThreshold"], 3,
        "settings no PATCH named keep the file's value"
    );
}

fn ask(gw: &Gateway, model: &str) -> Response {
    Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[],
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

fn is_open(r: &Response) -> bool {
    r.status == 503 && r.header("x-tidegate-error") == Some("provider_circuit_open")
}

fn inspect(dir: &Path) -> serde_json::Value {
    let out = run_tidegate(
        &["snapshot", "inspect", "--state-dir", dir.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn stop(mut gw: Gateway) -> String {
    gw.terminate();
    let status = gw
        .wait_exit(Duration::from_secs(10))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{}", gw.logs());
    gw.logs()
}

/// What the restored state must look like, in the file. Returns how many pins it holds
/// and of how many distinct sessions (the `up` requests pin a session too: their first
/// message is a session key).
fn assert_state_in_file(dir: &Path) -> (usize, usize) {
    let j = inspect(dir);
    let state = &j["state"];
    let breaker = state["breakers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["provider"] == "down" && b["connection"] == "d1")
        .unwrap_or_else(|| panic!("no breaker for d1: {j:#}"));
    assert_eq!(breaker["state"], "OPEN", "{j:#}");
    assert!(breaker["openUntilWallMs"].as_u64().unwrap() > 0);
    let conn = |name: &str| {
        state["connections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["connection"] == name)
            .unwrap_or_else(|| panic!("no record for {name}: {j:#}"))
            .clone()
    };
    let c1 = conn("c1");
    assert_eq!(c1["testStatus"], "unavailable", "{c1:#}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let until = c1["rateLimitedUntilWallMs"].as_u64().unwrap();
    assert!(until > now_ms + 60_000, "c1 cools for minutes more: {c1:#}");
    let c2 = conn("c2");
    assert_eq!(c2["testStatus"], "banned", "{c2:#}");
    assert!(c2["lastError"].as_str().unwrap().contains("suspended"));
    assert!(
        !state["connections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["connection"] == "c3"),
        "a clean connection has no record"
    );
    for slot in j["slots"].as_array().unwrap() {
        assert_ne!(slot["status"], "invalid", "{j:#}");
    }
    let patch = state["runtimeSettings"][0]["patchJson"].as_str().unwrap();
    let patch: serde_json::Value = serde_json::from_str(patch).unwrap();
    assert_eq!(
        patch,
        serde_json::json!({"requestQueue": {"maxWaitMs": 4321}}),
        "only what was PATCHed: {j:#}"
    );
    let o = &state["connectionOverrides"];
    assert_eq!(o.as_array().unwrap().len(), 1, "{j:#}");
    assert_eq!(o[0]["connection"], "c3");
    assert_eq!(o[0]["maxConcurrent"], 7);
    assert_eq!(o[0]["rlModelConcurrency"][0]["model"], "m1");
    assert_eq!(o[0]["rlModelConcurrency"][0]["cap"], 2);
    let pins = state["affinityPins"].as_array().unwrap();
    let mut pinned: Vec<&str> = pins
        .iter()
        .filter(|p| p["provider"] == "pair")
        .map(|p| p["connection"].as_str().unwrap())
        .collect();
    pinned.sort_unstable();
    assert_eq!(pinned, vec!["x1", "x2"], "{j:#}");
    let mut sessions = std::collections::BTreeSet::new();
    for p in pins {
        let digest = p["session"].as_str().unwrap();
        assert_eq!(digest.len(), 64, "a digest, never the key");
        sessions.insert(digest.to_owned());
    }
    (pins.len(), sessions.len())
}

#[test]
fn breakers_cooldowns_and_bans_survive_a_restart_with_any_worker_count() {
    let state = TempDir::new("snapshot-restart");
    let u = Upstreams {
        down: MockUpstream::start(),
        up: MockUpstream::start(),
        pair: MockUpstream::start(),
    };
    let (down, up) = (&u.down, &u.up);
    down.on_always("/v1/chat/completions", Reply::error(503, "overloaded"));
    u.pair
        .on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    up.on(
        "/v1/chat/completions",
        Reply::error(429, "rate limited").header("retry-after", "300"),
    );
    up.on(
        "/v1/chat/completions",
        Reply::error(
            403,
            "Your account has been suspended for violating our terms",
        ),
    );
    up.on_always("/v1/chat/completions", Reply::openai_chat("ok"));

    let gw = Gateway::start_with_env(&config(&u, 2, state.path()), KEYS);
    // One request walks c1 (429: cools), c2 (403: banned) and is served by c3.
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c3"));
    for _ in 0..3 {
        assert_eq!(ask(&gw, "down/m1").status, 503);
    }
    eventually(Duration::from_secs(3), "the breaker to open", || {
        is_open(&ask(&gw, "down/m1")).then_some(())
    });
    // Two sessions pinned: the first to the best priority, the second to the other.
    assert_eq!(ask_session(&gw, "s-first"), "x1");
    assert_eq!(ask_session(&gw, "s-second"), "x2");
    management(
        &gw,
        "PATCH",
        "/api/resilience",
        br#"{"requestQueue":{"maxWaitMs":4321}}"#,
    );
    management(
        &gw,
        "PATCH",
        "/api/providers/c3",
        br#"{"max_concurrent":7,"rateLimitOverrides":{"modelConcurrency":{"m1":2}}}"#,
    );
    let health = management(&gw, "GET", "/api/monitoring/health", b"");
    assert!(
        health["sessions"]["stickyBoundCount"].as_u64().unwrap() >= 2,
        "{health:#}"
    );
    let down_hits = down.hits("/v1/chat/completions");
    let logs = stop(gw);
    assert!(!logs.contains("not trusted"), "{logs}");
    let mut in_file = assert_state_in_file(state.path());

    for workers in [2, 3, 1] {
        let up_hits = up.hits("/v1/chat/completions");
        let gw = Gateway::start_with_env(&config(&u, workers, state.path()), KEYS);
        assert_eq!(gw.shards(), workers);
        // Logged before the ready line, but on the other pipe: it may arrive a moment later.
        gw.wait_for_log("snapshot restored", secs(5));
        assert_runtime_state_served(&gw, in_file.0, in_file.1);
        // The second session first: a fresh pick would take x1 (never used, or used
        // longest ago, and first by priority); its restored pin says x2.
        for _ in 0..4 {
            assert_eq!(ask_session(&gw, "s-second"), "x2", "workers={workers}");
            assert_eq!(ask_session(&gw, "s-first"), "x1", "workers={workers}");
        }
        // Whichever shard a request lands on knows all of it from the first request.
        for _ in 0..6 {
            let r = ask(&gw, "down/m1");
            assert!(is_open(&r), "workers={workers}: {} {}", r.status, r.text());
            let r = ask(&gw, "up/m1");
            assert_eq!(r.status, 200);
            assert_eq!(
                r.header("x-omniroute-selected-connection-id"),
                Some("c3"),
                "workers={workers}: c1 still cools and c2 is still banned"
            );
        }
        assert_eq!(
            down.hits("/v1/chat/completions"),
            down_hits,
            "nothing passes the open breaker"
        );
        let keys: Vec<String> = up
            .requests_to("/v1/chat/completions")
            .iter()
            .skip(up_hits)
            .map(|r| r.header("authorization").unwrap_or("").to_string())
            .collect();
        assert_eq!(keys, vec!["Bearer key-three"; 6], "workers={workers}");
        let logs = stop(gw);
        assert!(!logs.contains("not trusted"), "{logs}");
        in_file = assert_state_in_file(state.path());
    }
}

/// The generation of the last write the gateway counted, from `/metrics`.
fn written_generation(gw: &Gateway) -> u64 {
    let r = Client::connect(gw.addr()).request("GET", "/metrics", &[], b"");
    r.text()
        .lines()
        .find_map(|l| l.strip_prefix("tidegate_snapshot_generation "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn kill_9_under_load_never_leaves_a_slot_that_fails_validation() {
    let state = TempDir::new("snapshot-kill9");
    let up = MockUpstream::start();
    // Failures and successes alternate: every request changes a breaker's counts or the
    // connection's last error, so the writer is busy when the kill lands.
    for _ in 0..20_000 {
        up.on("/v1/chat/completions", Reply::error(503, "overloaded"));
        up.on("/v1/chat/completions", Reply::openai_chat("ok"));
    }
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2
state_dir = "{}"
snapshot_interval_ms = 10

[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "up"
disable_cooling = true

[[connections]]
id = "c2"
provider = "up"
disable_cooling = true

[resilience.provider_breaker.apikey]
failure_threshold = 1000
degradation_threshold = 999
"#,
        state.path().display(),
        up.base_url()
    );
    let stopwatch = Stopwatch::start();
    let mut last_generation = 0;
    for round in 0..20 {
        let mut gw = Gateway::start(&toml);
        let logs = gw.logs();
        assert!(!logs.contains("not trusted"), "round {round}: {logs}");
        let stop = Arc::new(AtomicBool::new(false));
        let addr = gw.addr();
        let load: Vec<_> = (0..4)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(mut c) = Client::try_connect(addr) {
                            c.set_timeout(Duration::from_secs(2));
                            let body = r#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#;
                            let _ = c.try_write_raw(
                                format!(
                                    "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                                    body.len()
                                )
                                .as_bytes(),
                            );
                            let _ = c.try_read_response();
                        }
                    }
                })
            })
            .collect();
        // Kill once at least two more writes than last round have landed: mid-stream.
        let seen = eventually(
            Duration::from_secs(10),
            "snapshot writes under load",
            || {
                let g = written_generation(&gw);
                (g >= last_generation + 2).then_some(g)
            },
        );
        gw.kill();
        stop.store(true, Ordering::Relaxed);
        for t in load {
            let _ = t.join();
        }
        let j = inspect(state.path());
        for slot in j["slots"].as_array().unwrap() {
            assert_ne!(slot["status"], "invalid", "round {round}: {j:#}");
        }
        let newest = j["generation"].as_u64().unwrap();
        assert!(
            newest >= seen,
            "round {round}: a write the gateway reported (generation {seen}) was lost: {j:#}"
        );
        last_generation = newest;
    }
    assert!(stopwatch.elapsed() < Duration::from_secs(120), "bounded");
}
