//! `PATCH /api/resilience` (A §5.3): a camelCase body of sections, applied onto the
//! current settings with the file's bounds and messages. Every leaf maps to the setting of
//! the same TOML path (`providerBreaker.apikey.failureThreshold` →
//! `resilience.provider_breaker.apikey.failure_threshold`); a value out of bounds gets the
//! problem the configuration file would get, and the whole result is checked with the
//! file's cross-field rules (`ResilienceSettings::check`). Nothing is applied unless
//! everything is valid.

use serde_json::{Map, Value};

use crate::config::problem::Problem;
use crate::config::resilience::{
    ProviderQuotaOverride, ResilienceSettings, TokenRefreshScope, bool_fields, num_fields,
};
use crate::config::{AuthKind, problem};

/// Why a PATCH body was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum PatchError {
    /// The body is not JSON.
    Json(String),
    /// The body is JSON but asks for something invalid: `(field, message)` per problem,
    /// the field in the body's own (camelCase) path.
    Invalid(Vec<(String, String)>),
}

/// Sections the file has but the API does not set (see `docs/compat.md`).
const FILE_ONLY: &[(&str, &str)] = &[
    (
        "providerErrorRules",
        "operator error rules are set in the configuration file only",
    ),
    (
        "legacy",
        "the legacy profile view is read-only; set connectionCooldown and providerBreaker",
    ),
    (
        "profiles",
        "legacy profiles are not accepted; set connectionCooldown and providerBreaker",
    ),
    (
        "defaults",
        "legacy defaults are not accepted; set requestQueue",
    ),
];

/// `fooBarMs` → `foo_bar_ms`; a digit run after a letter starts a word
/// (`useUpstream429BreakerHints` → `use_upstream_429_breaker_hints`).
fn snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    let mut prev: Option<char> = None;
    for c in key.chars() {
        let boundary = match prev {
            Some(p) => {
                (c.is_ascii_uppercase() && !p.is_ascii_uppercase())
                    || (c.is_ascii_digit() && !p.is_ascii_digit())
            }
            None => false,
        };
        if boundary {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
        prev = Some(c);
    }
    out
}

struct Walk<'a> {
    s: ResilienceSettings,
    problems: Vec<(String, String)>,
    sections: &'a [String],
}

