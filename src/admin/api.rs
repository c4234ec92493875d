//! The management API's handlers (A §1.10, §1.11, §4.8, §5; B §9): each reads or changes
//! owner state through owner calls and answers OmniRoute's camelCase JSON.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{Value, json};

use super::connection;
use super::patch::{self, PatchError};
use super::routes::{Answer, CONNECTION_PREFIX, Route};
use crate::clock::Now;
use crate::config::{AuthKind, Config, ConnectionId};
use crate::error::{ErrorKind, GatewayError};
use crate::http1::{Method, RequestHead};
use crate::owners::Shard;
use crate::owners::health::client::{admin, admin_all};
use crate::owners::health::protocol::{AdminRequest, OwnerStatus, Reply};
use crate::resilience::backoff::format_rfc3339_ms;
use crate::resilience::breaker::{BreakerCounts, BreakerKey};
use crate::resilience::connection::{ClearOutcome, TestStatus};
use crate::shard::call::CallError;

/// Most ids `POST /api/resilience/cooldowns` takes (A §5.2).
const MAX_CONNECTION_IDS: usize = 1_000;
/// Longest id or provider name it takes.
const MAX_ID_CHARS: usize = 128;

pub async fn serve(
    shard: &Shard,
    head: &RequestHead,
    route: Route,
    body: &Bytes,
) -> Result<Answer, GatewayError> {
    let method = head.method();
    let value = match (route, method) {
        (Route::MonitoringHealth, _) => health(shard).await?,
        (Route::ResilienceReset, _) => reset(shard).await?,
        (Route::Resilience, Method::Patch) => patch_settings(shard, body)?,
        (Route::Resilience, _) => settings_json(shard.current().config(), None),
        (Route::Cooldowns, Method::Post) => clear_cooldowns(shard, body).await?,
        (Route::Cooldowns, _) => list_cooldowns(shard, head.query()).await?,
        (Route::ModelCooldowns, Method::Delete) => clear_model_cooldowns(shard, body).await?,
        (Route::ModelCooldowns, _) => list_model_cooldowns(shard).await?,
        (Route::Connection, _) => patch_connection(shard, head.path(), body)?,
        (Route::Healthz | Route::Readyz | Route::Metrics, _) => {
            return Err(GatewayError::new(
                ErrorKind::Internal,
                "not a management route",
            ));
        }
    };
    Ok((200, "application/json", value.to_string()))
}

fn unavailable(e: CallError) -> GatewayError {
    GatewayError::new(
        ErrorKind::MeshUnavailable,
        format!("an owner shard did not answer ({e:?})"),
    )
}

fn bad_request(message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorKind::MalformedRequest, message.into())
}

/// 400 "Invalid request" with `details: [{field, message}]` (A §4.8, §5.2, §5.3).
fn invalid(details: Vec<(String, String)>) -> GatewayError {
    let details: Vec<Value> = details
        .into_iter()
        .map(|(field, message)| json!({"field": field, "message": message}))
        .collect();
    GatewayError::new(ErrorKind::MalformedRequest, "Invalid request")
        .with_extra("details", Value::Array(details))
}

/// A JSON object body; invalid JSON is `Invalid JSON body`.
fn json_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, GatewayError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(invalid(vec![(
            "body".into(),
            "expected a JSON object".into(),
        )])),
        Err(_) => Err(GatewayError::new(
            ErrorKind::InvalidJson,
            "Invalid JSON body",
        )),
    }
}

/// Every owner's status, merged.
async fn status_all(shard: &Shard) -> Result<OwnerStatus, GatewayError> {
    let mut all = OwnerStatus::default();
    for reply in admin_all(shard, &AdminRequest::Status)
        .await
        .map_err(unavailable)?
    {
        if let Reply::Status(s) = reply {
            all.breakers.extend(s.breakers);
            all.connections.extend(s.connections);
            all.lockouts.extend(s.lockouts);
        }
    }
    all.breakers.sort_by_key(|b| b.key);
    all.connections.sort_by_key(|c| c.connection);
    all.lockouts.sort_by(|a, b| {
        b.remaining_ms
            .cmp(&a.remaining_ms)
            .then_with(|| a.provider.cmp(&b.provider))
            .then_with(|| a.model.cmp(&b.model))
    });
    Ok(all)
}

fn connection_name(config: &Config, c: Option<ConnectionId>) -> String {
    c.and_then(|c| config.connection_by_id(c))
        .map(|c| c.name.clone())
        .unwrap_or_default()
}

