//! Combo ordering strategies (spec B §3.2) through the real binary: round-robin (with its
//! sticky limit, skipping a target the views rule out), weighted (the draw's shares and its
//! sticky limit), fill-first, random, strict-random (one deck), least-used, lkgp (the
//! target and connection that served last), p2c (a target that failed more, or whose
//! response head came slower, is not first), cost-optimized (the cheapest input price
//! first, an unpriced target last, a reloaded price read at once); failover still works
//! under each; a reload that changes a combo's targets restarts its rotation. One shard (`workers = 1`) so each
//! strategy's per-shard state is the only one.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::disallowed_methods
)]

mod support;

use support::*;

const CHAT: &str = "/v1/chat/completions";

fn ask(addr: std::net::SocketAddr, model: &str) -> Response {
    let mut c = Client::connect(addr);
    c.set_timeout(secs(30));
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    c.request("POST", CHAT, &[], body.as_bytes())
}

/// The connection that served `model` (the request must be served).
fn served(addr: std::net::SocketAddr, model: &str) -> String {
    let r = ask(addr, model);
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-omniroute-selected-connection-id")
        .expect("the serving connection")
        .to_owned()
}

fn serve_n(addr: std::net::SocketAddr, model: &str, n: usize) -> Vec<String> {
    (0..n).map(|_| served(addr, model)).collect()
}

/// Mock upstreams answering 200 on every chat request.
fn ok_mocks(n: usize) -> Vec<MockUpstream> {
    (0..n)
        .map(|_| {
            let m = MockUpstream::start();
            m.on_always(CHAT, Reply::openai_chat("ok"));
            m
        })
        .collect()
}

/// One shard; provider `pN` (model `m`) on `mocks[N]` with connection `cN`; the combo
/// `mix` of `strategy` over `targets` (TOML array items) with `combo_config`; `extra`
/// appended.
fn config(
    mocks: &[&MockUpstream],
    strategy: &str,
    targets: &str,
    combo_config: &str,
    extra: &str,
) -> String {
    let mut s = String::from("[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\n");
    for (i, m) in mocks.iter().enumerate() {
        s += &provider(&format!("p{i}"), &m.base_url(), &["m"]);
        s += &connection(&format!("c{i}"), &format!("p{i}"));
    }
    s += &format!(
        "[[combos]]\nname = \"mix\"\nstrategy = \"{strategy}\"\ntargets = [{targets}]\n\n\
         [combos.config]\n{combo_config}\n\n{extra}\n"
    );
    s
}

fn start(mocks: &[&MockUpstream], strategy: &str, targets: &str, combo_config: &str) -> Gateway {
    let gw = Gateway::start(&config(mocks, strategy, targets, combo_config, ""));
    assert_eq!(gw.shards(), 1);
    gw
}

const ABC: &str = r#""p0/m", "p1/m", "p2/m""#;

fn count(v: &[String], c: &str) -> usize {
    v.iter().filter(|s| *s == c).count()
}

#[test]
fn round_robin_starts_each_request_at_the_next_target() {
    let m = ok_mocks(3);
    let gw = start(&[&m[0], &m[1], &m[2]], "round-robin", ABC, "");
    assert_eq!(
        serve_n(gw.addr(), "mix", 7),
        ["c0", "c1", "c2", "c0", "c1", "c2", "c0"]
    );
    // The strategy is built: no load-time warning about its order.
    assert!(!gw.logs().contains("not built"), "{}", gw.logs());
}

#[test]
fn a_sticky_round_robin_limit_keeps_the_start_for_that_many_requests() {
    let m = ok_mocks(3);
    let gw = start(
        &[&m[0], &m[1], &m[2]],
        "round-robin",
        ABC,
        "sticky_round_robin_limit = 2",
    );
    assert_eq!(
        serve_n(gw.addr(), "mix", 7),
        ["c0", "c0", "c1", "c1", "c2", "c2", "c0"]
    );
}

