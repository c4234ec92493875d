#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;

use proptest::prelude::*;

use super::learn::DEFAULT_RESET_MS;
use super::learn::*;
use super::limiter::*;
use super::window::*;
use super::*;
use crate::clock::Clock;
use crate::clock::ManualClock;
use crate::clock::Now;
use crate::config::kinds::NVIDIA_DEFAULT_RPM;
use crate::config::kinds::ProviderKind;
use crate::config::raw::RawResilience;
use crate::config::resilience::{ProviderQuotaOverride, build};

const MS: u64 = 1_000_000;

fn settings(
    max_concurrent: u32,
    min_time_ms: u64,
    rpm: Option<u32>,
    max_wait_ms: u64,
) -> LimiterSettings {
    LimiterSettings {
        enabled: true,
        max_concurrent,
        min_time_ms,
        rpm,
        max_wait_ms,
        execution_max_wait_ms: 600_000,
        max_queue_depth: 0,
        rpm_overridden: false,
    }
}

fn at(ms: u64) -> Now {
    Now {
        mono_ns: ms * MS,
        wall_ms: 1_700_000_000_000 + ms,
    }
}

// ---- errors and admission ----

#[test]
fn error_messages() {
    assert!(
        QueueError::Full { max_queue_depth: 7 }
            .message("openai/gpt")
            .contains("maxQueueDepth 7")
    );
    let m = QueueError::QueueTimeout {
        max_wait_ms: 30_000,
    }
    .message("openai/gpt");
    assert!(m.contains("maxWaitMs (30000ms)") && m.contains("not an upstream execution timeout"));
}

#[test]
fn admission() {
    assert_eq!(check_queue_admission(1_000_000, 0), Ok(()));
    assert_eq!(check_queue_admission(0, 1), Ok(()));
    assert_eq!(check_queue_admission(2, 3), Ok(()));
    assert_eq!(
        check_queue_admission(3, 3),
        Err(QueueError::Full { max_queue_depth: 3 })
    );
    assert_eq!(
        check_queue_admission(4, 3),
        Err(QueueError::Full { max_queue_depth: 3 })
    );
}

#[test]
fn admission_counts_only_queued_waiters() {
    let mut l = Limiter::new(settings(1, 0, None, 0), at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.queued(), 0);
    assert_eq!(check_queue_admission(l.queued(), 1), Ok(()));
    assert_eq!(l.schedule(2, at(0)), Schedule::Queued);
    assert_eq!(
        check_queue_admission(l.queued(), 1),
        Err(QueueError::Full { max_queue_depth: 1 })
    );
}

// ---- settings resolution ----

fn resilience(env: &[(&str, &str)], file: &str) -> ResilienceSettings {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let env = move |k: &str| map.get(k).cloned();
    let raw: RawResilience = toml::from_str(file).unwrap();
    let (mut p, mut w) = (Vec::new(), Vec::new());
    let s = build(&raw, &env, &mut p, &mut w);
    assert!(p.is_empty(), "{p:?}");
    s
}

#[test]
fn limiter_is_off_by_default_and_auto_enables_only_api_key_providers() {
    let s = ResilienceSettings::default();
    let none = RateLimitOverrides::default();
    let r = LimiterSettings::resolve(
        &s,
        &none,
        ProviderKind::default_for_id("openai")
            .quirks()
            .max_wait_floor_ms,
        AuthKind::ApiKey,
        true,
    );
    assert!(!r.enabled);
    assert_eq!((r.max_concurrent, r.min_time_ms, r.rpm), (6, 350, Some(60)));
    assert_eq!(
        (r.max_wait_ms, r.execution_max_wait_ms, r.max_queue_depth),
        (30_000, 600_000, 0)
    );

    let on = resilience(&[("RATE_LIMIT_AUTO_ENABLE", "on")], "");
    assert!(
        LimiterSettings::resolve(
            &on,
            &none,
            ProviderKind::default_for_id("openai")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::ApiKey,
            true
        )
        .enabled
    );
    assert!(
        !LimiterSettings::resolve(
            &on,
            &none,
            ProviderKind::default_for_id("claude")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::OAuth,
            true
        )
        .enabled
    );
    assert!(
        !LimiterSettings::resolve(
            &on,
            &none,
            ProviderKind::default_for_id("openai")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::ApiKey,
            false
        )
        .enabled
    );

    let explicit = RateLimitOverrides {
        requests_per_minute: Some(10),
        ..Default::default()
    };
    let r = LimiterSettings::resolve(
        &s,
        &explicit,
        ProviderKind::default_for_id("claude")
            .quirks()
            .max_wait_floor_ms,
        AuthKind::OAuth,
        true,
    );
    assert!(r.enabled && r.rpm_overridden);
    assert_eq!(r.rpm, Some(10));
    // max_concurrent alone is a gate, not the limiter.
    let gate_only = RateLimitOverrides {
        max_concurrent: Some(2),
        ..Default::default()
    };
    assert!(
        !LimiterSettings::resolve(
            &s,
            &gate_only,
            ProviderKind::default_for_id("openai")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::ApiKey,
            true
        )
        .enabled
    );
}

