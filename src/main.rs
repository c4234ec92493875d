//! The `tidegate` command line: `serve`, `check`, `snapshot inspect`. Everything else lives
//! in the library.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

// The unreachable-code check (scripts/check-dead-code) builds this binary with
// `--cfg tidegate_reach`: the library's modules are then compiled into the binary itself,
// where nothing is exported, so `-W dead_code` names every item `main` cannot reach.
// Items that only tests and benches use carry `#[cfg_attr(tidegate_reach, allow(dead_code))]`
// (the test-support surface, listed in docs/architecture.md). The list must equal lib.rs's.
#[cfg(tidegate_reach)]
use crate as tidegate;
#[cfg(tidegate_reach)]
mod admin;
#[cfg(tidegate_reach)]
mod auth;
#[cfg(tidegate_reach)]
mod clock;
#[cfg(tidegate_reach)]
mod config;
#[cfg(tidegate_reach)]
mod error;
#[cfg(tidegate_reach)]
mod flow;
#[cfg(tidegate_reach)]
mod heap;
#[cfg(tidegate_reach)]
mod http1;
#[cfg(tidegate_reach)]
mod mesh;
#[cfg(tidegate_reach)]
mod net;
#[cfg(tidegate_reach)]
mod notify;
#[cfg(tidegate_reach)]
mod owners;
#[cfg(tidegate_reach)]
mod providers;
#[cfg(tidegate_reach)]
mod proxy;
#[cfg(tidegate_reach)]
mod resilience;
#[cfg(tidegate_reach)]
mod routing;
#[cfg(tidegate_reach)]
mod server;
#[cfg(tidegate_reach)]
mod shard;
#[cfg(tidegate_reach)]
mod snapshot;
#[cfg(tidegate_reach)]
mod sse;
#[cfg(tidegate_reach)]
mod timer;

#[cfg(not(tidegate_reach))]
use tidegate::config;
use tidegate::config::Config;
use tidegate::server::{self as fleet, DriverChoice, UringSetup};
use tidegate::snapshot::store::Unusable;

#[global_allocator]
static GLOBAL: tidegate::heap::Heap = tidegate::heap::Heap;

/// Exit code for an invalid configuration or command line.
const EXIT_CONFIG: u8 = 2;
/// Exit code for a failure to start (cannot bind, TLS setup, threads).
const EXIT_START: u8 = 1;

