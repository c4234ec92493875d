//! The persisted state as the process holds it: records keyed by the config's dense ids
//! ([`Records`]), the changes an owner shard reports ([`Delta`]), and the mapping to and
//! from the file's named entries ([`Records::to_contents`], [`Records::from_contents`]).
//!
//! The mapping never trusts the file: an entry naming a provider or connection the config
//! no longer has, or carrying a value this release does not know, is dropped and counted
//! (the caller logs it); the rest of the file is still used.

use std::collections::{BTreeMap, HashMap};

use crate::config::runtime::ConnectionSettings;
use crate::config::{Config, ConnectionId, ProviderId, RateLimitOverrides};
use crate::resilience::Reason;
use crate::resilience::breaker::{
    BreakerKey, BreakerRecord, BreakerState, FailureKind, KindCounts,
};
use crate::resilience::connection::{
    ConnectionState, Cooldown, ErrorFields, ExpiredStrikes, ProviderErrorType, RejectStreak,
    TestStatus, parse_reason,
};
use crate::resilience::tracker::{TrackerKey, TrackerRecord};
use crate::routing::lease::{LeaseState, OwnerHash, PersistedLease};
use crate::routing::session::SessionDigest;

use super::schema::{
    BreakerEntry, ConnectionEntry, ConnectionOverrideEntry, Contents, LeaseEntry, ModelCapEntry,
    PinEntry, SettingsPatchEntry, StreakEntry, StrikesEntry, TrackerEntry,
};

/// A session's pin for one provider: `(provider, session digest)`.
pub type PinKey = (ProviderId, SessionDigest);

/// A session pin as persisted: instants in wall-clock ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinRecord {
    pub connection: ConnectionId,
    pub created_wall_ms: u64,
    pub last_used_wall_ms: u64,
    pub expires_wall_ms: u64,
}

/// Every persisted record, by key. Clean records are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub breakers: BTreeMap<BreakerKey, BreakerRecord>,
    pub connections: BTreeMap<ConnectionId, ConnectionState>,
    pub trackers: BTreeMap<TrackerKey, TrackerRecord>,
    pub pins: BTreeMap<PinKey, PinRecord>,
    /// Each lease owner's latest lease (all on shard 0).
    pub leases: BTreeMap<OwnerHash, PersistedLease>,
    /// The `PATCH /api/resilience` bodies accepted since start (or the last reload),
    /// merged (`RuntimeSettings::resilience_patch`); empty when none.
    pub settings_patch: serde_json::Map<String, serde_json::Value>,
    /// `PATCH /api/providers/{id}` settings, by connection id (the configured name).
    pub connection_overrides: BTreeMap<String, ConnectionSettings>,
}

/// What changed on one owner shard since its last report: each key's record now, or
/// `None` when it is back to clean (or gone).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub breakers: Vec<(BreakerKey, Option<BreakerRecord>)>,
    pub connections: Vec<(ConnectionId, Option<ConnectionState>)>,
    pub trackers: Vec<(TrackerKey, Option<TrackerRecord>)>,
    pub pins: Vec<(PinKey, Option<PinRecord>)>,
    pub leases: Vec<(OwnerHash, Option<PersistedLease>)>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.breakers.len()
            + self.connections.len()
            + self.trackers.len()
            + self.pins.len()
            + self.leases.len()
    }
}

fn put<K: Ord, V>(map: &mut BTreeMap<K, V>, key: K, value: Option<V>) {
    match value {
        Some(v) => {
            map.insert(key, v);
        }
        None => {
            map.remove(&key);
        }
    }
}

impl Records {
    pub fn is_empty(&self) -> bool {
        self.breakers.is_empty()
            && self.connections.is_empty()
            && self.trackers.is_empty()
            && self.pins.is_empty()
            && self.leases.is_empty()
            && self.settings_patch.is_empty()
            && self.connection_overrides.is_empty()
    }

