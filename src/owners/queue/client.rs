//! The asker's side of the request queue (admit): an attempt on a connection whose per-connection limiter is on
//! (ARCHITECTURE §6: `RATE_LIMIT_AUTO_ENABLE` / `auto_enable_api_key_providers`, or a
//! `requests_per_minute` / `min_time_between_requests_ms` override) first takes a slot in
//! the connection's queue on its owner shard: queue-depth admission (429
//! `rate_limit_queue_full`), then a start now, at a spaced start, or FIFO behind others —
//! bounded by `max_wait_ms` (503 `rate_limit_queue_timeout`; the upstream never sees it). The
//! slot is returned exactly once by the guard's `Drop`. The execution budget is separate.
//!
//! A provider with a sliding window (B §1.2b: `nvidia` 40 per minute per connection, or
//! `provider_quota_overrides.<p>.rpm`) takes a start in it first, on the same owner: when the
//! window is full the owner answers when to ask again, and past `max(60 s, max_wait_ms)` of
//! waiting lets the request through anyway (fail open; the queue still applies).

use std::time::Duration;

use crate::config::ConnectionId;
use crate::error::{ErrorKind, GatewayError};
use crate::flow::queue::{QueueError, ResponseFacts};
use crate::owners::{Req, Shard, admission, reply_bound};
use crate::resilience::OwnedHeaders;
use crate::shard::call::{CallError, CallId};

use super::Queue;
use super::protocol::{Fact, Reply, Request};

/// Held while an attempt runs; dropping it returns the queue slot.
pub struct QueueSlot<'a> {
    shard: &'a Shard,
    connection: ConnectionId,
    id: CallId,
    /// The execution budget of the attempt when the connection's request queue is on
    /// (`execution_max_wait_ms`, at least the upstream's own response-head budget); `None`
    /// for a start taken only in the provider's sliding window.
    pub execution_budget: Option<Duration>,
    /// What a successful answer taught, sent with the slot's return. Boxed: only a
    /// connection with a request queue learns, and inline it made every attempt's
    /// admission (moved from its wait into the relay) some 100 bytes larger.
    learned: Option<Box<ResponseFacts>>,
}

impl QueueSlot<'_> {
    /// Keeps what a successful upstream head tells the queue (its status and `x-ratelimit-*`
    /// fields); the owner applies it when the slot comes back. Error answers reach the
    /// owner as outcomes instead.
    pub fn learn_from<'h>(
        &mut self,
        status: u16,
        fields: impl Iterator<Item = (&'h str, &'h [u8])>,
    ) {
        if self.execution_budget.is_none() {
            return; // no request queue to teach
        }
        let headers: Vec<(String, String)> = fields
            .filter(|(n, _)| {
                n.len() > RATE_LIMIT_PREFIX.len()
                    && n.as_bytes()[..RATE_LIMIT_PREFIX.len()]
                        .eq_ignore_ascii_case(RATE_LIMIT_PREFIX.as_bytes())
            })
            .map(|(n, v)| (n.to_owned(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        let facts = ResponseFacts::read(status, &OwnedHeaders(&headers), "", self.shard.now());
        self.learned = Some(Box::new(facts));
    }
}

/// Header fields a queue learns from (`x-ratelimit-limit-requests`, `…-remaining…`,
/// `…-reset…`, `x-ratelimit-over-limit`).
const RATE_LIMIT_PREFIX: &str = "x-ratelimit-";

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        if self.execution_budget.is_none() {
            // Only a sliding-window start: nothing is held on the owner.
            return;
        }
        let owner = self.shard.owner(&self.connection);
        let fact = Fact::Finish {
            id: self.id,
            learned: self.learned.take().map(|facts| *facts),
        };
        self.shard.send_fact(owner, fact.into());
    }
}

/// The gateway error of a queue error, naming `target` (`<provider>/<model>`).
pub fn error(e: QueueError, target: &str) -> GatewayError {
    let kind = match e {
        QueueError::Full { .. } => ErrorKind::RateLimitQueueFull,
        QueueError::QueueTimeout { .. } => ErrorKind::RateLimitQueueTimeout,
        QueueError::ExecutionTimeout { .. } => ErrorKind::RateLimitExecutionTimeout,
        QueueError::Wedged => ErrorKind::RateLimitQueueWedged,
    };
    GatewayError::new(kind, e.message(target))
}

