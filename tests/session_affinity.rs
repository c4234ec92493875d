//! Session affinity (spec B §4): a session's pin to a connection lives on the session's
//! owner shard, so a session keeps its connection whichever shard serves it, and moves when
//! that connection cools (a failover after a 429 drops the pin; the next pick is the least
//! recently used eligible connection). Session headers never reach the upstream.
//! `x-omniroute-connection` forces a connection; an unknown one is a hard failure.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use support::*;

const CHAT: &str = "/v1/chat/completions";
const SESSION_HEADERS: [&str; 3] = ["x-codex-session-id", "x-session-id", "x-omniroute-session"];

/// Two shards; provider `up` with connections `c1` (priority 1, key `k1`) and `c2`
/// (priority 2, key `k2`); provider `other` with `o1`.
fn config(base: &str, resilience: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "up"
format = "openai"
base_url = "{base}"
models = ["m1"]

[[providers]]
id = "other"
format = "openai"
base_url = "{base}"
models = ["m9"]

[[connections]]
id = "c1"
provider = "up"
priority = 1
api_key_env = "TG_AFFINITY_K1"

[[connections]]
id = "c2"
provider = "up"
priority = 2
api_key_env = "TG_AFFINITY_K2"

[[connections]]
id = "o1"
provider = "other"
api_key_env = "TG_AFFINITY_K1"

[[combos]]
name = "team"
targets = ["up/m1"]

[[combos]]
name = "tteam"
targets = ["up/m1"]
config = {{ target_timeout_ms = 1000, max_retries = 0 }}

[resilience]
{resilience}
"#
    )
}

fn start(base: &str, resilience: &str) -> Gateway {
    Gateway::start_with_env(
        &config(base, resilience),
        &[("TG_AFFINITY_K1", "k1"), ("TG_AFFINITY_K2", "k2")],
    )
}

/// One request on a fresh client connection (so SO_REUSEPORT spreads them over both
/// shards), with `extra` headers.
fn ask(gw: &Gateway, model: &str, extra: &[(&str, &str)]) -> Response {
    let mut c = Client::connect(gw.addr());
    let mut headers = vec![("authorization", "Bearer test-key")];
    headers.extend_from_slice(extra);
    c.request(
        "POST",
        CHAT,
        &headers,
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

/// The shard that answered: the low byte of a gateway-made request id
/// (`tg-<wall ms>-<sequence << 8 | shard>`, hex).
fn shard_of(resp: &Response) -> u64 {
    let id = resp.header("x-request-id").expect("x-request-id");
    let seq = id.rsplit('-').next().unwrap();
    u64::from_str_radix(seq, 16).unwrap() & 0xff
}

fn served_by(resp: &Response) -> String {
    assert_eq!(resp.status, 200, "{}", resp.text());
    resp.header("x-omniroute-selected-connection-id")
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_session_keeps_its_connection_across_both_shards_and_moves_when_it_cools() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "session_affinity_ttl_ms = 600000");
    assert_eq!(gw.shards(), 2);

    // The first session is pinned to the never-used connection of best priority: c1.
    let first = ask(&gw, "m1", &[("x-session-id", "s0")]);
    assert_eq!(served_by(&first), "c1");

    // A second session gets the least recently used connection, c2 — although c1 is
    // healthy and first by priority — and keeps it over 20 requests on 20 client
    // connections (both shards serve; the pin lives on the session's owner). The three
    // session headers carry the same key.
    let mut shards_seen = Vec::new();
    for i in 0..20 {
        let header = SESSION_HEADERS[i % 3];
        let resp = ask(&gw, "m1", &[(header, "s1")]);
        assert_eq!(served_by(&resp), "c2", "request {i} ({header})");
        shards_seen.push(shard_of(&resp));
    }
    // Both shards served some of them (the request id's low byte names the shard).
    assert!(
        shards_seen.contains(&0) && shards_seen.contains(&1),
        "{shards_seen:?}"
    );
    let seen = mock.requests_to(CHAT);
    assert_eq!(seen.len(), 21);
    assert_eq!(seen[0].header("authorization"), Some("Bearer k1"));
    for r in &seen[1..] {
        assert_eq!(r.header("authorization"), Some("Bearer k2"));
    }

    // c2 answers 429: the request fails over to c1, the pin to c2 is dropped, and the
    // session now stays on c1.
    mock.on(
        CHAT,
        Reply::error(429, "rate limited").header("retry-after", "600"),
    );
    let moved = ask(&gw, "m1", &[("x-session-id", "s1")]);
    assert_eq!(served_by(&moved), "c1");
    assert_eq!(moved.header("x-tidegate-attempts"), Some("2"));
    for i in 0..9 {
        let resp = ask(&gw, "m1", &[(SESSION_HEADERS[i % 3], "s1")]);
        assert_eq!(served_by(&resp), "c1", "request {i} after the move");
    }

    // No session header ever reached the upstream.
    let seen = mock.requests_to(CHAT);
    assert_eq!(seen.len(), 21 + 2 + 9);
    for r in &seen {
        for h in SESSION_HEADERS {
            assert!(!r.has_header(h), "{h} was forwarded: {:?}", r.headers);
        }
    }
    assert!(mock.problems().is_empty(), "{:?}", mock.problems());
}

#[test]
fn x_omniroute_connection_forces_a_connection_and_an_unknown_one_fails_hard() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "session_affinity_ttl_ms = 600000");

    // Forced to c2 although c1 is first by priority; the header is not forwarded.
    let resp = ask(&gw, "m1", &[("x-omniroute-connection", "c2")]);
    assert_eq!(served_by(&resp), "c2");
    let seen = mock.requests_to(CHAT);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("authorization"), Some("Bearer k2"));
    assert!(!seen[0].has_header("x-omniroute-connection"));

    // An unknown connection: 400 unknown_connection, nothing sent upstream.
    let resp = ask(&gw, "m1", &[("x-omniroute-connection", "nope")]);
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "unknown_connection");
    assert_eq!(resp.header("x-tidegate-error"), Some("unknown_connection"));
    assert!(
        resp.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nope")
    );

    // A connection of another provider cannot serve m1: 400 connection_not_usable.
    let resp = ask(&gw, "m1", &[("x-omniroute-connection", "o1")]);
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert_eq!(resp.json()["error"]["code"], "connection_not_usable");
    assert_eq!(mock.requests_to(CHAT).len(), 1);
}

