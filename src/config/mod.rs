//! Configuration: raw serde structs (`raw`), validated into the typed [`Config`]
//! (`validate`), with the resilience settings of the spec and their environment overrides
//! (`resilience`, reading variables through `env`). `problem` is the shared leaf. Imports
//! run one way: problem, env ← resilience ← validate, and `exposure` (warnings about a valid
//! but dangerous file) and `diagnose` (messages for unknown keys and type errors) ← validate. Everything is checked at load; the rest of the gateway only ever
//! sees a valid `Config`, with providers, connections and combos addressed by ids that stay
//! the same across a reload ([`ids`]).

pub mod combo;
pub mod diagnose;
pub mod env;
pub mod exposure;
pub mod ids;
pub mod kinds;
pub mod problem;
pub mod raw;
pub mod renumber;
pub mod resilience;
pub mod runtime;
pub mod validate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::LazyLock;

pub use combo::ComboSettings;
pub use resilience::ResilienceSettings;
pub use validate::load_file;
#[cfg_attr(tidegate_reach, allow(unused_imports))] // benches load inline configs
pub use validate::load_str;

pub use ids::{ComboId, ConnectionId, ProviderId};

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub server: ServerConfig,
    pub client_keys: Vec<ClientKey>,
    /// In file order; [`Config::provider`] finds one by id.
    pub providers: Vec<Provider>,
    /// In file order; [`Config::connection`] finds one by id.
    pub connections: Vec<Connection>,
    /// In file order; [`Config::combo_by_id`] finds one by id.
    pub combos: Vec<Combo>,
    pub resilience: ResilienceSettings,
    /// `[emergency_fallback]` when a target is set and `OMNIROUTE_EMERGENCY_FALLBACK` does
    /// not switch it off (B §9.1).
    pub emergency_fallback: Option<EmergencyFallback>,
    /// Where each id sits in the lists above.
    pub ids: ids::Slots,
}

/// Where a request whose provider says its budget is spent is re-run once (B §9.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmergencyFallback {
    pub provider: ProviderId,
    pub model: String,
}

/// The environment switch of the emergency fallback (on unless `false`/`0`/`off`/`no`).
pub const EMERGENCY_FALLBACK_ENV: &str = "OMNIROUTE_EMERGENCY_FALLBACK";

impl Config {
    /// The provider `id`. An id this configuration does not have (a message from a shard
    /// that runs another configuration during a reload) gives a disabled placeholder.
    pub fn provider(&self, id: ProviderId) -> &Provider {
        self.provider_by_id(id)
            .unwrap_or_else(|| unknown_provider())
    }

    /// The connection `id` (a disabled placeholder for an id this configuration does not
    /// have; see [`Config::provider`]).
    pub fn connection(&self, id: ConnectionId) -> &Connection {
        self.connection_by_id(id)
            .unwrap_or_else(|| unknown_connection())
    }

    pub fn provider_by_id(&self, id: ProviderId) -> Option<&Provider> {
        self.providers.get(self.ids.provider_slot(id)?)
    }

    pub fn connection_by_id(&self, id: ConnectionId) -> Option<&Connection> {
        self.connections.get(self.ids.connection_slot(id)?)
    }

    pub fn combo_by_id(&self, id: ComboId) -> Option<&Combo> {
        self.combos.get(self.ids.combo_slot(id)?)
    }

    /// Fills [`Config::ids`] from the lists as they are (a fresh load, numbered by
    /// position).
    pub fn index_ids(&mut self) {
        self.ids = ids::Slots::new(
            self.providers.iter().map(|p| p.id),
            self.connections.iter().map(|c| c.id),
            self.combos.iter().map(|c| c.id),
            &ids::Slots::default(),
        );
    }

    /// The position of provider `id` in [`Config::providers`].
    pub fn provider_slot(&self, id: ProviderId) -> Option<usize> {
        self.ids.provider_slot(id)
    }

    /// The position of connection `id` in [`Config::connections`].
    pub fn connection_slot(&self, id: ConnectionId) -> Option<usize> {
        self.ids.connection_slot(id)
    }

    pub fn provider_by_name(&self, name: &str) -> Option<&Provider> {
        self.providers.iter().find(|p| p.name == name)
    }
}

/// What [`Config::provider`] answers for an id the configuration does not have.
pub fn unknown_provider() -> &'static Provider {
    static UNKNOWN: LazyLock<Provider> = LazyLock::new(|| Provider {
        id: ProviderId(u16::MAX),
        name: "(removed)".into(),
        quirks: kinds::ProviderKind::default_for_id("").quirks(),
        format: ProviderFormat::Mock,
        auth: AuthKind::ApiKey,
        base_url: None,
        models: Vec::new(),
        headers: Vec::new(),
        ca_file: None,
        daily_reset: None,
        responses_api: true,
        input_usd_per_mtok: Vec::new(),
    });
    &UNKNOWN
}

