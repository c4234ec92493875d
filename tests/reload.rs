//! SIGHUP reloads the configuration file: a valid one is adopted by every shard at its next
//! quiet point (requests in flight finish on the old one); any problem keeps the running
//! configuration and logs each problem; `listen`, `workers` and `state_dir` are reported and kept.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::{Client, Gate, Gateway, MockUpstream, Reply, eventually, secs};

const CHAT: &str = "/v1/chat/completions";

fn config(listen: &str, workers: usize, key: &str, model: &str, upstream: &MockUpstream) -> String {
    format!(
        r#"
[server]
listen = "{listen}"
workers = {workers}

[[client_keys]]
id = "t"
key = "{key}"

{}{}"#,
        support::provider("up", &upstream.base_url(), &[model]),
        support::connection("c1", "up"),
    )
}

fn chat(addr: std::net::SocketAddr, key: &str, model: &str) -> support::Response {
    support::json_post(
        addr,
        CHAT,
        key,
        &serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
    )
}

fn hup(gw: &mut Gateway) {
    gw.signal(libc::SIGHUP);
}

#[test]
fn sighup_applies_a_new_config_once_in_flight_requests_finish_on_the_old_one() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(CHAT, Reply::openai_chat("held").wait_for(&gate));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let mut gw = Gateway::start(&config("127.0.0.1:0", 1, "key-one", "m1", &mock));
    let addr = gw.addr();

    // A request in flight across the reload.
    let mut held = Client::connect(addr);
    let body = br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#;
    held.start_request(
        "POST",
        CHAT,
        &[
            ("authorization", "Bearer key-one"),
            ("content-type", "application/json"),
        ],
        body,
    );
    mock.wait_for_hits(CHAT, 1, secs(10));

    std::fs::write(
        gw.config_path(),
        config("127.0.0.1:0", 1, "key-two", "m2", &mock),
    )
    .unwrap();
    hup(&mut gw);
    gw.wait_for_log("configuration reloaded", secs(10));
    gate.open();
    let r = held.read_response();
    assert_eq!(
        r.status,
        200,
        "the in-flight request finishes: {}",
        r.text()
    );

    // Then the new key and the new model list are in force, and the old ones are gone.
    eventually(secs(10), "the new key is accepted", || {
        (chat(addr, "key-two", "up/m2").status == 200).then_some(())
    });
    assert_eq!(chat(addr, "key-one", "up/m2").status, 401);
    let models = Client::connect(addr)
        .request(
            "GET",
            "/v1/models",
            &[("authorization", "Bearer key-two")],
            b"",
        )
        .text();
    assert!(
        models.contains("up/m2") && !models.contains("up/m1"),
        "{models}"
    );
    assert!(
        gw.wait_exit(support::ms(0)).is_none(),
        "SIGHUP ended the process"
    );
}

#[test]
fn sighup_with_an_invalid_config_keeps_the_running_one_and_logs_every_problem() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let mut gw = Gateway::start(&config("127.0.0.1:0", 2, "key-one", "m1", &mock));
    let broken = config("127.0.0.1:0", 2, "key-two", "m1", &mock)
        .replace("workers = 2", "workers = 2\nidle_timeout = 5")
        + "[[connections]]\nid = \"c2\"\nprovider = \"nope\"\n";
    std::fs::write(gw.config_path(), broken).unwrap();
    hup(&mut gw);
    gw.wait_for_log("keeping the running configuration", secs(10));
    let logs = gw.logs();
    assert!(logs.contains("server.idle_timeout"), "{logs}");
    assert!(logs.contains("nope"), "{logs}");
    assert!(logs.contains("reload refused (2 problem(s))"), "{logs}");
    assert_eq!(chat(gw.addr(), "key-one", "up/m1").status, 200);
    assert_eq!(chat(gw.addr(), "key-two", "up/m1").status, 401);
}