fn auth_str(a: AuthKind) -> &'static str {
    match a {
        AuthKind::ApiKey => "apikey",
        AuthKind::OAuth => "oauth",
        AuthKind::Local => "local",
    }
}

fn lockouts_json(config: &Config, status: &OwnerStatus) -> Vec<Value> {
    status
        .lockouts
        .iter()
        .map(|l| {
            json!({
                "provider": l.provider,
                "model": l.model,
                "connectionId": connection_name(config, l.connection),
                "reason": l.reason,
                "remainingMs": l.remaining_ms,
                "failureCount": l.failure_count,
            })
        })
        .collect()
}

/// `GET /api/monitoring/health` (A §1.10).
async fn health(shard: &Shard) -> Result<Value, GatewayError> {
    let generation = shard.current();
    let config = generation.config();
    let now = shard.now();
    let status = status_all(shard).await?;
    let mut counts = BreakerCounts::default();
    let mut provider_breakers = Vec::new();
    let mut provider_health = serde_json::Map::new();
    for b in &status.breakers {
        counts.add(b.state);
        let name = b.key.name(config);
        let last = b.last_failure_wall_ms.map(format_rfc3339_ms);
        // `provider` is the provider's name for every entry; a connection's breaker also
        // names its connection. `breaker` is the registry name (`providerHealth`'s key).
        let (provider, connection) = match b.key {
            BreakerKey::Provider(p) => (config.provider_by_id(p).map(|p| p.name.as_str()), None),
            BreakerKey::Connection(c) => {
                let conn = config.connection_by_id(c);
                let provider = conn.and_then(|c| config.provider_by_id(c.provider));
                (
                    provider.map(|p| p.name.as_str()),
                    conn.map(|c| c.name.as_str()),
                )
            }
        };
        provider_breakers.push(json!({
            "provider": provider.unwrap_or("unknown"),
            "connection": connection,
            "breaker": name,
            "state": b.state,
            "failureCount": b.failure_count,
            "lastFailure": last,
            "retryAfterMs": b.retry_after_ms,
            "scope": match b.key { BreakerKey::Provider(_) => "provider", BreakerKey::Connection(_) => "connection" },
        }));
        provider_health.insert(
            name,
            json!({
                "state": b.state,
                "failures": b.failure_count,
                "lastFailure": last,
                "retryAfterMs": b.retry_after_ms,
            }),
        );
    }
    // connectionHealth: providers with at least one cooling connection.
    let mut by_provider: BTreeMap<String, (usize, usize, u64)> = BTreeMap::new();
    for c in &config.connections {
        let provider = &config.provider(c.provider).name;
        let e = by_provider
            .entry(provider.clone())
            .or_insert((0, 0, u64::MAX));
        e.1 += 1;
        if let Some(until) = status
            .connections
            .iter()
            .find(|s| s.connection == c.id)
            .and_then(|s| s.rate_limited_until_ms)
            .filter(|u| *u > now.wall_ms)
        {
            e.0 += 1;
            e.2 = e.2.min(until - now.wall_ms);
        }
    }
    let connection_health: serde_json::Map<String, Value> = by_provider
        .into_iter()
        .filter(|(_, (cooling, _, _))| *cooling > 0)
        .map(|(p, (cooling, total, soonest))| {
            (
                p,
                json!({"coolingDown": cooling, "total": total, "soonestRetryAfterMs": soonest}),
            )
        })
        .collect();
    let terminal = status
        .connections
        .iter()
        .filter(|c| c.test_status.is_terminal())
        .count();
    let metrics = &generation.shared().metrics;
    let sum = |f: fn(&crate::shard::metrics::ShardMetrics) -> u64| -> u64 {
        metrics.iter().map(|m| f(m)).sum()
    };
    // Session affinity pins, from every shard's owner (a session's pins all live on its
    // owner shard, so the per-shard session counts add up). An owner that does not answer
    // leaves the spec's empty default.
    let pins = crate::owners::affinity::client::count_all(shard)
        .await
        .unwrap_or_default();
    let sessions = json!({
        "activeCount": pins.iter().map(|(_, s)| u64::from(*s)).sum::<u64>(),
        "stickyBoundCount": pins.iter().map(|(p, _)| u64::from(*p)).sum::<u64>(),
        "byApiKey": {},
        "top": [],
        "byShard": pins.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
    });
    // Exclusive session leases, all on the lease-owner shard (`null`: it did not answer).
    let leases = crate::owners::leases::client::count(shard).await;
    use std::sync::atomic::Ordering::Relaxed;
    let uptime_ms = now
        .wall_ms
        .saturating_sub(generation.shared().started_wall_ms);
    Ok(json!({
        "status": "healthy",
        "timestamp": format_rfc3339_ms(now.wall_ms),
        "version": env!("CARGO_PKG_VERSION"),
        "uptime": uptime_ms / 1000,
        "uptimeMs": uptime_ms,
        "shards": shard.shards(),
        "driver": generation.shared().driver,
        "activeConnections": config.connections.len(),
        "circuitBreakers": counts,
        "providerBreakers": provider_breakers,
        "providerHealth": provider_health,
        "connectionHealth": connection_health,
        "terminalConnections": terminal,
        "lockouts": lockouts_json(config, &status),
        "sessions": sessions,
        "leases": { "active": leases },
        "queue": {
            "requests": sum(|m| m.queue_requests.load(Relaxed)),
        },
        "gates": {
            "permits": sum(|m| m.gate_permits.load(Relaxed)),
            "waiters": sum(|m| m.gate_waiters.load(Relaxed)),
        },
        "requestsInFlight": sum(|m| m.in_flight.load(Relaxed)),
    }))
}

