//! The command line and configuration validation: `tidegate check` on the shipped file and
//! on broken ones (exit 2, one line per problem naming its key), `tidegate serve` refusing a
//! bad file without listening, `--help`, a connection whose key variable is unset, and the
//! warnings of settings that are accepted but not active yet, and a `state_dir` no user could
//! create.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use serde_json::json;
use support::{Gateway, TempDir, eventually, json_post, run_check, run_tidegate, secs};

/// A variable no environment sets, for a connection that must come up disabled.
const UNSET_VAR: &str = "TIDEGATE_TEST_NEVER_SET_KEY_7F3A";

fn shipped_config() -> String {
    format!("{}/config/tidegate.toml", env!("CARGO_MANIFEST_DIR"))
}

/// A valid base with one in-process provider; tests append to or edit it.
const BASE: &str = r#"
[server]
listen = "127.0.0.1:0"
workers = 1

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "up"
format = "mock"
models = ["m1"]

[[connections]]
id = "c1"
provider = "up"
"#;

/// Three problems of three kinds: an unknown key, a connection naming an unknown provider,
/// and a duplicate connection id.
fn three_problems() -> String {
    BASE.replace("workers = 1\n", "workers = 1\nbogus_setting = 5\n")
        + r#"
[[connections]]
id = "c1"
provider = "up"

[[connections]]
id = "c2"
provider = "nowhere"
"#
}

/// The problem lines of a failed check (stderr, blank lines dropped).
fn problem_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// The one line that mentions every one of `needles`; panics if none or several do.
fn line_naming<'a>(lines: &[&'a str], needles: &[&str]) -> &'a str {
    let hits: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "expected exactly one line naming {needles:?}, got {hits:?} in:\n{}",
        lines.join("\n")
    );
    hits[0]
}

#[test]
fn the_shipped_config_passes_check() {
    let path = shipped_config();
    let out = run_tidegate(&["check", "--config", &path], &[]);
    assert_eq!(out.code, 0, "stdout {}\nstderr {}", out.stdout, out.stderr);
    assert!(out.stdout.contains("ok"), "stdout {}", out.stdout);
    // Disabled real providers are warnings, never errors.
    for line in problem_lines(&out.stderr) {
        assert!(line.starts_with("warning:"), "not a warning: {line}");
    }
}

/// The ok line counts in words that agree with the numbers: one of a kind is singular.
#[test]
fn the_ok_line_says_one_in_the_singular() {
    let (code, stdout, stderr) = run_check(BASE);
    assert_eq!(code, 0, "stdout {stdout}\nstderr {stderr}");
    assert!(
        stdout.contains(": ok (1 provider, 1 connection, 0 combos, 1 client key)"),
        "{stdout}"
    );
    let two = BASE.to_string()
        + r#"
[[client_keys]]
id = "u"
key = "other-key"

[[connections]]
id = "c2"
provider = "up"
"#;
    let (code, stdout, stderr) = run_check(&two);
    assert_eq!(code, 0, "stdout {stdout}\nstderr {stderr}");
    assert!(
        stdout.contains(": ok (1 provider, 2 connections, 0 combos, 2 client keys)"),
        "{stdout}"
    );
}

