//! SIGHUP reloads the configuration file: a valid one is adopted by every shard at once —
//! requests that start after it run on it, requests in flight finish on the configuration
//! they started with, even while every shard stays busy; any problem keeps the running
//! configuration and logs each problem; `listen`, `workers` and `state_dir` are reported and kept.
// Test code: a failed unwrap is a failed test. The load test orders its streams against the
// reload by the wall clock of this process (the gateway is a separate process).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use support::{Chunk, Client, Gate, Gateway, MockUpstream, Reply, eventually, secs};

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

/// A chat request for `model` with client key `key`, sent and left waiting for its answer
/// (the upstream holds it), so the shard that took it has a request in flight.
fn start_chat(addr: std::net::SocketAddr, key: &str, model: &str) -> Client {
    let mut held = Client::connect(addr);
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    held.start_request(
        "POST",
        CHAT,
        &[
            ("authorization", &format!("Bearer {key}")),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    );
    held
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
    let mut held = start_chat(addr, "key-one", "up/m1");
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

// -- The layout: providers, connections and combos added, removed, reordered --------------

/// A client key with the `manage` scope, for the management API.
const OPS: &str = "[[client_keys]]\nid = \"ops\"\nkey = \"ops-key\"\nscopes = [\"manage\"]\n\n";

/// A `[[connections]]` table with a priority (lower runs first).
fn connection_at(id: &str, provider: &str, priority: u32) -> String {
    format!("[[connections]]\nid = \"{id}\"\nprovider = \"{provider}\"\npriority = {priority}\n\n")
}

fn head(workers: usize) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = {workers}\n\n[[client_keys]]\nid = \"t\"\nkey = \"k\"\n\n{OPS}"
    )
}

fn reload_to(gw: &mut Gateway, file: &str) {
    let before = gw.logs().matches("configuration reloaded").count();
    std::fs::write(gw.config_path(), file).unwrap();
    hup(gw);
    eventually(secs(10), "the reload to be logged", || {
        (gw.logs().matches("configuration reloaded").count() > before).then_some(())
    });
}

