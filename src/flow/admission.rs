//! What admission an attempt on a connection needs, derived from the configuration: the
//! gates of the composite gate (B §2.1) with their capacities, the shard that holds them
//! (the *gate home*), and the connection's request-queue settings and limiter key (B §1.1).
//!
//! # The gate home
//!
//! The composite gate takes every gate an attempt needs all-or-nothing, so they must sit in
//! one table. The account and model gates belong to the connection, the provider gate to
//! every connection of the provider, the global gate to everything. A connection's gates
//! therefore live on the owner of the widest gate that is configured for it:
//!
//! * `request_queue.global_concurrent_requests > 0` → every connection's gates live on the
//!   owner of `global` (one shard serialises all admissions — the price of a global cap);
//! * else `provider_quota_overrides[p].provider_concurrency > 0` → the connections of `p`
//!   have their gates on the owner of `p`;
//! * else on the owner of the connection.
//!
//! A given connection always maps to one home, so its account gate is never split across
//! two tables. The home is a function of settings that are fixed while the process runs.

use crate::config::{ComboId, Config, ConnectionId, ProviderId};
use crate::flow::gates::{GateKey, GateReq};
use crate::flow::queue::{
    KeyParts, LimiterSettings, ProviderWindow, limiter_key, provider_default_concurrency,
};
use crate::resilience::FallbackDecision;

/// Where a connection's concurrency gates live (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateHome {
    Global,
    Provider(ProviderId),
    Connection(ConnectionId),
}

/// The shard that runs quota-share selection (B §2.4) for every combo: its in-flight
/// counters are per connection and must see every quota-share dispatch, whichever combo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaShareHome;

/// `provider_quota_overrides[<provider>].provider_concurrency` (0 = none).
pub fn provider_capacity(config: &Config, provider: ProviderId) -> Option<u32> {
    let p = config.provider(provider);
    config
        .resilience
        .quota_override_for(&p.name)
        .and_then(|o| o.provider_concurrency)
        .filter(|n| *n > 0)
}

/// `request_queue.global_concurrent_requests` (0 = none).
pub fn global_capacity(config: &Config) -> Option<u32> {
    Some(config.resilience.request_queue.global_concurrent_requests).filter(|n| *n > 0)
}

/// A connection's account gate capacity: `rate_limit_overrides.max_concurrent`, else the
/// connection's `max_concurrent`, else its provider's default per-connection cap
/// (`provider_quota_overrides[p].concurrency`, built in: `nvidia` 6).
pub fn account_capacity(config: &Config, connection: ConnectionId) -> Option<u32> {
    let c = config.connection(connection);
    c.rate_limit_overrides
        .max_concurrent
        .or(c.max_concurrent)
        .or_else(|| {
            let p = config.provider(c.provider);
            provider_default_concurrency(&config.resilience, &p.name, &p.quirks)
        })
        .filter(|n| *n > 0)
}

/// The capacity the settings in force give gate `key` (`None`: no gate), as an acquire
/// would name it: what a settings change applies to the live gates.
pub fn gate_capacity(config: &Config, key: &GateKey) -> Option<u32> {
    match key {
        GateKey::Global => global_capacity(config),
        GateKey::Provider(p) => provider_capacity(config, *p),
        GateKey::Account(c) | GateKey::QuotaShare(c) => account_capacity(config, *c),
        GateKey::Model(c, model) => model_capacity(config, *c, model),
        GateKey::Combo(combo, c, _) => combo_capacity(config, ComboId(*combo), *c),
    }
}

/// A round-robin combo's per-model semaphore on `connection` (B §2.2): the connection's
/// account cap when it has one, else the combo's `concurrency_per_model` (at least 1).
pub fn combo_capacity(config: &Config, combo: ComboId, connection: ConnectionId) -> Option<u32> {
    let settings = &config.combo_by_id(combo)?.settings;
    Some(
        account_capacity(config, connection)
            .unwrap_or(settings.concurrency_per_model)
            .max(1),
    )
}

/// `rate_limit_overrides.model_concurrency[model]` (exact upstream model id).
pub fn model_capacity(config: &Config, connection: ConnectionId, model: &str) -> Option<u32> {
    config
        .connection(connection)
        .rate_limit_overrides
        .model_concurrency
        .iter()
        .find(|(m, _)| m == model)
        .map(|(_, n)| *n)
        .filter(|n| *n > 0)
}