/// `POST /api/resilience/reset` (A §1.11): the body is ignored.
async fn reset(shard: &Shard) -> Result<Value, GatewayError> {
    let mut breakers = 0u64;
    let mut lockouts = 0u64;
    for reply in admin_all(shard, &AdminRequest::Reset)
        .await
        .map_err(unavailable)?
    {
        if let Reply::Reset {
            breakers: b,
            lockouts: l,
        } = reply
        {
            breakers += u64::from(b);
            lockouts += u64::from(l);
        }
    }
    tracing::info!(breakers, lockouts, "management: resilience state reset");
    Ok(json!({
        "ok": true,
        "resetCount": breakers,
        "lockoutsCleared": lockouts,
        "message": format!("Reset {breakers} circuit breaker(s) and model lockouts"),
    }))
}

/// `GET /api/resilience`, or the PATCH answer (`ok: true` first).
fn settings_json(config: &Config, ok: Option<bool>) -> Value {
    let mut v = serde_json::to_value(&config.resilience).unwrap_or(Value::Null);
    if let (Some(ok), Value::Object(m)) = (ok, &mut v) {
        m.insert("ok".into(), Value::Bool(ok));
    }
    v
}

/// `PATCH /api/resilience` (A §5.3): validated like the file, applied to every shard.
fn patch_settings(shard: &Shard, body: &[u8]) -> Result<Value, GatewayError> {
    let updated = shard.current().shared().runtime.update(|current| {
        let resilience = patch::apply(&current.resilience, body)?;
        let mut next = current.clone();
        next.resilience = resilience;
        // Kept for the snapshot: what was PATCHed, re-applied onto the file at start-up.
        if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) {
            patch::merge(&mut next.resilience_patch, &o);
        }
        Ok(next)
    });
    match updated {
        Ok(_) => {
            tracing::info!("management: resilience settings changed");
            shard.refresh();
            crate::owners::gates::client::reconfigure_everywhere(shard);
            Ok(settings_json(shard.current().config(), Some(true)))
        }
        Err(PatchError::Json(_)) => Err(invalid(vec![("body".into(), "Invalid JSON body".into())])),
        Err(PatchError::Invalid(details)) => Err(invalid(details)),
    }
}

/// `PATCH /api/providers/{connectionId}`: the connection's concurrency and rate-limit
/// settings, applied to every shard before its next request.
fn patch_connection(shard: &Shard, path: &str, body: &[u8]) -> Result<Value, GatewayError> {
    let id = path.strip_prefix(CONNECTION_PREFIX).unwrap_or_default();
    let generation = shard.current();
    let config = generation.config();
    let Some((position, conn)) = config
        .connections
        .iter()
        .enumerate()
        .find(|(_, c)| c.name == id)
    else {
        return Err(GatewayError::new(
            ErrorKind::RouteNotFound,
            format!("no connection {id:?}"),
        ));
    };
    let obj = json_object(body)?;
    let updated = shard.current().shared().runtime.update(|current| {
        let now = current
            .connections
            .get(&conn.name)
            .cloned()
            .unwrap_or_else(|| crate::config::runtime::ConnectionSettings {
                max_concurrent: conn.max_concurrent,
                rate_limit_overrides: conn.rate_limit_overrides.clone(),
            });
        let settings = connection::apply(position, &now, &obj)?;
        let mut next = current.clone();
        next.connections.insert(conn.name.clone(), settings);
        Ok(next)
    });
    match updated {
        Ok(next) => {
            tracing::info!(connection = %conn.name, "management: connection settings changed");
            shard.refresh();
            crate::owners::gates::client::reconfigure_everywhere(shard);
            let provider = &config.provider(conn.provider).name;
            let s = next
                .connections
                .get(&conn.name)
                .cloned()
                .unwrap_or_default();
            let mut v = connection::to_json(conn, provider, &s);
            if let Value::Object(m) = &mut v {
                m.insert("ok".into(), Value::Bool(true));
            }
            Ok(v)
        }
        Err(details) => Err(invalid(details)),
    }
}