#[test]
fn precedence_env_then_config_then_override() {
    let env = [
        ("RATE_LIMIT_MAX_WAIT_MS", "15000"),
        ("RATE_LIMIT_EXECUTION_MAX_WAIT_MS", "900000"),
    ];
    let none = RateLimitOverrides::default();
    // env over built-in
    let s = resilience(&env, "");
    let r = LimiterSettings::resolve(
        &s,
        &none,
        ProviderKind::default_for_id("openai")
            .quirks()
            .max_wait_floor_ms,
        AuthKind::ApiKey,
        true,
    );
    assert_eq!((r.max_wait_ms, r.execution_max_wait_ms), (15_000, 900_000));
    // config over env
    let s = resilience(
        &env,
        "[request_queue]\nmax_wait_ms = 45000\nmin_time_between_requests_ms = 100\n",
    );
    let r = LimiterSettings::resolve(
        &s,
        &none,
        ProviderKind::default_for_id("openai")
            .quirks()
            .max_wait_floor_ms,
        AuthKind::ApiKey,
        true,
    );
    assert_eq!((r.max_wait_ms, r.min_time_ms), (45_000, 100));
    // override over config; zero falls through, except for the spacing (below)
    let o = RateLimitOverrides {
        max_wait_ms: Some(5_000),
        execution_max_wait_ms: Some(0),
        requests_per_minute: Some(0),
        max_concurrent: Some(0),
        ..Default::default()
    };
    let r = LimiterSettings::resolve(
        &s,
        &o,
        ProviderKind::default_for_id("openai")
            .quirks()
            .max_wait_floor_ms,
        AuthKind::ApiKey,
        true,
    );
    assert_eq!(
        (r.max_wait_ms, r.execution_max_wait_ms, r.min_time_ms),
        (5_000, 900_000, 100)
    );
    assert_eq!(
        (r.rpm, r.max_concurrent, r.rpm_overridden),
        (Some(60), 6, false)
    );
    // An explicit 0 spacing is "no spacing", and it turns the limiter on by itself;
    // `max_concurrent` alone is a concurrency gate, not the limiter.
    let mut off = s.clone();
    off.request_queue.auto_enable_api_key_providers = false;
    assert!(!LimiterSettings::resolve(&off, &none, 0, AuthKind::ApiKey, true).enabled);
    let zero = RateLimitOverrides {
        min_time_between_requests_ms: Some(0),
        ..Default::default()
    };
    let r = LimiterSettings::resolve(&off, &zero, 0, AuthKind::ApiKey, true);
    assert_eq!((r.enabled, r.min_time_ms), (true, 0));
    let gate_only = RateLimitOverrides {
        max_concurrent: Some(2),
        ..Default::default()
    };
    assert!(!LimiterSettings::resolve(&off, &gate_only, 0, AuthKind::ApiKey, true).enabled);
}

#[test]
fn clamps_and_provider_floors() {
    let mut s = ResilienceSettings::default();
    s.request_queue.concurrent_requests = 0;
    s.request_queue.requests_per_minute = 0;
    s.request_queue.execution_max_wait_ms = 0;
    let none = RateLimitOverrides::default();
    let r = LimiterSettings::resolve(
        &s,
        &none,
        ProviderKind::default_for_id("openai")
            .quirks()
            .max_wait_floor_ms,
        AuthKind::ApiKey,
        true,
    );
    assert_eq!(
        (r.max_concurrent, r.rpm, r.execution_max_wait_ms),
        (UNLIMITED_CONCURRENCY, None, 1)
    );

    let o = RateLimitOverrides {
        max_wait_ms: Some(500_000),
        execution_max_wait_ms: Some(900_000),
        requests_per_minute: Some(5_000_000),
        min_time_between_requests_ms: Some(10_000_000),
        ..Default::default()
    };
    let r = LimiterSettings::resolve(
        &s,
        &o,
        ProviderKind::default_for_id("openai")
            .quirks()
            .max_wait_floor_ms,
        AuthKind::ApiKey,
        true,
    );
    assert_eq!(
        (r.max_wait_ms, r.execution_max_wait_ms),
        (OVERRIDE_MAX_WAIT_MS, OVERRIDE_EXECUTION_MAX_WAIT_MS)
    );
    assert_eq!((r.rpm, r.min_time_ms), (Some(MAX_RPM), MAX_MIN_TIME_MS));

    let d = ResilienceSettings::default();
    assert_eq!(
        LimiterSettings::resolve(
            &d,
            &none,
            ProviderKind::default_for_id("zai-web")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::ApiKey,
            true
        )
        .max_wait_ms,
        60_000
    );
    assert_eq!(
        LimiterSettings::resolve(
            &d,
            &none,
            ProviderKind::default_for_id("MaxAI")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::ApiKey,
            true
        )
        .max_wait_ms,
        300_000
    );
    // The floor applies before the per-connection override.
    let o = RateLimitOverrides {
        max_wait_ms: Some(1_000),
        ..Default::default()
    };
    assert_eq!(
        LimiterSettings::resolve(
            &d,
            &o,
            ProviderKind::default_for_id("mx")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::ApiKey,
            true
        )
        .max_wait_ms,
        1_000
    );
    // 0 = no deadline needs no floor.
    let mut z = ResilienceSettings::default();
    z.request_queue.max_wait_ms = 0;
    assert_eq!(
        LimiterSettings::resolve(
            &z,
            &none,
            ProviderKind::default_for_id("zai-web")
                .quirks()
                .max_wait_floor_ms,
            AuthKind::ApiKey,
            true
        )
        .max_wait_ms,
        0
    );
}

#[test]
fn limiter_keys() {
    let k = |provider: &str, model, codex_key, quota_family| {
        limiter_key(KeyParts {
            provider,
            scheme: ProviderKind::default_for_id(provider).quirks().limiter_key,
            connection: "c1",
            model,
            codex_key,
            quota_family,
        })
    };
    assert_eq!(k("openai", Some("gpt-4o"), None, None), "openai:c1");
    assert_eq!(
        k("Gemini", Some("gemini-2.5-pro"), None, None),
        "gemini:c1:gemini-2.5-pro"
    );
    assert_eq!(
        k("github", Some("gpt-4.1"), None, None),
        "github:c1:gpt-4.1"
    );
    assert_eq!(
        k("codex", Some("gpt-5"), Some("acct:gpt5"), None),
        "codex:acct:gpt5"
    );
    assert_eq!(
        k("antigravity", Some("claude-opus"), None, Some("claude")),
        "antigravity:c1:claude"
    );
    assert_eq!(k("agy", Some("gemini-3"), None, None), "agy:c1:gemini-3");
}

