//! Provider kinds and the rules they switch on, through the real binary (mock upstream →
//! Tidegate with two shards → client): the egress-bucketed lock (scope, default
//! allowlist), model locks on per-model-quota providers (a success clears them; a
//! model-scoped refusal locks one model, bounded), and a provider's configured daily reset.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::*;

const CHAT: &str = "/v1/chat/completions";

fn ask(gw: &Gateway, model: &str) -> Response {
    Client::connect(gw.addr()).request(
        "POST",
        CHAT,
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

/// The `Authorization` values upstream saw for `model`, in order.
fn keys_seen(mock: &MockUpstream, model: &str) -> Vec<String> {
    mock.requests_to(CHAT)
        .iter()
        .filter(|r| r.json()["model"] == model)
        .map(|r| r.header("authorization").unwrap_or("").to_owned())
        .collect()
}

fn gateway(providers_and_connections: &str, env: &[(&str, &str)]) -> Gateway {
    Gateway::start_with_env(
        &format!("[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{providers_and_connections}"),
        env,
    )
}

/// The gateway's own `model_cooldown` answer: (retry-after, reset_seconds).
fn cooldown_answer(r: &Response) -> (u64, u64) {
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("model_cooldown"),
        "{}",
        r.text()
    );
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    let reset = r.json()["error"]["reset_seconds"].as_u64().unwrap();
    (retry, reset)
}

// ---- item 2: the egress lock -----------------------------------------------------------

/// opencode-go's `x-ratelimit-remaining-requests: 0` is a connection-scoped quota rule: it
/// cools that account only, so its sibling behind the same egress serves the request.
#[test]
fn a_connection_scoped_429_does_not_cool_the_egress_sibling() {
    let mock = MockUpstream::start();
    mock.on(
        CHAT,
        Reply::error(429, "Too many requests").header("x-ratelimit-remaining-requests", "0"),
    );
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = gateway(
        &format!(
            r#"
[[providers]]
id = "opencode-go"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "h1"
provider = "opencode-go"
priority = 1
egress = "office"
api_key_env = "TG_H1"

[[connections]]
id = "h2"
provider = "opencode-go"
priority = 2
egress = "office"
api_key_env = "TG_H2"
"#,
            mock.base_url()
        ),
        &[("TG_H1", "key-h1"), ("TG_H2", "key-h2")],
    );
    let r = ask(&gw, "opencode-go/m1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "h2");
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    // h1 cools (its own quota), h2 keeps serving.
    for _ in 0..5 {
        let r = ask(&gw, "opencode-go/m1");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(served_by(&r), "h2");
    }
    assert_eq!(
        keys_seen(&mock, "m1")
            .iter()
            .filter(|k| *k == "Bearer key-h1")
            .count(),
        1
    );
}

/// The spec's allowlisted kinds (opencode-go, opencode-cli) take part in the egress lock
/// without an `egress` label: their unlabelled connections leave through the gateway's
/// own address, so an account-wide 429 on one cools the others; a labelled connection
/// (another egress) serves.
#[test]
fn allowlisted_kinds_share_the_gateways_egress_without_a_label() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(429, "Rate limit reached for requests"));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = gateway(
        &format!(
            r#"
[[providers]]
id = "opencode-go"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "a1"
provider = "opencode-go"
priority = 1
api_key_env = "TG_A1"

[[connections]]
id = "a2"
provider = "opencode-go"
priority = 2
api_key_env = "TG_A2"

[[connections]]
id = "b1"
provider = "opencode-go"
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
    let r = ask(&gw, "opencode-go/m1");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(served_by(&r), "b1", "a1's 429 cooled a2 as well");
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    for _ in 0..3 {
        assert_eq!(served_by(&ask(&gw, "opencode-go/m1")), "b1");
    }
    let seen = keys_seen(&mock, "m1");
    assert!(
        !seen.iter().any(|k| k == "Bearer key-a2"),
        "a2 was never tried: {seen:?}"
    );
}

// ---- item 6: model locks on per-model-quota providers ----------------------------------

/// Two rate-limited answers escalate m1's lock; a success clears it, so the next 429
/// without a hint locks for the base (3 s), not twice the base (what halving the failure
/// count gave).
#[test]
fn a_direct_success_clears_the_model_lock() {
    let mock = MockUpstream::start();
    for _ in 0..2 {
        mock.on(
            CHAT,
            Reply::error(429, "Rate limit reached for requests").header("retry-after", "1"),
        );
    }
    mock.on(CHAT, Reply::openai_chat("ok"));
    mock.on(CHAT, Reply::error(429, "Rate limit reached for requests"));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = gateway(
        &format!(
            r#"
[[providers]]
id = "openai-compatible-acme"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "openai-compatible-acme"
api_key_env = "TG_C1"

# Answered from the lock, not after waiting it out.
[resilience.wait_for_cooldown]
enabled = false
"#,
            mock.base_url()
        ),
        &[("TG_C1", "key-c1")],
    );
    let model = "openai-compatible-acme/m1";
    let r = ask(&gw, model);
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.header("x-tidegate-error").is_none(), "upstream's 429");
    // Locked for the hinted second: the gateway answers until it lapses, then upstream's
    // second 429 comes through, then (after another second) its 200.
    for (hits, status) in [(2, 429), (3, 200)] {
        let r = eventually(Duration::from_secs(10), "m1's lock lapses", || {
            let r = ask(&gw, model);
            (mock.hits(CHAT) == hits).then_some(r)
        });
        assert_eq!(r.status, status, "{}", r.text());
    }
    // The success cleared m1: this 429 (no hint) is its first failure again.
    let r = ask(&gw, model);
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(mock.hits(CHAT), 4);
    let (retry, reset) = cooldown_answer(&ask(&gw, model));
    assert!(
        (1..=3).contains(&retry) && (1..=3).contains(&reset),
        "locked for the 3 s base, got retry-after {retry}, reset_seconds {reset}"
    );
}

/// agentrouter's 403 `无权访问模型` is about one model: that model is locked on the
/// connection, capped by `model_lockout.max_cooldown_ms` (30 min), and the connection keeps
/// serving the provider's other models.
#[test]
fn a_model_scoped_refusal_locks_that_model_only() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(403, "无权访问模型 claude-opus"));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = gateway(
        &format!(
            r#"
[[providers]]
id = "agentrouter"
format = "openai"
base_url = "{}"
models = ["claude-opus", "gpt-4o"]

[[connections]]
id = "c1"
provider = "agentrouter"
api_key_env = "TG_C1"
"#,
            mock.base_url()
        ),
        &[("TG_C1", "key-c1")],
    );
    let r = ask(&gw, "agentrouter/claude-opus");
    assert_eq!(r.status, 403, "{}", r.text());
    let (retry, reset) = cooldown_answer(&ask(&gw, "agentrouter/claude-opus"));
    assert!(
        (1_700..=1_800).contains(&retry) && (1_700..=1_800).contains(&reset),
        "bounded at 30 min: retry-after {retry}, reset_seconds {reset}"
    );
    for _ in 0..3 {
        let r = ask(&gw, "agentrouter/gpt-4o");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(served_by(&r), "c1");
    }
    assert_eq!(keys_seen(&mock, "claude-opus").len(), 1);
}