fn admin(addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> support::Response {
    Client::connect(addr).request(
        method,
        path,
        &[
            ("authorization", "Bearer ops-key"),
            ("content-type", "application/json"),
        ],
        body,
    )
}

/// The connection that served a request (`None`: not served).
fn served_by(r: &support::Response) -> Option<String> {
    (r.status == 200)
        .then(|| {
            r.header("x-omniroute-selected-connection-id")
                .map(str::to_owned)
        })
        .flatten()
}

/// The value of one sample of `/metrics` (`None`: no such label set).
fn sample(addr: std::net::SocketAddr, series: &str) -> Option<u64> {
    let text = admin(addr, "GET", "/metrics", b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn sighup_adds_a_connection_and_traffic_reaches_it_on_every_shard() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let before = format!(
        "{}{}{}",
        head(2),
        support::provider("up", &mock.base_url(), &["m1"]),
        connection_at("c1", "up", 5)
    );
    let mut gw = Gateway::start(&before);
    let addr = gw.addr();
    assert_eq!(served_by(&chat(addr, "k", "up/m1")).as_deref(), Some("c1"));

    // `c2` comes first in the file and runs first (priority 1 < 5).
    let after = format!(
        "{}{}{}{}",
        head(2),
        support::provider("up", &mock.base_url(), &["m1"]),
        connection_at("c2", "up", 1),
        connection_at("c1", "up", 5)
    );
    reload_to(&mut gw, &after);
    assert!(
        gw.logs().contains("reload: connections: added c2"),
        "{}",
        gw.logs()
    );
    eventually(secs(10), "every shard routes to c2", || {
        (0..10)
            .all(|_| served_by(&chat(addr, "k", "up/m1")).as_deref() == Some("c2"))
            .then_some(())
    });
    // The management API sees the new layout.
    let r = admin(
        addr,
        "PATCH",
        "/api/providers/c2",
        br#"{"max_concurrent":3}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let health = admin(addr, "GET", "/api/monitoring/health", b"").json();
    assert_eq!(health["activeConnections"], 2, "{health}");
    // Its metrics label set exists, and c1's count went on from where it was.
    let c2 = "tidegate_upstream_attempts_by_connection_total{provider=\"up\",connection=\"c2\",class=\"2xx\"}";
    let c1 = "tidegate_upstream_attempts_by_connection_total{provider=\"up\",connection=\"c1\",class=\"2xx\"}";
    assert!(sample(addr, c2).unwrap() >= 10);
    assert_eq!(
        sample(addr, c1),
        Some(1),
        "c1's one attempt before the reload"
    );
}

#[test]
fn sighup_removes_a_connection_its_in_flight_request_finishes_and_no_traffic_follows() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on(CHAT, Reply::openai_chat("held").wait_for(&gate));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let file = |conns: &str| {
        format!(
            "{}{}{conns}",
            head(2),
            support::provider("up", &mock.base_url(), &["m1"]),
        )
    };
    let mut gw = Gateway::start(&file(&format!(
        "{}{}",
        connection_at("c1", "up", 1),
        connection_at("c2", "up", 5)
    )));
    let addr = gw.addr();

    // A request on c1 in flight across the reload that removes c1.
    let mut held = start_chat(addr, "k", "up/m1");
    mock.wait_for_hits(CHAT, 1, secs(10));
    reload_to(&mut gw, &file(&connection_at("c2", "up", 5)));
    assert!(
        gw.logs().contains("reload: connections: removed c1"),
        "{}",
        gw.logs()
    );
    gate.open();
    let r = held.read_response();
    assert_eq!(
        r.status,
        200,
        "the in-flight request finishes: {}",
        r.text()
    );
    assert_eq!(served_by(&r).as_deref(), Some("c1"));

    eventually(secs(10), "every shard routes to c2", || {
        (0..10)
            .all(|_| served_by(&chat(addr, "k", "up/m1")).as_deref() == Some("c2"))
            .then_some(())
    });
    for _ in 0..20 {
        assert_eq!(
            served_by(&chat(addr, "k", "up/m1")).as_deref(),
            Some("c2"),
            "no more traffic to c1"
        );
    }
    let r = admin(
        addr,
        "PATCH",
        "/api/providers/c1",
        br#"{"max_concurrent":3}"#,
    );
    assert_eq!(r.status, 404, "c1 is gone from the management API");
    let c1 = "tidegate_upstream_attempts_by_connection_total{provider=\"up\",connection=\"c1\",class=\"2xx\"}";
    eventually(secs(10), "c1's label set to leave /metrics", || {
        (0..4).all(|_| sample(addr, c1).is_none()).then_some(())
    });
}

#[test]
fn sighup_reordering_providers_and_connections_keeps_each_breaker_with_its_name() {
    // Two shards: the breaker's owner is picked by its id, which must not move.
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    a.on_always(CHAT, Reply::error(503, "overloaded"));
    b.on_always(CHAT, Reply::openai_chat("ok"));
    let breaker =
        "[resilience.provider_breaker.apikey]\nfailure_threshold = 3\nreset_timeout_ms = 600000\n";
    let pa = support::provider("pa", &a.base_url(), &["m1"]);
    let pb = support::provider("pb", &b.base_url(), &["m1"]);
    // `disable_cooling` keeps the connections routable: every failure reaches the breaker.
    let ca = "[[connections]]\nid = \"ca\"\nprovider = \"pa\"\ndisable_cooling = true\n\n";
    let cb = "[[connections]]\nid = \"cb\"\nprovider = \"pb\"\ndisable_cooling = true\n\n";
    let mut gw = Gateway::start(&format!("{}{pa}{pb}{ca}{cb}{breaker}", head(2)));
    let addr = gw.addr();
    let open = |r: &support::Response| {
        r.status == 503 && r.header("x-tidegate-error") == Some("provider_circuit_open")
    };
    eventually(secs(10), "pa's breaker to open", || {
        open(&chat(addr, "k", "pa/m1")).then_some(())
    });
    assert_eq!(chat(addr, "k", "pb/m1").status, 200);

    // Reordered: pb, pa and cb, ca (an index-keyed state would now put pa's open breaker
    // on pb).
    reload_to(&mut gw, &format!("{}{pb}{pa}{cb}{ca}{breaker}", head(2)));
    let hits = a.hits(CHAT);
    eventually(secs(10), "every shard runs the reordered file", || {
        (0..10)
            .all(|_| served_by(&chat(addr, "k", "pb/m1")).as_deref() == Some("cb"))
            .then_some(())
    });
    for _ in 0..10 {
        let r = chat(addr, "k", "pa/m1");
        assert!(
            open(&r),
            "pa's breaker is still open: {} {}",
            r.status,
            r.text()
        );
        assert_eq!(r.json()["error"]["provider"], "pa");
    }
    assert_eq!(a.hits(CHAT), hits, "nothing passed pa's open breaker");
    // The breaker that opened is `ca`'s (connection-scoped), and it is still `ca`'s.
    let health = admin(addr, "GET", "/api/monitoring/health", b"").json();
    assert_eq!(
        health["providerHealth"]["pa::conn::ca"]["state"], "OPEN",
        "{health}"
    );
    assert_eq!(health["circuitBreakers"]["open"], 1, "{health}");

    // The snapshot written at shutdown names the open breaker by its provider.
    let dir = gw.config_path().parent().unwrap().join("state");
    gw.terminate();
    assert!(gw.wait_exit(secs(10)).is_some());
    let out = support::run_tidegate(
        &["snapshot", "inspect", "--state-dir", dir.to_str().unwrap()],
        &[],
    );
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let breakers = json["state"]["breakers"].as_array().unwrap();
    let ca = breakers
        .iter()
        .find(|b| b["provider"] == "pa" && b["connection"] == "ca")
        .unwrap();
    assert_eq!(ca["state"], "OPEN", "{json}");
    assert!(
        breakers
            .iter()
            .all(|b| b["provider"] == "pa" || b["state"] != "OPEN"),
        "{json}"
    );
}

#[test]
fn sighup_adds_combos_before_the_existing_one_and_serves_them_all() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    a.on_always(CHAT, Reply::openai_chat("from a"));
    b.on_always(CHAT, Reply::openai_chat("from b"));
    let providers = format!(
        "{}{}{}{}",
        support::provider("pa", &a.base_url(), &["m1"]),
        support::provider("pb", &b.base_url(), &["m1"]),
        support::connection("ca", "pa"),
        support::connection("cb", "pb"),
    );
    let combo = |name: &str, strategy: &str, targets: &str| {
        format!(
            "[[combos]]\nname = \"{name}\"\nstrategy = \"{strategy}\"\ntargets = [{targets}]\n\n"
        )
    };
    let rr = combo("rr", "round-robin", "\"pa/m1\", \"pb/m1\"");
    let mut gw = Gateway::start(&format!("{}{providers}{rr}", head(2)));
    let addr = gw.addr();
    assert_eq!(chat(addr, "k", "rr").status, 200);
    assert_eq!(chat(addr, "k", "to-b").status, 404, "no such combo yet");

    let to_b = combo("to-b", "priority", "\"pb/m1\", \"pa/m1\"");
    let to_a = combo("to-a", "priority", "\"pa/m1\"");
    reload_to(&mut gw, &format!("{}{providers}{to_b}{to_a}{rr}", head(2)));
    assert!(
        gw.logs().contains("reload: combos: added to-b, to-a"),
        "{}",
        gw.logs()
    );
    eventually(secs(10), "every shard serves the new combos", || {
        (0..10)
            .all(|_| chat(addr, "k", "to-b").json()["choices"][0]["message"]["content"] == "from b")
            .then_some(())
    });
    for _ in 0..6 {
        let r = chat(addr, "k", "to-a");
        assert_eq!(r.json()["choices"][0]["message"]["content"], "from a");
        assert_eq!(
            chat(addr, "k", "rr").status,
            200,
            "the kept combo still serves"
        );
    }
}

#[test]
fn sighup_with_an_invalid_layout_change_applies_none_of_it_and_logs_every_problem() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let up = support::provider("up", &mock.base_url(), &["m1"]);
    let mut gw = Gateway::start(&format!("{}{up}{}", head(2), connection_at("c1", "up", 5)));
    let addr = gw.addr();
    // A valid new connection and combo beside three problems.
    let broken = format!(
        "{}{up}{}{}[[combos]]\nname = \"new\"\nstrategy = \"priority\"\ntargets = [\"up/m1\"]\n\n\
         [[combos]]\nname = \"bad\"\nstrategy = \"priority\"\ntargets = [\"ghost/m1\"]\n\n\
         [[connections]]\nid = \"c3\"\nprovider = \"nope\"\n\n",
        head(2).replace("workers = 2", "workers = 2\nidle_timeout = 5"),
        connection_at("c2", "up", 1),
        connection_at("c1", "up", 5),
    );
    std::fs::write(gw.config_path(), broken).unwrap();
    hup(&mut gw);
    gw.wait_for_log("keeping the running configuration", secs(10));
    let logs = gw.logs();
    assert!(logs.contains("server.idle_timeout"), "{logs}");
    assert!(logs.contains("nope"), "{logs}");
    assert!(logs.contains("ghost"), "{logs}");
    assert!(logs.contains("reload refused (3 problem(s))"), "{logs}");
    for _ in 0..10 {
        assert_eq!(served_by(&chat(addr, "k", "up/m1")).as_deref(), Some("c1"));
        assert_eq!(
            chat(addr, "k", "new").status,
            404,
            "the valid combo is not applied either"
        );
    }
}

