//! The snapshot during a zero-downtime handover (`server.allow_shared_listen`): the new
//! instance starts while the old one still runs and writes `state_dir`. The new one reads
//! the snapshot at start but writes nothing while the old one lives; once the old one has
//! written its last snapshot and exited, the new one takes the directory over and writes
//! above the old one's last generation — so the newest slot is always the live instance's.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::path::Path;

use support::gateway::run_tidegate;
use support::*;

const CHAT: &str = "/v1/chat/completions";

fn config(port: u16, state_dir: &Path, upstream: &MockUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
workers = 2
allow_shared_listen = true
state_dir = "{}"
snapshot_interval_ms = 20

[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "up"
priority = 1

[[connections]]
id = "c2"
provider = "up"
priority = 2
"#,
        state_dir.display(),
        upstream.base_url()
    )
}

fn inspect(dir: &Path) -> serde_json::Value {
    let out = run_tidegate(
        &["snapshot", "inspect", "--state-dir", dir.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

fn banned(j: &serde_json::Value, name: &str) -> bool {
    j["state"]["connections"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["connection"] == name && c["testStatus"] == "banned")
    })
}

#[test]
fn the_new_instance_writes_state_dir_only_after_the_old_one_has_exited() {
    let state = TempDir::new("snapshot-handover");
    let up = MockUpstream::start();
    up.on(CHAT, Reply::error(403, "Your account has been suspended"));
    up.on_always(CHAT, Reply::openai_chat("ok"));
    let (mut old, port) = Gateway::start_on_free_port(|port| config(port, state.path(), &up));
    let cfg = config(port, state.path(), &up);

    let r = Client::connect(old.addr()).request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let before = eventually(secs(20), "the old instance's snapshot of the ban", || {
        let j = inspect(state.path());
        banned(&j, "c1").then(|| j["generation"].as_u64().unwrap())
    });

    // The new instance restores the ban (its owners re-report it: it has something to
    // write) but leaves the directory to the old one while that one lives.
    let new = Gateway::start(&cfg);
    // Logged before the ready line, but on the other pipe: it may arrive a moment later.
    new.wait_for_log("snapshot restored", secs(5));
    new.wait_for_log("writing waits until it exits", secs(5));
    let old_logs = old.logs();
    assert!(!old_logs.contains("another instance"), "{old_logs}");

    old.terminate();
    let status = old.wait_exit(secs(20)).expect("the old instance exits");
    assert!(status.success(), "{}", old.logs());
    let after_old = inspect(state.path())["generation"].as_u64().unwrap();
    assert!(after_old >= before);

    // Then the new one takes over (its first write may already be on disk) and writes
    // what changes from now on above everything before it: c2 is banned on the new one.
    new.wait_for_log("released state_dir; writing from here on", secs(5));
    up.on(CHAT, Reply::error(403, "Your account has been suspended"));
    let _ = Client::connect(new.addr()).request(
        "POST",
        CHAT,
        &[],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let j = eventually(secs(20), "the new instance's write of c2's ban", || {
        let j = inspect(state.path());
        banned(&j, "c2").then_some(j)
    });
    assert!(j["generation"].as_u64().unwrap() > after_old, "{j:#}");
    assert!(banned(&j, "c1"), "{j:#}");
    for slot in j["slots"].as_array().unwrap() {
        assert_ne!(slot["status"], "invalid", "{j:#}");
    }
    assert!(!new.logs().contains("not trusted"), "{}", new.logs());
}
