//! Classification and restatement as a client sees them, through the real binary on two
//! shards (issue 9, items 1, 3, 4, 7, 15 and 19):
//! - agentrouter's quota 403 is restated to 429 whether its body is raw UTF-8 or JSON
//!   `\u` escapes, and an upstream `Retry-After` on it is kept;
//! - an OAuth 403 nobody recognises bans the connection; an OAuth 401 "Invalid
//!   authentication credentials" neither cools nor expires it;
//! - the spec's quota wordings classify as quotas (a long cooldown or lock, not seconds);
//! - a connection that cannot be reached is reported as unreachable (503), never as a rate
//!   limit;
//! - every provider error type is reached from a real answer, with its terminal status.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::Duration;

use support::*;

const KEYS: &[(&str, &str)] = &[("TG_K1", "key-one"), ("TG_K2", "key-two")];

/// One provider `provider_id` (`auth`, openai format) at `base_url` with model `m1` and
/// connection `c1` (key K1); `tail` is appended (e.g. `[resilience…]` tables).
fn config(base_url: &str, provider_id: &str, auth: &str, tail: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[providers]]
id = "{provider_id}"
format = "openai"
auth = "{auth}"
base_url = "{base_url}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "{provider_id}"
api_key_env = "TG_K1"

{tail}
"#
    )
}

fn start(mock: &MockUpstream, provider_id: &str, auth: &str, tail: &str) -> Gateway {
    Gateway::start_with_env(&config(&mock.base_url(), provider_id, auth, tail), KEYS)
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

fn retry_after(r: &Response) -> u64 {
    r.header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After on {} {}", r.status, r.text()))
        .parse()
        .unwrap()
}

/// The count of failed upstream attempts classified as `error_type`.
fn typed_errors(gw: &Gateway, error_type: &str) -> u64 {
    metric(
        gw.addr(),
        &format!("tidegate_upstream_errors_total{{type=\"{error_type}\"}}"),
    )
}

/// Waits until the connection is terminal everywhere (the gateway's own 401), then checks
/// that later requests never reach the upstream again.
fn assert_terminal(gw: &Gateway, mock: &MockUpstream, model: &str, what: &str) {
    let r = eventually(Duration::from_secs(5), "the terminal 401", || {
        let r = ask(gw, model);
        (r.header("x-tidegate-error") == Some("all_connections_unavailable")).then_some(r)
    });
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains(what),
        "{}",
        r.text()
    );
    let hits = mock.hits("/v1/chat/completions");
    for _ in 0..4 {
        let r = ask(gw, model);
        assert_eq!(r.status, 401, "{}", r.text());
    }
    assert_eq!(
        mock.hits("/v1/chat/completions"),
        hits,
        "a terminal connection is never tried"
    );
}

// ---------------------------------------------------------------------------------------
// Item 1: restatement.

#[test]
fn an_escaped_agentrouter_quota_403_reaches_the_client_as_429_with_retry_after_60() {
    let mock = MockUpstream::start();
    // What any JSON encoder with ASCII escapes sends for {"error":{"message":"用户额度不足"}}.
    mock.on_always(
        "/v1/chat/completions",
        Reply::status(403)
            .header("content-type", "application/json")
            .body(r#"{"error":{"message":"\u7528\u6237\u989d\u5ea6\u4e0d\u8db3","type":"new_api_error"}}"#),
    );
    let gw = start(&mock, "agentrouter", "apikey", "");
    let r = ask(&gw, "agentrouter/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("60"));
    assert!(
        r.text().contains(r"\u7528\u6237"),
        "the upstream's body is relayed as sent"
    );
}

#[test]
fn an_upstream_retry_after_on_a_restated_answer_is_kept() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::json(
            403,
            serde_json::json!({"error": {"message": "用户额度不足", "type": "new_api_error"}}),
        )
        .header("retry-after", "5"),
    );
    let gw = start(&mock, "agentrouter", "apikey", "");
    let r = ask(&gw, "agentrouter/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(
        r.header_all("retry-after"),
        vec!["5"],
        "the upstream's 5 s, not the rule's 60 s"
    );
}

// ---------------------------------------------------------------------------------------
// Item 3: an OAuth 403 with text nobody recognises.

