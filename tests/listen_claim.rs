//! One instance per address: the shards listen with `SO_REUSEPORT`, yet a second process on
//! the same address is refused ("address in use by another process", exit 1) unless both
//! set `server.allow_shared_listen = true` — the zero-downtime handover, where the new
//! instance starts beside the old one and the old one drains on SIGTERM.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;

use support::{Client, Gateway, secs};

const KEY: &str = "test-key";

/// Waits until nothing listens on `port` any more. A killed io_uring process is reaped
/// before the kernel tears its ring down, and the ring's pending accepts keep the listening
/// socket alive for that moment.
#[allow(clippy::disallowed_methods)] // a wall-clock bound on the wait
fn wait_until_unbound(port: u16) {
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = std::time::Instant::now() + secs(10);
    loop {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.set_reuse_address(true).unwrap();
        if socket.bind(&addr.into()).is_ok() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "port {port} still listened on 10 s after the process exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `idle_ms` only makes two configs differ.
fn config(port: u16, shared: bool, idle_ms: u64) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
workers = 2
idle_timeout_ms = {idle_ms}
allow_shared_listen = {shared}

[[client_keys]]
id = "t"
key = "{KEY}"

[[providers]]
id = "mock"
format = "mock"
models = ["echo"]

[[connections]]
id = "mock-c"
provider = "mock"
"#
    )
}

fn refused(cfg: &str) -> String {
    let failure = match Gateway::try_start(cfg, &[]) {
        Ok(gw) => panic!("a second instance started:\n{}", gw.logs()),
        Err(f) => f,
    };
    assert_eq!(
        failure.status.and_then(|s| s.code()),
        Some(1),
        "{}",
        failure.logs
    );
    assert!(
        failure.logs.contains("address in use by another process"),
        "{}",
        failure.logs
    );
    failure.logs
}

fn echo(addr: SocketAddr) -> u16 {
    Client::connect(addr)
        .request(
            "POST",
            "/v1/chat/completions",
            &[("authorization", &format!("Bearer {KEY}"))],
            br#"{"model":"mock/echo","messages":[{"role":"user","content":"hi"}]}"#,
        )
        .status
}

#[test]
fn a_second_instance_on_the_same_address_is_refused_even_with_another_config() {
    let (first, port) = Gateway::start_on_free_port(|port| config(port, false, 60000));
    assert_eq!(echo(first.addr()), 200);
    refused(&config(port, false, 60000));
    refused(&config(port, false, 30000));
    // Opting in on one side only is not enough, either way round.
    refused(&config(port, true, 30000));
    drop(first);
    wait_until_unbound(port);
    let first = Gateway::start(&config(port, true, 60000));
    refused(&config(port, false, 30000));
    assert_eq!(echo(first.addr()), 200, "the first instance still serves");
}

#[test]
fn a_foreign_process_sharing_the_port_with_so_reuseport_is_detected() {
    // Another program of the same user, listening with SO_REUSEPORT: the kernel would let
    // the shards join it.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_reuse_port(true).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(16).unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    refused(&config(port, false, 60000));
    refused(&config(port, true, 60000));
    drop(socket);
    let gw = Gateway::start(&config(port, false, 60000));
    assert_eq!(echo(gw.addr()), 200);
}

#[test]
fn with_allow_shared_listen_on_both_the_new_instance_takes_over_while_the_old_drains() {
    let (mut old, port) = Gateway::start_on_free_port(|port| config(port, true, 60000));
    let new = Gateway::start(&config(port, true, 30000));
    assert_eq!(new.addr(), old.addr());
    assert_eq!(echo(new.addr()), 200);
    old.terminate();
    let status = old.wait_exit(secs(20)).expect("the old instance exits");
    assert!(status.success(), "{}", old.logs());
    // Every request now lands on the new instance.
    for _ in 0..20 {
        assert_eq!(echo(new.addr()), 200);
    }
}

#[test]
fn a_draining_instance_stops_listening_at_once_so_the_new_one_takes_every_connection() {
    let mock = support::MockUpstream::start();
    let gate = support::Gate::new();
    let chat = "/v1/chat/completions";
    mock.on(chat, support::Reply::openai_chat("held").wait_for(&gate));
    let old_cfg = |port| {
        format!(
            "{}{}{}",
            config(port, true, 60000).replacen(
                "[server]",
                "[server]\nshutdown_grace_ms = 20000",
                1
            ),
            support::config::provider("up", &mock.base_url(), &["m1"]),
            support::config::connection("c1", "up")
        )
    };
    let (mut old, port) = Gateway::start_on_free_port(old_cfg);
    // A request held upstream keeps the old instance draining (made before the new one
    // starts, so it lands on the old one).
    let mut held = Client::connect(old.addr());
    held.start_request(
        "POST",
        chat,
        &[("authorization", &format!("Bearer {KEY}"))],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    mock.wait_for_hits(chat, 1, secs(10));
    let new = Gateway::start(&config(port, true, 30000));
    old.terminate();
    old.wait_for_log("shutting down", secs(5));
    // Every new connection made while the old instance drains reaches the new one, which
    // is ready (a draining instance would answer 503 `draining`, or not at all).
    let request = b"GET /readyz HTTP/1.1\r\nhost: gw\r\n\r\n";
    for i in 0..40 {
        let mut c = Client::connect(new.addr());
        c.set_timeout(secs(5));
        c.write_raw(request);
        let r = c
            .try_read_response()
            .unwrap_or_else(|e| panic!("connection {i} during the drain got no answer: {e}"));
        assert_eq!(
            r.status,
            200,
            "connection {i} during the drain: {}",
            r.text()
        );
    }
    assert!(
        old.wait_exit(support::ms(0)).is_none(),
        "the old instance stopped draining early"
    );
    gate.open();
    assert_eq!(held.read_response().status, 200);
    let status = old.wait_exit(secs(20)).expect("the old instance exits");
    assert!(status.success(), "{}", old.logs());
}