#[test]
fn round_robin_fails_over_and_then_rotates_past_the_target_whose_breaker_is_open() {
    let m = ok_mocks(3);
    let bad = MockUpstream::start();
    bad.on_always(CHAT, Reply::error(500, "boom"));
    // c1 takes no cooldown and no model lock (`disable_cooling`): only its provider's
    // breaker, open at the first failure for the rest of the test, holds it back.
    let cfg = config(
        &[&m[0], &bad, &m[2]],
        "round-robin",
        ABC,
        "",
        "[resilience.provider_breaker.apikey]\nfailure_threshold = 1\nreset_timeout_ms = 600000\n",
    )
    .replace(
        "id = \"c1\"\nprovider = \"p1\"\n",
        "id = \"c1\"\nprovider = \"p1\"\ndisable_cooling = true\n",
    );
    assert!(cfg.contains("disable_cooling"));
    let gw = Gateway::start(&cfg);
    let first = ask(gw.addr(), "mix");
    assert_eq!(
        first.header("x-omniroute-selected-connection-id"),
        Some("c0")
    );
    // c1 is the second start: it fails 500 and the next target serves.
    let second = ask(gw.addr(), "mix");
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(
        second.header("x-omniroute-selected-connection-id"),
        Some("c2")
    );
    assert_eq!(second.header("x-tidegate-attempts"), Some("2"));
    // From then on p1's breaker is open: the rotation runs over c0 and c2 (counter 2, 3, …
    // mod 2), and p1 is never tried again.
    assert_eq!(serve_n(gw.addr(), "mix", 4), ["c0", "c2", "c0", "c2"]);
    assert_eq!(bad.requests_to(CHAT).len(), 1);
}

#[test]
fn weighted_3_to_1_lands_about_three_quarters_on_the_heavier() {
    let m = ok_mocks(3);
    let gw = start(
        &[&m[0], &m[1], &m[2]],
        "weighted",
        r#"{ model = "p0/m", weight = 3 }, { model = "p1/m", weight = 1 }, { model = "p2/m", weight = 0 }"#,
        "",
    );
    let got = serve_n(gw.addr(), "mix", 400);
    let a = count(&got, "c0");
    // Expected 300; the bounds are over 6 standard deviations wide.
    assert!((240..=360).contains(&a), "c0 served {a} of 400");
    assert_eq!(count(&got, "c1"), 400 - a);
    // Weight 0 is never drawn while another target is eligible.
    assert_eq!(count(&got, "c2"), 0);
    assert!(m[2].requests_to(CHAT).is_empty());
}

#[test]
fn a_sticky_weighted_limit_reuses_the_draw_for_that_many_requests() {
    let m = ok_mocks(2);
    let gw = start(
        &[&m[0], &m[1]],
        "weighted",
        r#""p0/m", "p1/m""#,
        "sticky_weighted_limit = 4",
    );
    let got = serve_n(gw.addr(), "mix", 80);
    for run in got.chunks(4) {
        assert!(run.iter().all(|c| *c == run[0]), "{got:?}");
    }
    // 20 draws at 1:1: both are drawn (all alike has odds of 2 in a million).
    assert!(count(&got, "c0") > 0 && count(&got, "c1") > 0, "{got:?}");
}

#[test]
fn strict_random_uses_every_target_once_per_deck() {
    let m = ok_mocks(3);
    let gw = start(&[&m[0], &m[1], &m[2]], "strict-random", ABC, "");
    let got = serve_n(gw.addr(), "mix", 30);
    for deck in got.chunks(3) {
        let mut d = deck.to_vec();
        d.sort();
        assert_eq!(d, ["c0", "c1", "c2"], "{got:?}");
    }
}

#[test]
fn random_spreads_requests_over_every_target() {
    let m = ok_mocks(3);
    let gw = start(&[&m[0], &m[1], &m[2]], "random", ABC, "");
    let got = serve_n(gw.addr(), "mix", 300);
    for c in ["c0", "c1", "c2"] {
        let n = count(&got, c);
        // Expected 100 each; the bounds are over 5 standard deviations wide.
        assert!((60..=140).contains(&n), "{c} served {n} of 300: {got:?}");
    }
}

