//! The snapshot across restarts of the real binary: an open breaker, a cooling connection
//! and a banned one survive SIGTERM and a start with another `workers` count — shown by
//! `tidegate snapshot inspect` and by traffic (nothing reaches the upstreams that the
//! restored state rules out). A `kill -9` loop under load never leaves a slot that fails
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

/// Provider `down` (one connection `d1`, never cooled, so its 503s reach the breaker) and
/// provider `up` with `c1`, `c2`, `c3` in priority order.
fn config(down: &MockUpstream, up: &MockUpstream, workers: usize, state_dir: &Path) -> String {
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

[resilience.provider_breaker.apikey]
failure_threshold = 3
degradation_threshold = 2
reset_timeout_ms = 120000
"#,
        state_dir.display(),
        down.base_url(),
        up.base_url()
    )
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

/// What the restored state must look like, in the file.
fn assert_state_in_file(dir: &Path) {
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
}

#[test]
fn breakers_cooldowns_and_bans_survive_a_restart_with_any_worker_count() {
    let state = TempDir::new("snapshot-restart");
    let down = MockUpstream::start();
    down.on_always("/v1/chat/completions", Reply::error(503, "overloaded"));
    let up = MockUpstream::start();
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

    let gw = Gateway::start_with_env(&config(&down, &up, 2, state.path()), KEYS);
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
    let down_hits = down.hits("/v1/chat/completions");
    let logs = stop(gw);
    assert!(!logs.contains("not trusted"), "{logs}");
    assert_state_in_file(state.path());

    for workers in [2, 3, 1] {
        let up_hits = up.hits("/v1/chat/completions");
        let gw = Gateway::start_with_env(&config(&down, &up, workers, state.path()), KEYS);
        assert_eq!(gw.shards(), workers);
        assert!(gw.logs().contains("snapshot restored"), "{}", gw.logs());
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
        assert_state_in_file(state.path());
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
