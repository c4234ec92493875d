//! Valid but dangerous configurations: `tidegate check` warns (and still exits 0) for an
//! inline key on an address other hosts can reach, for a file where every connection is
//! disabled, and for an empty file; an open gateway on a non-loopback address is refused by
//! `tidegate serve` and fails `tidegate check` (exit 2) unless
//! `server.allow_open_gateway = true`, when both warn.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::{Gateway, run_check, secs};

const MOCK: &str = r#"
[[providers]]
id = "mock"
format = "mock"
models = ["echo"]

[[connections]]
id = "mock-c"
provider = "mock"
"#;

fn warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect()
}

fn check_warns(cfg: &str, needle: &str) {
    let (code, stdout, stderr) = run_check(cfg);
    assert_eq!(code, 0, "stdout {stdout}\nstderr {stderr}");
    assert!(stdout.contains(": ok ("), "{stdout}");
    let w = warnings(&stderr);
    assert!(
        w.iter().any(|l| l.contains(needle)),
        "no warning with {needle:?}: {stderr}"
    );
}

#[test]
fn an_open_gateway_on_a_reachable_address_fails_check_and_serve_refuses_it() {
    let open = format!("[server]\nlisten = \"0.0.0.0:0\"\nworkers = 1\n{MOCK}");
    // `check` fails the file `serve` would refuse, with the same line.
    let (code, stdout, stderr) = run_check(&open);
    assert_eq!(code, 2, "stdout {stdout}\nstderr {stderr}");
    assert!(!stdout.contains(": ok ("), "{stdout}");
    assert!(
        stderr.contains("server.listen: refusing to serve 0.0.0.0:0 with no [[client_keys]]"),
        "{stderr}"
    );
    let failure = match Gateway::try_start(&open, &[]) {
        Ok(gw) => panic!("an open gateway started:\n{}", gw.logs()),
        Err(f) => f,
    };
    assert_eq!(
        failure.status.and_then(|s| s.code()),
        Some(2),
        "{}",
        failure.logs
    );
    assert!(
        failure
            .logs
            .contains("refusing to serve 0.0.0.0:0 with no [[client_keys]]"),
        "{}",
        failure.logs
    );
    // The operator's explicit choice starts it (with the warning, logged before the ready
    // line but on stderr, which another thread drains: waited for).
    let allowed = open.replace("workers = 1\n", "workers = 1\nallow_open_gateway = true\n");
    check_warns(
        &allowed,
        "server.listen: 0.0.0.0:0 is reachable from other hosts",
    );
    let gw = Gateway::start(&allowed);
    gw.wait_for_log("allow_open_gateway = true", secs(5));
    // On loopback, no keys is the local-development setup: no warning, it serves.
    let local = format!("[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n{MOCK}");
    let (code, _, stderr) = run_check(&local);
    assert_eq!(code, 0);
    assert!(warnings(&stderr).is_empty(), "{stderr}");
    Gateway::start(&local);
}

#[test]
fn an_inline_key_on_a_reachable_address_warns() {
    let cfg = format!(
        "[server]\nlisten = \"0.0.0.0:0\"\n{MOCK}\n[[client_keys]]\nid = \"dev\"\nkey = \"tidegate-dev-key\"\n\n[[client_keys]]\nid = \"ci\"\nkey = \"some-other-key\"\n"
    );
    check_warns(&cfg, "client_keys[0].key: the shipped sample key");
    check_warns(&cfg, "client_keys[1].key: an inline key");
    // The shipped file itself, moved to 0.0.0.0, warns about its sample key.
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tidegate.toml"))
            .unwrap()
            .replace("listen = \"127.0.0.1:8787\"", "listen = \"0.0.0.0:8787\"");
    check_warns(&shipped, "the shipped sample key");
}

#[test]
fn every_connection_disabled_warns() {
    let cfg = r#"
[[providers]]
id = "real"
format = "openai"
base_url = "http://127.0.0.1:9/v1"

[[connections]]
id = "real-main"
provider = "real"
api_key_env = "TIDEGATE_TEST_NEVER_SET_KEY_7F3A"
"#;
    check_warns(
        cfg,
        "every connection is disabled (TIDEGATE_TEST_NEVER_SET_KEY_7F3A not set",
    );
}

#[test]
fn an_empty_file_warns() {
    check_warns("", "the file is empty");
    check_warns("# nothing but a comment\n\n", "the file is empty");
}
