//! What an SDK client sees of the gateway's own answers: `GET /v1/models/{id}` (the OpenAI
//! SDK's `models.retrieve`) and a listing of only the models a client can use now; a body
//! without `model` named as such; a 405 with `Allow`; and on `/v1/messages` every
//! gateway-made error in Anthropic's shape, with the gateway's code kept in
//! `x-tidegate-error`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use support::*;

const KEY: &str = "Bearer test-key";

/// `up` (OpenAI format) has an enabled connection; `off` has only a connection whose key
/// variable is unset (disabled); `claude` (Anthropic format) has an enabled connection.
fn config(mock: &MockUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "up"
format = "openai"
base_url = "{base}"
models = ["m1"]

[[providers]]
id = "off"
format = "openai"
base_url = "{base}"
models = ["m2"]

[[providers]]
id = "claude"
format = "anthropic"
base_url = "{base}"
models = ["c1"]

[[connections]]
id = "c-up"
provider = "up"
api_key_env = "TG_TEST_UPSTREAM_KEY"

[[connections]]
id = "c-off"
provider = "off"
api_key_env = "TG_TEST_UNSET_KEY_CLIENT_EXPERIENCE"

[[connections]]
id = "c-claude"
provider = "claude"
api_key_env = "TG_TEST_UPSTREAM_KEY"

[[combos]]
name = "live"
targets = ["off/m2", "up/m1"]

[[combos]]
name = "dead"
targets = ["off/m2"]
"#,
        base = mock.base_url()
    )
}

const ENV: &[(&str, &str)] = &[("TG_TEST_UPSTREAM_KEY", "sk-upstream-secret")];

fn get(gw: &Gateway, path: &str) -> Response {
    Client::connect(gw.addr()).request("GET", path, &[("authorization", KEY)], b"")
}

#[test]
fn the_listing_has_only_models_with_an_enabled_connection() {
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock), ENV);
    let r = get(&gw, "/v1/models");
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    assert_eq!(body["object"], "list");
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["up/m1", "claude/c1", "live"], "{body}");
}

/// A model whose every connection is disabled names the key variable the gateway lacks, for
/// a model named directly and for a combo whose only target is that model.
#[test]
fn a_model_without_an_enabled_connection_names_the_unset_key_variable() {
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock), ENV);
    for model in ["off/m2", "m2", "dead"] {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let r = Client::connect(gw.addr()).request(
            "POST",
            "/v1/chat/completions",
            &[("authorization", KEY)],
            body.as_bytes(),
        );
        assert_eq!(r.status, 503, "{model}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "no_available_connection");
        let message = r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        assert!(
            message.contains("TG_TEST_UNSET_KEY_CLIENT_EXPERIENCE not set"),
            "{model}: {message}"
        );
    }
    assert_eq!(mock.hits("/v1/chat/completions"), 0);
}

#[test]
fn a_model_is_retrieved_by_id_in_openais_shape() {
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock), ENV);
    for path in ["/v1/models/up/m1", "/v1/models/up%2Fm1"] {
        let r = get(&gw, path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(
            r.json(),
            serde_json::json!({"id": "up/m1", "object": "model", "created": 0, "owned_by": "up"})
        );
    }
    let r = get(&gw, "/v1/models/live");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["owned_by"], "combo");

    // Unknown, disabled, or a combo with no enabled target: OpenAI's 404.
    for id in ["nope", "off/m2", "dead"] {
        let r = get(&gw, &format!("/v1/models/{id}"));
        assert_eq!(r.status, 404, "{id}: {}", r.text());
        assert_eq!(r.header("x-tidegate-error"), Some("model_not_found"));
        let e = &r.json()["error"];
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert_eq!(e["code"], "model_not_found");
        assert_eq!(e["param"], "model");
        assert!(e["message"].as_str().unwrap().contains(id), "{e}");
    }

    // It needs a client key like the listing.
    let r = Client::connect(gw.addr()).request("GET", "/v1/models/up/m1", &[], b"");
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(mock.requests().len(), 0, "nothing reached an upstream");
}

