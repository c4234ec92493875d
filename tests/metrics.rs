//! `/metrics` parses with a maintained Prometheus text-format parser (Python's
//! `prometheus_client.parser`, pinned in tests/compat/requirements.txt) on two shards, and
//! its histograms, labelled counters and breaker gauges move under load.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;
use support::compat::python;
use support::*;

const PARSER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/compat/parse_metrics.py");

/// `/metrics` from loopback, parsed by prometheus_client: family → {type, samples}.
fn scrape(gw: &Gateway) -> Value {
    let r = Client::connect(gw.addr()).request("GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200);
    let mut child = Command::new(python())
        .arg(PARSER)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&r.body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "prometheus_client refused the exposition: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        r.text()
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_unique_series(&parsed);
    parsed
}

/// No two samples of the exposition share a name and label set (the text format forbids it,
/// and prometheus_client's parser lets it through).
fn assert_unique_series(m: &Value) {
    let mut seen = std::collections::HashSet::new();
    for family in m.as_object().unwrap().values() {
        for s in family["samples"].as_array().unwrap() {
            let mut labels: Vec<(String, String)> = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect();
            labels.sort();
            let key = (s[0].as_str().unwrap().to_string(), labels);
            assert!(seen.insert(key.clone()), "a series appears twice: {key:?}");
        }
    }
}

/// The value of the sample `name` whose labels include `labels`. (The parser names a
/// counter's family without its `_total` suffix.)
fn sample(m: &Value, family: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let family = if m.get(family).is_some() {
        family
    } else {
        family.trim_end_matches("_total")
    };
    let samples = m[family]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no family {family}"));
    samples
        .iter()
        .find(|s| s[0] == name && labels.iter().all(|(k, v)| s[1][*k].as_str() == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in {family}"))[2]
        .as_f64()
        .unwrap()
}

#[test]
fn metrics_parse_and_histograms_and_counters_move_under_load() {
    let mock = MockUpstream::start();
    for _ in 0..2 {
        mock.on("/v1/chat/completions", Reply::error(503, "overloaded"));
    }
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    let breaker = "[resilience.provider_breaker.apikey]\nfailure_threshold = 2\ndegradation_threshold = 1\nreset_timeout_ms = 1000\n";
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        2,
        "disable_cooling = true",
        breaker,
    ));
    assert_eq!(gw.shards(), 2);

    let before = scrape(&gw);
    for family in [
        "tidegate_admission_wait_seconds",
        "tidegate_request_duration_seconds",
        "tidegate_upstream_head_seconds",
        "tidegate_upstream_ttfb_seconds",
    ] {
        assert_eq!(before[family]["type"], "histogram", "{family}");
    }
    assert_eq!(before["tidegate_build_info"]["type"], "gauge");
    assert_eq!(before["process_start_time_seconds"]["type"], "gauge");
    assert!(
        sample(
            &before,
            "process_resident_memory_bytes",
            "process_resident_memory_bytes",
            &[]
        ) > 0.0
    );
    assert_eq!(
        sample(
            &before,
            "tidegate_upstream_head_seconds",
            "tidegate_upstream_head_seconds_count",
            &[("provider", "up")]
        ),
        0.0
    );
    // No label is ever empty.
    for (name, family) in before.as_object().unwrap() {
        for s in family["samples"].as_array().unwrap() {
            for (k, v) in s[1].as_object().unwrap() {
                assert!(!v.as_str().unwrap().is_empty(), "{name}: empty label {k}");
            }
        }
    }

    // Two failures open the connection's breaker; then the reset timeout passes and traffic
    // flows again. Requests on new connections land on both shards.
    for _ in 0..2 {
        let r = Client::connect(gw.addr()).request(
            "POST",
            "/v1/chat/completions",
            &[],
            br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
        );
        assert_eq!(r.status, 503);
    }
    let open = eventually(
        std::time::Duration::from_secs(3),
        "the breaker to open",
        || {
            let m = scrape(&gw);
            (sample(
                &m,
                "tidegate_breaker_transitions_total",
                "tidegate_breaker_transitions_total",
                &[("to", "OPEN")],
            ) >= 1.0)
                .then_some(m)
        },
    );
    assert_eq!(
        sample(
            &open,
            "tidegate_upstream_attempts_by_connection_total",
            "tidegate_upstream_attempts_by_connection_total",
            &[("connection", "c1"), ("class", "5xx")]
        ),
        2.0
    );
    // The probe's success closes the breaker on its owner; the other shard hears it by a
    // view, so a request there may still be refused for a moment. Ten answers from the
    // upstream, however many refusals it takes.
    let mut served = 0;
    eventually(
        std::time::Duration::from_secs(5),
        "ten requests served after the reset timeout",
        || {
            let r = Client::connect(gw.addr()).request(
                "POST",
                "/v1/chat/completions",
                &[],
                br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#,
            );
            served += usize::from(r.status == 200);
            (served >= 10).then_some(())
        },
    );
    let after = scrape(&gw);
    let count = |m: &Value, f: &str| sample(m, f, &format!("{f}_count"), &[("provider", "up")]);
    assert!(count(&after, "tidegate_upstream_head_seconds") >= 12.0);
    assert!(count(&after, "tidegate_upstream_ttfb_seconds") >= 10.0);
    assert!(count(&after, "tidegate_admission_wait_seconds") >= 12.0);
    let inf = sample(
        &after,
        "tidegate_upstream_head_seconds",
        "tidegate_upstream_head_seconds_bucket",
        &[("provider", "up"), ("le", "+Inf")],
    );
    assert_eq!(inf, count(&after, "tidegate_upstream_head_seconds"));
    let routed = sample(
        &after,
        "tidegate_request_duration_seconds",
        "tidegate_request_duration_seconds_count",
        &[("route", "chat_completions")],
    );
    assert!(routed >= 12.0, "{routed}");
    assert!(
        sample(
            &after,
            "tidegate_request_duration_seconds",
            "tidegate_request_duration_seconds_sum",
            &[("route", "chat_completions")]
        ) > 0.0
    );
    assert!(
        sample(
            &after,
            "tidegate_http_requests_total",
            "tidegate_http_requests_total",
            &[("route", "chat_completions")]
        ) >= 12.0
    );
    assert!(
        sample(
            &after,
            "tidegate_upstream_attempts_by_model_total",
            "tidegate_upstream_attempts_by_model_total",
            &[("provider", "up"), ("model", "m1")]
        ) >= 12.0
    );
    assert!(
        sample(
            &after,
            "tidegate_breaker_transitions_total",
            "tidegate_breaker_transitions_total",
            &[("to", "CLOSED")]
        ) >= 1.0,
        "the probe's success closed it"
    );
    assert_eq!(
        sample(
            &after,
            "tidegate_breaker_state",
            "tidegate_breaker_state",
            &[("provider", "up"), ("state", "OPEN")]
        ),
        0.0
    );

    // Every metric the shipped Grafana dashboard queries exists.
    let text = Client::connect(gw.addr())
        .request("GET", "/metrics", &[], b"")
        .text();
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/grafana-dashboard.json"
    ))
    .unwrap();
    let mut names = 0;
    for word in dashboard.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("tidegate_") || word.starts_with("process_") {
            names += 1;
            assert!(
                text.lines().any(|l| l.starts_with(word)),
                "the dashboard queries {word}, which /metrics does not have"
            );
        }
    }
    assert!(names > 10);
}

