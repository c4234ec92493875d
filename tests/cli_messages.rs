//! What the command line tells an operator: `tidegate --help` lists every environment
//! variable the binary reads; an unknown key suggests the nearest known one; a value of the
//! wrong type names its key path and the kind of value it takes, not a Rust type, and does
//! not hide the file's other wrong values and unknown keys; `check` reports a bad
//! `TIDEGATE_LOG` (or driver variable) as `serve` would refuse it; the help names every
//! section the snapshot keeps.
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

/// `tidegate --help` and `snapshot --help` name every section the snapshot keeps.
#[test]
fn snapshot_help_names_what_it_keeps() {
    for args in [&["--help"][..], &["snapshot", "--help"]] {
        let out = run_tidegate(args, &[]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let line = out
            .stdout
            .split("persisted state")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap_or_else(|| panic!("{args:?}:\n{}", out.stdout));
        let line: String = line.split_whitespace().collect::<Vec<_>>().join(" ");
        for kept in [
            "breakers",
            "connection states",
            "provider cooldowns",
            "session affinity pins",
            "exclusive session leases",
            "settings changed through the API",
        ] {
            assert!(line.contains(kept), "{args:?} omits {kept}: {line}");
        }
    }
}

/// Every `--config` names both defaults it falls back to, as `config_path` picks them:
/// `snapshot inspect` reads `/etc/tidegate/tidegate.toml` under systemd too.
#[test]
fn every_config_flag_names_both_default_paths() {
    for args in [
        &["serve", "--help"][..],
        &["check", "--help"],
        &["snapshot", "inspect", "--help"],
    ] {
        let out = run_tidegate(args, &[]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let flag = out
            .stdout
            .split("--config <PATH>")
            .nth(1)
            .unwrap_or_else(|| panic!("{args:?}: no --config:\n{}", out.stdout));
        let flag = flag.split("-h, --help").next().unwrap();
        for path in ["config/tidegate.toml", "/etc/tidegate/tidegate.toml"] {
            assert!(
                flag.contains(path),
                "{args:?} --config omits {path}: {flag}"
            );
        }
    }
    // ... and `snapshot inspect` does read it under systemd.
    let out = run_tidegate(&["snapshot", "inspect"], &[("INVOCATION_ID", "x")]);
    if !std::path::Path::new("/etc/tidegate/tidegate.toml").exists() {
        assert_eq!(out.code, 2, "{}", out.stderr);
        assert!(
            out.stderr.contains("/etc/tidegate/tidegate.toml"),
            "{}",
            out.stderr
        );
    }
}

/// An empty `TIDEGATE_CONFIG` (`TIDEGATE_CONFIG=`) is unset: the default path is read, not
/// a file named "" (which printed `: cannot read the config file`); that default missing
/// from the working directory says where it was looked for.
#[test]
fn an_empty_tidegate_config_is_unset() {
    let dir = support::TempDir::new("empty-config-var");
    let mut cmd = std::process::Command::new(support::gateway::TIDEGATE_BIN);
    cmd.arg("check")
        .current_dir(dir.path())
        .env("TIDEGATE_CONFIG", "")
        .env_remove("INVOCATION_ID")
        .env_remove("NOTIFY_SOCKET");
    let out = support::gateway::run_bounded(cmd, support::secs(30));
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .starts_with("config/tidegate.toml: cannot read the config file"),
        "{}",
        out.stderr
    );
    // A relative path that is not there says where it was looked for, on the same line.
    let cwd = dir.path().canonicalize().unwrap();
    assert!(
        out.stderr.contains(&format!(
            "(looked for in the working directory {}; --config PATH or TIDEGATE_CONFIG \
             names another file)",
            cwd.display()
        )),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
}

/// `OMNIROUTE_EMERGENCY_FALLBACK` that is not a boolean is a problem like every other
/// override's, also in a file with no `[emergency_fallback] target` (the shipped one).
#[test]
fn a_bad_emergency_fallback_variable_is_a_problem_without_a_target() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/config/tidegate.toml");
    let out = run_tidegate(
        &["check", "--config", shipped],
        &[(tidegate::config::EMERGENCY_FALLBACK_ENV, "maybe")],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("OMNIROUTE_EMERGENCY_FALLBACK: \"maybe\" is not a boolean"),
        "{}",
        out.stderr
    );
    let out = run_tidegate(
        &["check", "--config", shipped],
        &[(tidegate::config::EMERGENCY_FALLBACK_ENV, "false")],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
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
        stderr.contains(
            "server.workers: expected a whole number (0 = one per core), got the string \"two\" \
             (line 3, column 11)"
        ),
        "{stderr}"
    );
    let (code, _, stderr) = run_check(
        "[[connections]]\nid = \"a\"\nprovider = \"m\"\n\n[[connections]]\nid = \"b\"\nprovider = \"m\"\n[connections.rate_limit_overrides]\nmax_wait_ms = true\n",
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("connections[1].rate_limit_overrides.max_wait_ms: expected a whole number of milliseconds, got true"),
        "{stderr}"
    );
    for rust in ["u32", "u64", "struct Raw", "a sequence"] {
        assert!(!stderr.contains(rust), "{stderr}");
    }
}

#[test]
fn each_kind_of_key_says_what_it_takes_in_operator_words() {
    let file = r#"
[server]
listen = ["127.0.0.1:0"]
idle_timeout_ms = "5s"
pin_threads = "yes"
admin_token_env = 3

[[providers]]
id = "m"
format = "mock"
models = "echo"

[[connections]]
id = "c"
provider = "m"
weight = -1

[combo_defaults]
max_retries = 2.5

[resilience.request_queue]
max_queue_depth = "deep"
max_wait_ms = 1979-05-27
"#;
    let (code, _, stderr) = run_check(file);
    assert_eq!(code, 2, "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let expected = [
        "server.listen: expected a string (in quotes), got an array (line 3, column 10)",
        "server.idle_timeout_ms: expected a whole number of milliseconds, got the string \"5s\" (line 4, column 19)",
        "server.pin_threads: expected true or false, got the string \"yes\" (line 5, column 15)",
        "server.admin_token_env: expected a string (in quotes), got 3 (line 6, column 19)",
        "providers[0].models: expected an array, got the string \"echo\" (line 11, column 10)",
        "connections[0].weight: expected a whole number, 0 or more, got -1 (line 16, column 10)",
        "combo_defaults.max_retries: expected a whole number in 0..=10, got 2.5 (line 19, column 15)",
        "resilience.request_queue.max_queue_depth: expected a whole number in 0..=100000, got the string \"deep\" (line 22, column 19)",
        "resilience.request_queue.max_wait_ms: expected a whole number of milliseconds in 0..=86400000, got a date or time (line 23, column 15)",
    ];
    assert_eq!(lines.len(), expected.len(), "{stderr}");
    for (line, want) in lines.iter().zip(expected) {
        assert!(line.ends_with(want), "{line:?} is not {want:?}\n{stderr}");
    }
}

#[test]
fn a_type_error_does_not_hide_the_other_wrong_values_and_unknown_keys() {
    let file = r#"
[server]
listen = "127.0.0.1:0"
workers = "two"
idle_timeot_ms = 5000

[[providers]]
id = "m"
format = "mock"
bogus = 1

[[connections]]
id = "c"
provider = "m"
priority = "high"
[connections.rate_limit_overrides]
max_wait = 3

[[combos]]
name = "x"
targets = [
  { model = "m/a", weight = "w" },
]
"#;
    let (code, _, stderr) = run_check(file);
    assert_eq!(code, 2, "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let expected = [
        "server.workers: expected a whole number (0 = one per core), got the string \"two\" (line 4, column 11)",
        "connections[0].priority: expected a whole number (lower is tried first), got the string \"high\" (line 15, column 12)",
        "combos[0].targets: expected \"provider/model\" or a table with `model` or `combo` and a whole-number `weight` (line 21, column 11)",
        "server.idle_timeot_ms: unknown key; did you mean `idle_timeout_ms`?",
        "providers[0].bogus: unknown key",
        "connections[0].rate_limit_overrides.max_wait: unknown key; did you mean `max_wait_ms`?",
    ];
    assert_eq!(lines.len(), expected.len(), "{stderr}");
    for (line, want) in lines.iter().zip(expected) {
        assert!(line.ends_with(want), "{line:?} is not {want:?}\n{stderr}");
    }

    // An error that cannot be set aside (a table header given twice) says what it left
    // unchecked.
    let (code, _, stderr) = run_check("[server]\nworkers = \"two\"\nbogus = 1\n[server]\n");
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("not checked past the error above"),
        "{stderr}"
    );
}