#[test]
fn sighup_drops_a_removed_connection_s_cooldown_and_no_kept_one_inherits_it() {
    let mock = MockUpstream::start();
    mock.on(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "600"),
    );
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let file = |conns: &str| {
        format!(
            "{}{}{conns}",
            head(2),
            support::provider("up", &mock.base_url(), &["m1"]),
        )
    };
    let both = format!(
        "{}{}",
        connection_at("c1", "up", 1),
        connection_at("c2", "up", 5)
    );
    let mut gw = Gateway::start(&file(&both));
    let addr = gw.addr();
    // c1 answers 429: it cools down for ten minutes and c2 serves.
    assert_eq!(served_by(&chat(addr, "k", "up/m1")).as_deref(), Some("c2"));
    let cooling = |addr| {
        admin(addr, "GET", "/api/monitoring/health", b"").json()["connectionHealth"]["up"]
            ["coolingDown"]
            .clone()
    };
    eventually(secs(10), "c1 to be cooling", || {
        (cooling(addr) == 1).then_some(())
    });
    // Its connection breaker is listed by name.
    let breakers = |addr| {
        let health = admin(addr, "GET", "/api/monitoring/health", b"").json();
        let names: Vec<String> = health["providerHealth"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        names
    };
    assert!(breakers(addr).contains(&"up::conn::c1".to_owned()));

    // c1 removed: c2 (now first in the file) serves and nothing is cooling any more.
    reload_to(&mut gw, &file(&connection_at("c2", "up", 5)));
    eventually(secs(10), "every shard routes to c2", || {
        (0..10)
            .all(|_| served_by(&chat(addr, "k", "up/m1")).as_deref() == Some("c2"))
            .then_some(())
    });
    // Its state is gone from every owner: nothing cooling, no breaker left behind (one
    // kept would be listed as `unknown::conn::…`).
    eventually(secs(10), "c1's state to be dropped", || {
        (cooling(addr).is_null()
            && breakers(addr)
                .iter()
                .all(|b| b.starts_with("up::conn::c2") || b == "up"))
        .then_some(())
    });

    // c1 added back: a new connection, with fresh state, serves first again.
    reload_to(&mut gw, &file(&both));
    eventually(secs(10), "every shard routes to the new c1", || {
        (0..10)
            .all(|_| served_by(&chat(addr, "k", "up/m1")).as_deref() == Some("c1"))
            .then_some(())
    });
    assert!(cooling(addr).is_null(), "the new c1 starts fresh");
}

