//! Exclusive session leases (spec B §5) through the real gateway: `POST
//! /api/v1/session-leases` (acquire, renew, status, release; every check in order; the
//! capacity answer), and the fence on inference — a lease-managed key's requests carry
//! both lease headers and go to the leased connection only, from whichever shard serves
//! them (every lease lives on shard 0), never to another candidate or the emergency
//! fallback. The lease headers never reach the upstream. Leases and owners' generations
//! survive a restart (the snapshot); a reload that takes the connection from the key
//! invalidates the lease.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use serde_json::{Value, json};
use support::*;

const CHAT: &str = "/v1/chat/completions";
const LEASES: &str = "/api/v1/session-leases";
const OWNER_A: &str = "vlo_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const OWNER_B: &str = "vlo_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";

/// Two shards; provider `up` with `c1` (priority 1, upstream key `k1`) and `c2` (priority
/// 2, `k2`); provider `other` with `o1`. The `agent` key may lease only `c2`.
fn config(base: &str, server_extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2
{server_extra}

[[client_keys]]
id = "agent"
key = "agent-key"
scopes = ["inference", "lease:exclusive"]
allowed_connections = ["c2", "o1"]

[[client_keys]]
id = "agent2"
key = "agent2-key"
scopes = ["inference", "lease:exclusive"]
allowed_connections = ["c2"]

[[client_keys]]
id = "plain"
key = "plain-key"
scopes = ["inference"]

[[client_keys]]
id = "nolist"
key = "nolist-key"
scopes = ["inference", "lease:exclusive"]

[[client_keys]]
id = "ops"
key = "ops-key"
scopes = ["manage"]

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

[[providers]]
id = "third"
format = "openai"
base_url = "{base}"
models = ["m3"]

[[connections]]
id = "c1"
provider = "up"
priority = 1
api_key_env = "TG_LEASE_K1"

[[connections]]
id = "c2"
provider = "up"
priority = 2
api_key_env = "TG_LEASE_K2"

[[connections]]
id = "o1"
provider = "other"
api_key_env = "TG_LEASE_K1"

[[connections]]
id = "t1"
provider = "third"
api_key_env = "TG_LEASE_K1"

[[combos]]
name = "team"
targets = ["up/m1"]
"#
    )
}

fn start(base: &str, server_extra: &str) -> Gateway {
    Gateway::start_with_env(
        &config(base, server_extra),
        &[("TG_LEASE_K1", "k1"), ("TG_LEASE_K2", "k2")],
    )
}

/// A lease call on a fresh client connection (so both shards serve some).
fn lease(gw: &Gateway, key: Option<&str>, owner: Option<&str>, body: &Value) -> Response {
    let mut headers = vec![("content-type", "application/json")];
    let auth;
    if let Some(k) = key {
        auth = format!("Bearer {k}");
        headers.push(("authorization", auth.as_str()));
    }
    if let Some(o) = owner {
        headers.push(("x-omniroute-lease-owner", o));
    }
    let mut c = Client::connect(gw.addr());
    c.request("POST", LEASES, &headers, body.to_string().as_bytes())
}

/// An inference request on a fresh client connection, with `extra` headers.
fn ask(gw: &Gateway, key: &str, model: &str, extra: &[(&str, &str)]) -> Response {
    let auth = format!("Bearer {key}");
    let mut headers = vec![("authorization", auth.as_str())];
    headers.extend_from_slice(extra);
    let mut c = Client::connect(gw.addr());
    c.request(
        "POST",
        CHAT,
        &headers,
        format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
            .as_bytes(),
    )
}

/// The status and `error.code` of a lease error, checking its envelope.
fn lease_error(resp: &Response) -> (u16, String) {
    let body = resp.json();
    assert_eq!(body["error"]["type"], "lease_error", "{}", resp.text());
    assert!(body["error"]["message"].is_string(), "{}", resp.text());
    (
        resp.status,
        body["error"]["code"].as_str().unwrap().to_owned(),
    )
}

fn acquire(model: &str) -> Value {
    json!({"action": "acquire", "model": model})
}