// ---- the limiter ----

#[test]
fn spacing_between_starts() {
    let mut l = Limiter::new(settings(10, 350, None, 0), at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.schedule(2, at(100)), Schedule::StartAt(350 * MS));
    assert_eq!(l.schedule(3, at(100)), Schedule::StartAt(700 * MS));
    assert_eq!(l.schedule(4, at(2_000)), Schedule::StartNow);
}

#[test]
fn concurrency_cap_and_fifo() {
    let mut l = Limiter::new(settings(2, 0, None, 0), at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.schedule(2, at(0)), Schedule::StartNow);
    assert_eq!(l.schedule(3, at(0)), Schedule::Queued);
    assert_eq!(l.schedule(4, at(0)), Schedule::Queued);
    assert_eq!(l.running(), 2);
    assert_eq!(
        l.on_finish(2, at(5)),
        vec![Grant {
            waiter: 3,
            start_at_ns: 5 * MS
        }]
    );
    assert_eq!(
        l.on_finish(1, at(6)),
        vec![Grant {
            waiter: 4,
            start_at_ns: 6 * MS
        }]
    );
    assert_eq!(l.on_finish(99, at(7)), vec![]);
    assert_eq!(l.running(), 2);
}

#[test]
fn reservoir_refills_every_minute() {
    let mut l = Limiter::new(settings(10, 0, Some(2), 0), at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.schedule(2, at(1)), Schedule::StartNow);
    assert_eq!(l.schedule(3, at(2)), Schedule::Queued);
    assert_eq!(l.reservoir_left(), Some(0));
    assert_eq!(l.next_wake_ns(), Some(60_000 * MS));
    assert_eq!(l.promote(at(59_999)), vec![]);
    assert_eq!(
        l.promote(at(60_000)),
        vec![Grant {
            waiter: 3,
            start_at_ns: 60_000 * MS
        }]
    );
    assert_eq!(l.reservoir_left(), Some(1));
}

