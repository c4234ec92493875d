//! Browser clients: `server.cors_allow_origins` answers CORS preflights and marks responses
//! to allowed origins; without it nothing changes (an `OPTIONS` is 405 with `Allow`).
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::{Client, Gateway};

const CHAT: &str = "/v1/chat/completions";
const BODY: &[u8] = br#"{"model":"mock/echo","messages":[{"role":"user","content":"hi"}]}"#;

fn config(cors: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1
{cors}

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "mock"
format = "mock"

[[connections]]
id = "m"
provider = "mock"
"#
    )
}

fn preflight(gw: &Gateway, origin: &str) -> support::Response {
    Client::connect(gw.addr()).request(
        "OPTIONS",
        CHAT,
        &[
            ("origin", origin),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "authorization, content-type",
            ),
        ],
        b"",
    )
}

#[test]
fn an_allowed_origin_gets_its_preflight_and_readable_responses() {
    let gw = Gateway::start(&config(r#"cors_allow_origins = ["https://app.example"]"#));
    let r = preflight(&gw, "https://app.example");
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(
        r.header("access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("authorization, content-type")
    );
    assert!(r.header("access-control-max-age").is_some());

    let r = Client::connect(gw.addr()).request(
        "POST",
        CHAT,
        &[
            ("authorization", "Bearer test-key"),
            ("origin", "https://app.example"),
        ],
        BODY,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(
        r.header("access-control-expose-headers")
            .unwrap()
            .contains("x-request-id")
    );
    // Errors are readable too.
    let r = Client::connect(gw.addr()).request(
        "POST",
        CHAT,
        &[("origin", "https://app.example")],
        BODY,
    );
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example")
    );

    // Another origin: refused, and no CORS fields on its responses.
    let r = preflight(&gw, "https://evil.example");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.header("access-control-allow-origin").is_none());
    let r = Client::connect(gw.addr()).request(
        "POST",
        CHAT,
        &[
            ("authorization", "Bearer test-key"),
            ("origin", "https://evil.example"),
        ],
        BODY,
    );
    assert!(r.header("access-control-allow-origin").is_none());
}

#[test]
fn a_wildcard_allows_any_origin_and_no_setting_leaves_cors_off() {
    let gw = Gateway::start(&config(r#"cors_allow_origins = ["*"]"#));
    let r = preflight(&gw, "http://localhost:3000");
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));

    let gw = Gateway::start(&config(""));
    let r = preflight(&gw, "http://localhost:3000");
    assert_eq!(r.status, 405);
    assert!(r.header("allow").is_some());
    assert!(r.header("access-control-allow-origin").is_none());
}

/// An `OPTIONS` without `Origin` is no preflight: with CORS on it is routed like any request
/// (405 with `Allow`), not refused as if its origin were not listed.
#[test]
fn an_options_without_origin_is_not_a_refused_preflight() {
    for cors in [
        r#"cors_allow_origins = ["https://app.example"]"#,
        r#"cors_allow_origins = ["*"]"#,
    ] {
        let gw = Gateway::start(&config(cors));
        let r = Client::connect(gw.addr()).request("OPTIONS", CHAT, &[], b"");
        assert_eq!(r.status, 405, "{cors}: {}", r.text());
        assert_eq!(r.header("allow"), Some("POST"), "{cors}");
        assert_eq!(r.header("x-tidegate-error"), Some("method_not_allowed"));
    }
}

#[test]
fn an_origin_with_a_path_is_a_config_error() {
    let (code, _, err) =
        support::run_check(&config(r#"cors_allow_origins = ["https://app.example/x"]"#));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("server.cors_allow_origins[0]"), "{err}");
}