#[test]
fn a_body_without_model_says_so_in_openais_words() {
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock), ENV);
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[("authorization", KEY), ("content-type", "application/json")],
        br#"{"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("missing_model"));
    let e = &r.json()["error"];
    assert_eq!(e["message"], "you must provide a model parameter");
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"], "model");
    assert_eq!(mock.requests().len(), 0);
}

#[test]
fn a_405_names_the_allowed_methods() {
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock), ENV);
    let r = get(&gw, "/v1/chat/completions");
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(r.header("allow"), Some("POST"));
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");

    let r = Client::connect(gw.addr()).request("DELETE", "/v1/models/up/m1", &[], b"");
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    let r = Client::connect(gw.addr()).request("POST", "/v1/models", &[], b"{}");
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
}

/// `GET` routes answer `HEAD` with the `GET`'s head: its `Content-Length` is the length the
/// `GET`'s body has (RFC 9110 §8.6), not 0, and no body follows — the next response on the
/// same connection is read intact.
#[test]
fn head_answers_with_the_content_length_of_the_get() {
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock), ENV);
    for path in ["/v1/models", "/v1/models/up/m1", "/healthz", "/readyz"] {
        let got = get(&gw, path);
        assert_eq!(got.status, 200, "{path}: {}", got.text());
        let mut client = Client::connect(gw.addr());
        let head = client.request("HEAD", path, &[("authorization", KEY)], b"");
        assert_eq!(head.status, 200, "{path}");
        assert_eq!(
            head.header("content-length"),
            Some(got.body.len().to_string().as_str()),
            "HEAD {path}"
        );
        assert_eq!(head.header("content-type"), got.header("content-type"));
        assert!(head.body.is_empty(), "HEAD {path}: {:?}", head.text());
        // Nothing of a body was sent: the same connection's next answer starts clean.
        let again = client.request("GET", path, &[("authorization", KEY)], b"");
        assert_eq!(again.status, 200, "{path}: {}", again.text());
        assert_eq!(again.body, got.body, "{path}");
    }
    // A gateway-made error to a HEAD keeps its length too.
    let head = Client::connect(gw.addr()).request(
        "HEAD",
        "/v1/models/nope",
        &[("authorization", KEY)],
        b"",
    );
    assert_eq!(head.status, 404);
    assert_ne!(head.header("content-length"), Some("0"));
    assert!(head.body.is_empty());
}

/// An Anthropic error body: `{"type":"error","error":{"type","message"}}`.
fn assert_anthropic(r: &Response, status: u16, anthropic_type: &str, code: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some(code), "{}", r.text());
    let body = r.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], anthropic_type, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

fn messages(gw: &Gateway, headers: &[(&str, &str)], body: &str) -> Response {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    Client::connect(gw.addr()).request("POST", "/v1/messages", &h, body.as_bytes())
}

const ANTHROPIC_KEY: (&str, &str) = ("x-api-key", "test-key");

