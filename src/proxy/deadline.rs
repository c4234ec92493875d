//! Deadlines that bound more than one read (spec B §7.3): the overall request deadline
//! (`[server] request_timeout_ms`, every attempt and wait until the answer's head reaches
//! the client) and the hard per-attempt deadline (`stream_watchdog.active_timeout_ms`,
//! from the request being sent to the end of its answer, never reset by incoming bytes).
//! The per-read budgets (connect, response head, body idle, content stall) stay where
//! they are read; these race whatever wait is running when they pass.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::{ErrorKind, GatewayError, TimeoutPhase};
use crate::owners::Req;

/// Which budget a [`Deadline`] enforces, and its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// `[server] request_timeout_ms`.
    Request { ms: u64 },
    /// `stream_watchdog.active_timeout_ms` (`STREAM_ACTIVE_TIMEOUT_MS`).
    Active { ms: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// Monotonic nanoseconds (the shard's clock) when it passes.
    pub at_ns: u64,
    pub budget: Budget,
}

impl Deadline {
    /// `ms` from now; `None` when the budget is 0 (off).
    pub fn after(shard: &Req<'_>, budget: Budget) -> Option<Deadline> {
        let ms = match budget {
            Budget::Request { ms } | Budget::Active { ms } => ms,
        };
        (ms > 0).then(|| Deadline {
            at_ns: shard
                .now()
                .mono_ns
                .saturating_add(ms.saturating_mul(1_000_000)),
            budget,
        })
    }

    /// The error when it passes; the message names the budget and its value.
    pub fn error(&self) -> GatewayError {
        match self.budget {
            Budget::Request { ms } => GatewayError::new(
                ErrorKind::RequestTimeout,
                format!(
                    "request timed out: no answer within the overall request budget of {ms} ms \
                     (server.request_timeout_ms, across every attempt and wait)"
                ),
            ),
            Budget::Active { ms } => GatewayError::new(
                ErrorKind::UpstreamTimeout(TimeoutPhase::Active),
                format!(
                    "upstream attempt ran past its hard deadline of {ms} ms \
                     (stream_watchdog.active_timeout_ms, per attempt, not reset by incoming bytes)"
                ),
            ),
        }
    }
}

/// The one of two deadlines that passes first.
pub fn earliest(a: Option<Deadline>, b: Option<Deadline>) -> Option<Deadline> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.at_ns < a.at_ns { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Runs `wait` until `deadline` passes (forever without one); the deadline's error when it
/// passes first (the caller drops `wait`, cancelling what it was doing).
///
/// `wait` is pinned by the caller, in place: an `async fn` keeps a future it takes by value
/// both as its argument and as the value it awaits, so every by-value wrapper doubled the
/// size of what it wrapped (and of every request's task) — see `docs/architecture.md`.
pub async fn within<F: Future>(
    shard: &Req<'_>,
    deadline: Option<Deadline>,
    wait: Pin<&mut F>,
) -> Result<F::Output, GatewayError> {
    let Some(d) = deadline else {
        return Ok(wait.await);
    };
    let left = Duration::from_nanos(d.at_ns.saturating_sub(shard.now().mono_ns));
    if left.is_zero() {
        return Err(d.error());
    }
    crate::timer::timeout(left, wait)
        .await
        .map_err(|_| d.error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earlier_deadline_wins_and_none_is_no_deadline() {
        let r = Deadline {
            at_ns: 10,
            budget: Budget::Request { ms: 1 },
        };
        let a = Deadline {
            at_ns: 5,
            budget: Budget::Active { ms: 1 },
        };
        assert_eq!(earliest(Some(r), Some(a)), Some(a));
        assert_eq!(earliest(Some(a), Some(r)), Some(a));
        assert_eq!(earliest(None, Some(r)), Some(r));
        assert_eq!(earliest(Some(r), None), Some(r));
        assert_eq!(earliest(None, None), None);
    }

    #[test]
    fn each_message_names_its_budget_and_value() {
        let d = |budget| Deadline { at_ns: 0, budget };
        let e = d(Budget::Request { ms: 1500 }).error();
        assert_eq!(e.kind, ErrorKind::RequestTimeout);
        assert!(e.message.contains("1500 ms"), "{}", e.message);
        assert!(e.message.contains("server.request_timeout_ms"));
        let e = d(Budget::Active { ms: 700 }).error();
        assert_eq!(e.kind, ErrorKind::UpstreamTimeout(TimeoutPhase::Active));
        assert!(e.message.contains("700 ms"), "{}", e.message);
        assert!(e.message.contains("stream_watchdog.active_timeout_ms"));
    }
}
