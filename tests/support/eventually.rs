//! Waiting for state that owners replicate asynchronously across shards: retry an
//! observation until it holds or a deadline passes.

use std::time::Duration;

use super::Deadline;

/// Calls `probe` until it returns `Some`, at most for `timeout`; panics with `what`.
pub fn eventually<T>(timeout: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Deadline::after(timeout);
    loop {
        if let Some(v) = probe() {
            return v;
        }
        if deadline.passed() {
            panic!("not within {timeout:?}: {what}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