/// Where `connection`'s gates live.
pub fn gate_home(config: &Config, connection: ConnectionId) -> GateHome {
    if global_capacity(config).is_some() {
        return GateHome::Global;
    }
    let provider = config.connection(connection).provider;
    if provider_capacity(config, provider).is_some() {
        return GateHome::Provider(provider);
    }
    GateHome::Connection(connection)
}

/// The gates an attempt on `connection` for `model` needs, widest first (gates without a
/// capacity are dropped by the table).
pub fn gate_requirements(config: &Config, connection: ConnectionId, model: &str) -> Vec<GateReq> {
    let provider = config.connection(connection).provider;
    vec![
        GateReq::new(GateKey::Global, global_capacity(config)),
        GateReq::new(
            GateKey::Provider(provider),
            provider_capacity(config, provider),
        ),
        GateReq::new(
            GateKey::Account(connection),
            account_capacity(config, connection),
        ),
        GateReq::new(
            GateKey::Model(connection, model.into()),
            model_capacity(config, connection, model),
        ),
    ]
}

/// A connection's request-queue settings (whether or not its limiter is on).
pub fn limiter_settings(config: &Config, connection: ConnectionId) -> LimiterSettings {
    let conn = config.connection(connection);
    let provider = config.provider(conn.provider);
    LimiterSettings::resolve(
        &config.resilience,
        &conn.rate_limit_overrides,
        provider.quirks.max_wait_floor_ms,
        provider.auth,
        conn.enabled,
    )
}

/// The queue budget `max_wait_ms` of a connection (its override, else the setting with the
/// provider's floor): bounds every local wait of an attempt — queue, gates, window.
pub fn effective_max_wait_ms(config: &Config, connection: ConnectionId) -> u64 {
    limiter_settings(config, connection).max_wait_ms
}

/// How long an upstream answer blocks the connection's gate (B §2.1 rule 7): a 429 that
/// says when to come back blocks it until then, so waiters queued there wait (or time
/// out) instead of meeting the same refusal. Not for `disable_cooling` connections.
pub fn gate_block_ms(
    config: &Config,
    connection: ConnectionId,
    status: u16,
    decision: &FallbackDecision,
) -> Option<u64> {
    let applies = status == 429
        && decision.used_upstream_retry_hint
        && decision.cooldown_ms > 0
        && !config.connection(connection).disable_cooling;
    applies.then_some(decision.cooldown_ms)
}

/// The settings and limiter key of a connection's request queue for `model`, when its
/// limiter is on (the one place both are derived).
pub fn queue_of(
    config: &Config,
    connection: ConnectionId,
    model: &str,
) -> Option<(LimiterSettings, String)> {
    let settings = limiter_settings(config, connection);
    let conn = config.connection(connection);
    let provider = config.provider(conn.provider);
    settings.enabled.then(|| {
        let key = limiter_key(KeyParts {
            provider: &provider.name,
            scheme: provider.quirks.limiter_key,
            connection: &conn.name,
            model: Some(model),
            codex_key: None,
            quota_family: None,
        });
        (settings, key)
    })
}

/// The provider sliding window (B §1.2b) of `connection`, with its counter key.
pub fn window_of(config: &Config, connection: ConnectionId) -> Option<(ProviderWindow, String)> {
    let conn = config.connection(connection);
    let provider = config.provider(conn.provider);
    ProviderWindow::for_provider(&config.resilience, &provider.name, &provider.quirks)
        .map(|w| (w, ProviderWindow::key(&provider.name, Some(&conn.name))))
}

/// What admission reads of one connection on every attempt, resolved from the
/// configuration once per generation (see [`Resolved`]) instead of per request: the
/// limiter settings, the provider window and the gate capacities that do not depend on
/// the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// [`limiter_settings`] (the queue applies when `limiter.enabled`).
    pub limiter: LimiterSettings,
    /// The provider's sliding window ([`window_of`] without its counter key).
    pub window: Option<ProviderWindow>,
    /// [`global_capacity`].
    pub global: Option<u32>,
    /// [`provider_capacity`] of the connection's provider.
    pub provider: Option<u32>,
    /// [`account_capacity`].
    pub account: Option<u32>,
    /// Whether `rate_limit_overrides.model_concurrency` caps any model: without, no model
    /// has a [`model_capacity`] and the model is not looked up.
    pub model_caps: bool,
}