/// Fallbacks inside a combo are counted like a direct request's: a target whose upstream
/// cannot be reached (a gateway-made failure) moves the combo to its next target and
/// counts one `tidegate_fallbacks_total{cause="gateway"}`; the attempts of both targets are
/// counted too.
#[test]
fn fallbacks_inside_a_combo_are_counted() {
    let mock = MockUpstream::start();
    mock.on_always("/v1/chat/completions", Reply::openai_chat("ok"));
    // A port held without listening for the whole test: connecting is refused at once
    // (a port merely released could be given to another process meanwhile).
    let dead = support::RefusingPort::new();
    let tail = format!(
        "{}[[connections]]\nid = \"d1\"\nprovider = \"dead\"\ndisable_cooling = true\n\n\
         [[combos]]\nname = \"team\"\ntargets = [\"dead/m1\", \"up/m1\"]\n",
        support::config::provider("dead", &dead.base_url(), &["m1"]),
    );
    let gw = Gateway::start(&one_upstream(&mock.base_url(), 2, "", &tail));
    let gateway_fallbacks = |m: &Value| -> f64 {
        let family = if m.get("tidegate_fallbacks_total").is_some() {
            "tidegate_fallbacks_total"
        } else {
            "tidegate_fallbacks"
        };
        m[family]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s[1]["cause"] == "gateway")
            .map(|s| s[2].as_f64().unwrap())
            .sum()
    };
    let before = gateway_fallbacks(&scrape(&gw));
    let r = Client::connect(gw.addr()).request(
        "POST",
        "/v1/chat/completions",
        &[],
        br#"{"model":"team","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mock.hits("/v1/chat/completions"), 1);
    let after = scrape(&gw);
    assert!(
        gateway_fallbacks(&after) >= before + 1.0,
        "the combo's move past the unreachable target is a fallback"
    );
}

#[test]
fn a_disabled_connection_is_counted_as_disabled_not_routable() {
    let mock = MockUpstream::start();
    // `keyless`'s only connection names a key variable that is not set: switched off at load.
    let tail = format!(
        "{}[[connections]]\nid = \"k1\"\nprovider = \"keyless\"\n\
         api_key_env = \"TIDEGATE_TEST_KEY_THAT_IS_NEVER_SET\"\n\n",
        support::config::provider("keyless", &mock.base_url(), &["m1"]),
    );
    let gw = Gateway::start(&one_upstream(&mock.base_url(), 1, "", &tail));
    let m = scrape(&gw);
    let status = |provider: &str, status: &str| {
        sample(
            &m,
            "tidegate_connection_status",
            "tidegate_connection_status",
            &[("provider", provider), ("status", status)],
        )
    };
    assert_eq!(status("keyless", "disabled"), 1.0);
    assert_eq!(status("keyless", "routable"), 0.0);
    assert_eq!(status("up", "routable"), 1.0);
    assert_eq!(status("up", "disabled"), 0.0);
}
