//! Running as a systemd service: `scripts/install.sh --root` lays out the binary, the unit,
//! the config (never overwriting an existing one) and the key file, idempotently, and
//! `--uninstall` removes what it installed; the unit passes `systemd-analyze verify` where
//! that tool exists; the binary speaks `sd_notify` (READY=1 once serving, STOPPING=1 on
//! SIGTERM) for the unit's `Type=notify`.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;

use support::gateway::{RunOutput, TIDEGATE_BIN, run_bounded};
use support::{Gateway, TempDir, secs};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn install(args: &[&str]) -> RunOutput {
    let mut cmd = Command::new("bash");
    cmd.arg(format!("{REPO}/scripts/install.sh")).args(args);
    let out = run_bounded(cmd, secs(60));
    assert_eq!(
        out.code, 0,
        "install.sh {args:?}:\n{}\n{}",
        out.stdout, out.stderr
    );
    out
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `--help` prints the header comment, every line of it and nothing of the script below.
#[test]
fn install_sh_help_is_the_header_comment_alone() {
    let out = install(&["--help"]);
    let header: Vec<String> = std::fs::read_to_string(format!("{REPO}/scripts/install.sh"))
        .unwrap()
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with('#'))
        .map(|l| {
            l.strip_prefix("# ")
                .or_else(|| l.strip_prefix('#'))
                .unwrap()
                .to_owned()
        })
        .collect();
    let printed: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(printed, header, "{}", out.stdout);
    assert!(printed.iter().any(|l| l.starts_with("--uninstall")));
}

/// A flag missing its value is refused like an unknown argument: one line naming the
/// flag, exit 2 (not bash's `line 19: 2: --root needs a directory`, exit 1).
#[test]
fn install_sh_names_a_flag_missing_its_value() {
    for args in [&["--root"][..], &["--binary"], &["--root", "--uninstall"]] {
        let mut cmd = Command::new("bash");
        cmd.arg(format!("{REPO}/scripts/install.sh")).args(args);
        let out = run_bounded(cmd, secs(30));
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert_eq!(
            out.stderr.trim(),
            format!("install.sh: {} needs a value (see --help)", args[0]),
            "{args:?}"
        );
    }
}

#[test]
fn install_sh_root_lays_out_the_service_and_keeps_an_existing_config() {
    let dir = TempDir::new("install");
    let root = dir.path().to_str().unwrap();
    install(&["--root", root, "--binary", TIDEGATE_BIN]);
    let bin = dir.join("usr/local/bin/tidegate");
    let unit = dir.join("etc/systemd/system/tidegate.service");
    let config = dir.join("etc/tidegate/tidegate.toml");
    let env = dir.join("etc/tidegate/env");
    assert_eq!(mode(&bin), 0o755);
    assert_eq!(mode(&env), 0o600, "provider keys are readable by root only");
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        std::fs::read_to_string(format!("{REPO}/config/tidegate.toml")).unwrap()
    );
    let unit_text = std::fs::read_to_string(&unit).unwrap();
    for line in [
        "Type=notify",
        "ExecStart=/usr/local/bin/tidegate serve --config /etc/tidegate/tidegate.toml",
        "EnvironmentFile=-/etc/tidegate/env",
        "User=tidegate",
        "Restart=on-failure",
        "StateDirectory=tidegate",
        "LimitNOFILE=",
        "NoNewPrivileges=yes",
    ] {
        assert!(
            unit_text.lines().any(|l| l.starts_with(line)),
            "unit lacks {line}"
        );
    }

    // Again, over an edited config: idempotent, and the operator's file is kept.
    std::fs::write(&config, "# edited by the operator\n").unwrap();
    let out = install(&["--root", root, "--binary", TIDEGATE_BIN]);
    assert!(
        out.stdout.contains("keeping the existing"),
        "{}",
        out.stdout
    );
    assert_eq!(
        std::fs::read_to_string(&config).unwrap(),
        "# edited by the operator\n"
    );

    // The unit is valid for systemd (with ExecStart pointed at the installed binary).
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let check = dir.join("verify/tidegate.service");
        std::fs::create_dir_all(check.parent().unwrap()).unwrap();
        std::fs::write(
            &check,
            unit_text.replace("/usr/local/bin/tidegate", bin.to_str().unwrap()),
        )
        .unwrap();
        let mut cmd = Command::new("systemd-analyze");
        cmd.arg("verify").arg(&check);
        let out = run_bounded(cmd, secs(60));
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert!(
            out.stderr.trim().is_empty(),
            "systemd-analyze verify complains:\n{}",
            out.stderr
        );
    }

    // Uninstall removes the binary and the unit, keeps the config and keys.
    install(&["--uninstall", "--root", root]);
    assert!(!bin.exists() && !unit.exists());
    assert!(config.exists() && env.exists());
}

#[test]
fn the_binary_tells_systemd_when_it_is_ready_reloading_and_stopping() {
    let dir = TempDir::new("notify");
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(secs(20))).unwrap();
    let cfg = r#"
[server]
listen = "127.0.0.1:0"
workers = 2

[[client_keys]]
id = "t"
key = "test-key"

[[providers]]
id = "mock"
format = "mock"

[[connections]]
id = "m"
provider = "mock"
"#;
    let mut gw = Gateway::start_with_env(cfg, &[("NOTIFY_SOCKET", path.to_str().unwrap())]);
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    // A reload (SIGHUP, the unit's ExecReload) is RELOADING=1 then READY=1.
    gw.signal(libc::SIGHUP);
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"RELOADING=1");
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"READY=1");
    gw.terminate();
    let n = socket.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert!(gw.wait_exit(secs(20)).unwrap().success());
}

/// `tidegate check` with no `--config` and no `TIDEGATE_CONFIG`, in an empty directory.
fn check_without_a_path(env: &[(&str, &str)]) -> RunOutput {
    let dir = TempDir::new("default-config");
    let mut cmd = Command::new(TIDEGATE_BIN);
    cmd.arg("check")
        .current_dir(dir.path())
        .env_remove("TIDEGATE_CONFIG")
        .env_remove("INVOCATION_ID")
        .env_remove("NOTIFY_SOCKET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(cmd, secs(30))
}

#[test]
fn the_default_config_path_is_etc_tidegate_under_systemd_and_printed_once() {
    if Path::new("/etc/tidegate/tidegate.toml").exists() {
        return; // a real install here: the path would be read, not reported missing
    }
    let local = check_without_a_path(&[]);
    assert_eq!(local.code, 2, "{}", local.stderr);
    assert_eq!(
        local.stderr.matches("config/tidegate.toml").count(),
        1,
        "the relative default is printed once: {}",
        local.stderr
    );
    for var in ["INVOCATION_ID", "NOTIFY_SOCKET"] {
        let service = check_without_a_path(&[(var, "x")]);
        assert_eq!(service.code, 2, "{}", service.stderr);
        assert!(
            service
                .stderr
                .starts_with("/etc/tidegate/tidegate.toml: cannot read"),
            "with {var} set the default is /etc/tidegate/tidegate.toml: {}",
            service.stderr
        );
        assert_eq!(
            service.stderr.matches("tidegate.toml").count(),
            1,
            "{}",
            service.stderr
        );
    }
}