impl Walk<'_> {
    fn problem(&mut self, field: &str, message: impl Into<String>) {
        self.problems.push((field.to_owned(), message.into()));
    }

    fn object(&mut self, field: &str, path: &str, obj: &Map<String, Value>) {
        for (k, v) in obj {
            let field = if field.is_empty() {
                k.clone()
            } else {
                format!("{field}.{k}")
            };
            let path = if path.is_empty() {
                snake(k)
            } else {
                format!("{path}.{}", snake(k))
            };
            self.value(&field, &path, v);
        }
    }

    fn value(&mut self, field: &str, path: &str, v: &Value) {
        if let Some((_, why)) = FILE_ONLY.iter().find(|(k, _)| *k == field) {
            self.problem(field, *why);
            return;
        }
        match path {
            "provider_quota_overrides" => return self.quota_overrides(field, v),
            "model_lockout.error_codes" => return self.error_codes(field, v),
            "token_refresh_breaker.scope" => {
                match v.as_str() {
                    Some("provider") => self.s.token_refresh_breaker.scope = TokenRefreshScope::Provider,
                    Some("connection") => {
                        self.s.token_refresh_breaker.scope = TokenRefreshScope::Connection;
                    }
                    _ => self.problem(
                        field,
                        format!(
                            "resilience.token_refresh_breaker.scope: unknown scope {v} (expected \"provider\" or \"connection\")"
                        ),
                    ),
                }
                return;
            }
            _ => {}
        }
        if let Some(auth) = path
            .strip_prefix("connection_cooldown.")
            .and_then(|p| p.strip_suffix(".use_upstream_429_breaker_hints"))
        {
            let auth = match auth {
                "oauth" => AuthKind::OAuth,
                "apikey" => AuthKind::ApiKey,
                _ => AuthKind::Local,
            };
            match v {
                Value::Null => {
                    self.s
                        .connection_cooldown
                        .get_mut(auth)
                        .use_upstream_429_breaker_hints = None;
                }
                Value::Bool(b) => {
                    self.s
                        .connection_cooldown
                        .get_mut(auth)
                        .use_upstream_429_breaker_hints = Some(*b);
                }
                _ => self.problem(
                    field,
                    format!("resilience.{path}: expected true, false or null"),
                ),
            }
            return;
        }
        if let Some(f) = num_fields().into_iter().find(|f| f.path == path) {
            match v.as_u64() {
                Some(n) if n < f.min || n > f.max => self.problem(
                    field,
                    format!(
                        "resilience.{path}: {}",
                        problem::out_of_range(n, f.min, f.max)
                    ),
                ),
                Some(n) => (f.set)(&mut self.s, n),
                None => self.problem(
                    field,
                    format!("resilience.{path}: expected a whole number, got {v}"),
                ),
            }
            return;
        }
        if let Some(f) = bool_fields().into_iter().find(|f| f.path == path) {
            match v.as_bool() {
                Some(b) => (f.set)(&mut self.s, b),
                None => self.problem(
                    field,
                    format!("resilience.{path}: expected true or false, got {v}"),
                ),
            }
            return;
        }
        match v {
            Value::Object(obj) if self.sections.iter().any(|s| s == path) => {
                self.object(field, path, obj);
            }
            _ => self.problem(field, format!("unknown setting resilience.{path}")),
        }
    }

    fn quota_overrides(&mut self, field: &str, v: &Value) {
        let Some(obj) = v.as_object() else {
            return self.problem(
                field,
                "expected an object of provider → {rpm, concurrency, providerConcurrency}",
            );
        };
        for (provider, o) in obj {
            let field = format!("{field}.{provider}");
            let Some(o) = o.as_object() else {
                self.problem(
                    &field,
                    "expected an object {rpm, concurrency, providerConcurrency}",
                );
                continue;
            };
            let mut out = ProviderQuotaOverride {
                rpm: None,
                concurrency: None,
                provider_concurrency: None,
            };
            for (k, n) in o {
                let field = format!("{field}.{k}");
                let key = format!(
                    "resilience.provider_quota_overrides.{provider}.{}",
                    snake(k)
                );
                let (slot, min, max) = match k.as_str() {
                    "rpm" => (&mut out.rpm, 1, 1_000_000),
                    "concurrency" => (&mut out.concurrency, 1, 100_000),
                    "providerConcurrency" => (&mut out.provider_concurrency, 0, 100_000),
                    _ => {
                        self.problem(&field, format!("unknown setting {key}"));
                        continue;
                    }
                };
                match n.as_u64() {
                    Some(x) if x < min || x > max => {
                        let m = format!("{key}: {}", problem::out_of_range(x, min, max));
                        self.problems.push((field, m));
                    }
                    Some(x) => *slot = u32::try_from(x).ok(),
                    None => {
                        let m = format!("{key}: expected a whole number, got {n}");
                        self.problems.push((field, m));
                    }
                }
            }
            self.s
                .provider_quota_overrides
                .insert(provider.clone(), out);
        }
    }

    fn error_codes(&mut self, field: &str, v: &Value) {
        let codes: Option<Vec<u16>> = v.as_array().and_then(|a| {
            a.iter()
                .map(|c| c.as_u64().and_then(|c| u16::try_from(c).ok()))
                .collect()
        });
        match codes {
            Some(c) => self.s.model_lockout.error_codes = c,
            None => self.problem(
                field,
                "resilience.model_lockout.error_codes: expected a list of HTTP status codes",
            ),
        }
    }
}

