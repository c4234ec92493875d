//! Damaged snapshot files never stop the gateway and are never trusted: a truncated
//! file, flipped bytes, a wrong magic, a future schema version and a zero-length file are
//! each moved aside with one warning; with both slots bad the gateway starts clean; with
//! one slot bad the other one is used.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::*;

const SLOTS: [&str; 2] = ["snapshot-a.tgsnap", "snapshot-b.tgsnap"];
const KEYS: &[(&str, &str)] = &[("TG_K1", "key-one"), ("TG_K2", "key-two")];

fn config(up: &MockUpstream, state_dir: &Path) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
workers = 2
state_dir = "{}"

[[providers]]
id = "up"
format = "openai"
base_url = "{}"
models = ["m1"]

[[connections]]
id = "c1"
provider = "up"
priority = 1
api_key_env = "TG_K1"

[[connections]]
id = "c2"
provider = "up"
priority = 2
api_key_env = "TG_K2"
"#,
        state_dir.display(),
        up.base_url()
    )
}

fn served_by(gw: &Gateway) -> String {
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-omniroute-selected-connection-id")
        .unwrap_or("")
        .to_string()
}

fn stop(mut gw: Gateway) -> String {
    gw.terminate();
    let status = gw.wait_exit(Duration::from_secs(10)).expect("exits");
    assert!(status.success(), "{}", gw.logs());
    gw.logs()
}

/// A valid snapshot in which `c1` is banned: the newest slot file's bytes.
fn banned_c1_snapshot(up: &MockUpstream) -> Vec<u8> {
    let dir = TempDir::new("snapshot-source");
    let gw = Gateway::start_with_env(&config(up, dir.path()), KEYS);
    assert_eq!(served_by(&gw), "c2", "c1 answered the ban");
    stop(gw);
    let out = support::gateway::run_tidegate(
        &[
            "snapshot",
            "inspect",
            "--state-dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    let j: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let newest = PathBuf::from(j["newest"].as_str().unwrap());
    assert!(
        j["state"]["connections"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["connection"] == "c1" && c["testStatus"] == "banned"),
        "{j:#}"
    );
    fs::read(newest).unwrap()
}

fn xxh3(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

/// Rewrites the header's own checksum (bytes 56..64 over 0..56), so the check under test
/// is the one that fires.
fn reseal(b: &mut [u8]) {
    let sum = xxh3(&b[..56]);
    b[56..64].copy_from_slice(&sum.to_le_bytes());
}

/// Starts on a state dir holding `files` (slot index → bytes) and returns what the first
/// request was served by, the number of "not trusted" warnings, and the dir.
fn start_on(up: &MockUpstream, files: &[(usize, Vec<u8>)]) -> (String, usize, TempDir) {
    let dir = TempDir::new("snapshot-damaged");
    for (slot, bytes) in files {
        fs::write(dir.path().join(SLOTS[*slot]), bytes).unwrap();
    }
    let gw = Gateway::start_with_env(&config(up, dir.path()), KEYS);
    let by = served_by(&gw);
    let logs = stop(gw);
    (by, logs.matches("not trusted").count(), dir)
}

fn moved_aside(dir: &Path, slot: usize) -> bool {
    fs::read_dir(dir).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("{}.rejected-", SLOTS[slot]))
    })
}

#[test]
fn each_kind_of_damage_is_moved_aside_with_one_warning_and_never_trusted() {
    let up = MockUpstream::start();
    up.on(
        "/v1/chat/completions",
        Reply::error(
            403,
            "Your account has been suspended for violating our terms",
        ),
    );
    up.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let good = banned_c1_snapshot(&up);

    // The undamaged file is trusted: c1 stays banned.
    let (by, warnings, _dir) = start_on(&up, &[(0, good.clone())]);
    assert_eq!((by.as_str(), warnings), ("c2", 0));

    let truncated = good[..good.len() / 2].to_vec();
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x5a;
    let mut magic = good.clone();
    magic[..8].copy_from_slice(b"NOTSNAPS");
    let mut future = good.clone();
    future[8..12].copy_from_slice(&99u32.to_le_bytes());
    reseal(&mut future);
    let cases: [(&str, Vec<u8>); 5] = [
        ("truncated", truncated.clone()),
        ("flipped bytes", flipped.clone()),
        ("wrong magic", magic.clone()),
        ("future version", future),
        ("zero-length", Vec::new()),
    ];
    for (what, bytes) in cases {
        let (by, warnings, dir) = start_on(&up, &[(0, bytes)]);
        assert_eq!(by, "c1", "{what}: a clean start, c1 is not banned");
        assert_eq!(warnings, 1, "{what}: one warning");
        assert!(moved_aside(dir.path(), 0), "{what}: moved aside");
        assert!(!dir.path().join(SLOTS[0]).exists(), "{what}");
    }

    // Both slots bad: a clean start, one warning each.
    let (by, warnings, dir) = start_on(&up, &[(0, truncated), (1, magic)]);
    assert_eq!((by.as_str(), warnings), ("c1", 2));
    assert!(moved_aside(dir.path(), 0) && moved_aside(dir.path(), 1));

    // One slot bad, the other good: the good one is used.
    let (by, warnings, dir) = start_on(&up, &[(0, flipped), (1, good)]);
    assert_eq!((by.as_str(), warnings), ("c2", 1));
    assert!(moved_aside(dir.path(), 0));
    assert!(dir.path().join(SLOTS[1]).exists());
}