#[test]
fn round_robin_combos_added_by_a_reload_serve_while_a_request_on_the_old_file_is_in_flight() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    let gate = Gate::new();
    a.on(CHAT, Reply::openai_chat("held").wait_for(&gate));
    b.on_always(CHAT, Reply::openai_chat("ok"));
    // Four single-connection providers: their connections' owner shards (where each combo
    // semaphore lives) cover both shards.
    let mut providers = format!(
        "{}{}",
        support::provider("pa", &a.base_url(), &["m1"]),
        support::connection("ca", "pa")
    );
    for i in 0..4 {
        providers += &support::provider(&format!("p{i}"), &b.base_url(), &["m1"]);
        providers += &support::connection(&format!("c{i}"), &format!("p{i}"));
    }
    let mut gw = Gateway::start(&format!("{}{providers}", head(2)));
    let addr = gw.addr();
    // A request on the old file (no combos) stays in flight to the end of the test; its
    // shard adopts the reload all the same, so both shards' owners hold the combos'
    // semaphores.
    let mut held = start_chat(addr, "k", "pa/m1");
    a.wait_for_hits(CHAT, 1, secs(10));
    let combos: String = (0..4)
        .map(|i| {
            format!(
                "[[combos]]\nname = \"r{i}\"\nstrategy = \"round-robin\"\ntargets = [\"p{i}/m1\"]\n\n"
            )
        })
        .collect();
    reload_to(&mut gw, &format!("{}{providers}{combos}", head(2)));
    for i in 0..4 {
        let combo = format!("r{i}");
        let r = eventually(secs(10), "the reloaded combo to answer", || {
            let r = chat(addr, "k", &combo);
            (r.status != 404).then_some(r)
        });
        assert_eq!(r.status, 200, "{combo}: {}", r.text());
        assert_eq!(served_by(&r), Some(format!("c{i}")));
    }
    gate.open();
    assert_eq!(held.read_response().status, 200);
}