#[test]
fn queue_wait_budget_and_execution_budget_are_separate() {
    let s = settings(1, 0, None, 1_000);
    let mut l = Limiter::new(s, at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    let exec1 = execution_deadline_ns(at(0), &s, 0);
    assert_eq!(exec1, 600_000 * MS);
    assert_eq!(l.schedule(2, at(10)), Schedule::Queued);
    assert_eq!(l.schedule(3, at(500)), Schedule::Queued);
    assert_eq!(l.expire(at(1_009)), vec![]);
    assert_eq!(
        l.expire(at(1_010)),
        vec![(2, QueueError::QueueTimeout { max_wait_ms: 1_000 })]
    );
    // The running request is still running well past max_wait: only the backstop bounds it.
    assert_eq!(l.running(), 1);
    assert!(1_010 * MS < exec1);
    // 3 is granted after queueing 400 ms; its execution budget starts at dispatch.
    let mut l = Limiter::new(s, at(0));
    l.schedule(1, at(0));
    l.schedule(3, at(500));
    assert_eq!(
        l.on_finish(1, at(900)),
        vec![Grant {
            waiter: 3,
            start_at_ns: 900 * MS
        }]
    );
    assert_eq!(execution_deadline_ns(at(900), &s, 0), (900 + 600_000) * MS);
    // Raised to the upstream's own start timeout when longer, never lowered.
    assert_eq!(
        execution_deadline_ns(at(900), &s, 700_000),
        (900 + 700_000) * MS
    );
    assert_eq!(
        execution_deadline_ns(at(900), &s, 1_000),
        (900 + 600_000) * MS
    );
    assert_eq!(
        execution_timeout(&s, 700_000),
        QueueError::ExecutionTimeout {
            execution_max_wait_ms: 700_000
        }
    );
}

#[test]
fn expire_fixes_the_order_of_events() {
    // 1 s of the first waiter gone at the exact expiry of the queued ones.
    let s = settings(1, 0, None, 1_000);
    let mut l = Limiter::new(s, at(0));
    l.schedule(1, at(0));
    l.schedule(2, at(0));
    assert_eq!(l.next_wake_ns(), Some(1_000 * MS));
    // Finished at the deadline: the waiter still gets its slot (start ≤ deadline).
    assert_eq!(
        l.on_finish(1, at(1_000)),
        vec![Grant {
            waiter: 2,
            start_at_ns: 1_000 * MS
        }]
    );
}

#[test]
fn no_queue_deadline_when_max_wait_is_zero() {
    let mut l = Limiter::new(settings(1, 0, None, 0), at(0));
    l.schedule(1, at(0));
    l.schedule(2, at(0));
    assert_eq!(l.expire(at(86_400_000)), vec![]);
    assert_eq!(l.next_wake_ns(), None);
}

#[test]
fn a_head_that_cannot_start_in_time_waits_then_expires_then_the_next_goes() {
    // Spacing 5 s, budget 2 s: the second start would be at 5 s, past its deadline.
    let mut l = Limiter::new(settings(10, 5_000, None, 2_000), at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.schedule(2, at(0)), Schedule::Queued);
    assert_eq!(l.schedule(3, at(3_500)), Schedule::Queued);
    assert_eq!(
        l.expire(at(2_000)),
        vec![(2, QueueError::QueueTimeout { max_wait_ms: 2_000 })]
    );
    assert_eq!(
        l.promote(at(3_600)),
        vec![Grant {
            waiter: 3,
            start_at_ns: 5_000 * MS
        }]
    );
}

#[test]
fn cancel_leaves_the_queue_or_frees_the_slot() {
    let mut l = Limiter::new(settings(1, 0, None, 0), at(0));
    l.schedule(1, at(0));
    l.schedule(2, at(0));
    l.schedule(3, at(0));
    assert_eq!(l.cancel(2, at(1)), (true, vec![]));
    assert_eq!(
        l.cancel(1, at(2)),
        (
            true,
            vec![Grant {
                waiter: 3,
                start_at_ns: 2 * MS
            }]
        )
    );
    assert_eq!(l.cancel(1, at(3)), (false, vec![]));
}

// ---- learning ----

#[test]
fn learning_from_headers() {
    let mut l = Limiter::new(settings(10, 350, Some(60), 30_000), at(0));
    let h: &[(&str, &str)] = &[
        ("x-ratelimit-limit-requests", "100"),
        ("x-ratelimit-remaining-requests", "5"),
        ("x-ratelimit-reset-requests", "6m0s"),
    ];
    let out = observe_headers(&mut l, h, at(0));
    assert_eq!(out.min_time_ms, Some(590));
    assert!(out.throttled && !out.relaxed);
    assert_eq!(l.min_time_ms(), 590);
    assert_eq!(l.reservoir_left(), Some(5));
    assert_eq!(l.next_wake_ns(), None);

    let h: &[(&str, &str)] = &[
        ("x-ratelimit-limit-requests", "100"),
        ("x-ratelimit-remaining-requests", "80"),
    ];
    let out = observe_headers(&mut l, h, at(10));
    // More than half left: the learned spacing and reservoir are dropped, back to the
    // configured ones.
    assert!(out.relaxed);
    assert_eq!(out.min_time_ms, None);
    assert_eq!(l.min_time_ms(), 350);
    assert_eq!(l.reservoir_left(), Some(60));
    // Between 10 % and 50 % left: the header's spacing, nothing else.
    let h: &[(&str, &str)] = &[
        ("x-ratelimit-limit-requests", "10"),
        ("x-ratelimit-remaining-requests", "5"),
    ];
    let out = observe_headers(&mut l, h, at(15));
    assert!(!out.relaxed && !out.throttled);
    assert_eq!(l.min_time_ms(), 5_990);

    let h: &[(&str, &str)] = &[("X-RateLimit-Over-Limit", "yes")];
    assert!(observe_headers(&mut l, h, at(20)).over_limit);
    assert_eq!(l.min_time_ms(), 200);

    let empty: &[(&str, &str)] = &[];
    assert_eq!(
        observe_headers(&mut l, empty, at(30)),
        HeaderLearn::default()
    );
}

#[test]
fn throttled_reservoir_refills_at_the_reset_period() {
    let mut l = Limiter::new(settings(10, 0, None, 0), at(0));
    let h: &[(&str, &str)] = &[
        ("x-ratelimit-limit-requests", "6000"),
        ("x-ratelimit-remaining-requests", "1"),
    ];
    observe_headers(&mut l, h, at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.schedule(2, at(1)), Schedule::Queued);
    assert_eq!(l.next_wake_ns(), Some(DEFAULT_RESET_MS * MS));
    assert_eq!(l.promote(at(DEFAULT_RESET_MS)).len(), 1);
}

#[test]
fn reset_durations() {
    assert_eq!(parse_reset_duration_ms("6m0s"), Some(360_000));
    assert_eq!(parse_reset_duration_ms("20ms"), Some(20));
    assert_eq!(parse_reset_duration_ms("1h2m3.5s"), Some(3_723_500));
    assert_eq!(parse_reset_duration_ms("30"), Some(30_000));
    assert_eq!(parse_reset_duration_ms("1.5"), Some(1_500));
    assert_eq!(parse_reset_duration_ms("soon"), None);
    assert_eq!(parse_reset_duration_ms(""), None);
    assert_eq!(parse_reset_duration_ms("5d"), None);
}

#[test]
fn caps_in_words() {
    assert_eq!(
        requests_within_cap("Limit: 5 requests within 1 minutes."),
        Some((5, 60_000))
    );
    assert_eq!(
        requests_within_cap("You may send 10 requests per minute"),
        Some((10, 60_000))
    );
    assert_eq!(
        requests_within_cap("max 100 requests in 2 hours"),
        Some((100, 7_200_000))
    );
    assert_eq!(
        requests_within_cap("{\"error\":\"3 requests every 30 seconds\"}"),
        Some((3, 30_000))
    );
    assert_eq!(requests_within_cap("too many requests"), None);
    assert_eq!(requests_within_cap("0 requests within 1 minute"), None);
    assert_eq!(requests_within_cap("5 requests within 0 minutes"), None);
}

#[test]
fn learned_caps_apply_unless_refused() {
    let body = "rate limited: 5 requests within 1 minutes";
    let mut l = Limiter::new(settings(10, 350, Some(60), 30_000), at(0));
    assert_eq!(
        learn_cap_from_body(&mut l, body),
        CapLearn::Applied {
            min_time_ms: 12_000
        }
    );
    assert_eq!(l.min_time_ms(), 12_000);
    // Never below the configured spacing.
    let mut l = Limiter::new(settings(10, 350, Some(60), 30_000), at(0));
    assert_eq!(
        learn_cap_from_body(&mut l, "1000 requests within 1 minute"),
        CapLearn::Applied { min_time_ms: 350 }
    );
    // Spacing beyond the queue budget: refused.
    let mut l = Limiter::new(settings(10, 350, Some(60), 10_000), at(0));
    assert_eq!(
        learn_cap_from_body(&mut l, body),
        CapLearn::RefusedExceedsQueueBudget {
            min_time_ms: 12_000
        }
    );
    assert_eq!(l.min_time_ms(), 350);
    // No queue deadline: nothing to exceed.
    let mut l = Limiter::new(settings(10, 350, Some(60), 0), at(0));
    assert_eq!(
        learn_cap_from_body(&mut l, body),
        CapLearn::Applied {
            min_time_ms: 12_000
        }
    );
    // A per-connection rpm wins.
    let mut s = settings(10, 350, Some(60), 30_000);
    s.rpm_overridden = true;
    let mut l = Limiter::new(s, at(0));
    assert_eq!(
        learn_cap_from_body(&mut l, body),
        CapLearn::RefusedRpmOverride
    );
    assert_eq!(learn_cap_from_body(&mut l, "nope"), CapLearn::None);
}

#[test]
fn retry_hint_empties_the_reservoir() {
    let mut l = Limiter::new(settings(10, 0, None, 0), at(0));
    observe_retry_hint(&mut l, 5_000, at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::Queued);
    assert_eq!(l.promote(at(4_999)), vec![]);
    assert_eq!(l.promote(at(5_000)).len(), 1);
    assert_eq!(l.reservoir_left(), Some(59));
}

#[test]
fn known_cooldown_after_429_and_cleared_by_success() {
    let mut t = LimiterTable::new();
    let l = t.get_or_create("openai:c1", settings(10, 350, Some(60), 0), at(0));
    l.force_min_time_ms(200);
    t.on_upstream_429("openai:c1", None, at(0));
    assert_eq!(
        t.get_mut("openai:c1").unwrap().min_time_ms(),
        350,
        "learned limits discarded"
    );
    assert_eq!(t.known_cooldown_ms("openai:c1", at(1_000)), Some(59_000));
    // A shorter later hint never shortens it.
    t.on_upstream_429("openai:c1", Some(1_000), at(1_000));
    assert_eq!(t.known_cooldown_ms("openai:c1", at(1_000)), Some(59_000));
    assert_eq!(t.known_cooldown_ms("openai:c1", at(60_000)), None);
    t.on_upstream_429("openai:c1", Some(5_000), at(70_000));
    t.on_upstream_success("openai:c1");
    assert_eq!(t.known_cooldown_ms("openai:c1", at(70_001)), None);
}

#[test]
fn wedge_watchdog() {
    let mut t = LimiterTable::new();
    let l = t.get_or_create("k", settings(10, 0, Some(1), 0), at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.on_finish(1, at(1)), vec![]);
    assert_eq!(l.schedule(2, at(1)), Schedule::Queued);
    assert_eq!(l.schedule(3, at(1)), Schedule::Queued);
    // Waiting for the refill at 60 s is legitimate.
    assert!(!l.is_wedged(at(59_999)));
    // The refill passed and nobody promoted: after 120 s without a dispatch it is wedged.
    assert!(!l.is_wedged(at(WEDGE_AFTER_MS - 1)));
    assert!(l.is_wedged(at(WEDGE_AFTER_MS)));
    assert_eq!(t.sweep_wedged(at(WEDGE_AFTER_MS - 1)), vec![]);
    let out = t.sweep_wedged(at(WEDGE_AFTER_MS));
    assert_eq!(
        out,
        vec![
            ("k".to_owned(), 2, QueueError::Wedged),
            ("k".to_owned(), 3, QueueError::Wedged)
        ]
    );
    // A fresh limiter replaced it.
    let l = t.get_mut("k").unwrap();
    assert_eq!((l.queued(), l.reservoir_left()), (0, Some(1)));
    assert_eq!(l.schedule(4, at(WEDGE_AFTER_MS)), Schedule::StartNow);
    // Running work is not a wedge.
    assert_eq!(l.schedule(5, at(WEDGE_AFTER_MS)), Schedule::Queued);
    assert!(!l.is_wedged(at(10 * WEDGE_AFTER_MS)));
}

#[test]
fn a_long_retry_hint_is_not_a_wedge() {
    let mut l = Limiter::new(settings(10, 0, None, 0), at(0));
    observe_retry_hint(&mut l, 3_600_000, at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::Queued);
    assert!(!l.is_wedged(at(10 * WEDGE_AFTER_MS)));
}

#[test]
fn every_grant_is_a_heartbeat() {
    // A limiter created at 0 grants its last token of the minute at 200 s; the next head
    // waits for the refill (240 s) and, once that has passed without a promotion, only a
    // full 120 s after that grant counts as wedged — not 120 s after the creation.
    let mut l = Limiter::new(settings(10, 0, Some(1), 0), at(0));
    assert_eq!(l.schedule(1, at(200_000)), Schedule::StartNow);
    assert_eq!(l.on_finish(1, at(200_001)), vec![]);
    assert_eq!(l.schedule(2, at(201_000)), Schedule::Queued);
    assert!(!l.is_wedged(at(250_000)));
    assert!(!l.is_wedged(at(319_999)));
    assert!(l.is_wedged(at(320_000)));
}

#[test]
fn a_head_waiting_for_its_spacing_is_not_a_wedge() {
    // Spacing longer than the wedge threshold, and a queue budget shorter than the spacing:
    // the head waits for its budget to end (503 queue timeout), not for the watchdog.
    let mut l = Limiter::new(settings(10, 200_000, None, 30_000), at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.on_finish(1, at(1)), vec![]);
    assert_eq!(l.schedule(2, at(130_000)), Schedule::Queued);
    assert!(!l.is_wedged(at(135_000)));
    assert_eq!(
        l.expire(at(160_000)),
        vec![(
            2,
            QueueError::QueueTimeout {
                max_wait_ms: 30_000
            }
        )]
    );
}

#[test]
fn a_spent_request_budget_fails_before_scheduling() {
    let mut l = Limiter::new(settings(1, 0, None, 30_000), at(0));
    assert_eq!(
        l.schedule_with_budget(1, 0, at(0)),
        Err(QueueError::QueueTimeout {
            max_wait_ms: 30_000
        })
    );
    assert_eq!((l.queued(), l.running()), (0, 0));
    assert_eq!(
        l.schedule_with_budget(1, 5_000, at(0)),
        Ok(Schedule::StartNow)
    );
    // The request's own budget is shorter than max_wait: it bounds the queue wait.
    assert_eq!(
        l.schedule_with_budget(2, 2_000, at(0)),
        Ok(Schedule::Queued)
    );
    assert_eq!(l.next_wake_ns(), Some(2_000 * MS));
    assert_eq!(
        l.expire(at(2_000)),
        vec![(
            2,
            QueueError::QueueTimeout {
                max_wait_ms: 30_000
            }
        )]
    );
    // A longer own budget does not extend max_wait.
    assert_eq!(
        l.schedule_with_budget(3, 90_000, at(2_000)),
        Ok(Schedule::Queued)
    );
    assert_eq!(l.next_wake_ns(), Some(32_000 * MS));
}

#[test]
fn combo_admission_never_queues() {
    let mut t = LimiterTable::new();
    let s = settings(6, 350, Some(60), 30_000);
    assert_eq!(
        t.combo_admission("k", s, 1, at(0)),
        ComboAdmission::Acquired
    );
    // Something running: busy.
    assert_eq!(
        t.combo_admission("k", s, 2, at(1_000)),
        ComboAdmission::Busy
    );
    t.get_mut("k").unwrap().on_finish(1, at(100));
    // Spacing not ready yet.
    assert_eq!(t.combo_admission("k", s, 3, at(200)), ComboAdmission::Busy);
    assert_eq!(
        t.combo_admission("k", s, 4, at(350)),
        ComboAdmission::Acquired
    );
    assert_eq!(t.get_mut("k").unwrap().queued(), 0);
    t.on_upstream_429("k", Some(10_000), at(400));
    assert_eq!(
        t.combo_admission("k", s, 5, at(500)),
        ComboAdmission::Cooldown {
            remaining_ms: 9_900
        }
    );
    t.on_upstream_success("k");
    let off = LimiterSettings {
        enabled: false,
        ..s
    };
    assert_eq!(
        t.combo_admission("other", off, 6, at(500)),
        ComboAdmission::Acquired
    );
    assert!(t.get_mut("other").is_none());
}

#[test]
fn idle_limiters_are_evicted() {
    let mut t = LimiterTable::new();
    t.get_or_create("a", settings(1, 0, None, 0), at(0))
        .schedule(1, at(0));
    t.get_or_create("b", settings(1, 0, None, 0), at(0));
    assert_eq!(t.evict_idle(at(LIMITER_IDLE_EVICT_MS)), 1, "a holds a slot");
    t.get_mut("a")
        .unwrap()
        .on_finish(1, at(LIMITER_IDLE_EVICT_MS));
    assert_eq!(t.evict_idle(at(2 * LIMITER_IDLE_EVICT_MS - 1)), 0);
    assert_eq!(t.evict_idle(at(2 * LIMITER_IDLE_EVICT_MS)), 1);
    assert!(t.is_empty());
}

#[test]
fn forgotten_keys_go_when_unused_with_their_remembered_cooldowns() {
    let mut t = LimiterTable::new();
    t.get_or_create("p:gone", settings(1, 0, None, 0), at(0))
        .schedule(1, at(0));
    t.get_or_create("p:gone:m1", settings(1, 0, None, 0), at(0));
    t.get_or_create("p:kept", settings(1, 0, None, 0), at(0));
    t.on_upstream_429("p:gone:m1", Some(60_000), at(0));
    t.on_upstream_429("p:gone", Some(60_000), at(0));
    let keep = |k: &str| k.starts_with("p:kept");
    assert_eq!(
        t.forget(keep),
        1,
        "p:gone holds a slot; p:gone:m1 is unused"
    );
    assert!(t.known_cooldown_ms("p:gone:m1", at(1)).is_none());
    assert!(
        t.known_cooldown_ms("p:gone", at(1)).is_some(),
        "kept while its limiter is"
    );
    t.get_mut("p:gone").unwrap().on_finish(1, at(5));
    assert_eq!(t.forget(keep), 1);
    assert!(t.known_cooldown_ms("p:gone", at(6)).is_none());
    assert_eq!(t.entry_count(), 1);
    assert!(t.get("p:kept").is_some());
}

// ---- provider sliding window ----

#[test]
fn provider_default_window_and_overrides() {
    let mut s = ResilienceSettings::default();
    assert_eq!(
        ProviderWindow::for_provider(
            &s,
            "nvidia",
            &ProviderKind::default_for_id("nvidia").quirks()
        ),
        Some(ProviderWindow {
            limit: NVIDIA_DEFAULT_RPM,
            window_ms: PROVIDER_WINDOW_MS
        })
    );
    assert_eq!(
        ProviderWindow::for_provider(
            &s,
            "openai",
            &ProviderKind::default_for_id("openai").quirks()
        ),
        None
    );
    assert_eq!(
        provider_default_concurrency(
            &s,
            "nvidia",
            &ProviderKind::default_for_id("nvidia").quirks()
        ),
        Some(6)
    );
    assert_eq!(
        provider_default_concurrency(
            &s,
            "openai",
            &ProviderKind::default_for_id("openai").quirks()
        ),
        None
    );
    s.provider_quota_overrides.insert(
        "openai".into(),
        ProviderQuotaOverride {
            rpm: Some(3),
            concurrency: Some(2),
            provider_concurrency: None,
        },
    );
    s.provider_quota_overrides.insert(
        "nvidia".into(),
        ProviderQuotaOverride {
            rpm: Some(0),
            concurrency: None,
            provider_concurrency: None,
        },
    );
    assert_eq!(
        ProviderWindow::for_provider(
            &s,
            "openai",
            &ProviderKind::default_for_id("openai").quirks()
        )
        .map(|w| w.limit),
        Some(3)
    );
    assert_eq!(
        ProviderWindow::for_provider(
            &s,
            "nvidia",
            &ProviderKind::default_for_id("nvidia").quirks()
        )
        .map(|w| w.limit),
        Some(40),
        "rpm 0 is no override"
    );
    assert_eq!(
        provider_default_concurrency(
            &s,
            "openai",
            &ProviderKind::default_for_id("openai").quirks()
        ),
        Some(2)
    );
    assert_eq!(ProviderWindow::key("NVIDIA", None), "nvidia:_");
}

#[test]
fn sliding_window_blocks_then_fails_open() {
    let spec = ProviderWindow {
        limit: 2,
        window_ms: 60_000,
    };
    let mut w = SlidingWindow::new();
    assert_eq!(
        w.admit(spec, at(0).mono_ns, 30_000, at(0)),
        WindowDecision::Go
    );
    assert_eq!(
        w.admit(spec, at(10_000).mono_ns, 30_000, at(10_000)),
        WindowDecision::Go
    );
    assert_eq!(
        w.admit(spec, at(20_000).mono_ns, 30_000, at(20_000)),
        WindowDecision::WaitUntil(60_000 * MS)
    );
    assert_eq!(
        w.admit(spec, at(20_000).mono_ns, 30_000, at(60_000)),
        WindowDecision::Go
    );
    // Budget = max(window, max_wait) = 60 s.
    assert_eq!(
        w.admit(spec, at(61_000).mono_ns, 30_000, at(61_000)),
        WindowDecision::WaitUntil(70_000 * MS)
    );
    assert_eq!(
        w.admit(spec, at(0).mono_ns, 30_000, at(65_000)),
        WindowDecision::FailOpen
    );
    assert_eq!(w.count(spec, at(65_000)), 3);
    assert!(w.is_empty(spec, at(200_000)));
}

#[test]
fn manual_clock_drives_the_limiter() {
    let clock = ManualClock::new(0);
    let mut l = Limiter::new(settings(1, 1_000, None, 0), clock.now());
    assert_eq!(l.schedule(1, clock.now()), Schedule::StartNow);
    clock.advance_ms(10);
    assert_eq!(l.schedule(2, clock.now()), Schedule::Queued);
    assert!(
        l.on_finish(1, clock.now())
            == vec![Grant {
                waiter: 2,
                start_at_ns: 1_000 * MS
            }]
    );
}

// ---- properties ----

#[derive(Clone, Debug)]
enum Op {
    Schedule,
    ScheduleWithBudget(u64),
    Advance(u64),
    Finish(usize),
    Cancel(usize),
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Schedule),
        1 => (0u64..10_000).prop_map(Op::ScheduleWithBudget),
        3 => (1u64..3_000).prop_map(Op::Advance),
        3 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => Just(Op::Tick),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Queued,
    Granted,
    Finished,
    TimedOut,
    Cancelled,
}

