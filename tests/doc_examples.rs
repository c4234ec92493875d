//! Every shell example in README.md and docs/ that starts with `curl` or `tidegate` runs
//! against the shipped config (`config/tidegate.toml`, on a free port instead of 8787) and
//! succeeds: exit 0 (`curl` with `--fail-with-body`, so an HTTP error fails too). That is
//! every such command in a fenced shell block, and every inline `` `curl …` `` span of the
//! prose and tables (run with `TG` and `AUTH` set as `docs/operations.md` defines them).
//! The docs cite only what a reader of the repository can open: no section numbers of the
//! OmniRoute spec or of the shared design notes, which are not part of the repository.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::gateway::{TIDEGATE_BIN, run_bounded};
use support::{Gateway, secs};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const SHIPPED_LISTEN: &str = "127.0.0.1:8787";

/// The documents whose examples are checked.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![Path::new(REPO).join("README.md")];
    let mut dir: Vec<PathBuf> = std::fs::read_dir(Path::new(REPO).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    dir.sort();
    docs.extend(dir);
    docs
}

/// The commands in fenced `sh`/`bash`/`shell`/unlabelled blocks that start with `curl` or
/// `tidegate`, continuation lines joined, and the inline code spans outside fenced blocks
/// that start with `curl ` (`tidegate …` spans are synopses such as `tidegate check
/// [--config PATH]`): (document, command).
fn examples() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(REPO).unwrap().display().to_string();
        let mut in_shell = false;
        let mut in_block = false;
        let mut pending = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if let Some(lang) = trimmed.strip_prefix("```") {
                if in_block {
                    in_block = false;
                    in_shell = false;
                } else {
                    in_block = true;
                    in_shell = matches!(lang.trim(), "" | "sh" | "bash" | "shell" | "console");
                }
                continue;
            }
            if !in_block {
                out.extend(
                    inline_curl_spans(line).map(|command| (name.clone(), command.to_owned())),
                );
                continue;
            }
            if !in_shell {
                continue;
            }
            let piece = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
            pending.push_str(piece.trim_end_matches('\\'));
            if piece.ends_with('\\') {
                pending.push(' ');
                continue;
            }
            let command = std::mem::take(&mut pending);
            let first = command.split_whitespace().next().unwrap_or("");
            if first == "curl" || first == "tidegate" {
                out.push((name.clone(), command));
            }
        }
    }
    out
}

/// The inline code spans of one line of prose that hold a `curl` command.
fn inline_curl_spans(line: &str) -> impl Iterator<Item = &str> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("curl "))
}

#[test]
fn every_curl_and_tidegate_example_in_the_docs_runs_against_the_shipped_config() {
    let shipped = std::fs::read_to_string(Path::new(REPO).join("config/tidegate.toml")).unwrap();
    assert!(shipped.contains(SHIPPED_LISTEN));
    let gw = Gateway::start(&shipped.replace(SHIPPED_LISTEN, "127.0.0.1:0"));
    let addr = gw.addr().to_string();
    let examples = examples();
    assert!(
        examples.len() >= 3,
        "fewer examples than expected: {examples:?}"
    );
    // The inline table commands of docs/operations.md are among them.
    assert!(
        examples.iter().any(
            |(doc, c)| doc.ends_with("operations.md") && c.contains("$TG/api/resilience/reset")
        ),
        "{examples:?}"
    );
    let mut failures = Vec::new();
    for (doc, command) in &examples {
        let mut run = command
            .replace(SHIPPED_LISTEN, &addr)
            .replace("localhost:8787", &addr);
        if let Some(rest) = run.strip_prefix("curl ") {
            run = format!("curl --fail-with-body --max-time 20 {rest}");
        }
        if let Some(rest) = run.strip_prefix("tidegate ") {
            run = format!("{TIDEGATE_BIN} {rest}");
        }
        let mut cmd = Command::new("bash");
        cmd.arg("-o")
            .arg("pipefail")
            .arg("-c")
            .arg(&run)
            .current_dir(REPO)
            .env_remove("TIDEGATE_CONFIG")
            // As `docs/operations.md` defines them for its table of calls.
            .env("TG", format!("http://{addr}"))
            .env("AUTH", "Authorization: Bearer tidegate-dev-key");
        let out = run_bounded(cmd, secs(60));
        if out.code != 0 {
            failures.push(format!(
                "{doc}: `{command}` exited {}:\n{}\n{}",
                out.code, out.stdout, out.stderr
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Section numbers of files outside the repository (the OmniRoute spec's "A §3.8", "B §7",
/// the shared design notes' `ARCHITECTURE.md`) mean nothing to a reader of `docs/`: a page
/// cites another page of `docs/` or says what the rule is.
#[test]
fn the_docs_cite_only_what_a_reader_of_the_repository_can_open() {
    let mut found = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(REPO).unwrap().display().to_string();
        for (i, line) in text.lines().enumerate() {
            let cites_spec = line.match_indices(" §").any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + " §".len()..].chars().next();
                matches!(before, Some('A' | 'B')) && after.is_some_and(|c| c.is_ascii_digit())
            });
            if cites_spec || line.contains("ARCHITECTURE") || line.contains("spec/") {
                found.push(format!("{name}:{}: {line}", i + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