    /// Applies an owner's report.
    pub fn apply(&mut self, delta: Delta) {
        for (k, v) in delta.breakers {
            put(&mut self.breakers, k, v);
        }
        for (k, v) in delta.connections {
            put(&mut self.connections, k, v);
        }
        for (k, v) in delta.trackers {
            put(&mut self.trackers, k, v);
        }
        for (k, v) in delta.pins {
            put(&mut self.pins, k, v);
        }
        for (k, v) in delta.leases {
            put(&mut self.leases, k, v);
        }
    }

    /// The file's named entries.
    pub fn to_contents(&self, config: &Config) -> Contents {
        let provider = |p: ProviderId| {
            config
                .provider_by_id(p)
                .map_or_else(String::new, |p| p.name.clone())
        };
        let connection = |c: ConnectionId| config.connection_by_id(c);
        let mut contents = Contents::default();
        for (key, r) in &self.breakers {
            let (p, c) = match *key {
                BreakerKey::Provider(p) => (provider(p), None),
                BreakerKey::Connection(c) => match connection(c) {
                    Some(conn) => (provider(conn.provider), Some(conn.name.clone())),
                    None => continue,
                },
            };
            if p.is_empty() {
                // A provider a reload removed: its state goes with it.
                continue;
            }
            contents.breakers.push(breaker_entry(p, c, r));
        }
        for (id, s) in &self.connections {
            let Some(conn) = connection(*id) else {
                continue;
            };
            contents.connections.push(connection_entry(
                conn.name.clone(),
                provider(conn.provider),
                s,
            ));
        }
        for (key, r) in &self.trackers {
            let (p, c) = match *key {
                TrackerKey::Provider(p) => (provider(p), None),
                TrackerKey::Connection(p, c) => match connection(c) {
                    Some(conn) => (provider(p), Some(conn.name.clone())),
                    None => continue,
                },
            };
            if p.is_empty() {
                continue;
            }
            contents.provider_cooldowns.push(TrackerEntry {
                provider: p,
                connection: c,
                last_failure_wall_ms: r.last_failure_wall_ms,
                failure_count: r.failure_count,
                retention_ms: r.retention_ms,
                failure_timestamps_wall_ms: r.failure_timestamps_wall_ms.clone(),
            });
        }
        if !self.settings_patch.is_empty() {
            contents.runtime_settings.push(SettingsPatchEntry {
                patch_json: serde_json::Value::Object(self.settings_patch.clone()).to_string(),
            });
        }
        for (name, o) in &self.connection_overrides {
            let Some(conn) = config.connections.iter().find(|c| &c.name == name) else {
                continue;
            };
            contents.connection_overrides.push(override_entry(
                name.clone(),
                provider(conn.provider),
                o,
            ));
        }
        for ((p, session), pin) in &self.pins {
            let Some(conn) = connection(pin.connection) else {
                continue;
            };
            contents.affinity_pins.push(PinEntry {
                provider: provider(*p),
                session: hex::encode(session),
                connection: conn.name.clone(),
                created_wall_ms: pin.created_wall_ms,
                last_used_wall_ms: pin.last_used_wall_ms,
                expires_wall_ms: pin.expires_wall_ms,
            });
        }
        for (owner, l) in &self.leases {
            let Some(conn) = connection(l.connection) else {
                continue;
            };
            contents.leases.push(LeaseEntry {
                owner: hex::encode(owner),
                key: l.key.clone(),
                provider: provider(conn.provider),
                connection: conn.name.clone(),
                generation: l.generation,
                state: l.state.as_str().to_owned(),
                acquired_wall_ms: l.acquired_wall_ms,
                renewed_wall_ms: l.renewed_wall_ms,
                expires_wall_ms: l.expires_wall_ms,
                ended_wall_ms: l.ended_wall_ms,
            });
        }
        contents
    }