#[test]
fn fill_first_stays_on_the_first_target_until_it_fails_then_moves_on() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    for _ in 0..3 {
        a.on(CHAT, Reply::openai_chat("a"));
    }
    a.on_always(CHAT, Reply::error(429, "quota").header("retry-after", "60"));
    b.on_always(CHAT, Reply::openai_chat("b"));
    let gw = start(&[&a, &b], "fill-first", r#""p0/m", "p1/m""#, "");
    assert_eq!(serve_n(gw.addr(), "mix", 3), ["c0", "c0", "c0"]);
    // The fourth: the first answers 429, the second serves.
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c1"));
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    // The first is locked now: the second is the one filled.
    assert_eq!(serve_n(gw.addr(), "mix", 3), ["c1", "c1", "c1"]);
    assert_eq!(a.requests_to(CHAT).len(), 4);
}

#[test]
fn least_used_sends_each_request_to_the_target_used_least_recently() {
    let m = ok_mocks(3);
    let gw = start(&[&m[0], &m[1], &m[2]], "least-used", ABC, "");
    assert_eq!(
        serve_n(gw.addr(), "mix", 6),
        ["c0", "c1", "c2", "c0", "c1", "c2"]
    );
}

/// `cfg` with `disable_cooling = true` on connection `id` (its failures put no cooldown or
/// model lock on it: only the strategy keeps it back).
fn no_cooling(cfg: &str, id: &str) -> String {
    let plain = format!("[[connections]]\nid = \"{id}\"\n");
    assert!(cfg.contains(&plain), "{cfg}");
    cfg.replace(&plain, &format!("{plain}disable_cooling = true\n"))
}

#[test]
fn lkgp_puts_the_target_that_served_last_first() {
    let (a, b, c) = (
        MockUpstream::start(),
        MockUpstream::start(),
        MockUpstream::start(),
    );
    a.on(CHAT, Reply::error(500, "boom"));
    a.on_always(CHAT, Reply::openai_chat("a"));
    for _ in 0..3 {
        b.on(CHAT, Reply::openai_chat("b"));
    }
    b.on_always(CHAT, Reply::error(500, "boom"));
    c.on_always(CHAT, Reply::openai_chat("c"));
    // c0 stays eligible after its failure: only the strategy puts c1 before it.
    let cfg = no_cooling(&config(&[&a, &b, &c], "lkgp", ABC, "", ""), "c0");
    let gw = Gateway::start(&cfg);
    // Nothing served yet: the written order; c0 fails, c1 serves and is the last good.
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c1"));
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(serve_n(gw.addr(), "mix", 2), ["c1", "c1"]);
    assert_eq!(a.requests_to(CHAT).len(), 1);
    // c1 fails: the rest in the written order, c0 serves and is the last good.
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c0"));
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    assert_eq!(serve_n(gw.addr(), "mix", 3), ["c0", "c0", "c0"]);
    assert_eq!(b.requests_to(CHAT).len(), 4);
    assert!(c.requests_to(CHAT).is_empty());
    assert!(!gw.logs().contains("not built"), "{}", gw.logs());
}

#[test]
fn lkgp_puts_the_connection_that_served_last_first_within_its_target() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    a.on(CHAT, Reply::error(500, "boom"));
    a.on_always(CHAT, Reply::openai_chat("a"));
    b.on_always(CHAT, Reply::openai_chat("b"));
    // Provider p0 has two connections, x before y (file order); x takes no cooldown.
    let mut cfg = String::from("[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\n");
    cfg += &provider("p0", &a.base_url(), &["m"]);
    cfg += &connection("x", "p0");
    cfg += &connection("y", "p0");
    cfg += &provider("p1", &b.base_url(), &["m"]);
    cfg += &connection("z", "p1");
    cfg += "[[combos]]\nname = \"mix\"\nstrategy = \"lkgp\"\ntargets = [\"p0/m\", \"p1/m\"]\n";
    let gw = Gateway::start(&no_cooling(&cfg, "x"));
    // x fails, y (same target) serves: the last good is p0/m on y.
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("y"));
    assert_eq!(r.header("x-tidegate-attempts"), Some("2"));
    // x is eligible again and first in the file, yet y goes first.
    for _ in 0..3 {
        let r = ask(gw.addr(), "mix");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("y"));
        assert_eq!(r.header("x-tidegate-attempts"), Some("1"));
    }
    assert!(b.requests_to(CHAT).is_empty());
}