#[test]
fn messages_errors_made_by_the_gateway_are_in_anthropics_shape() {
    let mock = MockUpstream::start();
    let gw = Gateway::start_with_env(&config(&mock), ENV);
    let ok = r#"{"model":"claude/c1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;

    let r = messages(&gw, &[], ok);
    assert_anthropic(&r, 401, "authentication_error", "invalid_api_key");
    let r = messages(&gw, &[("x-api-key", "wrong")], ok);
    assert_anthropic(&r, 401, "authentication_error", "invalid_api_key");

    let r = messages(&gw, &[ANTHROPIC_KEY], r#"{"max_tokens":8,"messages":[]}"#);
    assert_anthropic(&r, 400, "invalid_request_error", "missing_model");
    let r = messages(&gw, &[ANTHROPIC_KEY], "{not json");
    assert_anthropic(&r, 400, "invalid_request_error", "invalid_json");
    let r = messages(
        &gw,
        &[ANTHROPIC_KEY],
        r#"{"model":"nowhere","messages":[]}"#,
    );
    assert_anthropic(&r, 404, "not_found_error", "model_not_found");
    // An OpenAI-format provider serves the Messages API through translation; a field it
    // cannot express is refused, naming it.
    let r = messages(
        &gw,
        &[ANTHROPIC_KEY],
        r#"{"model":"up/m1","max_tokens":8,"top_k":5,"messages":[]}"#,
    );
    assert_anthropic(&r, 400, "invalid_request_error", "untranslatable_request");
    assert_eq!(r.json()["error"]["param"], "top_k", "{}", r.text());
    let r = messages(&gw, &[ANTHROPIC_KEY], r#"{"model":"off/m2","messages":[]}"#);
    assert_anthropic(&r, 503, "api_error", "no_available_connection");

    let r = Client::connect(gw.addr()).request("GET", "/v1/messages", &[ANTHROPIC_KEY], b"");
    assert_anthropic(&r, 405, "invalid_request_error", "method_not_allowed");
    assert_eq!(r.header("allow"), Some("POST"));

    // The same failures elsewhere keep OpenAI's shape.
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        br#"{"model":"up/m1","messages":[]}"#,
    );
    assert_eq!(r.status, 401);
    assert!(r.json().get("type").is_none(), "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
}

#[test]
fn a_body_too_large_on_messages_is_anthropics_request_too_large() {
    let mock = MockUpstream::start();
    let cfg = config(&mock).replace(
        "workers = 1\n",
        "workers = 1\nmax_request_body_bytes = 1024\n",
    );
    let gw = Gateway::start_with_env(&cfg, ENV);
    let big = format!(
        r#"{{"model":"claude/c1","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(4096)
    );
    let r = messages(&gw, &[ANTHROPIC_KEY], &big);
    assert_anthropic(&r, 413, "request_too_large", "request_too_large");
}

#[test]
fn a_cooling_model_on_messages_is_anthropics_rate_limit_error() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/messages",
        Reply::json(
            429,
            serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
        )
        .header("retry-after", "30"),
    );
    // Answered from the cooldown at once, not after waiting the 30 s out.
    let cfg = config(&mock) + "\n[resilience.wait_for_cooldown]\nenabled = false\n";
    let gw = Gateway::start_with_env(&cfg, ENV);
    let body =
        r#"{"model":"claude/c1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    // The upstream's own 429 is relayed as it came; then the model cools and the gateway
    // answers without trying it.
    let first = messages(&gw, &[ANTHROPIC_KEY], body);
    assert_eq!(first.status, 429, "{}", first.text());
    assert!(first.header("x-tidegate-error").is_none());
    let r = eventually(
        Duration::from_secs(5),
        "the gateway answers the cooldown",
        || {
            let r = messages(&gw, &[ANTHROPIC_KEY], body);
            r.header("x-tidegate-error").is_some().then_some(r)
        },
    );
    assert_eq!(r.status, 429, "{}", r.text());
    let code = r.header("x-tidegate-error").unwrap().to_owned();
    assert_anthropic(&r, 429, "rate_limit_error", &code);
    assert!(r.header("retry-after").is_some());
}

#[test]
fn an_open_breaker_on_messages_is_anthropics_overloaded_error() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/messages",
        Reply::json(
            500,
            serde_json::json!({"type": "error", "error": {"type": "api_error", "message": "boom"}}),
        ),
    );
    // Two failures open the provider's breaker; the connection itself never cools.
    let cfg = config(&mock).replace(
        "provider = \"claude\"\n",
        "provider = \"claude\"\ndisable_cooling = true\n",
    ) + "\n[resilience.provider_breaker.apikey]\nfailure_threshold = 2\ndegradation_threshold = 1\n";
    let gw = Gateway::start_with_env(&cfg, ENV);
    let body =
        r#"{"model":"claude/c1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    for _ in 0..2 {
        let r = messages(&gw, &[ANTHROPIC_KEY], body);
        assert_eq!(r.status, 500, "the upstream's own answer: {}", r.text());
        assert!(r.header("x-tidegate-error").is_none());
    }
    let r = messages(&gw, &[ANTHROPIC_KEY], body);
    assert_anthropic(&r, 503, "overloaded_error", "provider_circuit_open");
    assert!(r.header("retry-after").is_some(), "{}", r.text());
    assert_eq!(
        mock.hits("/v1/messages"),
        2,
        "the open breaker sends nothing"
    );
}