// -- Reloads under load: adopted at once, in-flight requests finish on their own file ------

/// A slow stream: `pieces` deltas, one every `every_ms`, then `[DONE]`.
fn slow_stream(pieces: usize, every_ms: u64) -> Reply {
    let mut chunks = Vec::with_capacity(pieces * 2 + 1);
    for i in 0..pieces {
        chunks.push(Chunk::delay_ms(every_ms));
        chunks.push(Chunk::openai_delta(&format!("p{i} ")));
    }
    chunks.push(Chunk::done());
    Reply::sse(chunks)
}

/// One stream a loader ran: the connection that served it, whether it arrived whole
/// (every piece, then `[DONE]`), and when it ended.
struct Streamed {
    connection: Option<String>,
    whole: bool,
    sent: Instant,
    ended: Instant,
}

/// Keeps one streamed request in flight on its own keep-alive connection, starting the next
/// as soon as one ends, until `stop`.
fn loader(addr: std::net::SocketAddr, pieces: usize, stop: Arc<AtomicBool>) -> Vec<Streamed> {
    let mut done = Vec::new();
    let mut client = Client::connect(addr);
    client.set_timeout(secs(30));
    let body = br#"{"model":"slow/m1","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        client.start_request(
            "POST",
            CHAT,
            &[
                ("authorization", "Bearer k"),
                ("content-type", "application/json"),
            ],
            body,
        );
        let r = client.read_response();
        let text = r.text();
        let whole = r.status == 200
            && (0..pieces).all(|i| text.contains(&format!("p{i} ")))
            && text.trim_end().ends_with("data: [DONE]");
        done.push(Streamed {
            connection: r
                .header("x-omniroute-selected-connection-id")
                .map(str::to_owned),
            whole,
            sent,
            ended: Instant::now(),
        });
        if r.header("connection") == Some("close") {
            client = Client::connect(addr);
            client.set_timeout(secs(30));
        }
    }
    done
}