#[derive(Parser)]
#[command(
    name = "tidegate",
    version,
    about = "Thread-per-core LLM API edge gateway (OpenAI and Anthropic formats)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway until SIGTERM or SIGINT; SIGHUP reloads the configuration file.
    Serve {
        /// Configuration file [env: TIDEGATE_CONFIG] [default: config/tidegate.toml, or
        /// /etc/tidegate/tidegate.toml under systemd (INVOCATION_ID or NOTIFY_SOCKET set)]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// Validate a configuration file and the TIDEGATE_LOG, TIDEGATE_DRIVER and
    /// TIDEGATE_URING_SETUP variables: exit 0, or 2 with one line per problem.
    Check {
        /// Configuration file [env: TIDEGATE_CONFIG] [default: config/tidegate.toml, or
        /// /etc/tidegate/tidegate.toml under systemd (INVOCATION_ID or NOTIFY_SOCKET set)]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
    /// The persisted state (breakers, connection states, provider cooldowns, session
    /// affinity pins, exclusive session leases, settings changed through the API).
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Print both snapshot slots' status and the newest valid one's state as JSON.
    /// Read-only: safe while the gateway runs; moves nothing aside.
    Inspect {
        /// State directory [default: server.state_dir of the configuration file]
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Configuration file read for server.state_dir when --state-dir is not given
        /// [env: TIDEGATE_CONFIG] [default: config/tidegate.toml, or
        /// /etc/tidegate/tidegate.toml under systemd (INVOCATION_ID or NOTIFY_SOCKET set)]
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
    },
}

/// The configuration file when neither `--config` nor `TIDEGATE_CONFIG` names one, for a
/// process systemd started (it sets `INVOCATION_ID`, and `NOTIFY_SOCKET` for `Type=notify`).
const SERVICE_CONFIG: &str = "/etc/tidegate/tidegate.toml";
/// ... and otherwise (relative to the working directory: a checkout).
const LOCAL_CONFIG: &str = "config/tidegate.toml";

/// `--config`, else a non-empty `TIDEGATE_CONFIG` (an empty one, as `TIDEGATE_CONFIG=` in an
/// environment file leaves it, is unset, as for the other variables), else the default.
fn config_path(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os("TIDEGATE_CONFIG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| {
        let service = ["INVOCATION_ID", "NOTIFY_SOCKET"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        PathBuf::from(if service {
            SERVICE_CONFIG
        } else {
            LOCAL_CONFIG
        })
    })
}

/// One problem line: `<path>: <key>: <message>`, or `<path>: <message>` when the problem is
/// the file itself (its key is the path).
fn problem_line(path: &std::path::Path, key: &str, message: &str) -> String {
    let shown = path.display().to_string();
    if key == shown || key.is_empty() {
        format!("{shown}: {message}")
    } else {
        format!("{shown}: {key}: {message}")
    }
}

/// `1 provider`, `0 providers`, `2 client keys`: a count and its noun, singular for one.
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn env_lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Loads and validates; on failure prints one line per problem to stderr. A relative path
/// that is not there says where it was looked for (the default `config/tidegate.toml` run
/// outside a checkout is the usual case).
fn load(path: &std::path::Path) -> Result<(Config, Vec<String>), ExitCode> {
    match config::load_file(path, &env_lookup) {
        Ok(outcome) => Ok((outcome.config, outcome.warnings)),
        Err(err) => {
            let shown = path.display().to_string();
            for p in &err.problems {
                let mut line = problem_line(path, &p.key, &p.message);
                if p.key == shown
                    && path.is_relative()
                    && !path.exists()
                    && let Ok(cwd) = std::env::current_dir()
                {
                    line.push_str(&format!(
                        " (looked for in the working directory {}; --config PATH or \
                         TIDEGATE_CONFIG names another file)",
                        cwd.display()
                    ));
                }
                eprintln!("{line}");
            }
            Err(ExitCode::from(EXIT_CONFIG))
        }
    }
}

/// The log filter from `TIDEGATE_LOG` (default `info`). Every directive must be a level
/// or `target=level`: a typo is an error, not a filter that silently matches nothing.
fn log_filter() -> Result<tracing_subscriber::EnvFilter, String> {
    let spec = std::env::var("TIDEGATE_LOG").unwrap_or_default();
    let spec = if spec.trim().is_empty() {
        "info".to_owned()
    } else {
        spec
    };
    for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        let known = ["error", "warn", "info", "debug", "trace", "off"];
        if !known.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "TIDEGATE_LOG: {directive:?} is not a level (error, warn, info, debug, trace, off) \
                 or target=level"
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(&spec).map_err(|e| format!("TIDEGATE_LOG: {e}"))
}

fn driver_choice() -> Result<DriverChoice, String> {
    DriverChoice::parse(&std::env::var("TIDEGATE_DRIVER").unwrap_or_default())
        .ok_or_else(|| "TIDEGATE_DRIVER: expected auto, io_uring or epoll".to_owned())
}

fn uring_setup() -> Result<UringSetup, String> {
    UringSetup::parse(&std::env::var("TIDEGATE_URING_SETUP").unwrap_or_default())
        .ok_or_else(|| "TIDEGATE_URING_SETUP: expected coop, defer or plain".to_owned())
}

/// What `serve` would refuse in `TIDEGATE_LOG`, `TIDEGATE_DRIVER` and
/// `TIDEGATE_URING_SETUP`, one line each (`check` reports them; `serve` exits 2 on the first).
fn startup_variable_problems() -> Vec<String> {
    [
        log_filter().err(),
        driver_choice().err(),
        uring_setup().err(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn init_logging(filter: tracing_subscriber::EnvFilter, format: config::LogFormat) {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi && format == config::LogFormat::Text)
        .with_target(false);
    match format {
        config::LogFormat::Text => builder.init(),
        config::LogFormat::Json => builder.event_format(json_log::JsonLines).init(),
    }
}

/// `server.log_format = "json"`: one JSON object per line — `time` (RFC 3339, UTC),
/// `level`, `target`, `message` and every field of the event.
mod json_log {

    use serde_json::{Map, Value};
    use tracing::field::{Field, Visit};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
    use tracing_subscriber::registry::LookupSpan;

    pub struct JsonLines;

    struct Fields<'a>(&'a mut Map<String, Value>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0
                .insert(field.name().to_owned(), Value::String(format!("{value:?}")));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), Value::from(value));
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.0.insert(field.name().to_owned(), Value::from(value));
        }
        fn record_i64(&mut self, field: &Field, value: i64) {
            self.0.insert(field.name().to_owned(), Value::from(value));
        }
        fn record_bool(&mut self, field: &Field, value: bool) {
            self.0.insert(field.name().to_owned(), Value::from(value));
        }
    }

    fn now_rfc3339() -> String {
        let t = time::OffsetDateTime::now_utc();
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.microsecond()
        )
    }

    impl<S, N> FormatEvent<S, N> for JsonLines
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            _ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> std::fmt::Result {
            let meta = event.metadata();
            let mut map = Map::new();
            map.insert("time".into(), Value::String(now_rfc3339()));
            map.insert("level".into(), Value::from(meta.level().as_str()));
            map.insert("target".into(), Value::from(meta.target()));
            event.record(&mut Fields(&mut map));
            writer.write_str(&Value::Object(map).to_string())?;
            writer.write_char('\n')
        }
    }
}