impl Admission {
    /// `connection`'s admission under `config` (what the table holds for it).
    pub fn of(config: &Config, connection: ConnectionId) -> Self {
        let conn = config.connection(connection);
        let provider = config.provider(conn.provider);
        Self {
            limiter: limiter_settings(config, connection),
            window: ProviderWindow::for_provider(
                &config.resilience,
                &provider.name,
                &provider.quirks,
            ),
            global: global_capacity(config),
            provider: provider_capacity(config, conn.provider),
            account: account_capacity(config, connection),
            model_caps: conn
                .rate_limit_overrides
                .model_concurrency
                .iter()
                .any(|(_, n)| *n > 0),
        }
    }

    /// Whether an attempt on `connection` for `model` passes through the composite gate:
    /// any of its gates has a capacity (`config` is the configuration this was resolved
    /// from).
    pub fn gated(&self, config: &Config, connection: ConnectionId, model: &str) -> bool {
        self.global.is_some()
            || self.provider.is_some()
            || self.account.is_some()
            || (self.model_caps && model_capacity(config, connection, model).is_some())
    }

    /// Whether an attempt takes a slot of the request queue or the provider window
    /// ([`queue_of`] or [`window_of`] is `Some`).
    pub fn queued(&self) -> bool {
        self.limiter.enabled || self.window.is_some()
    }
}

/// Every connection's [`Admission`] under one configuration, by connection slot. A shard
/// builds one with each configuration generation it adopts (`shard::Generation`, through
/// `App::derive`: start, reload, runtime settings; read by `owners::admission`), so a
/// request reads its connection's settings instead of
/// resolving them from the configuration (override lists scanned by name, clamps and
/// precedence: ~400 instructions per request), and a changed configuration is read at once
/// by the requests that start on it.
#[derive(Debug, Default)]
pub struct Resolved {
    by_slot: Vec<Admission>,
}

impl Resolved {
    pub fn new(config: &Config) -> Self {
        Self {
            by_slot: config
                .connections
                .iter()
                .map(|c| Admission::of(config, c.id))
                .collect(),
        }
    }

