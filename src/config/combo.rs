//! How a combo runs (spec B §3.1): the settings of the combo config cascade. Built-in
//! defaults, then `[combo_defaults]`, then `[combo_provider_overrides.<provider id>]` (the
//! provider of the combo's first target), then the combo's own `[combos.config]` table;
//! the most specific layer that sets a key wins. Each layer is checked on its own, one
//! problem per bad key, naming the key where it is written.

use super::problem::{HOUR_MS, MINUTE_MS, Problem, SECOND_MS, out_of_range};
use super::raw::RawComboConfig;

/// Added to the combo cooldown-wait budget for the raised per-target timeout (B §3.1).
pub const TARGET_TIMEOUT_WAIT_MARGIN_MS: u64 = 10 * SECOND_MS;

/// The resolved settings of one combo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComboSettings {
    /// Same-target retries after a target's first failure.
    pub max_retries: u32,
    /// Wait before a same-target retry (longer when the upstream asked for longer).
    pub retry_delay_ms: u64,
    /// Wait before moving on to the next target after a failure.
    pub fallback_delay_ms: u64,
    /// Try every target once before any same-target retry.
    pub failover_before_retry: bool,
    /// Re-runs of the whole set after every target failed.
    pub max_set_retries: u32,
    pub set_retry_delay_ms: u64,
    /// Start the next target when the current one has produced no response head after
    /// `hedge_delay_ms`; the first head wins.
    pub hedging: bool,
    pub hedge_delay_ms: u64,
    /// The whole request's budget; 0 = none.
    pub combo_timeout_ms: u64,
    /// One attempt's budget, up to its response head and first bytes.
    pub target_timeout_ms: u64,
    /// How deep combo references may nest.
    pub max_combo_depth: u32,
    /// Round-robin semaphore settings (B §2.2), used by the round-robin strategy.
    pub concurrency_per_model: u32,
    pub queue_timeout_ms: u64,
    pub queue_depth: u32,
    /// `round-robin`: requests in a row that start at the same target.
    pub sticky_round_robin_limit: u32,
    /// `weighted`: requests in a row that reuse the drawn target.
    pub sticky_weighted_limit: u32,
}

impl Default for ComboSettings {
    fn default() -> Self {
        Self {
            max_retries: 1,
            retry_delay_ms: 2_000,
            fallback_delay_ms: 0,
            failover_before_retry: true,
            max_set_retries: 0,
            set_retry_delay_ms: 2_000,
            hedging: false,
            hedge_delay_ms: 500,
            combo_timeout_ms: 0,
            target_timeout_ms: 120_000,
            max_combo_depth: 3,
            concurrency_per_model: 3,
            queue_timeout_ms: 30_000,
            queue_depth: 20,
            sticky_round_robin_limit: 1,
            sticky_weighted_limit: 1,
        }
    }
}

/// One checked layer of the cascade: the keys it sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComboLayer {
    max_retries: Option<u32>,
    retry_delay_ms: Option<u64>,
    fallback_delay_ms: Option<u64>,
    failover_before_retry: Option<bool>,
    max_set_retries: Option<u32>,
    set_retry_delay_ms: Option<u64>,
    hedging: Option<bool>,
    hedge_delay_ms: Option<u64>,
    combo_timeout_ms: Option<u64>,
    target_timeout_ms: Option<u64>,
    max_combo_depth: Option<u32>,
    concurrency_per_model: Option<u32>,
    queue_timeout_ms: Option<u64>,
    queue_depth: Option<u32>,
    sticky_round_robin_limit: Option<u32>,
    sticky_weighted_limit: Option<u32>,
}

/// The bounds of each numeric key: (name, min, max).
pub const BOUNDS: &[(&str, u64, u64)] = &[
    ("max_retries", 0, 10),
    ("retry_delay_ms", 0, 5 * MINUTE_MS),
    ("fallback_delay_ms", 0, MINUTE_MS),
    ("max_set_retries", 0, 10),
    ("set_retry_delay_ms", 0, 5 * MINUTE_MS),
    ("hedge_delay_ms", 1, MINUTE_MS),
    ("combo_timeout_ms", 0, HOUR_MS),
    ("target_timeout_ms", SECOND_MS, HOUR_MS),
    ("max_combo_depth", 1, 10),
    ("concurrency_per_model", 1, 32),
    ("queue_timeout_ms", 0, 10 * MINUTE_MS),
    ("queue_depth", 0, 100),
    ("sticky_round_robin_limit", 1, 10_000),
    ("sticky_weighted_limit", 1, 10_000),
];

fn bounds(name: &str) -> (u64, u64) {
    BOUNDS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map_or((0, u64::MAX), |(_, lo, hi)| (*lo, *hi))
}