/// What [`Config::connection`] answers for an id the configuration does not have.
pub fn unknown_connection() -> &'static Connection {
    static UNKNOWN: LazyLock<Connection> = LazyLock::new(|| Connection {
        id: ConnectionId(ids::NONE),
        name: "(removed)".into(),
        provider: ProviderId(u16::MAX),
        api_key_env: None,
        api_key: None,
        enabled: false,
        priority: u32::MAX,
        weight: 0,
        max_concurrent: None,
        disable_cooling: true,
        egress: None,
        rate_limit_overrides: RateLimitOverrides::default(),
    });
    &UNKNOWN
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Shard count; 0 in the file means one per available core and is resolved at start.
    pub workers: usize,
    pub state_dir: PathBuf,
    /// Name of the env variable holding the admin bearer token.
    pub admin_token_env: Option<String>,
    /// The admin token, read from `admin_token_env` at load.
    pub admin_token: Option<String>,
    pub max_request_body_bytes: usize,
    /// Time allowed for a request head to arrive once its first byte has.
    pub header_timeout_ms: u64,
    /// Idle keep-alive time of a client connection between requests.
    pub idle_timeout_ms: u64,
    /// Upstream TCP + TLS connect budget.
    pub connect_timeout_ms: u64,
    /// Upstream: request fully written → response head received.
    pub response_header_timeout_ms: u64,
    /// Upstream: longest gap between two body reads.
    pub body_idle_timeout_ms: u64,
    /// One request, every attempt and wait until its answer's head reaches the client;
    /// 0 = no overall deadline.
    pub request_timeout_ms: u64,
    /// Idle upstream pooled connections are closed after this.
    pub pool_idle_timeout_ms: u64,
    /// Idle upstream connections kept per (scheme, host, port) per shard.
    pub pool_max_idle_per_host: usize,
    /// Hard cap on the model lockouts (and, apart, the failure states) each owner shard
    /// holds; past it the entries written longest ago are dropped.
    pub max_model_lockouts: usize,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    pub shutdown_grace_ms: u64,
    /// Pin each shard thread to one CPU (off helps only on machines shared with other
    /// busy processes).
    pub pin_threads: bool,
    pub snapshot_interval_ms: u64,
    /// Slots per cross-shard ring (a power of two). Point-to-point messages that find a
    /// ring full wait in the sender's outbox; view broadcasts are dropped and re-sent.
    pub mesh_ring_capacity: usize,
    /// Let another Tidegate that also allows it listen on the same address (the
    /// zero-downtime handover); otherwise an address held by another process is refused.
    pub allow_shared_listen: bool,
    /// Serve on a non-loopback address with no client keys (an open gateway).
    pub allow_open_gateway: bool,
    /// How log lines are written (read at start; a reload keeps it).
    pub log_format: LogFormat,
    /// The listener's certificate chain and key (PEM); both or neither. With them the
    /// listener speaks TLS (ALPN `http/1.1`).
    pub tls: Option<ListenerTls>,
    /// Browser origins allowed to call the API (`"*"`: any); empty = no CORS headers.
    pub cors_allow_origins: Vec<String>,
    /// `/metrics` answers every caller without a credential.
    pub metrics_public: bool,
    /// How long an exclusive session lease lives after its acquire or last renew (B §5.1).
    pub lease_ttl_ms: u64,
}

/// `server.lease_ttl_ms` when unset (B §5.1).
pub const DEFAULT_LEASE_TTL_MS: u64 = 120_000;
/// The bounds of `server.lease_ttl_ms` (B §5.1's clamp).
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
pub const MAX_LEASE_TTL_MS: u64 = 1_800_000;

/// `server.mesh_ring_capacity` when unset: the mesh's own default (`mesh::ring::RING_CAPACITY`;
/// a test in `server.rs`, which sees both layers, keeps the two equal).
pub const DEFAULT_MESH_RING_CAPACITY: usize = 1024;
/// The largest `server.mesh_ring_capacity` accepted: the mesh's `MAX_RING_CAPACITY`.
pub const MAX_MESH_RING_CAPACITY: usize = 1 << 16;

/// How a client key is matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySecret {
    Plain(String),
    Sha256([u8; 32]),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Inference endpoints (`/v1/...`). Granted when a key lists no scopes.
    Inference,
    /// Management API.
    Manage,
    /// `POST /api/v1/session-leases`.
    LeaseExclusive,
}