#[test]
fn p2c_keeps_a_target_that_fails_more_out_of_first_place() {
    let (a, b) = (MockUpstream::start(), MockUpstream::start());
    a.on_always(CHAT, Reply::error(500, "boom"));
    b.on(CHAT, Reply::error(500, "boom"));
    b.on_always(CHAT, Reply::openai_chat("b"));
    // Neither takes a cooldown or a model lock: both stay eligible, only their scores
    // differ.
    let cfg = config(&[&a, &b], "p2c", r#""p0/m", "p1/m""#, "max_retries = 0", "");
    let gw = Gateway::start(&no_cooling(&no_cooling(&cfg, "c0"), "c1"));
    // Both fail the first request (no same-target retry): both score 0 + 0.25 (no
    // latency known).
    let r = ask(gw.addr(), "mix");
    assert_ne!(r.status, 200, "{}", r.text());
    assert_eq!(a.requests_to(CHAT).len(), 1);
    // The second: whichever is drawn first keeps first place (the other is not strictly
    // better); b serves either way, with a success rate of a half and a known latency.
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c1"));
    let tried = a.requests_to(CHAT).len();
    // From now on b scores above a in every draw: a is never tried first (random would
    // put it first about every other request).
    for _ in 0..30 {
        let r = ask(gw.addr(), "mix");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c1"));
        assert_eq!(r.header("x-tidegate-attempts"), Some("1"));
    }
    assert_eq!(a.requests_to(CHAT).len(), tried);
    assert!(!gw.logs().contains("not built"), "{}", gw.logs());
}

#[test]
fn p2c_puts_the_target_with_the_faster_response_head_first() {
    let (slow, fast) = (MockUpstream::start(), MockUpstream::start());
    slow.on_always(CHAT, Reply::openai_chat("slow").delay_ms(300));
    fast.on_always(CHAT, Reply::openai_chat("fast"));
    let gw = start(&[&slow, &fast], "p2c", r#""p0/m", "p1/m""#, "");
    // One request forced onto each connection gives both a record: both served, heads in
    // about 300 ms (score ≈ 1 + 1/log10(310) ≈ 1.4) and a few ms (≈ 1.9).
    for c in ["c0", "c1"] {
        let mut client = Client::connect(gw.addr());
        client.set_timeout(secs(30));
        let body = r#"{"model":"mix","messages":[{"role":"user","content":"hi"}]}"#;
        let r = client.request(
            "POST",
            CHAT,
            &[("x-omniroute-connection", c)],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-omniroute-selected-connection-id"), Some(c));
    }
    // Both are drawn every time (two targets) and the faster scores higher in either
    // order: it goes first, every time.
    assert_eq!(serve_n(gw.addr(), "mix", 20), vec!["c1"; 20]);
    assert_eq!(slow.requests_to(CHAT).len(), 1);
}

/// `cfg` with provider `id`'s input price for model `m` set to `usd` per million tokens.
fn priced(cfg: &str, id: &str, usd: &str) -> String {
    let plain = format!("[[providers]]\nid = \"{id}\"\n");
    assert!(cfg.contains(&plain), "{cfg}");
    cfg.replace(
        &plain,
        &format!("{plain}input_usd_per_mtok = {{ \"m\" = {usd} }}\n"),
    )
}

/// Written p0 (1.0), p1 (no price), p2 (0.15), p3 (2.5): by price p2, p0, p3, then p1.
fn cost_gateway(mocks: &[&MockUpstream]) -> Gateway {
    let cfg = config(
        mocks,
        "cost-optimized",
        r#""p0/m", "p1/m", "p2/m", "p3/m""#,
        "",
        "",
    );
    let cfg = priced(&priced(&priced(&cfg, "p0", "1"), "p2", "0.15"), "p3", "2.5");
    let gw = Gateway::start(&cfg);
    assert_eq!(gw.shards(), 1);
    gw
}

#[test]
fn cost_optimized_serves_from_the_cheapest_target_whatever_the_written_order() {
    let m = ok_mocks(4);
    let gw = cost_gateway(&[&m[0], &m[1], &m[2], &m[3]]);
    assert_eq!(serve_n(gw.addr(), "mix", 4), ["c2", "c2", "c2", "c2"]);
    for (i, mock) in m.iter().enumerate() {
        let want = if i == 2 { 4 } else { 0 };
        assert_eq!(mock.requests_to(CHAT).len(), want, "p{i}");
    }
    // Built, and priced: no load-time warning about its order.
    assert!(!gw.logs().contains("order written"), "{}", gw.logs());
}

#[test]
fn cost_optimized_fails_over_to_the_next_cheapest_not_the_next_written() {
    let (m, bad) = (ok_mocks(4), MockUpstream::start());
    bad.on_always(CHAT, Reply::error(500, "boom"));
    // p2, the cheapest, fails: p0 (1.0) serves, not p3 (written next, 2.5).
    let gw = cost_gateway(&[&m[0], &m[1], &bad, &m[3]]);
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c0"));
    assert!(!bad.requests_to(CHAT).is_empty());
    assert!(m[1].requests_to(CHAT).is_empty());
    assert!(m[3].requests_to(CHAT).is_empty());
}

#[test]
fn cost_optimized_tries_an_unpriced_target_after_every_priced_one() {
    let m = ok_mocks(4);
    let (bad0, bad2, bad3) = (
        MockUpstream::start(),
        MockUpstream::start(),
        MockUpstream::start(),
    );
    for b in [&bad0, &bad2, &bad3] {
        b.on_always(CHAT, Reply::error(500, "boom"));
    }
    // p2 and p0 fail: p3, the dearest priced, serves before p1, written before it.
    let gw = cost_gateway(&[&bad0, &m[1], &bad2, &m[3]]);
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c3"));
    assert!(m[1].requests_to(CHAT).is_empty());
    drop(gw);
    // Every priced one fails: the unpriced one still serves, last.
    let gw = cost_gateway(&[&bad0, &m[1], &bad2, &bad3]);
    let r = ask(gw.addr(), "mix");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-omniroute-selected-connection-id"), Some("c1"));
    assert!(!bad3.requests_to(CHAT).is_empty());
}

#[test]
fn a_reload_that_changes_a_price_changes_the_cheapest() {
    let m = ok_mocks(2);
    let mocks = [&m[0], &m[1]];
    let cfg = |p0: &str, p1: &str| {
        let c = config(&mocks, "cost-optimized", r#""p0/m", "p1/m""#, "", "");
        priced(&priced(&c, "p0", p0), "p1", p1)
    };
    let mut gw = Gateway::start(&cfg("3", "1"));
    assert_eq!(serve_n(gw.addr(), "mix", 2), ["c1", "c1"]);
    let before = gw.logs().matches("configuration reloaded").count();
    std::fs::write(gw.config_path(), cfg("0.5", "1")).unwrap();
    gw.signal(libc::SIGHUP);
    eventually(secs(10), "the reload to be logged", || {
        (gw.logs().matches("configuration reloaded").count() > before).then_some(())
    });
    assert_eq!(serve_n(gw.addr(), "mix", 2), ["c0", "c0"]);
}

#[test]
fn a_failing_first_pick_fails_over_under_every_strategy() {
    for strategy in [
        "round-robin",
        "weighted",
        "fill-first",
        "random",
        "strict-random",
        "least-used",
        "lkgp",
        "p2c",
        "cost-optimized",
    ] {
        let bad = MockUpstream::start();
        bad.on_always(CHAT, Reply::error(500, "boom"));
        let good = MockUpstream::start();
        good.on_always(CHAT, Reply::openai_chat("ok"));
        // The failing target first, and the only one a weighted draw takes (the other
        // weighs 0); the random ones pick it first about every other request until the
        // views rule it out.
        let gw = start(
            &[&bad, &good],
            strategy,
            r#"{ model = "p0/m", weight = 1 }, { model = "p1/m", weight = 0 }"#,
            "",
        );
        for _ in 0..20 {
            let r = ask(gw.addr(), "mix");
            assert_eq!(r.status, 200, "{strategy}: {}", r.text());
            assert_eq!(
                r.header("x-omniroute-selected-connection-id"),
                Some("c1"),
                "{strategy}"
            );
        }
        // p2c may never draw it first: once the good one served, it scores above the
        // unknown one.
        if strategy != "p2c" {
            assert!(!bad.requests_to(CHAT).is_empty(), "{strategy}");
        }
    }
}

#[test]
fn a_reload_that_changes_the_targets_restarts_the_rotation() {
    let m = ok_mocks(3);
    let mocks = [&m[0], &m[1], &m[2]];
    let mut gw = start(&mocks, "round-robin", ABC, "");
    assert_eq!(serve_n(gw.addr(), "mix", 2), ["c0", "c1"]);
    let before = gw.logs().matches("configuration reloaded").count();
    std::fs::write(
        gw.config_path(),
        config(&mocks, "round-robin", r#""p2/m", "p0/m""#, "", ""),
    )
    .unwrap();
    gw.signal(libc::SIGHUP);
    eventually(secs(10), "the reload to be logged", || {
        (gw.logs().matches("configuration reloaded").count() > before).then_some(())
    });
    assert_eq!(serve_n(gw.addr(), "mix", 3), ["c2", "c0", "c2"]);
}

#[test]
fn check_warns_about_a_sticky_limit_the_combo_does_not_read_and_not_about_built_strategies() {
    let m = ok_mocks(2);
    let (code, _, stderr) = run_check(&config(
        &[&m[0], &m[1]],
        "fill-first",
        r#""p0/m", "p1/m""#,
        "sticky_weighted_limit = 3",
        "",
    ));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "combos[0].config.sticky_weighted_limit: has no effect: combo \"mix\" is not weighted"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("strategy"), "{stderr}");
    for built in ["lkgp", "p2c"] {
        let (code, _, stderr) = run_check(&config(&[&m[0], &m[1]], built, r#""p0/m""#, "", ""));
        assert_eq!(code, 0, "{built}: {stderr}");
        assert!(!stderr.contains("strategy"), "{built}: {stderr}");
    }
    // cost-optimized is built: priced, no warning; with no price at all, it says it runs
    // in the written order.
    let cost = config(
        &[&m[0], &m[1]],
        "cost-optimized",
        r#""p0/m", "p1/m""#,
        "",
        "",
    );
    let (code, _, stderr) = run_check(&priced(&cost, "p1", "0.5"));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("strategy"), "{stderr}");
    let (code, _, stderr) = run_check(&cost);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "combos[0].strategy: \"cost-optimized\" has no price for any target of combo \"mix\""
        ) && stderr.contains("order written")
            && !stderr.contains("not built"),
        "{stderr}"
    );
    let (code, _, stderr) = run_check(&config(&[&m[0], &m[1]], "auto", r#""p0/m""#, "", ""));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("combos[0].strategy: \"auto\" is accepted, but its ordering is not built"),
        "{stderr}"
    );
}

/// A weight written on a model target of a combo whose ordering reads no weights (and that
/// no weighted or quota-share combo nests) is accepted but does nothing: `check` says so.
/// A weighted combo's weights, and those of a combo a weighted combo nests, are read.
#[test]
fn check_warns_about_a_target_weight_no_ordering_reads() {
    let m = ok_mocks(2);
    let weighted = r#"{ model = "p0/m", weight = 3 }, "p1/m""#;
    let (code, _, stderr) = run_check(&config(&[&m[0], &m[1]], "round-robin", weighted, "", ""));
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "combos[0].targets[0].weight: has no effect: combo \"mix\" does not read weights"
        ),
        "{stderr}"
    );
    let (code, _, stderr) = run_check(&config(&[&m[0], &m[1]], "weighted", weighted, "", ""));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("weight: has no effect"), "{stderr}");
    // `mix` (priority) nested in a weighted combo: its target weights split the share.
    let nested = "[[combos]]\nname = \"outer\"\nstrategy = \"weighted\"\n\
                  targets = [{ combo = \"mix\", weight = 2 }, \"p1/m\"]\n";
    let (code, _, stderr) = run_check(&config(&[&m[0], &m[1]], "priority", weighted, "", nested));
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("weight: has no effect"), "{stderr}");
}

