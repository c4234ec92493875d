//! Logs an operator can use: one access-log line per request with its request id (the
//! client's `x-request-id`, or one made here, returned either way), `server.log_format =
//! "json"`, breaker transitions logged once per transition, failovers at INFO, and an
//! invalid `TIDEGATE_LOG` refused.
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use support::*;

const CHAT: &str = "/v1/chat/completions";
const BODY: &[u8] = br#"{"model":"up/m1","messages":[{"role":"user","content":"hi"}]}"#;

fn keyed(base_url: &str, server_extra: &str) -> String {
    one_upstream(base_url, 2, "", "").replace(
        "workers = 2\n",
        &format!("workers = 2\n{server_extra}\n[[client_keys]]\nid = \"team-a\"\nkey = \"k-a\"\n"),
    )
}

fn access_lines(logs: &str) -> Vec<String> {
    logs.lines()
        .filter(|l| l.contains("access") && l.contains("request_id"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_request_gets_one_access_log_line_and_its_request_id_back() {
    let mock = MockUpstream::start();
    mock.on_always(
        CHAT,
        Reply::openai_chat("ok").header("x-request-id", "upstream-id"),
    );
    let gw = Gateway::start(&keyed(&mock.base_url(), ""));

    let r = Client::connect(gw.addr()).request(
        "POST",
        CHAT,
        &[
            ("authorization", "Bearer k-a"),
            ("x-request-id", "client-id-1"),
        ],
        BODY,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header_all("x-request-id"), vec!["client-id-1"]);
    let line = eventually(secs(5), "the access line", || {
        access_lines(&gw.logs())
            .into_iter()
            .find(|l| l.contains("request_id=client-id-1"))
    });
    for field in [
        "key=team-a",
        "method=\"POST\"",
        "route=\"/v1/chat/completions\"",
        "model=up/m1",
        "combo=-",
        "provider=up",
        "connection=c1",
        "attempts=1",
        "status=200",
        "ttfb_ms=",
        "latency_ms=",
        "error=\"-\"",
    ] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
    assert!(!line.contains("bytes=0"), "{line}");

    // Without one, an id is made and returned; a refused request is logged too.
    let r =
        Client::connect(gw.addr()).request("POST", CHAT, &[("authorization", "Bearer nope")], BODY);
    assert_eq!(r.status, 401);
    let id = r
        .header("x-request-id")
        .expect("a generated request id")
        .to_owned();
    let line = eventually(secs(5), "the refused request's line", || {
        access_lines(&gw.logs())
            .into_iter()
            .find(|l| l.contains(&format!("request_id={id}")))
    });
    assert!(
        line.contains("status=401") && line.contains("invalid_api_key"),
        "{line}"
    );
    assert_eq!(access_lines(&gw.logs()).len(), 2, "{}", gw.logs());
}

/// A request its connection's queue refuses (429 `rate_limit_queue_full`) never reached the
/// upstream, but its target was chosen: the access line names the provider and connection
/// whose queue was full.
#[test]
fn a_queue_full_refusal_names_its_provider_and_connection() {
    let mock = MockUpstream::start();
    let gate = Gate::new();
    mock.on_always(CHAT, Reply::openai_chat("ok").wait_for(&gate));
    let cfg = one_upstream(
        &mock.base_url(),
        2,
        "[connections.rate_limit_overrides]\nrequests_per_minute = 60000\nmax_concurrent = 1",
        "[resilience.request_queue]\nmax_queue_depth = 2",
    );
    let gw = Gateway::start(&cfg);
    let addr = gw.addr();
    let ask = move |id: &str| {
        let mut c = Client::connect(addr);
        c.set_timeout(secs(30));
        c.request("POST", CHAT, &[("x-request-id", id)], BODY)
    };
    // One running, two queued: the queue is full.
    let held: Vec<_> = (0..3)
        .map(|i| std::thread::spawn(move || ask(&format!("held-{i}")).status))
        .collect();
    mock.wait_for_hits(CHAT, 1, secs(10));
    eventually(secs(10), "three requests in the queue", || {
        (metric(addr, "tidegate_queue_requests") == 3).then_some(())
    });
    let r = ask("refused-1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-tidegate-error"), Some("rate_limit_queue_full"));
    let line = eventually(secs(5), "the refused request's line", || {
        access_lines(&gw.logs())
            .into_iter()
            .find(|l| l.contains("request_id=refused-1"))
    });
    for field in [
        "model=up/m1",
        "provider=up",
        "connection=c1",
        "attempts=0",
        "status=429",
        "rate_limit_queue_full",
    ] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
    gate.open();
    let statuses: Vec<u16> = held.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(statuses, vec![200, 200, 200]);
}

/// A management call's access line names who made it: the manage key's id, or
/// `admin-token`.
#[test]
fn management_calls_log_the_key_that_made_them() {
    let mock = MockUpstream::start();
    let cfg = keyed(&mock.base_url(), "admin_token_env = \"TG_LOGS_ADMIN\"").replace(
        "key = \"k-a\"\n",
        "key = \"k-a\"\nscopes = [\"inference\", \"manage\"]\n",
    );
    let gw = Gateway::start_with_env(&cfg, &[("TG_LOGS_ADMIN", "adm-secret")]);
    for (bearer, id, expect) in [
        ("k-a", "mgmt-key", "key=team-a"),
        ("adm-secret", "mgmt-token", "key=admin-token"),
    ] {
        let r = Client::connect(gw.addr()).request(
            "POST",
            "/api/resilience/reset",
            &[
                ("authorization", &format!("Bearer {bearer}")),
                ("x-request-id", id),
            ],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let line = eventually(secs(5), "the management call's line", || {
            access_lines(&gw.logs())
                .into_iter()
                .find(|l| l.contains(&format!("request_id={id}")))
        });
        assert!(line.contains(expect), "{expect} missing from {line}");
    }
}

#[test]
fn log_format_json_writes_one_json_object_per_line() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = Gateway::start(&keyed(&mock.base_url(), "log_format = \"json\""));
    let r = Client::connect(gw.addr()).request(
        "POST",
        CHAT,
        &[("authorization", "Bearer k-a"), ("x-request-id", "json-1")],
        BODY,
    );
    assert_eq!(r.status, 200);
    let record = eventually(secs(5), "the JSON access line", || {
        gw.logs()
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["request_id"] == "json-1")
    });
    assert_eq!(record["target"], "access");
    assert_eq!(record["level"], "INFO");
    assert_eq!(record["status"], 200);
    assert_eq!(record["provider"], "up");
    assert_eq!(record["key"], "team-a");
    assert!(record["time"].as_str().unwrap().ends_with('Z'));
    // Every log line is JSON (the ready line on stdout aside).
    for line in gw
        .logs()
        .lines()
        .filter(|l| !l.starts_with("tidegate listening"))
    {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
}

#[test]
fn an_invalid_tidegate_log_is_an_error() {
    let cfg = one_upstream("http://127.0.0.1:9", 1, "", "");
    let failure = match Gateway::try_start(&cfg, &[("TIDEGATE_LOG", "inof")]) {
        Ok(gw) => panic!("started with TIDEGATE_LOG=inof:\n{}", gw.logs()),
        Err(f) => f,
    };
    assert_eq!(
        failure.status.and_then(|s| s.code()),
        Some(2),
        "{}",
        failure.logs
    );
    assert!(failure.logs.contains("TIDEGATE_LOG"), "{}", failure.logs);
    // A valid filter with a target starts.
    let gw = Gateway::start_with_env(&cfg, &[("TIDEGATE_LOG", "warn,access=info")]);
    drop(gw);
}

#[test]
fn breaker_transitions_are_logged_once_and_failovers_at_info() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::error(503, "overloaded"));
    let cfg = one_upstream(
        &mock.base_url(),
        2,
        "disable_cooling = true",
        "[resilience.provider_breaker.apikey]\nfailure_threshold = 3\ndegradation_threshold = 2\nreset_timeout_ms = 60000",
    )
    .replace(
        "[[connections]]\nid = \"c1\"\nprovider = \"up\"\n",
        "[[connections]]\nid = \"c1\"\nprovider = \"up\"\ndisable_cooling = true\n[[connections]]\nid = \"c2\"\nprovider = \"up\"\n",
    );
    let cfg = cfg.replacen(
        "disable_cooling = true\n[[connections]]",
        "[[connections]]",
        1,
    );
    let gw = Gateway::start(&cfg);
    for _ in 0..12 {
        Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
    }
    eventually(secs(5), "a breaker to open", || {
        gw.logs().contains("circuit breaker opened").then_some(())
    });
    let logs = gw.logs();
    // Two connections, each opens once; the rejected requests after that log nothing more.
    let opened = logs.matches("circuit breaker opened").count();
    assert!((1..=2).contains(&opened), "{opened} open lines:\n{logs}");
    assert!(logs.contains("trying the next candidate"), "{logs}");
    assert!(logs.contains(" INFO "), "{logs}");
}