#[test]
fn check_defaults_to_config_tidegate_toml_and_reads_tidegate_config() {
    // Integration tests run in the package root, where config/tidegate.toml is.
    let out = run_tidegate(&["check"], &[]);
    assert_eq!(out.code, 0, "stdout {}\nstderr {}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("config/tidegate.toml"),
        "{}",
        out.stdout
    );

    let dir = TempDir::new("check-env");
    let bad = dir.write("bad.toml", three_problems());
    let out = run_tidegate(&["check"], &[("TIDEGATE_CONFIG", bad.to_str().unwrap())]);
    assert_eq!(out.code, 2, "TIDEGATE_CONFIG was not used: {}", out.stdout);
    // The flag wins over the variable.
    let out = run_tidegate(
        &["check", "--config", &shipped_config()],
        &[("TIDEGATE_CONFIG", bad.to_str().unwrap())],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
}

#[test]
fn three_problems_exit_2_with_one_line_each() {
    let (code, stdout, stderr) = run_check(&three_problems());
    assert_eq!(code, 2, "stdout {stdout}\nstderr {stderr}");
    let lines = problem_lines(&stderr);
    line_naming(&lines, &["bogus_setting"]);
    line_naming(&lines, &["connections[1].id", "c1"]);
    line_naming(&lines, &["connections[2].provider", "nowhere"]);
    assert_eq!(lines.len(), 3, "one line per problem:\n{stderr}");
}

#[test]
fn an_unknown_key_exits_2_naming_it() {
    let cfg = BASE.replace("workers = 1\n", "workers = 1\nbogus_setting = 5\n");
    let (code, stdout, stderr) = run_check(&cfg);
    assert_eq!(code, 2, "stdout {stdout}\nstderr {stderr}");
    let lines = problem_lines(&stderr);
    line_naming(&lines, &["bogus_setting"]);
    assert!(!stdout.contains("ok"), "{stdout}");

    // In a nested table too.
    let cfg = BASE.replace(
        "models = [\"m1\"]\n",
        "models = [\"m1\"]\ncolour = \"red\"\n",
    );
    let (code, _, stderr) = run_check(&cfg);
    assert_eq!(code, 2, "{stderr}");
    line_naming(&problem_lines(&stderr), &["colour"]);

    // In a combo target's table (a target is a string or a table).
    let cfg = BASE.to_string()
        + "\n[[combos]]\nname = \"w\"\nstrategy = \"weighted\"\n\
           targets = [{ model = \"up/m1\", weight = 2, wieght = 3 }]\n";
    let (code, _, stderr) = run_check(&cfg);
    assert_eq!(code, 2, "{stderr}");
    let lines = problem_lines(&stderr);
    line_naming(&lines, &["combos[0].targets[0].wieght", "weight"]);
    assert_eq!(lines.len(), 1, "{stderr}");
}

#[test]
fn semantic_problems_exit_2_with_one_line_each_naming_the_key() {
    let cfg = BASE.to_string()
        + r#"
[[connections]]
id = "c1"
provider = "up"

[[connections]]
id = "c2"
provider = "nowhere"
"#;
    let (code, stdout, stderr) = run_check(&cfg);
    assert_eq!(code, 2, "stdout {stdout}\nstderr {stderr}");
    let lines = problem_lines(&stderr);
    line_naming(&lines, &["connections[1].id", "\"c1\""]);
    line_naming(&lines, &["connections[2].provider", "\"nowhere\""]);
    assert_eq!(lines.len(), 2, "one line per problem:\n{stderr}");
}

#[test]
fn serve_with_a_bad_config_exits_2_without_listening() {
    let dir = TempDir::new("serve-bad");
    let path = dir.write("bad.toml", three_problems());
    let out = run_tidegate(&["serve", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(out.code, 2, "stdout {}\nstderr {}", out.stdout, out.stderr);
    assert!(
        !out.stdout.contains("listening") && !out.stderr.contains("listening"),
        "a bad config got as far as listening:\n{}{}",
        out.stdout,
        out.stderr
    );
    assert!(!out.stderr.is_empty(), "no problem printed");

    // The same through the launcher: it never becomes ready.
    let failure = match Gateway::try_start(&three_problems(), &[]) {
        Ok(_) => panic!("tidegate served a bad config"),
        Err(f) => f,
    };
    assert_eq!(
        failure.status.and_then(|s| s.code()),
        Some(2),
        "{}",
        failure.logs
    );

    // A config file that does not exist is a configuration error too.
    let out = run_tidegate(
        &[
            "serve",
            "--config",
            dir.join("missing.toml").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.code, 2, "stdout {}\nstderr {}", out.stdout, out.stderr);
}

#[test]
fn help_lists_serve_and_check() {
    let out = run_tidegate(&["--help"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let commands: Vec<&str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(commands.contains(&"serve"), "{}", out.stdout);
    assert!(commands.contains(&"check"), "{}", out.stdout);

    // A command line it does not understand is exit 2, like a bad config.
    let out = run_tidegate(&["frobnicate"], &[]);
    assert_eq!(out.code, 2, "{}", out.stderr);
}

#[test]
fn a_connection_whose_key_variable_is_unset_is_disabled_with_a_warning() {
    let cfg = BASE.to_string()
        + &format!(
            r#"
[[providers]]
id = "real"
format = "openai"
base_url = "http://127.0.0.1:9/v1"
models = ["r1"]

[[connections]]
id = "real-main"
provider = "real"
api_key_env = "{UNSET_VAR}"
"#
        );

    // check: exit 0, one warning naming the variable and the connection.
    let (code, stdout, stderr) = run_check(&cfg);
    assert_eq!(code, 0, "stdout {stdout}\nstderr {stderr}");
    let warning = line_naming(&problem_lines(&stderr), &[UNSET_VAR]);
    assert!(warning.contains("real-main"), "{warning}");

    // serve: starts, logs the warning, serves the enabled provider. The warning is logged
    // before the ready line, but on stderr, which another thread drains: wait for it.
    let gw = Gateway::start(&cfg);
    gw.wait_for_log(UNSET_VAR, secs(5));
    let logs = gw.logs();
    let warning = logs
        .lines()
        .find(|l| l.contains(UNSET_VAR))
        .unwrap_or_else(|| panic!("no warning naming {UNSET_VAR}:\n{logs}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("real-main"), "{warning}");

    let ok = json_post(
        gw.addr(),
        "/v1/chat/completions",
        "test-key",
        &json!({"model": "up/m1", "messages": [{"role": "user", "content": "served"}]}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["choices"][0]["message"]["content"], "served");

    // The disabled connection's model has nowhere to go.
    let r = json_post(
        gw.addr(),
        "/v1/chat/completions",
        "test-key",
        &json!({"model": "real/r1", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("no_available_connection")
    );
    assert_eq!(r.json()["error"]["code"], "no_available_connection");
    assert_eq!(r.json()["error"]["type"], "service_unavailable");
}

/// Every setting that is validated but not read yet, set once: all in the file except
/// `quota_preflight`, which comes from its environment variable.
const INACTIVE_SETTINGS: &str = r#"
[resilience.wait_for_cooldown]
max_retries = 2

[resilience.combo_cooldown_wait]
max_wait_ms = 1000

[resilience.token_refresh_breaker]
scope = "connection"

[resilience.credential_health_check]
interval_minutes = 0

[resilience.stream_recovery]
continue_mid_stream = true

[resilience.model_lockout]
enabled = true
error_codes = [429]
base_cooldown_ms = 60000
max_backoff_steps = 2
use_exponential_backoff = false
max_cooldown_ms = 600000
"#;

/// The lines `tidegate` prints or logs for settings that are accepted but not active yet.
fn not_active_lines(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|l| l.contains("accepted but not active yet"))
        .collect()
}

#[test]
fn settings_that_are_not_active_yet_warn_once_each_at_check_and_at_start_up() {
    let cfg = BASE.to_string() + INACTIVE_SETTINGS;
    // `provider_cooldown` is active: setting it never warns.
    let env = [
        ("QUOTA_PREFLIGHT_CUTOFF_ENABLED", "true"),
        ("PROVIDER_COOLDOWN_ENABLED", "true"),
    ];
    let keys = tidegate::config::resilience::NOT_ACTIVE_YET;

    // check: exit 0, one warning line per key, nothing else wrong.
    let dir = TempDir::new("check-inactive");
    let path = dir.write("tidegate.toml", &cfg);
    let out = run_tidegate(&["check", "--config", path.to_str().unwrap()], &env);
    assert_eq!(out.code, 0, "stdout {}\nstderr {}", out.stdout, out.stderr);
    assert!(out.stdout.contains("ok"), "{}", out.stdout);
    let lines = not_active_lines(&out.stderr);
    assert_eq!(lines.len(), keys.len(), "one line per key:\n{}", out.stderr);
    for key in keys {
        let want = format!("warning: resilience.{key}: accepted but not active yet");
        assert!(
            lines.contains(&want.as_str()),
            "no {want:?} in:\n{}",
            out.stderr
        );
    }
    assert!(
        !out.stderr.contains("resilience.provider_cooldown:"),
        "{}",
        out.stderr
    );
    // Without the variable, quota_preflight is not set and does not warn.
    let out = run_tidegate(&["check", "--config", path.to_str().unwrap()], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(not_active_lines(&out.stderr).len(), keys.len() - 1);
    assert!(
        !out.stderr.contains("resilience.quota_preflight:"),
        "{}",
        out.stderr
    );

    // The shipped file sets none of them.
    let out = run_tidegate(&["check", "--config", &shipped_config()], &[]);
    assert_eq!(not_active_lines(&out.stderr), Vec::<&str>::new());

    // serve: logs the same warnings at start-up, then serves. They are logged before the
    // ready line, but on stderr, which another thread drains: wait for them all.
    let gw = Gateway::start_with_env(&cfg, &env);
    let logs = eventually(secs(5), "a warning per key in the log", || {
        let logs = gw.logs();
        (not_active_lines(&logs).len() >= keys.len()).then_some(logs)
    });
    let lines = not_active_lines(&logs);
    assert_eq!(lines.len(), keys.len(), "one log line per key:\n{logs}");
    for key in keys {
        let want = format!("resilience.{key}: accepted but not active yet");
        let line = lines
            .iter()
            .find(|l| l.ends_with(&want))
            .unwrap_or_else(|| panic!("no {want:?} in:\n{logs}"));
        assert!(line.contains("WARN"), "{line}");
    }
    let ok = json_post(
        gw.addr(),
        "/v1/chat/completions",
        "test-key",
        &json!({"model": "up/m1", "messages": [{"role": "user", "content": "served"}]}),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
}

/// The example of `docs/configuration.md` ("How a file is read") is what `check` prints for
/// a file with those five problems, line for line.
#[test]
fn the_problem_lines_are_the_ones_docs_configuration_md_shows() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .unwrap();
    let start = doc.find("every problem is reported at once").unwrap();
    let block = &doc[start..];
    let block = &block[block.find("```\n").unwrap() + 4..];
    let block = &block[..block.find("```").unwrap()];
    let documented: Vec<&str> = block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(documented.len(), 5, "{block}");
    let file = r#"
[server]
listen = "localhost"

[[providers]]
id = "openai"
format = "openai"
base_url = "https://api.openai.com/v1"
models = ["gpt-4.1"]

[[connections]]
id = "a"
provider = "openai"

[[connections]]
id = "b"
provider = "openai"

[[connections]]
id = "c"
provider = "opnai"

[[combos]]
name = "x"
targets = ["openai/gpt-4.1", "openai/gpt-5"]

[resilience.provider_breaker.apikey]
failure_threshold = 5
degradation_threshold = 7
"#;
    let dir = TempDir::new("doc-problems");
    dir.write("tidegate.toml", file);
    let mut cmd = std::process::Command::new(support::gateway::TIDEGATE_BIN);
    cmd.args(["check", "--config", "tidegate.toml"])
        .current_dir(dir.path())
        .env_remove("TIDEGATE_CONFIG")
        .env("RATE_LIMIT_MAX_WAIT_MS", "abc");
    let out = support::gateway::run_bounded(cmd, support::secs(30));
    assert_eq!(out.code, 2, "{}", out.stderr);
    let mut printed = problem_lines(&out.stderr);
    printed.sort_unstable();
    let mut documented = documented;
    documented.sort_unstable();
    assert_eq!(printed, documented);
}

#[test]
fn check_fails_a_state_dir_no_user_could_create_and_creates_nothing() {
    let dir = TempDir::new("state-probe");
    let file = dir.write("not-a-dir", "x");
    let blocked = BASE.replace(
        "workers = 1\n",
        &format!("workers = 1\nstate_dir = \"{}/state\"\n", file.display()),
    );
    let (code, stdout, stderr) = run_check(&blocked);
    assert_eq!(code, 2, "stdout {stdout}\nstderr {stderr}");
    assert!(
        stderr.contains(&format!(
            "server.state_dir: {} is not a directory",
            file.display()
        )),
        "{stderr}"
    );
    // A missing directory below a writable one passes and is left for `serve` to create.
    let fresh = dir.path().join("a/b");
    let ok = BASE.replace(
        "workers = 1\n",
        &format!("workers = 1\nstate_dir = \"{}\"\n", fresh.display()),
    );
    let (code, stdout, stderr) = run_check(&ok);
    assert_eq!(code, 0, "stdout {stdout}\nstderr {stderr}");
    assert!(!dir.path().join("a").exists());
}