    /// The records of a file that this config still names. Returns the records and one
    /// line per entry dropped.
    pub fn from_contents(contents: &Contents, config: &Config) -> (Records, Vec<String>) {
        let mut r = Records::default();
        let mut dropped = Vec::new();
        // Names to ids, once: a file of every connection stays linear in its size.
        let providers: HashMap<&str, ProviderId> = config
            .providers
            .iter()
            .map(|p| (p.name.as_str(), p.id))
            .collect();
        let connections: HashMap<&str, (ConnectionId, ProviderId)> = config
            .connections
            .iter()
            .map(|c| (c.name.as_str(), (c.id, c.provider)))
            .collect();
        let provider = |name: &str| providers.get(name).copied();
        let connection = |name: &str, provider_name: &str| {
            connections
                .get(name)
                .filter(|(_, p)| provider(provider_name) == Some(*p))
                .map(|(c, _)| *c)
        };
        for e in &contents.breakers {
            let key = match &e.connection {
                None => provider(&e.provider).map(BreakerKey::Provider),
                Some(c) => connection(c, &e.provider).map(BreakerKey::Connection),
            };
            match (key, breaker_record(e)) {
                (Some(k), Some(rec)) => {
                    r.breakers.insert(k, rec);
                }
                (None, _) => dropped.push(format!(
                    "breaker {}{}: not in the config",
                    e.provider,
                    e.connection
                        .as_deref()
                        .map(|c| format!("::conn::{c}"))
                        .unwrap_or_default()
                )),
                (_, None) => dropped.push(format!("breaker {}: unknown values", e.provider)),
            }
        }
        for e in &contents.connections {
            match (connection(&e.connection, &e.provider), connection_state(e)) {
                (Some(id), Some(s)) => {
                    r.connections.insert(id, s);
                }
                (None, _) => dropped.push(format!(
                    "connection {} ({}): not in the config",
                    e.connection, e.provider
                )),
                (_, None) => dropped.push(format!("connection {}: unknown values", e.connection)),
            }
        }
        for e in &contents.provider_cooldowns {
            let key = match &e.connection {
                None => provider(&e.provider).map(TrackerKey::Provider),
                Some(c) => provider(&e.provider)
                    .zip(connection(c, &e.provider))
                    .map(|(p, c)| TrackerKey::Connection(p, c)),
            };
            match key {
                Some(k) => {
                    r.trackers.insert(
                        k,
                        TrackerRecord {
                            last_failure_wall_ms: e.last_failure_wall_ms,
                            failure_count: e.failure_count,
                            retention_ms: e.retention_ms,
                            failure_timestamps_wall_ms: e.failure_timestamps_wall_ms.clone(),
                        },
                    );
                }
                None => dropped.push(format!(
                    "provider cooldown {}{}: not in the config",
                    e.provider,
                    e.connection
                        .as_deref()
                        .map(|c| format!(":{c}"))
                        .unwrap_or_default()
                )),
            }
        }
        for e in &contents.runtime_settings {
            match serde_json::from_str::<serde_json::Value>(&e.patch_json) {
                Ok(serde_json::Value::Object(m)) => r.settings_patch = m,
                _ => dropped.push("runtime settings: not a JSON object".to_owned()),
            }
        }
        for e in &contents.connection_overrides {
            match connection(&e.connection, &e.provider) {
                Some(_) => {
                    r.connection_overrides
                        .insert(e.connection.clone(), override_settings(e));
                }
                None => dropped.push(format!(
                    "connection override {} ({}): not in the config",
                    e.connection, e.provider
                )),
            }
        }
        for e in &contents.affinity_pins {
            let session = hex::decode(&e.session)
                .ok()
                .and_then(|b| SessionDigest::try_from(b.as_slice()).ok());
            let key = provider(&e.provider).zip(session);
            match (key, connection(&e.connection, &e.provider)) {
                (Some(k), Some(c)) => {
                    r.pins.insert(
                        k,
                        PinRecord {
                            connection: c,
                            created_wall_ms: e.created_wall_ms,
                            last_used_wall_ms: e.last_used_wall_ms,
                            expires_wall_ms: e.expires_wall_ms,
                        },
                    );
                }
                (None, _) if provider(&e.provider).is_some() => {
                    dropped.push(format!("affinity pin ({}): bad session digest", e.provider));
                }
                _ => dropped.push(format!(
                    "affinity pin {} ({}): not in the config",
                    e.connection, e.provider
                )),
            }
        }
        for e in &contents.leases {
            let owner = hex::decode(&e.owner)
                .ok()
                .and_then(|b| OwnerHash::try_from(b.as_slice()).ok());
            let state = LeaseState::parse(&e.state);
            match (owner, state, connection(&e.connection, &e.provider)) {
                (Some(owner), Some(state), Some(c)) => {
                    r.leases.insert(
                        owner,
                        PersistedLease {
                            connection: c,
                            key: e.key.clone(),
                            generation: e.generation,
                            state,
                            acquired_wall_ms: e.acquired_wall_ms,
                            renewed_wall_ms: e.renewed_wall_ms,
                            expires_wall_ms: e.expires_wall_ms,
                            ended_wall_ms: e.ended_wall_ms,
                        },
                    );
                }
                (_, _, None) => dropped.push(format!(
                    "lease on {} ({}): not in the config",
                    e.connection, e.provider
                )),
                _ => dropped.push(format!(
                    "lease on {} ({}): bad owner digest or state {:?}",
                    e.connection, e.provider, e.state
                )),
            }
        }
        (r, dropped)
    }
}

