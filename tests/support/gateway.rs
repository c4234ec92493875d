//! `Gateway`: runs the real `tidegate` binary as a child process with an inline TOML config,
//! waits for its ready line and keeps everything it prints for failure messages. Also bounded
//! one-shot runs of the CLI (`run_check`, `run_tidegate`).
//!
//! ```ignore
//! let gw = Gateway::start(r#"
//! [server]
//! listen = "127.0.0.1:0"
//! "#);
//! let r = json_post(gw.addr(), "/v1/chat/completions", "key", &body);
//! ```

use super::{Deadline, TempDir};
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// The binary under test, built by cargo for integration tests.
pub const TIDEGATE_BIN: &str = env!("CARGO_BIN_EXE_tidegate");
/// How long `start` waits for the ready line.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one-shot CLI runs may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a wait for a child's exit looks again when no output woke it.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// The parsed ready line: `tidegate listening on <addr> (shards=<n>, driver=<io_uring|epoll>)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyLine {
    pub addr: SocketAddr,
    pub shards: usize,
    pub driver: String,
}

impl ReadyLine {
    const PREFIX: &'static str = "tidegate listening on ";

    /// Parses the ready line out of one line of output (which may carry a log prefix).
    pub fn parse(line: &str) -> Option<ReadyLine> {
        let rest = &line[line.find(Self::PREFIX)? + Self::PREFIX.len()..];
        let (addr, rest) = rest.split_once(" (")?;
        let inner = rest.trim_end().strip_suffix(')')?;
        let (shards, driver) = inner.split_once(", ")?;
        let shards = shards.strip_prefix("shards=")?.parse().ok()?;
        let driver = driver.strip_prefix("driver=")?;
        if !matches!(driver, "io_uring" | "epoll") {
            return None;
        }
        Some(ReadyLine {
            addr: addr.parse().ok()?,
            shards,
            driver: driver.to_string(),
        })
    }

    /// The first ready line in `output`.
    pub fn find(output: &str) -> Option<ReadyLine> {
        output.lines().find_map(ReadyLine::parse)
    }
}

/// Output of a child, collected by drain threads so its pipes never fill.
#[derive(Default)]
struct Output {
    state: Mutex<OutputState>,
    changed: Condvar,
}

#[derive(Default)]
struct OutputState {
    /// stdout and stderr interleaved by line, as they arrived.
    all: String,
    stdout: String,
    stderr: String,
    closed_pipes: usize,
}

impl Output {
    fn lock(&self) -> MutexGuard<'_, OutputState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sleeps until new output arrives, a pipe closes, or `at_most` passes.
    fn wait_change(&self, at_most: Duration) {
        let state = self.lock();
        let before = (state.all.len(), state.closed_pipes);
        drop(
            self.changed
                .wait_timeout_while(state, at_most, |s| (s.all.len(), s.closed_pipes) == before)
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }
}

#[derive(Clone, Copy)]
enum Pipe {
    Stdout,
    Stderr,
}

fn drain(output: Arc<Output>, pipe: Pipe, source: impl Read + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("tidegate-output".to_string())
        .spawn(move || {
            let mut reader = BufReader::new(source);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line);
                        let mut state = output.lock();
                        state.all.push_str(&text);
                        match pipe {
                            Pipe::Stdout => state.stdout.push_str(&text),
                            Pipe::Stderr => state.stderr.push_str(&text),
                        }
                        output.changed.notify_all();
                    }
                }
            }
            output.lock().closed_pipes += 1;
            output.changed.notify_all();
        })
        .expect("spawn output drain thread")
}

/// A child process whose output is drained in the background.
struct Supervised {
    child: Child,
    output: Arc<Output>,
    drains: Vec<JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

impl Supervised {
    fn spawn(mut cmd: Command) -> Supervised {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let output = Arc::new(Output::default());
        let mut drains = Vec::new();
        if let Some(out) = child.stdout.take() {
            drains.push(drain(Arc::clone(&output), Pipe::Stdout, out));
        }
        if let Some(err) = child.stderr.take() {
            drains.push(drain(Arc::clone(&output), Pipe::Stderr, err));
        }
        Supervised {
            child,
            output,
            drains,
            exit: None,
        }
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Deadline::after(timeout);
        loop {
            if let Some(status) = self.try_exit() {
                self.join_drains();
                return Some(status);
            }
            if deadline.passed() {
                return None;
            }
            self.output.wait_change(deadline.remaining().min(EXIT_POLL));
        }
    }

