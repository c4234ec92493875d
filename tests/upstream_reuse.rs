//! The upstream pool: sequential requests reuse one keep-alive connection; a pooled
//! connection the upstream closed while idle is replaced transparently; a response that
//! ends with `Connection: close` is not reused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

fn config(mock: &MockUpstream) -> String {
    one_upstream(&mock.base_url(), 1, "", "")
}

fn ask(c: &mut Client) -> Response {
    c.request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"up/m1","messages":[]}"#,
    )
}

#[test]
fn sequential_requests_share_one_upstream_connection() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start(&config(&mock));
    // From several client connections, one after the other.
    for _ in 0..5 {
        let mut c = Client::connect(gw.addr());
        for _ in 0..4 {
            assert_eq!(ask(&mut c).status, 200);
        }
    }
    assert_eq!(mock.hits("/v1/chat/completions"), 20);
    assert_eq!(
        mock.connections_accepted(),
        1,
        "every request should reuse the pooled connection"
    );
}

#[test]
fn streams_return_their_connection_to_the_pool_too() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_stream(&["a", "b"]));
    let gw = Gateway::start(&config(&mock));
    let mut c = Client::connect(gw.addr());
    for _ in 0..5 {
        let r = c.request(
            "POST",
            "/v1/chat/completions",
            &[],
            br#"{"model":"up/m1","stream":true,"messages":[]}"#,
        );
        assert_eq!(r.status, 200);
        assert!(r.text().ends_with("data: [DONE]\n\n"));
    }
    assert_eq!(mock.connections_accepted(), 1);
}

#[test]
fn a_connection_the_upstream_closed_while_idle_is_replaced_without_an_error() {
    let mock = MockUpstream::start();
    // The first answer keeps the connection alive but the mock then closes it; the
    // gateway's next request on that pooled socket fails and must be retried fresh.
    mock.on("/v1/chat/completions", Reply::openai_chat("one"));
    mock.on("/v1/chat/completions", Reply::close());
    mock.on_always("/v1/chat/completions", Reply::openai_chat("again"));
    let gw = Gateway::start(&config(&mock));
    let mut c = Client::connect(gw.addr());
    assert_eq!(ask(&mut c).status, 200);
    let r = ask(&mut c);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], "again");
    assert_eq!(
        r.header("x-tidegate-attempts"),
        Some("1"),
        "a stale pooled socket is not an attempt"
    );
    // The retry on a fresh connection sends the very request the stale socket was sent:
    // the same head and the same body, its model rewritten (`up/m1` → `m1`).
    let seen = mock.requests_to("/v1/chat/completions");
    assert_eq!(seen.len(), 3);
    let (stale, fresh) = (&seen[1], &seen[2]);
    assert_ne!(stale.connection, fresh.connection);
    assert_eq!(fresh.body, br#"{"model":"m1","messages":[]}"#);
    assert_eq!(stale.body, fresh.body);
    assert_eq!(stale.headers, fresh.headers);
}

#[test]
fn connection_close_from_the_upstream_is_honoured() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::openai_chat("bye").close_after(),
    );
    let gw = Gateway::start(&config(&mock));
    let mut c = Client::connect(gw.addr());
    for _ in 0..3 {
        assert_eq!(ask(&mut c).status, 200);
    }
    assert_eq!(mock.connections_accepted(), 3);
}