fn status_of(test: TestStatus, remaining_ms: u64, locked: bool) -> &'static str {
    if test.is_terminal() {
        "terminal"
    } else if remaining_ms > 0 {
        "cooling_down"
    } else if locked {
        "model_locked"
    } else if test == TestStatus::Unavailable {
        "unavailable"
    } else {
        "healthy"
    }
}

fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `GET /api/resilience/cooldowns[?provider=]` (A §5.1).
async fn list_cooldowns(shard: &Shard, query: Option<&str>) -> Result<Value, GatewayError> {
    let provider = query_param(query, "provider").map(str::trim).unwrap_or("");
    if provider.chars().count() > MAX_ID_CHARS {
        return Err(bad_request("Invalid provider"));
    }
    let generation = shard.current();
    let config = generation.config();
    let now = shard.now();
    let status = status_all(shard).await?;
    let connections: Vec<Value> = config
        .connections
        .iter()
        .filter(|c| provider.is_empty() || config.provider(c.provider).name == provider)
        .map(|c| connection_json(config, &status, c.id, now))
        .collect();
    Ok(json!({
        "connections": connections,
        "generatedAt": format_rfc3339_ms(now.wall_ms),
    }))
}

fn connection_json(config: &Config, status: &OwnerStatus, id: ConnectionId, now: Now) -> Value {
    let c = config.connection(id);
    let p = config.provider(c.provider);
    let entry = status.connections.iter().find(|s| s.connection == id);
    let test = entry.map_or(TestStatus::Active, |e| e.test_status);
    let until = entry.and_then(|e| e.rate_limited_until_ms);
    let remaining = until.map_or(0, |u| u.saturating_sub(now.wall_ms));
    let locks: Vec<Value> = status
        .lockouts
        .iter()
        .filter(|l| l.connection == Some(id))
        .map(|l| json!({"model": l.model, "reason": l.reason, "remainingMs": l.remaining_ms}))
        .collect();
    json!({
        "id": c.name,
        "provider": p.name,
        "name": Value::Null,
        "authType": auth_str(p.auth),
        "priority": c.priority,
        "isActive": c.enabled,
        "status": status_of(test, remaining, !locks.is_empty()),
        "testStatus": test.as_str(),
        "rateLimitedUntil": until.map(format_rfc3339_ms),
        "cooldownRemainingMs": remaining,
        "backoffLevel": entry.map_or(0, |e| e.backoff_level),
        "errorCode": entry.and_then(|e| e.error_code).map(|c| c.to_string()),
        "lastErrorType": entry.and_then(|e| e.error_type).map(|t| t.as_str()),
        "lastErrorAt": entry.and_then(|e| e.error_at_ms).map(format_rfc3339_ms),
        "lockouts": locks,
    })
}