    fn kill(&mut self) {
        if self.try_exit().is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
        self.join_drains();
    }

    /// Collects the drain threads once the child is gone (its pipes then close).
    fn join_drains(&mut self) {
        for d in self.drains.drain(..) {
            let _ = d.join();
        }
    }
}

/// A running `tidegate serve`. Dropping it kills (SIGKILL) and reaps the process if it is still
/// running, and prints its output if the test is failing.
pub struct Gateway {
    proc: Supervised,
    ready: ReadyLine,
    config_path: PathBuf,
    _dir: TempDir,
}

/// Why a gateway did not become ready.
#[derive(Debug)]
pub struct StartFailure {
    /// Its exit status, if it exited (it is killed if it merely never got ready).
    pub status: Option<ExitStatus>,
    pub logs: String,
}

impl Gateway {
    /// Starts `tidegate serve --config <file with config_toml>` and waits for the ready line;
    /// panics with the output if it does not come within [`START_TIMEOUT`].
    pub fn start(config_toml: &str) -> Gateway {
        Gateway::start_with_env(config_toml, &[])
    }

    /// Starts the gateway listening on a fixed loopback port (for tests of the listen
    /// claim and of handovers, which need to know the port before the start): `config_for`
    /// makes the config for a port. The port is picked free, but it is released before the
    /// gateway binds it, and any other process on the machine may be given it in between
    /// (the gateway then refuses to start: address in use); the start is then tried on
    /// another port, at most 5 times. Returns the gateway and its port.
    pub fn start_on_free_port(config_for: impl Fn(u16) -> String) -> (Gateway, u16) {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            match Gateway::try_start(&config_for(port), &[]) {
                Ok(gw) => return (gw, port),
                Err(f) if f.logs.contains("in use") => last = f.logs,
                Err(f) => panic!(
                    "tidegate did not become ready (exit status {:?}); output:\n{}",
                    f.status, f.logs
                ),
            }
        }
        panic!("5 free ports were taken before tidegate bound them; last output:\n{last}")
    }

    /// As [`start`](Self::start), with extra environment variables for the process.
    pub fn start_with_env(config_toml: &str, env: &[(&str, &str)]) -> Gateway {
        Gateway::try_start(config_toml, env).unwrap_or_else(|f| {
            panic!(
                "tidegate did not become ready (exit status {:?}); output:\n{}",
                f.status, f.logs
            )
        })
    }

    /// As [`start_with_env`](Self::start_with_env), returning the failure instead of
    /// panicking (for tests that expect start-up to fail).
    pub fn try_start(config_toml: &str, env: &[(&str, &str)]) -> Result<Gateway, StartFailure> {
        let dir = TempDir::new("gateway");
        let config_path = dir.write("tidegate.toml", config_toml);
        let mut cmd = Command::new(TIDEGATE_BIN);
        // Relative paths of the config (the default `state_dir = "./state"`) land in the
        // test's own directory, never in a directory another test shares.
        cmd.arg("serve")
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .env_remove("TIDEGATE_CONFIG")
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Gateway::launch(cmd, dir, config_path)
    }

    /// Runs `cmd` in place of the real binary and waits for a ready line from it: for testing
    /// this launcher with a stand-in process.
    pub fn try_start_command(cmd: Command) -> Result<Gateway, StartFailure> {
        let dir = TempDir::new("gateway");
        let config_path = dir.join("tidegate.toml");
        Gateway::launch(cmd, dir, config_path)
    }

    fn launch(cmd: Command, dir: TempDir, config_path: PathBuf) -> Result<Gateway, StartFailure> {
        let mut proc = Supervised::spawn(cmd);
        let deadline = Deadline::after(START_TIMEOUT);
        loop {
            let ready = ReadyLine::find(&proc.output.lock().all);
            if let Some(ready) = ready {
                return Ok(Gateway {
                    proc,
                    ready,
                    config_path,
                    _dir: dir,
                });
            }
            if proc.try_exit().is_some() || deadline.passed() {
                proc.kill();
                let logs = proc.output.lock().all.clone();
                return Err(StartFailure {
                    status: proc.exit,
                    logs,
                });
            }
            proc.output.wait_change(deadline.remaining().min(EXIT_POLL));
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.ready.addr
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.ready.addr)
    }

