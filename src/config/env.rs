//! Environment overrides of the resilience settings, under the spec's variable names
//! (`RATE_LIMIT_MAX_WAIT_MS`, `OMNIROUTE_CIRCUIT_BREAKER_*`, …; the full list is
//! [`super::resilience::env_variables`]). An override only replaces the built-in default:
//! a value in the config file wins over it. The environment is injected as a function so
//! tests never touch the process environment.
//!
//! Parsing is strict: a value that is not a whole number / boolean, or lies outside the
//! setting's bounds, is a problem naming the variable (OmniRoute silently ignores it). An
//! empty or whitespace-only value counts as unset.

use super::resilience::{Provenance, ResilienceSettings, bool_fields, num_fields, out_of_range};
use super::validate::Problem;

/// The trimmed value of `name`, or `None` when unset or blank.
pub fn read(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `true`/`1`/`on`/`yes` or `false`/`0`/`off`/`no`, case-insensitive.
pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "on" | "yes" => Ok(true),
        "false" | "0" | "off" | "no" => Ok(false),
        _ => Err(format!(
            "{value:?} is not a boolean (use true/false, 1/0, on/off or yes/no)"
        )),
    }
}

/// A non-negative whole number (digits only, `_` not allowed).
pub fn parse_u64(value: &str) -> Result<u64, String> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        value
            .parse::<u64>()
            .map_err(|_| format!("{value:?} is too large"))
    } else {
        Err(format!("{value:?} is not a non-negative whole number"))
    }
}

/// Applies every set variable onto `s`, recording where each value came from. When a
/// setting has several variables the first one set wins (`STREAM_CONTENT_STALL_TIMEOUT_MS`
/// before `STREAM_READINESS_TIMEOUT_MS`).
pub(crate) fn apply(
    s: &mut ResilienceSettings,
    prov: &mut Provenance,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<Problem>,
) {
    for f in bool_fields() {
        let Some((var, value)) = first_set(env, f.env) else {
            continue;
        };
        match parse_bool(&value) {
            Ok(v) => {
                (f.set)(s, v);
                prov.set_env(f.path, var);
            }
            Err(message) => problems.push(Problem::new(var, message)),
        }
    }
    for f in num_fields() {
        let Some((var, value)) = first_set(env, f.env) else {
            continue;
        };
        match parse_u64(&value) {
            Ok(v) if v < f.env_min || v > f.max => {
                problems.push(Problem::new(var, out_of_range(v, f.env_min, f.max)));
            }
            Ok(v) => {
                (f.set)(s, v);
                prov.set_env(f.path, var);
            }
            Err(message) => problems.push(Problem::new(var, message)),
        }
    }
}

fn first_set(
    env: &dyn Fn(&str) -> Option<String>,
    vars: &'static [&'static str],
) -> Option<(&'static str, String)> {
    vars.iter()
        .find_map(|var| read(env, var).map(|value| (*var, value)))
}

#[cfg(test)]
mod tests {
    use super::super::raw::RawResilience;
    use super::super::resilience::{build, env_variables};
    use super::*;
    use std::collections::HashMap;

    fn with_env(
        vars: &[(&str, &str)],
        file: &str,
    ) -> (ResilienceSettings, Vec<Problem>, Vec<String>) {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |k: &str| map.get(k).cloned();
        let raw: RawResilience = toml::from_str(file).unwrap();
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let s = build(&raw, &env, &mut problems, &mut warnings);
        (s, problems, warnings)
    }

    #[test]
    fn parsing() {
        assert_eq!(parse_bool("ON"), Ok(true));
        assert_eq!(parse_bool("no"), Ok(false));
        assert!(parse_bool("enabled").is_err());
        assert_eq!(parse_u64("42"), Ok(42));
        assert!(parse_u64("-1").is_err());
        assert!(parse_u64("1.5").is_err());
        assert!(parse_u64("1e3").is_err());
        assert!(parse_u64("99999999999999999999999").is_err());
    }