#[test]
fn model_lockout_transitions_are_logged_once_each() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(404, "The model `m1` does not exist"));
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    // A self-hosted provider: a 404 locks the model on the connection.
    let cfg = one_upstream(&mock.base_url(), 2, "", "").replace(
        "format = \"openai\"\n",
        "format = \"openai\"\nauth = \"local\"\n",
    );
    let gw = Gateway::start(&cfg);
    let first = Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
    assert_ne!(first.status, 200, "{}", first.text());
    eventually(secs(5), "the lock line", || {
        gw.logs().contains("model locked for").then_some(())
    });
    // Requests refused by the lock log no transition.
    for _ in 0..5 {
        let r = Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
        assert_ne!(r.status, 200);
    }
    // An operator's clear lifts it: one more line.
    let cleared = Client::connect(gw.addr()).request(
        "DELETE",
        "/api/resilience/model-cooldowns",
        &[],
        br#"{"provider":"up","model":"m1"}"#,
    );
    assert_eq!(cleared.status, 200, "{}", cleared.text());
    eventually(secs(5), "the lift line", || {
        gw.logs().contains("model lock lifted").then_some(())
    });
    let logs = gw.logs();
    assert_eq!(logs.matches("model locked for").count(), 1, "{logs}");
    assert_eq!(logs.matches("model lock lifted").count(), 1, "{logs}");
    let line = logs
        .lines()
        .find(|l| l.contains("model locked for"))
        .unwrap();
    assert!(
        line.contains(" INFO ") && line.contains("m1") && line.contains("not_found"),
        "{line}"
    );
}