fn override_entry(
    connection: String,
    provider: String,
    o: &ConnectionSettings,
) -> ConnectionOverrideEntry {
    let r = &o.rate_limit_overrides;
    ConnectionOverrideEntry {
        connection,
        provider,
        max_concurrent: o.max_concurrent,
        rl_max_concurrent: r.max_concurrent,
        rl_model_concurrency: r
            .model_concurrency
            .iter()
            .map(|(model, cap)| ModelCapEntry {
                model: model.clone(),
                cap: *cap,
            })
            .collect(),
        rl_max_wait_ms: r.max_wait_ms,
        rl_execution_max_wait_ms: r.execution_max_wait_ms,
        rl_requests_per_minute: r.requests_per_minute,
        rl_min_time_between_requests_ms: r.min_time_between_requests_ms,
    }
}

fn override_settings(e: &ConnectionOverrideEntry) -> ConnectionSettings {
    ConnectionSettings {
        max_concurrent: e.max_concurrent,
        rate_limit_overrides: RateLimitOverrides {
            max_concurrent: e.rl_max_concurrent,
            model_concurrency: e
                .rl_model_concurrency
                .iter()
                .map(|m| (m.model.clone(), m.cap))
                .collect(),
            max_wait_ms: e.rl_max_wait_ms,
            execution_max_wait_ms: e.rl_execution_max_wait_ms,
            requests_per_minute: e.rl_requests_per_minute,
            min_time_between_requests_ms: e.rl_min_time_between_requests_ms,
        },
    }
}

fn breaker_entry(provider: String, connection: Option<String>, r: &BreakerRecord) -> BreakerEntry {
    BreakerEntry {
        provider,
        connection,
        state: r.state.as_str().to_owned(),
        failure_count: r.failure_count,
        last_failure_wall_ms: r.last_failure_wall_ms,
        last_failure_kind: r.last_failure_kind.map(|k| k.as_str().to_owned()),
        open_cycle_count: r.open_cycle_count,
        transient_failures: r.kind_failure_counts.transient,
        rate_limit_failures: r.kind_failure_counts.rate_limit,
        quota_exhausted_failures: r.kind_failure_counts.quota_exhausted,
        open_until_wall_ms: r.open_until_wall_ms,
    }
}

fn breaker_state(s: &str) -> Option<BreakerState> {
    [
        BreakerState::Closed,
        BreakerState::Degraded,
        BreakerState::Open,
        BreakerState::HalfOpen,
    ]
    .into_iter()
    .find(|x| x.as_str() == s)
}

fn failure_kind(s: &str) -> Option<FailureKind> {
    [
        FailureKind::Transient,
        FailureKind::RateLimit,
        FailureKind::QuotaExhausted,
    ]
    .into_iter()
    .find(|x| x.as_str() == s)
}