#[test]
fn an_oauth_403_with_unrecognised_text_bans_the_connection() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::error(403, "You are not allowed to do that"),
    );
    let gw = start(&mock, "acme", "oauth", "");
    let r = ask(&gw, "acme/m1");
    assert_eq!(r.status, 403, "the first 403 is relayed: {}", r.text());
    assert!(r.header("x-tidegate-error").is_none());
    assert_terminal(&gw, &mock, "acme/m1", "banned");
    assert_eq!(typed_errors(&gw, "forbidden"), 1);
}

// ---------------------------------------------------------------------------------------
// Item 4: an OAuth 401 "Invalid authentication credentials".

#[test]
fn an_oauth_401_with_invalid_credentials_neither_cools_nor_expires_the_connection() {
    let mock = MockUpstream::start();
    mock.on_always(
        "/v1/chat/completions",
        Reply::error(401, "Invalid authentication credentials"),
    );
    let gw = start(&mock, "acme", "oauth", "");
    for i in 1..=5 {
        let r = ask(&gw, "acme/m1");
        assert_eq!(r.status, 401, "request {i}: {}", r.text());
        assert!(
            r.header("x-tidegate-error").is_none(),
            "request {i} reached the upstream: {}",
            r.text()
        );
        assert_eq!(mock.hits("/v1/chat/completions"), i);
    }
    assert_eq!(typed_errors(&gw, "oauth_invalid_token"), 5);
    assert_eq!(typed_errors(&gw, "unauthorized"), 0);
}

// ---------------------------------------------------------------------------------------
// Item 7: quota wording.

#[test]
fn monthly_usage_limit_cools_for_the_quota_window_without_upstream_hints() {
    let mock = MockUpstream::start();
    mock.on(
        "/v1/chat/completions",
        Reply::error(429, "Monthly usage limit reached"),
    );
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let tail = "[resilience.connection_cooldown.apikey]\nuse_upstream_retry_hints = false\n";
    let gw = start(&mock, "acme", "apikey", tail);
    let r = ask(&gw, "acme/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    let r = eventually(Duration::from_secs(5), "the cooldown answer", || {
        let r = ask(&gw, "acme/m1");
        (r.header("x-tidegate-error") == Some("model_cooldown")).then_some(r)
    });
    let wait = retry_after(&r);
    assert!(
        (3_500..=3_600).contains(&wait),
        "cools for the one-hour quota window, not seconds: Retry-After {wait}"
    );
    assert_eq!(mock.hits("/v1/chat/completions"), 1);
    assert_eq!(typed_errors(&gw, "quota_exhausted"), 1);
}

#[test]
fn quota_wordings_with_a_reset_hint_lock_the_model_for_the_reset() {
    // A `local` provider has per-model quotas: a quota locks the model for the reset the
    // text names (capped by `model_lockout.max_cooldown_ms`, 30 min); a rate limit only
    // for seconds. Upstream hints are not trusted here, so only the quota path reads one.
    let tail = "[resilience.connection_cooldown.local]\nuse_upstream_retry_hints = false\n";
    for text in [
        "Individual quota reached. Contact your administrator to enable overages. Resets in 2h.",
        "You exceeded your monthly token quota; resets in 2h",
        "You have used up your daily free allocation of 10,000 neurons, resets in 2h",
        "Request reached organization TPD rate limit, resets in 2h",
    ] {
        let mock = MockUpstream::start();
        mock.on("/v1/chat/completions", Reply::error(429, text));
        mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
        let gw = start(&mock, "self", "local", tail);
        let r = ask(&gw, "self/m1");
        assert_eq!(r.status, 429, "{text}: {}", r.text());
        let r = eventually(Duration::from_secs(5), "the lockout answer", || {
            let r = ask(&gw, "self/m1");
            (r.header("x-tidegate-error") == Some("model_cooldown")).then_some(r)
        });
        let wait = retry_after(&r);
        assert!(
            (1_700..=1_800).contains(&wait),
            "{text}: locked until the reset (capped at 30 min), not seconds: Retry-After {wait}"
        );
        assert_eq!(mock.hits("/v1/chat/completions"), 1, "{text}");
        assert_eq!(typed_errors(&gw, "quota_exhausted"), 1, "{text}");
    }
}

// ---------------------------------------------------------------------------------------
// Item 15: network failures.

#[test]
fn an_unreachable_upstream_is_reported_as_unreachable_never_as_a_rate_limit() {
    // An api-key provider, and a local one (per-model quotas: a failure usually locks the
    // model, but a network failure is about the host).
    for auth in ["apikey", "local"] {
        unreachable_is_not_a_rate_limit(auth);
    }
}

