//! Model lockouts and the egress-bucketed lock on two shards: a 404 locks one model on one
//! connection only (per-model-quota providers; the connection stays active for other
//! models), and one 429 on a connection cools every sibling behind the same `egress`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use support::*;

fn ask(gw: &Gateway, model: &str) -> Response {
    Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[],
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

fn served_by(r: &Response) -> String {
    r.header("x-omniroute-selected-connection-id")
        .unwrap_or("")
        .to_owned()
}

fn keys_seen(mock: &MockUpstream, model: &str) -> Vec<String> {
    mock.requests_to("/v1/chat/completions")
        .iter()
        .filter(|r| r.json()["model"] == model)
        .map(|r| r.header("authorization").unwrap_or("").to_owned())
        .collect()
}

#[test]
fn a_404_locks_one_model_on_one_connection_only() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(404, "The model `m1` does not exist"),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    // A self-hosted (auth = local) provider: its limits are per model.
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[providers]]
id = "selfhosted"
format = "openai"
auth = "local"
base_url = "{}"
models = ["m1", "m2"]

[[connections]]
id = "c1"
provider = "selfhosted"
priority = 1
api_key_env = "TG_K1"

[[connections]]
id = "c2"
provider = "selfhosted"
priority = 2
api_key_env = "TG_K2"
"#,
            mock.base_url()
        ),
        &[("TG_K1", "key-one"), ("TG_K2", "key-two")],
    );
    let r = ask(&gw, "selfhosted/m1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "c2", "the 404 moved m1 to the sibling");
    for _ in 0..8 {
        // m1 stays locked on c1 …
        assert_eq!(served_by(&ask(&gw, "selfhosted/m1")), "c2");
        // … while c1 still serves m2.
        assert_eq!(served_by(&ask(&gw, "selfhosted/m2")), "c1");
    }
    assert_eq!(
        keys_seen(&mock, "m1")
            .iter()
            .filter(|k| *k == "Bearer key-one")
            .count(),
        1,
        "c1 saw m1 once (the 404)"
    );
}

#[test]
fn one_429_cools_every_connection_behind_the_same_egress() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(429, "Rate limit reached for requests").header("retry-after", "20"),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let gw = Gateway::start_with_env(
        &format!(
            r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "a1"
provider = "up"
priority = 1
egress = "proxy-a"
api_key_env = "TG_A1"

[[connections]]
id = "a2"
provider = "up"
priority = 2
egress = "proxy-a"
api_key_env = "TG_A2"

[[connections]]
id = "b1"
provider = "up"
priority = 3
egress = "proxy-b"
api_key_env = "TG_B1"
"#,
            mock.base_url()
        ),
        &[
            ("TG_A1", "key-a1"),
            ("TG_A2", "key-a2"),
            ("TG_B1", "key-b1"),
        ],
    );
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 200, "{}", r.text());
    // a1's 429 cooled its egress sibling a2 as well: the request went to b1.
    assert_eq!(served_by(&r), "b1");
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    for _ in 0..10 {
        let r = ask(&gw, "up/m1");
        assert_eq!(served_by(&r), "b1");
        assert_eq!(r.header("x-tidegate-attempts"), Some("1"));
    }
    let seen = keys_seen(&mock, "m1");
    assert!(
        !seen.iter().any(|k| k == "Bearer key-a2"),
        "a2 was never tried: {seen:?}"
    );
}