/// Every section path (`provider_breaker`, `provider_breaker.apikey`, …) of the settings.
fn section_paths() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let paths = num_fields()
        .into_iter()
        .map(|f| f.path)
        .chain(bool_fields().into_iter().map(|f| f.path))
        .chain([
            "connection_cooldown.oauth.x",
            "connection_cooldown.apikey.x",
            "connection_cooldown.local.x",
            "model_lockout.x",
            "token_refresh_breaker.x",
        ]);
    for p in paths {
        let mut at = 0;
        while let Some(i) = p[at..].find('.') {
            let s = &p[..at + i];
            if !out.iter().any(|o| o == s) {
                out.push(s.to_owned());
            }
            at += i + 1;
        }
    }
    out
}

/// Applies a PATCH body onto `current`: the new settings, or why not.
pub fn apply(current: &ResilienceSettings, body: &[u8]) -> Result<ResilienceSettings, PatchError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| PatchError::Json(e.to_string()))?;
    let Some(obj) = value.as_object().filter(|o| !o.is_empty()) else {
        return Err(PatchError::Invalid(vec![(
            "body".to_owned(),
            "Must provide resilience settings to update".to_owned(),
        )]));
    };
    let sections = section_paths();
    let mut walk = Walk {
        s: current.clone(),
        problems: Vec::new(),
        sections: &sections,
    };
    walk.object("", "", obj);
    if !walk.problems.is_empty() {
        return Err(PatchError::Invalid(walk.problems));
    }
    let mut s = walk.s;
    let problems: Vec<Problem> = s.check();
    if !problems.is_empty() {
        return Err(PatchError::Invalid(
            problems
                .into_iter()
                .map(|p| (p.key.clone(), p.to_string()))
                .collect(),
        ));
    }
    let _ = s.normalize();
    Ok(s)
}

/// Merges an accepted PATCH body into the bodies accepted before it, the way [`apply`]
/// reads them: objects merge key by key, any other value replaces the earlier one, and a
/// provider's `providerQuotaOverrides` entry replaces that provider's earlier entry whole
/// (as [`apply`] does). Applying the merged object onto the file's settings gives what
/// applying every body in turn gave.
pub fn merge(into: &mut Map<String, Value>, body: &Map<String, Value>) {
    merge_at(into, body, "");
}