impl ComboLayer {
    /// Checks one written layer; `key` is where it is written (`combo_defaults`,
    /// `combos[2].config`, …).
    pub fn check(key: &str, raw: &RawComboConfig, problems: &mut Vec<Problem>) -> Self {
        let mut num = |name: &str, v: Option<u64>| -> Option<u64> {
            let v = v?;
            let (lo, hi) = bounds(name);
            if v < lo || v > hi {
                problems.push(Problem::new(
                    format!("{key}.{name}"),
                    out_of_range(v, lo, hi),
                ));
                return None;
            }
            Some(v)
        };
        let narrow = |v: Option<u64>| v.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        Self {
            max_retries: narrow(num("max_retries", raw.max_retries.map(u64::from))),
            retry_delay_ms: num("retry_delay_ms", raw.retry_delay_ms),
            fallback_delay_ms: num("fallback_delay_ms", raw.fallback_delay_ms),
            failover_before_retry: raw.failover_before_retry,
            max_set_retries: narrow(num("max_set_retries", raw.max_set_retries.map(u64::from))),
            set_retry_delay_ms: num("set_retry_delay_ms", raw.set_retry_delay_ms),
            hedging: raw.hedging,
            hedge_delay_ms: num("hedge_delay_ms", raw.hedge_delay_ms),
            combo_timeout_ms: num("combo_timeout_ms", raw.combo_timeout_ms),
            target_timeout_ms: num("target_timeout_ms", raw.target_timeout_ms),
            max_combo_depth: narrow(num("max_combo_depth", raw.max_combo_depth.map(u64::from))),
            concurrency_per_model: narrow(num(
                "concurrency_per_model",
                raw.concurrency_per_model.map(u64::from),
            )),
            queue_timeout_ms: num("queue_timeout_ms", raw.queue_timeout_ms),
            queue_depth: narrow(num("queue_depth", raw.queue_depth.map(u64::from))),
            sticky_round_robin_limit: narrow(num(
                "sticky_round_robin_limit",
                raw.sticky_round_robin_limit.map(u64::from),
            )),
            sticky_weighted_limit: narrow(num(
                "sticky_weighted_limit",
                raw.sticky_weighted_limit.map(u64::from),
            )),
        }
    }
}

/// Applies `layers`, least specific first, over the built-in defaults. When no layer sets
/// `target_timeout_ms` and the combo cooldown wait is allowed (`wait_budget_ms` is its
/// budget), the per-target timeout is raised to that budget + 10 s (B §3.1), so an attempt
/// is never cut shorter than a wait the combo may make.
pub fn cascade(layers: &[&ComboLayer], wait_budget_ms: Option<u64>) -> ComboSettings {
    let mut s = ComboSettings::default();
    let mut explicit_target_timeout = false;
    for l in layers {
        macro_rules! take {
            ($($f:ident),*) => { $( if let Some(v) = l.$f { s.$f = v; } )* };
        }
        take!(
            max_retries,
            retry_delay_ms,
            fallback_delay_ms,
            failover_before_retry,
            max_set_retries,
            set_retry_delay_ms,
            hedging,
            hedge_delay_ms,
            combo_timeout_ms,
            target_timeout_ms,
            max_combo_depth,
            concurrency_per_model,
            queue_timeout_ms,
            queue_depth,
            sticky_round_robin_limit,
            sticky_weighted_limit
        );
        explicit_target_timeout |= l.target_timeout_ms.is_some();
    }
    if !explicit_target_timeout && let Some(budget) = wait_budget_ms {
        s.target_timeout_ms = s
            .target_timeout_ms
            .max(budget.saturating_add(TARGET_TIMEOUT_WAIT_MARGIN_MS));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(f: impl FnOnce(&mut RawComboConfig)) -> RawComboConfig {
        let mut r = RawComboConfig::default();
        f(&mut r);
        r
    }

    #[test]
    fn the_most_specific_layer_wins_key_by_key() {
        let mut problems = Vec::new();
        let defaults = ComboLayer::check(
            "combo_defaults",
            &raw(|r| {
                r.max_retries = Some(3);
                r.retry_delay_ms = Some(100);
            }),
            &mut problems,
        );
        let provider = ComboLayer::check(
            "combo_provider_overrides.p",
            &raw(|r| r.retry_delay_ms = Some(200)),
            &mut problems,
        );
        let own = ComboLayer::check(
            "combos[0].config",
            &raw(|r| r.hedging = Some(true)),
            &mut problems,
        );
        assert!(problems.is_empty());
        let s = cascade(&[&defaults, &provider, &own], None);
        assert_eq!(s.max_retries, 3);
        assert_eq!(s.retry_delay_ms, 200);
        assert!(s.hedging);
        assert_eq!(s.hedge_delay_ms, 500);
        assert_eq!(s.target_timeout_ms, 120_000);
    }

    #[test]
    fn the_target_timeout_is_raised_only_when_nobody_set_it() {
        let s = cascade(&[], Some(300_000));
        assert_eq!(s.target_timeout_ms, 310_000);
        let mut problems = Vec::new();
        let own = ComboLayer::check(
            "c",
            &raw(|r| r.target_timeout_ms = Some(5_000)),
            &mut problems,
        );
        assert_eq!(cascade(&[&own], Some(300_000)).target_timeout_ms, 5_000);
    }

    #[test]
    fn each_bad_key_is_one_problem_naming_its_layer() {
        let mut problems = Vec::new();
        let l = ComboLayer::check(
            "combos[1].config",
            &raw(|r| {
                r.max_retries = Some(11);
                r.concurrency_per_model = Some(0);
                r.queue_depth = Some(100);
            }),
            &mut problems,
        );
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "combos[1].config.max_retries: 11 is out of range (0..=10)",
                "combos[1].config.concurrency_per_model: 0 is out of range (1..=32)",
            ]
        );
        assert_eq!(l.max_retries, None);
        assert_eq!(l.queue_depth, Some(100));
    }

    #[test]
    fn the_sticky_limits_default_to_one_and_zero_is_refused() {
        let s = cascade(&[], None);
        assert_eq!(
            (s.sticky_round_robin_limit, s.sticky_weighted_limit),
            (1, 1)
        );
        let mut problems = Vec::new();
        let l = ComboLayer::check(
            "combos[0].config",
            &raw(|r| {
                r.sticky_round_robin_limit = Some(0);
                r.sticky_weighted_limit = Some(5);
            }),
            &mut problems,
        );
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            ["combos[0].config.sticky_round_robin_limit: 0 is out of range (1..=10000)"]
        );
        assert_eq!(cascade(&[&l], None).sticky_weighted_limit, 5);
    }
}