    /// `connection`'s admission; `config` is the configuration the table was built from
    /// (an id it does not have is resolved from it: its disabled placeholder).
    pub fn get(&self, config: &Config, connection: ConnectionId) -> Admission {
        config
            .connection_slot(connection)
            .and_then(|i| self.by_slot.get(i))
            .copied()
            .unwrap_or_else(|| Admission::of(config, connection))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_str;

    fn config(extra: &str) -> Config {
        let toml = format!(
            "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
             [[providers]]\nid = \"nvidia\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
             [[connections]]\nid = \"a\"\nprovider = \"p\"\n\
             [[connections]]\nid = \"b\"\nprovider = \"p\"\nmax_concurrent = 3\n\
             [connections.rate_limit_overrides]\nmodel_concurrency = {{ \"m1\" = 1 }}\n\
             [[connections]]\nid = \"n\"\nprovider = \"nvidia\"\n{extra}"
        );
        match load_str(&toml, &|_| None) {
            Ok(o) => o.config,
            Err(e) => panic!("config: {e}"),
        }
    }

    const A: ConnectionId = ConnectionId(0);
    const B: ConnectionId = ConnectionId(1);
    const N: ConnectionId = ConnectionId(2);

    #[test]
    fn home_is_the_widest_configured_gate() {
        let c = config("");
        assert_eq!(gate_home(&c, A), GateHome::Connection(A));
        assert_eq!(gate_home(&c, N), GateHome::Connection(N));
        let c = config("[resilience.provider_quota_overrides.p]\nprovider_concurrency = 2\n");
        assert_eq!(gate_home(&c, A), GateHome::Provider(ProviderId(0)));
        assert_eq!(gate_home(&c, B), GateHome::Provider(ProviderId(0)));
        assert_eq!(gate_home(&c, N), GateHome::Connection(N));
        let c = config(
            "[resilience.request_queue]\nglobal_concurrent_requests = 5\n\
             [resilience.provider_quota_overrides.p]\nprovider_concurrency = 2\n",
        );
        for conn in [A, B, N] {
            assert_eq!(gate_home(&c, conn), GateHome::Global);
        }
    }

    fn gated(c: &Config, connection: ConnectionId, model: &str) -> bool {
        Admission::of(c, connection).gated(c, connection, model)
    }

    #[test]
    fn requirements_and_gated() {
        let c = config("");
        assert!(!gated(&c, A, "m"));
        assert!(gated(&c, B, "m"), "max_concurrent");
        assert!(gated(&c, N, "m"), "nvidia's default per-connection cap");
        assert_eq!(account_capacity(&c, N), Some(6));
        assert_eq!(model_capacity(&c, B, "m1"), Some(1));
        assert_eq!(model_capacity(&c, B, "m"), None);
        let reqs = gate_requirements(&c, B, "m1");
        let caps: Vec<Option<u32>> = reqs.iter().map(|r| r.capacity).collect();
        assert_eq!(caps, vec![None, None, Some(3), Some(1)]);
        let c = config(
            "[resilience.request_queue]\nglobal_concurrent_requests = 5\n\
             [resilience.provider_quota_overrides.p]\nprovider_concurrency = 2\n\
             [resilience.provider_quota_overrides.nvidia]\nconcurrency = 2\n",
        );
        assert!(gated(&c, A, "m"));
        let caps: Vec<Option<u32>> = gate_requirements(&c, A, "m")
            .iter()
            .map(|r| r.capacity)
            .collect();
        assert_eq!(caps, vec![Some(5), Some(2), None, None]);
        assert_eq!(
            account_capacity(&c, N),
            Some(2),
            "override of the nvidia default"
        );
    }

    /// The table holds for every connection what the per-request functions resolve from
    /// the configuration, under every kind of setting that feeds them, and an id the
    /// configuration does not have gets its placeholder's.
    #[test]
    fn the_table_holds_what_each_function_resolves() {
        let extras = [
            "",
            "[resilience.provider_quota_overrides.p]\nprovider_concurrency = 2\nrpm = 7\nconcurrency = 4\n",
            "[resilience.provider_quota_overrides.nvidia]\nrpm = 5\nconcurrency = 9\n",
            "[resilience.request_queue]\nglobal_concurrent_requests = 5\nmax_wait_ms = 2500\n\
             auto_enable_api_key_providers = true\nconcurrent_requests = 3\n",
            "[resilience.request_queue]\nrequests_per_minute = 60\nmin_time_between_requests_ms = 10\n\
             execution_max_wait_ms = 9000\nmax_queue_depth = 4\n",
            "[[connections]]\nid = \"o\"\nprovider = \"p\"\napi_key_env = \"TG_UNSET\"\n\
             [connections.rate_limit_overrides]\nrequests_per_minute = 30\nmax_wait_ms = 700\n\
             max_concurrent = 2\nmodel_concurrency = { \"m2\" = 2 }\n",
            "[[connections]]\nid = \"o\"\nprovider = \"p\"\n\
             [connections.rate_limit_overrides]\nmin_time_between_requests_ms = 0\n\
             execution_max_wait_ms = 50\nmodel_concurrency = { \"m1\" = 3 }\n",
        ];
        for extra in extras {
            let c = config(extra);
            let table = Resolved::new(&c);
            let ids = c
                .connections
                .iter()
                .map(|x| x.id)
                .chain([ConnectionId(999)]);
            for id in ids {
                let a = table.get(&c, id);
                assert_eq!(a, Admission::of(&c, id), "{extra}");
                assert_eq!(a.limiter, limiter_settings(&c, id), "{extra}");
                assert_eq!(a.window, window_of(&c, id).map(|(w, _)| w), "{extra}");
                assert_eq!(a.account, account_capacity(&c, id), "{extra}");
                assert_eq!(a.limiter.max_wait_ms, effective_max_wait_ms(&c, id));
                assert_eq!(
                    a.queued(),
                    queue_of(&c, id, "m").is_some() || window_of(&c, id).is_some(),
                    "{extra}"
                );
                for model in ["m", "m1", "m2", "x", ""] {
                    let provider = c.connection(id).provider;
                    let before = global_capacity(&c).is_some()
                        || provider_capacity(&c, provider).is_some()
                        || account_capacity(&c, id).is_some()
                        || model_capacity(&c, id, model).is_some();
                    assert_eq!(a.gated(&c, id, model), before, "{extra} {model}");
                }
            }
        }
    }

    #[test]
    fn windows() {
        let c = config("");
        assert_eq!(window_of(&c, A), None);
        let (w, key) = window_of(&c, N).expect("nvidia has a default window");
        assert_eq!((w.limit, key.as_str()), (40, "nvidia:n"));
        let c = config("[resilience.provider_quota_overrides.p]\nrpm = 3\n");
        assert_eq!(window_of(&c, A).map(|(w, _)| w.limit), Some(3));
    }
}