#[test]
fn check_reports_a_tidegate_log_that_serve_would_refuse() {
    let dir = support::TempDir::new("check-log");
    let good = dir.write("good.toml", "[server]\nlisten = \"127.0.0.1:0\"\n");
    let bad = dir.write("bad.toml", "[server]\nbogus = 1\n");
    let check = |path: &std::path::Path, env: &[(&str, &str)]| {
        run_tidegate(&["check", "--config", path.to_str().unwrap()], env)
    };
    let out = check(&good, &[("TIDEGATE_LOG", "inof")]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr.contains("TIDEGATE_LOG: \"inof\" is not a level"),
        "{}",
        out.stderr
    );
    assert!(!out.stdout.contains(": ok"), "{}", out.stdout);
    // Beside the file's own problems, and with the driver variables serve reads.
    let out = check(
        &bad,
        &[
            ("TIDEGATE_LOG", "warn,access=inof"),
            ("TIDEGATE_DRIVER", "bogus"),
        ],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    for needle in [
        "server.bogus: unknown key",
        "TIDEGATE_LOG:",
        "TIDEGATE_DRIVER:",
    ] {
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
    }
    // A valid filter passes.
    let out = check(&good, &[("TIDEGATE_LOG", "warn,access=info")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
}

/// `TIDEGATE_DRIVER` and `TIDEGATE_URING_SETUP` are read trimmed and in any case (`EPOLL`,
/// ` Defer `), as the resilience variables and `TIDEGATE_LOG`'s levels are; `serve` runs
/// the driver asked for.
#[test]
fn the_driver_variables_take_any_case_and_surrounding_blanks() {
    let dir = support::TempDir::new("check-driver-case");
    let good = dir.write("good.toml", "[server]\nlisten = \"127.0.0.1:0\"\n");
    for (var, value) in [
        ("TIDEGATE_DRIVER", "EPOLL"),
        ("TIDEGATE_DRIVER", " Io_Uring "),
        ("TIDEGATE_URING_SETUP", "Defer"),
        ("TIDEGATE_URING_SETUP", " plain\t"),
    ] {
        let out = run_tidegate(
            &["check", "--config", good.to_str().unwrap()],
            &[(var, value)],
        );
        assert_eq!(out.code, 0, "{var}={value:?}: {}", out.stderr);
    }
    let out = run_tidegate(
        &["check", "--config", good.to_str().unwrap()],
        &[("TIDEGATE_DRIVER", "epol")],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    let gw = support::Gateway::start_with_env(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n",
        &[("TIDEGATE_DRIVER", "EPOLL")],
    );
    assert_eq!(gw.driver(), "epoll");
}