#[test]
fn a_combo_target_keeps_the_session_on_its_pinned_connection() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "session_affinity_ttl_ms = 600000");
    assert_eq!(
        served_by(&ask(&gw, "team", &[("x-session-id", "t0")])),
        "c1"
    );
    for i in 0..8 {
        let resp = ask(&gw, "team", &[("x-session-id", "t1")]);
        assert_eq!(served_by(&resp), "c2", "request {i}");
    }
}

#[test]
fn a_target_timeout_in_a_combo_evicts_the_pin_to_the_timed_out_connection() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    // c2 never cools (`disable_cooling`), so after its timeout it stays eligible: only the
    // eviction rule can move the session.
    let gw = Gateway::start_with_env(
        &config(&mock.base_url(), "session_affinity_ttl_ms = 600000")
            .replace("priority = 2\n", "priority = 2\ndisable_cooling = true\n"),
        &[("TG_AFFINITY_K1", "k1"), ("TG_AFFINITY_K2", "k2")],
    );
    // s0 is pinned to c1 (never used, best priority), s1 to c2 (least recently used).
    assert_eq!(
        served_by(&ask(&gw, "tteam", &[("x-session-id", "s0")])),
        "c1"
    );
    assert_eq!(
        served_by(&ask(&gw, "tteam", &[("x-session-id", "s1")])),
        "c2"
    );
    assert_eq!(
        served_by(&ask(&gw, "tteam", &[("x-session-id", "s1")])),
        "c2"
    );

    // c2 sends no response head within the combo's 1 s target timeout: the request moves
    // on to c1, and the pin to c2 is evicted.
    mock.on(CHAT, Reply::stall_before_head());
    let started = std::time::Instant::now();
    let moved = ask(&gw, "tteam", &[("x-session-id", "s1")]);
    assert_eq!(served_by(&moved), "c1");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1000));
    assert_eq!(moved.header("x-tidegate-attempts"), Some("2"));
    let seen = mock.requests_to(CHAT);
    assert_eq!(seen.len(), 5);
    assert_eq!(seen[3].header("authorization"), Some("Bearer k2"));
    assert_eq!(seen[4].header("authorization"), Some("Bearer k1"));

    // s1's next pick is made afresh (least recently pinned: c1) although c2 serves again;
    // a new session still gets c2, so c2 is eligible and only the pin moved.
    for i in 0..4 {
        let resp = ask(&gw, "tteam", &[(SESSION_HEADERS[i % 3], "s1")]);
        assert_eq!(served_by(&resp), "c1", "request {i} after the timeout");
    }
    assert_eq!(
        served_by(&ask(&gw, "tteam", &[("x-session-id", "s2")])),
        "c2"
    );
}

/// docs/clients.md: Claude Code's `x-claude-code-session-id` and Codex CLI's `session_id` /
/// `session-id` name a session (all requests here share their first user message, which
/// would otherwise make them one session), and they still reach the upstream: they are the
/// clients' own headers for their provider.
#[test]
fn claude_code_and_codex_session_headers_key_their_sessions() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "session_affinity_ttl_ms = 600000");
    // Claude Code's session is pinned first (c1), Codex's next (the least recently used: c2).
    let claude = [("x-claude-code-session-id", "0b9e4c52-claude")];
    assert_eq!(served_by(&ask(&gw, "m1", &claude)), "c1");
    assert_eq!(
        served_by(&ask(&gw, "m1", &[("session_id", "codex-1")])),
        "c2"
    );
    for i in 0..6 {
        assert_eq!(served_by(&ask(&gw, "m1", &claude)), "c1", "claude {i}");
        let codex = if i % 2 == 0 {
            "session_id"
        } else {
            "session-id"
        };
        assert_eq!(
            served_by(&ask(&gw, "m1", &[(codex, "codex-1")])),
            "c2",
            "codex {i} ({codex})"
        );
    }
    let seen = mock.requests_to(CHAT);
    assert_eq!(seen.len(), 14);
    assert_eq!(
        seen[0].header("x-claude-code-session-id"),
        Some("0b9e4c52-claude")
    );
    assert_eq!(seen[1].header("session_id"), Some("codex-1"));
}