/// `server.tls_cert_file` / `server.tls_key_file`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// `server.log_format`: human-readable lines, or one JSON object per line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug)]
pub struct ClientKey {
    pub id: String,
    pub secret: KeySecret,
    pub scopes: Vec<Scope>,
    /// `None` = every connection.
    pub allowed_connections: Option<Vec<ConnectionId>>,
}

impl ClientKey {
    pub fn has_scope(&self, s: Scope) -> bool {
        self.scopes.contains(&s)
    }

    /// Lease-managed (B §5.4): every inference request carries its lease's headers and
    /// goes to the leased connection only.
    pub fn is_lease_managed(&self) -> bool {
        self.has_scope(Scope::LeaseExclusive)
    }

    pub fn may_use(&self, c: ConnectionId) -> bool {
        self.allowed_connections
            .as_ref()
            .is_none_or(|a| a.contains(&c))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderFormat {
    Openai,
    Anthropic,
    /// Served in-process by `providers::mock`.
    Mock,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthKind {
    ApiKey,
    OAuth,
    Local,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    Http,
    Https,
}

/// A provider's API root, e.g. `https://api.openai.com/v1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseUrl {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash, e.g. `/v1`; may be empty.
    pub path: String,
}

#[derive(Clone, Debug)]
pub struct Provider {
    pub id: ProviderId,
    /// The operator's name for it (`[[providers]] id`): free, never interpreted.
    pub name: String,
    /// Its quirks, resolved from `kind` at load ([`kinds`]).
    pub quirks: kinds::Quirks,
    pub format: ProviderFormat,
    pub auth: AuthKind,
    /// `None` only for `format = mock`.
    pub base_url: Option<BaseUrl>,
    pub models: Vec<String>,
    /// Extra headers sent on every upstream request (name lower-cased).
    pub headers: Vec<(String, String)>,
    /// Extra PEM CA bundle trusted for this provider's TLS (private endpoints).
    pub ca_file: Option<PathBuf>,
    /// When this provider's daily quotas reset; `None` = midnight UTC.
    pub daily_reset: Option<DailyResetClock>,
    /// An `openai`-format provider serves `/v1/responses` itself (the default); `false`:
    /// it speaks only Chat Completions, and Responses requests are translated for it.
    pub responses_api: bool,
    /// The operator's input prices (`input_usd_per_mtok`): model → USD per million input
    /// tokens, each finite and ≥ 0, each model one of `models` (when listed). Read by the
    /// `cost-optimized` strategy through [`ComboTarget::input_usd_per_mtok`].
    pub input_usd_per_mtok: Vec<(String, f64)>,
}

/// A provider's daily quota reset: `hour` o'clock at `utc_offset_minutes` east of UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DailyResetClock {
    pub utc_offset_minutes: i16,
    pub hour: u8,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitOverrides {
    pub max_concurrent: Option<u32>,
    /// Exact upstream model id → concurrent cap.
    pub model_concurrency: Vec<(String, u32)>,
    pub max_wait_ms: Option<u64>,
    pub execution_max_wait_ms: Option<u64>,
    pub requests_per_minute: Option<u32>,
    pub min_time_between_requests_ms: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct Connection {
    pub id: ConnectionId,
    pub name: String,
    pub provider: ProviderId,
    /// Name of the env variable holding the key (if any).
    pub api_key_env: Option<String>,
    /// The secret read from `api_key_env` at load.
    pub api_key: Option<String>,
    /// False when `api_key_env` names an unset variable (a warning, not an error).
    pub enabled: bool,
    /// Lower runs first.
    pub priority: u32,
    pub weight: u32,
    pub max_concurrent: Option<u32>,
    pub disable_cooling: bool,
    pub egress: Option<String>,
    pub rate_limit_overrides: RateLimitOverrides,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ComboStrategy {
    Priority,
    Weighted,
    RoundRobin,
    Random,
    LeastUsed,
    CostOptimized,
    StrictRandom,
    Auto,
    Fill,
    QuotaShare,
    Lkgp,
    P2c,
}

#[derive(Clone, Debug)]
pub struct ComboTarget {
    pub provider: ProviderId,
    pub model: String,
    pub weight: u32,
    /// The model's input price on its provider (USD per million input tokens), resolved
    /// at load from the provider's `input_usd_per_mtok`; `None` when it has none.
    pub input_usd_per_mtok: Option<f64>,
}

#[derive(Clone, Debug)]
pub struct Combo {
    pub id: ComboId,
    pub name: String,
    pub strategy: ComboStrategy,
    /// Flattened: nested combos' targets in place of their reference (B §3.1).
    pub targets: Vec<ComboTarget>,
    /// The resolved combo config cascade.
    pub settings: ComboSettings,
}