/// `c1` (priority 1) and `c2` on one upstream, told apart by their keys.
fn two_connections(base_url: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\n{}\
         [[connections]]\nid = \"c1\"\nprovider = \"up\"\npriority = 1\napi_key_env = \"TG_K1\"\n\n\
         [[connections]]\nid = \"c2\"\nprovider = \"up\"\npriority = 2\napi_key_env = \"TG_K2\"\n",
        provider("up", base_url, &["m1"])
    )
}

fn served_by(gw: &Gateway) -> String {
    let r = Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-omniroute-selected-connection-id")
        .unwrap_or("")
        .to_owned()
}

#[test]
fn connection_cooldowns_and_terminal_states_are_logged_once_per_transition() {
    let mock = MockUpstream::start();
    // c1's first answer: a rate limit for 30 s (a cooldown); c2 serves meanwhile.
    mock.on(
        CHAT,
        Reply::error(429, "slow down").header("retry-after", "30"),
    )
    .on_always(CHAT, Reply::openai_chat("ok"));
    let gw = Gateway::start_with_env(
        &two_connections(&mock.base_url()),
        &[("TG_K1", "key-one"), ("TG_K2", "key-two")],
    );
    assert_eq!(served_by(&gw), "c2");
    // Requests that skip the cooling connection log no transition.
    for _ in 0..5 {
        assert_eq!(served_by(&gw), "c2");
    }
    let cooling = |logs: &str| {
        logs.lines()
            .filter(|l| l.contains("connection cooling down for") && l.contains("c1"))
            .count()
    };
    eventually(secs(5), "the cooldown line", || {
        (cooling(&gw.logs()) > 0).then_some(())
    });
    // An operator's clear ends it: one line, and c1 serves again.
    let cleared = Client::connect(gw.addr()).request(
        "POST",
        "/api/resilience/cooldowns",
        &[],
        br#"{"connectionIds":["c1"]}"#,
    );
    assert_eq!(cleared.status, 200, "{}", cleared.text());
    let available = |logs: &str| {
        logs.lines()
            .filter(|l| l.contains("connection available again") && l.contains("c1"))
            .count()
    };
    eventually(secs(5), "the available line", || {
        (available(&gw.logs()) > 0).then_some(())
    });
    assert_eq!(served_by(&gw), "c1");

    // c1 is then banned: a terminal state, logged once at WARN; later requests skip it
    // without another line.
    mock.on(
        CHAT,
        Reply::error(
            403,
            "Your account has been suspended for violating our terms",
        ),
    );
    assert_eq!(served_by(&gw), "c2");
    for _ in 0..5 {
        assert_eq!(served_by(&gw), "c2");
    }
    let terminal = |logs: &str| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains("connection terminal") && l.contains("c1"))
            .map(str::to_owned)
            .collect()
    };
    let line = eventually(secs(5), "the terminal line", || {
        terminal(&gw.logs()).into_iter().next()
    });
    assert!(line.contains(" WARN "), "{line}");
    let logs = gw.logs();
    assert_eq!(cooling(&logs), 1, "{logs}");
    assert_eq!(available(&logs), 1, "{logs}");
    assert_eq!(terminal(&logs).len(), 1, "{logs}");
    let cooling_line = logs
        .lines()
        .find(|l| l.contains("connection cooling down for"))
        .unwrap();
    assert!(cooling_line.contains(" WARN "), "{cooling_line}");
}

