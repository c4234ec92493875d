//! https upstreams: real TLS (rustls) to a mock upstream whose certificate is signed by a
//! private CA named in the provider's `ca_file`; without that CA the handshake is refused.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

fn config(mock: &MockUpstream, ca_line: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[providers]]
id = "secure"
format = "openai"
base_url = "{}"
models = ["m1"]
{ca_line}

[[connections]]
id = "c1"
provider = "secure"
"#,
        mock.base_url()
    )
}

#[test]
fn an_https_upstream_with_a_private_ca_is_served_over_tls_and_reused() {
    let mock = MockUpstream::start_tls();
    assert!(mock.base_url().starts_with("https://localhost:"));
    mock.on_always("/v1/chat/completions", Reply::openai_chat("over tls"));
    let ca = mock.ca_pem_path();
    let gw = Gateway::start(&config(&mock, &format!("ca_file = \"{}\"", ca.display())));
    let mut c = Client::connect(gw.addr());
    for _ in 0..3 {
        let r = c.request(
            "POST",
            "/v1/chat/completions",
            &[],
            br#"{"model":"secure/m1","messages":[]}"#,
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], "over tls");
    }
    let r = c.request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"secure/m1","stream":true,"messages":[]}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        mock.connections_accepted(),
        1,
        "TLS connections are pooled too"
    );
    assert!(mock.problems().is_empty(), "{:?}", mock.problems());
    let seen = mock.requests_to("/v1/chat/completions");
    assert_eq!(
        seen[0].header("host"),
        Some(format!("localhost:{}", mock.addr().port()).as_str())
    );
}

#[test]
fn an_untrusted_certificate_is_refused() {
    let mock = MockUpstream::start_tls();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("never"));
    let gw = Gateway::start(&config(&mock, ""));
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"secure/m1","messages":[]}"#,
    );
    assert_eq!(r.status, 502);
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("upstream_connect_failed")
    );
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("TLS"),
        "{}",
        r.text()
    );
    assert_eq!(mock.hits("/v1/chat/completions"), 0);
}

#[test]
fn a_missing_ca_file_is_a_configuration_error() {
    let mock = MockUpstream::start_tls();
    let (code, _out, err) = run_check(&config(&mock, "ca_file = \"/nonexistent/ca.pem\""));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("ca_file"), "{err}");
}