// ---- item 22: a provider's daily reset clock -------------------------------------------

/// Milliseconds from `wall_ms` to `hour` o'clock at `offset_min` east of UTC, in (0, 24 h].
fn ms_until(wall_ms: u64, offset_min: i64, hour: i64) -> u64 {
    let day = 86_400_000i64;
    let local = wall_ms as i64 + offset_min * 60_000;
    let until = (hour * 3_600_000 - local.rem_euclid(day)).rem_euclid(day);
    (if until == 0 { day } else { until }) as u64
}

/// "Daily quota exceeded" cools until the provider's configured reset (here at half past
/// an hour UTC, never UTC midnight), not until midnight UTC.
#[test]
fn a_daily_quota_cools_until_the_configured_reset() {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // +00:30: the reset falls on hh:30 UTC. Pick the hour two hours ahead (local time).
    let offset = 30;
    let local_hour = (now_ms as i64 + offset * 60_000).rem_euclid(86_400_000) / 3_600_000;
    let hour = (local_hour + 2) % 24;
    let mock = MockUpstream::start();
    mock.on(
        CHAT,
        Reply::error(429, "Daily quota exceeded, try again tomorrow"),
    );
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = gateway(
        &format!(
            r#"
[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]
daily_reset_hour = {hour}
daily_reset_utc_offset_minutes = {offset}

[[connections]]
id = "c1"
provider = "up"
api_key_env = "TG_C1"
"#,
            mock.base_url()
        ),
        &[("TG_C1", "key-c1")],
    );
    let r = ask(&gw, "up/m1");
    assert_eq!(r.status, 429, "{}", r.text());
    let (retry, _) = cooldown_answer(&ask(&gw, "up/m1"));
    let want = ms_until(now_ms, offset, hour).div_ceil(1_000);
    let midnight = ms_until(now_ms, 0, 0).div_ceil(1_000);
    assert!(
        want.abs_diff(midnight) >= 20 * 60,
        "the test's clock is not midnight's"
    );
    assert!(
        retry.abs_diff(want) <= 30,
        "retry-after {retry}, configured reset in {want} s (UTC midnight: {midnight} s)"
    );
    assert_eq!(mock.hits(CHAT), 1);
}

#[test]
fn a_bad_daily_reset_is_a_config_problem() {
    let (code, _out, err) = run_check(
        "[[providers]]\nid = \"m\"\nformat = \"mock\"\ndaily_reset_hour = 24\n\
         daily_reset_utc_offset_minutes = 900\n",
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("providers[0].daily_reset_hour: 24 is out of range (0..=23)"),
        "{err}"
    );
    assert!(
        err.contains(
            "providers[0].daily_reset_utc_offset_minutes: 900 is out of range (-720..=840)"
        ),
        "{err}"
    );
}

#[test]
fn an_unknown_provider_kind_is_a_config_problem() {
    let (code, _out, err) =
        run_check("[[providers]]\nid = \"m\"\nkind = \"nvidea\"\nformat = \"mock\"\n");
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("kind")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("providers[0].kind: unknown provider kind \"nvidea\""),
        "{err}"
    );
}