/// `POST /api/resilience/cooldowns` (A §5.2).
async fn clear_cooldowns(shard: &Shard, body: &[u8]) -> Result<Value, GatewayError> {
    let obj = json_object(body)?;
    let mut details = Vec::new();
    for k in obj.keys() {
        if !matches!(k.as_str(), "connectionIds" | "all" | "provider") {
            details.push((k.clone(), format!("unknown key {k:?}")));
        }
    }
    let all = match obj.get("all") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            details.push(("all".into(), "expected a boolean".into()));
            false
        }
    };
    let provider = match obj.get("provider") {
        None => None,
        Some(Value::String(s))
            if !s.trim().is_empty() && s.trim().chars().count() <= MAX_ID_CHARS =>
        {
            Some(s.trim().to_owned())
        }
        Some(_) => {
            details.push((
                "provider".into(),
                "expected a string of 1..=128 characters".into(),
            ));
            None
        }
    };
    let mut ids: Vec<String> = Vec::new();
    match obj.get("connectionIds") {
        None => {}
        Some(Value::Array(a)) if a.len() <= MAX_CONNECTION_IDS => {
            for (i, v) in a.iter().enumerate() {
                match v.as_str().map(str::trim) {
                    Some(s) if !s.is_empty() && s.chars().count() <= MAX_ID_CHARS => {
                        ids.push(s.to_owned());
                    }
                    _ => details.push((
                        format!("connectionIds[{i}]"),
                        "expected a string of 1..=128 characters".into(),
                    )),
                }
            }
        }
        Some(_) => details.push((
            "connectionIds".into(),
            format!("expected a list of at most {MAX_CONNECTION_IDS} ids"),
        )),
    }
    if details.is_empty() && !all && ids.is_empty() {
        details.push((
            "body".into(),
            "Provide connectionIds or set all to true".into(),
        ));
    }
    if !details.is_empty() {
        return Err(invalid(details));
    }
    let generation = shard.current();
    let config = generation.config();
    let targets: Vec<ConnectionId> = config
        .connections
        .iter()
        .filter(|c| {
            provider
                .as_deref()
                .is_none_or(|p| config.provider(c.provider).name == p)
        })
        .filter(|c| all || ids.contains(&c.name))
        .map(|c| c.id)
        .collect();
    let (mut cleared, mut unchanged, mut skipped, mut lockouts) = (0u64, 0u64, 0u64, 0u64);
    for c in &targets {
        let owner = shard.owner(c);
        match admin(shard, owner, AdminRequest::ClearConnection(*c))
            .await
            .map_err(unavailable)?
        {
            Reply::Cleared {
                outcome,
                lockouts: l,
            } => {
                lockouts += u64::from(l);
                match outcome {
                    ClearOutcome::Cleared => cleared += 1,
                    ClearOutcome::Unchanged => unchanged += 1,
                    ClearOutcome::SkippedTerminal => skipped += 1,
                }
            }
            _ => return Err(unavailable(CallError::Mismatched)),
        }
    }
    tracing::info!(
        cleared,
        unchanged,
        skipped,
        lockouts,
        "management: cooldowns cleared"
    );
    Ok(json!({
        "ok": true,
        "cleared": cleared,
        "unchanged": unchanged,
        "skippedTerminal": skipped,
        "lockoutsCleared": lockouts,
    }))
}

/// `GET /api/resilience/model-cooldowns` (A §4.8).
async fn list_model_cooldowns(shard: &Shard) -> Result<Value, GatewayError> {
    let generation = shard.current();
    let config = generation.config();
    let status = status_all(shard).await?;
    Ok(json!({ "items": lockouts_json(config, &status) }))
}

/// `DELETE /api/resilience/model-cooldowns` (A §4.8): `{all: true}` or `{provider,
/// model}` (other keys ignored; invalid JSON is `{}`).
async fn clear_model_cooldowns(shard: &Shard, body: &[u8]) -> Result<Value, GatewayError> {
    let obj = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => o,
        _ => serde_json::Map::new(),
    };
    let all = match obj.get("all") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(invalid(vec![("all".into(), "expected a boolean".into())]));
        }
    };
    let text = |k: &str| {
        obj.get(k)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let request = if all {
        AdminRequest::ClearAllLocks
    } else {
        match (text("provider"), text("model")) {
            (Some(provider), Some(model)) => AdminRequest::ClearLocks { provider, model },
            _ => return Err(bad_request("provider and model are required")),
        }
    };
    let mut any = false;
    for reply in admin_all(shard, &request).await.map_err(unavailable)? {
        if let Reply::Removed { any: a } = reply {
            any |= a;
        }
    }
    tracing::info!(all, removed = any, "management: model cooldowns cleared");
    Ok(if all {
        json!({"ok": true, "clearedAll": true})
    } else {
        json!({"ok": true, "removed": any})
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_status_follows_the_specs_order() {
        assert_eq!(status_of(TestStatus::Banned, 5, true), "terminal");
        assert_eq!(status_of(TestStatus::Active, 5, true), "cooling_down");
        assert_eq!(status_of(TestStatus::Active, 0, true), "model_locked");
        assert_eq!(status_of(TestStatus::Unavailable, 0, false), "unavailable");
        assert_eq!(status_of(TestStatus::Active, 0, false), "healthy");
    }

    #[test]
    fn query_parameters_are_found_by_name() {
        assert_eq!(query_param(Some("a=1&provider=x"), "provider"), Some("x"));
        assert_eq!(query_param(Some("provider"), "provider"), Some(""));
        assert_eq!(query_param(None, "provider"), None);
    }
}