/// `None` when a value is not one this release knows.
fn breaker_record(e: &BreakerEntry) -> Option<BreakerRecord> {
    let last_failure_kind = match &e.last_failure_kind {
        Some(k) => Some(failure_kind(k)?),
        None => None,
    };
    Some(BreakerRecord {
        state: breaker_state(&e.state)?,
        failure_count: e.failure_count,
        last_failure_wall_ms: e.last_failure_wall_ms,
        last_failure_kind,
        open_cycle_count: e.open_cycle_count,
        kind_failure_counts: KindCounts {
            transient: e.transient_failures,
            rate_limit: e.rate_limit_failures,
            quota_exhausted: e.quota_exhausted_failures,
        },
        open_until_wall_ms: e.open_until_wall_ms,
    })
}

fn connection_entry(connection: String, provider: String, s: &ConnectionState) -> ConnectionEntry {
    ConnectionEntry {
        connection,
        provider,
        test_status: s.test_status.as_str().to_owned(),
        rate_limited_until_wall_ms: s.cooldown.map(|c| c.until_ms),
        cooldown_reason: s.cooldown.map(|c| c.reason.as_str().to_owned()),
        backoff_level: s.backoff_level,
        last_error: s.error.as_ref().map(|e| e.message.clone()),
        last_error_type: s
            .error
            .as_ref()
            .and_then(|e| e.error_type)
            .map(|t| t.as_str().to_owned()),
        error_code: s.error.as_ref().and_then(|e| e.code),
        last_error_at_wall_ms: s.error.as_ref().map(|e| e.at_ms),
        reject_streak: s.reject_streak.map(|r| StreakEntry {
            count: r.count,
            last_at_wall_ms: r.last_at_ms,
            until_wall_ms: r.until_ms,
        }),
        expired_strikes: s.expired_strikes.map(|x| StrikesEntry {
            count: x.count,
            last_at_wall_ms: x.last_at_ms,
        }),
    }
}