#[test]
fn a_lease_fences_inference_to_its_connection_from_either_shard() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "");
    assert_eq!(gw.shards(), 2);

    // Acquire: generation 1, ISO times, nothing that names the connection or the owner.
    let got = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    let body = got.json();
    assert_eq!(body["state"], "ACTIVE");
    assert_eq!(body["generation"], 1);
    for t in ["acquiredAt", "renewedAt", "expiresAt"] {
        let s = body[t].as_str().unwrap();
        assert!(
            s.len() == 24 && s.ends_with('Z') && s.contains('T'),
            "{t}: {s}"
        );
    }
    let text = got.text();
    for secret in ["c2", "agent", OWNER_A, "k2"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }

    // Inference with the lease headers goes to c2 (the leased one; c1 has the better
    // priority), whichever shard serves it. The lease headers never reach the upstream.
    let headers = [
        ("x-omniroute-lease-owner", OWNER_A),
        ("x-omniroute-lease-generation", "1"),
    ];
    let mut shards = std::collections::BTreeSet::new();
    for _ in 0..12 {
        let resp = ask(&gw, "agent-key", "up/m1", &headers);
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(
            resp.header("x-omniroute-selected-connection-id"),
            Some("c2")
        );
        shards.insert(shard_of(&resp));
    }
    assert_eq!(shards.len(), 2, "both shards served: {shards:?}");
    let seen = mock.requests_to(CHAT);
    assert_eq!(seen.len(), 12);
    for r in &seen {
        assert_eq!(r.header("authorization"), Some("Bearer k2"));
        assert!(!r.has_header("x-omniroute-lease-owner"));
        assert!(!r.has_header("x-omniroute-lease-generation"));
    }

    // A stale generation, a missing or malformed header: refused before any dispatch.
    let stale = ask(
        &gw,
        "agent-key",
        "up/m1",
        &[
            ("x-omniroute-lease-owner", OWNER_A),
            ("x-omniroute-lease-generation", "2"),
        ],
    );
    assert_eq!(lease_error(&stale), (409, "LEASE_FENCE_STALE".into()));
    let bare = ask(&gw, "agent-key", "up/m1", &[]);
    assert_eq!(lease_error(&bare), (400, "LEASE_CONTEXT_REQUIRED".into()));
    let no_generation = ask(
        &gw,
        "agent-key",
        "up/m1",
        &[("x-omniroute-lease-owner", OWNER_A)],
    );
    assert_eq!(
        lease_error(&no_generation),
        (400, "LEASE_CONTEXT_REQUIRED".into())
    );
    let zero = ask(
        &gw,
        "agent-key",
        "up/m1",
        &[
            ("x-omniroute-lease-owner", OWNER_A),
            ("x-omniroute-lease-generation", "01"),
        ],
    );
    assert_eq!(lease_error(&zero), (400, "LEASE_CONTEXT_INVALID".into()));
    // The lease is c2's: a model c2 does not serve cannot be routed there.
    let elsewhere = ask(&gw, "agent-key", "other/m9", &headers);
    assert_eq!(
        lease_error(&elsewhere),
        (409, "LEASE_CONNECTION_MISMATCH".into())
    );
    // A managed key cannot fan out over a combo.
    let combo = ask(&gw, "agent-key", "team", &headers);
    assert_eq!(lease_error(&combo), (400, "LEASE_UNSUPPORTED_ROUTE".into()));
    // Another managed key presenting this owner's lease.
    let foreign = ask(&gw, "agent2-key", "up/m1", &headers);
    assert_eq!(
        lease_error(&foreign),
        (409, "LEASE_AUTHORIZATION_MISMATCH".into())
    );
    assert_eq!(
        mock.requests_to(CHAT).len(),
        12,
        "none of those was dispatched"
    );

    // A second owner on the only connection it may lease: 429 capacity, Retry-After.
    let busy = lease(&gw, Some("agent2-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(busy.status, 429, "{}", busy.text());
    let body = busy.json();
    assert_eq!(body["state"], "WAITING_FOR_CAPACITY");
    assert_eq!(body["error"]["code"], "LEASE_CAPACITY_UNAVAILABLE");
    assert_eq!(body["error"]["type"], "lease_error");
    assert_eq!(body["reason"], "NO_FREE_ELIGIBLE_CONNECTION");
    assert_eq!(
        (body["eligibleCount"].as_u64(), body["freeCount"].as_u64()),
        (Some(1), Some(0))
    );
    let retry: u64 = busy.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=120).contains(&retry), "{retry}");
    assert_eq!(body["retryAfter"].as_u64(), Some(retry));
    // It holds no lease: its inference is refused.
    let none = ask(
        &gw,
        "agent2-key",
        "up/m1",
        &[
            ("x-omniroute-lease-owner", OWNER_B),
            ("x-omniroute-lease-generation", "1"),
        ],
    );
    assert_eq!(lease_error(&none), (409, "LEASE_REQUIRED".into()));
    // The fence's 409s word their message as OmniRoute does: the code with spaces.
    for (resp, message) in [
        (&elsewhere, "LEASE CONNECTION MISMATCH"),
        (&foreign, "LEASE AUTHORIZATION MISMATCH"),
        (&none, "LEASE REQUIRED"),
    ] {
        assert_eq!(resp.json()["error"]["message"], message);
    }

    // Renew, status (the provider, never the connection id), reuse by a second acquire.
    let renewed = lease(
        &gw,
        Some("agent-key"),
        Some(OWNER_A),
        &json!({"action": "renew", "generation": 1}),
    );
    assert_eq!(renewed.status, 200, "{}", renewed.text());
    assert_eq!(renewed.json()["generation"], 1);
    let status = lease(
        &gw,
        Some("agent-key"),
        Some(OWNER_A),
        &json!({"action": "status", "generation": 1}),
    );
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(
        status.json()["connection"],
        json!({"displayName": null, "provider": "up"})
    );
    let reused = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(reused.json()["generation"], 1, "{}", reused.text());
    let wrong = lease(
        &gw,
        Some("agent-key"),
        Some(OWNER_A),
        &json!({"action": "renew", "generation": 7}),
    );
    assert_eq!(lease_error(&wrong), (409, "LEASE_FENCE_STALE".into()));

    // Release (a repeat answers the same), then the old generation is stale and a new
    // acquire is generation 2.
    let release = json!({"action": "release", "generation": 1, "reason": "OWNER_EXIT"});
    for _ in 0..2 {
        let r = lease(&gw, Some("agent-key"), Some(OWNER_A), &release);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["state"], "RELEASED");
    }
    let after = ask(&gw, "agent-key", "up/m1", &headers);
    assert_eq!(lease_error(&after), (409, "LEASE_FENCE_STALE".into()));
    let again = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("m1"));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["generation"], 2);
    let served = ask(
        &gw,
        "agent-key",
        "up/m1",
        &[
            ("x-omniroute-lease-owner", OWNER_A),
            ("x-omniroute-lease-generation", "2"),
        ],
    );
    assert_eq!(served.status, 200, "{}", served.text());

    // The health page counts the active lease.
    let mut c = Client::connect(gw.addr());
    let health = c.request(
        "GET",
        "/api/monitoring/health",
        &[("authorization", "Bearer ops-key")],
        b"",
    );
    assert_eq!(health.json()["leases"]["active"], 1, "{}", health.text());
}