#[test]
fn a_breaker_that_opens_and_closes_again_logs_each_transition_once() {
    let mock = MockUpstream::start();
    mock.on(CHAT, Reply::error(503, "overloaded"))
        .on(CHAT, Reply::error(503, "overloaded"))
        .on_always(CHAT, Reply::openai_chat("ok"));
    // One connection that never cools, its breaker opening at 2 failures for 1 s (the least).
    let gw = Gateway::start(&one_upstream(
        &mock.base_url(),
        1,
        "disable_cooling = true",
        "[resilience.provider_breaker.apikey]\nfailure_threshold = 2\ndegradation_threshold = 1\n\
         reset_timeout_ms = 1000\n\n[resilience.wait_for_cooldown]\nenabled = false\n",
    ));
    let ask = || Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
    for _ in 0..2 {
        assert_eq!(ask().status, 503);
    }
    // Open: refused without a line per request.
    for _ in 0..5 {
        let r = ask();
        assert_eq!(
            r.header("x-tidegate-error"),
            Some("provider_circuit_open"),
            "{}",
            r.text()
        );
    }
    // After the reset timeout one probe goes through, succeeds and closes the breaker.
    let served = eventually(secs(5), "a request served after the reset timeout", || {
        let r = ask();
        (r.status == 200).then_some(r)
    });
    assert_eq!(served.json()["choices"][0]["message"]["content"], "ok");
    let line = eventually(secs(5), "the close line", || {
        gw.logs()
            .lines()
            .find(|l| l.contains("circuit breaker closed"))
            .map(str::to_owned)
    });
    assert!(line.contains(" INFO "), "{line}");
    for _ in 0..3 {
        assert_eq!(ask().status, 200);
    }
    let logs = gw.logs();
    assert_eq!(logs.matches("circuit breaker opened").count(), 1, "{logs}");
    assert_eq!(logs.matches("circuit breaker closed").count(), 1, "{logs}");
    assert_eq!(
        logs.matches("circuit breaker halfopen").count(),
        1,
        "{logs}"
    );
    // The refused requests have their access lines, and nothing more: no WARN line each.
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("provider_circuit_open"))
        .collect();
    assert!(refused.len() >= 5, "{logs}");
    assert!(
        refused.iter().all(|l| l.contains(" access ")),
        "a line per refused request:\n{logs}"
    );
    // The connection never cooled (disable_cooling), so it never became "available again".
    assert!(!logs.contains("connection available again"), "{logs}");
}