/// Takes a slot in the connection's request queue, after a start in its provider's sliding
/// window when the provider has one. `Ok(None)`: neither applies.
pub async fn acquire<'a>(
    shard: &Req<'a>,
    connection: ConnectionId,
    model: &str,
) -> Result<Option<QueueSlot<'a>>, GatewayError> {
    // Scoped so that only the settings are kept across the waits below.
    let settings = {
        let admission = admission(shard, connection);
        if !admission.queued() {
            return Ok(None);
        }
        admission.limiter
    };
    let bound = reply_bound(settings.max_wait_ms);
    let waiting_since_ns = shard.now().mono_ns;
    let owner = shard.owner(&connection);
    loop {
        let request = Request::Acquire {
            connection,
            model: model.to_owned(),
            waiting_since_ns,
        };
        let (id, reply) = shard.call_with_id::<Queue>(owner, request, bound).await;
        let start_at_ns = match reply {
            Ok(Reply::Granted { start_at_ns }) => start_at_ns,
            Ok(Reply::Denied(e)) => {
                return Err(error(e, &target_name(shard, connection, model)));
            }
            // The provider's window is full: wait and ask again (the owner lets the request
            // through once its wait budget is spent).
            Ok(Reply::Retry { at_ns }) => {
                sleep_until(shard, at_ns).await;
                continue;
            }
            Err(CallError::TimedOut) => {
                return Err(error(
                    QueueError::QueueTimeout {
                        max_wait_ms: settings.max_wait_ms,
                    },
                    &target_name(shard, connection, model),
                ));
            }
            Err(CallError::Unsent | CallError::Mismatched) => {
                return Err(GatewayError::new(
                    ErrorKind::MeshUnavailable,
                    "the connection's owner shard could not be asked for a queue slot",
                ));
            }
        };
        let slot = QueueSlot {
            shard: shard.shard(),
            connection,
            id,
            // Only a request queue bounds the execution; the gateway has no separate
            // per-provider start timeout to raise it to.
            execution_budget: settings.enabled.then(|| {
                Duration::from_millis(crate::flow::queue::execution_budget_ms(&settings, 0).max(1))
            }),
            learned: None,
        };
        // A spaced start: the slot is ours, its start is later.
        sleep_until(shard, start_at_ns).await;
        return Ok(Some(slot));
    }
}

/// `<provider>/<model>`, as queue errors name their target.
pub fn target_name(shard: &Req<'_>, connection: ConnectionId, model: &str) -> String {
    let config = shard.config();
    let provider = &config.provider(config.connection(connection).provider).name;
    format!("{provider}/{model}")
}

async fn sleep_until(shard: &Shard, at_ns: u64) {
    let now = shard.now().mono_ns;
    if at_ns > now {
        crate::timer::sleep(Duration::from_nanos(at_ns - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queue error's status, code and type come from its `ErrorKind` (B §1.6): the one map.
    #[test]
    fn queue_errors_map_through_the_one_error_table() {
        let cases = [
            (
                QueueError::Full { max_queue_depth: 3 },
                429,
                "rate_limit_queue_full",
                "rate_limit_error",
            ),
            (
                QueueError::QueueTimeout { max_wait_ms: 5 },
                503,
                "rate_limit_queue_timeout",
                "service_unavailable",
            ),
            (
                QueueError::ExecutionTimeout {
                    execution_max_wait_ms: 5,
                },
                504,
                "rate_limit_execution_timeout",
                "gateway_timeout",
            ),
            (
                QueueError::Wedged,
                503,
                "rate_limit_queue_wedged",
                "service_unavailable",
            ),
        ];
        for (e, status, code, ty) in cases {
            let g = error(e, "openai/gpt");
            assert_eq!(
                (g.kind.status(), g.kind.code(), g.kind.error_type()),
                (status, code, ty),
                "{e:?}"
            );
            assert_eq!(g.message, e.message("openai/gpt"));
        }
    }
}