#[test]
fn the_endpoint_checks_in_the_specs_order() {
    let mock = MockUpstream::start();
    let gw = start(&mock.base_url(), "");
    let a = Some(OWNER_A);
    let body = acquire("up/m1");
    let code = |r: Response| lease_error(&r);
    assert_eq!(
        code(lease(&gw, None, a, &body)),
        (401, "LEASE_AUTHENTICATION_REQUIRED".into())
    );
    assert_eq!(
        code(lease(&gw, Some("nope"), a, &body)),
        (401, "LEASE_API_KEY_INVALID".into())
    );
    let mut c = Client::connect(gw.addr());
    let plain_text = c.request(
        "POST",
        LEASES,
        &[
            ("authorization", "Bearer agent-key"),
            ("content-type", "text/plain"),
        ],
        body.to_string().as_bytes(),
    );
    assert_eq!(
        code(plain_text),
        (415, "LEASE_CONTENT_TYPE_REQUIRED".into())
    );
    // A bad action is told before a missing scope.
    assert_eq!(
        code(lease(
            &gw,
            Some("plain-key"),
            a,
            &json!({"action": "renew"})
        )),
        (400, "LEASE_ACTION_INVALID".into())
    );
    // The message says what each action takes: a model too long, a bad release reason.
    for bad in [
        acquire(&"m".repeat(513)),
        json!({"action": "release", "generation": 1, "reason": "DONE"}),
    ] {
        let r = lease(&gw, Some("agent-key"), a, &bad);
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert_eq!(code(r), (400, "LEASE_ACTION_INVALID".into()));
        for part in ["1 to 512 characters", "1 to 2^53-1", "OWNER_EXIT"] {
            assert!(message.contains(part), "{message}");
        }
    }
    assert_eq!(
        code(lease(&gw, Some("plain-key"), a, &body)),
        (403, "LEASE_SCOPE_REQUIRED".into())
    );
    assert_eq!(
        code(lease(&gw, Some("nolist-key"), a, &body)),
        (403, "LEASE_KEY_CONFIGURATION_INVALID".into())
    );
    assert_eq!(
        code(lease(&gw, Some("agent-key"), None, &body)),
        (400, "LEASE_CONTEXT_REQUIRED".into())
    );
    assert_eq!(
        code(lease(&gw, Some("agent-key"), Some("vlo_short"), &body)),
        (400, "LEASE_CONTEXT_INVALID".into())
    );
    let unknown = lease(&gw, Some("agent-key"), a, &acquire("nowhere/x"));
    // The resolver's message, naming the model once.
    assert_eq!(
        unknown.json()["error"]["message"],
        "model \"nowhere/x\" is not a combo, a provider/model, or in any provider's models"
    );
    assert_eq!(code(unknown), (400, "LEASE_MODEL_INVALID".into()));
    // `third` serves m3, but this key may lease none of its connections.
    assert_eq!(
        code(lease(&gw, Some("agent-key"), a, &acquire("third/m3"))),
        (409, "LEASE_NO_ELIGIBLE_CONNECTION".into())
    );
    // A status of a lease never acquired is stale.
    assert_eq!(
        code(lease(
            &gw,
            Some("agent-key"),
            a,
            &json!({"action": "status", "generation": 1})
        )),
        (409, "LEASE_FENCE_STALE".into())
    );
    // OPTIONS: 204, the lease headers allowed.
    let mut c = Client::connect(gw.addr());
    let options = c.request("OPTIONS", LEASES, &[], b"");
    assert_eq!(options.status, 204);
    let allowed = options.header("access-control-allow-headers").unwrap();
    assert!(allowed.contains("x-omniroute-lease-owner"), "{allowed}");
    assert!(
        allowed.contains("x-omniroute-lease-generation"),
        "{allowed}"
    );
    // Another method: 405, and `Allow` names both methods the endpoint answers.
    let get = c.request("GET", LEASES, &[("authorization", "Bearer agent-key")], b"");
    assert_eq!(get.status, 405, "{}", get.text());
    assert_eq!(get.header("allow"), Some("POST, OPTIONS"));
    // A model none of the key's connections serves is refused as for any key (403), before
    // the lease headers are read.
    let outside = ask(&gw, "agent-key", "third/m3", &[]);
    assert_eq!(outside.status, 403, "{}", outside.text());
    assert_eq!(outside.json()["error"]["code"], "forbidden");
    // A key without the scope is not lease-managed: its inference needs no lease headers.
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let plain = ask(&gw, "plain-key", "up/m1", &[]);
    assert_eq!(plain.status, 200, "{}", plain.text());
    // The endpoint never called the upstream: the one request it saw is that inference.
    assert_eq!(mock.requests().len(), 1);
}