fn unreachable_is_not_a_rate_limit(auth: &str) {
    // A port held without listening for the whole test: every connect is refused (a
    // port merely released could be given to another process meanwhile).
    let dead = RefusingPort::new();
    let base_url = dead.base_url();
    let gw = Gateway::start_with_env(&config(&base_url, "acme", auth, ""), KEYS);
    let r = ask(&gw, "acme/m1");
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("upstream_connect_failed")
    );
    let r = eventually(Duration::from_secs(5), "the unreachable answer", || {
        let r = ask(&gw, "acme/m1");
        assert_ne!(
            r.status,
            429,
            "{auth}: no rate limit happened: {}",
            r.text()
        );
        (r.status == 503).then_some(r)
    });
    assert_eq!(r.header("x-tidegate-error"), Some("upstream_unreachable"));
    let e = &r.json()["error"];
    assert_eq!(e["code"], "upstream_unreachable");
    assert_eq!(e["type"], "service_unavailable");
    assert_eq!(e["provider"], "acme");
    assert!(
        e["message"].as_str().unwrap().contains("network errors"),
        "{}",
        r.text()
    );
    let wait = retry_after(&r);
    assert!((1..=5).contains(&wait), "{auth}: Retry-After {wait}");
    assert_eq!(e["retry_after"], wait);
    assert!(typed_errors(&gw, "connect_failed") >= 1);
}

// ---------------------------------------------------------------------------------------
// Item 19: every provider error type from a real answer, with its terminal status.

#[test]
fn every_provider_error_type_is_reached_from_a_real_answer() {
    struct Case {
        provider: &'static str,
        auth: &'static str,
        status: u16,
        text: &'static str,
        error_type: &'static str,
        /// `Some(what)`: the connection becomes terminal (`what` in the 401's message);
        /// `None`: it stays in rotation and the next request reaches the upstream.
        terminal: Option<&'static str>,
    }
    let cases = [
        Case {
            provider: "acme",
            auth: "oauth",
            status: 403,
            text: "SENTINEL_BLOCKED: complete the challenge",
            error_type: "forbidden",
            terminal: Some("banned"),
        },
        Case {
            provider: "acme",
            auth: "apikey",
            status: 403,
            text: "Turnstile required",
            error_type: "forbidden",
            terminal: Some("banned"),
        },
        Case {
            provider: "acme",
            auth: "oauth",
            status: 401,
            text: "This account is deactivated",
            error_type: "account_deactivated",
            terminal: Some("banned"),
        },
        Case {
            provider: "acme",
            auth: "oauth",
            status: 401,
            text: "Invalid authentication credentials",
            error_type: "oauth_invalid_token",
            terminal: None,
        },
        Case {
            provider: "acme",
            auth: "oauth",
            status: 403,
            text: "Cloud AI Companion API has not been used in project 1234 before",
            error_type: "project_route_error",
            terminal: None,
        },
        // `vertex`, not `gemini`: a gemini-kind provider holds per-model quotas, so its 403
        // locks the model (A §3.5 step 19) and the next request would not reach upstream.
        Case {
            provider: "vertex",
            auth: "oauth",
            status: 403,
            text: "User location is not supported for the API use.",
            error_type: "geo_blocked",
            terminal: None,
        },
        Case {
            provider: "acme",
            auth: "oauth",
            status: 403,
            text: "error code: 1010 (browser_signature_banned)",
            error_type: "fingerprint_rejection",
            terminal: None,
        },
    ];
    for c in cases {
        let what = format!("{} {} {:?}", c.auth, c.status, c.text);
        let mock = MockUpstream::start();
        mock.on_always("/v1/chat/completions", Reply::error(c.status, c.text));
        let gw = start(&mock, c.provider, c.auth, "");
        let model = format!("{}/m1", c.provider);
        let r = ask(&gw, &model);
        assert_eq!(r.status, c.status, "{what}: {}", r.text());
        assert_eq!(typed_errors(&gw, c.error_type), 1, "{what}");
        match c.terminal {
            Some(t) => assert_terminal(&gw, &mock, &model, t),
            None => {
                for i in 2..=3 {
                    let r = ask(&gw, &model);
                    assert_eq!(r.status, c.status, "{what}: {}", r.text());
                    assert_eq!(mock.hits("/v1/chat/completions"), i, "{what}");
                }
            }
        }
    }
}