/// `None` when a value is not one this release knows.
fn connection_state(e: &ConnectionEntry) -> Option<ConnectionState> {
    let cooldown = match (e.rate_limited_until_wall_ms, &e.cooldown_reason) {
        (Some(until_ms), reason) => Some(Cooldown {
            until_ms,
            reason: match reason {
                Some(r) => parse_reason(r)?,
                None => Reason::Unknown,
            },
        }),
        (None, _) => None,
    };
    let error_type = match &e.last_error_type {
        Some(t) => Some(ProviderErrorType::parse(t)?),
        None => None,
    };
    let error = match (&e.last_error, e.last_error_at_wall_ms) {
        (Some(message), at) => Some(ErrorFields {
            message: message.clone(),
            error_type,
            code: e.error_code,
            at_ms: at.unwrap_or(0),
        }),
        (None, _) => None,
    };
    Some(ConnectionState {
        cooldown,
        test_status: TestStatus::parse(&e.test_status)?,
        error,
        backoff_level: e.backoff_level,
        reject_streak: e.reject_streak.map(|r| RejectStreak {
            count: r.count,
            last_at_ms: r.last_at_wall_ms,
            until_ms: r.until_wall_ms,
        }),
        expired_strikes: e.expired_strikes.map(|x| ExpiredStrikes {
            count: x.count,
            last_at_ms: x.last_at_wall_ms,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOML: &str = "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
                        [[connections]]\nid = \"a\"\nprovider = \"p\"\n\
                        [[connections]]\nid = \"b\"\nprovider = \"p\"\n";

    fn config(toml: &str) -> Config {
        crate::config::load_str(toml, &|_| None).unwrap().config
    }

    fn records() -> Records {
        let mut r = Records::default();
        r.breakers.insert(
            BreakerKey::Provider(ProviderId(0)),
            BreakerRecord {
                state: BreakerState::Open,
                failure_count: 5,
                last_failure_wall_ms: Some(10),
                last_failure_kind: Some(FailureKind::RateLimit),
                open_cycle_count: 2,
                kind_failure_counts: KindCounts {
                    transient: 1,
                    rate_limit: 4,
                    quota_exhausted: 0,
                },
                open_until_wall_ms: Some(99),
            },
        );
        r.connections.insert(
            ConnectionId(1),
            ConnectionState {
                cooldown: Some(Cooldown {
                    until_ms: 500,
                    reason: Reason::RateLimitExceeded,
                }),
                test_status: TestStatus::Unavailable,
                error: Some(ErrorFields {
                    message: "slow down".into(),
                    error_type: Some(ProviderErrorType::RateLimited),
                    code: Some(429),
                    at_ms: 400,
                }),
                backoff_level: 3,
                reject_streak: Some(RejectStreak {
                    count: 1,
                    last_at_ms: 1,
                    until_ms: 2,
                }),
                expired_strikes: Some(ExpiredStrikes {
                    count: 2,
                    last_at_ms: 3,
                }),
            },
        );
        r.trackers.insert(
            TrackerKey::Connection(ProviderId(0), ConnectionId(0)),
            TrackerRecord {
                last_failure_wall_ms: 7,
                failure_count: 1,
                retention_ms: 8,
                failure_timestamps_wall_ms: vec![],
            },
        );
        r.pins.insert(
            (ProviderId(0), [9; 32]),
            PinRecord {
                connection: ConnectionId(1),
                created_wall_ms: 1,
                last_used_wall_ms: 2,
                expires_wall_ms: 3,
            },
        );
        r.leases.insert(
            [4; 32],
            PersistedLease {
                connection: ConnectionId(1),
                key: "agent".into(),
                generation: 3,
                state: LeaseState::Released,
                acquired_wall_ms: 10,
                renewed_wall_ms: 11,
                expires_wall_ms: 12,
                ended_wall_ms: 11,
            },
        );
        r.settings_patch
            .insert("requestQueue".into(), serde_json::json!({"maxWaitMs": 10}));
        r.connection_overrides.insert(
            "a".into(),
            ConnectionSettings {
                max_concurrent: Some(3),
                rate_limit_overrides: RateLimitOverrides {
                    model_concurrency: vec![("m".into(), 2)],
                    ..RateLimitOverrides::default()
                },
            },
        );
        r
    }

    #[test]
    fn names_round_trip_and_survive_a_reordered_config() {
        let c = config(TOML);
        let contents = records().to_contents(&c);
        let (back, dropped) = Records::from_contents(&contents, &c);
        assert!(dropped.is_empty(), "{dropped:?}");
        assert_eq!(back, records());
        // The same names under other indexes: the records follow the names.
        let swapped = config(
            "[[providers]]\nid = \"p\"\nformat = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n\
             [[connections]]\nid = \"b\"\nprovider = \"p\"\n\
             [[connections]]\nid = \"a\"\nprovider = \"p\"\n",
        );
        let (moved, _) = Records::from_contents(&contents, &swapped);
        assert!(moved.connections.contains_key(&ConnectionId(0)));
        assert!(
            moved
                .trackers
                .contains_key(&TrackerKey::Connection(ProviderId(0), ConnectionId(1)))
        );
        assert_eq!(
            moved.pins[&(ProviderId(0), [9; 32])].connection,
            ConnectionId(0)
        );
        assert_eq!(moved.leases[&[4; 32]].connection, ConnectionId(0));
    }

    #[test]
    fn unknown_names_and_values_are_dropped_and_reported() {
        let c = config(TOML);
        let mut contents = records().to_contents(&c);
        contents.connections[0].connection = "gone".into();
        contents.breakers[0].state = "SIDEWAYS".into();
        let (back, dropped) = Records::from_contents(&contents, &c);
        assert!(back.connections.is_empty() && back.breakers.is_empty());
        assert_eq!(dropped.len(), 2);
        assert_eq!(back.trackers.len(), 1);
    }

    #[test]
    fn deltas_set_and_clear() {
        let mut r = records();
        r.apply(Delta {
            connections: vec![(ConnectionId(1), None)],
            ..Delta::default()
        });
        assert!(r.connections.is_empty());
    }
}