#[test]
fn a_reload_under_continuous_streaming_load_applies_at_once_on_every_shard() {
    // Streams of 3 s (30 pieces, 100 ms apart) on twelve keep-alive connections, restarted
    // as they end: both shards always have requests in flight, so a reload that waited for
    // a quiet point would never apply.
    let (slow, fast) = (MockUpstream::start(), MockUpstream::start());
    const PIECES: usize = 30;
    slow.on_always(CHAT, slow_stream(PIECES, 100));
    fast.on_always(CHAT, Reply::openai_chat("ok"));
    let providers = format!(
        "{}{}",
        support::provider("slow", &slow.base_url(), &["m1"]),
        support::provider("up", &fast.base_url(), &["m1"]),
    );
    let before = format!(
        "{}{providers}{}{}",
        head(2),
        connection_at("s1", "slow", 5),
        connection_at("c1", "up", 5)
    );
    let mut gw = Gateway::start(&before);
    let addr = gw.addr();
    assert_eq!(served_by(&chat(addr, "k", "up/m1")).as_deref(), Some("c1"));

    let stop = Arc::new(AtomicBool::new(false));
    let loaders: Vec<_> = (0..12)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || loader(addr, PIECES, stop))
        })
        .collect();
    eventually(secs(10), "twelve streams in flight", || {
        (slow.current_in_flight() >= 12).then_some(())
    });

    // The reload adds a connection that runs first to each provider.
    let after = format!(
        "{}{providers}{}{}{}{}",
        head(2),
        connection_at("s2", "slow", 1),
        connection_at("s1", "slow", 5),
        connection_at("c2", "up", 1),
        connection_at("c1", "up", 5)
    );
    let reloaded = Instant::now();
    reload_to(&mut gw, &after);
    // New requests on fresh connections (spread over both shards by the kernel) all run on
    // the new file within 2 s — well inside the 3 s streams, so the streams started before
    // are still running: a reload that waited for them (or for a quiet point, which this
    // load never leaves) would not be applied by then. (Each try is 20 requests: on a
    // loaded machine one try alone can take most of a second.)
    eventually(
        secs(2),
        "every new request to run on the reloaded file",
        || {
            (0..20)
                .all(|_| served_by(&chat(addr, "k", "up/m1")).as_deref() == Some("c2"))
                .then_some(())
        },
    );
    let applied = Instant::now();
    assert!(
        slow.current_in_flight() >= 1,
        "the streams started before the reload are still running"
    );

    // Let every stream started before the reload end, and a few started after.
    std::thread::sleep(secs(4));
    stop.store(true, Ordering::SeqCst);
    let streams: Vec<Streamed> = loaders
        .into_iter()
        .flat_map(|l| l.join().unwrap())
        .collect();
    for s in &streams {
        assert!(
            s.whole,
            "a stream ended short (served by {:?})",
            s.connection
        );
    }
    // The streams in flight across the reload finished on the old file's connection, after
    // the new file was already in force for new requests.
    let old_after = streams
        .iter()
        .filter(|s| s.connection.as_deref() == Some("s1") && s.ended > applied)
        .count();
    assert!(
        old_after >= 1,
        "streams of the old file finished after the new one applied"
    );
    // Streams that started after it ran on the new one.
    assert!(
        streams
            .iter()
            .any(|s| s.connection.as_deref() == Some("s2") && s.ended > reloaded),
        "restarted streams run on the reloaded file"
    );
    assert!(
        streams
            .iter()
            .filter(|s| s.sent > applied)
            .all(|s| s.connection.as_deref() == Some("s2")),
        "no stream that started after the reload ran on the old file"
    );
}

#[test]
fn sighup_removes_a_provider_its_in_flight_request_finishes_and_its_state_is_gone() {
    let (gone, up) = (MockUpstream::start(), MockUpstream::start());
    let gate = Gate::new();
    // One failure first, so the provider has breaker state and metrics to drop.
    gone.on(CHAT, Reply::error(500, "boom"));
    gone.on(CHAT, Reply::openai_chat("held").wait_for(&gate));
    up.on_always(CHAT, Reply::openai_chat("ok"));
    let pg = support::provider("gone", &gone.base_url(), &["m9"]);
    let pu = support::provider("up", &up.base_url(), &["m1"]);
    // `disable_cooling` keeps the failed connection routable for the held request.
    let cg = "[[connections]]\nid = \"g1\"\nprovider = \"gone\"\ndisable_cooling = true\n\n";
    let cu = connection_at("u1", "up", 5);
    let mut gw = Gateway::start(&format!("{}{pg}{pu}{cg}{cu}", head(2)));
    let addr = gw.addr();
    assert_eq!(chat(addr, "k", "gone/m9").status, 500);
    let attempts = "tidegate_upstream_attempts_by_connection_total{provider=\"gone\",connection=\"g1\",class=\"5xx\"}";
    assert_eq!(sample(addr, attempts), Some(1));
    let providers_in_health = |addr| {
        let health = admin(addr, "GET", "/api/monitoring/health", b"").json();
        health["providerHealth"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<String>>()
    };
    eventually(secs(10), "gone's breaker to be listed", || {
        providers_in_health(addr)
            .iter()
            .any(|k| k.starts_with("gone"))
            .then_some(())
    });

    // A request on `gone` in flight across the reload that removes the provider.
    let mut held = start_chat(addr, "k", "gone/m9");
    gone.wait_for_hits(CHAT, 2, secs(10));
    reload_to(&mut gw, &format!("{}{pu}{cu}", head(2)));
    let logs = gw.logs();
    assert!(logs.contains("reload: providers: removed gone"), "{logs}");
    assert!(logs.contains("reload: connections: removed g1"), "{logs}");
    // New requests for its model get the documented answer at once, on every shard.
    for _ in 0..10 {
        let r = chat(addr, "k", "gone/m9");
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.header("x-tidegate-error"), Some("model_not_found"));
        assert_eq!(chat(addr, "k", "up/m1").status, 200);
    }
    gate.open();
    let r = held.read_response();
    assert_eq!(
        r.status,
        200,
        "the in-flight request finishes: {}",
        r.text()
    );
    assert_eq!(served_by(&r).as_deref(), Some("g1"));
    assert_eq!(r.header("x-tidegate-provider"), Some("gone"));
    // Its state is gone from every owner and from /metrics.
    eventually(secs(10), "gone's state to be dropped", || {
        (0..4)
            .all(|_| {
                !providers_in_health(addr)
                    .iter()
                    .any(|k| k.starts_with("gone") || k.starts_with("unknown"))
                    && sample(addr, attempts).is_none()
            })
            .then_some(())
    });
    let metrics = admin(addr, "GET", "/metrics", b"").text();
    assert!(!metrics.contains("provider=\"gone\""), "{metrics}");
}