/// Every environment variable the binary reads, for `--help`.
fn environment_help() -> String {
    let mut out = String::from(
        "Environment:\n  \
         TIDEGATE_CONFIG   configuration file when --config is not given\n  \
         TIDEGATE_LOG      log filter: a level (error, warn, info, debug, trace, off) or \
         comma-separated target=level directives, e.g. tidegate=debug; default info\n  \
         TIDEGATE_DRIVER   auto (default), io_uring or epoll\n  \
         TIDEGATE_URING_SETUP  io_uring ring setup: coop (default), defer or plain\n\n\
         Set by systemd (either one set: the default configuration file is \
         /etc/tidegate/tidegate.toml instead of config/tidegate.toml):\n  \
         NOTIFY_SOCKET     where READY=1 / RELOADING=1 / STOPPING=1 go (Type=notify)\n  \
         INVOCATION_ID     the unit's invocation\n\n\
         Resilience overrides (under the file's values, except RATE_LIMIT_AUTO_ENABLE, \
         which wins over the file; docs/configuration.md):\n",
    );
    for var in config::resilience::env_variables() {
        out.push_str("  ");
        out.push_str(var);
        out.push('\n');
    }
    out.push_str("  ");
    out.push_str(config::EMERGENCY_FALLBACK_ENV);
    out.push_str("   false turns [emergency_fallback] off\n");
    out.push_str(
        "\nSecrets, read from the variables the file names: connections.api_key_env \
         (OPENAI_API_KEY, ANTHROPIC_API_KEY, OPENROUTER_API_KEY in the shipped file), \
         client_keys.key_env, server.admin_token_env.",
    );
    out
}

fn main() -> ExitCode {
    let env_help = environment_help();
    let command = <Cli as clap::CommandFactory>::command()
        .after_help(env_help.clone())
        .mut_subcommand("serve", |c| c.after_help(format!("{env_help}\n\nWhen every shard accepts, prints: tidegate listening on <addr> (shards=<n>, driver=<io_uring|epoll>)")))
        .mut_subcommand("check", |c| c.after_help(env_help.clone()))
        .mut_subcommand("snapshot", |c| {
            c.after_help(
                "The snapshot lives in server.state_dir as two slot files \
                 (snapshot-a.tgsnap, snapshot-b.tgsnap); docs/operations.md describes it.",
            )
        });
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Check { config } => {
            let path = config_path(config);
            // The variables `serve` would refuse are reported beside the file's problems.
            let env_problems = startup_variable_problems();
            let loaded = load(&path);
            for p in &env_problems {
                eprintln!("{p}");
            }
            match loaded {
                Ok(_) if !env_problems.is_empty() => ExitCode::from(EXIT_CONFIG),
                Ok((cfg, warnings)) => {
                    for w in &warnings {
                        eprintln!("warning: {w}");
                    }
                    // What `serve` refuses after loading fails the check too: a check run
                    // before a restart must not pass a file the restart would not serve.
                    if let Some(why) = config::exposure::open_gateway_refusal(&cfg) {
                        eprintln!("{}: server.listen: {why}", path.display());
                        return ExitCode::from(EXIT_CONFIG);
                    }
                    // The listener's certificate and key and the providers' CA bundles, read
                    // as `serve` reads them: a file that is there but holds no usable PEM.
                    if let Err(why) = tidegate::net::tls::TlsConfigs::build(&cfg) {
                        eprintln!("{}: {why}", path.display());
                        return ExitCode::from(EXIT_CONFIG);
                    }
                    match tidegate::snapshot::store::probe(&cfg.server.state_dir) {
                        Ok(()) => {}
                        Err(Unusable::Fatal(why)) => {
                            eprintln!("{}: server.state_dir: {why}", path.display());
                            return ExitCode::from(EXIT_CONFIG);
                        }
                        // `serve` may run as another user (the packaged unit's `tidegate`).
                        Err(Unusable::NotWritable(why)) => eprintln!(
                            "warning: server.state_dir: {why} for this user; `serve` must run \
                             as a user that can create and write it"
                        ),
                    }
                    println!(
                        "{}: ok ({}, {}, {}, {})",
                        path.display(),
                        counted(cfg.providers.len(), "provider"),
                        counted(cfg.connections.len(), "connection"),
                        counted(cfg.combos.len(), "combo"),
                        counted(cfg.client_keys.len(), "client key")
                    );
                    ExitCode::SUCCESS
                }
                Err(code) => code,
            }
        }
        Command::Serve { config } => serve(config_path(config)),
        Command::Snapshot {
            command: SnapshotCommand::Inspect { state_dir, config },
        } => {
            let dir = match state_dir {
                Some(d) => d,
                None => match load(&config_path(config)) {
                    Ok((cfg, _)) => cfg.server.state_dir,
                    Err(code) => return code,
                },
            };
            let json = tidegate::snapshot::inspect::inspect(&dir);
            match serde_json::to_string_pretty(&json) {
                Ok(text) => {
                    println!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("tidegate: {e}");
                    ExitCode::from(EXIT_START)
                }
            }
        }
    }
}

