//! Loading: TOML text → [`raw`](super::raw) structs (serde) → the typed [`Config`]. Every
//! check runs and every problem is collected, so `tidegate check` prints the whole list
//! at once, one `<key>: <message>` line each (ARCHITECTURE §1.6). Providers and
//! connections get dense ids in file order. Secrets named by `*_env` keys are read here,
//! through the injected environment function.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::combo::{self, ComboLayer, ComboSettings};
use super::kinds::ProviderKind;
use super::problem::{DAY_MS, HOUR_MS, Problem, out_of_range};
use super::raw::{RawClientKey, RawComboTarget, RawConfig, RawConnection, RawProvider, RawServer};
use super::resilience::{self, ResilienceSettings};
use super::{
    AuthKind, BaseUrl, ClientKey, Combo, ComboId, ComboStrategy, ComboTarget, Config, Connection,
    ConnectionId, DailyResetClock, EMERGENCY_FALLBACK_ENV, EmergencyFallback, KeySecret, Provider,
    ProviderFormat, ProviderId, RateLimitOverrides, Scheme, Scope, ServerConfig,
};

/// The configuration is invalid; `Display` prints one line per problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// The problem serde reports for `text`, naming its key when it is a value of the
    /// wrong type.
    fn toml_problem(text: &str, e: &toml::de::Error) -> Problem {
        let raw_message = e.message().replace('\n', " ");
        let (key, message) = match e.span() {
            // A value of the wrong type: name its key, say what it takes and what it got,
            // and give the place after the message.
            Some(span) if is_wrong_value(e) => {
                let (line, column) = line_column(text, span.start);
                let key = super::diagnose::key_at(text, span.start);
                // A TOML date or time reaches serde as a table.
                let is_datetime = text
                    .get(span.start..)
                    .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()));
                let raw_message = match raw_message.strip_prefix("invalid type: map, ") {
                    Some(rest) if is_datetime => format!("invalid type: datetime, {rest}"),
                    _ => raw_message,
                };
                let message = super::diagnose::plain_message(key.as_deref(), raw_message.trim());
                (
                    key.unwrap_or_else(|| format!("line {line}, column {column}")),
                    format!("{message} (line {line}, column {column})"),
                )
            }
            Some(span) => {
                let (line, column) = line_column(text, span.start);
                (
                    format!("line {line}, column {column}"),
                    super::diagnose::plain_message(None, raw_message.trim()),
                )
            }
            None => (
                "toml".to_string(),
                super::diagnose::plain_message(None, raw_message.trim()),
            ),
        };
        Problem::new(key, message.trim().to_string())
    }
}

/// The error is a value of the wrong type (or shape), at the value's place.
fn is_wrong_value(e: &toml::de::Error) -> bool {
    [
        "invalid type",
        "invalid value",
        "invalid length",
        "data did not match any variant",
    ]
    .iter()
    .any(|p| e.message().starts_with(p))
}

/// Most values of the wrong type reported from one file (each costs one more read of it).
const MAX_TYPE_PROBLEMS: usize = 64;

/// The problems of a file that does not deserialize. serde stops at its first error, and
/// the unknown keys seen so far are lost with it; so while the error is a value of the
/// wrong type, that `key = value` is blanked out (spaces: every other byte keeps its
/// offset, so lines, columns and key paths stay those of the file; a wrong element takes
/// the rest of its array with it) and the file is read
/// again — until it reads, when its unknown keys are added, or an error that cannot be
/// blanked out stops the search, which is then said.
fn deserialize_problems(text: &str, first: &toml::de::Error) -> Vec<Problem> {
    let mut problems = vec![ConfigError::toml_problem(text, first)];
    let mut text = text.to_owned();
    let mut range = wrong_value_range(&text, first);
    while let Some(r) = range.take() {
        if problems.len() >= MAX_TYPE_PROBLEMS {
            break;
        }
        // A blanking that broke the file ends the search: what serde would say next could
        // be of its making.
        if !blank_whole(&mut text, r) {
            break;
        }
        match deserialize(&text) {
            Ok((_, unknown)) => {
                problems.extend(unknown.into_iter().map(|key| {
                    let message = super::diagnose::unknown_key(&key);
                    Problem::new(key, message)
                }));
                return problems;
            }
            Err(e) => {
                problems.push(ConfigError::toml_problem(&text, &e));
                range = wrong_value_range(&text, &e);
            }
        }
    }
    problems.push(Problem::new(
        "",
        "the rest of the file (unknown keys included) was not checked past the error above; \
         fix it and check again",
    ));
    problems
}

/// Reads the file into the raw structs, with the path of every key they do not take.
fn deserialize(text: &str) -> Result<(RawConfig, Vec<String>), toml::de::Error> {
    let mut unknown = Vec::new();
    let raw: RawConfig = serde_ignored::deserialize(toml::Deserializer::new(text), |path| {
        unknown.push(key_path(&path.to_string()));
    })?;
    // A combo target's table is read through an untagged enum, out of serde_ignored's
    // sight: its other keys are kept on it (`RawWeightedTarget::other`).
    for (i, c) in raw.combos.iter().enumerate() {
        for (j, t) in c.targets.iter().flatten().enumerate() {
            if let RawComboTarget::Weighted(w) = t {
                unknown.extend(
                    w.other
                        .keys()
                        .map(|k| format!("combos[{i}].targets[{j}].{k}")),
                );
            }
        }
    }
    Ok((raw, unknown))
}

/// The bytes of the `key = value` whose value has the wrong type: from the start of the
/// line its key is on (the error's line, or the nearest line above with a key, for a
/// value spread over lines) to the end of the value's last line. `None` when the error is
/// not a wrong value or has no such line (a table of the wrong type, a syntax error).
fn wrong_value_range(text: &str, e: &toml::de::Error) -> Option<std::ops::Range<usize>> {
    let span = e.span().filter(|_| is_wrong_value(e))?;
    let mut start = text.get(..span.start)?.rfind('\n').map_or(0, |i| i + 1);
    loop {
        let line = text.get(start..)?.lines().next().unwrap_or_default().trim();
        if line.starts_with('[') {
            return None;
        }
        if line.contains('=') && !line.starts_with('#') {
            break;
        }
        start = text
            .get(..start.checked_sub(1)?)?
            .rfind('\n')
            .map_or(0, |i| i + 1);
    }
    // The value's last byte (a line end is one byte, whatever the characters around it).
    let last = span.end.saturating_sub(1).max(span.start).min(text.len());
    let end = text
        .as_bytes()
        .get(last..)?
        .iter()
        .position(|b| *b == b'\n')
        .map_or(text.len(), |i| last + i);
    (start < end).then_some(start..end)
}

/// Most lines a blanking reaches past a wrong value for the rest of its array.
const MAX_BLANK_EXTENSION_LINES: usize = 64;

/// Blanks `range`, and as many of the lines after it as it takes for the file to read as
/// TOML again (an array's other elements and its closing `]`, for an element of the wrong
/// type); `false` (the file left as it was) when no such end is found.
fn blank_whole(text: &mut String, range: std::ops::Range<usize>) -> bool {
    let mut end = range.end;
    for _ in 0..=MAX_BLANK_EXTENSION_LINES {
        let mut tried = text.clone();
        blank(&mut tried, range.start..end);
        if tried.parse::<toml::Table>().is_ok() {
            *text = tried;
            return true;
        }
        // The next line, with its line end.
        let Some(next) = text
            .get(end + 1..)
            .filter(|rest| !rest.is_empty())
            .map(|rest| rest.find('\n').map_or(text.len(), |i| end + 1 + i))
        else {
            return false;
        };
        end = next;
    }
    false
}

/// Replaces every byte of `range` but line ends with a space.
fn blank(text: &mut String, range: std::ops::Range<usize>) {
    let blanked: String = text
        .get(range.clone())
        .unwrap_or_default()
        .chars()
        .flat_map(|c| {
            let n = if c == '\n' { 0 } else { c.len_utf8() };
            std::iter::repeat_n(' ', n).chain((c == '\n').then_some('\n'))
        })
        .collect();
    text.replace_range(range, &blanked);
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit_once('\n')
        .map_or(before, |(_, tail)| tail)
        .chars()
        .count()
        + 1;
    (line, column)
}

/// A valid configuration, plus the lines worth telling the operator (connections disabled
/// for want of a key, flags forced off, …).
#[derive(Clone, Debug)]
pub struct LoadOutcome {
    pub config: Config,
    pub warnings: Vec<String>,
}

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
pub const DEFAULT_STATE_DIR: &str = "./state";
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 8 * 1024 * 1024;
pub const MAX_REQUEST_BODY_BYTES_LIMIT: u64 = 1024 * 1024 * 1024;
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// LLMs think long before the first byte.
pub const DEFAULT_RESPONSE_HEADER_TIMEOUT_MS: u64 = 600_000;
pub const DEFAULT_BODY_IDLE_TIMEOUT_MS: u64 = 300_000;
/// The overall request deadline (spec B §7.3 `FETCH_TIMEOUT_MS`).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 600_000;
pub const DEFAULT_POOL_IDLE_TIMEOUT_MS: u64 = 90_000;
pub const DEFAULT_POOL_MAX_IDLE_PER_HOST: u64 = 1024;
/// `server.max_model_lockouts`: per owner shard, for the locks and apart for the failure
/// states of the model lockout table.
pub const DEFAULT_MAX_MODEL_LOCKOUTS: u64 = 10_000;
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
pub const DEFAULT_SNAPSHOT_INTERVAL_MS: u64 = 1_000;
pub const MAX_WORKERS: u64 = 1_024;
/// Longest id of a provider, connection or client key.
pub const MAX_ID_LEN: usize = 64;
/// Longest combo name, model id or egress label.
pub const MAX_NAME_LEN: usize = 256;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8787)),
            workers: 0,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            admin_token_env: None,
            admin_token: None,
            max_request_body_bytes: 8 * 1024 * 1024, // DEFAULT_MAX_REQUEST_BODY_BYTES
            header_timeout_ms: DEFAULT_HEADER_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            response_header_timeout_ms: DEFAULT_RESPONSE_HEADER_TIMEOUT_MS,
            body_idle_timeout_ms: DEFAULT_BODY_IDLE_TIMEOUT_MS,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            pool_idle_timeout_ms: DEFAULT_POOL_IDLE_TIMEOUT_MS,
            pool_max_idle_per_host: DEFAULT_POOL_MAX_IDLE_PER_HOST as usize,
            max_model_lockouts: DEFAULT_MAX_MODEL_LOCKOUTS as usize,
            shutdown_grace_ms: DEFAULT_SHUTDOWN_GRACE_MS,
            pin_threads: true,
            mesh_ring_capacity: super::DEFAULT_MESH_RING_CAPACITY,
            snapshot_interval_ms: DEFAULT_SNAPSHOT_INTERVAL_MS,
            allow_shared_listen: false,
            allow_open_gateway: false,
            log_format: super::LogFormat::Text,
            tls: None,
            cors_allow_origins: Vec::new(),
            metrics_public: false,
            lease_ttl_ms: super::DEFAULT_LEASE_TTL_MS,
        }
    }
}

/// Reads and validates a config file. Relative paths inside it (`state_dir`, `ca_file`) are
/// relative to the process's working directory, not to the file.
pub fn load_file(
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<LoadOutcome, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => load_str(&text, env),
        Err(e) => Err(ConfigError {
            problems: vec![Problem::new(
                path.display().to_string(),
                format!("cannot read the config file: {e}"),
            )],
        }),
    }
}

/// Validates config text. `env` answers environment lookups (secrets named by `*_env`
/// keys and the resilience overrides); pass `&|k| std::env::var(k).ok()` in production.
pub fn load_str(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<LoadOutcome, ConfigError> {
    let (raw, unknown) = deserialize(text).map_err(|e| ConfigError {
        problems: deserialize_problems(text, &e),
    })?;
    let mut l = Loader {
        env,
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    for key in unknown {
        let message = super::diagnose::unknown_key(&key);
        l.problem(key, message);
    }
    let config = l.config(&raw);
    if l.problems.is_empty() {
        let mut warnings = l.warnings;
        warnings.extend(super::exposure::warnings(&config, &raw, text));
        Ok(LoadOutcome { config, warnings })
    } else {
        Err(ConfigError {
            problems: l.problems,
        })
    }
}

/// `serde_ignored`'s path (`connections.1.foo`) in this module's key style (`connections[1].foo`).
fn key_path(dotted: &str) -> String {
    let mut out = String::with_capacity(dotted.len() + 4);
    for part in dotted.split('.') {
        if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
            out.push('[');
            out.push_str(part);
            out.push(']');
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(part);
        }
    }
    out
}

struct Loader<'e> {
    env: &'e dyn Fn(&str) -> Option<String>,
    problems: Vec<Problem>,
    warnings: Vec<String>,
}

