//! Two shards: both accept (SO_REUSEPORT spreads connections), each with its own pool, and
//! the ready line says how many there are.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::HashSet;

use support::*;

#[test]
fn two_shards_serve_from_one_address() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start(&one_upstream(&mock.base_url(), 2, "", ""));
    assert_eq!(gw.shards(), 2);
    assert!(gw.driver() == "io_uring" || gw.driver() == "epoll");
    let health = Client::connect(gw.addr())
        .request("GET", "/healthz", &[], b"")
        .json();
    assert_eq!(health["shards"], 2);

    // Many client connections, each on its own source port: the kernel spreads them over
    // both listeners; every one is served.
    let mut ports = HashSet::new();
    for _ in 0..64 {
        let mut c = Client::connect(gw.addr());
        ports.insert(c.local_addr().port());
        let r = c.request(
            "POST",
            "/v1/chat/completions",
            &[],
            br#"{"model":"up/m1","messages":[]}"#,
        );
        assert_eq!(r.status, 200);
    }
    assert_eq!(mock.hits("/v1/chat/completions"), 64);
    // Each shard keeps its own pool, so at most one upstream connection per shard here.
    let upstream = mock.connections_accepted();
    assert!(
        (1..=2).contains(&upstream),
        "{upstream} upstream connections"
    );

    // Metrics are summed over shards.
    let metrics = Client::connect(gw.addr())
        .request("GET", "/metrics", &[], b"")
        .text();
    assert!(metrics.contains("tidegate_shards 2"), "{metrics}");
    let requests: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tidegate_requests_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("tidegate_requests_total");
    assert!(requests >= 65, "{requests}");
}

#[test]
fn workers_zero_means_one_shard_per_core() {
    let gw = Gateway::start(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 0

[[providers]]
id = "mock"
format = "mock"
models = ["echo"]

[[connections]]
id = "m"
provider = "mock"
"#,
    );
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(gw.shards(), cores);
}

#[test]
fn the_epoll_driver_serves_the_same_requests() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_stream(&["via ", "epoll"]),
    );
    let gw = Gateway::start_with_env(
        &one_upstream(&mock.base_url(), 2, "", ""),
        &[("TIDEGATE_DRIVER", "epoll")],
    );
    assert_eq!(gw.driver(), "epoll");
    let mut c = Client::connect(gw.addr());
    for _ in 0..3 {
        let r = c.request(
            "POST",
            "/v1/chat/completions",
            &[],
            br#"{"model":"up/m1","stream":true,"messages":[]}"#,
        );
        assert_eq!(r.status, 200);
        assert!(r.text().contains("epoll"), "{}", r.text());
    }
}

#[test]
fn an_unknown_driver_name_is_a_usage_error() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/tidegate.toml");
    let out = run_tidegate(
        &["serve", "--config", shipped],
        &[("TIDEGATE_DRIVER", "kqueue")],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("TIDEGATE_DRIVER"), "{}", out.stderr);
}