#[test]
fn sighup_reports_listen_and_workers_changes_keeps_them_and_applies_the_rest() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let mut gw = Gateway::start(&config("127.0.0.1:0", 2, "key-one", "m1", &mock));
    let addr = gw.addr();
    std::fs::write(
        gw.config_path(),
        config("127.0.0.1:1", 3, "key-two", "m1", &mock),
    )
    .unwrap();
    hup(&mut gw);
    gw.wait_for_log("configuration reloaded", secs(10));
    let logs = gw.logs();
    assert!(
        logs.contains("server.listen changed to 127.0.0.1:1"),
        "{logs}"
    );
    assert!(logs.contains("server.workers changed to 3"), "{logs}");
    // Still on the old address, with the new key on every shard.
    eventually(secs(10), "the new key is accepted", || {
        (chat(addr, "key-two", "up/m1").status == 200).then_some(())
    });
    for _ in 0..10 {
        assert_eq!(chat(addr, "key-two", "up/m1").status, 200);
        assert_eq!(chat(addr, "key-one", "up/m1").status, 401);
    }
}

/// `GET /api/resilience`'s provider-breaker failure threshold for API-key providers.
fn failure_threshold(addr: std::net::SocketAddr) -> serde_json::Value {
    let r = Client::connect(addr).request(
        "GET",
        "/api/resilience",
        &[("authorization", "Bearer ops-key")],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["providerBreaker"]["apikey"]["failureThreshold"].clone()
}

#[test]
fn sighup_replaces_settings_patched_through_the_management_api_on_every_shard() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let file = format!(
        "{}\n[[client_keys]]\nid = \"ops\"\nkey = \"ops-key\"\nscopes = [\"manage\"]\n\n[resilience.provider_breaker.apikey]\nfailure_threshold = 9\n",
        config("127.0.0.1:0", 2, "key-one", "m1", &mock)
    );
    let mut gw = Gateway::start(&file);
    let addr = gw.addr();
    assert_eq!(failure_threshold(addr), 9);

    let r = Client::connect(addr).request(
        "PATCH",
        "/api/resilience",
        &[
            ("authorization", "Bearer ops-key"),
            ("content-type", "application/json"),
        ],
        br#"{"providerBreaker":{"apikey":{"failureThreshold":12}}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Every connection (whichever shard takes it) sees the patched value.
    for _ in 0..8 {
        assert_eq!(failure_threshold(addr), 12);
    }

    // The reloaded file wins over the PATCH, on every shard.
    hup(&mut gw);
    gw.wait_for_log("configuration reloaded", secs(10));
    eventually(secs(10), "every shard is back on the file's value", || {
        (0..8).all(|_| failure_threshold(addr) == 9).then_some(())
    });
}

#[test]
fn sighup_reports_a_state_dir_change_and_keeps_the_directory_it_opened() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let mut gw = Gateway::start(&config("127.0.0.1:0", 2, "key-one", "m1", &mock));
    let dir = gw.config_path().parent().unwrap().to_path_buf();
    // The default `./state`, relative to the directory the binary runs in.
    assert!(dir.join("state").is_dir(), "state_dir created at start");
    std::fs::write(
        gw.config_path(),
        config("127.0.0.1:0", 2, "key-two", "m1", &mock)
            .replace("workers = 2\n", "workers = 2\nstate_dir = \"moved\"\n"),
    )
    .unwrap();
    hup(&mut gw);
    gw.wait_for_log("configuration reloaded", secs(10));
    let logs = gw.logs();
    assert!(logs.contains("server.state_dir changed to moved"), "{logs}");
    // The rest applied.
    eventually(secs(10), "the new key is accepted", || {
        (chat(gw.addr(), "key-two", "up/m1").status == 200).then_some(())
    });
    gw.terminate();
    assert!(gw.wait_exit(secs(10)).is_some(), "exits on SIGTERM");
    assert!(
        !dir.join("moved").exists(),
        "the snapshot writer keeps the directory it opened"
    );
}