#[test]
fn the_emergency_fallback_follows_its_provider_when_a_reload_adds_and_removes_providers_before_it()
{
    let (paid, rescue, other) = (
        MockUpstream::start(),
        MockUpstream::start(),
        MockUpstream::start(),
    );
    paid.on_always(CHAT, Reply::error(402, "Payment Required: out of credits"));
    rescue.on_always(CHAT, Reply::openai_chat("rescued"));
    other.on_always(CHAT, Reply::openai_chat("other"));
    let provider = |id: &str, mock: &MockUpstream, model: &str| {
        format!(
            "{}{}",
            support::provider(id, &mock.base_url(), &[model]),
            support::connection(&format!("{id}-c"), id)
        )
    };
    let fallback = "[emergency_fallback]\ntarget = \"rescue/big\"\n";
    let file = |providers: &[String]| format!("{}{}{fallback}", head(2), providers.concat());
    // `old` sits before `rescue`; the reload removes it and puts two new providers first.
    let mut gw = Gateway::start(&file(&[
        provider("old", &other, "m0"),
        provider("paid", &paid, "m1"),
        provider("rescue", &rescue, "big"),
    ]));
    let addr = gw.addr();
    let rescued = |addr| {
        let r = chat(addr, "k", "paid/m1");
        (r.status == 200
            && r.header("x-omniroute-emergency-fallback") == Some("from=paid/m1; to=rescue/big")
            && served_by(&r).as_deref() == Some("rescue-c"))
        .then_some(())
    };
    assert!(rescued(addr).is_some());
    reload_to(
        &mut gw,
        &file(&[
            provider("new1", &other, "n1"),
            provider("new2", &other, "n2"),
            provider("paid", &paid, "m1"),
            provider("rescue", &rescue, "big"),
        ]),
    );
    for _ in 0..10 {
        assert!(
            rescued(addr).is_some(),
            "the fallback still goes to rescue/big"
        );
    }
    assert_eq!(
        other.hits(CHAT),
        0,
        "no request went to a renumbered neighbour"
    );
    assert_eq!(chat(addr, "k", "new2/n2").status, 200);
}

#[test]
fn a_reloaded_max_concurrent_is_enforced_at_once_while_every_shard_is_busy() {
    let mock = MockUpstream::start();
    let (old_gate, new_gate) = (Gate::new(), Gate::new());
    // Four requests of the old file, held: both shards are busy across the reload.
    for _ in 0..4 {
        mock.on(CHAT, Reply::openai_chat("old").wait_for(&old_gate));
    }
    mock.on_always(CHAT, Reply::openai_chat("new").wait_for(&new_gate));
    let up = support::provider("up", &mock.base_url(), &["m1"]);
    let mut gw = Gateway::start(&format!("{}{up}{}", head(2), connection_at("c1", "up", 5)));
    let addr = gw.addr();
    let mut old: Vec<Client> = (0..4).map(|_| start_chat(addr, "k", "up/m1")).collect();
    mock.wait_for_hits(CHAT, 4, secs(10));

    // The reload caps c1 at one request at a time, waiting at most 50 ms for the slot.
    let capped = "[[connections]]\nid = \"c1\"\nprovider = \"up\"\npriority = 5\nmax_concurrent = 1\n\
                  [connections.rate_limit_overrides]\nmax_wait_ms = 50\n\n";
    reload_to(&mut gw, &format!("{}{up}{capped}", head(2)));
    // One new request takes the slot (the old file's requests took none)…
    let mut first = start_chat(addr, "k", "up/m1");
    mock.wait_for_hits(CHAT, 5, secs(10));
    // …and every other one, on either shard, is refused once its wait is over.
    for _ in 0..8 {
        let r = chat(addr, "k", "up/m1");
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.header("x-tidegate-error"), Some("semaphore_timeout"));
    }
    assert_eq!(mock.hits(CHAT), 5, "the cap let nothing else through");
    new_gate.open();
    assert_eq!(first.read_response().status, 200);
    old_gate.open();
    for mut c in old.drain(..) {
        assert_eq!(
            c.read_response().status,
            200,
            "the old file's requests finish"
        );
    }
}

