//! The owner tables do not grow for ever: model lockouts (whose keys carry client-chosen
//! model names) are swept once expired and idle, their size is on `/metrics`
//! (`tidegate_owner_entries{table}`), a hard per-shard cap (`server.max_model_lockouts`)
//! drops the oldest entries when a client creates them faster than they idle out
//! (`tidegate_model_lockouts_evicted_total`), and every lock transition is logged once.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

const CHAT: &str = "/v1/chat/completions";

/// A self-hosted provider (limits per model: a 404 locks the model, not the connection)
/// with one connection, on two shards.
fn selfhosted(base_url: &str, server_extra: &str, tail: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2
{server_extra}

[[providers]]
id = "selfhosted"
format = "openai"
auth = "local"
base_url = "{base_url}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "selfhosted"

{tail}
"#
    )
}

fn ask(gw: &Gateway, model: &str) -> Response {
    Client::connect(gw.addr()).request(
        "POST",
        CHAT,
        &[],
        format!(
            r#"{{"model":"selfhosted/{model}","messages":[{{"role":"user","content":"hi"}}]}}"#
        )
        .as_bytes(),
    )
}

fn entries(gw: &Gateway, table: &str) -> u64 {
    metric(
        gw.addr(),
        &format!("tidegate_owner_entries{{table=\"{table}\"}}"),
    )
}

#[test]
fn lockouts_for_ever_new_model_names_are_swept_once_expired_and_idle() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::error(404, "The model does not exist"));
    // A 10 s lock (the local profile's base cooldown: long enough that every lock is seen
    // live before any expires, even on a loaded machine) and a short escalation window (the
    // breaker reset timeout), so the entries idle out a few housekeeping runs later.
    let gw = Gateway::start(&selfhosted(
        &mock.base_url(),
        "",
        "[resilience.connection_cooldown.local]\nbase_cooldown_ms = 10000\n\
         [resilience.provider_breaker.local]\nreset_timeout_ms = 1000\n",
    ));
    const N: u64 = 24;
    for i in 0..N {
        let r = ask(&gw, &format!("gone-{i}"));
        assert_eq!(r.status, 404, "{}", r.text());
    }
    // Every distinct model name left a lock and a failure state on its owner.
    eventually(secs(5), "one lock per model name", || {
        (entries(&gw, "model_lockouts") == N && entries(&gw, "model_failures") == N).then_some(())
    });
    gw.wait_for_log("model locked for", secs(5));
    // After the lock expires and the failure state's window passes, the sweep forgets both.
    eventually(secs(40), "the swept tables", || {
        (entries(&gw, "model_lockouts") == 0 && entries(&gw, "model_failures") == 0).then_some(())
    });
    let logs = gw.logs();
    let expired = logs.matches("model lock expired").count();
    assert_eq!(expired as u64, N, "one expiry line per lock:\n{logs}");
    assert_eq!(
        metric(gw.addr(), "tidegate_model_lockouts_evicted_total"),
        0
    );
    // Still served: a new name locks again.
    assert_eq!(ask(&gw, "gone-again").status, 404);
    eventually(secs(5), "a new lock", || {
        (entries(&gw, "model_lockouts") == 1).then_some(())
    });
}

#[test]
fn a_flood_of_new_model_names_is_held_to_the_cap_oldest_first() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::error(404, "The model does not exist"));
    // Default (long) cooldowns: nothing expires during the test, only the cap can drop.
    let gw = Gateway::start(&selfhosted(&mock.base_url(), "max_model_lockouts = 8", ""));
    const N: u64 = 40;
    for i in 0..N {
        assert_eq!(ask(&gw, &format!("flood-{i}")).status, 404);
    }
    // Two owner shards, at most 8 locks each.
    let evicted = eventually(secs(5), "the cap to drop the excess", || {
        let e = metric(gw.addr(), "tidegate_model_lockouts_evicted_total");
        (e >= N - 16).then_some(e)
    });
    let locks = entries(&gw, "model_lockouts");
    let failures = entries(&gw, "model_failures");
    assert!(
        locks <= 16 && failures <= 16,
        "{locks} locks, {failures} failure states"
    );
    assert_eq!(
        locks + evicted,
        N,
        "every lock is either held or counted as evicted"
    );
    // The newest name is still locked: its next request is refused without an upstream call.
    let before = mock.requests_to(CHAT).len();
    let r = ask(&gw, "flood-39");
    assert_ne!(r.status, 200);
    assert_eq!(
        mock.requests_to(CHAT).len(),
        before,
        "flood-39 is still locked"
    );
    // The oldest went: its next request reaches the upstream again.
    assert_eq!(ask(&gw, "flood-0").status, 404);
    assert_eq!(
        mock.requests_to(CHAT).len(),
        before + 1,
        "flood-0 was evicted"
    );
    gw.wait_for_log("model lock lifted", secs(5));
}