/// An upstream that refuses connections: the attempt that failed is logged (WARN), the
/// connection's cooldown once, and the requests refused while it cools (503
/// `upstream_unreachable`, nothing tried) have their access lines and nothing more — no
/// WARN line each, which would flood the log exactly while an upstream is down.
#[test]
fn requests_refused_while_an_unreachable_upstream_cools_log_no_warn_each() {
    let refusing = RefusingPort::new();
    let gw = Gateway::start(&one_upstream(&refusing.base_url(), 1, "", ""));
    let ask = || Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
    let first = ask();
    assert_eq!(
        first.header("x-tidegate-error"),
        Some("upstream_connect_failed"),
        "{}",
        first.text()
    );
    for _ in 0..3 {
        let r = ask();
        assert_eq!(
            r.header("x-tidegate-error"),
            Some("upstream_unreachable"),
            "{}",
            r.text()
        );
    }
    let logs = eventually(secs(5), "three refused access lines", || {
        let logs = gw.logs();
        (logs.matches("error=\"upstream_unreachable\"").count() == 3).then_some(logs)
    });
    assert_eq!(
        logs.matches("connection cooling down for").count(),
        1,
        "{logs}"
    );
    let warned: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("unreachable after network errors"))
        .collect();
    assert!(
        warned.is_empty(),
        "a WARN line per refused request:\n{logs}"
    );
}

