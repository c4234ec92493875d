//! Runs `tests/compat/sdk_client.py`, which drives the official OpenAI and Anthropic Python
//! SDKs against a server. The interpreter comes from `TIDEGATE_PYTHON` (set by `scripts/test`
//! to the project's `.venv`); a test that needs it fails, never skips, when it is missing.

use super::gateway::{RunOutput, run_bounded};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The SDK client script.
pub const SDK_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/compat/sdk_client.py");
/// Bound on one whole SDK run (four calls, each with its own 30 s SDK timeout).
pub const SDK_TIMEOUT: Duration = Duration::from_secs(150);

/// The Python with the pinned SDKs; panics, saying how to get one, if `TIDEGATE_PYTHON` is unset.
pub fn python() -> PathBuf {
    match std::env::var_os("TIDEGATE_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!(
            "TIDEGATE_PYTHON is not set: run the tests with scripts/test, which creates .venv \
             with the pinned SDKs (tests/compat/requirements.txt) and exports it, or export \
             TIDEGATE_PYTHON=$PWD/.venv/bin/python yourself"
        ),
    }
}

/// Runs the SDK client against `origin` (`http://ADDR`, no `/v1`) with `api_key` and extra
/// script arguments (`--only openai`, `--expect-echo`, `--model M`). Panics with the script's
/// output if it fails; returns its JSON result line.
pub fn run_sdk_client(origin: &str, api_key: &str, extra_args: &[&str]) -> serde_json::Value {
    run_sdk_script(SDK_CLIENT, origin, api_key, extra_args)
}

/// The cross-format SDK script (`openai` or `anthropic` mode, then the model).
pub const SDK_TRANSLATE: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/compat/sdk_translate.py");

/// Runs an SDK script as [`run_sdk_client`] does.
pub fn run_sdk_script(
    script: &str,
    origin: &str,
    api_key: &str,
    extra_args: &[&str],
) -> serde_json::Value {
    let mut cmd = Command::new(python());
    cmd.arg(script).arg(origin).arg(api_key).args(extra_args);
    let RunOutput {
        code,
        stdout,
        stderr,
        ..
    } = run_bounded(cmd, SDK_TIMEOUT);
    assert_eq!(
        code, 0,
        "{script} against {origin} failed (exit {code})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    );
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or_else(|| panic!("{script} printed no JSON line:\n{stdout}\n{stderr}"));
    serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{script} result is not JSON ({e}): {line}"))
}
