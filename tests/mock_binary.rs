//! The standalone `tidegate-mock` binary (the load tests' loopback upstream, `perf/`) plays
//! the in-process mock provider's timed behaviours by model name: `drip-<ms>` spaces a
//! stream's frames, `slow-<ms>` delays the head. Without that, `MODE=net
//! perf/slow_streams.sh` measured streams that ended at once.
//! Its `--help` says which paths it answers and what each model name does.
// Test code: a failed unwrap is a failed test, in helpers as in `#[test]` functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::{Client, Piece, Stopwatch};

const MOCK_BIN: &str = env!("CARGO_BIN_EXE_tidegate-mock");

/// A running `tidegate-mock` on a loopback port; killed (by its own handle) on drop.
struct Mock {
    child: Child,
    addr: SocketAddr,
}

impl Mock {
    fn start() -> Mock {
        let mut child = Command::new(MOCK_BIN)
            .args(["--listen", "127.0.0.1:0", "--workers", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .strip_prefix("tidegate-mock listening on ")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .expect("tidegate-mock's ready line names its address");
        Mock { child, addr }
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat(client: &mut Client, model: &str, stream: bool) {
    let body = serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "one two three four"}],
    })
    .to_string();
    client.start_request(
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.as_bytes(),
    );
}

#[test]
fn a_drip_model_streams_its_frames_one_gap_apart() {
    let mock = Mock::start();
    let mut c = Client::connect(mock.addr);
    chat(&mut c, "drip-150", true);
    let head = c.read_head();
    assert_eq!(head.status, 200);
    // Role frame, four words, the stop frame and [DONE]: seven frames, six gaps.
    let clock = Stopwatch::start();
    let mut arrivals = Vec::new();
    let mut body = Vec::new();
    loop {
        match c.next_body_piece(Duration::from_secs(10)) {
            Piece::Data(d) => {
                arrivals.push(clock.elapsed());
                body.extend_from_slice(&d);
            }
            Piece::End => break,
            other => panic!("stream did not end cleanly: {other:?}"),
        }
    }
    let text = String::from_utf8_lossy(&body);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(text.matches("\"content\":\"").count(), 5, "{text}");
    assert!(
        arrivals.len() >= 5,
        "frames should arrive spaced, not together: {} reads",
        arrivals.len()
    );
    let spread = arrivals[arrivals.len() - 1] - arrivals[0];
    assert!(
        spread >= Duration::from_millis(5 * 150),
        "six 150 ms gaps took {spread:?}"
    );
    // The connection stays usable for the next request.
    chat(&mut c, "echo", false);
    assert_eq!(c.read_response().status, 200);
}

#[test]
fn a_slow_model_delays_the_head() {
    let mock = Mock::start();
    let mut c = Client::connect(mock.addr);
    let t0 = Stopwatch::start();
    chat(&mut c, "slow-400", false);
    let r = c.read_response();
    assert_eq!(r.status, 200);
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "one two three four"
    );
}

/// The mock renders an instant answer once per request body and afterwards copies it with
/// the request's own seq written in: the same body sent again and again on one connection
/// (a load test) gets answers that differ only in their ids, which count up, across the
/// widths of the seq (request 9 → 10), streamed and not.
#[test]
fn a_repeated_body_is_answered_with_each_request_s_own_id() {
    let mock = Mock::start();
    let mut c = Client::connect(mock.addr);
    for stream in [false, true] {
        for seq in 1..=12u32 {
            chat(&mut c, "gpt-4o-mini", stream);
            let r = c.read_response();
            assert_eq!(r.status, 200);
            let text = String::from_utf8(r.body).unwrap();
            // streamed: the first request of the connection's second half is seq 13
            let id = format!("\"chatcmpl-mock-{}\"", seq + if stream { 12 } else { 0 });
            let ids = text.matches("\"chatcmpl-mock-").count();
            assert!(
                ids >= 1 && text.matches(&id).count() == ids,
                "{id} in {text}"
            );
            if stream {
                assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
                assert_eq!(text.matches("\"content\":\"").count(), 5, "{text}");
            } else {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["choices"][0]["message"]["content"], "one two three four");
            }
        }
    }
}

/// A second mock on a port a first one listens on (its workers use SO_REUSEPORT) is refused
/// instead of silently taking part of the first one's connections.
#[test]
fn a_second_mock_on_a_taken_port_is_refused() {
    let first = Mock::start();
    let mut second = Command::new(MOCK_BIN)
        .args(["--listen", &first.addr.to_string(), "--workers", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waited = Stopwatch::start();
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if waited.elapsed() > Duration::from_secs(10) {
            let _ = second.kill();
            let _ = second.wait();
            panic!("the second mock is serving {} beside the first", first.addr);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains(&format!("cannot listen on {}", first.addr)),
        "stderr: {err}"
    );
}

/// `--help` tells an operator what the mock answers and how a model name picks its
/// behaviour, so it can be pointed at from a gateway config without reading the source.
#[test]
fn help_says_what_it_answers_and_which_models_do_what() {
    let out = Command::new(MOCK_BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for part in [
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
        "slow-<ms>",
        "drip-<ms>",
        "stall",
        "fail-<status>",
        "base_url = \"http://127.0.0.1:9100/v1\"",
    ] {
        assert!(help.contains(part), "--help omits {part}:\n{help}");
    }
}