/// The number a field of an access line holds (`ttfb_ms=0.123`).
fn field_ms(line: &str, field: &str) -> f64 {
    let start = line
        .find(&format!(" {field}="))
        .unwrap_or_else(|| panic!("{field} missing from {line}"))
        + field.len()
        + 2;
    let value: String = line[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    value
        .parse()
        .unwrap_or_else(|_| panic!("{field} is not a number in {line}"))
}

fn line_of(gw: &Gateway, id: &str) -> String {
    eventually(secs(5), "the access line", || {
        access_lines(&gw.logs())
            .into_iter()
            .find(|l| l.contains(&format!("request_id={id} ")))
    })
}

#[test]
fn ttfb_is_measured_for_an_answer_made_in_process_and_one_from_an_upstream() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let cfg = keyed(&mock.base_url(), "").replace(
        "[[connections]]",
        "[[providers]]\nid = \"inproc\"\nformat = \"mock\"\nmodels = [\"echo\"]\n\n\
         [[connections]]\nid = \"m1\"\nprovider = \"inproc\"\n\n[[connections]]",
    );
    let gw = Gateway::start(&cfg);
    for (id, model) in [("inproc-1", "inproc/echo"), ("upstream-1", "up/m1")] {
        let body =
            format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
        let r = Client::connect(gw.addr()).request(
            "POST",
            CHAT,
            &[("authorization", "Bearer k-a"), ("x-request-id", id)],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let line = line_of(&gw, id);
        let (ttfb, latency) = (field_ms(&line, "ttfb_ms"), field_ms(&line, "latency_ms"));
        // The in-process mock answers within the poll its request started in: the
        // response head is still some microseconds after the request was read.
        assert!(ttfb > 0.0, "{line}");
        assert!(ttfb <= latency, "{line}");
    }
}

#[test]
fn early_refusals_log_what_was_known_when_refused() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::openai_chat("ok"));
    let gw = Gateway::start(&keyed(&mock.base_url(), "max_request_body_bytes = 300"));
    let send = |id: &str, key: &str, path: &str, body: &[u8]| {
        let r = Client::connect(gw.addr()).request(
            "POST",
            path,
            &[("authorization", key), ("x-request-id", id)],
            body,
        );
        assert_eq!(r.header("x-request-id"), Some(id), "{}", r.text());
        (r.status, line_of(&gw, id))
    };
    let has = |line: &str, fields: &[&str]| {
        for f in fields {
            assert!(line.contains(f), "{f} missing from {line}");
        }
    };

    // A model no route serves: the 404 names it (it was peeked).
    let (status, line) = send(
        "unknown-model",
        "Bearer k-a",
        "/v1/messages",
        br#"{"model":"nowhere/x","max_tokens":5,"messages":[]}"#,
    );
    assert_eq!(status, 404);
    has(
        &line,
        &[
            "key=team-a",
            "model=nowhere/x",
            "status=404",
            "error=\"model_not_found\"",
        ],
    );
    // A body that is not JSON: the key is known, the model is not.
    let (status, line) = send("bad-json", "Bearer k-a", "/v1/messages", br#"{"model":"#);
    assert_eq!(status, 400);
    has(
        &line,
        &[
            "key=team-a",
            "model=-",
            "status=400",
            "error=\"invalid_json\"",
        ],
    );
    // A body over the limit is refused before it is read: the line is still written, with
    // the key from the head.
    let big = format!(r#"{{"model":"up/m1","pad":"{}"}}"#, "x".repeat(400));
    let (status, line) = send("too-big", "Bearer k-a", CHAT, big.as_bytes());
    assert_eq!(status, 413);
    has(
        &line,
        &[
            "key=team-a",
            "route=\"/v1/chat/completions\"",
            "model=-",
            "status=413",
            "error=\"request_too_large\"",
        ],
    );
    // A key that is not valid: nothing of the body is read.
    let (status, line) = send("bad-key", "Bearer nope", CHAT, BODY);
    assert_eq!(status, 401);
    has(&line, &["key=-", "model=-", "status=401"]);
}

/// The INFO line of a failure the request moves on from says what comes next: the next
/// candidate while one is left, "no candidate left" on the last one (an error answer and an
/// upstream that cannot be reached alike), and, in a combo, that the combo goes on.
#[test]
fn a_failed_attempt_says_whether_a_candidate_is_left() {
    let mock = MockUpstream::start();
    mock.on_always(CHAT, Reply::error(503, "overloaded"));
    let gw = Gateway::start_with_env(
        &two_connections(&mock.base_url()),
        &[("TG_K1", "key-one"), ("TG_K2", "key-two")],
    );
    let r = Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
    assert_eq!(r.status, 503, "{}", r.text());
    let logs = eventually(secs(5), "both failure lines", || {
        let logs = gw.logs();
        (logs.matches("upstream error;").count() == 2).then_some(logs)
    });
    let line_of = |conn: &str| {
        logs.lines()
            .find(|l| l.contains("upstream error;") && l.contains(&format!("connection={conn}")))
            .unwrap_or_else(|| panic!("no failure line for {conn}:\n{logs}"))
            .to_owned()
    };
    let first = line_of("c1");
    assert!(first.contains(" INFO "), "{first}");
    assert!(
        first.contains("upstream error; trying the next candidate"),
        "{first}"
    );
    let last = line_of("c2");
    assert!(last.contains("upstream error; no candidate left"), "{last}");
    assert!(!last.contains("next candidate"), "{last}");
    drop(gw);

    // The only candidate cannot be reached.
    let refusing = RefusingPort::new();
    let gw = Gateway::start(&one_upstream(&refusing.base_url(), 1, "", ""));
    let r = Client::connect(gw.addr()).request("POST", CHAT, &[], BODY);
    assert_eq!(
        r.header("x-tidegate-error"),
        Some("upstream_connect_failed"),
        "{}",
        r.text()
    );
    let logs = eventually(secs(5), "the failure line", || {
        let logs = gw.logs();
        logs.contains("upstream attempt failed").then_some(logs)
    });
    let line = logs
        .lines()
        .find(|l| l.contains("upstream attempt failed"))
        .unwrap();
    assert!(
        line.contains("upstream_connect_failed") && line.contains("; no candidate left"),
        "{line}"
    );
    drop(gw);

    // A combo: its runner decides what follows.
    let cfg = format!(
        "{}\n[[combos]]\nname = \"duo\"\ntargets = [\"up/m1\", \"up/m2\"]\n",
        one_upstream(&mock.base_url(), 1, "", "")
    );
    let gw = Gateway::start(&cfg);
    let body = br#"{"model":"duo","messages":[{"role":"user","content":"hi"}]}"#;
    let r = Client::connect(gw.addr()).request("POST", CHAT, &[], body);
    assert_ne!(r.status, 200, "{}", r.text());
    let logs = eventually(secs(5), "the combo's failure lines", || {
        let logs = gw.logs();
        logs.contains("upstream error;").then_some(logs)
    });
    assert!(
        logs.contains(
            "upstream error; the combo goes on (a retry, its next target, or its answer)"
        ),
        "{logs}"
    );
    assert!(!logs.contains("candidate left"), "{logs}");
}