impl Loader<'_> {
    fn problem(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem::new(key, message));
    }

    fn warn(&mut self, key: &str, message: impl fmt::Display) {
        self.warnings.push(format!("{key}: {message}"));
    }

    fn config(&mut self, raw: &RawConfig) -> Config {
        let server = self.server(&raw.server);
        let providers = self.providers(&raw.providers);
        let provider_ids: HashMap<&str, usize> = providers
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.as_str(), i))
            .collect();
        let connections = self.connections(&raw.connections, &providers, &provider_ids);
        let connection_ids: HashMap<&str, ConnectionId> = connections
            .iter()
            .map(|c| (c.name.as_str(), c.id))
            .collect();
        let client_keys = self.client_keys(&raw.client_keys, &connection_ids);
        let resilience = self.resilience(raw, &provider_ids);
        let combos = self.combos(raw, &providers, &provider_ids, &resilience);
        let emergency_fallback = self.emergency_fallback(raw, &providers, &provider_ids);
        for p in &providers {
            if !connections.iter().any(|c| c.provider == p.id) {
                self.warn(
                    &format!("providers[{}]", p.id.0),
                    format_args!("provider {:?} has no connection; it cannot serve", p.name),
                );
            }
            let priced = |c: &Combo| {
                c.strategy == ComboStrategy::CostOptimized
                    && c.targets.iter().any(|t| t.provider == p.id)
            };
            if !p.input_usd_per_mtok.is_empty() && !combos.iter().any(priced) {
                self.warn(
                    &format!("providers[{}].input_usd_per_mtok", p.id.0),
                    format_args!(
                        "has no effect: no cost-optimized combo has a target on provider {:?} \
                         (only cost-optimized combos read prices)",
                        p.name
                    ),
                );
            }
        }
        let mut config = Config {
            server,
            client_keys,
            providers,
            connections,
            combos,
            resilience,
            emergency_fallback,
            ids: super::ids::Slots::default(),
        };
        config.index_ids();
        config
    }

    // -- [emergency_fallback] ------------------------------------------------------------

    /// The target when one is set, unless `OMNIROUTE_EMERGENCY_FALLBACK` switches it off.
    /// The variable is checked with or without a target, as every other override is: a
    /// value that is not a boolean is a problem even before a target is written.
    fn emergency_fallback(
        &mut self,
        raw: &RawConfig,
        providers: &[Provider],
        provider_ids: &HashMap<&str, usize>,
    ) -> Option<EmergencyFallback> {
        let on = match super::env::read(self.env, EMERGENCY_FALLBACK_ENV) {
            None => true,
            Some(v) => match super::env::parse_bool(&v) {
                Ok(on) => on,
                Err(why) => {
                    self.problem(EMERGENCY_FALLBACK_ENV, why);
                    true
                }
            },
        };
        let text = raw.emergency_fallback.target.as_deref()?;
        let key = "emergency_fallback.target";
        let target = self.target(key, text, providers, provider_ids)?;
        on.then_some(EmergencyFallback {
            provider: target.provider,
            model: target.model,
        })
    }

    // -- [server] ------------------------------------------------------------------------

    fn server(&mut self, raw: &RawServer) -> ServerConfig {
        let d = ServerConfig::default();
        let listen = match &raw.listen {
            None => d.listen,
            Some(text) => match text.trim().parse::<SocketAddr>() {
                Ok(addr) => addr,
                Err(_) => {
                    self.problem(
                        "server.listen",
                        format!(
                            "{text:?} is not a socket address (expected ip:port, e.g. {DEFAULT_LISTEN})"
                        ),
                    );
                    d.listen
                }
            },
        };
        let workers = self.bounded(
            "server.workers",
            raw.workers.map(u64::from),
            0,
            0,
            MAX_WORKERS,
        );
        let state_dir = match &raw.state_dir {
            Some(dir) if dir.trim().is_empty() => {
                self.problem("server.state_dir", "must not be empty");
                d.state_dir
            }
            Some(dir) => PathBuf::from(dir),
            None => d.state_dir,
        };
        let (admin_token_env, admin_token) = match &raw.admin_token_env {
            None => (None, None),
            Some(var) => {
                let token = self.optional_secret("server.admin_token_env", var);
                (Some(var.clone()), token)
            }
        };
        // Every timeout is 1 ms ..= 1 day.
        let timeout = |l: &mut Self, key: &str, v: Option<u64>, default: u64| {
            l.bounded(key, v, default, 1, DAY_MS)
        };
        let header_timeout_ms = timeout(
            self,
            "server.header_timeout_ms",
            raw.header_timeout_ms,
            d.header_timeout_ms,
        );
        let idle_timeout_ms = timeout(
            self,
            "server.idle_timeout_ms",
            raw.idle_timeout_ms,
            d.idle_timeout_ms,
        );
        let connect_timeout_ms = timeout(
            self,
            "server.connect_timeout_ms",
            raw.connect_timeout_ms,
            d.connect_timeout_ms,
        );
        let response_header_timeout_ms = timeout(
            self,
            "server.response_header_timeout_ms",
            raw.response_header_timeout_ms,
            d.response_header_timeout_ms,
        );
        let body_idle_timeout_ms = timeout(
            self,
            "server.body_idle_timeout_ms",
            raw.body_idle_timeout_ms,
            d.body_idle_timeout_ms,
        );
        // 0 turns the overall deadline off.
        let request_timeout_ms = self.bounded(
            "server.request_timeout_ms",
            raw.request_timeout_ms,
            d.request_timeout_ms,
            0,
            DAY_MS,
        );
        let pool_idle_timeout_ms = timeout(
            self,
            "server.pool_idle_timeout_ms",
            raw.pool_idle_timeout_ms,
            d.pool_idle_timeout_ms,
        );
        ServerConfig {
            listen,
            workers: usize::try_from(workers).unwrap_or(0),
            state_dir,
            admin_token_env,
            admin_token,
            max_request_body_bytes: usize::try_from(self.bounded(
                "server.max_request_body_bytes",
                raw.max_request_body_bytes,
                DEFAULT_MAX_REQUEST_BODY_BYTES,
                1,
                MAX_REQUEST_BODY_BYTES_LIMIT,
            ))
            .unwrap_or(d.max_request_body_bytes),
            header_timeout_ms,
            idle_timeout_ms,
            connect_timeout_ms,
            response_header_timeout_ms,
            body_idle_timeout_ms,
            request_timeout_ms,
            pool_idle_timeout_ms,
            pool_max_idle_per_host: usize::try_from(self.bounded(
                "server.pool_max_idle_per_host",
                raw.pool_max_idle_per_host.map(u64::from),
                DEFAULT_POOL_MAX_IDLE_PER_HOST,
                0,
                100_000,
            ))
            .unwrap_or(d.pool_max_idle_per_host),
            max_model_lockouts: usize::try_from(self.bounded(
                "server.max_model_lockouts",
                raw.max_model_lockouts,
                d.max_model_lockouts as u64,
                1,
                1_000_000,
            ))
            .unwrap_or(d.max_model_lockouts),
            shutdown_grace_ms: self.bounded(
                "server.shutdown_grace_ms",
                raw.shutdown_grace_ms,
                d.shutdown_grace_ms,
                0,
                HOUR_MS,
            ),
            pin_threads: raw.pin_threads.unwrap_or(d.pin_threads),
            snapshot_interval_ms: self.bounded(
                "server.snapshot_interval_ms",
                raw.snapshot_interval_ms,
                d.snapshot_interval_ms,
                10,
                HOUR_MS,
            ),
            mesh_ring_capacity: self.ring_capacity(raw.mesh_ring_capacity, d.mesh_ring_capacity),
            allow_shared_listen: raw.allow_shared_listen.unwrap_or(d.allow_shared_listen),
            allow_open_gateway: raw.allow_open_gateway.unwrap_or(d.allow_open_gateway),
            metrics_public: raw.metrics_public.unwrap_or(d.metrics_public),
            lease_ttl_ms: self.bounded(
                "server.lease_ttl_ms",
                raw.lease_ttl_ms,
                d.lease_ttl_ms,
                super::MIN_LEASE_TTL_MS,
                super::MAX_LEASE_TTL_MS,
            ),
            tls: self.listener_tls(raw),
            cors_allow_origins: self.cors_origins(raw),
            log_format: match raw.log_format.as_deref() {
                None => d.log_format,
                Some("text") => super::LogFormat::Text,
                Some("json") => super::LogFormat::Json,
                Some(other) => {
                    self.problem(
                        "server.log_format",
                        format!("{other:?} is not a log format (text or json)"),
                    );
                    d.log_format
                }
            },
        }
    }

    /// `server.cors_allow_origins`: `"*"` or origins (`scheme://host[:port]`, no path).
    fn cors_origins(&mut self, raw: &RawServer) -> Vec<String> {
        let list = raw.cors_allow_origins.clone().unwrap_or_default();
        for (i, o) in list.iter().enumerate() {
            let ok = o == "*"
                || ((o.starts_with("http://") || o.starts_with("https://"))
                    && !o
                        .split_once("://")
                        .is_some_and(|(_, rest)| rest.is_empty() || rest.contains('/')));
            if !ok {
                self.problem(
                    format!("server.cors_allow_origins[{i}]"),
                    format!("{o:?} is not an origin (\"*\" or scheme://host[:port], no path)"),
                );
            }
        }
        list
    }

    /// `server.tls_cert_file` and `server.tls_key_file`: both or neither, each a file.
    fn listener_tls(&mut self, raw: &RawServer) -> Option<super::ListenerTls> {
        let mut file = |key: &str, v: &Option<String>| {
            let f = v.as_ref()?;
            if !Path::new(f).is_file() {
                self.problem(key, format!("{f:?} does not exist or is not a file"));
            }
            Some(PathBuf::from(f))
        };
        let cert = file("server.tls_cert_file", &raw.tls_cert_file);
        let key = file("server.tls_key_file", &raw.tls_key_file);
        match (cert, key) {
            (Some(cert_file), Some(key_file)) => Some(super::ListenerTls {
                cert_file,
                key_file,
            }),
            (None, None) => None,
            (Some(_), None) => {
                self.problem(
                    "server.tls_key_file",
                    "tls_cert_file is set: set its key too",
                );
                None
            }
            (None, Some(_)) => {
                self.problem(
                    "server.tls_cert_file",
                    "tls_key_file is set: set its certificate too",
                );
                None
            }
        }
    }

    /// `v` (or `default` when unset) if within `min..=max`; else a problem and the default.
    /// `server.mesh_ring_capacity`: a power of two in 2..=65536.
    fn ring_capacity(&mut self, v: Option<u64>, default: usize) -> usize {
        const KEY: &str = "server.mesh_ring_capacity";
        let max = super::MAX_MESH_RING_CAPACITY as u64;
        match v {
            None => default,
            Some(v) if !(2..=max).contains(&v) || !v.is_power_of_two() => {
                self.problem(KEY, format!("{v} is not a power of two in 2..={max}"));
                default
            }
            Some(v) => usize::try_from(v).unwrap_or(default),
        }
    }

    fn bounded(&mut self, key: &str, v: Option<u64>, default: u64, min: u64, max: u64) -> u64 {
        match v {
            None => default,
            Some(v) if v < min || v > max => {
                self.problem(key, out_of_range(v, min, max));
                default
            }
            Some(v) => v,
        }
    }

    // -- [[providers]] -------------------------------------------------------------------

    fn providers(&mut self, raw: &[RawProvider]) -> Vec<Provider> {
        if raw.len() > usize::from(u16::MAX) {
            self.problem("providers", format!("at most {} providers", u16::MAX));
        }
        let mut out: Vec<Provider> = Vec::with_capacity(raw.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, p) in raw.iter().enumerate() {
            let key = format!("providers[{i}]");
            let name = self.id(&key, "id", p.id.as_deref());
            if let Some(first) = seen.get(&name) {
                self.problem(
                    format!("{key}.id"),
                    format!("duplicate provider id {name:?} (first at providers[{first}])"),
                );
            } else if !name.is_empty() {
                seen.insert(name.clone(), i);
            }
            // `None` when missing or unknown (already a problem): skip the checks that
            // depend on it.
            let format = match p.format.as_deref() {
                None => {
                    self.problem(
                        format!("{key}.format"),
                        "missing (openai, anthropic or mock)",
                    );
                    None
                }
                Some("openai") => Some(ProviderFormat::Openai),
                Some("anthropic") => Some(ProviderFormat::Anthropic),
                Some("mock") => Some(ProviderFormat::Mock),
                Some(other) => {
                    self.problem(
                        format!("{key}.format"),
                        format!("unknown format {other:?} (expected openai, anthropic or mock)"),
                    );
                    None
                }
            };
            let auth = match p.auth.as_deref() {
                None if format == Some(ProviderFormat::Mock) => AuthKind::Local,
                None => AuthKind::ApiKey,
                Some("apikey") => AuthKind::ApiKey,
                Some("oauth") => AuthKind::OAuth,
                Some("local") => AuthKind::Local,
                Some(other) => {
                    self.problem(
                        format!("{key}.auth"),
                        format!("unknown auth {other:?} (expected apikey, oauth or local)"),
                    );
                    AuthKind::ApiKey
                }
            };
            let base_url = match (&p.base_url, format) {
                (_, None) => None,
                (Some(_), Some(ProviderFormat::Mock)) => {
                    self.problem(
                        format!("{key}.base_url"),
                        "not used by format = \"mock\" (served in-process); remove it",
                    );
                    None
                }
                (None, Some(ProviderFormat::Mock)) => None,
                (None, Some(_)) => {
                    self.problem(
                        format!("{key}.base_url"),
                        "missing (the API root including its version, e.g. https://api.openai.com/v1)",
                    );
                    None
                }
                (Some(url), Some(_)) => match parse_base_url(url) {
                    Ok(u) => Some(u),
                    Err(message) => {
                        self.problem(format!("{key}.base_url"), message);
                        None
                    }
                },
            };
            let mut models: Vec<String> = Vec::with_capacity(p.models.len());
            for (j, m) in p.models.iter().enumerate() {
                if !valid_model(m) {
                    self.problem(
                        format!("{key}.models[{j}]"),
                        format!(
                            "{m:?} is not a model id (1..={MAX_NAME_LEN} characters, no \
                             whitespace or control characters)"
                        ),
                    );
                } else if models.contains(m) {
                    self.problem(
                        format!("{key}.models[{j}]"),
                        format!("duplicate model {m:?}"),
                    );
                } else {
                    models.push(m.clone());
                }
            }
            let kind = match p.kind.as_deref() {
                None => ProviderKind::default_for_id(&name),
                Some(k) => ProviderKind::from_name(k).unwrap_or_else(|| {
                    self.problem(
                        format!("{key}.kind"),
                        format!(
                            "unknown provider kind {k:?} (known: {})",
                            ProviderKind::names()
                        ),
                    );
                    ProviderKind::Generic
                }),
            };
            let mut quirks = kind.quirks();
            // Local / self-hosted and in-process providers hold per-model limits.
            quirks.per_model_quota |=
                auth == AuthKind::Local || format == Some(ProviderFormat::Mock);
            let daily_reset = self.daily_reset(&key, p);
            let headers = self.headers(&key, &p.headers);
            let ca_file = p.ca_file.as_ref().map(|f| {
                let path = PathBuf::from(f);
                if !path.is_file() {
                    self.problem(
                        format!("{key}.ca_file"),
                        format!("{f:?} does not exist or is not a file"),
                    );
                }
                path
            });
            if p.responses_api.is_some() && format != Some(ProviderFormat::Openai) {
                self.problem(
                    format!("{key}.responses_api"),
                    "only meaningful for format = \"openai\"; remove it",
                );
            }
            let input_usd_per_mtok = self.input_prices(&key, &name, p, &models);
            out.push(Provider {
                id: ProviderId(u16::try_from(i).unwrap_or(u16::MAX)),
                name,
                quirks,
                format: format.unwrap_or(ProviderFormat::Mock),
                auth,
                base_url,
                models,
                headers,
                ca_file,
                daily_reset,
                responses_api: p.responses_api.unwrap_or(true),
                input_usd_per_mtok,
            });
        }
        out
    }

    /// `input_usd_per_mtok = { "<model>" = <USD per million input tokens> }`: each price a
    /// finite number ≥ 0 (an integer reads as one), each model a valid id and, when the
    /// provider lists `models`, one of them (a price for a model it does not serve could
    /// only be a typo, and would leave the intended model unpriced: an error). One problem
    /// per wrong entry, naming it.
    fn input_prices(
        &mut self,
        key: &str,
        provider: &str,
        p: &RawProvider,
        models: &[String],
    ) -> Vec<(String, f64)> {
        let mut out = Vec::with_capacity(p.input_usd_per_mtok.len());
        for (model, value) in &p.input_usd_per_mtok {
            let k = format!("{key}.input_usd_per_mtok.{model}");
            if !valid_model(model) {
                self.problem(
                    k,
                    format!(
                        "{model:?} is not a model id (1..={MAX_NAME_LEN} characters, no \
                         whitespace or control characters)"
                    ),
                );
                continue;
            }
            if !models.is_empty() && !models.iter().any(|m| m == model) {
                self.problem(
                    k,
                    format!("model {model:?} is not in provider {provider:?}'s models"),
                );
                continue;
            }
            let price = match value {
                toml::Value::Float(f) => *f,
                toml::Value::Integer(n) => *n as f64,
                other => {
                    self.problem(
                        k,
                        format!(
                            "expected a number (USD per million input tokens), found a {}",
                            other.type_str()
                        ),
                    );
                    continue;
                }
            };
            if !price.is_finite() || price < 0.0 {
                self.problem(
                    k,
                    format!(
                        "{price} is not a price (a finite number ≥ 0, USD per million input tokens)"
                    ),
                );
                continue;
            }
            // -0.0 reads as 0.
            out.push((model.clone(), price.max(0.0) + 0.0));
        }
        out
    }

    /// `daily_reset_hour` (0..=23) and `daily_reset_utc_offset_minutes` (-720..=840): either
    /// one configures the clock (the other defaults to 0).
    fn daily_reset(&mut self, key: &str, p: &RawProvider) -> Option<DailyResetClock> {
        if p.daily_reset_hour.is_none() && p.daily_reset_utc_offset_minutes.is_none() {
            return None;
        }
        let hour = p.daily_reset_hour.unwrap_or(0);
        let offset = p.daily_reset_utc_offset_minutes.unwrap_or(0);
        let mut ok = true;
        if !(0..=23).contains(&hour) {
            self.problem(
                format!("{key}.daily_reset_hour"),
                format!("{hour} is out of range (0..=23)"),
            );
            ok = false;
        }
        if !(-720..=840).contains(&offset) {
            self.problem(
                format!("{key}.daily_reset_utc_offset_minutes"),
                format!("{offset} is out of range (-720..=840)"),
            );
            ok = false;
        }
        ok.then(|| DailyResetClock {
            utc_offset_minutes: i16::try_from(offset).unwrap_or(0),
            hour: u8::try_from(hour).unwrap_or(0),
        })
    }

    fn headers(&mut self, key: &str, raw: &BTreeMap<String, String>) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::with_capacity(raw.len());
        for (name, value) in raw {
            let k = format!("{key}.headers.{name}");
            let lower = name.to_ascii_lowercase();
            if lower.is_empty() || !lower.bytes().all(is_tchar) {
                self.problem(
                    k,
                    "not a valid header name (RFC 9110 token characters only)",
                );
                continue;
            }
            if MANAGED_HEADERS.contains(&lower.as_str()) {
                self.problem(k, "is managed by the gateway and cannot be set");
                continue;
            }
            if value.chars().any(|c| c.is_control() && c != '\t') {
                self.problem(
                    k,
                    "value must not contain CR, LF or other control characters",
                );
                continue;
            }
            if out.iter().any(|(n, _)| *n == lower) {
                self.problem(k, "duplicate header (names are case-insensitive)");
                continue;
            }
            out.push((lower, value.trim().to_string()));
        }
        out
    }

    // -- [[connections]] -----------------------------------------------------------------

    fn connections(
        &mut self,
        raw: &[RawConnection],
        providers: &[Provider],
        provider_ids: &HashMap<&str, usize>,
    ) -> Vec<Connection> {
        let mut out: Vec<Connection> = Vec::with_capacity(raw.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, c) in raw.iter().enumerate() {
            let key = format!("connections[{i}]");
            let name = self.id(&key, "id", c.id.as_deref());
            if let Some(first) = seen.get(&name) {
                self.problem(
                    format!("{key}.id"),
                    format!("duplicate connection id {name:?} (first at connections[{first}])"),
                );
            } else if !name.is_empty() {
                seen.insert(name.clone(), i);
            }
            let provider = match c.provider.as_deref() {
                None => {
                    self.problem(format!("{key}.provider"), "missing (a provider id)");
                    None
                }
                Some(p) => match provider_ids.get(p) {
                    Some(&idx) => providers.get(idx),
                    None => {
                        self.problem(format!("{key}.provider"), format!("unknown provider {p:?}"));
                        None
                    }
                },
            };
            let (api_key, enabled) = match &c.api_key_env {
                Some(var) => {
                    let secret = self.optional_secret(&format!("{key}.api_key_env"), var);
                    if secret.is_none() && valid_env_name(var) {
                        self.warn(
                            &format!("{key}.api_key_env"),
                            format_args!("{var} is not set; connection {name:?} is disabled"),
                        );
                    }
                    let enabled = secret.is_some();
                    (secret, enabled)
                }
                None => {
                    if let Some(p) = provider
                        && p.auth != AuthKind::Local
                    {
                        self.warn(
                            &key,
                            format_args!(
                                "connection {name:?} has no api_key_env; requests to {:?} go \
                                 out without credentials",
                                p.name
                            ),
                        );
                    }
                    (None, true)
                }
            };
            let weight = self.bounded(
                &format!("{key}.weight"),
                c.weight.map(u64::from),
                1,
                1,
                1_000_000,
            );
            let max_concurrent = c.max_concurrent.map(|v| {
                self.bounded(
                    &format!("{key}.max_concurrent"),
                    Some(u64::from(v)),
                    1,
                    1,
                    100_000,
                )
            });
            let egress = c.egress.as_ref().map(|e| {
                if !valid_label(e) {
                    self.problem(
                        format!("{key}.egress"),
                        format!(
                            "{e:?} is not a label (1..={MAX_NAME_LEN} characters, no control \
                             characters)"
                        ),
                    );
                }
                e.clone()
            });
            let rate_limit_overrides = self.overrides(&key, c, provider);
            out.push(Connection {
                id: ConnectionId(u32::try_from(i).unwrap_or(u32::MAX)),
                name,
                provider: provider.map_or(ProviderId(0), |p| p.id),
                api_key_env: c.api_key_env.clone(),
                api_key,
                enabled,
                priority: c.priority.unwrap_or(1),
                weight: narrow_u32(weight),
                max_concurrent: max_concurrent.map(narrow_u32),
                disable_cooling: c.disable_cooling.unwrap_or(false),
                egress,
                rate_limit_overrides,
            });
        }
        out
    }

    fn overrides(
        &mut self,
        key: &str,
        c: &RawConnection,
        provider: Option<&Provider>,
    ) -> RateLimitOverrides {
        let o = &c.rate_limit_overrides;
        let key = format!("{key}.rate_limit_overrides");
        let check = |l: &mut Self, name: &str, v: Option<u64>, min: u64, max: u64| {
            v.map(|v| l.bounded(&format!("{key}.{name}"), Some(v), min, min, max))
        };
        let max_concurrent = check(
            self,
            "max_concurrent",
            o.max_concurrent.map(u64::from),
            1,
            100_000,
        );
        let max_wait_ms = check(self, "max_wait_ms", o.max_wait_ms, 1, 120_000);
        let execution_max_wait_ms = check(
            self,
            "execution_max_wait_ms",
            o.execution_max_wait_ms,
            1,
            600_000,
        );
        let requests_per_minute = check(
            self,
            "requests_per_minute",
            o.requests_per_minute.map(u64::from),
            1,
            1_000_000,
        );
        let min_time_between_requests_ms = check(
            self,
            "min_time_between_requests_ms",
            o.min_time_between_requests_ms,
            0,
            HOUR_MS,
        );
        let mut model_concurrency = Vec::with_capacity(o.model_concurrency.len());
        for (model, &cap) in &o.model_concurrency {
            let k = format!("{key}.model_concurrency.{model}");
            if model.is_empty() || model.chars().count() > 128 {
                self.problem(k, "model id must be 1..=128 characters");
                continue;
            }
            if !(1..=10_000).contains(&cap) {
                self.problem(k, out_of_range(u64::from(cap), 1, 10_000));
                continue;
            }
            if let Some(p) = provider
                && !p.models.is_empty()
                && !p.models.contains(model)
            {
                self.warn(
                    &k,
                    format_args!("model {model:?} is not in provider {:?}'s models", p.name),
                );
            }
            model_concurrency.push((model.clone(), cap));
        }
        RateLimitOverrides {
            max_concurrent: max_concurrent.map(narrow_u32),
            model_concurrency,
            max_wait_ms,
            execution_max_wait_ms,
            requests_per_minute: requests_per_minute.map(narrow_u32),
            min_time_between_requests_ms,
        }
    }

    // -- [[client_keys]] -----------------------------------------------------------------

    fn client_keys(
        &mut self,
        raw: &[RawClientKey],
        connection_ids: &HashMap<&str, ConnectionId>,
    ) -> Vec<ClientKey> {
        let mut out: Vec<ClientKey> = Vec::with_capacity(raw.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut digests: HashMap<[u8; 32], usize> = HashMap::new();
        for (i, k) in raw.iter().enumerate() {
            let key = format!("client_keys[{i}]");
            let id = self.id(&key, "id", k.id.as_deref());
            if let Some(first) = seen.get(&id) {
                self.problem(
                    format!("{key}.id"),
                    format!("duplicate client key id {id:?} (first at client_keys[{first}])"),
                );
            } else if !id.is_empty() {
                seen.insert(id.clone(), i);
            }
            let secret = self.key_secret(&key, k);
            if let Some(secret) = &secret {
                let digest = match secret {
                    KeySecret::Plain(s) => Sha256::digest(s.as_bytes()).into(),
                    KeySecret::Sha256(d) => *d,
                };
                if let Some(first) = digests.get(&digest) {
                    self.problem(
                        key.clone(),
                        format!("same secret as client_keys[{first}]; every key must be unique"),
                    );
                } else {
                    digests.insert(digest, i);
                }
            }
            let mut scopes: Vec<Scope> = Vec::new();
            for (j, s) in k.scopes.iter().flatten().enumerate() {
                let scope = match s.as_str() {
                    "inference" => Scope::Inference,
                    "manage" => Scope::Manage,
                    "lease:exclusive" => Scope::LeaseExclusive,
                    other => {
                        self.problem(
                            format!("{key}.scopes[{j}]"),
                            format!(
                                "unknown scope {other:?} (expected inference, manage or \
                                 lease:exclusive)"
                            ),
                        );
                        continue;
                    }
                };
                if !scopes.contains(&scope) {
                    scopes.push(scope);
                }
            }
            if k.scopes.as_ref().is_none_or(Vec::is_empty) {
                scopes.push(Scope::Inference);
            }
            let allowed_connections = k.allowed_connections.as_ref().map(|names| {
                let mut ids = Vec::with_capacity(names.len());
                for (j, n) in names.iter().enumerate() {
                    match connection_ids.get(n.as_str()) {
                        Some(&c) if !ids.contains(&c) => ids.push(c),
                        Some(_) => {}
                        None => self.problem(
                            format!("{key}.allowed_connections[{j}]"),
                            format!("unknown connection {n:?}"),
                        ),
                    }
                }
                ids
            });
            if scopes.contains(&Scope::LeaseExclusive)
                && allowed_connections.as_ref().is_none_or(Vec::is_empty)
            {
                self.warn(
                    &key,
                    "scope lease:exclusive without allowed_connections: this key can acquire \
                     no lease (403 LEASE_KEY_CONFIGURATION_INVALID), so its inference \
                     requests, which need one, are refused",
                );
            }
            // A lease is used by its own key's inference requests only (another key's get
            // LEASE_AUTHORIZATION_MISMATCH): without `inference` its leases serve nothing.
            if scopes.contains(&Scope::LeaseExclusive) && !scopes.contains(&Scope::Inference) {
                self.warn(
                    &key,
                    "scope lease:exclusive without inference: this key's inference requests \
                     are refused (403), and only they can use its leases, so a lease it \
                     acquires only holds a connection from other owners",
                );
            }
            out.push(ClientKey {
                id,
                secret: secret.unwrap_or(KeySecret::Plain(String::new())),
                scopes,
                allowed_connections,
            });
        }
        out
    }

    fn key_secret(&mut self, key: &str, k: &RawClientKey) -> Option<KeySecret> {
        let given: Vec<&str> = [
            ("key", k.key.is_some()),
            ("key_env", k.key_env.is_some()),
            ("key_sha256", k.key_sha256.is_some()),
        ]
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect();
        if given.len() != 1 {
            let message = if given.is_empty() {
                "needs exactly one of key, key_env or key_sha256".to_string()
            } else {
                format!(
                    "set exactly one of key, key_env or key_sha256 (found {})",
                    given.join(", ")
                )
            };
            self.problem(key, message);
            return None;
        }
        if let Some(plain) = &k.key {
            if plain.trim().is_empty() {
                self.problem(format!("{key}.key"), "must not be empty");
                return None;
            }
            return Some(KeySecret::Plain(plain.clone()));
        }
        if let Some(var) = &k.key_env {
            let k_env = format!("{key}.key_env");
            let secret = self.optional_secret(&k_env, var);
            if secret.is_none() && valid_env_name(var) {
                self.problem(k_env, format!("environment variable {var} is not set"));
            }
            return secret.map(KeySecret::Plain);
        }
        let hexed = k.key_sha256.as_deref().unwrap_or_default();
        let mut digest = [0u8; 32];
        if hexed.len() == 64 && hex::decode_to_slice(hexed, &mut digest).is_ok() {
            Some(KeySecret::Sha256(digest))
        } else {
            self.problem(
                format!("{key}.key_sha256"),
                "must be 64 hex characters (the SHA-256 of the key)",
            );
            None
        }
    }

    // -- [[combos]] ----------------------------------------------------------------------

    fn combos(
        &mut self,
        raw: &RawConfig,
        providers: &[Provider],
        provider_ids: &HashMap<&str, usize>,
        resilience: &ResilienceSettings,
    ) -> Vec<Combo> {
        let mut out: Vec<Combo> = Vec::with_capacity(raw.combos.len());
        let mut steps: Vec<Vec<Step>> = Vec::with_capacity(raw.combos.len());
        let mut layers: Vec<ComboLayer> = Vec::with_capacity(raw.combos.len());
        let mut seen: HashMap<String, usize> = HashMap::new();
        // Weights written on targets and combo references: (combo, key).
        let mut written_weights: Vec<(usize, String)> = Vec::new();
        for (i, c) in raw.combos.iter().enumerate() {
            let key = format!("combos[{i}]");
            let name = match c.name.as_deref() {
                None => {
                    self.problem(format!("{key}.name"), "missing");
                    String::new()
                }
                Some(n) if !valid_combo_name(n) => {
                    self.problem(
                        format!("{key}.name"),
                        format!(
                            "{n:?} is not a combo name (1..={MAX_NAME_LEN} of A-Z a-z 0-9 . _ - : /)"
                        ),
                    );
                    n.to_string()
                }
                Some(n) => n.to_string(),
            };
            if let Some(first) = seen.get(&name) {
                self.problem(
                    format!("{key}.name"),
                    format!("duplicate combo name {name:?} (first at combos[{first}])"),
                );
            } else if !name.is_empty() {
                seen.insert(name.clone(), i);
            }
            if let Some((prefix, _)) = name.split_once('/')
                && provider_ids.contains_key(prefix)
            {
                self.problem(
                    format!("{key}.name"),
                    format!("{name:?} collides with provider/model routing of provider {prefix:?}"),
                );
            }
            if let Some(p) = providers.iter().find(|p| p.models.contains(&name)) {
                self.warn(
                    &format!("{key}.name"),
                    format_args!(
                        "combo {name:?} shadows the model of the same name in provider {:?}",
                        p.name
                    ),
                );
            }
            // `combo/<name>` names the combo (B §3.1) before provider/model routing.
            if providers
                .iter()
                .any(|p| p.name == "combo" && p.models.contains(&name))
            {
                self.warn(
                    &format!("{key}.name"),
                    format_args!(
                        "\"combo/{name}\" names combo {name:?}, not provider \"combo\"'s model                          of that name"
                    ),
                );
            }
            let strategy = match c.strategy.as_deref() {
                None => ComboStrategy::Priority,
                Some(s) => match parse_strategy(s) {
                    Ok(strategy) => {
                        if let Some(why) = strategy_order_not_built(strategy) {
                            self.warn(
                                &format!("{key}.strategy"),
                                format_args!(
                                    "{s:?} {why}: combo {:?} runs its targets in the order \
                                     written",
                                    name
                                ),
                            );
                        }
                        strategy
                    }
                    Err(message) => {
                        self.problem(format!("{key}.strategy"), message);
                        ComboStrategy::Priority
                    }
                },
            };
            // A sticky limit the combo's own strategy does not read (one in
            // `[combo_defaults]` or a provider override is for the combos that do).
            let sticky = [
                (
                    c.config.sticky_round_robin_limit,
                    "sticky_round_robin_limit",
                    ComboStrategy::RoundRobin,
                    "round-robin",
                ),
                (
                    c.config.sticky_weighted_limit,
                    "sticky_weighted_limit",
                    ComboStrategy::Weighted,
                    "weighted",
                ),
            ];
            for (value, field, reader, reader_name) in sticky {
                if value.is_some() && strategy != reader {
                    self.warn(
                        &format!("{key}.config.{field}"),
                        format_args!(
                            "has no effect: combo {name:?} is not {reader_name} (only a \
                             {reader_name} combo reads it)"
                        ),
                    );
                }
            }
            let mut own = Vec::new();
            match &c.targets {
                None => self.problem(
                    format!("{key}.targets"),
                    "missing (a list of \"provider/model\")",
                ),
                Some(list) if list.is_empty() => {
                    self.problem(format!("{key}.targets"), "must list at least one target");
                }
                Some(list) => {
                    for (j, t) in list.iter().enumerate() {
                        let tkey = format!("{key}.targets[{j}]");
                        let (model, combo, weight) = match t {
                            RawComboTarget::Plain(m) => (Some(m), None, None),
                            RawComboTarget::Weighted(w) => {
                                (w.model.as_ref(), w.combo.as_ref(), w.weight)
                            }
                        };
                        let weight = narrow_u32(self.bounded(
                            &format!("{tkey}.weight"),
                            weight.map(u64::from),
                            1,
                            0,
                            1_000_000,
                        ));
                        match (model, combo) {
                            (Some(model), None) => {
                                if matches!(t, RawComboTarget::Weighted(w) if w.weight.is_some()) {
                                    written_weights.push((i, format!("{tkey}.weight")));
                                }
                                if let Some(t) = self.target(&tkey, model, providers, provider_ids)
                                {
                                    own.push(Step::Model(ComboTarget { weight, ..t }));
                                }
                            }
                            (None, Some(combo)) => {
                                if matches!(t, RawComboTarget::Weighted(w) if w.weight.is_some()) {
                                    written_weights.push((i, format!("{tkey}.weight")));
                                }
                                own.push(Step::Combo {
                                    key: tkey,
                                    name: combo.clone(),
                                    weight,
                                });
                            }
                            _ => self.problem(
                                tkey,
                                "must set exactly one of model = \"provider/model\" and \
                                 combo = \"<combo name>\"",
                            ),
                        }
                    }
                }
            }
            layers.push(ComboLayer::check(
                &format!("{key}.config"),
                &c.config,
                &mut self.problems,
            ));
            steps.push(own);
            out.push(Combo {
                id: ComboId(u16::try_from(i).unwrap_or(u16::MAX)),
                name,
                strategy,
                targets: Vec::new(),
                settings: ComboSettings::default(),
            });
        }
        let defaults = ComboLayer::check("combo_defaults", &raw.combo_defaults, &mut self.problems);
        let mut by_provider: HashMap<&str, ComboLayer> = HashMap::new();
        for (p, layer) in &raw.combo_provider_overrides {
            let key = format!("combo_provider_overrides.{p}");
            if !provider_ids.contains_key(p.as_str()) {
                self.problem(key.clone(), format!("unknown provider {p:?}"));
            }
            by_provider.insert(
                p.as_str(),
                ComboLayer::check(&key, layer, &mut self.problems),
            );
        }
        let wait = &resilience.combo_cooldown_wait;
        let wait_budget = wait.enabled.then_some(wait.budget_ms);
        for i in 0..out.len() {
            let mut stack = Vec::new();
            let (targets, depth) = match flatten(i, &out, &steps, &mut stack) {
                Ok(flat) => flat,
                Err(message) => {
                    self.problem(format!("combos[{i}].targets"), message);
                    (Vec::new(), 0)
                }
            };
            let provider_layer = targets
                .first()
                .and_then(|t| providers.get(usize::from(t.provider.0)))
                .and_then(|p| by_provider.get(p.name.as_str()));
            let mut cascade: Vec<&ComboLayer> = vec![&defaults];
            cascade.extend(provider_layer);
            cascade.push(&layers[i]);
            let settings = combo::cascade(&cascade, wait_budget);
            if depth > settings.max_combo_depth as usize {
                self.problem(
                    format!("combos[{i}].targets"),
                    format!(
                        "combo {:?} nests {depth} levels deep; max_combo_depth is {}",
                        out[i].name, settings.max_combo_depth
                    ),
                );
            }
            if out[i].strategy == ComboStrategy::CostOptimized
                && !targets.is_empty()
                && targets.iter().all(|t| t.input_usd_per_mtok.is_none())
            {
                self.warn(
                    &format!("combos[{i}].strategy"),
                    format_args!(
                        "\"cost-optimized\" has no price for any target of combo {:?} (set \
                         input_usd_per_mtok on their providers): it runs its targets in the \
                         order written",
                        out[i].name
                    ),
                );
            }
            out[i].targets = targets;
            out[i].settings = settings;
        }
        // A target's weight, or a reference's (which shapes the shares of the referred
        // targets), is read only by the quota-share and weighted orderings. Said once per
        // weight written in a combo that no such combo reaches (itself or by nesting it).
        let shared = reached_by_weight_readers(&out, &steps);
        for (i, key) in written_weights {
            if !shared.contains(&i) {
                self.warn(
                    &key,
                    format_args!(
                        "has no effect: combo {:?} does not read weights and no quota-share \
                         or weighted combo nests it (only those read weights)",
                        out[i].name
                    ),
                );
            }
        }
        out
    }

    fn target(
        &mut self,
        key: &str,
        text: &str,
        providers: &[Provider],
        provider_ids: &HashMap<&str, usize>,
    ) -> Option<ComboTarget> {
        let Some((provider, model)) = text.split_once('/') else {
            self.problem(key, format!("{text:?} must be \"provider/model\""));
            return None;
        };
        if model.is_empty() || !valid_model(model) {
            self.problem(
                key,
                format!("{text:?} has no valid model after the provider"),
            );
            return None;
        }
        let Some(p) = provider_ids.get(provider).and_then(|&i| providers.get(i)) else {
            self.problem(key, format!("unknown provider {provider:?}"));
            return None;
        };
        if !p.models.is_empty() && !p.models.iter().any(|m| m == model) {
            self.problem(
                key,
                format!("model {model:?} is not in provider {provider:?}'s models"),
            );
            return None;
        }
        Some(ComboTarget {
            provider: p.id,
            model: model.to_string(),
            weight: 1,
            input_usd_per_mtok: p
                .input_usd_per_mtok
                .iter()
                .find(|(m, _)| m == model)
                .map(|&(_, price)| price),
        })
    }

    // -- [resilience] --------------------------------------------------------------------

    fn resilience(
        &mut self,
        raw: &RawConfig,
        provider_ids: &HashMap<&str, usize>,
    ) -> ResilienceSettings {
        let s = resilience::build(
            &raw.resilience,
            self.env,
            &mut self.problems,
            &mut self.warnings,
        );
        let lower: Vec<String> = provider_ids
            .keys()
            .map(|p| p.to_ascii_lowercase())
            .collect();
        for p in s.provider_quota_overrides.keys() {
            if !provider_ids.contains_key(p.as_str()) {
                self.problem(
                    format!("resilience.provider_quota_overrides.{p}"),
                    format!("unknown provider {p:?}"),
                );
            }
        }
        for p in s.quota_preflight.provider_window_defaults.keys() {
            if !provider_ids.contains_key(p.as_str()) {
                self.problem(
                    format!("resilience.quota_preflight.provider_window_defaults.{p}"),
                    format!("unknown provider {p:?}"),
                );
            }
        }
        for p in raw.resilience.provider_error_rules.keys() {
            if !lower.contains(&p.trim().to_ascii_lowercase()) {
                self.problem(
                    format!("resilience.provider_error_rules.{p}"),
                    format!("unknown provider {p:?}"),
                );
            }
        }
        s
    }

    // -- shared --------------------------------------------------------------------------

    /// A required id: present and made of `A-Z a-z 0-9 . _ -`.
    fn id(&mut self, key: &str, field: &str, v: Option<&str>) -> String {
        match v {
            None => {
                self.problem(format!("{key}.{field}"), "missing");
                String::new()
            }
            Some(id) if !valid_id(id) => {
                self.problem(
                    format!("{key}.{field}"),
                    format!("{id:?} is not an id (1..={MAX_ID_LEN} of A-Z a-z 0-9 . _ -)"),
                );
                id.to_string()
            }
            Some(id) => id.to_string(),
        }
    }

    /// The trimmed value of env variable `var` (named at `key`), `None` when unset or empty.
    fn optional_secret(&mut self, key: &str, var: &str) -> Option<String> {
        if !valid_env_name(var) {
            self.problem(
                key,
                format!("{var:?} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"),
            );
            return None;
        }
        super::env::read(self.env, var)
    }
}