fn merge_at(into: &mut Map<String, Value>, body: &Map<String, Value>, path: &str) {
    for (k, v) in body {
        let here = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        let whole = path == "providerQuotaOverrides";
        match (into.get_mut(k), v) {
            (Some(Value::Object(old)), Value::Object(new)) if !whole => merge_at(old, new, &here),
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

/// The runtime settings at start-up: the file's, with the PATCHes a snapshot kept put
/// back — the merged resilience body applied like a PATCH (the file's bounds and
/// cross-field rules against the file as it is now) and the per-connection settings of
/// connections the file still has. One line per thing not restored.
pub fn restore(
    config: &crate::config::Config,
    records: &crate::snapshot::state::Records,
) -> (crate::config::runtime::RuntimeSettings, Vec<String>) {
    let mut out = crate::config::runtime::RuntimeSettings::from_config(config);
    let mut dropped = Vec::new();
    if !records.settings_patch.is_empty() {
        let body = Value::Object(records.settings_patch.clone()).to_string();
        match apply(&config.resilience, body.as_bytes()) {
            Ok(s) => {
                out.resilience = s;
                out.resilience_patch = records.settings_patch.clone();
            }
            Err(e) => dropped.push(format!(
                "PATCHed resilience settings not restored (the file keeps its values): {}",
                match e {
                    PatchError::Json(j) => j,
                    PatchError::Invalid(p) =>
                        p.into_iter().map(|(_, m)| m).collect::<Vec<_>>().join("; "),
                }
            )),
        }
    }
    for (name, o) in &records.connection_overrides {
        if config.connections.iter().any(|c| &c.name == name) {
            out.connections.insert(name.clone(), o.clone());
        }
    }
    (out, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn camel_case_keys_map_to_the_file_paths() {
        assert_eq!(snake("failureThreshold"), "failure_threshold");
        assert_eq!(
            snake("useUpstream429BreakerHints"),
            "use_upstream_429_breaker_hints"
        );
        assert_eq!(snake("apikey"), "apikey");
        assert_eq!(
            snake("halfOpenProbeTimeoutMs"),
            "half_open_probe_timeout_ms"
        );
    }

    #[test]
    fn a_valid_patch_changes_only_what_it_names() {
        let cur = ResilienceSettings::default();
        let body =
            br#"{"providerBreaker":{"apikey":{"failureThreshold":3,"degradationThreshold":2}}}"#;
        let s = apply(&cur, body).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(s.provider_breaker.apikey.failure_threshold, 3);
        assert_eq!(s.provider_breaker.apikey.degradation_threshold, 2);
        assert_eq!(s.provider_breaker.oauth, cur.provider_breaker.oauth);
        assert_eq!(s.request_queue, cur.request_queue);
    }

    #[test]
    fn out_of_range_values_get_the_files_message() {
        let cur = ResilienceSettings::default();
        let body = br#"{"providerBreaker":{"apikey":{"failureThreshold":0}}}"#;
        let Err(PatchError::Invalid(p)) = apply(&cur, body) else {
            panic!("accepted");
        };
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0, "providerBreaker.apikey.failureThreshold");
        assert_eq!(
            p[0].1,
            "resilience.provider_breaker.apikey.failure_threshold: 0 is out of range (1..=1000)"
        );
    }

    #[test]
    fn unknown_keys_wrong_types_and_empty_bodies_are_refused() {
        let cur = ResilienceSettings::default();
        for body in [
            &br#"{"providerBreaker":{"apikey":{"nope":1}}}"#[..],
            br#"{"requestQueue":{"maxWaitMs":"10"}}"#,
            br#"{"quotaShareConcurrencyLimit":{"enabled":1}}"#,
            br#"{}"#,
            br#"[1]"#,
            br#"{"legacy":{}}"#,
        ] {
            assert!(
                matches!(apply(&cur, body), Err(PatchError::Invalid(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(matches!(apply(&cur, b"{nope"), Err(PatchError::Json(_))));
    }

    #[test]
    fn merged_bodies_apply_like_the_bodies_in_turn() {
        let bodies = [
            &br#"{"providerBreaker":{"apikey":{"failureThreshold":3,"degradationThreshold":2}}}"#[..],
            br#"{"providerBreaker":{"apikey":{"failureThreshold":4}},"requestQueue":{"maxWaitMs":900}}"#,
            br#"{"providerQuotaOverrides":{"x":{"rpm":5}}}"#,
            br#"{"providerQuotaOverrides":{"x":{"concurrency":2}}}"#,
        ];
        let mut in_turn = ResilienceSettings::default();
        let mut merged = Map::new();
        for b in bodies {
            in_turn = apply(&in_turn, b).unwrap_or_else(|e| panic!("{e:?}"));
            let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(b) else {
                panic!("not an object")
            };
            merge(&mut merged, &o);
        }
        let once = Value::Object(merged).to_string();
        let at_once = apply(&ResilienceSettings::default(), once.as_bytes())
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(at_once, in_turn);
        assert_eq!(at_once.provider_breaker.apikey.failure_threshold, 4);
        assert_eq!(
            at_once.provider_quota_overrides.get("x").map(|o| o.rpm),
            Some(None)
        );
    }

    #[test]
    fn cross_field_rules_of_the_file_apply() {
        let cur = ResilienceSettings::default();
        let body =
            br#"{"providerBreaker":{"apikey":{"failureThreshold":3,"degradationThreshold":5}}}"#;
        let Err(PatchError::Invalid(p)) = apply(&cur, body) else {
            panic!("accepted");
        };
        assert!(p[0].1.contains("degradation_threshold"), "{p:?}");
    }
}