/// B §3.2 weighted: when every weight is 0 the draw is uniform (no target is starved).
#[test]
fn weighted_with_every_weight_zero_draws_uniformly() {
    let m = ok_mocks(2);
    let gw = start(
        &[&m[0], &m[1]],
        "weighted",
        r#"{ model = "p0/m", weight = 0 }, { model = "p1/m", weight = 0 }"#,
        "",
    );
    let got = serve_n(gw.addr(), "mix", 200);
    let a = count(&got, "c0");
    // Expected 100; the bounds are over 5 standard deviations wide.
    assert!((60..=140).contains(&a), "c0 served {a} of 200");
}

/// B §3.2 weighted: after the drawn step, the rest follow by descending weight, not in the
/// written order. `p0` (weight 3, always failing, kept eligible) is drawn most of the time;
/// its fallback is then `p2` (weight 1), not `p1` (weight 0, written before it).
#[test]
fn weighted_fallbacks_follow_in_descending_weight() {
    let m = ok_mocks(3);
    let bad = MockUpstream::start();
    bad.on_always(CHAT, Reply::error(500, "boom"));
    let cfg = config(
        &[&bad, &m[1], &m[2]],
        "weighted",
        r#"{ model = "p0/m", weight = 3 }, { model = "p1/m", weight = 0 }, { model = "p2/m", weight = 1 }"#,
        "",
        "[resilience.provider_breaker.apikey]\nfailure_threshold = 1000\n",
    )
    .replace(
        "id = \"c0\"\nprovider = \"p0\"\n",
        "id = \"c0\"\nprovider = \"p0\"\ndisable_cooling = true\n",
    );
    assert!(cfg.contains("disable_cooling"));
    let gw = Gateway::start(&cfg);
    let got = serve_n(gw.addr(), "mix", 40);
    assert!(got.iter().all(|c| c == "c2"), "{got:?}");
    assert!(m[1].requests_to(CHAT).is_empty());
    // p0 stayed eligible and was drawn first most of the time (expected 30 of 40).
    let drawn = bad.requests_to(CHAT).len();
    assert!((15..=40).contains(&drawn), "p0 tried {drawn} times");
}

/// B §3.1: a client may name a combo as `combo/<name>`; it is the same combo (one
/// rotation whichever name a request uses). `combo/<not a combo>` is no combo.
#[test]
fn combo_slash_name_runs_the_same_combo() {
    let m = ok_mocks(3);
    let gw = start(&[&m[0], &m[1], &m[2]], "round-robin", ABC, "");
    let got: Vec<String> = ["mix", "combo/mix", "mix", "combo/mix"]
        .iter()
        .map(|model| served(gw.addr(), model))
        .collect();
    assert_eq!(got, ["c0", "c1", "c2", "c0"]);
    let none = ask(gw.addr(), "combo/nope");
    assert_eq!(none.status, 404, "{}", none.text());
}