/// Headers the gateway owns: framing and hop-by-hop headers.
const MANAGED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
];

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn valid_combo_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/'))
}

fn valid_model(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() <= MAX_NAME_LEN
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn valid_label(s: &str) -> bool {
    !s.trim().is_empty() && s.chars().count() <= MAX_NAME_LEN && !s.chars().any(char::is_control)
}

fn valid_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// One written target of a combo: a model, or a reference to another combo.
enum Step {
    Model(ComboTarget),
    /// `weight`: the share of the referring combo's weight the nested combo's targets
    /// split between them (in proportion to their own weights).
    Combo {
        key: String,
        name: String,
        weight: u32,
    },
}

/// The largest weight a flattened combo with a nested reference is scaled to (its
/// shares become integers; the quota-share ordering multiplies them by connection weights).
const FLAT_WEIGHT_SCALE: f64 = 10_000.0;

/// The most nesting `flatten` follows before calling it a problem.
const FLATTEN_LIMIT: usize = 10;

/// Combo `i`'s targets with every combo reference replaced by that combo's targets, in
/// order (a target already listed earlier is not repeated: it gets the later share too),
/// and how deep the references nest (1 = no reference). A cycle or an unknown combo name
/// is an error. Weights: a reference `{ combo, weight = w }` is one step of weight `w`, so
/// its targets split `w` in proportion to their own weights (a weight of 0 counts as 1,
/// as in the quota-share ordering); when any reference is flattened, the shares are
/// scaled so the largest is 10 000 (rounded, at least 1).
fn flatten(
    i: usize,
    combos: &[Combo],
    steps: &[Vec<Step>],
    stack: &mut Vec<usize>,
) -> Result<(Vec<ComboTarget>, usize), String> {
    let (flat, depth) = flatten_shares(i, combos, steps, stack)?;
    if depth == 1 {
        return Ok((flat.into_iter().map(|(t, _)| t).collect(), depth));
    }
    let max = flat.iter().map(|(_, w)| *w).fold(0.0_f64, f64::max);
    let scaled = flat
        .into_iter()
        .map(|(t, w)| {
            let weight = if max > 0.0 {
                // In 1..=10 000 by construction: the cast cannot truncate.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let w = (w / max * FLAT_WEIGHT_SCALE).round().max(1.0) as u32;
                w
            } else {
                1
            };
            ComboTarget { weight, ..t }
        })
        .collect();
    Ok((scaled, depth))
}

/// The combos whose targets' weights some quota-share or weighted combo reads: every such
/// combo and every combo it nests, at any depth.
fn reached_by_weight_readers(combos: &[Combo], steps: &[Vec<Step>]) -> Vec<usize> {
    let mut reached: Vec<usize> = Vec::new();
    let mut todo: Vec<usize> = (0..combos.len())
        .filter(|&i| {
            matches!(
                combos[i].strategy,
                ComboStrategy::QuotaShare | ComboStrategy::Weighted
            )
        })
        .collect();
    while let Some(i) = todo.pop() {
        if reached.contains(&i) {
            continue;
        }
        reached.push(i);
        for step in steps.get(i).into_iter().flatten() {
            if let Step::Combo { name, .. } = step
                && let Some(j) = combos.iter().position(|c| &c.name == name)
            {
                todo.push(j);
            }
        }
    }
    reached
}

fn effective_weight(w: u32) -> f64 {
    f64::from(w.max(1))
}

fn flatten_shares(
    i: usize,
    combos: &[Combo],
    steps: &[Vec<Step>],
    stack: &mut Vec<usize>,
) -> Result<(Vec<(ComboTarget, f64)>, usize), String> {
    if stack.contains(&i) || stack.len() >= FLATTEN_LIMIT {
        let mut path: Vec<&str> = stack.iter().map(|s| combos[*s].name.as_str()).collect();
        path.push(&combos[i].name);
        return Err(format!(
            "combo references form a cycle or nest past {FLATTEN_LIMIT}: {}",
            path.join(" -> ")
        ));
    }
    stack.push(i);
    let mut out: Vec<(ComboTarget, f64)> = Vec::new();
    let mut depth = 1;
    for step in &steps[i] {
        let add: Vec<(ComboTarget, f64)> = match step {
            Step::Model(t) => vec![(t.clone(), effective_weight(t.weight))],
            Step::Combo { key, name, weight } => {
                let Some(j) = combos.iter().position(|c| &c.name == name) else {
                    stack.pop();
                    return Err(format!("{key}: no combo named {name:?}"));
                };
                let (inner, d) = flatten_shares(j, combos, steps, stack).inspect_err(|_| {
                    stack.pop();
                })?;
                depth = depth.max(d + 1);
                let total: f64 = inner.iter().map(|(_, w)| *w).sum();
                let share = effective_weight(*weight);
                inner
                    .into_iter()
                    .map(|(t, w)| (t, share * w / total))
                    .collect()
            }
        };
        for (t, w) in add {
            match out
                .iter_mut()
                .find(|(o, _)| o.provider == t.provider && o.model == t.model)
            {
                Some((_, have)) => *have += w,
                None => out.push((t, w)),
            }
        }
    }
    stack.pop();
    Ok((out, depth))
}

fn narrow_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Spec strategy names (B §3.2) → [`ComboStrategy`].
fn parse_strategy(s: &str) -> Result<ComboStrategy, String> {
    Ok(match s {
        "priority" => ComboStrategy::Priority,
        "weighted" => ComboStrategy::Weighted,
        "round-robin" => ComboStrategy::RoundRobin,
        "random" => ComboStrategy::Random,
        "least-used" => ComboStrategy::LeastUsed,
        "cost-optimized" => ComboStrategy::CostOptimized,
        "strict-random" => ComboStrategy::StrictRandom,
        "auto" => ComboStrategy::Auto,
        "fill-first" => ComboStrategy::Fill,
        "quota-share" => ComboStrategy::QuotaShare,
        "lkgp" => ComboStrategy::Lkgp,
        "p2c" => ComboStrategy::P2c,
        "context-relay" | "reset-aware" | "reset-window" | "headroom" | "context-optimized"
        | "cache-optimized" | "fusion" | "pipeline" | "quota-weighted" | "expiry-first" => {
            return Err(format!(
                "strategy {s:?} is not supported by Tidegate (supported: {SUPPORTED_STRATEGIES})"
            ));
        }
        _ => {
            return Err(format!(
                "unknown strategy {s:?} (expected one of {SUPPORTED_STRATEGIES})"
            ));
        }
    })
}

/// What a strategy whose own ordering is not built yet lacks (`None`: it is built).
/// `priority` is the written order; `quota-share` orders every dispatch at its home; the
/// others are ordered per shard (`routing::strategy`).
fn strategy_order_not_built(s: ComboStrategy) -> Option<&'static str> {
    match s {
        ComboStrategy::Priority
        | ComboStrategy::QuotaShare
        | ComboStrategy::RoundRobin
        | ComboStrategy::Weighted
        | ComboStrategy::Fill
        | ComboStrategy::Random
        | ComboStrategy::StrictRandom
        | ComboStrategy::LeastUsed
        | ComboStrategy::Lkgp
        | ComboStrategy::P2c
        | ComboStrategy::CostOptimized => None,
        ComboStrategy::Auto => Some("is accepted, but its ordering is not built yet"),
    }
}