    pub fn shards(&self) -> usize {
        self.ready.shards
    }

    /// `io_uring` or `epoll`, as the ready line said.
    pub fn driver(&self) -> &str {
        &self.ready.driver
    }

    pub fn ready_line(&self) -> &ReadyLine {
        &self.ready
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// Everything the process printed so far (stdout and stderr interleaved by line).
    pub fn logs(&self) -> String {
        self.proc.output.lock().all.clone()
    }

    /// Waits until the output contains `needle`; panics with the output after `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let deadline = Deadline::after(timeout);
        loop {
            if self.proc.output.lock().all.contains(needle) {
                return;
            }
            if deadline.passed() {
                panic!(
                    "tidegate did not log {needle:?} within {timeout:?}; output:\n{}",
                    self.logs()
                );
            }
            self.proc.output.wait_change(deadline.remaining());
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// Sends SIGTERM (graceful shutdown). Does nothing if the process has already exited.
    pub fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends `signal` to the process, unless it has already exited (and been reaped, so its pid
    /// may belong to someone else).
    pub fn signal(&mut self, signal: libc::c_int) {
        if self.proc.try_exit().is_some() {
            return;
        }
        let pid = libc::pid_t::try_from(self.pid()).expect("pid fits pid_t");
        send_signal(pid, signal);
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.proc.wait_exit(timeout)
    }

    /// Kills (SIGKILL) and reaps the process now.
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// kill(2) on our own, not yet reaped child.
#[allow(unsafe_code)]
fn send_signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: kill(2) takes two integers and touches no memory of ours. The caller checked that
    // `pid` is our child and not yet reaped, so the pid cannot have been reused.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.proc.kill();
        if std::thread::panicking() {
            eprintln!(
                "----- tidegate output (pid {}, {:?}) -----\n{}----- end of tidegate output -----",
                self.pid(),
                self.proc.exit,
                self.logs()
            );
        }
    }
}

/// The result of a one-shot CLI run.
#[derive(Debug)]
pub struct RunOutput {
    pub status: ExitStatus,
    /// The exit code, -1 if a signal ended the process.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `tidegate <args>` with extra `env` and returns its output; panics if it takes longer
/// than [`RUN_TIMEOUT`].
pub fn run_tidegate(args: &[&str], env: &[(&str, &str)]) -> RunOutput {
    let mut cmd = Command::new(TIDEGATE_BIN);
    cmd.args(args)
        .env_remove("TIDEGATE_CONFIG")
        .env("NO_COLOR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(cmd, RUN_TIMEOUT)
}

/// Runs `cmd` to completion with drained output; kills it and panics after `timeout`.
pub fn run_bounded(cmd: Command, timeout: Duration) -> RunOutput {
    let what = format!("{cmd:?}");
    let mut proc = Supervised::spawn(cmd);
    let Some(status) = proc.wait_exit(timeout) else {
        proc.kill();
        let out = proc.output.lock();
        panic!(
            "{what} did not finish within {timeout:?}; output:\n{}",
            out.all
        );
    };
    let out = proc.output.lock();
    RunOutput {
        status,
        code: status.code().unwrap_or(-1),
        stdout: out.stdout.clone(),
        stderr: out.stderr.clone(),
    }
}

/// `tidegate check --config <file with config_toml>`: (exit code, stdout, stderr).
pub fn run_check(config_toml: &str) -> (i32, String, String) {
    let dir = TempDir::new("check");
    let path = dir.write("tidegate.toml", config_toml);
    let path = path.to_str().expect("temp path is UTF-8");
    let out = run_tidegate(&["check", "--config", path], &[]);
    (out.code, out.stdout, out.stderr)
}

/// A loopback port that was free a moment ago (released at once: another process may be
/// given it next; [`Gateway::start_on_free_port`] tries again if so).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