    #[test]
    fn env_overrides_defaults() {
        let (s, problems, _) = with_env(
            &[
                ("RATE_LIMIT_MAX_WAIT_MS", "15000"),
                ("RATE_LIMIT_EXECUTION_MAX_WAIT_MS", " 900000 "),
                ("RATE_LIMIT_MAX_QUEUE_DEPTH", "50"),
                ("RATE_LIMIT_AUTO_ENABLE", "on"),
                ("OMNIROUTE_CIRCUIT_BREAKER_API_KEY_THRESHOLD", "20"),
                ("OMNIROUTE_CIRCUIT_BREAKER_OAUTH_RESET_MS", "90000"),
                ("OMNIROUTE_CIRCUIT_BREAKER_LOCAL_THRESHOLD", "4"),
                (
                    "OMNIROUTE_PROVIDER_BREAKER_OAUTH_MAX_BACKOFF_MULTIPLIER",
                    "2",
                ),
                (
                    "OMNIROUTE_PROVIDER_BREAKER_API_KEY_FAILURE_WINDOW_MS",
                    "60000",
                ),
                ("PROVIDER_COOLDOWN_ENABLED", "true"),
                ("PROVIDER_COOLDOWN_MIN_MS", "1000"),
                ("QUOTA_PREFLIGHT_CUTOFF_ENABLED", "1"),
                ("STREAM_RECOVERY_ENABLED", "true"),
                ("STREAM_THROUGHPUT_WATCHDOG_ENABLED", "true"),
                ("STREAM_THROUGHPUT_WATCHDOG_MIN_BYTES_PER_SECOND", "16"),
                ("STREAM_READINESS_TIMEOUT_MS", "120000"),
            ],
            "",
        );
        assert_eq!(problems, vec![]);
        let q = &s.request_queue;
        assert_eq!(
            (q.max_wait_ms, q.execution_max_wait_ms, q.max_queue_depth),
            (15_000, 900_000, 50)
        );
        assert!(q.auto_enable_api_key_providers);
        assert_eq!(s.provider_breaker.apikey.failure_threshold, 20);
        assert_eq!(s.provider_breaker.oauth.reset_timeout_ms, 90_000);
        assert_eq!(s.provider_breaker.local.failure_threshold, 4);
        assert_eq!(s.provider_breaker.oauth.max_backoff_multiplier, 2);
        assert_eq!(s.provider_cooldown.apikey.failure_window_ms, 60_000);
        assert!(s.provider_cooldown.enabled);
        assert_eq!(s.provider_cooldown.min_retry_cooldown_ms, 1_000);
        assert!(s.quota_preflight.enabled);
        assert!(s.stream_recovery.enabled);
        assert!(s.stream_recovery.throughput_watchdog.enabled);
        assert_eq!(
            s.stream_recovery
                .throughput_watchdog
                .min_useful_bytes_per_second,
            16
        );
        assert_eq!(s.stream_watchdog.stall_timeout_ms, 120_000);
    }

    #[test]
    fn the_first_listed_variable_wins() {
        let (s, _, _) = with_env(
            &[
                ("STREAM_READINESS_TIMEOUT_MS", "120000"),
                ("STREAM_CONTENT_STALL_TIMEOUT_MS", "0"),
            ],
            "",
        );
        assert_eq!(s.stream_watchdog.stall_timeout_ms, 0);
    }

    #[test]
    fn the_file_wins_over_env() {
        let (s, problems, _) = with_env(
            &[
                ("RATE_LIMIT_MAX_WAIT_MS", "15000"),
                ("RATE_LIMIT_AUTO_ENABLE", "true"),
                ("PROVIDER_COOLDOWN_ENABLED", "true"),
            ],
            "[request_queue]\nmax_wait_ms = 45000\nauto_enable_api_key_providers = false\n",
        );
        assert_eq!(problems, vec![]);
        assert_eq!(s.request_queue.max_wait_ms, 45_000);
        assert!(!s.request_queue.auto_enable_api_key_providers);
        // Not in the file: the env value stays.
        assert!(s.provider_cooldown.enabled);
    }

    #[test]
    fn malformed_and_out_of_range_values_name_the_variable() {
        let (_, problems, _) = with_env(
            &[
                ("RATE_LIMIT_MAX_WAIT_MS", "0"),
                ("RATE_LIMIT_MAX_QUEUE_DEPTH", "lots"),
                ("PROVIDER_COOLDOWN_ENABLED", "maybe"),
                ("OMNIROUTE_CIRCUIT_BREAKER_OAUTH_RESET_MS", "10"),
                ("STREAM_RECOVERY_ENABLED", "   "),
            ],
            "",
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "PROVIDER_COOLDOWN_ENABLED",
                "RATE_LIMIT_MAX_WAIT_MS",
                "RATE_LIMIT_MAX_QUEUE_DEPTH",
                "OMNIROUTE_CIRCUIT_BREAKER_OAUTH_RESET_MS",
            ]
        );
        assert_eq!(
            problems[1].to_string(),
            "RATE_LIMIT_MAX_WAIT_MS: 0 is out of range (1..=86400000)"
        );
    }

    #[test]
    fn env_threshold_lowers_an_unset_degradation_threshold() {
        let (s, problems, _) =
            with_env(&[("OMNIROUTE_CIRCUIT_BREAKER_API_KEY_THRESHOLD", "5")], "");
        assert_eq!(problems, vec![]);
        assert_eq!(s.provider_breaker.apikey.degradation_threshold, 4);
    }

    #[test]
    fn contradicting_env_values_name_the_variable() {
        let (_, problems, _) = with_env(
            &[
                ("OMNIROUTE_CIRCUIT_BREAKER_API_KEY_THRESHOLD", "5"),
                (
                    "OMNIROUTE_PROVIDER_BREAKER_API_KEY_DEGRADATION_THRESHOLD",
                    "6",
                ),
                ("PROVIDER_COOLDOWN_MIN_MS", "9000"),
                ("PROVIDER_COOLDOWN_MAX_MS", "8000"),
            ],
            "",
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "OMNIROUTE_PROVIDER_BREAKER_API_KEY_DEGRADATION_THRESHOLD",
                "PROVIDER_COOLDOWN_MAX_MS",
            ]
        );
    }

    #[test]
    fn every_variable_is_read() {
        // Setting each variable to an impossible value must produce a problem naming it.
        for var in env_variables() {
            let (_, problems, _) = with_env(&[(var, "not-a-value")], "");
            assert_eq!(problems.len(), 1, "{var}");
            assert_eq!(problems[0].key, var);
        }
    }
}