struct Model {
    s: LimiterSettings,
    st: HashMap<WaiterId, St>,
    enqueued: HashMap<WaiterId, u64>,
    own_deadline: HashMap<WaiterId, u64>,
    starts: Vec<(WaiterId, u64)>,
    ends: HashMap<WaiterId, u32>,
}

impl Model {
    fn grant(&mut self, id: WaiterId, start: u64) {
        assert_eq!(
            self.st.get(&id),
            Some(&St::Queued),
            "granted twice or after ending: {id}"
        );
        self.st.insert(id, St::Granted);
        if let Some((_, prev)) = self.starts.last() {
            assert!(
                start >= prev + self.s.min_time_ms * MS,
                "spacing {prev} → {start}"
            );
        }
        if let Some((prev_id, _)) = self.starts.last() {
            assert!(id > *prev_id, "FIFO: {prev_id} then {id}");
        }
        if self.s.max_wait_ms > 0 {
            assert!(
                start <= self.enqueued[&id] + self.s.max_wait_ms * MS,
                "started past its queue budget"
            );
        }
        if let Some(d) = self.own_deadline.get(&id) {
            assert!(start <= *d, "started past its own budget");
        }
        self.starts.push((id, start));
        let live = self.st.values().filter(|s| **s == St::Granted).count();
        assert!(
            live <= self.s.max_concurrent as usize,
            "{live} > {}",
            self.s.max_concurrent
        );
    }