#[test]
fn a_lease_expires_after_its_ttl_and_frees_the_connection() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "lease_ttl_ms = 1000");
    let got = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    let body = got.json();
    let at = |k: &str| body[k].as_str().unwrap().to_owned();
    assert!(at("expiresAt") > at("acquiredAt"));
    let headers = [
        ("x-omniroute-lease-owner", OWNER_A),
        ("x-omniroute-lease-generation", "1"),
    ];
    assert_eq!(ask(&gw, "agent-key", "up/m1", &headers).status, 200);
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    let late = ask(&gw, "agent-key", "up/m1", &headers);
    assert_eq!(lease_error(&late), (409, "LEASE_FENCE_STALE".into()));
    // The connection is free again: another owner gets it, at generation 1.
    let other = lease(&gw, Some("agent2-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(other.json()["generation"], 1);
    // The first owner's next lease would be generation 2, but c2 is taken: capacity.
    let back = lease(&gw, Some("agent2-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(back.status, 429, "{}", back.text());
    let retry: u64 = back.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry, 1);
}

#[test]
fn leases_and_their_generations_survive_a_restart() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let state = TempDir::new("lease-restart");
    let server = format!(
        "state_dir = \"{}\"\nsnapshot_interval_ms = 50",
        state.path().display()
    );
    let mut gw = start(&mock.base_url(), &server);
    assert_eq!(
        lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1")).status,
        200
    );
    let release = json!({"action": "release", "generation": 1});
    assert_eq!(
        lease(&gw, Some("agent-key"), Some(OWNER_A), &release).status,
        200
    );
    let again = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(again.json()["generation"], 2, "{}", again.text());
    gw.terminate();
    let status = gw.wait_exit(std::time::Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{}", gw.logs());

    // The file holds the owner's digest, never its token.
    let out = support::gateway::run_tidegate(
        &[
            "snapshot",
            "inspect",
            "--state-dir",
            state.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains(OWNER_A));
    let file: Value = serde_json::from_str(&out.stdout).unwrap();
    let leases = file["state"]["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "{file:#}");
    assert_eq!(leases[0]["generation"], 2);
    assert_eq!(leases[0]["state"], "ACTIVE");
    assert_eq!(leases[0]["connection"], "c2");

    // Restarted: the lease still fences inference to c2, holds c2 against another owner,
    // and generation 1 is still stale.
    let gw = start(&mock.base_url(), &server);
    let headers = [
        ("x-omniroute-lease-owner", OWNER_A),
        ("x-omniroute-lease-generation", "2"),
    ];
    for _ in 0..4 {
        let resp = ask(&gw, "agent-key", "up/m1", &headers);
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(
            resp.header("x-omniroute-selected-connection-id"),
            Some("c2")
        );
    }
    let old = ask(
        &gw,
        "agent-key",
        "up/m1",
        &[
            ("x-omniroute-lease-owner", OWNER_A),
            ("x-omniroute-lease-generation", "1"),
        ],
    );
    assert_eq!(lease_error(&old), (409, "LEASE_FENCE_STALE".into()));
    let busy = lease(&gw, Some("agent2-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(busy.status, 429, "{}", busy.text());
}

#[test]
fn a_leased_request_never_takes_the_emergency_fallback() {
    let paid = MockUpstream::start();
    let rescue = MockUpstream::start();
    paid.on_always(CHAT, Reply::error(402, "Payment Required: out of credits"));
    rescue.on_always(CHAT, Reply::openai_chat("rescued"));
    let toml = format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "agent"
key = "agent-key"
scopes = ["inference", "lease:exclusive"]
allowed_connections = ["p1", "r1"]

[[client_keys]]
id = "plain"
key = "plain-key"

[[providers]]
id = "paid"
format = "openai"
base_url = "{}"
models = ["m1"]

[[providers]]
id = "rescue"
format = "openai"
base_url = "{}"
models = ["big"]

[[connections]]
id = "p1"
provider = "paid"

[[connections]]
id = "r1"
provider = "rescue"

[emergency_fallback]
target = "rescue/big"
"#,
        paid.base_url(),
        rescue.base_url()
    );
    let gw = Gateway::start(&toml);
    let got = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("paid/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    let body =
        r#"{"model":"paid/m1","max_tokens":9000,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut c = Client::connect(gw.addr());
    let resp = c.request(
        "POST",
        CHAT,
        &[
            ("authorization", "Bearer agent-key"),
            ("x-omniroute-lease-owner", OWNER_A),
            ("x-omniroute-lease-generation", "1"),
        ],
        body.as_bytes(),
    );
    // The leased connection's own answer, not a re-run elsewhere.
    assert_eq!(resp.status, 402, "{}", resp.text());
    assert_eq!(resp.header("x-omniroute-emergency-fallback"), None);
    assert_eq!((paid.hits(CHAT), rescue.hits(CHAT)), (1, 0));
    // The same request by a key that is not lease-managed is rescued (the fallback is on).
    let mut c = Client::connect(gw.addr());
    let plain = c.request(
        "POST",
        CHAT,
        &[("authorization", "Bearer plain-key")],
        body.as_bytes(),
    );
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(rescue.hits(CHAT), 1);
}

#[test]
fn a_reload_that_takes_the_connection_from_the_key_invalidates_the_lease() {
    let mock = MockUpstream::start();
    let mut gw = start(&mock.base_url(), "");
    let got = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    let status = json!({"action": "status", "generation": 1});
    let held = lease(&gw, Some("agent-key"), Some(OWNER_A), &status);
    assert_eq!(held.status, 200, "{}", held.text());
    // The agent key may no longer use c2.
    let file = config(&mock.base_url(), "").replace(
        r#"allowed_connections = ["c2", "o1"]"#,
        r#"allowed_connections = ["o1"]"#,
    );
    let before = gw.logs().matches("configuration reloaded").count();
    std::fs::write(gw.config_path(), file).unwrap();
    gw.signal(libc::SIGHUP);
    eventually(std::time::Duration::from_secs(10), "the reload", || {
        (gw.logs().matches("configuration reloaded").count() > before).then_some(())
    });
    eventually(
        std::time::Duration::from_secs(10),
        "the lease invalidated",
        || {
            let r = lease(&gw, Some("agent-key"), Some(OWNER_A), &status);
            (r.status == 409).then_some(())
        },
    );
    let r = lease(&gw, Some("agent-key"), Some(OWNER_A), &status);
    assert_eq!(lease_error(&r), (409, "LEASE_FENCE_STALE".into()));
    // c2 is free for another owner.
    let other = lease(&gw, Some("agent2-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(other.status, 200, "{}", other.text());
}

/// A reload that disables the leased connection (its key variable unset) rather than
/// removing it ends the lease too: its requests could go nowhere else.
#[test]
fn a_reload_that_disables_the_leased_connection_invalidates_the_lease() {
    let mock = MockUpstream::start();
    let mut gw = start(&mock.base_url(), "");
    let got = lease(&gw, Some("agent2-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    let status = json!({"action": "status", "generation": 1});
    let held = lease(&gw, Some("agent2-key"), Some(OWNER_A), &status);
    assert_eq!(held.status, 200, "{}", held.text());
    let file = config(&mock.base_url(), "").replace(
        "api_key_env = \"TG_LEASE_K2\"",
        "api_key_env = \"TG_LEASE_UNSET\"",
    );
    assert!(file.contains("TG_LEASE_UNSET"));
    let before = gw.logs().matches("configuration reloaded").count();
    std::fs::write(gw.config_path(), file).unwrap();
    gw.signal(libc::SIGHUP);
    eventually(std::time::Duration::from_secs(10), "the reload", || {
        (gw.logs().matches("configuration reloaded").count() > before).then_some(())
    });
    eventually(
        std::time::Duration::from_secs(10),
        "the lease invalidated",
        || {
            let r = lease(&gw, Some("agent2-key"), Some(OWNER_A), &status);
            (r.status == 409).then_some(())
        },
    );
    let r = lease(&gw, Some("agent2-key"), Some(OWNER_A), &status);
    assert_eq!(lease_error(&r), (409, "LEASE_FENCE_STALE".into()));
}

/// A restart whose file takes the leased connection from the key is a reload: the restored
/// lease ends at start-up, so another owner gets the connection at once (it was held until
/// the first housekeeping round, 5 s on).
#[test]
fn a_restart_whose_file_takes_the_connection_from_the_key_ends_the_lease_at_once() {
    let mock = MockUpstream::start();
    let state = TempDir::new("lease-restart-unauthorised");
    let server = format!(
        "state_dir = \"{}\"\nsnapshot_interval_ms = 50",
        state.path().display()
    );
    let mut gw = start(&mock.base_url(), &server);
    let got = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    gw.terminate();
    let status = gw.wait_exit(std::time::Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{}", gw.logs());
    // The agent key may no longer use c2.
    let file = config(&mock.base_url(), &server).replace(
        r#"allowed_connections = ["c2", "o1"]"#,
        r#"allowed_connections = ["o1"]"#,
    );
    let gw = Gateway::start_with_env(&file, &[("TG_LEASE_K1", "k1"), ("TG_LEASE_K2", "k2")]);
    assert!(gw.logs().contains("leases=1"), "{}", gw.logs());
    let other = lease(&gw, Some("agent2-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(other.status, 200, "{}", other.text());
    let stale = lease(
        &gw,
        Some("agent-key"),
        Some(OWNER_A),
        &json!({"action": "status", "generation": 1}),
    );
    assert_eq!(lease_error(&stale), (409, "LEASE_FENCE_STALE".into()));
}

/// A key whose connections of the model's provider are all disabled (their `api_key_env`
/// unset) is told so, without the connection's name; a provider the key has no connection
/// of gets the plain refusal.
#[test]
fn an_acquire_refused_because_the_keys_connection_is_disabled_says_so() {
    let mock = MockUpstream::start();
    // TG_LEASE_K2 unset: c2, the agent key's only connection of `up`, is disabled.
    let gw = Gateway::start_with_env(&config(&mock.base_url(), ""), &[("TG_LEASE_K1", "k1")]);
    let r = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert_eq!(
        lease_error(&r),
        (409, "LEASE_NO_ELIGIBLE_CONNECTION".into())
    );
    assert!(message.contains("disabled: api_key_env unset"), "{message}");
    assert!(!message.contains("c2"), "{message}");
    let r = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("third/m3"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert_eq!(
        lease_error(&r),
        (409, "LEASE_NO_ELIGIBLE_CONNECTION".into())
    );
    assert!(!message.contains("disabled"), "{message}");
}

#[test]
fn check_warns_of_a_lease_key_without_allowed_connections_or_inference() {
    let (code, _stdout, stderr) = run_check(&config("http://127.0.0.1:9/v1", ""));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("client_keys[3]: scope lease:exclusive without allowed_connections"),
        "{stderr}"
    );
    assert!(!stderr.contains("without inference"), "{stderr}");
    // A lease key without `inference`: its leases could serve no request.
    let file = config("http://127.0.0.1:9/v1", "").replace(
        "id = \"agent2\"\nkey = \"agent2-key\"\nscopes = [\"inference\", \"lease:exclusive\"]",
        "id = \"agent2\"\nkey = \"agent2-key\"\nscopes = [\"lease:exclusive\"]",
    );
    let (code, _stdout, stderr) = run_check(&file);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("client_keys[1]: scope lease:exclusive without inference"),
        "{stderr}"
    );
}

/// Two shards; provider `up` with `c1` (priority 1, upstream key `k1`) and `c2` (priority
/// 2, `k2`). `pair` may lease either, `solo` only `c1`; `plain` is not lease-managed (it
/// forces a connection to teach it a failure). Cooldowns are not waited out.
fn pair_config(base: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "pair"
key = "pair-key"
scopes = ["inference", "lease:exclusive"]
allowed_connections = ["c1", "c2"]

[[client_keys]]
id = "solo"
key = "solo-key"
scopes = ["inference", "lease:exclusive"]
allowed_connections = ["c1"]

[[client_keys]]
id = "plain"
key = "plain-key"
scopes = ["inference"]

[[providers]]
id = "up"
format = "openai"
base_url = "{base}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "up"
priority = 1
api_key_env = "TG_LEASE_K1"

[[connections]]
id = "c2"
provider = "up"
priority = 2
api_key_env = "TG_LEASE_K2"

[resilience.wait_for_cooldown]
enabled = false
"#
    )
}

fn start_pair(base: &str) -> Gateway {
    Gateway::start_with_env(
        &pair_config(base),
        &[("TG_LEASE_K1", "k1"), ("TG_LEASE_K2", "k2")],
    )
}

/// The lease headers of `owner` at `generation`.
fn fenced(owner: &'static str, generation: &'static str) -> [(&'static str, &'static str); 2] {
    [
        ("x-omniroute-lease-owner", owner),
        ("x-omniroute-lease-generation", generation),
    ]
}

/// Acquires `model` for `owner` through `key` until the answer is the refusal `code`:
/// until every shard's views show the failure an upstream just taught (a lease granted
/// before that is released again).
fn acquire_until_refused(
    gw: &Gateway,
    key: &str,
    owner: &str,
    model: &str,
    code: &str,
) -> Response {
    eventually(
        std::time::Duration::from_secs(5),
        "the failure in every shard's views",
        || {
            for _ in 0..4 {
                let r = lease(gw, Some(key), Some(owner), &acquire(model));
                if r.status == 200 {
                    let generation = r.json()["generation"].clone();
                    let release = json!({"action": "release", "generation": generation});
                    assert_eq!(lease(gw, Some(key), Some(owner), &release).status, 200);
                    return None;
                }
                assert_eq!(r.json()["error"]["code"], code, "{}", r.text());
            }
            Some(lease(gw, Some(key), Some(owner), &acquire(model)))
        },
    )
}

#[test]
fn acquire_leases_only_connections_routable_now() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(403, "account_deactivated"));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start_pair(&mock.base_url());
    let force = |c: &str| ask(&gw, "plain-key", "up/m1", &[("x-omniroute-connection", c)]);

    // c1 is banned (terminal): the key that may lease only c1 has no eligible connection.
    assert_eq!(force("c1").status, 403);
    let r = acquire_until_refused(
        &gw,
        "solo-key",
        OWNER_A,
        "up/m1",
        "LEASE_NO_ELIGIBLE_CONNECTION",
    );
    assert_eq!(
        lease_error(&r),
        (409, "LEASE_NO_ELIGIBLE_CONNECTION".into())
    );
    assert!(r.header("retry-after").is_none());
    // The pair key gets c2, though c1 has the better priority.
    let got = lease(&gw, Some("pair-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    for _ in 0..4 {
        let served = ask(&gw, "pair-key", "up/m1", &fenced(OWNER_B, "1"));
        assert_eq!(served.status, 200, "{}", served.text());
        assert_eq!(
            served.header("x-omniroute-selected-connection-id"),
            Some("c2")
        );
    }
    let release = json!({"action": "release", "generation": 1});
    assert_eq!(
        lease(&gw, Some("pair-key"), Some(OWNER_B), &release).status,
        200
    );

    // c2 answers 429 with Retry-After: 30 and cools. Every connection of the pair key
    // that is not terminal is cooling: 429, with the cooldown's end.
    mock.on(
        CHAT,
        Reply::error(429, "rate limited").header("retry-after", "30"),
    );
    assert_eq!(force("c2").status, 429);
    let r = acquire_until_refused(
        &gw,
        "pair-key",
        OWNER_B,
        "up/m1",
        "LEASE_ELIGIBILITY_UNAVAILABLE",
    );
    assert_eq!(
        lease_error(&r),
        (429, "LEASE_ELIGIBILITY_UNAVAILABLE".into())
    );
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((20..=30).contains(&retry), "Retry-After {retry}");
    // The solo key's only connection is still terminal, not waiting.
    let r = lease(&gw, Some("solo-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(
        lease_error(&r),
        (409, "LEASE_NO_ELIGIBLE_CONNECTION".into())
    );
    // The endpoint made no upstream call: the mock saw only the two forced requests and
    // B's four.
    assert_eq!(mock.hits(CHAT), 6);
}

#[test]
fn a_lease_whose_connection_cools_moves_on_the_next_acquire() {
    let mock = MockUpstream::start();
    mock.on(
        CHAT,
        Reply::error(429, "rate limited").header("retry-after", "30"),
    );
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start_pair(&mock.base_url());

    // A's lease is on c1 (the better priority); its first request there is a 429 with
    // Retry-After: 30, relayed as is (a lease never moves a request elsewhere), and c1
    // cools.
    let got = lease(&gw, Some("pair-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.json()["generation"], 1, "{}", got.text());
    let cooled = ask(&gw, "pair-key", "up/m1", &fenced(OWNER_A, "1"));
    assert_eq!(cooled.status, 429, "{}", cooled.text());
    assert_eq!(
        cooled.header("x-omniroute-selected-connection-id"),
        Some("c1")
    );
    let sent = mock.requests_to(CHAT);
    assert_eq!(sent[0].header("authorization"), Some("Bearer k1"));

    // Once every shard sees c1 cooling (the key that may lease only c1 is told so on
    // four fresh connections in a row), a renew keeps the lease where it is: generation 1
    // on c1, whose requests get c1's refusal without reaching the upstream.
    eventually(
        std::time::Duration::from_secs(5),
        "c1 cooling in every shard's views",
        || {
            (0..4)
                .all(|_| {
                    let r = lease(&gw, Some("solo-key"), Some(OWNER_B), &acquire("up/m1"));
                    r.json()["error"]["code"] == "LEASE_ELIGIBILITY_UNAVAILABLE"
                })
                .then_some(())
        },
    );
    let renew = json!({"action": "renew", "generation": 1});
    let renewed = lease(&gw, Some("pair-key"), Some(OWNER_A), &renew);
    assert_eq!(renewed.status, 200, "{}", renewed.text());
    assert_eq!(renewed.json()["generation"], 1);
    let refused = ask(&gw, "pair-key", "up/m1", &fenced(OWNER_A, "1"));
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.header("x-tidegate-error"), Some("model_cooldown"));
    assert_eq!(mock.hits(CHAT), 1);

    // A acquires again: the lease moves to c2 under generation 2 (were the answering
    // shard's views behind, the acquire would reuse generation 1: asked until moved).
    let moved = eventually(std::time::Duration::from_secs(5), "the lease moved", || {
        let r = lease(&gw, Some("pair-key"), Some(OWNER_A), &acquire("up/m1"));
        assert_eq!(r.status, 200, "{}", r.text());
        (r.json()["generation"] != 1).then_some(r)
    });
    let body = moved.json();
    assert_eq!(body["state"], "ACTIVE");
    assert_eq!(body["generation"], 2, "{}", moved.text());
    assert!(!moved.text().contains("c2"), "{}", moved.text());

    // Generation 1 is stale everywhere; generation 2 is served by c2, from either shard.
    let old = ask(&gw, "pair-key", "up/m1", &fenced(OWNER_A, "1"));
    assert_eq!(lease_error(&old), (409, "LEASE_FENCE_STALE".into()));
    let status = json!({"action": "status", "generation": 1});
    let old_status = lease(&gw, Some("pair-key"), Some(OWNER_A), &status);
    assert_eq!(lease_error(&old_status), (409, "LEASE_FENCE_STALE".into()));
    let status = json!({"action": "status", "generation": 2});
    let new_status = lease(&gw, Some("pair-key"), Some(OWNER_A), &status);
    assert_eq!(new_status.status, 200, "{}", new_status.text());
    assert_eq!(new_status.json()["connection"]["provider"], "up");
    let mut shards = std::collections::BTreeSet::new();
    for _ in 0..12 {
        let r = ask(&gw, "pair-key", "up/m1", &fenced(OWNER_A, "2"));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c2"));
        shards.insert(shard_of(&r));
    }
    assert_eq!(shards.len(), 2, "both shards served: {shards:?}");
    let to_c2 = mock
        .requests_to(CHAT)
        .iter()
        .filter(|r| r.header("authorization") == Some("Bearer k2"))
        .count();
    assert_eq!(to_c2, 12);
    assert_eq!(mock.hits(CHAT), 13, "c1 saw only the first request");

    // c2 is eligible: another acquire reuses generation 2. c1 is free of A's lease but
    // still cooling: the key that may lease only c1 waits for it.
    let again = lease(&gw, Some("pair-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(again.json()["generation"], 2, "{}", again.text());
    let b = lease(&gw, Some("solo-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(
        lease_error(&b),
        (429, "LEASE_ELIGIBILITY_UNAVAILABLE".into())
    );
}

/// The shard that answered: the low byte of a gateway-made request id
/// (`tg-<wall ms>-<sequence << 8 | shard>`, hex).
fn shard_of(resp: &Response) -> u64 {
    let id = resp.header("x-request-id").expect("x-request-id");
    let seq = id.rsplit('-').next().unwrap();
    u64::from_str_radix(seq, 16).unwrap() & 0xff
}

/// The audit of B §5 against the binary, for what the tests above do not pin down: the
/// capacity answer's exact members and headers, the generation header's bounds (a safe
/// integer, `^[1-9][0-9]*$`), REUSED pushing the end out, and release's idempotence being
/// only for the same key and generation of a released lease.
#[test]
fn the_capacity_answer_generation_bounds_reuse_and_release_fencing_are_the_specs() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "");
    let got = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    let first = got.json();

    // Capacity: exactly the spec's members (top level and `error`), JSON, Retry-After
    // equal to `retryAfter`; nothing names the connection, the key or the owners.
    let busy = lease(&gw, Some("agent2-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(busy.status, 429, "{}", busy.text());
    assert_eq!(busy.header("content-type"), Some("application/json"));
    let body = busy.json();
    let mut top: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    top.sort_unstable();
    assert_eq!(
        top,
        [
            "eligibleCount",
            "error",
            "freeCount",
            "reason",
            "retryAfter",
            "state"
        ],
        "{body}"
    );
    let mut inner: Vec<&str> = body["error"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    inner.sort_unstable();
    assert_eq!(inner, ["code", "message", "type"], "{body}");
    let retry = busy.header("retry-after").unwrap();
    assert_eq!(body["retryAfter"].to_string(), retry);
    let text = busy.text();
    for secret in ["c2", "agent", OWNER_A, OWNER_B, "k2"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }

    // The generation header: the largest safe integer passes the format (and is merely
    // stale); 2^53, a 25-digit number, a sign, a fraction or an exponent are malformed.
    let with_generation = |g: &str| {
        ask(
            &gw,
            "agent-key",
            "up/m1",
            &[
                ("x-omniroute-lease-owner", OWNER_A),
                ("x-omniroute-lease-generation", g),
            ],
        )
    };
    assert_eq!(
        lease_error(&with_generation("9007199254740991")),
        (409, "LEASE_FENCE_STALE".into())
    );
    for bad in [
        "9007199254740992",
        "1000000000000000000000000",
        "+1",
        "-1",
        "1.0",
        "1e3",
        "0",
        "0x1",
    ] {
        assert_eq!(
            lease_error(&with_generation(bad)),
            (400, "LEASE_CONTEXT_INVALID".into()),
            "{bad}"
        );
    }
    assert_eq!(with_generation("1").status, 200);
    assert_eq!(
        mock.requests_to(CHAT).len(),
        1,
        "only the valid one was sent"
    );
    // In a body, a generation is an integer literal: `1.0` and `1e0` are no action.
    for g in ["1.0", "1e0"] {
        let mut c = Client::connect(gw.addr());
        let r = c.request(
            "POST",
            LEASES,
            &[
                ("authorization", "Bearer agent-key"),
                ("content-type", "application/json"),
                ("x-omniroute-lease-owner", OWNER_A),
            ],
            format!(r#"{{"action":"renew","generation":{g}}}"#).as_bytes(),
        );
        assert_eq!(lease_error(&r), (400, "LEASE_ACTION_INVALID".into()), "{g}");
    }

    // REUSED: a second acquire by the same owner and key keeps the generation and the
    // acquisition time and pushes the end out.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let reused = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(reused.status, 200, "{}", reused.text());
    let again = reused.json();
    assert_eq!(again["state"], "ACTIVE");
    assert_eq!(again["generation"], 1);
    assert_eq!(again["acquiredAt"], first["acquiredAt"]);
    assert!(
        again["expiresAt"].as_str().unwrap() > first["expiresAt"].as_str().unwrap(),
        "{again} after {first}"
    );

    // Release through another lease key, or of another generation: stale, and the lease
    // stays active. Then the owner releases it; a repeat is idempotent only for the same
    // key and generation.
    let release = |key: &str, g: u64| {
        lease(
            &gw,
            Some(key),
            Some(OWNER_A),
            &json!({"action": "release", "generation": g}),
        )
    };
    assert_eq!(
        lease_error(&release("agent2-key", 1)),
        (409, "LEASE_FENCE_STALE".into())
    );
    assert_eq!(
        lease_error(&release("agent-key", 2)),
        (409, "LEASE_FENCE_STALE".into())
    );
    assert_eq!(with_generation("1").status, 200, "still active");
    for _ in 0..2 {
        let r = release("agent-key", 1);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["state"], "RELEASED");
    }
    assert_eq!(
        lease_error(&release("agent2-key", 1)),
        (409, "LEASE_FENCE_STALE".into())
    );
    // Renew and status of the released lease: stale, and status names no connection.
    for action in ["renew", "status"] {
        let r = lease(
            &gw,
            Some("agent-key"),
            Some(OWNER_A),
            &json!({"action": action, "generation": 1}),
        );
        assert!(r.json().get("connection").is_none(), "{}", r.text());
        assert_eq!(lease_error(&r), (409, "LEASE_FENCE_STALE".into()));
    }
    // The other owner now gets the connection.
    let b = lease(&gw, Some("agent2-key"), Some(OWNER_B), &acquire("up/m1"));
    assert_eq!(b.status, 200, "{}", b.text());
}

/// B §5.3: an owner active through one key that acquires through another gets 409 and
/// nothing is rebound — its lease keeps its key, connection and generation.
#[test]
fn an_owner_active_through_another_key_is_refused_and_its_lease_untouched() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = start(&mock.base_url(), "");
    let got = lease(&gw, Some("agent-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(got.status, 200, "{}", got.text());
    let other_key = lease(&gw, Some("agent2-key"), Some(OWNER_A), &acquire("up/m1"));
    assert_eq!(lease_error(&other_key), (409, "LEASE_OWNER_ACTIVE".into()));
    // Untouched: the first key's status and inference still work at generation 1; the
    // second key presenting the owner is a foreign key.
    let status = lease(
        &gw,
        Some("agent-key"),
        Some(OWNER_A),
        &json!({"action": "status", "generation": 1}),
    );
    assert_eq!(status.status, 200, "{}", status.text());
    assert_eq!(status.json()["generation"], 1);
    let headers = [
        ("x-omniroute-lease-owner", OWNER_A),
        ("x-omniroute-lease-generation", "1"),
    ];
    let served = ask(&gw, "agent-key", "up/m1", &headers);
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(
        served.header("x-omniroute-selected-connection-id"),
        Some("c2")
    );
    let foreign = ask(&gw, "agent2-key", "up/m1", &headers);
    assert_eq!(
        lease_error(&foreign),
        (409, "LEASE_AUTHORIZATION_MISMATCH".into())
    );
}

/// The lease endpoint reads the client key where every route does: `Authorization: Bearer`
/// or `x-api-key`. OmniRoute's `x-goog-api-key` and `?key=` are not read (docs/compat.md):
/// a key sent only there is no key.
#[test]
fn the_endpoint_reads_the_key_from_bearer_or_x_api_key_only() {
    let mock = MockUpstream::start();
    let gw = start(&mock.base_url(), "");
    let body = acquire("up/m1").to_string();
    let post = |path: &str, key_header: (&str, &str)| {
        let mut c = Client::connect(gw.addr());
        c.request(
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("x-omniroute-lease-owner", OWNER_A),
                key_header,
            ],
            body.as_bytes(),
        )
    };
    let by_x_api_key = post(LEASES, ("x-api-key", "agent-key"));
    assert_eq!(by_x_api_key.status, 200, "{}", by_x_api_key.text());
    let goog = post(LEASES, ("x-goog-api-key", "agent-key"));
    assert_eq!(
        lease_error(&goog),
        (401, "LEASE_AUTHENTICATION_REQUIRED".into())
    );
    let query = post(&format!("{LEASES}?key=agent-key"), ("x-other", "1"));
    assert_eq!(
        lease_error(&query),
        (401, "LEASE_AUTHENTICATION_REQUIRED".into())
    );
}

/// B §5.2's order, pairwise: each request fails two checks and gets the earlier one's code.
#[test]
fn each_check_comes_before_the_next_when_both_fail() {
    let mock = MockUpstream::start();
    let gw = start(&mock.base_url(), "");
    let post = |key: &str, content_type: &str, owner: Option<&str>, body: &str| {
        let auth = format!("Bearer {key}");
        let mut headers = vec![
            ("authorization", auth.as_str()),
            ("content-type", content_type),
        ];
        if let Some(o) = owner {
            headers.push(("x-omniroute-lease-owner", o));
        }
        let mut c = Client::connect(gw.addr());
        lease_error(&c.request("POST", LEASES, &headers, body.as_bytes()))
    };
    let json = "application/json";
    let good = acquire("up/m1").to_string();
    let unknown = acquire("nowhere/x").to_string();
    // 1 before 2: an invalid key with a wrong content type.
    assert_eq!(
        post("nope", "text/plain", None, "x"),
        (401, "LEASE_API_KEY_INVALID".into())
    );
    // 2 before 3: a wrong content type with a body that is no action.
    assert_eq!(
        post("agent-key", "text/plain", None, "x"),
        (415, "LEASE_CONTENT_TYPE_REQUIRED".into())
    );
    // 3 before 4: no action, no scope (and no owner).
    assert_eq!(
        post("plain-key", json, None, "{}"),
        (400, "LEASE_ACTION_INVALID".into())
    );
    // 4 before 5: no scope / no connection list, and no owner.
    assert_eq!(
        post("plain-key", json, None, &good),
        (403, "LEASE_SCOPE_REQUIRED".into())
    );
    assert_eq!(
        post("nolist-key", json, None, &good),
        (403, "LEASE_KEY_CONFIGURATION_INVALID".into())
    );
    // 5 before 6: a malformed owner with a model that resolves to nothing.
    assert_eq!(
        post("agent-key", json, Some("vlo_x"), &unknown),
        (400, "LEASE_CONTEXT_INVALID".into())
    );
    assert_eq!(
        post("agent-key", json, Some(OWNER_A), &unknown),
        (400, "LEASE_MODEL_INVALID".into())
    );
    assert!(mock.requests().is_empty());
}