/// A connection whose request queue (limiter) is on, with one start per minute and a short
/// queue wait, so a second request within the minute is refused with
/// `rate_limit_queue_timeout`.
fn limited(id: &str, provider: &str) -> String {
    format!(
        "[[connections]]\nid = \"{id}\"\nprovider = \"{provider}\"\n\
         [connections.rate_limit_overrides]\nrequests_per_minute = 1\n\
         min_time_between_requests_ms = 0\nmax_wait_ms = 200\n\n"
    )
}

#[test]
fn a_reload_drops_a_removed_connection_s_request_queue_and_a_re_added_one_starts_fresh() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let up = support::provider("up", &mock.base_url(), &["m1"]);
    // One shard: the re-added connection's queue has the same owner as the removed one's.
    let with_c1 = format!("{}{up}{}", head(1), limited("c1", "up"));
    let without = format!("{}{up}{}", head(1), connection_at("c2", "up", 5));
    let mut gw = Gateway::start(&with_c1);
    let addr = gw.addr();
    let queues = "tidegate_owner_entries{table=\"request_queues\"}";

    assert_eq!(served_by(&chat(addr, "k", "up/m1")).as_deref(), Some("c1"));
    let r = chat(addr, "k", "up/m1");
    assert_eq!(
        r.status,
        503,
        "the minute's one start is spent: {}",
        r.text()
    );
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("rate_limit_queue_timeout")
    );
    assert_eq!(sample(addr, queues), Some(1), "c1's queue is listed");

    // Removed: its queue (idle) goes with it, at the reload.
    reload_to(&mut gw, &without);
    assert_eq!(sample(addr, queues), Some(0), "c1's queue is gone at once");
    assert_eq!(served_by(&chat(addr, "k", "up/m1")).as_deref(), Some("c2"));

    // Added again under the same name: a fresh queue, not the old one's spent minute.
    reload_to(&mut gw, &with_c1);
    let r = chat(addr, "k", "up/m1");
    assert_eq!(
        served_by(&r).as_deref(),
        Some("c1"),
        "{} {}",
        r.status,
        r.text()
    );
}

#[test]
fn a_request_s_body_is_read_under_the_limit_of_the_configuration_it_started_on() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let file = |max: usize| {
        format!(
            "{}{}{}",
            head(1).replace(
                "workers = 1\n",
                &format!("workers = 1\nmax_request_body_bytes = {max}\n")
            ),
            support::provider("up", &mock.base_url(), &["m1"]),
            connection_at("c1", "up", 1)
        )
    };
    let mut gw = Gateway::start(&file(4096));
    let addr = gw.addr();
    let body = format!(
        r#"{{"model":"up/m1","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2000)
    );
    let head_only = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer k\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );

    // The head arrives under the 4096-byte limit; the limit drops to 1000 before the body.
    let mut held = Client::connect(addr);
    held.write_raw(head_only.as_bytes());
    held.write_raw(&body.as_bytes()[..100]);
    // In flight: it and the scrape that asks.
    eventually(secs(10), "the request to be in flight", || {
        (sample(addr, "tidegate_requests_in_flight") == Some(2)).then_some(())
    });
    reload_to(&mut gw, &file(1000));
    held.write_raw(&body.as_bytes()[100..]);
    let r = held.read_response();
    assert_eq!(r.status, 200, "read under its own limit: {}", r.text());

    // A request that starts after the reload gets the new limit.
    let r = Client::connect(addr).request(
        "POST",
        CHAT,
        &[
            ("authorization", "Bearer k"),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 413, "{}", r.text());
}
