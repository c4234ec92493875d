//! `PATCH /api/providers/{connectionId}`: a connection's `max_concurrent` and
//! `rateLimitOverrides` (including `modelConcurrency`), live. Checked with the bounds and
//! messages the configuration file gives the same keys (`connections[i].…`); each key may
//! be `null` to unset it. The result replaces the connection's settings in the runtime
//! settings every shard adopts before its next request.
//!
//! A gate's capacity is read on each acquire, so a new cap applies to the next request;
//! after the change every gate home also applies it to its live gates at once, so a
//! raised cap admits requests already queued on a busy gate without waiting for a release.
//! Permits already held are returned to the gate home that granted them; when a change
//! moves a gate's home (a provider or global gate turned on or off elsewhere), the old
//! home drains as its permits come back while the new one grants from zero.

use serde_json::{Map, Value, json};

use crate::config::Connection;
use crate::config::problem::{HOUR_MS, out_of_range};
use crate::config::runtime::ConnectionSettings;

/// Checks a body against `current` for the connection at `position` in the file's
/// `[[connections]]` (named in messages); the new settings, or `(field, message)` problems.
pub fn apply(
    position: usize,
    current: &ConnectionSettings,
    body: &Map<String, Value>,
) -> Result<ConnectionSettings, Vec<(String, String)>> {
    let i = position;
    let mut next = current.clone();
    let mut problems = Vec::new();
    if body.is_empty() {
        problems.push(("body".into(), "Must provide settings to update".into()));
    }
    let narrow = |v: Option<u64>| v.and_then(|v| u32::try_from(v).ok());
    for (k, v) in body {
        match k.as_str() {
            "max_concurrent" | "maxConcurrent" => {
                if let Some(n) = bounded(
                    &mut problems,
                    k,
                    format!("connections[{i}].max_concurrent"),
                    v,
                    1,
                    100_000,
                ) {
                    next.max_concurrent = narrow(n);
                }
            }
            "rateLimitOverrides" | "rate_limit_overrides" => {
                let Some(o) = v.as_object() else {
                    problems.push((k.clone(), "expected an object".into()));
                    continue;
                };
                let base = format!("connections[{i}].rate_limit_overrides");
                let r = &mut next.rate_limit_overrides;
                for (ok, ov) in o {
                    let field = format!("{k}.{ok}");
                    match ok.as_str() {
                        "maxConcurrent" => {
                            if let Some(n) = bounded(
                                &mut problems,
                                &field,
                                format!("{base}.max_concurrent"),
                                ov,
                                1,
                                100_000,
                            ) {
                                r.max_concurrent = narrow(n);
                            }
                        }
                        "maxWaitMs" => {
                            if let Some(n) = bounded(
                                &mut problems,
                                &field,
                                format!("{base}.max_wait_ms"),
                                ov,
                                1,
                                120_000,
                            ) {
                                r.max_wait_ms = n;
                            }
                        }
                        "executionMaxWaitMs" => {
                            if let Some(n) = bounded(
                                &mut problems,
                                &field,
                                format!("{base}.execution_max_wait_ms"),
                                ov,
                                1,
                                600_000,
                            ) {
                                r.execution_max_wait_ms = n;
                            }
                        }
                        "requestsPerMinute" => {
                            if let Some(n) = bounded(
                                &mut problems,
                                &field,
                                format!("{base}.requests_per_minute"),
                                ov,
                                1,
                                1_000_000,
                            ) {
                                r.requests_per_minute = narrow(n);
                            }
                        }
                        "minTimeBetweenRequestsMs" => {
                            if let Some(n) = bounded(
                                &mut problems,
                                &field,
                                format!("{base}.min_time_between_requests_ms"),
                                ov,
                                0,
                                HOUR_MS,
                            ) {
                                r.min_time_between_requests_ms = n;
                            }
                        }
                        "modelConcurrency" => match ov {
                            Value::Null => r.model_concurrency.clear(),
                            Value::Object(models) => {
                                let mut list = Vec::new();
                                for (model, cap) in models {
                                    let key = format!("{base}.model_concurrency.{model}");
                                    let f = format!("{field}.{model}");
                                    if model.is_empty() || model.chars().count() > 128 {
                                        problems.push((
                                            f,
                                            format!("{key}: model id must be 1..=128 characters"),
                                        ));
                                        continue;
                                    }
                                    match cap.as_u64() {
                                        Some(c) if (1..=10_000).contains(&c) => {
                                            list.push((
                                                model.clone(),
                                                u32::try_from(c).unwrap_or(10_000),
                                            ));
                                        }
                                        Some(c) => problems.push((
                                            f,
                                            format!("{key}: {}", out_of_range(c, 1, 10_000)),
                                        )),
                                        None => problems.push((
                                            f,
                                            format!("{key}: expected a whole number, got {cap}"),
                                        )),
                                    }
                                }
                                r.model_concurrency = list;
                            }
                            _ => problems
                                .push((field, "expected an object of model → cap, or null".into())),
                        },
                        _ => problems.push((field, format!("unknown setting {base}.{ok}"))),
                    }
                }
            }
            _ => problems.push((k.clone(), format!("unknown setting connections[{i}].{k}"))),
        }
    }
    if problems.is_empty() {
        Ok(next)
    } else {
        Err(problems)
    }
}

/// `v` as a whole number in `min..=max`, or `null` (unset): `Some(value)`, or `None`
/// after recording the file's problem for `file_key`.
fn bounded(
    problems: &mut Vec<(String, String)>,
    field: &str,
    file_key: String,
    v: &Value,
    min: u64,
    max: u64,
) -> Option<Option<u64>> {
    match v {
        Value::Null => Some(None),
        v => match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => Some(Some(n)),
            Some(n) => {
                let m = format!("{file_key}: {}", out_of_range(n, min, max));
                problems.push((field.to_owned(), m));
                None
            }
            None => {
                let m = format!("{file_key}: expected a whole number or null, got {v}");
                problems.push((field.to_owned(), m));
                None
            }
        },
    }
}

/// The connection's settings as the API shows them.
pub fn to_json(conn: &Connection, provider: &str, s: &ConnectionSettings) -> Value {
    let r = &s.rate_limit_overrides;
    let models: Map<String, Value> = r
        .model_concurrency
        .iter()
        .map(|(m, c)| (m.clone(), json!(c)))
        .collect();
    json!({
        "id": conn.name,
        "provider": provider,
        "maxConcurrent": s.max_concurrent,
        "rateLimitOverrides": {
            "maxConcurrent": r.max_concurrent,
            "modelConcurrency": models,
            "maxWaitMs": r.max_wait_ms,
            "executionMaxWaitMs": r.execution_max_wait_ms,
            "requestsPerMinute": r.requests_per_minute,
            "minTimeBetweenRequestsMs": r.min_time_between_requests_ms,
        },
    })
}