/// SIGHUP: re-reads and validates the file; any problem keeps the running configuration
/// (each logged), otherwise every shard adopts it at once (requests in flight finish on the
/// configuration they started with).
fn reload(path: &std::path::Path, fleet: &mut fleet::Fleet) {
    tracing::info!(signal = "SIGHUP", "reloading {}", path.display());
    let refuse = |problems: &[String]| {
        for p in problems {
            tracing::error!("reload: {p}");
        }
        tracing::error!(
            "reload refused ({} problem(s)); keeping the running configuration",
            problems.len()
        );
    };
    let cfg = match config::load_file(path, &env_lookup) {
        Ok(outcome) => {
            for w in &outcome.warnings {
                tracing::warn!("reload: {w}");
            }
            outcome.config
        }
        Err(err) => {
            let problems: Vec<String> = err
                .problems
                .iter()
                .map(|p| problem_line(path, &p.key, &p.message))
                .collect();
            refuse(&problems);
            return;
        }
    };
    if let Some(why) = config::exposure::open_gateway_refusal(&cfg) {
        refuse(&[format!("{}: server.listen: {why}", path.display())]);
        return;
    }
    match fleet.reload(cfg) {
        Ok(done) => {
            for k in &done.kept {
                tracing::warn!("reload: {k}");
            }
            for c in &done.changes {
                tracing::info!("reload: {c}");
            }
            if done.adopted == fleet.shards {
                tracing::info!(
                    shards = done.adopted,
                    "configuration reloaded from {}: every shard adopted it (new requests use it; \
                     requests in flight finish on the configuration they started with)",
                    path.display()
                );
            } else {
                tracing::warn!(
                    shards = fleet.shards,
                    adopted = done.adopted,
                    "configuration reloaded from {}: only {} of {} shards adopted it so far; the rest \
                     adopt it when their threads next run",
                    path.display(),
                    done.adopted,
                    fleet.shards
                );
            }
        }
        Err(problems) => refuse(&problems),
    }
}

fn signal_name(signal: Option<i32>) -> &'static str {
    match signal {
        Some(signal_hook::consts::SIGTERM) => "SIGTERM",
        Some(signal_hook::consts::SIGINT) => "SIGINT",
        Some(signal_hook::consts::SIGHUP) => "SIGHUP",
        _ => "unknown",
    }
}

fn serve(path: PathBuf) -> ExitCode {
    let filter = match log_filter() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let (cfg, warnings) = match load(&path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    init_logging(filter, cfg.server.log_format);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    if let Some(why) = config::exposure::open_gateway_refusal(&cfg) {
        eprintln!("{}: server.listen: {why}", path.display());
        return ExitCode::from(EXIT_CONFIG);
    }
    let choice = match driver_choice() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let uring_setup = match uring_setup() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // Handlers are installed before any shard starts; this thread waits for them.
    let mut signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot install signal handlers: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    let mut fleet = match fleet::start(Arc::new(cfg), choice, uring_setup) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("tidegate: {e}");
            return ExitCode::from(EXIT_START);
        }
    };
    println!(
        "tidegate listening on {} (shards={}, driver={})",
        fleet.addr,
        fleet.shards,
        fleet.driver.as_str()
    );
    tidegate::notify::notify("READY=1");
    let mut signal = None;
    for s in signals.forever() {
        if s == signal_hook::consts::SIGHUP {
            tidegate::notify::notify("RELOADING=1");
            reload(&path, &mut fleet);
            tidegate::notify::notify("READY=1");
            continue;
        }
        signal = Some(s);
        break;
    }
    tidegate::notify::notify("STOPPING=1");
    // Listeners close before the line is logged: a successor (or a test) that sees it
    // knows every new connection goes elsewhere.
    fleet.stop_listening();
    tracing::info!(
        signal = %signal_name(signal),
        "shutting down: no new connections, draining in-flight requests"
    );
    fleet.stop();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}
