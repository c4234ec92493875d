//! What the command line tells an operator: `tidegate --help` lists every environment
//! variable the binary reads; an unknown key suggests the nearest known one; a value of the
//! wrong type names its key path and the kind of value it takes, not a Rust type.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::{run_check, run_tidegate};

#[test]
fn help_lists_every_environment_variable() {
    for args in [&["--help"][..], &["serve", "--help"], &["check", "--help"]] {
        let out = run_tidegate(args, &[]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let vars = [
            "TIDEGATE_CONFIG",
            "TIDEGATE_LOG",
            "TIDEGATE_DRIVER",
            "INVOCATION_ID",
            tidegate::notify::NOTIFY_SOCKET_ENV,
            tidegate::config::EMERGENCY_FALLBACK_ENV,
        ]
        .into_iter()
        .chain(tidegate::config::resilience::env_variables());
        for var in vars {
            assert!(
                out.stdout
                    .lines()
                    .any(|l| l.trim() == var || l.trim_start().starts_with(&format!("{var} "))),
                "{args:?} does not list {var}:\n{}",
                out.stdout
            );
        }
        assert!(out.stdout.contains("api_key_env"), "{}", out.stdout);
    }
}

#[test]
fn an_unknown_key_suggests_the_nearest_known_one() {
    let (code, _, stderr) = run_check("[server]\nidle_timeot_ms = 5000\n");
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("server.idle_timeot_ms: unknown key; did you mean `idle_timeout_ms`?"),
        "{stderr}"
    );
    let (code, _, stderr) = run_check(
        "[[providers]]\nid = \"m\"\nformat = \"mock\"\n\n[[connections]]\nid = \"c\"\nprovider = \"m\"\nprority = 2\n",
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("connections[0].prority: unknown key; did you mean `priority`?"),
        "{stderr}"
    );
    // Nothing near: no guess.
    let (_, _, stderr) = run_check("[server]\nbogus_setting = 1\n");
    assert!(
        stderr.contains("server.bogus_setting: unknown key\n"),
        "{stderr}"
    );
}

#[test]
fn a_type_error_names_the_key_path_not_a_rust_type() {
    let (code, _, stderr) = run_check("[server]\nlisten = \"127.0.0.1:0\"\nworkers = \"two\"\n");
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("server.workers: invalid type: string \"two\", expected a whole number"),
        "{stderr}"
    );
    assert!(stderr.contains("(line 3, column 11)"), "{stderr}");
    let (code, _, stderr) = run_check(
        "[[connections]]\nid = \"a\"\nprovider = \"m\"\n\n[[connections]]\nid = \"b\"\nprovider = \"m\"\n[connections.rate_limit_overrides]\nmax_wait_ms = true\n",
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("connections[1].rate_limit_overrides.max_wait_ms: invalid type: boolean `true`, expected a non-negative whole number"),
        "{stderr}"
    );
    for rust in ["u32", "u64", "struct Raw", "a sequence"] {
        assert!(!stderr.contains(rust), "{stderr}");
    }
}