    fn end(&mut self, id: WaiterId, how: St) {
        *self.ends.entry(id).or_default() += 1;
        self.st.insert(id, how);
    }

    fn ids(&self, want: &[St]) -> Vec<WaiterId> {
        let mut v: Vec<_> = self
            .st
            .iter()
            .filter(|(_, s)| want.contains(s))
            .map(|(i, _)| *i)
            .collect();
        v.sort_unstable();
        v
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn limiter_invariants(
        max_concurrent in 1u32..4,
        min_time_ms in prop_oneof![Just(0u64), 1u64..2_000],
        rpm in prop_oneof![Just(None), (1u32..6).prop_map(Some)],
        max_wait_ms in prop_oneof![Just(0u64), 500u64..20_000],
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let s = settings(max_concurrent, min_time_ms, rpm, max_wait_ms);
        let mut l = Limiter::new(s, at(0));
        let mut m = Model { s, st: HashMap::new(), enqueued: HashMap::new(), own_deadline: HashMap::new(), starts: Vec::new(), ends: HashMap::new() };
        let mut now_ms = 0u64;
        let mut next_id: WaiterId = 0;
        let apply = |m: &mut Model, grants: Vec<Grant>| for g in grants { m.grant(g.waiter, g.start_at_ns) };
        for op in ops {
            let now = at(now_ms);
            match op {
                Op::Schedule => {
                    next_id += 1;
                    m.st.insert(next_id, St::Queued);
                    m.enqueued.insert(next_id, now.mono_ns);
                    match l.schedule(next_id, now) {
                        Schedule::StartNow => m.grant(next_id, now.mono_ns),
                        Schedule::StartAt(t) => { prop_assert!(t > now.mono_ns); m.grant(next_id, t) }
                        Schedule::Queued => {}
                    }
                }
                Op::ScheduleWithBudget(budget_ms) => {
                    next_id += 1;
                    match l.schedule_with_budget(next_id, budget_ms, now) {
                        Err(e) => {
                            prop_assert_eq!(budget_ms, 0);
                            prop_assert_eq!(e, QueueError::QueueTimeout { max_wait_ms });
                            m.st.insert(next_id, St::TimedOut);
                            m.end(next_id, St::TimedOut);
                        }
                        Ok(sched) => {
                            m.st.insert(next_id, St::Queued);
                            m.enqueued.insert(next_id, now.mono_ns);
                            m.own_deadline.insert(next_id, now.mono_ns + budget_ms * MS);
                            match sched {
                                Schedule::StartNow => m.grant(next_id, now.mono_ns),
                                Schedule::StartAt(t) => m.grant(next_id, t),
                                Schedule::Queued => {}
                            }
                        }
                    }
                }
                Op::Advance(ms) => now_ms += ms,
                Op::Finish(i) => {
                    let g = m.ids(&[St::Granted]);
                    if !g.is_empty() {
                        let id = g[i % g.len()];
                        let start = m.starts.iter().find(|(w, _)| *w == id).map(|(_, t)| *t).unwrap();
                        if start <= now.mono_ns {
                            m.end(id, St::Finished);
                            let grants = l.on_finish(id, now);
                            apply(&mut m, grants);
                        }
                    }
                }
                Op::Cancel(i) => {
                    let live = m.ids(&[St::Queued, St::Granted]);
                    if !live.is_empty() {
                        let id = live[i % live.len()];
                        m.end(id, St::Cancelled);
                        let (known, grants) = l.cancel(id, now);
                        prop_assert!(known);
                        apply(&mut m, grants);
                    }
                }
                Op::Tick => {
                    for (id, e) in l.expire(now) {
                        prop_assert_eq!(e, QueueError::QueueTimeout { max_wait_ms });
                        prop_assert_eq!(m.st.get(&id), Some(&St::Queued));
                        m.end(id, St::TimedOut);
                    }
                    let grants = l.promote(now);
                    apply(&mut m, grants);
                }
            }
            prop_assert_eq!(l.queued(), m.ids(&[St::Queued]).len());
            prop_assert_eq!(l.running(), m.ids(&[St::Granted]).len());
        }
        // Drain: every waiter ends exactly once.
        for _ in 0..10_000 {
            if m.ids(&[St::Queued, St::Granted]).is_empty() { break; }
            now_ms += 1_000;
            let now = at(now_ms);
            for (id, _) in l.expire(now) { m.end(id, St::TimedOut); }
            let grants = l.promote(now);
            apply(&mut m, grants);
            for id in m.ids(&[St::Granted]) {
                let start = m.starts.iter().find(|(w, _)| *w == id).map(|(_, t)| *t).unwrap();
                if start <= now.mono_ns {
                    m.end(id, St::Finished);
                    let grants = l.on_finish(id, now);
                    apply(&mut m, grants);
                }
            }
        }
        prop_assert!(m.ids(&[St::Queued, St::Granted]).is_empty());
        prop_assert_eq!(m.ends.len(), next_id as usize);
        prop_assert!(m.ends.values().all(|n| *n == 1));
        prop_assert_eq!((l.queued(), l.running()), (0, 0));
    }
}

#[test]
fn observe_response_is_the_one_entry_point() {
    let mut t = LimiterTable::new();
    let s = settings(10, 350, Some(60), 30_000);
    t.get_or_create("k", s, at(0));
    let h: &[(&str, &str)] = &[("retry-after", "5")];
    let out = observe_response(
        &mut t,
        "k",
        429,
        h,
        "slow down: 5 requests within 1 minutes",
        at(0),
    );
    assert_eq!(out.cooldown_ms, Some(5_000));
    assert_eq!(
        out.cap,
        CapLearn::Applied {
            min_time_ms: 12_000
        }
    );
    assert_eq!(t.get_mut("k").unwrap().min_time_ms(), 12_000);

    let h: &[(&str, &str)] = &[("x-ratelimit-limit-requests", "600")];
    let out = observe_response(&mut t, "k", 200, h, "", at(1_000));
    assert_eq!(out.headers.min_time_ms, Some(90));
    assert_eq!(t.known_cooldown_ms("k", at(1_000)), None);

    let empty: &[(&str, &str)] = &[];
    let out = observe_response(
        &mut t,
        "k",
        503,
        empty,
        r#"{"retry_after_ms": 2000}"#,
        at(2_000),
    );
    assert_eq!(out.retry_hint_ms, Some(2_000));
    let l = t.get_mut("k").unwrap();
    assert_eq!(l.reservoir_left(), Some(0));
    assert_eq!(l.schedule(1, at(2_000)), Schedule::Queued);
    assert_eq!(l.promote(at(4_000)).len(), 1);

    // No limiter for the key (protection off): the 429 cooldown is still remembered.
    let out = observe_response(&mut t, "none", 429, empty, "", at(0));
    assert_eq!(out.cooldown_ms, Some(KNOWN_COOLDOWN_DEFAULT_MS));
    assert!(t.get_mut("none").is_none());
}

#[test]
fn changed_settings_reconfigure_in_place() {
    let mut t = LimiterTable::new();
    let s = settings(1, 350, Some(60), 30_000);
    let l = t.get_or_create("k", s, at(0));
    assert_eq!(l.schedule(1, at(0)), Schedule::StartNow);
    assert_eq!(l.schedule(2, at(0)), Schedule::Queued);
    l.force_min_time_ms(200);
    let s2 = LimiterSettings {
        min_time_ms: 1_000,
        max_concurrent: 2,
        ..s
    };
    let l = t.get_or_create("k", s2, at(10));
    assert_eq!((l.min_time_ms(), l.queued(), l.running()), (1_000, 1, 1));
    assert_eq!(
        l.reservoir_left(),
        Some(59),
        "same rpm: the reservoir is kept"
    );
    assert_eq!(
        l.promote(at(10)),
        vec![Grant {
            waiter: 2,
            start_at_ns: 1_000 * MS
        }]
    );
}