const SUPPORTED_STRATEGIES: &str = "priority, weighted, round-robin, random, least-used, \
                                    cost-optimized, strict-random, auto, fill-first, quota-share, \
                                    lkgp, p2c";

/// `http(s)://host[:port][/path]`: no credentials, query or fragment; host lower-cased
/// (an IPv6 literal keeps its brackets, so `host:port` is a valid authority and socket
/// address); default port 80/443; path without trailing slash.
fn parse_base_url(s: &str) -> Result<BaseUrl, String> {
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{s:?} must not contain whitespace or control characters"
        ));
    }
    let (scheme, rest) = match s.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (Scheme::Https, rest),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (Scheme::Http, rest),
        _ => return Err(format!("{s:?} must start with http:// or https://")),
    };
    if rest.contains(['?', '#']) {
        return Err(format!("{s:?} must not have a query or fragment"));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(format!(
            "{s:?} must not carry credentials; use api_key_env or headers"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err(format!("{s:?} has an unterminated IPv6 literal"));
        };
        if addr.parse::<Ipv6Addr>().is_err() {
            return Err(format!("{s:?} has an invalid IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err(format!("{s:?} has junk after the IPv6 address")),
            },
        };
        (format!("[{}]", addr.to_ascii_lowercase()), port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h.to_ascii_lowercase(), Some(p)),
            None => (authority.to_ascii_lowercase(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("{s:?} has no host"));
    }
    if !host.starts_with('[')
        && !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err(format!("{s:?} has an invalid host {host:?}"));
    }
    let port = match port {
        None => match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        },
        // Canonical decimal only, so `:0443` and `:+443` are refused.
        Some(text) => match text.parse::<u16>() {
            Ok(n) if n > 0 && n.to_string() == text => n,
            _ => return Err(format!("{s:?} has an invalid port {text:?}")),
        },
    };
    Ok(BaseUrl {
        scheme,
        host,
        port,
        path: path.trim_end_matches('/').to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn load(text: &str) -> Result<LoadOutcome, ConfigError> {
        load_str(text, &no_env)
    }

    fn problem_keys(text: &str) -> Vec<String> {
        match load(text) {
            Ok(_) => panic!("loaded:\n{text}"),
            Err(e) => e.problems.into_iter().map(|p| p.key).collect(),
        }
    }

    #[test]
    fn wrong_values_spread_over_lines_or_sharing_one_are_set_aside_whole() {
        // A multi-line array and an inline table: each blanked whole, the rest read on.
        let text = "[server]\ncors_allow_origins = [\n  \"a\",\n  3,\n]\nbogus = 1\n\n\
                    [[providers]]\nid = \"m\"\nformat = \"mock\"\nheaders = { a = 1 }\n";
        assert_eq!(
            problem_keys(text),
            [
                "server.cors_allow_origins",
                "providers[0].headers",
                "server.bogus"
            ]
        );
        // Blanking keeps every offset: the second error's position is the file's.
        let e = load("[server]\nworkers = \"x\"\n\n\nlisten = 1\n").unwrap_err();
        assert!(
            e.problems[1].message.ends_with("(line 5, column 10)"),
            "{e}"
        );
        // A table where an array of tables belongs: no `key = value` to blank (its
        // position names it); what was not checked is said.
        let keys = problem_keys("server = 3\n[providers]\nbogus = 1\n");
        assert_eq!(keys, ["server", "line 2, column 1", ""]);
    }

    fn load_env(text: &str, vars: &[(&str, &str)]) -> Result<LoadOutcome, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        load_str(text, &move |k: &str| map.get(k).cloned())
    }

    fn problems(text: &str) -> Vec<String> {
        match load(text) {
            Ok(_) => panic!("expected problems"),
            Err(e) => e.problems.iter().map(ToString::to_string).collect(),
        }
    }

    fn keys(text: &str) -> Vec<String> {
        match load(text) {
            Ok(_) => panic!("expected problems"),
            Err(e) => e.problems.into_iter().map(|p| p.key).collect(),
        }
    }

    const BASE: &str = r#"
        [[providers]]
        id = "openai"
        format = "openai"
        base_url = "https://api.openai.com/v1/"
        models = ["gpt-4.1", "gpt-4.1-mini"]
        headers = { "OpenAI-Organization" = "org-1" }

        [[providers]]
        id = "mock"
        format = "mock"

        [[connections]]
        id = "openai-a"
        provider = "openai"
        api_key_env = "OPENAI_API_KEY"

        [[connections]]
        id = "mock-a"
        provider = "mock"
        priority = 2
        weight = 3
        egress = "office"
        [connections.rate_limit_overrides]
        max_concurrent = 2
        model_concurrency = { "echo" = 1 }
        max_wait_ms = 5000

        [[client_keys]]
        id = "dev"
        key = "secret-dev-key"
        scopes = ["inference", "manage"]
        allowed_connections = ["mock-a"]

        [[combos]]
        name = "fast"
        strategy = "weighted"
        targets = ["openai/gpt-4.1-mini", { model = "mock/echo", weight = 2 }]
    "#;

    #[test]
    fn an_empty_file_is_valid_with_defaults() {
        let out = load("").unwrap();
        let s = &out.config.server;
        assert_eq!(s.listen, "127.0.0.1:8787".parse::<SocketAddr>().unwrap());
        assert_eq!(s.workers, 0);
        assert_eq!(s.state_dir, PathBuf::from("./state"));
        assert_eq!(s.max_request_body_bytes, 8 * 1024 * 1024);
        assert_eq!(
            (
                s.header_timeout_ms,
                s.idle_timeout_ms,
                s.connect_timeout_ms,
                s.response_header_timeout_ms,
                s.body_idle_timeout_ms,
                s.pool_idle_timeout_ms
            ),
            (10_000, 60_000, 10_000, 600_000, 300_000, 90_000)
        );
        assert_eq!(s.pool_max_idle_per_host, 1024);
        assert_eq!(
            (s.shutdown_grace_ms, s.snapshot_interval_ms),
            (10_000, 1_000)
        );
        assert_eq!(s.mesh_ring_capacity, 1024);
        assert_eq!(out.config.resilience, ResilienceSettings::default());
        assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
        assert!(out.warnings[0].starts_with("config: the file is empty"));
    }

    #[test]
    fn mesh_ring_capacity_is_a_power_of_two_in_range() {
        let cap = |v: u64| load(&format!("[server]\nmesh_ring_capacity = {v}\n"));
        assert_eq!(cap(2).unwrap().config.server.mesh_ring_capacity, 2);
        assert_eq!(
            cap(65_536).unwrap().config.server.mesh_ring_capacity,
            65_536
        );
        for bad in [0, 1, 3, 1000, 131_072] {
            assert_eq!(
                problems(&format!("[server]\nmesh_ring_capacity = {bad}\n")),
                vec![format!(
                    "server.mesh_ring_capacity: {bad} is not a power of two in 2..=65536"
                )],
            );
        }
    }

    #[test]
    fn a_full_file_converts_to_typed_config() {
        let out = load_env(BASE, &[("OPENAI_API_KEY", " sk-test\n")]).unwrap();
        let c = &out.config;
        assert_eq!(c.providers.len(), 2);
        let openai = c.provider(ProviderId(0));
        assert_eq!(openai.name, "openai");
        assert_eq!(openai.auth, AuthKind::ApiKey);
        assert_eq!(
            openai.base_url,
            Some(BaseUrl {
                scheme: Scheme::Https,
                host: "api.openai.com".into(),
                port: 443,
                path: "/v1".into()
            })
        );
        assert_eq!(
            openai.headers,
            vec![("openai-organization".to_string(), "org-1".to_string())]
        );
        let mock = c.provider_by_name("mock").unwrap();
        assert_eq!(
            (mock.id, mock.auth, &mock.base_url),
            (ProviderId(1), AuthKind::Local, &None)
        );

        let a = c.connection(ConnectionId(0));
        assert_eq!(a.provider, ProviderId(0));
        assert_eq!(a.api_key.as_deref(), Some("sk-test"));
        assert!(a.enabled);
        assert_eq!((a.priority, a.weight, a.disable_cooling), (1, 1, false));
        let m = c.connection(ConnectionId(1));
        assert_eq!((m.provider, m.priority, m.weight), (ProviderId(1), 2, 3));
        assert!(m.enabled && m.api_key.is_none());
        assert_eq!(m.egress.as_deref(), Some("office"));
        assert_eq!(m.rate_limit_overrides.max_concurrent, Some(2));
        assert_eq!(
            m.rate_limit_overrides.model_concurrency,
            vec![("echo".to_string(), 1)]
        );
        assert_eq!(m.rate_limit_overrides.max_wait_ms, Some(5_000));

        let k = &c.client_keys[0];
        assert_eq!(k.secret, KeySecret::Plain("secret-dev-key".into()));
        assert!(k.has_scope(Scope::Manage) && !k.has_scope(Scope::LeaseExclusive));
        assert!(k.may_use(ConnectionId(1)) && !k.may_use(ConnectionId(0)));

        let combo = &c.combos[0];
        assert_eq!(combo.strategy, ComboStrategy::Weighted);
        assert_eq!(combo.targets.len(), 2);
        assert_eq!(
            (
                combo.targets[0].provider,
                combo.targets[0].model.as_str(),
                combo.targets[0].weight
            ),
            (ProviderId(0), "gpt-4.1-mini", 1)
        );
        assert_eq!(
            (
                combo.targets[1].provider,
                combo.targets[1].model.as_str(),
                combo.targets[1].weight
            ),
            (ProviderId(1), "echo", 2)
        );
        // The warning: the combo ends on the mock while OpenAI serves.
        assert_eq!(out.warnings.len(), 1, "{:?}", out.warnings);
        assert!(out.warnings[0].starts_with("combos[0].targets: combo \"fast\" falls back"));
    }

    #[test]
    fn an_unset_api_key_disables_the_connection_with_a_warning() {
        let out = load(BASE).unwrap();
        let a = out.config.connection(ConnectionId(0));
        assert!(!a.enabled && a.api_key.is_none());
        assert_eq!(a.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(
            out.warnings,
            vec![
                "connections[0].api_key_env: OPENAI_API_KEY is not set; connection \"openai-a\" \
                 is disabled"
                    .to_string(),
            ]
        );
        let out = load_env(BASE, &[("OPENAI_API_KEY", "  ")]).unwrap();
        assert!(!out.config.connection(ConnectionId(0)).enabled);
    }

    #[test]
    fn toml_syntax_errors_give_line_and_column() {
        let e = load("[server]\nlisten = \"127.0.0.1:1\"\nworkers = = 3\n").unwrap_err();
        assert_eq!(e.problems.len(), 2, "{e}");
        assert!(
            e.problems[0].key.starts_with("line 3, column "),
            "{}",
            e.problems[0].key
        );
        // Nothing past it was read: said, keyed by the file itself.
        assert_eq!(e.problems[1].key, "");
        assert!(e.problems[1].message.contains("not checked"), "{e}");
    }

    #[test]
    fn unknown_keys_are_rejected_by_path_all_at_once() {
        let e = load("[server]\nlisten = \"127.0.0.1:1\"\nlisten_port = 3\n").unwrap_err();
        assert_eq!(e.problems.len(), 1);
        assert_eq!(e.problems[0].key, "server.listen_port");
        assert_eq!(e.problems[0].message, "unknown key");
        let e = load("[resilience.request_queue]\nmax_wait = 3\n").unwrap_err();
        assert_eq!(e.problems[0].key, "resilience.request_queue.max_wait");
        // An unknown key does not hide the other problems.
        let text =
            format!("{BASE}\n[[connections]]\nid = \"x\"\nprovider = \"nowhere\"\nbogus = 1\n");
        let e = load(&format!("[server]\nbogus_setting = 5\n{text}")).unwrap_err();
        let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
        assert!(keys.contains(&"server.bogus_setting"), "{keys:?}");
        assert!(
            keys.iter()
                .any(|k| k.starts_with("connections[") && k.ends_with("].bogus")),
            "{keys:?}"
        );
        assert!(keys.iter().any(|k| k.ends_with("].provider")), "{keys:?}");
    }

    #[test]
    fn unknown_keys_in_a_combo_target_table_are_rejected_by_path() {
        // A target is a string or a table; the table's keys are checked like any other's.
        let text = format!(
            "{BASE}\n[[combos]]\nname = \"w\"\ntargets = [\"mock/m\", \
             {{ model = \"mock/m\", weight = 2, wieght = 3 }}, {{ combo = \"v\", bogus = 1 }}]\n\
             [[combos]]\nname = \"v\"\ntargets = [\"mock/m\"]\n"
        );
        let e = load(&text).unwrap_err();
        let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["combos[1].targets[1].wieght", "combos[1].targets[2].bogus"],
            "{e}"
        );
        assert_eq!(e.problems[0].message, "unknown key; did you mean `weight`?");
        // Beside a value of the wrong type (the file is read again without it), too.
        let e = load(&format!(
            "[server]\nworkers = \"two\"\n{BASE}\n[[combos]]\nname = \"w\"\n\
             targets = [{{ model = \"mock/m\", wieght = 3 }}]\n"
        ))
        .unwrap_err();
        let keys: Vec<&str> = e.problems.iter().map(|p| p.key.as_str()).collect();
        assert!(keys.contains(&"combos[1].targets[0].wieght"), "{e}");
        // Neither a string nor a table: a wrong value, named by its place.
        let e = load(&format!(
            "{BASE}\n[[combos]]\nname = \"w\"\ntargets = [3]\n"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("provider/model"), "{e}");
    }

    #[test]
    fn dangling_references_name_their_key() {
        let text = BASE
            .replace("provider = \"openai\"", "provider = \"opnai\"")
            .replace(
                "allowed_connections = [\"mock-a\"]",
                "allowed_connections = [\"mock-a\", \"mock-z\"]",
            )
            .replace(
                "\"openai/gpt-4.1-mini\"",
                "\"openai/gpt-5\", \"anthropic/claude\"",
            );
        assert_eq!(
            problems(&text),
            vec![
                "connections[0].provider: unknown provider \"opnai\"",
                "client_keys[0].allowed_connections[1]: unknown connection \"mock-z\"",
                "combos[0].targets[0]: model \"gpt-5\" is not in provider \"openai\"'s models",
                "combos[0].targets[1]: unknown provider \"anthropic\"",
            ]
        );
    }

    const PRICED: &str = r#"
        [[providers]]
        id = "p"
        format = "mock"
        models = ["a", "b", "c"]
        input_usd_per_mtok = { "a" = 2.5, "b" = 1, "c" = -0.0 }
        [[providers]]
        id = "q"
        format = "mock"
        [[connections]]
        id = "p1"
        provider = "p"
        [[connections]]
        id = "q1"
        provider = "q"
        [[combos]]
        name = "inner"
        targets = ["p/c"]
        [[combos]]
        name = "cheap"
        strategy = "cost-optimized"
        targets = ["p/a", "q/x", "p/b", { combo = "inner" }]
    "#;

    #[test]
    fn input_prices_resolve_on_each_combo_target_at_load() {
        let out = load(PRICED).unwrap();
        let p = &out.config.providers[0];
        // An integer reads as a price; -0 as 0.
        assert_eq!(
            p.input_usd_per_mtok,
            [("a".into(), 2.5), ("b".into(), 1.0), ("c".into(), 0.0)]
        );
        assert!(out.config.providers[1].input_usd_per_mtok.is_empty());
        let prices: Vec<Option<f64>> = out.config.combos[1]
            .targets
            .iter()
            .map(|t| t.input_usd_per_mtok)
            .collect();
        // A nested combo's target keeps its price; q has none.
        assert_eq!(prices, [Some(2.5), None, Some(1.0), Some(0.0)]);
        assert!(
            out.warnings.iter().all(|w| !w.contains("price")),
            "{:?}",
            out.warnings
        );
    }

    #[test]
    fn a_wrong_price_is_one_problem_naming_its_key() {
        let text = PRICED.replace(
            r#"input_usd_per_mtok = { "a" = 2.5, "b" = 1, "c" = -0.0 }"#,
            r#"input_usd_per_mtok = { "a" = "2.5", "b" = -1, "c" = nan, "d" = 1.0, "a b" = 1 }"#,
        );
        assert_eq!(
            problems(&text),
            vec![
                "providers[0].input_usd_per_mtok.a: expected a number (USD per million input \
                 tokens), found a string",
                "providers[0].input_usd_per_mtok.a b: \"a b\" is not a model id (1..=256 \
                 characters, no whitespace or control characters)",
                "providers[0].input_usd_per_mtok.b: -1 is not a price (a finite number ≥ 0, USD \
                 per million input tokens)",
                "providers[0].input_usd_per_mtok.c: NaN is not a price (a finite number ≥ 0, USD \
                 per million input tokens)",
                "providers[0].input_usd_per_mtok.d: model \"d\" is not in provider \"p\"'s \
                 models",
            ]
        );
        let inf = PRICED.replace("\"b\" = 1,", "\"b\" = inf,");
        assert_eq!(keys(&inf), ["providers[0].input_usd_per_mtok.b"],);
        // A provider without `models` takes a price for any model.
        let any = PRICED
            .replace("\"a\" = 2.5,", "\"a\" = 2.5, \"zz\" = 3,")
            .replace(
                "id = \"p\"\n        format = \"mock\"\n        models = [\"a\", \"b\", \"c\"]",
                "id = \"p\"\n        format = \"mock\"",
            );
        assert!(!any.contains("models"), "{any}");
        assert_eq!(
            load(&any).unwrap().config.providers[0]
                .input_usd_per_mtok
                .len(),
            4
        );
        // An unknown key beside it is still one.
        let typo = PRICED.replace("input_usd_per_mtok =", "input_usd_per_mtoks =");
        assert!(keys(&typo).contains(&"providers[0].input_usd_per_mtoks".to_string()));
    }

    #[test]
    fn a_provider_without_models_accepts_any_combo_model() {
        let text = BASE.replace("models = [\"gpt-4.1\", \"gpt-4.1-mini\"]", "");
        let text = text.replace("\"openai/gpt-4.1-mini\"", "\"openai/anything\"");
        assert!(load(&text).is_ok());
    }

    #[test]
    fn duplicates_are_problems() {
        let text = format!(
            "{BASE}
            [[providers]]
            id = \"openai\"
            format = \"mock\"
            [[connections]]
            id = \"mock-a\"
            provider = \"mock\"
            [[client_keys]]
            id = \"dev\"
            key = \"other\"
            [[client_keys]]
            id = \"dev2\"
            key_sha256 = \"{}\"
            [[combos]]
            name = \"fast\"
            targets = [\"mock/echo\"]
            [[combos]]
            name = \"mock/echo\"
            targets = [\"mock/echo\"]
            ",
            hex::encode(Sha256::digest(b"secret-dev-key"))
        );
        assert_eq!(
            keys(&text),
            vec![
                "providers[2].id",
                "connections[2].id",
                "client_keys[1].id",
                "client_keys[2]",
                "combos[1].name",
                "combos[2].name",
            ]
        );
    }

    #[test]
    fn bad_values_are_problems() {
        let text = r#"
            [server]
            listen = "localhost"
            workers = 5000
            header_timeout_ms = 0
            [[providers]]
            id = "p/1"
            format = "grpc"
            auth = "cookie"
            base_url = "ftp://example.com"
            [[providers]]
            id = "m"
            format = "mock"
            base_url = "http://localhost:1"
            [[connections]]
            id = "c"
            provider = "m"
            weight = 0
            max_concurrent = 0
            api_key_env = "1BAD"
            [[client_keys]]
            id = "a"
            key = "x"
            key_env = "X"
            [[client_keys]]
            id = "b"
            key_sha256 = "abc"
            [[client_keys]]
            id = "c"
            key_env = "UNSET_KEY"
            scopes = ["inference", "admin"]
            [[client_keys]]
            id = "d"
            [[combos]]
            name = "x"
            strategy = "headroom"
            targets = []
        "#;
        assert_eq!(
            problems(text),
            vec![
                "server.listen: \"localhost\" is not a socket address (expected ip:port, e.g. 127.0.0.1:8787)",
                "server.workers: 5000 is out of range (0..=1024)",
                "server.header_timeout_ms: 0 is out of range (1..=86400000)",
                "providers[0].id: \"p/1\" is not an id (1..=64 of A-Z a-z 0-9 . _ -)",
                "providers[0].format: unknown format \"grpc\" (expected openai, anthropic or mock)",
                "providers[0].auth: unknown auth \"cookie\" (expected apikey, oauth or local)",
                "providers[1].base_url: not used by format = \"mock\" (served in-process); remove it",
                "connections[0].api_key_env: \"1BAD\" is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                "connections[0].weight: 0 is out of range (1..=1000000)",
                "connections[0].max_concurrent: 0 is out of range (1..=100000)",
                "client_keys[0]: set exactly one of key, key_env or key_sha256 (found key, key_env)",
                "client_keys[1].key_sha256: must be 64 hex characters (the SHA-256 of the key)",
                "client_keys[2].key_env: environment variable UNSET_KEY is not set",
                "client_keys[2].scopes[1]: unknown scope \"admin\" (expected inference, manage or lease:exclusive)",
                "client_keys[3]: needs exactly one of key, key_env or key_sha256",
                "combos[0].strategy: strategy \"headroom\" is not supported by Tidegate (supported: \
                 priority, weighted, round-robin, random, least-used, cost-optimized, \
                 strict-random, auto, fill-first, quota-share, lkgp, p2c)",
                "combos[0].targets: must list at least one target",
            ]
        );
    }

    #[test]
    fn missing_required_fields_are_all_reported() {
        let text = "[[providers]]\n[[connections]]\n[[combos]]\n";
        assert_eq!(
            keys(text),
            vec![
                "providers[0].id",
                "providers[0].format",
                "connections[0].id",
                "connections[0].provider",
                "combos[0].name",
                "combos[0].targets",
            ]
        );
    }

    #[test]
    fn a_set_key_env_and_a_sha256_key_load() {
        let text = format!(
            "[[client_keys]]\nid = \"a\"\nkey_env = \"TG_KEY\"\n\
             [[client_keys]]\nid = \"b\"\nkey_sha256 = \"{}\"\nscopes = []\n",
            "AB".repeat(32)
        );
        let out = load_env(&text, &[("TG_KEY", "k-1")]).unwrap();
        let keys = &out.config.client_keys;
        assert_eq!(keys[0].secret, KeySecret::Plain("k-1".into()));
        assert_eq!(keys[1].secret, KeySecret::Sha256([0xab; 32]));
        assert_eq!(keys[1].scopes, vec![Scope::Inference]);
        assert!(keys[1].allowed_connections.is_none());
    }

    #[test]
    fn admin_token_is_read_from_its_variable() {
        let text = "[server]\nadmin_token_env = \"TG_ADMIN\"\n";
        let out = load_env(text, &[("TG_ADMIN", "t0k")]).unwrap();
        assert_eq!(out.config.server.admin_token.as_deref(), Some("t0k"));
        let out = load(text).unwrap();
        assert!(out.config.server.admin_token.is_none());
        let admin: Vec<_> = out
            .warnings
            .iter()
            .filter(|w| w.starts_with("server."))
            .collect();
        assert_eq!(admin.len(), 1, "{:?}", out.warnings);
        assert!(admin[0].starts_with("server.admin_token_env: TG_ADMIN is not set"));
        // With no manage key either, the warning says what that leaves: loopback only.
        assert!(
            admin[0].contains("answers loopback callers"),
            "{}",
            admin[0]
        );
        let keyed =
            format!("{text}[[client_keys]]\nid = \"ops\"\nkey = \"k\"\nscopes = [\"manage\"]\n");
        let out = load(&keyed).unwrap();
        let admin: Vec<_> = out
            .warnings
            .iter()
            .filter(|w| w.starts_with("server.admin_token_env"))
            .collect();
        assert!(
            admin[0].ends_with("accepts only client keys with scope \"manage\""),
            "{admin:?}"
        );
    }

    #[test]
    fn headers_are_checked() {
        let text = r#"
            [[providers]]
            id = "p"
            format = "openai"
            base_url = "http://10.0.0.1:8080"
            headers = { "X-Ok" = "1", "Bad Name" = "1", "Content-Length" = "3", "x-crlf" = "a\r\nb" }
        "#;
        assert_eq!(
            keys(text),
            vec![
                "providers[0].headers.Bad Name",
                "providers[0].headers.Content-Length",
                "providers[0].headers.x-crlf",
            ]
        );
    }

    #[test]
    fn ca_file_must_exist() {
        let text = r#"
            [[providers]]
            id = "p"
            format = "openai"
            base_url = "https://llm.internal/v1"
            ca_file = "/nonexistent/tidegate-ca.pem"
        "#;
        assert_eq!(keys(text), vec!["providers[0].ca_file"]);
        let text = text.replace("/nonexistent/tidegate-ca.pem", "Cargo.toml");
        let out = load(&text).unwrap();
        assert_eq!(
            out.config.providers[0].ca_file,
            Some(PathBuf::from("Cargo.toml"))
        );
    }

    #[test]
    fn base_urls() {
        let ok = |s: &str| parse_base_url(s).unwrap();
        let u = ok("HTTPS://API.Example.com/v1/");
        assert_eq!(
            (u.scheme, u.host.as_str(), u.port, u.path.as_str()),
            (Scheme::Https, "api.example.com", 443, "/v1")
        );
        let u = ok("http://127.0.0.1:9000");
        assert_eq!(
            (u.scheme, u.port, u.path.as_str()),
            (Scheme::Http, 9000, "")
        );
        let u = ok("http://[::1]:8080/api/v1");
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("[::1]", 8080, "/api/v1")
        );
        assert_eq!(ok("https://x.io/").path, "");
        for bad in [
            "api.openai.com/v1",
            "ftp://x.io",
            "https://x.io/v1?key=1",
            "https://x.io/v1#frag",
            "https://user:pw@x.io",
            "https://:443/v1",
            "https://x.io:0",
            "https://x.io:65536",
            "https://x.io:0443",
            "https://x.io:abc",
            "https://[::1",
            "https://[zz]:1",
            "https://x io",
            "https://x!.io",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_combo_named_as_a_model_of_provider_combo_warns_that_combo_slash_name_is_the_combo() {
        let text = format!(
            "{BASE}\n[[providers]]\nid = \"combo\"\nformat = \"mock\"\nmodels = [\"team\"]\n\
             [[connections]]\nid = \"combo-a\"\nprovider = \"combo\"\n\
             [[combos]]\nname = \"team\"\ntargets = [\"mock/echo\"]\n"
        );
        let out = load_env(&text, &[]).unwrap();
        assert!(
            out.warnings.iter().any(|w| w
                .contains("\"combo/team\" names combo \"team\", not provider \"combo\"'s model")),
            "{:?}",
            out.warnings
        );
    }

    #[test]
    fn combo_names_may_not_shadow_provider_routes() {
        let text =
            format!("{BASE}\n[[combos]]\nname = \"openai/gpt-4.1\"\ntargets = [\"mock/echo\"]\n");
        assert_eq!(
            problems(&text),
            vec![
                "combos[1].name: \"openai/gpt-4.1\" collides with provider/model routing of \
                 provider \"openai\""
            ]
        );
        let text = format!("{BASE}\n[[combos]]\nname = \"gpt-4.1\"\ntargets = [\"mock/echo\"]\n");
        let out = load_env(&text, &[("OPENAI_API_KEY", "k")]).unwrap();
        assert_eq!(
            out.warnings,
            vec![
                "combos[1].name: combo \"gpt-4.1\" shadows the model of the same name in \
                 provider \"openai\"",
                "combos[0].targets: combo \"fast\" falls back to the mock provider \"mock\" \
                 while real providers are enabled: clients would get the mock's canned answer \
                 instead of an error"
            ]
        );
    }

    #[test]
    fn every_strategy_name_maps() {
        let names = [
            ("priority", ComboStrategy::Priority),
            ("weighted", ComboStrategy::Weighted),
            ("round-robin", ComboStrategy::RoundRobin),
            ("random", ComboStrategy::Random),
            ("least-used", ComboStrategy::LeastUsed),
            ("cost-optimized", ComboStrategy::CostOptimized),
            ("strict-random", ComboStrategy::StrictRandom),
            ("auto", ComboStrategy::Auto),
            ("fill-first", ComboStrategy::Fill),
            ("quota-share", ComboStrategy::QuotaShare),
            ("lkgp", ComboStrategy::Lkgp),
            ("p2c", ComboStrategy::P2c),
        ];
        for (name, s) in names {
            assert_eq!(parse_strategy(name), Ok(s));
        }
        assert!(parse_strategy("round_robin").is_err());
    }

    #[test]
    fn provider_kinds_resolve_at_load() {
        let text = r#"
            [[providers]]
            id = "nvidia"
            format = "openai"
            base_url = "http://127.0.0.1:9/v1"
            [[providers]]
            id = "nim-eu"
            kind = "NVIDIA"
            format = "openai"
            base_url = "http://127.0.0.1:9/v1"
            [[providers]]
            id = "codex"
            kind = "generic"
            format = "openai"
            base_url = "http://127.0.0.1:9/v1"
            [[providers]]
            id = "openai-compatible-acme"
            format = "openai"
            base_url = "http://127.0.0.1:9/v1"
            [[providers]]
            id = "self"
            format = "openai"
            auth = "local"
            base_url = "http://127.0.0.1:9/v1"
        "#;
        let c = load(text).unwrap().config;
        let kind = |name: &str| c.provider_by_name(name).unwrap().quirks.kind;
        assert_eq!(kind("nvidia"), ProviderKind::Nvidia);
        assert_eq!(kind("nim-eu"), ProviderKind::Nvidia);
        assert_eq!(kind("codex"), ProviderKind::Generic);
        assert_eq!(
            kind("openai-compatible-acme"),
            ProviderKind::OpenaiCompatible
        );
        assert_eq!(kind("self"), ProviderKind::Generic);
        let nim = &c.provider_by_name("nim-eu").unwrap().quirks;
        assert_eq!(
            (nim.default_rpm, nim.default_concurrency),
            (Some(40), Some(6))
        );
        // A generic kind has no quirks even under a known id.
        assert!(!c.provider_by_name("codex").unwrap().quirks.per_model_quota);
        // Local providers hold per-model quotas whatever the kind.
        assert!(c.provider_by_name("self").unwrap().quirks.per_model_quota);
    }

    #[test]
    fn unknown_provider_kind_is_a_problem() {
        let text = "[[providers]]\nid = \"x\"\nkind = \"nvidea\"\nformat = \"mock\"\n";
        let p = problems(text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with(
                "providers[0].kind: unknown provider kind \"nvidea\" (known: generic,"
            ),
            "{p:?}"
        );
    }

    #[test]
    fn resilience_keys_must_name_configured_providers() {
        let text = format!(
            "{BASE}
            [resilience.provider_quota_overrides.nvidia]
            rpm = 40
            [resilience.quota_preflight.provider_window_defaults.codex]
            session = 5
            [[resilience.provider_error_rules.OpenAI]]
            status = 400
            match = \"quota\"
            scope = \"provider\"
            [[resilience.provider_error_rules.acme]]
            status = 400
            match = \"quota\"
            scope = \"provider\"
            "
        );
        assert_eq!(
            keys(&text),
            vec![
                "resilience.provider_quota_overrides.nvidia",
                "resilience.quota_preflight.provider_window_defaults.codex",
                "resilience.provider_error_rules.acme",
            ]
        );
    }

    #[test]
    fn problems_from_every_layer_are_reported_together() {
        let text =
            "[server]\nlisten = \"nope\"\n[resilience.request_queue]\nconcurrent_requests = 0\n";
        let e = load_env(text, &[("RATE_LIMIT_MAX_QUEUE_DEPTH", "-1")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "server.listen: \"nope\" is not a socket address (expected ip:port, e.g. 127.0.0.1:8787)\n\
             RATE_LIMIT_MAX_QUEUE_DEPTH: \"-1\" is not a non-negative whole number\n\
             resilience.request_queue.concurrent_requests: 0 is out of range (1..=10000)"
        );
    }

    #[test]
    fn load_file_reports_unreadable_files() {
        let e = load_file(Path::new("/nonexistent/tidegate.toml"), &no_env).unwrap_err();
        assert_eq!(e.problems.len(), 1);
        assert_eq!(e.problems[0].key, "/nonexistent/tidegate.toml");
    }

    // -- shipped files -------------------------------------------------------------------

    const SHIPPED: &[(&str, &str)] = &[
        (
            "config/tidegate.toml",
            include_str!("../../config/tidegate.toml"),
        ),
        (
            "config/examples/minimal.toml",
            include_str!("../../config/examples/minimal.toml"),
        ),
        (
            "config/examples/multi-key.toml",
            include_str!("../../config/examples/multi-key.toml"),
        ),
        (
            "config/examples/combo.toml",
            include_str!("../../config/examples/combo.toml"),
        ),
    ];

    #[test]
    fn shipped_files_validate_without_any_environment() {
        for (name, text) in SHIPPED {
            if let Err(e) = load(text) {
                panic!("{name}:\n{e}");
            }
        }
        let out = load_file(Path::new("config/tidegate.toml"), &no_env).unwrap();
        let c = &out.config;
        assert_eq!(
            c.server.listen,
            "127.0.0.1:8787".parse::<SocketAddr>().unwrap()
        );
        // The mock serves out of the box; the real providers wait for their keys.
        let mock = c.provider_by_name("mock").unwrap();
        let enabled: Vec<_> = c
            .connections
            .iter()
            .filter(|x| x.enabled)
            .map(|x| (x.name.as_str(), x.provider, x.priority))
            .collect();
        let faults = c.provider_by_name("mock-faults").unwrap();
        assert_eq!(
            enabled,
            vec![
                ("mock-a", mock.id, 1),
                ("mock-b", mock.id, 2),
                ("faults-a", faults.id, 1),
                ("faults-b", faults.id, 2)
            ]
        );
        for var in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"] {
            assert!(out.warnings.iter().any(|w| w.contains(var)), "{var}");
        }
        let dev = c.client_keys.iter().find(|k| k.id == "dev").unwrap();
        assert_eq!(dev.secret, KeySecret::Plain("tidegate-dev-key".into()));
        assert!(dev.has_scope(Scope::Inference) && dev.has_scope(Scope::Manage));
        // A lease:exclusive key must carry lease headers on every request: not the dev key.
        assert!(!dev.has_scope(Scope::LeaseExclusive));
        assert!(!c.combos.is_empty());
    }

    #[test]
    fn shipped_files_enable_real_providers_when_keys_are_set() {
        let env = [
            ("OPENAI_API_KEY", "sk-1"),
            ("ANTHROPIC_API_KEY", "sk-2"),
            ("OPENROUTER_API_KEY", "sk-3"),
        ];
        let out = load_env(SHIPPED[0].1, &env).unwrap();
        assert!(out.config.connections.iter().all(|c| c.enabled));
        assert!(out.warnings.is_empty(), "{:?}", out.warnings);
    }

    #[test]
    fn the_configuration_guide_marks_every_inactive_setting() {
        let doc = include_str!("../../docs/configuration.md");
        for path in resilience::NOT_ACTIVE_YET {
            let (section, key) = path.split_once('.').unwrap_or((path, ""));
            let heading = format!("### `[resilience.{section}]`");
            let start = doc
                .find(&heading)
                .unwrap_or_else(|| panic!("docs/configuration.md lacks {heading}"));
            let body = &doc[start + heading.len()..];
            let body = &body[..body.find("\n### ").unwrap_or(body.len())];
            let marked = if key.is_empty() {
                let warning = format!("`{}`", resilience::not_active_warning(path));
                body.contains("**Accepted, not active yet.**") && body.contains(&warning)
            } else {
                body.lines().any(|l| {
                    l.starts_with(&format!("| `{key}` |"))
                        && l.contains("**accepted, not active yet**")
                })
            };
            assert!(
                marked,
                "docs/configuration.md does not mark {path} as not active yet"
            );
        }
    }

    #[test]
    fn the_configuration_guide_documents_every_key_and_variable() {
        let doc = include_str!("../../docs/configuration.md");
        for var in resilience::env_variables() {
            assert!(doc.contains(var), "docs/configuration.md lacks {var}");
        }
        let paths = resilience::num_fields()
            .into_iter()
            .map(|f| f.path)
            .chain(resilience::bool_fields().into_iter().map(|f| f.path));
        for path in paths {
            let (section, key) = path.rsplit_once('.').unwrap_or(("", path));
            if !section.is_empty() {
                assert!(
                    doc.contains(&format!("[resilience.{section}]")),
                    "docs/configuration.md lacks [resilience.{section}]"
                );
            }
            assert!(
                doc.contains(&format!("`{key}`")),
                "docs/configuration.md lacks {path}"
            );
        }
    }
}

/// The warnings of `exposure`, through the loader that runs them.
#[cfg(test)]
mod exposure_tests {
    use crate::config::exposure::open_gateway_refusal;
    use crate::config::validate::load_str;

    fn warns(text: &str, env: &[(&str, &str)]) -> Vec<String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        let lookup = move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        load_str(text, &lookup).unwrap().warnings
    }

    const MOCK: &str = "[[providers]]\nid = \"m\"\nformat = \"mock\"\n\
                        [[connections]]\nid = \"m1\"\nprovider = \"m\"\n";
    const KEY: &str = "[[client_keys]]\nid = \"k\"\nkey = \"tidegate-dev-key\"\n";

    #[test]
    fn a_strategy_whose_ordering_is_not_built_warns_once_naming_the_combo() {
        let combo = |strategy: &str| {
            format!(
                "{MOCK}[[combos]]\nname = \"c\"\nstrategy = \"{strategy}\"\n\
                 targets = [\"m/a\", \"m/b\"]\n"
            )
        };
        let about = |w: Vec<String>| -> Vec<String> {
            w.into_iter()
                .filter(|l| l.starts_with("combos[0].strategy"))
                .collect()
        };
        for built in [
            "priority",
            "quota-share",
            "round-robin",
            "weighted",
            "fill-first",
            "random",
            "strict-random",
            "least-used",
        ] {
            assert_eq!(about(warns(&combo(built), &[])), Vec::<String>::new());
        }
        assert_eq!(
            about(warns(&combo("auto"), &[])),
            vec![
                "combos[0].strategy: \"auto\" is accepted, but its ordering is not built \
                 yet: combo \"c\" runs its targets in the order written"
            ]
        );
        // Built; without a price for any target it runs in the written order, and says so.
        assert_eq!(
            about(warns(&combo("cost-optimized"), &[])),
            vec![
                "combos[0].strategy: \"cost-optimized\" has no price for any target of combo \
                 \"c\" (set input_usd_per_mtok on their providers): it runs its targets in the \
                 order written"
            ]
        );
        let priced = combo("cost-optimized").replace(
            "format = \"mock\"\n",
            "format = \"mock\"\ninput_usd_per_mtok = { \"b\" = 1 }\n",
        );
        assert!(priced.contains("input_usd_per_mtok"));
        assert_eq!(about(warns(&priced, &[])), Vec::<String>::new());
    }

    #[test]
    fn prices_no_cost_optimized_combo_reads_warn() {
        let text = |strategy: &str, targets: &str| {
            format!(
                "[[providers]]\nid = \"m\"\nformat = \"mock\"\n\
                 input_usd_per_mtok = {{ \"a\" = 0.5 }}\n\
                 [[connections]]\nid = \"m1\"\nprovider = \"m\"\n\
                 [[providers]]\nid = \"n\"\nformat = \"mock\"\n\
                 [[connections]]\nid = \"n1\"\nprovider = \"n\"\n\
                 [[combos]]\nname = \"c\"\nstrategy = \"{strategy}\"\ntargets = [{targets}]\n"
            )
        };
        let about = |w: Vec<String>| -> Vec<String> {
            w.into_iter()
                .filter(|l| l.starts_with("providers[0].input_usd_per_mtok"))
                .collect()
        };
        let unread = "providers[0].input_usd_per_mtok: has no effect: no cost-optimized combo \
                      has a target on provider \"m\" (only cost-optimized combos read prices)";
        assert_eq!(
            about(warns(&text("priority", "\"m/a\""), &[])),
            vec![unread]
        );
        // A cost-optimized combo, but on the other provider only.
        assert_eq!(
            about(warns(&text("cost-optimized", "\"n/a\""), &[])),
            vec![unread]
        );
        // Read: no warning (target `m/b` has no price; the combo's `m/a` does not matter).
        assert_eq!(
            about(warns(&text("cost-optimized", "\"n/a\", \"m/b\""), &[])),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_sticky_limit_on_a_combo_that_does_not_read_it_warns() {
        let combo = |strategy: &str, keys: &str| {
            format!(
                "{MOCK}[[combos]]\nname = \"c\"\nstrategy = \"{strategy}\"\n\
                 targets = [\"m/a\", \"m/b\"]\n\n[combos.config]\n{keys}\n"
            )
        };
        let about = |w: Vec<String>| -> Vec<String> {
            w.into_iter()
                .filter(|l| l.starts_with("combos[0].config"))
                .collect()
        };
        let both = "sticky_round_robin_limit = 2\nsticky_weighted_limit = 3";
        assert_eq!(
            about(warns(&combo("priority", both), &[])),
            vec![
                "combos[0].config.sticky_round_robin_limit: has no effect: combo \"c\" is not \
                 round-robin (only a round-robin combo reads it)",
                "combos[0].config.sticky_weighted_limit: has no effect: combo \"c\" is not \
                 weighted (only a weighted combo reads it)",
            ]
        );
        let rr = about(warns(&combo("round-robin", both), &[]));
        assert_eq!(rr.len(), 1, "{rr:?}");
        assert!(rr[0].contains("sticky_weighted_limit"), "{rr:?}");
        let w = about(warns(&combo("weighted", both), &[]));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("sticky_round_robin_limit"), "{w:?}");
    }

    #[test]
    fn blank_files_and_files_with_no_usable_connection_warn() {
        for text in ["", "\n  \n# only a comment\n"] {
            let w = warns(text, &[]);
            assert!(w.iter().any(|l| l.contains("the file is empty")), "{w:?}");
        }
        let w = warns("[server]\nworkers = 1\n", &[]);
        assert!(w.iter().any(|l| l.contains("no [[connections]]")), "{w:?}");
        let real = "[[providers]]\nid = \"o\"\nformat = \"openai\"\n\
                    base_url = \"https://api.openai.com/v1\"\n\
                    [[connections]]\nid = \"o1\"\nprovider = \"o\"\napi_key_env = \"TG_X\"\n";
        let w = warns(real, &[]);
        assert!(
            w.iter().any(|l| l.contains("every connection is disabled")),
            "{w:?}"
        );
        let w = warns(real, &[("TG_X", "sk")]);
        assert!(w.iter().all(|l| !l.contains("disabled")), "{w:?}");
    }

    #[test]
    fn exposure_depends_on_the_listen_address() {
        let open = format!("[server]\nlisten = \"0.0.0.0:8787\"\n{MOCK}");
        let w = warns(&open, &[]);
        assert!(w.iter().any(|l| l.contains("open gateway")), "{w:?}");
        let c = load_str(&open, &|_| None).unwrap().config;
        assert!(open_gateway_refusal(&c).is_some());
        let allowed = open.replace("[server]\n", "[server]\nallow_open_gateway = true\n");
        let c = load_str(&allowed, &|_| None).unwrap().config;
        assert!(open_gateway_refusal(&c).is_none());
        let loopback = format!("[server]\nlisten = \"127.0.0.1:8787\"\n{MOCK}");
        assert!(warns(&loopback, &[]).is_empty());
        let c = load_str(&loopback, &|_| None).unwrap().config;
        assert!(open_gateway_refusal(&c).is_none());
        let v6 = format!("[server]\nlisten = \"[::1]:8787\"\n{MOCK}{KEY}");
        assert!(warns(&v6, &[]).is_empty());
        let keyed = format!("[server]\nlisten = \"[::]:8787\"\n{MOCK}{KEY}");
        let w = warns(&keyed, &[]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("without TLS"), "{w:?}");
        assert!(w[1].starts_with("client_keys[0].key: the shipped sample key"));
    }
}
